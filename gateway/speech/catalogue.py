"""Prompt catalogues: render and pin a list of prompts through the speech service.

An IVR deployment knows its prompts in advance. ``voxgate warm FILE`` and ``POST /v1/prompts`` both
turn each prompt into a pinned rendition (never evicted) through the same :class:`SpeechService`
as live traffic, so a later request for the prompt is a hit. Rendering is resumable by construction:
a prompt whose rendition is already stored is a hit and costs no synthesis.

Pinning is a step of its own, after rendering (:func:`pin`): what the catalogue would pin (each
rendition, the sentence masters it is made of, the encodings asked for) is measured, reserved in
the pin registry against its owner's quota and the total (:mod:`cache.pins`: one registry per
host, or per Redis), and only then are pinned copies stored. A catalogue over its quota pins
nothing (its audio stays stored as ordinary, evictable entries). The registry also keeps each
prompt's label (text, id, voice, format), which ``GET /v1/prompts`` lists.

A prompt is an OpenAI speech body (``input``, ``voice``, ``model``, ``response_format``,
``speed``, ``sample_rate``); files may use the short names ``text``, ``format`` and ``rate``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cache.entry import Entry
from cache.pins import (
    LABEL_TEXT_CHARS,
    PinItem,
    PinQuota,
    PinQuotaExceeded,
    PinRegistry,
    encode_label,
)
from gateway.errors import VoxgateError, clip
from gateway.speech.request import SpeechRequest, SpeechResult
from gateway.speech.service import SpeechService
from gateway.speech.telephony import Extension
from metrics import Metrics
from synth.errors import Overloaded, SynthesisError

log = logging.getLogger("voxgate.catalogue")

MIB = 1024 * 1024

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
    # The rendition as stored (None for an error): what pin() pins.
    entry: Entry | None = field(default=None, repr=False, compare=False)

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
    # Set by pin(): entries pinned, and the bytes newly charged to the owner's quota for them
    # (0 when all of them were pinned already).
    pinned_entries: int = 0
    pinned_bytes: int = 0
    results: list[PromptResult] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """Totals without the per-prompt results."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del out["results"]
        out["seconds"] = round(self.seconds, 3)
        return out


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
                    index,
                    res.key,
                    res.cache,
                    len(res.entry.audio),
                    meta.format,
                    meta.sample_rate,
                    entry=res.entry,
                )
            metrics.catalogue_prompts.labels(result.cache).inc()
            results[index] = result
            if on_done is not None:
                on_done(result)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(requests))))))
    summary.seconds = time.perf_counter() - started
    summary.results = [r for r in results if r is not None]  # (every index was handed out)
    counts = collections.Counter(r.cache for r in summary.results)
    summary.synthesized, summary.cached = counts["miss"], counts["hit"]
    summary.coalesced, summary.failed = counts["coalesced"], counts["error"]
    summary.bytes = sum(r.bytes for r in summary.results)
    return summary


# ---- pinning -------------------------------------------------------------------------------


def prompt_label(req: SpeechRequest, result: PromptResult, ident: str | None) -> dict[str, Any]:
    """What ``GET /v1/prompts`` lists for a pinned prompt (the entry holds no text): its words
    (cut to LABEL_TEXT_CHARS), id, model, voice, format and sample rate, and the speed when
    not 1."""
    label: dict[str, Any] = {
        "id": ident,
        "text": req.text[:LABEL_TEXT_CHARS],
        "model": req.model,
        "voice": req.voice,
        "format": req.fmt.name,
        "sample_rate": result.sample_rate,
    }
    # What `voxgate rollout` needs to say the prompt again (gateway/speech/rollout.py).
    if req.speed != 1.0:
        label["speed"] = req.speed
    if len(req.text) > LABEL_TEXT_CHARS:
        label["cut"] = True
    if req.segments:
        label["ssml"] = True  # the words are kept, not the pauses and rates around them
    return label


async def pin(
    service: SpeechService,
    registry: PinRegistry,
    summary: Summary,
    requests: Sequence[SpeechRequest],
    ids: Sequence[str | None],
    *,
    owner: str,
    quota: PinQuota,
    extensions: Sequence[Extension] = (),
) -> dict[int, dict[str, str]]:
    """Pin what :func:`render` made of ``requests`` (``summary``) for ``owner``: each rendition,
    its sentence masters, and its encodings in ``extensions`` (transcoded now). All of it is
    reserved in ``registry`` first; :class:`cache.pins.PinQuotaExceeded` (nothing pinned) when
    it would pass ``quota``. Returns, by prompt index, the content address of each extension's
    encoding. Sets ``summary.pinned_entries`` and ``summary.pinned_bytes``."""
    entries: dict[str, Entry] = {}
    labels: dict[str, bytes] = {}
    encodings: dict[int, dict[str, str]] = {}
    for result in summary.results:
        if result.key is None or result.entry is None:
            continue
        entries[result.key] = result.entry
        label = prompt_label(requests[result.index], result, ids[result.index])
        labels[result.key] = encode_label(result.key, label)
        # The masters too: every other encoding of a pinned prompt is then a transcode.
        for part in result.entry.meta.parts:
            if part not in entries:
                found = await service.store.find(part)
                if found is not None:
                    entries[part] = found
        for ext in extensions:
            made = await service.transcoder.get(result.key, ext)
            if made is not None:
                entries[made.key] = made.entry
                encodings.setdefault(result.index, {})[ext.name] = made.key
    items = [
        PinItem(k, e.size, e.meta.voice, e.meta.model, e.meta.created) for k, e in entries.items()
    ]

    async def commit() -> int:
        charged = await registry.reserve(owner, items, labels, quota)
        await asyncio.gather(
            *(
                service.store.put(k, e.pinned_copy())
                for k, e in entries.items()
                if not e.meta.pinned
            )
        )
        return charged

    # Records and pins go together: a caller that hangs up between them must not leave the
    # quota charged for entries never pinned.
    task = asyncio.ensure_future(commit())
    try:
        summary.pinned_bytes = await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_retrieve)  # finishes without its caller; a failure is logged
        raise
    summary.pinned_entries = len(entries)
    return encodings


def quota_message(exc: PinQuotaExceeded) -> str:
    """Why a catalogue was refused by its pin quota: the limit, its setting and the numbers."""
    quota = exc.quota
    if exc.limit == "per_owner" and quota.per_owner is not None:
        where = (
            f"API key {clip(exc.owner)} has {exc.owner_bytes:,} of its {quota.per_owner:,} bytes "
            f"pinned (pin_quota_mb_per_key = {quota.per_owner // MIB})"
        )
    else:
        where = (
            f"{exc.total_bytes:,} of {quota.total:,} bytes are pinned in all "
            f"(pin_quota_mb = {quota.total // MIB})"
        )
    return (
        f"pinning this catalogue needs {exc.needed:,} more bytes and {where}: nothing was "
        "pinned (purge pins with `voxgate cache purge --pinned`, or raise the quota)"
    )


def _retrieve(task: asyncio.Future[Any]) -> None:
    # A commit whose caller was cancelled still fails visibly in the log, not as "never retrieved".
    if not task.cancelled() and task.exception() is not None:
        log.warning("pinning a catalogue failed after its caller left: %s", task.exception())
