"""Sentences of a client's streams waiting their turn instead of being refused.

A streaming socket speaks sentence by sentence, each its own rendition; a client's sockets
together may hold more sentences than its shares (``renders_per_client``, ``queue_per_client``)
admit. A refusal there is right for a request (the client retries it), wrong for a sentence in
the middle of a call: it would go unspoken. So a stream's sentence takes a slot of its client
first (at most the client's share per process, first come first served), and when the share is
still full (the client's other requests, its sockets on other gateway processes) it waits and
asks again, for at most ``batch_timeout_s`` (the longest one synthesis may run): a share held
that long is held by something else than a turn, and the call has moved on, so the sentence
fails as any of the stream's sentences does (a 429's message back on the socket). Before that,
the wait is bounded by the socket: each socket has a bounded queue, which stops reading the
socket when full, and a closed socket cancels what waits. docs/telephony.md, "jambonz".
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

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = max(1, limit)
        self.wait_s = wait_s
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}

    def waiting(self, client: str) -> int:
        """Sentences of ``client`` holding or waiting for a slot (for tests and metrics)."""
        entry = self._slots.get(client)
        return 0 if entry is None else entry[1]

    async def run(self, client: str, make: Callable[[], Awaitable[T]]) -> T:
        """``make()`` once ``client`` has a free slot, asked again while its share is full: for
        at most ``wait_s`` after its first refusal, then a 429 (:class:`TooManyRequests`)."""
        slot, users = self._slots.get(client) or (asyncio.Semaphore(self.limit), 0)
        self._slots[client] = (slot, users + 1)
        try:
            async with slot:
                return await _until_admitted(make, self.wait_s)
        finally:
            slot, users = self._slots[client]
            if users <= 1:
                del self._slots[client]
            else:
                self._slots[client] = (slot, users - 1)


async def _until_admitted(make: Callable[[], Awaitable[T]], wait_s: float) -> T:
    loop = asyncio.get_running_loop()
    delay = FIRST_RETRY_S
    deadline = None
    while True:
        try:
            return await make()
        except ClientQueueFull:
            code = "client_queue_full"
        except TooManyRequests as exc:
            if exc.code not in SHARE_CODES:
                raise
            code = exc.code
        now = loop.time()
        if deadline is None:
            deadline = now + wait_s
        elif now >= deadline:
            raise TooManyRequests(
                f"this client's share stayed full for {wait_s:g} s (batch_timeout_s): "
                "the sentence was not spoken",
                code=code,
                retry_after_s=1.0,
            )
        await asyncio.sleep(min(delay, deadline - now))
        delay = min(delay * 2, LAST_RETRY_S)
