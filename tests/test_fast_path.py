"""Repeated requests answered from their bytes (gateway.http.hits.FastPath, FastHandler): a
connection's next bytes that are exactly a request answered before with a memory hit are
answered again before aiohttp parses them, with what the ordinary path sends (the same audio and
headers, a fresh request id, a fresh Date), counted and logged the same way; anything else, or
anything that may answer differently, takes aiohttp's path.

These tests need the gateway's app in the test's process (its state, the engine's count); the
same path under ``voxgate serve`` as users start it is in tests/test_default_topology.py. Each
runs with the ``fast_path`` setting on and off (tests/conftest.py): off, nothing is answered
from its bytes and every answer on the wire is the same; a test of the answerer's own workings
runs on only."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from bench.harness import metric_sum
from gateway.http import hits, keys
from gateway.http.hits import FastHandler, FastServer, answer_repeats
from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory
from tests.served import DefaultServer
from tests.support import eventually
from tests.test_hits import BODY, post_bytes, read_response

TEXT = "Your call is important to us."
GET = (
    "GET /synthesize?text=" + quote(TEXT) + "&speaker=joe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
).encode()

pytestmark = pytest.mark.fast_path(True, False)


async def fast_gateway(gateway: GatewayFactory, **kw: Any) -> TestClient[Any, Any]:
    """A gateway set up as ``voxgate serve`` sets its own up (tests/conftest.py): its server
    answers repeats where the fast path is on, and is aiohttp's own where it is off."""
    client = await gateway(**kw)
    server = client.server.runner.server
    fast = client.app[keys.SETTINGS].fast_path
    assert isinstance(server, FastServer) is fast and client.app[keys.FAST_HITS] is fast
    return client


def answered(client: TestClient[Any, Any]) -> int:
    return client.app[keys.FAST_PATH].answered


def unless_off(settings: Settings, count: int) -> int:
    """``count`` requests answered from their bytes with the fast path on; none with it off."""
    return count if settings.fast_path else 0


async def ask(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, data: bytes, count: int = 1
) -> list[tuple[str, dict[str, str], bytes]]:
    writer.write(data)
    await writer.drain()
    return [await read_response(reader) for _ in range(count)]


async def test_a_repeat_is_answered_from_its_bytes_as_the_ordinary_path_answers(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await fast_gateway(gateway)
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        (miss,) = await ask(writer, reader, GET)
        assert miss[1]["x-cache"] == "MISS" and answered(client) == 0
        (hit,) = await ask(writer, reader, GET)  # a memory hit, aiohttp's path: remembered
        assert hit[1]["x-cache"] == "HIT" and answered(client) == 0
        repeats = [(await ask(writer, reader, GET))[0] for _ in range(3)]
        assert answered(client) == unless_off(settings, 3)
    finally:
        writer.close()
    for status, headers, body in repeats:
        assert status == "HTTP/1.1 200 OK" and body == hit[2] == miss[2]
        want = {k: v for k, v in hit[1].items() if k not in ("date", "x-request-id")}
        assert {k: v for k, v in headers.items() if k not in ("date", "x-request-id")} == want
        assert headers["date"].endswith(" GMT")
    ids = {hit[1]["x-request-id"], *(h["x-request-id"] for _, h, _ in repeats)}
    assert len(ids) == 4  # each answer its own id


async def test_repeats_are_counted_timed_and_logged_as_hits(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await fast_gateway(gateway)
    metrics = client.app[keys.METRICS]
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        for _ in range(5):
            await ask(writer, reader, GET)
    finally:
        writer.close()
    assert answered(client) == unless_off(settings, 3)
    client.app[keys.OBSERVER].flush()
    get = metrics.registry.get_sample_value
    route = {"route": "/synthesize", "method": "GET", "status": "200"}
    assert get("voxgate_http_requests_total", route) == 5
    assert (
        get("voxgate_http_request_duration_seconds_count", {"route": "/synthesize", "cache": "hit"})
        == 4
    )
    speech = {"model": "piper", "voice": "joe", "format": "wav", "cache": "hit"}
    assert get("voxgate_speech_requests_total", speech) == 4
    assert get("voxgate_fast_hits_total") == unless_off(settings, 3)


async def test_a_post_repeat_and_pipelined_requests_keep_their_order(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await fast_gateway(gateway)
    other = {**BODY, "input": "Goodbye now."}
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        await ask(writer, reader, post_bytes(BODY))
        await ask(writer, reader, post_bytes(other))
        await ask(writer, reader, post_bytes(BODY))  # remembered
        (first,) = await ask(writer, reader, post_bytes(BODY))
        assert answered(client) == unless_off(settings, 1)
        # Two requests in one write are not a remembered request's bytes: aiohttp answers both,
        # in order; so does a request split over two writes.
        both = await ask(writer, reader, post_bytes(other) + post_bytes(BODY), count=2)
        assert [b for _, _, b in both] != [first[2], first[2]] and both[1][2] == first[2]
        data = post_bytes(BODY)
        writer.write(data[:20])
        await writer.drain()
        (split,) = await ask(writer, reader, data[20:])
        assert split[2] == first[2] and answered(client) == unless_off(settings, 1)
    finally:
        writer.close()


async def test_what_is_not_remembered(gateway: GatewayFactory) -> None:
    """Conditional and range requests, a client's request id: aiohttp's path every time (their
    answers may differ from the plain stored bytes, or echo the client), answered as it answers
    them."""
    client = await fast_gateway(gateway)
    await client.get("/synthesize", params={"text": TEXT, "speaker": "joe"})
    etag = (await client.get("/synthesize", params={"text": TEXT, "speaker": "joe"})).headers[
        "ETag"
    ]
    head = GET[: -len(b"\r\n")]
    for extra in (f"If-None-Match: {etag}\r\n", "Range: bytes=0-99\r\n", "X-Request-Id: leg-1\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        try:
            statuses = set()
            for _ in range(3):
                writer.write(head + extra.encode() + b"\r\n")
                await writer.drain()
                statuses.add(await asyncio.wait_for(reader.readline(), 10))
                await _skip_rest(reader)
            assert len(statuses) == 1, statuses
        finally:
            writer.close()
    assert answered(client) == 0


async def _skip_rest(reader: asyncio.StreamReader) -> None:
    length = 0
    while (line := await asyncio.wait_for(reader.readline(), 10)) != b"\r\n":
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)


async def test_an_evicted_entry_is_answered_by_the_ordinary_path(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await fast_gateway(gateway)
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        await ask(writer, reader, GET)
        (hit,) = await ask(writer, reader, GET)
        await ask(writer, reader, GET)
        assert answered(client) == unless_off(settings, 1)
        memory = client.app[keys.SPEECH].store.tiers[0]
        assert memory.name == "memory"
        memory._forget(hit[1]["x-audio-key"])  # (as an eviction does)
        (again,) = await ask(writer, reader, GET)
        assert answered(client) == unless_off(settings, 1)
        assert again[1]["x-cache"] == "HIT" and again[2] == hit[2]
    finally:
        writer.close()


@pytest.mark.fast_path(True)
async def test_connections_are_fast_handlers_and_keep_alive_moves_on(
    gateway: GatewayFactory,
) -> None:
    client = await fast_gateway(gateway)
    server = client.server.runner.server
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        for _ in range(2):
            await ask(writer, reader, GET)
        # (The test client's own kept connection is another FastHandler: this one is ours.)
        ours = writer.get_extra_info("sockname")
        (handler,) = [
            h for h in server.connections if h.transport.get_extra_info("peername") == ours
        ]
        assert isinstance(handler, FastHandler)
        before = handler._next_keepalive_close_time
        await ask(writer, reader, GET)
        assert answered(client) == 1 and handler._next_keepalive_close_time > before
    finally:
        writer.close()


@pytest.mark.slow
@pytest.mark.parametrize("fast_path", ["true", "false"])
async def test_voxgate_serve_answers_repeats_on_kept_connections(
    tmp_path: Path, fast_path: str
) -> None:
    """``voxgate serve`` with no other flags (a gateway process per core, uvloop): bots that
    keep their connections, each sending the same prompts again, get the same audio, every
    request counted once; the repeats were answered from their bytes in whichever process holds
    the connection, and with ``--fast-path false`` none was. No API keys here: with keys on
    every request is checked (the default topology module shows none answered so)."""
    server = DefaultServer(tmp_path / "srv", "--fast-path", fast_path)
    try:
        await asyncio.to_thread(server.wait_ready)
        prompts = ["Press one for sales.", "Press two for support."]
        rounds, bots = 4, 3

        async def bot() -> list[bytes]:
            # One kept connection per bot: aiohttp sends the same bytes for the same request.
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(server.url, connector=connector) as session:
                got = []
                for _ in range(rounds):
                    for text in prompts:
                        body = {**BODY, "input": text}
                        async with session.post("/v1/audio/speech", json=body) as r:
                            assert r.status == 200
                            got.append(await r.read())
                return got

        answers = await asyncio.gather(*(bot() for _ in range(bots)))
        assert all(a == answers[0] for a in answers)
        assert len(set(answers[0])) == len(prompts)

        total = bots * rounds * len(prompts)

        async def counted() -> tuple[float, float]:
            text = await asyncio.to_thread(server.metrics)
            return (
                metric_sum(text, "voxgate_http_requests_total", route="/v1/audio/speech"),
                metric_sum(text, "voxgate_fast_hits_total"),
            )

        requests, fast = await eventually(counted, lambda c: c[0] == total, 30, "every request")
        # Each bot's first round is a miss or an ordinary hit per prompt; later rounds are
        # repeats on its connection, answered from their bytes (with the fast path on).
        if fast_path == "true":
            assert fast >= bots * (rounds - 2) * len(prompts), (requests, fast)
        else:
            assert fast == 0
        assert server.terminate() == 0
    finally:
        server.close()


@pytest.mark.fast_path(True)
async def test_on_another_aiohttp_the_server_stays_aiohttp_s_own(
    gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the installed aiohttp is not the one the handler's internals were written for
    (hits.FITS), nothing is swapped: aiohttp's own protocol answers every request."""
    monkeypatch.setattr(hits, "FITS", False)
    client = await gateway()
    server = client.server.runner.server
    assert server is not None
    assert not answer_repeats(server, client.app[keys.FAST_PATH])
    assert type(server) is web.Server
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        answers = [(await ask(writer, reader, GET))[0] for _ in range(4)]
    finally:
        writer.close()
    assert answered(client) == 0 and len({body for _, _, body in answers}) == 1


async def test_requests_longer_than_the_memo_keeps_are_not_remembered(
    gateway: GatewayFactory,
) -> None:
    """The memo keeps requests of at most 8 KB (bounded memory under hostile clients): a longer
    one is answered by aiohttp's path every time, the same way."""
    client = await fast_gateway(gateway)
    assert client.app[keys.FAST_PATH].memo.max_key == 8192
    pad = "".join(f"X-Pad-{i}: {'a' * 4000}\r\n" for i in range(3))
    long_get = GET[: -len(b"\r\n")] + pad.encode() + b"\r\n"
    assert len(long_get) > 8192
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        answers = [(await ask(writer, reader, long_get))[0] for _ in range(4)]
    finally:
        writer.close()
    assert [a[1]["x-cache"] for a in answers] == ["MISS", "HIT", "HIT", "HIT"]
    assert len({body for _, _, body in answers}) == 1 and answered(client) == 0
    assert len(client.app[keys.FAST_PATH].memo) == 0
