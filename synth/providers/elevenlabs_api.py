"""kind = "elevenlabs": ElevenLabs' text-to-speech API over aiohttp.

The request is the one ElevenLabs publishes (their OpenAPI document, from which the official
``elevenlabs`` SDK is generated: repository elevenlabs/elevenlabs-python,
``text_to_speech/raw_client.py``): ``POST {base_url}/v1/text-to-speech/{voice_id}`` with the
query ``output_format=pcm_<rate>`` (16-bit little-endian mono PCM, lossless: kept as the master),
the key in the ``xi-api-key`` header, and a JSON body of ``text``, ``model_id`` and
``voice_settings`` (the entry's, plus ``speed`` when the request's is not 1).

aiohttp (a dependency of every install) rather than the SDK: one POST needs none of the SDK's
models, websockets or its own HTTP client, and the runner does retries itself. Errors come as
``{"detail": {"status", "message"}}`` or, for a 422, FastAPI's ``{"detail": [{"msg"}]}``; an
unknown voice id (404 on its path) is the caller's fault here.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import aiohttp

from synth.engine import Audio, SynthesisItem
from synth.upstream import (
    ProviderError,
    UpstreamConfig,
    error_for_status,
    pcm16_audio,
    retry_after_of,
)

MIB = 1024 * 1024


def detail_message(body: bytes) -> str:
    """The message of an ElevenLabs error body (either of its shapes), else the raw text."""
    try:
        value = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace")
    detail = value.get("detail") if isinstance(value, dict) else None
    if isinstance(detail, dict):
        return str(detail.get("message") or detail.get("status") or detail)
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return "; ".join(str(d.get("msg", d)) for d in detail[:3])
    return str(detail if detail is not None else value)


class ElevenLabsProvider:
    """The :class:`~synth.upstream.Provider` of ElevenLabs' text-to-speech endpoint."""

    def __init__(self, config: UpstreamConfig, api_key: str) -> None:
        self.config = config
        self.api_key = api_key
        self.max_bytes = config.max_audio_mb * MIB
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on the event loop, at the first call (the provider is built in a thread).
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def synthesize(self, item: SynthesisItem, timeout_s: float) -> Audio:
        c = self.config
        settings: dict[str, object] = dict(c.voice_settings)
        if item.speed != 1.0:
            settings["speed"] = item.speed
        body: dict[str, object] = {"text": item.text, "model_id": c.model}
        if settings:
            body["voice_settings"] = settings
        url = f"{c.base_url}/v1/text-to-speech/{quote(item.voice, safe='')}"
        headers = {"xi-api-key": self.api_key, "Accept": "audio/pcm"}
        try:
            async with self._client().post(
                url,
                params={"output_format": f"pcm_{c.sample_rate}"},
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                if resp.status != 200:
                    message = detail_message(await resp.content.read(64 * 1024))
                    retry = retry_after_of({k.lower(): v for k, v in resp.headers.items()})
                    if resp.status == 404:  # /text-to-speech/{voice_id}: no such voice
                        raise ProviderError("refused", message, status=404)
                    raise error_for_status(resp.status, message, retry)
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ProviderError(
                            "bad_reply", f"the answer is larger than {c.max_audio_mb} MiB"
                        )
                    chunks.append(chunk)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise ProviderError("timeout", "no answer in time") from None
            raise ProviderError("connection", type(exc).__name__, retryable=True) from None
        return pcm16_audio(b"".join(chunks), c.sample_rate)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
