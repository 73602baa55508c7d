"""The request shapes existing clients send besides OpenAI's: Coqui tts-server's ``/api/tts`` and the
plain query-string ``GET /synthesize``. Both end in the same :class:`SpeechRequest` (same cache
keys: ``/api/tts`` and ``/synthesize`` and ``/v1/audio/speech`` for the same text, voice and format
share one entry). Their handlers are :mod:`gateway.http.compat`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.api.models import models_for
from gateway.api.parsing import resolve_format, resolve_model, resolve_voice, validate_text
from gateway.errors import BadRequest
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService
from synth import audio

# Coqui's server reads each field from a header first, then from the query string or form.
# (The fields themselves, their types and bounds: gateway.api.models.CoquiFields.)
COQUI_HEADERS = {
    "text": "text",
    "speaker_id": "speaker-id",
    "language_id": "language-id",
    "style_wav": "style-wav",
    "speaker_wav": "speaker-wav",
}


def default_voice(model: str, settings: Settings, speech: SpeechService) -> str:
    """The voice used when a compatible request names none."""
    voices = speech.models[model].voice_names()
    return settings.default_voice if settings.default_voice in voices else voices[0]


def _voice(name: str, model: str, param: str, settings: Settings, speech: SpeechService) -> str:
    if not name:
        return default_voice(model, settings, speech)
    try:
        return resolve_voice(name, model, settings, speech)
    except BadRequest as exc:
        raise BadRequest(exc.message, param=param, code=exc.code) from exc


def _norm_language(tag: str) -> str:
    return tag.strip().lower().replace("-", "_")


def check_language(language: str, model: str, voice: str, speech: SpeechService) -> None:
    """Accept ``language`` when it is the voice's language or its primary subtag (``en`` for
    ``en_US``); the voices served here speak one language each."""
    if not language:
        return
    spoken = next((v.language for v in speech.models[model].engine.voices() if v.name == voice), "")
    asked = _norm_language(language)
    have = _norm_language(spoken)
    if have and (asked == have or have.split("_")[0] == asked):
        return
    raise BadRequest(
        f"language_id '{language}' is not supported: voice '{voice}' of model '{model}' "
        f"speaks {spoken or 'one fixed language'}",
        param="language_id",
        code="unsupported_language",
    )


def parse_coqui(
    values: Mapping[str, Any], settings: Settings, speech: SpeechService
) -> SpeechRequest:
    """A :class:`SpeechRequest` for Coqui's ``/api/tts``: default model, WAV at the voice's rate.

    ``values`` are the request's fields (strings from headers, query and forms; anything from a
    JSON body, where a non-string such as ``null`` is a 400, never spoken as "None").
    """
    fields = models_for(settings).coqui.check(values)
    model = resolve_model(settings.default_model, settings, speech)
    text = validate_text(fields.text, settings, param="text")
    voice = _voice(fields.speaker_id.strip(), model, "speaker_id", settings, speech)
    check_language(fields.language_id, model, voice, speech)
    return SpeechRequest(text=text, model=model, voice=voice, fmt=audio.FORMATS["wav"])


def parse_synthesize(
    query: Mapping[str, str], settings: Settings, speech: SpeechService
) -> SpeechRequest:
    """A :class:`SpeechRequest` for ``GET /synthesize?text=...&speaker=...&model=...&format=...``."""
    fields = models_for(settings).synthesize.check(query)
    model = resolve_model(fields.model or settings.default_model, settings, speech)
    text = validate_text(fields.text, settings, param="text")
    voice = _voice(fields.speaker, model, "speaker", settings, speech)
    try:
        fmt = resolve_format(fields.format)
    except BadRequest as exc:
        raise BadRequest(exc.message, param="format", code=exc.code) from exc
    return SpeechRequest(
        text=text,
        model=model,
        voice=voice,
        fmt=fmt,
        speed=fields.speed,
        sample_rate=fields.sample_rate,
    )
