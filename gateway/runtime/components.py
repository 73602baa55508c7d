"""The long-lived resources, each an async context manager: the store, the models, the service.

The app wraps them as cleanup contexts; the CLI (``voxgate say``) enters the same ones, so a
command-line synthesis goes through the same store and single flight as the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from cache.breaker import BreakerState, CircuitBreaker
from cache.disk import DiskTier
from cache.distributed import CrossReplicaFlight
from cache.memory import MemoryTier
from cache.pins import PinRegistry, registry_for
from cache.redis_tier import RedisTier
from cache.store import TieredStore
from cache.tier import Tier
from gateway.runtime.extras import check_extras
from gateway.runtime.ratelimit import limits_storage
from gateway.runtime.settings import Settings
from gateway.runtime.upstreams import upstream_configs
from gateway.runtime.workers import POOL_SOCKET_ENV
from gateway.speech.assembly import Assembler, RenderShare
from gateway.speech.ledger import Ledger
from gateway.speech.masters import Masters, ModelHandle
from gateway.speech.quarantine import Quarantine
from gateway.speech.rollout import follow_revisions
from gateway.speech.service import SpeechService
from gateway.speech.takes import TakeGate
from gateway.speech.telephony import Transcoder
from gateway.speech.vocabulary import Vocabulary
from metrics import Metrics
from synth.audio import as_rendered_pcm16
from synth.cancellation import cancel_and_wait
from synth.engine import Engine
from synth.loudness import Loudness
from synth.pieces import PiecesFeed
from synth.piper_engine import PiperVoiceFiles
from synth.pool import EngineSpec, LogSetup, WorkerPool
from synth.providers.base import max_reply_bytes
from synth.runner import ThreadRunner
from synth.scheduler import ClientShares, Scheduler
from synth.shared_pool import RemotePool
from synth.takecheck import Limits, TakeChecker
from synth.upstream import (
    RequestRate,
    UpstreamConfig,
    UpstreamEngine,
    UpstreamRunner,
    build_provider,
    check_config,
)

log = logging.getLogger("voxgate")

MIB = 1024 * 1024


def build_tiers(settings: Settings, metrics: Metrics) -> list[Tier]:
    """The configured tiers, top-down."""
    tiers: list[Tier] = []
    if settings.memory_cache_mb > 0:
        tiers.append(
            MemoryTier(
                settings.memory_cache_mb * MIB,
                on_evict=lambda n: metrics.cache_evictions.labels("memory").inc(n),
            )
        )
    if settings.disk_cache_mb > 0:
        tiers.append(
            DiskTier(
                settings.cache_dir,
                settings.disk_cache_mb * MIB,
                on_evict=lambda n: metrics.cache_space_evictions.labels("disk").inc(n),
            )
        )
    redis_url = settings.redis_url.get_secret_value()
    if redis_url:  # the shared tier, last; closed with the store
        tiers.append(
            RedisTier.from_url(
                redis_url,
                secret=settings.cache_secret.get_secret_value().encode(),
                prefix=settings.redis_prefix,
                ttl_s=settings.redis_ttl_s,
                max_entry_bytes=settings.redis_max_entry_mb * MIB,
                timeout_s=settings.redis_timeout_ms / 1000,
                breaker_failures=settings.redis_breaker_failures,
                breaker_reset_s=settings.redis_breaker_reset_ms / 1000,
                lean_reads=settings.redis_lean_reads,
                metrics=metrics,
            )
        )
    return tiers


@contextlib.asynccontextmanager
async def open_store(settings: Settings, metrics: Metrics) -> AsyncIterator[TieredStore]:
    """Open every configured tier; close them on exit."""
    # Opening diskcache touches SQLite and the filesystem: not on the event loop.
    tiers = await asyncio.to_thread(build_tiers, settings, metrics)
    if not tiers:
        tiers = [MemoryTier(64 * MIB)]  # a store with no tier would synthesize every request
        log.warning("memory and disk tiers both off: using a 64 MiB memory tier")
    store = TieredStore(tiers, metrics)
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def open_pins(settings: Settings, store: TieredStore) -> AsyncIterator[PinRegistry]:
    """The pin registry for ``store``: in its Redis tier when it has one (every replica shares
    it), else in ``cache_dir`` (every gateway process of the host shares it)."""
    registry = registry_for(store.tiers, settings.cache_dir)
    try:
        yield registry
    finally:
        await registry.close()


def default_engine_specs(settings: Settings) -> dict[str, list[EngineSpec]]:
    """Per model, one engine spec per worker: Piper always, Coqui when ``coqui_model`` is set.

    Worker ``i`` runs on ``devices[i % len(devices)]``; in-process engines use ``devices[0]``.
    """
    topology = settings.topology()
    threads = topology.intra_op_threads
    count = max(1, topology.synth_workers)
    devices = [settings.devices[i % len(settings.devices)] for i in range(count)]
    voices = [PiperVoiceFiles.from_spec(spec) for spec in settings.piper_voices]
    specs = {
        "piper": [
            EngineSpec(
                "synth.piper_engine:PiperEngine",
                {
                    "voices": voices,
                    "intra_op_threads": threads,
                    "use_cuda": d.startswith("cuda"),
                    "precision": settings.synthesis_precision,
                    "derived_dir": settings.cache_dir / "piper-int8",
                    "speech_marks": settings.speech_marks,
                },
            )
            for d in devices
        ]
    }
    if settings.coqui_model:
        check_extras(settings)
        # Imported here: a process that serves no Coqui model never loads the Coqui engine's module.
        from synth.coqui_engine import resolve_model_files

        # Resolve a zoo name here, once: the workers then find the files in Coqui's cache.
        model_path, config_path = resolve_model_files(
            settings.coqui_model, settings.coqui_config or None
        )
        specs[settings.coqui_name] = [
            EngineSpec(
                "synth.coqui_engine:CoquiEngine",
                {
                    "model_path": model_path,
                    "config_path": config_path,
                    "mode": settings.coqui_mode,
                    "device": d,
                    "intra_op_threads": threads,
                    "onnx_dir": settings.cache_dir / "coqui-onnx",
                    "precision": settings.synthesis_precision,
                    "speech_marks": settings.speech_marks,
                },
            )
            for d in devices
        ]
    return specs


# What a model is built from: an engine object (in-process), engine specs (worker processes) or
# an upstream entry (a remote provider).
ModelSource = Engine | Sequence[EngineSpec] | UpstreamConfig


def default_models(settings: Settings) -> dict[str, ModelSource]:
    """Every model the settings ask for: the local engines' specs, then the upstreams."""
    specs: dict[str, ModelSource] = dict(default_engine_specs(settings))
    specs.update(upstream_configs(settings, list(specs)))
    return specs


@contextlib.asynccontextmanager
async def open_models(
    settings: Settings,
    metrics: Metrics,
    engines: Mapping[str, ModelSource] | None = None,
    *,
    wait_ready: bool = False,
    shares: ClientShares | None = None,
) -> AsyncIterator[dict[str, ModelHandle]]:
    """Start a runner and a scheduler per engine and load + warm the engines in the background.

    An :class:`Engine` object runs in-process (a :class:`ThreadRunner`: tests inject wrappers this
    way). A list of :class:`EngineSpec` (one per worker) runs in a :class:`WorkerPool` of worker
    processes; with ``synth_workers = 0`` the first spec is built and run in-process instead.

    Each handle's ``ready`` event is set once its engine is warm. With ``wait_ready`` the context
    is entered only after every engine is ready (the CLI); the server enters at once so that
    ``/readyz`` can answer 503 while models load.
    """
    if engines is None:
        # Reads configs (and may resolve a zoo name): off the loop.
        engines = await asyncio.to_thread(default_models, settings)
    handles: dict[str, ModelHandle] = {}
    runners: list[Runner] = []
    loaders: list[asyncio.Task[None]] = []
    # Set by the supervisor of `serve --workers N` for its gateway processes: the host's one pool.
    shared_pool = os.environ.get(POOL_SOCKET_ENV) or None

    async def load(name: str, runner: Runner, ready: asyncio.Event) -> None:
        try:
            await runner.start()
        except Exception:
            log.exception("model %s failed to load; its misses will get 503", name)
            raise
        ready.set()
        metrics.engine_ready.labels(name).set(1)
        log.info(
            "model ready: %s (voices: %s)", name, ", ".join(v.name for v in runner.engine.voices())
        )

    try:
        for name, given in engines.items():
            # Building the metadata engine hashes the weights for its fingerprint: off the loop.
            runner, engine, concurrency = await asyncio.to_thread(
                _runner_for, name, given, settings, metrics, shared_pool
            )
            runners.append(runner)
            scheduler = Scheduler(
                name,
                runner,
                metrics,
                max_queue=settings.queue_size,
                max_batch=_max_batch(settings, engine),
                max_wait_ms=float(settings.max_wait_ms),
                concurrency=concurrency,
                retry_after_s=settings.retry_after_s,
                # One text queues up to max_parallel_sentences at once: never its own obstacle.
                max_per_client=max(settings.queue_per_client, settings.max_parallel_sentences),
                shares=shares,
            )
            scheduler.start()
            ready = asyncio.Event()
            metrics.engine_ready.labels(name).set(0)
            handles[name] = ModelHandle(name, engine, scheduler, ready)
            loaders.append(asyncio.create_task(load(name, runner, ready), name=f"load-{name}"))
        if wait_ready:
            await asyncio.gather(*loaders)
        yield handles
    finally:
        await cancel_and_wait(*loaders)
        for handle in handles.values():
            await handle.scheduler.close()
        for runner in runners:
            await runner.close()


Runner = ThreadRunner | WorkerPool | RemotePool | UpstreamRunner


def handover(settings: Settings, slots: int) -> int:
    """Batches a gateway process hands the host's pool process at once (``slots``: what the pool
    runs at once): every miss it has, up to its queue, so the pool's one queue serves every
    gateway process in order of arrival. Held back here instead (each process's turn at a few
    slots there), a busier process's misses waited longer than a quieter one's: the IVR bench's
    cold p99 was 2.22-2.42 s that way, 1.87-1.98 s this way (docs/synthesis.md)."""
    return settings.queue_size + slots


def _runner_for(
    name: str,
    given: ModelSource,
    settings: Settings,
    metrics: Metrics,
    shared_pool: str | None = None,
) -> tuple[Runner, Engine, int]:
    """``(runner, engine for metadata, batches at once)`` for one model; with ``shared_pool``
    (a Unix socket path) pooled models and upstreams run in the host's pool process instead of
    here (one process per host calls each upstream: its concurrency and single flight are the
    host's)."""
    if isinstance(given, UpstreamConfig):
        return _upstream_runner(name, given, settings, metrics, shared_pool)

    def in_process(engine: Engine) -> tuple[ThreadRunner, Engine, int]:
        runner = ThreadRunner(
            engine,
            settings.synth_threads,
            batch_timeout_s=float(settings.batch_timeout_s),
            model=name,
            metrics=metrics,
        )
        return runner, engine, settings.synth_threads

    if isinstance(given, Engine):
        return in_process(given)
    specs = list(given)
    # The gateway's copy is never loaded: it only answers voices, fingerprint and sample rate.
    engine = specs[0].build()
    if settings.pool_workers() < 1:
        return in_process(engine)
    # Piper and other one-item engines get a second batch waiting in each worker's pipe: the
    # worker need not wait for the event loop between batches (docs/synthesis.md). An engine that
    # batches does not: a batch formed while the worker is still busy would be a smaller one.
    pipeline = 2 if _max_batch(settings, engine) == 1 else 1
    if shared_pool is not None:
        remote = RemotePool(
            shared_pool,
            name,
            engine,
            settings.pool_workers(),
            max_reply_bytes=settings.synth_max_reply_mb * MIB,
        )
        return remote, engine, handover(settings, remote.size * pipeline)
    pool = WorkerPool(
        name,
        engine,
        specs,
        metrics,
        threads=settings.topology().intra_op_threads,
        batch_timeout_s=float(settings.batch_timeout_s),
        max_reply_bytes=settings.synth_max_reply_mb * MIB,
        # Worker lines in the gateway's format: with log_format json every line stays one object.
        log_setup=LogSetup(
            "gateway.runtime.logs:configure_logging",
            {"level": settings.log_level, "fmt": settings.log_format},
        ),
        pipeline=pipeline,
    )
    return pool, engine, pool.concurrency


def _upstream_runner(
    name: str,
    config: UpstreamConfig,
    settings: Settings,
    metrics: Metrics,
    shared_pool: str | None,
) -> tuple[Runner, Engine, int]:
    """The runner of upstream ``config`` (built in a thread: it may build a Redis storage)."""
    engine = UpstreamEngine(config)
    if settings.redis_url.get_secret_value() and config.timeout_s > settings.redis_lock_wait_s:
        # Another replica would stop waiting for this one's call and pay for its own.
        log.warning(
            "upstream %s: timeout_s %gs is longer than redis_lock_wait_s %ds; replicas may "
            "call it twice for one text",
            name,
            config.timeout_s,
            settings.redis_lock_wait_s,
        )
    # Calls wait for a slot inside the runner, under their deadline (timeout_s), not in the
    # scheduler's queue, where a provider that hangs would hold them for many timeouts.
    concurrency = handover(settings, config.max_concurrency)
    if shared_pool is not None:
        remote = RemotePool(
            shared_pool,
            name,
            engine,
            concurrency,
            # One take per reply, as float32: the frame its max_audio_mb needs, or more.
            max_reply_bytes=max(settings.synth_max_reply_mb * MIB, max_reply_bytes(config)),
            # The pool process passes the provider's pieces on (streaming pass-through).
            passes_pcm=config.streams_pcm,
        )
        return remote, engine, concurrency
    gauge = metrics.upstream_breaker_state.labels(name)
    gauge.set(BreakerState.CLOSED)
    breaker = CircuitBreaker(
        config.breaker_failures,
        config.breaker_reset_s,
        on_change=lambda state: gauge.set(state),
    )
    # Always made (0: no limit), so a reload may set a limit; with Redis, every replica's.
    redis_url = settings.redis_url.get_secret_value()
    timeout_s = settings.redis_timeout_ms / 1000
    prefix = f"{settings.redis_prefix}upstream"
    shared = limits_storage(redis_url, prefix, timeout_s) if redis_url else None
    rate = RequestRate(
        name, config.requests_per_minute, metrics, shared=shared, timeout_s=timeout_s
    )
    provider = build_provider(config, check_config(config, os.environ))
    runner = UpstreamRunner(engine, provider, metrics, breaker=breaker, rate=rate)
    return runner, engine, concurrency


def _max_batch(settings: Settings, engine: Engine) -> int:
    """Items per batch for ``engine``: the setting, bounded by what the engine batches exactly."""
    return min(settings.effective_max_batch(), engine.capabilities.max_exact_batch)


@contextlib.asynccontextmanager
async def open_speech(
    settings: Settings,
    metrics: Metrics,
    engines: Mapping[str, ModelSource] | None = None,
    *,
    wait_ready: bool = False,
    shares: ClientShares | None = None,
    admit_synthesis: Callable[[int], Awaitable[None]] | None = None,
) -> AsyncIterator[SpeechService]:
    """Store + models + the speech service over them; ``shares`` counts each client's queue
    and rendition shares (this process's queue share by default; no rendition limit), and
    ``admit_synthesis`` (with API keys on) charges a key for each sentence it synthesizes."""
    async with (
        open_store(settings, metrics) as store,
        open_models(settings, metrics, engines, wait_ready=wait_ready, shares=shares) as models,
    ):
        engine_of = {name: handle.engine for name, handle in models.items()}
        ledger = Ledger(engine_of, metrics)
        encode_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="encode")
        # The sentences in flight whose pcm comes in pieces: each piece as the stored rendition
        # will hold its samples, so a stream that passes them on sends a later hit's bytes.
        partials = PiecesFeed(convert=as_rendered_pcm16)
        # Refused takes, kept for review: one list for every gateway process of the host.
        rejects = await asyncio.to_thread(
            lambda: Quarantine(
                os.path.join(settings.cache_dir, "quarantine"),
                max_takes=settings.quarantine_takes,
                max_bytes=settings.quarantine_mb * MIB,
                ttl_s=settings.quarantine_ttl_h * 3600,
            )
        )
        masters = Masters(
            store,
            models,
            metrics,
            encode_pool,
            partials,
            cross_replica=CrossReplicaFlight.for_tiers(  # None without Redis
                store.tiers,
                lock_ttl_s=settings.redis_lock_ttl_ms / 1000,
                max_wait_s=settings.redis_lock_wait_s,
                metrics=metrics,
            ),
            admit_synthesis=admit_synthesis,
            takes=TakeGate(
                TakeChecker(settings.take_checks),
                encode_pool,
                metrics,
                retries=settings.take_retries,
                rejects=rejects,
                limits={
                    name: Limits.from_setting(values)
                    for name, values in settings.take_limits.items()
                },
            ),
            loudness=None
            if settings.loudness_lufs == "off"
            else Loudness(target_lufs=settings.loudness_lufs),
        )
        render_share = (
            RenderShare(shares, settings.renders_per_client, metrics.renders_refused)
            if shares is not None
            else None
        )
        service = SpeechService(
            masters=masters,
            assembler=Assembler(
                masters=masters,
                ledger=ledger,
                render_share=render_share,
                pause_ms=settings.sentence_pause_ms,
                max_parallel=settings.max_parallel_sentences,
                max_sentence_chars=settings.max_sentence_chars,
            ),
            transcoder=Transcoder(store, engine_of, ledger, encode_pool, render_share),
            rejects=rejects,
            max_audio_s=settings.max_audio_s,
            vocabulary=Vocabulary(
                engine_of,
                default_model=settings.default_model,
                default_voice=settings.default_voice,
                model_aliases=settings.model_aliases,
                voice_aliases=settings.voice_aliases,
            ),
        )
        # The address revisions `voxgate rollout` switched, before anything is looked up (the
        # server, warm, export, say: every user of the store addresses as the gateways do).
        async with open_pins(settings, store) as registry:
            await follow_revisions(service, registry)
        try:
            yield service
        finally:
            await service.close()
            await rejects.close()
