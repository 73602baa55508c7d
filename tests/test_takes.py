"""Every new take passes one seam before it is stored: :func:`gateway.speech.takes.accept_take`.

The checks of a take's audio will live there; a path that wrote a master or a rendition into
the store any other way would store (and later serve as a HIT) audio nobody checked.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from cache.entry import Entry
from cache.store import TieredStore
from gateway.speech import takes
from tests.conftest import GatewayFactory


@pytest.fixture
def puts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, bool]]]:
    """Every store put while the test runs: (key, format, whether it came through the seam)."""
    seen: list[tuple[str, str, bool]] = []
    put = TieredStore.put
    seam = takes.accept_take.__code__

    async def watched(self: TieredStore, key: str, entry: Entry) -> None:
        frame = sys._getframe(1)
        through = False
        while frame is not None and not through:
            through = frame.f_code is seam
            frame = frame.f_back
        seen.append((key, entry.meta.format, through))
        await put(self, key, entry)

    monkeypatch.setattr(TieredStore, "put", watched)
    yield seen


async def test_a_synthesis_a_stream_and_a_transcode_store_through_the_seam(
    gateway: GatewayFactory, puts: list[tuple[str, str, bool]]
) -> None:
    client = await gateway()
    whole = {"model": "tts-1", "voice": "alloy", "input": "Good morning.", "response_format": "wav"}
    r = await client.post("/v1/audio/speech", json=whole)
    assert r.status == 200 and r.headers["X-Cache"] == "MISS"
    key = r.headers["X-Audio-Key"]
    streamed = {**whole, "input": "Your order shipped. It arrives on Friday.", "stream": True}
    r = await client.post("/v1/audio/speech", json=streamed)
    assert r.status == 200 and r.headers["X-Cache"] == "MISS"
    await r.read()
    r = await client.get(f"/v1/audio/{key}.ulaw")
    assert r.status == 200
    await r.read()
    # Three masters (flac), two renditions (wav) and one transcode (ulaw), each once.
    formats = sorted(fmt for _, fmt, _ in puts)
    assert formats == ["flac", "flac", "flac", "ulaw", "wav", "wav"]
    assert [key for key, _, through in puts if not through] == []
