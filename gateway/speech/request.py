"""The speech path's value types: a validated request, and the audio answered for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from cache.entry import Entry
from synth import audio
from synth.engine import ParamValue

# How the store answered a request: "hit" (stored), "miss" (synthesized for this request) or
# "coalesced" (joined an identical request in flight). Sent as the X-Cache header, upper-cased.
CacheResult = Literal["hit", "miss", "coalesced"]
CACHE_RESULTS: tuple[CacheResult, ...] = get_args(CacheResult)

# An SSML rate multiplies the request's speed; the product stays within what a request may ask.
MIN_SEGMENT_SPEED, MAX_SEGMENT_SPEED = 0.25, 4.0


def segment_speed(speed: float, rate: float) -> float:
    """The engine speed of a segment at SSML ``rate`` in a request at ``speed``."""
    return min(MAX_SEGMENT_SPEED, max(MIN_SEGMENT_SPEED, round(speed * rate, 4)))


@dataclass(frozen=True)
class Segment:
    """One piece of an SSML expansion: words said at one ``rate``, then a pause.

    ``words`` is normalized text (or IPA phonemes when ``phonemes``); ``pause_ms`` is the exact
    silence after it, ``None`` for the gateway's sentence pause (nothing after the last segment).
    """

    words: str
    pause_ms: int | None = None
    rate: float = 1.0
    phonemes: bool = False
    # SSML ``<mark name>``s in it: (name, character offset into ``words``), in order. Part of
    # the address (a rendition stores its marks), and only when there are some, so documents
    # without marks keep their addresses.
    marks: tuple[tuple[str, int], ...] = ()

    def key_material(self) -> list[object]:
        """The segment as it enters the content address."""
        material: list[object] = [self.words, self.pause_ms, self.rate, self.phonemes]
        if self.marks:
            material.append([list(m) for m in self.marks])
        return material


@dataclass(frozen=True)
class SpeechRequest:
    """A validated request: ``text`` is normalized, ``model`` and ``voice`` are resolved names."""

    text: str
    model: str
    voice: str
    fmt: audio.AudioFormat
    speed: float = 1.0
    sample_rate: int | None = None
    # Engine parameters asked for beyond the voice's defaults (Piper's noise scales, a speaker),
    # sorted by name: part of the content address. Only names the engine's own defaults carry.
    params: tuple[tuple[str, ParamValue], ...] = ()
    # An SSML expansion that plain text cannot stand for (pauses, rates, phonemes): its segments,
    # in order; ``text`` is then their words joined. Empty for plain text, so a plain request and
    # ``<speak>`` around it have one content address.
    segments: tuple[Segment, ...] = ()
    # ``words`` of this (one-sentence) request are IPA phonemes (a ``<phoneme>`` segment).
    phonemes: bool = False
    # (service, its keys_for result), set by SpeechService.keys_for: not part of the request's
    # identity (excluded from ==, hash and repr), and not an init field, so dataclasses.replace
    # never carries it to a changed request.
    keys_cache: tuple[object, tuple[str, str, int]] | None = field(
        default=None, init=False, compare=False, repr=False
    )

    def entry(
        self,
        data: bytes,
        fmt: audio.AudioFormat,
        sample_rate: int,
        duration_s: float,
        **recipe: Any,
    ) -> Entry:
        """Stored audio for this request: ``data`` in ``fmt``, tagged with model and voice
        (and, for a rendition, the masters it was made from, ``recipe``: the keyword fields of
        :meth:`cache.entry.Entry.create`, see :class:`cache.entry.EntryMeta`).
        Never pinned: pins are made by :mod:`gateway.speech.catalogue`, within their quota."""
        return Entry.create(
            data,
            content_type=fmt.content_type,
            fmt=fmt.name,
            sample_rate=sample_rate,
            model=self.model,
            voice=self.voice,
            duration_s=duration_s,
            **recipe,
        )


@dataclass(frozen=True)
class SpeechResult:
    """The audio for a request, its content address, and how the store answered."""

    entry: Entry
    key: str
    cache: CacheResult
