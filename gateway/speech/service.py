"""The speech path shared by every endpoint and the CLI: key, store lookup, single flight, synthesis.

A request has two content addresses: the *master* (format-free: text, engine, voice, fingerprint,
parameters) whose value is lossless PCM at the engine's rate, and the *rendition* (master + format +
sample rate) whose value is the bytes sent to the client. A new format or rate of audio already
synthesized is a transcode of the master, never a synthesis.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from cache.distributed import CrossReplicaFlight
from cache.entry import Entry
from cache.keys import master_key, rendition_key
from cache.singleflight import SingleFlight
from cache.store import TieredStore
from gateway.errors import BadRequest
from gateway.memo import BoundedMemo
from gateway.speech.assembly import Assembler, SpeechStream, plan
from gateway.speech.request import (
    CacheResult,
    Segment,
    SpeechRequest,
    SpeechResult,
    segment_speed,
)
from gateway.speech.telephony import Transcoder
from metrics import Metrics
from synth import audio, sentences
from synth.engine import Audio, Engine, ParamValue, SynthesisItem
from synth.errors import Overloaded
from synth.scheduler import Scheduler

log = logging.getLogger("voxgate.speech")

KEY_MEMO_SIZE = 8192

# Characters spoken per second at speed 1, for the up-front audio estimate: a little slower than
# the joe voice's measured 18.6, so the estimate errs long.
CHARS_PER_SECOND = 15.0


def estimated_audio_s(text: str, speed: float) -> float:
    """Seconds of audio ``text`` is expected to make at ``speed`` (from its weighted length)."""
    return sentences.speech_weight(text) / (CHARS_PER_SECOND * speed)


def estimated_request_s(req: SpeechRequest) -> float:
    """Seconds of audio ``req`` is expected to make: its text, or its SSML expansion's segments
    at their own rates plus their pauses (breaks count against the budget like speech)."""
    if not req.segments:
        return estimated_audio_s(req.text, req.speed)
    total = 0.0
    for seg in req.segments:
        if seg.words:
            total += estimated_audio_s(seg.words, segment_speed(req.speed, seg.rate))
        total += (seg.pause_ms or 0) / 1000.0
    return total


@dataclass
class ModelHandle:
    """A served model: its engine (for metadata) and the scheduler that runs it."""

    name: str
    engine: Engine
    scheduler: Scheduler
    ready: asyncio.Event
    _voice_names: list[str] | None = None
    _languages: dict[str, str] | None = None

    def voice_language(self, voice: str) -> str:
        """The language code of ``voice`` ("en_US"), "" when the engine names none."""
        if self._languages is None:
            self._languages = {v.name: v.language for v in self.engine.voices()}
        return self._languages.get(voice, "")

    def voice_names(self) -> list[str]:
        """Names of the voices this model serves (an engine's voices do not change once built)."""
        if self._voice_names is None:
            self._voice_names = [v.name for v in self.engine.voices()]
        return self._voice_names


def _master_entry(req: SpeechRequest, result: Audio) -> tuple[Audio, Entry]:
    """Freshly synthesized audio as stored, and the master entry that stores it (runs off the
    loop)."""
    stored, master = audio.master_of(result.pcm, result.sample_rate)
    entry = req.entry(master, audio.MASTER_FORMAT, result.sample_rate, result.duration_s)
    return Audio(stored, result.sample_rate), entry


class SpeechService:
    """Answers speech requests from the store, synthesizing each distinct master once."""

    def __init__(
        self,
        store: TieredStore,
        models: Mapping[str, ModelHandle],
        metrics: Metrics,
        *,
        encode_threads: int = 2,
        sentence_pause_ms: int = 250,
        max_parallel_sentences: int = 8,
        max_sentence_chars: int | None = None,
        max_audio_s: float | None = None,
    ) -> None:
        self.store = store
        self.max_audio_s = max_audio_s
        self.models = dict(models)
        self.metrics = metrics
        # Cancelled once every waiter is gone, so the production below learns nobody waits.
        self._renditions: SingleFlight[tuple[Entry, CacheResult]] = SingleFlight(
            cancel_abandoned=True
        )
        # A master and whether this replica made it (False: adopted from another's synthesis).
        self._masters: SingleFlight[tuple[Audio, bool]] = SingleFlight()
        # Set when Redis is configured: one replica of many synthesizes each master.
        self.cross_replica: CrossReplicaFlight | None = None
        # Set with API keys on: called with a sentence's length before this process
        # starts synthesizing it (misses only; joining one in flight is free); raises to refuse
        # it (a key over its chars_per_minute).
        self.admit_synthesis: Callable[[int], Awaitable[None]] | None = None
        # Content addresses of recent requests: hashing the canonical JSON is most of a hit's CPU
        # cost, and the same few thousand prompts repeat. Bounded; evicts oldest first.
        self._key_memo: BoundedMemo[tuple[object, ...], tuple[str, str, int]] = BoundedMemo(
            KEY_MEMO_SIZE
        )
        # SSML expansions by (raw text, voice language, engine, front end, limits): a repeated
        # document is not parsed again on paths the request memo does not cover (say URLs,
        # jambonz, the Coqui and Piper routes). Filled by gateway.api.parsing.
        self.expansions: BoundedMemo[tuple[object, ...], tuple[Segment, ...]] = BoundedMemo(
            KEY_MEMO_SIZE
        )
        self._encode_pool = concurrent.futures.ThreadPoolExecutor(
            encode_threads, thread_name_prefix="encode"
        )
        self.sentence_pause_ms = sentence_pause_ms
        # Upstream models (remote providers billed per character) by their price per million
        # characters, and the characters of theirs served without a call since the last flush:
        # tallied here (the hit path), added to the metrics in bulk before every collection.
        self._prices: dict[str, float] = {
            name: float(getattr(handle.engine, "price_per_million_chars", 0.0))
            for name, handle in self.models.items()
            if hasattr(handle.engine, "price_per_million_chars")
        }
        self._served_free: dict[str, int] = {}
        metrics.before_collect(self.flush_upstream_tally)
        self.assembler = Assembler(
            fetch_master=self.master_audio,
            store_put=self.store.put,
            encode_pool=self._encode_pool,
            metrics=metrics,
            master_key=self.master_key_for,
            pause_ms=sentence_pause_ms,
            max_parallel=max_parallel_sentences,
            max_sentence_chars=max_sentence_chars,
            unsplit=self._unsplit,
        )
        # Other encodings of stored audio by content address (GET /v1/audio/{key}.{ext}).
        self.transcoder = Transcoder(
            store,
            {name: handle.engine for name, handle in self.models.items()},
            metrics,
            self._encode_pool,
        )

    def _unsplit(self, model: str) -> bool:
        """Whether ``model`` says each text whole (an upstream with ``split = "whole"``)."""
        return not getattr(self.models[model].engine, "splits_sentences", True)

    def served_free(self, req: SpeechRequest) -> None:
        """``req``'s characters were served without a call to its model: counted for upstream
        models (the characters a provider did not bill), nothing for local ones."""
        if req.model in self._prices:
            tally = self._served_free
            tally[req.model] = tally.get(req.model, 0) + len(req.text)

    def flush_upstream_tally(self) -> None:
        """Add the characters served without a call since the last flush to the metrics."""
        tally, self._served_free = self._served_free, {}
        m = self.metrics
        for model, chars in tally.items():
            m.upstream_chars_cached.labels(model).inc(chars)
            # Read now: a reload of the upstreams file may have changed it.
            price = float(getattr(self.models[model].engine, "price_per_million_chars", 0.0))
            if price:
                m.upstream_saved.labels(model).inc(chars * price / 1e6)

    async def close(self) -> None:
        """Stop productions in flight and release the encoder threads (joining threads blocks:
        done off the loop)."""
        self.assembler.cancel_all()
        await asyncio.to_thread(self._encode_pool.shutdown, wait=True, cancel_futures=True)

    # ---- addressing -------------------------------------------------------------------------

    def params_for(self, req: SpeechRequest) -> dict[str, ParamValue]:
        """Everything that shapes the sound, for the master key."""
        engine = self.models[req.model].engine
        params = {**engine.default_params(req.voice), **dict(req.params), "speed": req.speed}
        if req.phonemes:
            params["phonemes"] = True  # the same characters read as IPA are other speech
        return params

    def master_key_for(self, req: SpeechRequest, **extra: ParamValue) -> str:
        """The format-free key of ``req``'s text, or of its SSML expansion (``extra`` joins the
        parameters)."""
        engine = self.models[req.model].engine
        return master_key(
            text=req.text,
            engine=engine.name,
            voice=req.voice,
            fingerprint=engine.fingerprint,
            params={**self.params_for(req), **extra},
            expansion=[seg.key_material() for seg in req.segments],
        )

    def keys_for(self, req: SpeechRequest) -> tuple[str, str, int]:
        """``(master_key, rendition_key, output_rate)`` of ``req`` (memoized).

        Masters are stored per sentence (a one-sentence text's master is ``master_key``); the
        rendition is derived from the whole text plus the pause that joins its sentences, so a
        changed pause never serves audio assembled with the old one.
        """
        # A request the request memo hands out again carries its keys from the first time (for
        # this service: a request object is only ever validated against one), so a hit skips
        # building and hashing the memo tuple below.
        cached = req.keys_cache
        if cached is not None and cached[0] is self:
            return cached[1]
        engine = self.models[req.model].engine
        memo_key = (
            req.text,
            req.model,
            req.voice,
            req.fmt.name,
            req.speed,
            req.sample_rate,
            req.params,
            engine.fingerprint,
            req.segments,
            req.phonemes,
        )
        keys = self._key_memo.get(memo_key)
        if keys is None:
            keys = self._compute_keys(req, engine)
            self._key_memo.put(memo_key, keys)
        object.__setattr__(req, "keys_cache", (self, keys))
        return keys

    def _compute_keys(self, req: SpeechRequest, engine: Engine) -> tuple[str, str, int]:
        mk = self.master_key_for(req)
        assembled = self.master_key_for(req, sentence_pause_ms=self.sentence_pause_ms)
        rate = audio.output_rate(req.fmt, engine.sample_rate, req.sample_rate)
        return mk, rendition_key(assembled, fmt=req.fmt.name, sample_rate=rate), rate

    # ---- serving ----------------------------------------------------------------------------

    def memory_hit(self, req: SpeechRequest) -> tuple[str, Entry] | None:
        """``(rendition_key, entry)`` when ``req`` is in the memory tier: the hot path, no awaits."""
        key = self.keys_for(req)[1]
        entry = self.store.get_memory(key)
        if entry is None:
            return None
        if self._prices:
            self.served_free(req)
        return key, entry

    async def answer(
        self, req: SpeechRequest, *, stream: bool = False
    ) -> SpeechResult | SpeechStream:
        """The one call every endpoint makes: ``req``'s audio whole (:class:`SpeechResult`), or,
        with ``stream`` and nothing stored yet, a :class:`SpeechStream` that follows the
        synthesis sentence by sentence (stored audio always comes whole)."""
        if not stream:
            return await self.speak(req)
        self.check_budget(req)
        key, rate, entry = await self.lookup(req)
        if entry is not None:
            self.served_free(req)
            return SpeechResult(entry, key, "hit")
        stream_ = await self.assembler.stream(req, key, rate)
        if stream_.cache == "coalesced":
            self.served_free(req)  # joined a production another request started
        return stream_

    def check_budget(self, req: SpeechRequest) -> None:
        """Refuse up front (400) a request whose audio would run past ``max_audio_s``: its cost
        in time and memory grows with the audio, whatever its length in characters."""
        if self.max_audio_s is None:
            return
        seconds = estimated_request_s(req)
        if seconds > self.max_audio_s:
            raise BadRequest(
                f"'input' would make about {seconds:.0f} s of audio at speed {req.speed:g}; the "
                f"limit is {self.max_audio_s:g} s per request (max_audio_s): send less text or "
                "a higher speed",
                param="input",
                code="audio_too_long",
            )

    async def speak(self, req: SpeechRequest) -> SpeechResult:
        """The audio for ``req``: from the store when it is there, else synthesized once."""
        self.check_budget(req)
        mk, rk, rate = self.keys_for(req)
        entry = self.store.get_memory(rk)
        if entry is None:
            found = await self.store.get(rk)
            entry = found.entry if found is not None else None
        if entry is not None:
            self.served_free(req)
            return SpeechResult(entry, rk, "hit")
        (entry, outcome), leader = await self._renditions.do(
            rk, lambda: self._produce(req, mk, rk, rate)
        )
        if not leader:
            # (A leader's sentences were counted one by one, in master_audio.)
            self.served_free(req)
        if not leader or outcome == "coalesced":
            # Waited for a synthesis another request (here) or another replica (through Redis)
            # ran: not a synthesis for this response, and only one response says MISS.
            self.metrics.coalesced.inc()
            return SpeechResult(entry, rk, "coalesced")
        return SpeechResult(entry, rk, outcome)

    async def _produce(
        self, req: SpeechRequest, mk: str, rk: str, rate: int
    ) -> tuple[Entry, CacheResult]:
        """Make the rendition ``rk`` from its sentences' masters (stored ones are transcoded, the
        others synthesized concurrently); see :mod:`gateway.speech.assembly`."""
        return await self.assembler.produce(req, rk, rate)

    async def lookup(self, req: SpeechRequest) -> tuple[str, int, Entry | None]:
        """``(rendition_key, rate, stored entry or None)``: the cheap first step of a request."""
        _, rk, rate = self.keys_for(req)
        entry = self.store.get_memory(rk)
        if entry is None:
            found = await self.store.get(rk)
            entry = found.entry if found is not None else None
        return rk, rate, entry

    async def master_audio(
        self, req: SpeechRequest, on_queued: Callable[[], None] | None = None
    ) -> tuple[Audio, CacheResult]:
        """The master audio of ``req`` (one sentence) and how it was had: ``"hit"`` (stored),
        ``"miss"`` (synthesized for this call) or ``"coalesced"`` (joined one in flight).

        ``on_queued`` is called as soon as the store has answered or the synthesis is queued
        (the assembler uses it to queue a text's sentences in order)."""
        mk = self.master_key_for(req)
        found = await self.store.get(mk)
        decoded = None if found is None else await self._decode_stored(mk, found.entry, found.tier)
        if found is not None and decoded is not None:
            if on_queued is not None:
                on_queued()
            self.served_free(req)
            return decoded, "hit"
        if self._masters.running(mk):
            if on_queued is not None:
                on_queued()  # joining a synthesis already queued
        elif self.admit_synthesis is not None:
            # Charged before the master's shared production starts, not inside it: a refusal
            # (429) then fails this caller's text only, never others that join the master.
            await self.admit_synthesis(len(req.text))
        (stored, made_here), leader = await self._masters.do(
            mk, lambda: self._synthesize_once(req, mk, on_queued)
        )
        if leader and made_here:
            return stored, "miss"
        self.served_free(req)
        return stored, "coalesced"

    async def _synthesize_once(
        self, req: SpeechRequest, mk: str, on_queued: Callable[[], None] | None = None
    ) -> tuple[Audio, bool]:
        """Master ``mk`` as stored, synthesized once; once across all replicas when Redis is
        configured: another replica's master is adopted from Redis, decoded exactly as
        :func:`audio.master_of` renders a fresh one, so every replica sends the same bytes.
        The flag is True when this replica synthesized it, False when it was adopted."""

        async def produce() -> tuple[Audio, bool]:
            return await self._synthesize(req, mk, on_queued), True

        if self.cross_replica is None:
            return await produce()
        if on_queued is not None:
            on_queued()  # across replicas the order is not ours to keep: do not hold the rest

        async def adopt(entry: Entry) -> tuple[Audio, bool]:
            decoded = await self._decode_stored(mk, entry, "redis")  # adopted from Redis
            return (decoded, False) if decoded is not None else await produce()

        return await self.cross_replica.run(mk, produce, adopt)

    async def _decode_stored(self, mk: str, entry: Entry, tier: str) -> Audio | None:
        """The PCM of stored master ``mk``, or None when it does not decode: then it is
        deleted from every tier (counted as corrupt) so that it is synthesized anew, where it
        once made every new format of its sentence a 500, even after Redis was flushed."""
        loop = asyncio.get_running_loop()
        try:
            pcm, rate = await loop.run_in_executor(
                self._encode_pool, audio.decode_master, entry.audio
            )
        except audio.UndecodableAudio as exc:
            self.metrics.cache_lookups.labels(tier, "corrupt").inc()
            log.warning("stored master deleted key=%s: %s", mk, exc)
            await self.store.delete(mk)
            return None
        return Audio(pcm, rate)

    async def _synthesize(
        self, req: SpeechRequest, mk: str, on_queued: Callable[[], None] | None = None
    ) -> Audio:
        """Synthesize ``req`` (one sentence), store its master under ``mk`` and return the
        audio as stored (:func:`audio.master_of`)."""
        handle = self.models[req.model]
        if not handle.ready.is_set():
            raise Overloaded(f"model '{req.model}' is still loading", retry_after_s=2.0)
        item = SynthesisItem(req.text, req.voice, req.speed, dict(req.params), req.phonemes)
        if on_queued is not None:
            # submit() queues the item before its first suspension; this runs right after.
            asyncio.get_running_loop().call_soon(on_queued)
        result = await handle.scheduler.submit(item)
        # One job off the loop: the 16-bit samples once, the FLAC master from them, its checksum
        # and digest (a miss's CPU here is taken from the synthesis workers on the same cores).
        stored, entry = await asyncio.get_running_loop().run_in_executor(
            self._encode_pool, _master_entry, req, result
        )
        await self.store.put(mk, entry)
        log.info(
            "synthesized key=%s model=%s voice=%s audio_s=%.2f",
            mk,
            req.model,
            req.voice,
            result.duration_s,
        )
        return stored

    async def explain(self, req: SpeechRequest) -> dict[str, object]:
        """What ``req`` would say and where its audio lives, without synthesizing: its
        expansion (segments), the sentences it is made of (each a cached master) and how they
        join, and its content address (``key``: the ``X-Audio-Key`` of its answer)."""
        mk, rk, rate = self.keys_for(req)
        loop = asyncio.get_running_loop()
        parts, layout = await loop.run_in_executor(
            self._encode_pool,
            plan,
            req,
            self.assembler.splitter,
            self.assembler.max_sentence_chars,
            self.sentence_pause_ms,
            self._unsplit(req.model),
        )
        segments = req.segments or (Segment(req.text),)
        return {
            "key": rk,
            "master": mk,
            "model": req.model,
            "voice": req.voice,
            "format": req.fmt.name,
            "sample_rate": rate,
            "text": req.text,
            "expansion": [dataclasses.asdict(seg) for seg in segments],
            "sentences": [
                {
                    "text": part.text,
                    "speed": part.speed,
                    "phonemes": part.phonemes,
                    "pause_before_ms": layout.gaps_ms[i],
                    "master": self.master_key_for(part),
                }
                for i, part in enumerate(parts)
            ],
            "pause_after_ms": layout.gaps_ms[-1],
            "estimated_audio_s": round(estimated_request_s(req), 2),
        }

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
