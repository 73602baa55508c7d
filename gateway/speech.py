"""The speech path shared by every endpoint and the CLI: key, store lookup, single flight, synthesis.

A request has two content addresses: the *master* (format-free: text, engine, voice, fingerprint,
parameters) whose value is lossless PCM at the engine's rate, and the *rendition* (master + format +
sample rate) whose value is the bytes sent to the client. A new format or rate of audio already
synthesized is a transcode of the master, never a synthesis.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cache.distributed import CrossReplicaFlight
from cache.entry import Entry
from cache.keys import master_key, rendition_key
from cache.singleflight import SingleFlight
from cache.store import TieredStore
from metrics import Metrics
from synth import audio
from synth.engine import Audio, Engine, ParamValue, SynthesisItem
from synth.errors import Overloaded
from synth.scheduler import Scheduler

log = logging.getLogger("voxgate.speech")


@dataclass(frozen=True)
class SpeechRequest:
    """A validated request: ``text`` is normalized, ``model`` and ``voice`` are resolved names."""

    text: str
    model: str
    voice: str
    fmt: audio.AudioFormat
    speed: float = 1.0
    sample_rate: int | None = None
    pinned: bool = False


@dataclass(frozen=True)
class SpeechResult:
    """The audio for a request, its content address, and how the store answered."""

    entry: Entry
    key: str
    cache: str  # "hit", "miss" (synthesized for this request) or "coalesced"


@dataclass
class ModelHandle:
    """A served model: its engine (for metadata) and the scheduler that runs it."""

    name: str
    engine: Engine
    scheduler: Scheduler
    ready: asyncio.Event

    def voice_names(self) -> list[str]:
        """Names of the voices this model serves."""
        return [v.name for v in self.engine.voices()]


class SpeechService:
    """Answers speech requests from the store, synthesizing each distinct master once."""

    def __init__(
        self,
        store: TieredStore,
        models: Mapping[str, ModelHandle],
        metrics: Metrics,
        *,
        encode_threads: int = 2,
    ) -> None:
        self.store = store
        self.models = dict(models)
        self.metrics = metrics
        self._renditions: SingleFlight[tuple[Entry, bool]] = SingleFlight()
        self._masters: SingleFlight[Audio] = SingleFlight()
        # Set when Redis is configured (issue 4): one replica of many synthesizes each master.
        self.cross_replica: CrossReplicaFlight | None = None
        self._encode_pool = concurrent.futures.ThreadPoolExecutor(
            encode_threads, thread_name_prefix="encode"
        )

    async def close(self) -> None:
        """Release the encoder threads (joining threads blocks: done off the loop)."""
        await asyncio.to_thread(self._encode_pool.shutdown, wait=True, cancel_futures=True)

    # ---- addressing -------------------------------------------------------------------------

    def params_for(self, req: SpeechRequest) -> dict[str, ParamValue]:
        """Everything that shapes the sound, for the master key."""
        engine = self.models[req.model].engine
        return {**engine.default_params(req.voice), "speed": req.speed}

    def keys_for(self, req: SpeechRequest) -> tuple[str, str, int]:
        """``(master_key, rendition_key, output_rate)`` of ``req``."""
        engine = self.models[req.model].engine
        mk = master_key(
            text=req.text,
            engine=engine.name,
            voice=req.voice,
            fingerprint=engine.fingerprint,
            params=self.params_for(req),
        )
        rate = audio.output_rate(req.fmt, engine.sample_rate, req.sample_rate)
        return mk, rendition_key(mk, fmt=req.fmt.name, sample_rate=rate), rate

    # ---- serving ----------------------------------------------------------------------------

    async def speak(self, req: SpeechRequest) -> SpeechResult:
        """The audio for ``req``: from the store when it is there, else synthesized once."""
        mk, rk, rate = self.keys_for(req)
        entry = self.store.get_memory(rk)
        if entry is None:
            found = await self.store.get(rk)
            entry = found.entry if found is not None else None
        if entry is not None:
            if req.pinned and not entry.meta.pinned:
                entry = entry.pinned_copy()
                await self.store.put(rk, entry)
            return SpeechResult(entry, rk, "hit")
        (entry, synthesized), leader = await self._renditions.do(
            rk, lambda: self._produce(req, mk, rk, rate)
        )
        if not leader:
            self.metrics.coalesced.inc()
            return SpeechResult(entry, rk, "coalesced")
        return SpeechResult(entry, rk, "miss" if synthesized else "hit")

    async def _produce(self, req: SpeechRequest, mk: str, rk: str, rate: int) -> tuple[Entry, bool]:
        """Make the rendition ``rk``: transcode the stored master, or synthesize it first."""
        loop = asyncio.get_running_loop()
        synthesized = False
        found = await self.store.get(mk)
        if found is not None:
            pcm, src_rate = await loop.run_in_executor(
                self._encode_pool, audio.decode_master, found.entry.audio
            )
            self.metrics.transcodes.labels(req.fmt.name).inc()
            if req.pinned and not found.entry.meta.pinned:
                await self.store.put(mk, found.entry.pinned_copy())
        else:
            result, leader = await self._masters.do(mk, lambda: self._synthesize_once(req, mk))
            pcm, src_rate = result.pcm, result.sample_rate
            synthesized = leader
        data = await loop.run_in_executor(
            self._encode_pool, audio.render, pcm, src_rate, req.fmt, rate
        )
        entry = Entry.create(
            data,
            content_type=req.fmt.content_type,
            fmt=req.fmt.name,
            sample_rate=rate,
            model=req.model,
            voice=req.voice,
            pinned=req.pinned,
            duration_s=len(pcm) / src_rate,
        )
        await self.store.put(rk, entry)
        return entry, synthesized

    async def _synthesize_once(self, req: SpeechRequest, mk: str) -> Audio:
        """Synthesize master ``mk``, once across all replicas when Redis is configured (issue 4).

        With replicas, every one renders from the *stored* master (FLAC, PCM16), whether it
        synthesized it or fetched it, so the same rendition key has the same bytes everywhere.
        """
        if self.cross_replica is None:
            return await self._synthesize(req, mk)
        loop = asyncio.get_running_loop()

        async def canonical(audio_: Audio) -> Audio:
            data = await loop.run_in_executor(
                self._encode_pool, audio.encode_master, audio_.pcm, audio_.sample_rate
            )
            return Audio(*await loop.run_in_executor(self._encode_pool, audio.decode_master, data))

        async def produce() -> Audio:
            return await canonical(await self._synthesize(req, mk))

        async def adopt(entry: Entry) -> Audio:
            return Audio(
                *await loop.run_in_executor(self._encode_pool, audio.decode_master, entry.audio)
            )

        return await self.cross_replica.run(mk, produce, adopt)

    async def _synthesize(self, req: SpeechRequest, mk: str) -> Audio:
        handle = self.models[req.model]
        if not handle.ready.is_set():
            raise Overloaded(f"model '{req.model}' is still loading", retry_after_s=2.0)
        item = SynthesisItem(req.text, req.voice, req.speed)
        result = await handle.scheduler.submit(item)
        loop = asyncio.get_running_loop()
        master = await loop.run_in_executor(
            self._encode_pool, audio.encode_master, result.pcm, result.sample_rate
        )
        await self.store.put(
            mk,
            Entry.create(
                master,
                content_type=audio.MASTER_FORMAT.content_type,
                fmt=audio.MASTER_FORMAT.name,
                sample_rate=result.sample_rate,
                model=req.model,
                voice=req.voice,
                pinned=req.pinned,
                duration_s=result.duration_s,
            ),
        )
        log.info(
            "synthesized key=%s model=%s voice=%s audio_s=%.2f",
            mk,
            req.model,
            req.voice,
            result.duration_s,
        )
        return result

    def voice_listing(self) -> Sequence[Mapping[str, object]]:
        """Models with their voices, for ``GET /v1/voices``."""
        out = []
        for name, handle in self.models.items():
            out.append(
                {
                    "id": name,
                    "ready": handle.ready.is_set(),
                    "sample_rate": handle.engine.sample_rate,
                    "voices": [
                        {"id": v.name, "language": v.language, "description": v.description}
                        for v in handle.engine.voices()
                    ],
                    "execution": dict(handle.engine.describe()),
                }
            )
        return out
