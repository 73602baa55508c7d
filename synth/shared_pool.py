"""One synthesis pool per host: a pool process serves every gateway process over a Unix socket.

With ``serve --workers N`` the N gateway processes would otherwise each hold a pool of engines:
N times the memory, the cores oversubscribed (a Piper synthesis took 0.38 s instead of 0.16 s
with 2), and no coalescing between processes (320 syntheses for 300 prompts). How the pool
process runs each distinct item once, answers it again from a recent result and cancels what
nobody waits for: docs/architecture.md, "One pool per host". A reply names the items its request
joined (``joined``: started by another request, or answered from a recent one), so only the
gateway process whose request started a synthesis says MISS for it. This is the one layer that
coalesces across the gateway processes of a host without Redis: each process's registry of
productions (:class:`gateway.speech.assembly.Assembler`) sees its own requests only.

Streaming pass-through (docs/architecture.md, "Upstreams"): the pieces a request gets are the
provider's answer itself (the same bytes objects the provider keeps to make the whole), held only
until the call ends; each request's follower joins what arrived while it wrote (:class:`Pieces`).

Wire format (asyncio streams, both ways): frames of a 4-byte big-endian length then the payload,
bounded on read (``MAX_REQUEST_BYTES`` at the pool, ``max_reply_bytes`` at the gateway) before
anything is allocated. A request is JSON ``{"id", "model", "items": [{"text", "voice", "speed",
"params"}], "pieces": [index, ...]}`` (``pieces``: the items whose pcm is wanted as it comes;
optional), a cancellation ``{"cancel": id}``. A reply is ``{"id": n}``, a newline, then a
worker's reply message (:func:`synth.pool.encode_reply`: JSON header plus float32 samples, parsed,
never unpickled). A piece is ``{"id": n, "piece": index}``, a newline, then raw 16-bit pcm.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic

from synth.cancellation import cancel_and_wait
from synth.engine import Audio, Engine, ParamValue, SynthesisItem
from synth.errors import (
    EngineDead,
    EngineError,
    Overloaded,
    SynthesisError,
    UpstreamError,
)
from synth.pieces import Pieces
from synth.pool import BadReply, encode_ok, encode_reply, reply_audios
from synth.scheduler import Scheduler

log = logging.getLogger("voxgate.synth.shared_pool")

_LENGTH = struct.Struct(">I")
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # a batch of texts; the gateway bounds each text far below
# How long, and in how many bytes of PCM, finished syntheses stay answerable without a new one:
# longer than a gateway takes from a cache miss to its submit, plus the store's write.
RECENT_S = 10.0
RECENT_BYTES = 64 * 1024 * 1024
# The highest take number an item may carry (take_retries is at most 5).
MAX_TAKE = 16


class FrameTooLarge(Exception):
    """A peer declared a frame larger than allowed; the connection cannot be trusted further."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """One length-prefixed frame; :class:`FrameTooLarge` before reading an oversized one,
    ``IncompleteReadError`` at end of stream."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > max_bytes:
        raise FrameTooLarge(f"frame of {length} bytes, more than the {max_bytes} allowed")
    return await reader.readexactly(length)


def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    """Queue one frame on ``writer`` (the caller drains)."""
    writer.write(_LENGTH.pack(len(payload)) + payload)


def item_to_json(item: SynthesisItem) -> dict[str, Any]:
    """An item as plain JSON values (``phonemes`` only when set: IPA from SSML <phoneme>;
    ``take`` only for a retake)."""
    value: dict[str, Any] = {
        "text": item.text,
        "voice": item.voice,
        "speed": item.speed,
        "params": dict(item.params),
    }
    if item.phonemes:
        value["phonemes"] = True
    if item.take:
        value["take"] = item.take
    return value


class _ItemJson(pydantic.BaseModel, strict=True):
    """An item as a request carries it (strict: a bool is no number, a number no string)."""

    text: str
    voice: str
    speed: float
    params: dict[str, ParamValue]
    phonemes: bool = False
    take: int = pydantic.Field(0, ge=0, le=MAX_TAKE)


def item_from_json(value: Any) -> SynthesisItem:
    """The item a request carries; ``ValueError`` (pydantic's) for anything that is not one."""
    item = _ItemJson.model_validate(value)
    return SynthesisItem(item.text, item.voice, item.speed, item.params, item.phonemes, item.take)


def identity(model: str, item: SynthesisItem) -> str:
    """What makes two items one synthesis on this host (docs/architecture.md, "One pool per
    host": the master's content address less the engine fingerprint, fixed here)."""
    return json.dumps([model, item_to_json(item)], sort_keys=True, separators=(",", ":"))


async def _all_or_none(calls: Sequence[Any]) -> list[Audio]:
    """Await every coroutine of ``calls``; on the first failure (or a cancellation) cancel the
    rest, so their interest in shared items is dropped, then raise it."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # Every outcome retrieved; the first failure is what the caller gets.
        await _stop_all(tasks)
        raise


async def _stop_all(tasks: Any) -> None:
    """Cancel ``tasks`` and wait for them, whatever they end with (a peer that went away makes
    a reply's write fail: nothing to report to anyone)."""
    pending = list(tasks)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


@dataclasses.dataclass(eq=False)
class _Shared:
    """One distinct item in flight at the pool: its synthesis, its pcm as it arrives (a model
    that passes pcm) and who still wants it."""

    task: asyncio.Task[Audio]
    pieces: Pieces | None
    interest: int = 0


# Where a request's pieces of one item go: awaited, so a slow connection slows its follower only.
PieceWriter = Callable[[bytes], Awaitable[None]]


class PoolServer:
    """Serves ``schedulers`` (one per model) to gateway processes, coalescing identical items."""

    def __init__(self, schedulers: Mapping[str, Scheduler]) -> None:
        self.schedulers = dict(schedulers)
        self._shared: dict[str, _Shared] = {}
        self._recent: OrderedDict[str, tuple[float, Audio]] = OrderedDict()
        self._recent_size = 0
        self._connections: set[asyncio.Task[None]] = set()
        self.syntheses_started = 0  # distinct items submitted to a scheduler (for tests)

    def interest(self, model: str, item: SynthesisItem) -> int:
        """Requests now waiting for ``item`` (0 when it is not in flight)."""
        shared = self._shared.get(identity(model, item))
        return shared.interest if shared is not None else 0

    async def _one(
        self, model: str, item: SynthesisItem, write_piece: PieceWriter | None = None
    ) -> Audio:
        """``item``'s audio, marked ``joined`` unless this request started its synthesis."""
        key = identity(model, item)
        recent = self._recent.get(key)
        if recent is not None and time.monotonic() - recent[0] < RECENT_S:
            return dataclasses.replace(recent[1], joined=True)
        shared = self._shared.get(key)
        joined = shared is not None
        if shared is None:
            self.syntheses_started += 1
            scheduler = self.schedulers[model]
            # Kept whoever asks first: a process joining later may want the pieces.
            pieces = Pieces() if scheduler.runner.passes_pcm else None
            if pieces is not None:
                item = dataclasses.replace(item, sink=pieces)
            task = asyncio.ensure_future(scheduler.submit(item))
            shared = self._shared[key] = _Shared(task, pieces)
            retake = item.take > 0
            task.add_done_callback(lambda _: self._forget(key, shared, retake))
        shared.interest += 1
        try:
            if write_piece is not None and shared.pieces is not None:
                async for piece in shared.pieces.follow():
                    await write_piece(piece)
            # Shielded: one requester leaving must not cancel what others wait for.
            made = await asyncio.shield(shared.task)
            return dataclasses.replace(made, joined=True) if joined else made
        finally:
            shared.interest -= 1
            if shared.interest == 0 and not shared.task.done():
                shared.task.cancel()  # nobody wants it: out of the queue if not started

    def _forget(self, key: str, shared: _Shared, retake: bool = False) -> None:
        if self._shared.get(key) is shared:
            del self._shared[key]
        if shared.pieces is not None:
            shared.pieces.finish()
        if shared.task.cancelled() or shared.task.exception() is not None:
            return  # retrieved: a failure nobody awaited any more is not logged
        if retake:
            # A retake follows a take the checks refused: the next request's retake must be a
            # new synthesis too, not this one again (its first take may be answered from here).
            return
        self._remember(key, shared.task.result())

    def _remember(self, key: str, audio: Audio) -> None:
        """Keep ``audio`` for ``RECENT_S``, within ``RECENT_BYTES``."""
        now = time.monotonic()
        old = self._recent.pop(key, None)
        if old is not None:
            self._recent_size -= old[1].pcm.nbytes
        self._recent[key] = (now, audio)
        self._recent_size += audio.pcm.nbytes
        while self._recent and (
            self._recent_size > RECENT_BYTES
            or now - next(iter(self._recent.values()))[0] >= RECENT_S
        ):
            _, (_, dropped) = self._recent.popitem(last=False)
            self._recent_size -= dropped.pcm.nbytes

    async def _answer(
        self, model: str, items: Sequence[SynthesisItem], writers: Mapping[int, PieceWriter]
    ) -> bytes:
        try:
            audios = await _all_or_none(
                [self._one(model, item, writers.get(i)) for i, item in enumerate(items)]
            )
        except UpstreamError as exc:
            return encode_reply("error", exc.to_wire())
        except SynthesisError as exc:
            kind = "Overloaded" if isinstance(exc, Overloaded) else type(exc).__name__
            return encode_reply("error", {"kind": kind, "message": str(exc)})
        except Exception as exc:  # anything unforeseen fails this request, not the pool
            log.exception("shared pool request failed model=%s", model)
            message = f"synthesis failed: {type(exc).__name__}"
            return encode_reply("error", {"kind": "EngineError", "message": message})
        return encode_ok(audios, joined=[i for i, a in enumerate(audios) if a.joined])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One gateway process's connection: requests in, replies out, until it closes."""
        me = asyncio.current_task()
        assert me is not None  # (a connection is served in a task of its own)
        self._connections.add(me)
        running: dict[int, asyncio.Task[None]] = {}

        async def send(head: dict[str, int], data: bytes) -> None:
            write_frame(writer, json.dumps(head).encode() + b"\n" + data)
            with contextlib.suppress(ConnectionError):
                await writer.drain()  # a gateway process that went away reads nothing more

        async def write_piece(rid: int, index: int, data: bytes) -> None:
            if not writer.is_closing():  # else the gateway process went away
                await send({"id": rid, "piece": index}, data)

        async def serve(rid: int, model: str, items: list[SynthesisItem], wanted: set[int]) -> None:
            writers = {i: functools.partial(write_piece, rid, i) for i in wanted}
            await send({"id": rid}, await self._answer(model, items, writers))

        try:
            while True:
                try:
                    frame = await read_frame(reader, MAX_REQUEST_BYTES)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    message = json.loads(frame)
                    if not isinstance(message, dict):
                        raise ValueError("frame is not an object")
                    if "cancel" in message:
                        task = running.get(message["cancel"])
                        if task is not None:
                            task.cancel()
                        continue
                    rid, model = message["id"], message["model"]
                    if type(rid) is not int or model not in self.schedulers:
                        raise ValueError("request without an id or for an unknown model")
                    items = [item_from_json(v) for v in message["items"]]
                    wanted = message.get("pieces", [])
                    if not isinstance(wanted, list) or any(
                        type(i) is not int or not 0 <= i < len(items) for i in wanted
                    ):
                        raise ValueError("pieces is not a list of item indices")
                except (ValueError, KeyError, TypeError) as exc:
                    # Our own gateway sent something we cannot read: the stream is out of step.
                    log.error("shared pool: bad request frame (%s); closing the connection", exc)
                    return
                task = asyncio.ensure_future(serve(rid, model, items, set(wanted)))
                running[rid] = task
                task.add_done_callback(functools.partial(lambda r, _: running.pop(r, None), rid))
        except FrameTooLarge as exc:
            log.error("shared pool: %s; closing the connection", exc)
        finally:
            await _stop_all(running.values())
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._connections.discard(me)

    async def close(self) -> None:
        """Stop serving the open connections."""
        await _stop_all(self._connections)


@dataclasses.dataclass
class _Request:
    future: asyncio.Future[bytes]
    sinks: dict[int, Callable[[bytes], None]]


class RemotePool:
    """A :class:`~synth.scheduler.BatchRunner` that runs batches in the host's pool process.

    ``engine`` is an unloaded instance for metadata, as with :class:`synth.pool.WorkerPool`;
    ``size`` is the pool's worker count (this process keeps that many batches in flight).
    One connection, many requests in flight on it, each answered by id. With ``passes_pcm``
    (the model is an upstream that streams, run by the pool process), an item's ``sink`` gets
    the pieces of its pcm as the pool process receives them.
    """

    # The scheduler cancels a batch every waiter left: here that is cheap (a cancel frame), and
    # it is what lets the pool drop the item (unlike a worker's pipe, nothing is left half-read).
    cancel_when_abandoned = True
    times_batches = False
    # The pool process counts syntheses; this process counting them too would double them.
    counts_syntheses = False
    # The pool process keeps one queue for every gateway process of the host, in order of
    # arrival: this process hands it each item at once, counted in its client's share till done.
    queues_work = True

    def __init__(
        self,
        path: str | Path,
        model: str,
        engine: Engine,
        size: int,
        *,
        start_timeout_s: float = 600.0,
        max_reply_bytes: int = 64 * 1024 * 1024,
        passes_pcm: bool = False,
    ) -> None:
        self.path = str(path)
        self.model = model
        self.engine = engine
        self.size = size
        self.start_timeout_s = start_timeout_s
        self.max_reply_bytes = max_reply_bytes
        self.passes_pcm = passes_pcm
        self._ids = itertools.count(1)
        self._pending: dict[int, _Request] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        """Wait until the pool process accepts (it listens once its engines are warm)."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                await self._connect()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise EngineDead("the synthesis pool process did not start") from None
                # Nothing to await: the socket is not there yet. A refused connect costs a
                # syscall, and a gateway is not ready before this returns: poll finely.
                await asyncio.sleep(0.05)

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            reader, writer = await asyncio.open_unix_connection(self.path)
            self._writer = writer
            self._reader_task = asyncio.ensure_future(self._read_replies(reader, writer))
            return writer

    async def _read_replies(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        reason = "the synthesis pool process closed the connection"
        try:
            while True:
                frame = await read_frame(reader, self.max_reply_bytes + 4096)
                head, sep, reply = frame.partition(b"\n")
                found = json.loads(head) if sep else {}
                rid, index = found.get("id"), found.get("piece")
                if type(rid) is not int:
                    continue
                if index is not None:
                    request = self._pending.get(rid)
                    if request is not None and type(index) is int and index in request.sinks:
                        request.sinks[index](reply)
                    continue
                pending = self._pending.pop(rid, None)
                if pending is not None and not pending.future.done():
                    pending.future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (FrameTooLarge, ValueError, AttributeError) as exc:
            reason = f"the synthesis pool process sent an unusable reply ({exc})"
            log.error("%s; reconnecting", reason)
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            for pending in self._pending.values():
                if not pending.future.done():
                    pending.future.set_exception(EngineDead(reason))
            self._pending.clear()

    async def run_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]:
        """Run ``items`` in the pool process; cancelling this tells the pool nobody waits."""
        if self._closed:
            raise EngineDead("the synthesis pool is shut down")
        try:
            writer = await self._connect()
        except OSError:
            raise EngineDead("the synthesis pool process is not reachable") from None
        rid = next(self._ids)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        sinks = {i: item.sink for i, item in enumerate(items) if item.sink and self.passes_pcm}
        self._pending[rid] = _Request(future, sinks)
        request: dict[str, Any] = {
            "id": rid,
            "model": self.model,
            "items": [item_to_json(i) for i in items],
        }
        if sinks:
            request["pieces"] = list(sinks)
        try:
            write_frame(writer, json.dumps(request).encode())
            await writer.drain()
            reply = await future
        except asyncio.CancelledError:
            self._pending.pop(rid, None)
            if not writer.is_closing():
                write_frame(writer, json.dumps({"cancel": rid}).encode())
            raise
        except ConnectionError:
            self._pending.pop(rid, None)
            raise EngineDead("the synthesis pool process is not reachable") from None
        try:
            return reply_audios(reply, len(items))
        except BadReply as exc:
            raise EngineError(f"the synthesis pool sent an unusable reply ({exc})") from None

    async def close(self) -> None:
        """Close the connection (the pool process itself belongs to the supervisor)."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            await cancel_and_wait(self._reader_task)
