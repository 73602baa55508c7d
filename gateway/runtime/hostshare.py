"""What the gateway processes of one host share without Redis: each API key's rate windows and
each client's share of the synthesis queue.

``voxgate serve`` runs one gateway process per core, and a key's ``requests_per_minute`` or a
client's ``queue_per_client`` is a promise about the host, not about the process the kernel
happened to hand a connection to. The supervisor makes one small table in shared memory
(``/dev/shm`` where it exists) before it starts the gateways and names it in
:data:`HOST_TABLE_ENV`; each gateway maps it. A lone server maps a private one, so one code path
serves both.

Layout: a header, then two open-addressing hash tables of fixed rows of 64-bit integers, each row
tagged with 64 bits of a BLAKE2b digest of its identity (0 is an empty row):

- windows: ``(tag, expiry, window, previous, current)``: the sliding-window counter of the
  ``limits`` library (the algorithm the Redis-shared budgets use, weighted the same way), one row
  per identity such as ``r:<key name>``;
- shares: ``(tag, count[0], ..., count[P-1])``: items a client has waiting, one column per
  gateway process. Each process writes only its own column and zeroes it when it starts, so the
  items of a process that died are forgotten with it, while the host-wide count is the row's sum.

Every operation holds ``flock`` on the table's file for a few microseconds (two system calls, no
I/O: the file lives in memory); a process killed while holding it releases it with its file
descriptor. Which rows are reused, what a full table does (an operation answers ``None``), and
what a table cut short or overwritten under the server does (the same, until the supervisor's
:meth:`HostTable.repair`), and what a table deleted or renamed over does (each process maps the
file found at the path again once it is whole): docs/deploy.md, "What one host shares, and what
replicas share".

Why hand-written: the shared-state tools that exist are servers (Redis, which is the replica-wide
answer) or the ``multiprocessing`` managers, which need the processes to be forked from one parent
and answer over a socket; a per-request budget check must cost microseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from synth.scheduler import LocalShares

# Named by the supervisor of `serve --workers N` in each gateway's environment.
HOST_TABLE_ENV = "VOXGATE_HOST_TABLE"

_MAGIC = 0x56584854424C3031  # "VXHTBL01"
_HEADER = 8  # int64 words: magic, window rows, share rows, processes, (reserved)
_WINDOW_WORDS = 5
_MAX_PROBE = 32
DEFAULT_ROWS = 4096


class HostTable:
    """Rate windows and queue shares in a table every gateway process of the host maps."""

    def __init__(self, path: str | None, process: int = 0) -> None:
        """Map the table at ``path`` (made by :meth:`create`) as gateway process ``process``;
        ``path=None``: a private table for a lone process. ValueError when the file is not a
        whole table (the supervisor rebuilds it: :meth:`repair`)."""
        self.path = path
        self._fd = -1
        self._follows = False  # (set once made: a table being made follows no replacement)
        if path is None:
            self._mm = mmap.mmap(-1, self.size_for(DEFAULT_ROWS, DEFAULT_ROWS, 1))
            self._mm[: 8 * 4] = _header(DEFAULT_ROWS, 1)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                # Checked before mapping: a page of the mapping past the end of the file is a
                # SIGBUS on first touch, not an exception.
                size = _whole_size(fd)
                if size is None:
                    raise ValueError(f"{path} is not a whole voxgate host table")
                self._mm = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        self._words = memoryview(self._mm).cast("q")
        words = self._words
        self.window_rows = int(words[1])
        self.share_rows = int(words[2])
        self.processes = int(words[3])
        self._size = self.size_for(self.window_rows, self.share_rows, self.processes)
        if not 0 <= process < self.processes:
            self.close()
            raise ValueError(f"process {process} is outside the table's {self.processes}")
        self.process = process
        self._windows = _HEADER
        self._shares = _HEADER + self.window_rows * _WINDOW_WORDS
        self._share_words = 1 + self.processes
        self._tags: dict[str, int] = {}
        # A process that starts again takes over its column: what it had waiting died with it.
        with self._locked() as intact:
            if not intact:
                self.close()
                raise ValueError(f"{path} is not a whole voxgate host table")
            for row in range(self.share_rows):
                words[self._shares + row * self._share_words + 1 + process] = 0
        self._follows = True

    @staticmethod
    def size_for(window_rows: int, share_rows: int, processes: int) -> int:
        """Bytes of a table of these dimensions."""
        return 8 * (_HEADER + window_rows * _WINDOW_WORDS + share_rows * (1 + processes))

    @classmethod
    def create(
        cls,
        processes: int,
        directory: str | None = None,
        rows: int = DEFAULT_ROWS,
    ) -> str:
        """Make a zeroed table file for ``processes`` gateway processes (in ``directory``, else
        ``/dev/shm`` where it is writable, else the temp directory); its path. The caller removes
        it."""
        if directory is None:
            shm = Path("/dev/shm")
            directory = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="voxgate-host-", suffix=".table", dir=directory)
        try:
            os.ftruncate(fd, cls.size_for(rows, rows, processes))
            os.pwrite(fd, _header(rows, processes), 0)
        finally:
            os.close(fd)
        return path

    @classmethod
    def repair(cls, path: str, processes: int, rows: int = DEFAULT_ROWS) -> bool:
        """Make the file at ``path`` a whole, zeroed table again if it is not one (truncated,
        overwritten, or gone); whether it had to. The supervisor calls it: the gateways keep
        their mappings, which reach the same file again once it has its size back."""
        size = cls.size_for(rows, rows, processes)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _whole_size(fd) == size and os.pread(fd, 32, 0) == _header(rows, processes):
                return False
            # Grown back before it is rewritten: a gateway touching its mapping meanwhile reads
            # zeros (empty rows), never past the end of the file.
            os.ftruncate(fd, size)
            os.pwrite(fd, bytes(size), 0)
            os.pwrite(fd, _header(rows, processes), 0)
            return True
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap the table (the file stays: the supervisor removes it)."""
        self._words.release()
        self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """Hold the table's lock; yields whether the table is whole. Its size is checked under
        the lock before any word is touched: a file cut short under the mapping would be a
        SIGBUS at the first word past its end. (One cut in the microseconds between that check
        and the access still kills the process: the supervisor repairs the table, then starts
        it again.) A file no longer at the path (deleted, or renamed over: no link left) is
        left for the whole table found there, so the host's processes count in one table again,
        the ones started since included; until there is one, the old file still serves.
        Callers read ``self._words`` inside the block: the mapping may be another one."""
        if self._fd < 0:
            yield True
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        stat = os.fstat(self._fd)
        if stat.st_nlink == 0 and self._follows and self._follow():
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            stat = os.fstat(self._fd)
        try:
            yield stat.st_size >= self._size and self._words[0] == _MAGIC
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _follow(self) -> bool:
        """Map the table now at the path instead of this one (whose lock is held, and released
        with its file); whether there was a whole one of these dimensions. A few system calls on
        a file in memory, as every operation's."""
        assert self.path is not None
        try:
            found = HostTable(self.path, self.process)
        except (OSError, ValueError):
            return False  # (not there yet, or not rebuilt yet: the supervisor's repair)
        if (found.window_rows, found.share_rows) != (self.window_rows, self.share_rows) or (
            found.processes != self.processes
        ):
            found.close()
            return False
        self.close()
        self._mm, self._words, self._fd = found._mm, found._words, found._fd
        return True

    def _tag_of(self, identity: str) -> int:
        tag = self._tags.get(identity)
        if tag is None:
            if len(self._tags) > 65536:
                self._tags.clear()
            digest = hashlib.blake2b(identity.encode(), digest_size=8).digest()
            tag = self._tags[identity] = int.from_bytes(digest, "little", signed=True) or 1
        return tag

    def _row(
        self, base: int, rows: int, width: int, tag: int, stale: Callable[[int], bool], insert: bool
    ) -> int | None:
        """The first word of ``tag``'s row (made from an empty or stale row when ``insert``);
        None when absent (or no room). Called with the lock held."""
        words = self._words
        start = (tag & 0x7FFFFFFFFFFFFFFF) % rows
        reuse = -1
        for probe in range(min(_MAX_PROBE, rows)):
            at = base + ((start + probe) % rows) * width
            found = words[at]
            if found == tag:
                return at
            if found == 0:
                if reuse < 0:
                    reuse = at
                break
            if reuse < 0 and stale(at):
                reuse = at
        if not insert or reuse < 0:
            return None
        words[reuse : reuse + width] = memoryview(bytes(8 * width)).cast("q")
        words[reuse] = tag
        return reuse

    def hit_window(
        self, identity: str, limit: int, expiry: int, cost: int, now: float
    ) -> tuple[bool, float] | None:
        """Spend ``cost`` of ``identity``'s ``limit`` per ``expiry`` seconds: ``(admitted,
        seconds until the next unit would be)``, or None when the table has no room for it.

        The ``limits`` library's sliding window counter, as its storages compute it: the previous
        window's count weighted by the share of it still inside the sliding window, plus the
        current window's count; refused when that, rounded down, plus ``cost`` passes ``limit``.
        """
        tag = self._tag_of(identity)
        window = int(now // expiry)
        current_left = expiry - (now % expiry)
        with self._locked() as intact:
            if not intact:
                return None
            words = self._words
            at = self._row(
                self._windows,
                self.window_rows,
                _WINDOW_WORDS,
                tag,
                lambda at: words[at + 2] < int(now // max(1, words[at + 1])) - 1,
                insert=True,
            )
            if at is None:
                return None
            if words[at + 1] != expiry or words[at + 2] != window:
                # The current window's count becomes the previous one's when it is the next.
                follows = words[at + 1] == expiry and words[at + 2] == window - 1
                words[at + 3] = words[at + 4] if follows else 0
                words[at + 1] = expiry
                words[at + 2] = window
                words[at + 4] = 0
            previous, current = int(words[at + 3]), int(words[at + 4])
            if (
                cost <= limit
                and math.floor(previous * current_left / expiry + current) + cost <= limit
            ):
                words[at + 4] = current + cost
                return True, 0.0
        # When one more unit would fit again, as limits' get_window_stats reports it.
        reset = math.inf
        if previous:
            reset = current_left % (expiry / previous)
        if current:
            reset = min(reset, current_left % expiry)
        return False, max(1.0, 0.0 if math.isinf(reset) else reset)

    def _share_row(self, client: str, insert: bool) -> int | None:
        """:meth:`_row` for ``client``'s share row; called with the lock held."""
        words, width = self._words, self._share_words
        return self._row(
            self._shares,
            self.share_rows,
            width,
            self._tag_of(client),
            lambda at: not any(words[at + 1 : at + width]),
            insert,
        )

    def take_share(self, client: str, limit: int) -> bool | None:
        """Count one item waiting for ``client`` if the host has fewer than ``limit`` waiting
        for it (True), else refuse (False); None when the table has no room for the client."""
        with self._locked() as intact:
            if not intact:
                return None
            words, width = self._words, self._share_words
            at = self._share_row(client, insert=True)
            if at is None:
                return None
            if sum(words[at + 1 : at + width]) >= limit:
                return False
            words[at + 1 + self.process] += 1
            return True

    def give_share(self, client: str) -> None:
        """One item of ``client`` (taken by this process) no longer waits."""
        with self._locked() as intact:
            at = self._share_row(client, insert=False) if intact else None
            words = self._words
            if at is not None and words[at + 1 + self.process] > 0:
                words[at + 1 + self.process] -= 1

    def waiting_for(self, client: str) -> int:
        """Items ``client`` has waiting on the whole host."""
        with self._locked() as intact:
            at = self._share_row(client, insert=False) if intact else None
            return 0 if at is None else sum(self._words[at + 1 : at + self._share_words])


def _whole_size(fd: int) -> int | None:
    """The size of the table file ``fd`` when it holds a whole table (magic, sane dimensions,
    every row there), else None."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 32, 0)
    if len(head) < 32:
        return None
    magic, window_rows, share_rows, processes = struct.unpack("=4q", head)
    if magic != _MAGIC or min(window_rows, share_rows, processes) < 1:
        return None
    if size < HostTable.size_for(window_rows, share_rows, processes):
        return None
    return size


def _header(rows: int, processes: int) -> bytes:
    """magic, window rows, share rows, processes (native int64, as the table is read)."""
    return struct.pack("=4q", _MAGIC, rows, rows, processes)


class HostShares:
    """:class:`synth.scheduler.ClientShares` over the host's table: a client's waiting items
    counted once for every gateway process of the host. A client the table has no room for is
    counted in this process (``voxgate_host_table_full_total``)."""

    def __init__(self, table: HostTable, full: Callable[[], None] = lambda: None) -> None:
        self.table = table
        self._full = full
        self._spilled = LocalShares()

    def take(self, client: str, limit: int) -> bool:
        if not self._spilled.waiting_for(client):
            taken = self.table.take_share(client, limit)
            if taken is not None:
                return taken
            self._full()
        return self._spilled.take(client, limit)

    def give(self, client: str) -> None:
        if self._spilled.waiting_for(client):
            self._spilled.give(client)
        else:
            self.table.give_share(client)

    def waiting_for(self, client: str) -> int:
        return self.table.waiting_for(client) + self._spilled.waiting_for(client)


def open_host_table(worker_index: int) -> HostTable:
    """The table the supervisor named in :data:`HOST_TABLE_ENV`, as gateway process
    ``worker_index``, else a private one for a lone process. Opens a file: call it off the event
    loop."""
    path = os.environ.get(HOST_TABLE_ENV) or None
    return HostTable(path, worker_index if path else 0)
