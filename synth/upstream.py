"""Upstreams: remote TTS services and other TTS servers as models of the same store.

An upstream is configured in the upstreams file (TOML, ``[[upstream]]`` entries, see
docs/upstreams.md) and served under its ``name`` like any local model. It is two parts, like a
pooled local engine: :class:`UpstreamEngine` (the metadata) and :class:`UpstreamRunner` (the calls,
under the policy of docs/upstreams.md, "How it treats the provider" and "What a client sees when
it fails").

What the provider is asked for is a lossless format (``pcm`` or ``wav``); the stored master is
made from it, so every other format is a transcode, never a second call.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import StorageError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from redis.exceptions import RedisError

from metrics import Metrics
from synth import credentials
from synth.engine import Audio, EngineCapabilities, ParamValue, SynthesisItem, VoiceInfo
from synth.errors import OWN_REFUSALS, UPSTREAM_ERROR_KINDS, EngineError, UpstreamError
from synth.providers import SPECS
from synth.providers.base import VOICE_ID, Provider, ProviderError, ProviderSpec, speed_refusal

log = logging.getLogger("voxgate.upstream")

# The table's kinds: to pydantic a Literal (so an unknown kind is refused in its own words, and
# the schema lists them); to mypy, which cannot read a Literal made at run time, a str.
if TYPE_CHECKING:
    Kind = str
else:
    Kind = Literal[tuple(SPECS)]
SCHEMES = {"http": (("http", "https"), "an http(s):// URL"), "tcp": (("tcp",), "tcp://host:port")}


class UpstreamConfig(BaseModel):
    """One ``[[upstream]]`` entry of the upstreams file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$",
        description="The model name clients use (aliases work as for local models).",
    )
    kind: Kind = Field(description="The provider's API: openai (any OpenAI-compatible server).")
    base_url: str = Field(
        description="The API's base URL, e.g. https://api.openai.com/v1 (openai), or "
        "tcp://host:port (wyoming)."
    )
    api_key_env: str = Field(
        "",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$|^$",
        description="The environment variable holding the API key (never the key itself); "
        "empty: the server takes no key.",
    )
    model: str = Field(
        "", description="The provider's model id (openai: required).", max_length=128
    )
    voices: tuple[str, ...] = Field(
        ("*",),
        description='The provider voice ids served; "*" also lets any other id through.',
        min_length=1,
    )
    language: str = Field(
        "",
        pattern=r"^([A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*)?$",
        description="The voices' language (en_US): for number reading; polly and cartesia "
        "also send it (LanguageCode, language).",
    )
    region: str = Field(
        "",
        pattern=r"^([a-z]{2}(-[a-z]+)+-\d)?$",
        description="polly: the AWS region (us-east-1); empty: taken from base_url's host.",
    )
    key_id_env: str = Field(
        "AWS_ACCESS_KEY_ID",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="polly: the variable holding the access key id (api_key_env holds the "
        "secret access key).",
    )
    session_token_env: str = Field(
        "",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$|^$",
        description="polly: the variable holding a session token (temporary credentials).",
    )
    max_concurrency: int = Field(8, ge=1, le=1024, description="Calls in flight to it.")
    requests_per_minute: int = Field(
        0, ge=0, description="Calls started per minute, across replicas with Redis; 0: no limit."
    )
    timeout_s: float = Field(
        30.0, gt=0, le=600, description="Bound on a miss's call, retries and waits included."
    )
    max_retries: int = Field(3, ge=0, le=10, description="Retries on 429, 408 and 5xx.")
    breaker_failures: int = Field(
        5, ge=1, le=1000, description="Failed misses in a row that open the circuit breaker."
    )
    breaker_reset_s: float = Field(
        10.0, gt=0, le=3600, description="Seconds an open breaker waits before one probe call."
    )
    price_per_million_chars: float = Field(
        0.0, ge=0, description="What the provider charges, for the savings metric."
    )
    revision: str = Field(
        "1",
        max_length=64,
        description="Bump to give every text a new address (the provider changed a voice).",
    )
    split: Literal["sentence", "whole"] = Field(
        "sentence",
        description="sentence: each sentence its own call and cache entry; whole: one per text.",
    )
    format: Literal["pcm", "wav"] = Field(
        "pcm", description="What the provider is asked for: lossless, kept as the master."
    )
    sample_rate: int = Field(
        24000, ge=8000, le=192000, description="The rate of the provider's pcm (OpenAI: 24 kHz)."
    )
    instructions: bool = Field(
        True, description="Pass OpenAI's `instructions` on (part of the content address)."
    )
    voice_settings: dict[str, float | bool] = Field(
        default_factory=dict,
        description="elevenlabs: voice_settings sent with every call (stability, "
        "similarity_boost, style, use_speaker_boost); part of the content address.",
    )
    max_audio_mb: int = Field(
        64, ge=1, le=1024, description="Largest answer read from the provider, in MiB."
    )
    normalize: Literal["auto", "numbers", "none"] = Field(
        "auto",
        description='The text front end of its requests\' normalize "auto": numbers (digits, '
        "amounts, dates and times written out in `language` before the call), none (sent as "
        "written), auto (none for a kind whose service reads them itself, numbers for wyoming).",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https", "tcp") or not parts.hostname:
            raise ValueError("must be an http://, https:// or tcp:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _fits_its_kind(self) -> UpstreamConfig:
        spec, kind = self.spec, self.kind
        url = urlsplit(self.base_url)
        schemes, shape = SCHEMES[spec.scheme]
        if url.scheme not in schemes or (spec.scheme == "tcp" and url.port is None):
            raise ValueError(f"base_url of kind {kind} must be {shape}")
        if self.format not in spec.formats or (spec.rates and self.sample_rate not in spec.rates):
            if not spec.rates:
                raise ValueError(f'kind {kind} is asked for pcm (format = "pcm")')
            raise ValueError(
                f'kind {kind} is asked for pcm at one of its rates: format = "pcm", '
                f"sample_rate in {', '.join(map(str, spec.rates))}"
            )
        if spec.model is not None and not self.model:
            example = f": {spec.model}" if spec.model else ""
            raise ValueError(f"kind {kind} needs the provider's model id (model{example})")
        for other in SPECS.values():
            if other is not spec and any(getattr(self, field) for field in other.owns):
                raise ValueError(f"{' and '.join(other.owns)} are for kind {other.kind}")
        if spec.check is not None:
            spec.check(self)
        return self

    @field_validator("voices")
    @classmethod
    def _voice_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for voice in value:
            if voice != "*" and not VOICE_ID.fullmatch(voice):
                raise ValueError(f"{voice!r} is not a voice id")
        return value

    @property
    def any_voice(self) -> bool:
        """Whether voices beyond the listed ones go to the provider as asked."""
        return "*" in self.voices

    @property
    def spec(self) -> ProviderSpec:
        """What the entry's kind is (:data:`synth.providers.SPECS`)."""
        return SPECS[self.kind]

    @property
    def front_end(self) -> Literal["numbers", "none"]:
        """The front end ``normalize = "auto"`` of a request to it runs (``normalize``, or by
        what its kind's service does with digits)."""
        if self.normalize != "auto":
            return self.normalize
        return "none" if self.spec.reads_numbers else "numbers"

    @property
    def streams_pcm(self) -> bool:
        """Whether the provider's answer is raw 16-bit pcm that arrives in pieces (an HTTP
        body read as it comes, Wyoming's audio-chunk events): each piece may go on to a stream
        before the whole (streaming pass-through)."""
        return self.format == "pcm" and not self.spec.whole_answer

    @property
    def public_base_url(self) -> str:
        """``base_url`` without credentials (user:password@) or a fragment: what may be shown,
        and what the audio depends on."""
        parts = urlsplit(self.base_url)
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))

    def address_material(self) -> dict[str, object]:
        """What, besides voice, text and parameters, decides the audio: the upstream's part of
        every content address (no secret, no tunable that leaves the audio as it is)."""
        return {
            "kind": self.kind,
            "base_url": self.public_base_url,
            "model": self.model,
            "format": self.format,
            "sample_rate": self.sample_rate if self.format == "pcm" else None,
            "revision": self.revision,
            "split": self.split,
            **({"voice_settings": self.voice_settings} if self.voice_settings else {}),
            # The language these kinds send changes the audio (a bilingual voice's language).
            **({"language": self.language} if self.spec.sends_language else {}),
        }


class UpstreamsFile(BaseModel):
    """The upstreams file: ``[[upstream]]`` entries."""

    model_config = ConfigDict(extra="forbid")

    upstream: list[UpstreamConfig] = Field(default_factory=list)


def load_upstreams(path: str | Path) -> list[UpstreamConfig]:
    """The entries of the upstreams file at ``path`` (blocking: call it off the event loop).

    ``ValueError`` with a message naming the file, the entry and the field for anything wrong:
    unreadable TOML, an unknown key, a bad value, two entries of one name.
    """
    try:
        data = tomllib.loads(Path(path).read_bytes().decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"upstreams file {path}: {exc}") from exc
    try:
        entries = UpstreamsFile.model_validate(data).upstream
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"upstreams file {path}: {where}: {first['msg']}") from exc
    names = [e.name for e in entries]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"upstreams file {path}: two entries are named {name!r}")
    return entries


class UpstreamEngine:
    """The metadata side of an upstream (the :class:`~synth.engine.Engine` protocol): voices,
    sample rate and the fingerprint every content address of it carries. It synthesizes
    nothing itself: its runner calls the provider."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self.name = f"upstream-{config.kind}"
        material = json.dumps(config.address_material(), sort_keys=True, separators=(",", ":"))
        self.fingerprint = hashlib.blake2b(material.encode(), digest_size=32).hexdigest()
        self.sample_rate = config.sample_rate
        self._voices = [
            VoiceInfo(v, config.language, f"{config.kind} voice of {config.model}")
            for v in config.voices
            if v != "*"
        ]

    def voices(self) -> Sequence[VoiceInfo]:
        return self._voices

    def reconfigure(self, config: UpstreamConfig) -> str:
        """Take ``config``'s tunables (the price here); "" when done, else what needs a restart."""
        old = self.config
        if config.name != old.name or config.address_material() != old.address_material():
            return "a change of what is in the content address"
        if config.voices != old.voices or config.language != old.language:
            return "a change of the voices"
        if config.front_end != old.front_end:
            # Validated requests are remembered by their body (gateway.api.parsing.RequestMemo):
            # the text an old body stands for must not change under them.
            return "a change of normalize"
        for *most, last in (
            ("instructions", "api_key_env"),
            ("region", "key_id_env", "session_token_env"),  # where calls are signed, and how
        ):
            if any(getattr(config, f) != getattr(old, f) for f in (*most, last)):
                return f"a change of {', '.join(most)} or {last}"
        self.config = config
        return ""

    @property
    def capabilities(self) -> EngineCapabilities:
        """Read from the current config each time: a reload may change the price."""
        config = self.config
        return EngineCapabilities(
            takes_instructions=config.instructions,
            remote=True,
            any_voice=config.any_voice,
            splits_sentences=config.split == "sentence",
            price_per_million_chars=config.price_per_million_chars,
            front_end=config.front_end,
            any_voice_language=config.language,
        )

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        return {}

    def load(self) -> None:
        """Nothing to load: the provider holds the model."""

    def warm_up(self) -> None:
        """Nothing to warm: a provider that is down must not make cached audio unservable."""

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        raise EngineError("an upstream is called through its runner, not in a thread")

    def describe(self) -> Mapping[str, object]:
        c = self.config
        return {
            "upstream": c.kind,
            "base_url": c.public_base_url,
            "provider_model": c.model,
            "format": c.format,
            "revision": c.revision,
            "split": c.split,
            "any_voice": c.any_voice,
            "max_concurrency": c.max_concurrency,
            "requests_per_minute": c.requests_per_minute,
            "timeout_s": c.timeout_s,
            "front_end": c.front_end,
        }


class Breaker(Protocol):
    """A circuit breaker (``cache.breaker.CircuitBreaker`` is one; the gateway passes it in)."""

    failures: int
    reset_s: float

    def allow(self) -> bool: ...

    def success(self) -> None: ...

    def failure(self) -> None: ...


class RequestRate:
    """``requests_per_minute`` of one upstream: a moving window (no more calls started in any
    60 s than the provider allows) in ``shared`` storage (Redis: one budget for every replica)
    when given, else in this process.

    A shared storage that fails is left for 5 s and the window kept here
    meanwhile (looser, never off); counted in ``voxgate_upstream_rate_fallbacks_total``.
    """

    def __init__(
        self,
        upstream: str,
        per_minute: int,
        metrics: Metrics,
        *,
        shared: Storage | None = None,
        timeout_s: float = 0.5,
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.set_limit(per_minute)
        self._local = MovingWindowRateLimiter(MemoryStorage())
        self._shared = MovingWindowRateLimiter(shared) if shared is not None else None
        self.timeout_s = timeout_s
        self._shared_down_until = 0.0

    async def _try(self) -> tuple[bool, float]:
        """(started, seconds until a slot frees) for one call now."""
        ident = ("voxgate-upstream", self.upstream)
        if self._shared is not None and time.monotonic() >= self._shared_down_until:
            try:
                async with asyncio.timeout(self.timeout_s * 2):
                    if await self._shared.hit(self.item, *ident):
                        return True, 0.0
                    stats = await self._shared.get_window_stats(self.item, *ident)
                    return False, max(0.01, stats.reset_time - time.time())
            except (StorageError, RedisError, OSError, TimeoutError) as exc:
                log.warning(
                    "upstream %s: requests_per_minute counted per process, the shared "
                    "storage failed (%s)",
                    self.upstream,
                    type(exc).__name__,
                )
                self._shared_down_until = time.monotonic() + 5.0
        if self._shared is not None:
            self.metrics.upstream_rate_fallbacks.labels(self.upstream).inc()
        if await self._local.hit(self.item, *ident):
            return True, 0.0
        stats = await self._local.get_window_stats(self.item, *ident)
        return False, max(0.01, stats.reset_time - time.time())

    def set_limit(self, per_minute: int) -> None:
        """Calls per minute from now on (0: no limit)."""
        self.per_minute = per_minute
        self.item: RateLimitItem = RateLimitItemPerMinute(max(1, per_minute))

    async def acquire(self, deadline: float) -> bool:
        """Take a slot, waiting for one until ``deadline`` (loop time); False if none freed."""
        if not self.per_minute:
            return True
        loop = asyncio.get_running_loop()
        while True:
            ok, wait = await self._try()
            if ok:
                return True
            left = deadline - loop.time()
            if wait >= left:
                return False
            self.metrics.upstream_rate_waits.labels(self.upstream).inc()
            # A slot frees at a known time: nothing to wait on but the clock.
            await asyncio.sleep(wait)


_TOLD = {
    "refused": "upstream {name!r} refused the request: {message}",
    "rate_limited": "upstream {name!r} is rate limiting voxgate (429) past its retries",
    "auth": "upstream {name!r} refused voxgate's credentials ({status}); see api_key_env",
    "timeout": "upstream {name!r} did not answer within {timeout:g}s",
    "connection": "upstream {name!r} cannot be reached: {message}",
    "bad_reply": "upstream {name!r} sent no usable audio: {message}",
    "server": "upstream {name!r} failed (status {status}): {message}",
}
_BACKOFF_S = 0.5
_BACKOFF_MAX_S = 8.0
# How long an item whose answer was cut off for its size (too_long, past max_audio_mb) is not
# asked for again: each call is billed, and the provider answers the same text the same way.
OVERSIZE_HOLD_S = 60.0
# The most items held so at once (the oldest go first).
OVERSIZE_HELD = 1024


def item_address(item: SynthesisItem) -> str:
    """What identifies a call for ``item`` within one upstream: its text, voice, speed,
    parameters and take (a retake is another call)."""
    params = sorted((k, repr(v)) for k, v in item.params.items())
    material = json.dumps([item.text, item.voice, item.speed, params, item.phonemes, item.take])
    return hashlib.blake2b(material.encode(), digest_size=16).hexdigest()


class UpstreamRunner:
    """The :class:`~synth.scheduler.BatchRunner` of an upstream: each item is one call to the
    provider, under the policy of the module docstring. Give the scheduler at least
    ``max_concurrency`` of concurrency: calls wait for their turn here, under their deadline."""

    # Every waiter gone: cancel the call (it frees a slot; the provider's work is lost either way).
    cancel_when_abandoned = True
    counts_syntheses = True
    times_batches = False
    queues_work = True  # calls wait for a slot here: each counts in its client's share till done

    def __init__(
        self,
        engine: UpstreamEngine,
        provider: Provider,
        metrics: Metrics,
        *,
        breaker: Breaker,
        rate: RequestRate,
    ) -> None:
        self.engine = engine
        self.config = engine.config
        self.provider = provider
        self.metrics = metrics
        self.breaker = breaker
        self.rate = rate
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        # Items whose answer was too large, by item_address: (loop time the hold ends, message).
        self._oversize: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self._listed = frozenset(v.name for v in engine.voices())
        # The upstream's model name (a reload that changes it takes a restart).
        self.name = name = self.config.name
        self._calls_ok = metrics.upstream_calls.labels(name, "ok")
        self._billed = metrics.upstream_chars_billed.labels(name)
        self._latency = metrics.upstream_call_seconds.labels(name)
        self._in_flight = metrics.upstream_in_flight.labels(name)
        metrics.upstream_price.labels(name).set(self.config.price_per_million_chars)

    @property
    def passes_pcm(self) -> bool:
        """Whether an item's ``sink`` receives the provider's raw pcm as it arrives."""
        return self.config.streams_pcm

    def reconfigure(self, config: UpstreamConfig) -> str:
        """Take ``config``'s tunables for the calls that start from now on; "" when done, else
        why it needs a restart (see :meth:`UpstreamEngine.reconfigure`)."""
        reason = self.engine.reconfigure(config)
        if reason:
            return reason
        old, self.config = self.config, config
        if config.max_concurrency != old.max_concurrency:
            # Calls running finish under the old bound; new ones count against the new one.
            self._slots = asyncio.Semaphore(config.max_concurrency)
        self.rate.set_limit(config.requests_per_minute)
        self.breaker.failures = config.breaker_failures
        self.breaker.reset_s = config.breaker_reset_s
        self.metrics.upstream_price.labels(self.name).set(config.price_per_million_chars)
        return ""

    async def start(self) -> None:
        """Nothing to start: the provider is asked on the first miss (a provider that is down
        must not keep the gateway from serving what it has stored)."""

    async def close(self) -> None:
        """Close the provider's connections."""
        await self.provider.close()

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        return [await self.synthesize(item) for item in items]

    def _fail(
        self, kind: str, message: str, retry_after_s: float | None = None, reason: str = ""
    ) -> UpstreamError:
        if kind not in OWN_REFUSALS:
            self.metrics.upstream_errors.labels(self.name, kind).inc()
        status = UPSTREAM_ERROR_KINDS[kind]
        if status >= 500 and retry_after_s is None:
            retry_after_s = 1.0
        return UpstreamError(
            message,
            upstream=self.name,
            kind=kind,
            status=status,
            retry_after_s=retry_after_s if status >= 500 else None,
            reason=reason,
        )

    async def synthesize(self, item: SynthesisItem) -> Audio:
        """One item's audio from the provider, within ``timeout_s`` (see the class doc)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_s
        name = self.name
        if item.voice not in self._listed and not (
            self.engine.config.any_voice and VOICE_ID.fullmatch(item.voice)
        ):
            listed = ", ".join(sorted(self._listed))
            raise self._fail(
                "voice_not_found",
                f"unknown voice {item.voice[:64]!r} for model {name!r}; available: {listed}",
            )
        refusal = speed_refusal(self.provider, item.speed)
        if refusal:
            # Before a call slot, a requests_per_minute slot or the breaker is touched: voxgate
            # refuses what the provider's API cannot ask for, without asking it.
            raise self._fail(
                "unsupported_speed", f"model {name!r} cannot take speed {item.speed:g}: {refusal}"
            )
        address = item_address(item)
        held = self._held(address, loop.time())
        if held is not None:
            raise held
        # This semaphore, not the attribute: a reload may replace it while the call runs.
        slots = self._slots
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire()
        except TimeoutError:
            raise self._fail(
                "timeout",
                f"upstream {name!r}: no call slot freed within {self.config.timeout_s:g}s "
                f"(max_concurrency {self.config.max_concurrency})",
            ) from None
        self._in_flight.inc()
        try:
            return await self._attempts(item, deadline)
        except UpstreamError as exc:
            if exc.oversize:
                self._hold(address, loop.time(), str(exc))
            raise
        finally:
            self._in_flight.dec()
            slots.release()

    async def _attempts(self, item: SynthesisItem, deadline: float) -> Audio:
        loop = asyncio.get_running_loop()
        name = self.name
        attempt = 0
        # The failure that made the last retry happen: when a retry then runs out of time, the
        # caller hears that (the provider was unreachable), not the deadline our retries hit.
        earlier: ProviderError | None = None
        # Pieces of the answer went to a stream already: a retry would say them twice.
        passed = False
        call_item = item if self.passes_pcm else dataclasses.replace(item, sink=None)
        if call_item.sink is not None:
            sink = call_item.sink

            def passing(data: bytes) -> None:
                nonlocal passed
                passed = True
                sink(data)

            call_item = dataclasses.replace(item, sink=passing)
        while True:
            if not self.breaker.allow():
                raise self._fail(
                    "breaker_open",
                    f"upstream {name!r} is unavailable: it failed repeatedly and is not asked "
                    "until its cool-down ends; stored audio is still served",
                )
            if not await self.rate.acquire(deadline):
                raise self._fail(
                    "rate_wait",
                    f"upstream {name!r} is at its requests_per_minute "
                    f"({self.config.requests_per_minute}); no slot freed within "
                    f"{self.config.timeout_s:g}s",
                )
            left = deadline - loop.time()
            started = time.perf_counter()
            try:
                async with asyncio.timeout_at(deadline):
                    audio = await self.provider.synthesize(call_item, left)
            except (ProviderError, TimeoutError) as caught:
                # Our deadline is a provider timeout: counted, told and never retried as one.
                exc = caught if isinstance(caught, ProviderError) else ProviderError("timeout", "")
                self.metrics.upstream_calls.labels(name, exc.kind).inc()
                self._latency.observe(time.perf_counter() - started)
                delay = None if passed else self._retry_delay(exc, attempt)
                if delay is not None and loop.time() + delay < deadline:
                    attempt += 1
                    earlier = exc
                    self.metrics.upstream_retries.labels(name, exc.kind).inc()
                    log.info(
                        "upstream %s: %s (status %s), retry %d in %.2fs",
                        name,
                        exc.kind,
                        exc.status,
                        attempt,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                if exc.kind != "refused":
                    self.breaker.failure()
                failure = self._error_of(earlier if exc.kind == "timeout" and earlier else exc)
                # The error's context would keep the provider's frames, and with them what
                # was read of the answer, for as long as the error is kept.
                caught.__traceback__ = exc.__traceback__ = None
                raise failure from None
            self._latency.observe(time.perf_counter() - started)
            self._calls_ok.inc()
            self._billed.inc(len(item.text))
            self.breaker.success()
            return audio

    def _retry_delay(self, exc: ProviderError, attempt: int) -> float | None:
        """Seconds before the next try of a call that failed with ``exc``; None: no retry."""
        if not exc.retryable or attempt >= self.config.max_retries:
            return None
        if exc.retry_after_s is not None:
            return self._bounded_wait(exc.retry_after_s)
        backoff = min(_BACKOFF_MAX_S, _BACKOFF_S * 2.0**attempt)
        return backoff * (0.5 + random.random() / 2)  # jitter: replicas do not retry in step

    def _held(self, address: str, now: float) -> UpstreamError | None:
        """The refusal of an item whose answer was too large within the last
        :data:`OVERSIZE_HOLD_S` (not a call: nothing counted against the provider)."""
        while self._oversize and next(iter(self._oversize.values()))[0] <= now:
            self._oversize.popitem(last=False)
        held = self._oversize.get(address)
        if held is None:
            return None
        until, message = held
        return UpstreamError(
            f"{message}; not asked again for {until - now:.0f} s (each call is billed)",
            upstream=self.name,
            kind="bad_reply",
            status=UPSTREAM_ERROR_KINDS["bad_reply"],
            retry_after_s=until - now,
        )

    def _hold(self, address: str, now: float, message: str) -> None:
        self._oversize.pop(address, None)
        self._oversize[address] = (now + OVERSIZE_HOLD_S, message)
        while len(self._oversize) > OVERSIZE_HELD:
            self._oversize.popitem(last=False)

    def _bounded_wait(self, seconds: float) -> float:
        """A wait the provider asked for, finite and at most this upstream's ``timeout_s``."""
        if not math.isfinite(seconds):
            return self.config.timeout_s
        return min(max(0.0, seconds), self.config.timeout_s)

    def _error_of(self, exc: ProviderError) -> UpstreamError:
        kind = exc.kind if exc.kind in _TOLD else "server"
        # A provider may quote the credentials it was sent (a key in "invalid key ..."): the
        # client is never shown them.
        told = _TOLD[kind].format(
            name=self.name,
            status=exc.status,
            message=credentials.scrub(exc.message),
            timeout=self.config.timeout_s,
        )
        # Only these kinds carry a wait the provider asked for, and never more than one call's
        # deadline: what the client is told is voxgate's advice, not the provider's raw words.
        asked = None
        if exc.retry_after_s is not None and kind in ("rate_limited", "server"):
            asked = self._bounded_wait(exc.retry_after_s)
        failure = self._fail(kind, told, asked, exc.reason)
        failure.oversize = exc.oversize
        return failure


def build_provider(config: UpstreamConfig, api_key: str) -> Provider:
    """The client of ``config``'s provider kind (its SDK imported only here); the process's
    environment holds any further credential its kind names (``secret_envs``). Each of those
    credentials, and ``base_url``'s user and password, is kept out of log lines and relayed
    messages from here on (:mod:`synth.credentials`)."""
    fields = (*(field for field, _ in config.spec.secret_envs), "session_token_env")
    others = (os.environ.get(getattr(config, field), "") for field in fields)
    credentials.register((api_key, *others, *credentials.userinfo(config.base_url)))
    credentials.install()
    return config.spec.factory(config, api_key, os.environ)


def missing_sdk(config: UpstreamConfig) -> str:
    """The package ``config``'s kind needs that is not installed; "" when none is missing."""
    import importlib.util

    module = config.spec.sdk
    return module if module and importlib.util.find_spec(module) is None else ""


def check_config(config: UpstreamConfig, environ: Mapping[str, str]) -> str:
    """The API key of ``config`` from ``environ`` ("" when it takes none); ``ValueError``
    naming the variable when it, or another its kind needs, is named but unset."""
    if not config.api_key_env:
        return ""
    for field, holds in (*config.spec.secret_envs, ("api_key_env", "")):
        variable = getattr(config, field)
        if not environ.get(variable, ""):
            raise ValueError(
                f"upstream {config.name!r}: the environment variable {variable} "
                f"({field}{': ' if holds else ''}{holds}) is not set"
            )
    return environ[config.api_key_env]
