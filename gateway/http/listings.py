"""The listings OpenAI-style clients read: ``GET /v1/models`` (OpenAI's list shape) and
``GET /v1/audio/models`` / ``GET /v1/audio/voices`` (the shapes Open WebUI reads, as
Kokoro-FastAPI and speaches serve them).

Open WebUI (backend/open_webui/routers/audio.py) fills its model and voice pickers from
``{base}/audio/models`` (``{"models": [{"id"}]}``) and ``{base}/audio/voices``
(``{"voices": [{"id", "name"}]}``), falling back to OpenAI's names when they fail. Aliases are
listed too: a client that picks ``tts-1`` or ``alloy`` is answered as by the model or voice the
alias names.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from typing_extensions import TypedDict

from gateway.http import keys


class OpenAIModel(TypedDict):
    """A served model or an alias, as OpenAI lists a model."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(TypedDict):
    """OpenAI's model list: every served model, then every alias of one."""

    object: Literal["list"]
    data: list[OpenAIModel]


class NamedModel(TypedDict):
    """A served model (``name`` = ``id``) or an alias (``name``: ``alias (model)``)."""

    id: str
    name: str


class AudioModels(TypedDict):
    """The models as Open WebUI reads them: served models, then their aliases."""

    models: list[NamedModel]


class AudioVoice(TypedDict):
    """A served voice, or an alias of one (``name``: ``alias (voice)``, no language)."""

    id: str
    name: str
    language: str


class AudioVoices(TypedDict):
    """The voices as Open WebUI reads them: voices, then the voice aliases that resolve to one."""

    voices: list[AudioVoice]


def model_names(app: web.Application) -> list[tuple[str, str]]:
    """``(name, served model)``: every served model, then every alias of a served one."""
    settings, speech = app[keys.SETTINGS], app[keys.SPEECH]
    names = [(m, m) for m in speech.models]
    names += [(a, m) for a, m in settings.model_aliases.items() if m in speech.models]
    return names


async def openai_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: OpenAI's model list (``{"object": "list", "data": [...]}``)."""
    body: ModelList = {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "voxgate"}
            for name, _ in model_names(request.app)
        ],
    }
    return web.json_response(body)


async def audio_models(request: web.Request) -> web.Response:
    """``GET /v1/audio/models``: ``{"models": [{"id", "name"}]}``."""
    body: AudioModels = {
        "models": [
            {"id": name, "name": name if name == model else f"{name} ({model})"}
            for name, model in model_names(request.app)
        ]
    }
    return web.json_response(body)


async def audio_voices(request: web.Request) -> web.Response:
    """``GET /v1/audio/voices``: the voices as Open WebUI reads them (docs/api.md)."""
    settings, speech = request.app[keys.SETTINGS], request.app[keys.SPEECH]
    voices: dict[str, AudioVoice] = {}
    for handle in speech.models.values():
        for v in handle.engine.voices():
            voices.setdefault(v.name, {"id": v.name, "name": v.name, "language": v.language})
    served = set(voices)
    for alias, voice in settings.voice_aliases.items():
        if voice in served and alias not in voices:
            voices[alias] = {"id": alias, "name": f"{alias} ({voice})", "language": ""}
    body: AudioVoices = {"voices": list(voices.values())}
    return web.json_response(body)
