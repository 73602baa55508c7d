"""Typed application keys: all state lives on the app, none in module globals."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from cache.pins import PinRegistry
from cache.store import TieredStore
from gateway.api.parsing import ExpansionMemo, RequestMemo
from gateway.api.say import SayMemo
from gateway.http.hits import FAST_HITS as FAST_HITS
from gateway.http.hits import FastPath
from gateway.http.observe import RequestObserver
from gateway.http.presentation import Presentations
from gateway.http.requestid import REQUEST_ID as REQUEST_ID
from gateway.http.routing import RouteTable
from gateway.runtime.accesslog import AccessLog
from gateway.runtime.apikeys import Authenticator, KeyedSockets
from gateway.runtime.hostshare import HostTable
from gateway.runtime.ratelimit import KeyLimits
from gateway.runtime.settings import Settings
from gateway.speech.service import SpeechService
from gateway.speech.streamslots import ClientSlots
from gateway.speech.vocabulary import Vocabulary
from gateway.wyoming.server import WyomingServer
from metrics import Metrics

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
STORE = web.AppKey("store", TieredStore)
SPEECH = web.AppKey("speech", SpeechService)
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
ACCESS_LOG = web.AppKey("access_log", AccessLog)
REQUEST_MEMO = web.AppKey("request_memo", RequestMemo)
FAST_PATH = web.AppKey("fast_path", FastPath)
# What requests may name (set with SPEECH), and parsing's memo of SSML documents expanded.
VOCABULARY = web.AppKey("vocabulary", Vocabulary)
EXPANSIONS = web.AppKey("expansions", ExpansionMemo)
OBSERVER = web.AppKey("observer", RequestObserver)
# Set when the Wyoming server runs (wyoming_port).
WYOMING = web.AppKey("wyoming", WyomingServer)

# Per-request values the handlers leave for the edge wrapper (gateway.http.edge) to record.
CACHE_RESULT = web.RequestKey("cache_result", str)
AUDIO_KEY = web.RequestKey("audio_key", str)

# --- operations ---
# perf_counter() when a streamed response's headers were sent (time to first byte).
FIRST_BYTE_AT = web.RequestKey("first_byte_at", float)

# --- telephony ---
PRESENTATIONS = web.AppKey("presentations", Presentations)
SAY_MEMO = web.AppKey("say_memo", SayMemo)
# The prompt studio's page (GET /), read at start.
STUDIO_PAGE = web.AppKey("studio_page", bytes)
# The pin registry: what is pinned, for whom, the quota, the prompts' listing (GET /v1/prompts,
# the studio); one per host, or per Redis (cache.pins).
PINS = web.AppKey("pins", PinRegistry)

# --- trust ---
# Who is asking, for per-client shares: the API key's name once keys are checked (set by the
# authentication step), else the client's address (gateway.http.delivery.client_of).
CLIENT_NAME = web.RequestKey("client_name", str)
# The API keys in force (a ring that SIGHUP reloads; none without a keys file).
AUTH = web.AppKey("auth", Authenticator)
# Per-key request and character limits (shared through Redis when configured).
LIMITS = web.AppKey("limits", KeyLimits)
# WebSockets by the API key that opened them: a reload that removes the key closes them.
KEYED_SOCKETS = web.AppKey("keyed_sockets", KeyedSockets)
# Each client's streamed sentences being made at once in this process (within its shares).
STREAM_SLOTS = web.AppKey("stream_slots", ClientSlots)
# What the gateway processes of this host share without Redis: key budgets and queue shares.
HOST_TABLE = web.AppKey("host_table", HostTable)
# Origins whose browser pages may call the gateway (cors_origins; empty: CORS off).
CORS_ORIGINS = web.AppKey("cors_origins", frozenset[str])
# The routes the app registered (gateway.http.routes), and its OpenAPI document (GET
# /openapi.json), rendered from them on first use.
ROUTES = web.AppKey("routes", RouteTable)
# (A callable the app is given: gateway.http.openapi reads the table, whose module names the
# handler, so the handler cannot import the generator without an import cycle.)
OPENAPI = web.AppKey[Callable[[], bytes]]("openapi")
