"""The ``Engine`` protocol and the values that cross it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from synth.alignment import WordTiming
from synth.audio import FloatPCM

ParamValue = str | int | float | bool | None


@dataclass(frozen=True)
class SynthesisItem:
    """One thing to say: normalized text, a voice of the engine, and engine parameters."""

    text: str
    voice: str
    speed: float = 1.0
    params: Mapping[str, ParamValue] = field(default_factory=dict)
    # ``text`` is IPA phonemes (SSML ``<phoneme>``), for engines whose capabilities take them.
    phonemes: bool = False
    # Which take of this item: 0, or a retake after the take checks refused the one before
    # (gateway/speech/takes.py). Part of its identity, so a retake is a new synthesis, never
    # the refused audio again from a pool's recent answers.
    take: int = 0
    # Where a runner that receives the audio in pieces (an upstream whose ``passes_pcm``) hands
    # each piece of raw 16-bit pcm as it arrives, before the whole: a stream passes them on. Not
    # part of the item's identity; never sent to another process (the host's pool process sends
    # the pieces back instead, :mod:`synth.shared_pool`).
    sink: Callable[[bytes], None] | None = field(
        default=None, compare=False, repr=False, hash=False
    )

    def batch_group(self) -> tuple[object, ...]:
        """Items with the same group can share one engine batch."""
        return (self.voice, self.speed, tuple(sorted(self.params.items())), self.phonemes)


@dataclass(frozen=True)
class Audio:
    """Mono float32 PCM at ``sample_rate``; ``words``, when the engine can tell, where each
    word of the item's text is heard (None: the engine gives no alignment)."""

    pcm: FloatPCM
    sample_rate: int
    words: tuple[WordTiming, ...] | None = None
    # Made for another request: this one joined a synthesis in flight (the host's pool process
    # runs each distinct item once for every gateway process), so it is not this one's MISS.
    joined: bool = False

    @property
    def duration_s(self) -> float:
        """Length in seconds."""
        return float(len(self.pcm)) / float(self.sample_rate)


@dataclass(frozen=True)
class VoiceInfo:
    """A voice an engine serves."""

    name: str
    language: str = ""
    description: str = ""


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do beyond saying plain text, read by whoever must know before a
    request reaches it (parsing, the assembler, the scheduler's batching, the tallies).

    ``takes_phonemes``: it says IPA (SSML ``<phoneme>``); ``takes_instructions``: it follows
    OpenAI's ``instructions`` (they enter the content address); ``remote``: a provider that says
    what it is asked (a voice it does not list is never swapped for another); ``any_voice``: any
    voice id goes to it as asked; ``splits_sentences``: its texts are said sentence by sentence
    (False: whole, one call per text); ``max_exact_batch``: the largest batch it splits back
    exactly; ``price_per_million_chars``: what a provider bills (None: not billed per character);
    ``front_end``: the text front end a request's ``normalize: "auto"`` runs for it
    (:mod:`gateway.api.frontend`): ``numbers`` for an engine whose phonemizer reads digits badly
    ("$42.50" said "dollar forty two point five zero"), ``none`` for one that reads them itself.
    """

    takes_phonemes: bool = False
    takes_instructions: bool = False
    remote: bool = False
    any_voice: bool = False
    splits_sentences: bool = True
    max_exact_batch: int = 1
    price_per_million_chars: float | None = None
    # Its items come back with word timings (``Audio.words``): speech marks.
    speech_marks: bool = False
    front_end: Literal["numbers", "none"] = "numbers"
    # The language of a voice it is asked for beyond those it lists (``any_voice``): an
    # upstream's ``language``.
    any_voice_language: str = ""


@runtime_checkable
class Engine(Protocol):
    """A speech synthesizer. All methods are synchronous: callers run them off the event loop.

    ``synthesize_batch`` returns one :class:`Audio` per item, in order. ``fingerprint`` identifies
    the weights and config, so a model change changes every content address.
    """

    name: str
    fingerprint: str
    sample_rate: int

    @property
    def capabilities(self) -> EngineCapabilities:
        """What it can do (may change when an upstream's file is reloaded: read it per use)."""

    def voices(self) -> Sequence[VoiceInfo]: ...

    def default_params(self, voice: str) -> Mapping[str, ParamValue]: ...

    def load(self) -> None: ...

    def warm_up(self) -> None: ...

    def synthesize_batch(self, items: Sequence[SynthesisItem]) -> list[Audio]: ...

    def describe(self) -> Mapping[str, object]: ...


def fingerprint_files(paths: Iterable[Path]) -> str:
    """blake2b-256 over the files' bytes (in the given order), hex."""
    h = hashlib.blake2b(digest_size=32)
    for path in paths:
        h.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
