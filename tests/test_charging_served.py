"""A key's chars_per_minute against `voxgate serve` as a user starts it: a streamed answer is
charged whole before its first byte, so crossing the budget is a 429, never a cut-off 200."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gateway.runtime.apikeys import key_table
from tests.canary import canary
from tests.served import DefaultServer
from tests.support import clear_of_a_minute_edge

SECRET = canary("charging-served")
AUTH = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    home = tmp_path_factory.mktemp("charging")
    keys = home / "keys.toml"
    keys.write_text(key_table("bot", SECRET, ["speak"], chars_per_minute=120))
    with DefaultServer(home / "srv", "--api-keys-file", str(keys)).serving() as srv:
        yield srv


def streamed(text: str) -> dict[str, object]:
    return {
        "model": "piper",
        "voice": "joe",
        "input": text,
        "response_format": "pcm",
        "stream": True,
    }


async def test_a_stream_that_would_cross_chars_per_minute_is_a_429_before_it_starts(
    server: DefaultServer,
) -> None:
    await clear_of_a_minute_edge()
    first = "The first order has shipped. It arrives on Monday. Thanks for waiting."  # 71
    status, _, body = await server.request(
        "POST", "/v1/audio/speech", json=streamed(first), headers=AUTH
    )
    assert status == 200 and len(body) > 8000
    # 71 + 64 > 120: the whole text is refused, before any of it is spoken.
    second = "Your second order is packed. It leaves today. We will email you."
    status, headers, body = await server.request(
        "POST", "/v1/audio/speech", json=streamed(second), headers=AUTH
    )
    assert status == 429
    assert float(headers["Retry-After"]) >= 1
    assert json.loads(body)["error"]["code"] == "chars_per_minute"
