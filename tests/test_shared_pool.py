"""One synthesis pool per host: gateway processes submit over a Unix socket,
identical items are synthesized once, and a request nobody waits for any more is dropped at the
pool. The pool server runs in the test's loop; each RemotePool stands for one gateway process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import struct
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from gateway.runtime.components import handover
from gateway.runtime.settings import Settings
from metrics import Metrics
from synth.engine import Audio, SynthesisItem
from synth.errors import ClientQueueFull, EngineDead, UnspeakableInput
from synth.runner import ThreadRunner
from synth.scheduler import Scheduler
from synth.shared_pool import PoolServer, RemotePool, identity, item_from_json, item_to_json
from tests.support import CountingEngine, ToneEngine, until


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Not tmp_path: a Unix socket path must stay under 108 bytes.
    d = Path(tempfile.mkdtemp(prefix="vgpool-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Host:
    """A pool server over one gated engine, and its socket."""

    def __init__(self, path: Path, engine: CountingEngine, server: PoolServer) -> None:
        self.path = path
        self.engine = engine
        self.server = server

    def client(self) -> RemotePool:
        return RemotePool(self.path, "tone", self.engine, 1, start_timeout_s=10)

    @contextlib.asynccontextmanager
    async def two_processes(self) -> AsyncIterator[tuple[RemotePool, RemotePool]]:
        """The pool's clients in two gateway processes, started; closed when the block ends."""
        a, b = self.client(), self.client()
        await a.start()
        await b.start()
        try:
            yield a, b
        finally:
            await a.close()
            await b.close()

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait (bounded) until ``condition()`` holds: the pool's state is polled, as nothing
        in it signals a test."""
        await until(condition, 10, "the pool's state")


@pytest.fixture
async def host(socket_dir: Path) -> AsyncIterator[Host]:
    engine = CountingEngine(ToneEngine())  # type: ignore[arg-type]
    engine.release.clear()  # batches wait until the test lets them run
    metrics = Metrics()
    runner = ThreadRunner(engine, 1, batch_timeout_s=30, model="tone", metrics=metrics)  # type: ignore[arg-type]
    scheduler = Scheduler("tone", runner, metrics, max_queue=16, concurrency=1)
    scheduler.start()
    server = PoolServer({"tone": scheduler})
    path = socket_dir / "pool.sock"
    listener = await asyncio.start_unix_server(server.handle, str(path))
    try:
        yield Host(path, engine, server)
    finally:
        engine.release.set()
        listener.close()
        await server.close()
        await listener.wait_closed()
        await scheduler.close()


async def test_identical_items_from_two_processes_are_synthesized_once(host: Host) -> None:
    async with host.two_processes() as (a, b):
        item = SynthesisItem("Your call is important to us.", "beep")
        other = SynthesisItem("Press one for billing.", "beep")
        calls = [asyncio.ensure_future((a if i % 2 else b).run_batch([item])) for i in range(8)]
        calls.append(asyncio.ensure_future(b.run_batch([other])))
        # Every request has reached the pool before the engine may run anything.
        await host.until(lambda: host.server.interest("tone", item) == 8)
        host.engine.release.set()
        results = await asyncio.gather(*calls)
        audios = [r[0] for r in results[:8]]
        assert all(x.pcm.tobytes() == audios[0].pcm.tobytes() for x in audios)
        assert len(results[8][0].pcm) != len(audios[0].pcm)  # the other item is its own
        assert host.engine.items == 2  # one synthesis per distinct item
        assert host.server.syntheses_started == 2
        # Asked again just after (a gateway whose lookup missed before another stored it): the
        # pool answers from the finished synthesis, it does not run it again.
        (again,) = await a.run_batch([item])
        assert again.pcm.tobytes() == audios[0].pcm.tobytes()
        assert host.engine.items == 2


async def test_a_request_nobody_waits_for_is_dropped_at_the_pool(host: Host) -> None:
    async with host.two_processes() as (a, b):
        metrics = Metrics()
        # Gateway process B: its own scheduler in front of the shared pool, as components wires it.
        gateway_b = Scheduler("tone", b, metrics, max_queue=16, concurrency=1)
        gateway_b.start()
        busy = SynthesisItem("occupies the only engine thread", "beep")
        queued = SynthesisItem("nobody will wait for this one", "beep")
        first = asyncio.ensure_future(a.run_batch([busy]))
        await host.until(lambda: host.server.interest("tone", busy) == 1)
        waiter = asyncio.ensure_future(gateway_b.submit(queued))
        await host.until(lambda: host.server.interest("tone", queued) == 1)
        waiter.cancel()  # B's client hung up
        await host.until(lambda: host.server.interest("tone", queued) == 0)
        host.engine.release.set()
        await first
        assert host.engine.texts == [busy.text]  # the abandoned item never reached the engine
        # B's scheduler is still serving after the abandoned batch.
        (audio,) = [await gateway_b.submit(SynthesisItem("still serving", "beep"))]
        assert len(audio.pcm) > 0
        assert metrics.syntheses.labels("tone", "ok")._value.get() == 0  # the pool counts, not B
        await gateway_b.close()


async def test_errors_keep_their_kind_and_a_gone_pool_is_engine_dead(
    host: Host, socket_dir: Path
) -> None:
    host.engine.release.set()

    class Refusing(ToneEngine):
        def synthesize_batch(self, items):  # type: ignore[no-untyped-def]
            raise UnspeakableInput("nothing to speak")

    refusing = CountingEngine(Refusing())  # type: ignore[arg-type]
    metrics = Metrics()
    runner = ThreadRunner(refusing, 1, model="tone", metrics=metrics)  # type: ignore[arg-type]
    scheduler = Scheduler("tone", runner, metrics, max_queue=4)
    scheduler.start()
    server = PoolServer({"tone": scheduler})
    path = socket_dir / "refusing.sock"
    listener = await asyncio.start_unix_server(server.handle, str(path))
    client = RemotePool(path, "tone", refusing, 1, start_timeout_s=10)
    await client.start()
    with pytest.raises(UnspeakableInput, match="nothing to speak"):
        await client.run_batch([SynthesisItem("...", "beep")])
    listener.close()
    await server.close()
    await listener.wait_closed()
    await scheduler.close()
    with pytest.raises(EngineDead):
        await client.run_batch([SynthesisItem("after the pool went away", "beep")])
    await client.close()


async def test_an_oversized_frame_closes_the_connection_unread(host: Host) -> None:
    reader, writer = await asyncio.open_unix_connection(str(host.path))
    writer.write(struct.pack(">I", 1 << 30))  # declares a gigabyte, sends nothing more
    await writer.drain()
    async with asyncio.timeout(10):
        assert await reader.read() == b""  # closed by the pool
    writer.close()


def test_items_keep_their_phoneme_flag_across_the_socket() -> None:
    """An SSML <phoneme> item is IPA, not text: the flag crosses to the pool, and it is part of
    the item's identity (the same characters as text are another synthesis)."""
    ipa = SynthesisItem("h\u0259l\u02c8o\u028a", "joe", 1.0, {"noise_scale": 0.5}, phonemes=True)
    text = SynthesisItem(ipa.text, "joe", 1.0, {"noise_scale": 0.5})
    assert item_from_json(item_to_json(ipa)) == ipa
    assert item_from_json(item_to_json(text)) == text
    assert "phonemes" not in item_to_json(text)  # plain items travel as before
    assert identity("piper", ipa) != identity("piper", text)
    with pytest.raises(ValueError):
        item_from_json({**item_to_json(ipa), "phonemes": "yes"})


class PiecedRunner:
    """An upstream's runner stand-in: each call hands its first piece of pcm to the item's sink,
    then the rest once ``rest`` is set (a provider that streams)."""

    counts_syntheses = True
    times_batches = False
    cancel_when_abandoned = True
    queues_work = False
    passes_pcm = True

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.rest = asyncio.Event()
        self.calls = 0

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        out = []
        for item in items:
            self.calls += 1
            assert item.sink is not None  # the pool keeps every call's pieces
            item.sink(self.pieces[0])
            await self.rest.wait()
            for piece in self.pieces[1:]:
                item.sink(piece)
            samples = np.frombuffer(b"".join(self.pieces), dtype="<i2")
            out.append(Audio(samples.astype(np.float32) / np.float32(32768.0), 24000))
        return out


class Pieces:
    """An item's sink in a gateway process: what reached it, awaitable by count."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self._changed = asyncio.Event()  # replaced at every piece

    def __call__(self, data: bytes) -> None:
        self.got.append(data)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def at_least(self, size: int) -> None:
        async with asyncio.timeout(10):
            while len(b"".join(self.got)) < size:
                await self._changed.wait()


async def test_an_upstreams_pieces_cross_the_socket_to_every_process_that_wants_them(
    socket_dir: Path,
) -> None:
    """Streaming pass-through with the host's pool process: the pcm of an upstream call in
    flight reaches the gateway process that asked for it before the call ends; a process that
    joins the same call later gets the pieces sent before it came, then the rest; one that wants
    no pieces gets the whole only; and the provider is called once."""
    pieces = [b"\x01\x00\x02\x00", b"\x03\x00", b"\x04\x00\x05\x00\x06\x00"]
    runner = PiecedRunner(pieces)
    metrics = Metrics()
    scheduler = Scheduler("up", runner, metrics, max_queue=16, concurrency=4)
    scheduler.start()
    server = PoolServer({"up": scheduler})
    path = socket_dir / "up.sock"
    listener = await asyncio.start_unix_server(server.handle, str(path))
    engine = ToneEngine()
    a, b, c = (
        RemotePool(path, "up", engine, 4, start_timeout_s=10, passes_pcm=True)  # type: ignore[arg-type]
        for _ in range(3)
    )
    try:
        for client in (a, b, c):
            await client.start()
        into_a, into_b = Pieces(), Pieces()
        item = SynthesisItem("Your call is important to us.", "alloy")
        first = asyncio.ensure_future(a.run_batch([dataclasses.replace(item, sink=into_a)]))
        await into_a.at_least(len(pieces[0]))
        assert not first.done() and into_a.got == [pieces[0]]  # the call is still running
        joined = asyncio.ensure_future(b.run_batch([dataclasses.replace(item, sink=into_b)]))
        await into_b.at_least(len(pieces[0]))  # what was sent before it joined
        whole_only = asyncio.ensure_future(c.run_batch([item]))
        await until(lambda: server.interest("up", item) == 3, 10, "three requests for the item")
        runner.rest.set()
        results = [await first, await joined, await whole_only]
        # Every piece arrived before the reply, in order (a late joiner's first ones joined).
        assert b"".join(into_a.got) == b"".join(into_b.got) == b"".join(pieces)
        assert all(np.array_equal(r[0].pcm, results[0][0].pcm) for r in results)
        assert runner.calls == 1 and server.syntheses_started == 1
    finally:
        for client in (a, b, c):
            await client.close()
        listener.close()
        await server.close()
        await listener.wait_closed()
        await scheduler.close()


async def test_a_request_naming_pieces_it_does_not_have_closes_the_connection(host: Host) -> None:
    """``pieces`` must name items of the request: anything else means the stream is out of
    step, as any unreadable frame."""
    reader, writer = await asyncio.open_unix_connection(str(host.path))
    item = item_to_json(SynthesisItem("Hello.", "beep"))
    for pieces in ([1], ["0"], 0):
        frame = json.dumps({"id": 1, "model": "tone", "items": [item], "pieces": pieces}).encode()
        writer.write(struct.pack(">I", len(frame)) + frame)
        await writer.drain()
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # closed by the pool, nothing answered
        writer.close()
        reader, writer = await asyncio.open_unix_connection(str(host.path))
    writer.close()


async def test_two_processes_misses_are_served_in_order_of_arrival(host: Host) -> None:
    """A gateway process hands the pool every miss at once (``handover``), so the pool's one
    queue serves the host's processes in order of arrival: a process with five misses ahead
    does not see a later one of another process's go before its own. Each item still counts in
    its client's share while the pool holds it, so the share keeps bounding a client."""
    settings = Settings()
    schedulers = []
    gateway_metrics = Metrics()
    for _ in range(2):
        remote = host.client()
        await remote.start()
        scheduler = Scheduler(
            "tone",
            remote,
            gateway_metrics,
            max_queue=settings.queue_size,
            concurrency=handover(settings, remote.size * 2),
            max_per_client=5,
        )
        scheduler.start()
        schedulers.append(scheduler)
    a, b = schedulers
    first = [SynthesisItem(f"First process, miss {i}.", "beep") for i in range(5)]
    later = SynthesisItem("Second process, one miss.", "beep")
    calls = []
    try:
        for item in first:
            calls.append(asyncio.ensure_future(a.submit(item, "ivr")))
            await host.until(lambda item=item: host.server.interest("tone", item) == 1)
        calls.append(asyncio.ensure_future(b.submit(later, "other")))
        await host.until(lambda: host.server.interest("tone", later) == 1)
        # All at the pool, none waiting in a process; the client's five still count.
        assert a.depth == 0 and a.waiting_for("ivr") == 5
        with pytest.raises(ClientQueueFull):
            await a.submit(SynthesisItem("One more of the same client.", "beep"), "ivr")
        host.engine.release.set()
        await asyncio.gather(*calls)
        assert host.engine.texts == [i.text for i in first] + [later.text]
        assert a.waiting_for("ivr") == 0
        # The waits are the pool's to observe (where batches start): a hand-over is not one.
        count = gateway_metrics.registry.get_sample_value(
            "voxgate_synthesis_queue_wait_seconds_count", {"model": "tone"}
        )
        assert not count
    finally:
        host.engine.release.set()
        for s in schedulers:
            await s.close()
            await s.runner.close()  # type: ignore[attr-defined]
