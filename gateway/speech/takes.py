"""The one way a new take into the store: every master a synthesis made (any engine, any
provider, whole or passed through in pieces) and every rendition or transcode made of masters
passes :func:`accept_take` before it is stored or counted.

A new take (audio an engine or a provider just made for a request) is checked there first
(:class:`TakeGate`, :mod:`synth.takecheck`): a refused one is never stored, so it is never a hit;
it is counted, logged by its key and kept aside for review (:class:`Rejects`). Renditions and
transcodes are encodings of masters that passed: the seam stores them as they are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from cache.entry import Entry
from cache.store import TieredStore
from gateway.speech.request import SpeechRequest
from metrics import Metrics
from synth.audio import FloatPCM
from synth.takecheck import OK, Limits, TakeChecker, TakeFacts, Verdict

log = logging.getLogger("voxgate.speech")

DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Take:
    """Audio just made, before it is stored: the samples ``entry`` encodes (float, at
    ``sample_rate``), the text they say, and the request they were made for (None for a
    transcode: another encoding of stored audio, asked for by its address). ``language`` is the
    voice's language code, when the engine names one."""

    pcm: FloatPCM
    sample_rate: int
    text: str
    req: SpeechRequest | None
    language: str = ""


class Rejects(Protocol):
    """Where a refused take is kept aside for review (the quarantine): bounded and expiring, so
    an admin can listen to it and approve it into the store under ``key``."""

    async def keep(self, key: str, entry: Entry, take: Take, verdict: Verdict) -> None: ...


@dataclass
class TakeGate:
    """The checks every new take passes (``take_checks``), and what a refusal leads to: up to
    ``retries`` new takes (:class:`gateway.speech.masters.Masters` draws them), the count in
    ``voxgate_takes_total``, and the take kept aside in ``rejects``. ``limits`` loosens a check
    per model or per voice (keys ``model`` and ``model/voice``: an upstream whose voice
    whispers, a voice with long pauses)."""

    checker: TakeChecker
    pool: concurrent.futures.Executor
    metrics: Metrics
    rejects: Rejects
    retries: int = 2
    limits: Mapping[str, Limits] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.checker.level != "off"

    async def judge(self, key: str, entry: Entry, take: Take) -> Verdict:
        """``take``'s verdict (off the loop: the checks are CPU work), counted; a refused take
        is logged by its key and kept aside."""
        req = take.req
        if req is None or not self.on:
            return OK
        facts = TakeFacts(
            take.pcm,
            take.sample_rate,
            take.text,
            speed=req.speed,
            voice=f"{req.model}/{req.voice}",
            language=take.language or "en",
        )
        limits = self.limits.get(facts.voice) or self.limits.get(req.model, DEFAULT_LIMITS)
        loop = asyncio.get_running_loop()
        verdict = await loop.run_in_executor(self.pool, self.checker.check, facts, limits)
        counter = self.metrics.takes
        if verdict.ok:
            counter.labels(req.model, "accepted", "").inc()
            self.checker.accepted(facts, verdict)
            return verdict
        # One count per take (its first reason), so refused over all is the share refused.
        counter.labels(req.model, "rejected", verdict.reasons[0]).inc()
        log.warning(
            "take refused key=%s model=%s voice=%s reasons=%s",
            key,
            req.model,
            req.voice,
            ",".join(verdict.reasons),
        )
        await self.rejects.keep(key, entry, take, verdict)
        return verdict


async def accept_take(
    store: TieredStore, key: str, entry: Entry, take: Take | None, gate: TakeGate | None = None
) -> Verdict:
    """Store ``entry`` under ``key`` if ``gate`` accepts ``take``: the one call that writes a
    new master or rendition. A refused take is not stored; its verdict says why. ``take`` is
    None for audio a person approved (the quarantine's review): stored as it is."""
    verdict = OK if gate is None or take is None else await gate.judge(key, entry, take)
    if verdict.ok:
        await store.put(key, entry)
    return verdict
