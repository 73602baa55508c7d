"""The OpenAPI 3.2 description of the gateway, served at ``/openapi.json``.

Every request schema (bodies and query parameters: types, bounds, enums, required lists) is
generated from the request models the server validates with (:mod:`gateway.api.models`), and the
schemas of the bodies the code types (errors, readiness, the speech events) from those types
(:data:`TYPED_BODIES`); enums of values the code sends (X-Cache, formats, extensions) come from
the code's own tables. So the document states exactly what is enforced and sent; paths, prose and
the other responses are written here. 3.2, not 3.1, for ``itemSchema``: an event stream is
described event by event.

``tests/test_openapi.py`` checks every registered route is described and that
``docs/openapi.json`` equals what a default server serves; ``tests/test_request_schemas.py`` sends
each schema's boundary values; every JSON and event-stream body the suite's gateways answer is
validated against the document (``tests/conformance.py``). Regenerate the saved copy with
``python -m gateway.http.openapi docs/openapi.json``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import TypeAdapter

from gateway.api.jambonz import ENCODINGS as JAMBONZ_ENCODINGS
from gateway.api.models import SPEAKABLE, RequestModel, RequestModels, models_for
from gateway.http import keys, sse
from gateway.http.errors import Error
from gateway.http.ops import Ready
from gateway.http.requestid import MAX_LENGTH, REQUEST_ID_PATTERN
from gateway.runtime.settings import Settings
from gateway.speech.request import CACHE_RESULTS
from gateway.speech.telephony import EXTENSIONS
from synth import audio

VERSION = "0.1.0"

JSON = "application/json"


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _format_table() -> str:
    rows = [
        "| format | Content-Type | encoding | default rate | streams |",
        "|---|---|---|---|---|",
    ]
    for f in audio.FORMATS.values():
        rate = f"{f.default_rate} Hz" if f.default_rate else "the voice's"
        enc = f"{f.container or 'raw'} {f.subtype}"
        rows.append(
            f"| `{f.name}` | `{f.content_type}` | {enc} | {rate} | "
            f"{'yes' if f.streamable else 'no'} |"
        )
    return "\n".join(rows)


def _errors(*codes: int) -> dict[str, Any]:
    names = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        408: "RequestTimeout",
        413: "PayloadTooLarge",
        415: "UnsupportedMediaType",
        416: "RangeNotSatisfiable",
        421: "MisdirectedRequest",
        429: "TooManyRequests",
        500: "ServerError",
        502: "BadGateway",
        503: "Unavailable",
    }
    return {str(c): _ref("responses", names[c]) for c in codes}


def _audio_ok(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {
            "ETag": {
                "description": "The first 128 bits of the body's SHA-256, hex, in quotes "
                "(strong): it names these bytes, not the content key (another replica may "
                "hold other bytes for the same key).",
                "schema": {"type": "string"},
            },
            "X-Audio-Key": {
                "description": "Content key; `GET /v1/audio/{key}` serves the same bytes.",
                "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            },
            "X-Cache": {
                "description": "HIT (stored), MISS (synthesized for this request) or COALESCED "
                "(joined an identical request in flight).",
                "schema": {"type": "string", "enum": [c.upper() for c in CACHE_RESULTS]},
            },
            "X-Audio-Sample-Rate": {"schema": {"type": "integer"}},
            "Content-Length": {
                "description": "Sent on every non-streamed response.",
                "schema": {"type": "integer"},
            },
        },
        "content": {
            ct: {"schema": {"type": "string", "contentMediaType": ct}}
            for ct in sorted({f.content_type for f in audio.FORMATS.values()})
        },
    }


def _partial(whole: dict[str, Any]) -> dict[str, Any]:
    """The 206 answer of a route whose 200 is ``whole``: the asked bytes of the same audio."""
    return {
        "description": "The asked byte range of the audio; Content-Range says which.",
        "headers": {
            "Content-Range": {"schema": {"type": "string"}},
            **whole["headers"],
        },
        "content": whole["content"],
    }


def _speech_ok() -> dict[str, Any]:
    ok = _audio_ok(
        "The audio. Streamed responses use chunked transfer encoding and carry no ETag or "
        'Content-Length; with `stream_format: "sse"`, server-sent events.'
    )
    ok["headers"]["X-Ignored-Fields"] = {
        "description": "Fields accepted but without effect (`instructions`, unknown fields), "
        "comma-separated.",
        "schema": {"type": "string"},
    }
    ok["content"][sse.CONTENT_TYPE] = {
        "description": "One event per `data:` line (no `event:` line: the JSON's `type` "
        "names it): `speech.audio.delta` events, then `speech.audio.done`; or an `error` "
        "event, after which the connection is dropped.",
        "itemSchema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "string",
                    "contentMediaType": JSON,
                    "contentSchema": _ref("schemas", "SpeechStreamEvent"),
                },
                "event": {"type": "string", "const": "message"},
            },
        },
    }
    return ok


def _json_ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _listing_paths() -> dict[str, Any]:
    named = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
    }
    return {
        "/v1/models": {
            "get": {
                "tags": ["speech"],
                "summary": "OpenAI's model list: served models and their aliases",
                "responses": {
                    "200": _json_ok(
                        '`{"object": "list", "data": [{"id", "object": "model", "created", '
                        '"owned_by"}]}`',
                        {"type": "object"},
                    )
                },
            }
        },
        "/v1/audio/models": {
            "get": {
                "tags": ["speech"],
                "summary": "Models as Open WebUI reads them",
                "responses": {
                    "200": _json_ok(
                        "Served models and aliases.",
                        {
                            "type": "object",
                            "properties": {"models": {"type": "array", "items": named}},
                        },
                    )
                },
            }
        },
        "/v1/audio/voices": {
            "get": {
                "tags": ["speech"],
                "summary": "Voices as Open WebUI reads them",
                "responses": {
                    "200": _json_ok(
                        "Voices, then the voice aliases that resolve to them.",
                        {
                            "type": "object",
                            "properties": {"voices": {"type": "array", "items": named}},
                        },
                    ),
                },
            }
        },
    }


def _piper_paths(models: RequestModels) -> dict[str, Any]:
    body = _json_schema(models.piper)["title"]
    return {
        "/": {
            "post": {
                "tags": ["compatible"],
                "summary": "Piper's HTTP API: JSON body, WAV at the voice's rate",
                "description": "`length_scale` is mapped to speed (the voice's own length "
                "scale is speed 1); noise scales are part of the content address.",
                "parameters": COND_PARAMS,
                "requestBody": _json_body(body),
                "responses": {
                    "200": _audio_ok("WAV audio."),
                    "304": _ref("responses", "NotModified"),
                    **_errors(400, 413, 500, 502, 503),
                },
            }
        },
        "/voices": {
            "get": {
                "tags": ["compatible"],
                "summary": "Piper's voice listing: {name: voice config}",
                "responses": {"200": _json_ok("The voices.", {"type": "object"})},
            }
        },
    }


@functools.cache
def _schema_text(model: type[RequestModel]) -> str:
    return json.dumps(model.model_json_schema(ref_template="#/components/schemas/{model}"))


def _json_schema(model: type[RequestModel]) -> dict[str, Any]:
    """``model``'s JSON schema, references into the document's components (a fresh copy: pydantic
    takes milliseconds to generate one, and every document build asks for each a few times)."""
    schema: dict[str, Any] = json.loads(_schema_text(model))
    return schema


def _strip_titles(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic titles every property with its own name: noise in a document that names them."""
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def request_schemas(models: RequestModels) -> dict[str, Any]:
    """Every request model's JSON schema (and the models they refer to), by model title."""
    schemas: dict[str, Any] = {}
    for model in models.all():
        schema = _json_schema(model)
        for name, nested in schema.pop("$defs", {}).items():
            schemas[name] = _strip_titles(nested)
        schemas[schema["title"]] = _strip_titles(schema)
    return schemas


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query value is never JSON null: drop the null branch of an optional field's schema."""
    options = [o for o in schema.get("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
        if schema.get("default") is not None:
            rest["default"] = schema["default"]
        return {**options[0], **rest}
    return schema


def query_parameters(model: type[RequestModel]) -> list[Any]:
    """The query parameters of ``model``'s fields."""
    schema = _json_schema(model)
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema["properties"].items():
        prop = _without_null({k: v for k, v in prop.items() if k != "title"})
        description = prop.pop("description", "")
        params.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "description": description,
                "schema": prop,
            }
        )
    return params


COND_PARAMS = [_ref("parameters", "IfNoneMatch")]


def _info() -> dict[str, Any]:
    return {
        "title": "voxgate",
        "version": VERSION,
        "summary": "A cached text-to-speech gateway.",
        "description": "Every audio response is content-addressed: the same text, voice, "
        "model weights, parameters, format and rate always give the same key and bytes.\n\n"
        "Formats:\n\n" + _format_table() + "\n\nErrors use OpenAI's shape "
        '`{"error": {"message", "type", "param", "code"}}`. HEAD is accepted wherever GET is.',
        "license": {"name": "GPL-3.0-or-later", "identifier": "GPL-3.0-or-later"},
    }


def _json_body(schema_name: str) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": _ref("schemas", schema_name)}}}


def _speech_path() -> dict[str, Any]:
    return {
        "post": {
            "tags": ["speech"],
            "summary": "OpenAI-compatible text to speech",
            "description": "Long input is split into sentences; each is cached on its "
            "own and only unseen ones are synthesized (in parallel), joined by a short "
            "pause. With `stream` the response is chunked and sends each sentence as "
            "soon as it is ready (WAV with an open-ended header, or raw PCM / G.711, "
            "MP3 or AAC frames); the full audio is cached at the end. A matching "
            "If-None-Match gets 304 when it names the bytes stored now. With "
            '`stream_format: "sse"` the body is `text/event-stream`: `speech.audio.delta` '
            "events (base64 audio, in order, sentence by sentence) and a final "
            "`speech.audio.done` with `usage`. `instructions` and unknown fields are ignored "
            "and named in X-Ignored-Fields (400 with the strict_instructions / strict_fields "
            "settings). `pcm` is 24 kHz unless `sample_rate` says otherwise.",
            "parameters": COND_PARAMS,
            "requestBody": _json_body("SpeechRequest"),
            "responses": {
                "200": _speech_ok(),
                "304": _ref("responses", "NotModified"),
                **_errors(400, 413, 429, 500, 502, 503),
            },
        }
    }


def _coqui_path(models: RequestModels) -> dict[str, Any]:
    op = {
        "tags": ["compatible"],
        "summary": "Coqui tts-server compatible synthesis (WAV)",
        "description": "Fields come from headers (`text`, `speaker-id`, `language-id`, "
        "`style-wav`, `speaker-wav`), the query string, or a form (or JSON) body, as Coqui's "
        "server reads them; a header wins. Any other field is a 400 naming it. Answers WAV "
        "(PCM16) at the voice's rate from the default model.",
        "responses": {
            "200": _audio_ok("WAV audio."),
            "304": _ref("responses", "NotModified"),
            **_errors(400, 413, 429, 500, 502, 503),
        },
    }
    body = _ref("schemas", _json_schema(models.coqui)["title"])
    return {
        "get": {
            **op,
            "operationId": "coquiTtsGet",
            "parameters": [*query_parameters(models.coqui), *COND_PARAMS],
        },
        "post": {
            **op,
            "operationId": "coquiTtsPost",
            # The body carries the fields. (The query string and headers may too, as Coqui's
            # server reads them: said in the description, not as parameters, because a schema
            # cannot say "text in the body or in the query", and the body's schema needs it.)
            "parameters": COND_PARAMS,
            "requestBody": {
                "required": True,
                "content": {
                    "application/x-www-form-urlencoded": {"schema": body},
                    "multipart/form-data": {"schema": body},
                    JSON: {"schema": body},
                },
            },
        },
    }


def _synthesize_path(models: RequestModels) -> dict[str, Any]:
    return {
        "get": {
            "tags": ["compatible"],
            "summary": "Query-string synthesis",
            "parameters": [*query_parameters(models.synthesize), *COND_PARAMS],
            "responses": {
                "200": _audio_ok("The audio."),
                "304": _ref("responses", "NotModified"),
                **_errors(400, 429, 500, 502, 503),
            },
        }
    }


def _studio_path() -> dict[str, Any]:
    return {
        "get": {
            "tags": ["operations"],
            "summary": "The prompt studio: a page to try text and SSML (docs/ssml.md)",
            "description": "One static HTML page with its script (no build step, nothing "
            "from a CDN). It calls only this API: POST /v1/audio/speech, POST "
            "/v1/ssml/explain, GET /v1/voices, GET /v1/prompts and GET "
            "/v1/audio/{key}.{ext}, with the key typed into it when API keys are on. POST / "
            "is Piper's API.",
            "responses": {
                "200": {
                    "description": "The page.",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                }
            },
        }
    }


def _prompts_path() -> dict[str, Any]:
    return {
        "get": {
            "tags": ["operations"],
            "summary": "The pinned prompts (POST /v1/prompts, voxgate warm)",
            "description": "Text (its first 1,000 characters), id, model, voice, format and "
            "content address of each, oldest first, the newest 4,096 (the studio plays them by "
            "key). One list for every gateway process of the host, or for every replica with "
            "Redis, kept over restarts (the pin registry).",
            "responses": {
                "200": _json_ok(
                    "The pinned prompts.",
                    {
                        "type": "object",
                        "required": ["prompts"],
                        "properties": {
                            "prompts": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "key": {"type": "string"},
                                        "id": {"type": ["string", "null"]},
                                        "text": {"type": "string"},
                                        "model": {"type": "string"},
                                        "voice": {"type": "string"},
                                        "format": {"type": "string"},
                                        "sample_rate": {"type": ["integer", "null"]},
                                    },
                                },
                            }
                        },
                    },
                ),
                **_errors(503),
            },
        },
        "post": {
            "tags": ["operations"],
            "summary": "Render and pin a prompt catalogue; returns each content address",
            "description": "Every prompt is validated (with `defaults` applied) before any is "
            "rendered. What it would pin is charged to the caller's pin quota first "
            "(pin_quota_mb_per_key for an API key, pin_quota_mb in all): past it the answer is "
            "413 `pin_quota_exceeded`, naming the limit and the numbers, and nothing is pinned.",
            "requestBody": _json_body("PromptsRequest"),
            "responses": {
                "200": {
                    "description": "Each prompt's key, cache result and size; totals (with "
                    "`pinned_entries` and `pinned_bytes`: the bytes newly charged).",
                    "content": {JSON: {"schema": {"type": "object"}}},
                },
                **_errors(400, 413, 503),
            },
        },
    }


def _stored_audio_path() -> dict[str, Any]:
    return {
        "get": {
            "tags": ["speech"],
            "summary": "Stored audio by content key",
            "description": "Long-lived (max-age audio_max_age_s), not immutable: the bytes "
            "are one rendering of the key. Supports If-None-Match (304), a single byte Range "
            "(206; 416 when unsatisfiable) and If-Range.",
            "parameters": [
                {
                    "name": "key",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                },
                *COND_PARAMS,
                _ref("parameters", "Range"),
                _ref("parameters", "IfRange"),
            ],
            "responses": {
                "200": _audio_ok("The stored audio (Cache-Control: public, max-age)."),
                "206": _partial(_audio_ok("")),
                "304": _ref("responses", "NotModified"),
                **_errors(400, 404, 416),
            },
        }
    }


def _extension_table() -> str:
    rows = ["| ext | encoding | Content-Type |", "|---|---|---|"]
    for e in EXTENSIONS.values():
        rows.append(f"| `{e.name}` | {e.summary} | `{e.content_type}` |")
    return "\n".join(rows)


def _player_audio(description: str) -> dict[str, Any]:
    ok = _audio_ok(description)
    ok["headers"]["Cache-Control"] = {
        "description": "public, max-age=N (players keep a file only with max-age).",
        "schema": {"type": "string"},
    }
    ok["headers"]["Last-Modified"] = {
        "description": "When the audio was stored (If-Modified-Since answers 304).",
        "schema": {"type": "string"},
    }
    ok["content"] = {
        ct: {"schema": {"type": "string", "contentMediaType": ct}}
        for ct in sorted({e.content_type for e in EXTENSIONS.values()})
    }
    return ok


EXT_PARAM = {
    "name": "ext",
    "in": "path",
    "required": True,
    "description": "The encoding (table in this path's description).",
    "schema": {"type": "string", "enum": list(EXTENSIONS)},
}
CONDITIONS = [*COND_PARAMS, {"$ref": "#/components/parameters/IfModifiedSince"}]


def _jambonz_audio(settings: Settings) -> dict[str, Any]:
    ok = _audio_ok("The audio, as `jambonz_content_type` (jambonz compares the string).")
    media = settings.jambonz_content_type
    ok["content"] = {media: {"schema": {"type": "string", "contentMediaType": media}}}
    return ok


def _telephony_paths(settings: Settings) -> dict[str, Any]:
    say_params = [
        {
            "name": "voice",
            "in": "path",
            "required": True,
            "description": "A voice of the default model, or an alias.",
            "schema": {"type": "string"},
        },
        {
            "name": "text",
            "in": "path",
            "required": True,
            "description": "The text, percent-encoded as one path segment: `/` as %2F, `%` as "
            "%25, `?` as %3F, `#` as %23, `&` as %26; the extension follows the last `.`.",
            "schema": {
                "type": "string",
                "minLength": 1,
                "maxLength": settings.max_input_chars,
                "pattern": SPEAKABLE,
            },
        },
        EXT_PARAM,
        *CONDITIONS,
    ]
    say_responses: dict[str, Any] = {
        "200": _player_audio("The audio."),
        "304": _ref("responses", "NotModified"),
        **_errors(400, 500, 502, 503),
    }
    say: dict[str, Any] = {
        "tags": ["telephony"],
        "description": "Speaks `text` in `voice` as the extension's encoding, with no query "
        "string (Asterisk's Playback splits on `&`; FreeSWITCH reads the extension from the "
        "path's end). Cache-Control max-age is `synthesis_max_age_s`.\n\n" + _extension_table(),
        "responses": say_responses,
    }
    return {
        "/v1/audio/{key}.{ext}": {
            "get": {
                "tags": ["telephony"],
                "summary": "Stored audio in a telephony encoding (a transcode, never a synthesis)",
                "description": "`key` is any content address voxgate returned; the extension "
                "picks the encoding, made from the key's masters and stored.\n\n"
                + _extension_table(),
                "parameters": [
                    {
                        "name": "key",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    },
                    EXT_PARAM,
                    *CONDITIONS,
                    _ref("parameters", "Range"),
                    _ref("parameters", "IfRange"),
                ],
                "responses": {
                    "200": _player_audio("The audio (Cache-Control: public, max-age)."),
                    "206": _partial(_player_audio("")),
                    "304": _ref("responses", "NotModified"),
                    **_errors(400, 404, 416),
                },
            }
        },
        "/v1/say/{voice}/{text}.{ext}": {
            "get": {
                **say,
                "summary": "Say URL: speak the text in the path",
                "parameters": say_params,
            }
        },
        "/v1/say/s/{token}/{voice}/{text}.{ext}": {
            "get": {
                **say,
                "summary": "Signed say URL (needs no API key)",
                "parameters": [
                    {
                        "name": "token",
                        "in": "path",
                        "required": True,
                        "description": "`{expires}~{key}~{mac}`: the expiry (Unix seconds), "
                        "the name of the API key that signed it (empty without a keys file), "
                        "and HMAC-SHA256 (url_signing_secret) over voice, text, extension, "
                        "expiry and key. The URL is charged to that key's budget (429 past it).",
                        "schema": {"type": "string"},
                    },
                    *say_params,
                ],
                "responses": {**say_responses, **_errors(403, 429)},
            }
        },
        "/v1/say/sign": {
            "post": {
                "tags": ["telephony"],
                "summary": "Sign a say URL",
                "requestBody": _json_body("SignRequest"),
                "responses": {
                    "200": {
                        "description": "`url` (absolute with public_url), `path`, `expires`.",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                    **_errors(400, 403, 413),
                },
            }
        },
        "/v1/jambonz/tts": {
            "post": {
                "tags": ["telephony"],
                "summary": "jambonz custom TTS vendor",
                "description": "jambonz's request; answered as `jambonz_content_type`: "
                + ", ".join(f"`{media}`" for media in JAMBONZ_ENCODINGS)
                + " (raw 16-bit PCM at the rate named, or 8 kHz WAV); "
                "this server's is the one in the 200 answer's content.",
                "requestBody": _json_body("JambonzRequest"),
                "responses": {
                    "200": _jambonz_audio(settings),
                    **_errors(400, 413, 500, 502, 503),
                },
            }
        },
        "/v1/jambonz/stream": {
            "get": {
                "tags": ["telephony"],
                "summary": "jambonz streaming TTS (WebSocket)",
                "description": "Query `voice`, `language`, `sampleRate`. Server: "
                '`{"type":"connect","data":{"sample_rate","base64_encoding":false}}`, then '
                "binary 16-bit PCM per sentence. Client: `stream` (text), `flush`, `stop`.",
                "parameters": [
                    {"name": n, "in": "query", "required": False, "schema": {"type": t}}
                    for n, t in (
                        ("voice", "string"),
                        ("language", "string"),
                        ("sampleRate", "integer"),
                    )
                ],
                "responses": {
                    "101": {"description": "Switching to the WebSocket protocol."},
                    "200": {"description": "Not sent: the connection upgrades (101)."},
                    **_errors(400),
                },
            }
        },
    }


def _explain_path() -> dict[str, Any]:
    return {
        "post": {
            "tags": ["speech"],
            "summary": "What a speech request would say, and its content address",
            "description": "Takes the body of POST /v1/audio/speech and synthesizes nothing: "
            "answers the SSML expansion (segments of words, the pause after them and their "
            "rate; docs/ssml.md), the sentences it is made of (each one cached master) with "
            "the pause before each, and `key`, the X-Audio-Key the speech request would "
            "answer with. A document is refused here exactly as there.",
            "requestBody": _json_body("SpeechRequest"),
            "responses": {
                "200": _json_ok("The expansion and address.", _ref("schemas", "Explanation")),
                **_errors(400, 413),
            },
        }
    }


def _voices_path() -> dict[str, Any]:
    return {
        "get": {
            "tags": ["speech"],
            "summary": "Models, their voices, and the accepted aliases",
            "responses": {
                "200": {
                    "description": "The listing.",
                    "content": {JSON: {"schema": _ref("schemas", "Voices")}},
                }
            },
        }
    }


def _operations_paths() -> dict[str, Any]:
    return {
        "/healthz": {
            "get": {
                "tags": ["operations"],
                "summary": "Liveness",
                "responses": {
                    "200": {
                        "description": "The process is up.",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/readyz": {
            "get": {
                "tags": ["operations"],
                "summary": "Readiness: every model loaded and warmed",
                "responses": {
                    "200": {
                        "description": "Ready.",
                        "content": {JSON: {"schema": _ref("schemas", "Ready")}},
                    },
                    "503": {
                        "description": "Loading.",
                        "content": {JSON: {"schema": _ref("schemas", "Ready")}},
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "tags": ["operations"],
                "summary": "Prometheus metrics (text exposition format)",
                "responses": {
                    "200": {
                        "description": "Metrics.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "tags": ["operations"],
                "summary": "This document",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.2.",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }


def _response_schemas() -> dict[str, Any]:
    """The schemas of response bodies (hand-written: the server builds these, clients read them)."""
    key = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
    return {
        "Explanation": {
            "type": "object",
            "required": ["key", "master", "text", "expansion", "sentences", "pause_after_ms"],
            "properties": {
                "key": {**key, "description": "The X-Audio-Key of the speech answer."},
                "master": {**key, "description": "The format-free address it derives from."},
                "model": {"type": "string"},
                "voice": {"type": "string"},
                "format": {"type": "string"},
                "sample_rate": {"type": "integer"},
                "text": {"type": "string", "description": "The words, joined."},
                "expansion": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "words": {"type": "string"},
                            "pause_ms": {
                                "type": ["integer", "null"],
                                "description": "Silence after; null: the sentence pause.",
                            },
                            "rate": {"type": "number"},
                            "phonemes": {"type": "boolean"},
                        },
                    },
                },
                "sentences": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "text": {"type": "string"},
                            "speed": {"type": "number"},
                            "phonemes": {"type": "boolean"},
                            "pause_before_ms": {"type": "integer"},
                            "master": key,
                        },
                    },
                },
                "pause_after_ms": {"type": "integer"},
                "estimated_audio_s": {"type": "number"},
            },
        },
        "Voices": {
            "type": "object",
            "properties": {
                "models": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "ready": {"type": "boolean"},
                            "sample_rate": {"type": "integer"},
                            "voices": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "id": {"type": "string"},
                                        "language": {"type": "string"},
                                        "description": {"type": "string"},
                                    },
                                },
                            },
                            "execution": {"type": "object"},
                        },
                    },
                },
                "model_aliases": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                },
                "voice_aliases": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                },
                "formats": {
                    "type": "object",
                    "description": "Per response_format: its Content-Type, its rate when no "
                    "sample_rate is asked (null: the voice's; pcm: 24000), whether it streams.",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "content_type": {"type": "string"},
                            "default_sample_rate": {"type": ["integer", "null"]},
                            "streamable": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    }


# The response bodies the code types (gateway.http.errors, .ops, .sse): their schemas are
# generated from those types, so a value the code can send is a value the document allows.
TYPED_BODIES: tuple[type, ...] = (Error, Ready, *sse.EVENTS)


def typed_schemas() -> dict[str, Any]:
    """The schemas of :data:`TYPED_BODIES` and the types they contain, by type name; and
    ``SpeechStreamEvent``, any one of the speech events (told apart by ``type``)."""
    schemas: dict[str, Any] = json.loads(_typed_schemas_text())
    return schemas


@functools.cache
def _typed_schemas_text() -> str:
    _, defs = TypeAdapter.json_schemas(
        [(t, "serialization", TypeAdapter(t)) for t in TYPED_BODIES],
        ref_template="#/components/schemas/{model}",
    )
    schemas = {name: _strip_titles(schema) for name, schema in defs["$defs"].items()}
    for schema in schemas.values():  # docstrings mark code ``so``; the document's Markdown `so`
        if "description" in schema:
            schema["description"] = schema["description"].replace("``", "`")
    events = {t.__name__: schemas[t.__name__]["properties"]["type"]["const"] for t in sse.EVENTS}
    schemas["SpeechStreamEvent"] = {
        "oneOf": [_ref("schemas", name) for name in events],
        "discriminator": {
            "propertyName": "type",
            "mapping": {kind: f"#/components/schemas/{name}" for name, kind in events.items()},
        },
    }
    return json.dumps(schemas)


def _components(settings: Settings, models: RequestModels) -> dict[str, Any]:
    return {
        "schemas": {**request_schemas(models), **_response_schemas(), **typed_schemas()},
        "parameters": {
            "IfNoneMatch": {
                "name": "If-None-Match",
                "in": "header",
                "description": "ETags (or `*`) the client holds; a match answers 304.",
                "schema": {"type": "string"},
            },
            "Range": {
                "name": "Range",
                "in": "header",
                "description": "One byte range: `bytes=first-last`, `bytes=first-` or "
                "`bytes=-suffix`. Several ranges are answered with the whole entity.",
                "schema": {"type": "string"},
            },
            "IfModifiedSince": {
                "name": "If-Modified-Since",
                "in": "header",
                "description": "An HTTP date at or after Last-Modified answers 304 (ignored "
                "with If-None-Match).",
                "schema": {"type": "string"},
            },
            "IfRange": {
                "name": "If-Range",
                "in": "header",
                "description": "Honour Range only if this is the current ETag.",
                "schema": {"type": "string"},
            },
        },
        "responses": {
            "NotModified": {
                "description": "The client's copy (If-None-Match) is current.",
                "headers": {"ETag": {"schema": {"type": "string"}}},
            },
            "BadRequest": {
                "description": "Invalid request: `param` names the field (unknown fields, "
                "unsupported formats and stream formats, out-of-range values, bad JSON).",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "Unauthorized": {
                "description": "API keys are on and the request sent no key, or one the gateway "
                "does not know (docs/security.md).",
                "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "UnsupportedMediaType": {
                "description": "The body was not sent as `Content-Type: application/json`.",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "Forbidden": {
                "description": "The API key lacks the route's scope; or a signed say URL whose "
                "signature does not match or has expired, or signing is off.",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "NotFound": {
                "description": "No such audio key or route.",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "RequestTimeout": {
                "description": f"The body did not arrive within {settings.body_timeout_s:g} s "
                "(`body_timeout_s`); the connection is closed.",
                "headers": {"Connection": {"schema": {"type": "string", "const": "close"}}},
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "PayloadTooLarge": {
                "description": f"Body over {settings.max_body_kb} KiB.",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "MisdirectedRequest": {
                "description": "The Host header names a host this gateway does not serve "
                "(`allowed_hosts`).",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "RangeNotSatisfiable": {
                "description": "The range starts past the end; Content-Range: bytes */size.",
                "headers": {"Content-Range": {"schema": {"type": "string"}}},
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "TooManyRequests": {
                "description": "This client already has its share of the synthesis queue "
                "waiting (`queue_per_client`), or its API key is over its requests or "
                "characters per minute; retry after Retry-After seconds.",
                "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "ServerError": {
                "description": "The engine failed this request (`engine_error`); nothing was "
                "stored, so a retry synthesizes again.",
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "BadGateway": {
                "description": "An upstream (a remote TTS provider served as a model) failed "
                "this request after its retries, or refused voxgate's credentials; the message "
                "names the upstream. Nothing was stored: a retry asks it again.",
                "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
            "Unavailable": {
                "description": "Synthesis queue full, model loading, engine unavailable, or an "
                "upstream unavailable (down, rate limiting, its breaker open); "
                "retry after Retry-After seconds (stored audio is still served).",
                "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                "content": {JSON: {"schema": _ref("schemas", "Error")}},
            },
        },
    }


def build_openapi(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.2 document for a server running with ``settings``."""
    models = models_for(settings)
    doc: dict[str, Any] = {
        "openapi": "3.2.0",
        "info": _info(),
        "tags": [
            {"name": "speech", "description": "Text to speech."},
            {"name": "compatible", "description": "Request shapes of other TTS servers."},
            {
                "name": "telephony",
                "description": "URLs PBXs play (Asterisk, FreeSWITCH, Twilio) and jambonz.",
            },
            {"name": "operations", "description": "Health, readiness, metrics, this document."},
        ],
        "paths": {
            "/v1/audio/speech": _speech_path(),
            "/v1/ssml/explain": _explain_path(),
            "/v1/audio/{key}": _stored_audio_path(),
            "/v1/voices": _voices_path(),
            "/api/tts": _coqui_path(models),
            "/synthesize": _synthesize_path(models),
            "/v1/prompts": _prompts_path(),
            **_listing_paths(),
            **_piper_paths(models),
            **_telephony_paths(settings),
            **_operations_paths(),
        },
        "components": _components(settings, models),
    }
    doc["paths"]["/"].update(_studio_path())  # GET / is the studio, POST / Piper's API
    _add_access(doc["paths"], settings)
    _add_request_ids(doc)
    doc["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key's secret (OpenAI clients send their `api_key` so).",
        },
        "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    }
    return doc


# What operations ask of their caller, as gateway.http.app registers them (docs/security.md):
# open ones never need a key; every other takes one when the server has a keys file (hence the
# empty alternative: a server without one asks for none). The JSON-only bodies answer 415.
_OPEN = {("/healthz", "get"), ("/readyz", "get"), ("/openapi.json", "get"), ("/", "get")}
_SIGNED = "/v1/say/s/"
_JSON_BODIES = {
    ("/v1/audio/speech", "post"),
    ("/v1/ssml/explain", "post"),
    ("/v1/prompts", "post"),
    ("/v1/say/sign", "post"),
    ("/v1/jambonz/tts", "post"),
    ("/v1/ssml/explain", "post"),
    ("/", "post"),
}


def _add_access(paths: dict[str, Any], settings: Settings) -> None:
    open_ops = _OPEN | (set() if settings.metrics_auth else {("/metrics", "get")})
    for path, item in paths.items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            responses = op["responses"]
            if settings.allowed_hosts:  # every route is behind the Host allow-list
                responses.update(_errors(421))
            if "requestBody" in op:  # a body that does not arrive within body_timeout_s
                responses.update(_errors(408))
            if (path, method) in _JSON_BODIES:
                responses.update(_errors(415))
            if (path, method) in open_ops or path.startswith(_SIGNED):
                continue
            op["security"] = [{"bearer": []}, {"apiKey": []}, {}]
            responses.update(_errors(401, 403, 429))


def _add_request_ids(doc: dict[str, Any]) -> None:
    """``X-Request-Id`` on every response (gateway.http.requestid): the operations' own and the
    shared ones they refer to."""
    doc["components"]["headers"] = {
        "RequestId": {
            "description": "The request's X-Request-Id when it sent one of at most "
            f"{MAX_LENGTH} characters from A-Z a-z 0-9 . _ : + / = -; else one the gateway "
            "made. The access log names it too.",
            "schema": {"type": "string", "pattern": REQUEST_ID_PATTERN},
        }
    }
    ref = _ref("headers", "RequestId")
    answers = [
        r
        for item in doc["paths"].values()
        for op in item.values()
        if isinstance(op, dict)
        for r in op.get("responses", {}).values()
    ]
    for response in [*answers, *doc["components"]["responses"].values()]:
        if "$ref" not in response:
            response.setdefault("headers", {})["X-Request-Id"] = ref


def render(settings: Settings) -> str:
    """The document as saved under ``docs/`` (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(build_openapi(settings), indent=2, sort_keys=True) + "\n"


async def openapi_handler(request: web.Request) -> web.Response:
    """``GET /openapi.json``: this server's OpenAPI 3.2 description."""
    body = render(request.app[keys.SETTINGS]).encode()
    return web.Response(body=body, content_type="application/json")


def main(argv: list[str]) -> int:
    """Write the document for the default settings to ``argv[0]`` (or stdout)."""
    text = render(Settings.load(env={}))
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
