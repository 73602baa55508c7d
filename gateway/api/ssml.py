"""The SSML front end: a ``<speak>`` document as a list of (words, pause, rate) segments
(:class:`gateway.speech.request.Segment`), from which the content address is computed.

Why the gateway expands SSML itself, what it accepts (beside Polly's, Google's and Azure's), what
it refuses and how it is bounded: docs/ssml.md.
"""

from __future__ import annotations

import re
import unicodedata
import xml.etree.ElementTree as ET
import xml.parsers.expat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import defusedxml
from defusedxml.ElementTree import fromstring

from cache.keys import normalize_text
from gateway.api import normalize
from gateway.errors import BadRequest, clip
from gateway.speech.request import Segment

# The first characters that make a text SSML. A startswith on the stripped text is the whole cost
# of detection on the plain-text hit path.
SSML_PREFIXES = ("<speak", "<?xml", "<!DOCTYPE")

MAX_BREAK_MS = 10_000  # Polly's bound on one break
# Breaks in a row add up; one silence stays under a minute (what a stored rendition may record).
MAX_PAUSE_MS = 60_000
MIN_RATE, MAX_RATE = 0.2, 4.0
# Azure documents these as multipliers; Polly and Google name the same words without numbers.
RATE_WORDS = {
    "x-slow": 0.5,
    "slow": 0.64,
    "medium": 1.0,
    "default": 1.0,
    "fast": 1.55,
    "x-fast": 2.0,
}
BREAK_STRENGTHS = {
    "none": 0,
    "x-weak": 125,
    "weak": 250,
    "medium": 500,
    "strong": 750,
    "x-strong": 1000,
}
IGNORED_TAGS = frozenset({"emphasis", "lang"})
# A <mark> rides through the expansion as one character of Unicode's supplementary private use
# area (its index added), which normalizing and joining keep in place, and is taken out at the
# end with its offset (speech marks of type "ssml": docs/speech-marks.md).
_MARK_BASE = 0xF0000
MAX_MARK_NAME = 128
CONTAINER_TAGS = frozenset({"speak", "p", "s", "paragraph", "sentence"})
# Tags whose purpose is to fetch something: refused whatever the unknown-tag setting says.
FETCHING_TAGS = frozenset({"audio", "lexicon", "lookup"})
# Sentence-final punctuation (optionally closed by quotes or brackets): two segments with the
# default pause between them, the first ending so, say the same as their words joined.
_SENTENCE_END = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*$")
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")


@dataclass(frozen=True)
class SsmlLimits:
    """Bounds on one document (settings ``ssml_*``)."""

    max_depth: int = 32
    max_elements: int = 1000
    max_expanded_chars: int = 8192
    unknown_tags: str = "refuse"


def is_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document (its first non-blank characters are ``<speak``, an
    XML declaration or a doctype, which is then refused)."""
    return text.lstrip().startswith(SSML_PREFIXES)


def _bad(message: str, code: str = "invalid_ssml") -> BadRequest:
    return BadRequest(f"SSML: {message}", param="input", code=code)


class _Tight:
    """The boundary between two segments that are one phrase (a rate change): no pause."""


_TIGHT = _Tight()
Boundary = int | None | _Tight


def _combine(a: Boundary, b: Boundary) -> Boundary:
    # A break replaces the sentence pause it falls on; consecutive breaks add up.
    if isinstance(a, _Tight):
        return b
    if isinstance(b, _Tight) or b is None:
        return a
    if a is None:
        return b
    return a + b


@dataclass
class _Piece:
    words: str
    pause: Boundary
    rate: float
    phonemes: bool = False
    # Marks right after IPA (which cannot hold them in its words): at its end.
    after_marks: str = ""


Span = tuple[int, int]


@dataclass
class _Positions:
    """Where each element and each run of text of a document is, in UTF-8 bytes (expat's
    events, in document order: the order :class:`_Expander` walks the elements in)."""

    # Per element (preorder): the element's own span (start tag to end tag), its content's.
    element: list[Span] = field(default_factory=list)
    content: list[Span] = field(default_factory=list)
    # Per element: each character of its text (before its first child) and of its tail (after
    # its end tag, before the next sibling), with the bytes it was written as.
    text: list[list[Span]] = field(default_factory=list)
    tail: list[list[Span]] = field(default_factory=list)


def _positions(document: str) -> _Positions:
    """The byte positions of ``document``'s elements and characters. Called only on a document
    :func:`expand` accepted (defusedxml refused declarations and entities already)."""
    raw = document.encode()
    found = _Positions()
    events: list[tuple[str, int, str]] = []  # (kind, byte index, character data)
    parser = xml.parsers.expat.ParserCreate()
    parser.StartElementHandler = lambda name, attrs: events.append(
        ("start", parser.CurrentByteIndex, "")
    )
    parser.EndElementHandler = lambda name: events.append(("end", parser.CurrentByteIndex, ""))
    parser.CharacterDataHandler = lambda data: events.append(
        ("data", parser.CurrentByteIndex, data)
    )
    parser.Parse(document, True)
    stack: list[int] = []
    slot: list[Span] | None = None
    for n, (kind, at, data) in enumerate(events):
        following = events[n + 1][1] if n + 1 < len(events) else len(raw)
        if kind == "start":
            index = len(found.element)
            found.element.append((at, at))
            found.content.append((following, following))
            found.text.append([])
            found.tail.append([])
            stack.append(index)
            slot = found.text[index]
        elif kind == "end":
            index = stack.pop()
            # A self-closed element's end event is where it ends; an end tag's, where it starts.
            end = at if raw[at - 2 : at] == b"/>" and at == following else raw.find(b">", at) + 1
            end = at if end <= at else end
            found.element[index] = (found.element[index][0], end)
            found.content[index] = (found.content[index][0], max(found.content[index][0], at))
            slot = found.tail[index]
        elif slot is not None:
            written = data.encode()
            # ("&" is never itself in text outside CDATA: there it is an entity's start.)
            if raw[at : at + len(written)] == written and raw[at : at + 1] != b"&":
                cursor = at
                for ch in data:
                    size = len(ch.encode())
                    slot.append((cursor, cursor + size))
                    cursor += size
            else:  # an entity, a character reference or a line end XML normalized
                slot.extend([(at, following)] * len(data))
    return found


@dataclass(frozen=True)
class SsmlSource:
    """Where an expansion's characters came from in its document: ``chars``, each character the
    expander emitted (before normalizing) with the bytes of the document it stands for (a
    ``say-as``, ``sub`` or ``phoneme`` expansion: the element's content, for each of its
    characters); ``marks``, each ``<mark>`` element's bytes, in document order."""

    chars: tuple[tuple[str, Span], ...]
    marks: tuple[Span, ...]


class _Expander:
    def __init__(
        self,
        lang: str,
        engine: str,
        takes_phonemes: bool,
        limits: SsmlLimits,
        positions: _Positions | None = None,
    ) -> None:
        self.lang = lang
        self.engine = engine
        self.takes_phonemes = takes_phonemes
        self.limits = limits
        self.pieces: list[_Piece] = []
        self.buffer: list[str] = []
        self.buffer_rate = 1.0
        self.leading: Boundary = _TIGHT
        self.mark_names: list[str] = []
        # With positions (speech marks' source offsets): what it emitted, whence.
        self.positions = positions
        self.visited = 0
        self.trace: list[tuple[str, Span]] = []
        self.mark_spans: list[Span] = []

    def text(self, value: str | None, rate: float, spans: Sequence[Span] = ()) -> None:
        if not value:
            return
        if self.positions is not None and len(spans) == len(value):
            self.trace.extend(zip(value, spans, strict=True))
        if rate != self.buffer_rate and "".join(self.buffer).strip():
            self.boundary(_TIGHT)
        self.buffer_rate = rate
        self.buffer.append(value)

    def _content(self, index: int, value: str) -> list[Span]:
        """Each character of ``value`` (what element ``index`` expands to) as its content."""
        if self.positions is None:
            return []
        return [self.positions.content[index]] * len(value)

    def boundary(self, pause: Boundary) -> None:
        words = normalize_text("".join(self.buffer))
        self.buffer.clear()
        if words:
            self.pieces.append(_Piece(words, pause, self.buffer_rate))
        elif self.pieces:
            self.pieces[-1].pause = _combine(self.pieces[-1].pause, pause)
        else:
            self.leading = _combine(self.leading, pause)

    def walk(self, element: ET.Element, depth: int, rate: float) -> None:
        if depth > self.limits.max_depth:
            raise _bad(
                f"elements nested deeper than {self.limits.max_depth} (ssml_max_depth)",
                code="ssml_too_deep",
            )
        index = self.visited
        self.visited += 1
        tag = _local(element.tag)
        if tag in FETCHING_TAGS:
            raise _bad(f"<{tag}> would fetch a URL; it is not supported", code="ssml_fetch")
        if tag in CONTAINER_TAGS:
            if tag != "speak":
                self.boundary(None)
            self.children(element, depth, rate, index)
            if tag != "speak":
                self.boundary(None)
        elif tag == "break":
            self.boundary(_break_ms(element))
        elif tag == "say-as":
            kind = element.get("interpret-as", "")
            said = normalize.say_as(
                kind, _only_text(element, tag), self.lang, element.get("format", "")
            )
            self.text(said, rate, self._content(index, said))
        elif tag == "sub":
            alias = element.get("alias")
            if alias is None:
                raise _bad("<sub> needs an alias attribute")
            _only_text(element, tag)
            self.text(alias, rate, self._content(index, alias))
        elif tag == "prosody":
            self.children(element, depth, _prosody_rate(element, rate), index)
        elif tag == "mark":
            name = element.get("name", "")
            if not name or len(name) > MAX_MARK_NAME:
                raise _bad(f"<mark> needs a name of 1-{MAX_MARK_NAME} characters")
            _only_text(element, tag)
            self.buffer.append(chr(_MARK_BASE + len(self.mark_names)))
            self.mark_names.append(name)
            if self.positions is not None:
                self.mark_spans.append(self.positions.element[index])
        elif tag == "phoneme":
            self.phoneme(element, rate, index)
        elif tag in IGNORED_TAGS or self.limits.unknown_tags == "strip":
            self.children(element, depth, rate, index)
        else:
            raise _bad(
                f"unsupported tag <{tag[:40]}> (ssml_unknown_tags=strip speaks its text instead)",
                code="ssml_unsupported_tag",
            )

    def children(self, element: ET.Element, depth: int, rate: float, index: int) -> None:
        positions = self.positions
        self.text(element.text, rate, positions.text[index] if positions else ())
        for child in element:
            child_index = self.visited
            self.walk(child, depth + 1, rate)
            self.text(child.tail, rate, positions.tail[child_index] if positions else ())

    def phoneme(self, element: ET.Element, rate: float, index: int) -> None:
        alphabet = element.get("alphabet", "ipa")
        if alphabet != "ipa":
            raise _bad(
                f'<phoneme> alphabet {clip(alphabet)} is not supported; use alphabet="ipa"',
                code="ssml_unsupported_tag",
            )
        if not self.takes_phonemes:
            raise _bad(
                f"<phoneme> needs an engine that takes phonemes; engine '{self.engine}' does not",
                code="ssml_unsupported_tag",
            )
        ph = element.get("ph")
        if not ph or not ph.strip():
            raise _bad("<phoneme> needs a ph attribute")
        _only_text(element, "phoneme")
        self.boundary(_TIGHT)
        if self.positions is not None:
            self.trace.extend(zip(ph, self._content(index, ph), strict=True))
        self.pieces.append(_Piece(normalize_text(ph), _TIGHT, rate, phonemes=True))

    def segments(self) -> tuple[Segment, ...]:
        self.boundary(_TIGHT)
        merged: list[_Piece] = []
        leading = self.leading
        leading_marks = ""
        for piece in self.pieces:
            prev = merged[-1] if merged else None
            if prev is not None and _joins(prev, piece):
                prev.words = f"{prev.words} {piece.words}"
                prev.pause = piece.pause
            elif not piece.phonemes and _unspoken(piece.words):
                # Punctuation alone ("Say <phoneme ...>tomato</phoneme>."): no voice has audio
                # for it, so it is not a segment of its own. It closes what it follows: words
                # take it (a "?" keeps its intonation), IPA cannot; a sentence end there ends
                # that sentence (the sentence pause, not a tight join).
                pause = piece.pause
                if isinstance(pause, _Tight) and _SENTENCE_END.search(piece.words):
                    pause = None
                marks_only = "".join(ch for ch in piece.words if _is_mark(ch))
                if prev is None:
                    leading = _combine(leading, pause)
                    leading_marks += marks_only
                    continue
                if not prev.phonemes:
                    prev.words += piece.words
                else:
                    prev.after_marks += marks_only
                prev.pause = _combine(prev.pause, pause)
            else:
                merged.append(_Piece(piece.words, piece.pause, piece.rate, piece.phonemes))
        out: list[Segment] = []
        pauses = [leading, *(piece.pause for piece in merged)]
        if any(isinstance(p, int) and p > MAX_PAUSE_MS for p in pauses):
            raise _bad(
                f"breaks in a row add up to more than {MAX_PAUSE_MS // 1000} s",
                code="ssml_break_too_long",
            )
        names = self.mark_names
        lead_ms = leading if isinstance(leading, int) and leading > 0 else None
        if lead_ms or leading_marks:
            out.append(Segment("", lead_ms, 1.0, marks=_take_marks(leading_marks, names)[1]))
        for i, piece in enumerate(merged):
            pause = piece.pause
            if isinstance(pause, _Tight) or pause == 0:
                pause = None if i == len(merged) - 1 else 0
            words, marks = _take_marks(piece.words, names) if names else (piece.words, ())
            if piece.after_marks:
                marks += tuple((n, len(words)) for n, _ in _take_marks(piece.after_marks, names)[1])
            out.append(Segment(words, pause, piece.rate, piece.phonemes, marks))
        return tuple(out)


def _unspoken(words: str) -> bool:
    """Whether ``words`` hold nothing a voice says: punctuation and spaces only (a symbol such as
    "%" or "$" is read out, so it is spoken)."""
    return all(
        ch.isspace() or unicodedata.category(ch).startswith("P") or _is_mark(ch) for ch in words
    )


def _is_mark(ch: str) -> bool:
    return _MARK_BASE <= ord(ch) <= 0xFFFFD


def _take_marks(words: str, names: Sequence[str]) -> tuple[str, tuple[tuple[str, int], ...]]:
    """``words`` without their mark characters, and each mark's (name, offset into them)."""
    out: list[str] = []
    found: list[tuple[str, int]] = []
    for ch in words:
        if _is_mark(ch):
            found.append((names[ord(ch) - _MARK_BASE], len(out)))
        elif not (ch == " " and (not out or out[-1] == " ")):
            out.append(ch)
    while out and out[-1] == " ":
        out.pop()
    n = len(out)
    return "".join(out), tuple((name, min(at, n)) for name, at in found)


def _joins(prev: _Piece, piece: _Piece) -> bool:
    """Whether two neighbouring pieces say the same as their words joined by a space."""
    if prev.phonemes or piece.phonemes or prev.rate != piece.rate:
        return False
    if isinstance(prev.pause, _Tight) or prev.pause == 0:
        return True
    return prev.pause is None and bool(_SENTENCE_END.search(prev.words))


def _local(tag: object) -> str:
    if not isinstance(tag, str):
        raise _bad("comments and processing instructions are not supported")
    return tag.rsplit("}", 1)[-1]


def _only_text(element: ET.Element, tag: str) -> str:
    if len(element):
        raise _bad(f"<{tag}> may hold text only, not elements")
    return element.text or ""


def _break_ms(element: ET.Element) -> int:
    if len(element) or (element.text or "").strip():
        raise _bad("<break> must be empty")
    time_attr = element.get("time")
    if time_attr is not None:
        match = _TIME_RE.match(time_attr)
        if match is None:
            raise _bad(f"<break> time {clip(time_attr)}: write it as 500ms or 1.5s")
        value = float(match.group(1)) * (1000 if match.group(2) == "s" else 1)
        if value > MAX_BREAK_MS:
            raise _bad(f"<break> longer than {MAX_BREAK_MS} ms", code="ssml_break_too_long")
        return round(value)
    strength = element.get("strength", "medium")
    if strength not in BREAK_STRENGTHS:
        raise _bad(f"<break> strength {clip(strength)}; supported: {', '.join(BREAK_STRENGTHS)}")
    return BREAK_STRENGTHS[strength]


def _prosody_rate(element: ET.Element, rate: float) -> float:
    value = element.get("rate")
    if value is None:
        return rate  # pitch and volume alone: accepted and ignored
    value = value.strip()
    factor: float | None = RATE_WORDS.get(value)
    if factor is None:
        try:
            if value.endswith("%"):
                number = float(value[:-1])
                # "+10%" / "-20%" are relative (Azure); "80%" is a percentage of normal (Polly).
                factor = 1 + number / 100 if value[0] in "+-" else number / 100
            else:
                factor = float(value)
        except ValueError:
            factor = None
    if factor is None or not MIN_RATE <= factor <= MAX_RATE:
        raise _bad(
            f"<prosody> rate {clip(value)}: use x-slow..x-fast, a percentage (20%-400%) or a "
            "multiplier (0.2-4)"
        )
    combined = round(rate * factor, 4)
    if not MIN_RATE <= combined <= MAX_RATE:
        raise _bad("<prosody> rates nested beyond 0.2-4 times the normal rate")
    return combined


def expand(
    text: str,
    *,
    language: str,
    engine: str = "",
    takes_phonemes: bool = False,
    limits: SsmlLimits | None = None,
) -> tuple[Segment, ...]:
    """The segments ``text`` (an SSML document) says, in canonical form: neighbours that say the
    same joined are joined, so equal speech has one expansion. ``language`` is the voice's
    language code (numbers are said in it); ``engine`` and ``takes_phonemes`` decide whether
    ``<phoneme>`` is possible. Raises :class:`BadRequest` for anything refused."""
    return _expander(text, language, engine, takes_phonemes, limits, None)[0]


def source_of(
    text: str,
    *,
    language: str,
    engine: str = "",
    takes_phonemes: bool = False,
    limits: SsmlLimits | None = None,
) -> SsmlSource:
    """Where each character :func:`expand` makes of ``text`` came from in it (speech marks'
    offsets into an SSML input). Raises as :func:`expand` does."""
    try:
        _, expander = _expander(text, language, engine, takes_phonemes, limits, _positions)
    except (xml.parsers.expat.ExpatError, IndexError):
        # (expat and defusedxml's parser read the one document alike; if they ever did not,
        # the marks keep offsets into the spoken text rather than fail the request.)
        return SsmlSource((), ())
    return SsmlSource(tuple(expander.trace), tuple(expander.mark_spans))


def _expander(
    text: str,
    language: str,
    engine: str,
    takes_phonemes: bool,
    limits: SsmlLimits | None,
    positions: Callable[[str], _Positions] | None,
) -> tuple[tuple[Segment, ...], _Expander]:
    limits = limits or SsmlLimits()
    if any(_is_mark(ch) for ch in text):
        # (These stand for <mark>s inside the expansion.)
        raise _bad("characters of the supplementary private use area A are not accepted")
    # Cheap bound before parsing: every element costs at least one '<'.
    if text.count("<") > 2 * limits.max_elements + 2:
        raise _bad(
            f"more than {limits.max_elements} elements (ssml_max_elements)",
            code="ssml_too_many_elements",
        )
    try:
        root = fromstring(text, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DTDForbidden as exc:
        raise _bad("document type declarations are refused", code="ssml_forbidden") from exc
    except defusedxml.EntitiesForbidden as exc:
        raise _bad("entity declarations are refused", code="ssml_forbidden") from exc
    except defusedxml.ExternalReferenceForbidden as exc:
        raise _bad("external references are refused", code="ssml_forbidden") from exc
    except ET.ParseError as exc:
        line, column = exc.position
        raise _bad(f"not well-formed XML (line {line}, column {column})") from exc
    if _local(root.tag) != "speak":
        raise _bad("the document's root element must be <speak>")
    count = sum(1 for _ in root.iter())
    if count > limits.max_elements:
        raise _bad(
            f"{count} elements; the limit is {limits.max_elements} (ssml_max_elements)",
            code="ssml_too_many_elements",
        )
    expander = _Expander(
        normalize.language_of(language),
        engine or "this engine",
        takes_phonemes,
        limits,
        positions(text) if positions is not None else None,
    )
    expander.walk(root, 1, 1.0)
    segments = expander.segments()
    expanded = sum(len(s.words) for s in segments)
    if expanded > limits.max_expanded_chars:
        raise _bad(
            f"expands to {expanded} characters; the limit is {limits.max_expanded_chars} "
            "(ssml_max_expanded_chars)",
            code="input_too_long",
        )
    if not any(s.words for s in segments):
        raise BadRequest(
            "'input' has nothing to speak after SSML expansion",
            param="input",
            code="nothing_to_speak",
        )
    return segments, expander


def plain_text(segments: Sequence[Segment]) -> str | None:
    """The plain text ``segments`` stand for when they are just words (one segment, normal rate,
    no pause, no phonemes): such an expansion has plain text's content address."""
    if len(segments) != 1:
        return None
    seg = segments[0]
    if seg.pause_ms is not None or seg.rate != 1.0 or seg.phonemes or seg.marks:
        return None
    return seg.words


def joined_words(segments: Sequence[Segment]) -> str:
    """The segments' words joined by spaces (logs, budgets and the request's ``text``)."""
    return " ".join(s.words for s in segments if s.words)
