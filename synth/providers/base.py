"""What every provider client shares: the :class:`Provider` protocol, the entry it reads
(:class:`ProviderConfig`), its failures (:class:`ProviderError`), the :class:`ProviderSpec` each
provider module declares of its kind, and the helpers that turn an answer into audio or an error.

Nothing here names a kind: a provider module says what its kind is, and
:data:`synth.providers.SPECS` lists them.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal, Protocol

import numpy as np

from synth.engine import Audio, SynthesisItem

MIB = 1024 * 1024
# A voice name the provider is sent when the entry's voices include "*" (any voice): a
# provider's voice ids are short identifiers; anything else is refused before it costs a call.
VOICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+\-]{0,127}")
# The pcm rates most providers offer.
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
# The longest provider message passed on to a client (it is the provider's words, clipped).
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

    @property
    def streams_pcm(self) -> bool: ...


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
        sent: bool = True,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        # False: refused before anything was sent (not a call).
        self.sent = sent


class Provider(Protocol):
    """A client of one provider's API, made from a :class:`ProviderConfig`. One whose
    ``passes_pcm`` is true hands each piece of its raw 16-bit pcm answer to ``item.sink`` (when
    set) as it arrives."""

    passes_pcm: bool

    async def synthesize(self, item: SynthesisItem, timeout_s: float) -> Audio:
        """The audio of ``item`` (one call, no retry); :class:`ProviderError` when there is none."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True)
class ProviderSpec:
    """One provider kind, as the entry's checks, the runner's builder and the content address
    see it. Each provider module declares its own (``SPEC``)."""

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


def error_for_status(status: int, message: str, retry_after_s: float | None) -> ProviderError:
    """The :class:`ProviderError` of an HTTP answer ``status`` with the provider's ``message``.

    429, 408, 409 and 5xx may pass (retried); 401 and 403 are our key's fault (502, counted
    against the breaker); 400, 413 and 422 are the request's (the caller's 400, with the
    provider's message); anything else is a provider failure.
    """
    text = provider_message(message)
    if status == 429:
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


def provider_message(message: str) -> str:
    """A provider's message as a client may be shown it: one line, clipped."""
    text = _CONTROL.sub(" ", message).strip()
    if len(text) > MAX_PROVIDER_MESSAGE:
        text = text[: MAX_PROVIDER_MESSAGE - 3] + "..."
    return text or "no message"


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """Seconds a provider asks to wait: ``retry-after-ms`` (OpenAI's), else ``Retry-After`` in
    seconds or as an HTTP date; None when it asks nothing readable."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def read_answer(
    body: AsyncIterable[bytes], config: ProviderConfig, sink: Callable[[bytes], None] | None
) -> bytes:
    """An answer's body read as it comes, up to ``max_audio_mb`` (a provider cannot make the
    gateway hold more); each piece goes on to ``sink`` when one is given."""
    pieces: list[bytes] = []
    size = 0
    async for piece in body:
        size += len(piece)
        if size > config.max_audio_mb * MIB:
            raise ProviderError("bad_reply", f"the answer is larger than {config.max_audio_mb} MiB")
        pieces.append(piece)
        if sink is not None and piece:
            sink(piece)
    return b"".join(pieces)


def pcm16_audio(data: bytes, sample_rate: int) -> Audio:
    """16-bit little-endian mono PCM as float audio; a :class:`ProviderError` for what is not."""
    if not data or len(data) % 2:
        raise ProviderError("bad_reply", f"the provider's pcm is {len(data)} bytes, not 16-bit")
    samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    return Audio(samples, sample_rate)


def wav_audio(data: bytes) -> Audio:
    """A WAV file's first channel as float audio (blocking: decode off the loop)."""
    import io

    import soundfile

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise ProviderError("bad_reply", f"the provider's wav does not decode ({exc})") from None
    if len(samples) == 0:
        raise ProviderError("bad_reply", "the provider's wav holds no audio")
    return Audio(np.ascontiguousarray(samples[:, 0]), int(rate))
