"""The features a process boundary can change, against `voxgate serve` as a user starts it: no
topology flags (a gateway process per core on one port, uvloop, the host's synthesis pool).

One server for the module (a start costs seconds). Each request goes on a new connection, so the
kernel hands it to any of the gateway processes, as it does for players and bots that do not keep
connections: an answer that depended on which process took it would show here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from bench.harness import metric_sum
from gateway.runtime.apikeys import key_table
from gateway.runtime.topology import usable_cores
from tests.canary import canary
from tests.served import DefaultServer
from tests.support import eventually

# One pytest-xdist worker runs the whole module: its tests share one module-scoped `voxgate serve`.
pytestmark = pytest.mark.xdist_group("default_topology")

SECRET = canary("default-topology")
AUTH = {"Authorization": f"Bearer {SECRET}"}
SIGNING = canary("default-topology-signing")
NEW_CONNECTIONS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    home = tmp_path_factory.mktemp("default-topology")
    keys = home / "keys.toml"
    keys.write_text(key_table("bot", SECRET, ["speak", "read", "admin"]))
    srv = DefaultServer(
        home / "srv",
        "--api-keys-file",
        str(keys),
        "--url-signing-secret",
        SIGNING,
        "--log-format",
        "json",
    )
    with srv.serving():
        yield srv
    assert SECRET not in srv.logs() and SIGNING not in srv.logs()


def speech(text: str, **fields: object) -> dict[str, object]:
    return {"model": "piper", "voice": "joe", "input": text, "response_format": "wav", **fields}


def test_it_runs_what_auto_chose(server: DefaultServer) -> None:
    logs = server.logs()
    assert server.gateways == usable_cores()
    assert logs.count("voxgate ready on") == server.gateways
    assert "synthesis pool ready" in logs
    assert "event loop: uvloop" in logs


async def test_every_process_is_ready_and_guards_its_routes(server: DefaultServer) -> None:
    for _ in range(NEW_CONNECTIONS):
        status, _, body = await server.request("GET", "/readyz")
        assert status == 200 and json.loads(body)["status"] == "ready"
        status, _, _ = await server.request("POST", "/v1/audio/speech", json=speech("Hi."))
        assert status == 401


async def test_a_miss_is_made_once_for_the_host_and_every_process_hits_it(
    server: DefaultServer,
) -> None:
    text = "Your call is important to us. Please stay on the line."
    before = syntheses(await scrape(server))
    # Whole (a miss of two sentences streams by default, and a streamed WAV's header differs).
    status, headers, first = await server.request(
        "POST", "/v1/audio/speech", headers=AUTH, json=speech(text, stream=False)
    )
    assert status == 200 and headers["X-Cache"] == "MISS"
    for _ in range(NEW_CONNECTIONS):
        status, headers, again = await server.request(
            "POST", "/v1/audio/speech", headers=AUTH, json=speech(text)
        )
        assert status == 200 and headers["X-Cache"] == "HIT" and again == first
    # Any process's /metrics is the host's sum: two sentences, synthesized once each.
    assert syntheses(await scrape(server)) - before == 2


async def test_identical_concurrent_misses_say_miss_once_for_one_synthesis(
    server: DefaultServer,
) -> None:
    """Eight identical misses at once, each on a new connection (so both gateway processes
    lead a production of their own): the host's pool runs one synthesis, and only the response
    whose request started it says MISS; the others joined it.

    The synthesis processes are stopped (SIGSTOP) until all eight requests are waiting on a
    rendition in the making (``voxgate_rendition_waiters``), so none can arrive after the
    synthesis is done and be a HIT instead, however slow the machine."""
    text = "While every agent is busy, please stay on the line and we will answer in turn."
    before = syntheses(await scrape(server))
    held = synthesis_processes(server.proc.pid)
    assert held, "no synthesis process found under the server"
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        answers = [
            asyncio.ensure_future(
                server.request("POST", "/v1/audio/speech", headers=AUTH, json=speech(text))
            )
            for _ in range(8)
        ]

        async def waiting() -> float:
            return metric_sum(await scrape(server), "voxgate_rendition_waiters")

        await eventually(waiting, lambda n: n == 8, what="eight requests following one text")
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
    done = await asyncio.gather(*answers)
    assert all(status == 200 for status, _, _ in done)
    assert len({body for _, _, body in done}) == 1
    labels = sorted(headers["X-Cache"] for _, headers, _ in done)
    assert labels == ["COALESCED"] * 7 + ["MISS"]
    assert syntheses(await scrape(server)) - before == 1


def synthesis_processes(root: int) -> list[int]:
    """The processes under ``root`` that multiprocessing spawned (the host's synthesis pool and
    its engine workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmdline:
                found.append(pid)
    return found


async def test_metrics_count_every_process_s_requests(server: DefaultServer) -> None:
    before = requests_to(await scrape(server), "/v1/voices")
    for _ in range(NEW_CONNECTIONS):
        assert (await server.request("GET", "/v1/voices", headers=AUTH))[0] == 200

    async def counted() -> float:
        return requests_to(await scrape(server), "/v1/voices")

    # Each process flushes its tallies within 0.1 s (and before each collection of its own).
    await eventually(counted, lambda n: n == before + NEW_CONNECTIONS, what="requests counted")


async def test_streamed_and_sse_answers(server: DefaultServer) -> None:
    text = "Thank you for waiting. An agent will answer shortly. Goodbye."
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            server.url + "/v1/audio/speech",
            headers=AUTH,
            json=speech(text, response_format="pcm", stream=True),
        ) as resp,
    ):
        assert resp.status == 200 and resp.headers["X-Cache"] == "MISS"
        assert resp.headers.get("Transfer-Encoding") == "chunked"
        chunks = [chunk async for chunk in resp.content.iter_any()]
    streamed = b"".join(chunks)
    assert len(streamed) % 2 == 0 and len(streamed) > 24000  # PCM16 at 24 kHz, over 0.5 s
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            server.url + "/v1/audio/speech",
            headers=AUTH,
            json=speech(text, response_format="pcm", stream_format="sse"),
        ) as resp,
    ):
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        events = [
            json.loads(line[len(b"data: ") :])
            for line in (await resp.read()).splitlines()
            if line.startswith(b"data: ")
        ]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    # The stored answer, now a hit, is the same audio the stream carried.
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == streamed


async def test_say_urls_plain_and_signed(server: DefaultServer) -> None:
    path = f"/v1/say/joe/{quote('Press one for sales.', safe='')}.ulaw"
    status, headers, plain = await server.request("GET", path, headers=AUTH)
    assert status == 200 and headers["Content-Type"] == "audio/basic"
    status, _, body = await server.request(
        "POST",
        "/v1/say/sign",
        headers=AUTH,
        json={"voice": "joe", "text": "Press one for sales.", "ext": "ulaw", "expires_in": 600},
    )
    assert status == 200
    signed = json.loads(body)["path"]
    for _ in range(NEW_CONNECTIONS):  # no key: the URL authorizes itself, on every process
        status, headers, again = await server.request("GET", signed)
        assert status == 200 and again == plain and headers["X-Cache"] == "HIT"


async def test_jambonz_http_and_stream(server: DefaultServer) -> None:
    status, _, body = await server.request(
        "POST",
        "/v1/jambonz/tts",
        headers=AUTH,
        json={"text": "Welcome to support.", "voice": "joe", "language": "en-US", "type": "text"},
    )
    assert status == 200
    assert len(body) > 1000
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            server.url + "/v1/jambonz/stream?voice=joe&language=en-US&sampleRate=8000",
            headers=AUTH,
        ) as ws,
    ):
        hello = await ws.receive_json(timeout=60)
        assert hello == {"type": "connect", "data": {"sample_rate": 8000, "base64_encoding": False}}
        await ws.send_json({"type": "stream", "text": "Your order has shipped."})
        await ws.send_json({"type": "flush"})
        audio = await ws.receive(timeout=60)
        assert audio.type == aiohttp.WSMsgType.BINARY
        assert len(audio.data) % 2 == 0 and len(audio.data) > 8000  # over half a second at 8 kHz
        await ws.send_json({"type": "stop"})


async def scrape(server: DefaultServer) -> str:
    status, _, body = await server.request("GET", "/metrics", headers=AUTH)
    assert status == 200
    return body.decode()


def syntheses(text: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^voxgate_syntheses_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', text, re.M
        )
    )


def requests_to(text: str, route: str) -> float:
    pattern = rf'^voxgate_http_requests_total\{{[^}}]*route="{re.escape(route)}"[^}}]*\}} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


async def test_with_keys_on_every_repeat_is_checked(server: DefaultServer) -> None:
    """A kept connection repeating a keyed request: each one goes through the key check (none is
    answered from its bytes while keys are on), and a repeat without the key is refused."""
    body = speech("Thank you for holding.")
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(server.url, connector=connector) as session:
        for _ in range(4):
            async with session.post("/v1/audio/speech", headers=AUTH, json=body) as r:
                assert r.status == 200
                await r.read()
        async with session.post("/v1/audio/speech", json=body) as r:
            assert r.status == 401
    assert metric_sum(await scrape(server), "voxgate_fast_hits_total") == 0
