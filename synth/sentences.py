"""Splitting text into sentences (the unit of the sentence-level cache) and joining their audio.

Templated prompts ("Your balance is 42 dollars. Press 1 to repeat.") share most sentences, so each
sentence is cached and synthesized on its own. pysbd is rule-based (abbreviations, decimals,
initials: "Dr. Smith paid $4.50." stays one sentence) and too slow per text for the event loop, so
callers run it off the loop and only on a miss; a text that is one sentence on its face
(:meth:`SentenceSplitter.whole`) skips it, and is cheap enough to split on the loop.

A sentence longer than ``max_chars`` is cut further, at clause boundaries first (after ``,;:``
and dashes), then between words (why: docs/synthesis.md, "Memory per run"). Engines bound their
runs too (Piper by phonemes), since characters are a loose measure of speech.

:func:`speech_weight` is the character count the request budget is estimated from: symbols and
emoji are read out as names ("grinning face with big eyes", about 20 phonemes each) and long digit
strings digit by digit, so they weigh more than a letter.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Sequence

import numpy as np
import pysbd

from synth.audio import FloatPCM

# A text no segmenter splits: ASCII letters, digits, commas, apostrophes and single spaces, with
# at most one ``.``, ``!`` or ``?``, at the end. pysbd returns such a text whole (checked against
# it in tests/test_sentences.py), but only after running all its rules.
_ONE_SENTENCE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9,']| (?=[A-Za-z0-9,']))*[.!?]?")


class SentenceSplitter:
    """Splits normalized text into normalized sentences.

    A pysbd ``Segmenter`` keeps per-call state, so each thread gets its own (callers split on an
    executor's threads).
    """

    def __init__(self, language: str = "en") -> None:
        self.language = language
        self._local = threading.local()

    def _segmenter(self) -> pysbd.Segmenter:
        seg: pysbd.Segmenter | None = getattr(self._local, "segmenter", None)
        if seg is None:
            seg = pysbd.Segmenter(language=self.language, clean=False)
            self._local.segmenter = seg
        return seg

    @staticmethod
    def whole(text: str, max_chars: int | None = None) -> bool:
        """Whether ``text`` is one sentence on its face: no sentence can end inside it, and it is
        within ``max_chars``. Then :meth:`split` returns it whole without running pysbd, and it
        is cheap enough to split on the event loop (most prompts and bot replies of a miss)."""
        return (max_chars is None or len(text) <= max_chars) and (
            _ONE_SENTENCE.fullmatch(text) is not None
        )

    def split(self, text: str, max_chars: int | None = None) -> list[str]:
        """The sentences of ``text`` (already whitespace-normalized), stripped, none empty, each
        at most ``max_chars`` long (longer ones cut by :func:`bound_length`).

        Joining the result with single spaces gives ``text`` back, so nothing is dropped (a word
        longer than ``max_chars`` is the one exception: it is cut where it must be).
        """
        if self.whole(text, max_chars):
            return [text]
        parts = self._sentences(text)
        if max_chars is None or all(len(p) <= max_chars for p in parts):
            return parts
        return [piece for part in parts for piece in bound_length(part, max_chars)]

    def _sentences(self, text: str) -> list[str]:
        sentences: list[str] = []
        pending = ""  # leading fragments with nothing to say, carried into the next sentence
        for part in self._segmenter().segment(text):
            part = part.strip()
            if not part:
                continue
            if not any(ch.isalnum() for ch in part):
                # "...", "?!", a dash: a voice produces no audio for these alone, so they stay
                # attached to a neighbour, as they were in the text.
                if sentences:
                    sentences[-1] = f"{sentences[-1]} {part}"
                else:
                    pending = f"{pending} {part}".strip()
                continue
            sentences.append(f"{pending} {part}".strip() if pending else part)
            pending = ""
        if pending:
            return [text]  # nothing speakable anywhere: the engine decides what to do with it
        return sentences or [text]


# A clause ends after , ; : or a dash, before a space (text is whitespace-normalized).
_CLAUSE_END = re.compile(r"(?<=[,;:\u2013\u2014)])\s|\s(?=[\u2013\u2014(])")


def bound_length(sentence: str, max_chars: int) -> list[str]:
    """``sentence`` in pieces of at most ``max_chars``: whole clauses packed together where they
    fit, a clause too long cut between words, a word too long cut where it must be."""
    if max_chars < 1:
        raise ValueError("max_chars must be >= 1")
    if len(sentence) <= max_chars:
        return [sentence]
    pieces: list[str] = []
    for clause in _CLAUSE_END.split(sentence):
        too_long = len(clause) > max_chars
        for i, unit in enumerate(_words(clause, max_chars) if too_long else [clause]):
            fits = bool(pieces) and len(pieces[-1]) + 1 + len(unit) <= max_chars
            # A clause too long is cut between words, starting a piece of its own: a cut at the
            # clause boundary before it sounds more natural than one inside the clause.
            if fits and not (too_long and i == 0):
                pieces[-1] = f"{pieces[-1]} {unit}"
            else:
                pieces.append(unit)
    return pieces


def _words(clause: str, max_chars: int) -> list[str]:
    words = clause.split(" ")
    return [word[i : i + max_chars] for word in words for i in range(0, len(word), max_chars)]


# Weights by Unicode category, measured as phonemes per character with the joe voice (espeak-ng):
# letters and punctuation about 1.2, symbols and emoji 4 to 23 (read out by name), digits up to 11
# (a long number is read digit by digit), CJK characters on an English voice about 15.
SYMBOL_WEIGHT = 20
DIGIT_WEIGHT = 4
WIDE_WEIGHT = 4


@functools.lru_cache(maxsize=4096)
def speech_weight(text: str) -> int:
    """How many plain letters ``text`` speaks like: its length, with symbols, emoji, digits and
    wide (CJK) characters counted at their measured weight. Memoized: the same prompts repeat."""
    if text.isascii():
        digits = sum(ch.isdigit() for ch in text)
        symbols = sum(1 for ch in text if ch in _ASCII_SYMBOLS)
        return len(text) + (DIGIT_WEIGHT - 1) * digits + (SYMBOL_WEIGHT // 5 - 1) * symbols
    weight = 0
    for ch in text:
        category = unicodedata.category(ch)
        if category[0] == "S":
            weight += SYMBOL_WEIGHT if not ch.isascii() else SYMBOL_WEIGHT // 5
        elif category == "Nd":
            weight += DIGIT_WEIGHT
        elif unicodedata.east_asian_width(ch) in ("W", "F"):
            weight += WIDE_WEIGHT
        else:
            weight += 1
    return weight


# ASCII symbols ($ % & + < = > ^ ` | ~ and friends) are read by name too, but short ones.
_ASCII_SYMBOLS = frozenset(ch for ch in map(chr, range(128)) if unicodedata.category(ch)[0] == "S")


def join(parts: Sequence[FloatPCM], sample_rate: int, pause_s: float) -> FloatPCM:
    """Concatenate sentence audio with ``pause_s`` of silence between consecutive sentences."""
    if len(parts) == 1:
        return parts[0]
    return join_gaps(parts, sample_rate, _pauses(len(parts), pause_s))


def _pauses(parts: int, pause_s: float) -> list[float]:
    return [0.0, *[pause_s] * (parts - 1), 0.0]


# Below this (voices peak-normalize to 1.0) a sample counts as the silence an engine puts around
# what it says: about 0.03-0.06 s before and 0.13-0.16 s after a phrase with the joe voice.
SILENCE_LEVEL = 0.01


def trim_edges(pcm: FloatPCM, head: bool, tail: bool) -> FloatPCM:
    """``pcm`` without the near-silence before its first sound (``head``) and after its last
    (``tail``): where an SSML break or a rate change cuts a phrase, the engine's own silence
    around each piece would otherwise lengthen the break."""
    if not (head or tail):
        return pcm
    loud = np.flatnonzero(np.abs(pcm) > SILENCE_LEVEL)
    if loud.size == 0:
        return pcm
    start = int(loud[0]) if head else 0
    end = int(loud[-1]) + 1 if tail else len(pcm)
    return pcm[start:end]


def join_gaps(
    parts: Sequence[FloatPCM],
    sample_rate: int,
    gaps_s: Sequence[float],
    trims: Sequence[bool] = (),
) -> FloatPCM:
    """Concatenate ``parts`` with exact silences: ``gaps_s[0]`` before the first, ``gaps_s[i]``
    between part ``i-1`` and part ``i``, ``gaps_s[-1]`` after the last (an SSML expansion's
    breaks; ``len(gaps_s) == len(parts) + 1``). Where ``trims[i]``, the parts on either side of
    gap ``i`` lose their edge silence there (:func:`trim_edges`), so the gap is the silence."""
    if len(gaps_s) != len(parts) + 1 or (trims and len(trims) != len(gaps_s)):
        raise ValueError("join_gaps needs one gap (and trim flag) more than parts")
    flags = list(trims) or [False] * len(gaps_s)
    pieces: list[FloatPCM] = []
    for i, gap_s in enumerate(gaps_s):
        if gap_s > 0:
            pieces.append(np.zeros(round(gap_s * sample_rate), dtype=np.float32))
        if i < len(parts):
            pieces.append(trim_edges(parts[i], flags[i], flags[i + 1]))
    return np.concatenate(pieces).astype(np.float32, copy=False)


def part_offsets(
    parts: Sequence[FloatPCM],
    sample_rate: int,
    gaps_s: Sequence[float] | None,
    trims: Sequence[bool] = (),
    pause_s: float = 0.0,
) -> list[tuple[int, int, int]]:
    """Where each of ``parts`` lands in what :func:`join_gaps` (``gaps_s`` given) or
    :func:`join` (``pause_s``) makes of them: ``(first output sample, samples trimmed off its
    head, samples kept)`` of each part, so a time inside a part maps onto the joined audio
    (speech marks). Computed the way those functions join."""
    if gaps_s is None:
        gaps_s, trims = _pauses(len(parts), pause_s), ()
    out: list[tuple[int, int, int]] = []
    at = 0
    flags = list(trims) or [False] * len(gaps_s)
    for i, gap_s in enumerate(gaps_s):
        if gap_s > 0:
            at += round(gap_s * sample_rate)
        if i < len(parts):
            part = parts[i]
            kept = trim_edges(part, flags[i], flags[i + 1])
            head = 0
            if flags[i] and len(kept) != len(part):
                loud = np.flatnonzero(np.abs(part) > SILENCE_LEVEL)
                head = int(loud[0]) if loud.size else 0
            out.append((at, head, len(kept)))
            at += len(kept)
    return out


def leading_pause(pcm: FloatPCM, sample_rate: int, pause_s: float) -> FloatPCM:
    """``pcm`` preceded by the inter-sentence pause: a streamed sentence after the first, so that
    the streamed chunks add up to exactly :func:`join`'s output."""
    gap = np.zeros(round(pause_s * sample_rate), dtype=np.float32)
    return np.concatenate([gap, pcm]).astype(np.float32, copy=False)
