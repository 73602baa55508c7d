"""One typed settings object: defaults < TOML file < ``VOXGATE_*`` environment < command-line flags.

Built on pydantic-settings: each layer is one of its sources (flags are the init source), merged in
its order and validated by pydantic. Every field carries its help text (its docstring, which
pydantic reads from this file's source) and its group (:data:`GROUP_STARTS`); the README's settings
table, ``voxgate config show`` and the ``--help`` of every command are made from them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    SecretStr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources import DefaultSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from gateway.runtime.topology import Topology, resolve_topology

ENV_PREFIX = "VOXGATE_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)
# What OpenAI's names mean here; the user's aliases are added to these (and win on a clash).
DEFAULT_MODEL_ALIASES = dict.fromkeys(OPENAI_MODELS, "piper")
DEFAULT_VOICE_ALIASES = dict.fromkeys(OPENAI_VOICES, "joe")

REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)

# Settings by concern, in the order --help, the README and `voxgate config show` list them: each
# group's name, first setting and title. A group is its first setting and those declared after it,
# up to the next group's first.
_GROUP_TABLE = (
    ("server", "host", "Server: where and how the gateway listens"),
    ("http", "max_input_chars", "HTTP limits: what one request may ask for"),
    ("api", "default_model", "Request defaults and aliases"),
    ("cache", "cache_dir", "Cache tiers in this process and on local disk"),
    ("redis", "redis_url", "Redis tier shared by replicas"),
    ("synthesis", "piper_voices", "Synthesis: models, devices, queues and batches"),
    ("sentences", "sentence_pause_ms", "Sentences and streaming"),
    ("logging", "log_level", "Logging"),
    ("catalogue", "max_catalogue_prompts", "Prompt catalogues (voxgate warm, POST /v1/prompts)"),
    ("wyoming", "wyoming_port", "Wyoming protocol (Home Assistant)"),
    (
        "telephony",
        "public_url",
        "Telephony: PBX-playable URLs, HTTP caching, signed say URLs, jambonz",
    ),
    ("security", "api_keys_file", "Security: API keys, scopes and limits (docs/security.md)"),
)
GROUPS = {group: title for group, _, title in _GROUP_TABLE}
GROUP_STARTS = {first: group for group, first, _ in _GROUP_TABLE}


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the key."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/voxgate``, else ``~/.cache/voxgate``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxgate"


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    return value


def _alias_pairs(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    out: dict[str, str] = {}
    for pair in value.split(","):
        if not pair.strip():
            continue
        alias, sep, target = pair.partition("=")
        if not sep:
            raise ValueError("expected alias=target pairs, comma-separated")
        out[alias.strip()] = target.strip()
    return out


def _origins(value: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for origin in value:
        origin = origin.rstrip("/").lower()
        if origin != "*" and re.fullmatch(r"https?://[^/\s?#]+", origin) is None:
            raise ValueError(f"{origin!r} is not an origin (scheme://host[:port]) or *")
        out.append(origin)
    return tuple(out)


def _redis_scheme(value: SecretStr) -> SecretStr:
    url = value.get_secret_value()
    if url and url.split("://", 1)[0].lower() not in REDIS_SCHEMES:
        raise ValueError(
            "must start with redis://, rediss://, unix://, redis+cluster:// or redis+sentinel://"
        )
    return value


def _secret_length(value: SecretStr) -> SecretStr:
    secret = value.get_secret_value()
    if secret and len(secret.encode()) < 16:
        raise ValueError("must be at least 16 characters")
    return value


# Comma-separated in env and flags ("cpu,cuda:0"), a list in TOML. NoDecode: pydantic-settings
# would otherwise read a list-typed env value as JSON.
Names = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)]
Aliases = Annotated[dict[str, str], NoDecode, BeforeValidator(_alias_pairs)]
Device = Annotated[str, StringConstraints(pattern=r"^(cpu|cuda(:\d+)?)$")]
# The bounds most settings share (pydantic's own NonNegativeInt and PositiveFloat beside them).
AtLeastOne = Annotated[int, Field(ge=1)]
LongSecret = Annotated[SecretStr, AfterValidator(_secret_length)]


class Settings(BaseSettings):
    """Everything voxgate can be told. Field names map to env ``VOXGATE_<NAME>`` and flags.

    Build it with :meth:`load`; ``Settings(**values)`` gives defaults plus ``values`` only.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,  # VOXGATE_X= (empty) leaves the setting as it was
        extra="forbid",  # an unknown key in the TOML file is a mistake worth stopping for
        frozen=True,
        coerce_numbers_to_str=True,  # `redis_prefix = 7` in TOML means "7"
        validate_default=True,
        use_attribute_docstrings=True,  # each setting's help: the docstring below it
    )

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8080, ge=0, le=65535)
    """TCP port to listen on."""
    workers: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = "auto"
    """Gateway processes serving one port (SO_REUSEPORT); metrics are aggregated across them. auto:
    one per core when synthesis runs in worker processes (they share one pool per host), 1 when
    engines run in the gateway (synth_workers 0); the start log says what it chose and why."""
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    """Event loop of the server: uvloop, asyncio, or auto (uvloop when installed, else asyncio)."""
    shutdown_timeout_s: NonNegativeInt = 30
    """On SIGTERM, seconds to let in-flight requests finish before closing connections."""
    keepalive_timeout_s: PositiveFloat = 75.0
    """Seconds a connection may sit idle, before its first request or between requests, including
    one whose request headers have not all arrived (slow-header clients are dropped after it). Keep
    it above a reverse proxy's upstream idle timeout."""
    body_timeout_s: PositiveFloat = 30.0
    """Seconds a request body may take to arrive once its headers are in; beyond it a 408 and the
    connection is closed."""
    write_timeout_s: PositiveFloat = 30.0
    """Seconds one piece of a streamed answer (chunked audio, events, a WebSocket message, a Wyoming
    event) may wait for a slow reader to take it; beyond it the connection is dropped."""
    max_connections: AtLeastOne = 1024
    """Connections served at once per gateway process; one more is answered 503 and closed, except
    that 8 more may each ask for GET /healthz or /readyz (answered, then closed)."""
    ops_port: int = Field(0, ge=0, le=65535)
    """TCP port of the ops listener: GET /healthz, /readyz and /metrics only (anything else 404),
    outside max_connections, so probes and scrapes are answered under any flood of the serving
    port; the shipped Kubernetes, compose and Prometheus configs use it. /metrics there is open
    unless metrics_auth (the serving port's /metrics needs a key whenever API keys are on). 0: off
    (the probes answer on the serving port only)."""
    ops_host: str = ""
    """Address the ops listener listens on (empty: the same as host)."""
    share_port: bool = False
    """Let other servers listen on this gateway's HTTP, ops and Wyoming ports (SO_REUSEPORT: the kernel
    spreads connections over all of them, whatever their keys and models). false: serve refuses to
    start (exit 2) on a port anyone already serves, and no later server can join it."""
    max_unfinished_per_source: NonNegativeInt = 128
    """Connections one client address may hold open before sending its first request, per gateway
    process; one more is answered 503 and closed, so one client's idle sockets cannot take the
    whole max_connections. 0: no bound (behind a proxy every client has the proxy's address)."""
    fast_path: bool = True
    """Memory hits written by the gateway itself, and repeated requests on kept connections answered
    from their bytes before HTTP parsing (both read aiohttp internals); false: aiohttp writes every
    response, as it ships (the same bytes, more CPU per hit)."""

    max_input_chars: AtLeastOne = 4096
    """Longest input text accepted, in characters."""
    max_body_kb: AtLeastOne = 256
    """Largest request body accepted, in KiB."""
    max_audio_s: AtLeastOne = 600
    """Most seconds of audio one request may ask for, estimated up front from its characters
    (symbols, emoji and digits weigh more: they are read out) and its speed; beyond it a 400 naming
    this limit."""
    retry_after_s: NonNegativeInt = 1
    """Retry-After seconds sent with a 503 for a full queue."""

    default_model: str = "piper"
    """Model of requests that name none (voxgate say, catalogues, /api/tts, /synthesize); an OpenAI
    voice alias on another model speaks with that model's first voice."""
    default_voice: str = "joe"
    """Voice of requests that name none (voxgate say, catalogues, /api/tts)."""
    default_format: str = "mp3"
    """response_format when a request gives none (OpenAI's is mp3)."""
    model_aliases: Aliases = Field(default_factory=lambda: dict(DEFAULT_MODEL_ALIASES))
    """Model aliases added to OpenAI's names (tts-1, tts-1-hd, gpt-4o-mini-tts map to piper); an
    alias of the same name replaces OpenAI's. Env/flag form: alias=model,alias=model."""
    voice_aliases: Aliases = Field(default_factory=lambda: dict(DEFAULT_VOICE_ALIASES))
    """Voice aliases added to OpenAI's voices (alloy, ash, ... verse map to joe); an alias of the
    same name replaces OpenAI's. Env/flag form: alias=voice,alias=voice."""

    normalize: Literal["auto", "none", "llm", "numbers"] = "auto"
    """Text front end of requests that choose none (their `normalize` field): auto (each model's
    own: numbers for the Piper and Coqui voices and wyoming upstreams, none for a provider that
    reads digits itself, or as the upstream's `normalize` says; none for a voice of no known
    language), none (the text as it is), llm (Markdown emphasis, code fences, links, emoji and URLs
    made speakable before the content address is computed; docs/api.md) or numbers (numbers,
    amounts, dates, times and phone numbers written out in the voice's language; docs/ssml.md)."""
    ssml_max_depth: AtLeastOne = 32
    """Deepest element nesting an SSML document may have (docs/ssml.md)."""
    ssml_max_elements: AtLeastOne = 1000
    """Most elements an SSML document may have (docs/ssml.md)."""
    ssml_max_expanded_chars: AtLeastOne = 8192
    """Longest text an SSML document may expand to (say-as, sub), in characters."""
    ssml_unknown_tags: Literal["refuse", "strip"] = "refuse"
    """An SSML tag voxgate does not know: refuse (400) or strip (its text is spoken)."""
    strict_instructions: bool = False
    """Answer 400 to OpenAI's `instructions` on a model that cannot follow them (off: they are
    accepted, ignored, kept out of the content address, and named in X-Ignored-Fields)."""
    strict_fields: bool = False
    """Answer 400 to fields /v1/audio/speech does not know (off: they are ignored and named in
    X-Ignored-Fields, so fields that later OpenAI API versions add do not break clients)."""

    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Directory of the disk tier (diskcache)."""
    memory_cache_mb: NonNegativeInt = 256
    """Byte bound of the in-process LRU tier, in MiB (0 turns it off)."""
    disk_cache_mb: NonNegativeInt = 4096
    """Size bound of the disk tier, in MiB (0 turns it off)."""
    quarantine_takes: AtLeastOne = 200
    """Most refused takes kept for review under cache_dir/quarantine (the oldest go first;
    docs/takes-review.md)."""
    quarantine_mb: AtLeastOne = 64
    """Most MiB of refused takes kept for review (the oldest go first)."""
    quarantine_ttl_h: PositiveFloat = 168.0
    """Hours a refused take is kept for review before it is dropped."""

    redis_url: Annotated[SecretStr, AfterValidator(_redis_scheme)] = SecretStr("")
    """Redis shared by all replicas (empty: no Redis tier): redis://[user:password@]host:port/db,
    rediss:// (TLS), unix:///path.sock, redis+cluster://host:port for Redis Cluster, or
    redis+sentinel://host:26379[,host:port]/<service>/<db> for Sentinel. A secret: shown masked,
    never logged."""
    cache_secret: LongSecret = SecretStr("")
    """Key of the HMAC-SHA256 every Redis value and lock carries, and that names the rate-limit
    counters (at least 16 characters; required with redis_url; the same on every replica): a value
    written without it, or moved to another key, is never served. Generate one with `openssl rand
    -hex 32`. A secret: shown masked, never logged."""
    redis_prefix: str = "voxgate:"
    """Prefix of every Redis key voxgate writes."""
    redis_ttl_s: NonNegativeInt = 7 * 24 * 3600
    """TTL of unpinned Redis entries, in seconds (0: none; pinned: never)."""
    redis_max_entry_mb: AtLeastOne = 16
    """Largest entry written to or read from Redis, in MiB (a larger value is refused before it is
    buffered)."""
    redis_timeout_ms: AtLeastOne = 500
    """Timeout of one Redis operation, in ms (then: a miss)."""
    redis_breaker_failures: AtLeastOne = 5
    """Consecutive Redis failures that open the circuit breaker (Redis then skipped)."""
    redis_breaker_reset_ms: AtLeastOne = 2000
    """How long an open Redis breaker skips Redis before probing it again, in ms."""
    redis_lock_ttl_ms: int = Field(30000, ge=100)
    """TTL of a cross-replica synthesis lock (renewed while held), in ms."""
    redis_lock_wait_s: AtLeastOne = 60
    """Longest wait on another replica's synthesis before synthesizing here, in seconds."""
    redis_lean_reads: bool = True
    """Read entries over voxgate's own pipelined RESP reader (redis:// and unix:// URLs; half the
    CPU per GET of redis-py or less); false: through redis-py, like every other command."""

    piper_voices: Names = Field(("joe",), min_length=1)
    """Piper voices: 'joe' (bundled) or name=/path/model.onnx (config beside it),
    comma-separated."""
    coqui_model: str = ""
    """Coqui TTS model: a zoo name (e.g. tts_models/en/ljspeech/vits; Coqui downloads it once) or a
    local checkpoint path; empty serves no Coqui model."""
    coqui_config: str = ""
    """config.json of a local Coqui checkpoint (default: config.json beside the checkpoint)."""
    coqui_name: str = Field("coqui", min_length=1)
    """Model name the Coqui model is served under in the API."""
    coqui_mode: Literal["torch", "onnx", "int8", "fp16", "bf16"] = "torch"
    """Coqui execution mode: torch (eager fp32), onnx (Coqui's VITS ONNX export in ONNX Runtime),
    int8 (dynamic quantization of Linear/LSTM layers; a no-op for VITS), fp16 or bf16 (autocast;
    fp16 needs CUDA)."""
    speech_marks: bool = True
    """Compute speech marks (each word's time, from the engine's phoneme durations) beside synthesis
    for voices whose engine gives them (Piper; Coqui VITS): docs/speech-marks.md. false: no voice
    has marks, and audio made then has none after it is turned back on."""
    synthesis_precision: Literal["fp32", "int8"] = "fp32"
    """Precision of the ONNX Runtime graphs (Piper voices; Coqui in coqui_mode onnx): fp32, or int8
    (static QDQ quantization of the convolutions, derived once per model into cache_dir; its own
    content addresses). docs/synthesis.md has the measured speed and distance from fp32."""
    upstreams_file: str = ""
    """TOML file of upstreams: remote TTS services and other TTS servers (OpenAI or any
    OpenAI-compatible server, another voxgate) served as models of the same store, each under its
    own name ([[upstream]] entries: docs/upstreams.md); their tunables are reloaded on SIGHUP.
    Empty: none."""
    devices: Annotated[tuple[Device, ...], NoDecode, BeforeValidator(_comma_list)] = Field(
        ("cpu",), min_length=1
    )
    """Devices the engines run on, comma-separated: cpu, or cuda:0,cuda:1."""
    synth_workers: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    """Synthesis worker processes per model (0: engines run in-process threads). auto: one per core
    shared by the gateway processes (measured fastest for Piper), one per device on CUDA; voxgate
    tune measures this machine. On CUDA devices the pool has one worker per device."""
    synth_threads: AtLeastOne = 1
    """Batches one model runs at a time (in-process engine threads)."""
    intra_op_threads: Annotated[int, Field(ge=0)] | Literal["auto"] = "auto"
    """ONNX Runtime / torch threads per engine (auto or 0: cores / engines running at once)."""
    queue_size: AtLeastOne = 64
    """Synthesis items that may wait per model; beyond it a miss gets 503."""
    max_batch: NonNegativeInt = 0
    """Most items per engine batch (0: auto, 1 on CPU where batching measured slower, 8 on CUDA).
    Engines that cannot split a batch exactly (Piper, Coqui onnx) always run 1."""
    max_wait_ms: NonNegativeInt = 5
    """Milliseconds a batch waits for compatible items to join it (with max_batch > 1)."""
    batch_timeout_s: AtLeastOne = 120
    """Seconds one batch may run: a worker process past it is killed and replaced; an in-process
    engine's batch is abandoned (its thread cannot be killed) and answered 503. Also the longest a
    streamed jambonz sentence waits for its client's share before it fails."""
    queue_per_client: AtLeastOne = 16
    """Synthesis items one client (its API key's name when keys are on, else its address) may have
    waiting per model, so no one client fills the queue; beyond it a miss gets 429. At least
    max_parallel_sentences is used, so one long text never trips it alone."""
    renders_per_client: AtLeastOne = 16
    """Renditions one client may have in the making at once (each new text, format or sample rate it
    asks for: transcodes of stored audio, which no synthesis queue bounds, included); one more gets
    429 (render_share)."""
    take_checks: Literal["off", "signal", "asr"] = "signal"
    """Checks every new take (from every engine and upstream) passes before it is stored
    (docs/takes.md): signal (duration for the text and speed, speech present, no holes, clipping,
    NaN or DC offset; under a hundredth of a local synthesis's CPU), asr (signal plus a
    speech-recognition round trip for English voices; needs the asr extra), or off. A refused take
    is never stored or served."""
    take_limits: dict[str, dict[str, Any]] = Field(default_factory=lambda: {})
    """Take checks loosened per model or per voice: 'model' or 'model/voice' to the limits it
    changes (docs/takes.md lists them), e.g. {"piper/joe": {"max_hole_s": 3}, "openai": {"skip":
    ["speed_ignored"]}}: a voice whose long pause or whisper is intended. Env/flag form: JSON."""
    take_retries: int = Field(2, ge=0, le=5)
    """New takes drawn after a refused one (a provider is called again, billed); when these are
    refused too the request gets 502 take_rejected naming the reasons."""
    synth_max_reply_mb: AtLeastOne = 64
    """Largest reply a synthesis worker process may send for one batch, in MiB; a larger one is
    refused unread and the worker replaced."""
    loudness_lufs: Annotated[float, Field(ge=-40, le=-5)] | Literal["off"] = -18.0
    """Loudness every new sentence is brought to before it is stored, in LUFS (ITU-R BS.1770-4
    integrated loudness), local voices and upstreams alike, its true peak held at most -2.5 dBTP
    so that every rendition of speech (MP3, AAC, Opus, G.711, GSM, G.722 included) decodes at
    most -1 dBTP; -18 is AES TD1008's level for speech (docs/synthesis.md, "Loudness"). Part of
    every content address: a new target is new audio. off: each engine's own level, as before,
    with the addresses of before; it also keeps streaming pass-through of upstream pcm, which a
    target turns off (a sentence's gain needs the whole sentence)."""

    sentence_pause_ms: int = Field(250, ge=0, le=5000)
    """Silence between sentences when a text's per-sentence audio is joined, in ms."""
    max_parallel_sentences: AtLeastOne = 8
    """Sentences of one request submitted to the synthesis queue at the same time."""
    max_sentence_chars: int = Field(300, ge=20, le=100_000)
    """Longest sentence synthesized as one piece, in characters; a longer one is cut at clause, then
    word boundaries (each piece is its own cache entry)."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level: debug, info, warning, error."""
    log_format: Literal["json", "text"] = "json"
    """Log line format: json (one JSON object a line) or text (for a terminal)."""
    access_log: bool = True
    """Write one JSON line per request to stderr (buffered, <= 0.2 s)."""

    max_catalogue_prompts: AtLeastOne = 1000
    """Most prompts one POST /v1/prompts may carry."""
    catalogue_concurrency: AtLeastOne = 4
    """Prompts rendered at once by voxgate warm and POST /v1/prompts."""
    pin_quota_mb: NonNegativeInt = 1024
    """Most MiB pinned in all (POST /v1/prompts, voxgate warm), counted for the whole host, or for
    every replica with Redis: each pinned entry's size plus its record. A catalogue past it is
    refused (413) and pins nothing. Keep it below Redis's maxmemory."""
    revision_refresh_s: float = Field(10.0, ge=0, le=3600)
    """Seconds between two reads of the models' address revisions in the pin registry (what voxgate
    rollout switches): how soon a running gateway serves a rolled-out revision. 0: read at start
    only."""
    pin_quota_mb_per_key: NonNegativeInt = 256
    """Most MiB the pins of one API key may take (within pin_quota_mb); pins made without a key (no
    keys file, voxgate warm) are bounded by pin_quota_mb alone."""

    wyoming_port: int = Field(0, ge=0, le=65535)
    """TCP port of the Wyoming server Home Assistant connects to (0: off; wyoming-piper uses
    10200)."""
    wyoming_host: str = ""
    """Address the Wyoming server listens on (empty: the same as host). The protocol has no
    authentication: listen only where Home Assistant, and nobody else, can reach it."""
    wyoming_max_connections: AtLeastOne = 64
    """Wyoming connections served at once per gateway process; one more is sent an error event and
    closed."""
    wyoming_idle_timeout_s: PositiveFloat = 60.0
    """Seconds a Wyoming connection may wait for the client's next event (or for the rest of one it
    began); beyond it the connection is closed. Home Assistant opens a connection per utterance, and
    streams a reply's text as a language model writes it."""
    wyoming_samples_per_chunk: int = Field(1024, ge=64)
    """Samples in each audio-chunk event the Wyoming server sends."""

    public_url: str = Field("", pattern=r"^(https?://[^\s?#]+)?$")
    """Base URL players reach this gateway at (e.g. http://tts.example:8080): URLs returned by POST
    /v1/prompts and voxgate sign-url are absolute when set, paths when empty."""
    audio_max_age_s: NonNegativeInt = 31536000
    """Cache-Control max-age of content-address URLs (/v1/audio/{key}[.ext]): their bytes never
    change, so players may keep them long."""
    synthesis_max_age_s: NonNegativeInt = 86400
    """Cache-Control max-age of synthesis URLs players fetch with GET (/v1/say/..., /synthesize, GET
    /api/tts): a new model or voice changes what they answer."""
    url_signing_secret: SecretStr = SecretStr("")
    """HMAC key of signed say URLs (/v1/say/s/{signature}/...) for players that cannot send an API
    key; empty: signed URLs are refused. A secret: shown masked, never logged."""
    signed_url_ttl_s: AtLeastOne = 30 * 86400
    """Seconds a signed say URL stays valid when its signer names no expiry (POST /v1/say/sign
    without expires_in, voxgate sign-url without --expires-in). Every signed URL expires."""
    signed_url_max_s: AtLeastOne = 365 * 86400
    """Longest validity a signed say URL may be given, in seconds; a longer expires_in is a 400."""
    public_audio_urls: bool = True
    """With API keys on, content-address URLs (/v1/audio/{key}[.ext]) are read without a key: a key
    is a 256-bit capability only the gateway hands out."""
    jambonz_content_type: Literal["audio/l16;rate=8000", "audio/l16;rate=16000", "audio/wav"] = (
        "audio/l16;rate=8000"
    )
    """Encoding of POST /v1/jambonz/tts answers: raw 16-bit PCM at 8 or 16 kHz, or 8 kHz PCM WAV."""
    jambonz_unknown_voice: Literal["default", "reject"] = "default"
    """A jambonz voice (and language) that names no voice or alias: speak with the default voice, or
    reject it with 400."""

    api_keys_file: str = ""
    """TOML file of API keys (names, SHA-256 hashes of their secrets, scopes, per-minute limits;
    `voxgate keys add` writes it), reloaded on SIGHUP. Empty: no keys, every route is open."""
    api_keys_init: bool = False
    """At start, when api_keys_file does not exist, make it (0600) with a key named admin (scopes
    admin, speak, read) and print that key's secret once on stderr; the file holds hashes only. For
    a container's first start (the Docker image turns it on)."""
    api_keys_init_metrics_secret: LongSecret = SecretStr("")
    """With api_keys_init: the secret of a key named prometheus (scope metrics: GET /metrics only)
    put in the keys file it makes, for the Prometheus that scrapes with metrics_auth on (at least 16
    characters). A secret: shown masked, never logged."""
    require_json_content_type: bool = True
    """Routes whose body is JSON only (those with a 415 in /openapi.json) need Content-Type
    application/json, else 415: a browser page cannot send them cross-origin without a CORS
    preflight."""
    allowed_hosts: Annotated[Names, AfterValidator(lambda hs: tuple(h.lower() for h in hs))] = ()
    """Host names (Host header, port ignored) the gateway answers, comma-separated; another gets 421
    (against DNS rebinding). Empty: with a loopback host (the default) localhost, 127.0.0.1 and
    [::1] only, with any other host any name. *: any name."""
    cors_origins: Annotated[Names, AfterValidator(_origins)] = ()
    """Origins (https://app.example) whose browser pages may call the gateway, comma-separated;
    their preflights (OPTIONS) are answered. Empty: CORS off."""
    metrics_auth: bool = False
    """With API keys on, GET /metrics on the ops listener (ops_port) needs a key with the admin or
    metrics scope too. On the serving port it needs one whenever API keys are on; without keys it
    is open, like /healthz."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_int(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode takes `port = true` in TOML as 1; a boolean is never a count here.
        field = cls.model_fields[info.field_name] if info.field_name else None
        if isinstance(value, bool) and field is not None and _counts(field.annotation):
            raise ValueError("expected an integer, got a boolean")
        return value

    @field_validator("take_checks")
    @classmethod
    def _take_checks(cls, value: str) -> str:
        if value == "asr":
            import importlib.util

            if importlib.util.find_spec("pocketsphinx") is None:
                raise ValueError(
                    "asr needs pocketsphinx, which is not installed: pip install 'voxgate[asr]' "
                    "(or choose signal)"
                )
        return value

    @field_validator("take_limits", mode="before")
    @classmethod
    def _take_limits(cls, value: Any) -> Any:
        from synth.takecheck import Limits  # (numpy: not for every settings load)

        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        if not isinstance(value, dict):
            raise ValueError("expected a table of 'model' or 'model/voice' to limits")
        for name, limits in value.items():
            if not isinstance(limits, dict):
                raise ValueError(f"{name}: expected a table of limits")
            try:
                Limits.from_setting(limits)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return value

    @field_validator("public_url")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("cache_dir")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("model_aliases", "voice_aliases")
    @classmethod
    def _add_openai_names(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        openai = (
            DEFAULT_MODEL_ALIASES if info.field_name == "model_aliases" else DEFAULT_VOICE_ALIASES
        )
        return {**openai, **value}

    @field_validator("cache_secret")
    @classmethod
    def _secret_with_redis(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        # Without it anyone who can write to Redis decides what every replica serves.
        secret = value.get_secret_value()
        redis_url = info.data.get("redis_url")
        if isinstance(redis_url, SecretStr) and redis_url.get_secret_value() and not secret:
            raise ValueError(
                "required when redis_url is set: every Redis value is authenticated with it "
                "(--cache-secret or VOXGATE_CACHE_SECRET; the same on every replica; e.g. "
                "`openssl rand -hex 32`)"
            )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the arguments: a ``Settings(...)`` made in code (tests, :meth:`replace`) must not
        pick up a stray ``VOXGATE_*`` variable or ``.env`` file; :meth:`load` layers the rest."""
        return (init_settings,)

    @classmethod
    def names(cls) -> list[str]:
        """Field names in declaration order (grouped by concern)."""
        return list(cls.model_fields)

    @classmethod
    def group_of(cls, name: str) -> str:
        """The group (a key of :data:`GROUPS`) the setting ``name`` belongs to."""
        return _GROUP_OF[name]

    @classmethod
    def load(
        cls,
        *,
        config_file: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> Settings:
        """Build settings from defaults, then a TOML file, then env, then ``overrides`` (flags).

        The TOML file is ``config_file``, else ``$VOXGATE_CONFIG`` when set. Raises
        :class:`SettingsError` naming the key for any unknown key or unusable value.
        """
        env = os.environ if env is None else env
        path = config_file or env.get(CONFIG_ENV) or None
        flags = {k: v for k, v in (overrides or {}).items() if v is not None}
        # pydantic-settings merges its sources first to last, the first one winning.
        sources: tuple[PydanticBaseSettingsSource, ...] = (
            InitSettingsSource(cls, init_kwargs=flags),
            MappingEnvSource(cls, env),
            ConfigFileSource(cls, path),
            DefaultSettingsSource(cls),
        )
        try:
            # mypy sees the fields-only __init__ of pydantic's dataclass_transform, not
            # BaseSettings.__init__ and its documented underscore options.
            return cls(_build_sources=(sources, flags))  # type: ignore[call-arg]
        except ValidationError as exc:

            def origin(key: str) -> str:
                if key in flags:
                    return f"--{key.replace('_', '-')}"
                if env.get(ENV_PREFIX + key.upper()):
                    return ENV_PREFIX + key.upper()
                return str(path) if path else "default"

            raise SettingsError(_describe(exc, origin)) from None

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated)."""
        try:
            return type(self).model_validate({**dict(self), **changes})
        except ValidationError as exc:
            raise SettingsError(_describe(exc, lambda key: None)) from None

    def shown(self) -> dict[str, Any]:
        """The effective settings for display (JSON types), grouped in order, secrets masked."""
        out = self.model_dump(mode="json")
        for name, value in out.items():
            if isinstance(getattr(self, name), SecretStr) and value:
                out[name] = "****"
        return out

    def topology(self, cores: int | None = None) -> Topology:
        """Gateway processes, synthesis processes and threads, ``auto`` resolved for ``cores``
        (default: the cores this process may use)."""
        return resolve_topology(
            workers=self.workers,
            synth_workers=self.synth_workers,
            intra_op_threads=self.intra_op_threads,
            synth_threads=self.synth_threads,
            devices=self.devices,
            cores=cores,
        )

    def pool_workers(self) -> int:
        """Worker processes per model: one per CUDA device, else ``synth_workers`` (resolved)."""
        return self.topology().synth_workers

    def effective_max_batch(self) -> int:
        """``max_batch``, or what measured fastest on the device (CPU: 1, CUDA: 8)."""
        if self.max_batch:
            return self.max_batch
        return 8 if any(d.startswith("cuda") for d in self.devices) else 1


def _group_of_each(names: list[str]) -> dict[str, str]:
    group, out = "", {}
    for name in names:
        group = GROUP_STARTS.get(name, group)
        out[name] = group
    return out


_GROUP_OF = _group_of_each(Settings.names())
# Each help text is one line: its docstring breaks only where the source wraps it.
for _field in Settings.model_fields.values():
    _field.description = " ".join((_field.description or "").split())


class MappingEnvSource(EnvSettingsSource):
    """``VOXGATE_*`` variables read from a given mapping.

    Glue: the library's env source reads ``os.environ`` only; :meth:`Settings.load` takes the
    mapping as an argument so that tests and tools can load settings without the caller's
    environment leaking in. Parsing (prefix, empty values, case) stays the library's.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ  # read by _load_env_vars, which the base __init__ calls
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


class ConfigFileSource(TomlConfigSettingsSource):
    """The TOML settings file, its keys at the top level or under a ``[voxgate]`` table.

    Glue: the library's TOML source skips a missing file silently and takes one fixed table
    header; a file voxgate was told to read must exist and parse, and both layouts (a file of its
    own, or a ``[voxgate]`` table in a shared one) are accepted.
    """

    def __init__(self, settings_cls: type[BaseSettings], path: str | Path | None) -> None:
        if path is not None and not Path(path).is_file():
            raise SettingsError(f"config file {path}: no such file")
        super().__init__(settings_cls, toml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            with file_path.open("rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"config file {file_path}: {exc}") from exc
        table = data.get("voxgate")
        return table if isinstance(table, dict) else data


def _describe(exc: ValidationError, origin: Callable[[str], str | None]) -> str:
    """The problems, each naming the key and (when known) where its value came from."""
    lines: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        key = str(err["loc"][0]) if err["loc"] else "?"
        if key in lines:  # a bad list item also fails the list's length: the first says why
            continue
        where = origin(key)
        src = f" (from {where})" if where else ""
        if err["type"] == "extra_forbidden":
            lines[key] = f"unknown setting {key!r}{src}"
            continue
        msg = err["msg"].removeprefix("Value error, ")
        field = Settings.model_fields.get(key)
        # Never echo a secret's value: a Redis URL may carry a password.
        secret = field is None or field.annotation is SecretStr
        got = "" if secret else f" (got {err['input']!r})"
        lines[key] = f"setting {key!r}{src}: {msg}{got}"
    return "; ".join(lines.values())


def _counts(annotation: Any) -> bool:
    """True for a count field: ``int``, or a union with an (annotated) ``int`` in it."""
    if annotation is int:
        return True
    return any(_counts(get_args(arg)[0] if get_args(arg) else arg) for arg in get_args(annotation))


def _default_text(name: str) -> str:
    field = Settings.model_fields[name]
    if name == "cache_dir":
        return "$XDG_CACHE_HOME/voxgate or ~/.cache/voxgate"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, dict):
        return "OpenAI names" if value else "{}"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return str(value)


def settings_table() -> str:
    """The settings as Markdown, one table per group (the README's block, checked by a test)."""
    parts: list[str] = []
    for group, title in GROUPS.items():
        names = [n for n in Settings.names() if Settings.group_of(n) == group]
        rows = [f"**{title}**", "", "| setting | env | default | meaning |", "|---|---|---|---|"]
        for name in names:
            rows.append(
                f"| `--{name.replace('_', '-')}` | `{ENV_PREFIX}{name.upper()}` | "
                f"`{_default_text(name)}` | {Settings.model_fields[name].description} |"
            )
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


README_BLOCK = re.compile(
    r"(<!-- settings-table:start -->\n)(.*?)(\n<!-- settings-table:end -->)", re.S
)


def main(argv: list[str]) -> int:
    """Rewrite the settings block of the README at ``argv[0]`` (default README.md) from
    :func:`settings_table`: ``python -m gateway.runtime.settings README.md``."""
    path = Path(argv[0] if argv else "README.md")
    text = path.read_text(encoding="utf-8")
    if README_BLOCK.search(text) is None:
        print(f"{path}: no <!-- settings-table:start/end --> block", file=sys.stderr)
        return 1
    path.write_text(README_BLOCK.sub(lambda m: m[1] + settings_table() + m[3], text), "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
