"""Operator-facing endpoints: readiness per tier and ``POST /v1/prompts`` (render and pin a
catalogue)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from cache.tier import TierError
from gateway.api.catalogue import CatalogueError, Prompt, normalize_prompt, to_requests
from gateway.api.parsing import read_json_object
from gateway.errors import BadRequest
from gateway.http import keys
from gateway.speech.catalogue import render

# A readiness probe must answer quickly even when a tier hangs: past this, the tier is degraded.
TIER_PROBE_TIMEOUT_S = 1.0
PROMPTS_FIELDS = frozenset({"prompts", "defaults"})


async def _probe(tier: Any) -> dict[str, Any]:
    try:
        stats = await asyncio.wait_for(tier.stats(), TIER_PROBE_TIMEOUT_S)
    except (TierError, TimeoutError, OSError) as exc:
        return {"state": "degraded", "error": f"{type(exc).__name__}: {exc}"[:200]}
    return {"state": "ok", "entries": stats.entries, "bytes": stats.bytes}


async def readiness(app: web.Application) -> tuple[int, dict[str, Any]]:
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
    status = ("degraded" if degraded else "ready") if ready else "loading"
    return (200 if ready else 503), {"status": status, "models": models, "tiers": tiers}


async def prompts(request: web.Request) -> web.Response:
    """``POST /v1/prompts``: render and pin a catalogue; returns each prompt's content address.

    Body: ``{"prompts": [str | {input, voice, model, response_format, speed, sample_rate}],
    "defaults": {...}}``. Every prompt is validated before any is rendered.
    """
    app = request.app
    settings = app[keys.SETTINGS]
    service = app[keys.SPEECH]
    body = await read_json_object(request, settings.max_body_kb * 1024)
    unknown = sorted(set(body) - PROMPTS_FIELDS)
    if unknown:
        raise BadRequest(f"unrecognized request argument: {', '.join(unknown)}", param=unknown[0])
    items = body.get("prompts")
    if not isinstance(items, list) or not items:
        raise BadRequest("'prompts' must be a non-empty list", param="prompts")
    if len(items) > settings.max_catalogue_prompts:
        raise BadRequest(
            f"'prompts' has {len(items)} entries; the limit is {settings.max_catalogue_prompts}",
            param="prompts",
            code="too_many_prompts",
        )
    defaults = body.get("defaults")
    if defaults is None:
        defaults = {}
    if not isinstance(defaults, dict):
        raise BadRequest("'defaults' must be an object", param="defaults")
    try:
        base = normalize_prompt(defaults, "defaults")
    except CatalogueError as exc:
        raise BadRequest(str(exc), param="defaults") from exc
    parsed: list[Prompt] = []
    try:
        for i, item in enumerate(items):
            where = f"prompt {i}"
            if isinstance(item, str):
                item = {"input": item}
            if not isinstance(item, dict):
                raise BadRequest(f"{where}: expected a string or an object", param=f"prompts[{i}]")
            parsed.append(Prompt(normalize_prompt(item, where), where))
    except CatalogueError as exc:
        raise BadRequest(str(exc), param="prompts") from exc
    requests = to_requests(parsed, base, settings, service)
    summary = await render(
        service, requests, app[keys.METRICS], concurrency=settings.catalogue_concurrency
    )
    return web.json_response(
        {"prompts": [r.as_json() for r in summary.results], "summary": summary.as_json()}
    )
