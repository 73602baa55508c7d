"""Test helpers: engine wrappers, polled waits, a gateway served from a thread. Imported by tests
and conftest. The real processes tests share with the benches (redis-server, gateway replicas, free
ports) live in :mod:`bench.harness`."""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from aiohttp import ClientResponse, web

from bench.harness import CACHE_SECRET, voiced
from cache.disk import RawBytesDisk
from cache.entry import Entry
from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from synth.engine import (
    Audio,
    Engine,
    EngineCapabilities,
    ParamValue,
    SynthesisItem,
    VoiceInfo,
)

T = TypeVar("T")


class CountingEngine:
    """Wraps a real engine: counts items synthesized and can add a delay per batch.

    The delay makes a deliberately slow engine (to fill the queue) out of a real one; the count is
    what "exactly one synthesis" assertions read.
    """

    def __init__(self, inner: Engine, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.name = inner.name
        self.fingerprint = inner.fingerprint
        self.sample_rate = inner.sample_rate
        # Piper takes phonemes (SSML <phoneme>); the wrapper passes that on.
        self.capabilities = inner.capabilities
        self.items = 0
        self.batches = 0
        self.texts: list[str] = []
        # Batches running at once, and the most seen (parallel synthesis assertions read it).
        self.active = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    def voices(self) -> Sequence[VoiceInfo]:
        return self.inner.voices()

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        return self.inner.default_params(voice)

    def load(self) -> None:
        self.inner.load()

    def warm_up(self) -> None:
        self.inner.warm_up()

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        self.release.wait()
        with self._lock:
            self.active += 1
            self.max_concurrent = max(self.max_concurrent, self.active)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            with self._lock:
                self.items += len(items)
                self.batches += 1
                self.texts.extend(i.text for i in items)
            return self.inner.synthesize_batch(items)
        finally:
            with self._lock:
                self.active -= 1

    def describe(self) -> Mapping[str, object]:
        return self.inner.describe()


class GatedEngine(CountingEngine):
    """The real voice; every batch after the first waits for ``gate``: what queues behind the
    first batch (a stream's later sentences, a request nobody waits for) is provably not yet
    synthesized until the test opens it."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.gate = threading.Event()

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        if self.batches >= 1:
            self.gate.wait(120)  # the test opens it; a long bound only guards a hang
        return super().synthesize_batch(items)


class ThreadRunnerFlags:
    """What a scheduler reads of a runner, as :class:`synth.runner.ThreadRunner` says it (its
    batches counted and timed by the scheduler, whole, finished once started): a test's runner
    that stands in for it adds ``run_batch``."""

    counts_syntheses = True
    times_batches = False
    cancel_when_abandoned = False
    queues_work = False
    passes_pcm = False


async def until(condition: Callable[[], object], within_s: float = 60.0, what: str = "") -> None:
    """Wait until ``condition()`` holds, polling it (for state nothing signals: a metric, a
    pool's workers); fail naming ``what`` past ``within_s``."""
    try:
        async with asyncio.timeout(within_s):
            while not condition():  # noqa: ASYNC110 - polled: there is no event to await
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not met within {within_s:g} s: {what or condition}") from None


async def eventually(
    probe: Callable[[], Awaitable[T]],
    check: Callable[[T], bool],
    within_s: float = 60.0,
    what: str = "",
) -> T:
    """Await ``probe()`` until ``check`` holds for what it returns (state another process owns: a
    metric scraped over HTTP); that value. Fail naming ``what`` past ``within_s``."""
    value = await probe()
    try:
        async with asyncio.timeout(within_s):
            while not check(value):
                await asyncio.sleep(0.02)
                value = await probe()
    except TimeoutError:
        raise AssertionError(f"not met within {within_s:g} s: {what} (last: {value!r})") from None
    return value


async def error_of(resp: ClientResponse, status: int) -> dict[str, Any]:
    """The error of an answer that must have ``status``: the ``error`` object of OpenAI's shape."""
    assert resp.status == status, await resp.text()
    error: dict[str, Any] = (await resp.json())["error"]
    return error


# The cache secret as bytes, as the Redis tier's EntrySeal takes it.
SECRET = CACHE_SECRET.encode()


def wav_entry(
    audio: bytes = b"RIFF-audio" * 100,
    *,
    voice: str = "",
    model: str = "piper",
    pinned: bool = False,
) -> Entry:
    """A stored WAV entry at 22.05 kHz, as the cache tiers' tests put it (the bytes need not be
    a real WAV: the tiers check checksums, not audio)."""
    return Entry.create(
        audio,
        content_type="audio/wav",
        fmt="wav",
        sample_rate=22050,
        model=model,
        voice=voice,
        pinned=pinned,
    )


def tone_samples(text: str) -> int:
    """How many samples :class:`ToneEngine` makes of ``text`` (at speed 1)."""
    return len(voiced(text, 1.0, ToneEngine.sample_rate))


class ToneEngine:
    """A tiny deterministic engine for worker-process tests (built in the worker by dotted path).

    Each item becomes :func:`voiced` speech whose length follows its text. A text containing ``hang`` blocks
    forever (the per-batch timeout test), one containing ``crash`` ends the process; ``huge``
    gives 10 s of audio per character (an oversized reply), ``stereo`` a two-channel array (a
    reply whose header and samples disagree); ``delay_s`` slows every batch so a test can act
    while a batch runs.
    """

    name = "tone"
    sample_rate = 16000
    capabilities = EngineCapabilities()  # plain text only, one item at a time

    def __init__(self, delay_s: float = 0.0, fingerprint: str = "tone-v1") -> None:
        self.delay_s = delay_s
        self.fingerprint = fingerprint
        self.loaded = False

    def voices(self) -> Sequence[VoiceInfo]:
        return [VoiceInfo("beep", "en", "test tone")]

    def default_params(self, voice: str) -> Mapping[str, ParamValue]:
        return {}

    def load(self) -> None:
        self.loaded = True

    def warm_up(self) -> None:
        self.synthesize_batch([SynthesisItem("warm", "beep")])

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:

        if any("hang" in item.text for item in items):
            threading.Event().wait()  # never set: a stuck engine
        if any("crash" in item.text for item in items):
            os._exit(3)  # a native crash: the process ends mid-batch
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for item in items:
            if "huge" in item.text:
                n = self.sample_rate * 10 * len(item.text)
                t = np.arange(n, dtype=np.float32) / self.sample_rate
                pcm = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
            else:  # speech to the take checks, as every take stored must be
                pcm = voiced(item.text, item.speed, self.sample_rate).astype(np.float32) / 32768
            if "stereo" in item.text:
                pcm = np.stack([pcm, pcm], axis=1)
            out.append(Audio(pcm, 16000))
        return out

    def describe(self) -> Mapping[str, object]:
        return {"engine": "tone", "mode": "test"}


class BatchingToneEngine(ToneEngine):
    """:class:`ToneEngine` declaring that it batches exactly (as Coqui's torch engine does)."""

    capabilities = EngineCapabilities(max_exact_batch=8)


class ServerThread:
    """A gateway served by an aiohttp ``AppRunner`` on its own event loop in a thread: one real
    server on loopback that a whole test module shares (``start()``, then ``port``; ``stop()``).
    Clients in the test thread may block: the server's loop is not theirs."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hostile-gateway", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to the test thread by start()
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        app = create_app(self.settings, engines={"piper": self.engine})
        # As `voxgate serve` runs it: the gateway logs its own access lines (aiohttp's logger would
        # write to a stream pytest has closed by the time a shared server stops).
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            # A connection aiohttp still lingers on (reading a body it refused) ends here,
            # not with the loop.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(120) or self._error is not None:
            raise RuntimeError(f"gateway did not start: {self._error!r}")

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


# One spectrogram frame of a Piper voice is this many samples (every Piper voice: 22,050 Hz).
PIPER_HOP_SAMPLES = 256


@functools.cache
def _joe_voice() -> Any:
    from piper import PiperVoice

    from synth.piper_engine import PiperVoiceFiles

    files = PiperVoiceFiles.bundled_joe()
    return PiperVoice.load(files.model_path, files.config_path)


def shortest_audio_s(text: str, *, ipa: bool = False) -> float:
    """The shortest audio the joe voice can make of ``text`` (one sentence or more, plain words;
    IPA when ``ipa``), whatever its noise draws.

    Piper's durations are random (noise inside the ONNX graph), but VITS gives every phoneme id
    at least one frame: a duration is the ceiling of a positive number (``w_ceil`` in its graph),
    and noise only lengthens it. So ``ids x 256`` samples is a lower bound that holds on every
    run: a test asserting a synthesis at speed 1 (or slower) lasts at least this long cannot fail
    by chance. (At speed s > 1 the frames are speed 1's divided by s: synth/exact_speed.py.)"""
    voice = _joe_voice()
    sentences = [list(text)] if ipa else voice.phonemize(text)
    ids = sum(len(voice.phonemes_to_ids(phonemes)) for phonemes in sentences)
    return float(ids * PIPER_HOP_SAMPLES / voice.config.sample_rate)


async def clear_of_a_minute_edge(span_s: float = 15.0) -> None:
    """Return when the next ``span_s`` seconds hold no minute edge (waiting, if need be, until
    the next minute has begun).

    Per-minute limits count in the ``limits`` library's sliding-window counter: two fixed
    windows aligned to the minute, the previous one weighted by how much of it still overlaps.
    Requests that straddle an edge see the earlier ones' weight drop below a whole request
    (``floor``), and one more request fits than the limit says: a test asserting "the 4th of 3
    is refused" then fails for about (its span / 60) of runs. A test that runs its counted
    requests within ``span_s`` of this call cannot meet an edge."""
    into = time.time() % 60
    if into > 60 - span_s:
        await asyncio.sleep(60 - into + 0.05)


def small_file_system(
    monkeypatch: pytest.MonkeyPatch, root: Path, capacity: int
) -> Callable[[], list[Path]]:
    """Value files under ``root`` on a file system of ``capacity`` bytes: a write past it puts
    what fits, then fails with ENOSPC, as a full disk does. The value files there, listed."""
    real_write = RawBytesDisk._write

    def files() -> list[Path]:
        return sorted(root.rglob("*.val"))

    def write(
        disk: RawBytesDisk, full_path: str, chunks: Iterator[bytes], mode: str, encoding: Any = None
    ) -> int:
        data = b"".join(chunks)
        room = capacity - sum(p.stat().st_size for p in files())
        if len(data) > room:
            real_write(disk, full_path, iter((data[: max(0, room)],)), mode, encoding)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(real_write(disk, full_path, iter((data,)), mode, encoding))

    monkeypatch.setattr(RawBytesDisk, "_write", write)
    return files
