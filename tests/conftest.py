"""Shared fixtures: settings in a temp dir, the real bundled Piper voice (loaded once), a real
gateway on loopback (every answer it gives checked against its OpenAPI document), a real
redis-server on a free port."""

from __future__ import annotations

import asyncio
import compileall
import fcntl
import importlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _pytest.logging import LogCaptureHandler
from aiohttp.test_utils import TestClient, TestServer
from blockbuster import blockbuster_ctx

from bench.harness import RedisServer, redis_server
from gateway.http import keys
from gateway.http.app import create_app
from gateway.http.hits import answer_repeats
from gateway.http.routing import RouteTable
from gateway.runtime.settings import Settings
from metrics import Metrics
from synth.engine import Engine
from synth.piper_engine import PiperEngine, PiperVoiceFiles
from tests import canary
from tests.conformance import RecordingClient
from tests.support import CountingEngine, GatedEngine
from tests.upstream_support import KEY_ENV, OpenAISpeechServer

ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Where the environment says not to write bytecode (PYTHONDONTWRITEBYTECODE), every
    interpreter the suite starts (the test workers, each ``voxgate`` command, a default
    ``serve``'s supervisor, pool process and synthesis workers) compiled the project's modules
    from source again: about 0.15 s of a core per process, on the path to every server's ready.
    Compiled once here (into the ``__pycache__`` folders git ignores), they read it; a file
    already compiled and unchanged since is skipped."""
    if sys.dont_write_bytecode and not hasattr(session.config, "workerinput"):
        for package in ("gateway", "cache", "synth", "metrics", "bench", "tests"):
            compileall.compile_dir(ROOT / package, quiet=2)


# Loggers at DEBUG in the tests, so that the canary check sees the records they would make at
# any level a deployment sets (voxgate's own, and the HTTP clients' that call providers).
CANARY_LOGGERS = ("voxgate", "aiohttp", "httpx", "httpx2", "httpcore", "httpcore2")


class CanaryLogHandler(logging.Handler):
    """Notes each canary (tests/canary.py) in a log record made in the test's process."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            text = str(record.msg)  # (arguments that do not fit: what a formatter would show)
        if record.exc_info and record.exc_info[1] is not None:
            text += record.exc_text or logging.Formatter().formatException(record.exc_info)
        canary.note(f"log record {record.name} {record.levelname}", text)


def watch_answer_bodies() -> None:
    """Note each canary in a body read through aiohttp's client or httpx (the openai SDK's),
    whole or streamed chunk by chunk (a canary split between two chunks included), unless a fake
    provider answered it: wrapped once, for the whole run."""
    start, chunk = aiohttp.ClientResponse.start, aiohttp.StreamReader._read_nowait_chunk

    async def aiohttp_start(self: aiohttp.ClientResponse, *args: Any, **kw: Any) -> Any:
        started = await start(self, *args, **kw)
        if self.url.port not in canary.provider_ports:
            canary.watch(self.content, f"the body of {self.method} {self.url}")
        return started

    def aiohttp_chunk(self: aiohttp.StreamReader, n: int) -> bytes:
        data: bytes = chunk(self, n)
        canary.note_chunk(self, data)
        return data

    aiohttp.ClientResponse.start = aiohttp_start  # type: ignore[method-assign]
    aiohttp.StreamReader._read_nowait_chunk = aiohttp_chunk  # type: ignore[method-assign]
    for name in ("httpx", "httpx2"):
        response = importlib.import_module(name).Response
        sync_iter, async_iter = response.iter_bytes, response.aiter_bytes

        def watched(self: Any) -> bool:
            request = getattr(self, "_request", None)
            if request is None or request.url.port in canary.provider_ports:
                return False
            canary.watch(self, f"the body of {request.method} {request.url}")
            return True

        def httpx_iter(
            self: Any, *args: Any, _iter: Any = sync_iter, _watched: Any = watched
        ) -> Any:
            for data in _iter(self, *args):
                if _watched(self):
                    canary.note_chunk(self, data)
                yield data

        async def httpx_aiter(
            self: Any, *args: Any, _iter: Any = async_iter, _watched: Any = watched
        ) -> Any:
            async for data in _iter(self, *args):
                if _watched(self):
                    canary.note_chunk(self, data)
                yield data

        response.iter_bytes, response.aiter_bytes = httpx_iter, httpx_aiter


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger().addHandler(CanaryLogHandler())
    watch_answer_bodies()


@pytest.fixture(autouse=True)
def root_logging_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were before the test. A command run in the
    test's own process (``main(["serve", ...])`` ended by a settings error) sets up logging as
    its process's: its handler replaces all others, the canary handler among them, so every
    later test on that xdist worker went unchecked for canaries in log records."""
    root = logging.getLogger()
    kept, level = [h for h in root.handlers if not isinstance(h, LogCaptureHandler)], root.level
    yield
    for handler in list(root.handlers):
        if handler not in kept and not isinstance(handler, LogCaptureHandler):
            root.removeHandler(handler)
    for handler in kept:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def no_canary_shown(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test in whose log records or answer bodies a canary secret (tests/canary.py) was
    seen. A test that shows one on purpose (to test a scrubber or this check) says why in a
    ``canary_allowed(reason)`` mark."""
    mark = request.node.get_closest_marker("canary_allowed")
    if mark is not None and not (mark.args and mark.args[0]):
        pytest.fail("canary_allowed needs a reason", pytrace=False)
    for name in CANARY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level != logging.DEBUG:
            logger.setLevel(logging.DEBUG)
    canary.seen.clear()
    canary.streams.clear()
    canary.allowed = mark.args[0] if mark is not None else ""
    yield
    seen, allowed = canary.shown(), canary.allowed
    canary.seen.clear()
    canary.allowed = ""
    if seen and not allowed:
        shown = "\n".join(f"  {where}" for where in seen[:20])
        pytest.fail(f"a canary secret (tests/canary.py) was shown:\n{shown}", pytrace=False)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one and a half workers per core (3 on the 2-core CI machine). Most of a test's
    time here is processes it started (servers, CLIs, engine workers) loading and answering while
    the test waits on them; a worker per core left a core idle through those waits (the whole
    suite on 2 cores: 733 s with 2 workers; docs/testing.md has the figures)."""
    cores = len(os.sched_getaffinity(0))
    return max(1, cores + cores // 2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, slow tests that share no fixture with others go first.

    ``--dist loadgroup`` hands each ``xdist_group`` to one worker whole (the largest first), then
    every other test alone, in collection order. The slow ones (each starts servers, CLIs or a
    benchmark) then start early, while the many short tests remain to fill in around them,
    instead of one of them running alone at the end. Grouped tests keep their order (their
    module-scoped fixtures are set up once)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return

    def first(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None and (
            item.get_closest_marker("xdist_group") is None
        )

    items.sort(key=lambda item: not first(item))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``fast_path(True, False)`` (the wire tests) runs once per value, with the
    ``settings`` it gets (and the gateways built from them) set so: what a client sees must
    not depend on the switch. A mark of one value runs the test with that value alone."""
    mark = metafunc.definition.get_closest_marker("fast_path")
    if mark is not None and "settings" in metafunc.fixturenames:
        ids = ["fast_path_on" if on else "fast_path_off" for on in mark.args]
        metafunc.parametrize("settings", mark.args, indirect=True, ids=ids)


@pytest.fixture(autouse=True)
def no_blocking_on_the_loop() -> Iterator[None]:
    """Fail any test in which voxgate code does blocking I/O on the event loop thread."""
    with blockbuster_ctx(scanned_modules=["gateway", "cache", "synth", "metrics"]):
        yield


@pytest.fixture(scope="session")
def piper_engine() -> PiperEngine:
    """The bundled joe voice, loaded once for the whole session (load() is idempotent)."""
    engine = PiperEngine([PiperVoiceFiles.bundled_joe()], intra_op_threads=1)
    engine.load()
    return engine


@pytest.fixture
def counting_engine(piper_engine: PiperEngine) -> CountingEngine:
    """The real voice behind a call counter."""
    return CountingEngine(piper_engine)


@pytest.fixture
def gated(piper_engine: PiperEngine) -> Iterator[GatedEngine]:
    """The real voice, its batches after the first held until the test sets ``gate`` (set at
    teardown too, so no synthesis thread is left waiting)."""
    engine = GatedEngine(piper_engine)
    yield engine
    engine.gate.set()


@pytest.fixture
async def client(gateway: GatewayFactory) -> TestClient[Any, Any]:
    """A client of ``gateway()``: the test's settings and metrics, the counting joe voice."""
    return await gateway()


@pytest.fixture
async def provider(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OpenAISpeechServer]:
    """The local OpenAI-compatible provider, its key in the environment variable (``KEY_ENV``)
    the tests' upstream entries name."""
    server = await OpenAISpeechServer().start()
    monkeypatch.setenv(KEY_ENV, server.api_key)
    yield server
    await server.stop()


COQUI_BUZZ_LIMITS = '{"coqui": {"skip": ["not_speech", "dc_offset"]}}'


@pytest.fixture
def settings(tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """Defaults, with the disk tier in a temp dir and no environment or config file; the fast
    path as a ``fast_path`` mark sets it (:func:`pytest_generate_tests`), else on."""
    fast = "true" if getattr(request, "param", True) else "false"
    overrides = {
        "cache_dir": str(tmp_path / "cache"),
        "port": "0",
        "fast_path": fast,
        # The tests' Coqui model has random weights: it buzzes, which the take checks rightly
        # refuse; the tests of its plumbing let it through, as an operator would a voice whose
        # sound is intended (take_limits).
        "take_limits": COQUI_BUZZ_LIMITS,
        # The in-process tests hold served audio to an engine's or a provider's own samples (a
        # master is the take, 16-bit; pass-through sends the provider's pieces), which a
        # loudness target changes by design: tests/test_loudness.py holds the default (on), and
        # so does every test of `voxgate serve` (tests/served.py).
        "loudness_lufs": "off",
        # Where a test adds Redis, a call that outlives its timeout is a miss, or a replica
        # working alone, or a rate counted per process: what such a test counts then changes.
        # The 0.5 s default is a GC pause of the test's process on a loaded machine; a test of
        # the timeout itself sets its own.
        "redis_timeout_ms": "5000",
    }
    return Settings.load(env={}, overrides=overrides)


@pytest.fixture
def metrics() -> Metrics:
    """A metrics set on a fresh registry."""
    return Metrics()


GatewayFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def gateway(
    settings: Settings,
    metrics: Metrics,
    counting_engine: CountingEngine,
    request: pytest.FixtureRequest,
) -> AsyncIterator[GatewayFactory]:
    """Start real gateways on loopback; ``await gateway()`` gives a client once models are ready.

    One process, the test's own: these tests inject an engine wrapper (to count, gate or fail
    syntheses) or read the app's state, which only a gateway in the test's process allows. What a
    process boundary can change (budgets, pins, Wyoming, jambonz, say URLs, streaming, SSE,
    readiness, metrics) is tested against ``voxgate serve`` as users start it too
    (:mod:`tests.served`).

    Keyword arguments: ``settings``, ``metrics``, ``engines`` (default: the counting joe voice),
    ``routes`` (default: the route table). In a test marked ``fast_path`` the server answers
    repeats from their bytes where the app's fast path is on, as ``voxgate serve`` sets it up.
    Once the test is done, every response its clients received is checked against the OpenAPI
    document the gateway serves (tests/conformance.py): a departure fails the test.
    """
    clients: list[RecordingClient] = []
    as_served = request.node.get_closest_marker("fast_path") is not None

    async def start(
        *,
        settings: Settings = settings,
        metrics: Metrics = metrics,
        engines: Mapping[str, Engine] | None = None,
        routes: RouteTable | None = None,
        wait_ready: bool = True,
    ) -> TestClient[Any, Any]:
        app = create_app(
            settings,
            metrics=metrics,
            engines=engines if engines is not None else {"piper": counting_engine},
            routes=routes,
        )
        server = TestServer(app, host="127.0.0.1")
        # No aiohttp access log, as voxgate serve: its request lines hold query strings (text).
        await server.start_server(access_log=None)
        client = RecordingClient(server)
        await client.start_server()
        clients.append(client)
        if as_served and app[keys.FAST_HITS]:
            assert client.server.runner.server is not None
            answer_repeats(client.server.runner.server, app[keys.FAST_PATH])
        if wait_ready:
            # As long as voxgate serve is given (tests.served): loading engines in worker
            # processes (torch for Coqui) takes a while on cores shared with another test.
            deadline = asyncio.get_running_loop().time() + 180
            while (await client.get("/readyz")).status != 200:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError("gateway did not become ready")
                await asyncio.sleep(0.05)
        return client

    yield start
    try:
        failures = [f for client in clients for f in await client.conformance_failures()]
    finally:
        for client in reversed(clients):
            await client.close()
    if failures:
        shown = "\n".join(f"  {f}" for f in failures[:20])
        more = f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else ""
        pytest.fail(f"answers that depart from /openapi.json:\n{shown}{more}", pytrace=False)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port."""
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.fixture(scope="session")
def coqui_model_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small random-weight Coqui VITS saved as ``model.pth`` + ``config.json``, built once a
    run: pytest-xdist workers share the run's temp root, and the first to take the lock builds
    it there for all."""
    from bench.harness import build_vits

    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the workers' basetemps are siblings in the run's own directory
    directory = root / "coqui-vits"
    with (root / "coqui-vits.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = directory / "built"
        if not built.exists():
            files = build_vits(directory)
            built.write_text("\n".join(str(f) for f in files))
        model, config = built.read_text().splitlines()
    return Path(model), Path(config)
