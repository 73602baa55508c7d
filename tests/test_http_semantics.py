"""ETag / If-None-Match (304), Range (206 / 416) and Content-Length on audio responses, with
the ``fast_path`` setting on and off (tests/conftest.py): the same answers both ways."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from cache.entry import Entry
from gateway.http import keys
from gateway.http.conditional import RangeError, parse_range
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

BODY = {"model": "tts-1", "input": "Please hold.", "voice": "alloy", "response_format": "wav"}

pytestmark = pytest.mark.fast_path(True, False)


def body_etag(data: bytes) -> str:
    """The ETag of these bytes: the first 128 bits of their SHA-256."""
    return f'"{hashlib.sha256(data).hexdigest()[:32]}"'


async def stored(client: Any) -> tuple[str, bytes]:
    r = await client.post("/v1/audio/speech", json=BODY)
    assert r.status == 200
    return r.headers["X-Audio-Key"], bytes(await r.read())


async def test_if_none_match_on_speech_is_304_without_synthesis(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    first = await client.post("/v1/audio/speech", json=BODY)
    key, data, etag = first.headers["X-Audio-Key"], await first.read(), first.headers["ETag"]
    assert etag == body_etag(data)  # the ETag names the bytes, not the content address
    items = counting_engine.items
    for header in (etag, f"W/{etag}", f'"other", {etag}'):
        r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": header})
        assert r.status == 304, header
        assert r.headers["ETag"] == etag
        assert await r.read() == b""
    r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": '"other"'})
    assert r.status == 200
    assert await r.read() == data
    assert counting_engine.items == items  # answered from the stored entry, no synthesis
    # The content address is not an ETag: a client holding `"<key>"` holds no known bytes.
    r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": f'"{key}"'})
    assert r.status == 200
    # Once other bytes are stored under the key (another replica's, a synthesis after an
    # eviction), the old ETag no longer matches: the client gets the bytes held now.
    store = client.app[keys.STORE]
    found = await store.get(key)
    assert found is not None
    other = Entry.create(
        data[:-2] + b"\x01\x00",
        content_type="audio/wav",
        fmt="wav",
        sample_rate=found.entry.meta.sample_rate,
        model=found.entry.meta.model,
    )
    await store.put(key, other)
    r = await client.post("/v1/audio/speech", json=BODY, headers={"If-None-Match": etag})
    assert r.status == 200
    assert await r.read() == other.audio and r.headers["ETag"] == body_etag(other.audio) != etag


async def test_audio_by_key_etag_and_ranges(gateway: GatewayFactory) -> None:
    client = await gateway()
    key, data = await stored(client)
    url = f"/v1/audio/{key}"
    full = await client.get(url)
    assert full.status == 200
    assert full.headers["Accept-Ranges"] == "bytes"
    assert int(full.headers["Content-Length"]) == len(data)
    # Long-lived but not immutable: another replica may hold other bytes for the key.
    assert full.headers["Cache-Control"] == "public, max-age=31536000"
    assert full.headers["ETag"] == body_etag(data)
    assert await full.read() == data

    r = await client.get(url, headers={"If-None-Match": body_etag(data)})
    assert r.status == 304
    r = await client.get(url, headers={"If-None-Match": f'"{key}"'})
    assert r.status == 200
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
    r = await client.get(url, headers={"Range": "bytes=0-9", "If-Range": body_etag(data)})
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
