"""A client's jambonz sockets against `voxgate serve` as a user starts it (no topology flags): its
sockets land on any gateway process, and the rendition share they take is the host's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.served import DefaultServer

STREAM = "/v1/jambonz/stream?voice=joe&language=en-US&sampleRate=8000"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    # A share of 2 renditions: four sockets of 8 sentences are 16 times it.
    srv = DefaultServer(tmp_path_factory.mktemp("jambonz") / "srv", "--renders-per-client", "2")
    with srv.serving():
        yield srv


async def sentences_heard(server: DefaultServer, n: int) -> list[int]:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(server.url + STREAM) as ws,
    ):
        assert (await ws.receive_json(timeout=60))["type"] == "connect"
        for word in WORDS:
            await ws.send_json({"type": "stream", "text": f"Line {word} of socket {WORDS[n]}. "})
        await ws.send_json({"type": "flush"})
        sizes = []
        for _ in WORDS:
            message = await ws.receive(timeout=120)
            sizes.append(len(message.data) if message.type == aiohttp.WSMsgType.BINARY else 0)
        await ws.send_json({"type": "stop"})
        return sizes


async def test_every_sentence_of_a_clients_sockets_is_spoken(server: DefaultServer) -> None:
    heard = await asyncio.gather(*(sentences_heard(server, n) for n in range(4)))
    # Every sentence got audio (over a quarter second of 8 kHz PCM16), none an error.
    assert [sum(size > 4000 for size in sizes) for sizes in heard] == [8] * 4
    assert "never retrieved" not in server.logs()
    assert "render_share" not in server.logs()
