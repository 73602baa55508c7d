"""Speech marks: when each sentence, word and viseme of a rendition is heard (docs/speech-marks.md).

An engine that can tell (Piper) returns where each word of a sentence is heard
(:mod:`synth.alignment`); the sentence's master stores that alignment beside its audio. A
rendition joins its sentences with pauses and SSML breaks, so its marks are composed from its
masters' alignments exactly as its audio is joined (:func:`synth.sentences.part_offsets`), and
stored with it as Amazon Polly's speech marks: one JSON object per line,
``{"time": 373, "type": "word", "start": 5, "end": 9, "value": "Mary"}``, ``time`` in ms from
the start of the audio, ``start``/``end`` UTF-8 byte offsets into the rendition's text (the
request's text as normalized, or its SSML expansion's words). A hit reads them; another format
or rate of the same audio has the same marks (times do not depend on the encoding).

From the stored marks: the captions (WebVTT, SubRip), ElevenLabs' character alignment, and
the request's own offsets (:class:`SourceMap`) where the request's text is at hand.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from gateway.speech.request import Segment
from synth.alignment import WordTiming, timings_from_json, timings_to_json
from synth.engine import Audio

MarkType = Literal["sentence", "word", "viseme", "ssml"]
MARK_TYPES: tuple[MarkType, ...] = ("sentence", "word", "viseme", "ssml")
CONTENT_TYPE = "application/x-ndjson"
# Longest caption cue, in characters (the BBC's and Netflix's 42 per line).
CUE_CHARS = 42

# Amazon Polly's visemes for English (US) from IPA (the Polly developer guide's phoneme and
# viseme table): p t S T f k i r s u @ a e E o O, and sil for silence. espeak-ng's IPA comes one
# symbol at a time (a diphthong's second part is not a viseme of its own, see _visemes).
_VISEME = {
    **dict.fromkeys("bpm", "p"),
    **dict.fromkeys("dtnlɾɫʔ", "t"),
    **dict.fromkeys("ʃʒʧʤ", "S"),
    **dict.fromkeys("θð", "T"),
    **dict.fromkeys("fv", "f"),
    **dict.fromkeys("kgɡŋhxɣ", "k"),
    **dict.fromkeys("iɪjy", "i"),
    **dict.fromkeys("ɹrɻ", "r"),
    **dict.fromkeys("sz", "s"),
    **dict.fromkeys("uʊw", "u"),
    **dict.fromkeys("əɐᵻ", "@"),
    **dict.fromkeys("aæɑ", "a"),
    "e": "e",
    **dict.fromkeys("ɛɜɝɚʌ", "E"),
    "o": "o",
    **dict.fromkeys("ɔɒ", "O"),
}
_VOWELS = frozenset("aæɑeɛɜəɐoɔɒʌ")
_GLIDES = frozenset("ɪʊ")


@dataclass(frozen=True)
class Mark:
    """One speech mark (Polly's fields)."""

    time: int
    type: MarkType
    start: int
    end: int
    value: str

    def as_json(self) -> dict[str, Any]:
        """The mark as Polly writes it (its fields, in Polly's order)."""
        return asdict(self)


def alignment_json(words: Sequence[WordTiming]) -> str:
    """A master's alignment as stored (compact JSON)."""
    return json.dumps(timings_to_json(words), separators=(",", ":"), ensure_ascii=False)


def stored_alignment(alignment: str, samples: int, chars: int) -> tuple[WordTiming, ...] | None:
    """The word timings a master stored (None: it has none, or they do not fit its audio)."""
    if not alignment:
        return None
    try:
        return timings_from_json(json.loads(alignment), samples, chars)
    except ValueError:
        return None


def _visemes(word: WordTiming) -> Iterator[tuple[int, str]]:
    """(first sample, viseme) of each viseme of ``word``: a phoneme's, where it changes; the
    second part of a diphthong (``aɪ``, ``oʊ``) is the first's."""
    previous = ""
    last_symbol = ""
    for phoneme, at in word.phonemes:
        symbol = unicodedata.normalize("NFC", phoneme)[:1]
        if symbol in _GLIDES and last_symbol in _VOWELS:
            last_symbol = symbol
            continue
        last_symbol = symbol
        viseme = _VISEME.get(symbol)
        if viseme is None or viseme == previous:
            continue
        previous = viseme
        yield at, viseme


def ssml_positions(segments: Sequence[Segment]) -> list[tuple[str, int]]:
    """Each SSML ``<mark>`` of an expansion: its name and character offset into the rendition's
    text (the segments' words joined by spaces, as :func:`gateway.api.ssml.joined_words`); a
    mark in a segment without words is where the next words start."""
    out: list[tuple[str, int]] = []
    cursor = 0
    waiting: list[str] = []
    first = True
    for seg in segments:
        if not seg.words:
            waiting += [name for name, _ in seg.marks]
            continue
        start = cursor if first else cursor + 1
        out += [(name, start) for name in waiting]
        waiting = []
        out += [(name, start + at) for name, at in seg.marks]
        cursor = start + len(seg.words)
        first = False
    out += [(name, cursor) for name in waiting]
    return out


def compose(
    text: str,
    sentence_texts: Sequence[str],
    masters: Sequence[Audio],
    placements: Sequence[tuple[int, int, int]],
    ssml: Sequence[tuple[str, int]] = (),
    total_samples: int = 0,
    cursor: int = 0,
) -> list[Mark] | None:
    """The marks of a rendition of ``text`` made of ``masters`` (one per sentence of
    ``sentence_texts``), each placed as :func:`synth.sentences.part_offsets` says: ``(first
    output sample, samples trimmed off its head, samples kept)``. None when a master has no
    alignment (its engine gives none, or it was stored before marks were). The sentences are
    looked for in ``text`` from character ``cursor`` on."""
    if not masters or any(m.words is None for m in masters):
        return None
    rate = masters[0].sample_rate
    offsets = _byte_offsets(text)
    marks: list[Mark] = []
    for sentence, master, (at, head, kept) in zip(sentence_texts, masters, placements, strict=True):
        found = text.find(sentence, cursor)
        base = found if found >= 0 else cursor
        cursor = base + len(sentence) if found >= 0 else cursor
        words = master.words or ()

        def ms(sample: int, at: int = at, head: int = head, kept: int = kept) -> int:
            inside = min(max(sample - head, 0), kept)
            return round((at + inside) * 1000 / rate)

        first = ms(words[0].t0) if words else ms(head)
        end_char = min(base + len(sentence), len(text))
        marks.append(Mark(first, "sentence", offsets[base], offsets[end_char], text[base:end_char]))
        for word in words:
            start, end = base + word.start, base + word.end
            if end > len(text) or text[start:end] != sentence[word.start : word.end]:
                continue  # (the sentence was not found as it was said: no offsets to give)
            marks.append(Mark(ms(word.t0), "word", offsets[start], offsets[end], text[start:end]))
            for sample, viseme in _visemes(word):
                marks.append(Mark(ms(sample), "viseme", 0, 0, viseme))
        if words:
            marks.append(Mark(ms(words[-1].t1), "viseme", 0, 0, "sil"))
    # An SSML mark is heard when the next word is (Polly's time for it); after the last word,
    # at the end of the audio.
    word_marks = [m for m in marks if m.type == "word"]
    end_ms = round(total_samples * 1000 / rate)
    for name, at in ssml:
        byte = offsets[min(at, len(text))]
        following = next((m.time for m in word_marks if m.start >= byte), end_ms)
        marks.append(Mark(following, "ssml", byte, byte, name))
    return sorted(marks, key=lambda m: (m.time, _ORDER[m.type]))


# Polly's order for marks of one time: the sentence, then the word, then its viseme.
_ORDER = {"ssml": 0, "sentence": 1, "word": 2, "viseme": 3}


def _byte_offsets(text: str) -> list[int]:
    """UTF-8 byte offset of each character of ``text``, and of its end."""
    return list(itertools.accumulate((len(ch.encode()) for ch in text), initial=0))


def to_ndjson(marks: Iterable[Mark]) -> str:
    """Marks as Polly's NDJSON (one object per line, each line ended)."""
    return "".join(
        json.dumps(m.as_json(), separators=(",", ":"), ensure_ascii=False) + "\n" for m in marks
    )


def from_ndjson(data: str) -> list[Mark]:
    """Marks from stored NDJSON (written by :func:`to_ndjson`)."""
    raws = [json.loads(line) for line in data.splitlines()]
    return [Mark(r["time"], r["type"], r["start"], r["end"], r["value"]) for r in raws]


def parse_types(value: str | None) -> frozenset[str] | None:
    """``?types=word,ssml`` as a set (None: every type); ValueError naming an unknown type."""
    if value is None or not value.strip():
        return None
    parts = [t.strip() for t in value.split(",")]
    if not all(parts):
        raise ValueError("an empty mark type")
    asked = set(parts)
    unknown = sorted(asked - set(MARK_TYPES))
    if unknown:
        raise ValueError(f"unknown mark type(s) {', '.join(unknown[:4])[:80]}")
    return frozenset(asked)


def chosen(marks: Iterable[Mark], types: frozenset[str] | None) -> list[Mark]:
    """The marks of ``types`` (all when None)."""
    return [m for m in marks if types is None or m.type in types]


# ---- captions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cue:
    """One caption: its text (the source's characters, one line) and when it shows (ms)."""

    start_ms: int
    end_ms: int
    text: str


def indexed_text(marks: Sequence[Mark]) -> bytes:
    """The text the marks' offsets index, as far as the marks carry it: each sentence mark's
    ``value`` at its offsets (a sentence mark holds its sentence as the text has it, punctuation
    and case included), spaces between them."""
    sentences = [m for m in marks if m.type == "sentence"]
    out = bytearray(b" " * max((m.end for m in sentences), default=0))
    for m in sentences:
        value = m.value.encode()
        if len(value) == m.end - m.start:
            out[m.start : m.end] = value
    return bytes(out)


_SPACE = re.compile(rb"\s+")


def _one_line(raw: bytes) -> str:
    # Whitespace runs (newlines of a source text included) are one space: a cue is one line,
    # so no blank line can end it early and no line of it can pass for a cue's index or timing.
    return " ".join(raw.decode("utf-8", errors="replace").split())


def cues(
    marks: Sequence[Mark], duration_ms: int, max_chars: int = CUE_CHARS, text: bytes | None = None
) -> list[Cue]:
    """Captions from the word marks, their text cut from ``text`` (the text the marks' offsets
    index; by default what the sentence marks carry, :func:`indexed_text`), so a cue shows the
    source's punctuation and case, and, where the offsets index what the client sent, its own
    characters ("$5" rather than the "five dollars" a front end made of it). Phrases of at most
    ``max_chars`` characters (a longer word is a cue alone), cut at the whitespace between two
    words (words that share one span, the words a number was read as, are never cut apart), a
    sentence never sharing a cue with the next; each shows from its first word until the next
    cue (the last one until ``duration_ms``)."""
    source = indexed_text(marks) if text is None else text
    size = len(source)
    sentences = sorted((m.start, m.end) for m in marks if m.type == "sentence")
    # Words in time order; words of one span (or overlapping spans) are one unit.
    units: list[tuple[int, int, int]] = []  # (time of the first, start byte, end byte)
    for w in (m for m in marks if m.type == "word"):
        if w.start < 0 or w.end > size:
            continue
        if units and w.start < units[-1][2]:
            units[-1] = (units[-1][0], units[-1][1], max(units[-1][2], w.end))
        else:
            units.append((w.time, w.start, w.end))

    def sentence_of(byte: int) -> tuple[int, int]:
        at = bisect.bisect_right(sentences, (byte, size + 1)) - 1
        if at >= 0 and sentences[at][0] <= byte < max(sentences[at][1], sentences[at][0] + 1):
            return sentences[at]
        return (byte, byte)

    # Where the text of a cue ending before unit k ends, and of one starting with it starts.
    ends: list[int] = []
    begins: list[int] = []
    for k, (_, start, _end) in enumerate(units):
        own = sentence_of(start)
        previous = units[k - 1] if k else None
        if previous is None or sentence_of(previous[1]) != own:
            begins.append(min(own[0], start))
            if previous is not None:
                ends.append(max(sentence_of(previous[1])[1], previous[2]))
            continue
        gap = source[previous[2] : start]
        # The whitespace last in the gap: what precedes it (a comma, a dash) ends the cue before,
        # what follows it (an opening quote or bracket) begins the next.
        spaces = list(_SPACE.finditer(gap))
        cut = spaces[-1] if spaces else None
        ends.append(previous[2] + cut.start() if cut else start)
        begins.append(previous[2] + cut.end() if cut else start)
    if units:
        ends.append(max(sentence_of(units[-1][1])[1], units[-1][2]))
    groups: list[tuple[int, int]] = []  # (first unit, last unit)
    for k in range(len(units)):
        if groups:
            first, last = groups[-1]
            same_sentence = sentence_of(units[k][1]) == sentence_of(units[first][1])
            if same_sentence and len(_one_line(source[begins[first] : ends[k]])) <= max_chars:
                groups[-1] = (first, k)
                continue
        groups.append((k, k))
    out = []
    for i, (first, last) in enumerate(groups):
        start_ms = units[first][0]
        end_ms = units[groups[i + 1][0]][0] if i + 1 < len(groups) else duration_ms
        line = _one_line(source[begins[first] : ends[last]])
        out.append(Cue(start_ms, max(end_ms, start_ms + 1), line))
    return out


def _stamp(ms: int, sep: str) -> str:
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{sep}{millis:03d}"


def _cue_lines(cue: Cue, sep: str, text: str) -> list[str]:
    return [f"{_stamp(cue.start_ms, sep)} --> {_stamp(cue.end_ms, sep)}", text, ""]


def vtt_text(text: str) -> str:
    """``text`` as WebVTT cue text says it: the W3C WebVTT spec's escapes for ``&``, ``<`` and
    ``>`` (so no tag can start and ``-->`` cannot appear)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# U+2060 WORD JOINER: invisible, and no character of a tag or of a timing arrow.
_JOINER = "\u2060"


def srt_text(text: str) -> str:
    """``text`` as SubRip cue text: SubRip has no escapes, so a word joiner goes inside what a
    player would read as markup (``<b>``, an ASS override ``{\\an8}``) or a timing arrow (``-->``);
    what shows is the same."""
    return (
        text.replace("-->", f"--{_JOINER}>")
        .replace("<", f"<{_JOINER}")
        .replace("{\\", f"{{{_JOINER}\\")
    )


def webvtt(cue_list: Sequence[Cue]) -> str:
    """WebVTT (W3C WebVTT: a ``WEBVTT`` line, then cues ``00:00:00.000 --> 00:00:01.000``)."""
    blocks = (_cue_lines(cue, ".", vtt_text(cue.text)) for cue in cue_list)
    return "\n".join(["WEBVTT", "", *(line for lines in blocks for line in lines)])


def subrip(cue_list: Sequence[Cue]) -> str:
    """SubRip: numbered cues, ``00:00:00,000 --> 00:00:01,000``."""
    numbered = (
        [str(n), *_cue_lines(cue, ",", srt_text(cue.text))] for n, cue in enumerate(cue_list, 1)
    )
    return "\n".join(line for lines in numbered for line in lines)


# ---- ElevenLabs' character alignment ------------------------------------------------------------


def character_alignment(text: str, marks: Sequence[Mark], duration_ms: int) -> dict[str, Any]:
    """ElevenLabs' ``alignment`` of ``text`` (whose UTF-8 byte offsets the word marks are):
    each character with its start and end in seconds. A word's characters share its time
    evenly; the characters between two words (spaces, punctuation) run from the end of one to
    the start of the next; before the first word, from 0."""
    byte_at = _byte_offsets(text)
    index_of = {b: i for i, b in enumerate(byte_at)}
    n = len(text)
    starts = [0.0] * n
    ends = [0.0] * n
    words = [m for m in marks if m.type == "word" and m.start in index_of and m.end in index_of]
    spans = [(index_of[m.start], index_of[m.end], m.time) for m in words]
    ends_ms = [nxt[2] for nxt in spans[1:]] + [duration_ms] if spans else []
    covered = 0
    previous_end = 0.0
    for (first, last, time_ms), next_ms in zip(spans, ends_ms, strict=True):
        if first < covered:
            continue
        for i in range(covered, first):  # between words: the gap before this one
            starts[i], ends[i] = previous_end, time_ms / 1000.0
        # A word lasts until the next starts (its own end is not a mark of Polly's).
        length = max(1, last - first)
        step = (next_ms - time_ms) / 1000.0 / length
        for k in range(first, last):
            starts[k] = time_ms / 1000.0 + step * (k - first)
            ends[k] = starts[k] + step
        covered = last
        previous_end = ends[last - 1] if last > first else time_ms / 1000.0
    for i in range(covered, n):
        starts[i], ends[i] = previous_end, duration_ms / 1000.0
    return {
        "characters": list(text),
        "character_start_times_seconds": [round(s, 3) for s in starts],
        "character_end_times_seconds": [round(e, 3) for e in ends],
    }


# ---- offsets into what the client sent ----------------------------------------------------------


def _same(given: str, spoken: str) -> bool:
    # Normalizing makes any run of whitespace one space.
    return given == spoken or (spoken == " " and given.isspace())


class SourceMap:
    """Moves byte offsets into the rendition's text onto the request's input, where the input
    says the same words: plain text differs from its normalized form only in whitespace (runs
    collapsed, ends trimmed) and Unicode composition (NFC). A text a front end rewrote (numbers,
    Markdown) or an SSML document keeps offsets into the spoken text (``exact`` is False)."""

    def __init__(self, spoken: str, given: str) -> None:
        self.spoken = spoken
        self.given = given
        self.exact = False
        self._to_given: list[int] | None = None
        if unicodedata.normalize("NFC", given) != given:
            return  # composition changed lengths: character positions do not carry over
        spoken_bytes = _byte_offsets(spoken)
        given_bytes = _byte_offsets(given)
        mapping: dict[int, int] = {}
        j = 0
        for i, ch in enumerate(spoken):
            while j < len(given) and not _same(given[j], ch) and given[j].isspace():
                j += 1
            if j >= len(given) or not _same(given[j], ch):
                return
            mapping[spoken_bytes[i]] = given_bytes[j]
            j += 1
            mapping[spoken_bytes[i + 1]] = given_bytes[j]
        mapping.setdefault(0, 0)
        self._to_given = [mapping.get(b, -1) for b in range(len(spoken.encode()) + 1)]
        self.exact = True

    def mark(self, mark: Mark) -> Mark:
        """``mark`` with offsets into the input (as it is when not ``exact``)."""
        table = self._to_given
        if table is None or mark.type == "viseme":
            return mark
        start, end = table[mark.start], table[mark.end]
        if start < 0 or end < 0:
            return mark
        return Mark(mark.time, mark.type, start, end, mark.value)

    @property
    def text(self) -> str:
        """The text the offsets index."""
        return self.given if self.exact else self.spoken


# Words, runs of spaces, and each other character alone (a comma after a number is kept).
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
SourceChar = tuple[str, tuple[int, int]]


def rewritten_source(
    chars: Sequence[SourceChar], rewrite: Callable[[str], str]
) -> list[SourceChar]:
    """``chars`` (characters, each with the bytes of the document it stands for) as they are
    once ``rewrite`` (a text front end) has rewritten their text: a word it left as it was keeps
    its bytes; each word it wrote in place of others spans the bytes of all of those ("42" read
    "forty two": both words span "42", as a ``say-as`` of it does). Words are matched by
    difflib's longest common runs, so a rewritten number never takes a neighbour's bytes."""
    before = "".join(ch for ch, _ in chars)
    after = rewrite(before)
    if after == before or not before:
        return list(chars)
    old = [m.span() for m in _TOKEN.finditer(before)]
    new = [m.span() for m in _TOKEN.finditer(after)]
    matcher = difflib.SequenceMatcher(
        None, [before[a:b] for a, b in old], [after[a:b] for a, b in new], autojunk=False
    )
    out: list[SourceChar] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(chars[old[i1][0] : old[i2 - 1][1]])
        elif j1 < j2:
            if i1 < i2:
                spans = [span for _, span in chars[old[i1][0] : old[i2 - 1][1]]]
                span = (min(a for a, _ in spans), max(b for _, b in spans))
            else:  # words written where there were none: they span nothing, where they stand
                at = chars[old[i1][0]][1][0] if i1 < len(old) else chars[-1][1][1]
                span = (at, at)
            out.extend((ch, span) for ch in after[new[j1][0] : new[j2 - 1][1]])
    return out


class SsmlSourceMap:
    """Moves offsets into an SSML expansion's words (the rendition's text) onto the document the
    request sent, as Polly's marks of SSML input index the SSML: a word the document wrote
    spans its own bytes; a word a ``say-as``, ``sub`` or ``phoneme`` made spans that element's
    content (``<say-as interpret-as="cardinal">42</say-as>`` is said "forty two": two word
    marks, "forty" and "two", each spanning the bytes of "42"); an ``ssml`` mark spans its
    ``<mark/>`` element. ``shift`` is the bytes of a ``<speak>`` wrapper the document was given
    around the input (SSML sent without its root). Where the expansion's words are not the
    document's characters in order, the offsets stay in the spoken text (``exact`` False); words a
    front end wrote (``numbers``) are in order once ``chars`` are :func:`rewritten_source`."""

    def __init__(
        self,
        spoken: str,
        given: str,
        chars: Sequence[tuple[str, tuple[int, int]]],
        mark_spans: Sequence[tuple[int, int]],
        shift: int = 0,
    ) -> None:
        self.exact = False
        self._mark_spans = list(mark_spans)
        self._shift = shift
        self._size = len(given.encode())
        self._char_at = {b: i for i, b in enumerate(_byte_offsets(spoken))}
        spans: list[tuple[int, int] | None] = []
        j = 0
        for ch in spoken:
            if ch.isspace():
                spans.append(None)
                continue
            # The expansion drops what is not said (punctuation alone before the first words)
            # and joins pieces with spaces: its characters are the document's, in order, with
            # some left out.
            while j < len(chars) and chars[j][0] != ch:
                j += 1
            if j >= len(chars):
                return
            spans.append(chars[j][1])
            j += 1
        self._spans = spans
        self.exact = True

    def _moved(self, start: int, end: int) -> tuple[int, int]:
        lo = max(0, min(start - self._shift, self._size))
        hi = max(lo, min(end - self._shift, self._size))
        return lo, hi

    def marks(self, found: Sequence[Mark]) -> list[Mark]:
        """``found`` with offsets into the document (as they are when not ``exact``)."""
        if not self.exact:
            return list(found)
        out = []
        ssml_seen = 0
        # The k-th ssml mark is the k-th <mark/> (both in document order) when all are there.
        ssml_known = sum(m.type == "ssml" for m in found) == len(self._mark_spans)
        for mark in found:
            if mark.type == "ssml":
                if ssml_known:
                    span = self._moved(*self._mark_spans[ssml_seen])
                    mark = Mark(mark.time, mark.type, span[0], span[1], mark.value)
                ssml_seen += 1
            elif mark.type != "viseme":
                first, last = self._char_at.get(mark.start), self._char_at.get(mark.end)
                if first is not None and last is not None:
                    covered = [s for s in self._spans[first:last] if s is not None]
                    if covered:
                        span = self._moved(min(s[0] for s in covered), max(s[1] for s in covered))
                        mark = Mark(mark.time, mark.type, span[0], span[1], mark.value)
            out.append(mark)
        return out
