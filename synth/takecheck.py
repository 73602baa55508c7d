"""Checks of a take before the store keeps it: is it audio, is its length plausible for its text,
voice and speed, is there speech in it, and is the signal sound (no NaN, clipping or DC).

Why and where every new take passes :meth:`TakeChecker.check`, and the levels
(``take_checks``): docs/takes.md, its opening and "Settings". A take that fails names its reasons
(:data:`REASONS`).
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt
import soxr
from num2words import num2words

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
    "spliced",  # a sound that stops dead inside the take: pieces joined, or a dropout
    "too_short",  # shorter than the text can be said (truncated)
    "too_long",  # longer than the text can be said (runaway, repeated)
    "speed_ignored",  # the length fits speed 1, not the speed asked
    "asr_mismatch",  # the recognizer's words differ from the text beyond the threshold
]
REASONS: tuple[Reason, ...] = get_args(Reason)

MIN_RATE, MAX_RATE = 8000, 48000

# A take ends quiet for at least this long (over the speed asked), quieter than
# END_QUIET_DB under its loud frames, or it was cut off: the bundled voice ends every sentence on
# 100 ms or more at speed 1 (40 ms at speed 2) in every format; a cut lands in a sound, or in a
# stop's closure or a pause shorter than that, nine times in ten. Judged up to speed 2: faster,
# the quiet shrinks to a frame or two of the measure.
MIN_END_QUIET_S = 0.06
END_QUIET_DB = -30.0
END_BURST_FRAMES = 2
DEAD_STOP_DB = 25.0
END_RING_AFTER_S = 0.08


@dataclass(frozen=True)
class Limits:
    """How strict each check is; per voice or per upstream a setting can loosen one (a voice
    whose whisper or long pause is intended). ``skip`` names reasons never raised."""

    # Duration as a ratio of the expected one (learned speaking rate, at the asked speed), give
    # or take ``duration_slack_s`` (a short text's length is more its pauses than its letters).
    min_duration_ratio: float = 0.5
    max_duration_ratio: float = 1.7
    duration_slack_s: float = 0.15
    # A length this far (as a ratio) from the asked speed's, and nearer speed 1's, ignored it.
    max_speed_error: float = 1.22
    # A take that ends in what the detector calls speech, its last 20 ms louder than this (dB
    # against the speech's median level), was cut off.
    max_end_db: float = -20.0
    # ... and so was a take that ends quiet for less than this (seconds at speed 1).
    min_end_quiet_s: float = MIN_END_QUIET_S
    # The longest silence inside speech beyond the pauses the text explains, in seconds at
    # speed 1 (longer at slower speeds).
    max_hole_s: float = 1.0
    # The share of samples at the take's own peak (within a 16-bit step): flat tops, clipping.
    max_clipped_fraction: float = 0.001
    max_dc_offset: float = 0.05
    # Frames quieter than this (dB of full scale) are silence; a take of only those is silent.
    min_level_db: float = -50.0
    # Sound the detector calls speech that is noise (flat spectrum), a tone or hum (one strong
    # bin), or steady (speech's level moves with its syllables): ``not_speech``.
    max_flatness: float = 0.45
    max_tonality: float = 0.9
    min_modulation_db: float = 3.0
    # Word error rate above which the recognizer's reading is a mismatch (``asr`` level): on the
    # bundled voice clean takes read at up to about 0.85 (pocketsphinx's general model on a
    # synthetic voice), babble spliced from other takes from about 0.87, mostly above 0.93. A
    # false flag costs a retake, a miss only what the signal checks let through: the threshold
    # sits above the clean takes.
    max_wer: float = 0.9
    skip: frozenset[str] = frozenset()

    def loosened(self, **changes: object) -> Limits:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_setting(cls, values: Mapping[str, object]) -> Limits:
        """The limits a ``take_limits`` entry sets (field names to numbers; ``skip`` a list of
        reasons); :class:`ValueError` naming what is wrong."""
        changes: dict[str, object] = {}
        names = {f.name for f in fields(cls)}
        for name, value in values.items():
            if name not in names:
                raise ValueError(f"unknown take limit {name!r} (known: {', '.join(sorted(names))})")
            if name == "skip":
                if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
                    raise ValueError("skip must be a list of reasons")
                unknown = sorted(set(value) - set(REASONS))
                if unknown:
                    raise ValueError(f"skip names unknown reasons: {', '.join(unknown)}")
                changes[name] = frozenset(value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"take limit {name} must be a number")
            else:
                changes[name] = float(value)
        return cls().loosened(**changes)


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
        # voice -> (accepted takes whose text has clause breaks, those that paused at each)
        self._pausing: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def chars_per_s(self, voice: str, language: str) -> float:
        prior = self._prior.get(_language(language), DEFAULT_CHARS_PER_S)
        with self._lock:
            chars, seconds = self._learned.get(voice, (0.0, 0.0))
        # The prior counts as 30 s of speech, so a few takes move it only a little.
        weight = 30.0
        return (chars + prior * weight) / (seconds + weight)

    def expected_range_s(self, facts: TakeFacts) -> tuple[float, float, float]:
        """The shortest, likeliest and longest plausible lengths of ``facts``' text (its
        digits and symbols may be read in fewer or more words) at the asked speed."""
        per_s = self.chars_per_s(facts.voice, facts.language) * max(facts.speed, 0.05)
        lo, mid, hi = _spoken_range(facts.text, facts.language)
        return lo / per_s, mid / per_s, hi / per_s

    def keeps_pauses(self, voice: str) -> bool:
        """Whether ``voice`` pauses at every clause break: it did in each of its first
        :data:`PAUSE_TRIAL_TAKES` accepted takes with breaks (a voice that once ran a comma
        through is never held to it)."""
        with self._lock:
            seen, kept = self._pausing.get(voice, (0, 0))
        return seen >= PAUSE_TRIAL_TAKES and kept == seen

    def learn(self, facts: TakeFacts, speech_s: float, pauses: int | None = None) -> None:
        """Count an accepted take: its spoken characters over its speech seconds at speed 1,
        and whether it paused (``pauses``, when measured) at each of its text's clause breaks."""
        breaks = clause_breaks(facts.text) if pauses is not None else 0
        if breaks:
            with self._lock:
                seen, kept = self._pausing.get(facts.voice, (0, 0))
                if seen < PAUSE_TRIAL_TAKES:
                    self._pausing[facts.voice] = (seen + 1, kept + ((pauses or 0) >= breaks))
        if speech_s <= 0:
            return
        spoken = _spoken_range(facts.text, facts.language)[1]
        with self._lock:
            chars, seconds = self._learned.get(facts.voice, (0.0, 0.0))
            self._learned[facts.voice] = (chars + spoken, seconds + speech_s * facts.speed)


# A voice is held to pausing at clause breaks after this many accepted takes with breaks showed
# it does, every time (the bundled voices do, at every speed; not every provider's voice does).
PAUSE_TRIAL_TAKES = 20
# A comma, semicolon, colon or sentence end with more text after it, where a voice pauses; not a
# full stop that ends an abbreviation ("Dr. Smith"), nor marks inside a number ("1,000", "3:30").
_BREAK = re.compile(r"(?:(\w+)\.|[,;:!?])\s+(?=\w)|[，。；：！？](?=\w)")
_ABBREVIATED = (
    "mr mrs ms dr st jr sr vs etc eg ie inc ltd co corp ave rd mt ft approx dept est fig"
    " jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun"
)
_ABBREVIATIONS = frozenset(_ABBREVIATED.split())


def clause_breaks(text: str) -> int:
    """How many clause breaks ``text`` has inside it (not at its end)."""
    return sum(
        1
        for m in _BREAK.finditer(text)
        if not (m.group(1) and m.group(1).lower().replace(".", "") in _ABBREVIATIONS)
    )


def _language(code: str) -> str:
    """ "en" of "en", "en-US" and "en_US" alike (BCP 47 tags, and Piper's voice names)."""
    return re.split(r"[-_]", code)[0].lower()


# Letters each digit and symbol is said in, at the least, likeliest and most. A number is said
# in words or digit by digit: "42" as "forty-two", "0042" as "zero zero four two", "1999" as
# "nineteen ninety-nine" (1.5 to 6 letters a digit in English; a syllable, one character, a digit
# in Chinese). Symbols are read by name: "%" as "percent", "/" as "slash", an emoji as
# "grinning face with big eyes" (synth/sentences.py measured their weight at up to 20). Other
# marks are silent where they close a word (a comma, a full stop, a quote) or join one ("don't",
# "well-known"), and read by name inside a token ("." in "example.com" as "dot").
_DIGIT_LETTERS = {"zh": (0.7, 1.0, 1.5)}
_DEFAULT_DIGIT_LETTERS = (1.5, 4.0, 6.0)
_READ_MARKS = frozenset("%#@/\\&*+=<>|~^_$")
_SYMBOL_LETTERS = (1.0, 4.0, 8.0)
_WIDE_SYMBOL_LETTERS = (1.0, 4.0, 20.0)
_INNER_MARK_LETTERS = (0.0, 1.0, 5.0)
_SILENT_MARKS = frozenset("'-\u2019\u2010\u2011")
# A letter said by its name (:func:`_spelled`): "S" as "ess", "W" as "double u", "á" as "a
# acute", "ß" as "sharp s", "Ω" as "omega" (not a letter of the scripts whose every letter is a
# syllable, from Hangul on).
_SPELLED_LETTERS = (1.0, 4.0, 10.0)
# A voice of another language says a letter of those scripts by a name: "中" as "Chinese
# letter", a rarer one as "letter 2 2 4 c 1".
_NAMED_LETTERS = (1.0, 13.0, 30.0)
_LONE_MARK_LETTERS = (0.0, 4.0, 15.0)
_TOKEN = re.compile(r"\S+")
_SYLLABIC = frozenset(("zh", "ja", "ko", "yue"))


_DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_DIGIT_RUN = re.compile(r"[0-9]+")
# Longer runs are not read as one number: they keep the per-digit weights.
_LONGEST_NUMBER = 12


@functools.lru_cache(maxsize=4096)
def _number_letters(run: str) -> tuple[float, float, float]:
    """Letters an English voice says a run of decimal digits in: the fewest, likeliest and most
    of its readings (num2words spells them): digit by digit, as a cardinal with its leading
    zeros said as "zero" ("forty-two", "nine hundred and eleven", with or without its "and"),
    and as a year for three or four digits ("nineteen ninety-nine", "nine eleven")."""
    value = int(run)
    readings = [sum(len(_DIGIT_NAMES[int(d)]) for d in run)]
    zeros = 4 * (len(run) - len(run.lstrip("0")))
    cardinal = _letters(num2words(value)) if value else 0
    readings += [zeros + cardinal, zeros + cardinal - 3 * num2words(value).count(" and ")]
    if run[0] != "0" and len(run) in (3, 4):
        readings.append(_letters(num2words(value, to="year")))
    return min(readings), (min(readings) + max(readings)) / 2, max(readings)


def _letters(words: str) -> int:
    return sum(ch.isalpha() for ch in words)


def _spelled(text: str) -> tuple[set[int], set[int]]:
    """Where ``text``'s letters are said by name, and its marks that stand alone: the letters of
    a word of up to three letters and digits with a letter beyond ASCII or a digit in it
    ("cÄ" as "see a umlaut", "é6"), or of one letter alone (but "a" and "I"); the marks of a
    word of marks (a lone "!" is "exclamation mark")."""
    letters: set[int] = set()
    marks: set[int] = set()
    for m in _TOKEN.finditer(text):
        alnum = [c for c in m.group() if c.isalnum()]
        if not alnum:
            marks.update(range(m.start(), m.end()))
        elif (len(alnum) == 1 and alnum[0] not in "aAI") or (
            len(alnum) <= 3
            and any(not c.isascii() or c.isdigit() for c in alnum)
            and any(c.isalpha() for c in alnum)
        ):
            letters.update(i for i in range(m.start(), m.end()) if text[i].isalpha())
    return letters, marks


def _spoken_range(text: str, language: str) -> tuple[float, float, float]:
    """How many plain letters ``text`` is said like (spaces not counted): least, likeliest and
    most, as its digits, marks and symbols may be read."""
    lang = _language(language)
    per_digit = _DIGIT_LETTERS.get(lang, _DEFAULT_DIGIT_LETTERS)
    lo = mid = hi = 0.0
    # English digit runs by their readings; a run's other digits are then not counted again.
    read: set[int] = set()
    if lang == "en":
        for m in _DIGIT_RUN.finditer(text):
            if len(m.group()) <= _LONGEST_NUMBER:
                least, likeliest, most = _number_letters(m.group())
                lo, mid, hi = lo + least, mid + likeliest, hi + most
                read.update(range(m.start(), m.end()))
    spelled, lone_marks = _spelled(text)
    last = len(text) - 1
    for i, ch in enumerate(text):
        if ch.isspace() or i in read:
            continue
        if ch.isalpha():
            weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
            if ord(ch) >= 0x1100 and lang not in _SYLLABIC:
                weights = _NAMED_LETTERS
            elif ord(ch) < 0x1100 and i in spelled:
                weights = _SPELLED_LETTERS
        elif ch.isdigit():
            weights = per_digit
        elif ch in _READ_MARKS:
            weights = _SYMBOL_LETTERS
        elif unicodedata.category(ch)[0] == "S":
            weights = _WIDE_SYMBOL_LETTERS
        elif i in lone_marks:
            weights = _LONE_MARK_LETTERS
        elif i == last or text[i + 1].isspace():
            continue
        elif ch in _SILENT_MARKS and not (i > 0 and (text[i - 1] + text[i + 1]).isdigit()):
            continue  # (a dash between digits is read: "1-800" as "one dash eight hundred")
        elif i > 0 and text[i - 1].isalnum() and text[i + 1].isalnum():
            weights = _INNER_MARK_LETTERS
        else:
            continue  # an opening quote or bracket
        lo, mid, hi = lo + weights[0], mid + weights[1], hi + weights[2]
    return max(1.0, lo), max(1.0, mid), max(1.0, hi)


class TakeChecker:
    """Runs the checks of ``level`` on a take. :meth:`check` is CPU work: call it off the loop.

    ``asr`` needs pocketsphinx (``pip install 'voxgate[asr]'``); without it the constructor
    raises :class:`ValueError` saying so, rather than every take failing later."""

    def __init__(self, level: Level = "signal") -> None:
        if level not in LEVELS:
            raise ValueError(f"take_checks must be one of {', '.join(LEVELS)}, not {level!r}")
        if level == "asr":
            import importlib.util

            if importlib.util.find_spec("pocketsphinx") is None:
                raise ValueError(
                    "take_checks = 'asr' needs pocketsphinx, which is not installed: "
                    "pip install 'voxgate[asr]' (or choose take_checks = 'signal')"
                )
        self.level: Level = level
        self.rates = SpeakingRates()
        self._recognizers = threading.local()

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
        if pcm.size and _starts_with_container(pcm):
            # A container's header read as samples (WAV where raw pcm was asked): the bytes
            # were never decoded, so the rate is a guess too.
            reasons.append("not_audio")
        if reasons:
            return _verdict(reasons, measured, limits)
        duration = pcm.size / facts.sample_rate
        expected = self.rates.expected_range_s(facts)
        measured["duration_s"] = duration
        measured["expected_s"] = expected[1]
        peak = float(np.max(np.abs(pcm))) if pcm.size else 0.0
        if peak > 0:
            at_top = np.count_nonzero(np.abs(pcm) >= peak - CLIP_STEP)
            # (A few samples are no evidence: a tiny G.711 take's loudest code holds a voice's
            # crests for a handful of samples, 0.2% of a 0.4 s take.)
            measured["clipped_fraction"] = at_top / pcm.size if at_top >= MIN_CLIPPED else 0.0
        if pcm.size and abs(float(np.mean(pcm))) > limits.max_dc_offset:
            reasons.append("dc_offset")
        signal = analyse(pcm, facts.sample_rate, limits.min_level_db)
        measured |= {
            "speech_s": signal.speech_frames * FRAME_S,
            "speech_span_s": signal.span_s,
            "longest_gap_s": signal.longest_gap_s,
            "flatness": signal.flatness,
            "tonality": signal.tonality,
            "modulation_db": signal.modulation_db,
            "level_db": signal.level_db,
            "end_db": signal.end_db,
            "end_quiet_s": signal.end_quiet_s,
        }
        if signal.loud_frames == 0:
            reasons.append("silent")
            return _verdict(reasons, measured, limits)
        if (
            # (A text said faster than three frames, at speed 4 or above, needs fewer.)
            signal.speech_frames < min(MIN_SPEECH_FRAMES, max(1, int(expected[0] / FRAME_S)))
            or signal.speech_frames < signal.loud_frames * MIN_SPEECH_SHARE
            or signal.flatness > limits.max_flatness
            or signal.tonality > limits.max_tonality
            or signal.modulation_db < limits.min_modulation_db
        ):
            reasons.append("not_speech")
            return _verdict(reasons, measured, limits)
        # Judged only on speech: a steady tone or hum has as many samples near its peak.
        if measured.get("clipped_fraction", 0.0) > limits.max_clipped_fraction:
            reasons.append("clipped")
        slow = min(facts.speed, 1.0)
        if signal.longest_gap_s > limits.max_hole_s / slow + facts.pause_s:
            reasons.append("hole")
        if signal.dead_stops:
            reasons.append("spliced")
        reasons.extend(self._duration_reasons(facts, signal, expected, limits, measured))
        if self.level == "asr" and recognizable(facts):
            wer = self._wer(facts)
            measured["wer"] = wer
            if wer > limits.max_wer:
                reasons.append("asr_mismatch")
        return _verdict(reasons, measured, limits)

    def _duration_reasons(
        self,
        facts: TakeFacts,
        signal: Signal,
        expected_range: tuple[float, float, float],
        limits: Limits,
        measured: dict[str, float],
    ) -> list[Reason]:
        shortest, expected, longest = expected_range
        said = max(signal.span_s - facts.pause_s, FRAME_S)  # a frame at least: ratios stay finite
        least = max(2, int(PAUSE_FRAMES / max(facts.speed, 0.05)))
        pauses = sum(1 for gap in signal.gaps if gap >= least)
        measured["pauses"] = pauses
        ratio = said / expected
        measured["duration_ratio"] = ratio
        slack = limits.duration_slack_s / max(facts.speed, 0.05)
        if facts.speed < MAX_END_CHECK_SPEED and signal.end_db > limits.max_end_db:
            # Cut off mid-sound: synthesis ends on its own silence, a truncated take does not.
            return ["too_short"]
        if facts.speed <= MAX_END_CHECK_SPEED and signal.end_quiet_s < limits.min_end_quiet_s / max(
            facts.speed, 0.05
        ):
            return ["too_short"]
        if (
            facts.speed < MAX_END_CHECK_SPEED
            and pauses < clause_breaks(facts.text)
            and self.rates.keeps_pauses(facts.voice)
        ):
            # Cut off in a pause: a clause of the text is missing (its pause ends the take).
            return ["too_short"]
        # Enough speech to tell its pace by: the text's likeliest length at speed 1, or the
        # take's own length, in speed-1 seconds at the slower of the two speeds it may be at.
        evidence = max(expected * facts.speed, said * min(facts.speed, 1.0))
        if evidence >= MIN_SPEED_EVIDENCE_S and _speed_ignored(
            said, shortest, longest, facts.speed, limits.max_speed_error
        ):
            return ["speed_ignored"]
        if said < shortest * limits.min_duration_ratio - slack:
            return ["too_short"]
        # (The slack never shortened by speed: a word of one syllable takes a quarter second,
        # however fast it is asked for.)
        if said > longest * limits.max_duration_ratio + max(slack, limits.duration_slack_s):
            return ["too_long"]
        return []

    def _wer(self, facts: TakeFacts) -> float:
        decoder = getattr(self._recognizers, "decoder", None)
        if decoder is None:
            from pocketsphinx import Config, Decoder

            config = Config(loglevel="FATAL")  # its own model (en-us), shipped in the wheel
            decoder = self._recognizers.decoder = Decoder(config)
        pcm16 = _to_rate(facts.pcm, facts.sample_rate, ASR_RATE)
        decoder.start_utt()
        decoder.process_raw(
            (np.clip(pcm16, -1.0, 1.0) * 32767).astype("<i2").tobytes(), False, True
        )
        decoder.end_utt()
        heard = decoder.hyp().hypstr if decoder.hyp() is not None else ""
        return word_error_rate(_words(facts.text), _words(heard))

    def accepted(self, facts: TakeFacts, verdict: Verdict | None = None) -> None:
        """Learn from a take the store kept: its speech time (the span the detector heard,
        from ``verdict`` when the check measured it; else its length), pauses excluded."""
        measured = verdict.measured if verdict is not None else {}
        seconds = measured.get("speech_span_s", facts.pcm.size / facts.sample_rate)
        pauses = measured.get("pauses")
        self.rates.learn(facts, seconds - facts.pause_s, None if pauses is None else int(pauses))


def _speed_ignored(
    said: float, shortest: float, longest: float, speed: float, error: float
) -> bool:
    """Whether a take ``said`` seconds long fits speed 1 and not the speed asked: its length
    lies outside the text's plausible lengths at ``speed`` (``shortest`` to ``longest``, give or
    take ``error`` as a ratio) and inside them at speed 1. Where the text's length is known (no
    numbers read one way or another), nearer speed 1's length than the asked one's is enough."""
    tolerance = np.log(error)
    low, high = np.log(said / shortest), np.log(said / longest)  # at the asked speed
    if longest / shortest < error:
        mid = (low + high) / 2
        return bool(abs(mid) > tolerance and abs(mid - np.log(speed)) < abs(mid))
    fits = low >= -tolerance and high <= tolerance
    fits_one = low - np.log(speed) >= -tolerance and high - np.log(speed) <= tolerance
    return not fits and fits_one


def _verdict(reasons: list[Reason], measured: dict[str, float], limits: Limits) -> Verdict:
    return Verdict(tuple(r for r in dict.fromkeys(reasons) if r not in limits.skip), measured)


# The voice-activity detector is WebRTC's (webrtcvad-wheels, MIT, an 83 KB wheel, no
# dependencies), on 30 ms frames of the take resampled to 16 kHz. Measured on the bundled voice
# (docs/takes.md has the table): it costs 0.13 ms of CPU per second of audio, against 5.1 ms for
# Silero VAD 6.2 (the ONNX model through onnxruntime; its package also requires torch) and 6.4 ms
# for TEN VAD 1.0.6 (which also needs the system's libc++, and whose licence adds terms a GPL
# program cannot pass on). Synthesis costs the bundled voice about 82 ms of CPU per second of
# audio, so the whole budget of the checks (5%) is about 4 ms: either neural detector alone
# would spend it. WebRTC's detector hears white noise and steady tones as speech (Silero and TEN
# do not), so three spectral measures of the frames it calls speech decide between speech and
# noise, hum or a tone: the spectrum's flatness (noise), the share of its strongest bin (a
# tone), and how much the frames' level moves (speech rises and falls with its syllables).

VAD_RATE = 16000
FRAME = 480  # 30 ms at 16 kHz, the longest frame the detector takes
FRAME_S = FRAME / VAD_RATE
ASR_RATE = 16000
# Samples within one 16-bit step of the take's own peak are at its top: a clipped take has many
# there (its flat tops, at whatever level it was clipped), a clean one a handful.
CLIP_STEP = 1.5 / 32768
MIN_CLIPPED = 24
# A text said in less than this at speed 1 is too short to tell its speed by (a word's length
# is more its own pace than the speed asked).
MIN_SPEED_EVIDENCE_S = 2.0
# From this speed up a voice's last sound decays within the 20 ms the end is judged on: a take
# said that fast ends like one cut off (the bundled voice's, from speed 2), so it is not judged.
MAX_END_CHECK_SPEED = 2.0
# A silence inside speech of this many frames over the speed (at least two: 60 ms) is a pause:
# the bundled voice pauses at least this long at each clause break, at every speed from 0.5 to 2
# and in every format; a stop's closure is shorter (at speed 0.5 up to 12 frames, so the bar
# moves with the speed).
PAUSE_FRAMES = 3.5
# Fewer frames of speech than this (90 ms) is no speech.
MIN_SPEECH_FRAMES = 3
# Sound of which the detector calls less than this share speech is something else (hum, rumble).
MIN_SPEECH_SHARE = 0.2
# The spectral measures look at 94 Hz - 4 kHz, where a voice's formants are.
_BAND = slice(3, 129)  # bins of a 512-point FFT at 16 kHz
_WINDOW = np.hanning(FRAME).astype(np.float32)
_VAD_MODE = 2


@dataclass(frozen=True)
class Signal:
    """What the detector and the spectral measures found in a take."""

    loud_frames: int
    speech_frames: int
    span_s: float  # from the first frame of speech to the end of the last
    longest_gap_s: float  # the longest run of non-speech inside the span
    flatness: float  # median spectral flatness of the speech frames (1: white noise)
    tonality: float  # median share of the strongest peak (3 bins) in the speech frames (tone: 1)
    modulation_db: float  # spread (standard deviation) of the speech frames' level
    level_db: float  # median level of the speech frames, dB of full scale
    end_db: float  # the last 20 ms against the speech frames median level, when they are speech
    end_quiet_s: float  # how long the take is quiet at its end (after its last sound)
    gaps: tuple[int, ...]  # the silences inside the speech, in frames (of two or more)
    dead_stops: int  # sounds inside the take that stop dead (see _dead_stops)


def analyse(pcm: npt.NDArray[np.float32], sample_rate: int, min_level_db: float) -> Signal:
    """Run the detector and the spectral measures over ``pcm``: vectorized numpy, one detector
    call per 30 ms frame."""
    import webrtcvad

    x = _to_rate(pcm, sample_rate, VAD_RATE)
    count = x.size // FRAME
    frames = x[: count * FRAME].reshape(count, FRAME)
    level = 10.0 * np.log10(np.mean(frames * frames, axis=1) + 1e-12)
    loud = level > min_level_db
    samples = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    vad = webrtcvad.Vad(_VAD_MODE)
    step = FRAME * 2
    heard = np.fromiter(
        (vad.is_speech(samples[i * step : (i + 1) * step], VAD_RATE) for i in range(count)),
        dtype=bool,
        count=count,
    )
    speech = heard & loud
    where = np.flatnonzero(speech)
    if where.size == 0:
        return Signal(int(loud.sum()), 0, 0.0, 0.0, 0.0, 0.0, 0.0, -120.0, -120.0, 0.0, (), 0)
    first, last = int(where[0]), int(where[-1])
    gaps = np.diff(where) - 1
    spectra = np.abs(np.fft.rfft(frames[speech] * _WINDOW, n=512)) ** 2
    band = spectra[:, _BAND] + 1e-12
    flatness = np.exp(np.mean(np.log(band), axis=1)) / np.mean(band, axis=1)
    # A tone's energy lies in its bin and the two beside it (the window's main lobe).
    padded = np.pad(band, ((0, 0), (1, 1)))
    top = np.argmax(band, axis=1)[:, None] + 1
    lobe = sum(np.take_along_axis(padded, top + k, axis=1)[:, 0] for k in (-1, 0, 1))
    tonality = lobe / band.sum(axis=1)
    speech_level = level[speech]
    median_level = float(np.median(speech_level))
    end_db = -120.0
    if speech[-1] or vad.is_speech(samples[-step:], VAD_RATE):
        # Ends in speech (else in silence, or in a codec's noise after it: GSM's can sit near
        # -40 dBFS): how loud its last 20 ms are tells a word cut off from one said out.
        # 50 to 20 ms before the end: a codec's last frame may ring (GSM's does), so the very
        # end is not the measure; a cut-off word is still loud there.
        tail = x[-VAD_RATE // 20 : -VAD_RATE // 50] if x.size > VAD_RATE // 20 else x
        end_level = 10.0 * float(np.log10(np.mean(tail * tail) + 1e-12))
        end_db = end_level - median_level
    return Signal(
        loud_frames=int(loud.sum()),
        speech_frames=int(where.size),
        span_s=(last - first + 1) * FRAME_S,
        longest_gap_s=float(gaps.max(initial=0)) * FRAME_S,
        flatness=float(np.median(flatness)),
        tonality=float(np.median(tonality)),
        modulation_db=float(np.std(speech_level)),
        level_db=median_level,
        end_db=end_db,
        end_quiet_s=_end_quiet_s(x, float(np.percentile(level[loud], 90))),
        gaps=tuple(int(g) for g in gaps[gaps >= 2]),
        dead_stops=_dead_stops(x, float(np.percentile(level[loud], 90))),
    )


def _dead_stops(x: npt.NDArray[np.float32], loud_db: float) -> int:
    """How many times a sound within 15 dB of ``loud_db`` falls by more than DEAD_STOP_DB from
    one 5 ms to the next inside ``x``: a voice's sound decays over tens of milliseconds (never
    once in the bundled voice's clean takes, in any format); a splice or a dropout cuts it."""
    step = VAD_RATE // 200
    count = x.size // step
    if count < 2:
        return 0
    level = 10.0 * np.log10(np.mean(x[: count * step].reshape(count, step) ** 2, axis=1) + 1e-12)
    fall = level[:-1] - level[1:]
    return int(np.count_nonzero((fall > DEAD_STOP_DB) & (level[:-1] > loud_db - 15.0)))


def _end_quiet_s(x: npt.NDArray[np.float32], loud_db: float) -> float:
    """How long ``x`` (at the detector's rate) ends quiet: from its last 10 ms louder than
    ``END_QUIET_DB`` below its loud frames (their 90th percentile) to its end. Synthesis ends a
    sentence on its own silence; a take cut off ends in, or just after, a sound."""
    step = VAD_RATE // 100
    count = x.size // step
    if count == 0:
        return 0.0
    tail = x[x.size - count * step :].reshape(count, step)
    level = 10.0 * np.log10(np.mean(tail * tail, axis=1) + 1e-12)
    sounding = level > loud_db + END_QUIET_DB
    # A burst of 20 ms or less at the very end, after quiet, is a codec's last frame ringing
    # (GSM's 20 ms frames do), not a sound cut off.
    burst = 0
    while burst < min(END_BURST_FRAMES, count - 1) and sounding[count - 1 - burst]:
        burst += 1
    where = np.flatnonzero(sounding[: count - burst])
    before = float(count - burst - 1 - where[-1]) / 100 if where.size else count / 100
    return before if burst and before >= END_RING_AFTER_S else 0.0 if burst else before


def _to_rate(pcm: npt.NDArray[np.float32], sample_rate: int, rate: int) -> npt.NDArray[np.float32]:
    if sample_rate == rate:
        return np.asarray(pcm, dtype=np.float32)
    # Low quality is plenty for a detector and a recognizer (both look below 4 kHz).
    return np.asarray(soxr.resample(pcm, sample_rate, rate, quality="LQ"), dtype=np.float32)


def _starts_with_container(pcm: npt.NDArray[np.float32]) -> bool:
    """Whether the first samples, as the 16-bit little-endian bytes they came from, are a
    container's four-byte magic (``RIFF``, ``OggS``, ``fLaC``, EBML): the header of a file
    read as samples. (An MPEG frame sync is two bytes, too short to tell from quiet samples.)"""
    head = np.round(pcm[:2] * 32768.0).clip(-32768, 32767).astype("<i2").tobytes()
    return head in _MAGICS


_MAGICS = frozenset((b"RIFF", b"OggS", b"fLaC", b"\x1a\x45\xdf\xa3", b"ID3\x03", b"ID3\x04"))


_WORD = re.compile(r"[a-z0-9']+")
# The recognizer reads English at 0.5x to 1.25x (at 1.5x one clean take of the bundled voice in
# ten reads as badly as babble, at 2% slower), and a text of a word or two is a coin toss for it.
# A text with digits is not judged: a voice may read "1-800" as "one dash eight hundred" or
# "one eight hundred", and pocketsphinx reads both its own way, take after take (every retake of
# "Call 1-800-555-0199." would fail).
ASR_MAX_SPEED = 1.25
ASR_MIN_WORDS = 3


def recognizable(facts: TakeFacts) -> bool:
    """Whether the ``asr`` level judges ``facts`` (else it passes on the signal checks alone)."""
    return (
        facts.language.lower().startswith("en")
        and facts.speed <= ASR_MAX_SPEED
        and not any(ch.isdigit() for ch in facts.text)
        and len(_words(facts.text)) >= ASR_MIN_WORDS
    )


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def word_error_rate(reference: list[str], heard: list[str]) -> float:
    """Word-level edit distance over the reference's length (1.0 when nothing was heard)."""
    if not reference:
        return 0.0 if not heard else 1.0
    row = list(range(len(heard) + 1))
    for i, word in enumerate(reference, 1):
        prev, row[0] = row[0], i
        for j, other in enumerate(heard, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (word != other))
    return row[-1] / len(reference)


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
    if data[:64].lstrip()[:1] in (b"{", b"[", b"<"):
        try:
            text = data[:256].decode("utf-8")
        except UnicodeDecodeError:
            return "unknown"
        if all(c.isprintable() or c.isspace() for c in text):
            return "text"
    return "unknown"
