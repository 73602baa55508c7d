"""A bounded memo: the few thousand requests, keys and headers that repeat, kept without growth."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """At most ``size`` values by key; beyond that the oldest stored goes first.

    A read does not reorder (it stays one dict lookup on the hit path): the memos hold what is
    derived from their key, so dropping a popular entry costs one recomputation, not a miss.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value stored for ``key``, if any."""
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        """Store ``value`` for ``key``, dropping the oldest entry when over ``size``."""
        self._items[key] = value
        if len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class BytesMemo(BoundedMemo[bytes, V]):
    """A :class:`BoundedMemo` keyed by bytes a client sent, bounded by their total size too:
    keys longer than ``max_key`` are not kept, and the kept keys hold at most ``max_bytes``
    together, so hostile clients filling it with large keys cost a known amount of memory."""

    def __init__(self, size: int, max_key: int, max_bytes: int) -> None:
        super().__init__(size)
        self.max_key = max_key
        self.max_bytes = max_bytes
        self.nbytes = 0

    def put(self, key: bytes, value: V) -> None:
        """Remember ``value`` for ``key`` (short keys only)."""
        if len(key) > self.max_key:
            return
        items = self._items
        old = items.pop(key, None)
        if old is not None:
            self.nbytes -= len(key)
        items[key] = value
        self.nbytes += len(key)
        while len(items) > self.size or self.nbytes > self.max_bytes:
            dropped, _ = items.popitem(last=False)
            self.nbytes -= len(dropped)
