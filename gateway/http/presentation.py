"""How GET routes present audio to players: Cache-Control, Last-Modified and Content-Type per
route (and per telephony extension), made once from the settings."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from cache.entry import Entry
from gateway.http.conditional import cache_control, http_date
from gateway.http.hits import PreparedHit
from gateway.memo import BoundedMemo
from gateway.runtime.settings import Settings
from gateway.speech.request import CacheResult
from gateway.speech.telephony import EXTENSIONS
from synth import audio

# Hit headers remembered across every GET route and extension of one app (about 1 KB each).
HIT_HEADERS = 8192


def audio_headers(
    key: str, fmt: audio.AudioFormat, rate: int, cache: CacheResult, etag: str | None
) -> dict[str, str]:
    """The headers every audio response carries: type, cache result, key, rate, and the ETag of
    the bytes sent (``etag``; None for a stream, whose bytes are not a stored entry's)."""
    out = {
        "Content-Type": fmt.content_type,
        "X-Cache": cache.upper(),
        "X-Audio-Key": key,
        "X-Audio-Sample-Rate": str(rate),
    }
    if etag is not None:
        out["ETag"] = etag
    return out


@dataclass
class Presentation:
    """How a GET route presents audio to players: its ``Cache-Control``, and its
    ``Content-Type`` where that is not the format's own (a telephony extension's). Players keep
    a file only with ``max-age`` and revalidate with ETag or Last-Modified, so both are sent.
    The headers of a memory hit are built once per entry, as for POST, in a memo all of an app's
    presentations share (``hits``, keyed by this presentation's ``tag`` and the key, checked
    against the entry's digest): one bound for the headers of every route and extension."""

    cache_control: str  # (empty: none sent)
    content_type: str | None = None
    hits: BoundedMemo[tuple[int, str], PreparedHit] = field(
        default_factory=lambda: BoundedMemo(HIT_HEADERS), repr=False
    )
    tag: int = 0
    # Whether Last-Modified is sent (and If-Modified-Since answered): not by the POST APIs.
    dated: bool = True

    def headers(
        self,
        key: str,
        fmt: audio.AudioFormat,
        rate: int,
        cache: CacheResult,
        created: float | None,
        etag: str | None,
    ) -> dict[str, str]:
        """The response headers for audio ``key`` whose bytes have ``etag``."""
        out = audio_headers(key, fmt, rate, cache, etag)
        if self.cache_control:
            out["Cache-Control"] = self.cache_control
        if self.content_type is not None:
            out["Content-Type"] = self.content_type
        if created is not None and self.dated:
            out["Last-Modified"] = http_date(created)
        return out

    def hit_headers(self, key: str, fmt: audio.AudioFormat, entry: Entry) -> PreparedHit:
        """The headers of a hit on ``entry`` under ``key`` (built and serialized once per
        entry: the store may hold other bytes under the key later, with another ETag and
        date)."""
        found = self.hits.get((self.tag, key))
        # The digest, not the entry: a memo holding entries would keep evicted audio alive.
        digest = entry.meta.digest or entry.etag
        if found is None or found.digest != digest or found.size != len(entry.audio):
            meta = entry.meta
            made = self.headers(key, fmt, meta.sample_rate, "hit", meta.created, entry.etag)
            found = PreparedHit(digest, made, len(entry.audio))
            self.hits.put((self.tag, key), found)
        return found


@dataclass
class Presentations:
    """Every GET route's :class:`Presentation`, made once from the settings."""

    synthesis: Presentation  # GET /synthesize, GET /api/tts
    stored: Presentation  # GET /v1/audio/{key}: the entry's own type
    say: dict[str, Presentation]  # GET /v1/say/...{ext}, by extension
    by_key: dict[str, Presentation]  # GET /v1/audio/{key}.{ext}, by extension
    jambonz: Presentation  # POST /v1/jambonz/tts: jambonz caches by its own rules
    api: Presentation  # every other route: the audio's own headers, no Cache-Control

    @classmethod
    def from_settings(cls, settings: Settings) -> Presentations:
        """Content-address URLs may be kept long (``audio_max_age_s``); synthesis URLs answer what
        the served model says today (``synthesis_max_age_s``). Neither is ``immutable``: the
        bytes under a content address are one rendering of it, and a replica without a shared
        store, or one that synthesizes it again after an eviction, sends other bytes (another
        ETag) for it, so a client must be free to revalidate."""
        forever = cache_control(settings.audio_max_age_s)
        today = cache_control(settings.synthesis_max_age_s)
        hits: BoundedMemo[tuple[int, str], PreparedHit] = BoundedMemo(HIT_HEADERS)
        tags = itertools.count()

        def present(cache: str, content_type: str | None = None) -> Presentation:
            return Presentation(cache, content_type, hits=hits, tag=next(tags))

        return cls(
            synthesis=present(today),
            stored=present(forever),
            say={name: present(today, e.content_type) for name, e in EXTENSIONS.items()},
            by_key={name: present(forever, e.content_type) for name, e in EXTENSIONS.items()},
            jambonz=present("no-store", settings.jambonz_content_type),
            api=Presentation("", dated=False),
        )
