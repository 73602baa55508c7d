"""Audio encoding and resampling: float32 PCM in, the asked container/codec out.

libsndfile (through soundfile) does every container it can; soxr resamples. All functions here are
CPU work: the gateway calls them off the event loop.
"""

from __future__ import annotations

import importlib.util
import io
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

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
    # Rates the codec can run at; an asked rate outside them is raised to the next one up.
    rates: tuple[int, ...] | None = None
    # Whether the format can be sent as it is made, sentence by sentence (see StreamEncoder).
    streamable: bool = False


# Opus in Ogg only runs at these rates; other asked rates are resampled to the nearest above.
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
# MPEG-1/2/2.5 layer III and AAC (ADTS sampling-frequency index) share this set.
_MPEG_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)

# G.711 naming: `mulaw` / `alaw` are WAV files (format tag 7 / 6) that any player opens; `ulaw` /
# `alaw-raw` are the headerless 8-bit streams Asterisk (`.ulaw`, `.alaw`) and FreeSWITCH (`.PCMU`,
# `.PCMA`) play directly. `alaw` stays the WAV form so that the two WAV names mirror each other.
FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("wav", "audio/wav", "WAV", "PCM_16", streamable=True),
        AudioFormat("pcm", "audio/pcm", None, "PCM_16", streamable=True),
        AudioFormat("flac", "audio/flac", "FLAC", "PCM_16"),
        AudioFormat(
            "mp3",
            "audio/mpeg",
            "MP3",
            "MPEG_LAYER_III",
            lossless=False,
            rates=_MPEG_RATES,
            streamable=True,
        ),
        AudioFormat("opus", "audio/ogg", "OGG", "OPUS", lossless=False, rates=_OPUS_RATES),
        AudioFormat(
            "mulaw", "audio/wav", "WAV", "ULAW", default_rate=8000, lossless=False, streamable=True
        ),
        AudioFormat(
            "alaw", "audio/wav", "WAV", "ALAW", default_rate=8000, lossless=False, streamable=True
        ),
        AudioFormat(
            "ulaw", "audio/basic", "RAW", "ULAW", default_rate=8000, lossless=False, streamable=True
        ),
        AudioFormat(
            "alaw-raw",
            "audio/x-alaw-basic",
            "RAW",
            "ALAW",
            default_rate=8000,
            lossless=False,
            streamable=True,
        ),
        # libsndfile has no AAC; PyAV's wheels carry FFmpeg's native AAC encoder (no system
        # ffmpeg needed). ADTS framing: every frame self-describing, so it streams as well.
        AudioFormat(
            "aac", "audio/aac", "ADTS", "AAC", lossless=False, rates=_MPEG_RATES, streamable=True
        ),
    )
    if f.container != "ADTS" or importlib.util.find_spec("av") is not None
}


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
    if fmt.container == "ADTS":
        return _encode_aac(pcm, sample_rate)
    buf = io.BytesIO()
    data = to_int16(pcm) if fmt.subtype == "PCM_16" else np.clip(pcm, -1.0, 1.0)
    sf.write(buf, data, sample_rate, format=fmt.container, subtype=fmt.subtype)
    return buf.getvalue()


def output_rate(fmt: AudioFormat, engine_rate: int, asked: int | None) -> int:
    """The sample rate a rendition is produced at."""
    rate = asked or fmt.default_rate or engine_rate
    if fmt.rates:
        rate = next((r for r in fmt.rates if r >= rate), fmt.rates[-1])
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


def _encode_aac(pcm: FloatPCM, sample_rate: int) -> bytes:
    """AAC-LC in ADTS through PyAV (FFmpeg's native encoder, bundled in the wheel)."""
    import av  # imported here: only AAC needs it, and it is a large extension module

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="adts") as container:
        stream = container.add_stream("aac", rate=sample_rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(
            np.clip(pcm, -1.0, 1.0).reshape(1, -1), format="flt", layout="mono"
        )
        frame.sample_rate = sample_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


# ---- streaming ------------------------------------------------------------------------------

# A WAV header whose RIFF and data sizes say "unknown, read to the end" (0xFFFFFFFF), as streaming
# servers send it: the length is not known when the first sentence goes out.
_UNKNOWN_SIZE = 0xFFFFFFFF
_WAV_TAGS = {"PCM_16": (1, 16), "ULAW": (7, 8), "ALAW": (6, 8)}


def stream_header(fmt: AudioFormat, sample_rate: int) -> bytes:
    """Bytes that open a stream of ``fmt`` (a streaming WAV header; nothing for raw or framed
    codecs, whose chunks carry their own framing)."""
    if fmt.container != "WAV":
        return b""
    tag, bits = _WAV_TAGS[fmt.subtype]
    block = bits // 8
    fmt_body = struct.pack("<HHIIHH", tag, 1, sample_rate, sample_rate * block, block, bits)
    if tag != 1:
        fmt_body += struct.pack("<H", 0)  # cbSize: non-PCM fmt chunks carry it
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt_body))
        + fmt_body
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


# MP3 bit rates for streams: CBR, by output rate (MPEG-2/2.5 below 32 kHz).
def _mp3_bit_rate(rate: int) -> int:
    return 32_000 if rate <= 16_000 else 64_000 if rate <= 24_000 else 96_000


_ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000)


def adts_header(payload_len: int, rate: int, channels: int = 1) -> bytes:
    """The 7-byte ADTS header (MPEG-4, AAC-LC, no CRC) of one raw AAC frame of ``payload_len``."""
    index = _ADTS_RATES.index(rate)
    length = payload_len + 7
    return bytes(
        (
            0xFF,
            0xF1,  # sync, MPEG-4, layer 0, no CRC
            (1 << 6) | (index << 2) | (channels >> 2),  # profile AAC-LC (object type 2, minus 1)
            ((channels & 3) << 6) | (length >> 11),
            (length >> 3) & 0xFF,
            ((length & 7) << 5) | 0x1F,  # buffer fullness 0x7FF: VBR
            0xFC,
        )
    )


class StreamEncoder:
    """Encodes one streamed response, sentence by sentence, as the sentences arrive.

    WAV and raw formats become bare samples (after :func:`stream_header`). MP3 and AAC go through
    ONE encoder for the whole stream: encoding each sentence on its own (as an earlier version
    did) put an encoder delay and a padded last frame at every sentence join, about 70 ms (MP3)
    and 45 ms (AAC) of extra silence each. Samples short of a codec frame wait for the next
    sentence; :meth:`finish` flushes the rest. Not thread-safe: one stream, one encoder.
    """

    def __init__(self, fmt: AudioFormat, rate: int) -> None:
        if not fmt.streamable:
            raise ValueError(f"format {fmt.name!r} cannot be streamed")
        self.fmt = fmt
        self.rate = rate
        self._codec: Any = None
        self._pts = 0
        if fmt.container in ("MP3", "ADTS"):
            import av  # imported here: a large extension module, only these formats need it

            name = "libmp3lame" if fmt.container == "MP3" else "aac"
            # (Any: PyAV types the generic context, not the audio one create() returns.)
            ctx: Any = av.CodecContext.create(name, "w")
            ctx.sample_rate = rate
            ctx.layout = "mono"
            ctx.format = "fltp"
            ctx.time_base = Fraction(1, rate)
            ctx.bit_rate = _mp3_bit_rate(rate) if name == "libmp3lame" else 64_000
            ctx.open()
            self._codec = ctx

    def header(self) -> bytes:
        """The bytes that open the stream (a streaming WAV header, or nothing)."""
        return stream_header(self.fmt, self.rate)

    def encode(self, pcm: FloatPCM, src_rate: int) -> bytes:
        """The stream's next bytes for ``pcm`` (resampled to the stream's rate)."""
        out = resample(pcm, src_rate, self.rate)
        if self._codec is None:
            if self.fmt.container == "WAV":
                raw = (
                    FORMATS["pcm"] if self.fmt.subtype == "PCM_16" else _RAW_G711[self.fmt.subtype]
                )
                return encode(out, self.rate, raw)
            return encode(out, self.rate, self.fmt)
        import av

        frame = av.AudioFrame.from_ndarray(
            np.clip(out, -1.0, 1.0).reshape(1, -1), format="fltp", layout="mono"
        )
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += len(out)
        return self._packets(self._codec.encode(frame))

    def finish(self) -> bytes:
        """The stream's last bytes (the encoder's held-back samples)."""
        if self._codec is None:
            return b""
        return self._packets(self._codec.encode(None))

    def _packets(self, packets: Any) -> bytes:
        if self.fmt.container == "MP3":
            return b"".join(bytes(p) for p in packets)
        return b"".join(adts_header(p.size, self.rate) + bytes(p) for p in packets)


_RAW_G711 = {"ULAW": FORMATS["ulaw"], "ALAW": FORMATS["alaw-raw"]}


def as_stored(pcm: FloatPCM) -> FloatPCM:
    """``pcm`` exactly as it reads back from its stored master (16-bit, decoded the way soundfile
    decodes it), so audio rendered right after synthesis equals audio rendered later from the
    store, byte for byte."""
    return to_int16(pcm).astype(np.float32) / np.float32(32768.0)
