"""What every provider client shares: the :class:`Provider` protocol, the entry it reads
(:class:`ProviderConfig`), its failures (:class:`ProviderError`), the :class:`ProviderSpec` each
provider module declares of its kind, and the helpers that turn an answer into audio or an error.

Nothing here names a kind: a provider module says what its kind is, and
:data:`synth.providers.SPECS` lists them.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import soxr

from synth.audio import resample, to_int16
from synth.engine import Audio, SynthesisItem
from synth.takecheck import (
    MAX_RATE,
    MIN_RATE,
    Container,
    Limits,
    SpeakingRates,
    TakeFacts,
    sniff_container,
)

MIB = 1024 * 1024
# A voice name the provider is sent when the entry's voices include "*" (any voice): a
# provider's voice ids are short identifiers; anything else is refused before it costs a call.
VOICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+\-]{0,127}")
# The pcm rates most providers offer.
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
MAX_PROVIDER_MESSAGE = 300


class ProviderConfig(Protocol):
    """An upstream entry as a provider reads it (:class:`synth.upstream.UpstreamConfig` is one;
    the providers depend on this, so the entry, which checks itself against the providers'
    specs, can depend on them)."""

    base_url: str
    api_key_env: str
    model: str
    language: str
    region: str
    key_id_env: str
    session_token_env: str
    timeout_s: float
    format: Literal["pcm", "wav"]
    sample_rate: int
    instructions: bool
    voice_settings: dict[str, float | bool]
    max_audio_mb: int


class ProviderError(Exception):
    """One call to a provider failed. ``kind`` is one of :data:`synth.errors.UPSTREAM_ERROR_KINDS`;
    ``retryable`` says whether the same call may succeed later; ``message`` is safe to show (the
    provider's own words where the caller is at fault)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
        reason: str = "",
        oversize: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        # For an answer that is no usable take: its reason (synth.takecheck.REASONS).
        self.reason = reason
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        # An answer cut off for its size (too_long, or past max_audio_mb): billed, and the same
        # call would be answered the same.
        self.oversize = oversize or reason == "too_long"


class Provider(Protocol):
    """A client of one provider's API, made from a :class:`ProviderConfig`. It hands each piece
    of its raw 16-bit pcm answer to ``item.sink`` (when set: only for an entry that
    streams pcm) as it arrives."""

    async def synthesize(self, item: SynthesisItem, timeout_s: float) -> Audio:
        """The audio of ``item`` (one call, no retry); :class:`ProviderError` when there is none."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True)
class ProviderSpec:
    """One provider kind, as the entry's checks, the runner's builder and the content address
    see it."""

    kind: str
    # The client of an entry: (entry, API key, environment holding any further credentials).
    factory: Callable[[ProviderConfig, str, Mapping[str, str]], Provider]
    # base_url's scheme: "http" (http:// or https://) or "tcp" (tcp://host:port).
    scheme: Literal["http", "tcp"] = "http"
    # What it may be asked for, and the pcm rates it offers (empty: any).
    formats: tuple[str, ...] = ("pcm",)
    rates: tuple[int, ...] = ()
    # None: no model id needed; else the entry must name one (this is an example, or "").
    model: str | None = None
    # The entry's `language` goes into every request (so into the content address).
    sends_language: bool = False
    # Its service writes out numbers, amounts, dates and times itself, as its docs say: an
    # entry's `normalize = "auto"` sends the text as written (docs/upstreams.md, "Numbers").
    reads_numbers: bool = False
    # The answer cannot come in pieces (a JSON body): no streaming pass-through.
    whole_answer: bool = False
    # The package its client imports, from the extra named like the kind ("": none).
    sdk: str = ""
    # Entry fields that only this kind takes.
    owns: tuple[str, ...] = ()
    # Entry fields naming further variables that must be set, with what each holds.
    secret_envs: tuple[tuple[str, str], ...] = ()
    # The kind's own checks of an entry: a ValueError saying what is wrong.
    check: Callable[[ProviderConfig], None] | None = None


def error_for_status(
    status: int, message: str, retry_after_s: float | None, throttled: bool = False
) -> ProviderError:
    """The :class:`ProviderError` of an HTTP answer ``status`` with the provider's ``message``.

    429 (or any status the provider says is ``throttled``), 408, 409 and 5xx may pass
    (retried); 401 and 403 are our key's fault (502, counted against the breaker); 400, 413 and
    422 are the request's (the caller's 400, with the provider's message); anything else is a
    provider failure.
    """
    text = provider_message(message)
    if status == 429 or throttled:
        return ProviderError(
            "rate_limited", text, status=status, retryable=True, retry_after_s=retry_after_s
        )
    if status in (408, 409) or status >= 500:
        return ProviderError(
            "server", text, status=status, retryable=True, retry_after_s=retry_after_s
        )
    if status in (401, 403):
        return ProviderError("auth", text, status=status)
    if status in (400, 413, 422):
        return ProviderError("refused", text, status=status)
    return ProviderError("server", text, status=status)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def speed_refusal(provider: object, speed: float) -> str:
    """Why ``provider`` cannot be asked for ``speed`` ("" when it can), from its ``speeds``
    (the range its API takes; none: any) and ``speed_refusal``: the runner asks this before a
    call takes a slot of its upstream's limits, as voxgate's own refusal."""
    speeds = getattr(provider, "speeds", None)
    if speeds is None:
        return ""
    low, high = speeds
    return "" if low <= speed <= high else str(getattr(provider, "speed_refusal", ""))


def provider_message(message: str) -> str:
    """A provider's message as a client may be shown it: one line, clipped."""
    text = _CONTROL.sub(" ", message).strip()
    if len(text) > MAX_PROVIDER_MESSAGE:
        text = text[: MAX_PROVIDER_MESSAGE - 3] + "..."
    return text or "no message"


# The longest wait a provider's answer is read as asking for (a year): what it asks beyond that,
# ``inf`` and 40-digit numbers included, is this, and the runner clamps it to its own deadline.
MAX_RETRY_AFTER_S = 365 * 86400.0


def _seconds(text: str, scale: float = 1.0) -> float | None:
    """A number of seconds (``scale``: of the unit written) in ``[0, MAX_RETRY_AFTER_S]``; None
    for what is no number (``nan`` included)."""
    try:
        wait = float(text) * scale
    except ValueError:
        return None
    if math.isnan(wait):
        return None
    return min(max(0.0, wait), MAX_RETRY_AFTER_S)


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """Seconds a provider asks to wait: ``retry-after-ms`` (OpenAI's), else ``Retry-After`` in
    seconds or as an HTTP date; None when it asks nothing readable. Always finite, at most
    :data:`MAX_RETRY_AFTER_S`: the caller clamps it further, to its own deadline."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        wait = _seconds(ms, 1 / 1000)
        if wait is not None:
            return wait
    value = headers.get("retry-after")
    if value is None:
        return None
    wait = _seconds(value)
    if wait is not None:
        return wait
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT, whether it says so or not
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - time.time()), MAX_RETRY_AFTER_S)


def redirect_refused(status: int) -> ProviderError:
    """The :class:`ProviderError` of a redirect answer: never followed (the key and the text
    would go to wherever it points), not retried (the next call is redirected too)."""
    return ProviderError(
        "server",
        f"the provider answered a redirect ({status}), which voxgate does not follow",
        status=status,
    )


def refused_take(reason: str, message: str) -> ProviderError:
    """The :class:`ProviderError` of a 200 answer that is no usable take, ``reason`` (one of
    :data:`synth.takecheck.REASONS`) first in its message: not retried, nothing stored."""
    return ProviderError("bad_reply", f"{reason}: {message}", reason=reason)


# A take's answer is at least this long a bound, in seconds of audio: a short text's take may
# carry a second of silence at either end, and a slow voice is slower than any prior.
MIN_ANSWER_S = 10.0
# The bytes read before the container is named (a WAV header with its fmt chunk fits in them).
SNIFF_BYTES = 64
# The most of a WAV file read before its samples (LIST and other metadata chunks included).
MAX_WAV_HEADER = 64 * 1024
# What a second of compressed audio may take at most: 48 kHz stereo 16-bit, uncompressed.
MAX_BYTES_PER_S = MAX_RATE * 4


def answer_seconds(item: SynthesisItem, language: str) -> float:
    """The longest a take of ``item`` may plausibly last: its text at the prior speaking rate
    of ``language``, at the asked speed, times the take checks' ``max_duration_ratio``."""
    facts = TakeFacts(np.zeros(0, np.float32), MIN_RATE, item.text, item.speed, language=language)
    expected = SpeakingRates().expected_range_s(facts)[1]
    return max(MIN_ANSWER_S, expected * Limits().max_duration_ratio)


@dataclass(frozen=True)
class WavLayout:
    """What a WAV header says of its samples: ``data_at`` is where they start, ``data_end``
    where they end (None: a streamed WAV's unknown length, to the end of the body; chunks
    after the samples, such as a trailing LIST, are never read as samples)."""

    rate: int
    channels: int
    dtype: str  # numpy's, or "<i3" for 24-bit
    data_at: int
    data_end: int | None = None

    @property
    def frame_bytes(self) -> int:
        return self.channels * int(self.dtype[-1])

    def mono(self, data: bytes | bytearray | memoryview) -> npt.NDArray[np.float32]:
        """Whole frames of ``data`` as the first channel's float samples."""
        width = int(self.dtype[-1])
        if self.dtype == "<i3":
            b = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
            ints = (b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16) << 8  # sign from bit 31
            return ints.reshape(-1, self.channels)[:, 0].astype(np.float32) / 2.0**31
        frames = np.frombuffer(data, dtype=self.dtype).reshape(-1, self.channels)[:, 0]
        if self.dtype[1] == "f":
            return np.nan_to_num(frames.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
        if self.dtype == "u1":
            return (frames.astype(np.float32) - 128.0) / 128.0
        return (frames.astype(np.float32) / float(2 ** (8 * width - 1))).astype(np.float32)


_WAV_DTYPES = {(1, 8): "u1", (1, 16): "<i2", (1, 24): "<i3", (1, 32): "<i4"}
_WAV_DTYPES |= {(3, 32): "<f4", (3, 64): "<f8"}


def wav_layout(head: bytes | bytearray) -> WavLayout | None:
    """The layout a RIFF/WAVE header in ``head`` states; None while the header is not all
    there; a :class:`ProviderError` (``not_audio``, ``bad_rate``) for one that cannot be."""
    pos, fmt = 12, None
    while len(head) >= pos + 8:
        chunk, size = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        if chunk == b"data":
            if fmt is None:
                raise refused_take("not_audio", "the WAV has samples but no fmt chunk")
            known = 0 < size < 0xFFFFFFFF - pos  # streamed WAVs state 0 or 0xFFFFFFFF
            return WavLayout(*fmt, data_at=pos + 8, data_end=pos + 8 + size if known else None)
        if chunk == b"fmt ":
            body = head[pos + 8 : pos + 8 + min(size, 26)]
            if len(body) < min(size, 26):
                return None
            if size < 16:
                raise refused_take("not_audio", "the WAV's fmt chunk is cut short")
            tag, channels, rate = int.from_bytes(body[0:2], "little"), body[2], body[4:8]
            bits = int.from_bytes(body[14:16], "little")
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the real tag
                tag = int.from_bytes(body[24:26], "little")
            hz = int.from_bytes(rate, "little")
            if not MIN_RATE <= hz <= MAX_RATE:
                raise refused_take("bad_rate", f"the WAV claims {hz} Hz (8-48 kHz is speech)")
            dtype = _WAV_DTYPES.get((tag, bits))
            if dtype is None or not 1 <= channels <= 8:
                raise refused_take(
                    "not_audio", f"a WAV of {channels} channels, format {tag}, {bits}-bit"
                )
            fmt = (hz, channels, dtype)
        pos += 8 + size + (size & 1)
        if pos > MAX_WAV_HEADER:
            raise refused_take("not_audio", "the WAV has no samples in its first 64 KiB")
    return None


class AnswerReader:
    """A provider's 200 answer read as it comes, as what it is, and bounded.

    The container is named from the first bytes and the content type
    (:func:`synth.takecheck.sniff_container`): text (an HTML page, a JSON error) is refused as
    ``not_audio`` before more is read; a WAV is read at its own rate whatever was asked (a
    server that answers WAV to a pcm request is common), and one claiming a rate outside
    8-48 kHz is refused as ``bad_rate``. The bytes read are bounded by the text's longest
    plausible take (:func:`answer_seconds`) in that container, and by ``max_audio_mb``: a
    runaway body is cut off and refused as ``too_long``, never buffered whole.

    ``max_audio_mb`` counts the take's 16-bit pcm at the rate it is kept at (what the pool
    process's reply frame is sized from: it carries float32, twice that): a WAV of wider or
    narrower samples, or at another rate, is bounded by the samples it makes, and so is the
    decoded take. The body is read into one buffer, dropped when the read ends whatever the
    outcome (a refusal leaves nothing of it held).

    With a ``sink`` (a pcm stream), each piece goes on as 16-bit samples at the entry's
    ``sample_rate``: raw pcm as it comes, a WAV's samples after its header, resampled when its
    rate is another. Feeding resamples a piece on the loop: a piece is at most an HTTP chunk.
    """

    def __init__(
        self,
        config: ProviderConfig,
        item: SynthesisItem,
        sink: Callable[[bytes], None] | None = None,
        content_type: str = "",
    ) -> None:
        self.config = config
        self.sink = sink
        self.content_type = content_type
        self.seconds = answer_seconds(item, config.language)
        self.max_samples = max_samples(config)
        self.cap = self.max_samples * 2
        self.limit = self.cap
        self.container: Container | None = None
        self.wav: WavLayout | None = None
        self.size = 0
        self._buffer = bytearray()
        self._carry = b""  # a part frame waiting for the rest (a WAV passed on)
        self._resampler: soxr.ResampleStream | None = None

    async def read(self, body: AsyncIterable[bytes]) -> Audio:
        """The audio of ``body`` (decoded off the loop when large)."""
        try:
            async for piece in body:
                self.feed(piece)
            if self.size > MIB or self._resamples:
                return await asyncio.to_thread(self.finish)
            return self.finish()
        finally:
            # The error's traceback keeps this reader alive as long as the error is kept (a
            # failed task, a held refusal): not the answer's bytes with it.
            self._buffer = bytearray()

    @property
    def _resamples(self) -> bool:
        asked = self.config.format == "pcm"
        return asked and self.wav is not None and self.wav.rate != self.config.sample_rate

    def feed(self, piece: bytes) -> None:
        """One more piece of the body."""
        if not piece:
            return
        self.size += len(piece)
        if self.size > self.limit:
            raise self._too_long()
        self._buffer += piece
        if self.container is None or (self.container == "wav" and self.wav is None):
            head = bytes(self._buffer)
            if self.container is None and len(head) < SNIFF_BYTES:
                return
            if self._name(head) == "unknown" or self.wav is not None:
                self._pass(head[self.wav.data_at :] if self.wav is not None else head, len(head))
            return
        self._pass(piece, self.size)

    def _name(self, head: bytes) -> Container:
        """Name the container of ``head`` and bound the body by what it is."""
        if self.container is None:
            self.container = sniff_container(head, self.content_type)
            framed = head[:3] != b"ID3" and self.container in ("mp3", "aac")
            said = any(name in self.content_type.lower() for name in ("mpeg", "mp3", "aac"))
            if framed and self.config.format == "pcm" and not said:
                # An MPEG frame sync is two bytes raw samples may start with (-7937 is
                # 0xFF 0xE0): asked for pcm, a body is MPEG only when its content type says so.
                self.container = "unknown"
            if self.container == "text":
                kind = self.content_type.split(";")[0].strip() or "text"
                raise refused_take("not_audio", f"the provider's answer is {kind}, not audio")
            if self.container == "unknown" and self.config.format != "pcm":
                raise refused_take("not_audio", "the provider's answer is not a WAV file")
        per_s = MAX_BYTES_PER_S
        if self.container == "unknown":
            per_s = self.config.sample_rate * 2
        elif self.container == "wav":
            self.wav = wav_layout(head)
            if self.wav is None:
                return self.container
            per_s = self.wav.rate * self.wav.frame_bytes
            # The samples it holds, once at the rate the take is kept at, fit max_audio_mb.
            kept = self.config.sample_rate if self.config.format == "pcm" else self.wav.rate
            frames = self.max_samples * self.wav.rate // kept
            self.cap = MAX_WAV_HEADER + frames * self.wav.frame_bytes
        self.limit = min(self.cap, MAX_WAV_HEADER + int(self.seconds * per_s))
        if self.size > self.limit:
            raise self._too_long()
        return self.container

    def _too_long(self) -> ProviderError:
        if self.limit == self.cap:
            return too_large(self.config)
        return refused_take(
            "too_long", f"the answer is longer than its text can take ({self.seconds:.0f} s)"
        )

    def _pass(self, data: bytes, upto: int) -> None:
        """Samples on to the sink, as 16-bit pcm at the entry's rate (``data`` ends at body
        offset ``upto``)."""
        if self.sink is None or not data:
            return
        wav = self.wav
        if wav is None:
            if self.container == "unknown":
                self.sink(data)
            return
        if wav.data_end is not None and upto > wav.data_end:
            data = data[: max(0, len(data) - (upto - wav.data_end))]
        data = self._carry + data
        whole = len(data) - len(data) % wav.frame_bytes
        self._carry = data[whole:]
        if not whole:
            return
        if wav.dtype == "<i2" and wav.channels == 1 and not self._resamples:
            self.sink(data[:whole])
            return
        self._sink_float(wav.mono(data[:whole]))

    def _sink_float(self, pcm: npt.NDArray[np.float32], last: bool = False) -> None:
        assert self.sink is not None and self.wav is not None
        if self._resamples:
            if self._resampler is None:
                self._resampler = soxr.ResampleStream(
                    self.wav.rate, self.config.sample_rate, 1, dtype="float32", quality="HQ"
                )
            pcm = self._resampler.resample_chunk(pcm, last=last)
        if pcm.size:
            self.sink(to_int16(pcm).tobytes())

    def finish(self) -> Audio:
        """The whole answer's audio (blocking when it decodes or resamples: off the loop)."""
        data = self._buffer
        container = self.container
        if container is None:  # shorter than a sniff
            container = self._name(bytes(data))
            if container == "unknown":
                self._pass(bytes(data), len(data))
        if container == "unknown":
            return pcm16_audio(data, self.config.sample_rate)
        if container == "wav":
            wav = self.wav
            if wav is None:
                raise refused_take("not_audio", "the WAV ends inside its header")
            samples = memoryview(data)[wav.data_at : wav.data_end]
            pcm = wav.mono(samples[: len(samples) - len(samples) % wav.frame_bytes])
            if self.sink is not None and self._resamples:
                self._sink_float(np.zeros(0, np.float32), last=True)
            audio = Audio(pcm, wav.rate)
        else:
            audio = decoded_audio(bytes(data))
        if not audio.pcm.size:
            raise ProviderError("bad_reply", "the provider's answer holds no audio")
        if self.config.format == "pcm" and audio.sample_rate != self.config.sample_rate:
            # Asked for pcm at this rate: the take is made at it, whatever came.
            pcm = resample(audio.pcm, audio.sample_rate, self.config.sample_rate)
            audio = Audio(pcm, self.config.sample_rate)
        if audio.pcm.size > self.max_samples:  # a compressed answer, decoded
            raise too_large(self.config)
        return audio


def max_samples(config: ProviderConfig) -> int:
    """The most samples a take of ``config``'s provider may hold: ``max_audio_mb`` of 16-bit
    pcm (a pool process's reply carries them as float32: :func:`max_reply_bytes`)."""
    return config.max_audio_mb * MIB // 2


def max_reply_bytes(config: ProviderConfig) -> int:
    """The reply frame the pool process needs for a take of ``config``'s provider: its most
    samples as float32, plus 64 KiB for the reply's header."""
    return max_samples(config) * 4 + 64 * 1024


def too_large(config: ProviderConfig) -> ProviderError:
    """The :class:`ProviderError` of an answer past ``max_audio_mb``."""
    return ProviderError(
        "bad_reply",
        f"the answer is larger than {config.max_audio_mb} MiB of pcm (max_audio_mb)",
        oversize=True,
    )


def pcm16_audio(data: bytes | bytearray, sample_rate: int) -> Audio:
    """16-bit little-endian mono PCM as float audio; a :class:`ProviderError` for what is not."""
    if not data or len(data) % 2:
        raise ProviderError("bad_reply", f"the provider's pcm is {len(data)} bytes, not 16-bit")
    samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    return Audio(samples, sample_rate)


def decoded_audio(data: bytes) -> Audio:
    """An audio file's first channel as float audio, whatever its container libsndfile reads
    (WAV, FLAC, Ogg, MP3), its rate checked (blocking: decode off the loop)."""
    import io

    import soundfile

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise refused_take("not_audio", f"the provider's audio does not decode ({exc})") from None
    if not MIN_RATE <= rate <= MAX_RATE:
        raise refused_take("bad_rate", f"the audio claims {rate} Hz (8-48 kHz is speech)")
    if len(samples) == 0:
        raise ProviderError("bad_reply", "the provider's audio holds no samples")
    return Audio(np.ascontiguousarray(samples[:, 0]), int(rate))


def wav_audio(data: bytes) -> Audio:
    """A WAV file's first channel as float audio (blocking: decode off the loop); a body that
    is not a WAV, or claims a rate outside 8-48 kHz, is refused."""
    container = sniff_container(data)
    if container != "wav":
        raise refused_take("not_audio", f"the provider's answer is {container}, not a WAV file")
    return decoded_audio(data)
