"""The quarantine: refused takes kept aside for review (docs/takes-review.md).

A take the checks refuse is never stored under its address; it is kept here, with its reasons,
what was measured, its model, voice and text, so an admin can listen to it and approve it into
the store (a voice whose whisper or long pause is intended) or discard it. Bounded in count and
bytes (the oldest go first) and expiring. A diskcache of its own under ``cache_dir``, so every
gateway process of the host sees one list; every call runs off the event loop. What is read
back is verified (the record's fields, the entry's checksum) before it is served or stored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from cache.disk import RawBytesDisk, _keys
from cache.entry import CorruptEntry, Entry
from gateway.speech.takes import Take
from synth.takecheck import REASONS, Verdict

log = logging.getLogger("voxgate")

T = TypeVar("T")
_LEN = struct.Struct(">I")
MIB = 1024 * 1024
MAX_TAKES = 200
MAX_BYTES = 64 * MIB
TTL_S = 7 * 86400.0
MAX_TEXT_CHARS = 10_000  # what a review shows of the text a take should say


@dataclass(frozen=True)
class Rejected:
    """One refused take's record: its ``id`` in the quarantine and the address it was made for."""

    id: str
    key: str
    model: str
    voice: str
    reasons: tuple[str, ...]
    measured: dict[str, float]
    time: float
    text: str

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "reasons": list(self.reasons)}


def _record(raw: object) -> Rejected:
    """A record read back, every field's type checked; else :class:`CorruptEntry`."""
    if not isinstance(raw, dict) or set(raw) != set(Rejected.__dataclass_fields__):
        raise CorruptEntry("quarantine record: not an object of its fields")
    if not all(isinstance(raw[name], str) for name in ("id", "key", "model", "voice", "text")):
        raise CorruptEntry("quarantine record: bad string field")
    reasons, measured, when = raw["reasons"], raw["measured"], raw["time"]
    if not isinstance(reasons, list) or not all(r in REASONS for r in reasons):
        raise CorruptEntry("quarantine record: bad reasons")
    if not isinstance(measured, dict) or not all(
        isinstance(k, str) and type(v) in (int, float) for k, v in measured.items()
    ):
        raise CorruptEntry("quarantine record: bad measured")
    if type(when) not in (int, float) or not math.isfinite(when):
        raise CorruptEntry("quarantine record: bad time")
    return Rejected(**{**raw, "reasons": tuple(reasons)})


class Quarantine:
    """Refused takes of every process of the host (implements ``Rejects``): at most
    ``max_takes`` and ``max_bytes``, each for ``ttl_s``. ``clock`` gives the time (tests)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_takes: int = MAX_TAKES,
        max_bytes: int = MAX_BYTES,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_takes, self.max_bytes, self.ttl_s = max_takes, max_bytes, ttl_s
        self._clock = clock
        path = Path(directory)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._cache = diskcache.Cache(
            str(path), size_limit=2**62, eviction_policy="none", disk=RawBytesDisk
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="quarantine")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ---- Rejects ---------------------------------------------------------------------------

    async def keep(self, key: str, entry: Entry, take: Take, verdict: Verdict) -> None:
        """Keep a refused take aside (logged with its key and reasons, never its text)."""
        record = Rejected(
            id=secrets.token_hex(8),
            key=key,
            model=entry.meta.model,
            voice=entry.meta.voice,
            reasons=verdict.reasons,
            measured={k: float(v) for k, v in verdict.measured.items() if math.isfinite(v)},
            time=self._clock(),
            text=take.text[:MAX_TEXT_CHARS],
        )
        head = json.dumps(record.as_json(), separators=(",", ":")).encode()
        blob = _LEN.pack(len(head)) + head + entry.to_blob()
        if len(blob) > self.max_bytes:
            log.warning("refused take for %s too large to quarantine (%d bytes)", key, len(blob))
            return
        await self._run(self._keep_sync, record, blob)
        log.info("quarantined take %s for %s: %s", record.id, key, ", ".join(record.reasons))

    def _keep_sync(self, record: Rejected, blob: bytes) -> None:
        self._cache.set(record.id, blob, tag=record.time)
        self._cull_sync()

    def _cull_sync(self) -> None:
        """Drop what expired, then the oldest until within both bounds."""
        rows = self._cache._sql(
            # A small value is kept in its row (size 0): its length is its size.
            "SELECT key, tag, max(size, coalesce(length(value), 0)) FROM Cache"
            " WHERE raw = 1 ORDER BY rowid"
        ).fetchall()
        now = self._clock()
        live = []
        for key, when, size in rows:
            if type(when) not in (int, float) or when + self.ttl_s <= now:
                self._cache.delete(key)
            else:
                live.append((key, size))
        count, volume = len(live), sum(size for _, size in live)
        for key, size in live:
            if count <= self.max_takes and volume <= self.max_bytes:
                break
            self._cache.delete(key)
            count, volume = count - 1, volume - size

    # ---- review ----------------------------------------------------------------------------

    def _read_sync(self, id_: str) -> tuple[Rejected, Entry] | None:
        blob = self._cache.get(id_)
        if blob is None:
            return None
        try:
            if not isinstance(blob, bytes):
                raise CorruptEntry("unexpected value type")
            (n,) = _LEN.unpack_from(blob, 0)
            record = _record(json.loads(blob[_LEN.size : _LEN.size + n]))
            entry = Entry.from_blob(memoryview(blob)[_LEN.size + n :])
            if record.id != id_:
                raise CorruptEntry("quarantine record under another id")
        except (CorruptEntry, struct.error, ValueError) as exc:
            log.warning("quarantined take %s unreadable, dropped: %s", id_, exc)
            self._cache.delete(id_)
            return None
        if record.time + self.ttl_s <= self._clock():
            self._cache.delete(id_)
            return None
        return record, entry

    def _listing_sync(self) -> list[Rejected]:
        self._cull_sync()
        found = (self._read_sync(key) for key in list(_keys(self._cache)))
        return [item[0] for item in found if item is not None]

    async def listing(self) -> list[Rejected]:
        """Every take kept, oldest first."""
        return await self._run(self._listing_sync)

    async def get(self, id_: str) -> tuple[Rejected, Entry] | None:
        """One take and its entry (verified), or None."""
        return await self._run(self._read_sync, id_)

    def _pop_sync(self, id_: str) -> tuple[Rejected, Entry] | None:
        found = self._read_sync(id_)
        # Only the process whose delete removes it has it: two approvals store it once.
        return found if found is not None and self._cache.delete(id_) else None

    async def pop(self, id_: str) -> tuple[Rejected, Entry] | None:
        """Take one out (to approve or discard it), or None when it is not there (any more)."""
        return await self._run(self._pop_sync, id_)

    def _close_sync(self) -> None:
        self._pool.shutdown(wait=True)
        self._cache.close()

    async def close(self) -> None:
        await asyncio.to_thread(self._close_sync)
