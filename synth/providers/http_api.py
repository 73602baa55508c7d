"""What the providers spoken to over plain HTTP share: one aiohttp session made on the event
loop, a bounded read of the answer, the provider's error body turned into a
:class:`~synth.providers.base.ProviderError` (with ``Retry-After``), connection failures retried.

A provider module says how to ask (:meth:`HttpProvider.request`), the speeds it takes and how
its errors read (class data, or :meth:`HttpProvider.error_message`) and, when it is not audio,
what its answer holds (:meth:`HttpProvider.answer`).
aiohttp is a dependency of every install: these kinds need no extra.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from synth.engine import Audio, SynthesisItem
from synth.providers.base import (
    AnswerReader,
    ProviderConfig,
    ProviderError,
    error_for_status,
    provider_message,
    redirect_refused,
    retry_after_of,
)

# The most of an error body read (a message, not audio).
ERROR_BODY_BYTES = 64 * 1024


@dataclass
class HttpCall:
    """One request to a provider: ``json`` or ``data`` as its body."""

    url: str
    headers: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    json: dict[str, object] | None = None
    data: bytes | None = None


def json_error_message(body: bytes, *paths: tuple[str, ...]) -> str:
    """The first string found at one of ``paths`` (keys into nested objects) of a JSON error
    body; else the body's text."""
    try:
        value = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace")
    for path in paths:
        found: object = value
        for key in path:
            found = found.get(key) if isinstance(found, dict) else None
        if isinstance(found, str) and found:
            return found
    return str(value)[:300]


def voice_language(voice: str) -> str:
    """The locale a voice name starts with, as Azure's and Google's do (``en-US-AvaNeural``:
    ``en-US``)."""
    parts = voice.split("-")
    return "-".join(parts[:2]) if len(parts) >= 3 else "en-US"


class HttpProvider:
    """A :class:`~synth.providers.base.Provider` over aiohttp; subclasses say how to ask and read
    (the class is its kind's factory: ``environ`` is for credentials beyond the key)."""

    # Statuses that mean the caller's request was wrong for this provider (its 400) beyond the
    # ones every provider shares (400, 413, 422): a provider's "no such voice" status.
    refusal_statuses: frozenset[int] = frozenset()
    # Where a JSON error body holds the message (json_error_message's paths); none: its text.
    error_paths: tuple[tuple[str, ...], ...] = ()
    # The speeds it takes, and what a request at another is told (refused before the call).
    speeds: tuple[float, float] = (0.0, math.inf)
    speed_refusal = ""

    def __init__(self, config: ProviderConfig, api_key: str, environ: Mapping[str, str]) -> None:
        self.config = config
        self.api_key = api_key
        self._session: aiohttp.ClientSession | None = None

    def request(self, item: SynthesisItem) -> HttpCall:
        """The call that asks for ``item``; a :class:`ProviderError` ("refused") for an item
        the provider cannot take."""
        raise NotImplementedError

    def error_message(self, body: bytes) -> str:
        """The provider's message in an error answer's body."""
        if self.error_paths:
            return json_error_message(body, *self.error_paths)
        return body[:300].decode("utf-8", "replace")

    def error_of(self, status: int, headers: dict[str, str], body: bytes) -> ProviderError:
        """The :class:`ProviderError` of an answer ``status`` (not 200) with ``headers``
        (lower-cased names) and the start of its ``body``."""
        message = provider_message(self.error_message(body))
        if status in self.refusal_statuses:
            return ProviderError("refused", message, status=status)
        return error_for_status(status, message, retry_after_of(headers))

    async def answer(self, item: SynthesisItem, resp: aiohttp.ClientResponse) -> Audio:
        """The audio of a successful answer (16-bit pcm at ``sample_rate`` here, or what the
        body is: :class:`~synth.providers.base.AnswerReader`)."""
        reader = AnswerReader(self.config, item, item.sink, resp.headers.get("Content-Type", ""))
        return await reader.read(resp.content.iter_chunked(64 * 1024))

    def _client(self) -> aiohttp.ClientSession:
        # Made on the event loop, at the first call (providers are built in a thread).
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def synthesize(self, item: SynthesisItem, timeout_s: float) -> Audio:
        call = self.request(item)
        try:
            async with self._client().post(
                call.url,
                params=call.params,
                json=call.json,
                data=call.data,
                headers=call.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                # A redirect would carry the key and the text to another host, and its answer
                # would be stored as the provider's: a 3xx is the provider's failure.
                allow_redirects=False,
            ) as resp:
                if 300 <= resp.status < 400:
                    raise redirect_refused(resp.status)
                if resp.status != 200:
                    body = await resp.content.read(ERROR_BODY_BYTES)
                    headers = {k.lower(): v for k, v in resp.headers.items()}
                    raise self.error_of(resp.status, headers, body)
                return await self.answer(item, resp)
        except TimeoutError:
            raise ProviderError("timeout", "no answer in time") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise ProviderError("connection", type(exc).__name__, retryable=True) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
