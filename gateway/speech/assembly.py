"""Sentence-level assembly: a rendition is made from per-sentence masters, joined with a pause.

Each sentence of a request is its own master entry (content key = that sentence with the request's
engine, voice and parameters), so templated prompts that share sentences share audio. A
:class:`Production` makes one rendition: it splits the text, fetches or synthesizes every sentence
master concurrently (through the model's scheduler, each sentence single-flighted), joins them,
encodes the result, and stores it under the rendition key. Streaming readers follow the same
production sentence by sentence, so a stream and a plain request for the same rendition share all
work. A reader that goes away (client disconnect) cancels nothing while anyone else still waits
for the production, and the rendition is stored at the end for them. When the last one goes, the
sentences not yet queued for synthesis are cancelled (a 60-sentence text abandoned after its first
sentence kept synthesizing for 30 s before, holding queue slots: issue 12); sentences already
queued or running finish and are stored, for the retry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from cache.entry import Entry
from gateway.speech.request import SpeechRequest
from metrics import Metrics
from synth import audio, sentences
from synth.engine import Audio

log = logging.getLogger("voxgate.speech")

# A sentence's master audio and how it was obtained: "hit" (stored), "miss" (synthesized by this
# call) or "coalesced" (joined a synthesis already in flight).
# fetch_master(request, on_queued): ``on_queued`` is called once the sentence is answered from
# the store or handed to synthesis, so the next sentence may start its own lookup.
MasterFetch = Callable[[SpeechRequest, Callable[[], None]], Awaitable[tuple[Audio, str]]]
Store = Callable[[str, Entry], Awaitable[None]]
# master_key(request, **extra): the format-free key of the request's text (extra parameters join).
MasterKey = Callable[..., str]


@dataclasses.dataclass
class Production:
    """One rendition being made. ``parts`` resolves to one future per sentence (in order), each
    giving that sentence's master audio; ``result`` to the stored entry and whether anything was
    synthesized for it."""

    key: str
    req: SpeechRequest
    rate: int
    parts: asyncio.Future[list[asyncio.Future[Audio]]]
    result: asyncio.Task[tuple[Entry, str]] | None = None
    # Readers and whole-answer waiters following this production; at 0 it is abandoned.
    waiters: int = 0
    # One event per sentence, set once it is answered from the store or queued for synthesis.
    queued: list[asyncio.Event] = dataclasses.field(default_factory=list)
    abandoned: bool = False

    async def sentence_parts(self) -> list[asyncio.Future[Audio]]:
        """The per-sentence futures (await each through :func:`asyncio.shield`)."""
        return await asyncio.shield(self.parts)

    async def entry(self) -> tuple[Entry, str]:
        """Wait for the finished, stored rendition (a cancelled waiter does not cancel it)."""
        assert self.result is not None
        return await asyncio.shield(self.result)


@dataclasses.dataclass
class SpeechStream:
    """A rendition sent as it is made: ``first`` (the format's header and the first sentence) is
    ready, the rest follows sentence by sentence from :meth:`chunks`. It follows a
    :class:`Production` without owning it: a reader that stops early cancels nothing."""

    key: str
    rate: int
    cache: str  # "miss" (this call started the production) or "coalesced"
    first: bytes
    _rest: list[asyncio.Future[Audio]]
    _encoder: audio.StreamEncoder
    _pool: concurrent.futures.Executor
    _pause_s: float
    # Seconds of audio in the bytes made so far (``first`` and the chunks read).
    audio_s: float = 0.0
    _release: Callable[[], None] | None = None

    def close(self) -> None:
        """Stop following the production (idempotent): the reader is gone or done."""
        release, self._release = self._release, None
        if release is not None:
            release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The encoded bytes after ``first``: one chunk per sentence, then the encoder's tail."""
        loop = asyncio.get_running_loop()
        for part in self._rest:
            sentence = await asyncio.shield(part)
            pcm = sentences.leading_pause(sentence.pcm, sentence.sample_rate, self._pause_s)
            self.audio_s += len(pcm) / sentence.sample_rate
            yield await loop.run_in_executor(
                self._pool, self._encoder.encode, pcm, sentence.sample_rate
            )
        yield await loop.run_in_executor(self._pool, self._encoder.finish)


def _open_encoder(
    fmt: audio.AudioFormat, rate: int, pcm: audio.FloatPCM, src_rate: int
) -> tuple[audio.StreamEncoder, bytes]:
    """A stream's encoder and its first bytes (header and first sentence); runs off the loop."""
    encoder = audio.StreamEncoder(fmt, rate)
    return encoder, encoder.header() + encoder.encode(pcm, src_rate)


class Assembler:
    """Makes renditions from sentence masters; at most one :class:`Production` per rendition key."""

    def __init__(
        self,
        *,
        fetch_master: MasterFetch,
        store_put: Store,
        encode_pool: concurrent.futures.Executor,
        metrics: Metrics,
        master_key: MasterKey | None = None,
        pause_ms: int = 250,
        max_parallel: int = 8,
        max_sentence_chars: int | None = None,
        splitter: sentences.SentenceSplitter | None = None,
    ) -> None:
        self._fetch_master = fetch_master
        self._store_put = store_put
        self.encode_pool = encode_pool
        self.metrics = metrics
        self._master_key = master_key
        self.pause_ms = pause_ms
        self.pause_s = pause_ms / 1000.0
        self.max_parallel = max(1, max_parallel)
        self.splitter = splitter or sentences.SentenceSplitter()
        self.max_sentence_chars = max_sentence_chars
        self._inflight: dict[str, Production] = {}

    def production(self, req: SpeechRequest, key: str, rate: int) -> tuple[Production, bool]:
        """The production of rendition ``key`` and whether this call started it: the one in
        flight, else a new one started now."""
        prod = self._inflight.get(key)
        if prod is not None:
            return prod, False
        loop = asyncio.get_running_loop()
        prod = Production(key=key, req=req, rate=rate, parts=loop.create_future())
        prod.parts.add_done_callback(_consume)  # an abandoned split fails it unread
        prod.result = asyncio.ensure_future(self._run(prod))
        self._inflight[key] = prod
        prod.result.add_done_callback(functools.partial(self._finished, key, prod))
        return prod, True

    def _finished(self, key: str, prod: Production, task: asyncio.Task[tuple[Entry, str]]) -> None:
        if self._inflight.get(key) is prod:
            del self._inflight[key]
        # Consume outcomes nobody awaited (every reader gone) so asyncio does not warn about them.
        _consume(task)

    def _join(self, prod: Production) -> None:
        prod.waiters += 1

    def _leave(self, prod: Production) -> None:
        """One waiter fewer; the last one out abandons what is not yet queued."""
        prod.waiters -= 1
        if prod.waiters > 0 or prod.result is None or prod.result.done():
            return
        if prod.parts.done():
            pending = [
                part
                for part, queued in zip(prod.parts.result(), prod.queued, strict=True)
                if not part.done() and not queued.is_set()
            ]
            if not pending:
                return  # every sentence is queued or done: let it finish and be stored
        else:
            pending = []  # still splitting: nothing is queued yet
        prod.abandoned = True
        # A new request for this rendition starts afresh rather than join one being taken apart.
        if self._inflight.get(prod.key) is prod:
            del self._inflight[prod.key]
        if not pending:
            prod.result.cancel()
            return
        for part in pending:
            part.cancel()
        self.metrics.sentences_abandoned.inc(len(pending))
        log.info(
            "production abandoned key=%s: %d sentences not synthesized", prod.key, len(pending)
        )

    def cancel_all(self) -> None:
        """Stop every production in flight (shutdown: nobody is left to store for)."""
        for prod in list(self._inflight.values()):
            if prod.result is not None:
                prod.result.cancel()

    async def produce(self, req: SpeechRequest, key: str, rate: int) -> tuple[Entry, str]:
        """Make (or join the making of) rendition ``key`` and return ``(entry, outcome)``: the
        outcome is ``"miss"`` when a sentence was synthesized for it here, ``"coalesced"`` when
        one came from a synthesis another replica ran, else ``"hit"`` (stored masters)."""
        prod, _ = self.production(req, key, rate)
        self._join(prod)
        try:
            return await prod.entry()
        finally:
            self._leave(prod)

    async def stream(self, req: SpeechRequest, key: str, rate: int) -> SpeechStream:
        """Start (or join) the production of ``key`` and return it as a stream once its first
        sentence is ready: a failure up to then (a full queue, an engine error) is raised here,
        while the caller can still answer it with an error status."""
        prod, leader = self.production(req, key, rate)
        self._join(prod)
        try:
            parts = await prod.sentence_parts()
            first = await asyncio.shield(parts[0])
            # One encoder for the whole stream (continuous MP3/AAC: no encoder delay at joins).
            encoder, data = await asyncio.get_running_loop().run_in_executor(
                self.encode_pool, _open_encoder, req.fmt, rate, first.pcm, first.sample_rate
            )
        except BaseException:
            self._leave(prod)
            raise
        return SpeechStream(
            key=key,
            rate=rate,
            cache="miss" if leader else "coalesced",
            first=data,
            _rest=parts[1:],
            _encoder=encoder,
            _pool=self.encode_pool,
            _pause_s=self.pause_s,
            audio_s=first.duration_s,
            _release=functools.partial(self._leave, prod),
        )

    async def _run(self, prod: Production) -> tuple[Entry, str]:
        req = prod.req
        loop = asyncio.get_running_loop()
        try:
            texts = await loop.run_in_executor(
                self.encode_pool, self.splitter.split, req.text, self.max_sentence_chars
            )
        except BaseException as exc:
            prod.parts.set_exception(exc)
            raise
        gate = asyncio.Semaphore(self.max_parallel)
        outcomes: list[str] = []

        # Sentences must reach the synthesis queue in text order, so the first sentence (what a
        # stream sends first) is synthesized first. A FIFO semaphore is not enough: each
        # sentence first looks itself up in the store (disk and Redis I/O), and those lookups
        # finish in any order. So sentence i starts its lookup only once sentence i-1 has been
        # answered from the store or queued for synthesis; synthesis itself stays concurrent.
        turns = prod.queued = [asyncio.Event() for _ in texts]

        async def one(i: int, text: str) -> Audio:
            async with gate:
                if i:
                    await turns[i - 1].wait()
                try:
                    master, outcome = await self._fetch_master(
                        dataclasses.replace(req, text=text), turns[i].set
                    )
                finally:
                    turns[i].set()
            outcomes.append(outcome)
            self.metrics.sentences.labels(outcome).inc()
            return master

        parts: list[asyncio.Future[Audio]] = [
            asyncio.ensure_future(one(i, t)) for i, t in enumerate(texts)
        ]
        for part in parts:
            part.add_done_callback(_consume)
        prod.parts.set_result(parts)
        # On a failure the other sentences are left to finish: their masters are stored for the
        # retry, and a stream reader following them never sees a part cancelled under it.
        masters = await asyncio.gather(*parts)
        rate_in = masters[0].sample_rate
        pcm = sentences.join([m.pcm for m in masters], rate_in, self.pause_s)
        data = await loop.run_in_executor(
            self.encode_pool, audio.render, pcm, rate_in, req.fmt, prod.rate
        )
        synthesized = "miss" in outcomes
        outcome = "miss" if synthesized else "coalesced" if "coalesced" in outcomes else "hit"
        if not synthesized:
            self.metrics.transcodes.labels(req.fmt.name).inc()
        # The rendition names its masters, so another encoding of it is a transcode of them
        # (gateway.speech.telephony), whoever asks and by whichever address.
        recipe: dict[str, Any] = {}
        if self._master_key is not None:
            recipe = {
                "master": self._master_key(req, sentence_pause_ms=self.pause_ms),
                "parts": tuple(self._master_key(dataclasses.replace(req, text=t)) for t in texts),
                "pause_ms": self.pause_ms,
            }
        entry = req.entry(data, req.fmt, prod.rate, len(pcm) / rate_in, **recipe)
        await self._store_put(prod.key, entry)
        if len(texts) > 1:
            log.debug(
                "assembled key=%s sentences=%d synthesized=%s", prod.key, len(texts), synthesized
            )
        return entry, outcome


def _consume(fut: asyncio.Future[Any]) -> None:
    # Retrieve an outcome nobody awaited (every reader gone) so asyncio does not warn about it.
    if not fut.cancelled():
        fut.exception()
