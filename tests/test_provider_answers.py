"""A provider's 200 answer read as what it is, bounded (synth.providers.base.AnswerReader):
a WAV answered to a pcm request decoded at its own rate and resampled, whole or passed on in
pieces; text and impossible rates refused; a runaway body cut off at the text's longest
plausible take. Unit tests: no server (tests/test_takes_thirdparty.py has the served ones)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import numpy as np
import pytest
import soundfile as sf

from synth.audio import resample
from synth.engine import SynthesisItem
from synth.errors import UpstreamError
from synth.providers.base import AnswerReader, ProviderError, answer_seconds, wav_audio
from synth.upstream import UpstreamConfig
from tests.upstream_support import HeldWyomingServer, voiced, wav_header

TEXT = "Thank you for calling, how may I help you today?"


def entry(**fields: object) -> UpstreamConfig:
    base = {"name": "p", "kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    return UpstreamConfig.model_validate({**base, **fields})


def speech_wav(rate: int, seconds: float = 1.5) -> tuple[bytes, np.ndarray]:
    """A WAV of a deterministic swept tone at ``rate`` (its samples as float too)."""
    t = np.arange(int(rate * seconds)) / rate
    pcm = (0.4 * np.sin(2 * np.pi * (220 + 200 * t) * t)).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, pcm, rate, format="WAV", subtype="PCM_16")
    return out.getvalue(), pcm


class Counted:
    """A body in ``size`` pieces, counting the bytes the reader took."""

    def __init__(self, data: bytes | None, size: int = 4096, endless: bytes = b"") -> None:
        self.data, self.size, self.endless, self.taken = data, size, endless, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.data is not None:
            for i in range(0, len(self.data), self.size):
                piece = self.data[i : i + self.size]
                self.taken += len(piece)
                yield piece
        while self.endless:
            self.taken += len(self.endless)
            yield self.endless


async def test_a_wav_answered_for_pcm_is_read_at_its_own_rate_whole_and_in_pieces() -> None:
    """22,050 Hz WAV to a 24 kHz pcm request (wyoming-openai-gateway's answer): the stream gets
    no header bytes and the samples at 24 kHz; the take lasts what the WAV lasts."""
    data, pcm = speech_wav(22050)
    heard: list[bytes] = []
    # Odd piece sizes: the header and samples split anywhere.
    audio = await AnswerReader(entry(), SynthesisItem(TEXT, "alloy"), heard.append).read(
        Counted(data, size=37)
    )
    assert audio.sample_rate == 24000
    assert abs(len(audio.pcm) / 24000 - len(pcm) / 22050) < 0.002
    expected = resample(pcm, 22050, 24000)
    assert np.max(np.abs(audio.pcm - expected)) < 2 / 32768 + 1e-4
    streamed = np.frombuffer(b"".join(heard), dtype="<i2").astype(np.float32) / 32767
    # No 'RIFF' burst: the first 22 samples are the tone's, not the 44 header bytes.
    assert not b"".join(heard).startswith(b"RIFF")
    assert np.max(np.abs(streamed[:22] - expected[:22])) < 3 / 32768
    assert abs(len(streamed) - len(audio.pcm)) <= 1
    n = min(len(streamed), len(audio.pcm))
    assert np.max(np.abs(streamed[:n] - audio.pcm[:n])) < 3 / 32768


async def test_a_wav_at_the_asked_rate_passes_its_samples_as_they_are() -> None:
    data, _ = speech_wav(24000)
    heard: list[bytes] = []
    audio = await AnswerReader(entry(), SynthesisItem(TEXT, "alloy"), heard.append).read(
        Counted(data, size=1000)
    )
    assert b"".join(heard) == data[44:]
    assert audio.sample_rate == 24000 and len(audio.pcm) == (len(data) - 44) // 2


async def test_raw_pcm_that_starts_like_an_mpeg_frame_is_still_pcm() -> None:
    samples = np.array([-7937, 120, -80, 40] * 4000, dtype="<i2").tobytes()
    assert samples[:2] == b"\xff\xe0"
    heard: list[bytes] = []
    audio = await AnswerReader(entry(), SynthesisItem(TEXT, "alloy"), heard.append).read(
        Counted(samples)
    )
    assert b"".join(heard) == samples and len(audio.pcm) == len(samples) // 2


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (b"<!DOCTYPE html><html><body>502 Bad Gateway" + b" " * 5000, "text/html", "not_audio"),
        (b'{"error": {"message": "overloaded"}}', "application/json", "not_audio"),
        (b'{"error": "overloaded"}' + b" " * 100, "application/octet-stream", "not_audio"),
        (wav_header(1, 22000) + bytes(22000), "audio/wav", "bad_rate"),
        (wav_header(96000, 22000) + bytes(22000), "audio/wav", "bad_rate"),
    ],
)
async def test_what_is_no_take_is_refused_from_its_first_bytes(
    body: bytes, content_type: str, reason: str
) -> None:
    """Refused on the first piece that names it, however much more the body would send; nothing
    reaches a stream."""
    counted = Counted(body, size=4096, endless=body[-4096:])
    heard: list[bytes] = []
    reader = AnswerReader(entry(), SynthesisItem(TEXT, "alloy"), heard.append, content_type)
    with pytest.raises(ProviderError) as caught:
        await reader.read(counted)
    assert caught.value.kind == "bad_reply" and caught.value.reason == reason
    assert caught.value.message.startswith(reason)
    assert counted.taken <= 4096 and heard == []


async def test_a_runaway_body_is_cut_off_at_the_texts_longest_plausible_take() -> None:
    """Endless pcm (a 1 Hz WAV made 486 MB of this): read up to the text's longest plausible
    take at the asked rate, then refused as too_long, far below max_audio_mb."""
    item = SynthesisItem(TEXT, "alloy")
    seconds = answer_seconds(item, "")
    assert 10 <= seconds < 30
    counted = Counted(None, endless=voiced(TEXT).tobytes()[:8192])
    with pytest.raises(ProviderError) as caught:
        await AnswerReader(entry(), item).read(counted)
    assert caught.value.reason == "too_long"
    bound = 64 * 1024 + seconds * 24000 * 2
    assert bound < counted.taken <= bound + 8192
    # Twice the speed, half the bound; a WAV is bounded at its own rate.
    fast = Counted(None, endless=bytes(8192))
    with pytest.raises(ProviderError):
        await AnswerReader(entry(), SynthesisItem(TEXT * 4, "alloy", speed=2.0)).read(fast)
    slow = Counted(None, endless=bytes(8192))
    with pytest.raises(ProviderError):
        await AnswerReader(entry(), SynthesisItem(TEXT * 4, "alloy")).read(slow)
    assert fast.taken < slow.taken * 0.6
    wav = Counted(wav_header(8000, 0xFFFFFFFF), endless=bytes(8192))
    with pytest.raises(ProviderError, match="too_long"):
        await AnswerReader(entry(), item).read(wav)
    assert wav.taken <= 64 * 1024 + seconds * 8000 * 2 + 8192


def test_a_wav_that_is_no_wav_or_claims_1_hz_is_refused() -> None:
    """The whole-answer kinds (Google's WAV in JSON) read WAV through the same checks."""
    with pytest.raises(ProviderError, match="not_audio"):
        wav_audio(b"<html>nope</html>")
    with pytest.raises(ProviderError, match="bad_rate"):
        wav_audio(wav_header(1, 2000) + bytes(2000))
    data, _ = speech_wav(16000)
    assert wav_audio(data).sample_rate == 16000


def test_the_reason_travels_with_the_upstreams_error_from_the_pool_process() -> None:
    """The take seam counts a refused answer by its reason: the error the pool process sends
    a gateway keeps it; a reason that is none of the take checks' is dropped."""
    sent = UpstreamError("no take", upstream="p", kind="bad_reply", reason="bad_rate")
    wire = sent.to_wire()
    assert UpstreamError.from_wire("no take", wire).reason == "bad_rate"
    assert UpstreamError.from_wire("no take", {**wire, "reason": "<script>"}).reason == ""


async def test_a_chunk_after_a_wavs_samples_is_never_read_as_samples() -> None:
    """A LIST chunk after the data chunk (as some encoders write) is not a click at the end."""
    data, _ = speech_wav(24000, seconds=0.5)
    tail = b"LIST" + (26).to_bytes(4, "little") + b"INFOISFT" + (14).to_bytes(4, "little")
    tail += b"some encoder\x00\x00"
    heard: list[bytes] = []
    audio = await AnswerReader(entry(), SynthesisItem(TEXT, "alloy"), heard.append).read(
        Counted(data + tail, size=333)
    )
    assert b"".join(heard) == data[44:]
    assert len(audio.pcm) == (len(data) - 44) // 2


async def test_a_wyoming_server_is_held_to_a_rate_and_the_texts_bound() -> None:
    """Wyoming's chunks name their rate: 1 Hz is refused on the first chunk; a take many times
    longer than its text is refused as too_long."""
    from synth.providers.wyoming_tcp import WyomingProvider

    for rate, repeat, reason in ((1, 1, "bad_rate"), (24000, 400, "too_long")):
        server = await HeldWyomingServer(parts=repeat * 2, rate=rate).start()
        server.repeat = repeat
        server.rest.set()
        try:
            config = UpstreamConfig(
                name="w", kind="wyoming", base_url=server.url, sample_rate=24000, voices=("alloy",)
            )
            with pytest.raises(ProviderError) as caught:
                await WyomingProvider(config, "", {}).synthesize(SynthesisItem(TEXT, "alloy"), 30)
            assert caught.value.reason == reason
        finally:
            await server.stop()


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])
async def test_every_wav_encoding_is_read_as_libsndfile_reads_it(subtype: str) -> None:
    """Stereo WAV of each encoding (WAVE_FORMAT_EXTENSIBLE, as libsndfile writes stereo
    24-bit): the first channel, as soundfile decodes it."""
    rng = np.random.default_rng(7)
    stereo = (0.5 * rng.standard_normal((16000, 2))).clip(-1, 1).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, stereo, 16000, format="WAV", subtype=subtype)
    reference, _ = sf.read(io.BytesIO(out.getvalue()), dtype="float32", always_2d=True)
    audio = await AnswerReader(entry(format="wav"), SynthesisItem(TEXT, "alloy")).read(
        Counted(out.getvalue(), size=999)
    )
    assert audio.sample_rate == 16000
    assert np.allclose(audio.pcm, reference[:, 0], atol=1e-6)
