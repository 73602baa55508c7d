"""The hit path's memos and tallies: bounded, and never wrong about what they stand for."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry

from cache.memory import MemoryTier
from cache.store import TieredStore
from gateway.api.parsing import RequestMemo, SpeechCall
from gateway.speech.request import SpeechRequest
from metrics import Metrics
from synth import audio


def _call(text: str) -> SpeechCall:
    req = SpeechRequest(text=text, model="piper", voice="joe", fmt=audio.FORMATS["wav"])
    return SpeechCall(req=req)


def test_request_memo_is_bounded_by_bytes_as_well_as_entries() -> None:
    memo = RequestMemo(size=1000, max_body=100, max_bytes=1000)
    bodies = [bytes([65 + i % 26]) * 100 + str(i).encode() for i in range(20)]
    for raw in bodies:
        memo.put(raw[:100], _call("x"))
    assert memo.nbytes <= 1000
    assert len(memo) == 10  # ten 100-byte bodies fit in 1,000 bytes
    memo.put(b"y" * 101, _call("too big"))  # over max_body: never kept
    assert memo.get(b"y" * 101) is None
    # Replacing a body's entry does not count its bytes twice.
    memo.put(bodies[-1][:100], _call("again"))
    assert memo.nbytes == sum(len(k) for k in memo._items)


def test_request_memo_drops_oldest_by_count() -> None:
    memo = RequestMemo(size=3)
    for raw in (b"a", b"b", b"c", b"d"):
        memo.put(raw, _call(raw.decode()))
    assert memo.get(b"a") is None and memo.get(b"d") is not None
    assert len(memo) == 3 and memo.nbytes == 3


def test_a_changed_request_never_carries_the_keys_of_the_one_it_was_made_from() -> None:
    req = SpeechRequest(text="Hello.", model="piper", voice="joe", fmt=audio.FORMATS["wav"])
    object.__setattr__(req, "keys_cache", (object(), ("m", "r", 22050)))
    other = dataclasses.replace(req, text="Goodbye.")
    assert other.keys_cache is None
    assert other != req
    # The cache is not part of the request's identity.
    plain = SpeechRequest(text="Hello.", model="piper", voice="joe", fmt=audio.FORMATS["wav"])
    assert plain == req and hash(plain) == hash(req)


async def test_memory_hits_are_tallied_and_counted_at_collection() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    store = TieredStore([MemoryTier(1 << 20)], metrics)
    assert store.get_memory("0" * 64) is None
    hits = {"tier": "memory", "result": "hit"}
    assert (registry.get_sample_value("voxgate_cache_lookups_total", hits) or 0.0) == 0.0
    req = SpeechRequest(text="Hi.", model="piper", voice="joe", fmt=audio.FORMATS["wav"])
    entry = req.entry(b"RIFF" + b"\0" * 40, audio.FORMATS["wav"], 22050, 0.1)
    await store.tiers[0].put("1" * 64, entry)
    for _ in range(5):
        assert store.get_memory("1" * 64) is not None
    assert registry.get_sample_value("voxgate_cache_lookups_total", hits) == 5.0
    assert store.get_memory("1" * 64) is not None
    assert registry.get_sample_value("voxgate_cache_lookups_total", hits) == 6.0
