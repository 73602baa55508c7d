"""The embedded default tier: diskcache on local disk, survives restarts, nothing to install.

diskcache is synchronous (SQLite + files), so every call runs in a small dedicated thread pool and
the event loop only awaits it.

Rows are data, never code, and a row's file name is not trusted (:class:`RawBytesDisk`), for
the reasons in docs/security.md, "The cache", "Disk tier".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import logging
import os
import sqlite3
import stat
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import diskcache
from crc32c import crc32c

from cache.entry import CorruptEntry, Entry
from cache.tier import PurgeFilter, TierError, TierStats, bounded

T = TypeVar("T")

log = logging.getLogger("voxgate.cache.disk")

# Pinned entries are tagged so that purge and eviction can tell them apart.
PINNED_TAG = "pinned"

# A disk value is a frame: magic, CRC-32C of the blob (metadata and audio), then the blob
# (Entry.to_blob). Values written before the frame start with the blob's 4-byte metadata length,
# whose first byte is 0 for any real entry, so they are told apart from a frame and still read
# (their audio checksum verified, as before).
_FRAME = struct.Struct(">4sI")
_MAGIC = b"VXD1"


def frame(entry: Entry) -> bytes:
    """The disk value holding ``entry``: the frame header, then ``entry.to_blob()``, built with
    one copy of the audio, not two (the CRC runs over the blob's head, then on over the audio)."""
    head = entry.blob_head()
    crc = crc32c(entry.audio, crc32c(head))
    return b"".join([_FRAME.pack(_MAGIC, crc), head, entry.audio])


def unframe(value: bytes) -> Entry:
    """The entry in a disk value; :class:`CorruptEntry` when the frame or its CRC is wrong."""
    if value[:4] != _MAGIC:
        return Entry.from_blob(value)  # written before frames: the audio checksum only
    if len(value) < _FRAME.size:
        raise CorruptEntry("disk value too short")
    _, crc = _FRAME.unpack_from(value, 0)
    blob = memoryview(value)[_FRAME.size :]
    if crc32c(blob) != crc:
        raise CorruptEntry("crc mismatch")
    return Entry.from_blob(blob, verify=False)


class RawBytesDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no type hints
    """A diskcache ``Disk`` of ``str`` keys and ``bytes`` values only (see the module's notes):
    a pickle or text row, a key stored pickled, or a value that is not bytes is refused with
    :class:`CorruptEntry` (a miss, and the store deletes it), never unpickled."""

    # The largest value file read (the tier sets its own bound): a bigger one is corrupt, so a
    # planted file costs no more memory than a genuine value could.
    max_file_bytes: int = 1 << 62

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) is not str:
            raise TypeError(f"disk tier keys are str, not {type(key).__name__}")
        return key, True

    def get(self, key: Any, raw: bool) -> Any:
        if not raw or type(key) is not str:
            raise CorruptEntry("a disk row with a pickled key: refused, never unpickled")
        return key

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if type(value) is not bytes or read:
            raise TypeError(f"disk tier values are bytes, not {type(value).__name__}")
        if len(value) < self.min_file_size:
            return super().store(value, read, key=key)
        # A value of its own file, written in one piece: diskcache's Disk.store hands _write a
        # BytesIO, whose iteration yields *lines*, so audio (a 0x0A byte every ~256) would go out
        # as hundreds of writes per value, a system call each, costing the most beside busy
        # synthesis workers. Same file, same row (tests/test_store.py reads it back).
        filename, full_path = self.filename(key, value)
        try:
            self._write(full_path, iter((value,)), "xb")
        except OSError:
            # A write cut short (ENOSPC) leaves a partial file no row names: never read, never
            # culled, holding the space the tier needs.
            with contextlib.suppress(OSError):
                os.unlink(full_path)
            raise
        return len(value), diskcache.core.MODE_BINARY, filename, None

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if read:
            raise TypeError("disk tier values are read whole")
        if mode == diskcache.core.MODE_RAW:
            if not isinstance(value, bytes):
                raise CorruptEntry(f"a disk row holding {type(value).__name__}, not bytes")
            return value
        if mode == diskcache.core.MODE_BINARY:
            return self._read_value_file(filename)
        # MODE_PICKLE above all: never handed to pickle. MODE_TEXT: never written by us.
        raise CorruptEntry(f"a disk row in mode {mode}: refused, never unpickled")

    def _read_value_file(self, filename: object) -> bytes:
        """The bytes of the value file a row names, read without trusting the name.

        An ``OSError`` that is not about the name (the file deleted since the row was read,
        ENOENT) reaches diskcache, which answers a miss as it always did; a name that leads out
        of the directory, through a link or to something not a regular file is
        :class:`CorruptEntry` (a counted miss; the store deletes the row, and :meth:`remove`
        touches nothing outside the directory).
        """
        parts = _path_parts(filename)
        with ExitStack() as fds:
            folder = _walk_folders(self._directory, parts, fds)[-1]
            try:
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=folder)
            except OSError as exc:
                if exc.errno in _LINK_ERRNOS:
                    raise CorruptEntry("a disk row naming a link, not a value file") from None
                raise
            fds.callback(os.close, fd)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CorruptEntry("a disk row naming something that is not a regular file")
            if info.st_size > self.max_file_bytes:
                raise CorruptEntry(f"a disk value file of {info.st_size} bytes, over the tier")
            return _read_exactly(fd, info.st_size)

    def remove(self, file_path: Any) -> None:
        """Delete a value file and the folders it leaves empty, inside the cache directory only.

        diskcache's own ``remove`` deletes ``join(directory, name)`` and then every empty folder
        above it (``os.removedirs``), wherever the name points. Here a name that is not a plain
        relative path deletes nothing, a link on the way is not followed (a link in place of the
        file is removed itself, never its target), and the walk up stops at the cache directory.
        Errors are suppressed, as diskcache's are (two caches may delete one file at once).
        """
        try:
            parts = _path_parts(file_path)
        except CorruptEntry:
            log.warning("a disk row naming a file outside the cache: no file deleted")
            return
        with ExitStack() as fds:
            try:
                folders = _walk_folders(self._directory, parts, fds)
                os.unlink(parts[-1], dir_fd=folders[-1])
            except (OSError, CorruptEntry):
                return
            for depth in range(len(parts) - 1, 0, -1):
                try:
                    os.rmdir(parts[depth - 1], dir_fd=folders[depth - 1])
                except OSError:
                    return


# O_NOFOLLOW: no link, as file or folder; O_NONBLOCK: opening a FIFO waits for no writer.
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What open() answers for a link where O_NOFOLLOW forbids one (ELOOP), or a link or file where
# O_DIRECTORY wants a folder (ENOTDIR).
_LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR)


def _path_parts(filename: object) -> list[str]:
    """The folders and file name of a row's ``filename``; :class:`CorruptEntry` unless it is a
    relative path of plain names (no ``..``, ``.``, empty part or NUL). diskcache writes
    ``ab/cd/<hex>.val``; anything else in that column was written by someone else."""
    if not isinstance(filename, str) or not filename or "\0" in filename:
        raise CorruptEntry("a disk row without a usable value file name")
    parts = filename.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise CorruptEntry("a disk row naming a file outside the cache directory")
    return parts


def _walk_folders(directory: str, parts: list[str], fds: ExitStack) -> list[int]:
    """The fds of ``directory`` and of each folder on the way to ``parts[-1]``, reached one
    folder at a time (closed with ``fds``); :class:`CorruptEntry` when one on the way is a link
    or not a folder. ``directory`` itself is the operator's and may be reached by links."""
    folders = [os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    fds.callback(os.close, folders[0])
    for part in parts[:-1]:
        try:
            folders.append(os.open(part, _FOLDER_FLAGS, dir_fd=folders[-1]))
        except OSError as exc:
            if exc.errno in _LINK_ERRNOS:
                raise CorruptEntry("a disk row whose path leads through a link") from None
            raise
        fds.callback(os.close, folders[-1])
    return folders


def _read_exactly(fd: int, size: int) -> bytes:
    """``size`` bytes of ``fd`` (one read, as a rule): fewer (the file shrank) is a corrupt
    value, never a short one passed on; more (it grew) is not read."""
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            raise CorruptEntry("a disk value file shorter than it was")
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _private_dir(path: Path) -> None:
    """Create ``path`` (and parents) so that only this user can enter it.

    A directory that exists already keeps its mode (an operator may have chosen it) unless
    others can write to it: then it is made 0700, as one of ours must be.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777
    if mode & 0o022:  # (only then: an operator reading stats as another user changes nothing)
        try:
            path.chmod(0o700)
        except OSError as exc:
            log.warning("cache directory %s is writable by others (%o): %s", path, mode, exc)


def _no_room(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system has no room (a value file or SQLite's own write)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


class DiskTier:
    """A size-bounded diskcache tier. Pinned entries go to a separate cache that is never
    evicted, bounded by ``max_bytes`` of its own (a pinned entry past it is stored evictable).

    A file system that fills before ``max_bytes`` (ENOSPC) makes the tier evict its least
    recently stored evictable entries to make room and store the entry after all; ``on_evict``
    is told how many, and :meth:`stats` says so (docs/operations.md, "A full disk")."""

    name = "disk"

    def __init__(
        self,
        directory: str | Path,
        max_bytes: int,
        *,
        timeout_s: float = 2.0,
        on_evict: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.directory = Path(directory)
        self._on_evict = on_evict
        self.evicted_for_space = 0
        self.full = False
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        _private_dir(self.directory)
        sides = {"lru": (max_bytes, "least-recently-stored"), "pinned": (2**62, "none")}
        caches: list[diskcache.Cache] = []
        for side, (limit, policy) in sides.items():
            _private_dir(self.directory / side)  # before diskcache makes it 0755
            cache = diskcache.Cache(
                str(self.directory / side),
                size_limit=limit,
                eviction_policy=policy,
                timeout=timeout_s,
                disk=RawBytesDisk,
            )
            cache.disk.max_file_bytes = max_bytes
            caches.append(cache)
        self._cache, self._pinned = caches
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="disk-tier")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await bounded(
                loop.run_in_executor(self._pool, functools.partial(fn, *args)), self.timeout_s
            )
        except (OSError, sqlite3.Error, diskcache.Timeout, TimeoutError) as exc:
            raise TierError(f"disk tier: {type(exc).__name__}: {exc}") from exc

    def _get_sync(self, key: str) -> Entry | None:
        blob = self._pinned.get(key)
        if blob is None:
            blob = self._cache.get(key)
        if blob is None:
            return None
        if not isinstance(blob, bytes):
            raise CorruptEntry("unexpected value type")
        return unframe(blob)

    async def get(self, key: str) -> Entry | None:
        return await self._run(self._get_sync, key)

    def _put_sync(self, key: str, entry: Entry) -> None:
        blob = frame(entry)
        try:
            self._store_sync(key, entry, blob)
        except (OSError, sqlite3.OperationalError) as exc:
            if not _no_room(exc):
                raise
            evicted = self._make_room(len(blob))
            if not evicted:
                self.full = True
                raise
            try:
                self._store_sync(key, entry, blob)
            except (OSError, sqlite3.OperationalError) as again:
                self.full = self.full or _no_room(again)
                raise
        self.full = False

    def _make_room(self, needed: int) -> int:
        """Evict the least recently stored evictable entries (diskcache's own cull order) until
        ``needed`` bytes twice over, or a twentieth of the side, are freed, so that a disk that
        filled is not culled again at every write; how many. Pinned entries are never evicted."""
        target = max(2 * needed, int(self._cache.volume()) // 20)
        freed = evicted = 0
        while freed < target:
            rows = self._cache._sql(
                "SELECT key, size FROM Cache WHERE raw = 1 ORDER BY store_time LIMIT 32"
            ).fetchall()
            if not rows:
                break
            for key, size in rows:
                if self._cache.delete(key):
                    evicted += 1
                    freed += int(size or 0)
                if freed >= target:
                    break
        if evicted:
            self.evicted_for_space += evicted
            self._on_evict(evicted)
            log.warning("disk full: evicted %d entries (%d bytes) to make room", evicted, freed)
        return evicted

    def _store_sync(self, key: str, entry: Entry, blob: bytes) -> None:
        # Pinned entries have a quota, the tier's bound (the pinned flag may come from Redis, a
        # tier below, with a promotion): one past it goes to the bounded side, where it may be
        # evicted like any other, instead of growing the pinned side without limit.
        if entry.meta.pinned and self._pinned.volume() + len(blob) <= self.max_bytes:
            self._pinned.set(key, blob, tag=PINNED_TAG)
            self._cache.delete(key)
        else:
            self._cache.set(key, blob)

    async def put(self, key: str, entry: Entry) -> None:
        await self._run(self._put_sync, key, entry)

    async def delete(self, key: str) -> bool:
        deleted = await self._run(lambda: [c.delete(key) for c in (self._cache, self._pinned)])
        return any(deleted)

    def _sides(self, pinned: bool | None) -> list[diskcache.Cache]:
        return [c for c, p in ((self._cache, False), (self._pinned, True)) if pinned in (None, p)]

    def iter_keys_sync(self, *, pinned: bool | None = None) -> Iterator[str]:
        """Iterate keys (synchronously; call from a thread). ``pinned`` selects one side."""
        for cache in self._sides(pinned):
            yield from _keys(cache)

    def _purge_sync(self, match: PurgeFilter) -> int:
        removed = 0
        for cache in self._sides(match.pinned):
            for key in list(_keys(cache)):
                try:
                    blob = cache.get(key)  # None: gone since the listing
                    doomed = blob is not None and match.matches(unframe(blob).meta)
                except CorruptEntry:
                    cache.delete(key)  # unreadable: it could never be served anyway
                    removed += 1
                    continue
                if doomed and cache.delete(key):
                    removed += 1
        return removed

    async def purge(self, match: PurgeFilter) -> int:
        # A scan is not bounded by the per-call timeout: it is an operator action, not a request.
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self._purge_sync, match)
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise TierError(f"disk tier purge: {exc}") from exc

    async def stats(self) -> TierStats:
        sides = self._cache, self._pinned
        sizes = await self._run(lambda: [(len(c), int(c.volume())) for c in sides])
        (n_lru, lru_bytes), (n_pin, pin_bytes) = sizes
        return TierStats(
            self.name,
            n_lru + n_pin,
            lru_bytes + pin_bytes,
            self.max_bytes,
            n_pin,
            self.evicted_for_space,
            self.full,
        )

    def path_of(self, key: str) -> Path | None:
        """Where diskcache keeps a large value on disk (tests use it to corrupt an entry)."""
        for cache in (self._cache, self._pinned):
            with cache.transact():
                row = cache._sql(
                    "SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)
                ).fetchone()
            if row and row[0]:
                return Path(cache.directory) / str(row[0])
        return None

    def _close_sync(self) -> None:
        self._pool.shutdown(wait=True)
        self._cache.close()
        self._pinned.close()

    async def close(self) -> None:
        await asyncio.to_thread(self._close_sync)


def _keys(cache: diskcache.Cache) -> Iterator[str]:
    """The keys of ``cache`` stored as text. diskcache's own ``iterkeys`` would unpickle a key
    stored pickled; such a row (never written by voxgate) is never read, so never served."""
    rows = cache._sql("SELECT key FROM Cache WHERE raw = 1 ORDER BY rowid").fetchall()
    return (row[0] for row in rows if isinstance(row[0], str))
