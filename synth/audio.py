"""Audio encoding and resampling: float32 PCM in, the asked container/codec out.

libsndfile (through soundfile) writes WAV, FLAC, Ogg Opus, G.711 and raw GSM 06.10 frames; MP3,
AAC and G.722 go through PyAV (FFmpeg's encoders and muxers, bundled in its wheels), one path per
codec for whole files and streams (:class:`CodecWriter`); soxr resamples. All functions here are CPU work: the gateway calls
them off the event loop.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import struct
import wave
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

from synth.ogg import fixed_serial

FloatPCM = npt.NDArray[np.float32]


@dataclass(frozen=True)
class AudioFormat:
    """One output format the gateway can produce."""

    name: str
    content_type: str
    # (container, subtype) for soundfile, or None for headerless raw output; "MP3" and "ADTS" are
    # written by PyAV instead (see _AV_CODECS).
    container: str | None
    subtype: str
    # Telephony codecs default to 8 kHz when no rate is asked for, raw PCM to OpenAI's 24 kHz;
    # others keep the engine's rate.
    default_rate: int | None = None
    # Rates the codec can run at; an asked rate outside them is raised to the next one up.
    rates: tuple[int, ...] | None = None
    # Whether the format can be sent as it is made, sentence by sentence (see StreamEncoder).
    streamable: bool = False


# Opus in Ogg only runs at these rates; other asked rates are resampled to the nearest above.
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
# MPEG-1/2/2.5 layer III and AAC (ADTS sampling-frequency index) share this set.
_MPEG_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)

_g711 = functools.partial(AudioFormat, default_rate=8000, streamable=True)
# G.711 naming: `mulaw` / `alaw` are WAV files (format tag 7 / 6) that any player opens; `ulaw` /
# `alaw-raw` are the headerless 8-bit streams Asterisk (`.ulaw`, `.alaw`) and FreeSWITCH (`.PCMU`,
# `.PCMA`) play directly. `alaw` stays the WAV form so that the two WAV names mirror each other.
FORMATS: dict[str, AudioFormat] = {
    f.name: f
    for f in (
        AudioFormat("wav", "audio/wav", "WAV", "PCM_16", streamable=True),
        # OpenAI's `pcm` is 24 kHz 16-bit mono, and clients play it as such whatever the voice's
        # rate (Pipecat, the Agents SDK, LiveKit): the rate is not in the bytes, so it is fixed.
        AudioFormat("pcm", "audio/pcm", None, "PCM_16", default_rate=24000, streamable=True),
        AudioFormat("flac", "audio/flac", "FLAC", "PCM_16"),
        AudioFormat(
            "mp3", "audio/mpeg", "MP3", "MPEG_LAYER_III", rates=_MPEG_RATES, streamable=True
        ),
        AudioFormat("opus", "audio/ogg", "OGG", "OPUS", rates=_OPUS_RATES),
        _g711("mulaw", "audio/wav", "WAV", "ULAW"),
        _g711("alaw", "audio/wav", "WAV", "ALAW"),
        _g711("ulaw", "audio/basic", "RAW", "ULAW"),
        _g711("alaw-raw", "audio/x-alaw-basic", "RAW", "ALAW"),
        # libsndfile has no AAC; PyAV's wheels carry FFmpeg's native AAC encoder (no system
        # ffmpeg needed). ADTS framing: every frame self-describing, so it streams as well.
        AudioFormat("aac", "audio/aac", "ADTS", "AAC", rates=_MPEG_RATES, streamable=True),
        # Telephony codecs PBXs play from files (Asterisk format_gsm / format_g722). GSM 06.10 as
        # libsndfile writes it headerless: 33-byte frames of 160 samples (20 ms at 8 kHz), the
        # layout Asterisk's `.gsm` and FFmpeg's `gsm` demuxer read. Not streamable: a sentence's
        # samples would be padded to a whole frame at every join.
        AudioFormat("gsm", "audio/gsm", "RAW", "GSM610", default_rate=8000, rates=(8000,)),
        # G.722 (64 kbit/s ADPCM, 16 kHz audio): FFmpeg's encoder and raw muxer through PyAV.
        AudioFormat("g722", "audio/G722", "G722", "G722", default_rate=16000, rates=(16000,)),
    )
    if f.container not in ("MP3", "ADTS", "G722") or importlib.util.find_spec("av") is not None
}


def resample(pcm: FloatPCM, src_rate: int, dst_rate: int) -> FloatPCM:
    """Resample mono float32 PCM with soxr (high quality)."""
    if src_rate == dst_rate:
        return pcm
    out = soxr.resample(pcm, src_rate, dst_rate, quality="HQ")
    return np.asarray(out, dtype=np.float32)


def to_int16(pcm: FloatPCM) -> npt.NDArray[np.int16]:
    """Clip to [-1, 1] and convert to signed 16-bit."""
    # In place after the clip: one float temporary, not two (this runs on every miss, where the
    # gateway's CPU is taken from the synthesis workers on the same cores).
    scaled = np.clip(pcm, -1.0, 1.0)
    scaled *= np.float32(32767.0)
    return scaled.astype(np.int16)


def wav_pcm16(samples: npt.NDArray[np.int16], sample_rate: int) -> bytes:
    """A mono 16-bit PCM WAV file, written by the standard library's :mod:`wave`: byte for byte
    the file libsndfile writes (its 44-byte header), so stored renditions and their ETags do not
    depend on which wrote them. Not libsndfile itself: it writes into memory through a Python
    callback per block, and under load each call waits for the GIL. (A hand-built header saved
    at most 4 us a file over ``wave``, 0.05% of a WAV miss's gateway CPU:
    docs/bench/handmade_wav.json.)"""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(np.ascontiguousarray(samples, dtype="<i2").data)
    return buf.getvalue()


def encode(pcm: FloatPCM, sample_rate: int, fmt: AudioFormat) -> bytes:
    """Encode mono float32 ``pcm`` at ``sample_rate`` in ``fmt``."""
    if fmt.container is None:
        return to_int16(pcm).tobytes()
    if fmt.container == "WAV" and fmt.subtype == "PCM_16":
        return wav_pcm16(to_int16(pcm), sample_rate)
    if fmt.container == "G722":
        return _encode_g722(pcm, sample_rate)
    if fmt.container in _AV_CODECS:
        writer = CodecWriter(fmt, sample_rate, whole_file=True)
        writer.encode(pcm)
        return writer.finish()
    buf = io.BytesIO()
    data = to_int16(pcm) if fmt.subtype == "PCM_16" else np.clip(pcm, -1.0, 1.0)
    sf.write(buf, data, sample_rate, format=fmt.container, subtype=fmt.subtype)
    if fmt.container == "OGG":
        # libsndfile numbers the stream from the clock: the serial is set from the audio.
        return fixed_serial(buf.getvalue())
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


def master_of(pcm: FloatPCM, sample_rate: int) -> tuple[FloatPCM, bytes]:
    """Freshly synthesized ``pcm`` as stored, and its master, from one quantization: the master
    is the 16-bit samples as FLAC, and the stored PCM is those samples exactly as soundfile
    decodes the master (:func:`decode_master`), so audio rendered right after synthesis equals
    audio rendered later from the store, byte for byte."""
    samples = to_int16(pcm)
    stored = samples.astype(np.float32)
    stored /= np.float32(32768.0)
    return stored, _flac16(samples, sample_rate)


def _flac16(samples: npt.NDArray[np.int16], sample_rate: int) -> bytes:
    """FLAC of 16-bit ``samples``, written into an anonymous in-memory file (Linux memfd), where
    it can: libsndfile then writes with plain syscalls. Into a BytesIO it calls back into Python
    for every block, and each callback waits for the GIL: beside a thread busy in Python, a
    master takes more CPU, and far longer, than through a memfd."""
    try:
        fd = os.memfd_create("voxgate-master", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux, or a sandbox that refuses the syscall
        buf = io.BytesIO()
        sf.write(buf, samples, sample_rate, format="FLAC", subtype="PCM_16")
        return buf.getvalue()
    try:
        with sf.SoundFile(
            fd, "w", sample_rate, 1, format="FLAC", subtype="PCM_16", closefd=False
        ) as out:
            out.write(samples)
        return os.pread(fd, os.lseek(fd, 0, os.SEEK_END), 0)
    finally:
        os.close(fd)


def as_rendered_pcm16(data: bytes) -> bytes:
    """A provider's raw 16-bit pcm (whole samples) as a rendition at its rate holds it: its
    samples over 32768 (the provider's audio) through the master's quantization
    (:func:`master_of`), then, over 32768 again (the master decoded), through the rendition's
    (:func:`to_int16`). The two are not exact inverses (32767 out, truncated; 32768 in): a
    sample may move by up to 2 steps, and a stream that passes a provider's pieces on applies
    this to each, so its bytes are the stored rendition's, as every other stream's are."""
    samples = np.frombuffer(data, dtype="<i2").astype(np.float32)
    samples /= np.float32(32768.0)
    master = to_int16(samples).astype(np.float32)
    master /= np.float32(32768.0)
    return to_int16(master).astype("<i2", copy=False).tobytes()


class UndecodableAudio(ValueError):
    """Stored audio that does not decode to mono PCM: a corrupt entry, to delete and make anew."""


def decode_master(data: bytes) -> tuple[FloatPCM, int]:
    """Decode a master back to float32 PCM and its rate; :class:`UndecodableAudio` when the
    bytes are no mono audio libsndfile reads (they passed their checksum: written that way)."""
    try:
        pcm, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    except Exception as exc:  # libsndfile's errors, and whatever odd bytes make soundfile raise
        raise UndecodableAudio(f"stored audio does not decode: {type(exc).__name__}") from exc
    if pcm.ndim != 1 or rate <= 0:
        raise UndecodableAudio(f"stored audio is not mono ({pcm.shape}, {rate} Hz)")
    return np.asarray(pcm, dtype=np.float32), int(rate)


# A WAV header whose RIFF and data sizes say "unknown, read to the end" (0xFFFFFFFF), as streaming
# servers send it: the length is not known when the first sentence goes out.
_UNKNOWN_SIZE = 0xFFFFFFFF
_WAV_TAGS = {"PCM_16": (1, 16), "ULAW": (7, 8), "ALAW": (6, 8)}


_AV_CODECS = {"MP3": ("libmp3lame", "mp3"), "ADTS": ("aac", "adts")}


class _Drain:
    """A write-only, non-seekable sink: a stream's bytes leave as soon as they are muxed.

    Having no ``seek`` is the point: PyAV then tells FFmpeg the output cannot seek, and the MP3
    muxer writes no Xing frame it would have to come back and fill in.
    """

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class CodecWriter:
    """The one MP3 (LAME) and the one AAC (FFmpeg's AAC-LC in ADTS) path: a PyAV encoder feeding
    FFmpeg's own ``mp3`` / ``adts`` muxer, for whole files and streams alike.

    A whole file (``whole_file=True``) is muxed into a seekable buffer, so the MP3 muxer goes back
    at the end and fills in its Xing/LAME frame (frame count, encoder delay and padding: decoders
    trim to the exact length); :meth:`encode` returns nothing and :meth:`finish` the whole file.
    A stream's bytes go out as they are made, so nothing can be filled in later: its sink cannot
    seek, the muxer writes no Xing frame, and :meth:`encode` / :meth:`finish` return the next
    bytes. So a whole AAC file is byte for byte a one-chunk stream, and a whole MP3 file is the
    Xing frame followed by that stream. Samples short of a codec frame wait for the next
    :meth:`encode`; :meth:`finish` flushes them. Not thread-safe: one file or stream, one writer.
    """

    def __init__(self, fmt: AudioFormat, rate: int, *, whole_file: bool) -> None:
        import av  # imported here: a large extension module, only these formats need it

        codec, muxer = _AV_CODECS[str(fmt.container)]
        self.rate = rate
        self._whole: io.BytesIO | None = io.BytesIO() if whole_file else None
        self._drain = _Drain()
        self._pts = 0
        options = {
            # Hand every packet to the sink at once (by default FFmpeg buffers 32 KB of output,
            # which would hold a stream's first sentence back).
            "flush_packets": "1",
        }
        if muxer == "mp3":
            # No ID3v2 tag: players need none, and the stream and the file start alike.
            options["id3v2_version"] = "0"
        self._container = av.open(
            self._whole if self._whole is not None else self._drain,
            mode="w",
            format=muxer,
            container_options=options,
        )
        stream = self._container.add_stream(codec, rate=rate, layout="mono")
        assert isinstance(stream, av.AudioStream)  # (for mypy: an audio codec's stream)
        self._stream = stream
        # Bit rates (CBR), the same for whole files and streams: MP3 by output rate (MPEG-2/2.5
        # below 32 kHz); AAC-LC mono at 64 kbps. For speech they come within a few percent of the
        # VBR files libsndfile wrote before (22.05 kHz: 46.8 vs 45.5 KB for 5.8 s), and CBR keeps
        # a stream's rate steady.
        mp3 = 32_000 if rate <= 16_000 else 64_000 if rate <= 24_000 else 96_000
        stream.codec_context.bit_rate = mp3 if codec == "libmp3lame" else 64_000

    def encode(self, pcm: FloatPCM) -> bytes:
        """Encode ``pcm`` (at the writer's rate); the stream's next bytes (a file's: none)."""
        import av

        frame = av.AudioFrame.from_ndarray(
            np.clip(pcm, -1.0, 1.0).reshape(1, -1), format="fltp", layout="mono"
        )
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += len(pcm)
        self._container.mux(self._stream.encode(frame))
        return self._drain.take()

    def finish(self) -> bytes:
        """Flush the encoder and close the muxer: a stream's last bytes, or the whole file."""
        self._container.mux(self._stream.encode(None))
        self._container.close()
        if self._whole is not None:
            return self._whole.getvalue()
        return self._drain.take()


def _encode_g722(pcm: FloatPCM, sample_rate: int) -> bytes:
    """Raw G.722 (what Asterisk's `.g722` and FFmpeg's ``g722`` demuxer read): FFmpeg's
    ``adpcm_g722`` encoder into its raw ``g722`` muxer, 8,000 bytes a second of 16 kHz audio."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="g722") as container:
        stream = container.add_stream("g722", rate=sample_rate, layout="mono")
        assert isinstance(stream, av.AudioStream)  # (for mypy: an audio codec's stream)
        frame = av.AudioFrame.from_ndarray(
            to_int16(pcm).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = sample_rate
        frame.pts = 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


class StreamEncoder:
    """Encodes one streamed response, sentence by sentence, as the sentences arrive.

    WAV and raw formats become bare samples (after :meth:`header`). MP3 and AAC go through
    ONE :class:`CodecWriter` for the whole stream (the same path as whole files): encoding each
    sentence on its own (as an earlier version did) put an encoder delay and a padded last frame
    at every sentence join, about 70 ms (MP3) and 45 ms (AAC) of extra silence each. Samples
    short of a codec frame wait for the next sentence; :meth:`finish` flushes the rest. Not
    thread-safe: one stream, one encoder.

    Resampling is one soxr stream for the whole answer too: fed sentence by sentence it gives the
    very samples a one-shot resample of the joined audio gives (what the stored rendition is
    made of), where resampling each sentence alone gave other samples near every join and a
    length off by one.
    """

    def __init__(self, fmt: AudioFormat, rate: int) -> None:
        if not fmt.streamable:
            raise ValueError(f"format {fmt.name!r} cannot be streamed")
        self.fmt = fmt
        self.rate = rate
        self._codec = (
            CodecWriter(fmt, rate, whole_file=False) if fmt.container in _AV_CODECS else None
        )
        self._resampler: soxr.ResampleStream | None = None

    def header(self) -> bytes:
        """The bytes that open the stream: a streaming WAV header; nothing for raw or framed
        codecs, whose chunks carry their own framing."""
        if self.fmt.container != "WAV":
            return b""
        tag, bits = _WAV_TAGS[self.fmt.subtype]
        block = bits // 8
        fmt_body = struct.pack("<HHIIHH", tag, 1, self.rate, self.rate * block, block, bits)
        if tag != 1:
            fmt_body += struct.pack("<H", 0)  # cbSize: non-PCM fmt chunks carry it
        riff = struct.pack("<4sI8sI", b"RIFF", _UNKNOWN_SIZE, b"WAVEfmt ", len(fmt_body))
        return riff + fmt_body + struct.pack("<4sI", b"data", _UNKNOWN_SIZE)

    def encode(self, pcm: FloatPCM, src_rate: int) -> bytes:
        """The stream's next bytes for ``pcm`` (resampled to the stream's rate; every call of
        one stream gives the same ``src_rate``)."""
        if src_rate != self.rate:
            if self._resampler is None:
                self._resampler = soxr.ResampleStream(
                    src_rate, self.rate, 1, dtype="float32", quality="HQ"
                )
            pcm = np.asarray(self._resampler.resample_chunk(pcm), dtype=np.float32)
        return self._encode(pcm)

    def _encode(self, out: FloatPCM) -> bytes:
        if self._codec is None:
            raw = _RAW_OF_WAV[self.fmt.subtype] if self.fmt.container == "WAV" else self.fmt
            return encode(out, self.rate, raw)
        return self._codec.encode(out)

    def finish(self) -> bytes:
        """The stream's last bytes (the resampler's and the encoder's held-back samples)."""
        tail = b""
        if self._resampler is not None:
            rest = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
            tail = self._encode(np.asarray(rest, dtype=np.float32))
        return tail + (self._codec.finish() if self._codec is not None else b"")


# A streamed WAV's samples: the headerless format of its subtype.
_RAW_OF_WAV = {"PCM_16": FORMATS["pcm"], "ULAW": FORMATS["ulaw"], "ALAW": FORMATS["alaw-raw"]}
