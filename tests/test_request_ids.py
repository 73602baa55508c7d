"""``X-Request-Id`` on every response and in the access log, against `voxgate serve` with no
topology flags (a gateway process per core, uvloop, the shared pool host): the client's id is
echoed when it is safe, one is made otherwise, whatever answered (a memory hit's own writer, a
miss, a chunked stream, server-sent events, a 304, JSON errors, the 404/405 fallbacks, an
``Expect`` refusal, a WebSocket upgrade)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.ops_support import ServerProcess
from tests.served import DefaultServer
from tests.support import eventually

SPEECH = {"model": "piper", "voice": "joe", "response_format": "wav"}
MADE = re.compile(r"[0-9a-f]{12}-[0-9]+")  # a process's prefix and its counter


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    served = DefaultServer(tmp_path_factory.mktemp("request-ids"))
    try:
        served.wait_ready()
        yield served
        assert served.terminate() == 0, served.logs()
    finally:
        served.close()


async def access_lines(server: ServerProcess, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The access-log line of each request id in ``ids`` (lines are written within 0.2 s)."""

    async def read() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for line in (await asyncio.to_thread(server.logs)).splitlines():
            if '"voxgate.access"' in line:
                entry = json.loads(line)
                if entry.get("request_id") in ids:
                    found[entry["request_id"]] = entry
        return found

    return await eventually(read, lambda found: set(found) == ids, 30, "an access line per id")


async def raw_head(
    server: ServerProcess, request: bytes, then: bytes = b""
) -> tuple[str, dict[str, str]]:
    """Send ``request`` on a fresh connection; the status line and headers of the answer (and
    with ``then``: send it after them, and read until the server closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(30):
            head = await reader.readuntil(b"\r\n\r\n")
            if then:
                writer.write(then)
                await writer.drain()
                while await reader.read(65536):
                    pass
    finally:
        writer.close()
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def test_every_answer_carries_its_request_id_and_logs_it(server: ServerProcess) -> None:
    text = f"Your reference is {os.getpid()}."
    seen: dict[str, tuple[str, str, int]] = {}  # id -> (route, method, status)

    async with aiohttp.ClientSession(server.url) as http:

        async def ask(
            method: str, path: str, route: str, status: int, sent: str | None = None, **kw: Any
        ) -> tuple[aiohttp.ClientResponse, bytes]:
            headers = kw.pop("headers", {})
            if sent is not None:
                headers["X-Request-Id"] = sent
            async with http.request(method, path, headers=headers, **kw) as r:
                body = await r.read()
            assert r.status == status, (path, r.status)
            rid = r.headers.get("X-Request-Id")
            assert rid is not None, (method, path)
            if sent is not None:
                assert rid == sent
            else:
                assert MADE.fullmatch(rid), rid
            assert rid not in seen  # one id per request
            seen[rid] = (route, method, status)
            return r, body

        speech = "/v1/audio/speech"
        miss, _ = await ask("POST", speech, speech, 200, json={**SPEECH, "input": text})
        assert miss.headers["X-Cache"] == "MISS"
        # The memory hit's own writer (gateway.http.hits), the id made, then the client's.
        for _ in range(3):  # (one kept-alive connection: the process that stored it)
            hit, _ = await ask("POST", speech, speech, 200, json={**SPEECH, "input": text})
            assert hit.headers["X-Cache"] == "HIT"
        hit, _ = await ask(
            "POST", speech, speech, 200, "lk-7f3a:seg.2", json={**SPEECH, "input": text}
        )
        etag = hit.headers["ETag"]
        await ask(
            "POST",
            speech,
            speech,
            304,
            json={**SPEECH, "input": text},
            headers={"If-None-Match": etag},
        )
        streamed, _ = await ask(
            "POST",
            speech,
            speech,
            200,
            json={**SPEECH, "input": "A stream. Of two.", "stream": True},
        )
        assert streamed.headers["Transfer-Encoding"] == "chunked"
        events, _ = await ask(
            "POST",
            speech,
            speech,
            200,
            "sse.1",
            json={**SPEECH, "input": "Events now.", "stream_format": "sse"},
        )
        assert events.headers["Content-Type"].startswith("text/event-stream")
        # Errors: a JSON 400, 404 and 405 from the fallbacks.
        _, bad = await ask("POST", speech, speech, 400, "err-1", json={**SPEECH, "input": ""})
        assert "error" in json.loads(bad)
        await ask("GET", "/no/such/path", "unmatched", 404)
        await ask("DELETE", "/healthz", "/healthz", 405)
        # Unsafe or oversized ids are replaced by made ones, not refused.
        for unsafe in ("has space", '"quoted"', "x" * 129, "é", ""):
            await ask("GET", "/healthz", "/healthz", 200, headers={"X-Request-Id": unsafe})
        await ask("GET", "/healthz", "/healthz", 200, "x" * 128)

    # A WebSocket upgrade (jambonz's stream) and an Expect refusal, on raw sockets.
    key = base64.b64encode(os.urandom(16)).decode()
    upgrade = (
        "GET /v1/jambonz/stream?voice=joe&sampleRate=8000 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Key: {key}\r\nX-Request-Id: ws-1\r\n\r\n"
    ).encode()
    # ... closed with a close frame (1000), so that its handler ends and is logged.
    mask = os.urandom(4)
    close = bytes([0x88, 0x82]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(b"\x03\xe8"))
    status, headers = await raw_head(server, upgrade, then=close)
    assert status.startswith("HTTP/1.1 101") and headers["x-request-id"] == "ws-1"
    seen["ws-1"] = ("/v1/jambonz/stream", "GET", 101)
    too_big = (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 999999999\r\nExpect: 100-continue\r\n\r\n"
    )
    status, headers = await raw_head(server, too_big)
    assert status.startswith("HTTP/1.1 413") and MADE.fullmatch(headers["x-request-id"])

    # Every routed request's line names its id (the Expect refusal never reached a route).
    lines = await access_lines(server, set(seen))
    for rid, (route, method, status_code) in seen.items():
        line = lines[rid]
        assert (line["route"], line["method"], line["status"]) == (route, method, status_code)
