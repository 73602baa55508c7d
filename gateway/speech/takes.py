"""The one way a new take into the store: every master a synthesis made (any engine, any
provider, whole or passed through in pieces) and every rendition or transcode made of masters
passes :func:`accept_take` before it is stored or counted. Checks of the audio itself belong
here, so that nothing unchecked is ever stored or served as a hit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cache.entry import Entry
from cache.store import TieredStore
from gateway.speech.request import SpeechRequest
from synth.audio import FloatPCM
from synth.takecheck import Verdict


@dataclass(frozen=True)
class Take:
    """Audio just made, before it is stored: the samples ``entry`` encodes (float, at
    ``sample_rate``), the text they say, and the request they were made for (None for a
    transcode: another encoding of stored audio, asked for by its address)."""

    pcm: FloatPCM
    sample_rate: int
    text: str
    req: SpeechRequest | None


class Rejects(Protocol):
    """Where a refused take is kept aside for review (the quarantine): bounded and expiring, so
    an admin can listen to it and approve it into the store under ``key``."""

    async def keep(self, key: str, entry: Entry, take: Take, verdict: Verdict) -> None: ...


async def accept_take(store: TieredStore, key: str, entry: Entry, take: Take) -> None:
    """Store ``entry`` under ``key``: the one call that writes a new master or rendition."""
    await store.put(key, entry)
