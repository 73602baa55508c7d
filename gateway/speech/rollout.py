"""Voice changes without a cold cache: ``voxgate rollout MODEL --revision N``.

Every content address of a model carries its engine's fingerprint (a local voice: a hash of its
files; an upstream: its kind, URL, provider model, format and ``revision``). A model can also be
given an *address revision*, recorded in the pin registry (:mod:`cache.pins`: SQLite in the cache
directory for one host, Redis for every replica) per (model, engine fingerprint): its addresses
then carry :func:`cache.keys.revision_fingerprint` of both, new addresses beside the old ones.

A rollout re-renders every pinned prompt of the model (their labels in the registry say text,
voice, format, rate and speed) under the new revision, in this process only, ``concurrency`` at
a time; what is stored already is a hit and costs nothing (so an interrupted rollout, run again,
renders only the rest); it pins what it rendered, compares each prompt's duration with the old
audio's, and only when every prompt is rendered switches the model by recording the revision.
Until then every gateway keeps serving the old addresses; after it, each gateway applies the
record at its next read (``revision_refresh_s``, and at start), so replicas and restarts agree.

A revision applies to the engine fingerprint the rollout ran with. For an upstream that is the
gateways' own (the provider changed a voice behind the same configuration: the rollout asks it
again and every gateway switches). For a local model whose voice file changed, run the rollout
with the new file configured: it renders under the new fingerprint, gateways still running the
old file keep their addresses (no record for their fingerprint), and gateways started with the
new file find every pinned prompt rendered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cache.pins import ANONYMOUS, LISTING_LIMIT, PinQuota, PinRegistry, PinRegistryError
from gateway.errors import VoxgateError
from gateway.speech.catalogue import PromptResult, pin, render
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService
from metrics import Metrics

log = logging.getLogger("voxgate.rollout")

# The characters of a prompt's text a report shows.
REPORT_TEXT_CHARS = 60


async def follow_revisions(service: SpeechService, registry: PinRegistry) -> bool:
    """Apply the registry's revisions to ``service``; False (logged, nothing changed) when
    the registry cannot be read."""
    try:
        table = await registry.revisions()
    except PinRegistryError as exc:
        log.warning("address revisions not read, the current ones stay: %s", exc)
        return False
    for model in service.apply_revisions(table):
        log.info(
            "model %s is served at address revision %s",
            model,
            service.revision_of(model) or "(none)",
        )
    return True


async def keep_following_revisions(
    service: SpeechService, registry: PinRegistry, every_s: float
) -> None:
    """Apply the registry's revisions every ``every_s`` seconds, until cancelled."""
    while True:
        # A poll: a switch is a write to SQLite or Redis, which notify nobody.
        await asyncio.sleep(every_s)
        await follow_revisions(service, registry)


@dataclass
class RolloutPrompt:
    """One pinned prompt in a rollout: its old and new address and duration."""

    id: str | None
    text: str
    voice: str
    format: str
    old_key: str | None = None
    old_duration_s: float | None = None
    new_key: str | None = None
    new_duration_s: float | None = None
    # rendered (a call or a synthesis now), already (stored before: a resumed rollout), or
    # error
    state: str = "error"
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The prompt's line of the JSON report."""
        old, new = self.old_duration_s, self.new_duration_s
        out = {
            "id": self.id,
            "text": self.text,
            "voice": self.voice,
            "format": self.format,
            "state": self.state,
            "old_key": self.old_key,
            "new_key": self.new_key,
            "old_duration_s": _round(old),
            "new_duration_s": _round(new),
            # New duration minus old (None when either is unknown).
            "change_s": None if old is None or new is None else _round(new - old),
        }
        if self.error is not None:
            out["error"] = self.error
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class RolloutReport:
    """What a rollout did, and whether it switched the model."""

    model: str
    revision: str
    previous: str
    fingerprint: str
    prompts: list[RolloutPrompt] = field(default_factory=list)
    switched: bool = False
    reason: str = ""

    def count(self, state: str) -> int:
        """Prompts in ``state``."""
        return sum(1 for p in self.prompts if p.state == state)

    def as_json(self) -> dict[str, Any]:
        """The JSON report."""
        return {
            "model": self.model,
            "revision": self.revision,
            "previous": self.previous,
            "prompts": len(self.prompts),
            "rendered": self.count("rendered"),
            "already": self.count("already"),
            "failed": self.count("error"),
            "switched": self.switched,
            "reason": self.reason,
            "changes": [p.as_json() for p in self.prompts],
        }


def pinned_prompts(
    listing: Sequence[Mapping[str, object]], model: str
) -> list[list[Mapping[str, object]]]:
    """The labels of ``model``'s pinned prompts, one group per distinct prompt (text, voice,
    format, rate, speed) in order of first pinning, each group oldest first (a prompt pinned
    under several revisions has a label per address)."""
    groups: dict[tuple[object, ...], list[Mapping[str, object]]] = {}
    for label in listing:
        if label.get("model") == model and isinstance(label.get("text"), str):
            named = (label.get(name) for name in ("text", "voice", "format", "sample_rate"))
            groups.setdefault((*named, label.get("speed", 1.0)), []).append(label)
    return list(groups.values())


async def rollout(
    service: SpeechService,
    registry: PinRegistry,
    model: str,
    revision: str,
    *,
    parse: Callable[[dict[str, Any]], SpeechRequest],
    quota: PinQuota,
    concurrency: int,
    metrics: Metrics,
    allow_unrenderable: bool = False,
    on_total: Callable[[int], None],
    on_done: Callable[[PromptResult], None],
) -> RolloutReport:
    """Re-render ``model``'s pinned prompts at ``revision`` and switch it when all are (see the
    module). ``parse`` validates a prompt's OpenAI speech body (a :class:`VoxgateError` for one
    that no longer is one: a voice gone); what is rendered is pinned as the operator's, within
    ``quota``. ``ValueError`` for a model ``service`` does not serve; :class:`PinRegistryError`
    when the registry cannot be read or written; :class:`cache.pins.PinQuotaExceeded` when the
    new renditions do not fit (nothing switched)."""
    if model not in service.models:
        raise ValueError(f"no model {model!r} here (models: {', '.join(sorted(service.models))})")
    fingerprint = service.models[model].engine.fingerprint
    table = await registry.revisions()
    previous = table.get((model, fingerprint), "")
    report = RolloutReport(model, revision, previous, fingerprint)
    if revision == previous:
        report.switched = True
        report.reason = f"already at revision {revision}"
        return report
    groups = pinned_prompts(await registry.listing(LISTING_LIMIT), model)
    unrenderable = 0
    # Each prompt to render: its report line, its request, and its labels (the old addresses).
    todo: list[tuple[RolloutPrompt, SpeechRequest, list[Mapping[str, object]]]] = []
    for group in groups:
        label = group[-1]
        text = str(label["text"])
        ident = label.get("id")
        line = RolloutPrompt(
            ident if isinstance(ident, str) else None,
            text[:REPORT_TEXT_CHARS],
            str(label.get("voice", "")),
            str(label.get("format", "")),
        )
        report.prompts.append(line)
        if label.get("cut") or label.get("ssml"):
            unrenderable += 1
            line.error = (
                "pinned as SSML: the label keeps its words only"
                if label.get("ssml")
                else "longer than the 1,000 characters a label keeps"
            )
            continue
        body: dict[str, Any] = {
            "model": model,
            "input": text,
            "voice": label.get("voice"),
            "response_format": label.get("format"),
            "speed": label.get("speed", 1.0),
        }
        if isinstance(label.get("sample_rate"), int):
            body["sample_rate"] = label["sample_rate"]
        try:
            req = parse(body)
        except VoxgateError as exc:
            line.error = exc.message
            continue
        todo.append((line, req, group))
    requests = [req for _, req, _ in todo]
    on_total(len(requests))
    # This process only: the gateways keep the old addresses until the switch below.
    service.apply_revisions({**table, (model, fingerprint): revision})
    summary = await render(service, requests, metrics, concurrency=concurrency, on_done=on_done)
    for result, (line, _, group) in zip(summary.results, todo, strict=True):
        if result.error is not None or result.entry is None:
            line.error = result.error
            continue
        line.state = "already" if result.cache == "hit" else "rendered"
        line.new_key = result.key
        line.new_duration_s = result.entry.meta.duration_s
        # The old audio: the newest label of this prompt at another address than the new one.
        old = [g.get("key") for g in group if g.get("key") != result.key]
        line.old_key = str(old[-1]) if old else None
        before = await service.store.find(line.old_key) if line.old_key is not None else None
        line.old_duration_s = before.meta.duration_s if before is not None else None
    ids = [line.id for line, _, _ in todo]
    await pin(service, registry, summary, requests, ids, owner=ANONYMOUS, quota=quota)
    await service.store.drain()
    failed = report.count("error")
    if failed and not (allow_unrenderable and failed == unrenderable):
        report.reason = (
            f"{failed} of {len(report.prompts)} prompts not rendered: the model stays at "
            f"revision {previous or '(none)'}; run the rollout again to render the rest"
        )
        return report
    await registry.set_revision(model, fingerprint, revision)
    report.switched = True
    return report
