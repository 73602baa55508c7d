"""Takes from real third-party servers and from providers that answer 200 with no usable take,
behind ``voxgate serve`` as users start it. One module-scoped gateway, one local-tts-studio
(PyPI; Piper's joe voice at 22,050 Hz, which ignores the request's speed) and one
:class:`~tests.upstream_support.AnswerServer` serve every test here:

- ``wavstudio``: local-tts-studio behind a pass that asks it for WAV whatever voxgate asked,
  as wyoming-openai-gateway answers (it needs Python 3.12, so it cannot run here): a pcm
  upstream at 24 kHz that gets 22,050 Hz WAV; asked for speed 2, it answers speed 1;
- ``studio``: local-tts-studio as it is;
- ``html``, ``json``, ``onehz``, ``endless``: 200s that are an HTML page, a JSON error, a WAV
  claiming 1 Hz, raw "pcm" that never ends.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from bench.harness import metric_sum, speech_body
from synth.audio import resample
from synth.engine import SynthesisItem
from synth.providers.base import answer_seconds
from tests.served import DefaultServer
from tests.test_upstream_serve import openai_entry, write_upstreams
from tests.upstream_support import AnswerServer, local_tts_studio

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("takes-thirdparty")]

SENTENCE = "Thank you for calling our office today."
FAKES = ("html", "json", "onehz", "endless")
# The most a TCP receive buffer grows to here.
RMEM_MAX = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])


@dataclass(frozen=True)
class Rig:
    front: DefaultServer
    answers: AnswerServer


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    directory = tmp_path_factory.mktemp("takes-thirdparty")
    with local_tts_studio(directory) as studio, AnswerServer(studio) as answers:
        pcm = {"format": "pcm", "voices": ["*"], "model": "tts-1", "timeout_s": 60}
        entries = [
            openai_entry("studio", studio, **{**pcm, "sample_rate": 22050}),
            openai_entry("wavstudio", answers.base_url("wavof"), **pcm),
            *(openai_entry(mode, answers.base_url(mode), **pcm) for mode in FAKES),
        ]
        upstreams = write_upstreams(directory / "upstreams.toml", *entries)
        # Loudness off: these tests compare what is served with the server's own samples, and
        # pcm passes through as it streams only without a level to reach (a sentence's gain
        # needs the whole sentence); the default level is tested served in test_loudness.
        front = DefaultServer(
            directory / "front", "--upstreams-file", str(upstreams), "--loudness-lufs", "off"
        )
        try:
            front.wait_ready()
            yield Rig(front, answers)
        finally:
            front.terminate()


def error_of(body: bytes) -> dict[str, str]:
    error: dict[str, str] = json.loads(body)["error"]
    return error


async def test_a_wav_answered_for_pcm_plays_at_its_true_rate_with_no_click(rig: Rig) -> None:
    """A pcm upstream at 24 kHz answered 22,050 Hz WAV by a real server: the streamed miss and
    the stored take are the server's own audio resampled to 24 kHz, as long as its WAV (not
    8.8% shorter), with no 44-byte 'RIFF' click at the start."""
    body = speech_body(SENTENCE, model="wavstudio", response_format="pcm")
    status, headers, heard = await rig.front.request("POST", "/v1/audio/speech", json=body)
    assert status == 200, heard
    assert headers["X-Cache"] == "MISS" and headers.get("Transfer-Encoding") == "chunked"
    own, own_rate = sf.read(io.BytesIO(rig.answers.wavs[-1]), dtype="float32")
    assert own_rate == 22050
    pcm = np.frombuffer(heard, dtype="<i2").astype(np.float32) / 32767
    assert abs(len(pcm) / 24000 - len(own) / own_rate) < 0.005
    assert not heard.startswith(b"RIFF")
    # (Resampling a peak at full scale may overshoot it: the 16-bit take clips there.)
    expected = np.clip(resample(own, own_rate, 24000), -1.0, 1.0)
    n = min(len(pcm), len(expected))
    assert np.max(np.abs(pcm[:22] - expected[:22])) < 4 / 32768  # the header would be ~0.57
    assert np.max(np.abs(pcm[:n] - expected[:n])) < 4 / 32768
    status, headers, stored = await rig.front.request("POST", "/v1/audio/speech", json=body)
    assert status == 200 and headers["X-Cache"] == "HIT"
    again = np.frombuffer(stored, dtype="<i2").astype(np.int32)
    assert again.shape == pcm.shape
    assert int(np.max(np.abs(again - np.frombuffer(heard, dtype="<i2")))) <= 2


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("html", "not_audio"), ("json", "not_audio"), ("onehz", "bad_rate")],
)
async def test_a_200_that_is_no_take_is_refused_and_never_stored(
    rig: Rig, mode: str, reason: str
) -> None:
    """An HTML page, a JSON error, a WAV claiming 1 Hz: a 502 JSON error naming the reason,
    and nothing stored (the same request asks the provider again, never a HIT)."""
    body = speech_body(f"The {mode} provider answers this sentence", model=mode)
    before = rig.answers.calls.get(mode, 0)
    for asked in (1, 2):
        status, headers, answer = await rig.front.request("POST", "/v1/audio/speech", json=body)
        assert status == 502, answer
        assert headers["Content-Type"].startswith("application/json")
        error = error_of(answer)
        assert error["code"] == "upstream_bad_reply" and reason in error["message"]
        # One call (no retry of a 200 that is no take), and no HIT after it: nothing stored.
        assert rig.answers.calls[mode] == before + asked


async def test_an_endless_body_is_cut_off_at_the_texts_longest_plausible_take(rig: Rig) -> None:
    """Raw pcm that never ends: refused as too_long once the bytes exceed what the text can
    take at 24 kHz (about 0.5 MB here), far below max_audio_mb (64 MiB), and not stored."""
    text = f"{SENTENCE} (endless)"
    body = speech_body(text, model="endless", response_format="wav")
    before = rig.answers.served.get("endless", 0)
    status, _, answer = await rig.front.request("POST", "/v1/audio/speech", json=body)
    assert status == 502 and "too_long" in error_of(answer)["message"]
    bound = 64 * 1024 + answer_seconds(SynthesisItem(text, "alloy"), "") * 24000 * 2
    served = rig.answers.served["endless"] - before
    # On top of what voxgate read, the fake wrote what the kernel's buffers held when voxgate
    # hung up (its receive buffer grows up to tcp_rmem's maximum); unbounded, it would have
    # written max_audio_mb (64 MiB) before a refusal.
    assert bound < served < min(bound + RMEM_MAX + 1024 * 1024, 64 * 1024 * 1024), served
    status, headers, _ = await rig.front.request("POST", "/v1/audio/speech", json=body)
    assert status == 502 and headers.get("X-Cache") != "HIT"


async def test_a_server_that_drops_speed_is_asked_again_then_refused_and_nothing_stored(
    rig: Rig,
) -> None:
    """local-tts-studio ignores ``speed``: asked for speed 2, it answers speed-1 audio (through
    the WAV pass, which counts its calls). The take checks refuse each take as
    ``speed_ignored``; after the two retakes the caller gets 502 ``take_rejected`` naming it,
    and nothing is stored under the speed-2 address (the next request asks again)."""
    body = speech_body(SENTENCE, model="wavstudio", response_format="wav", speed=2.0)
    calls = [rig.answers.calls.get("wavof", 0)]
    for _ in range(2):
        status, headers, answer = await rig.front.request("POST", "/v1/audio/speech", json=body)
        assert status == 502 and headers["Content-Type"].startswith("application/json"), answer
        error = error_of(answer)
        assert error["code"] == "take_rejected" and "speed_ignored" in error["message"]
        calls.append(rig.answers.calls["wavof"])
    # 1 + take_retries calls; the next request asks again (its first take may come from the
    # host pool's answers of the last 10 s, refused again without a call: its retakes never do).
    assert calls[1] - calls[0] == 3
    assert 2 <= calls[2] - calls[1] <= 3
    status, _, metrics = await rig.front.request("GET", "/metrics")
    assert status == 200
    refused = metric_sum(
        metrics.decode(),
        "voxgate_takes_total",
        model="wavstudio",
        verdict="rejected",
        reason="speed_ignored",
    )
    assert refused == 6  # every take judged, whether called anew or not
