"""A buffered access log: one line per request, written in batches.

Going through ``logging`` for every request (record creation, formatting, a write syscall) cost
about a tenth of a cache hit's CPU time. Like nginx's ``access_log ... buffer=``, requests are
kept in memory, and their lines built with no logging machinery and written together at most
``flush_interval_s`` later (or when ``max_lines`` pile up). gateway.http.observe hands requests
over at most 0.1 s after they are answered, so a line is written at most 0.2 s after its request.
The write itself (a syscall that blocks while a log pipe is full) runs on one writer thread,
never on the event loop; one thread keeps batches in order.
Lines waiting for that thread are bounded (``max_backlog_lines``): while stderr is blocked, newer
lines are dropped and counted, and the count is written once the stream drains, so a stuck log
reader costs bounded memory. The lines have the shape of every other log line
(:mod:`gateway.runtime.logs`); what they hold, never the request text: docs/observability.md,
"Logs".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import json
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from synth.cancellation import cancel_and_wait

if TYPE_CHECKING:
    from gateway.runtime.settings import Settings

LOGGER = "voxgate.access"

# One answered request as gateway.http.observe sees it: (time.time() when answered, route
# template, method, status, cache result, content key, seconds, seconds to the first byte, bytes
# sent, client id, request id). A plain tuple: one is made per request, on the hit path.
Observation = tuple[
    float, str, str, int, str, str | None, float, float, int | None, str | None, str | None
]


class AccessLog:
    """Collects access-log lines and writes them to ``stream`` in batches."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        fmt: str = "json",
        flush_interval_s: float = 0.1,
        max_lines: int = 512,
        max_backlog_lines: int = 65536,
        enabled: bool = True,
    ) -> None:
        self._stream = stream
        self.fmt = fmt
        self.flush_interval_s = flush_interval_s
        self.max_lines = max_lines
        self.enabled = enabled
        self._pid = os.getpid()
        self._second = -1
        self._prefix = ""
        self._milli = -1
        self._stamp = ""
        self._pending: list[Observation] = []
        self._parts: dict[tuple[str, str, int, str], tuple[str, str]] = {}
        self._task: asyncio.Task[None] | None = None
        # Created on the first batch; its one thread writes batches in the order they are handed
        # over. Non-daemon (concurrent.futures joins it at interpreter exit), so a handed-over
        # batch is written even if close() never runs.
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._last_write: concurrent.futures.Future[None] | None = None
        self.max_backlog_lines = max_backlog_lines
        # Lines handed to the writer thread and not yet written, and lines dropped since the
        # last write; both touched from the loop and the writer thread, hence the lock.
        self._backlog = 0
        self.dropped = 0
        self._unreported = 0
        self._count_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> AccessLog:
        """On when ``access_log`` is set and the level lets INFO lines through."""
        level = getattr(logging, settings.log_level.upper(), logging.INFO)
        return cls(fmt=settings.log_format, enabled=settings.access_log and level <= logging.INFO)

    @property
    def stream(self) -> TextIO:
        # Resolved at write time: tests and the CLI may swap sys.stderr after the app is built.
        return self._stream if self._stream is not None else sys.stderr

    def _timestamp(self, now: float) -> str:
        """ISO 8601 UTC with milliseconds, as gateway.runtime.logs writes it. The part up to the
        second is formatted once a second, and the whole stamp once a millisecond (a busy server
        logs several lines per millisecond; datetime formatting per request would be most of a
        line's cost)."""
        milli = int(now * 1000)
        if milli == self._milli:
            return self._stamp
        second = milli // 1000
        if second != self._second:
            self._second = second
            self._prefix = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%S"
            )
        self._milli = milli
        self._stamp = f"{self._prefix}.{milli - second * 1000:03d}+00:00"
        return self._stamp

    def extend(self, observations: list[Observation]) -> None:
        """Queue one line per observation (:data:`Observation`; its time to first byte is not
        part of the line). The lines are formatted when they are handed to the writer."""
        if not self.enabled:
            return
        pending = self._pending
        pending.extend(observations)
        if len(pending) >= self.max_lines:
            self.flush()

    def _format(self, observations: list[Observation]) -> list[str]:
        """The lines of ``observations``, formatted together: one call for a batch rather than
        one per request (a call per line would be a large share of a line's cost)."""
        lines: list[str] = []
        add = lines.append
        text, timestamp, known = self.fmt != "json", self._timestamp, self._parts
        for now, route, method, status, cache, key, seconds, _, nbytes, client, rid in observations:
            if text:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
                add(
                    f"{stamp},{int(now * 1000) % 1000:03d} INFO {LOGGER} request route={route} "
                    f"method={method} status={status} cache={cache} ms={seconds * 1000:.3f}"
                    + (f" key={key}" if key else "")
                    + (f" bytes={nbytes}" if nbytes is not None else "")
                    + (f" client={client}" if client else "")
                    + (f" request_id={rid}" if rid else "")
                )
                continue
            # Route templates, methods, cache results, keys (hex) and request ids (checked or
            # made by gateway.http.requestid) need no escaping; only the client id can hold
            # arbitrary characters. The parts fixed by (route, method, status, cache) are
            # formatted once.
            parts = known.get((route, method, status, cache))
            if parts is None:
                parts = (
                    f'","level":"info","logger":"{LOGGER}","pid":{self._pid},"msg":"request",'
                    f'"route":"{route}","method":"{method}","status":{status},"key":',
                    f',"cache":"{cache}","ms":',
                )
                if len(known) < 4096:  # kept: they are bounded sets
                    known[(route, method, status, cache)] = parts
            head, tail = parts
            add(
                f'{{"ts":"{timestamp(now)}{head}'
                f"{'null' if key is None else chr(34) + key + chr(34)}{tail}"
                f'{seconds * 1000:.3f},"bytes":{"null" if nbytes is None else nbytes},'
                f'"client":{"null" if client is None else json.dumps(client)},'
                f'"request_id":{"null" if rid is None else chr(34) + rid + chr(34)}}}'
            )
        return lines

    def flush(self) -> None:
        """Hand what is queued to the writer thread (one write call there); returns at once."""
        if not self._pending:
            return
        lines = self._format(self._pending)
        self._pending = []
        with self._count_lock:
            if self._backlog + len(lines) > self.max_backlog_lines:
                self.dropped += len(lines)
                self._unreported += len(lines)
                return
            self._backlog += len(lines)
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, "access-log-writer")
        self._last_write = self._writer.submit(self._write, lines)

    def _write(self, lines: list[str]) -> None:
        """Runs on the writer thread."""
        with self._count_lock:
            dropped, self._unreported = self._unreported, 0
        text = "\n".join(lines) + "\n"
        if dropped:  # a warning line in the log's own format
            now = datetime.datetime.now(datetime.UTC)
            msg = "access log lines dropped while the log stream was blocked"
            if self.fmt == "json":
                ts = now.isoformat(timespec="milliseconds")
                text += (
                    f'{{"ts":"{ts}","level":"warning","logger":"{LOGGER}","pid":{self._pid},'
                    f'"msg":"{msg}","dropped":{dropped}}}\n'
                )
            else:
                text += f"{now:%Y-%m-%d %H:%M:%S} WARNING {LOGGER} {msg} dropped={dropped}\n"
        with contextlib.suppress(ValueError, OSError):  # a closed stream must not fail requests
            self.stream.write(text)
            self.stream.flush()
        with self._count_lock:
            self._backlog -= len(lines)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            self.flush()

    def start(self) -> None:
        """Start the periodic flush."""
        if self._task is None and self.enabled:
            self._task = asyncio.create_task(self._run(), name="access-log-flush")

    async def close(self) -> None:
        """Stop the periodic flush and wait until every line queued so far is written."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self.flush()
        writer, last = self._writer, self._last_write
        self._writer = self._last_write = None
        if writer is None:
            return
        if last is not None:
            # The writer thread runs batches in order, so the last one done means all are done.
            # Shielded: a cancelled close must not cancel a batch not yet written.
            await asyncio.shield(asyncio.wrap_future(last))
        writer.shutdown(wait=False)  # nothing is left in it
