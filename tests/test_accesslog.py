"""The buffered access log writes off the event loop, in order, and loses nothing at shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from gateway.runtime.accesslog import AccessLog


class RecordingStream:
    """A log stream that records which thread wrote what; ``gate`` (when set up) holds every
    write until the test opens it, like a log pipe nobody is reading."""

    def __init__(self, *, gated: bool = False) -> None:
        self.writes: list[tuple[str, str]] = []
        self.wrote = threading.Event()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()

    def write(self, data: str) -> int:
        # Bounded, so a regression that writes on the loop fails the test instead of hanging it.
        self.gate.wait(10)
        self.writes.append((threading.current_thread().name, data))
        self.wrote.set()
        return len(data)

    def flush(self) -> None:
        pass

    def lines(self) -> list[dict[str, object]]:
        return [json.loads(x) for _, data in self.writes for x in data.splitlines()]


def record(log: AccessLog, n: int) -> None:
    """``n`` answered requests, handed over one at a time (their bytes: 0 to n - 1)."""
    for i in range(n):
        log.extend([(time.time(), "/healthz", "GET", 200, "none", None, 0.001, 0.0, i, None, None)])


async def test_lines_arrive_within_the_interval_written_by_another_thread() -> None:
    stream = RecordingStream()
    log = AccessLog(stream, flush_interval_s=0.05)  # type: ignore[arg-type]
    log.start()
    try:
        record(log, 3)
        assert stream.writes == []  # buffered, not written per request
        assert await asyncio.to_thread(stream.wrote.wait, 10)
        assert [x["bytes"] for x in stream.lines()] == [0, 1, 2]
        assert len(stream.writes) == 1  # one batch, one write
        assert stream.writes[0][0] != threading.current_thread().name  # not the loop's thread
    finally:
        await log.close()


async def test_close_writes_every_queued_line() -> None:
    stream = RecordingStream()
    log = AccessLog(stream, flush_interval_s=3600)  # type: ignore[arg-type]
    log.start()
    record(log, 5)
    await log.close()  # long before the interval: the shutdown flush writes them
    assert [x["bytes"] for x in stream.lines()] == [0, 1, 2, 3, 4]


async def test_a_blocked_stream_does_not_block_the_loop_and_nothing_is_lost() -> None:
    stream = RecordingStream(gated=True)
    log = AccessLog(stream, flush_interval_s=3600, max_lines=2)  # type: ignore[arg-type]
    log.start()
    record(log, 2)  # max_lines: handed to the writer at once, whose write now blocks
    record(log, 2)  # queued behind it
    # The loop is free while the writer thread is stuck in write().
    ticked = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(ticked.set_result, True)
    assert await ticked
    assert stream.writes == []
    record(log, 1)
    closing = asyncio.create_task(log.close())
    await asyncio.sleep(0)  # let close() start
    assert not closing.done()  # shutdown waits for the stuck batch rather than dropping it
    stream.gate.set()
    await closing
    # Every line, in order, in the batches they were handed over in.
    assert [x["bytes"] for x in stream.lines()] == [0, 1, 0, 1, 0]
    assert len(stream.writes) == 3


async def test_a_blocked_stream_costs_bounded_memory_and_the_drop_is_reported() -> None:
    stream = RecordingStream(gated=True)
    log = AccessLog(stream, max_lines=10, max_backlog_lines=30)  # type: ignore[arg-type]
    record(log, 100)  # 10 batches of 10: the first 3 fit the backlog, 7 are dropped
    assert log.dropped == 70
    stream.gate.set()
    await log.close()
    lines = stream.lines()  # every line, the warning too, is one JSON object
    assert [x["bytes"] for x in lines if x["msg"] == "request"] == list(range(30))
    assert [x["dropped"] for x in lines if x["level"] == "warning"] == [70]
