"""Prompt catalogues: render and pin a list of prompts through the speech service.

An IVR deployment knows its prompts in advance. ``voxgate warm FILE`` and ``POST /v1/prompts`` both
turn each prompt into a pinned rendition (never evicted) through the same :class:`SpeechService`
as live traffic, so a later request for the prompt is a hit. Rendering is resumable by construction:
a prompt whose rendition is already stored is a hit and costs no synthesis.

A prompt is an OpenAI speech body (``input``, ``voice``, ``model``, ``response_format``,
``speed``, ``sample_rate``); files may use the short names ``text``, ``format`` and ``rate``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import VoxgateError
from gateway.speech.request import SpeechRequest, SpeechResult
from gateway.speech.service import SpeechService
from metrics import Metrics
from synth.errors import Overloaded, SynthesisError

# A full queue is waited out, not failed: a catalogue is background work.
MAX_OVERLOAD_RETRIES = 120


@dataclass(frozen=True)
class PromptResult:
    """What rendering one prompt gave."""

    index: int
    key: str | None
    cache: str  # hit, miss, coalesced, or error
    bytes: int = 0
    fmt: str | None = None
    sample_rate: int | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The JSON form returned by ``POST /v1/prompts``."""
        out: dict[str, Any] = {"index": self.index, "key": self.key, "cache": self.cache}
        if self.error is None:
            out.update(bytes=self.bytes, format=self.fmt, sample_rate=self.sample_rate)
        else:
            out["error"] = self.error
        return out


@dataclass
class Summary:
    """Totals of one catalogue run."""

    prompts: int = 0
    synthesized: int = 0
    cached: int = 0
    coalesced: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    results: list[PromptResult] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """Totals without the per-prompt results."""
        out = dataclasses.asdict(self)
        del out["results"]
        out["seconds"] = round(self.seconds, 3)
        return out


class PinnedPrompts:
    """The prompts ``POST /v1/prompts`` pinned in this process, newest last, by content address
    (``GET /v1/prompts``: the prompt studio lists and plays them). Entries hold no text, so the
    prompts' words and ids are kept here; bounded, oldest first out. Not shared between worker
    processes or kept over a restart: the pinned audio is, this listing of it is not."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._items: dict[str, dict[str, Any]] = {}

    def record(self, req: SpeechRequest, answer: dict[str, Any], ident: str | None) -> None:
        """Remember one rendered prompt (``answer`` is its ``POST /v1/prompts`` answer)."""
        key = answer.get("key")
        if not key:
            return
        self._items.pop(key, None)
        self._items[key] = {
            "key": key,
            "id": ident,
            "text": req.text,
            "model": req.model,
            "voice": req.voice,
            "format": req.fmt.name,
            "sample_rate": answer.get("sample_rate"),
        }
        while len(self._items) > self.size:
            del self._items[next(iter(self._items))]

    def listing(self) -> list[dict[str, Any]]:
        """The prompts, oldest first."""
        return list(self._items.values())


# ---- rendering -----------------------------------------------------------------------------


async def speak_patiently(service: SpeechService, req: SpeechRequest) -> SpeechResult:
    """``service.speak(req)``, waiting out a full synthesis queue (background work)."""
    for _ in range(MAX_OVERLOAD_RETRIES):
        try:
            return await service.speak(req)
        except Overloaded as exc:
            await asyncio.sleep(min(5.0, exc.retry_after_s or 0.5))
    return await service.speak(req)


async def render(
    service: SpeechService,
    requests: Sequence[SpeechRequest],
    metrics: Metrics,
    *,
    concurrency: int,
    on_done: Callable[[PromptResult], None] | None = None,
) -> Summary:
    """Render and pin every request, ``concurrency`` at a time; a failed prompt is reported,
    not raised, so one bad prompt does not lose the rest of the catalogue."""
    summary = Summary(prompts=len(requests))
    results: list[PromptResult | None] = [None] * len(requests)
    todo = iter(enumerate(requests))
    started = time.perf_counter()

    async def worker() -> None:
        for index, req in todo:  # the shared iterator hands each prompt to one worker
            try:
                res = await speak_patiently(service, req)
            except (VoxgateError, SynthesisError) as exc:
                result = PromptResult(index, None, "error", error=str(exc))
            else:
                meta = res.entry.meta
                result = PromptResult(
                    index, res.key, res.cache, res.entry.size, meta.format, meta.sample_rate
                )
            metrics.catalogue_prompts.labels(result.cache).inc()
            results[index] = result
            if on_done is not None:
                on_done(result)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(requests))))))
    summary.seconds = time.perf_counter() - started
    for r in results:
        assert r is not None  # every index was handed to a worker
        summary.results.append(r)
        summary.bytes += r.bytes
        if r.cache == "miss":
            summary.synthesized += 1
        elif r.cache == "hit":
            summary.cached += 1
        elif r.cache == "coalesced":
            summary.coalesced += 1
        else:
            summary.failed += 1
    return summary
