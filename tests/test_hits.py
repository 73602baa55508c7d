"""A memory hit written by gateway.http.hits: on the wire it is what aiohttp would have sent
(same headers, Content-Length framing, HTTP/1.0 and keep-alive rules, no body for HEAD), and it
is used only where no response-prepare receiver could change the response."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import pytest

from gateway.http import keys
from gateway.http.hits import PreparedHit
from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.conftest import GatewayFactory

BODY = {"model": "piper", "voice": "joe", "input": "Hold, please.", "response_format": "wav"}
SAY_PATH = "/v1/say/joe/" + quote("Please hold.", safe="") + ".wav"


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
    headers must be the same, the client's X-Request-Id included."""
    fast = await gateway()
    ordinary = await gateway(settings=settings.replace(cors_origins="https://app.example"))
    assert fast.app[keys.FAST_HITS] and not ordinary.app[keys.FAST_HITS]
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
