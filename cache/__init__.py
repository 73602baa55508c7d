"""Content addressing and the tiered audio store (memory, disk, Redis) with single flight."""

from cache.entry import CorruptEntry, Entry, EntryMeta
from cache.keys import is_key, master_key, normalize_text, rendition_key
from cache.singleflight import SingleFlight
from cache.store import Lookup, TieredStore
from cache.tier import PurgeFilter, Tier, TierError, TierStats, TierUnavailable

__all__ = [
    "CorruptEntry",
    "Entry",
    "EntryMeta",
    "Lookup",
    "PurgeFilter",
    "SingleFlight",
    "Tier",
    "TierError",
    "TierStats",
    "TierUnavailable",
    "TieredStore",
    "is_key",
    "master_key",
    "normalize_text",
    "rendition_key",
]
