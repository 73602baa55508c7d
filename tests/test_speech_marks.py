"""Speech marks (docs/speech-marks.md): word timings computed beside synthesis from Piper's phoneme
durations, stored with the audio, served as Polly's NDJSON, captions and ElevenLabs' character
alignment.

The engine's own syntheses here run with Piper's noise scales at 0 (the same audio every run).
``POST /v1/audio/speech`` takes no noise fields (``NOISE_FREE`` in its bodies has no effect), so
what goes through the gateway runs with the voice's noise: its assertions hold for any draw, and
where two answers are compared they are encodings of one synthesis (the synthesis count says
so)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import html
import io
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt
from aiohttp.test_utils import TestClient
from openai import AsyncOpenAI

from bench import marks_timing
from bench.harness import COQUI_QUIET, speech_body
from gateway.api.normalize import say_as as normalize_say_as
from gateway.api.readings import read_numbers
from gateway.api.ssml import expand, plain_text, source_of
from gateway.runtime.components import default_engine_specs
from gateway.runtime.settings import Settings
from gateway.speech import marks as speech_marks
from synth import sentences
from synth.alignment import align_words, token_stream, word_spans
from synth.coqui_engine import CoquiEngine
from synth.engine import Audio, SynthesisItem
from synth.piper_engine import PiperEngine
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.served import DefaultServer
from tests.support import CountingEngine

# Module-scoped engines and servers: one xdist worker builds them.
pytestmark = pytest.mark.xdist_group("speech_marks")

NOISE_FREE = {"noise_scale": 0.0, "noise_w_scale": 0.0}
TEN_WORDS = [
    "Please",
    "listen",
    "carefully",
    "because",
    "our",
    "menu",
    "options",
    "have",
    "recently",
    "changed",
]


def body(text: str, **kw: Any) -> dict[str, Any]:
    return speech_body(text, **{**NOISE_FREE, **kw})


def ndjson(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


async def speak(client: TestClient[Any, Any], text: str, **kw: Any) -> tuple[str, bytes]:
    resp = await client.post("/v1/audio/speech", json=body(text, **kw))
    assert resp.status == 200, await resp.text()
    return resp.headers["X-Audio-Key"], await resp.read()


async def marks_of(client: TestClient[Any, Any], key: str, query: str = "") -> list[dict[str, Any]]:
    resp = await client.get(f"/v1/audio/{key}.marks{query}")
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/x-ndjson")
    return ndjson(await resp.read())


# ---- word alignment ----------------------------------------------------------------------------


def test_words_espeak_joins_or_expands_map_back_to_the_text() -> None:
    """espeak says "of the" as one phoneme word and "42" as two; each text word still gets its
    own phonemes and time."""
    text = "Out of the 42 cats."
    said = "aʊt ʌvðə fɔːɹti tuː kæts."
    stream = [(ph, i * 100, 100) for i, ph in enumerate(said)]
    alone = {"Out": "aʊt", "of": "ʌv", "the": "ðə", "42": "fɔːɹti tuː", "cats": "kæts"}
    words = align_words(text, stream, lambda w: list(alone[w]))
    assert [text[w.start : w.end] for w in words] == ["Out", "of", "the", "42", "cats"]
    assert [w.t0 // 100 for w in words] == [0, 4, 6, 9, 20]
    assert words[3].t1 == 19 * 100  # "fɔːɹti tuː" ends before the space
    assert all(a.t1 <= b.t0 for a, b in itertools.pairwise(words))


def test_after_a_pause_the_blank_is_the_pauses_not_the_next_sounds() -> None:
    """Between sounds a blank is the start of the sound after it; after a comma (a pause the
    voice keeps) it is still the pause: the word after starts at its own frames, and the
    stream stays gapless."""
    symbols = [None, "h", None, "i", None, ",", None, " ", None, "j", None, "o"]
    stream = token_stream(symbols, [10] * len(symbols))
    assert [(s, first) for s, first, _ in stream] == [
        ("h", 0),
        ("i", 20),
        (",", 40),
        (" ", 70),
        ("j", 90),
        ("o", 100),
    ]
    assert all(a[1] + a[2] == b[1] for a, b in itertools.pairwise(stream))
    # Without the comma the blank before "j" is its transition, as before.
    plain = token_stream([None, "h", None, " ", None, "j"], [10] * 6)
    assert plain[-1] == ("j", 40, 20)


def test_word_spans_leave_out_the_punctuation_around_words() -> None:
    text = '"Hello," she said -- (it\'s 3.5%).'
    assert [text[a:b] for a, b in word_spans(text)] == ["Hello", "she", "said", "it's", "3.5%"]


def test_marks_follow_the_join_of_sentences_and_breaks() -> None:
    """A part's word times move by where the join puts it: after the pause, less the head
    trimmed at a break."""
    rate = 1000
    loud = np.ones(100, dtype=np.float32)
    quiet = np.zeros(20, dtype=np.float32)
    part = np.concatenate([quiet, loud, quiet])  # 140 samples, sound at 20-120
    words = align_words("Hi", [("h", 20, 50), ("aɪ", 70, 50)], lambda w: ["h", "aɪ"])
    masters = [Audio(part, rate, words), Audio(part, rate, words)]
    joined = sentences.join_gaps([part, part], rate, [0.0, 0.5, 0.0], [False, True, False])
    placements = sentences.part_offsets([part, part], rate, [0.0, 0.5, 0.0], [False, True, False])
    found = speech_marks.compose("Hi. Hi.", ["Hi.", "Hi."], masters, placements)
    assert found is not None
    times = [m.time for m in found if m.type == "word"]
    # First at 20 ms; the second part lost its 20-sample tail, the break is 500, the second
    # part's head (20 samples) is trimmed: its word starts right after the break.
    assert times == [20, 120 + 500]
    assert joined[620] == 1.0 and joined[619] == 0.0
    assert [(m.start, m.end) for m in found if m.type == "word"] == [(0, 2), (4, 6)]


# ---- through the gateway -----------------------------------------------------------------------


async def test_marks_of_a_text_index_its_bytes_and_fit_its_audio(
    client: TestClient[Any, Any],
) -> None:
    text = "Café au lait costs 3 dollars. Thank you for calling!"
    # (As written: "3" is one word of the text that espeak says as "three".)
    key, wav = await speak(client, text, normalize="none")
    duration_ms = len(sf.read(io.BytesIO(wav))[0]) * 1000 / 22050
    found = await marks_of(client, key)
    raw = text.encode()
    words = [m for m in found if m["type"] == "word"]
    assert [m["value"] for m in words] == [
        "Café",
        "au",
        "lait",
        "costs",
        "3",
        "dollars",
        "Thank",
        "you",
        "for",
        "calling",
    ]
    for m in found:
        if m["type"] != "viseme":
            assert raw[m["start"] : m["end"]].decode() == m["value"]
        assert 0 <= m["time"] <= duration_ms
    assert [m["time"] for m in found] == sorted(m["time"] for m in found)
    sentences_ = [m for m in found if m["type"] == "sentence"]
    assert [m["value"] for m in sentences_] == [
        "Café au lait costs 3 dollars.",
        "Thank you for calling!",
    ]
    # A sentence starts with its first word; the second after the pause between sentences.
    assert sentences_[0]["time"] == words[0]["time"]
    assert sentences_[1]["time"] == words[6]["time"] > words[5]["time"] + 250
    visemes = {m["value"] for m in found if m["type"] == "viseme"}
    assert visemes <= {
        "p",
        "t",
        "S",
        "T",
        "f",
        "k",
        "i",
        "r",
        "s",
        "u",
        "@",
        "a",
        "e",
        "E",
        "o",
        "O",
        "sil",
    }
    assert {"k", "f", "sil"} <= visemes
    only = await marks_of(client, key, "?types=word,ssml")
    assert only == words
    resp = await client.get(f"/v1/audio/{key}.marks?types=word,bogus")
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "types"


async def test_a_hit_and_a_transcode_answer_the_misses_marks(
    client: TestClient[Any, Any], counting_engine: CountingEngine
) -> None:
    text = "Your call is important to us. Please hold."
    key, _ = await speak(client, text)
    first = await marks_of(client, key)
    synthesized = counting_engine.items
    again, _ = await speak(client, text)
    assert again == key
    mp3_key, _ = await speak(client, text, response_format="mp3")
    assert mp3_key != key
    resp = await client.get(f"/v1/audio/{key}.ulaw")
    assert resp.status == 200
    ulaw_key = resp.headers["X-Audio-Key"]
    assert counting_engine.items == synthesized  # all of it from the stored masters
    assert await marks_of(client, key) == first
    assert await marks_of(client, mp3_key) == first
    assert await marks_of(client, ulaw_key) == first


def parsed_vtt(data: str) -> list[Any]:
    """The cues of a WebVTT file as webvtt-py reads it (a real parser, not this module)."""
    return list(webvtt.from_string(data))


def vtt_cue_text(caption: Any) -> str:
    # webvtt-py leaves character references as they are: the W3C spec's decoding is HTML's.
    return html.unescape(caption.text)


async def test_captions_cut_phrases_at_words(client: TestClient[Any, Any]) -> None:
    """Cues are cut between words from the text as written: its punctuation and case stay."""
    text = (
        "Thank you for calling the city library information line. Our opening hours, as you "
        "may know, have changed for the holidays: we close early; on Sunday, not at all."
    )
    key, _ = await speak(client, text)
    resp = await client.get(f"/v1/audio/{key}.vtt")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/vtt")
    vtt = await resp.text()
    assert vtt.startswith("WEBVTT\n\n")
    cues = parsed_vtt(vtt)
    phrases = [vtt_cue_text(c) for c in cues]
    assert " ".join(phrases) == text
    assert all(len(p) <= 42 for p in phrases) and len(phrases) >= 4
    # No cue joins the end of one sentence to the next.
    assert any(p.endswith("line.") for p in phrases)
    assert [c.start_time.in_milliseconds() for c in cues] == sorted(
        c.start_time.in_milliseconds() for c in cues
    )
    resp = await client.get(f"/v1/audio/{key}.srt")
    assert resp.headers["Content-Type"].startswith("application/x-subrip")
    subs = list(srt.parse(await resp.text()))
    assert [s.index for s in subs] == list(range(1, len(cues) + 1))
    assert [s.content for s in subs] == phrases
    assert [round(s.start.total_seconds() * 1000) for s in subs] == [
        c.start_time.in_milliseconds() for c in cues
    ]


def caption_marks(text: str) -> list[speech_marks.Mark]:
    """Marks of ``text`` as :func:`speech_marks.compose` makes them (a sentence ends at a
    full stop before whitespace, a word per token), each word 100 ms after the one before."""
    offsets = list(itertools.accumulate((len(ch.encode()) for ch in text), initial=0))
    found = []
    for match in re.finditer(r"\S.*?(?:[.!?](?=\s|$)|$)", text, re.DOTALL):
        start, end = match.span()
        if start < end:
            found.append(
                speech_marks.Mark(0, "sentence", offsets[start], offsets[end], text[start:end])
            )
    for n, (start, end) in enumerate(word_spans(text)):
        found.append(
            speech_marks.Mark(n * 100, "word", offsets[start], offsets[end], text[start:end])
        )
    words = [m for m in found if m.type == "word"]
    for i, m in enumerate(found):
        if m.type == "sentence":
            first = next(w for w in words if w.start >= m.start)
            found[i] = dataclasses.replace(m, time=first.time)
    return sorted(found, key=lambda m: (m.time, m.type != "sentence"))


HOSTILE = (
    "Press <b>one</b> & then &amp; wait --> here.\n\n1\n00:00:01,000 --> 00:00:02,000\n"
    "Forged cue, <i>italic</i>; {\\an8}top. NOTE this: <c.red>red</c> <00:00:01.000> ok."
)


def test_caption_text_is_the_source_escaped_for_each_format() -> None:
    """Hostile text (tags, entities, the timing arrow, a blank line, a line of digits and a
    timing line) stays text: webvtt-py and srt read back the source's characters, one cue per
    cue written, no cue forged."""
    marks = caption_marks(HOSTILE)
    cues = speech_marks.cues(marks, 60_000)
    shown = [c.text for c in cues]
    assert " ".join(shown) == " ".join(HOSTILE.split())
    vtt = speech_marks.webvtt(cues)
    assert "-->" not in vtt.replace(" --> ", "") and "<" not in vtt
    parsed = parsed_vtt(vtt)
    assert [vtt_cue_text(c) for c in parsed] == shown
    assert [c.raw_text for c in parsed] == [c.text for c in parsed]  # no cue tag was read
    assert [c.start_time.in_milliseconds() for c in parsed] == [c.start_ms for c in cues]
    subs = list(srt.parse(speech_marks.subrip(cues)))
    assert [s.index for s in subs] == list(range(1, len(cues) + 1))
    joiner = "\u2060"
    assert [s.content.replace(joiner, "") for s in subs] == shown
    assert all("-->" not in s.content and "\n" not in s.content for s in subs)
    assert not any(re.search(r"<[a-z/]|\{\\", s.content) for s in subs)


def test_a_cue_keeps_words_that_share_a_source_span_together() -> None:
    """Where the offsets index what the client sent and a front end read one token as several
    words ("$1,250" said "one thousand two hundred fifty dollars"), those words share the
    token's span: the cue shows the token, and no cut falls inside it."""
    source = "The total is $1,250, due today."
    said = [
        "The",
        "total",
        "is",
        "one",
        "thousand",
        "two",
        "hundred",
        "fifty",
        "dollars",
        "due",
        "today",
    ]
    spans = [(0, 3), (4, 9), (10, 12), *[(13, 19)] * 6, (21, 24), (25, 30)]
    marks = [speech_marks.Mark(0, "sentence", 0, len(source), source)]
    marks += [
        speech_marks.Mark(n * 100, "word", a, b, w)
        for n, (w, (a, b)) in enumerate(zip(said, spans, strict=True))
    ]
    cues = speech_marks.cues(marks, 2000, max_chars=16, text=source.encode())
    assert [c.text for c in cues] == ["The total is", "$1,250, due", "today."]
    assert [c.start_ms for c in cues] == [0, 300, 1000]


async def test_with_timestamps_answers_elevenlabs_alignment_of_the_input(
    client: TestClient[Any, Any],
) -> None:
    text = "  Hello   there,\nfriend. "
    resp = await client.post("/v1/audio/speech/with-timestamps", json=body(text))
    assert resp.status == 200, await resp.text()
    got = await resp.json()
    wav = __import__("base64").b64decode(got["audio_base64"])
    audio, rate = sf.read(io.BytesIO(wav))
    assert rate == 22050
    alignment = got["alignment"]
    assert "".join(alignment["characters"]) == text
    starts, ends = (
        alignment["character_start_times_seconds"],
        alignment["character_end_times_seconds"],
    )
    assert len(starts) == len(ends) == len(text)
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends, strict=True))
    assert ends[-1] <= len(audio) / rate + 0.001
    assert got["normalized_text"] == "Hello there, friend."
    words = [m for m in got["marks"] if m["type"] == "word"]
    raw = text.encode()
    assert [raw[m["start"] : m["end"]].decode() for m in words] == ["Hello", "there", "friend"]
    # The character alignment puts each word's first letter at its mark.
    for m in words:
        assert starts[len(raw[: m["start"]].decode())] == round(m["time"] / 1000, 3)
    # The same key's marks, by key, index the normalized text.
    by_key = await marks_of(client, got["key"])
    assert [m["time"] for m in by_key] == [m["time"] for m in got["marks"]]
    assert resp.headers["X-Cache"] == "MISS"
    again = await client.post("/v1/audio/speech/with-timestamps", json=body(text))
    assert again.headers["X-Cache"] == "HIT"
    assert (await again.json())["marks"] == got["marks"]


async def test_voices_say_which_have_marks_and_others_are_refused_by_name(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    unmarked = CountingEngine(counting_engine.inner)
    unmarked.capabilities = dataclasses.replace(unmarked.capabilities, speech_marks=False)
    unmarked.name = "plain"
    client = await gateway(engines={"piper": counting_engine, "plain": unmarked})
    resp = await client.get("/v1/voices")
    listing = {m["id"]: m["voices"][0]["speech_marks"] for m in (await resp.json())["models"]}
    assert listing == {"piper": True, "plain": False}
    resp = await client.post(
        "/v1/audio/speech/with-timestamps", json=body("Hello.", model="plain", voice="joe")
    )
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert "voice 'joe' of model 'plain'" in error["message"]
    assert error["code"] == "marks_unsupported"


# ---- accuracy ----------------------------------------------------------------------------------

# Where a word's sound begins after a break: the first sample above the level the gateway takes
# for an engine's near-silence when it trims at a break (synth.sentences.SILENCE_LEVEL).
ONSET_LEVEL = sentences.SILENCE_LEVEL
TOLERANCE_MS = 30.0


def break_onsets(pcm: np.ndarray[Any, Any], rate: int, break_ms: int) -> list[float]:
    """The end of each run of exact zeros at least ``break_ms`` long (a break the gateway
    inserted), and the first sample above the silence floor after it, both in ms."""
    zero = pcm == 0.0
    min_run = round(break_ms * rate / 1000) - 2
    onsets = []
    i = 0
    while i < len(pcm):
        if zero[i]:
            j = i
            while j < len(pcm) and zero[j]:
                j += 1
            if j - i >= min_run and j < len(pcm):
                loud = np.flatnonzero(np.abs(pcm[j:]) > ONSET_LEVEL)
                onsets.append((j * 1000 / rate, (j + int(loud[0])) * 1000 / rate))
            i = j
        else:
            i += 1
    return onsets  # type: ignore[return-value]


def break_errors(pcm: np.ndarray[Any, Any], rate: int, words: list[dict[str, Any]]) -> list[float]:
    """For each word after an 800 ms break: its mark minus the onset of its sound (ms); asserts
    the mark is not before the break's end."""
    onsets = break_onsets(pcm, rate, 800)
    assert len(onsets) == len(words) - 1
    errors = []
    for (silence_end, onset), word in zip(onsets, words[1:], strict=True):
        assert word["time"] >= silence_end - 1, (word, silence_end)  # ms marks round
        errors.append(word["time"] - onset)
    return errors


async def assert_words_marked_at_break_ends(
    client: TestClient[Any, Any], key: str, wav: bytes, engine: str
) -> None:
    """``wav`` (stored as ``key``) speaks TEN_WORDS with 800 ms breaks: each word's mark is
    within TOLERANCE_MS of its onset after its break, and no mark is past the audio's end."""
    pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
    found = await marks_of(client, key)
    words = [m for m in found if m["type"] == "word"]
    assert [m["value"] for m in words] == TEN_WORDS
    errors = break_errors(pcm, rate, words)
    print(engine, "break errors ms", [round(e, 1) for e in errors])
    assert max(abs(e) for e in errors) <= TOLERANCE_MS, errors
    assert all(m["time"] <= len(pcm) * 1000 / rate for m in found)


async def test_each_word_after_a_break_is_marked_at_its_onset(
    client: TestClient[Any, Any],
) -> None:
    """Ten words, each after an 800 ms break: each word's mark falls after the break and within
    30 ms of where its samples rise above the silence floor (docs/speech-marks.md gives the
    figures)."""
    ssml = "<speak>" + '<break time="800ms"/>'.join(TEN_WORDS) + "</speak>"
    key, wav = await speak(client, ssml)
    await assert_words_marked_at_break_ends(client, key, wav, "piper")


def test_a_words_mark_is_its_sounds_onset_in_the_engines_own_audio(
    piper_engine: PiperEngine,
) -> None:
    """The same measure without the gateway's trim at breaks (which puts a mark that falls in
    the trimmed near-silence on the break's end): each of the ten words synthesized alone, its
    mark against the first sample above the silence floor of the engine's own audio."""
    params = {"noise_scale": 0.0, "noise_w": 0.0}
    items = [SynthesisItem(word, "joe", params=params) for word in TEN_WORDS]
    errors = []
    for got in piper_engine.synthesize_batch(items):
        assert got.words is not None and len(got.words) == 1
        onset = int(np.flatnonzero(np.abs(got.pcm) > ONSET_LEVEL)[0])
        errors.append((got.words[0].t0 - onset) * 1000 / got.sample_rate)
    print("engine onset errors ms", [round(e, 1) for e in errors])
    assert max(abs(e) for e in errors) <= TOLERANCE_MS, errors


def test_words_after_commas_are_marked_at_their_onset(piper_engine: PiperEngine) -> None:
    """Words after a comma, semicolon or colon inside a sentence: each mark against the first
    loud sample after the pause before the word in the engine's own audio (the measure of
    bench/marks_timing.py). Counting the blank before such a word put marks 26 ms early at the
    median and up to 106 ms (the blank is the pause's silence); the marks must not lean early."""
    texts = [
        "Hello, how are you today?",
        "To pay your bill, press one; to speak to an agent, press two.",
        "Our store offers three sizes: small, medium and large.",
        "Meanwhile, the team kept working; nobody wanted to stop.",
        "Listen closely, the answer is hidden.",
        "Two things matter here: speed and care.",
    ]
    params = {"noise_scale": 0.0, "noise_w": 0.0}
    errors = []
    for text, got in zip(
        texts,
        piper_engine.synthesize_batch([SynthesisItem(t, "joe", params=params) for t in texts]),
        strict=True,
    ):
        words = got.words
        assert words is not None
        rate = got.sample_rate
        times_ms = [round(w.t0 * 1000 / rate) for w in words]
        for i in range(1, len(words)):
            if not any(ch in ",;:" for ch in text[words[i - 1].end : words[i].start]):
                continue
            lo, hi = marks_timing.window(times_ms, i, rate, len(got.pcm))
            onset = marks_timing.onset_after_pause(got.pcm, rate, lo, hi)
            assert onset is not None, text[words[i].start : words[i].end]
            errors.append((words[i].t0 - onset) * 1000 / rate)
    print("errors after commas ms", [round(e, 1) for e in errors])
    assert len(errors) == 10
    magnitudes = sorted(abs(e) for e in errors)
    assert magnitudes[len(errors) // 2] <= 15 and magnitudes[-2] <= TOLERANCE_MS, errors
    assert abs(sum(errors) / len(errors)) <= 10, errors


# ---- the Coqui test model ------------------------------------------------------------------------

# The Coqui test model has random weights: what it says is no speech, and its sound starts at the
# first sample. The truth is the break: the gateway inserts exact zeros, so where the model's
# samples start again after it is measurable whatever the model says.


async def test_each_word_after_a_break_is_marked_at_its_onset_on_coqui(
    gateway: GatewayFactory, settings: Settings, coqui_model_files: tuple[Path, Path]
) -> None:
    """The ten words with 800 ms breaks on the Coqui test model (VITS, torch): its duration
    predictor's frames give the marks; /v1/voices says its voice has them."""
    model, config = coqui_model_files
    settings = settings.replace(coqui_model=str(model), coqui_config=str(config), synth_workers=0)
    client = await gateway(
        settings=settings, engines=await asyncio.to_thread(default_engine_specs, settings)
    )
    listing = await (await client.get("/v1/voices")).json()
    marked = {m["id"]: [v["speech_marks"] for v in m["voices"]] for m in listing["models"]}
    assert marked == {"piper": [True], "coqui": [True]}
    ssml = "<speak>" + '<break time="800ms"/>'.join(TEN_WORDS) + "</speak>"
    resp = await client.post(
        "/v1/audio/speech",
        json=speech_body(ssml, model="coqui", voice="default", noise_scale=0.0),
    )
    assert resp.status == 200, await resp.text()
    await assert_words_marked_at_break_ends(
        client, resp.headers["X-Audio-Key"], await resp.read(), "coqui"
    )


@pytest.fixture(scope="module")
def coqui_engines(
    coqui_model_files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[CoquiEngine, CoquiEngine]:
    """The Coqui test model in torch and in ONNX Runtime (its export), loaded once."""
    torch_engine = CoquiEngine(*coqui_model_files, mode="torch")
    onnx_engine = CoquiEngine(
        *coqui_model_files, mode="onnx", onnx_dir=tmp_path_factory.mktemp("coqui-onnx")
    )
    torch_engine.load()
    onnx_engine.load()
    return torch_engine, onnx_engine


def test_coqui_words_are_its_duration_predictors_frames_in_torch_and_onnx(
    coqui_engines: tuple[CoquiEngine, CoquiEngine],
) -> None:
    """Each word of a Coqui VITS item runs from the blank before its first character (after
    the comma, from the character's own frames) to the end of its last character's frames;
    its export in ONNX Runtime gives the same frames as torch
    (durations are whole frames, so the two agree exactly), batched or alone, at any speed."""
    torch_engine, onnx_engine = coqui_engines
    text = "Please hold, your call matters."
    items = [
        SynthesisItem(text, "default", speed=speed, params=COQUI_QUIET) for speed in (1.0, 1.5)
    ]
    for engine in (torch_engine, onnx_engine):
        for got in engine.synthesize_batch(items):
            assert got.words is not None
            assert [text[w.start : w.end] for w in got.words] == [
                "Please",
                "hold",
                "your",
                "call",
                "matters",
            ]
            # Each character a phoneme: the model's front end is its characters.
            assert ["".join(p for p, _ in w.phonemes) for w in got.words] == [
                "please",
                "hold",
                "your",
                "call",
                "matters",
            ]
            assert got.words[0].t0 == 0
            assert all(a.t1 <= b.t0 for a, b in itertools.pairwise(got.words))
            assert got.words[-1].t1 <= len(got.pcm)
    alone = torch_engine.synthesize_batch(items[:1])[0]
    batched = torch_engine.synthesize_batch(
        [items[0], SynthesisItem("Hi.", "default", params=COQUI_QUIET)]
    )[0]
    exported = onnx_engine.synthesize_batch(items[:1])[0]
    assert alone.words == batched.words == exported.words


# ---- as users run it ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    """``voxgate serve`` with no topology flags: gateway processes and the host's pool process,
    so the timings cross the worker's and the pool's sockets before they are stored."""
    with DefaultServer(tmp_path_factory.mktemp("marks") / "srv").serving() as srv:
        yield srv


async def test_served_marks_cross_the_processes_and_every_route_agrees(
    server: DefaultServer,
) -> None:
    text = "Thank you for calling. Please hold while we connect you."
    speech = {"model": "piper", "voice": "joe", "input": text, "response_format": "wav"}
    status, headers, wav = await server.request(
        "POST", "/v1/audio/speech", json={**speech, **NOISE_FREE}
    )
    assert status == 200
    key = headers["X-Audio-Key"]
    duration_ms = len(sf.read(io.BytesIO(wav))[0]) * 1000 / 22050
    status, headers, data = await server.request("GET", f"/v1/audio/{key}.marks")
    assert status == 200 and headers["Content-Type"].startswith("application/x-ndjson")
    found = ndjson(data)
    words = [m for m in found if m["type"] == "word"]
    assert " ".join(m["value"] for m in words) == text.replace(".", "")
    assert all(0 <= m["time"] <= duration_ms for m in found)
    # Every gateway process answers the same marks (new connections: the kernel picks one).
    for _ in range(4):
        assert ndjson((await server.request("GET", f"/v1/audio/{key}.marks"))[2]) == found
    status, _, data = await server.request(
        "POST", "/v1/audio/speech/with-timestamps", json={**speech, **NOISE_FREE}
    )
    assert status == 200
    timed = json.loads(data)
    assert timed["key"] == key and timed["marks"] == found
    status, headers, _ = await server.request("GET", f"/v1/audio/{key}.ulaw")
    assert status == 200
    ulaw_marks = ndjson(
        (await server.request("GET", f"/v1/audio/{headers['X-Audio-Key']}.marks"))[2]
    )
    assert ulaw_marks == found
    status, _, data = await server.request("GET", f"/v1/audio/{key}.srt")
    assert status == 200 and data.decode().startswith("1\n00:00:00,")
    status, _, data = await server.request("GET", "/v1/voices")
    voices = json.loads(data)["models"][0]["voices"]
    assert voices[0]["speech_marks"] is True


async def test_served_captions_show_the_texts_characters_safely(server: DefaultServer) -> None:
    """Captions fetched as users fetch them (``GET /v1/audio/{key}.vtt`` and ``.srt`` of
    ``voxgate serve``), of a text with markup, entities, the timing arrow, a blank line and a
    forged SubRip cue in it: the parsers read back the text's own characters (whitespace runs as
    one space, as the spoken text has them), cue for cue, and nothing else. The text goes as
    written (``normalize: "none"``): by key, captions show the text the voice read, and the
    default front end would read the forged cue's digits out."""
    text = (
        'Press <b>one</b> & wait --> here, "now".\n\n1\n00:00:01,000 --> 00:00:02,000\n'
        "Then: &amp; done; goodbye."
    )
    speech = {"model": "piper", "voice": "joe", "input": text, "response_format": "wav"}
    status, headers, _ = await server.request(
        "POST", "/v1/audio/speech", json={**speech, **NOISE_FREE, "normalize": "none"}
    )
    assert status == 200
    key = headers["X-Audio-Key"]
    status, headers, data = await server.request("GET", f"/v1/audio/{key}.vtt")
    assert status == 200 and headers["Content-Type"].startswith("text/vtt")
    vtt = parsed_vtt(data.decode())
    shown = [vtt_cue_text(c) for c in vtt]
    assert " ".join(shown) == " ".join(text.split())
    assert [c.raw_text for c in vtt] == [c.text for c in vtt]  # no cue tag was read
    status, headers, data = await server.request("GET", f"/v1/audio/{key}.srt")
    assert status == 200 and headers["Content-Type"].startswith("application/x-subrip")
    subs = list(srt.parse(data.decode()))
    assert [s.index for s in subs] == list(range(1, len(vtt) + 1))
    assert [s.content.replace("\u2060", "") for s in subs] == shown
    assert [s.start for s in subs] == [
        datetime.timedelta(milliseconds=c.start_time.in_milliseconds()) for c in vtt
    ]


# ---- SSML <mark> -------------------------------------------------------------------------------


def test_ssml_marks_ride_the_expansion_with_their_offsets() -> None:
    doc = (
        '<speak><mark name="start"/>Hello <mark name="mid"/>world.<break time="500ms"/>'
        '<mark name="after"/><prosody rate="slow">Bye</prosody><mark name="end"/></speak>'
    )
    segments = expand(doc, language="en_US")
    assert [(s.words, s.marks) for s in segments] == [
        ("Hello world.", (("start", 0), ("mid", 6), ("after", 12))),
        ("Bye", (("end", 3),)),
    ]
    assert speech_marks.ssml_positions(segments) == [
        ("start", 0),
        ("mid", 6),
        ("after", 12),
        ("end", 16),
    ]
    # A document without marks expands as before (its address does not move).
    plain = expand("<speak>Hello world.</speak>", language="en_US")
    assert plain_text(plain) == "Hello world."
    assert (
        plain_text(expand('<speak>Hello <mark name="m"/>world.</speak>', language="en_US")) is None
    )


async def test_an_ssml_mark_is_heard_with_the_word_after_it(
    client: TestClient[Any, Any],
) -> None:
    ssml = (
        '<speak>Welcome.<break time="800ms"/><mark name="menu"/>Press one for sales.'
        '<mark name="end"/></speak>'
    )
    key, wav = await speak(client, ssml)
    pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
    found = await marks_of(client, key)
    text = "Welcome. Press one for sales."
    ssml_marks = {m["value"]: m for m in found if m["type"] == "ssml"}
    words = {m["value"]: m for m in found if m["type"] == "word"}
    assert ssml_marks["menu"]["time"] == words["Press"]["time"]
    assert ssml_marks["menu"]["start"] == ssml_marks["menu"]["end"] == text.index("Press")
    ((silence_end, _),) = break_onsets(pcm, rate, 800)
    assert ssml_marks["menu"]["time"] >= silence_end - 1
    assert ssml_marks["end"]["time"] == round(len(pcm) * 1000 / rate)
    assert await marks_of(client, key, "?types=ssml") == sorted(
        ssml_marks.values(), key=lambda m: m["time"]
    )


# ---- server-sent events ------------------------------------------------------------------------


async def sse_events(
    http: TestClient[Any, Any], text: str, *, marks: bool = True
) -> tuple[str, list[dict[str, Any]]]:
    """``stream_format: "sse"`` through the official openai client (``speech_marks`` asked)."""
    async with (
        AsyncOpenAI(
            base_url=str(http.make_url("/v1")), api_key=canary("client"), max_retries=0
        ) as oa,
        oa.audio.speech.with_streaming_response.create(
            model="tts-1",
            voice="alloy",
            input=text,
            response_format="pcm",
            stream_format="sse",
            extra_body={**NOISE_FREE, "speech_marks": marks},
        ) as resp,
    ):
        key = resp.headers["x-audio-key"]
        lines = [line async for line in resp.iter_lines()]
    return key, [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


async def test_sse_sends_each_sentences_marks_before_its_audio(gateway: GatewayFactory) -> None:
    http = await gateway()
    text = "Thank you for calling. Your order has shipped. Goodbye."
    key, events = await sse_events(http, text)
    sent_ms = 0.0
    streamed: list[dict[str, Any]] = []
    for e in events:
        if e["type"] == "speech.audio.delta":
            sent_ms += len(base64.b64decode(e["audio"])) / 2 / 24
        elif e["type"] == "speech.marks.delta":
            # Marks come before the audio they cover: none is of audio already sent.
            assert all(m["time"] >= sent_ms - 1 for m in e["marks"]), (sent_ms, e["marks"])
            streamed += e["marks"]
    assert events[-1]["type"] == "speech.audio.done"
    assert sum(e["type"] == "speech.marks.delta" for e in events) == 3  # one per sentence
    stored = await marks_of(http, key)
    assert streamed == stored
    # Stored audio: all its marks in one event, first.
    again_key, again = await sse_events(http, text)
    assert again_key == key
    assert again[0] == {"type": "speech.marks.delta", "marks": stored}
    # Not asked for: OpenAI's two event types only.
    _, plain = await sse_events(http, text, marks=False)
    assert {e["type"] for e in plain} == {"speech.audio.delta", "speech.audio.done"}
    resp = await http.post("/v1/audio/speech", json=body(text, speech_marks=True))
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == "speech_marks"


# ---- Pipecat -----------------------------------------------------------------------------------


def docs_recipe(section: str) -> dict[str, Any]:
    """What the first Python block under ``## <section>`` of docs/speech-marks.md defines, run
    as the page shows it."""
    page = (Path(__file__).parents[1] / "docs" / "speech-marks.md").read_text()
    code = page.split(f"## {section}", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/speech-marks.md", "exec"), namespace)
    return namespace


async def test_the_pipecat_recipe_times_pipecats_words_by_the_marks(
    gateway: GatewayFactory,
) -> None:
    """The documented service in a real Pipecat pipeline (``pipecat.tests.utils.run_test``):
    its audio frames and the word frames Pipecat makes from the word timestamps."""
    import aiohttp
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame, TTSTextFrame
    from pipecat.pipeline.task import PipelineParams
    from pipecat.tests.utils import run_test

    http = await gateway()
    recipe = docs_recipe("Pipecat")
    text = "Thank you for calling. Goodbye."
    async with aiohttp.ClientSession() as session:
        service = recipe["VoxgateTTSService"](
            session=session, base_url=str(http.make_url("")), model="piper", voice="joe"
        )
        down, _ = await run_test(
            service,
            frames_to_send=[TTSSpeakFrame(text)],
            pipeline_params=PipelineParams(audio_out_sample_rate=24000),
        )
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    assert len(audio) > 0 and all(
        f.sample_rate == 24000 for f in down if isinstance(f, TTSAudioRawFrame)
    )
    # Pipecat's word frames, made from the word timestamps (the sentence's own frame aside).
    spoken = [f for f in down if isinstance(f, TTSTextFrame) and f.text_type == "word"]
    assert [f.text.strip() for f in spoken] == ["Thank", "you", "for", "calling", "Goodbye"]
    stamps = [f.pts for f in spoken]
    assert all(isinstance(p, int) for p in stamps) and stamps == sorted(stamps)


# ---- LiveKit Agents ----------------------------------------------------------------------------


async def test_the_livekit_recipe_times_livekits_words_by_the_marks(
    gateway: GatewayFactory,
) -> None:
    """The documented TTS with the real ``livekit-agents``: the words it pushes ride the audio
    frames (``lk.timed_transcripts``, what the voice pipeline hands its transcript
    synchronizer), each timed from the start of the stream's audio, across sentences."""
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, TimedString

    http = await gateway()
    recipe = docs_recipe("LiveKit Agents")
    tts = recipe["VoxgateTTS"](base_url=str(http.make_url("")), model="piper", voice="joe")
    first, second = "Thank you for calling our support line.", "Please hold while we connect you."
    try:
        stream = tts.stream()
        for token in (first[:12], first[12:] + " ", second):  # as an LLM's tokens come
            stream.push_text(token)
        stream.end_input()
        async with stream:
            events = [event async for event in stream]
        async with tts.synthesize("Goodbye for now.") as chunked:
            alone = [event async for event in chunked]
    finally:
        await tts.aclose()
    frames = [event.frame for event in events]
    assert {f.sample_rate for f in frames} == {24000}
    seconds = sum(f.samples_per_channel / f.sample_rate for f in frames)
    words = [w for f in frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    assert all(isinstance(w, TimedString) for w in words)
    assert "".join(words).split() == (first + " " + second).replace(".", "").split()
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and starts[0] >= 0 and starts[-1] < seconds
    assert all(w.start_time <= w.end_time for w in words)
    # The second sentence's words count from the start of the stream: after the first's audio.
    assert words[7].start_time >= words[6].end_time > words[6].start_time
    # Each sentence is one with-timestamps request: its marks are the stored audio's.
    again = await http.post(
        "/v1/audio/speech/with-timestamps",
        json=speech_body(
            second, model="piper", voice="joe", response_format="pcm", sample_rate=24000
        ),
    )
    assert again.headers["X-Cache"] == "HIT"
    stored = (await again.json())["marks"]
    first_word = next(m for m in stored if m["type"] == "word")["time"] / 1000
    assert abs(words[7].start_time - words[6].end_time - first_word) < 0.002
    said = [w for e in alone for w in e.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    assert "".join(said).split() == ["Goodbye", "for", "now"]


def test_character_alignment_of_a_text_without_words() -> None:
    """Punctuation alone has no word marks: every character spans the audio."""
    got = speech_marks.character_alignment("!", [], 500)
    assert got == {
        "characters": ["!"],
        "character_start_times_seconds": [0.0],
        "character_end_times_seconds": [0.5],
    }
    assert speech_marks.parse_types(" word , ssml ") == {"word", "ssml"}
    for bad in ("word,,ssml", "bogus"):
        try:
            speech_marks.parse_types(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


# ---- offsets into an SSML input ----------------------------------------------------------------


async def test_ssml_words_map_to_the_source_they_came_from(gateway: GatewayFactory) -> None:
    """With-timestamps of an SSML input: each word mark spans the document's bytes it came
    from; a word a ``say-as`` or ``sub`` made spans that element's content, so two marks may
    share one span; an ``ssml`` mark spans its ``<mark/>``."""
    client = await gateway()
    doc = (
        '<speak>Room <say-as interpret-as="cardinal">123</say-as> &amp; the '
        '<sub alias="World Wide Web">WWW</sub>.<break time="500ms"/>'
        '<mark name="next"/>Café au lait.</speak>'
    )
    resp = await client.post("/v1/audio/speech/with-timestamps", json=body(doc))
    assert resp.status == 200, await resp.text()
    got = await resp.json()
    raw = doc.encode()
    said = [
        (m["value"], raw[m["start"] : m["end"]].decode())
        for m in got["marks"]
        if m["type"] == "word"
    ]
    assert said == [
        ("Room", "Room"),
        ("one", "123"),
        ("hundred", "123"),
        ("and", "123"),
        ("twenty-three", "123"),
        ("&", "&amp;"),
        ("the", "the"),
        ("World", "WWW"),
        ("Wide", "WWW"),
        ("Web", "WWW"),
        ("Café", "Café"),
        ("au", "au"),
        ("lait", "lait"),
    ]
    (mark,) = [m for m in got["marks"] if m["type"] == "ssml"]
    assert raw[mark["start"] : mark["end"]] == b'<mark name="next"/>'
    sentences_ = [
        raw[m["start"] : m["end"]].decode() for m in got["marks"] if m["type"] == "sentence"
    ]
    assert sentences_[-1] == "Café au lait."
    # The characters' alignment covers the words said (markup has no time).
    assert "".join(got["alignment"]["characters"]) == got["normalized_text"]
    # SSML content sent as SSML without its root: offsets into what was sent.
    inner = doc.removeprefix("<speak>").removesuffix("</speak>")
    resp = await client.post(
        "/v1/audio/speech/with-timestamps", json=body(inner, input_type="ssml")
    )
    assert resp.status == 200, await resp.text()
    inner_raw = inner.encode()
    words = [m for m in (await resp.json())["marks"] if m["type"] == "word"]
    assert [inner_raw[m["start"] : m["end"]].decode() for m in words][:3] == ["Room", "123", "123"]
    # The stored marks, by key, index the spoken text.
    by_key = await marks_of(client, got["key"])
    spoken = got["normalized_text"].encode()
    assert [spoken[m["start"] : m["end"]].decode() for m in by_key if m["type"] == "word"] == [
        value for value, _ in said
    ]


def test_words_a_front_end_wrote_span_the_characters_they_read() -> None:
    """A word the rewrite kept keeps its bytes; the words written for "42" all span "42"."""
    text = "Room 42 now"
    chars = [(ch, (10 + i, 11 + i)) for i, ch in enumerate(text)]
    out = speech_marks.rewritten_source(chars, lambda t: t.replace("42", "forty two"))
    assert "".join(ch for ch, _ in out) == "Room forty two now"
    assert out[:5] == chars[:5]
    assert {span for ch, span in out[5:14]} == {(15, 17)}
    assert out[-4:] == chars[-4:]
    # Nothing rewritten: the same characters.
    assert speech_marks.rewritten_source(chars, lambda t: t) == chars


@pytest.mark.parametrize("normalize", [None, "numbers"])
async def test_ssml_words_the_number_front_end_read_map_to_their_digits(
    gateway: GatewayFactory, normalize: str | None
) -> None:
    """Under auto (the default) and numbers the SSML source map is kept: each word read from a
    bare number spans its digits, a say-as's words its content, the document's words their own."""
    client = await gateway()
    doc = '<speak>Your PIN is 0042, room <say-as interpret-as="digits">12</say-as>.</speak>'
    kw = {"normalize": normalize} if normalize else {}
    resp = await client.post("/v1/audio/speech/with-timestamps", json=body(doc, **kw))
    assert resp.status == 200, await resp.text()
    got = await resp.json()
    raw = doc.encode()
    said = [
        (m["value"], raw[m["start"] : m["end"]].decode())
        for m in got["marks"]
        if m["type"] == "word"
    ]
    pin = read_numbers("0042", "en").split()
    assert said == [
        ("Your", "Your"),
        ("PIN", "PIN"),
        ("is", "is"),
        *[(word, "0042") for word in pin],
        ("room", "room"),
        ("one", "12"),
        ("two", "12"),
    ]


async def test_plain_words_the_number_front_end_read_map_to_their_digits(
    gateway: GatewayFactory,
) -> None:
    """Plain text under auto: the marks index the input as sent (each word read from "0042"
    spans it) and the characters' alignment covers the words said."""
    client = await gateway()
    text = "Your PIN is 0042, thanks."
    resp = await client.post("/v1/audio/speech/with-timestamps", json=body(text))
    assert resp.status == 200, await resp.text()
    got = await resp.json()
    raw = text.encode()
    said = [
        (m["value"], raw[m["start"] : m["end"]].decode())
        for m in got["marks"]
        if m["type"] == "word"
    ]
    pin = read_numbers("0042", "en").split()
    assert said == [
        ("Your", "Your"),
        ("PIN", "PIN"),
        ("is", "is"),
        *[(word, "0042") for word in pin],
        ("thanks", "thanks"),
    ]
    (sentence,) = [m for m in got["marks"] if m["type"] == "sentence"]
    assert raw[sentence["start"] : sentence["end"]].decode() == text
    assert "".join(got["alignment"]["characters"]) == got["normalized_text"]
    assert got["normalized_text"] == read_numbers(text, "en")


def test_ssml_source_of_entities_and_a_text_only_say_as() -> None:
    """Where each character of an expansion came from: an entity stands for its reference, a
    plain say-as expansion (no segments) keeps its source too."""
    doc = '<speak>A &lt; B, <say-as interpret-as="characters">ab</say-as>.</speak>'
    source = source_of(doc, language="en_US")
    raw = doc.encode()
    assert [(ch, raw[a:b].decode()) for ch, (a, b) in source.chars if not ch.isspace()] == [
        ("A", "A"),
        ("<", "&lt;"),
        ("B", "B"),
        (",", ","),
        *[(ch, "ab") for ch in normalize_say_as("characters", "ab", "en", "") if not ch.isspace()],
        (".", "."),
    ]
    assert source.marks == ()
    spoken = plain_text(expand(doc, language="en_US"))
    assert spoken is not None
    mapped = speech_marks.SsmlSourceMap(spoken, doc, source.chars, source.marks)
    assert mapped.exact


async def test_marks_turned_off_leave_every_voice_without_them(
    gateway: GatewayFactory, settings: Settings
) -> None:
    """``speech_marks = false``: the engines skip the durations output and the alignment (the
    bench's "off" row), /v1/voices says so and the marks routes refuse by name."""
    settings = settings.replace(speech_marks=False, synth_workers=0)
    client = await gateway(
        settings=settings, engines=await asyncio.to_thread(default_engine_specs, settings)
    )
    listing = await (await client.get("/v1/voices")).json()
    assert [v["speech_marks"] for m in listing["models"] for v in m["voices"]] == [False]
    key, _ = await speak(client, "Hello there.")
    resp = await client.get(f"/v1/audio/{key}.marks")
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "marks_unsupported"
