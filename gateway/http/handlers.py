"""The gateway's own endpoints: speech, stored audio, voices, health, metrics, OpenAPI."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, cast

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from cache.keys import KEY_PATTERN
from gateway.errors import NotFound
from gateway.http import keys, ops
from gateway.http.conditional import audio_response, http_date
from gateway.http.delivery import serve_speech
from gateway.http.marks import audio_key, speech_call, stored_entry
from metrics import CONTENT_TYPE_LATEST, exposition
from synth import audio

log = logging.getLogger("voxgate.gateway")

ContentKey = Annotated[str, Field(pattern=KEY_PATTERN)]


class ExpansionSegment(TypedDict):
    """Words said at one rate (IPA phonemes when ``phonemes``), then a pause."""

    words: str
    pause_ms: Annotated[int | None, Field(description="Silence after; null: the sentence pause.")]
    rate: float
    phonemes: bool
    marks: NotRequired[
        Annotated[
            list[tuple[str, int]],
            Field(description="SSML <mark> names and their character offsets into `words`."),
        ]
    ]


class ExplainedSentence(TypedDict):
    """A sentence of the answer: one cached master, after a pause."""

    text: str
    speed: float
    phonemes: bool
    pause_before_ms: int
    master: ContentKey


# (The body SpeechService.explain builds; its docstring is the document's description.)
class Explanation(TypedDict):
    """What a speech request would say, and where its audio lives."""

    key: Annotated[ContentKey, Field(description="The X-Audio-Key of the speech answer.")]
    master: Annotated[ContentKey, Field(description="The format-free address it derives from.")]
    model: str
    voice: str
    format: str
    sample_rate: int
    text: Annotated[str, Field(description="The words, joined.")]
    front_end: Annotated[
        str,
        Field(
            description="The text front end the input went through (its `normalize`, `auto` "
            "resolved to the model's own): `text` and the sentences are what the engine reads."
        ),
    ]
    expansion: list[ExpansionSegment]
    sentences: list[ExplainedSentence]
    pause_after_ms: int
    estimated_audio_s: float


class VoiceEntry(TypedDict):
    """A voice of a model."""

    id: str
    language: str
    description: str
    speech_marks: Annotated[
        bool,
        Field(description="Whether its audio has speech marks (`GET /v1/audio/{key}.marks`)."),
    ]


# (What SpeechService.voice_listing builds.)
class ModelEntry(TypedDict):
    """A served model: whether it is warmed, its rate, its voices."""

    id: str
    ready: bool
    sample_rate: int
    voices: list[VoiceEntry]
    execution: Annotated[dict[str, Any], Field(description="How the engine runs.")]


class FormatEntry(TypedDict):
    """A response_format: its Content-Type, its rate when no sample_rate is asked (null: the
    voice's; pcm: 24000), whether it streams."""

    content_type: str
    default_sample_rate: int | None
    streamable: bool


class Voices(TypedDict):
    """Models, their voices, the accepted aliases and the formats."""

    models: list[ModelEntry]
    model_aliases: dict[str, str]
    voice_aliases: dict[str, str]
    formats: dict[str, FormatEntry]


class Health(TypedDict):
    """The process is up."""

    status: Literal["ok"]


async def speech(request: web.Request) -> web.StreamResponse:
    """``POST /v1/audio/speech``: OpenAI-compatible text to speech."""
    call = (await speech_call(request))[1]
    return await serve_speech(
        request, call.req, stream=call.stream, sse=call.sse, ignored=call.ignored, marks=call.marks
    )


STUDIO_PAGE = Path(__file__).with_name("studio.html")


async def studio(request: web.Request) -> web.Response:
    """``GET /``: the prompt studio, one static page (HTML + JS, no build step, nothing from a
    CDN) that uses only the public API (read at start: :func:`studio_ctx`)."""
    return web.Response(
        body=request.app[keys.STUDIO_PAGE],
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-cache",
            # The page runs its own script and talks to its own origin only.
            "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
            "style-src 'self' 'unsafe-inline'; media-src 'self' blob:; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
        },
    )


async def studio_ctx(app: web.Application) -> AsyncIterator[None]:
    """Read the studio page once, off the loop, for :func:`studio`."""
    app[keys.STUDIO_PAGE] = await asyncio.to_thread(STUDIO_PAGE.read_bytes)
    yield


async def ssml_explain(request: web.Request) -> web.Response:
    """``POST /v1/ssml/explain``: a speech body's expansion and content address, nothing
    synthesized (the prompt studio and ``voxgate say --explain`` show it)."""
    call = (await speech_call(request))[1]
    body = cast(Explanation, await request.app[keys.SPEECH].explain(call.req, call.front_end))
    return web.json_response(body)


async def audio_by_key(request: web.Request) -> web.StreamResponse:
    """``GET /v1/audio/{key}``: stored audio by content address, with ETag/304 and Range/206/416."""
    key = audio_key(request)
    entry = await stored_entry(request, key)
    # The type comes from the stored format, never from the stored content_type text: a value
    # someone else wrote must not make the gateway's origin serve text/html.
    fmt = audio.FORMATS.get(entry.meta.format)
    if fmt is None:
        log.warning("stored entry of unknown format deleted key=%s", key)
        await request.app[keys.STORE].delete(key)
        raise NotFound(f"no audio stored under key {key}", param="key")
    request[keys.CACHE_RESULT] = "hit"
    request[keys.AUDIO_KEY] = key
    headers = {
        "ETag": entry.etag,
        "Cache-Control": request.app[keys.PRESENTATIONS].stored.cache_control,
        "Content-Type": fmt.content_type,
        "X-Audio-Sample-Rate": str(entry.meta.sample_rate),
        "Last-Modified": http_date(entry.meta.created),
    }
    return audio_response(request, entry.audio, headers, ranges=True, created=entry.meta.created)


async def voices(request: web.Request) -> web.Response:
    """``GET /v1/voices``: models, their voices, and the accepted aliases."""
    settings = request.app[keys.SETTINGS]
    body: Voices = {
        "models": cast(list[ModelEntry], list(request.app[keys.SPEECH].voice_listing())),
        "model_aliases": settings.model_aliases,
        "voice_aliases": settings.voice_aliases,
        # `pcm` is OpenAI's 24 kHz, whatever the voice's rate.
        "formats": {
            f.name: {
                "content_type": f.content_type,
                "default_sample_rate": f.default_rate,
                "streamable": f.streamable,
            }
            for f in audio.FORMATS.values()
        },
    }
    return web.json_response(body)


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the process is alive."""
    body: Health = {"status": "ok"}
    return web.json_response(body)


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 once every model is warmed, else 503; each tier's state in the body."""
    status, body = await ops.readiness(request.app)
    return web.json_response(body, status=status)


async def openapi_document(request: web.Request) -> web.Response:
    """``GET /openapi.json``: this server's OpenAPI description (of the route table it was
    built with: the app renders it, :data:`gateway.http.keys.OPENAPI`)."""
    return web.Response(body=request.app[keys.OPENAPI](), content_type="application/json")


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text exposition."""
    return await metrics_response(request.app)


async def metrics_response(app: web.Application) -> web.Response:
    """``app``'s metrics (Prometheus text exposition), as ``GET /metrics`` answers them."""
    m = app[keys.METRICS]
    service = app.get(keys.SPEECH)
    if service is not None:
        await service.store.stats()
    await ops.report_pins(app)
    m.flush_pending()  # this process's tallies (gateway.http.observe), before any exposition
    return web.Response(body=exposition(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
