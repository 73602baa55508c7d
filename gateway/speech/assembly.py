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
sentence kept synthesizing for 30 s before, holding queue slots); sentences already
queued or running finish and are stored, for the retry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from prometheus_client import Counter

from cache.entry import Entry
from gateway.errors import TooManyRequests
from gateway.speech import marks
from gateway.speech.caller import caller
from gateway.speech.ledger import Ledger, Made
from gateway.speech.masters import Masters
from gateway.speech.request import CacheResult, SpeechRequest, segment_speed
from gateway.speech.takes import Take, accept_take
from synth import audio, sentences
from synth.engine import Audio
from synth.errors import TakeRejected
from synth.pieces import Pieces
from synth.scheduler import ClientShares

log = logging.getLogger("voxgate.speech")


@dataclasses.dataclass
class Production:
    """One rendition being made. ``parts`` resolves to one future per sentence (in order), each
    giving that sentence's master audio; ``result`` to the stored rendition and how it was had
    (:class:`~gateway.speech.ledger.Made`)."""

    key: str
    req: SpeechRequest
    rate: int
    parts: asyncio.Future[list[asyncio.Future[Audio]]]
    # Set as soon as the production is built (it runs with the production in hand).
    result: asyncio.Task[Made] = dataclasses.field(init=False)
    # Readers and whole-answer waiters following this production; at 0 it is abandoned.
    waiters: int = 0
    # One event per sentence, set once it is answered from the store or queued for synthesis.
    queued: list[asyncio.Event] = dataclasses.field(default_factory=list)
    # How the sentences are joined, and the one-sentence requests (set with ``parts``, before
    # anything reads them).
    layout: Layout = dataclasses.field(init=False)
    sentences: list[SpeechRequest] = dataclasses.field(default_factory=list)
    # How each sentence was had ("hit", "miss", "coalesced"), by index, once it has been.
    outcomes: dict[int, CacheResult] = dataclasses.field(default_factory=dict)
    # Started by a stream: the first sentence is synthesized alone (see ``Assembler._run``).
    first_alone: bool = False

    async def made(self) -> Made:
        """Wait for the finished, stored rendition (a cancelled waiter does not cancel it)."""
        return await asyncio.shield(self.result)


@dataclasses.dataclass(frozen=True)
class Opening:
    """How a stream starts: ``first`` (the format's header and the first sentence, or the
    first pieces of its pcm passing through), the one encoder of the stream (continuous
    MP3/AAC: no encoder delay at joins), the rate its sentences come at and the seconds of audio
    in ``first``. Passing pcm through: each sentence's master key (None where one cannot pass:
    its edges trimmed), and the rest of the first sentence's pieces when it passed."""

    first: bytes
    encoder: audio.StreamEncoder
    source_rate: int
    audio_s: float
    keys: list[str | None] | None = None
    first_rest: AsyncIterator[bytes] | None = None
    first_call: Pieces | None = None


class SpeechStream:
    """A rendition sent as it is made: ``first`` is ready, the rest follows sentence by
    sentence from :meth:`chunks`. It follows a :class:`Production` without owning it: a reader
    that stops early cancels nothing (the assembler's one abandonment rule decides)."""

    def __init__(
        self, production: Production, assembler: Assembler, opening: Opening, *, leader: bool
    ) -> None:
        self.key = production.key
        self.rate = production.rate
        self.leader = leader
        # The header goes out with the first sentence: COALESCED when this request joined a
        # production here, or that sentence came from another process's or replica's synthesis.
        first_had = production.outcomes.get(0)
        self.cache: CacheResult = "miss" if leader and first_had != "coalesced" else "coalesced"
        self.first = opening.first
        # Seconds of audio in the bytes made so far (``first`` and the chunks read).
        self.audio_s = opening.audio_s
        # The marks of the piece last made (``first``'s, then each chunk's, read before it is
        # sent: SSE's speech.marks.delta).
        self.piece_marks: list[marks.Mark] = []
        self._production = production
        self._opening = opening
        self._pool = assembler.encode_pool
        self._feed = assembler.partials if opening.keys is not None else None
        self._release: Callable[[], None] | None = functools.partial(assembler.leave, production)
        # Where the next sentence starts (in samples at the source rate), and where in the
        # rendition's text the last one placed ended.
        self._samples = 0
        self._cursor = 0

    def place(self, i: int, sentence: Audio, piece_samples: int) -> None:
        """The marks of sentence ``i`` (made into a piece of ``piece_samples``), placed after
        what was streamed before it; ``piece_marks`` holds them until the next piece."""
        prod = self._production
        layout = prod.layout
        offsets = sentences.part_offsets(
            [sentence.pcm],
            sentence.sample_rate,
            [layout.gaps_ms[i] / 1000.0, 0.0],
            [layout.trims[i], layout.trims[i + 1]],
        )
        at, head, kept = offsets[0]
        found = None
        text, whole = prod.sentences[i].text, prod.req.text
        start = whole.find(text, self._cursor)
        if start >= 0:
            self._cursor = start + len(text)
            # The rendition's text up to this sentence, so offsets index the whole text.
            found = marks.compose(
                whole, [text], [sentence], [(self._samples + at, head, kept)], cursor=start
            )
        self.piece_marks = found or []
        self._samples += piece_samples

    def close(self) -> None:
        """Stop following the production (idempotent): the reader is gone or done."""
        release, self._release = self._release, None
        if release is not None:
            release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The encoded bytes after ``first``: one chunk per sentence (or, passing through, each
        piece as the provider sends it), then the encoder's tail."""
        loop = asyncio.get_running_loop()
        prod, opening = self._production, self._opening
        layout, parts = prod.layout, prod.parts.result()
        encoder, rate = opening.encoder, opening.source_rate
        if opening.first_rest is not None:
            async for piece in opening.first_rest:
                self.audio_s += len(piece) / 2 / rate
                yield piece
            await asyncio.shield(parts[0])  # a failure after the pieces ends the stream
            _sent_what_is_kept(opening.first_call)
        for i, part in enumerate(parts[1:], start=1):
            passing = (
                await self._feed.sentence(mk, part)
                if self._feed is not None and opening.keys and (mk := opening.keys[i]) is not None
                else None
            )
            if passing is not None:
                gap = round(layout.gaps_ms[i] / 1000.0 * rate)
                if gap:
                    self.audio_s += gap / rate
                    yield bytes(2 * gap)
                async for piece in passing.follow():
                    self.audio_s += len(piece) / 2 / rate
                    yield piece
                await asyncio.shield(part)
                _sent_what_is_kept(passing)
                continue
            sentence = await asyncio.shield(part)
            rate = sentence.sample_rate
            pcm = layout.piece(i, sentence.pcm, rate)
            self.place(i, sentence, len(pcm))
            self.audio_s += len(pcm) / rate
            yield await loop.run_in_executor(self._pool, encoder.encode, pcm, rate)
        trailing_s = layout.gaps_ms[-1] / 1000.0
        if trailing_s > 0:
            # An SSML break at the very end: its silence is part of the audio.
            tail = np.zeros(round(trailing_s * rate), dtype=np.float32)
            self.audio_s += len(tail) / rate
            self.piece_marks = []
            yield await loop.run_in_executor(self._pool, encoder.encode, tail, rate)
        # The stored rendition, before the last chunk: a client that reads X-Audio-Key when the
        # stream ends finds the file (GET /v1/audio/{key}, another format).
        try:
            await prod.made()
        except Exception as exc:  # the audio went out whole: only its storing failed
            log.warning("streamed key=%s was not stored: %s", self.key, type(exc).__name__)
        yield await loop.run_in_executor(self._pool, encoder.finish)


def _sent_what_is_kept(call: Pieces | None) -> None:
    """A stream passed ``call``'s pcm on as it came; when the take checks then refused that take
    (a retake is stored in its place), what went out is not what is kept: the stream ends in
    error, never as if it were whole."""
    if call is not None and call.refused:
        raise TakeRejected(call.refused, 1)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a rendition's sentences join: ``gaps_ms[i]`` of silence before sentence ``i`` (and
    ``gaps_ms[-1]`` after the last); where ``trims[i]``, the sentences beside gap ``i`` lose
    their edge silence there (an SSML break or rate change: the gap is then the silence)."""

    gaps_ms: tuple[int, ...]
    trims: tuple[bool, ...]

    @property
    def exact(self) -> bool:
        """Whether the join is not plain text's (one pause between sentences, nothing at the
        edges): SSML breaks or rates (sentence pauses at several speeds)."""
        edges = self.gaps_ms[0] > 0 or self.gaps_ms[-1] > 0
        return any(self.trims) or edges or len(set(self.gaps_ms[1:-1])) > 1

    @property
    def pause_ms(self) -> int:
        """The one pause between sentences of a join that is not :attr:`exact` (0 for one
        sentence)."""
        return self.gaps_ms[1] if len(self.gaps_ms) > 2 else 0

    def piece(self, i: int, pcm: audio.FloatPCM, rate: int) -> audio.FloatPCM:
        """Sentence ``i`` as it is streamed: its gap before it, its edges trimmed where due
        (the pieces of a stream add up to :func:`join`'s whole)."""
        pcm = sentences.trim_edges(pcm, self.trims[i], self.trims[i + 1])
        gap_s = self.gaps_ms[i] / 1000.0
        return sentences.leading_pause(pcm, rate, gap_s) if gap_s > 0 else pcm


def join_parts(
    pcms: list[audio.FloatPCM],
    rate: int,
    gaps_ms: tuple[int, ...],
    trims: tuple[bool, ...],
    pause_ms: int,
) -> audio.FloatPCM:
    """Sentences joined as a rendition joins them: at the exact ``gaps_ms`` of a
    :attr:`Layout.exact` join (as its recipe stores them), else ``pause_ms`` between each."""
    if gaps_ms:
        return sentences.join_gaps(pcms, rate, [g / 1000.0 for g in gaps_ms], trims)
    return sentences.join(pcms, rate, pause_ms / 1000.0)


def plan(
    req: SpeechRequest,
    splitter: sentences.SentenceSplitter,
    max_chars: int | None,
    pause_ms: int,
    whole: bool = False,
) -> tuple[list[SpeechRequest], Layout]:
    """The one-sentence requests ``req`` is made of, in order, and how they join; runs off the
    loop (it splits text).

    Plain text: its sentences, ``pause_ms`` at the request's speed between them. An SSML
    expansion: each segment's sentences at the segment's rate (a phoneme segment whole),
    ``pause_ms`` at the segment's speed between sentences of a segment, the segment's own pause
    after it (exact: an SSML break; ``pause_ms`` at the segment's speed where it has none,
    nothing after the last). Each sentence request is plain, so a sentence shared with plain text
    shares its master.
    With ``whole`` (a model that says each text in one call: an upstream's ``split = "whole"``)
    texts and segments are not split into sentences.
    """
    if not req.segments:
        texts = [req.text] if whole else splitter.split(req.text, max_chars)
        pause = pause_at_speed(pause_ms, req.speed)
        gaps_ms = (0, *([pause] * (len(texts) - 1)), 0)
        layout = Layout(gaps_ms, (False,) * len(gaps_ms))
        return [dataclasses.replace(req, text=t) for t in texts], layout
    parts: list[SpeechRequest] = []
    gaps = [0]
    trims = [False]
    for i, seg in enumerate(req.segments):
        if seg.words:
            speed = segment_speed(req.speed, seg.rate)
            texts = [seg.words] if seg.phonemes or whole else splitter.split(seg.words, max_chars)
            for j, text in enumerate(texts):
                if j:
                    gaps[-1] += pause_at_speed(pause_ms, speed)
                parts.append(
                    dataclasses.replace(
                        req, text=text, speed=speed, segments=(), phonemes=seg.phonemes
                    )
                )
                gaps.append(0)
                trims.append(False)
        if seg.pause_ms is not None:
            gaps[-1] += seg.pause_ms
            trims[-1] = True
        elif seg.words and i < len(req.segments) - 1:  # (nothing after the last)
            gaps[-1] += pause_at_speed(pause_ms, segment_speed(req.speed, seg.rate))
    return parts, Layout(tuple(gaps), tuple(trims))


def pause_at_speed(pause_ms: int, speed: float) -> int:
    """The sentence pause of speech at ``speed``: scaled as the speech is (twice as fast, half
    the pause), so a text's whole length is 1/speed of speed 1's. SSML breaks are not scaled."""
    return pause_ms if speed == 1.0 else round(pause_ms / speed)


def _open_encoder(
    fmt: audio.AudioFormat, rate: int, pcm: audio.FloatPCM, src_rate: int
) -> tuple[audio.StreamEncoder, bytes]:
    """A stream's encoder and its first bytes (header and first sentence); runs off the loop."""
    encoder = audio.StreamEncoder(fmt, rate)
    return encoder, encoder.header() + encoder.encode(pcm, src_rate)


class RenderShare:
    """Each client's share of the renditions being made at once: a rendition of stored masters
    (a new format or sample rate of audio said before) is a transcode, CPU that no synthesis
    queue bounds, so a client asking for many formats of one text could take every encoder.
    The client is the caller's (:mod:`gateway.speech.caller`: the API key's name, else the
    address); counts live in ``shares`` (the host's, in the gateway)."""

    def __init__(self, shares: ClientShares, limit: int, refused: Counter) -> None:
        self.shares = shares
        self.limit = limit
        self.refused = refused

    def take(self) -> Callable[[], None] | None:
        """Count one rendition for the calling client (429 ``render_share`` past its limit); the
        call that gives it back, or None for no client (the CLI, a catalogue warm-up)."""
        client = caller().client
        if not client:
            return None
        name = "render:" + client
        if not self.shares.take(name, self.limit):
            self.refused.inc()
            raise TooManyRequests(
                f"this client already has {self.limit} renditions being made (new texts, formats "
                "or sample rates; renders_per_client): retry when they are done",
                code="render_share",
                retry_after_s=1.0,
            )
        return functools.partial(self.shares.give, name)


class Assembler:
    """Makes renditions from sentence masters: the one registry of productions, at most one per
    rendition key, that whole answers and streams alike join, with one abandonment rule
    (:meth:`leave`)."""

    def __init__(
        self,
        *,
        masters: Masters,
        ledger: Ledger,
        render_share: RenderShare | None = None,
        pause_ms: int = 250,
        max_parallel: int = 8,
        max_sentence_chars: int | None = None,
    ) -> None:
        self._masters = masters
        # The masters' store and encoder threads: the renditions go where their sentences do.
        self._store = masters.store
        self.encode_pool = masters.encode_pool
        self.ledger = ledger
        # Streaming pass-through: the sentences in flight whose pcm arrives in pieces (the
        # masters open them), for streams to pass on.
        self.partials = masters.partials
        # A client's share of the productions started at once (None: no limit).
        self.render_share = render_share
        self.pause_ms = pause_ms
        self.max_parallel = max(1, max_parallel)
        self.splitter = sentences.SentenceSplitter()
        self.max_sentence_chars = max_sentence_chars
        self._inflight: dict[str, Production] = {}

    def join(
        self, req: SpeechRequest, key: str, rate: int, *, first_alone: bool = False
    ) -> tuple[Production, bool]:
        """Follow the production of rendition ``key`` (until :meth:`leave`), and whether this
        call started it: the one in flight, else a new one started now (``first_alone``: for a
        stream, whose first sentence is synthesized before the others are)."""
        prod = self._inflight.get(key)
        leader = prod is None
        if prod is None:
            # The client that starts a production holds a share of them until it is done (a
            # 429 here starts nothing); joining one costs nothing.
            release = self.render_share.take() if self.render_share is not None else None
            loop = asyncio.get_running_loop()
            prod = Production(
                key=key, req=req, rate=rate, parts=loop.create_future(), first_alone=first_alone
            )
            prod.parts.add_done_callback(_consume)  # an abandoned split fails it unread
            prod.result = asyncio.ensure_future(self._run(prod))
            self._inflight[key] = prod
            prod.result.add_done_callback(functools.partial(self._finished, key, prod))
            if release is not None:
                prod.result.add_done_callback(lambda _: release())
        prod.waiters += 1
        self.ledger.metrics.rendition_waiters.inc()
        return prod, leader

    def _finished(self, key: str, prod: Production, task: asyncio.Task[Made]) -> None:
        if self._inflight.get(key) is prod:
            del self._inflight[key]
        _consume(task)

    def leave(self, prod: Production) -> None:
        """One follower fewer; the last one out abandons what is not yet queued."""
        prod.waiters -= 1
        self.ledger.metrics.rendition_waiters.dec()
        if prod.waiters > 0 or prod.result.done():
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
        # A new request for this rendition starts afresh rather than join one being taken apart.
        if self._inflight.get(prod.key) is prod:
            del self._inflight[prod.key]
        if not pending:
            prod.result.cancel()
            return
        for part in pending:
            part.cancel()
        self.ledger.metrics.sentences_abandoned.inc(len(pending))
        log.info(
            "production abandoned key=%s: %d sentences not synthesized", prod.key, len(pending)
        )

    def cancel_all(self) -> None:
        """Stop every production in flight (shutdown: nobody is left to store for)."""
        for prod in list(self._inflight.values()):
            prod.result.cancel()

    async def produce(self, req: SpeechRequest, key: str, rate: int) -> tuple[Made, bool]:
        """Make (or join the making of) rendition ``key``: its :class:`Made` and whether this
        call started the production (one that joined it says COALESCED: only one response may
        say MISS for one synthesis)."""
        prod, leader = self.join(req, key, rate)
        try:
            return await prod.made(), leader
        finally:
            self.leave(prod)

    async def stream(
        self, req: SpeechRequest, key: str, rate: int, *, whole_if_one: bool = False
    ) -> SpeechStream | tuple[Made, bool]:
        """Start (or join) the production of ``key`` and return it as a stream once its first
        sentence is ready: a failure up to then (a full queue, an engine error) is raised here,
        while the caller can still answer it with an error status. With ``whole_if_one`` (a
        stream only where it helps), a rendition of one sentence, or one whose sentences were
        all stored, is awaited whole instead, as :meth:`produce` answers; unless that one
        sentence's pcm passes through as the provider sends it (there the stream is what
        helps)."""
        prod, leader = self.join(req, key, rate, first_alone=True)
        try:
            parts = await asyncio.shield(prod.parts)  # (await each through a shield too)
            keys = self._passing_keys(req, rate, prod)
            whole = False
            if whole_if_one:
                # Every sentence answered from the store or queued (lookups, no synthesis): a
                # stored one has resolved by then, so "all done" means nothing is synthesized.
                # The first one queued and not resolved settles it (a stream): the later
                # lookups are not waited for (a stream's later sentences are queued only once
                # its first is made, and the first chunk must not wait for their turns).
                for turn, part in zip(prod.queued, parts, strict=True):
                    await turn.wait()
                    if not part.done():
                        break
                whole = len(parts) == 1 or all(part.done() for part in parts)
            if keys is not None and not (whole and parts[0].done()):
                passing = await self._pass_through(req, prod, keys, leader)
                if passing is not None:
                    return passing
            if whole:
                made = await prod.made()
                self.leave(prod)
                return made, leader
            first = await asyncio.shield(parts[0])
            pcm = prod.layout.piece(0, first.pcm, first.sample_rate)
            encoder, data = await asyncio.get_running_loop().run_in_executor(
                self.encode_pool, _open_encoder, req.fmt, rate, pcm, first.sample_rate
            )
        except BaseException:
            self.leave(prod)
            raise
        # The sentences after a stored first one may still pass through.
        opening = Opening(data, encoder, first.sample_rate, len(pcm) / first.sample_rate, keys)
        stream = SpeechStream(prod, self, opening, leader=leader)
        stream.place(0, first, len(pcm))
        return stream

    def _passing_keys(
        self, req: SpeechRequest, rate: int, prod: Production
    ) -> list[str | None] | None:
        """Per sentence of ``prod``, the master key a stream follows the pieces of (None for a
        sentence made whole: its edges trimmed beside an SSML break); None when nothing may
        pass (another format than raw pcm, another rate than the provider's, a model whose
        calls do not come in pieces here)."""
        layout = prod.layout
        if not self._masters.passes_through(req, rate):
            return None
        return [
            None if layout.trims[i] or layout.trims[i + 1] else self._masters.master_key(sentence)
            for i, sentence in enumerate(prod.sentences)
        ]

    async def _pass_through(
        self, req: SpeechRequest, prod: Production, keys: list[str | None], leader: bool
    ) -> SpeechStream | None:
        """``prod`` as a stream whose first sentence passes the provider's pcm on as it
        arrives; None when that sentence comes whole (stored, or its call sent no piece)."""
        layout, mk, rate = prod.layout, keys[0], prod.rate
        if mk is None:
            return None
        call = await self.partials.sentence(mk, prod.parts.result()[0])
        if call is None:
            return None
        pieces = call.follow()
        head = await anext(pieces, None)
        if head is None:  # the call ended without a piece: the whole (or its failure) decides
            await pieces.aclose()
            return None
        first = bytes(2 * round(layout.gaps_ms[0] / 1000.0 * rate)) + head
        encoder = audio.StreamEncoder(req.fmt, rate)
        opening = Opening(first, encoder, rate, len(first) / 2 / rate, keys, pieces, call)
        return SpeechStream(prod, self, opening, leader=leader)

    async def split(self, req: SpeechRequest) -> tuple[list[SpeechRequest], Layout]:
        """The one-sentence requests ``req`` is made of and how they join (:func:`plan`)."""
        whole = self._masters.says_whole(req.model)
        args = (req, self.splitter, self.max_sentence_chars, self.pause_ms, whole)
        if not req.segments and (whole or self.splitter.whole(req.text, self.max_sentence_chars)):
            # One sentence on its face: nothing to split, no trip to a thread and back.
            return plan(*args)
        return await asyncio.get_running_loop().run_in_executor(self.encode_pool, plan, *args)

    async def _run(self, prod: Production) -> Made:
        req = prod.req
        loop = asyncio.get_running_loop()
        try:
            texts, layout = await self.split(req)
        except BaseException as exc:
            prod.parts.set_exception(exc)
            raise
        prod.layout = layout
        prod.sentences = texts
        gate = asyncio.Semaphore(self.max_parallel)

        # Sentences must reach the synthesis queue in text order, so the first sentence (what a
        # stream sends first) is synthesized first. A FIFO semaphore is not enough: each
        # sentence first looks itself up in the store (disk and Redis I/O), and those lookups
        # finish in any order. So sentence i starts its lookup only once sentence i-1 has been
        # answered from the store or queued for synthesis; synthesis itself stays concurrent.
        turns = prod.queued = [asyncio.Event() for _ in texts]

        # A stream's first sentence is what its listener waits for: the later sentences that
        # must be synthesized start once it is made, so it has the cores to itself (run beside
        # the second sentence, its synthesis took 1.3x as long on an idle 2-core machine and
        # 2x on a loaded one). Their lookups still go ahead, so a text whose later sentences
        # are stored is still known at once; the delay to the second sentence (one sentence's
        # synthesis) is far below the first sentence's playing time.
        async def first_made() -> None:
            await asyncio.wait([parts[0]])

        async def one(i: int, sentence: SpeechRequest) -> Audio:
            hold = first_made if i and prod.first_alone else None
            async with gate:
                if i:
                    await turns[i - 1].wait()
                try:
                    master, outcome = await self._masters.master(sentence, turns[i].set, hold)
                finally:
                    turns[i].set()
            prod.outcomes[i] = outcome  # before the part resolves: a stream reads it then
            self.ledger.sentence(outcome)
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
        outcomes = [prod.outcomes[i] for i in range(len(texts))]
        synthesized = "miss" in outcomes
        made_as: CacheResult = (
            "miss" if synthesized else "coalesced" if "coalesced" in outcomes else "hit"
        )
        # The rendition names its masters, so another encoding of it is a transcode of them
        # (gateway.speech.telephony), whoever asks and by whichever address.
        recipe: dict[str, Any] = {
            "master": self._masters.master_key(req, sentence_pause_ms=self.pause_ms),
            "parts": tuple(self._masters.master_key(t) for t in texts),
            # The pause as joined (at the speech's speed): what a transcode joins with.
            "pause_ms": layout.pause_ms if len(texts) > 1 else self.pause_ms,
            "gaps_ms": layout.gaps_ms if layout.exact else (),
            "trims": layout.trims if layout.exact else (),
        }
        entry, pcm = await loop.run_in_executor(
            self.encode_pool, _rendition_entry, req, masters, layout, prod.rate, recipe, texts
        )
        await accept_take(
            self._store, prod.key, entry, Take(pcm, masters[0].sample_rate, req.text, req)
        )
        free = sum(len(t.text) for t, had in zip(texts, outcomes, strict=True) if had != "miss")
        made = Made(entry, made_as, free)
        self.ledger.produced(req, made)
        if len(texts) > 1:
            log.debug(
                "assembled key=%s sentences=%d synthesized=%s", prod.key, len(texts), synthesized
            )
        return made


def _rendition_entry(
    req: SpeechRequest,
    masters: list[Audio],
    layout: Layout,
    rate: int,
    recipe: dict[str, Any],
    texts: list[SpeechRequest],
) -> tuple[Entry, audio.FloatPCM]:
    """The rendition of ``req`` made of ``masters`` (of its sentences ``texts``, in order) and
    the entry that stores it: the
    join, the encoding, its checksum and digest, and its speech marks, in one job off the
    loop; with the joined samples."""
    rate_in = masters[0].sample_rate
    pcms = [m.pcm for m in masters]
    gaps_ms = layout.gaps_ms if layout.exact else ()
    pcm = join_parts(pcms, rate_in, gaps_ms, layout.trims, layout.pause_ms)
    gaps = [g / 1000.0 for g in gaps_ms] if gaps_ms else None
    data = audio.render(pcm, rate_in, req.fmt, rate)
    found = marks.compose(
        req.text,
        [t.text for t in texts],
        masters,
        sentences.part_offsets(pcms, rate_in, gaps, layout.trims, layout.pause_ms / 1000.0),
        marks.ssml_positions(req.segments),
        len(pcm),
    )
    entry = req.entry(
        data,
        req.fmt,
        rate,
        len(pcm) / rate_in,
        marks=marks.to_ndjson(found) if found is not None else "",
        **recipe,
    )
    return entry, pcm


def _consume(fut: asyncio.Future[Any]) -> None:
    # Retrieve an outcome nobody awaited (every reader gone) so asyncio does not warn about it.
    if not fut.cancelled():
        fut.exception()
