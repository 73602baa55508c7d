"""Every output format decodes with ffprobe/ffmpeg (and soundfile where libsndfile reads it), with
the canonical master's duration; a new format or rate of synthesized audio is a transcode."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from synth import audio
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

TEXT = "Thank you for calling. Your call is important to us."


def raw(demuxer: str, rate: int | str, codec: str) -> tuple[str, str, int]:
    """A headerless format's row: ffmpeg is told its demuxer and rate; frames of one sample."""
    return (f"-f {demuxer} -ar {rate} -ac 1", codec, 1)


# What ffmpeg must report, and how long one codec frame is (the allowed duration difference).
EXPECTED: dict[str, tuple[str, str, int]] = {
    # format: (ffmpeg demuxer args, codec name, frame length in samples at the output rate)
    "wav": ("", "pcm_s16le", 1),
    "pcm": raw("s16le", "{rate}", "pcm_s16le"),
    "flac": ("", "flac", 1),
    "mp3": ("", "mp3", 1152),
    "opus": ("", "opus", 0),  # 20 ms, computed from the rate below
    "mulaw": ("", "pcm_mulaw", 1),
    "alaw": ("", "pcm_alaw", 1),
    "ulaw": raw("mulaw", "{rate}", "pcm_mulaw"),
    "alaw-raw": raw("alaw", "{rate}", "pcm_alaw"),
    # AAC: 1024-sample frames; ADTS has no edit list, so the encoder's priming frame is decoded too.
    "aac": ("", "aac", 2048),
    # Raw GSM 06.10: 160-sample (20 ms) frames of 33 bytes.
    "gsm": ("-f gsm", "gsm", 160),
    # Raw G.722: two samples a byte at 16 kHz.
    "g722": ("-f g722", "adpcm_g722", 2),
}
SOUNDFILE_READS = {"wav", "flac", "mp3", "opus", "mulaw", "alaw"}


def ffprobe(data: bytes, tmp: Path, name: str, demux: str) -> dict[str, Any]:
    path = tmp / name
    path.write_bytes(data)
    out = subprocess.run(
        ["ffprobe", "-v", "error", *demux.split(), "-show_streams", "-of", "json", str(path)],
        capture_output=True,
        check=True,
    )
    streams: list[dict[str, Any]] = json.loads(out.stdout)["streams"]
    assert len(streams) == 1
    return streams[0]


def ffmpeg_samples(data: bytes, tmp: Path, name: str, demux: str) -> int:
    """Decode with ffmpeg to s16le at the file's own rate and count the samples."""
    path = tmp / name
    path.write_bytes(data)
    out = subprocess.run(
        ["ffmpeg", "-v", "error", *demux.split(), "-i", str(path), "-f", "s16le", "-ac", "1", "-"],
        capture_output=True,
        check=True,
    )
    assert out.stderr == b""
    return len(out.stdout) // 2


@pytest.mark.parametrize("rate", [None, 8000])
async def test_every_format_decodes_with_master_duration(
    gateway: GatewayFactory, counting_engine: CountingEngine, tmp_path: Path, rate: int | None
) -> None:
    assert set(EXPECTED) == set(audio.FORMATS)
    client = await gateway()
    master_s = None
    for name in audio.FORMATS:
        # Whole files (a streamed MP3 lacks the frame that gives its exact length: docs/api.md).
        body: dict[str, Any] = {"model": "tts-1", "input": TEXT, "voice": "alloy", "stream": False}
        body["response_format"] = name
        if rate:
            body["sample_rate"] = rate
        r = await client.post("/v1/audio/speech", json=body)
        assert r.status == 200, await r.text()
        data = await r.read()
        out_rate = int(r.headers["X-Audio-Sample-Rate"])
        if master_s is None:
            # The first rendition is WAV at the voice rate (or 8 kHz): its length is the master's.
            master_s = sf.info(io.BytesIO(data)).duration
        demux, codec, frame = EXPECTED[name]
        demux = demux.format(rate=out_rate)
        stream = ffprobe(data, tmp_path, f"{name}.bin", demux)
        assert stream["codec_name"] == codec, name
        # Opus always decodes at 48 kHz (the Ogg header keeps the input rate only as a hint).
        decoded_rate = 48000 if name == "opus" else out_rate
        assert int(stream["sample_rate"]) == decoded_rate, name
        frame = frame or decoded_rate // 50  # Opus: 20 ms
        samples = ffmpeg_samples(data, tmp_path, f"{name}.bin", demux)
        expected = master_s * decoded_rate
        assert abs(samples - expected) <= frame, (name, samples, expected)
        if name in SOUNDFILE_READS:
            # libsndfile decodes Opus at the rate it was encoded at.
            pcm, sf_rate = sf.read(io.BytesIO(data), dtype="float32")
            assert sf_rate == out_rate
            assert abs(len(pcm) - master_s * out_rate) <= frame * out_rate / decoded_rate, name
            assert np.abs(pcm).max() > 0.05, name  # speech, not silence
    assert counting_engine.items == 2  # two sentences, once: every format after that transcodes


async def test_mulaw_wav_is_g711_at_8k(gateway: GatewayFactory, tmp_path: Path) -> None:
    client = await gateway()
    r = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "mulaw"},
    )
    data = await r.read()
    assert data[:4] == b"RIFF"
    stream = ffprobe(data, tmp_path, "x.wav", "")
    assert stream["codec_name"] == "pcm_mulaw"
    assert stream["codec_long_name"] == "PCM mu-law / G.711 mu-law"
    assert stream["sample_rate"] == "8000"
    raw = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "ulaw"},
    )
    raw_bytes = await raw.read()
    assert raw.headers["Content-Type"] == "audio/basic"
    # The headerless form is exactly the WAV form's sample data (RIFF pads odd chunks by a byte).
    assert raw_bytes in data
    assert len(data) - len(raw_bytes) < 100


async def test_wav_then_mulaw_8k_then_mp3_synthesize_once(
    gateway: GatewayFactory, counting_engine: CountingEngine, tmp_path: Path
) -> None:
    client = await gateway()
    base = {"model": "tts-1", "input": "Press one for billing.", "voice": "alloy"}
    r = await client.post("/v1/audio/speech", json={**base, "response_format": "wav"})
    assert r.headers["X-Cache"] == "MISS"
    assert counting_engine.items == 1
    for extra in ({"response_format": "mulaw", "sample_rate": 8000}, {"response_format": "mp3"}):
        r = await client.post("/v1/audio/speech", json={**base, **extra})
        assert r.status == 200
        assert r.headers["X-Cache"] == "HIT"  # a transcode of the stored master
        data = await r.read()
        stream = ffprobe(data, tmp_path, "t.bin", "")
        assert stream["codec_name"] in ("pcm_mulaw", "mp3")
    assert counting_engine.items == 1


async def test_unsupported_format_lists_the_supported(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "wma"},
    )
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == "response_format"
    for name in audio.FORMATS:
        assert name in err["message"]


def speechlike(rate: int, seconds: float = 2.3) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Noise under a syllable-rate envelope: broadband like speech, deterministic."""
    n = int(rate * seconds)
    t = np.arange(n) / rate
    noise = np.random.default_rng(7).standard_normal(n)
    return (0.2 * noise * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def ffmpeg_count(data: bytes, tmp: Path) -> int:
    return ffmpeg_samples(data, tmp, "x.bin", "")


@pytest.mark.parametrize("name", ["mp3", "aac"])
@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_whole_file_and_stream_are_one_encoder_path(name: str, rate: int, tmp_path: Path) -> None:
    fmt = audio.FORMATS[name]
    pcm = speechlike(rate)
    whole = audio.encode(pcm, rate, fmt)
    one = audio.StreamEncoder(fmt, rate)
    stream = one.header() + one.encode(pcm, rate) + one.finish()
    three = audio.StreamEncoder(fmt, rate)
    parts = [three.encode(part, rate) for part in np.array_split(pcm, 3)]
    streamed = three.header() + b"".join(parts) + three.finish()
    assert all(parts)  # bytes leave with each sentence, not only at the end
    frame = EXPECTED[name][2] // 2 if name == "aac" else EXPECTED[name][2]
    n_whole, n_stream = ffmpeg_count(whole, tmp_path), ffmpeg_count(stream, tmp_path)
    if name == "aac":
        # ADTS: every frame carries its own header, so the file is the one-chunk stream.
        assert whole == stream
    else:
        # The file is the stream after one Xing/LAME frame, which only a seekable file can have
        # (the muxer fills in frame count and padding at the end). It declares LAME's encoder
        # delay (576 + 529 samples) so decoders trim it; the raw stream cannot declare it.
        assert whole.endswith(stream)
        assert 0 < len(whole) - len(stream) <= 1500  # one frame at <= 96 kbps
        n_stream -= 1105
    assert abs(n_whole - n_stream) <= frame, (n_whole, n_stream)
    assert abs(n_whole - len(pcm)) <= EXPECTED[name][2], (n_whole, len(pcm))
    # Sentence by sentence through one encoder decodes as long as one piece.
    assert abs(ffmpeg_count(streamed, tmp_path) - ffmpeg_count(stream, tmp_path)) <= frame
    if name in SOUNDFILE_READS:
        for data in (whole, stream):
            decoded, sf_rate = sf.read(io.BytesIO(data), dtype="float32")
            assert sf_rate == rate
            assert np.abs(decoded).max() > 0.05


def test_rates_round_up_to_what_the_codec_runs_at() -> None:
    assert audio.output_rate(audio.FORMATS["mp3"], 22050, 10000) == 11025
    assert audio.output_rate(audio.FORMATS["aac"], 22050, 47000) == 48000
    assert audio.output_rate(audio.FORMATS["opus"], 22050, None) == 24000
    assert audio.output_rate(audio.FORMATS["wav"], 22050, 10000) == 10000
    assert audio.output_rate(audio.FORMATS["ulaw"], 22050, None) == 8000


@pytest.mark.parametrize("rate", [8000, 22050, 24000, 48000])
def test_wav_is_byte_for_byte_what_libsndfile_writes(rate: int) -> None:
    """WAV is written by stdlib ``wave`` (libsndfile wrote it through a Python callback per
    block), and must stay the file libsndfile writes: stored renditions and their ETags do not
    change."""
    rng = np.random.default_rng(rate)
    for n in (0, 1, 999, 66150):
        pcm = (rng.standard_normal(n) * 0.6).astype(np.float32)  # some samples clip
        buf = io.BytesIO()
        sf.write(buf, audio.to_int16(pcm), rate, format="WAV", subtype="PCM_16")
        assert audio.encode(pcm, rate, audio.FORMATS["wav"]) == buf.getvalue()


@pytest.mark.parametrize("memfd", ["available", "refused"])
def test_a_master_is_made_from_one_quantization(
    memfd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``master_of``'s master is the FLAC of the clipped 16-bit samples, its stored PCM those
    samples over 32768, and the master decodes to exactly the stored PCM (what a later
    transcode reads). Where the memfd it is written through is refused (a sandbox), the same
    bytes come through memory."""
    if memfd == "refused":

        def refuse(name: str, flags: int = 0) -> int:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr("os.memfd_create", refuse)
    rng = np.random.default_rng(7)
    for n in (1, 1000, 66150):
        pcm = (rng.standard_normal(n) * 0.6).astype(np.float32)  # some samples clip
        samples = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)
        stored, master = audio.master_of(pcm, 22050)
        assert stored.dtype == np.float32
        assert np.array_equal(stored, samples.astype(np.float32) / np.float32(32768.0))
        buf = io.BytesIO()
        sf.write(buf, samples, 22050, format="FLAC", subtype="PCM_16")
        assert master == buf.getvalue()
        decoded, rate = audio.decode_master(master)
        assert rate == 22050 and np.array_equal(decoded, stored)
