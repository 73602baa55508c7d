"""The route table: every route the gateway serves, each declared once (what a declaration holds,
and what is derived from it: :mod:`gateway.http.routing`).

Order matters: aiohttp matches routes in the order they are added, so the listings come before
``/v1/audio/{key}`` (which would match them), and so does ``/v1/audio/{key}.{ext}`` (whose
segment ``/v1/audio/{key}`` would take whole).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cache.keys import KEY_PATTERN
from gateway.api.jambonz import ENCODINGS as JAMBONZ_ENCODINGS
from gateway.api.models import SPEAKABLE, models_for
from gateway.api.say import SIGNED as SIGNED_SEGMENT
from gateway.http import listings, ops, review, sse
from gateway.http.auth import ADMIN, ANY_KEY, METRICS, OPEN, READ, SIGNED, SPEAK
from gateway.http.compat import api_tts, piper_speak, piper_voices, synthesize
from gateway.http.errors import Error, Handler
from gateway.http.handlers import (
    Explanation,
    Health,
    Voices,
    audio_by_key,
    healthz,
    metrics_handler,
    openapi_document,
    readyz,
    speech,
    ssml_explain,
    studio,
    voices,
)
from gateway.http.jambonz import jambonz_stream, jambonz_tts
from gateway.http.marks import TimedSpeech, captions_by_key, marks_by_key, speech_with_timestamps
from gateway.http.routing import (
    JSON,
    Answer,
    Binary,
    Body,
    Common,
    Events,
    Header,
    Json,
    Param,
    Route,
    RouteTable,
    Text,
)
from gateway.http.telephony import SignedUrl, audio_by_key_ext, say, say_signed, sign_say_url
from gateway.runtime.settings import Settings
from gateway.speech.marks import CONTENT_TYPE as MARKS_TYPE
from gateway.speech.marks import MARK_TYPES, subrip, webvtt
from gateway.speech.request import CACHE_RESULTS
from gateway.speech.telephony import EXTENSIONS
from synth import audio

# ---- request headers (each described once in the document) -----------------------------------

IF_NONE_MATCH = Header(
    "If-None-Match",
    description="ETags (or `*`) the client holds; a match answers 304.",
    component="IfNoneMatch",
)
IF_MODIFIED_SINCE = Header(
    "If-Modified-Since",
    description="An HTTP date at or after Last-Modified answers 304 (ignored with If-None-Match).",
    component="IfModifiedSince",
)
RANGE = Header(
    "Range",
    description="One byte range: `bytes=first-last`, `bytes=first-` or `bytes=-suffix`. "
    "Several ranges are answered with the whole entity.",
    component="Range",
)
IF_RANGE = Header(
    "If-Range",
    description="Honour Range only if this is the current ETag.",
    component="IfRange",
)
CONDITIONS = (IF_NONE_MATCH, IF_MODIFIED_SINCE)

KEY = {"type": "string", "pattern": KEY_PATTERN}
AUDIO_HEADERS = (
    Header(
        "ETag",
        description="The first 128 bits of the body's SHA-256, hex, in quotes (strong): it "
        "names these bytes, not the content key (another replica may hold other bytes for the "
        "same key).",
    ),
    Header(
        "X-Audio-Key", KEY, description="Content key; `GET /v1/audio/{key}` serves the same bytes."
    ),
    Header(
        "X-Cache",
        {"type": "string", "enum": [c.upper() for c in CACHE_RESULTS]},
        description="HIT (stored), MISS (synthesized for this request) or COALESCED (joined an "
        "identical request in flight).",
    ),
    Header("X-Audio-Sample-Rate", {"type": "integer"}),
    Header(
        "Content-Length", {"type": "integer"}, description="Sent on every non-streamed response."
    ),
)
PLAYER_HEADERS = (
    Header(
        "Cache-Control", description="public, max-age=N (players keep a file only with max-age)."
    ),
    Header(
        "Last-Modified", description="When the audio was stored (If-Modified-Since answers 304)."
    ),
)
CONTENT_RANGE = Header("Content-Range")
RETRY_AFTER = Header("Retry-After", {"type": "integer"})

BINARY, TEXT = Binary(), Text()
AUDIO_TYPES = tuple(sorted({f.content_type for f in audio.FORMATS.values()}))
PLAYER_TYPES = tuple(sorted({e.content_type for e in EXTENSIONS.values()}))
# The captions' types: their handlers send what is declared here.
VTT, SRT = "text/vtt", "application/x-subrip"


def audio_answer(description: str, media: tuple[str, ...] = AUDIO_TYPES) -> Answer:
    """Audio in one of ``media``, with the headers every audio answer carries."""
    return Answer(description, {m: BINARY for m in media}, AUDIO_HEADERS)


def player_answer(description: str) -> Answer:
    """Audio in a telephony encoding, for players that keep files (Cache-Control, Last-Modified)."""
    return Answer(description, {m: BINARY for m in PLAYER_TYPES}, AUDIO_HEADERS + PLAYER_HEADERS)


def partial(whole: Answer) -> Answer:
    """The 206 answer of a route whose 200 is ``whole``: the asked bytes of the same audio."""
    return Answer(
        "The asked byte range of the audio; Content-Range says which.",
        whole.content,
        (CONTENT_RANGE, *whole.headers),
    )


def json_answer(description: str, model: type | None = None) -> Answer:
    """A JSON body built as ``model`` (None: some object)."""
    return Answer(description, {JSON: Json(model)})


SPEECH_OK = Answer(
    "The audio. Streamed responses (a miss of a text of several sentences in a streamable "
    "format, unless `stream: false`; or `stream: true`) use chunked transfer encoding and carry "
    "no ETag or Content-Length (Cache-Control: no-store; X-Audio-Key names the audio stored "
    'at the end); with `stream_format: "sse"`, server-sent events.',
    {
        **{m: BINARY for m in AUDIO_TYPES},
        sse.CONTENT_TYPE: Events(
            "SpeechStreamEvent",
            sse.EVENTS,
            "One event per `data:` line (no `event:` line: the JSON's `type` names it): "
            "`speech.audio.delta` events, then `speech.audio.done`; or an `error` event, after "
            "which the connection is dropped.",
        ),
    },
    (
        *AUDIO_HEADERS,
        Header(
            "X-Ignored-Fields",
            description="Fields accepted but without effect (`instructions`, unknown fields), "
            "comma-separated.",
        ),
    ),
)


def common_answers(settings: Settings) -> dict[int, Common]:
    """The answers many routes give, by status (errors in OpenAI's shape, and 304)."""

    def error(name: str, description: str, *headers: Header) -> Common:
        return Common(name, Answer(description, {JSON: Json(Error)}, headers))

    return {
        304: Common(
            "NotModified",
            Answer("The client's copy (If-None-Match) is current.", {}, (Header("ETag"),)),
        ),
        400: error(
            "BadRequest",
            "Invalid request: `param` names the field (unknown fields, unsupported formats and "
            "stream formats, out-of-range values, bad JSON).",
        ),
        401: error(
            "Unauthorized",
            "API keys are on and the request sent no key, or one the gateway does not know "
            "(docs/security.md).",
            Header("WWW-Authenticate"),
        ),
        403: error(
            "Forbidden",
            "The API key lacks the route's scope; or a signed say URL whose signature does not "
            "match or has expired, or signing is off.",
        ),
        404: error("NotFound", "No such audio key or route."),
        408: error(
            "RequestTimeout",
            f"The body did not arrive within {settings.body_timeout_s:g} s (`body_timeout_s`); "
            "the connection is closed.",
            Header("Connection", {"type": "string", "const": "close"}),
        ),
        413: error("PayloadTooLarge", f"Body over {settings.max_body_kb} KiB."),
        415: error(
            "UnsupportedMediaType", "The body was not sent as `Content-Type: application/json`."
        ),
        416: error(
            "RangeNotSatisfiable",
            "The range starts past the end; Content-Range: bytes */size.",
            CONTENT_RANGE,
        ),
        421: error(
            "MisdirectedRequest",
            "The Host header names a host this gateway does not serve (`allowed_hosts`).",
        ),
        429: error(
            "TooManyRequests",
            "This client already has its share of the synthesis queue waiting "
            "(`queue_per_client`), or its API key is over its requests or characters per minute; "
            "retry after Retry-After seconds.",
            RETRY_AFTER,
        ),
        500: error(
            "ServerError",
            "The engine failed this request (`engine_error`); nothing was stored, so a retry "
            "synthesizes again.",
        ),
        502: error(
            "BadGateway",
            "An upstream (a remote TTS provider served as a model) failed this request after "
            "its retries, or refused voxgate's credentials; the message names the upstream. "
            "Nothing was stored: a retry asks it again.",
            RETRY_AFTER,
        ),
        503: error(
            "Unavailable",
            "Synthesis queue full, model loading, engine unavailable, or an upstream unavailable "
            "(down, rate limiting, its breaker open); retry after Retry-After seconds (stored "
            "audio is still served).",
            RETRY_AFTER,
        ),
    }


KEY_PARAM = Param("key", "path", KEY)
TAKE_ID = Param("id", "path", {"type": "string", "pattern": "^[0-9a-f]{16}$"}, "The take's id.")
_MARK_TYPE = "(" + "|".join(MARK_TYPES) + ")"
MARK_TYPES_PATTERN = rf"^\s*({_MARK_TYPE}\s*(,\s*{_MARK_TYPE}\s*)*)?$"
EXT_PARAM = Param(
    "ext",
    "path",
    {"type": "string", "enum": list(EXTENSIONS)},
    "The encoding (table in this path's description).",
)


# Stored audio's content address: what is read under it (its encodings, marks and captions) is
# read as it is, by the same access.
AUDIO = "/v1/audio/{key}"


def address_read(suffix: str, handler: Handler, summary: str, **fields: Any) -> Route:
    """``GET /v1/audio/{key}`` + ``suffix``: a read of stored audio by its content address, with
    that address's access (:data:`READ`: a capability while public_audio_urls is on) and its
    ``key`` parameter (before ``params``)."""
    params = (KEY_PARAM, *fields.pop("params", ()))
    return Route("GET", AUDIO + suffix, handler, READ, summary=summary, params=params, **fields)


def _extension_table() -> str:
    rows = ["| ext | encoding | Content-Type |", "|---|---|---|"]
    rows += [f"| `{e.name}` | {e.summary} | `{e.content_type}` |" for e in EXTENSIONS.values()]
    return "\n".join(rows)


SAY_DESCRIPTION = (
    "Speaks `text` in `voice` as the extension's encoding, with no query string (Asterisk's "
    "Playback splits on `&`; FreeSWITCH reads the extension from the path's end). Cache-Control "
    "max-age is `synthesis_max_age_s`.\n\n" + _extension_table()
)


def route_table(settings: Settings) -> RouteTable:
    """Every route of a gateway running with ``settings``, in registration order."""
    models = models_for(settings)
    speech_body = Body(models.speech)
    say_params = (
        Param("voice", "path", {"type": "string"}, "A voice of the default model, or an alias."),
        Param(
            "text",
            "path",
            {
                "type": "string",
                "minLength": 1,
                "maxLength": settings.max_input_chars,
                "pattern": SPEAKABLE,
            },
            "The text, percent-encoded as one path segment: `/` as %2F, `%` as %25, `?` as %3F, "
            "`#` as %23, `&` as %26; the extension follows the last `.`.",
        ),
        EXT_PARAM,
    )
    coqui_get = Route(
        "GET",
        "/api/tts",
        api_tts,
        SPEAK,
        tag="compatible",
        summary="Coqui tts-server compatible synthesis (WAV)",
        description="Fields come from headers (`text`, `speaker-id`, `language-id`, `style-wav`, "
        "`speaker-wav`), the query string, or a form (or JSON) body, as Coqui's server reads "
        "them; a header wins. Any other field is a 400 naming it. Answers WAV (PCM16) at the "
        "voice's rate from the default model.",
        query=models.coqui,
        headers=(IF_NONE_MATCH,),
        answers={200: audio_answer("WAV audio.")},
        common=(304, 400, 429, 500, 502, 503),
        operation_id="coquiTtsGet",
    )
    # The POST's body carries the fields. (The query string and headers may too, as Coqui's
    # server reads them: said in the description, not as parameters, because a schema cannot say
    # "text in the body or in the query", and the body's schema needs it.)
    coqui_post = replace(
        coqui_get,
        method="POST",
        query=None,
        body=Body(models.coqui, ("application/x-www-form-urlencoded", "multipart/form-data", JSON)),
        operation_id="coquiTtsPost",
    )
    jambonz_media = settings.jambonz_content_type
    routes = (
        Route(
            "POST",
            "/v1/audio/speech",
            speech,
            SPEAK,
            tag="speech",
            summary="OpenAI-compatible text to speech",
            description="Long input is split into sentences; each is cached on its own and only "
            "unseen ones are synthesized (in parallel), joined by a short pause. As OpenAI's "
            "endpoint, a miss streams by default: when its text has several sentences and its "
            "format streams, the response is chunked and sends each sentence as soon as it is "
            "ready (WAV with an open-ended header, or raw PCM / G.711, MP3 or AAC frames), "
            "without ETag or Content-Length (a miss whose sentences are all stored is whole); the "
            "full audio is cached at the end, and a later "
            "request for it is a whole HIT (ETag, Content-Length, 304). `stream: false` always "
            "answers whole; `stream: true` streams a miss of one sentence too. A matching "
            "If-None-Match gets 304 when it names the bytes stored now. "
            'With `stream_format: "sse"` the body is `text/event-stream`: `speech.audio.delta` '
            "events (base64 audio, in order, sentence by sentence) and a final "
            "`speech.audio.done` with `usage`. `instructions` go to an upstream model that follows "
            "them (part of the content address); otherwise they and unknown fields are ignored "
            "and named in X-Ignored-Fields (400 with the strict_instructions / strict_fields "
            "settings). `pcm` is 24 kHz unless `sample_rate` says otherwise.",
            body=speech_body,
            headers=(IF_NONE_MATCH,),
            answers={200: SPEECH_OK},
            common=(304, 400, 413, 429, 500, 502, 503),
        ),
        Route(
            "POST",
            "/v1/audio/speech/with-timestamps",
            speech_with_timestamps,
            SPEAK,
            tag="speech",
            summary="Speech with its timings: ElevenLabs' with-timestamps shape plus speech marks",
            description="Takes the body of POST /v1/audio/speech and answers JSON, whole (its "
            "streaming fields have no effect here): "
            "`audio_base64` (the audio in `response_format`), `alignment` (each character of the "
            "input with its start and end in seconds, as ElevenLabs' "
            "`/v1/text-to-speech/{voice_id}/with-timestamps` answers), `normalized_alignment`, "
            "and `marks`, Amazon Polly's speech marks (sentence, word, viseme). The timings are "
            "stored with the audio: a repeat computes nothing. A voice without speech marks is a "
            "400 naming it (docs/speech-marks.md).",
            body=speech_body,
            answers={200: json_answer("The audio and its timings.", TimedSpeech)},
            common=(400, 413, 429, 500, 502, 503),
        ),
        Route(
            "POST",
            "/v1/ssml/explain",
            ssml_explain,
            SPEAK,
            tag="speech",
            summary="What a speech request would say, and its content address",
            description="Takes the body of POST /v1/audio/speech and synthesizes nothing: "
            "answers the SSML expansion (segments of words, the pause after them and their rate; "
            "docs/ssml.md), the sentences it is made of (each one cached master) with the pause "
            "before each, and `key`, the X-Audio-Key the speech request would answer with. A "
            "document is refused here exactly as there.",
            body=speech_body,
            answers={200: json_answer("The expansion and address.", Explanation)},
            common=(400, 413),
        ),
        Route(
            "GET",
            "/v1/models",
            listings.openai_models,
            ANY_KEY,
            tag="speech",
            summary="OpenAI's model list: served models and their aliases",
            answers={200: json_answer("Served models, then their aliases.", listings.ModelList)},
        ),
        Route(
            "GET",
            "/v1/audio/models",
            listings.audio_models,
            ANY_KEY,
            tag="speech",
            summary="Models as Open WebUI reads them",
            answers={200: json_answer("Served models and aliases.", listings.AudioModels)},
        ),
        Route(
            "GET",
            "/v1/audio/voices",
            listings.audio_voices,
            ANY_KEY,
            tag="speech",
            summary="Voices as Open WebUI reads them",
            answers={
                200: json_answer(
                    "Voices, then the voice aliases that resolve to them.", listings.AudioVoices
                )
            },
        ),
        address_read(
            ".marks",
            marks_by_key(MARKS_TYPE),
            tag="speech",
            summary="Speech marks of stored audio (Amazon Polly's NDJSON)",
            description="One JSON object per line: `time` (ms from the start of the audio), "
            "`type` (sentence, word, viseme), `start`/`end` (UTF-8 byte offsets into the text as "
            "normalized: the request's text with whitespace collapsed, or its SSML expansion's "
            "words) and `value`. Stored with the audio at synthesis; every format and rate of "
            "the same text has the same marks. A voice whose engine gives no alignment is a 400 "
            "naming it (docs/speech-marks.md).",
            params=(
                Param(
                    "types",
                    "query",
                    {"type": "string", "pattern": MARK_TYPES_PATTERN},
                    "Comma-separated mark types to keep (sentence, word, viseme, ssml); all "
                    "when absent.",
                    required=False,
                ),
            ),
            answers={200: Answer("The marks.", {MARKS_TYPE: TEXT})},
            common=(400, 404),
        ),
        address_read(
            ".vtt",
            captions_by_key(webvtt, VTT),
            tag="speech",
            summary="WebVTT captions of stored audio",
            description="One cue per phrase of at most 42 characters, cut between words and "
            "timed by the stored word marks; its text is the text's own (punctuation and case "
            "kept), escaped as WebVTT says.",
            answers={200: Answer("The captions.", {VTT: TEXT})},
            common=(400, 404),
        ),
        address_read(
            ".srt",
            captions_by_key(subrip, SRT),
            tag="speech",
            summary="SubRip captions of stored audio",
            description="As the WebVTT captions, in SubRip's numbered form (no escapes: an "
            "invisible word joiner keeps a `<`, `{\\` or `-->` in the text from being read as "
            "markup or a timing).",
            answers={200: Answer("The captions.", {SRT: TEXT})},
            common=(400, 404),
        ),
        address_read(
            ".{ext}",
            audio_by_key_ext,
            tag="telephony",
            summary="Stored audio in a telephony encoding (a transcode, never a synthesis)",
            description="`key` is any content address voxgate returned; the extension picks the "
            "encoding, made from the key's masters and stored.\n\n" + _extension_table(),
            params=(EXT_PARAM,),
            headers=(*CONDITIONS, RANGE, IF_RANGE),
            answers={
                200: player_answer("The audio (Cache-Control: public, max-age)."),
                206: partial(player_answer("")),
            },
            common=(304, 400, 404, 416),
        ),
        address_read(
            "",
            audio_by_key,
            tag="speech",
            summary="Stored audio by content key",
            description="Long-lived (max-age audio_max_age_s), not immutable: the bytes are one "
            "rendering of the key. Supports If-None-Match (304), a single byte Range (206; 416 "
            "when unsatisfiable) and If-Range.",
            headers=(IF_NONE_MATCH, RANGE, IF_RANGE),
            answers={
                200: audio_answer("The stored audio (Cache-Control: public, max-age)."),
                206: partial(audio_answer("")),
            },
            common=(304, 400, 404, 416),
        ),
        Route(
            "GET",
            "/v1/voices",
            voices,
            ANY_KEY,
            tag="speech",
            summary="Models, their voices, and the accepted aliases",
            answers={200: json_answer("The listing.", Voices)},
        ),
        Route(
            "GET",
            "/healthz",
            healthz,
            OPEN,
            tag="operations",
            summary="Liveness",
            probe=True,
            answers={200: json_answer("The process is up.", Health)},
        ),
        Route(
            "GET",
            "/readyz",
            readyz,
            OPEN,
            tag="operations",
            summary="Readiness: every model loaded and warmed",
            probe=True,
            answers={
                200: json_answer("Ready.", ops.Ready),
                503: json_answer("Loading.", ops.Ready),
            },
        ),
        Route(
            "GET",
            "/metrics",
            metrics_handler,
            # With keys on, the serving port's metrics need a key; a keyless scrape lives on
            # the ops listener (ops_port), open there unless metrics_auth.
            METRICS if settings.metrics_auth or settings.api_keys_file else OPEN,
            tag="operations",
            summary="Prometheus metrics (text exposition format)",
            answers={200: Answer("Metrics.", {"text/plain": TEXT})},
        ),
        coqui_get,
        coqui_post,
        Route(
            "GET",
            "/synthesize",
            synthesize,
            SPEAK,
            tag="compatible",
            summary="Query-string synthesis",
            query=models.synthesize,
            headers=(IF_NONE_MATCH,),
            answers={200: audio_answer("The audio.")},
            common=(304, 400, 429, 500, 502, 503),
        ),
        Route(
            "GET",
            "/openapi.json",
            openapi_document,
            OPEN,
            tag="operations",
            summary="The OpenAPI document",
            answers={200: json_answer("OpenAPI 3.2.")},
        ),
        Route(
            "POST",
            "/v1/prompts",
            ops.prompts,
            ADMIN,
            tag="operations",
            summary="Render and pin a prompt catalogue; returns each content address",
            description="Every prompt is validated (with `defaults` applied) before any is "
            "rendered. What it would pin is charged to the caller's pin quota first "
            "(pin_quota_mb_per_key for an API key, pin_quota_mb in all): past it the answer is "
            "413 `pin_quota_exceeded`, naming the limit and the numbers, and nothing is pinned.",
            body=Body(models.prompts),
            answers={
                200: json_answer(
                    "Each prompt's key, cache result and size; totals (with `pinned_entries` and "
                    "`pinned_bytes`: the bytes newly charged)."
                )
            },
            common=(400, 413, 503),
        ),
        Route(
            "GET",
            "/v1/prompts",
            ops.pinned_prompts,
            ANY_KEY,
            tag="operations",
            summary="The pinned prompts (POST /v1/prompts, voxgate warm)",
            description="Text (its first 1,000 characters), id, model, voice, format and content "
            "address of each, oldest first, the newest 4,096 (the studio plays them by key). One "
            "list for every gateway process of the host, or for every replica with Redis, kept "
            "over restarts (the pin registry).",
            answers={200: json_answer("The pinned prompts.", ops.PinnedPrompts)},
            common=(503,),
        ),
        Route(
            "GET",
            "/v1/takes",
            review.list_takes,
            ADMIN,
            tag="operations",
            summary="The refused takes kept for review (the quarantine)",
            description="Each take the checks refused: id, content address, model, voice, "
            "reasons, what was measured, when, and the text it should say; oldest first. One "
            "list for every gateway process of the host, bounded and expiring "
            "(docs/takes-review.md).",
            answers={200: json_answer("The refused takes.", review.RejectedTakes)},
        ),
        Route(
            "GET",
            "/v1/takes/{id}/audio",
            review.take_audio,
            ADMIN,
            tag="operations",
            summary="Listen to a refused take",
            params=(TAKE_ID,),
            answers={
                200: Answer(
                    "The take's audio, as it would have been stored.",
                    {m: BINARY for m in AUDIO_TYPES},
                )
            },
            common=(400, 404),
        ),
        Route(
            "POST",
            "/v1/takes/{id}/approve",
            review.approve_take,
            ADMIN,
            tag="operations",
            summary="Approve a refused take into the store under its key",
            description="No check runs: the admin heard it. Logged with the key.",
            params=(TAKE_ID,),
            answers={200: json_answer("Stored.", review.Settled)},
            common=(400, 404),
        ),
        Route(
            "POST",
            "/v1/takes/{id}/discard",
            review.discard_take,
            ADMIN,
            tag="operations",
            summary="Discard a refused take",
            params=(TAKE_ID,),
            answers={200: json_answer("Dropped.", review.Settled)},
            common=(400, 404),
        ),
        Route(
            "POST",
            "/",
            piper_speak,
            SPEAK,
            tag="compatible",
            summary="Piper's HTTP API: JSON body, WAV at the voice's rate",
            description="`length_scale` is mapped to speed (the voice's own length scale is speed "
            "1); noise scales are part of the content address.",
            body=Body(models.piper),
            headers=(IF_NONE_MATCH,),
            answers={200: audio_answer("WAV audio.")},
            common=(304, 400, 413, 500, 502, 503),
        ),
        Route(
            "GET",
            "/",
            studio,
            OPEN,
            tag="operations",
            summary="The prompt studio: a page to try text and SSML (docs/ssml.md)",
            description="One static HTML page with its script (no build step, nothing from a "
            "CDN). It calls only this API: POST /v1/audio/speech, POST /v1/ssml/explain, GET "
            "/v1/voices, GET /v1/prompts, GET /v1/audio/{key}.{ext}, the refused takes "
            "(GET /v1/takes, their audio, approve and discard: an admin key lists them) and the "
            "speech marks and "
            "captions of `/v1/audio/{key}.marks`, `.vtt`, `.srt` (each word highlighted as it "
            "plays), with the key typed into it when API keys are on. POST / is Piper's API.",
            answers={200: Answer("The page.", {"text/html": TEXT})},
        ),
        Route(
            "GET",
            "/voices",
            piper_voices,
            ANY_KEY,
            tag="compatible",
            summary="Piper's voice listing: {name: voice config}",
            answers={200: json_answer("The voices.")},
        ),
        Route(
            "GET",
            "/v1/say/{voice}/{text}.{ext}",
            say,
            SPEAK,
            tag="telephony",
            summary="Say URL: speak the text in the path",
            description=SAY_DESCRIPTION,
            params=say_params,
            headers=CONDITIONS,
            answers={200: player_answer("The audio.")},
            common=(304, 400, 500, 502, 503),
        ),
        Route(
            "GET",
            f"/v1/say/{SIGNED_SEGMENT}/{{token}}/{{voice}}/{{text}}.{{ext}}",
            say_signed,
            SIGNED,
            tag="telephony",
            summary="Signed say URL (needs no API key)",
            description=SAY_DESCRIPTION,
            params=(
                Param(
                    "token",
                    "path",
                    {"type": "string"},
                    "`{expires}~{key}~{mac}`: the expiry (Unix seconds), the name of the API key "
                    "that signed it (empty without a keys file), and HMAC-SHA256 "
                    "(url_signing_secret) over voice, text, extension, expiry and key. The URL is "
                    "charged to that key's budget (429 past it).",
                ),
                *say_params,
            ),
            headers=CONDITIONS,
            answers={200: player_answer("The audio.")},
            # (403: a signature that does not match or has expired.)
            common=(304, 400, 403, 429, 500, 502, 503),
        ),
        Route(
            "POST",
            "/v1/say/sign",
            sign_say_url,
            SPEAK,
            tag="telephony",
            summary="Sign a say URL",
            body=Body(models.sign),
            answers={200: json_answer("The signed URL.", SignedUrl)},
            common=(400, 403),
        ),
        Route(
            "POST",
            "/v1/jambonz/tts",
            jambonz_tts,
            SPEAK,
            tag="telephony",
            summary="jambonz custom TTS vendor",
            description="jambonz's request; answered as `jambonz_content_type`: "
            + ", ".join(f"`{media}`" for media in JAMBONZ_ENCODINGS)
            + " (raw 16-bit PCM at the rate named, or 8 kHz WAV); this server's is the one in "
            "the 200 answer's content.",
            body=Body(models.jambonz),
            answers={
                200: audio_answer(
                    "The audio, as `jambonz_content_type` (jambonz compares the string).",
                    (jambonz_media,),
                )
            },
            common=(400, 413, 500, 502, 503),
        ),
        Route(
            "GET",
            "/v1/jambonz/stream",
            jambonz_stream,
            SPEAK,
            tag="telephony",
            summary="jambonz streaming TTS (WebSocket)",
            description="Query `voice`, `language`, `sampleRate`. Server: "
            '`{"type":"connect","data":{"sample_rate","base64_encoding":false}}`, then binary '
            "16-bit PCM per sentence. Client: `stream` (text), `flush`, `stop`.",
            params=tuple(
                Param(name, "query", {"type": kind}, required=False)
                for name, kind in (
                    ("voice", "string"),
                    ("language", "string"),
                    ("sampleRate", "integer"),
                )
            ),
            answers={
                101: Answer("Switching to the WebSocket protocol."),
                200: Answer("Not sent: the connection upgrades (101)."),
            },
            common=(400,),
        ),
    )
    return RouteTable(routes, common_answers(settings))
