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
import csv
import dataclasses
import io
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import BadRequest, VoxgateError
from gateway.parsing import parse_openai_speech
from gateway.settings import Settings
from gateway.speech import SpeechRequest, SpeechResult, SpeechService
from metrics import Metrics
from synth.errors import Overloaded, SynthesisError

# Short column names accepted in files, mapped to the OpenAI field names.
ALIASES = {"text": "input", "format": "response_format", "rate": "sample_rate"}
FIELDS = ("input", "voice", "model", "response_format", "speed", "sample_rate")
# A full queue is waited out, not failed: a catalogue is background work.
MAX_OVERLOAD_RETRIES = 120


class CatalogueError(ValueError):
    """A catalogue file cannot be read; the message names the line or prompt."""


@dataclass(frozen=True)
class Prompt:
    """One catalogue entry before validation: an OpenAI-shaped body and where it came from."""

    body: Mapping[str, Any]
    where: str  # "line 12" or "prompt 3": for error messages, never the text itself


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


# ---- reading ------------------------------------------------------------------------------


def normalize_prompt(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A prompt body with OpenAI field names; empty cells dropped (they take the default)."""
    body: dict[str, Any] = {}
    for key, value in raw.items():
        name = ALIASES.get(str(key).strip(), str(key).strip())
        if name not in FIELDS:
            raise CatalogueError(
                f"{where}: unknown field {key!r}; expected one of "
                f"{', '.join(sorted({*FIELDS, *ALIASES}))}"
            )
        if value is None or (isinstance(value, str) and not value.strip() and name != "input"):
            continue  # an empty cell takes the default
        body[name] = value
    return body


def _coerce(body: dict[str, Any], where: str) -> dict[str, Any]:
    """CSV cells are strings: make ``speed`` and ``sample_rate`` numbers."""
    try:
        if isinstance(body.get("sample_rate"), str):
            body["sample_rate"] = int(body["sample_rate"])
        if isinstance(body.get("speed"), str):
            body["speed"] = float(body["speed"])
    except ValueError as exc:
        raise CatalogueError(f"{where}: {exc}") from exc
    return body


def parse_catalogue(text: str, kind: str) -> list[Prompt]:
    """Prompts from a catalogue's contents. ``kind`` is ``txt``, ``csv`` or ``yaml``."""
    prompts: list[Prompt] = []
    if kind == "csv":
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None:
            return []
        for row in reader:
            where = f"line {reader.line_num}"
            if None in row:
                raise CatalogueError(f"{where}: more cells than header columns")
            if not any((v or "").strip() for v in row.values()):
                continue
            prompts.append(Prompt(_coerce(normalize_prompt(row, where), where), where))
        return prompts
    if kind == "yaml":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CatalogueError(f"not valid YAML: {exc}") from exc
        defaults: Mapping[str, Any] = {}
        if isinstance(data, Mapping):
            defaults = data.get("defaults") or {}
            data = data.get("prompts")
            if not isinstance(defaults, Mapping):
                raise CatalogueError("'defaults' must be a mapping")
        if data is None:
            return []
        if not isinstance(data, list):
            raise CatalogueError("expected a list of prompts (or a mapping with 'prompts')")
        base = normalize_prompt(defaults, "defaults")
        for i, item in enumerate(data):
            where = f"prompt {i + 1}"
            if isinstance(item, str):
                item = {"input": item}
            if not isinstance(item, Mapping):
                raise CatalogueError(f"{where}: expected a string or a mapping")
            prompts.append(Prompt(_coerce({**base, **normalize_prompt(item, where)}, where), where))
        return prompts
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        prompts.append(Prompt({"input": line}, f"line {n}"))
    return prompts


def read_catalogue(path: Path) -> list[Prompt]:
    """Prompts from a file: ``.csv``, ``.yaml``/``.yml``, else one prompt a line (txt)."""
    suffix = path.suffix.lower()
    kind = "csv" if suffix == ".csv" else "yaml" if suffix in (".yaml", ".yml") else "txt"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogueError(f"cannot read {path}: {exc}") from exc
    return parse_catalogue(text, kind)


# ---- validating and rendering -------------------------------------------------------------


def to_requests(
    prompts: Sequence[Prompt],
    defaults: Mapping[str, Any],
    settings: Settings,
    service: SpeechService,
    *,
    param_prefix: str = "prompts",
) -> list[SpeechRequest]:
    """Validate every prompt (all of them before any is rendered) into pinned requests.

    ``defaults`` fill fields a prompt leaves out. A bad prompt raises :class:`BadRequest` whose
    ``param`` is ``prompts[i].field`` and whose message says where the prompt came from.
    """
    base = {"model": settings.default_model, "voice": settings.default_voice, **defaults}
    out: list[SpeechRequest] = []
    for i, prompt in enumerate(prompts):
        try:
            req = parse_openai_speech({**base, **prompt.body}, settings, service)
        except BadRequest as exc:
            raise BadRequest(
                f"{prompt.where}: {exc.message}",
                param=f"{param_prefix}[{i}].{exc.param}" if exc.param else f"{param_prefix}[{i}]",
                code=exc.code,
            ) from exc
        out.append(dataclasses.replace(req, pinned=True))
    return out


async def _speak_patiently(service: SpeechService, req: SpeechRequest) -> SpeechResult:
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
                res = await _speak_patiently(service, req)
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
