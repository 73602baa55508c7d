"""Sentence masters: the format-free audio of one sentence (its text, engine, voice, fingerprint
and parameters), from the store, else synthesized once: single flight in this process, and across
replicas with Redis (:mod:`cache.distributed`).

:class:`Masters` is what the assembler (:mod:`gateway.speech.assembly`) asks for each
sentence of a text; it sits below the assembler, beside the store, and never calls back up into
the :class:`~gateway.speech.service.SpeechService` that owns both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from cache.distributed import CrossReplicaFlight
from cache.entry import Entry
from cache.keys import master_key, revision_fingerprint
from cache.singleflight import SingleFlight
from cache.store import TieredStore
from gateway.speech import marks
from gateway.speech.caller import caller
from gateway.speech.request import CacheResult, SpeechRequest
from gateway.speech.takes import Take, TakeGate, accept_take
from metrics import Metrics
from synth import audio
from synth.engine import Audio, Engine, ParamValue, SynthesisItem
from synth.errors import Overloaded, TakeRejected
from synth.exact_speed import SPEED_RULE
from synth.loudness import Loudness
from synth.pieces import PiecesFeed
from synth.scheduler import Scheduler

log = logging.getLogger("voxgate.speech")


# Voices whose engine defaults are remembered (more only with an upstream taking any voice id).
MAX_VOICES_REMEMBERED = 4096


@dataclass
class ModelHandle:
    """A served model: its engine (for metadata) and the scheduler that runs it."""

    name: str
    engine: Engine
    scheduler: Scheduler
    ready: asyncio.Event


def _master_entry(
    req: SpeechRequest, result: Audio, level: Loudness | None
) -> tuple[Audio, Entry, audio.FloatPCM]:
    """Freshly synthesized audio as stored (at ``level``'s loudness, when there is one), the
    master entry that stores it, and the samples the take checks judge (runs off the loop).

    The checks judge the engine's own take, before the loudness gain: their limits were set on
    the engines' and providers' own takes, so a target changes none of their verdicts."""
    pcm = result.pcm if level is None else level.apply(result.pcm, result.sample_rate)
    stored, master = audio.master_of(pcm, result.sample_rate)
    words = result.words
    if words is not None and any(w.end > len(req.text) for w in words):
        words = None  # (an engine's offsets past its text: no marks rather than wrong ones)
    alignment = marks.alignment_json(words) if words is not None else ""
    entry = req.entry(
        master, audio.MASTER_FORMAT, result.sample_rate, result.duration_s, alignment=alignment
    )
    judged = stored if level is None else result.pcm
    return Audio(stored, result.sample_rate, words, result.joined), entry, judged


class Masters:
    """Sentence masters by content address: stored, or synthesized once."""

    def __init__(
        self,
        store: TieredStore,
        models: Mapping[str, ModelHandle],
        metrics: Metrics,
        encode_pool: concurrent.futures.Executor,
        partials: PiecesFeed,
        *,
        cross_replica: CrossReplicaFlight | None = None,
        admit_synthesis: Callable[[int], Awaitable[None]] | None = None,
        takes: TakeGate,
        loudness: Loudness | None = None,
    ) -> None:
        # The level every new master is brought to (``loudness_lufs``; None: the engine's own).
        self.loudness = loudness
        # Each model's voices' languages, as the take checks read them.
        self._languages: dict[str, dict[str, str]] = {}
        # The checks every new take passes before it is stored.
        self.takes = takes
        self.store = store
        self.models = models
        self.metrics = metrics
        self.encode_pool = encode_pool
        # The sentences in flight whose pcm comes in pieces (streaming pass-through).
        self.partials = partials
        # With Redis: one replica of many synthesizes each master.
        self.cross_replica = cross_replica
        # With API keys on: called with a sentence's length before this process starts
        # synthesizing it (misses only; joining one in flight is free); raises to refuse it (a
        # key over its chars_per_minute).
        self.admit_synthesis = admit_synthesis
        # Sentence masters are shared by every rendition that says them (two formats of one
        # text, two texts with a sentence in common): one synthesis of each here, whichever
        # renditions ask. A master and whether this process made it (False: joined another's).
        self._flight: SingleFlight[tuple[Audio, bool]] = SingleFlight()
        # Each voice's engine defaults (fixed once an engine is built), read for every key.
        self._defaults: dict[tuple[str, str], Mapping[str, ParamValue]] = {}
        # Address revisions a rollout switched models to (voxgate rollout), and the
        # fingerprints they make.
        self._revisions: dict[str, str] = {}
        self._address_fingerprints: dict[str, str] = {}

    # ---- revisions (voxgate rollout) --------------------------------------------------------

    def fingerprint_of(self, model: str) -> str:
        """The fingerprint ``model``'s content addresses carry: its engine's, joined with the
        address revision a rollout switched it to (none: the engine's own, as before any
        rollout)."""
        return self._address_fingerprints.get(model) or self.models[model].engine.fingerprint

    def revision_of(self, model: str) -> str:
        """The address revision ``model`` is served at ("" before any rollout)."""
        return self._revisions.get(model, "")

    def apply_revisions(self, table: Mapping[tuple[str, str], str]) -> list[str]:
        """Serve each model at the revision ``table`` (the pin registry's: (model, engine
        fingerprint) -> revision) holds for its engine's fingerprint; the models that changed.
        A model whose engine has another fingerprint (a new voice file not deployed here yet)
        keeps its addresses."""
        changed = []
        for name, handle in self.models.items():
            revision = table.get((name, handle.engine.fingerprint), "")
            if revision == self._revisions.get(name, ""):
                continue
            changed.append(name)
            if revision:
                self._revisions[name] = revision
                self._address_fingerprints[name] = revision_fingerprint(
                    handle.engine.fingerprint, revision
                )
            else:
                self._revisions.pop(name, None)
                self._address_fingerprints.pop(name, None)
        return changed

    def passes_through(self, req: SpeechRequest, rate: int) -> bool:
        """Whether ``req``'s pcm may go to a stream as it arrives at output ``rate``: raw pcm,
        and its model's runner (here, or the host's pool process for it) hands it on in pieces,
        at that rate."""
        handle = self.models[req.model]
        return (
            # A sentence's loudness gain is known only once the whole sentence is: with a
            # target, the provider's pieces are not what is stored.
            self.loudness is None
            and req.fmt.name == "pcm"
            and handle.scheduler.runner.passes_pcm
            and handle.engine.sample_rate == rate
        )

    # ---- addressing -------------------------------------------------------------------------

    def params_for(self, req: SpeechRequest) -> dict[str, ParamValue]:
        """Everything that shapes the sound, for the master key."""
        defaults = self._defaults.get((req.model, req.voice))
        if defaults is None:
            defaults = self.models[req.model].engine.default_params(req.voice)
            if len(self._defaults) < MAX_VOICES_REMEMBERED:  # (an upstream takes any voice id)
                self._defaults[req.model, req.voice] = defaults
        params = {**defaults, **dict(req.params), "speed": req.speed}
        if req.speed != 1.0 or any(seg.rate != 1.0 for seg in req.segments):
            # Speech away from speed 1 is exactly 1/speed as long, pauses included, every
            # phoneme heard (synth/exact_speed.py, assembly.pause_at_speed): audio stored under
            # a rule before is never served for it. Speed 1's addresses, and audio, are unchanged.
            params["speed_rule"] = SPEED_RULE
        if req.phonemes:
            params["phonemes"] = True  # the same characters read as IPA are other speech
        if self.loudness is not None:
            # Another level is other audio; without a target the addresses are as they were.
            params["loudness"] = self.loudness.address
        return params

    def master_key(self, req: SpeechRequest, **extra: ParamValue) -> str:
        """The format-free key of ``req``'s text, or of its SSML expansion (``extra`` joins the
        parameters)."""
        engine = self.models[req.model].engine
        return master_key(
            text=req.text,
            engine=engine.name,
            voice=req.voice,
            fingerprint=self.fingerprint_of(req.model),
            params={**self.params_for(req), **extra},
            expansion=[seg.key_material() for seg in req.segments],
        )

    def says_whole(self, model: str) -> bool:
        """Whether ``model`` says each text whole (an upstream with ``split = "whole"``)."""
        return not self.models[model].engine.capabilities.splits_sentences

    # ---- audio ------------------------------------------------------------------------------

    async def master(
        self,
        req: SpeechRequest,
        on_queued: Callable[[], None],
        hold: Callable[[], Awaitable[object]] | None = None,
    ) -> tuple[Audio, CacheResult]:
        """The master audio of ``req`` (one sentence) and how it was had: ``"hit"`` (stored),
        ``"miss"`` (synthesized for this call) or ``"coalesced"`` (joined one in flight).

        ``on_queued`` is called as soon as the store has answered or the synthesis is queued
        (the assembler uses it to queue a text's sentences in order). ``hold`` is awaited
        after a store miss, before a synthesis not already in flight is started (a stream's
        later sentences wait for its first)."""
        mk = self.master_key(req)
        found = await self.store.get(mk)
        decoded = None if found is None else await self._decode_stored(mk, found.entry, found.tier)
        if found is not None and decoded is not None:
            on_queued()
            return decoded, "hit"
        if hold is not None and not self._flight.running(mk):
            await hold()
        if self._flight.running(mk):
            on_queued()  # joining a synthesis already queued
        elif self.admit_synthesis is not None and not caller().prepaid:
            # Charged before the master's shared production starts, not inside it: a refusal
            # (429) then fails this caller's text only, never others that join the master.
            await self.admit_synthesis(len(req.text))
        (stored, made_here), leader = await self._flight.do(
            mk, lambda: self._synthesize_once(req, mk, on_queued)
        )
        return stored, "miss" if leader and made_here else "coalesced"

    async def _synthesize_once(
        self, req: SpeechRequest, mk: str, on_queued: Callable[[], None]
    ) -> tuple[Audio, bool]:
        """Master ``mk`` as stored, synthesized once; once across all replicas when Redis is
        configured: another replica's master is adopted from Redis, decoded exactly as
        :func:`audio.master_of` renders a fresh one, so every replica sends the same bytes.
        The flag is True when this process synthesized it, False when it was adopted or the
        host's pool process joined it to another process's synthesis."""
        produce = functools.partial(self._synthesize, req, mk, on_queued)
        if self.cross_replica is None:
            return await produce()
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
                self.encode_pool, audio.decode_master, entry.audio
            )
        except audio.UndecodableAudio as exc:
            self.metrics.cache_lookups.labels(tier, "corrupt").inc()
            log.warning("stored master deleted key=%s: %s", mk, exc)
            await self.store.delete(mk)
            return None
        words = marks.stored_alignment(entry.meta.alignment, len(pcm), 1 << 30)
        return Audio(pcm, rate, words)

    async def _synthesize(
        self, req: SpeechRequest, mk: str, on_queued: Callable[[], None]
    ) -> tuple[Audio, bool]:
        """Synthesize ``req`` (one sentence), store its master under ``mk`` and return the
        audio as stored (:func:`audio.master_of`), and whether this process made it (not
        joined to another's by the host's pool process). A take the checks refuse is never
        stored: another is drawn (a provider is asked again), up to ``take_retries`` times,
        then :class:`TakeRejected` names the reasons."""
        handle = self.models[req.model]
        if not handle.ready.is_set():
            raise Overloaded(f"model '{req.model}' is still loading", retry_after_s=2.0)
        takes = 1 + (self.takes.retries if self.takes.on else 0)
        reasons: dict[str, None] = {}
        loop = asyncio.get_running_loop()
        for n in range(takes):  # take n (0 the first)
            # The provider's pcm, piece by piece, for streams that pass it on.
            partial = self.partials.open(mk) if handle.scheduler.runner.passes_pcm else None
            item = SynthesisItem(
                req.text, req.voice, req.speed, dict(req.params), req.phonemes, n, sink=partial
            )
            # submit() queues the item before its first suspension; this runs right after (a
            # retake's turn was given by the first take: setting it again changes nothing).
            loop.call_soon(on_queued)
            try:
                result = await handle.scheduler.submit(item, caller().client)
            finally:
                if partial is not None:
                    self.partials.close(mk, partial)
            # One job off the loop: the 16-bit samples once, the FLAC master from them, its
            # checksum and digest (a miss's CPU here is taken from the synthesis workers on the
            # same cores).
            stored, entry, judged = await loop.run_in_executor(
                self.encode_pool, _master_entry, req, result, self.loudness
            )
            take = Take(judged, stored.sample_rate, req.text, req, self.language_of(req))
            verdict = await accept_take(self.store, mk, entry, take, self.takes)
            if verdict.ok:
                log.info(
                    "synthesized key=%s model=%s voice=%s audio_s=%.2f",
                    mk,
                    req.model,
                    req.voice,
                    result.duration_s,
                )
                return stored, not stored.joined
            if partial is not None:
                # A stream that passed these pieces on sent what is not kept: it ends in error.
                partial.refused = verdict.reasons
            reasons.update(dict.fromkeys(verdict.reasons))
        raise TakeRejected(tuple(reasons), takes)

    def language_of(self, req: SpeechRequest) -> str:
        """The language code of ``req``'s voice ("" when its engine names none)."""
        languages = self._languages.get(req.model)
        if languages is None:
            voices = self.models[req.model].engine.voices()
            languages = self._languages[req.model] = {v.name: v.language for v in voices}
        return languages.get(req.voice, "")
