"""A lean, pipelined RESP2 reader for the Redis tier's hot path: GET of an audio entry.

Why it exists, what it speaks, how it fails and what it measured: docs/scale-out.md, "How entries
are read". Beyond that page: redis-py's copies run socket -> StreamReader buffer -> ``read()`` ->
hiredis buffer -> ``bytes``, and it pauses and resumes the transport around the StreamReader's
buffer limit; here the kernel's copy is the only one (:class:`asyncio.BufferedProtocol`). Redis
answers in order, so each request is a future in a FIFO. A request cancelled before ``stall_s``
(the tier's timeout) leaves the connection alone: its reply is dropped when it lands, and the
requests pipelined with it are not failed for it; one cancelled later closes it, as redis-py does.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from redis.asyncio.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError


class ReplyTooLarge(InvalidResponse):
    """A bulk reply declared longer than the reader's ``max_bulk``: refused before any buffer is
    allocated for it (its bytes are read past and dropped; the connection stays in step)."""


Reply = memoryview | int | str | ResponseError | ReplyTooLarge | None
T = TypeVar("T")
Decode = Callable[[memoryview], Any]

# Replies that fit are parsed out of the scratch buffer; a larger bulk reply gets a buffer of its
# own, of its exact size, that the socket reads straight into. Kept small on purpose: the first
# read of a large reply lands here and has to be copied over.
_SCRATCH = 8 * 1024
# A status, error or length line longer than this is not a RESP2 reply we asked for.
_MAX_LINE = 4 * 1024
# Lengths and integers exactly as Redis writes them: ASCII digits, no sign but a nil's -1, no
# leading zeros, spaces or underscores (all of which int() would take), and few enough digits
# that no reply can make int() slow. A nil is "$-1"; nothing else negative is a length.
_LENGTH = re.compile(rb"-1|0|[1-9][0-9]{0,17}")
_INTEGER = re.compile(rb"-?(?:0|[1-9][0-9]{0,18})")
# The largest bulk reply taken when the caller sets no bound (redis-server's own proto-max-bulk-len
# default): a reply declaring more is out of step or hostile.
MAX_BULK = 512 * 1024 * 1024
# The buffer of a large reply is kept for the next one (see RespProtocol._body_buffer) up to this
# size; a larger one is left to the allocator.
_KEEP_BUFFER = 4 * 1024 * 1024


def _unshared(buf: bytearray) -> bool:
    """True when no view of ``buf`` is alive. A bytearray refuses to resize while exported, and
    that refusal is the only way Python shows whether it is."""
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


def encode_command(*args: bytes | str | int) -> bytes:
    """One RESP2 command: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


class RespProtocol(asyncio.BufferedProtocol):
    """One connection: requests go out in order, and each reply resolves the oldest waiter.

    Replies are bulk strings (a ``memoryview`` of a buffer the reply owns, without the trailing
    CRLF), ``None`` for a nil, ``int``, ``str`` for a status line, or a
    :class:`~redis.exceptions.ResponseError` for an error line. Arrays are not spoken here.
    """

    def __init__(self, max_bulk: int = MAX_BULK) -> None:
        # A bulk reply declared longer is refused before a buffer is allocated for it: else one
        # planted "$2000000000" would have the reader allocate and zero 2 GB on the event loop.
        self.max_bulk = max_bulk
        self._skip = 0  # bytes of a refused reply still to read past
        self._transport: asyncio.Transport | None = None
        self._waiters: collections.deque[tuple[asyncio.Future[Any], Decode | None]] = (
            collections.deque()
        )
        self._scratch = bytearray(_SCRATCH)
        self._filled = 0
        self._body: memoryview | None = None  # the bulk reply being received, CRLF included
        self._body_got = 0
        self._spare: bytearray | None = None  # the last large reply's buffer, for reuse
        self._lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            # Exactly the rest of this reply: the socket never reads past it into the next one.
            return self._body[self._body_got :]
        return memoryview(self._scratch)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._body is not None:
                self._body_got += nbytes
                if self._body_got == len(self._body):
                    body, self._body = self._body, None
                    self._deliver_bulk(body)
                return
            self._filled += nbytes
            self._parse()
        except InvalidResponse as exc:
            # Out of step with the reply stream: nothing on this connection can be trusted.
            self._fail_all(exc)
            self._body = None
            self._filled = 0
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or RedisConnectionError("Redis closed the connection")
        self._body = None
        self._fail_all(RedisConnectionError(f"Redis connection lost: {self._lost}"))

    def _fail_all(self, error: Exception) -> None:
        while self._waiters:
            waiter, _ = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    @property
    def usable(self) -> bool:
        """True while the connection is open."""
        return (
            self._transport is not None and self._lost is None and not self._transport.is_closing()
        )

    def request(self, command: bytes, decode: Decode | None = None) -> asyncio.Future[Any]:
        """Send one encoded command; the future resolves with its reply.

        With ``decode``, a bulk reply resolves the future with ``decode(view)`` instead (or
        with the exception it raised), called the moment the reply has landed: a 250 KB value
        is then checked and copied while it is still in the CPU's cache. Decoded later, after
        the replies pipelined behind it had pushed it out, it would be read from memory again.
        """
        if not self.usable or self._transport is None:
            raise RedisConnectionError("Redis connection is closed")
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.append((waiter, decode))
        self._transport.write(command)
        return waiter

    def close(self) -> None:
        """Close the connection; requests in flight fail."""
        if self._transport is not None:
            self._transport.close()

    def _parse(self) -> None:
        buf = self._scratch
        pos = 0
        while pos < self._filled:
            if self._skip:
                taken = min(self._skip, self._filled - pos)
                self._skip -= taken
                pos += taken
                continue
            end = buf.find(b"\r\n", pos, self._filled)
            if end < 0:
                if self._filled - pos > _MAX_LINE:
                    raise self._protocol_error("reply line too long")
                break
            kind = buf[pos]
            line = bytes(buf[pos + 1 : end])
            pos = end + 2
            if kind == 0x24:  # '$' bulk string
                if _LENGTH.fullmatch(line) is None:
                    raise self._protocol_error(f"bad bulk length {line[:32]!r}")
                length = int(line)
                if length < 0:
                    self._deliver(None)
                    continue
                if length > self.max_bulk:
                    self._skip = length + 2
                    self._deliver(
                        ReplyTooLarge(
                            f"bulk reply of {length} bytes is over the bound of {self.max_bulk}"
                        )
                    )
                    continue
                available = self._filled - pos
                if available >= length + 2:
                    body = buf[pos : pos + length + 2]
                    pos += length + 2
                    self._deliver_bulk(body)
                    continue
                self._body = self._body_buffer(length + 2)
                self._body[:available] = memoryview(buf)[pos : self._filled]
                self._body_got = available
                pos = self._filled
                break
            if kind == 0x2B:  # '+' status
                self._deliver(line.decode("utf-8", "replace"))
            elif kind == 0x2D:  # '-' error
                self._deliver(ResponseError(line.decode("utf-8", "replace")))
            elif kind == 0x3A:  # ':' integer
                if _INTEGER.fullmatch(line) is None:
                    raise self._protocol_error(f"bad integer {line[:32]!r}")
                self._deliver(int(line))
            else:
                raise self._protocol_error(f"unexpected reply type {chr(kind)!r}")
        # Same-size slice assignment: the transport holds a view of the buffer, so it cannot resize.
        rest = self._filled - pos
        if rest and pos:
            buf[:rest] = buf[pos : self._filled]
        self._filled = rest

    def _body_buffer(self, size: int) -> memoryview:
        """A buffer of ``size`` bytes for a large reply: the last one's when nothing holds a view
        of it any more (its decoder copied what it kept), else a new one. A fresh 250 KB
        bytearray is zero-filled and cold in the cache; a reused one is neither."""
        spare = self._spare
        if spare is None or len(spare) < size or not _unshared(spare):
            spare = bytearray(size)
            self._spare = spare if size <= _KEEP_BUFFER else None
        return memoryview(spare)[:size]

    def _deliver_bulk(self, body: memoryview | bytearray) -> None:
        if body[-2] != 0x0D or body[-1] != 0x0A:  # CRLF
            raise self._protocol_error("bulk reply not terminated by CRLF")
        self._deliver(memoryview(body)[:-2])

    def _deliver(self, reply: Reply) -> None:
        if not self._waiters:
            raise self._protocol_error("a reply nobody asked for")
        waiter, decode = self._waiters.popleft()
        if waiter.done():  # a cancelled request's reply is dropped
            return
        if isinstance(reply, ReplyTooLarge):
            waiter.set_exception(reply)
            return
        if decode is not None and isinstance(reply, memoryview):
            try:
                reply = decode(reply)
            except Exception as exc:  # the decoder's verdict goes to its caller
                waiter.set_exception(exc)
                return
        elif decode is not None and isinstance(reply, int | str):
            waiter.set_exception(InvalidResponse(f"expected a bulk reply, got {reply!r}"))
            return
        waiter.set_result(reply)

    @staticmethod
    def _protocol_error(why: str) -> InvalidResponse:
        return InvalidResponse(f"Protocol error from Redis: {why}")


@dataclass(kw_only=True, eq=False)
class RespReader:
    """GETs over one lean pipelined connection, opened on first use and reopened after a loss."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0
    stall_s: float = 0.5
    max_bulk: int = MAX_BULK
    _conn: RespProtocol | None = field(default=None, init=False, repr=False)
    _connecting: asyncio.Lock | None = field(default=None, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_url(
        cls, url: str, *, stall_s: float = 0.5, max_bulk: int = MAX_BULK
    ) -> RespReader | None:
        """A reader for a ``redis://`` or ``unix://`` URL, parsed by redis-py; else ``None``.

        ``stall_s``: a request cancelled after waiting this long closes the connection.
        ``max_bulk``: the longest bulk reply taken; a longer one raises :class:`ReplyTooLarge`.
        """
        scheme = url.split("://", 1)[0].lower()
        if scheme not in ("redis", "unix"):
            return None
        kw: dict[str, Any] = dict(parse_url(url))
        return cls(
            host=str(kw.get("host") or "localhost"),
            port=int(kw.get("port") or 6379),
            path=kw.get("path"),
            username=kw.get("username"),
            password=kw.get("password"),
            db=int(kw.get("db") or 0),
            stall_s=stall_s,
            max_bulk=max_bulk,
        )

    async def get(self, key: bytes, decode: Callable[[memoryview], T]) -> T | None:
        """``decode`` of the value at ``key`` (as it lands: :meth:`RespProtocol.request`; what it
        raises is raised here), or ``None`` when there is none. Raises a Redis error (``OSError``
        while connecting) on failure, :class:`ReplyTooLarge` for a value over ``max_bulk``."""
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is None or not conn.usable or loop is not self._loop:
            conn = await self._connect(loop)
        sent = loop.time()
        waiter = conn.request(encode_command(b"GET", key), decode)
        try:
            reply: T | None = await waiter
        except asyncio.CancelledError:
            if loop.time() - sent >= self.stall_s:
                conn.close()  # a reply this late: Redis is in trouble; start afresh
            raise
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> RespProtocol:
        if loop is not self._loop:
            # First use, or used from another loop than before (a CLI command, a test): the
            # connection and the lock of the old loop cannot be used from this one.
            if self._conn is not None and self._loop is not None and not self._loop.is_closed():
                self._conn.close()
            self._conn, self._connecting, self._loop = None, asyncio.Lock(), loop
        assert self._connecting is not None
        async with self._connecting:  # one connect at a time; the others use its result
            if self._conn is not None and self._conn.usable:
                return self._conn

            protocol = functools.partial(RespProtocol, self.max_bulk)
            if self.path:
                _, conn = await loop.create_unix_connection(protocol, self.path)
            else:
                transport, conn = await loop.create_connection(protocol, self.host, self.port)
                sock = transport.get_extra_info("socket")
                if sock is not None:  # asyncio sets it already on 3.11+; be explicit
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                if self.password is not None:
                    user = (self.username,) if self.username else ()
                    await self._expect_ok(conn, encode_command(b"AUTH", *user, self.password))
                if self.db:
                    await self._expect_ok(conn, encode_command(b"SELECT", self.db))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            return conn

    @staticmethod
    async def _expect_ok(conn: RespProtocol, command: bytes) -> None:
        reply = await conn.request(command)
        if isinstance(reply, ResponseError):
            raise reply
        if reply != "OK":
            raise InvalidResponse(f"expected OK, got {reply!r}")

    async def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None and self._loop is not None and not self._loop.is_closed():
            conn.close()  # (one of a loop already closed cannot be: it goes with that loop)
