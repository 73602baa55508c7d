"""The OpenAPI 3.1 description of the gateway, served at ``/openapi.json``.

Built from the same tables the server uses (formats, settings defaults and limits), so it cannot
drift from them; ``tests/test_openapi.py`` checks every registered route is described and that
``docs/openapi.json`` equals what a default server serves. Regenerate the saved copy with
``python -m gateway.http.openapi docs/openapi.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.api.parsing import MAX_RATE, MAX_SPEED, MIN_RATE, MIN_SPEED
from gateway.http import keys
from gateway.runtime.settings import OPENAI_MODELS, OPENAI_VOICES, Settings
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
        404: "NotFound",
        413: "PayloadTooLarge",
        416: "RangeNotSatisfiable",
        503: "Unavailable",
    }
    return {str(c): _ref("responses", names[c]) for c in codes}


def _audio_ok(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {
            "ETag": {
                "description": "The content key in quotes (strong).",
                "schema": {"type": "string"},
            },
            "X-Audio-Key": {
                "description": "Content key; `GET /v1/audio/{key}` serves the same bytes.",
                "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            },
            "X-Cache": {
                "description": "HIT (stored), MISS (synthesized for this request) or COALESCED "
                "(joined an identical request in flight).",
                "schema": {"type": "string", "enum": ["HIT", "MISS", "COALESCED"]},
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


def _query(name: str, description: str, schema: dict[str, Any], required: bool = False) -> Any:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


def build_openapi(settings: Settings) -> dict[str, Any]:
    """The OpenAPI 3.1 document for a server running with ``settings``."""
    formats = list(audio.FORMATS)
    streamable = [f.name for f in audio.FORMATS.values() if f.streamable]
    text_schema = {"type": "string", "minLength": 1, "maxLength": settings.max_input_chars}
    rate_schema = {"type": "integer", "minimum": MIN_RATE, "maximum": MAX_RATE}
    speed_schema = {"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED, "default": 1.0}
    cond_params = [_ref("parameters", "IfNoneMatch")]
    speech_body = {
        "type": "object",
        "additionalProperties": False,
        "required": ["model", "input", "voice"],
        "properties": {
            "model": {
                "type": "string",
                "description": "A served model (see /v1/voices) or an alias; OpenAI's names "
                f"({', '.join(OPENAI_MODELS)}) map to '{settings.default_model}' by default.",
            },
            "input": {**text_schema, "description": "Text to speak (split into sentences)."},
            "voice": {
                "type": "string",
                "description": "A voice of the model or an alias; OpenAI's voices "
                f"({', '.join(OPENAI_VOICES)}) map to '{settings.default_voice}' by default.",
            },
            "response_format": {
                "type": "string",
                "enum": formats,
                "default": settings.default_format,
                "description": "Output format; see the format table in the API description.",
            },
            "speed": speed_schema,
            "sample_rate": {
                **rate_schema,
                "description": "Output rate in Hz (resampled with soxr). Default: the voice's "
                "rate, 8000 for the G.711 formats; MP3/AAC/Opus round up to a rate their codec "
                "runs at.",
            },
            "stream": {
                "type": "boolean",
                "default": False,
                "description": "Chunked response, one chunk per sentence as it is ready. "
                f"Formats: {', '.join(streamable)}.",
            },
            "stream_format": {
                "type": "string",
                "enum": ["audio"],
                "description": "OpenAI's form of `stream: true` ('sse' is not supported).",
            },
            "instructions": {
                "type": "string",
                "description": "Accepted only when empty: the served models take no instructions.",
            },
        },
    }
    coqui_params = [
        _query("text", "Text to speak (or the `text` header).", text_schema),
        _query(
            "speaker_id",
            "Voice of the default model (or the `speaker-id` header); empty: the default voice.",
            {"type": "string"},
        ),
        _query(
            "language_id",
            "Empty, or the voice's language (`en_US` or `en`); else 400.",
            {"type": "string"},
        ),
        _query("style_wav", "Must be empty (no style transfer): else 400.", {"type": "string"}),
        _query("speaker_wav", "Must be empty (no voice cloning): else 400.", {"type": "string"}),
    ]
    coqui_form = {
        "type": "object",
        "properties": {p["name"]: p["schema"] for p in coqui_params},
        "additionalProperties": False,
    }
    tts_op = {
        "tags": ["compatible"],
        "summary": "Coqui tts-server compatible synthesis (WAV)",
        "description": "Fields come from headers (`text`, `speaker-id`, `language-id`, "
        "`style-wav`, `speaker-wav`), the query string, or a form (or JSON) body, as Coqui's "
        "server reads them. Any other field is a 400 naming it. Answers WAV (PCM16) at the "
        "voice's rate from the default model.",
        "parameters": [*coqui_params, *cond_params],
        "responses": {
            "200": _audio_ok("WAV audio."),
            "304": _ref("responses", "NotModified"),
            **_errors(400, 413, 503),
        },
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "voxgate",
            "version": VERSION,
            "summary": "A cached text-to-speech gateway.",
            "description": "Every audio response is content-addressed: the same text, voice, "
            "model weights, parameters, format and rate always give the same key and bytes.\n\n"
            "Formats:\n\n" + _format_table() + "\n\nErrors use OpenAI's shape "
            '`{"error": {"message", "type", "param", "code"}}`. HEAD is accepted wherever GET is.',
            "license": {"name": "GPL-3.0-or-later", "identifier": "GPL-3.0-or-later"},
        },
        "tags": [
            {"name": "speech", "description": "Text to speech."},
            {"name": "compatible", "description": "Request shapes of other TTS servers."},
            {"name": "operations", "description": "Health, readiness, metrics, this document."},
        ],
        "paths": {
            "/v1/audio/speech": {
                "post": {
                    "tags": ["speech"],
                    "summary": "OpenAI-compatible text to speech",
                    "description": "Long input is split into sentences; each is cached on its "
                    "own and only unseen ones are synthesized (in parallel), joined by a short "
                    "pause. With `stream` the response is chunked and sends each sentence as "
                    "soon as it is ready (WAV with an open-ended header, or raw PCM / G.711, "
                    "MP3 or AAC frames); the full audio is cached at the end. A matching "
                    "If-None-Match gets 304 (the content never changes for a key).",
                    "parameters": cond_params,
                    "requestBody": {
                        "required": True,
                        "content": {JSON: {"schema": _ref("schemas", "SpeechRequest")}},
                    },
                    "responses": {
                        "200": _audio_ok(
                            "The audio. Streamed responses use chunked transfer encoding and "
                            "carry no ETag or Content-Length."
                        ),
                        "304": _ref("responses", "NotModified"),
                        **_errors(400, 413, 503),
                    },
                }
            },
            "/v1/audio/{key}": {
                "get": {
                    "tags": ["speech"],
                    "summary": "Stored audio by content key",
                    "description": "Immutable. Supports If-None-Match (304), a single byte Range "
                    "(206; 416 when unsatisfiable) and If-Range.",
                    "parameters": [
                        {
                            "name": "key",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                        },
                        *cond_params,
                        _ref("parameters", "Range"),
                        _ref("parameters", "IfRange"),
                    ],
                    "responses": {
                        "200": _audio_ok("The stored audio (Cache-Control: immutable)."),
                        "206": {
                            "description": "The asked byte range; Content-Range says which.",
                            "headers": {"Content-Range": {"schema": {"type": "string"}}},
                            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                        },
                        "304": _ref("responses", "NotModified"),
                        **_errors(400, 404, 416),
                    },
                }
            },
            "/v1/voices": {
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
            },
            "/api/tts": {
                "get": {**tts_op, "operationId": "coquiTtsGet"},
                "post": {
                    **tts_op,
                    "operationId": "coquiTtsPost",
                    "requestBody": {
                        "required": False,
                        "content": {
                            "application/x-www-form-urlencoded": {"schema": coqui_form},
                            "multipart/form-data": {"schema": coqui_form},
                            JSON: {"schema": coqui_form},
                        },
                    },
                },
            },
            "/synthesize": {
                "get": {
                    "tags": ["compatible"],
                    "summary": "Query-string synthesis",
                    "parameters": [
                        _query("text", "Text to speak.", text_schema, required=True),
                        _query(
                            "speaker",
                            "Voice (or alias); default: the default voice.",
                            {"type": "string"},
                        ),
                        _query(
                            "model",
                            f"Model (or alias); default: '{settings.default_model}'.",
                            {"type": "string"},
                        ),
                        _query(
                            "format",
                            "Output format.",
                            {"type": "string", "enum": formats, "default": "wav"},
                        ),
                        _query("sample_rate", "Output rate in Hz.", rate_schema),
                        _query("speed", "Speaking rate.", speed_schema),
                        *cond_params,
                    ],
                    "responses": {
                        "200": _audio_ok("The audio."),
                        "304": _ref("responses", "NotModified"),
                        **_errors(400, 503),
                    },
                }
            },
            "/v1/prompts": {
                "post": {
                    "tags": ["operations"],
                    "summary": "Render and pin a prompt catalogue; returns each content address",
                    "requestBody": {
                        "required": True,
                        "content": {
                            JSON: {
                                "schema": {
                                    "type": "object",
                                    "required": ["prompts"],
                                    "properties": {
                                        "prompts": {
                                            "type": "array",
                                            "description": "Strings, or objects with input, "
                                            "voice, model, response_format, speed, sample_rate.",
                                            "items": {
                                                "oneOf": [{"type": "string"}, {"type": "object"}]
                                            },
                                        },
                                        "defaults": {
                                            "type": "object",
                                            "description": "Fields applied to every prompt.",
                                        },
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "Each prompt's key, cache result and size; totals.",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        },
                        **_errors(400, 413),
                    },
                }
            },
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
                            "description": "OpenAPI 3.1.",
                            "content": {JSON: {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "SpeechRequest": speech_body,
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["message", "type", "param", "code"],
                            "properties": {
                                "message": {
                                    "type": "string",
                                    "description": "Safe to show; never echoes the text.",
                                },
                                "type": {
                                    "type": "string",
                                    "enum": [
                                        "invalid_request_error",
                                        "not_found_error",
                                        "server_overloaded",
                                        "server_error",
                                    ],
                                },
                                "param": {
                                    "type": ["string", "null"],
                                    "description": "The field at fault.",
                                },
                                "code": {"type": ["string", "null"]},
                            },
                        }
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
                    },
                },
                "Ready": {
                    "type": "object",
                    "properties": {
                        "status": {"type": "string", "enum": ["ready", "degraded", "loading"]},
                        "models": {"type": "object", "additionalProperties": {"type": "boolean"}},
                        "tiers": {
                            "type": "object",
                            "description": "Per tier: state ok or degraded (still serving).",
                            "additionalProperties": {"type": "object"},
                        },
                    },
                },
            },
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
                "NotFound": {
                    "description": "No such audio key or route.",
                    "content": {JSON: {"schema": _ref("schemas", "Error")}},
                },
                "PayloadTooLarge": {
                    "description": f"Body over {settings.max_body_kb} KiB.",
                    "content": {JSON: {"schema": _ref("schemas", "Error")}},
                },
                "RangeNotSatisfiable": {
                    "description": "The range starts past the end; Content-Range: bytes */size.",
                    "headers": {"Content-Range": {"schema": {"type": "string"}}},
                    "content": {JSON: {"schema": _ref("schemas", "Error")}},
                },
                "Unavailable": {
                    "description": "Synthesis queue full, model loading, or engine unavailable; "
                    "retry after Retry-After seconds (stored audio is still served).",
                    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                    "content": {JSON: {"schema": _ref("schemas", "Error")}},
                },
            },
        },
    }
    return doc


def render(settings: Settings) -> str:
    """The document as saved under ``docs/`` (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(build_openapi(settings), indent=2, sort_keys=True) + "\n"


async def openapi_handler(request: web.Request) -> web.Response:
    """``GET /openapi.json``: this server's OpenAPI 3.1 description."""
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
