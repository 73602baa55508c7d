"""The raw 16-bit pcm of a synthesis in flight, piece by piece as its provider sends it.

One type for every place that follows a call's pieces: the host's pool process (it sends them
on to each gateway process that asks, :mod:`synth.shared_pool`) and a gateway's streams that pass
them on (streaming pass-through, :mod:`gateway.speech.assembly`). A :class:`Pieces` is the
item's ``sink`` (:class:`synth.engine.SynthesisItem`): the runner calls it with each piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from synth.engine import Audio


class Pieces:
    """The pieces of one call, in whole samples: a piece may end inside a sample (an HTTP
    chunk's edge, a pool frame's), and its odd byte waits for the next one. ``convert``, when
    given, is applied to each piece as it arrives."""

    def __init__(self, convert: Callable[[bytes], bytes] | None = None) -> None:
        self.pieces: list[bytes] = []
        self.finished = False
        # The take checks' reasons when they refused this call's take (set after it finished).
        self.refused: tuple[str, ...] = ()
        self._convert = convert
        self._odd = b""
        # Replaced at every change: each follower waits on the one it saw last.
        self._changed = asyncio.Event()

    def __call__(self, data: bytes) -> None:
        """A piece arrived (the item's ``sink``)."""
        if self._odd:
            data = self._odd + data
        whole = len(data) - len(data) % 2
        self._odd = data[whole:]
        if whole:
            # (The provider's own bytes object when whole: the pool holds no copy of them.)
            piece = data if whole == len(data) else data[:whole]
            self.pieces.append(self._convert(piece) if self._convert is not None else piece)
            self._wake()

    def finish(self) -> None:
        """The call is over (its audio whole, or failed): no piece comes after this."""
        self.finished = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self) -> AsyncGenerator[bytes]:
        """Every piece until the call is over, those arrived before first; what arrived while
        the follower was busy comes joined as one (a slow reader holds nothing more)."""
        i = 0
        while True:
            if i < len(self.pieces):
                ready, i = self.pieces[i:], len(self.pieces)
                yield ready[0] if len(ready) == 1 else b"".join(ready)
                continue
            if self.finished:
                return
            await self._changed.wait()


class PiecesFeed:
    """The calls in flight whose pcm arrives in pieces, by master key: a stream passes the
    pieces on as they come, while the whole is stored."""

    def __init__(self, convert: Callable[[bytes], bytes] | None = None) -> None:
        self._convert = convert
        self._calls: dict[str, Pieces] = {}
        self._waiters: dict[str, list[asyncio.Future[Pieces]]] = {}

    def open(self, mk: str) -> Pieces:
        """A synthesis of master ``mk`` starts; its pieces go to the returned sink."""
        call = self._calls[mk] = Pieces(self._convert)
        for waiter in self._waiters.pop(mk, []):
            if not waiter.done():
                waiter.set_result(call)
        return call

    def close(self, mk: str, call: Pieces) -> None:
        """The synthesis of ``mk`` is over."""
        if self._calls.get(mk) is call:
            del self._calls[mk]
        call.finish()

    async def sentence(self, mk: str, part: asyncio.Future[Audio]) -> Pieces | None:
        """The synthesis of ``mk`` in flight, waiting for it to start; None once ``part`` (the
        sentence's master, from the store or a synthesis) is had without one."""
        call = self._calls.get(mk)
        if call is not None or part.done():
            return call
        waiter: asyncio.Future[Pieces] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(mk, []).append(waiter)
        try:
            waits: set[asyncio.Future[Any]] = {waiter, part}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting = self._waiters.get(mk, [])
            if waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del self._waiters[mk]
            if not waiter.done():
                waiter.cancel()
        return None if waiter.cancelled() else waiter.result()
