"""ETag / If-None-Match (304), Range (206 / 416) and Content-Length on audio responses."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.conditional import RangeError, parse_range
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

BODY = {"model": "tts-1", "input": "Please hold.", "voice": "alloy", "response_format": "wav"}


async def stored(client: Any) -> tuple[str, bytes]:
    r = await client.post("/v1/audio/speech", json=BODY)
    assert r.status == 200
    return r.headers["X-Audio-Key"], bytes(await r.read())


async def test_if_none_match_on_speech_is_304_without_synthesis(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    key, data = await stored(client)
    etag = f'"{key}"'
    for header in (etag, f"W/{etag}", f'"other", {etag}'):
        r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": header})
        assert r.status == 304, header
        assert r.headers["ETag"] == etag
        assert await r.read() == b""
    r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": '"other"'})
    assert r.status == 200
    assert await r.read() == data
    # `*` asks whether anything is stored: not answered from the key alone on the speech endpoint.
    r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": "*"})
    assert r.status == 200
    # The 304 comes from the key alone: a client holding a key's audio needs no synthesis.
    fresh = {**BODY, "input": "Never asked before."}
    probe = await client.post("/v1/audio/speech", json=fresh)
    fresh_key = probe.headers["X-Audio-Key"]
    items = counting_engine.items
    r = await client.post(
        "/v1/audio/speech", json=fresh, headers={"If-None-Match": f'"{fresh_key}"'}
    )
    assert r.status == 304
    assert counting_engine.items == items


async def test_audio_by_key_etag_and_ranges(gateway: GatewayFactory) -> None:
    client = await gateway()
    key, data = await stored(client)
    url = f"/v1/audio/{key}"
    full = await client.get(url)
    assert full.status == 200
    assert full.headers["Accept-Ranges"] == "bytes"
    assert int(full.headers["Content-Length"]) == len(data)
    assert "immutable" in full.headers["Cache-Control"]
    assert await full.read() == data

    r = await client.get(url, headers={"If-None-Match": f'"{key}"'})
    assert r.status == 304
    r = await client.get(url, headers={"If-None-Match": "*"})
    assert r.status == 304

    n = len(data)
    for spec, first, last in (
        ("bytes=0-43", 0, 43),
        ("bytes=100-", 100, n - 1),
        ("bytes=-500", n - 500, n - 1),
        (f"bytes=10-{n + 1000}", 10, n - 1),
    ):
        r = await client.get(url, headers={"Range": spec})
        assert r.status == 206, spec
        assert r.headers["Content-Range"] == f"bytes {first}-{last}/{n}"
        assert int(r.headers["Content-Length"]) == last - first + 1
        assert await r.read() == data[first : last + 1]

    r = await client.get(url, headers={"Range": f"bytes={n}-"})
    assert r.status == 416
    assert r.headers["Content-Range"] == f"bytes */{n}"
    assert (await r.json())["error"]["code"] == "range_not_satisfiable"

    # If-Range with another validator: the whole entity, not the range.
    r = await client.get(url, headers={"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert r.status == 200
    assert await r.read() == data
    r = await client.get(url, headers={"Range": "bytes=0-9", "If-Range": f'"{key}"'})
    assert r.status == 206
    # Several ranges: answered whole (allowed by RFC 9110).
    r = await client.get(url, headers={"Range": "bytes=0-9,20-29"})
    assert r.status == 200


async def test_content_length_on_every_non_streamed_response(gateway: GatewayFactory) -> None:
    client = await gateway()
    key, _ = await stored(client)
    responses = [
        await client.post("/v1/audio/speech", json=BODY),
        await client.post("/v1/audio/speech", json={**BODY, "response_format": "mp3"}),
        await client.get(f"/v1/audio/{key}"),
        await client.get("/synthesize", params={"text": "Please hold."}),
        await client.get("/api/tts", params={"text": "Please hold."}),
        await client.post("/v1/audio/speech", json={**BODY, "voice": "nobody"}),
        await client.get(f"/v1/audio/{'0' * 64}"),
        await client.get("/openapi.json"),
        await client.get("/v1/voices"),
    ]
    for r in responses:
        body = await r.read()
        assert int(r.headers["Content-Length"]) == len(body), r.url
        assert "Transfer-Encoding" not in r.headers


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-0", 10, (0, 0)),
        ("bytes=5-", 10, (5, 9)),
        ("bytes=-3", 10, (7, 9)),
        ("bytes=-30", 10, (0, 9)),
        ("bytes=3-1", 10, None),
        ("items=0-1", 10, None),
        ("bytes=a-b", 10, None),
        ("bytes=-", 10, None),
    ],
)
def test_parse_range(header: str, size: int, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == expected


@pytest.mark.parametrize("header", ["bytes=10-", "bytes=-0", "bytes=20-30"])
def test_unsatisfiable_ranges(header: str) -> None:
    with pytest.raises(RangeError):
        parse_range(header, 10)
