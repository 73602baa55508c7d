"""Request models: each endpoint's request shape and bounds, stated once.

The server validates every request with these models, and the OpenAPI document's request schemas
are generated from them (:mod:`gateway.http.openapi`), so the two cannot disagree. What needs the
running service (aliases, served models and voices, a voice's language, streamable formats) is
checked after, in :mod:`gateway.api.parsing` and :mod:`gateway.api.compat`.

Why pydantic v2 and not msgspec: msgspec validates a speech body faster, but a body costs
microseconds either way, and only a body the request memo has not seen is validated at all;
pydantic's errors carry the field, the failed constraint and its bound, which the messages below
are built from, and it is already installed.

Models depend on a few settings (the longest input, the most prompts one catalogue may carry, the
defaults named in descriptions): :func:`request_models` builds them once per distinct value.
"""

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic_core import ErrorDetails

from gateway.api.frontend import NORMALIZE_MODES
from gateway.errors import BadRequest, clip
from gateway.runtime.settings import OPENAI_MODELS, OPENAI_VOICES, Settings
from gateway.speech.telephony import EXTENSIONS
from synth import audio

MIN_SPEED, MAX_SPEED = 0.25, 4.0
MIN_RATE, MAX_RATE = 8000, 48000
# OpenAI documents no bound for `instructions`; ignored text still costs memory, so one applies.
MAX_INSTRUCTIONS = 4096

# C0 and C1 control characters (Unicode category Cc) but tab, line feed and carriage return: no
# sound and no place in text to speak (a NUL reached espeak-ng as a C string terminator).
CONTROL = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
CONTROL_CHARACTER = re.compile(f"[{CONTROL}]")
# Text to speak: no control character (the lookahead: one linear scan), and not blank: text the
# engine would find empty after normalization (cache.keys.normalize_text collapses and strips
# whitespace). The models refuse both, so the document states both. Python's ``re`` engine is
# used (model_config below) so ``\s`` is exactly the whitespace ``str.strip`` removes.
SPEAKABLE = rf"^(?=[^{CONTROL}]*$)\s*\S"
# A value that must be empty or whitespace only (Coqui's style_wav/speaker_wav).
BLANK = r"^\s*$"

if TYPE_CHECKING:
    FormatName = str
    NormalizeMode = str
    ExtensionName = str
else:
    # The enum is the format table itself: a format added in synth.audio is documented and accepted.
    FormatName = Literal[tuple(audio.FORMATS)]
    # Likewise the front ends' table (gateway.api.frontend).
    NormalizeMode = Literal[NORMALIZE_MODES]
    # And the telephony extensions' (gateway.speech.telephony).
    ExtensionName = Literal[tuple(EXTENSIONS)]

# A prompt id (gateway.api.catalogue.ID_PATTERN: a safe file name).
PROMPT_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


def _integral(value: Any) -> Any:
    """JSON has one number type: ``8000.0`` is the integer 8000 (JSON Schema's ``integer`` says
    so, and Python's json writes a float so). Strict validation still refuses ``8000.5``,
    ``"8000"`` and ``true``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Metadata of an integer field of a JSON body, after its Field (before, pydantic would write the
# bounds into the JSON schema as "ge"/"le", which no JSON Schema validator reads).
INTEGRAL = BeforeValidator(_integral)

# A speed factor (Piper's length_scale: its inverse), and Piper's noise scales.
SpeedRange = Annotated[float, Field(ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)]
Speed = Annotated[SpeedRange, Field(description="Speaking rate.")]
Noise = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
SampleRate = Annotated[
    int,
    Field(
        ge=MIN_RATE,
        le=MAX_RATE,
        description="Output rate in Hz (resampled with soxr). Default: the voice's rate, 8000 for "
        "the G.711 formats; MP3/AAC/Opus round up to a rate their codec runs at.",
    ),
    INTEGRAL,
]

# A message per pydantic error type, for any field. ``{field}`` is the field's name; ``{shown}``
# the rejected value, used only where it is a short token (never the text to speak).
_MESSAGES: dict[str, str] = {
    "missing": "missing required field '{field}'",
    "string_type": "'{field}' must be a string",
    "string_unicode": "'{field}' contains invalid Unicode (a lone surrogate)",
    "float_type": "'{field}' must be a number",
    "float_parsing": "'{field}' must be a number",
    "int_type": "'{field}' must be an integer",
    "int_parsing": "'{field}' must be an integer",
    "int_from_float": "'{field}' must be an integer",
    "bool_type": "'{field}' must be true or false",
    "bool_parsing": "'{field}' must be true or false",
    "string_too_short": "'{field}' is empty or whitespace only",
    "string_pattern_mismatch": "'{field}' is empty or whitespace only",
    "string_too_long": "'{field}' is {length} characters; the limit is {max_length}",
    "literal_error": "unsupported {field} {shown}; supported: {expected}",
    "model_type": "'{field}' must be an object",
    "dict_type": "'{field}' must be an object",
    "list_type": "'{field}' must be a list",
}
# (field, pydantic error type) -> (message, code): a field's own words, formatted like the above.
Messages = dict[tuple[str, str], tuple[str, str | None]]
_RANGE = ("greater_than_equal", "less_than_equal", "finite_number")
_CODES = {"string_too_long": "input_too_long"}


def unsupported(**codes: str) -> Messages:
    """A value outside the field's enum in the generic words, with the error ``code`` given
    for each field."""
    return {(field, "literal_error"): (_MESSAGES["literal_error"], c) for field, c in codes.items()}


def control_character(field: str, found: re.Match[str]) -> BadRequest:
    """The error for a control character ``found`` in text ``field``."""
    return BadRequest(
        f"'{field}' contains the control character U+{ord(found.group()):04X} at position "
        f"{found.start()}: only tab, line feed and carriage return are allowed",
        param=field,
        code="control_character",
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class RequestModel(BaseModel):
    """Base of the request models: strict JSON types, unknown fields refused, and every failure
    turned into a :class:`BadRequest` that names the field (:meth:`bad_request`)."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")

    # A field's own words where it needs them (see Messages).
    messages: ClassVar[Messages] = {}
    # The route named in "unsupported field" messages; None: OpenAI's wording.
    route: ClassVar[str | None] = None

    @classmethod
    def unknown_fields(cls, names: list[str]) -> BadRequest:
        """The error for fields the model does not have (``names`` sorted, never empty)."""
        # A client may send thousands of names, each as long as the body: a few are named, cut.
        safe = [n if len(n) <= 32 and n.isprintable() else clip(n, 32) for n in names[:8]]
        shown = ", ".join(safe) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        if cls.route is None:
            return BadRequest(f"unrecognized request argument: {shown}", param=safe[0])
        known = ", ".join(cls.model_fields)
        return BadRequest(
            f"unsupported field{'s' if len(names) > 1 else ''} {shown}: {cls.route} takes {known}",
            param=safe[0],
        )

    @classmethod
    def describe(cls, error: ErrorDetails, field: str) -> BadRequest:
        """The error for one pydantic failure of ``field``."""
        kind = error["type"]
        ctx: dict[str, Any] = dict(error.get("ctx") or {})
        value = error.get("input")
        words = {
            "field": field,
            "shown": _shown(value),
            "length": len(value) if isinstance(value, str) else 0,
            **ctx,
        }
        custom = cls.messages.get((field, kind))
        if custom is not None:
            template, code = custom
            return BadRequest(template.format(**words), param=field, code=code)
        control = CONTROL_CHARACTER.search(value) if isinstance(value, str) else None
        if kind == "string_pattern_mismatch" and control is not None:
            return control_character(field, control)
        if kind in _RANGE:
            low, high = cls.bounds(field)
            return BadRequest(
                f"'{field}' must be between {low} and {high}, got {_shown(value)}", param=field
            )
        generic = _MESSAGES.get(kind)
        if generic is None:
            # pydantic's own words never echo the value.
            return BadRequest(f"'{field}' is invalid: {error['msg']}", param=field)
        return BadRequest(generic.format(**words), param=field, code=_CODES.get(kind))

    @classmethod
    def bounds(cls, field: str) -> tuple[Any, Any]:
        """``(minimum, maximum)`` of a numeric field, read from the model's own schema."""
        schema = cls.model_json_schema()["properties"][field]
        for option in [schema, *schema.get("anyOf", [])]:
            if "minimum" in option or "maximum" in option:
                return option.get("minimum"), option.get("maximum")
        return None, None

    @classmethod
    def bad_request(cls, exc: ValidationError) -> BadRequest:
        """The first failure in ``exc`` as a :class:`BadRequest` (unknown fields first, all named)."""
        errors = exc.errors(include_url=False)
        unknown = sorted(
            str(e["loc"][0])
            for e in errors
            if e["type"] == "extra_forbidden" and len(e["loc"]) == 1
        )
        if unknown:
            return cls.unknown_fields(unknown)
        first = errors[0]
        field = str(first["loc"][0]) if first["loc"] else "body"
        return cls.describe(first, field)

    @classmethod
    def check(cls, data: Any) -> Any:
        """Validate ``data`` (a parsed body or mapping of strings) or raise :class:`BadRequest`."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise cls.bad_request(exc) from None


def _streaming_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """What the speech body's fields cannot say one by one (:func:`gateway.api.parsing.streams`
    enforces it): ``stream_format`` is not for ``stream: false``, a streamed answer (either
    field) needs a streamable format, the default one when ``response_format`` is null, and
    ``speech_marks`` needs ``stream_format: "sse"``."""
    streamable = [f.name for f in audio.FORMATS.values() if f.streamable]
    default = getattr(model, "default_format", None)
    formats: dict[str, Any] = {"properties": {"response_format": {"enum": streamable}}}
    if default in streamable:
        formats["properties"]["response_format"]["enum"] = [*streamable, None]
    else:
        formats["required"] = ["response_format"]
    schema["allOf"] = [
        {
            "if": _has("stream", {"const": False}),
            "then": {"properties": {"stream_format": {"type": "null"}}},
        },
        {
            "if": {
                "anyOf": [
                    _has("stream", {"const": True}),
                    _has("stream_format", {"type": "string"}),
                ]
            },
            "then": formats,
        },
        # Speech marks events are events of the event stream.
        {
            "if": _has("speech_marks", {"const": True}),
            "then": _has("stream_format", {"const": "sse"}),
        },
    ]


def _has(field: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": [field], "properties": {field: schema}}


class SpeechBody(RequestModel):
    """``POST /v1/audio/speech``: OpenAI's speech body.

    Fields this model does not know are kept aside (``model_extra``), not refused: later OpenAI
    API versions add fields, and a client sending one must not break. The parser ignores them
    and names them in a response header, or refuses them with ``strict_fields``.
    """

    model_config = ConfigDict(
        title="SpeechRequest", extra="allow", json_schema_extra=_streaming_rules
    )
    # The format of a body that names none (set on each configuration's model).
    default_format: ClassVar[str | None] = None
    messages: ClassVar[Messages] = unsupported(
        response_format="unsupported_format",
        stream_format="unsupported_stream_format",
        normalize="unsupported_normalize",
    )

    # model, input, voice and response_format: described per configuration (request_models).
    model: str
    input: str
    voice: str
    response_format: FormatName | None = None
    speed: Speed = 1.0
    sample_rate: SampleRate | None = None
    stream: bool | None = Field(
        None,
        description="Chunked response, one chunk per sentence as it is ready (streamable "
        "formats only: " + ", ".join(f.name for f in audio.FORMATS.values() if f.streamable) + "). "
        "Unset: a miss of several sentences in a streamable format streams, the rest is whole; "
        "false: always whole (ETag, Content-Length).",
    )
    stream_format: Literal["audio", "sse"] | None = Field(
        None,
        description="OpenAI's streaming: 'audio' is `stream: true`; 'sse' answers "
        "text/event-stream events `speech.audio.delta` (base64 audio, sentence by sentence) "
        "and a final `speech.audio.done` with `usage`. Not with `stream: false`.",
    )
    speech_marks: bool = Field(
        False,
        description='With `stream_format: "sse"`: a `speech.marks.delta` event (Amazon Polly\'s '
        "speech marks: sentence, word, viseme) before the audio deltas it covers "
        "(docs/speech-marks.md). Voices with `speech_marks` in GET /v1/voices only.",
    )
    instructions: str | None = Field(
        None,
        max_length=MAX_INSTRUCTIONS,
        description="Voice instructions. An upstream model that follows them (OpenAI's "
        "gpt-4o-mini-tts) gets them, and they are part of the content address; the local "
        "models cannot follow them: there they are ignored (not part of the content address) "
        "and named in the X-Ignored-Fields header, or refused with the strict_instructions "
        "setting.",
    )
    normalize: NormalizeMode | None = Field(
        None,
        description="Text front end: 'auto' is the model's own ('numbers' for the local "
        "voices and wyoming upstreams, 'none' for a provider that reads digits itself; "
        "docs/api.md, Text front ends); 'llm' makes a language model's Markdown speakable "
        "(emphasis, code fences, links, emoji, URLs) before the content address is computed; "
        "'numbers' writes out numbers, amounts, dates, times and phone numbers in the voice's "
        "language (docs/ssml.md); 'none' takes the text as it is. Default: the normalize "
        "setting ('auto').",
    )
    input_type: Literal["text", "ssml"] | None = Field(
        None,
        description="'ssml': 'input' is an SSML document (docs/ssml.md); 'text': it is spoken "
        "as written, markup and all. Default: SSML when its first non-blank characters are "
        "'<speak', else text.",
    )


class PromptFields(RequestModel):
    """One prompt of ``POST /v1/prompts`` (or its ``defaults``): OpenAI's speech fields, all
    optional, with the short names catalogue files use (``text``, ``format``, ``rate``)."""

    # The example is a complete prompt: a prompt object needs the text unless the defaults give it.
    model_config = ConfigDict(
        title="Prompt", json_schema_extra={"examples": [{"input": "Welcome."}]}
    )
    messages: ClassVar[Messages] = {
        ("id", "string_pattern_mismatch"): (
            "'id' is not a safe file name: use letters, digits and _ - . (not first), at most "
            "128 characters",
            "invalid_id",
        ),
    }

    input: str | None = None
    text: str | None = Field(None, description="Same as `input`.")
    voice: str | None = None
    model: str | None = None
    response_format: FormatName | None = None
    format: FormatName | None = Field(None, description="Same as `response_format`.")
    speed: Speed | None = None
    sample_rate: SampleRate | None = None
    rate: SampleRate | None = Field(None, description="Same as `sample_rate`.")
    input_type: Literal["text", "ssml"] | None = Field(
        None, description="As in the speech request: 'ssml' reads the input as SSML."
    )
    normalize: NormalizeMode | None = Field(None, description="As in the speech request.")
    id: str | None = Field(
        None,
        pattern=PROMPT_ID,
        description="Names the prompt in the answer (and its files in `voxgate export`): "
        "letters, digits, `_ - .` (not first); unique in the catalogue.",
    )


def _catalogue_rules(schema: dict[str, Any]) -> None:
    """What the prompts' shared schema cannot say alone: a prompt object needs its text
    (``input`` or ``text``) unless the defaults give it, and the defaults name no ``id`` (an id
    names one prompt; null is no id)."""
    has_text = [{"required": ["input"]}, {"required": ["text"]}]
    schema["if"] = _has("defaults", {"type": "object", "anyOf": has_text})
    schema["else"] = {
        "properties": {"prompts": {"items": {"anyOf": [{"type": "string"}, {"anyOf": has_text}]}}}
    }
    schema["properties"]["defaults"]["not"] = {"type": "object", **_has("id", {"type": "string"})}


class PromptsBody(RequestModel):
    """``POST /v1/prompts``: a catalogue to render and pin."""

    model_config = ConfigDict(title="PromptsRequest", json_schema_extra=_catalogue_rules)

    prompts: list[str | PromptFields]
    defaults: PromptFields | None = Field(None, description="Fields applied to every prompt.")
    extensions: list[ExtensionName] | None = Field(
        None,
        max_length=len(EXTENSIONS),
        description="Telephony extensions (see GET /v1/audio/{key}.{ext}) to make ready: each "
        "prompt's answer gets `urls` by extension, transcoded and pinned now (absolute when "
        "`public_url` is set).",
    )

    @classmethod
    def bad_request(cls, exc: ValidationError) -> BadRequest:
        """Errors inside a prompt name it (``prompts[i].field``); unknown fields inside one are
        reported as a catalogue's are."""
        errors = exc.errors(include_url=False)
        for error in errors:
            loc = error["loc"]
            if loc[:1] == ("defaults",) and len(loc) == 2:
                return _prompt_error("defaults", error, str(loc[1]), "defaults", "defaults")
        items = [e for e in errors if e["loc"][:1] == ("prompts",) and len(e["loc"]) >= 2]
        if not items:
            first = errors[0]
            if first["loc"][:1] == ("prompts",) and first["type"] == "too_long":
                return BadRequest(
                    f"'prompts' has {first['ctx']['actual_length']} entries; "
                    f"the limit is {first['ctx']['max_length']}",
                    param="prompts",
                    code="too_many_prompts",
                )
            if first["loc"][:1] == ("prompts",):
                return BadRequest("'prompts' must be a non-empty list", param="prompts")
            return super().bad_request(exc)
        index = int(items[0]["loc"][1])
        where = f"prompt {index}"
        mine = [e for e in items if e["loc"][1] == index]
        # A string item fails only as "not a string": the object branch says what is wrong.
        inside = [e for e in mine if len(e["loc"]) >= 4]
        text = [e for e in mine if len(e["loc"]) == 3 and isinstance(e.get("input"), str)]
        if text:
            # A string item that is a string but not acceptable text.
            return _prompt_error(where, text[0], "input", "", f"prompts[{index}].input")
        if not inside:
            return BadRequest(f"{where}: expected a string or an object", param=f"prompts[{index}]")
        unknown = sorted(
            (e for e in inside if e["type"] == "extra_forbidden"), key=lambda e: str(e["loc"][3])
        )
        first = (unknown or inside)[0]
        field = str(first["loc"][3])
        return _prompt_error(where, first, field, "prompts", f"prompts[{index}].{field}")


def _prompt_error(
    where: str, error: ErrorDetails, field: str, unknown_param: str, param: str
) -> BadRequest:
    """The error for ``field`` of a prompt object (or of the defaults), prefixed by ``where``."""
    if error["type"] == "extra_forbidden":
        return BadRequest(
            f"{where}: unknown field {clip(field, 32)}; expected one of "
            f"{', '.join(PromptFields.model_fields)}",
            param=unknown_param,
        )
    inner = PromptFields.describe(error, field)
    return BadRequest(f"{where}: {inner.message}", param=param, code=inner.code)


class CoquiFields(RequestModel):
    """``GET|POST /api/tts``: Coqui tts-server's fields, from headers, query string or body."""

    model_config = ConfigDict(title="CoquiRequest")
    route: ClassVar[str | None] = "/api/tts"
    messages: ClassVar[Messages] = {
        ("text", "missing"): ("'text' is missing or empty: send the text to speak", None),
        **{
            (name, "string_pattern_mismatch"): (
                f"'{name}' is not supported: the served voices do not clone or transfer style "
                "from reference audio; leave it empty",
                "unsupported_parameter",
            )
            for name in ("style_wav", "speaker_wav")
        },
    }

    text: str
    speaker_id: str = Field(
        "",
        description="Voice of the default model (or the `speaker-id` header); empty: the "
        "default voice.",
    )
    language_id: str = Field(
        "", description="Empty, or the voice's language (`en_US` or `en`); else 400."
    )
    style_wav: str = Field("", pattern=BLANK, description="Must be empty (no style transfer).")
    speaker_wav: str = Field("", pattern=BLANK, description="Must be empty (no voice cloning).")


class SynthesizeQuery(RequestModel):
    """``GET /synthesize``: the plain query string (numbers arrive as text, so not strict)."""

    model_config = ConfigDict(title="SynthesizeQuery", strict=False)
    route: ClassVar[str | None] = "/synthesize"
    messages: ClassVar[Messages] = {
        ("text", "missing"): ("'text' is missing or empty: send the text to speak", None),
        **unsupported(format="unsupported_format"),
    }

    text: str
    speaker: str = Field("", description="Voice (or alias); empty: the default voice.")
    model: str = Field("", description="Model (or alias); empty: the default model.")
    format: FormatName = Field("wav", description="Output format.")
    sample_rate: SampleRate | None = None
    speed: Speed = 1.0


class PiperBody(RequestModel):
    """``POST /``: Piper's HTTP server body (OHF-Voice/piper1-gpl, docs/API_HTTP.md)."""

    model_config = ConfigDict(title="PiperRequest")
    route: ClassVar[str | None] = "POST /"
    messages: ClassVar[Messages] = {
        ("text", "missing"): ("'text' is missing or empty: send the text to speak", None),
        ("speaker_id", "less_than_equal"): (
            "the served voices have one speaker each (id 0); got speaker_id {shown}",
            "speaker_not_found",
        ),
        ("speaker", "string_too_long"): (
            "the served voices have one speaker each and no speaker names; omit 'speaker'",
            "speaker_not_found",
        ),
    }

    text: str
    voice: str | None = Field(
        None, description="A voice of any served model (see GET /voices); null: the default."
    )
    # Piper's multi-speaker fields: every served voice has one speaker, so only "none" is valid.
    speaker: str | None = Field(
        None,
        max_length=0,
        description="Speaker name of a multi-speaker voice: the served voices have one speaker "
        "and no names, so null or empty.",
    )
    speaker_id: Annotated[int, Field(ge=0, le=0), INTEGRAL] | None = Field(
        None,
        description="Speaker id (overrides speaker): the served voices have one speaker, id 0.",
    )
    length_scale: SpeedRange | None = Field(
        None,
        description="Phoneme length: the voice's own (1.0 for most) is normal speed; "
        "mapped to speed = the voice's length_scale / this, which must lie in 0.25-4.",
    )
    noise_scale: Noise | None = Field(
        None, description="Generator noise; part of the content address (Piper voices only)."
    )
    noise_w_scale: Noise | None = Field(
        None, description="Phoneme width noise; part of the content address (Piper voices only)."
    )


class JambonzBody(RequestModel):
    """``POST /v1/jambonz/tts``: what jambonz sends a custom TTS vendor (jambonz speech-utils
    ``synthCustomVendor``: ``{language, voice, type, text}``)."""

    # Fields jambonz may add later are ignored rather than refused: jambonz, not a person, writes
    # this body, and a 400 would silence every prompt of an upgraded jambonz at once.
    model_config = ConfigDict(title="JambonzRequest", extra="ignore")
    route: ClassVar[str | None] = "/v1/jambonz/tts"
    messages: ClassVar[Messages] = {
        ("type", "literal_error"): (
            "unsupported type {shown}; jambonz sends 'text' or 'ssml'",
            "unsupported_type",
        ),
    }

    language: str = Field("", description="jambonz language, e.g. en-US; may name a voice alias.")
    voice: str = Field("", description="jambonz voice name: a voice or voice alias.")
    type: Literal["text", "ssml"] = Field(
        "text",
        description="'text', or 'ssml' (jambonz sends it for a text starting with <speak>; "
        "docs/ssml.md).",
    )
    text: str


class SignBody(RequestModel):
    """``POST /v1/say/sign``: a signed say URL for one prompt."""

    model_config = ConfigDict(title="SignRequest")
    route: ClassVar[str | None] = "/v1/say/sign"
    messages: ClassVar[Messages] = {
        **unsupported(ext="unsupported_format"),
        ("expires_in", "less_than_equal"): (
            "expires_in {shown} is longer than this gateway signs for ({le} s, signed_url_max_s)",
            None,
        ),
    }

    voice: str = Field(description="A voice of the default model, or an alias.", examples=["joe"])
    text: str
    ext: ExtensionName = Field(description="Extension of the URL (see GET /v1/audio/{key}.{ext}).")
    expires_in: int | None = None  # bounded by signed_url_max_s (request_models)


@dataclass(frozen=True)
class RequestModels:
    """The models of one configuration (see :func:`request_models`)."""

    speech: type[SpeechBody]
    prompts: type[PromptsBody]
    coqui: type[CoquiFields]
    synthesize: type[SynthesizeQuery]
    piper: type[PiperBody]
    jambonz: type[JambonzBody]
    sign: type[SignBody]


def models_for(settings: Settings) -> RequestModels:
    """The request models for ``settings`` (built once per distinct set of values they use)."""
    return request_models(
        settings.max_input_chars,
        settings.max_catalogue_prompts,
        settings.default_model,
        settings.default_voice,
        settings.default_format,
        settings.signed_url_max_s,
    )


@functools.lru_cache(maxsize=16)
def request_models(
    max_input_chars: int,
    max_prompts: int,
    default_model: str,
    default_voice: str,
    default_format: str,
    signed_url_max_s: int,
) -> RequestModels:
    """The models with the configured bounds and defaults filled in."""
    bounds: dict[str, Any] = {"min_length": 1, "max_length": max_input_chars, "pattern": SPEAKABLE}

    def text(description: str = "Text to speak.", example: str = "Hello.") -> Any:
        return (str, Field(description=description, examples=[example], **bounds))

    speech = create_model(
        "SpeechRequest",
        __base__=SpeechBody,
        model=(
            str,
            Field(
                description="A served model (see /v1/voices) or an alias; OpenAI's names "
                f"({', '.join(OPENAI_MODELS)}) map to '{default_model}' by default.",
                examples=[OPENAI_MODELS[0]],
            ),
        ),
        input=text("Text to speak (split into sentences)."),
        voice=(
            str,
            Field(
                description="A voice of the model or an alias; OpenAI's voices "
                f"({', '.join(OPENAI_VOICES)}) map to '{default_voice}' by default.",
                examples=[OPENAI_VOICES[0]],
            ),
        ),
        response_format=(
            FormatName | None,
            Field(
                None,
                description=f"Output format (default '{default_format}'); see the format "
                "table in the API description.",
            ),
        ),
    )
    speech.default_format = default_format
    prompt = create_model(
        "Prompt",
        __base__=PromptFields,
        # Optional but never null: without text a prompt has nothing to say.
        input=(str, Field(None, description="Text to speak.", **bounds)),
        text=(str, Field(None, description="Same as `input`.", **bounds)),
    )
    # (Types built at run time, so written as expressions: mypy reads no annotation from them.)
    text_item: Any = Annotated[str, Field(**bounds)]
    prompts = create_model(
        "PromptsRequest",
        __base__=PromptsBody,
        prompts=(
            cast(Any, list.__class_getitem__(text_item | prompt)),
            Field(
                min_length=1,
                max_length=max_prompts,
                description="Strings (the text), or objects with the speech fields.",
                examples=[["Welcome."]],
            ),
        ),
        defaults=(
            cast(Any, prompt | None),
            Field(None, description="Fields applied to every prompt."),
        ),
    )

    coqui = create_model(
        "CoquiRequest", __base__=CoquiFields, text=text("Text to speak (or the `text` header).")
    )
    synthesize = create_model("SynthesizeQuery", __base__=SynthesizeQuery, text=text())
    piper = create_model("PiperRequest", __base__=PiperBody, text=text())
    jambonz = create_model("JambonzRequest", __base__=JambonzBody, text=text())
    sign = create_model(
        "SignRequest",
        __base__=SignBody,
        text=text(example="Press one."),
        expires_in=(
            cast(Any, Annotated[int, Field(ge=1, le=signed_url_max_s), INTEGRAL] | None),
            Field(
                None,
                description=f"Seconds the URL stays valid: at most {signed_url_max_s} "
                "(signed_url_max_s); absent: signed_url_ttl_s. Every signed URL expires.",
            ),
        ),
    )
    return RequestModels(speech, prompts, coqui, synthesize, piper, jambonz, sign)
