"""The worker-process pool: real spawned workers running a tiny test engine (tests.support).

A worker SIGKILLed mid-batch or stuck past the batch timeout is replaced; requests get audio or a
clean 503, never a hang or another 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.http import keys
from gateway.runtime.settings import Settings
from metrics import Metrics
from synth.engine import SynthesisItem
from synth.errors import EngineDead, EngineError, SynthesisTimeout
from synth.pool import BadReply, EngineSpec, WorkerPool, decode_reply, encode_reply
from tests.conftest import GatewayFactory
from tests.support import ToneEngine, tone_samples, until

TONE = "tests.support:ToneEngine"


@contextlib.asynccontextmanager
async def running_tone_pool(metrics: Metrics, **kw: Any) -> AsyncIterator[WorkerPool]:
    """:func:`tone_pool`, started; closed (its workers killed and reaped) when the block ends."""
    pool = tone_pool(metrics, **kw)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


def tone_pool(
    metrics: Metrics,
    workers: int = 2,
    delay_s: float = 0.0,
    timeout_s: float = 30.0,
    max_reply_bytes: int = 64 * 1024 * 1024,
    pipeline: int = 1,
) -> WorkerPool:
    spec = EngineSpec(TONE, {"delay_s": delay_s})
    return WorkerPool(
        "tone",
        spec.build(),
        [spec] * workers,
        metrics,
        batch_timeout_s=timeout_s,
        max_reply_bytes=max_reply_bytes,
        pipeline=pipeline,
    )


async def wait_for_workers(pool: WorkerPool, count: int, within_s: float) -> float:
    """Seconds until ``count`` workers are live and idle again; fails past ``within_s``."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        # Each worker offers one slot per batch it may hold (a second waits in its pipe).
        if len(pool.worker_pids()) == count and pool._idle.qsize() == count * pool.pipeline:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"pool not back to {count} workers within {within_s}s")


def restarts(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "voxgate_synthesis_worker_restarts_total", {"model": "tone", "reason": reason}
    )
    return value or 0.0


async def test_pool_runs_batches_in_worker_processes(metrics: Metrics) -> None:
    async with running_tone_pool(metrics) as pool:
        assert len(pool.worker_pids()) == 2
        assert os.getpid() not in pool.worker_pids()
        items = [SynthesisItem(t, "beep") for t in ("a", "bbbb", "cc")]
        audios = await pool.run_batch(items)
        assert [len(a.pcm) for a in audios] == [tone_samples(t) for t in ("a", "bbbb", "cc")]
        assert all(a.sample_rate == 16000 for a in audios)
    assert pool.worker_pids() == []


async def test_crashing_batch_is_retried_once_then_engine_dead(metrics: Metrics) -> None:
    async with running_tone_pool(metrics) as pool:
        with pytest.raises(EngineDead):
            await pool.run_batch([SynthesisItem("crash now", "beep")])
        # Both workers it ran on were replaced; the pool heals and serves again.
        assert restarts(metrics, "died") == 2
        await wait_for_workers(pool, 2, 60)
        audios = await pool.run_batch([SynthesisItem("fine", "beep")])
        assert len(audios) == 1


async def test_hanging_batch_times_out_and_worker_is_replaced(metrics: Metrics) -> None:
    async with running_tone_pool(metrics, workers=1, timeout_s=1.5) as pool:
        before = pool.worker_pids()
        with pytest.raises(SynthesisTimeout):
            await pool.run_batch([SynthesisItem("please hang", "beep")])
        assert restarts(metrics, "timeout") == 1
        await wait_for_workers(pool, 1, 60)
        assert pool.worker_pids() != before
        # The next batch gets 30 s, not 1.5 s (a fresh worker on a loaded machine): one sent to
        # the hung worker would still never be answered.
        pool.batch_timeout_s = 30
        assert len(await pool.run_batch([SynthesisItem("after", "beep")])) == 1


# ---- pipelined batches: a second batch waits in the worker's pipe ------------------------------


def in_pipe(pool: WorkerPool) -> int:
    """Batches written to the (one) worker's pipe whose replies are not read yet."""
    (worker,) = pool._workers.values()
    return worker._sent - worker._read


def busy(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("voxgate_synthesis_busy_workers", {"model": "tone"})
    return value or 0.0


async def test_pipelined_batches_each_get_their_own_reply(metrics: Metrics) -> None:
    async with running_tone_pool(metrics, workers=1, delay_s=0.2, pipeline=2) as pool:
        texts = ["a", "bbbbbbbb", "ccc", "dddddddddddddddd", "ee", "f" * 30]
        runs = [asyncio.ensure_future(pool.run_batch([SynthesisItem(t, "beep")])) for t in texts]
        # (The first batch's thread counts it busy just after it has sent it: awaited too.)
        await until(
            lambda: in_pipe(pool) == 2 and busy(metrics) >= 1, 60, "two batches in the pipe"
        )
        assert busy(metrics) == 1  # the one running, not the one waiting behind it
        audios = await asyncio.gather(*runs)
        assert [len(a.pcm) for (a,) in audios] == [tone_samples(t) for t in texts]
        assert busy(metrics) == 0
        assert in_pipe(pool) == 0


async def test_the_batch_timeout_counts_from_a_batchs_turn(metrics: Metrics) -> None:
    """Each batch runs 3 s; the second waits 3 s in the pipe first: 6 s after it was sent, past
    the 5 s bound, yet it ran for 3 s only and must not time out. Time is what is tested: a
    false failure needs the worker to overrun its 3 s sleep by 2 s (0.4 s did it when this ran
    0.8 s batches against 1.2 s)."""
    async with running_tone_pool(
        metrics, workers=1, delay_s=3.0, timeout_s=5.0, pipeline=2
    ) as pool:
        first, second = await asyncio.gather(
            pool.run_batch([SynthesisItem("one", "beep")]),
            pool.run_batch([SynthesisItem("two", "beep")]),
        )
        assert (len(first), len(second)) == (1, 1)
        assert restarts(metrics, "timeout") == 0


async def test_a_death_with_two_batches_in_the_pipe_retries_both(metrics: Metrics) -> None:
    async with running_tone_pool(metrics, workers=1, delay_s=0.5, pipeline=2) as pool:
        runs = [
            asyncio.ensure_future(pool.run_batch([SynthesisItem(t, "beep")]))
            for t in ("first", "second")
        ]
        await until(lambda: in_pipe(pool) == 2, 60, "two batches in the worker's pipe")
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        (a,), (b,) = await asyncio.wait_for(asyncio.gather(*runs), 60)
        assert (len(a.pcm), len(b.pcm)) == (tone_samples("first"), tone_samples("second"))
        assert restarts(metrics, "died") == 1  # one worker, replaced once
        await wait_for_workers(pool, 1, 60)


async def test_a_bad_reply_sends_the_batch_behind_it_to_a_retry(metrics: Metrics) -> None:
    async with running_tone_pool(metrics, workers=1, delay_s=0.5, pipeline=2) as pool:
        poisoned = asyncio.ensure_future(pool.run_batch([SynthesisItem("stereo", "beep")]))
        await until(lambda: in_pipe(pool) == 1, 60, "the poisoned batch sent")
        behind = asyncio.ensure_future(pool.run_batch([SynthesisItem("behind", "beep")]))
        await until(lambda: in_pipe(pool) == 2, 60, "a batch behind it in the pipe")
        with pytest.raises(EngineError):
            await poisoned
        (audio,) = await asyncio.wait_for(behind, 60)
        assert len(audio.pcm) == tone_samples("behind")  # from the replacement, not the broken pipe
        assert restarts(metrics, "bad_reply") == 1
        assert restarts(metrics, "died") == 0


@pytest.mark.parametrize(
    ("engine", "max_batch", "pipeline"),
    [("ToneEngine", 0, 2), ("ToneEngine", 4, 2), ("BatchingToneEngine", 4, 1)],
)
async def test_one_item_engines_get_a_batch_waiting_in_each_pipe(
    gateway: GatewayFactory,
    settings: Settings,
    engine: str,
    max_batch: int,
    pipeline: int,
) -> None:
    """A batch formed while its worker is busy would be a smaller one: an engine that batches
    (max batch > 1) gets no pipeline; one-item engines (Piper) get two batches per worker."""
    spec = EngineSpec(f"tests.support:{engine}", {})
    client = await gateway(
        settings=pool_settings(settings, max_batch=max_batch), engines={"tone": [spec, spec]}
    )
    scheduler = client.app[keys.SPEECH].models["tone"].scheduler
    assert isinstance(scheduler.runner, WorkerPool)
    assert scheduler.runner.pipeline == pipeline
    assert scheduler.concurrency == 2 * pipeline


def pool_settings(settings: Settings, **changes: object) -> Settings:
    return settings.replace(**{"synth_workers": 2, **changes})


async def test_sigkill_mid_batch_every_request_gets_audio_or_503(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics
) -> None:
    spec = EngineSpec(TONE, {"delay_s": 0.8})
    client = await gateway(settings=pool_settings(settings), engines={"tone": [spec, spec]})
    pool = client.app[keys.SPEECH].models["tone"].scheduler.runner
    assert isinstance(pool, WorkerPool)
    assert len(pool.worker_pids()) == 2

    async def ask(i: int) -> int:
        body = {"model": "tone", "voice": "beep", "input": f"request {i}", "response_format": "wav"}
        resp = await client.post("/v1/audio/speech", json=body)
        await resp.read()
        return resp.status

    tasks = [asyncio.create_task(ask(i)) for i in range(6)]
    await until(lambda: busy(metrics) == 2, 60, "both workers inside a batch")
    victim = pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    statuses = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert set(statuses) <= {200, 503}, statuses
    assert 200 in statuses
    assert restarts(metrics, "died") >= 1
    await wait_for_workers(pool, 2, 60)
    assert victim not in pool.worker_pids()


async def test_hanging_engine_gets_503_and_the_gateway_keeps_serving(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics
) -> None:
    spec = EngineSpec(TONE, {})
    client = await gateway(
        settings=pool_settings(settings, synth_workers=1, batch_timeout_s=1),
        engines={"tone": [spec]},
    )
    pool = client.app[keys.SPEECH].models["tone"].scheduler.runner
    body = {"model": "tone", "voice": "beep", "input": "please hang", "response_format": "wav"}
    resp = await client.post("/v1/audio/speech", json=body)
    assert resp.status == 503
    assert "Retry-After" in resp.headers
    assert restarts(metrics, "timeout") == 1
    await wait_for_workers(pool, 1, 60)
    pool.batch_timeout_s = 30  # (for the fresh worker: 1 s is a stall of a loaded machine)
    body["input"] = "a normal sentence"
    resp = await client.post("/v1/audio/speech", json=body)
    assert resp.status == 200


def test_engine_spec_builds_by_dotted_path(tmp_path: Path) -> None:
    engine = EngineSpec("tests.support.ToneEngine", {"delay_s": 0.0}).build(fingerprint="x")
    assert isinstance(engine, ToneEngine)
    assert engine.fingerprint == "x"


async def test_close_during_a_batch_leaves_no_worker_processes(metrics: Metrics) -> None:
    import multiprocessing

    pool = tone_pool(metrics, workers=2, delay_s=2.0)
    await pool.start()
    running = asyncio.create_task(pool.run_batch([SynthesisItem("slow one", "beep")]))
    await until(lambda: busy(metrics) == 1, 60, "the batch running in a worker")
    running.cancel()  # what the scheduler does at shutdown
    with pytest.raises(asyncio.CancelledError):
        await running
    await pool.close()  # kills and reaps every worker before it returns
    alive = [p.name for p in multiprocessing.active_children() if p.name.startswith("synth-worker")]
    assert alive == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("huge reply", "bad_reply"),  # 100 s of audio: over the 1 MiB bound, refused unread
        ("stereo reply", "bad_reply"),  # header and samples disagree
    ],
)
async def test_poisoned_reply_replaces_the_worker_and_later_batches_succeed(
    metrics: Metrics, text: str, reason: str
) -> None:
    """A reply that cannot be trusted replaces its worker: a worker left neither idle nor
    replaced would make every later batch wait out the batch timeout."""
    async with running_tone_pool(metrics, workers=1, max_reply_bytes=1024 * 1024) as pool:
        before = pool.worker_pids()
        with pytest.raises(EngineError, match="replaced"):
            await pool.run_batch([SynthesisItem(text, "beep")])
        assert restarts(metrics, reason) == 1
        await wait_for_workers(pool, 1, 60)
        assert pool.worker_pids() != before
        for i in range(3):  # no wedge: each later batch is answered, well within the timeout
            audios = await asyncio.wait_for(pool.run_batch([SynthesisItem(f"ok {i}", "beep")]), 60)
            assert len(audios[0].pcm) == tone_samples(f"ok {i}")


async def test_an_unforeseen_exception_in_a_reply_replaces_the_worker(
    metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any exception kind, not only the foreseen ones, replaces the worker."""
    async with running_tone_pool(metrics, workers=1) as pool:
        import synth.pool

        def explode(data: bytes, expected: int) -> object:
            raise MemoryError("decoding the reply ran out of memory")

        monkeypatch.setattr(synth.pool, "decode_reply", explode)
        with pytest.raises(EngineError):
            await pool.run_batch([SynthesisItem("one", "beep")])
        monkeypatch.undo()
        assert restarts(metrics, "error") == 1
        await wait_for_workers(pool, 1, 60)
        assert len(await asyncio.wait_for(pool.run_batch([SynthesisItem("two", "beep")]), 60)) == 1


@pytest.mark.parametrize(
    "data",
    [
        b"ok",  # no header
        b"ok\n{}\n",  # no items
        b'ok\n{"items": [[4, 16000]]}\n' + b"\0" * 8,  # shorter than declared
        b'ok\n{"items": [[1, 16000]]}\n' + b"\0" * 8,  # longer than declared
        b'ok\n{"items": [[1, 0]]}\n' + b"\0" * 4,  # a rate of 0
        b'ok\n{"items": [[1.5, 16000]]}\n' + b"\0" * 4,  # a fractional count
        b'ok\n{"items": [[1, 16000]]}\n' + b"\x00\x00\xc0\x7f",  # NaN
        b"ok\n[1]\n",  # header not an object
        b"ok\n\xff\n",  # header not UTF-8
        b'error\n{"kind": 3}',
        b"cos\nsystem\n(S'echo pwned'\ntR.",  # a pickle is not executed, only refused
    ],
)
def test_malformed_replies_are_refused(data: bytes) -> None:
    with pytest.raises(BadReply):
        decode_reply(data, 1)


def test_a_reply_round_trips() -> None:
    import numpy as np

    pcm = np.linspace(-1, 1, 7, dtype=np.float32)
    data = encode_reply("ok", {"items": [[7, 22050], [0, 22050]]}, [pcm, pcm[:0]])
    kind, audios = decode_reply(data, 2)
    assert kind == "ok"
    assert [a.sample_rate for a in audios] == [22050, 22050]
    assert np.array_equal(audios[0].pcm, pcm) and len(audios[1].pcm) == 0
    message = "x" * 10_000
    kind, (error_kind, text, _) = decode_reply(
        encode_reply("error", {"kind": "EngineError", "message": message}), 1
    )
    assert (kind, error_kind, len(text)) == ("error", "EngineError", 500)


def test_a_one_item_reply_is_read_in_place_and_several_are_copied() -> None:
    """The samples of a one-item reply are read where they lie in the reply (the worker pads its
    header to put them on a 4-byte boundary): no copy on the miss path. Several items are copied
    out, so that one item does not keep the whole reply alive."""
    import numpy as np

    pcm = np.linspace(-1, 1, 1001, dtype=np.float32)
    for header in ({"items": [[1001, 22050]]}, {"items": [[1001, 22050]], "pad": "x" * 5}):
        data = encode_reply("ok", header, [pcm])
        assert (data.index(b"\n", 3) + 1) % 4 == 0
        (one,) = decode_reply(data, 1)[1]
        assert np.array_equal(one.pcm, pcm) and one.pcm.base is not None
        assert not one.pcm.flags.writeable  # a view of the reply's bytes
    two = decode_reply(encode_reply("ok", {"items": [[1001, 22050]] * 2}, [pcm, pcm]), 2)[1]
    assert all(a.pcm.flags.writeable and np.array_equal(a.pcm, pcm) for a in two)
    # A reply whose samples do not start on a boundary (a worker of another version) is copied.
    unaligned = b'ok\n{"items": [[1001, 22050]]}\n' + pcm.tobytes()
    assert (unaligned.index(b"\n", 3) + 1) % 4
    (odd,) = decode_reply(unaligned, 1)[1]
    assert odd.pcm.flags.writeable and np.array_equal(odd.pcm, pcm)
