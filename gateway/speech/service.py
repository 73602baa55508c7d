"""The speech path shared by every endpoint and the CLI: key, store lookup, single flight, synthesis.

A request has two content addresses: the *master* (format-free: text, engine, voice, fingerprint,
parameters) whose value is lossless PCM at the engine's rate, and the *rendition* (master + format +
sample rate) whose value is the bytes sent to the client. A new format or rate of audio already
synthesized is a transcode of the master, never a synthesis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence

from cache.entry import Entry
from cache.keys import rendition_key
from gateway.errors import BadRequest
from gateway.memo import BoundedMemo
from gateway.speech.assembly import Assembler, SpeechStream
from gateway.speech.caller import prepaid
from gateway.speech.ledger import Made
from gateway.speech.masters import Masters
from gateway.speech.quarantine import Quarantine
from gateway.speech.request import (
    Segment,
    SpeechRequest,
    SpeechResult,
    segment_speed,
)
from gateway.speech.telephony import Transcoder
from gateway.speech.vocabulary import Vocabulary
from synth import audio, sentences

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


class SpeechService:
    """Answers speech requests from the store, synthesizing each distinct master once."""

    def __init__(
        self,
        *,
        masters: Masters,
        assembler: Assembler,
        transcoder: Transcoder,
        vocabulary: Vocabulary,
        rejects: Quarantine,
        max_audio_s: float,
    ) -> None:
        # The store, models, ledger and encoder threads are the parts' own: one of each.
        self.store = masters.store
        # Where refused takes are kept for review.
        self.rejects = rejects
        self.models = dict(masters.models)
        self.masters = masters
        self.assembler = assembler
        self.transcoder = transcoder
        self.ledger = assembler.ledger
        # Owned here: shut down with the service (the parts above share it).
        self._encode_pool = assembler.encode_pool
        self.max_audio_s = max_audio_s
        self.sentence_pause_ms = assembler.pause_ms
        # Content addresses of recent requests: hashing the canonical JSON is most of a hit's CPU
        # cost, and the same few thousand prompts repeat. Bounded; evicts oldest first.
        self._key_memo: BoundedMemo[tuple[SpeechRequest, str], tuple[str, str, int]] = BoundedMemo(
            KEY_MEMO_SIZE
        )
        # What requests may name, for parsing (gateway.api), which never sees this service.
        self.vocabulary = vocabulary
        # ``_addressing`` is replaced at every switch of an address revision (voxgate rollout),
        # so a request carrying keys computed before it computes them again.
        self._addressing = object()

    async def close(self) -> None:
        """Stop productions in flight and release the encoder threads (joining threads blocks:
        done off the loop)."""
        self.assembler.cancel_all()
        await asyncio.to_thread(self._encode_pool.shutdown, wait=True, cancel_futures=True)

    # ---- addressing -------------------------------------------------------------------------

    def revision_of(self, model: str) -> str:
        """The address revision ``model`` is served at ("" before any rollout)."""
        return self.masters.revision_of(model)

    def apply_revisions(self, table: Mapping[tuple[str, str], str]) -> list[str]:
        """Serve each model at the revision ``table`` (the pin registry's) holds for its
        engine's fingerprint (:meth:`Masters.apply_revisions`); the models that changed."""
        changed = self.masters.apply_revisions(table)
        if changed:
            self._addressing = object()
        return changed

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
        if cached is not None and cached[0] is self._addressing:
            return cached[1]
        # The request's value (every field; ``keys_cache`` is none) and its model's fingerprint.
        memo_key = (req, self.masters.fingerprint_of(req.model))
        keys = self._key_memo.get(memo_key)
        if keys is None:
            engine = self.models[req.model].engine
            assembled = self.masters.master_key(req, sentence_pause_ms=self.sentence_pause_ms)
            rate = audio.output_rate(req.fmt, engine.sample_rate, req.sample_rate)
            rk = rendition_key(assembled, fmt=req.fmt.name, sample_rate=rate)
            keys = self.masters.master_key(req), rk, rate
            self._key_memo.put(memo_key, keys)
        object.__setattr__(req, "keys_cache", (self._addressing, keys))
        return keys

    # ---- serving ----------------------------------------------------------------------------

    def memory_hit(self, req: SpeechRequest) -> tuple[str, Entry] | None:
        """``(rendition_key, entry)`` when ``req`` is in the memory tier: the hot path, no awaits."""
        key = self.keys_for(req)[1]
        entry = self.store.get_memory(key)
        if entry is None:
            return None
        self.ledger.answered(req, "hit", produced_here=False)
        return key, entry

    async def answer(
        self, req: SpeechRequest, *, stream: bool | None = False
    ) -> SpeechResult | SpeechStream:
        """The one call every endpoint makes: ``req``'s audio whole (:class:`SpeechResult`), or,
        with ``stream`` and nothing stored yet, a :class:`SpeechStream` that follows the
        synthesis sentence by sentence (stored audio always comes whole). ``stream=None``
        streams only a rendition of more than one sentence (known once the text is split).
        Every answer's outcome is counted here, once (:class:`Ledger`)."""
        self.check_budget(req)
        _, key, rate = self.keys_for(req)
        entry = await self.store.find(key)
        if entry is not None:
            self.ledger.answered(req, "hit", produced_here=False)
            return SpeechResult(entry, key, "hit")
        made: SpeechStream | tuple[Made, bool]
        if stream is False:
            made = await self.assembler.produce(req, key, rate)
        else:
            admit = self.masters.admit_synthesis
            if admit is not None and self.several_sentences(req):
                # Charged whole before the first byte: a 429 can still be a status.
                await admit(len(req.text))
                prepaid()
            made = await self.assembler.stream(req, key, rate, whole_if_one=stream is None)
            if isinstance(made, SpeechStream):
                self.ledger.answered(req, made.cache, produced_here=made.leader)
                return made
        result, leader = made
        # Waited for a production another request (here) started: not a synthesis for this
        # response, and only one response says MISS for one synthesis.
        cache = result.cache if leader else "coalesced"
        self.ledger.answered(req, cache, produced_here=leader)
        return SpeechResult(result.entry, key, cache)

    async def speak(self, req: SpeechRequest) -> SpeechResult:
        """The audio for ``req`` whole: from the store when it is there, else made once."""
        answer = await self.answer(req)
        assert isinstance(answer, SpeechResult)  # (whole unless a stream is asked for)
        return answer

    def passes_through(self, req: SpeechRequest) -> bool:
        """Whether a miss of ``req`` may pass its provider's pcm on as it arrives (raw ``pcm``
        at the rate of an upstream that streams): then streaming helps even one sentence, whose
        first bytes go out before the provider's last. Cheap, on the loop."""
        return self.masters.passes_through(req, self.keys_for(req)[2])

    def several_sentences(self, req: SpeechRequest) -> bool:
        """Whether ``req`` may be made of more than one sentence master (what streaming by
        default needs to help): cheap, on the loop. A text that is not one sentence on its face
        counts as several (it may still split into one)."""
        spoken = [seg for seg in req.segments if seg.words]
        if self.masters.says_whole(req.model):
            return len(spoken) > 1
        whole, limit = self.assembler.splitter.whole, self.assembler.max_sentence_chars
        if not req.segments:
            return not whole(req.text, limit)
        return len(spoken) > 1 or any(
            not seg.phonemes and not whole(seg.words, limit) for seg in spoken
        )

    def check_budget(self, req: SpeechRequest) -> None:
        """Refuse up front (400) a request whose audio would run past ``max_audio_s``: its cost
        in time and memory grows with the audio, whatever its length in characters."""
        seconds = estimated_request_s(req)
        if seconds > self.max_audio_s:
            raise BadRequest(
                f"'input' would make about {seconds:.0f} s of audio at speed {req.speed:g}; the "
                f"limit is {self.max_audio_s:g} s per request (max_audio_s): send less text or "
                "a higher speed",
                param="input",
                code="audio_too_long",
            )

    async def explain(self, req: SpeechRequest, front_end: str) -> dict[str, object]:
        """What ``req`` would say and where its audio lives, without synthesizing: its
        expansion (segments), the sentences it is made of (each a cached master, its text what
        the engine reads) and how they join, and its content address (``key``: the
        ``X-Audio-Key`` of its answer). ``front_end``: the one its text went through."""
        mk, rk, rate = self.keys_for(req)
        parts, layout = await self.assembler.split(req)
        return {
            "key": rk,
            "master": mk,
            "model": req.model,
            "voice": req.voice,
            "format": req.fmt.name,
            "sample_rate": rate,
            "text": req.text,
            "front_end": front_end,
            # Each segment's fields (its SSML marks only when it has some).
            "expansion": [
                {k: v for k, v in dataclasses.asdict(seg).items() if k != "marks" or seg.marks}
                for seg in req.segments or (Segment(req.text),)
            ],
            "sentences": [
                {
                    "text": part.text,
                    "speed": part.speed,
                    "phonemes": part.phonemes,
                    "pause_before_ms": layout.gaps_ms[i],
                    "master": self.masters.master_key(part),
                }
                for i, part in enumerate(parts)
            ],
            "pause_after_ms": layout.gaps_ms[-1],
            "estimated_audio_s": round(estimated_request_s(req), 2),
        }

    def has_marks(self, model: str, voice: str) -> bool:
        """Whether ``voice`` of ``model`` gives speech marks (its engine reports alignments)."""
        handle = self.models.get(model)
        return handle is not None and handle.engine.capabilities.speech_marks

    def voice_listing(self) -> Sequence[Mapping[str, object]]:
        """Models with their voices, for ``GET /v1/voices``."""
        return [
            {
                "id": name,
                "ready": handle.ready.is_set(),
                "sample_rate": handle.engine.sample_rate,
                "voices": [
                    {
                        "id": v.name,
                        "language": v.language,
                        "description": v.description,
                        "speech_marks": self.has_marks(name, v.name),
                    }
                    for v in handle.engine.voices()
                ],
                "execution": dict(handle.engine.describe()),
            }
            for name, handle in self.models.items()
        ]
