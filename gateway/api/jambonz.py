"""jambonz as a client: its custom TTS vendor request, and its streaming query, as requests.

jambonz (speech-utils ``lib/synth-audio.js``, ``synthCustomVendor``) POSTs
``{language, voice, type: "text"|"ssml", text}`` with ``Authorization: Bearer <token>`` and plays
the answer by its Content-Type (``getFileExtFromMime``): ``audio/l16;rate=N`` is raw 16-bit PCM
at N Hz (written to a FreeSWITCH ``.rN`` file: little-endian samples), ``audio/wav`` or
``audio/x-wav`` a WAV file taken as 8 kHz, ``audio/mpeg`` MP3; anything else is taken as WAV.
Its voice and language names map to voxgate voices through the voice aliases.
"""

from __future__ import annotations

from typing import Any

from gateway.api.compat import default_voice
from gateway.api.models import models_for
from gateway.api.parsing import (
    ExpansionMemo,
    accepted_voices,
    build_request,
    resolve_model,
    resolve_voice,
    speech_text,
)
from gateway.errors import BadRequest
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.vocabulary import Vocabulary
from synth import audio

# jambonz_content_type -> (our format, rate). jambonz reads a WAV as 8 kHz whatever its header
# says, so WAV is only ever sent at 8 kHz.
ENCODINGS: dict[str, tuple[str, int]] = {
    "audio/l16;rate=8000": ("pcm", 8000),
    "audio/l16;rate=16000": ("pcm", 16000),
    "audio/wav": ("wav", 8000),
}
# Rates the streaming protocol may ask for (sampleRate): those jambonz names L16 files for.
STREAM_RATES = (8000, 16000, 24000, 32000, 48000)


def jambonz_voice(
    voice: str, language: str, model: str, settings: Settings, words: Vocabulary
) -> str:
    """Our voice for a jambonz voice and language: the voice (or its alias), else the language
    as an alias (``en-US=joe``), else the default voice or a 400 (``jambonz_unknown_voice``)."""
    for name in filter(None, (voice, language)):
        try:
            return resolve_voice(name, model, words)
        except BadRequest:
            continue
    if settings.jambonz_unknown_voice == "default" or not (voice or language):
        return default_voice(model, words)
    known = accepted_voices(model, words)
    raise BadRequest(
        f"unknown jambonz voice {voice[:64]!r} (language {language[:16]!r}); voices and "
        f"aliases: {', '.join(known)}",
        param="voice",
        code="voice_not_found",
    )


def parse_jambonz(
    body: dict[str, Any],
    settings: Settings,
    words: Vocabulary,
    expansions: ExpansionMemo | None = None,
) -> SpeechRequest:
    """The request for a jambonz custom-vendor body, in the encoding ``jambonz_content_type``
    names."""
    fields = models_for(settings).jambonz.check(body)
    model = resolve_model(words.default_model, words)
    voice = jambonz_voice(fields.voice, fields.language, model, settings, words)
    spoken = speech_text(
        fields.text,
        settings,
        words,
        model,
        voice,
        param="text",
        ssml=fields.type == "ssml",
        expansions=expansions,
    )
    fmt, rate = ENCODINGS[settings.jambonz_content_type]
    return build_request(spoken, model=model, voice=voice, fmt=audio.FORMATS[fmt], sample_rate=rate)


def parse_stream_query(
    query: dict[str, str], settings: Settings, words: Vocabulary
) -> tuple[str, str, int]:
    """``(model, voice, rate)`` of a streaming connection's query (``voice``, ``language``,
    ``sampleRate``: what jambonz puts on the custom vendor's WebSocket URL)."""
    model = resolve_model(words.default_model, words)
    voice = jambonz_voice(query.get("voice", ""), query.get("language", ""), model, settings, words)
    raw = query.get("sampleRate", "8000")
    # (isascii and a length bound: isdigit alone takes "²", and int() refuses 4,300 digits)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or int(raw) not in STREAM_RATES:
        raise BadRequest(
            f"sampleRate must be one of {', '.join(map(str, STREAM_RATES))}",
            param="sampleRate",
        )
    return model, voice, int(raw)
