"""Word timings from an engine's phoneme durations (speech marks): how a text's words are
matched to the phonemes the engine said, docs/speech-marks.md, "Where they come from".

Runs in the synthesis process, beside the engine (a sentence of ten words costs about 1 ms of
phonemizing and matching, against 50-100 ms of synthesis).
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Symbols in a phoneme stream that are not a sound of their own: stress marks, the word space,
# punctuation Piper keeps as pauses, and IPA's tie and syllable marks.
_SILENT = frozenset(" \u02c8\u02cc.,;:!?-'\"()\u0361\u035c|\u2016")
_STRESS = frozenset("\u02c8\u02cc")
# Punctuation a voice says as a pause (espeak-ng keeps it in the phonemes, Piper has ids for it).
_PAUSES = frozenset(".,;:!?\u2026\u2014")
_TOKEN = re.compile(r"\S+")
# Most words a sentence's timings may hold across the worker boundary (a run is at most a few
# hundred phonemes; a sentence at most a few runs of them).
MAX_WORDS = 4096
MAX_PHONEMES_PER_WORD = 256


@dataclass(frozen=True)
class WordTiming:
    """Where one word of an item's text is heard: ``start``/``end`` are character offsets into
    the item's text (the word without the punctuation around it), ``t0``/``t1`` its first sample
    and the sample after its last, ``phonemes`` each of its phonemes with its first sample."""

    start: int
    end: int
    t0: int
    t1: int
    phonemes: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_json(cls, raw: object, samples: int, chars: int) -> WordTiming:
        """A timing from :func:`timings_to_json`'s form, every value checked against the audio's
        ``samples`` and the text's ``chars``; ``ValueError`` for anything else."""
        if not isinstance(raw, list) or len(raw) != 5:
            raise ValueError("word timing is not [start, end, t0, t1, phonemes]")
        start, end, t0, t1, phonemes = raw
        if not all(type(v) is int for v in (start, end, t0, t1)):
            raise ValueError("word timing offsets are not integers")
        if not (0 <= start <= end <= chars and 0 <= t0 <= t1 <= samples):
            raise ValueError("word timing out of range")
        if not isinstance(phonemes, list) or len(phonemes) > MAX_PHONEMES_PER_WORD:
            raise ValueError("word timing phonemes are not a bounded list")
        out = []
        for item in phonemes:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not isinstance(item[0], str)
                or not 0 < len(item[0]) <= 8
                or type(item[1]) is not int
                or not 0 <= item[1] <= samples
            ):
                raise ValueError("word timing phoneme is not [symbol, sample]")
            out.append((item[0], item[1]))
        return cls(start, end, t0, t1, tuple(out))


def timings_to_json(words: Sequence[WordTiming]) -> list[Any]:
    """``words`` in compact form: what crosses the worker boundary and is stored with a master."""
    return [[w.start, w.end, w.t0, w.t1, [[p, t] for p, t in w.phonemes]] for w in words]


def timings_from_json(raw: object, samples: int, chars: int) -> tuple[WordTiming, ...]:
    """Word timings from their compact form, checked (``ValueError`` otherwise)."""
    if not isinstance(raw, list) or len(raw) > MAX_WORDS:
        raise ValueError("word timings are not a bounded list")
    words = tuple(WordTiming.from_json(w, samples, chars) for w in raw)
    if any(b.start < a.end or b.t0 < a.t0 for a, b in itertools.pairwise(words)):
        raise ValueError("word timings are not in order")
    return words


def token_stream(
    symbols: Sequence[str | None], samples: Sequence[int], at: int = 0
) -> list[tuple[str, int, int]]:
    """``(symbol, first sample, samples)`` of each symbol of a VITS input whose ids lasted
    ``samples`` each, the audio starting at sample ``at``. ``symbols`` has one entry per input
    id: its symbol; ``None`` for an interspersed blank, which is heard as the start of the symbol
    after it (VITS makes the transition into a sound in the blank before it: the rule Piper's
    pads follow, measured there), except after a pause (a comma, a full stop: punctuation
    the voice keeps), where the blank is still the pause's silence and stays with the symbol
    before it; ``""`` for an id that is no sound (BOS, EOS), left out."""
    out: list[tuple[str, int, int]] = []
    cursor = at
    pending: int | None = None  # first sample of the blank just before, if any
    paused = False  # a pause mark since the last symbol that is not a space or a pause
    for symbol, n in zip(symbols, samples, strict=True):
        first = cursor
        cursor += int(n)
        if symbol is None:
            pending = first if pending is None else pending
            continue
        if symbol:
            # Measured (docs/speech-marks.md, "Accuracy"): after a comma the blank before the
            # next word is as silent as the pause, and counting it put words 26 ms early at
            # the median, 106 ms at worst; from their own frames, 8 ms and 40 ms.
            start = first if pending is None or paused else pending
            if paused and out:
                previous, since, _ = out[-1]
                out[-1] = (previous, since, start - since)
            out.append((symbol, start, cursor - start))
            if symbol in _PAUSES:
                paused = True
            elif symbol.strip():
                paused = False
        pending = None
    return out


def sounding(phoneme: str) -> bool:
    """Whether ``phoneme`` is a sound (not a stress mark, space or punctuation)."""
    return bool(phoneme) and not all(ch in _SILENT for ch in phoneme)


def word_spans(text: str) -> list[tuple[int, int]]:
    """The words of ``text`` as character spans: whitespace-separated tokens without the
    punctuation around them; a token of punctuation only is no word."""
    spans = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        start = match.start() + len(token) - len(token.lstrip(_AROUND))
        end = match.start() + len(token.rstrip(_AROUND))
        if start < end:
            spans.append((start, end))
    return spans


# Punctuation around a word that is not said (a "%" or "#" is: it stays in the word).
_AROUND = ".,;:!?\"'()[]{}<>\u00ab\u00bb\u201c\u201d\u2018\u2019\u2026\u2014\u2013-\u00bf\u00a1*_"


def align_words(
    text: str,
    stream: Sequence[tuple[str, int, int]],
    phonemes_of: Callable[[str], Sequence[str]],
) -> tuple[WordTiming, ...]:
    """The timing of each word of ``text`` from the engine's phoneme ``stream`` of it:
    ``(phoneme, first sample, samples)`` in order (spaces and punctuation included).
    ``phonemes_of(word)`` is the engine's phonemization of one word alone."""
    spans = word_spans(text)
    if not spans:
        return ()
    heard = [i for i, (ph, _, _) in enumerate(stream) if sounding(ph)]
    if not heard:
        return ()
    word_syms: list[str] = []
    owner_of_sym: list[int] = []
    for w, (start, end) in enumerate(spans):
        for ph in phonemes_of(text[start:end]):
            if sounding(ph):
                word_syms.append(_bare(ph))
                owner_of_sym.append(w)
    stream_syms = [_bare(stream[i][0]) for i in heard]
    owner: list[int | None] = [None] * len(heard)
    matcher = difflib.SequenceMatcher(None, word_syms, stream_syms, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            owner[b + k] = owner_of_sym[a + k]
    # Monotone: a stray match that would put a word before its predecessor is dropped.
    last = -1
    owned: list[list[int]] = [[] for _ in spans]
    for j, maybe in enumerate(owner):
        if maybe is not None and maybe < last:
            owner[j] = None
        elif maybe is not None:
            last = maybe
            owned[maybe].append(j)
    # Unmatched sounds between two words' matches go to a word that matched nothing there, or
    # else to the word before them (a sound espeak added in context: a linking r, a longer vowel).
    for w in range(len(spans)):
        if owned[w]:
            continue
        prior = max((owned[v][-1] for v in range(w) if owned[v]), default=-1)
        after = min((owned[v][0] for v in range(w + 1, len(spans)) if owned[v]), default=len(heard))
        free = [j for j in range(prior + 1, after) if owner[j] is None]
        for j in free:
            owner[j] = w
        owned[w] = free
    # Sounds left over (espeak said more in context than alone: "%" after a number) belong to
    # the word they follow.
    for j, maybe in enumerate(owner):
        if maybe is None:
            before = [v for v in range(len(spans)) if owned[v] and owned[v][0] < j]
            if before:
                owned[before[-1]].append(j)
                owned[before[-1]].sort()
    out: list[WordTiming] = []
    floor = 0
    for w, (start, end) in enumerate(spans):
        if owned[w]:
            first, last_j = heard[owned[w][0]], heard[owned[w][-1]]
            # A stress mark before the word's first sound has frames of its own, and they are
            # the sound's beginning (measured: a vowel-initial word, "ˈaʊɚ", was heard 100 ms
            # before its vowel's frames).
            while first > 0 and stream[first - 1][0] in _STRESS:
                first -= 1
            t0 = max(floor, stream[first][1])
            t1 = max(t0, stream[last_j][1] + stream[last_j][2])
            phonemes = tuple(
                (stream[i][0], stream[i][1])
                for i in range(first, last_j + 1)
                if sounding(stream[i][0])
            )[:MAX_PHONEMES_PER_WORD]
        else:
            t0 = t1 = floor  # nothing of it was heard (a word espeak dropped): an instant
            phonemes = ()
        out.append(WordTiming(start, end, t0, t1, phonemes))
        floor = t0
    return tuple(out)


def _bare(phoneme: str) -> str:
    """A phoneme without its length mark, for matching (context lengthens vowels)."""
    return phoneme.replace("\u02d0", "") or phoneme
