"""Speech marks over HTTP (docs/speech-marks.md): ``GET /v1/audio/{key}.marks`` (Polly's NDJSON),
``.vtt`` and ``.srt`` (captions), and ``POST /v1/audio/speech/with-timestamps`` (ElevenLabs'
response shape plus the marks). The marks are stored with the audio (:mod:`gateway.speech.marks`):
a hit reads them, nothing is computed again. (Stored audio by its key, which every
``/v1/audio/{key}`` route reads: :func:`stored_entry`.)
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, cast

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from cache.entry import Entry
from cache.keys import is_key
from gateway.api import ssml
from gateway.api.frontend import numbers_language
from gateway.api.parsing import (
    SpeechCall,
    parse_speech_body,
    read_body,
    ssml_limits,
    text_front_end,
    validate_off_loop,
)
from gateway.api.readings import read_numbers
from gateway.errors import BadRequest, NotFound
from gateway.http import keys
from gateway.http.errors import Handler
from gateway.runtime.settings import Settings
from gateway.speech import marks as speech_marks
from gateway.speech.request import SpeechRequest
from gateway.speech.vocabulary import Vocabulary


class CharacterAlignment(TypedDict):
    """ElevenLabs' alignment: each character with when it starts and ends (seconds)."""

    characters: list[str]
    character_start_times_seconds: list[float]
    character_end_times_seconds: list[float]


class SpeechMark(TypedDict):
    """One speech mark, as Amazon Polly writes it."""

    time: Annotated[int, Field(description="Milliseconds from the start of the audio.")]
    type: Annotated[str, Field(description="sentence, word, viseme or ssml.")]
    start: Annotated[int, Field(description="UTF-8 byte offset of the text's first byte.")]
    end: Annotated[int, Field(description="UTF-8 byte offset after the text's last byte.")]
    value: Annotated[str, Field(description="The sentence, the word, or the viseme.")]


class TimedSpeech(TypedDict):
    """Audio with its timings (ElevenLabs' ``with-timestamps`` shape, plus Polly's marks)."""

    audio_base64: str
    alignment: Annotated[
        CharacterAlignment,
        Field(description="Of `input` as sent where it is plain text; else of `normalized_text`."),
    ]
    normalized_alignment: Annotated[
        CharacterAlignment, Field(description="Of the text as spoken (`normalized_text`).")
    ]
    normalized_text: str
    marks: Annotated[
        list[SpeechMark],
        Field(
            description="Offsets into `input` as sent where it is plain text (as `alignment`) "
            "or an SSML document (a `say-as`, `sub` or `phoneme` word spans the element's "
            "content); else into `normalized_text`."
        ),
    ]
    key: Annotated[str, Field(description="The audio's content key (`GET /v1/audio/{key}`).")]
    content_type: str
    sample_rate: int
    duration_s: float


def audio_key(request: web.Request) -> str:
    """The ``{key}`` of a stored-audio URL: 400 unless it is a content address."""
    key = request.match_info["key"]
    if not is_key(key):
        raise BadRequest("malformed audio key: expected 64 lowercase hex digits", param="key")
    return key


async def stored_entry(request: web.Request, key: str) -> Entry:
    """The entry stored under ``key`` (the memory tier first): 404 when there is none."""
    store = request.app[keys.STORE]
    entry = store.get_memory(key)
    if entry is None:
        found = await store.get(key)
        if found is None:
            raise NotFound(f"no audio stored under key {key}", param="key")
        entry = found.entry
    return entry


def _no_marks(model: str, voice: str, why: str = "") -> BadRequest:
    return BadRequest(
        f"voice '{voice}' of model '{model}' gives no speech marks{why}; GET /v1/voices says "
        "which voices do (`speech_marks`)",
        param="voice",
        code="marks_unsupported",
    )


async def _stored(request: web.Request) -> tuple[str, Entry]:
    key = audio_key(request)
    entry = await stored_entry(request, key)
    meta = entry.meta
    if not meta.marks:
        stored_before = request.app[keys.SPEECH].has_marks(meta.model, meta.voice)
        raise _no_marks(
            meta.model, meta.voice, " for this audio (stored before marks were)" * stored_before
        )
    request[keys.CACHE_RESULT] = "hit"
    request[keys.AUDIO_KEY] = key
    return key, entry


def _text_response(body: str, content_type: str, key: str) -> web.Response:
    response = web.Response(text=body, content_type=content_type, charset="utf-8")
    response.headers["X-Audio-Key"] = key
    # The marks of one entry never change; another replica's entry for the key has its own.
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


def marks_by_key(content_type: str) -> Handler:
    """The handler of ``GET /v1/audio/{key}.marks``: the stored audio's speech marks (``?types=``
    filters), sent as ``content_type`` (what its route declares)."""

    async def marks_by_key(request: web.Request) -> web.Response:
        try:
            types = speech_marks.parse_types(request.query.get("types"))
        except ValueError as exc:
            raise BadRequest(
                f"{exc}; types are {', '.join(speech_marks.MARK_TYPES)}", param="types"
            ) from exc
        key, entry = await _stored(request)
        body = entry.meta.marks
        if types is not None:
            found = speech_marks.chosen(speech_marks.from_ndjson(body), types)
            body = speech_marks.to_ndjson(found)
        return _text_response(body, content_type, key)

    return marks_by_key


def captions_by_key(write: Callable[[list[speech_marks.Cue]], str], content_type: str) -> Handler:
    """The handler of ``GET /v1/audio/{key}.{captions}``: the stored audio's captions as ``write``
    renders its cues, sent as ``content_type`` (what its route declares)."""

    async def captions_by_key(request: web.Request) -> web.Response:
        key, entry = await _stored(request)
        found = speech_marks.from_ndjson(entry.meta.marks)
        cues = speech_marks.cues(found, round(entry.meta.duration_s * 1000))
        return _text_response(write(cues), content_type, key)

    captions_by_key.__name__ = f"{write.__name__}_by_key"
    return captions_by_key


def _fields_of(raw: bytes) -> tuple[str, str | None, str | None]:
    # (The body validated already: this reads its fields again for the offsets.)
    body = json.loads(raw)
    value, input_type, normalize = (body.get(k) for k in ("input", "input_type", "normalize"))
    return (
        value if isinstance(value, str) else "",
        input_type if isinstance(input_type, str) else None,
        normalize if isinstance(normalize, str) else None,
    )


def _read_as_said(
    req: SpeechRequest,
    chars: Sequence[speech_marks.SourceChar],
    settings: Settings,
    words: Vocabulary,
    normalize: str | None,
) -> Sequence[speech_marks.SourceChar] | None:
    """``chars`` (the input's characters with their bytes) as the request's text front end read
    them: under ``numbers`` each word it wrote spans the digits it read. None: they cannot be
    (digits the request's own words did not have)."""
    handle = words.models[req.model]
    if text_front_end(settings, handle, req.voice, normalize) != "numbers":
        return chars
    lang = numbers_language(handle.voice_language(req.voice))
    try:
        return speech_marks.rewritten_source(chars, lambda text: read_numbers(text, lang))
    except BadRequest:
        return None


def _ssml_map(
    req: SpeechRequest, raw: bytes, settings: Settings, words: Vocabulary
) -> speech_marks.SsmlSourceMap | None:
    """Where the spoken words came from in the request's SSML input (None: plain text)."""
    given, input_type, normalize = _fields_of(raw)
    if not (input_type == "ssml" if input_type is not None else ssml.is_ssml(given)):
        return None
    wrapped = not ssml.is_ssml(given)
    document = f"<speak>{given}</speak>" if wrapped else given
    handle = words.models[req.model]
    source = ssml.source_of(
        document,
        language=handle.voice_language(req.voice),
        engine=handle.engine_name,
        takes_phonemes=handle.capabilities.takes_phonemes,
        limits=ssml_limits(settings),
    )
    chars = _read_as_said(req, source.chars, settings, words, normalize)
    if chars is None:
        return None
    return speech_marks.SsmlSourceMap(
        req.text, given, chars, source.marks, len("<speak>") if wrapped else 0
    )


def _read_map(
    req: SpeechRequest, raw: bytes, settings: Settings, words: Vocabulary
) -> speech_marks.SsmlSourceMap | None:
    """Where the spoken words came from in a plain input the number front end rewrote (None:
    where they do not follow it word for word)."""
    given, _, normalize = _fields_of(raw)
    ends = list(itertools.accumulate((len(ch.encode()) for ch in given), initial=0))
    own = [(ch, (ends[i], ends[i + 1])) for i, ch in enumerate(given)]
    chars = _read_as_said(req, own, settings, words, normalize)
    if chars is None or chars is own:
        return None
    mapped = speech_marks.SsmlSourceMap(req.text, given, chars, ())
    return mapped if mapped.exact else None


async def speech_call(request: web.Request) -> tuple[bytes, SpeechCall]:
    """The body of a request that takes ``POST /v1/audio/speech``'s body, and its validated call
    (the app's memo of them first; off the event loop when a text front end may run)."""
    app = request.app
    settings = app[keys.SETTINGS]
    raw = await read_body(request, settings.max_body_kb * 1024, settings.body_timeout_s)
    memo = app[keys.REQUEST_MEMO]
    call = memo.get(raw)
    if call is None:
        words, expansions = app[keys.VOCABULARY], app[keys.EXPANSIONS]
        call = await validate_off_loop(
            settings, raw, parse_speech_body, raw, settings, words, expansions
        )
        memo.put(raw, call)
    return raw, call


async def speech_with_timestamps(request: web.Request) -> web.Response:
    """``POST /v1/audio/speech/with-timestamps``: the speech body's audio, whole, base64 in
    JSON, with ElevenLabs' character alignment and Polly's marks."""
    app = request.app
    settings, service = app[keys.SETTINGS], app[keys.SPEECH]
    raw, call = await speech_call(request)
    # (The answer is whole JSON: the streaming fields of the speech body have no effect here.)
    req = call.req
    if not service.has_marks(req.model, req.voice):
        raise _no_marks(req.model, req.voice)
    result = await service.speak(req)
    entry = result.entry
    request[keys.CACHE_RESULT] = result.cache
    request[keys.AUDIO_KEY] = result.key
    if not entry.meta.marks:
        raise _no_marks(req.model, req.voice, " for this audio (stored before marks were)")
    body = await asyncio.to_thread(
        _timed_body, req, raw, entry, result.key, settings, app[keys.VOCABULARY]
    )
    response = web.json_response(body)
    response.headers["X-Audio-Key"] = result.key
    response.headers["X-Cache"] = result.cache.upper()
    return response


def _timed_body(
    req: SpeechRequest, raw: bytes, entry: Entry, key: str, settings: Settings, words: Vocabulary
) -> TimedSpeech:
    """The with-timestamps body (off the loop: base64, the alignment of every character, the
    SSML source map)."""
    found = speech_marks.from_ndjson(entry.meta.marks)
    duration_ms = round(entry.meta.duration_s * 1000)
    in_ssml = _ssml_map(req, raw, settings, words)
    normalized = speech_marks.character_alignment(req.text, found, duration_ms)
    if in_ssml is not None:
        # The characters are aligned over the spoken text (markup has no time); the marks
        # index the document, as Polly's do for SSML input.
        moved = in_ssml.marks(found)
        alignment = normalized
    else:
        source = speech_marks.SourceMap(req.text, _fields_of(raw)[0])
        read = None if source.exact else _read_map(req, raw, settings, words)
        if read is not None:
            # Numbers read as words: the marks index the input as sent, as for SSML; the
            # characters' alignment covers the words said.
            moved = read.marks(found)
            alignment = normalized
        else:
            moved = [source.mark(m) for m in found]
            alignment = speech_marks.character_alignment(source.text, moved, duration_ms)
    marks_json: list[Any] = [m.as_json() for m in moved]
    return {
        "audio_base64": base64.b64encode(entry.audio).decode("ascii"),
        "alignment": cast(CharacterAlignment, alignment),
        "normalized_alignment": cast(CharacterAlignment, normalized),
        "normalized_text": req.text,
        "marks": marks_json,
        "key": key,
        "content_type": req.fmt.content_type,
        "sample_rate": entry.meta.sample_rate,
        "duration_s": round(entry.meta.duration_s, 3),
    }
