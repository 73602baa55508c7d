"""Exporting a prompt catalogue as sound files a PBX plays from disk (``voxgate export``).

IVR teams deploy prompts into the PBX's sound directories: Asterisk plays ``sounds/<name>`` and
picks the file by extension (``<id>.ulaw``, ``<id>.wav``, ``<id>.sln16``, ...); FreeSWITCH keeps one
directory per rate (``sounds/<lang>/<rate>/<id>.wav``). Each prompt (with an ``id``) becomes one
file per asked extension, named for the layout, rendered through the speech service like any
request (a prompt already stored costs no synthesis; a new encoding of it is a transcode).

Files are written atomically (a temporary file in the same directory, then a rename), so a PBX
never plays half a file. ``manifest.json`` beside them records, per id, the prompt's format-free
content address, its text, voice and model, and each file with its own content address: a re-run
compares those addresses and writes nothing unchanged (a file is rewritten only when its address
changed, or it is missing, or its bytes no longer match the digest recorded for them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.errors import VoxgateError
from gateway.speech.catalogue import speak_patiently
from gateway.speech.request import SpeechRequest
from gateway.speech.service import SpeechService
from gateway.speech.telephony import EXTENSIONS, Extension
from synth.errors import SynthesisError

Layout = Literal["asterisk", "freeswitch", "flat"]
LAYOUTS: tuple[Layout, ...] = ("asterisk", "freeswitch", "flat")
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


class ExportError(ValueError):
    """The export cannot run as asked (formats, layout); the message says why."""


def file_name(layout: Layout, ident: str, ext: Extension) -> str:
    """Where ``ext``'s file of prompt ``ident`` goes, relative to the export directory."""
    if layout == "freeswitch":
        return f"{ext.rate}/{ident}.wav"
    if layout == "asterisk":
        assert ext.asterisk is not None  # (checked by plan_formats)
        return f"{ident}.{ext.asterisk}"
    return f"{ident}.{ext.name}"


def plan_formats(names: Sequence[str], layout: Layout) -> list[Extension]:
    """The extensions of ``names`` for ``layout``, refusing what the PBX cannot play from that
    layout and formats that would write the same file."""
    if layout not in LAYOUTS:
        raise ExportError(f"unknown layout {layout!r}; layouts: {', '.join(LAYOUTS)}")
    out: list[Extension] = []
    taken: dict[str, str] = {}
    for name in names:
        ext = EXTENSIONS.get(name)
        if ext is None:
            raise ExportError(f"unknown format {name!r}; formats: {', '.join(EXTENSIONS)}")
        if layout == "asterisk" and ext.asterisk is None:
            raise ExportError(f"core Asterisk plays no {name} files; use the flat layout")
        if layout == "freeswitch" and ext.fmt.name != "wav":
            wavs = ", ".join(n for n, e in EXTENSIONS.items() if e.fmt.name == "wav")
            raise ExportError(
                f"the freeswitch layout writes <rate>/<id>.wav: formats {wavs} (not {name})"
            )
        where = file_name(layout, "ID", ext)
        if where in taken:
            raise ExportError(f"formats {taken[where]} and {name} would write the same file")
        taken[where] = name
        out.append(ext)
    if not out:
        raise ExportError("no formats asked: --format ulaw,wav,...")
    return out


@dataclass(frozen=True)
class ExportItem:
    """One prompt to export: its id, request, and where it came from (for messages)."""

    ident: str
    req: SpeechRequest
    where: str


@dataclass
class FileResult:
    """What happened to one file: ``written``, ``unchanged`` or ``failed``."""

    ident: str
    ext: str
    path: str
    outcome: str
    synthesized: bool = False
    error: str | None = None


@dataclass
class ExportSummary:
    """Totals of one export."""

    prompts: int = 0
    files: int = 0
    written: int = 0
    unchanged: int = 0
    failed: int = 0
    synthesized: int = 0
    seconds: float = 0.0
    manifest_written: bool = False
    errors: list[dict[str, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` summary."""
        out = dataclasses.asdict(self)
        out["seconds"] = round(self.seconds, 3)
        out["errors"] = self.errors[:20]
        return out


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of an earlier export into ``directory`` (empty when there is none or it
    cannot be read: then every file is written again)."""
    try:
        data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        return {}
    prompts = data.get("prompts")
    return prompts if isinstance(prompts, dict) else {}


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new, uniquely named file in ``path``'s directory, open for writing, with the mode the
    process umask gives a new file (0644 under umask 022). Not ``tempfile.mkstemp``: its 0600
    would survive the rename, and the PBX (its own user: asterisk, freeswitch) could not read
    the prompt. The kernel applies the umask at creation, so no thread ever changes it."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename:
    a reader sees the old file or the new one, never a part. Files and the directories made for
    them get the modes the process umask allows, as any file the user writes does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def file_digest(data: bytes) -> str:
    """The digest the manifest records of a file's bytes."""
    return "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def _unchanged(directory: Path, rel: str, key: str, old: dict[str, Any] | None) -> bool:
    """Whether the file an earlier run wrote is still what ``key`` names: same content address,
    and (the manifest is not trusted for the file itself) the file's bytes match its digest."""
    if not old or old.get("key") != key or old.get("path") != rel:
        return False
    try:
        data = (directory / rel).read_bytes()
    except OSError:
        return False
    return len(data) == old.get("bytes") and file_digest(data) == old.get("digest")


async def export(
    service: SpeechService,
    items: Sequence[ExportItem],
    formats: Sequence[Extension],
    directory: Path,
    layout: Layout,
    *,
    concurrency: int,
    on_file: Callable[[FileResult], None],
) -> ExportSummary:
    """Write every item's file in every format into ``directory`` (see the module doc)."""
    started = time.perf_counter()
    summary = ExportSummary(prompts=len(items), files=len(items) * len(formats))
    old = await asyncio.to_thread(read_manifest, directory)
    jobs = iter([(item, ext) for item in items for ext in formats])
    pause_ms = service.sentence_pause_ms
    manifest: dict[str, Any] = {
        item.ident: {
            "key": service.masters.master_key(item.req, sentence_pause_ms=pause_ms),
            "text": item.req.text,
            "voice": item.req.voice,
            "model": item.req.model,
            "files": {},
        }
        for item in items
    }

    async def one(item: ExportItem, ext: Extension) -> FileResult:
        req = dataclasses.replace(item.req, fmt=ext.fmt, sample_rate=ext.rate)
        rel = file_name(layout, item.ident, ext)
        key = service.keys_for(req)[1]
        previous = (old.get(item.ident) or {}).get("files", {}).get(ext.name)
        if await asyncio.to_thread(_unchanged, directory, rel, key, previous):
            manifest[item.ident]["files"][ext.name] = previous
            return FileResult(item.ident, ext.name, rel, "unchanged")
        try:
            result = await speak_patiently(service, req)
        except (VoxgateError, SynthesisError) as exc:
            return FileResult(item.ident, ext.name, rel, "failed", error=str(exc))
        await asyncio.to_thread(write_atomically, directory / rel, result.entry.audio)
        manifest[item.ident]["files"][ext.name] = {
            "path": rel,
            "key": result.key,
            "bytes": len(result.entry.audio),
            "digest": file_digest(result.entry.audio),
            "content_type": ext.content_type,
            "sample_rate": result.entry.meta.sample_rate,
        }
        return FileResult(item.ident, ext.name, rel, "written", synthesized=result.cache == "miss")

    async def worker() -> None:
        for item, ext in jobs:  # the shared iterator hands each file to one worker
            res = await one(item, ext)
            # (Each outcome is the name of its count.)
            setattr(summary, res.outcome, getattr(summary, res.outcome) + 1)
            if res.outcome == "failed":
                summary.errors.append(
                    {"where": item.where, "file": res.path, "error": res.error or ""}
                )
            summary.synthesized += res.synthesized
            on_file(res)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, summary.files or 1)))))
    document = {"version": MANIFEST_VERSION, "layout": layout, "prompts": manifest}
    text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    summary.manifest_written = await asyncio.to_thread(
        _write_if_changed, directory / MANIFEST, text
    )
    summary.seconds = time.perf_counter() - started
    return summary


def _write_if_changed(path: Path, text: str) -> bool:
    try:
        current: str | None = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        current = None  # missing or unreadable: written anew
    if current == text:
        return False
    write_atomically(path, text.encode("utf-8"))
    return True
