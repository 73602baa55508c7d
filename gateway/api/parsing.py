"""Request parsing and validation: from raw HTTP bodies to a :class:`SpeechRequest` or a 4xx."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, ParamSpec, TypeVar

from aiohttp import web
from pydantic import ValidationError

from cache.keys import normalize_text
from gateway.api.frontend import front_end, front_end_mode, numbers_language
from gateway.api.models import CONTROL_CHARACTER, SpeechBody, control_character, models_for
from gateway.api.readings import read_numbers
from gateway.api.ssml import SsmlLimits, expand, is_ssml, joined_words, plain_text
from gateway.errors import BadRequest, PayloadTooLarge, RequestTimeout, clip
from gateway.memo import BoundedMemo, BytesMemo
from gateway.runtime.settings import Settings
from gateway.speech.request import Segment, SpeechRequest
from gateway.speech.vocabulary import ModelWords, Vocabulary
from synth import audio
from synth.engine import ParamValue
from synth.providers.base import VOICE_ID


async def read_body(request: web.Request, max_bytes: int, timeout_s: float | None = None) -> bytes:
    """The raw body, bounded by ``max_bytes`` (413 beyond) and, with ``timeout_s``, in time
    (408 beyond: a client trickling its body holds a connection and a task)."""
    length = request.content_length  # (parsed from the header on every access)
    if length is not None and length > max_bytes:
        raise PayloadTooLarge(f"request body too large: {length} bytes (limit {max_bytes})")
    try:
        if request.content.is_eof():
            # The whole body has arrived (a small body comes with its headers): reading it
            # cannot wait, and a timeout (a loop timer armed and cancelled) would be a visible
            # share of a cache hit's CPU time.
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout_s):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"request body too large (limit {max_bytes} bytes)") from exc
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {timeout_s:g} s (body_timeout_s)",
            code="body_timeout",
        ) from None
    return raw


# The deepest nesting a request body may have. The deepest body any endpoint takes is 3 levels
# (a prompt object in the prompts list); deeper bodies are hostile (5,000 levels was a
# RecursionError), and pydantic's own JSON parser stops at about 250.
MAX_JSON_DEPTH = 32


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and objects more than ``limit`` deep.

    Iterative, so a deep value cannot exhaust the stack; it stops at the first path too deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def too_deep() -> BadRequest:
    """The error for a body nested deeper than :data:`MAX_JSON_DEPTH`."""
    return BadRequest(
        f"request body is nested too deeply: the limit is {MAX_JSON_DEPTH} levels",
        code="json_too_deep",
    )


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse ``raw`` as a JSON object (the JSON routes check its Content-Type first, at
    registration: :mod:`gateway.http.origins`)."""
    if not raw.strip():
        raise BadRequest("request body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    except RecursionError as exc:
        raise too_deep() from exc
    except ValueError as exc:
        # A number of more than 4,300 digits (Python's int conversion limit).
        raise BadRequest("request body is not valid JSON: a number is too long") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    if json_depth_exceeds(body):
        raise too_deep()
    return body


async def read_json_object(
    request: web.Request, max_bytes: int, timeout_s: float | None = None
) -> dict[str, Any]:
    """Read (in ``timeout_s``) and parse the body as a JSON object."""
    return parse_json_object(await read_body(request, max_bytes, timeout_s))


@dataclass(frozen=True)
class SpeechCall:
    """A validated ``/v1/audio/speech`` body: the request, how to answer it, and the fields that
    were accepted but have no effect (named in the ``X-Ignored-Fields`` response header)."""

    req: SpeechRequest
    # True or False as asked (``stream``, ``stream_format``); None when the body says nothing:
    # a miss then streams where that helps (gateway.http.delivery.serve_speech).
    stream: bool | None = None
    sse: bool = False
    ignored: tuple[str, ...] = ()
    # Speech marks events in the event stream (``speech_marks``; with ``sse`` only).
    marks: bool = False
    # The text front end its text went through (``normalize``, ``auto`` resolved).
    front_end: str = "none"


class RequestMemo(BytesMemo[SpeechCall]):
    """Validated requests by their exact body bytes (bounded by count and by bytes, oldest first
    out).

    Bots and IVR systems send the same few thousand bodies again and again; parsing, validating
    and normalizing them was a third of a cache hit's Python time. Validation depends only on the
    body and on settings and models fixed at start, so the same bytes always give the same
    request. Only valid requests are kept, and only small bodies.

    Sized for a catalogue of several thousand prompts (a Zipf mix over 5,000 prompts re-validates
    a few percent of its hits at 4,096 entries, almost none at 8,192: docs/bench/hit_path.json,
    ``memo_miss_rate_over_sequence``), and bounded by the bodies' total size
    too, so hostile clients filling it with large bodies hold at most ``max_bytes``.
    """

    def __init__(
        self, size: int = 16384, max_body: int = 8192, max_bytes: int = 16 * 1024 * 1024
    ) -> None:
        super().__init__(size, max_body, max_bytes)


# Bodies up to this size are validated on the event loop under the numbers front end: reading
# the digits of a 200-character prompt takes well under a millisecond, of the longest input
# (max_input_chars) tens of milliseconds.
SMALL_BODY = 256


def front_end_may_run(settings: Settings, raw: bytes | None = None) -> bool:
    """Whether validating a request may run a slow text front end (the ``normalize`` setting, or
    a ``normalize`` field in ``raw``; ``raw`` None: a text of any length): markdown parsing or
    number reading of a long hostile text takes tens of milliseconds, so such requests are
    validated off the event loop (``asyncio.to_thread``)."""
    mode = settings.normalize
    if mode == "none":
        long_text = False
    elif mode == "llm" or raw is None:
        long_text = True
    else:  # numbers, or auto (numbers on most models): only a long text takes long
        long_text = len(raw) > SMALL_BODY
    # An SSML document is parsed too (bounded, about a millisecond for the longest input).
    return long_text or (
        raw is not None and (b'"normalize"' in raw or b"<speak" in raw or b'"input_type"' in raw)
    )


T = TypeVar("T")
P = ParamSpec("P")


async def validate_off_loop(
    settings: Settings, raw: bytes | None, parse: Callable[P, T], *args: P.args, **kw: P.kwargs
) -> T:
    """``parse(*args)``: in a thread where a slow text front end may run on ``raw``
    (:func:`front_end_may_run`), else here on the event loop."""
    if front_end_may_run(settings, raw):
        return await asyncio.to_thread(parse, *args, **kw)
    return parse(*args, **kw)


def _check_raw(raw: str, settings: Settings, param: str) -> None:
    if len(raw) > settings.max_input_chars:
        raise BadRequest(
            f"'{param}' is {len(raw)} characters; the limit is {settings.max_input_chars}",
            param=param,
            code="input_too_long",
        )
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"'{param}' contains invalid Unicode (a lone surrogate)", param=param
        ) from exc
    control = CONTROL_CHARACTER.search(raw)
    if control is not None:
        # (The request models refuse these first; text from elsewhere, Wyoming's or a catalogue
        # file's, is checked here.)
        raise control_character(param, control)


def text_front_end(
    settings: Settings, handle: ModelWords, voice: str, normalize: str | None = None
) -> str:
    """The front end (a key of :data:`gateway.api.frontend.FRONT_ENDS`) a request's text runs
    through with ``voice`` of the model ``handle``: its ``normalize``, else the setting, with
    ``auto`` resolved to the model's own."""
    return front_end_mode(
        normalize or settings.normalize,
        handle.capabilities.front_end,
        handle.voice_language(voice),
    )


def validate_text(
    raw: str, settings: Settings, param: str = "input", *, mode: str, language: str = ""
) -> str:
    """Run plain ``raw`` through the text front end ``mode`` (:func:`text_front_end`) and
    normalize it; reject empty, oversized or malformed Unicode input. The limit applies to
    ``raw``. ``language`` is the voice's (for ``numbers``)."""
    _check_raw(raw, settings, param)
    text = normalize_text(front_end(raw, mode, numbers_language(language)))
    if not text:
        if normalize_text(raw):
            raise BadRequest(
                f"'{param}' has nothing to speak after the '{mode}' text front end",
                param=param,
                code="nothing_to_speak",
            )
        raise BadRequest(f"'{param}' is empty or whitespace only", param=param)
    return text


class ExpansionMemo(BoundedMemo[tuple[object, ...], tuple[Segment, ...]]):
    """SSML expansions by (raw text, model, voice, front end, limits): a repeated document is
    not parsed again on paths the request memo does not cover (say URLs, jambonz, the Coqui and
    Piper routes, Wyoming). Parsing's own: kept on the app beside the request memo."""

    def __init__(self, size: int = 8192) -> None:
        super().__init__(size)


# Documents memoized by their raw text only up to this length: the memo holds each text as its
# key, so its worst case stays a few tens of MB whatever max_input_chars is set to.
EXPANSION_MEMO_MAX_CHARS = 4096


def ssml_limits(settings: Settings) -> SsmlLimits:
    """The SSML bounds the settings give."""
    return SsmlLimits(
        max_depth=settings.ssml_max_depth,
        max_elements=settings.ssml_max_elements,
        max_expanded_chars=settings.ssml_max_expanded_chars,
        unknown_tags=settings.ssml_unknown_tags,
    )


class Spoken(NamedTuple):
    """What a request's text says, validated: its normalized ``text`` and, for an SSML
    expansion plain text cannot stand for, its ``segments`` (else empty)."""

    text: str
    segments: tuple[Segment, ...] = ()


def speech_text(
    raw: str,
    settings: Settings,
    words: Vocabulary,
    model: str,
    voice: str,
    *,
    param: str = "input",
    normalize: str | None = None,
    ssml: bool | None = None,
    expansions: ExpansionMemo | None = None,
) -> Spoken:
    """What ``raw`` says with ``voice`` of ``model``, for :func:`build_request`.

    ``expansions`` remembers SSML documents already expanded (by text, model, voice, front end
    and limits). SSML when ``ssml`` says so, or (``ssml`` None) when the text starts with ``<speak`` (a
    startswith on the stripped text is all plain text pays); SSML content said to be SSML
    without its ``<speak>`` root is put in one. An expansion that is just words comes back as
    plain text with no segments, so it shares plain text's content address.
    """
    try:
        handle = words.models[model]
        language = handle.voice_language(voice)
        mode = text_front_end(settings, handle, voice, normalize)
        if not (ssml if ssml is not None else is_ssml(raw)):
            return Spoken(validate_text(raw, settings, param, mode=mode, language=language))
        _check_raw(raw, settings, param)
        document = raw if is_ssml(raw) else f"<speak>{raw}</speak>"
        limits = ssml_limits(settings)
        memo_key = (raw, model, voice, mode, limits)
        segments = expansions.get(memo_key) if expansions is not None else None
        if segments is None:
            segments = expand(
                document,
                language=language,
                engine=handle.engine_name,
                takes_phonemes=handle.capabilities.takes_phonemes,
                limits=limits,
            )
            if mode == "numbers":
                # (The words of a say-as are words already: it decides how its digits are read.)
                lang = numbers_language(language)
                segments = tuple(
                    s
                    if s.phonemes or not s.words
                    else dataclasses.replace(s, words=normalize_text(read_numbers(s.words, lang)))
                    for s in segments
                )
            if expansions is not None and len(raw) <= EXPANSION_MEMO_MAX_CHARS:
                expansions.put(memo_key, segments)
        plain = plain_text(segments)
        if plain is not None:
            return Spoken(plain)
        return Spoken(joined_words(segments), segments)
    except BadRequest as exc:
        if exc.param != "input" or param == "input":
            raise
        # The SSML and number front ends name 'input'; this route calls the field otherwise.
        raise BadRequest(exc.message, param=param, code=exc.code) from exc


def resolve_model(name: str, words: Vocabulary) -> str:
    """Our model name for ``name`` (an alias such as ``tts-1`` or a model name)."""
    resolved = words.model_aliases.get(name, name)
    if resolved not in words.models:
        known = sorted(set(words.models) | set(words.model_aliases))
        raise BadRequest(
            f"unknown model {clip(name)}; available: {', '.join(known)}",
            param="model",
            code="model_not_found",
        )
    return resolved


def accepted_voices(model: str, words: Vocabulary) -> list[str]:
    """The names :func:`resolve_voice` takes for ``model``, sorted: its voices, and the aliases
    that lead to one of them (every alias, on a local model other than the default, which
    answers an alias with its first voice). An upstream is never offered an alias of a voice it
    does not have: the provider would refuse it."""
    handle = words.models[model]
    voices = handle.voice_names()
    if model != words.default_model and voices and not handle.capabilities.remote:
        aliases = set(words.voice_aliases)
    else:
        aliases = {a for a, v in words.voice_aliases.items() if v in voices}
    return sorted(set(voices) | aliases)


def resolve_voice(name: str, model: str, words: Vocabulary) -> str:
    """Our voice name for ``name`` on ``model`` (an alias such as ``alloy`` or a voice name)."""
    handle = words.models[model]
    voices = handle.voice_names()
    if name in voices:
        return name
    alias = words.voice_aliases.get(name)
    if alias is not None and alias in voices:
        return alias
    # An upstream (a paid provider) says what it was asked to: a name it does not list is
    # never swapped for another voice of it.
    can = handle.capabilities
    if can.any_voice:
        # voices = ["*"]: any voice id goes to the provider, which says whether it has it (its
        # refusal is a 400 with its message), once the id has a voice id's form.
        if not VOICE_ID.fullmatch(name):
            raise BadRequest(
                f"voice {clip(name)} is not a voice id (letters, digits and _.:@+- only, at "
                "most 128)",
                param="voice",
                code="voice_not_found",
            )
        return name
    if alias is not None and model != words.default_model and voices and not can.remote:
        # OpenAI voice names on a model that lacks the aliased voice: use its first voice.
        return voices[0]
    known = accepted_voices(model, words)
    raise BadRequest(
        f"unknown voice {clip(name)} for model '{model}'; available: {', '.join(known)}",
        param="voice",
        code="voice_not_found",
    )


def build_request(
    spoken: Spoken,
    *,
    model: str,
    voice: str,
    fmt: audio.AudioFormat,
    speed: float = 1.0,
    sample_rate: int | None = None,
    params: Mapping[str, ParamValue] | None = None,
) -> SpeechRequest:
    """The one constructor of a client's :class:`SpeechRequest`, from validated fields: the
    text as :func:`speech_text` made it, ``model`` and ``voice`` resolved, ``fmt``, ``speed``
    and ``sample_rate`` checked, and engine ``params`` beyond the voice's defaults (sorted here:
    they enter the content address in one order)."""
    return SpeechRequest(
        text=spoken.text,
        model=model,
        voice=voice,
        fmt=fmt,
        speed=speed,
        sample_rate=sample_rate,
        params=tuple(sorted((params or {}).items())),
        segments=spoken.segments,
    )


def parse_speech_object(
    body: Mapping[str, Any], settings: Settings, words: Vocabulary
) -> SpeechCall:
    """The :class:`SpeechCall` of an OpenAI ``/v1/audio/speech`` body (a parsed JSON object)."""
    return speech_request(models_for(settings).speech.check(body), settings, words)


def parse_speech_body(
    raw: bytes, settings: Settings, words: Vocabulary, expansions: ExpansionMemo | None = None
) -> SpeechCall:
    """Validate the raw bytes of a ``/v1/audio/speech`` body.

    A valid body is parsed and validated in one pass (pydantic's JSON parser, faster than
    ``json.loads`` alone). Any failure is parsed again the slow way, so a malformed body is named
    as before (empty, not UTF-8, not JSON, not an object) and a field's failure as for any body.
    """
    model = models_for(settings).speech
    try:
        body = model.model_validate_json(raw)
    except ValidationError:
        body = model.check(parse_json_object(raw))
    else:
        # Fields it does not know are kept as sent: held to the same depth as any body.
        if body.model_extra and json_depth_exceeds(body.model_extra, MAX_JSON_DEPTH - 1):
            raise too_deep()
    return speech_request(body, settings, words, expansions)


def speech_request(
    body: SpeechBody,
    settings: Settings,
    words: Vocabulary,
    expansions: ExpansionMemo | None = None,
) -> SpeechCall:
    """The checks a model cannot make alone (served models, voices and aliases, the configured
    limit's normalized text, streamable formats, fields to ignore), and the :class:`SpeechCall`."""
    unknown = sorted(body.model_extra or {})
    if unknown and settings.strict_fields:
        raise type(body).unknown_fields(unknown)
    model = resolve_model(body.model, words)
    ignored: list[str] = []
    params: dict[str, ParamValue] = {}
    if body.instructions and words.models[model].capabilities.takes_instructions:
        # An upstream that follows them (OpenAI's gpt-4o-mini-tts): they change the audio, so
        # they are part of the content address, and go to the provider with the text.
        params["instructions"] = body.instructions
    elif body.instructions:
        # No local engine takes instructions (OpenAI's own tts-1 does not either). Ignored,
        # they stay out of the request and so out of the content address.
        if settings.strict_instructions:
            raise BadRequest(
                f"model '{model}' does not follow 'instructions'; omit the field or leave it empty",
                param="instructions",
                code="unsupported_parameter",
            )
        ignored.append("instructions")
    voice = resolve_voice(body.voice, model, words)
    ssml = None if body.input_type is None else body.input_type == "ssml"
    spoken = speech_text(
        body.input,
        settings,
        words,
        model,
        voice,
        normalize=body.normalize,
        ssml=ssml,
        expansions=expansions,
    )
    name = body.response_format or settings.default_format
    fmt = audio.FORMATS.get(name)
    if fmt is None:  # (a default_format setting that names no format: the field is checked)
        raise BadRequest(
            f"unsupported response_format {clip(name)}; supported: {', '.join(audio.FORMATS)}",
            param="response_format",
            code="unsupported_format",
        )
    stream, sse = streams(body, fmt)
    req = build_request(
        spoken,
        model=model,
        voice=voice,
        fmt=fmt,
        speed=body.speed,
        sample_rate=body.sample_rate,
        params=params,
    )
    if body.speech_marks and not sse:
        raise BadRequest(
            "'speech_marks' sends events in an event stream: ask for stream_format 'sse' (or use "
            "POST /v1/audio/speech/with-timestamps)",
            param="speech_marks",
        )
    if body.speech_marks and not words.models[model].capabilities.speech_marks:
        raise BadRequest(
            f"voice '{voice}' of model '{model}' gives no speech marks; GET /v1/voices says "
            "which voices do (`speech_marks`)",
            param="speech_marks",
            code="marks_unsupported",
        )
    return SpeechCall(
        req,
        stream,
        sse,
        tuple(ignored) + header_names(unknown),
        marks=body.speech_marks,
        front_end=text_front_end(settings, words.models[model], voice, body.normalize),
    )


# A field name a header may carry as it is; others are counted, not echoed (a client's JSON key
# can hold anything, a CR/LF included).
_FIELD_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_MAX_NAMED = 16


def header_names(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as they may appear in a response header: safe names, at most 16, and a count
    of the rest."""
    names = list(names)
    # (fullmatch: ``$`` alone would let a trailing newline into the header)
    safe = [n for n in names if _FIELD_NAME.fullmatch(n)][:_MAX_NAMED]
    rest = len(names) - len(safe)
    return (*safe, f"{rest} more") if rest else tuple(safe)


def streams(body: SpeechBody, fmt: audio.AudioFormat) -> tuple[bool | None, bool]:
    """``(streams, as server-sent events)``: ``stream: true`` or OpenAI's
    ``stream_format: "audio"`` stream the audio; ``stream_format: "sse"`` streams events;
    ``stream: false`` answers whole. None: neither field, the server's default (a miss of a
    streamable format streams where it has several sentences, as OpenAI's endpoint streams).

    Only formats whose sentence chunks concatenate into one valid stream can be asked to stream.
    """
    if body.stream_format is not None and body.stream is False:
        raise BadRequest(
            f"'stream_format' is '{body.stream_format}' but 'stream' is false", param="stream"
        )
    if body.stream is None and body.stream_format is None:
        return None, False
    streaming = bool(body.stream) or body.stream_format is not None
    if streaming and not fmt.streamable:
        names = ", ".join(f.name for f in audio.FORMATS.values() if f.streamable)
        raise BadRequest(
            f"response_format '{fmt.name}' cannot be streamed; streamable formats: {names}",
            param="response_format",
            code="unsupported_format",
        )
    return streaming, body.stream_format == "sse"
