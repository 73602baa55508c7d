"""The lean RESP reader (cache/resp.py): its parser on every way a reply stream can be cut, its
pipelining and failure handling, and the real thing against a real redis-server (AUTH, SELECT,
restarts, a server that never answers)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError

from bench.harness import RedisServer, free_port, redis_server
from cache.entry import CorruptEntry, Entry
from cache.redis_tier import RedisTier
from cache.resp import ReplyTooLarge, RespProtocol, RespReader, encode_command
from cache.tier import TierError
from metrics import Metrics
from tests.support import SECRET, until

# One pytest-xdist worker runs the whole module: its tests share one module-scoped redis-server.
pytestmark = pytest.mark.xdist_group("resp")

BIG = os.urandom(300_000)  # larger than the scratch buffer: received into a buffer of its own


class FakeTransport:
    """Enough of an asyncio transport for the protocol: records writes, knows if closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def connected() -> tuple[RespProtocol, FakeTransport]:
    proto, transport = RespProtocol(), FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, transport


def feed(proto: RespProtocol, data: bytes, cuts: Iterator[int]) -> None:
    """Deliver ``data`` the way a socket would: into the protocol's buffers, in pieces."""
    pos = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        assert len(buf) > 0, "the protocol must always offer room"
        n = min(len(buf), len(data) - pos, next(cuts))
        buf[:n] = data[pos : pos + n]
        proto.buffer_updated(n)
        pos += n


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


STREAM = [
    (b"+OK\r\n", "OK"),
    (b":42\r\n", 42),
    (b"$-1\r\n", None),
    (bulk(b"small"), b"small"),
    (bulk(b""), b""),
    (bulk(BIG), BIG),
    (b"-WRONGTYPE wrong kind of value\r\n", ResponseError),
    (bulk(b"a\r\nb"), b"a\r\nb"),  # CRLF inside a value is data
    (bulk(BIG[:70_000]), BIG[:70_000]),
]


def cut_patterns() -> Iterator[tuple[str, list[int]]]:
    yield "whole", [1 << 30]
    for size in (1, 2, 3, 5, 7, 4095, 4096, 8191, 8192, 8193, 65536):
        yield f"every {size} bytes", [size]
    rng = random.Random(7)
    for i in range(5):
        yield f"random {i}", [rng.randint(1, 90_000) for _ in range(200)]


@pytest.mark.parametrize(("name", "pattern"), list(cut_patterns()), ids=lambda x: str(x)[:20])
async def test_replies_parse_the_same_however_the_stream_is_cut(
    name: str, pattern: list[int]
) -> None:
    proto, _ = connected()
    waiters = [proto.request(b"X") for _ in STREAM]
    data = b"".join(raw for raw, _ in STREAM)

    def cuts() -> Iterator[int]:
        while True:
            yield from pattern

    feed(proto, data, cuts())
    for waiter, (_, expected) in zip(waiters, STREAM, strict=True):
        assert waiter.done(), name
        got = waiter.result()
        if expected is ResponseError:
            assert isinstance(got, ResponseError) and "WRONGTYPE" in str(got)
        elif isinstance(expected, bytes):
            assert bytes(got) == expected
        else:
            assert got == expected


async def test_decode_runs_as_the_reply_lands_and_its_error_goes_to_its_caller() -> None:
    proto, _ = connected()
    seen: list[int] = []

    def decode(view: memoryview) -> int:
        seen.append(len(view))
        if len(view) == 3:
            raise CorruptEntry("bad")
        return len(view)

    first = proto.request(b"X", decode)
    bad = proto.request(b"X", decode)
    status = proto.request(b"X", decode)  # a bulk was expected: a status line is an error
    missing = proto.request(b"X", decode)
    feed(proto, bulk(BIG) + bulk(b"abc") + b"+OK\r\n" + b"$-1\r\n", iter(lambda: 50_000, 0))
    assert first.result() == len(BIG)
    assert isinstance(bad.exception(), CorruptEntry)
    assert isinstance(status.exception(), InvalidResponse)
    assert missing.result() is None  # nil is not decoded
    assert seen == [len(BIG), 3]


async def test_a_cancelled_requests_reply_is_dropped_and_the_next_gets_its_own() -> None:
    proto, _ = connected()
    first, second = proto.request(b"X"), proto.request(b"X")
    first.cancel()
    feed(proto, bulk(b"one") + bulk(b"two"), iter(lambda: 1 << 20, 0))
    assert bytes(second.result()) == b"two"


async def test_a_large_buffer_is_reused_only_when_nothing_holds_a_view_of_it() -> None:
    proto, _ = connected()
    other = os.urandom(len(BIG))
    kept = proto.request(b"X", lambda view: view[:10])  # keeps a view of the buffer
    feed(proto, bulk(BIG), iter(lambda: 1 << 20, 0))
    view = kept.result()
    copied = proto.request(b"X", bytes)
    feed(proto, bulk(other), iter(lambda: 1 << 20, 0))
    assert bytes(view) == BIG[:10], "a view handed out must never be overwritten"
    assert copied.result() == other
    again = proto.request(b"X", bytes)  # the last buffer is free now: reused, same result
    feed(proto, bulk(BIG), iter(lambda: 1 << 20, 0))
    assert again.result() == BIG and bytes(view) == BIG[:10]


@pytest.mark.parametrize(
    "garbage",
    [
        b"*1\r\n$1\r\na\r\n",
        b"$abc\r\n",
        b":x\r\n",
        b"$3\r\nabcXY",
        b"?\r\n",
        b"+" + b"x" * 20_000,
        # Lengths and integers Redis never writes, though int() would take them:
        b"$ 3\r\nabc\r\n",
        b"$3 \r\nabc\r\n",
        b"$+3\r\nabc\r\n",
        b"$03\r\nabc\r\n",
        b"$1_0\r\n0123456789\r\n",
        b"$-2\r\n",
        b"$-0\r\n",
        b"$\xd9\xa3\r\nabc\r\n",  # an Arabic-Indic 3
        b"$" + b"9" * 19 + b"\r\n",
        b":+1\r\n",
        b": 1\r\n",
        b":1_000\r\n",
        b":01\r\n",
        b":" + b"9" * 400 + b"\r\n",
    ],
)
async def test_a_reply_it_cannot_parse_fails_everything_in_flight_and_closes(
    garbage: bytes,
) -> None:
    proto, transport = connected()
    waiters = [proto.request(b"X"), proto.request(b"X")]
    feed(proto, garbage, iter(lambda: 1 << 20, 0))
    assert transport.closed
    for waiter in waiters:
        assert isinstance(waiter.exception(), InvalidResponse)


async def test_a_reply_nobody_asked_for_is_a_protocol_error() -> None:
    proto, transport = connected()
    feed(proto, b"+OK\r\n", iter(lambda: 1 << 20, 0))
    assert transport.closed


async def test_a_lost_connection_fails_what_is_in_flight_and_refuses_more() -> None:
    proto, _ = connected()
    waiter = proto.request(b"X")
    proto.connection_lost(ConnectionResetError("reset"))
    assert isinstance(waiter.exception(), RedisConnectionError)
    assert not proto.usable
    with pytest.raises(RedisConnectionError):
        proto.request(b"X")


def test_commands_are_encoded_as_arrays_of_bulk_strings() -> None:
    assert (
        encode_command(b"GET", "k\u00e9", 5) == b"*3\r\n$3\r\nGET\r\n$3\r\nk\xc3\xa9\r\n$1\r\n5\r\n"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h:6380/2", {"host": "h", "port": 6380, "db": 2, "password": None}),
        ("redis://user:p%40ss@h/0", {"host": "h", "username": "user", "password": "p@ss"}),
        ("redis://:secret@h", {"host": "h", "port": 6379, "username": None, "password": "secret"}),
        ("unix:///tmp/r.sock?db=3", {"path": "/tmp/r.sock", "db": 3}),
        ("rediss://h:6380", None),  # TLS: redis-py reads
        ("redis+cluster://h:7000", None),
        ("redis+sentinel://h:26379/mymaster", None),
    ],
)
def test_which_urls_the_reader_takes_and_how_it_reads_them(
    url: str, expected: dict[str, object] | None
) -> None:
    reader = RespReader.for_url(url)
    if expected is None:
        assert reader is None
        return
    assert reader is not None
    for name, value in expected.items():
        assert getattr(reader, name) == value, name


# ---- against a real redis-server ------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server with a default-user password and an ACL user."""
    directory = tmp_path_factory.mktemp("redis-auth")
    with redis_server(directory) as server:  # password set once it is up (its probe has none)
        with contextlib.closing(socket.create_connection(("127.0.0.1", server.port))) as s:
            s.sendall(
                encode_command(b"ACL", b"SETUSER", b"app", b"on", b">apppw", b"~*", b"+@all")
                + encode_command(b"CONFIG", b"SET", b"requirepass", b"s3cret")
            )
            reply = b""
            while reply.count(b"\r\n") < 2:
                reply += s.recv(100)
            assert reply == b"+OK\r\n+OK\r\n", reply
        yield server


async def seed(
    port: int, key: str, value: bytes, *, password: str | None = None, db: int = 0
) -> None:
    client = aioredis.Redis(port=port, password=password, db=db)
    await client.set(key, value)
    await client.aclose()


@pytest.mark.parametrize(
    "credentials", [":s3cret@", "app:apppw@", "default:s3cret@"], ids=["password", "acl", "default"]
)
async def test_auth_and_select_against_a_real_server(
    secured: RedisServer, credentials: str
) -> None:
    await seed(secured.port, "k", BIG, password="s3cret", db=5)
    reader = RespReader.for_url(f"redis://{credentials}127.0.0.1:{secured.port}/5")
    assert reader is not None
    try:
        assert await reader.get(b"k", bytes) == BIG
        assert await reader.get(b"absent", bytes) is None
        results = await asyncio.gather(*(reader.get(b"k", len) for _ in range(50)))
        assert results == [len(BIG)] * 50  # pipelined on one connection, in order
    finally:
        await reader.close()


async def test_a_wrong_password_is_an_error_not_a_hang(secured: RedisServer) -> None:
    reader = RespReader.for_url(f"redis://:nope@127.0.0.1:{secured.port}")
    assert reader is not None
    with pytest.raises(ResponseError):
        await asyncio.wait_for(reader.get(b"k", bytes), 5)
    await reader.close()


async def test_the_reader_reconnects_after_redis_restarts(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r")
    server.start()
    try:
        await seed(server.port, "k", b"v1")
        reader = RespReader(port=server.port)
        assert await reader.get(b"k", bytes) == b"v1"
        server.stop()
        with pytest.raises((RedisConnectionError, OSError)):
            await reader.get(b"k", bytes)
        server.start()
        await seed(server.port, "k", b"v2")
        assert await reader.get(b"k", bytes) == b"v2"
        await reader.close()
    finally:
        server.stop()


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts, reads and never answers (a hung Redis)."""
    connections: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", free_port())
    port = server.sockets[0].getsockname()[1]
    yield port
    for writer in connections:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_hung_redis_times_out_as_a_tier_error_and_drops_the_connection(
    silent_server: int,
) -> None:
    metrics = Metrics()
    tier = RedisTier.from_url(
        f"redis://127.0.0.1:{silent_server}", secret=SECRET, timeout_s=0.2, metrics=metrics
    )
    assert tier.reader is not None
    with pytest.raises(TierError):
        await tier.get("ab" * 32)
    assert metrics.redis_errors.labels("get")._value.get() == 1
    conn = tier.reader._conn
    assert conn is not None and not conn.usable, "a timed-out connection is not reused"
    await tier.close()


async def test_tier_reads_the_same_with_and_without_the_lean_reader(tmp_path: Path) -> None:
    with redis_server(tmp_path / "r") as server:
        url = server.url
        lean = RedisTier.from_url(url, secret=SECRET, timeout_s=5.0)
        plain = RedisTier.from_url(url, secret=SECRET, lean_reads=False, timeout_s=5.0)
        assert lean.reader is not None and plain.reader is None
        try:
            stored = Entry.create(
                BIG, content_type="audio/wav", fmt="wav", sample_rate=22050, voice="joe"
            )
            await lean.put("k1", stored)
            assert await lean.get("k1") == stored == await plain.get("k1")
            assert await lean.get("k2") is None and await plain.get("k2") is None
            raw = bytearray(await plain.client.get(plain.entry_key("k1")))
            raw[-1] ^= 1
            await plain.client.set(plain.entry_key("k1"), bytes(raw))
            for tier in (lean, plain):
                with pytest.raises(CorruptEntry):
                    await tier.get("k1")
        finally:
            await lean.close()
            await plain.close()


async def test_a_request_cancelled_early_leaves_the_others_on_the_connection_alone(
    silent_server: int,
) -> None:
    """A client that goes away cancels its own GET, not the 15 pipelined with it."""
    reader = RespReader(port=silent_server, stall_s=5.0)
    others = [asyncio.ensure_future(reader.get(b"k", bytes)) for _ in range(15)]
    mine = asyncio.ensure_future(reader.get(b"k", bytes))
    # All 16 are sent and waiting for their replies on the one connection: mine is cancelled
    # mid-flight, not before it was written.
    await until(lambda: reader._conn is not None and len(reader._conn._waiters) == 16)
    mine.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await mine
    conn = reader._conn
    assert conn is not None and conn.usable
    assert not any(t.done() for t in others)
    for t in others:
        t.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    await reader.close()


async def test_a_unix_socket_url_reads_over_the_socket(tmp_path: Path) -> None:
    sock = tmp_path / "r" / "redis.sock"
    with redis_server(tmp_path / "r", extra=["--unixsocket", str(sock)]) as server:
        await seed(server.port, "k", BIG)
        reader = RespReader.for_url(f"unix://{sock}?db=0")
        assert reader is not None and reader.path == str(sock)
        try:
            assert await reader.get(b"k", bytes) == BIG
        finally:
            await reader.close()


def test_one_reader_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    """`voxgate say` and tests run a loop each; a reader used by an earlier loop reconnects."""
    with redis_server(tmp_path / "r") as server:
        asyncio.run(seed(server.port, "k", b"v"))
        reader = RespReader(port=server.port)
        for _ in range(2):
            assert asyncio.run(reader.get(b"k", bytes)) == b"v"
        asyncio.run(reader.close())


async def test_a_corrupt_entry_read_by_the_lean_reader_counts_as_redis_answering(
    tmp_path: Path,
) -> None:
    """The reader unframes as the reply lands, so CorruptEntry comes out of the guarded call:
    a half-open breaker must still close on it (Redis answered), not wait out another probe."""
    with redis_server(tmp_path / "r") as server:
        tier = RedisTier.from_url(
            server.url, secret=SECRET, breaker_failures=1, breaker_reset_s=0.05, timeout_s=5.0
        )
        try:
            await tier.client.set(tier.entry_key("k"), b"VXR2garbage-that-is-no-frame")
            tier.breaker.failure()  # open
            await asyncio.sleep(0.06)  # half-open: the next call is the probe
            with pytest.raises(CorruptEntry):
                await tier.get("k")
            assert tier.state() == "closed"
        finally:
            await tier.close()


# ---- hostile replies -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "pattern"), list(cut_patterns()), ids=lambda x: str(x)[:20])
async def test_a_bulk_reply_over_the_bound_is_refused_unallocated_and_read_past(
    name: str, pattern: list[int]
) -> None:
    """The oversized reply fails its own request; the replies after it parse as usual and the
    connection stays in step. The protocol never offers more than its scratch buffer."""
    proto, transport = RespProtocol(max_bulk=1000), FakeTransport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    waiters = [proto.request(b"X") for _ in range(3)]
    data = bulk(b"x" * 5000) + bulk(b"small") + b"+OK\r\n"
    cuts = itertools.cycle(pattern)
    pos, offered = 0, 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        offered = max(offered, len(buf))
        n = min(len(buf), len(data) - pos, next(cuts))
        buf[:n] = data[pos : pos + n]
        proto.buffer_updated(n)
        pos += n
    assert isinstance(waiters[0].exception(), ReplyTooLarge)
    assert bytes(waiters[1].result()) == b"small"
    assert waiters[2].result() == "OK"
    assert not transport.closed
    assert offered <= 8192


@contextlib.asynccontextmanager
async def replying_server(reply: bytes) -> AsyncIterator[int]:
    """A tiny TCP server that answers every read with ``reply`` (a Redis gone bad)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            writer.write(reply)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("max_bulk", [16 * 1024 * 1024, None], ids=["entry-bound", "default"])
async def test_a_declared_length_of_2_gb_is_refused_before_anything_is_allocated(
    max_bulk: int | None,
) -> None:
    """``$2000000000`` made the reader allocate 1.9 GB and stall the loop 0.9 s."""
    async with replying_server(b"$2000000000\r\n") as port:
        kw = {} if max_bulk is None else {"max_bulk": max_bulk}
        reader = RespReader(port=port, stall_s=5.0, **kw)
        tracemalloc.start()
        try:
            with pytest.raises(ReplyTooLarge):
                await asyncio.wait_for(reader.get(b"k", bytes), 30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            await reader.close()
    # Nothing was allocated for it (what stalled the loop was the allocation): measured in
    # bytes, not in time, so a loaded machine cannot fail it.
    assert peak < 4 * 1024 * 1024


@pytest.mark.parametrize(
    "reply", [b"$ 5\r\nhello\r\n", b"$5\xc2\xb2\r\nhello\r\n", b"$-7\r\n", b":1e3\r\n"]
)
async def test_a_hostile_length_line_from_the_server_is_a_protocol_error(reply: bytes) -> None:
    async with replying_server(reply) as port:
        reader = RespReader(port=port, stall_s=5.0)
        try:
            with pytest.raises(InvalidResponse):
                await asyncio.wait_for(reader.get(b"k", bytes), 5)
            conn = reader._conn
            assert conn is not None and not conn.usable, "an out-of-step connection is dropped"
        finally:
            await reader.close()


async def test_a_planted_value_over_the_entry_bound_is_a_corrupt_entry(tmp_path: Path) -> None:
    """A value larger than ``redis_max_entry_mb`` (a gateway never writes one) is refused by the
    lean reader before it allocates, as a corrupt entry (deleted by the store), not a failing
    Redis: the breaker stays closed."""
    with redis_server(tmp_path / "r") as server:
        tier = RedisTier.from_url(
            server.url,
            secret=SECRET,
            max_entry_bytes=1024 * 1024,
            breaker_failures=1,
            timeout_s=5.0,
        )
        assert tier.reader is not None and tier.reader.max_bulk == 1024 * 1024
        try:
            await tier.client.set(tier.entry_key("k"), b"VXR2" + os.urandom(2 * 1024 * 1024))
            with pytest.raises(CorruptEntry):
                await tier.get("k")
            assert tier.state() == "closed"
            stored = Entry.create(
                BIG, content_type="audio/wav", fmt="wav", sample_rate=22050, voice="joe"
            )
            await tier.put("k2", stored)
            assert await tier.get("k2") == stored  # the connection is still in step
        finally:
            await tier.close()
