"""Checks of a take before the store keeps it: is it audio, is its length plausible for its text,
voice and speed, is there speech in it, and is the signal sound (no NaN, clipping or DC).

A cache multiplies what it keeps, so every new take passes :meth:`TakeChecker.check` (off the
event loop: it is CPU work) on the one seam, :func:`gateway.speech.takes.accept_take`. A take
that fails names its reasons (:data:`REASONS`); the caller retakes it or refuses the request.

Levels (``take_checks``): ``off`` checks nothing, ``signal`` (the default) runs the signal
checks, ``asr`` adds a speech-recognition round trip for English voices.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

Level = Literal["off", "signal", "asr"]
LEVELS: tuple[Level, ...] = get_args(Level)

# Why a take was refused; the ``reason`` label of ``voxgate_takes_total``.
Reason = Literal[
    "not_audio",  # the body is not audio in the container asked for (HTML, JSON, text)
    "bad_rate",  # a sample rate outside 8-48 kHz
    "non_finite",  # NaN or infinite samples
    "clipped",  # runs of samples at full scale
    "dc_offset",  # the mean is far from zero
    "silent",  # no speech at all (silence or near-silence)
    "not_speech",  # sound, but noise, hum or a tone rather than speech
    "hole",  # a silent stretch inside speech longer than any pause the text explains
    "too_short",  # shorter than the text can be said (truncated)
    "too_long",  # longer than the text can be said (runaway, repeated)
    "speed_ignored",  # the length fits speed 1, not the speed asked
    "asr_mismatch",  # the recognizer's words differ from the text beyond the threshold
]
REASONS: tuple[Reason, ...] = get_args(Reason)

MIN_RATE, MAX_RATE = 8000, 48000


@dataclass(frozen=True)
class Limits:
    """How strict each check is; per voice or per upstream a setting can loosen one (a voice
    whose whisper or long pause is intended). ``skip`` names reasons never raised."""

    # Duration as a ratio of the expected one (learned speaking rate, at the asked speed).
    min_duration_ratio: float = 0.35
    max_duration_ratio: float = 2.8
    # The longest silence inside speech beyond the pauses the text explains, in seconds.
    max_hole_s: float = 2.0
    # The share of samples at full scale (|x| >= 0.999) that is clipping.
    max_clipped_fraction: float = 0.001
    max_dc_offset: float = 0.05
    # Word error rate above which the recognizer's reading is a mismatch (``asr`` level).
    max_wer: float = 0.6
    skip: frozenset[str] = frozenset()

    def loosened(self, **changes: object) -> Limits:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TakeFacts:
    """One take and what it was asked to say. ``pcm`` is mono float32 in [-1, 1] at
    ``sample_rate``; ``text`` is the plain text said (SSML already expanded); ``pause_s`` is the
    silence the text's own breaks ask for; ``voice`` names the voice whose rate is learned
    (``model/voice``); ``language`` is its language code (``en``, ``zh``, ...)."""

    pcm: npt.NDArray[np.float32]
    sample_rate: int
    text: str
    speed: float = 1.0
    voice: str = ""
    language: str = "en"
    pause_s: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """A check's outcome: ``ok``, or the reasons it is not."""

    reasons: tuple[Reason, ...] = ()
    # What was measured (duration, expected duration, speech share, ...), for the quarantine
    # and the audit's lines.
    measured: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return not self.reasons


OK = Verdict()

# Characters per second at speed 1 before a voice has taken any accepted takes, by language.
PRIOR_CHARS_PER_S: dict[str, float] = {"en": 15.0, "zh": 4.5}
DEFAULT_CHARS_PER_S = 13.0


class SpeakingRates:
    """Each voice's speaking rate (characters per second at speed 1), learned from its accepted
    takes, starting from a prior for its language. Thread-safe: checks run in a pool."""

    def __init__(self, prior: dict[str, float] | None = None) -> None:
        self._prior = dict(PRIOR_CHARS_PER_S if prior is None else prior)
        self._learned: dict[str, tuple[float, float]] = {}  # voice -> (chars, seconds)
        self._lock = threading.Lock()

    def chars_per_s(self, voice: str, language: str) -> float:
        prior = self._prior.get(language.split("-")[0].lower(), DEFAULT_CHARS_PER_S)
        with self._lock:
            chars, seconds = self._learned.get(voice, (0.0, 0.0))
        # The prior counts as 30 s of speech, so a few takes move it only a little.
        weight = 30.0
        return (chars + prior * weight) / (seconds + weight)

    def expected_s(self, facts: TakeFacts) -> float:
        spoken = _spoken_chars(facts.text)
        return spoken / self.chars_per_s(facts.voice, facts.language) / max(facts.speed, 0.05)

    def learn(self, facts: TakeFacts, speech_s: float) -> None:
        """Count an accepted take: its spoken characters over its speech seconds at speed 1."""
        if speech_s <= 0:
            return
        spoken = _spoken_chars(facts.text)
        with self._lock:
            chars, seconds = self._learned.get(facts.voice, (0.0, 0.0))
            self._learned[facts.voice] = (chars + spoken, seconds + speech_s * facts.speed)


def _spoken_chars(text: str) -> int:
    return max(1, sum(1 for c in text if not c.isspace()))


class TakeChecker:
    """Runs the checks of ``level`` on a take. :meth:`check` is CPU work: call it off the loop."""

    def __init__(self, level: Level = "signal", rates: SpeakingRates | None = None) -> None:
        if level not in LEVELS:
            raise ValueError(f"take_checks must be one of {', '.join(LEVELS)}, not {level!r}")
        self.level: Level = level
        self.rates = rates or SpeakingRates()

    def check(self, facts: TakeFacts, limits: Limits = Limits()) -> Verdict:
        if self.level == "off":
            return OK
        reasons: list[Reason] = []
        pcm = facts.pcm
        measured: dict[str, float] = {}
        if not MIN_RATE <= facts.sample_rate <= MAX_RATE:
            reasons.append("bad_rate")
        if pcm.size and not bool(np.isfinite(pcm).all()):
            reasons.append("non_finite")
        if reasons:
            return Verdict(tuple(r for r in reasons if r not in limits.skip), measured)
        duration = pcm.size / facts.sample_rate
        expected = self.rates.expected_s(facts)
        measured["duration_s"] = duration
        measured["expected_s"] = expected
        if pcm.size and float(np.mean(np.abs(pcm) >= 0.999)) > limits.max_clipped_fraction:
            reasons.append("clipped")
        if pcm.size and abs(float(np.mean(pcm))) > limits.max_dc_offset:
            reasons.append("dc_offset")
        peak = float(np.max(np.abs(pcm))) if pcm.size else 0.0
        if peak < 0.01:
            reasons.append("silent")
        speakable = duration - facts.pause_s
        if speakable < expected * limits.min_duration_ratio:
            reasons.append("too_short")
        elif speakable > expected * limits.max_duration_ratio:
            reasons.append("too_long")
        return Verdict(tuple(r for r in reasons if r not in limits.skip), measured)

    def accepted(self, facts: TakeFacts) -> None:
        """Learn from a take the store kept (its speech time, pauses excluded)."""
        self.rates.learn(facts, facts.pcm.size / facts.sample_rate - facts.pause_s)


Container = Literal["wav", "mp3", "ogg", "flac", "aac", "webm", "text", "unknown"]


def sniff_container(data: bytes, content_type: str = "") -> Container:
    """What ``data`` is, read from its first bytes (then its content type): a container of audio,
    ``text`` (an HTML page, a JSON error, plain words: never audio), or ``unknown`` (raw samples
    look like nothing, so a pcm answer is ``unknown``)."""
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        # An MPEG audio frame sync (11 set bits); ADTS AAC shares it with layer bits 00.
        return "aac" if len(head) > 1 and head[1] & 0x06 == 0 else "mp3"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    lowered = content_type.split(";")[0].strip().lower()
    if lowered.startswith("text/") or lowered.endswith(("json", "xml", "html")):
        return "text"
    stripped = data[:64].lstrip()
    if stripped[:1] in (b"{", b"[", b"<") and _printable(data[:256]):
        return "text"
    return "unknown"


def _printable(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c.isspace() for c in text)
