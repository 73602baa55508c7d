"""Audio encoding and resampling: float32 PCM in, the asked container/codec out.

libsndfile (through soundfile) does every container it can; soxr resamples. All functions here are
CPU work: the gateway calls them off the event loop.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

FloatPCM = npt.NDArray[np.float32]


@dataclass(frozen=True)
class AudioFormat:
    """One output format the gateway can produce."""

    name: str
    content_type: str
    # (container, subtype) for soundfile, or None for headerless raw output.
    container: str | None
    subtype: str
    # Telephony codecs default to 8 kHz when no rate is asked for; others keep the engine's rate.
    default_rate: int | None = None
    lossless: bool = True


FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("wav", "audio/wav", "WAV", "PCM_16"),
        AudioFormat("pcm", "audio/pcm", None, "PCM_16"),
        AudioFormat("flac", "audio/flac", "FLAC", "PCM_16"),
        AudioFormat("mp3", "audio/mpeg", "MP3", "MPEG_LAYER_III", lossless=False),
        AudioFormat("opus", "audio/ogg", "OGG", "OPUS", lossless=False),
        AudioFormat("mulaw", "audio/wav", "WAV", "ULAW", default_rate=8000, lossless=False),
        AudioFormat("alaw", "audio/wav", "WAV", "ALAW", default_rate=8000, lossless=False),
        AudioFormat("ulaw", "audio/basic", "RAW", "ULAW", default_rate=8000, lossless=False),
        AudioFormat(
            "alaw-raw", "audio/x-alaw-basic", "RAW", "ALAW", default_rate=8000, lossless=False
        ),
    )
}

# Opus in Ogg only runs at these rates; other asked rates are resampled to the nearest above.
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def resample(pcm: FloatPCM, src_rate: int, dst_rate: int) -> FloatPCM:
    """Resample mono float32 PCM with soxr (high quality)."""
    if src_rate == dst_rate:
        return pcm
    out = soxr.resample(pcm, src_rate, dst_rate, quality="HQ")
    return np.asarray(out, dtype=np.float32)


def to_int16(pcm: FloatPCM) -> npt.NDArray[np.int16]:
    """Clip to [-1, 1] and convert to signed 16-bit."""
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16)


def encode(pcm: FloatPCM, sample_rate: int, fmt: AudioFormat) -> bytes:
    """Encode mono float32 ``pcm`` at ``sample_rate`` in ``fmt``."""
    if fmt.container is None:
        return to_int16(pcm).tobytes()
    buf = io.BytesIO()
    data = to_int16(pcm) if fmt.subtype == "PCM_16" else np.clip(pcm, -1.0, 1.0)
    sf.write(buf, data, sample_rate, format=fmt.container, subtype=fmt.subtype)
    return buf.getvalue()


def output_rate(fmt: AudioFormat, engine_rate: int, asked: int | None) -> int:
    """The sample rate a rendition is produced at."""
    rate = asked or fmt.default_rate or engine_rate
    if fmt.name == "opus":
        rate = next((r for r in _OPUS_RATES if r >= rate), 48000)
    return rate


def render(pcm: FloatPCM, engine_rate: int, fmt: AudioFormat, rate: int) -> bytes:
    """Resample ``pcm`` from ``engine_rate`` to ``rate`` and encode it as ``fmt``."""
    return encode(resample(pcm, engine_rate, rate), rate, fmt)


# The canonical master: lossless PCM16 at the engine's own rate, as FLAC (about half the size of
# WAV, exact for 16-bit audio, and decodable by anything).
MASTER_FORMAT = FORMATS["flac"]


def encode_master(pcm: FloatPCM, sample_rate: int) -> bytes:
    """Encode the canonical master rendering."""
    return encode(pcm, sample_rate, MASTER_FORMAT)


def decode_master(data: bytes) -> tuple[FloatPCM, int]:
    """Decode a master back to float32 PCM and its rate."""
    pcm, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    return np.asarray(pcm, dtype=np.float32), int(rate)
