"""Connection hygiene and browser rules: header/idle, body and write timeouts,
the connection cap, 415 for non-JSON bodies on JSON routes, the Host allow-list and CORS. The
timeouts and the cap hold with the fast path's connections and with aiohttp's own."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.http.connections import (
    PROBE_SLOTS,
    cap_connections,
    runner_options,
    write_within,
)
from gateway.http.hits import FastPath, answer_repeats
from gateway.http.requestid import RequestIds
from gateway.http.routes import route_table
from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.served import DefaultServer

# One pytest-xdist worker runs the whole module: two of its tests share a module-scoped server.
pytestmark = pytest.mark.xdist_group("connections")

BODY = {"model": "piper", "voice": "joe", "input": "Hold, please.", "response_format": "wav"}


REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def status_of(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 30)
    return int(line.split()[1])


async def fill_cap(
    tiny_server: Any, metrics: Metrics, *paths: str
) -> tuple[int, list[asyncio.StreamWriter]]:
    """A server capped at two connections (``hello`` at ``/`` and ``paths``), both held by
    kept-alive connections that were answered 200: its port and the held writers."""
    app = web.Application()
    for path in ("/", *paths):
        app.router.add_get(path, hello)
    port = await tiny_server(app, Settings(max_connections=2), metrics)
    held = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        assert await status_of(reader) == 200  # kept alive: the connection stays open
        held.append(writer)
    return port, held


# ---- JSON content type -------------------------------------------------------------------


async def test_json_routes_refuse_other_content_types_with_415(gateway: GatewayFactory) -> None:
    http = await gateway()
    raw = json.dumps(BODY)
    for headers in (
        {"Content-Type": "text/plain"},  # what a cross-origin page may send without a preflight
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {},
    ):
        r = await http.post("/v1/audio/speech", data=raw.encode(), headers=headers)
        assert r.status == 415, headers
        err = (await r.json())["error"]
        assert err["code"] == "unsupported_media_type" and err["type"] == "invalid_request_error"
    for path, body in (
        ("/v1/prompts", {"prompts": ["Hi."]}),
        ("/", {"text": "Hi."}),
        ("/v1/say/sign", {"voice": "joe", "text": "Hi.", "ext": "wav"}),
    ):
        r = await http.post(path, data=json.dumps(body), headers={"Content-Type": "text/plain"})
        assert r.status == 415, path
    ok = await http.post(
        "/v1/audio/speech",
        data=raw.encode(),
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert ok.status == 200
    # Coqui's /api/tts reads forms as well as JSON: not a JSON-only route.
    form = await http.post("/api/tts", data={"text": "Hold, please.", "speaker_id": "joe"})
    assert form.status == 200


async def test_json_content_type_can_be_relaxed(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await gateway(settings=settings.replace(require_json_content_type=False))
    r = await http.post(
        "/v1/audio/speech", data=json.dumps(BODY), headers={"Content-Type": "text/plain"}
    )
    assert r.status == 200


# ---- Host allow-list and CORS ------------------------------------------------------------


async def test_host_allow_list_answers_421_to_other_hosts(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await gateway(settings=settings.replace(allowed_hosts="tts.example,127.0.0.1"))
    assert (await http.get("/healthz", headers={"Host": "tts.example:8080"})).status == 200
    assert (await http.get("/healthz", headers={"Host": "TTS.example"})).status == 200
    for path in ("/healthz", "/no/such/path", "/v1/audio/speech"):
        r = await http.get(path, headers={"Host": "rebound.attacker.example"})
        assert r.status == 421, path
        assert (await r.json())["error"]["code"] == "unknown_host"


async def test_cors_is_off_by_default(gateway: GatewayFactory) -> None:
    http = await gateway()
    origin = {"Origin": "https://app.example"}
    r = await http.get("/healthz", headers=origin)
    assert "Access-Control-Allow-Origin" not in r.headers
    pre = await http.options(
        "/v1/audio/speech", headers={**origin, "Access-Control-Request-Method": "POST"}
    )
    assert pre.status == 405 and "Access-Control-Allow-Origin" not in pre.headers


async def test_cors_answers_allowed_origins_only(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await gateway(settings=settings.replace(cors_origins="https://app.example/"))
    asked = {"Access-Control-Request-Method": "POST", "Origin": "https://app.example"}
    pre = await http.options("/v1/audio/speech", headers=asked)
    assert pre.status == 204
    assert pre.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
    assert "Origin" in pre.headers["Vary"]
    r = await http.post("/v1/audio/speech", json=BODY, headers={"Origin": "https://app.example"})
    assert r.status == 200
    assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "X-Audio-Key" in r.headers["Access-Control-Expose-Headers"]
    other = {**asked, "Origin": "https://evil.example"}
    refused = await http.options("/v1/audio/speech", headers=other)
    assert refused.status == 405 and "Access-Control-Allow-Origin" not in refused.headers
    r = await http.get("/healthz", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in r.headers


# ---- timeouts ----------------------------------------------------------------------------


@pytest.fixture(params=[True, False], ids=["fast_path_on", "fast_path_off"])
async def tiny_server(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Start a small aiohttp app with the gateway's runner options and connection cap, and
    connections that offer their bytes to the fast path first (as ``voxgate serve`` sets them
    up; these apps make no memory hit, so nothing is answered from bytes) or aiohttp's own."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, settings: Settings, metrics: Metrics) -> int:
        runner = web.AppRunner(app, access_log=None, **runner_options(settings))
        await runner.setup()
        assert runner.server is not None
        probes = route_table(settings).probe_paths  # (what `voxgate serve` passes)
        cap_connections(
            runner.server,
            settings.max_connections,
            metrics,
            probes,
            per_source=settings.max_unfinished_per_source,
        )
        if request.param:
            fast = FastPath(lambda *_: None, RequestIds(), lambda: True)
            assert answer_repeats(runner.server, fast)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for runner in runners:
        await runner.cleanup()


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def test_a_client_trickling_its_headers_is_dropped(tiny_server: Any) -> None:
    app = web.Application()
    app.router.add_get("/", hello)
    settings = Settings(keepalive_timeout_s=1)
    port = await tiny_server(app, settings, Metrics())
    # Timed from before the connection exists: the server's idle timer cannot start earlier, so
    # the close comes at least 1 s later on any machine. The upper bound only tells the 1 s
    # setting from aiohttp's 75 s default, with room for a loaded machine.
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and the rest never comes
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 60) == b""  # closed by the server
    assert 0.99 < time.monotonic() - started < 30  # (0.99: asyncio may fire a timer a tick early)
    writer.close()


@pytest.mark.fast_path(True, False)
async def test_a_body_that_does_not_arrive_gets_408(
    gateway: GatewayFactory, settings: Settings
) -> None:
    http = await gateway(settings=settings.replace(body_timeout_s=1))
    reader, writer = await asyncio.open_connection(http.server.host, http.server.port)
    writer.write(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": '
    )
    await writer.drain()
    started = time.monotonic()
    assert await status_of(reader) == 408
    assert time.monotonic() - started < 20  # the 1 s setting, not the 30 s default
    writer.close()


async def test_a_stream_reader_that_stops_reading_is_cut_off(tiny_server: Any) -> None:
    ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        chunk = b"\0" * 65536
        try:
            while True:
                await write_within(request, resp, chunk, 0.5)
        except ConnectionResetError as exc:
            ended.set_result(str(exc))
        return resp

    app = web.Application()
    app.router.add_get("/", endless)
    port = await tiny_server(app, Settings(), Metrics())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes little
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    _reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    # Never read: the server's buffers fill, and its write waits past the timeout.
    reason = await asyncio.wait_for(ended, 20)
    assert "write_timeout_s" in reason
    writer.close()


async def test_connections_beyond_the_cap_get_503(tiny_server: Any) -> None:
    metrics = Metrics()
    port, held = await fill_cap(tiny_server, metrics)
    request = REQUEST
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await status_of(reader) == 503
    assert b"too_many_connections" in await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert metrics.registry.get_sample_value("voxgate_connections_refused_total") == 1
    first = held.pop()
    first.close()
    await first.wait_closed()
    for _ in range(50):  # the server sees the close, then a new connection is served
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        status = await status_of(reader)
        writer.close()
        if status == 200:
            break
    assert status == 200
    for w in held:
        w.close()


async def test_one_source_cannot_hold_the_cap_with_unfinished_sockets(tiny_server: Any) -> None:
    """Past max_unfinished_per_source sockets of one address that sent no request yet, its next
    one is refused; a socket stops counting once its first request is in."""
    app = web.Application()
    app.router.add_get("/", hello)
    metrics = Metrics()
    settings = Settings(max_connections=100, max_unfinished_per_source=3)
    port = await tiny_server(app, settings, metrics)
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await status_of(reader) == 503
    assert b"too_many_connections" in await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert metrics.registry.get_sample_value("voxgate_connections_refused_total") == 1
    first_reader, first_writer = idle[0]
    first_writer.write(REQUEST)
    assert await status_of(first_reader) == 200  # kept open, no longer unfinished
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    assert await status_of(reader) == 200
    writer.close()
    for _, w in idle:
        w.close()
    assert metrics.registry.get_sample_value("voxgate_connections_refused_total") == 1


async def test_a_full_gateway_still_answers_health_probes(tiny_server: Any) -> None:
    """Past the cap, a few connections may still ask for /healthz or /readyz (and are closed
    after the answer); any other request on them, or none in time, gets the cap's 503."""
    metrics = Metrics()
    port, held = await fill_cap(tiny_server, metrics, "/healthz", "/readyz")
    request = REQUEST
    for path in ("/healthz", "/readyz"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)  # read to the close
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello"), path
        assert b"Connection: close" in answer
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
    writer.close()
    # Connections that ask nothing: those in probe slots are refused once their time is up,
    # those past the slots at once.
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(PROBE_SLOTS + 2)]
    for reader, writer in silent:
        assert await status_of(reader) == 503
        writer.close()
    assert metrics.registry.get_sample_value("voxgate_connections_refused_total") == 1 + len(silent)
    for w in held:
        w.close()


@pytest.mark.slow
async def test_probes_answer_while_the_default_topology_is_full(tmp_path: Path) -> None:
    """`voxgate serve` with no flags and its connection cap reached in every gateway process by
    idle clients: /healthz and /readyz answer 200, other requests 503."""
    cap = 4
    server = DefaultServer(tmp_path / "srv", "--max-connections", str(cap))
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        server.wait_ready()
        # Far more than every process's cap plus its probe slots (the kernel spreads new
        # connections over the processes by their addresses).
        for _ in range(server.gateways * (cap + PROBE_SLOTS) * 4):
            idle.append(await asyncio.open_connection("127.0.0.1", server.port))
        # Every idle client past a cap is refused: at once past the probe slots, after
        # PROBE_WAIT_S in one. Then each process holds exactly its cap, and its slots are free.
        reads = [asyncio.ensure_future(reader.read()) for reader, _ in idle]
        refused = len(idle) - server.gateways * cap
        async with asyncio.timeout(60):
            while sum(r.done() for r in reads) < refused:
                pending = [r for r in reads if not r.done()]
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        assert all(r.result().startswith(b"HTTP/1.1 503") for r in reads if r.done())
        for path in ("/healthz", "/readyz"):
            statuses = [(await server.request("GET", path))[0] for _ in range(10)]
            assert statuses == [200] * 10, path
        status, _, body = await server.request("GET", "/v1/models")
        assert status == 503 and b"too_many_connections" in body
        for r in reads:
            r.cancel()
    finally:
        for _, w in idle:
            w.close()
        server.close()


def test_parser_refusals_are_one_warning_per_interval_without_their_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RefusedRequests (the logger aiohttp's request handlers get): a refusal is a warning with
    the error's kind and the peer, never the bytes; within the interval they are counted, and
    the next line says how many were not logged; other records pass through unchanged."""
    from aiohttp.http_exceptions import InvalidHeader, LineTooLong

    from gateway.http.connections import RefusedRequests

    now = [100.0]
    logger = RefusedRequests(10.0, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG)
    secret = canary("sk-live")
    for _ in range(5):
        logger.exception(
            "Error handling request from %s", "10.0.0.7", exc_info=InvalidHeader(secret)
        )
    now[0] += 10.0
    logger.exception(
        "Error handling request from %s", "10.0.0.8", exc_info=LineTooLong(secret, "8190")
    )
    logger.warning("something else %s", "entirely")
    mine = [r for r in caplog.records if r.name == "voxgate.gateway"]
    assert [
        (r.levelno, r.fields["kind"], r.fields["peer"], r.fields["unlogged"]) for r in mine
    ] == [
        (logging.WARNING, "InvalidHeader", "10.0.0.7", 0),
        (logging.WARNING, "LineTooLong", "10.0.0.8", 4),
    ]
    assert logger.refused == 6
    assert secret not in caplog.text and not any(r.exc_info for r in caplog.records)
    passed = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [r.getMessage() for r in passed] == ["something else entirely"]


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    """`voxgate serve` with no flags, for the tests that only send it requests."""
    with DefaultServer(tmp_path_factory.mktemp("plain") / "srv").serving() as server:
        yield server


async def test_a_loopback_bind_answers_only_loopback_host_names(
    plain_server: DefaultServer,
) -> None:
    """`voxgate serve` with no flags (127.0.0.1) and a DNS-rebinding page: its browser sends the
    page's own name as Host, and gets a 421 naming the hosts served and the setting; a local
    client's names are answered, with or without a port."""
    server = plain_server
    for host in ("localhost", f"localhost:{server.port}", "127.0.0.1", "[::1]:80", "LOCALHOST"):
        status, _, _ = await server.request("GET", "/healthz", headers={"Host": host})
        assert status == 200, host
    for path in ("/metrics", "/healthz", "/v1/audio/speech", "/no/such/path"):
        for host in ("rebound.attacker.example", "rebound.attacker.example:8080", "0.0.0.0"):
            status, _, body = await server.request("GET", path, headers={"Host": host})
            assert status == 421, (path, host)
            error = json.loads(body)["error"]
            assert error["code"] == "unknown_host" and error["param"] == "allowed_hosts"
            assert "localhost, 127.0.0.1, [::1]" in error["message"]
            assert "rebound" not in error["message"]


async def test_allowed_hosts_star_answers_any_host_name(tmp_path: Path) -> None:
    server = DefaultServer(tmp_path / "srv", "--allowed-hosts", "*")
    try:
        await asyncio.to_thread(server.wait_ready)
        headers = {"Host": "tts.example"}
        assert (await server.request("GET", "/healthz", headers=headers))[0] == 200
    finally:
        server.close()


def test_a_bind_beyond_loopback_keeps_the_explicit_list() -> None:
    from gateway.http.origins import served_hosts

    assert served_hosts((), "0.0.0.0") == frozenset()
    assert served_hosts((), "10.1.2.3") == frozenset()
    assert served_hosts(("tts.example",), "0.0.0.0") == {"tts.example"}
    assert served_hosts(("tts.example",), "127.0.0.1") == {"tts.example"}
    assert served_hosts((), "::1") == {"localhost", "127.0.0.1", "[::1]"}
    assert served_hosts((), "127.0.0.2") == {"localhost", "127.0.0.1", "[::1]", "127.0.0.2"}
    assert served_hosts(("*",), "127.0.0.1") == frozenset()


async def test_a_request_the_parser_refuses_gets_a_fixed_body(plain_server: DefaultServer) -> None:
    """aiohttp's 400 for a malformed request echoed the offending header, an API key beside a
    control byte included; `voxgate serve` answers a fixed JSON body that holds nothing sent."""
    key = canary("sk-parser")
    server = plain_server
    for head in (
        f"Authorization: Bearer {key}\x01",
        f"X-API-Key: {key}\x7f",
        f"X-Long: {key}{'a' * 9000}",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        assert re.fullmatch(rb"HTTP/1\.[01] 4\d\d .*", status_line), status_line
        body = rest.partition(b"\r\n\r\n")[2]
        assert json.loads(body)["error"]["code"] == "malformed_request"
        assert key.encode() not in answer
    assert key not in server.logs()
