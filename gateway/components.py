"""The long-lived resources, each an async context manager: the store, the models, the service.

The app wraps them as cleanup contexts; the CLI (``voxgate say``) enters the same ones, so a
command-line synthesis goes through the same store and single flight as the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from cache.disk import DiskTier
from cache.distributed import CrossReplicaFlight
from cache.memory import MemoryTier
from cache.redis_tier import RedisTier
from cache.store import TieredStore
from cache.tier import Tier
from gateway.settings import Settings
from gateway.speech import ModelHandle, SpeechService
from metrics import Metrics
from synth.engine import Engine
from synth.piper_engine import PiperEngine, PiperVoiceFiles
from synth.runner import ThreadRunner
from synth.scheduler import Scheduler

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
        tiers.append(DiskTier(settings.cache_dir, settings.disk_cache_mb * MIB))
    if settings.redis_url:  # issue 4: the shared tier, last; closed with the store
        tiers.append(
            RedisTier.from_url(
                settings.redis_url,
                prefix=settings.redis_prefix,
                ttl_s=settings.redis_ttl_s,
                max_entry_bytes=settings.redis_max_entry_mb * MIB,
                timeout_s=settings.redis_timeout_ms / 1000,
                breaker_failures=settings.redis_breaker_failures,
                breaker_reset_s=settings.redis_breaker_reset_ms / 1000,
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


def default_engines(settings: Settings) -> dict[str, Engine]:
    """The engines the settings ask for (the bundled Piper voice by default)."""
    voices = [PiperVoiceFiles.from_spec(spec) for spec in settings.piper_voices]
    return {"piper": PiperEngine(voices, intra_op_threads=settings.effective_intra_op_threads())}


@contextlib.asynccontextmanager
async def open_models(
    settings: Settings,
    metrics: Metrics,
    engines: Mapping[str, Engine] | None = None,
    *,
    wait_ready: bool = False,
) -> AsyncIterator[dict[str, ModelHandle]]:
    """Start a runner and a scheduler per engine and load + warm the engines in the background.

    Each handle's ``ready`` event is set once its engine is warm. With ``wait_ready`` the context
    is entered only after every engine is ready (the CLI); the server enters at once so that
    ``/readyz`` can answer 503 while models load.
    """
    if engines is None:
        # Reads voice configs and hashes the weights for the fingerprint: off the loop.
        engines = await asyncio.to_thread(default_engines, settings)
    engines = dict(engines)
    handles: dict[str, ModelHandle] = {}
    runners: list[ThreadRunner] = []
    loaders: list[asyncio.Task[None]] = []

    async def load(name: str, runner: ThreadRunner, ready: asyncio.Event) -> None:
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
        for name, engine in engines.items():
            runner = ThreadRunner(engine, settings.synth_threads)
            runners.append(runner)
            scheduler = Scheduler(
                name,
                runner,
                metrics,
                max_queue=settings.queue_size,
                concurrency=settings.synth_threads,
                retry_after_s=settings.retry_after_s,
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
        for task in loaders:
            task.cancel()
        for task in loaders:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for handle in handles.values():
            await handle.scheduler.close()
        for runner in runners:
            await runner.close()


@contextlib.asynccontextmanager
async def open_speech(
    settings: Settings,
    metrics: Metrics,
    engines: Mapping[str, Engine] | None = None,
    *,
    wait_ready: bool = False,
) -> AsyncIterator[SpeechService]:
    """Store + models + the speech service over them."""
    async with (
        open_store(settings, metrics) as store,
        open_models(settings, metrics, engines, wait_ready=wait_ready) as models,
    ):
        service = SpeechService(
            store,
            models,
            metrics,
            sentence_pause_ms=settings.sentence_pause_ms,
            max_parallel_sentences=settings.max_parallel_sentences,
        )
        service.cross_replica = CrossReplicaFlight.for_tiers(  # issue 4; None without Redis
            store.tiers,
            lock_ttl_s=settings.redis_lock_ttl_ms / 1000,
            max_wait_s=settings.redis_lock_wait_s,
            metrics=metrics,
        )
        try:
            yield service
        finally:
            await service.close()
