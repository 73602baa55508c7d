"""kind = "openai": OpenAI's ``CreateSpeechRequest`` through the ``openai`` SDK, as
docs/upstreams.md, "Providers", has it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from synth.credentials import strip_userinfo
from synth.engine import Audio, SynthesisItem
from synth.providers.base import (
    AnswerReader,
    ProviderConfig,
    ProviderError,
    ProviderSpec,
    error_for_status,
    redirect_refused,
    retry_after_of,
)


class OpenAIProvider:
    """The :class:`~synth.providers.base.Provider` of an OpenAI-compatible speech endpoint."""

    def __init__(self, config: ProviderConfig, api_key: str, environ: Mapping[str, str]) -> None:
        # The SDK comes with the openai extra: imported here, not when the table of kinds
        # (synth.providers) imports this module whatever is configured.
        import openai

        self.config = config
        # The SDK logs each request's options, text included, at DEBUG: never, whatever the
        # gateway's log level (request text is never logged).
        logging.getLogger("openai").setLevel(logging.INFO)
        # A user:password in base_url is sent as Basic auth, as the SDK's client would: given
        # to the client as its auth, out of the URL that the client logs on every call.
        parts = urlsplit(config.base_url)
        auth: Any = None
        if parts.username is not None or parts.password is not None:
            import httpx2

            user, password = unquote(parts.username or ""), unquote(parts.password or "")
            auth = httpx2.BasicAuth(user, password)
        self.client = openai.AsyncOpenAI(
            # A server that takes no key (a local one) is sent a placeholder it ignores: the SDK
            # refuses to start without one.
            api_key=api_key or "no-key",
            base_url=strip_userinfo(config.base_url),
            # The runner retries: every attempt is counted, and all of them fit in one deadline.
            max_retries=0,
            timeout=config.timeout_s,
            # The SDK's own client follows redirects: the key and the text would go wherever a
            # 3xx points, and its answer be stored as the provider's.
            http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False, auth=auth),
        )

    async def synthesize(self, item: SynthesisItem, timeout_s: float) -> Audio:
        import httpx2  # loaded by __init__'s openai already: a lookup here
        import openai

        c = self.config
        extra: dict[str, object] = {}
        if item.speed != 1.0:
            extra["speed"] = item.speed
        instructions = item.params.get("instructions")
        if c.instructions and isinstance(instructions, str) and instructions:
            extra["instructions"] = instructions
        try:
            async with self.client.audio.speech.with_streaming_response.create(
                model=c.model,
                voice=item.voice,
                input=item.text,
                response_format=c.format,
                timeout=timeout_s,
                **extra,  # type: ignore[arg-type]
            ) as response:
                kind = response.headers.get("content-type", "")
                return await AnswerReader(c, item, item.sink, kind).read(response.iter_bytes())
        except openai.APIStatusError as exc:
            if 300 <= exc.status_code < 400:
                raise redirect_refused(exc.status_code) from None
            headers = {k.lower(): v for k, v in exc.response.headers.items()}
            raise error_for_status(exc.status_code, exc.message, retry_after_of(headers)) from None
        except openai.APITimeoutError:
            raise ProviderError("timeout", "no answer in time") from None
        except openai.APIConnectionError as exc:
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "error"
            raise ProviderError("connection", cause, retryable=True) from None
        except (httpx2.HTTPError, OSError) as exc:  # the connection broke mid-body
            raise ProviderError("connection", type(exc).__name__, retryable=True) from None

    async def close(self) -> None:
        await self.client.close()


SPEC = ProviderSpec(
    "openai", OpenAIProvider, formats=("pcm", "wav"), model="", sdk="openai", reads_numbers=True
)
