"""Operator-facing endpoints: readiness per tier and ``POST /v1/prompts`` (render and pin a
catalogue)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

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
from gateway.errors import BadRequest
from gateway.http import keys
from gateway.speech.catalogue import render
from gateway.speech.telephony import EXTENSIONS

# A readiness probe must answer quickly even when a tier hangs: past this, the tier is degraded.
TIER_PROBE_TIMEOUT_S = 1.0


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

    Body: ``{"prompts": [str | {input, voice, model, response_format, speed, sample_rate, id}],
    "defaults": {...}, "extensions": ["wav", "ulaw", ...]}``. Every prompt is validated before
    any is rendered. With ``extensions`` each prompt's answer carries ready ``urls`` (the
    encodings transcoded and pinned now): ``/v1/audio/{key}.{ext}``, absolute with
    ``public_url``.
    """
    app = request.app
    settings = app[keys.SETTINGS]
    service = app[keys.SPEECH]
    raw = await read_json_object(request, settings.max_body_kb * 1024, settings.body_timeout_s)
    # Shape and bounds (gateway.api.models.PromptsBody); every prompt is then validated as a
    # speech body with the defaults applied (to_requests).
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
        raise BadRequest(str(exc), param="prompts", code="invalid_id") from exc
    requests = to_requests(parsed, base, settings, service)
    summary = await render(
        service, requests, app[keys.METRICS], concurrency=settings.catalogue_concurrency
    )
    answers = [r.as_json() for r in summary.results]
    pinned = app[keys.PINNED_PROMPTS]
    for prompt, req, answer in zip(parsed, requests, answers, strict=True):
        if prompt.id is not None:
            answer["id"] = prompt.id
        pinned.record(req, answer, prompt.id)
    for ext_name in body.extensions or ():
        ext = EXTENSIONS[ext_name]
        for answer in answers:
            key = answer["key"]
            if key is None:
                continue
            # Transcoded and pinned now, so the first player to fetch the URL gets a hit.
            await service.transcoder.get(key, ext, pinned=True)
            answer.setdefault("urls", {})[ext_name] = (
                f"{settings.public_url}/v1/audio/{key}.{ext_name}"
            )
    return web.json_response({"prompts": answers, "summary": summary.as_json()})


async def pinned_prompts(request: web.Request) -> web.Response:
    """``GET /v1/prompts``: the prompts ``POST /v1/prompts`` pinned in this process (their
    text, id, voice, format and content address), oldest first; the prompt studio plays them."""
    return web.json_response({"prompts": request.app[keys.PINNED_PROMPTS].listing()})
