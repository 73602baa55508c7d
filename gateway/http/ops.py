"""Operator-facing endpoints: readiness per tier, ``POST /v1/prompts`` (render and pin a
catalogue, within its pin quota) and ``GET /v1/prompts`` (the pinned prompts of the host, or of
every replica with Redis: :mod:`cache.pins`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any, Literal, NotRequired, Required, cast

from aiohttp import web
from pydantic import Field
from typing_extensions import TypedDict

from cache.keys import KEY_PATTERN
from cache.pins import ANONYMOUS, PinQuota, PinQuotaExceeded, PinRegistryError, check_room
from cache.tier import TierError
from gateway.api.catalogue import (
    CatalogueError,
    Prompt,
    check_ids,
    make_prompt,
    normalize_prompt,
    to_requests,
)
from gateway.api.models import models_for
from gateway.api.parsing import read_json_object
from gateway.errors import BadRequest, PayloadTooLarge, Unavailable
from gateway.http import keys
from gateway.runtime.settings import Settings
from gateway.speech.caller import caller
from gateway.speech.catalogue import pin, quota_message, render
from gateway.speech.telephony import EXTENSIONS

MIB = 1024 * 1024

log = logging.getLogger("voxgate.gateway")

# A readiness probe must answer quickly even when a tier hangs: past this, the tier is degraded.
TIER_PROBE_TIMEOUT_S = 1.0


class TierProbe(TypedDict):
    """One tier's answer to the readiness probe: ``degraded`` still serves (a failing tier is a
    miss)."""

    state: Literal["ok", "degraded"]
    entries: NotRequired[int]
    bytes: NotRequired[int]
    error: NotRequired[Annotated[str, Field(description="Why the probe failed.")]]
    evicted_for_space: NotRequired[
        Annotated[
            int,
            Field(
                description="The disk tier: entries this process evicted because the disk was "
                "full before the tier's bound (a warning, not a failure)."
            ),
        ]
    ]
    full: NotRequired[
        Annotated[
            bool,
            Field(
                description="The disk tier: the disk is full and nothing is left to evict, so "
                "new entries are not stored (the tier is then degraded)."
            ),
        ]
    ]


class Ready(TypedDict):
    """The ``/readyz`` body: ``starting`` (no models yet), ``loading`` (warming up; 503), then
    ``ready`` or ``degraded`` (a tier fails its probe; still 200)."""

    status: Literal["starting", "loading", "ready", "degraded"]
    models: Annotated[dict[str, bool], Field(description="Per model: loaded and warmed.")]
    tiers: dict[str, TierProbe]


class PinnedPrompt(TypedDict, total=False):
    """A pinned prompt: its content address, and what was pinned (the text's first 1,000
    characters; id, model, voice, format, rate) as far as the pin recorded it."""

    key: Required[Annotated[str, Field(pattern=KEY_PATTERN)]]
    id: str | None
    text: str
    model: str
    voice: str
    format: str
    sample_rate: int | None
    # Recorded from the rollout on (what re-renders a prompt): the speed when not 1, whether
    # the text was cut to its first 1,000 characters, whether it was SSML (only its words kept).
    speed: float
    cut: bool
    ssml: bool


class PinnedPrompts(TypedDict):
    """The pinned prompts, oldest first."""

    prompts: list[PinnedPrompt]


async def _probe(tier: Any) -> TierProbe:
    try:
        stats = await asyncio.wait_for(tier.stats(), TIER_PROBE_TIMEOUT_S)
    except (TierError, TimeoutError, OSError) as exc:
        return {"state": "degraded", "error": f"{type(exc).__name__}: {exc}"[:200]}
    probe: TierProbe = {"state": "ok", "entries": stats.entries, "bytes": stats.bytes}
    if stats.evicted_for_space:
        probe["evicted_for_space"] = stats.evicted_for_space
    if stats.full:
        probe["state"] = "degraded"
        probe["full"] = True
        probe["error"] = "the disk is full and nothing is left to evict: new entries not stored"
    return probe


async def readiness(app: web.Application) -> tuple[int, Ready]:
    """Status code and body of ``/readyz``.

    Ready means every model is loaded and warmed. A tier that fails its probe is reported as
    ``degraded`` but does not make the gateway unready: a failing tier is a miss, and the tiers
    below it (or the engine) still answer, so taking the replica out of rotation would only hurt.
    """
    service = app.get(keys.SPEECH)
    if service is None:
        return 503, {"status": "starting", "models": {}, "tiers": {}}
    models = {name: h.ready.is_set() for name, h in service.models.items()}
    probes = await asyncio.gather(*(_probe(t) for t in service.store.tiers))
    tiers = {t.name: p for t, p in zip(service.store.tiers, probes, strict=True)}
    ready = bool(models) and all(models.values())
    degraded = any(p["state"] != "ok" for p in probes)
    body: Ready = {
        "status": ("degraded" if degraded else "ready") if ready else "loading",
        "models": models,
        "tiers": tiers,
    }
    return (200 if ready else 503), body


def pin_owner(settings: Settings) -> tuple[str, PinQuota]:
    """Who the request's pins are charged to and their quota: the calling API key (its own
    quota within the total), or, without one, the one anonymous owner (the total alone)."""
    total = settings.pin_quota_mb * MIB
    key = caller().key
    if key is None:
        return ANONYMOUS, PinQuota(total)
    return key.name, PinQuota(total, settings.pin_quota_mb_per_key * MIB)


def registry_down(exc: PinRegistryError) -> Unavailable:
    """The 503 when the pin registry cannot be read or written (Redis down, disk failing)."""
    return Unavailable(
        f"the pin registry is unavailable ({type(exc).__name__}); try again",
        code="pin_registry_unavailable",
        retry_after_s=2.0,
    )


async def prompts(request: web.Request) -> web.Response:
    """``POST /v1/prompts``: render and pin a catalogue; returns each prompt's content address.

    Body: ``{"prompts": [str | {input, voice, model, response_format, speed, sample_rate, id}],
    "defaults": {...}, "extensions": ["wav", "ulaw", ...]}``. Every prompt is validated before
    any is rendered. With ``extensions`` each prompt's answer carries ready ``urls`` (the
    encodings transcoded and pinned now): ``/v1/audio/{key}.{ext}``, absolute with
    ``public_url``. Everything it would pin is charged to the caller's pin quota first
    (:func:`pin_owner`); past it the answer is 413 and nothing is pinned.
    """
    app = request.app
    settings = app[keys.SETTINGS]
    service = app[keys.SPEECH]
    registry = app[keys.PINS]
    raw = await read_json_object(request, settings.max_body_kb * 1024, settings.body_timeout_s)
    body = models_for(settings).prompts.check(raw)
    base = {}
    if body.defaults is not None:
        base = normalize_prompt(body.defaults.model_dump(exclude_none=True), "defaults")
        if "id" in base:
            raise BadRequest(
                "defaults: 'id' names one prompt; it cannot be a default", param="defaults"
            )
    parsed: list[Prompt] = []
    for i, item in enumerate(body.prompts):
        where = f"prompt {i}"
        fields = {"input": item} if isinstance(item, str) else item.model_dump(exclude_none=True)
        parsed.append(make_prompt(normalize_prompt(fields, where), where))
    try:
        check_ids(parsed)
    except CatalogueError as exc:
        # (Each id's form is the model's to check: what is left is an id used twice.)
        raise BadRequest(str(exc), param="prompts", code="duplicate_id") from exc
    requests = to_requests(parsed, base, settings, app[keys.VOCABULARY])
    owner, quota = pin_owner(settings)
    metrics = app[keys.METRICS]
    try:
        # An owner with no room left is refused before anything is synthesized.
        usage = await registry.usage()
        check_room(owner, 1, usage.owners.get(owner, 0), usage.total, quota)
        summary = await render(
            service, requests, metrics, concurrency=settings.catalogue_concurrency
        )
        encodings = await pin(
            service,
            registry,
            summary,
            requests,
            [p.id for p in parsed],
            owner=owner,
            quota=quota,
            extensions=[EXTENSIONS[name] for name in body.extensions or ()],
        )
    except PinQuotaExceeded as exc:
        metrics.pins_refused.labels("per_key" if exc.limit == "per_owner" else "total").inc()
        message = quota_message(exc)
        raise PayloadTooLarge(message, param="prompts", code="pin_quota_exceeded") from None
    except PinRegistryError as exc:
        raise registry_down(exc) from exc
    answers = [r.as_json() for r in summary.results]
    for i, (prompt, answer) in enumerate(zip(parsed, answers, strict=True)):
        if prompt.id is not None:
            answer["id"] = prompt.id
        for ext_name in encodings.get(i, {}):
            url = f"{settings.public_url}/v1/audio/{answer['key']}.{ext_name}"
            answer.setdefault("urls", {})[ext_name] = url
    return web.json_response({"prompts": answers, "summary": summary.as_json()})


async def pinned_prompts(request: web.Request) -> web.Response:
    """``GET /v1/prompts``: the pinned prompts (their text, id, voice, format and content
    address), oldest first, the newest LISTING_LIMIT of them: the same list from every gateway
    process of the host, or every replica with Redis. The prompt studio plays them."""
    try:
        listing = await request.app[keys.PINS].listing()
    except PinRegistryError as exc:
        raise registry_down(exc) from exc
    body: PinnedPrompts = {"prompts": cast(list[PinnedPrompt], listing)}
    return web.json_response(body)


async def report_pins(app: web.Application) -> None:
    """Set the pinned-bytes gauges from the registry (at scrape time: another process or
    replica may have pinned since). A registry that fails leaves them as they were."""
    registry = app.get(keys.PINS)
    if registry is None:
        return
    settings, metrics = app[keys.SETTINGS], app[keys.METRICS]
    try:
        usage = await registry.usage()
    except PinRegistryError as exc:
        log.warning("pin registry unavailable for metrics: %s", exc)
        return
    gauge = metrics.pinned_bytes
    # Every owner that could have pins is reported, 0 without: an owner whose pins were purged
    # must not keep the last figure some process reported for it.
    ring = app[keys.AUTH].ring
    owners = {ANONYMOUS, *(ring.names() if ring is not None else ())}
    owners.update(s.labels["key"] for f in gauge.collect() for s in f.samples if "key" in s.labels)
    for owner in owners | set(usage.owners):
        gauge.labels(owner).set(usage.owners.get(owner, 0))
    metrics.pinned_quota_bytes.labels("total").set(settings.pin_quota_mb * MIB)
    metrics.pinned_quota_bytes.labels("per_key").set(settings.pin_quota_mb_per_key * MIB)
