"""Speech at the speed asked: at speed ``s`` a text lasts 1/s of its length at speed 1 (OpenAI's
contract for ``speed``, 0.25-4), per engine, pauses included, while an SSML break stays exact.

Everything is compared on noise-free synthesis (noise scales 0: the same audio every run,
docs/testing.md), so lengths compare exactly and nothing passes or fails by chance.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient

from gateway.api.ssml import RATE_WORDS
from synth.coqui_engine import CoquiEngine
from synth.engine import SynthesisItem
from synth.exact_speed import (
    SPEED_RULE,
    NotAVitsGraph,
    rescaled_durations,
    rescaled_graph,
    vits_feeds,
)
from synth.piper_engine import PiperEngine, PiperVoiceFiles
from tests.conftest import GatewayFactory
from tests.served import DefaultServer

# Module-scoped engines and servers: one xdist worker builds them.
pytestmark = pytest.mark.xdist_group("speed")

# OpenAI's range of speeds, its ends and a few between.
SPEEDS = (0.25, 0.5, 0.8, 1.5, 2.0, 3.0, 4.0)
TOLERANCE = 0.05  # the contract: within 5% of 1/s
TEXT = "Your appointment is confirmed for Tuesday at three in the afternoon."
THREE = "Thank you for calling. Your order has shipped. Goodbye for now."
PIPER_QUIET = {"noise_scale": 0.0, "noise_w": 0.0}
COQUI_QUIET = {"noise_scale": 0.0, "noise_scale_dp": 0.0}
RATE = 22050


def off_by(length: float, at_speed_1: float, speed: float) -> float:
    """How far ``length`` is from 1/speed of ``at_speed_1``, relative."""
    return abs(length * speed / at_speed_1 - 1)


@pytest.fixture(scope="module")
def piper() -> PiperEngine:
    engine = PiperEngine([PiperVoiceFiles.bundled_joe()])
    engine.load()
    return engine


def samples(engine: Any, text: str, speed: float, params: dict[str, float]) -> int:
    voice = next(iter(v.name for v in engine.voices()))
    (audio,) = engine.synthesize_batch([SynthesisItem(text, voice, speed, params)])
    return len(audio.pcm)


def test_piper_lasts_one_over_the_speed(piper: PiperEngine) -> None:
    base = samples(piper, TEXT, 1.0, PIPER_QUIET)
    for speed in SPEEDS:
        n = samples(piper, TEXT, speed, PIPER_QUIET)
        # The rule rounds the running total of frames: off by at most half a frame per run.
        assert abs(n - base / speed) <= 128, (speed, n, base / speed)
        assert off_by(n, base, speed) < TOLERANCE


PROMPTS = (
    "Press one.",
    "Thank you for calling.",
    "Please hold while we connect you.",
    "Your balance is forty two dollars and seventeen cents.",
)


def test_piper_says_every_phoneme_at_speed_2_and_3_within_5_percent(piper: PiperEngine) -> None:
    """The voice's own durations (the graph's output the speech marks read): at speeds 2 and 3
    every phoneme has a frame, the frames are the rule's (a tie between the graph's float
    arithmetic and torch's may move a boundary by a frame, never the total), and each prompt
    lasts 1/speed of speed 1 within 5%."""
    voice = piper._voices["joe"]
    for text in PROMPTS:
        ids = voice.phonemes_to_ids(voice.phonemize(text)[0])
        phoneme = np.asarray(ids) != BLANK
        noise = piper._noise["joe"]
        run = noise.outputs(voice.session)
        _, frames = noise.run(voice.session, run, vits_feeds(ids, [0.0, 1.0, 0.0], 1.0), 0)
        base = samples(piper, text, 1.0, PIPER_QUIET)
        for speed in (2.0, 3.0):
            _, d = noise.run(voice.session, run, vits_feeds(ids, [0.0, 1.0, 0.0], speed), 0)
            d = d.reshape(-1)
            assert np.all(d[phoneme] >= 1), (text, speed)
            expected = rule(frames.reshape(-1).astype(int).tolist(), ids, speed)
            assert d.sum() == expected.sum() and np.abs(d - expected).max() <= 1
            assert off_by(samples(piper, text, speed, PIPER_QUIET), base, speed) < TOLERANCE


def _session(model: bytes) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])


def _run(session: Any, ids: list[int], length_scale: float, speed: float | None) -> Any:
    feeds: dict[str, Any] = {
        "input": np.asarray([ids], dtype=np.int64),
        "input_lengths": np.asarray([len(ids)], dtype=np.int64),
        "scales": np.asarray([0.0, length_scale, 0.0], dtype=np.float32),
    }
    if speed is not None:
        feeds["speed"] = np.asarray([speed], dtype=np.float32)
    return session.run(None, feeds)[0].squeeze()


def test_the_rewritten_graph_at_speed_1_is_the_voice_unchanged_and_dividing_the_length_scale_is_gentler(
    piper: PiperEngine,
) -> None:
    """The rewrite changes nothing at speed 1 (the same samples, bit for bit); and what it
    replaces, the length scale divided by the speed, gives speech far gentler than asked (every
    phoneme id keeps the frame its duration's ceiling rounds up to)."""
    voice = piper._voices["joe"]
    ids = voice.phonemes_to_ids(voice.phonemize(TEXT)[0])
    original = PiperVoiceFiles.bundled_joe().model_path.read_bytes()
    plain, rewritten = _session(original), _session(rescaled_graph(original))
    base = _run(plain, ids, 1.0, None)
    assert np.array_equal(_run(rewritten, ids, 1.0, 1.0), base)
    gentle = len(_run(plain, ids, 0.5, None))
    assert gentle / len(base) > 0.5 * (1 + 2 * TOLERANCE)  # measured 0.60: not twice as fast
    assert off_by(len(_run(rewritten, ids, 1.0, 2.0)), len(base), 2.0) < 0.01
    with pytest.raises(ValueError, match="already has a speed input"):
        rescaled_graph(rescaled_graph(original))
    with pytest.raises(NotAVitsGraph):
        rescaled_graph(b"")


# ---- the rule: every phoneme heard, the total kept ------------------------------------------

BLANK = 0


def layouts(rng: np.random.Generator, phonemes: int) -> Iterator[tuple[list[int], list[int]]]:
    """``(ids, speed-1 frames)`` of one utterance as Piper lays it out (BOS, a blank after each
    id, EOS) and as Coqui's ``add_blank`` does (a blank between and around the symbols), the
    frames drawn as the bundled voice's run: phonemes 1-9 frames (a third of them 1 or 2),
    blanks 1-3."""
    symbols = rng.integers(3, 150, phonemes).tolist()
    ph = rng.choice([1, 1, 2, 2, 3, 4, 5, 6, 9], phonemes + 2).tolist()
    bl = rng.integers(1, 4, phonemes + 2).tolist()
    piper_ids = [1, BLANK] + [x for s in symbols for x in (s, BLANK)] + [2]
    piper_frames = [ph[0], bl[0]] + [x for i in range(phonemes) for x in (ph[i + 1], bl[i + 1])]
    yield piper_ids, [*piper_frames, ph[-1]]
    coqui_ids = [BLANK] + [x for s in symbols for x in (s, BLANK)]
    yield coqui_ids, [bl[-1]] + [x for i in range(phonemes) for x in (ph[i], bl[i])]


def rule(frames: list[int], ids: list[int], speed: float) -> np.ndarray[Any, Any]:
    import torch

    blank = torch.tensor(ids).view(1, 1, -1) == BLANK
    f = torch.tensor(frames, dtype=torch.float32).view(1, 1, -1)
    return rescaled_durations(f, speed, blank).view(-1).numpy()


def test_the_rule_keeps_a_frame_for_every_phoneme_and_the_total() -> None:
    """Up to speed 3, on utterances of 1-60 phonemes laid out as Piper and Coqui lay them: no
    phoneme without a frame,
    the total within a frame of speed 1's over the speed, every id whole and none negative."""
    rng = np.random.default_rng(7)
    old_zeros = 0
    for _ in range(60):
        for ids, frames in layouts(rng, int(rng.integers(1, 61))):
            phoneme = np.asarray(ids) != BLANK
            for speed in (1.25, 1.5, 2.0, 2.5, 3.0):
                assert sum(frames) / speed >= phoneme.sum()  # (room for a frame each)
                d = rule(frames, ids, speed)
                assert np.all(d[phoneme] >= 1), (speed, ids, frames, d)
                assert abs(d.sum() - sum(frames) / speed) <= 1, (speed, d.sum())
                assert np.all(d >= 0) and np.array_equal(d, np.round(d))
                total = np.cumsum(frames)
                old = np.diff(np.round(total / speed), prepend=0)
                old_zeros += int(np.sum(old[phoneme] == 0))
    assert old_zeros > 1000  # what the rule is for: the old one dropped phonemes, often


def test_the_rule_changes_nothing_where_every_phoneme_has_its_frame() -> None:
    """At speed 1 the frames themselves; slower (and faster where no phoneme falls under a
    frame) the running total over the speed, rounded half up, and nothing moved."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        for ids, frames in layouts(rng, int(rng.integers(1, 40))):
            assert np.array_equal(rule(frames, ids, 1.0), frames)
            for speed in (0.25, 0.5, 0.8):
                plain = np.diff(np.floor(np.cumsum(frames) / speed + 0.5), prepend=0)
                assert np.array_equal(rule(frames, ids, speed), plain), speed
    ids, frames = [1, 0, 40, 0, 41, 0, 2], [4, 2, 6, 3, 8, 2, 4]
    assert rule(frames, ids, 2.0).tolist() == [2, 1, 3, 2, 4, 1, 2]


def test_a_phoneme_takes_its_frame_from_the_blank_after_it_then_before_it() -> None:
    #            BOS blank  p  blank  p  blank EOS
    ids = [1, 0, 40, 0, 41, 0, 2]
    # At speed 3 the running total alone gives the short phoneme (1 frame at speed 1) none:
    # [2, 1, 0, 1, 2, 1, 1]. It takes the third of a frame it lacks from the blank after it.
    assert rule([6, 2, 1, 2, 6, 3, 3], ids, 3.0).tolist() == [2, 1, 1, 0, 2, 1, 1]
    # Where that blank has too little, the blank before it gives the rest.
    assert rule([6, 2, 1, 1, 6, 3, 3], ids, 3.0).tolist() == [2, 0, 1, 0, 2, 1, 1]
    # A batch's padding (no frames) stays silent.
    padded = rule([6, 2, 1, 1, 6, 3, 3, 0, 0], [*ids, 0, 0], 3.0)
    assert padded.tolist() == [2, 0, 1, 0, 2, 1, 1, 0, 0]
    # With no blank beside it the frame comes from every other id's share, and where the
    # text has fewer frames than phonemes the total holds (here 9 / 3 frames, 4 phonemes).
    assert rule([3, 1, 1, 9], [5, 6, 7, 8], 3.0).tolist() == [1, 1, 1, 2]
    assert rule([1, 1, 1, 6], [5, 6, 7, 8], 3.0).tolist() == [1, 1, 0, 1]


def test_past_the_frames_a_text_has_its_length_still_holds() -> None:
    """Faster than a text has frames for a frame per phoneme (the tests' Coqui model, one frame
    an id, beyond speed 2; the bundled voice beyond about 3.5), the length wins: the phonemes
    share the frames there are, evenly, rather than the text running long."""
    ids = [0, *[x for s in range(40, 70) for x in (s, 0)]]
    frames = [1] * len(ids)
    d = rule(frames, ids, 4.0)
    assert abs(d.sum() - len(ids) / 4) <= 1
    heard = d[np.asarray(ids) != 0]
    assert heard.sum() == d.sum() and set(heard.tolist()) == {0, 1}
    # Evenly: no two phonemes in a row go unheard.
    assert "00" not in "".join(str(int(x)) for x in heard)


@pytest.fixture(scope="module")
def coqui(coqui_model_files: tuple[Path, Path]) -> CoquiEngine:
    engine = CoquiEngine(*coqui_model_files, mode="torch")
    engine.load()
    return engine


def test_coqui_vits_lasts_one_over_the_speed(coqui: CoquiEngine) -> None:
    base = samples(coqui, TEXT, 1.0, COQUI_QUIET)
    for speed in SPEEDS:
        assert off_by(samples(coqui, TEXT, speed, COQUI_QUIET), base, speed) < TOLERANCE, speed


def test_coqui_vits_batches_each_item_at_the_speed(coqui: CoquiEngine) -> None:
    texts = [TEXT, "Short one.", THREE]
    singles = [samples(coqui, t, 1.0, COQUI_QUIET) for t in texts]
    batch = coqui.synthesize_batch([SynthesisItem(t, "default", 2.0, COQUI_QUIET) for t in texts])
    for audio, base in zip(batch, singles, strict=True):
        assert off_by(len(audio.pcm), base, 2.0) < TOLERANCE


def test_coqui_vits_onnx_lasts_one_over_the_speed(
    coqui_model_files: tuple[Path, Path], tmp_path: Path
) -> None:
    engine = CoquiEngine(*coqui_model_files, mode="onnx", onnx_dir=tmp_path)
    engine.load()
    base = samples(engine, TEXT, 1.0, COQUI_QUIET)
    for speed in (0.25, 2.0, 4.0):
        assert off_by(samples(engine, TEXT, speed, COQUI_QUIET), base, speed) < TOLERANCE, speed
    # The export's rule is the eager one, blanks told by the tokenizer's id (the test model has
    # about a frame an id: at speed 2 it just has a frame for each symbol).
    names = {i.name for i in engine._onnx.get_inputs()}
    feeds = {
        s: engine._onnx_feeds(SynthesisItem(TEXT, "default", s, COQUI_QUIET), names)
        for s in (1.0, 2.0)
    }
    outputs = ["output", engine._onnx_durations]
    frames = engine._noise.run(engine._onnx, outputs, feeds[1.0], 0)[1].reshape(-1)
    d = engine._noise.run(engine._onnx, outputs, feeds[2.0], 0)[1].reshape(-1)
    ids = feeds[2.0]["input"][0]
    blank = engine._synth.tts_model.tokenizer.characters.blank_id
    assert np.all(d[ids != blank] >= 1)
    import torch

    expected = (
        rescaled_durations(
            torch.tensor(frames).view(1, 1, -1), 2.0, torch.tensor(ids == blank).view(1, 1, -1)
        )
        .view(-1)
        .numpy()
    )
    assert d.sum() == expected.sum() and np.abs(d - expected).max() <= 1
    assert [p.name for p in tmp_path.glob("*.onnx")] == [
        f"{engine.fingerprint}.conv2d.{SPEED_RULE}.onnx"
    ]


# ---- through the gateway: the joins, SSML rates and breaks ---------------------------------


def zero_runs(pcm: np.ndarray[Any, Any]) -> list[int]:
    """Lengths of the runs of exact zero samples, longest first (the gateway's silences)."""
    zero = np.concatenate(([0], (pcm == 0).astype(np.int8), [0]))
    edges = np.diff(zero)
    return sorted((np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).tolist(), reverse=True)


async def piper_wav(client: TestClient[Any, Any], text: str, speed: float = 1.0) -> Any:
    """Noise-free audio through Piper's ``POST /`` (``length_scale`` 1/speed: the voice's own
    is 1.0)."""
    body = {"text": text, "noise_scale": 0, "noise_w_scale": 0, "length_scale": 1 / speed}
    resp = await client.post("/", json=body)
    assert resp.status == 200, await resp.text()
    pcm, rate = sf.read(io.BytesIO(await resp.read()), dtype="float32")
    assert rate == RATE
    return pcm


async def test_a_text_with_its_sentence_pauses_lasts_one_over_the_speed(
    gateway: GatewayFactory,
) -> None:
    client = await gateway()
    base = await piper_wav(client, THREE)
    assert pauses_of(base, 1.0)
    for speed in (0.25, 2.0, 4.0):
        pcm = await piper_wav(client, THREE, speed)
        assert off_by(len(pcm), len(base), speed) < TOLERANCE, speed
        # The two pauses between sentences are scaled as the speech is.
        assert pauses_of(pcm, speed), (speed, zero_runs(pcm)[:3])


def pauses_of(pcm: np.ndarray[Any, Any], speed: float) -> bool:
    """Whether the two longest silences of ``pcm`` are the sentence pause (250 ms) at ``speed``:
    the gateway's zeros, plus the few exact zeros at the voice's edges beside them (measured at
    speed 1: 0.4 and 5.4 ms; they scale with the speech), so within 10 ms / speed over it. The
    pause is a whole number of milliseconds (62 at speed 4)."""
    pause = round(round(250 / speed) / 1000 * RATE)
    return all(pause <= n <= pause + 0.01 / speed * RATE for n in zero_runs(pcm)[:2])


async def test_prosody_rates_are_the_speeds_documented(gateway: GatewayFactory) -> None:
    """docs/ssml.md: x-slow 0.5, slow 0.64, medium 1, fast 1.55, x-fast 2; ``80%`` of normal;
    ``+25%`` relative; ``1.5`` a multiplier. A document spoken wholly at a rate lasts
    1/rate of the plain text, its sentence pause included."""
    client = await gateway()
    base = len(await piper_wav(client, THREE))
    rates: dict[str, float] = {
        **{word: RATE_WORDS[word] for word in ("x-slow", "slow", "fast", "x-fast")},
        "80%": 0.8,
        "+25%": 1.25,
        "1.5": 1.5,
    }
    words = ("x-slow", "slow", "medium", "default", "fast", "x-fast")
    assert dict(zip(words, (0.5, 0.64, 1.0, 1.0, 1.55, 2.0), strict=True)) == RATE_WORDS
    for value, rate in rates.items():
        doc = f'<speak><prosody rate="{value}">{THREE}</prosody></speak>'
        n = len(await piper_wav(client, doc))
        assert off_by(n, base, rate) < TOLERANCE, (value, n / base)
        explained = await client.post(
            "/v1/ssml/explain",
            json={"model": "tts-1", "input": doc, "voice": "alloy"},
        )
        assert {s["speed"] for s in (await explained.json())["sentences"]} == {rate}


async def test_a_break_stays_exact_at_any_speed(gateway: GatewayFactory) -> None:
    client = await gateway()
    doc = '<speak>Please hold. <break time="700ms"/> Thank you.</speak>'
    for speed in (0.5, 1.0, 4.0):
        pcm = await piper_wav(client, doc, speed)
        assert zero_runs(pcm)[0] == round(0.7 * RATE), speed
    # A rate nested in a faster request multiplies; the break inside it is still exact.
    nested = (
        '<speak><prosody rate="x-fast">One moment. <break time="1s"/> Still here.</prosody></speak>'
    )
    pcm = await piper_wav(client, nested, 2.0)
    assert zero_runs(pcm)[0] == RATE


# ---- the default topology: the engine in the host's pool processes ---------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    srv = DefaultServer(tmp_path_factory.mktemp("speed") / "srv")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.close()


async def test_voxgate_serve_speaks_at_the_speed_asked(server: DefaultServer) -> None:
    lengths = {}
    for speed in (1.0, 2.0, 0.5):
        body = {"text": THREE, "noise_scale": 0, "noise_w_scale": 0, "length_scale": 1 / speed}
        status, _, data = await server.request("POST", "/", json=body)
        assert status == 200, data[:300]
        lengths[speed] = sf.info(io.BytesIO(data)).frames
    for speed in (2.0, 0.5):
        assert off_by(lengths[speed], lengths[1.0], speed) < TOLERANCE, (speed, lengths)
