"""A memory hit written by gateway.http.hits: on the wire it is what aiohttp would have sent
(same headers, Content-Length framing, HTTP/1.0 and keep-alive rules, no body for HEAD), and it
is used only where no response-prepare receiver could change the response, and only on the
aiohttp it was written for (else aiohttp's own response goes out, byte for byte the same). The
writelines skip of aiohttp is lifted only where that is safe for the whole process. The wire
tests run with the ``fast_path`` setting on and off (tests/conftest.py): the same bytes both
ways."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import tomllib
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import uvloop
from aiohttp import http_writer, web
from aiohttp.test_utils import make_mocked_request

from gateway.http import hits, keys
from gateway.http.hits import PreparedHit
from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.conftest import GatewayFactory

BODY = {"model": "piper", "voice": "joe", "input": "Hold, please.", "response_format": "wav"}
SAY_PATH = "/v1/say/joe/" + quote("Please hold.", safe="") + ".wav"

pytestmark = pytest.mark.fast_path(True, False)


def post_bytes(body: dict[str, str], *, version: str = "1.1", extra: str = "") -> bytes:
    raw = json.dumps(body).encode()
    return (
        f"POST /v1/audio/speech HTTP/{version}\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n{extra}\r\n"
    ).encode() + raw


async def read_response(
    reader: asyncio.StreamReader, *, head: bool = False
) -> tuple[str, dict[str, str], bytes]:
    """One response: status line, headers (lower-case names, each sent once), body by its
    Content-Length (none for HEAD)."""
    status = (await asyncio.wait_for(reader.readline(), 10)).decode().rstrip("\r\n")
    headers: dict[str, str] = {}
    while True:
        line = (await asyncio.wait_for(reader.readline(), 10)).decode().rstrip("\r\n")
        if not line:
            break
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"{name} sent twice"
        headers[name.lower()] = value.strip()
    length = int(headers["content-length"])
    body = b"" if head else await asyncio.wait_for(reader.readexactly(length), 10)
    return status, headers, body


async def exchange(
    port: int, data: bytes, *, count: int = 1, head: bool = False
) -> tuple[list[tuple[str, dict[str, str], bytes]], bool]:
    """Send ``data`` on a new connection and read ``count`` responses; also whether the server
    then closed the connection. Asked, not timed: one more request goes on the connection, and
    a server that kept it answers (a status line) while one that closed it gives EOF or a reset
    (waiting a while for EOF would call a slow close "kept" on a loaded machine)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answers = [await read_response(reader, head=head) for _ in range(count)]
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 30)
        except ConnectionError:
            line = b""
        assert line in (b"", b"HTTP/1.1 200 OK\r\n"), line
        return answers, line == b""
    finally:
        writer.close()


async def test_a_hit_sends_what_an_ordinary_response_sends(
    gateway: GatewayFactory, settings: Settings
) -> None:
    """The same hit from an app with a response-prepare receiver besides the request-id stamp
    (CORS on, no Origin sent, so it adds nothing) goes out as an ordinary aiohttp response: the
    headers must be the same, the client's X-Request-Id included. (With the fast path off both
    are ordinary responses.)"""
    fast = await gateway()
    ordinary = await gateway(settings=settings.replace(cors_origins="https://app.example"))
    assert fast.app[keys.FAST_HITS] is settings.fast_path and not ordinary.app[keys.FAST_HITS]
    sent: list[tuple[dict[str, str], bytes]] = []
    for client in (fast, ordinary):
        # (The second app shares the first's disk tier: its first answer is a disk hit.)
        audio = await (await client.post("/v1/audio/speech", json=BODY)).read()
        ask = post_bytes(BODY, extra="X-Request-Id: call-7f3a:leg.2\r\n")
        (answer,), _ = await exchange(client.port, ask)
        status, headers, body = answer
        assert status == "HTTP/1.1 200 OK"
        assert headers["x-cache"] == "HIT" and body == audio
        assert headers["content-length"] == str(len(audio))
        sent.append((headers, body))
    (fast_headers, _), (ordinary_headers, _) = sent

    fast_date, ordinary_date = fast_headers.pop("date"), ordinary_headers.pop("date")
    assert fast_headers == ordinary_headers  # the same bytes, the same ETag
    assert fast_headers["x-request-id"] == "call-7f3a:leg.2"
    assert fast_date.endswith(" GMT") and len(fast_date) == len(ordinary_date) == 29


async def test_keep_alive_connection_close_and_http_1_0(gateway: GatewayFactory) -> None:
    """aiohttp's rules (web_response.StreamResponse._prepare_headers): HTTP/1.1 keeps the
    connection unless the client sends ``Connection: close`` (answered with it); HTTP/1.0 closes
    it unless the client asks ``Connection: keep-alive`` (answered with it)."""
    http = await gateway()
    await http.post("/v1/audio/speech", json=BODY)  # stored
    port = http.port

    # HTTP/1.1 keep-alive: two pipelined hits answered in order on one connection.
    answers, closed = await exchange(port, post_bytes(BODY) * 2, count=2)
    assert not closed
    assert [a[1]["x-cache"] for a in answers] == ["HIT", "HIT"]
    assert answers[0][2] == answers[1][2] and "connection" not in answers[0][1]

    (answer,), closed = await exchange(port, post_bytes(BODY, extra="Connection: close\r\n"))
    assert answer[1]["connection"] == "close" and closed

    (answer,), closed = await exchange(port, post_bytes(BODY, version="1.0"))
    assert answer[0] == "HTTP/1.0 200 OK" and "connection" not in answer[1] and closed

    # No other version reaches a handler (aiohttp's parser refuses it): the writer's two rules
    # are all there are.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(post_bytes(BODY, version="1.2"))
        status = (await asyncio.wait_for(reader.readline(), 10)).split()
    finally:
        writer.close()
    assert status[1] == b"400"

    keep = post_bytes(BODY, version="1.0", extra="Connection: keep-alive\r\n")
    answers, closed = await exchange(port, keep * 2, count=2)
    assert [a[0] for a in answers] == ["HTTP/1.0 200 OK"] * 2
    assert answers[0][1]["connection"] == "keep-alive" and not closed


async def test_head_of_a_say_url_hit_has_the_length_and_no_body(gateway: GatewayFactory) -> None:
    """Players probe with HEAD (Asterisk revalidates with it): the same headers as GET, no
    body, and the connection stays in step (a GET after it on one connection is answered)."""
    http = await gateway()
    got = await http.get(SAY_PATH)
    audio = await got.read()
    again = await http.get(SAY_PATH)
    assert again.headers["X-Cache"] == "HIT"
    request = f"HEAD {SAY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    (head,), _ = await exchange(http.port, request, head=True)
    assert head[0] == "HTTP/1.1 200 OK" and head[2] == b""
    assert head[1]["content-length"] == str(len(audio)) and head[1]["x-cache"] == "HIT"
    assert head[1]["cache-control"].startswith(("public, max-age=", "no-cache"))
    get = f"GET {SAY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
    try:
        writer.write(request + get)
        first = await read_response(reader, head=True)
        second = await read_response(reader)
    finally:
        writer.close()
    assert first[2] == b"" and second[2] == audio
    assert first[1]["etag"] == second[1]["etag"]


async def test_a_hit_is_observed_like_any_response(
    gateway: GatewayFactory, metrics: Metrics
) -> None:
    """The edge still counts a hit, its cache result and its bytes (gateway.http.observe)."""
    http = await gateway()
    miss = await (await http.post("/v1/audio/speech", json=BODY)).read()
    hit = await http.post("/v1/audio/speech", json=BODY)
    audio = await hit.read()
    assert audio == miss and hit.headers["Content-Length"] == str(len(audio))
    get = metrics.registry.get_sample_value
    route = {"route": "/v1/audio/speech"}
    assert get("voxgate_http_requests_total", {**route, "method": "POST", "status": "200"}) == 2
    assert get("voxgate_http_request_duration_seconds_count", {**route, "cache": "hit"}) == 1
    assert get("voxgate_http_response_bytes_total", route) == 2 * len(audio)


def test_prepared_hit_refuses_a_line_break_in_a_value() -> None:
    with pytest.raises(ValueError, match="control character"):
        PreparedHit("d", {"X-Audio-Key": "abc\r\nSet-Cookie: x=1"}, 10)
    hit = PreparedHit("d", {"Content-Type": "audio/wav"}, 10)
    assert hit.head.startswith(b"Content-Type: audio/wav\r\nContent-Length: 10\r\nServer: ")
    assert hit.head.endswith(b"\r\n") and not hit.head.endswith(b"\r\n\r\n")


# --- the aiohttp it was written for, and the fallback ---


def hits_imported_with(version: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A fresh import of gateway.http.hits (its own module object, the real one untouched) while
    aiohttp says it is ``version``: what a process with that aiohttp installed would get."""
    monkeypatch.setattr(aiohttp, "__version__", version)
    spec = importlib.util.spec_from_file_location("hits_on_aiohttp_" + version, hits.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pinned_aiohttp_is_the_one_the_writer_was_written_for() -> None:
    """Moving the pin in pyproject.toml fails here until the writer is read again against the
    new aiohttp; and the installed aiohttp, the pin's, gets the writer (the tests above test it)."""
    pyproject = tomllib.loads((Path(hits.__file__).parents[2] / "pyproject.toml").read_text())
    pins = [d for d in pyproject["project"]["dependencies"] if re.match(r"aiohttp\b", d)]
    assert len(pins) == 1
    pin = re.fullmatch(r"aiohttp==(\d+)\.(\d+)\.\*", pins[0])
    assert pin is not None, pins[0]
    assert (int(pin[1]), int(pin[2])) == hits.WRITTEN_FOR
    assert hits.written_for(aiohttp.__version__) and hits.FITS


@pytest.mark.parametrize(
    ("version", "fits"),
    [
        ("3.14.5", True),
        ("3.14.0rc1", True),
        ("3.14", True),
        ("3.13.2", False),
        ("3.15.0", False),
        ("3.140.0", False),
        ("4.0.0a1", False),
        ("3", False),
        ("unknown", False),
    ],
)
def test_written_for_takes_the_pinned_minor_release_only(version: str, fits: bool) -> None:
    assert hits.written_for(version) is fits


def hit_request(module: types.ModuleType) -> web.Request:
    app = web.Application()
    app[module.FAST_HITS] = True  # nothing else would keep the writer from it
    return make_mocked_request("POST", "/v1/audio/speech", app=app)


def test_another_aiohttp_gets_aiohttp_s_own_response(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported with another aiohttp version, the module keeps away from aiohttp's internals:
    a hit is a plain web.Response with the same headers and body, and the writelines skip is
    left alone even on uvloop. Imported with the pinned version, the same code makes the
    writer: it is the version that decides."""
    audio = b"RIFF" + bytes(range(256)) * 64
    headers = {"Content-Type": "audio/wav", "X-Cache": "HIT", "ETag": '"e1"'}
    pinned = hits_imported_with("3.14.9", monkeypatch)
    assert pinned.FITS
    fast = pinned.hit_response(hit_request(pinned), audio, pinned.PreparedHit("d", headers, 9))
    assert type(fast) is pinned.HitResponse

    other = hits_imported_with("3.15.0", monkeypatch)
    assert not other.FITS
    plain = other.hit_response(hit_request(other), audio, other.PreparedHit("d", headers, 9))
    assert type(plain) is web.Response
    assert plain.status == 200 and plain.body == audio
    assert dict(plain.headers) == headers and plain.content_length == len(audio)

    monkeypatch.setattr(http_writer, "SKIP_WRITELINES", True)
    with new_loop("uvloop") as loop:
        assert not other.lift_writelines_skip(loop)
    assert http_writer.SKIP_WRITELINES is True


def test_a_renamed_private_field_also_gets_aiohttp_s_own_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pinned-version aiohttp without one of the fields the writer sets (setting it would
    quietly make a new attribute, and aiohttp would send a response of its own after the hit's)
    is not written to either."""
    monkeypatch.delattr(web.StreamResponse, "_eof_sent")
    assert not hits_imported_with(aiohttp.__version__, monkeypatch).FITS


@pytest.mark.fast_path(True)  # (off, the writer is never used: the fallback is all there is)
async def test_the_fallback_sends_the_same_status_headers_and_bytes(
    gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hit by POST and by say URL, GET and HEAD, with the client's X-Request-Id: what the
    writer sends and what aiohttp's own response sends where the writer does not fit are the
    same status line, headers (the Date apart) and bytes."""
    written: list[int] = []
    prepare = hits.HitResponse.prepare

    async def counted(self: hits.HitResponse, request: web.BaseRequest) -> Any:
        written.append(1)
        return await prepare(self, request)

    monkeypatch.setattr(hits.HitResponse, "prepare", counted)
    http = await gateway()
    await http.post("/v1/audio/speech", json=BODY)  # stored
    await http.get(SAY_PATH)
    rid = "X-Request-Id: call-7f3a:leg.2\r\n"
    asks = {
        "post": (post_bytes(BODY, extra=rid), False),
        "say": (f"GET {SAY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n{rid}\r\n".encode(), False),
        "head": (f"HEAD {SAY_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n{rid}\r\n".encode(), True),
    }
    sent: dict[bool, dict[str, tuple[str, dict[str, str], bytes]]] = {}
    for fits in (True, False):
        monkeypatch.setattr(hits, "FITS", fits)
        written.clear()
        sent[fits] = {}
        for name, (ask, head) in asks.items():
            (answer,), _ = await exchange(http.port, ask, head=head)
            status, headers, body = answer
            assert status == "HTTP/1.1 200 OK" and headers["x-cache"] == "HIT", name
            assert headers.pop("date").endswith(" GMT")
            sent[fits][name] = (status, headers, body)
        assert len(written) == (len(asks) if fits else 0)  # the writer, then never
    assert sent[True] == sent[False]
    post, say, head = (sent[False][name] for name in asks)
    for _, headers, _ in (post, say, head):
        assert headers["x-request-id"] == "call-7f3a:leg.2"
        assert headers["etag"].startswith('"') and headers["x-audio-key"]
    assert post[2][:4] == say[2][:4] == b"RIFF" and head[2] == b""
    assert post[1]["content-length"] == str(len(post[2]))
    assert say[1]["content-length"] == head[1]["content-length"] == str(len(say[2]))
    assert say[1]["cache-control"] == head[1]["cache-control"]
    assert say[1]["cache-control"].startswith(("public, max-age=", "no-cache"))


# --- aiohttp's writelines skip ---


@contextmanager
def new_loop(kind: str) -> Iterator[asyncio.AbstractEventLoop]:
    loop = uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


@pytest.mark.parametrize(
    ("python", "writelines"),
    [
        ((3, 11, 7), "joins"),
        ((3, 12, 0), "unsafe"),
        ((3, 12, 8), "unsafe"),
        ((3, 12, 9), "sends"),
        ((3, 13, 0), "unsafe"),
        ((3, 13, 1), "unsafe"),
        ((3, 13, 2), "sends"),
        ((3, 14, 0), "sends"),
    ],
)
def test_asyncio_writelines_by_python_version(
    python: tuple[int, int, int], writelines: str
) -> None:
    """The versions aiohttp's skip stands for (CVE-2024-12254: 3.12.0-3.12.8, 3.13.0-3.13.1)."""
    assert hits.asyncio_writelines(python) == writelines


def test_the_version_table_agrees_with_aiohttp_and_with_this_python() -> None:
    """aiohttp skips writelines by itself exactly where asyncio's does not "send"; and on this
    interpreter asyncio's socket transport does what the table says: before 3.12 its
    writelines is WriteTransport's, one write of the joined pieces (what the skip does
    instead, so lifting the skip changes nothing for an asyncio transport), later its own."""
    aiohttp_skips = http_writer.IS_PY_BEFORE_312_9 or http_writer.IS_PY313_BEFORE_313_2
    assert aiohttp_skips == (hits.ASYNCIO_WRITELINES != "sends")
    from asyncio import selector_events, transports

    own = selector_events._SelectorSocketTransport.writelines
    if hits.ASYNCIO_WRITELINES == "joins":
        assert own is transports.WriteTransport.writelines
        written: list[bytes] = []

        class Probe(transports.WriteTransport):
            def write(self, data: Any) -> None:
                written.append(bytes(data))

        Probe().writelines([b"HTTP/1.1 200 OK\r\n\r\n", b"RIFF"])
        assert written == [b"HTTP/1.1 200 OK\r\n\r\nRIFF"]
    else:
        assert own is not transports.WriteTransport.writelines


@pytest.mark.parametrize("fits", [True, False])
@pytest.mark.parametrize("writelines", ["joins", "unsafe", "sends"])
@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_the_skip_is_lifted_only_on_uvloop_where_asyncio_s_writelines_joins(
    loop_kind: str, writelines: str, fits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process-wide, so only where it is safe for every transport (lift_writelines_skip): a
    uvloop server, a Python whose asyncio writelines joins, the aiohttp it was written for."""
    monkeypatch.setattr(http_writer, "SKIP_WRITELINES", True)  # restored after the test
    monkeypatch.setattr(hits, "ASYNCIO_WRITELINES", writelines)
    monkeypatch.setattr(hits, "FITS", fits)
    lifted = loop_kind == "uvloop" and writelines == "joins" and fits
    with new_loop(loop_kind) as loop:
        assert hits.lift_writelines_skip(loop) is lifted
    assert http_writer.SKIP_WRITELINES is not lifted


@pytest.mark.parametrize("lift", [True, False])
def test_on_uvloop_bodies_small_and_large_arrive_whole(
    lift: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On uvloop, with aiohttp's skip lifted as a server lifts it (aiohttp's own responses then
    go to the transport as one writelines) or kept: aiohttp's responses and the hit writer's
    carry bodies small and large (past the socket buffer, so flow control pauses the writer)
    whole. The hit writer gives uvloop's transport one writelines either way: it asks the
    transport, not the skip."""
    monkeypatch.setattr(http_writer, "SKIP_WRITELINES", True)  # restored after the test
    bodies = {"small": bytes(range(256)) * 141, "large": bytes(range(255, -1, -1)) * 16384}
    prepared = {n: PreparedHit(n, {"Content-Type": "audio/wav"}, len(b)) for n, b in bodies.items()}
    transports: set[type[object]] = set()

    async def main() -> None:
        if lift:
            hits.lift_writelines_skip(asyncio.get_running_loop())

        async def handler(request: web.Request) -> web.StreamResponse:
            name = request.match_info["name"]
            if request.match_info["kind"] == "plain":
                return web.Response(body=bodies[name], content_type="audio/wav")
            transports.add(type(request.transport))
            return hits.hit_response(request, bodies[name], prepared[name])

        app = web.Application()
        app[hits.FAST_HITS] = True
        app.router.add_get("/{kind}/{name}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:

                async def fetch(path: str) -> tuple[str, bytes]:
                    async with session.get(f"http://127.0.0.1:{port}/{path}") as r:
                        assert r.status == 200
                        return r.headers["Content-Type"], await r.read()

                paths = [f"{k}/{n}" for k in ("hit", "plain") for n in bodies] * 4
                got = await asyncio.gather(*(fetch(p) for p in paths))
                for path, (kind, body) in zip(paths, got, strict=True):
                    assert kind == "audio/wav" and body == bodies[path.split("/")[1]], path
        finally:
            await runner.cleanup()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    assert http_writer.SKIP_WRITELINES is not (lift and hits.ASYNCIO_WRITELINES == "joins")
    assert transports and all(k.__module__.startswith("uvloop") for k in transports)
    assert all(hits._gathers(k) for k in transports)
