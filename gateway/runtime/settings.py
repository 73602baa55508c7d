"""One typed settings object: defaults < TOML file < ``VOXGATE_*`` environment < command-line flags.

Every field documents itself (``metadata["help"]``); the README's settings table and
``voxgate config show`` are made from the same list.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

ENV_PREFIX = "VOXGATE_"

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


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the key."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/voxgate``, else ``~/.cache/voxgate``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxgate"


def _opt(default: Any, help: str, *, secret: bool = False, **kw: Any) -> Any:
    meta = {"help": help, "secret": secret}
    if callable(default) and not isinstance(default, type):
        return field(default_factory=default, metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass(frozen=True)
class Settings:
    """Everything voxgate can be told. Field names map to env ``VOXGATE_<NAME>`` and flags."""

    host: str = _opt("127.0.0.1", "Address to listen on.")
    port: int = _opt(8080, "TCP port to listen on.")
    cache_dir: Path = _opt(default_cache_dir, "Directory of the disk tier (diskcache).")
    memory_cache_mb: int = _opt(
        256, "Byte bound of the in-process LRU tier, in MiB (0 turns it off)."
    )
    disk_cache_mb: int = _opt(4096, "Size bound of the disk tier, in MiB (0 turns it off).")
    piper_voices: tuple[str, ...] = _opt(
        ("joe",),
        "Piper voices: 'joe' (bundled) or name=/path/model.onnx (config beside it), comma-separated.",
    )
    default_model: str = _opt("piper", "Model used when a request names an alias of no model.")
    default_voice: str = _opt("joe", "Voice the OpenAI voice aliases map to by default.")
    default_format: str = _opt(
        "mp3", "response_format when a request gives none (OpenAI's is mp3)."
    )
    model_aliases: dict[str, str] = _opt(
        lambda: dict.fromkeys(OPENAI_MODELS, "piper"),
        "Extra model names accepted as aliases (OpenAI's names map to piper by default); "
        "env/flag form: alias=model,alias=model.",
    )
    voice_aliases: dict[str, str] = _opt(
        lambda: dict.fromkeys(OPENAI_VOICES, "joe"),
        "Extra voice names accepted as aliases (OpenAI's voices map to joe by default).",
    )
    max_input_chars: int = _opt(4096, "Longest input text accepted, in characters.")
    max_body_kb: int = _opt(256, "Largest request body accepted, in KiB.")
    queue_size: int = _opt(
        64, "Synthesis items that may wait per model; beyond it a miss gets 503."
    )
    synth_threads: int = _opt(1, "Batches one model runs at a time (in-process engine threads).")
    intra_op_threads: int = _opt(0, "ONNX Runtime / torch threads per engine (0: cores / workers).")
    retry_after_s: int = _opt(1, "Retry-After seconds sent with a 503 for a full queue.")
    log_level: str = _opt("info", "Log level: debug, info, warning, error.")
    access_log: bool = _opt(True, "Write one JSON line per request to stderr (buffered, <= 0.2 s).")

    # --- sentences and streaming (issue 5) ---
    sentence_pause_ms: int = _opt(
        250, "Silence between sentences when a text's per-sentence audio is joined, in ms."
    )
    max_parallel_sentences: int = _opt(
        8, "Sentences of one request submitted to the synthesis queue at the same time."
    )

    # --- synthesis backend (issue 3) ---
    coqui_model: str = _opt(
        "",
        "Coqui TTS model: a zoo name (e.g. tts_models/en/ljspeech/vits; Coqui downloads it once) "
        "or a local checkpoint path; empty serves no Coqui model.",
    )
    coqui_config: str = _opt(
        "", "config.json of a local Coqui checkpoint (default: config.json beside the checkpoint)."
    )
    coqui_name: str = _opt("coqui", "Model name the Coqui model is served under in the API.")
    coqui_mode: str = _opt(
        "torch",
        "Coqui execution mode: torch (eager fp32), onnx (Coqui's VITS ONNX export in ONNX "
        "Runtime), int8 (dynamic quantization of Linear/LSTM layers; a no-op for VITS), "
        "fp16 or bf16 (autocast; fp16 needs CUDA).",
    )
    synth_workers: int = _opt(
        0,
        "Synthesis worker processes per model (0: engines run in-process threads). On CUDA "
        "devices the pool has one worker per device.",
    )
    devices: tuple[str, ...] = _opt(
        ("cpu",), "Devices the engines run on, comma-separated: cpu, or cuda:0,cuda:1."
    )
    max_batch: int = _opt(
        0,
        "Most items per engine batch (0: auto, 1 on CPU where batching measured slower, 8 on "
        "CUDA). Engines that cannot split a batch exactly (Piper, Coqui onnx) always run 1.",
    )
    max_wait_ms: int = _opt(
        5, "Milliseconds a batch waits for compatible items to join it (with max_batch > 1)."
    )
    batch_timeout_s: int = _opt(
        120, "Seconds a worker may spend on one batch before it is killed and replaced."
    )

    # --- Redis tier and scale-out (issue 4) ---
    redis_url: str = _opt(
        "",
        "Redis shared by all replicas (empty: no Redis tier): redis://[user:password@]host:port/db, "
        "rediss:// (TLS), unix:///path.sock, redis+cluster://host:port for Redis Cluster, or "
        "redis+sentinel://host:26379[,host:port]/<service>/<db> for Sentinel.",
        secret=True,
    )
    redis_prefix: str = _opt("voxgate:", "Prefix of every Redis key voxgate writes.")
    redis_ttl_s: int = _opt(
        7 * 24 * 3600, "TTL of unpinned Redis entries, in seconds (0: none; pinned: never)."
    )
    redis_max_entry_mb: int = _opt(16, "Largest entry written to Redis, in MiB.")
    redis_timeout_ms: int = _opt(500, "Timeout of one Redis operation, in ms (then: a miss).")
    redis_breaker_failures: int = _opt(
        5, "Consecutive Redis failures that open the circuit breaker (Redis then skipped)."
    )
    redis_breaker_reset_ms: int = _opt(
        2000, "How long an open Redis breaker skips Redis before probing it again, in ms."
    )
    redis_lock_ttl_ms: int = _opt(
        30000, "TTL of a cross-replica synthesis lock (extended while held), in ms."
    )
    redis_lock_wait_s: int = _opt(
        60, "Longest wait on another replica's synthesis before synthesizing here, in seconds."
    )
    redis_lean_reads: bool = _opt(
        True,
        "Read entries over voxgate's own pipelined RESP reader (redis:// and unix:// URLs; half "
        "the CPU per GET of redis-py or less); false: through redis-py, like every other command.",
    )

    # ---- loading ---------------------------------------------------------------------------

    @classmethod
    def names(cls) -> list[str]:
        """Field names in declaration order."""
        return [f.name for f in fields(cls)]

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
        values: dict[str, Any] = {}
        path = config_file or env.get(f"{ENV_PREFIX}CONFIG")
        if path:
            try:
                with Path(path).open("rb") as f:
                    data = tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise SettingsError(f"config file {path}: {exc}") from exc
            table = data.get("voxgate", data)
            for key, raw in table.items():
                values[key] = cls._convert(key, raw, source=f"{path}")
        known = set(cls.names())
        for name in known:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = cls._convert(name, raw, source=f"{ENV_PREFIX}{name.upper()}")
        for key, raw in (overrides or {}).items():
            if raw is not None:
                values[key] = cls._convert(key, raw, source=f"--{key.replace('_', '-')}")
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def _convert(cls, key: str, raw: Any, *, source: str) -> Any:
        hints = get_type_hints(cls)
        if key not in hints:
            raise SettingsError(f"unknown setting {key!r} (from {source})")
        typ = hints[key]
        try:
            if typ is bool:
                if isinstance(raw, bool):
                    return raw
                word = str(raw).strip().lower()
                if word in ("1", "true", "yes", "on"):
                    return True
                if word in ("0", "false", "no", "off"):
                    return False
                raise ValueError("expected true or false")
            if typ is int:
                if isinstance(raw, bool):
                    raise ValueError("expected an integer")
                return int(raw)
            if typ is str:
                return str(raw)
            if typ is Path:
                return Path(str(raw)).expanduser()
            if typ == tuple[str, ...]:
                items = raw.split(",") if isinstance(raw, str) else list(raw)
                return tuple(s.strip() for s in items if str(s).strip())
            if typ == dict[str, str]:
                if isinstance(raw, Mapping):
                    return {str(k): str(v) for k, v in raw.items()}
                out: dict[str, str] = {}
                for pair in str(raw).split(","):
                    if not pair.strip():
                        continue
                    k, sep, v = pair.partition("=")
                    if not sep:
                        raise ValueError(f"expected alias=target, got {pair!r}")
                    out[k.strip()] = v.strip()
                return out
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"setting {key!r} (from {source}): {exc}") from exc
        raise SettingsError(f"setting {key!r}: unsupported type {typ}")  # pragma: no cover

    def validate(self) -> None:
        """Raise :class:`SettingsError` for values out of range."""

        def need(cond: bool, key: str, what: str) -> None:
            if not cond:
                raise SettingsError(f"setting {key!r}: {what} (got {getattr(self, key)!r})")

        need(0 <= self.port <= 65535, "port", "must be 0-65535")
        need(self.memory_cache_mb >= 0, "memory_cache_mb", "must be >= 0")
        need(self.disk_cache_mb >= 0, "disk_cache_mb", "must be >= 0")
        need(self.max_input_chars >= 1, "max_input_chars", "must be >= 1")
        need(self.max_body_kb >= 1, "max_body_kb", "must be >= 1")
        need(self.queue_size >= 1, "queue_size", "must be >= 1")
        need(self.synth_threads >= 1, "synth_threads", "must be >= 1")
        need(self.intra_op_threads >= 0, "intra_op_threads", "must be >= 0")
        need(self.retry_after_s >= 0, "retry_after_s", "must be >= 0")
        need(bool(self.piper_voices), "piper_voices", "needs at least one voice")
        need(0 <= self.sentence_pause_ms <= 5000, "sentence_pause_ms", "must be 0-5000")
        need(self.max_parallel_sentences >= 1, "max_parallel_sentences", "must be >= 1")
        need(
            self.log_level.lower() in ("debug", "info", "warning", "error"),
            "log_level",
            "must be debug, info, warning or error",
        )
        # --- synthesis backend (issue 3) ---
        need(
            self.coqui_mode in ("torch", "onnx", "int8", "fp16", "bf16"),
            "coqui_mode",
            "must be torch, onnx, int8, fp16 or bf16",
        )
        need(bool(self.coqui_name), "coqui_name", "must not be empty")
        need(self.synth_workers >= 0, "synth_workers", "must be >= 0")
        need(bool(self.devices), "devices", "needs at least one device")
        need(
            all(d == "cpu" or d == "cuda" or d.startswith("cuda:") for d in self.devices),
            "devices",
            "each device must be cpu, cuda or cuda:N",
        )
        need(self.max_batch >= 0, "max_batch", "must be >= 0")
        need(self.max_wait_ms >= 0, "max_wait_ms", "must be >= 0")
        need(self.batch_timeout_s >= 1, "batch_timeout_s", "must be >= 1")
        self.validate_operations()
        # --- Redis tier and scale-out (issue 4) ---
        need(self.redis_ttl_s >= 0, "redis_ttl_s", "must be >= 0")
        need(self.redis_max_entry_mb >= 1, "redis_max_entry_mb", "must be >= 1")
        need(self.redis_timeout_ms >= 1, "redis_timeout_ms", "must be >= 1")
        need(self.redis_breaker_failures >= 1, "redis_breaker_failures", "must be >= 1")
        need(self.redis_breaker_reset_ms >= 1, "redis_breaker_reset_ms", "must be >= 1")
        need(self.redis_lock_ttl_ms >= 100, "redis_lock_ttl_ms", "must be >= 100")
        need(self.redis_lock_wait_s >= 1, "redis_lock_wait_s", "must be >= 1")
        need(
            not self.redis_url
            or self.redis_url.split("://", 1)[0].lower()
            in (
                "redis",
                "rediss",
                "unix",
                "redis+cluster",
                "rediss+cluster",
                "redis+sentinel",
                "rediss+sentinel",
            ),
            "redis_url",
            "must start with redis://, rediss://, unix://, redis+cluster:// or redis+sentinel://",
        )

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated)."""
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def shown(self) -> dict[str, Any]:
        """The effective settings for display, secrets masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("secret") and value:
                value = "****"
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    def effective_intra_op_threads(self) -> int:
        """Threads per engine so that engines x threads fits the cores."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return max(1, (os.cpu_count() or 1) // self.synth_threads)

    # --- synthesis backend (issue 3) ---

    def uses_cuda(self) -> bool:
        """True when the engines run on CUDA devices."""
        return any(d.startswith("cuda") for d in self.devices)

    def pool_workers(self) -> int:
        """Worker processes per model: one per CUDA device, else ``synth_workers``."""
        if self.synth_workers and self.uses_cuda():
            return len(self.devices)
        return self.synth_workers

    def worker_threads(self) -> int:
        """Intra-op threads per worker process, so that workers x threads fits the cores."""
        if self.intra_op_threads:
            return self.intra_op_threads
        return max(1, (os.cpu_count() or 1) // max(1, self.pool_workers()))

    def effective_max_batch(self) -> int:
        """``max_batch``, or what measured fastest on the device (CPU: 1, CUDA: 8)."""
        if self.max_batch:
            return self.max_batch
        return 8 if self.uses_cuda() else 1

    # --- operations (issue 6) ---
    log_format: str = _opt(
        "json", "Log line format: json (one JSON object a line) or text (for a terminal)."
    )
    workers: int = _opt(
        1, "Gateway processes serving one port (SO_REUSEPORT); metrics are aggregated across them."
    )
    event_loop: str = _opt(
        "auto",
        "Event loop of the server: uvloop, asyncio, or auto (uvloop when installed, else asyncio).",
    )
    shutdown_timeout_s: int = _opt(
        30, "On SIGTERM, seconds to let in-flight requests finish before closing connections."
    )
    max_catalogue_prompts: int = _opt(1000, "Most prompts one POST /v1/prompts may carry.")
    catalogue_concurrency: int = _opt(
        4, "Prompts rendered at once by voxgate warm and POST /v1/prompts."
    )

    def validate_operations(self) -> None:
        """Range checks for the operations settings (called by :meth:`validate`)."""
        for key, ok, what in (
            ("log_format", self.log_format in ("json", "text"), "must be json or text"),
            ("workers", 1 <= self.workers <= 64, "must be 1-64"),
            (
                "event_loop",
                self.event_loop in ("auto", "uvloop", "asyncio"),
                "must be auto, uvloop or asyncio",
            ),
            ("shutdown_timeout_s", self.shutdown_timeout_s >= 0, "must be >= 0"),
            ("max_catalogue_prompts", self.max_catalogue_prompts >= 1, "must be >= 1"),
            ("catalogue_concurrency", self.catalogue_concurrency >= 1, "must be >= 1"),
        ):
            if not ok:
                raise SettingsError(f"setting {key!r}: {what} (got {getattr(self, key)!r})")


def settings_table() -> str:
    """The settings as a Markdown table (the README's table is this, checked by a test)."""
    rows = ["| setting | env | default | meaning |", "|---|---|---|---|"]
    defaults = Settings.__dataclass_fields__
    for f in fields(Settings):
        d = defaults[f.name]
        if d.default is not dataclasses.MISSING:
            value: Any = d.default
        elif d.default_factory is not dataclasses.MISSING:
            value = d.default_factory()
        else:  # pragma: no cover - every field has a default
            value = ""
        if f.name == "cache_dir":
            value = "$XDG_CACHE_HOME/voxgate or ~/.cache/voxgate"
        elif isinstance(value, dict):
            value = "OpenAI names" if value else "{}"
        elif isinstance(value, tuple):
            value = ",".join(value)
        elif isinstance(value, bool):
            value = str(value).lower()
        rows.append(
            f"| `--{f.name.replace('_', '-')}` | `{ENV_PREFIX}{f.name.upper()}` | `{value}` | "
            f"{f.metadata['help']} |"
        )
    return "\n".join(rows)
