"""How GET routes present audio to players: Cache-Control, Last-Modified and Content-Type per
route (and per telephony extension), made once from the settings."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from multidict import CIMultiDict

from cache.entry import Entry
from gateway.http.conditional import cache_control, etag_for, http_date
from gateway.memo import BoundedMemo
from gateway.runtime.settings import Settings
from gateway.speech.telephony import EXTENSIONS
from synth import audio

# Hit headers remembered across every GET route and extension of one app (about 1 KB each).
HIT_HEADERS = 8192


def audio_headers(key: str, fmt: audio.AudioFormat, rate: int, cache: str) -> dict[str, str]:
    """The headers every audio response carries: type, cache result, key, ETag, rate."""
    return {
        "Content-Type": fmt.content_type,
        "X-Cache": cache.upper(),
        "X-Audio-Key": key,
        "ETag": etag_for(key),
        "X-Audio-Sample-Rate": str(rate),
    }


@dataclass
class Presentation:
    """How a GET route presents audio to players: its ``Cache-Control``, and its
    ``Content-Type`` where that is not the format's own (a telephony extension's). Players keep
    a file only with ``max-age`` and revalidate with ETag or Last-Modified, so both are sent.
    The headers of a memory hit are built once per key, as for POST, in a memo all of an app's
    presentations share (``hits``, keyed by this presentation's ``tag`` and the key): one bound
    for the headers of every route and extension, however many are used."""

    cache_control: str
    content_type: str | None = None
    hits: BoundedMemo[tuple[int, str], CIMultiDict[str]] = field(
        default_factory=lambda: BoundedMemo(HIT_HEADERS), repr=False
    )
    tag: int = 0

    def headers(
        self, key: str, fmt: audio.AudioFormat, rate: int, cache: str, created: float | None
    ) -> dict[str, str]:
        """The response headers for audio ``key``."""
        out = audio_headers(key, fmt, rate, cache)
        out["Cache-Control"] = self.cache_control
        if self.content_type is not None:
            out["Content-Type"] = self.content_type
        if created is not None:
            out["Last-Modified"] = http_date(created)
        return out

    def hit_headers(self, key: str, fmt: audio.AudioFormat, entry: Entry) -> CIMultiDict[str]:
        """The headers of a hit on ``key`` (built once per key: they never change for it)."""
        found = self.hits.get((self.tag, key))
        if found is None:
            meta = entry.meta
            found = CIMultiDict(self.headers(key, fmt, meta.sample_rate, "hit", meta.created))
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

    @classmethod
    def from_settings(cls, settings: Settings) -> Presentations:
        """Content addresses are immutable (``audio_max_age_s``); synthesis URLs answer what
        the served model says today (``synthesis_max_age_s``)."""
        forever = cache_control(settings.audio_max_age_s, immutable=True)
        today = cache_control(settings.synthesis_max_age_s)
        hits: BoundedMemo[tuple[int, str], CIMultiDict[str]] = BoundedMemo(HIT_HEADERS)
        tags = itertools.count()

        def present(cache: str, content_type: str | None = None) -> Presentation:
            return Presentation(cache, content_type, hits=hits, tag=next(tags))

        return cls(
            synthesis=present(today),
            stored=present(forever),
            say={name: present(today, e.content_type) for name, e in EXTENSIONS.items()},
            by_key={name: present(forever, e.content_type) for name, e in EXTENSIONS.items()},
            jambonz=present("no-store", settings.jambonz_content_type),
        )
