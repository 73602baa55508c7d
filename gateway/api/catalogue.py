"""Prompt catalogues as input: reading ``.txt``/``.csv``/``.yaml`` files and ``POST /v1/prompts``
bodies into validated :class:`~gateway.speech.request.SpeechRequest` objects.

A prompt is an OpenAI speech body (``input``, ``voice``, ``model``, ``response_format``,
``speed``, ``sample_rate``, ``input_type``, ``normalize``); files may use the short names
``text``, ``format`` and ``rate``. An ``input`` may be SSML (docs/ssml.md), as in any request.
A prompt may carry an ``id``: the name its files get when exported for a PBX (``voxgate export``),
so it must be file-name safe and unique in the catalogue (:func:`check_ids`).
Rendering and pinning them is :mod:`gateway.speech.catalogue`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.api.models import PROMPT_ID, PromptFields
from gateway.api.parsing import parse_speech_object
from gateway.errors import BadRequest
from gateway.runtime.settings import Settings
from gateway.speech.request import SpeechRequest
from gateway.speech.vocabulary import Vocabulary

# Short column names accepted in files, mapped to the OpenAI field names.
ALIASES = {"text": "input", "format": "response_format", "rate": "sample_rate"}
# The speech fields a prompt takes: the request model's, less the short names and the id.
FIELDS = tuple(f for f in PromptFields.model_fields if f not in ALIASES and f != "id")
# A prompt's id names its exported files (Asterisk: sounds/<id>.ulaw): letters, digits, and
# "_", "-", "." inside, never leading (no hidden files, no "..": no way out of the directory).
ID_PATTERN = re.compile(PROMPT_ID)


class CatalogueError(ValueError):
    """A catalogue file cannot be read; the message names the line or prompt."""


@dataclass(frozen=True)
class Prompt:
    """One catalogue entry before validation: an OpenAI-shaped body and where it came from."""

    body: Mapping[str, Any]
    where: str  # "line 12" or "prompt 3": for error messages, never the text itself
    id: str | None = None


def normalize_prompt(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A prompt body with OpenAI field names; empty cells dropped (they take the default)."""
    body: dict[str, Any] = {}
    for key, value in raw.items():
        name = ALIASES.get(str(key).strip(), str(key).strip())
        if name == "id":
            if value is not None and str(value).strip():
                body["id"] = str(value).strip()
            continue
        if name not in FIELDS:
            raise CatalogueError(
                f"{where}: unknown field {key!r}; expected one of "
                f"{', '.join(sorted({*FIELDS, *ALIASES, 'id'}))}"
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
        for row in reader:
            where = f"line {reader.line_num}"
            if None in row:
                raise CatalogueError(f"{where}: more cells than header columns")
            if not any((v or "").strip() for v in row.values()):
                continue
            prompts.append(make_prompt(_coerce(normalize_prompt(row, where), where), where))
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
        if "id" in base:
            raise CatalogueError("defaults: 'id' names one prompt; it cannot be a default")
        for i, item in enumerate(data):
            where = f"prompt {i + 1}"
            if isinstance(item, str):
                item = {"input": item}
            if not isinstance(item, Mapping):
                raise CatalogueError(f"{where}: expected a string or a mapping")
            prompts.append(
                make_prompt(_coerce({**base, **normalize_prompt(item, where)}, where), where)
            )
        return prompts
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        prompts.append(Prompt({"input": line}, f"line {n}"))
    return prompts


def make_prompt(body: dict[str, Any], where: str) -> Prompt:
    """A prompt, its ``id`` taken out of the speech fields."""
    ident = body.pop("id", None)
    return Prompt(body, where, ident)


def check_ids(prompts: Sequence[Prompt], *, required: bool = False) -> None:
    """Refuse ids that are not file-name safe or not unique (and, with ``required``, missing
    ones), naming the line or prompt: before any work is done."""
    seen: dict[str, str] = {}
    for prompt in prompts:
        ident = prompt.id
        if ident is None:
            if required:
                raise CatalogueError(f"{prompt.where}: missing id (export names files by id)")
            continue
        if not ID_PATTERN.fullmatch(ident):
            raise CatalogueError(
                f"{prompt.where}: id {ident[:40]!r} is not a safe file name: use letters, "
                "digits and _ - . (not first), at most 128 characters"
            )
        if ident in seen:
            raise CatalogueError(f"{prompt.where}: id {ident!r} is already used on {seen[ident]}")
        seen[ident] = prompt.where


def read_catalogue(path: Path) -> list[Prompt]:
    """Prompts from a file: ``.csv``, ``.yaml``/``.yml``, else one prompt a line (txt)."""
    suffix = path.suffix.lower()
    kind = "csv" if suffix == ".csv" else "yaml" if suffix in (".yaml", ".yml") else "txt"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogueError(f"cannot read {path}: {exc}") from exc
    return parse_catalogue(text, kind)


def to_requests(
    prompts: Sequence[Prompt],
    defaults: Mapping[str, Any],
    settings: Settings,
    words: Vocabulary,
) -> list[SpeechRequest]:
    """Validate every prompt (all of them before any is rendered) into requests.

    ``defaults`` fill fields a prompt leaves out. A bad prompt raises :class:`BadRequest` whose
    ``param`` is ``prompts[i].field`` and whose message says where the prompt came from.
    """
    base = {"model": words.default_model, "voice": words.default_voice, **defaults}
    out: list[SpeechRequest] = []
    for i, prompt in enumerate(prompts):
        try:
            out.append(parse_speech_object({**base, **prompt.body}, settings, words).req)
        except BadRequest as exc:
            raise BadRequest(
                f"{prompt.where}: {exc.message}",
                param=f"prompts[{i}].{exc.param}" if exc.param else f"prompts[{i}]",
                code=exc.code,
            ) from exc
    return out
