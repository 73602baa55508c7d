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

# A key per way of streaming: each spends its own minute's budget.
SECRETS = {how: canary(f"charging-served-{how}") for how in ("audio", "sse")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DefaultServer]:
    home = tmp_path_factory.mktemp("charging")
    keys = home / "keys.toml"
    keys.write_text(
        "\n".join(
            key_table(f"bot-{how}", secret, ["speak"], chars_per_minute=120)
            for how, secret in SECRETS.items()
        )
    )
    with DefaultServer(home / "srv", "--api-keys-file", str(keys)).serving() as srv:
        yield srv


def streamed(text: str, how: str) -> dict[str, object]:
    asked: dict[str, object] = {"stream": True} if how == "audio" else {"stream_format": how}
    return {"model": "piper", "voice": "joe", "input": text, "response_format": "pcm", **asked}


@pytest.mark.parametrize(("how", "day"), [("audio", "Monday"), ("sse", "Friday")])
async def test_a_stream_that_would_cross_chars_per_minute_is_a_429_before_it_starts(
    server: DefaultServer, how: str, day: str
) -> None:
    """Chunked audio (``stream: true``) and server-sent events (``stream_format: "sse"``)
    alike: both start with a 200 that cannot be taken back. (Texts of their own: a hit is free.)"""
    auth = {"Authorization": f"Bearer {SECRETS[how]}"}
    await clear_of_a_minute_edge()
    first = f"The first order has shipped. It arrives on {day}. Thanks for waiting."
    status, _, body = await server.request(
        "POST", "/v1/audio/speech", json=streamed(first, how), headers=auth
    )
    assert status == 200 and len(body) > 8000
    # 71 + 68 > 120: the whole text is refused, before any of it is spoken.
    second = f"Your second order is packed. It leaves on {day}. We will email you."
    status, headers, body = await server.request(
        "POST", "/v1/audio/speech", json=streamed(second, how), headers=auth
    )
    assert status == 429
    assert float(headers["Retry-After"]) >= 1
    assert json.loads(body)["error"]["code"] == "chars_per_minute"
