"""Sentences of a client's streams waiting their turn instead of being refused.

A streaming socket speaks sentence by sentence, each its own rendition; a client's sockets
together may hold more sentences than its shares (``renders_per_client``, ``queue_per_client``)
admit. A refusal there is right for a request (the client retries it), wrong for a sentence in
the middle of a call: it would go unspoken. So a stream's sentence takes a slot of its client
first (at most the client's share per process, first come first served), and when the share is
still full (the client's other requests, its sockets on other gateway processes) it waits and
asks again. The wait is bounded by the socket: each socket has a bounded queue, which stops
reading the socket when full, and a closed socket cancels what waits. docs/telephony.md,
"jambonz".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.errors import TooManyRequests
from synth.errors import ClientQueueFull

T = TypeVar("T")

# Codes of the refusals that mean "the client's share is full now", not "never".
SHARE_CODES = frozenset({"render_share"})
# Seconds between asks while the share stays full (doubling from the first).
FIRST_RETRY_S = 0.05
LAST_RETRY_S = 1.0


class ClientSlots:
    """Per client, the sentences of its streams being made in this process at once."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}

    def waiting(self, client: str) -> int:
        """Sentences of ``client`` holding or waiting for a slot (for tests and metrics)."""
        entry = self._slots.get(client)
        return 0 if entry is None else entry[1]

    async def run(self, client: str, make: Callable[[], Awaitable[T]]) -> T:
        """``make()`` once ``client`` has a free slot, asked again while its share is full."""
        slot, users = self._slots.get(client) or (asyncio.Semaphore(self.limit), 0)
        self._slots[client] = (slot, users + 1)
        try:
            async with slot:
                return await _until_admitted(make)
        finally:
            slot, users = self._slots[client]
            if users <= 1:
                del self._slots[client]
            else:
                self._slots[client] = (slot, users - 1)


async def _until_admitted(make: Callable[[], Awaitable[T]]) -> T:
    delay = FIRST_RETRY_S
    while True:
        try:
            return await make()
        except ClientQueueFull:
            pass
        except TooManyRequests as exc:
            if exc.code not in SHARE_CODES:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, LAST_RETRY_S)
