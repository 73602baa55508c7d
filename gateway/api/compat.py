"""The request shapes existing clients send besides OpenAI's: Coqui tts-server's ``/api/tts``, the
plain query-string ``GET /synthesize`` and Piper's HTTP API (``POST /``). All end in the same
:class:`SpeechRequest` (same cache keys: ``/api/tts``, ``/synthesize``, ``POST /`` and
``/v1/audio/speech`` for the same text, voice and format share one entry). Their handlers are :mod:`gateway.http.compat`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.api.models import MAX_SPEED, MIN_SPEED, CoquiFields, models_for
from gateway.api.parsing import (
    ExpansionMemo,
    build_request,
    resolve_model,
    resolve_voice,
    speech_text,
)
from gateway.errors import BadRequest, clip
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.vocabulary import Vocabulary
from synth import audio
from synth.engine import ParamValue

# Coqui's server reads each field from a header first, then from the query string or form: the
# header is the field's name with dashes (the fields, their types and bounds: CoquiFields).
COQUI_HEADERS = {name: name.replace("_", "-") for name in CoquiFields.model_fields}


def default_voice(model: str, words: Vocabulary) -> str:
    """The voice used when a compatible request names none."""
    voices = words.models[model].voice_names()
    return words.default_voice if words.default_voice in voices else voices[0]


def _voice(name: str, model: str, param: str, words: Vocabulary) -> str:
    if not name:
        return default_voice(model, words)
    try:
        return resolve_voice(name, model, words)
    except BadRequest as exc:
        raise BadRequest(exc.message, param=param, code=exc.code) from exc


def check_language(language: str, model: str, voice: str, words: Vocabulary) -> None:
    """Accept ``language`` when it is the voice's language or its primary subtag (``en`` for
    ``en_US``); the voices served here speak one language each."""
    if not language:
        return
    spoken = next((v.language for v in words.models[model].voices() if v.name == voice), "")
    asked, have = (tag.strip().lower().replace("-", "_") for tag in (language, spoken))
    if have and (asked == have or have.split("_")[0] == asked):
        return
    raise BadRequest(
        f"language_id {clip(language, 24)} is not supported: voice '{voice}' of model '{model}' "
        f"speaks {spoken or 'one fixed language'}",
        param="language_id",
        code="unsupported_language",
    )


def parse_coqui(
    values: Mapping[str, Any],
    settings: Settings,
    words: Vocabulary,
    expansions: ExpansionMemo | None = None,
) -> SpeechRequest:
    """A :class:`SpeechRequest` for Coqui's ``/api/tts``: default model, WAV at the voice's rate.

    ``values`` are the request's fields (strings from headers, query and forms; anything from a
    JSON body, where a non-string such as ``null`` is a 400, never spoken as "None").
    """
    fields = models_for(settings).coqui.check(values)
    model = resolve_model(words.default_model, words)
    voice = _voice(fields.speaker_id.strip(), model, "speaker_id", words)
    check_language(fields.language_id, model, voice, words)
    spoken = speech_text(
        fields.text, settings, words, model, voice, param="text", expansions=expansions
    )
    return build_request(spoken, model=model, voice=voice, fmt=audio.FORMATS["wav"])


def parse_synthesize(
    query: Mapping[str, str],
    settings: Settings,
    words: Vocabulary,
    expansions: ExpansionMemo | None = None,
) -> SpeechRequest:
    """A :class:`SpeechRequest` for ``GET /synthesize?text=...&speaker=...&model=...&format=...``."""
    fields = models_for(settings).synthesize.check(query)
    model = resolve_model(fields.model or words.default_model, words)
    voice = _voice(fields.speaker, model, "speaker", words)
    spoken = speech_text(
        fields.text, settings, words, model, voice, param="text", expansions=expansions
    )
    # (The model refused any format that is not one: its Literal is the format table.)
    return build_request(
        spoken,
        model=model,
        voice=voice,
        fmt=audio.FORMATS[fields.format],
        speed=fields.speed,
        sample_rate=fields.sample_rate,
    )


def find_voice(name: str | None, words: Vocabulary) -> tuple[str, str]:
    """``(model, voice)`` for a voice named by a client that names no model (Piper's HTTP API,
    Wyoming): the default model's voice or alias first, then any served model's voice; no
    name is the default model's default voice."""
    default = resolve_model(words.default_model, words)
    if not name:
        return default, default_voice(default, words)
    for model in [default, *(m for m in words.models if m != default)]:
        if name in words.models[model].voice_names():
            return model, name
    alias = words.voice_aliases.get(name)
    if alias is not None and alias in words.models[default].voice_names():
        return default, alias
    known = sorted({v for h in words.models.values() for v in h.voice_names()})
    raise BadRequest(
        f"unknown voice {clip(name)}; available: {', '.join(known)}",
        param="voice",
        code="voice_not_found",
    )


# Piper's field names -> the engine parameters they set (synth.piper_engine.default_params).
PIPER_NOISE = {"noise_scale": "noise_scale", "noise_w_scale": "noise_w"}


def parse_piper(
    values: Mapping[str, Any],
    settings: Settings,
    words: Vocabulary,
    expansions: ExpansionMemo | None = None,
) -> SpeechRequest:
    """A :class:`SpeechRequest` for Piper's ``POST /``: WAV at the voice's rate.

    ``length_scale`` is mapped to speed relative to the voice's own (so the voice's default is
    speed 1 and shares its cache entries); noise scales become engine parameters, part of the
    content address, on voices whose engine has them, and are refused on others.
    """
    fields = models_for(settings).piper.check(values)
    model, voice = find_voice(fields.voice, words)
    spoken = speech_text(
        fields.text, settings, words, model, voice, param="text", expansions=expansions
    )
    defaults = words.models[model].default_params(voice)
    speed = 1.0
    if fields.length_scale is not None:
        own = defaults.get("length_scale")
        base = float(own) if isinstance(own, (int, float)) else 1.0
        speed = base / fields.length_scale
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise BadRequest(
                f"'length_scale' {fields.length_scale} means speed {speed:.3g} for voice "
                f"'{voice}' (length_scale {base}); the speed must be between {MIN_SPEED} and "
                f"{MAX_SPEED}",
                param="length_scale",
            )
    params: dict[str, ParamValue] = {}
    for field, param in PIPER_NOISE.items():
        value = getattr(fields, field)
        if value is None:
            continue
        if param not in defaults:
            raise BadRequest(
                f"'{field}' is not supported by model '{model}': its voices have no such parameter",
                param=field,
                code="unsupported_parameter",
            )
        if value != defaults[param]:  # the voice's own value: the same audio, the same key
            params[param] = float(value)
    return build_request(
        spoken, model=model, voice=voice, fmt=audio.FORMATS["wav"], speed=speed, params=params
    )
