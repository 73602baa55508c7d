"""The ``llm`` text front end: a language model's Markdown reply turned into text worth speaking.

What it keeps and drops: docs/api.md, "Text front ends". Headings, list items and table rows end
as sentences so that the voice pauses between them instead of running them together.

Markdown is parsed with markdown-it-py (CommonMark), not with regular expressions: nesting,
escapes (``\\*`` stays ``*``) and intraword underscores (``snake_case``) are its rules, not ours.
Emoji are found with the ``regex`` module's Unicode properties (``Extended_Pictographic``), which
the standard ``re`` lacks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from urllib.parse import urlsplit

import regex
from markdown_it import MarkdownIt
from markdown_it.token import Token

# Pictographs, skin-tone modifiers, zero-width joiners, variation selector 16, keycap marks, and
# regional-indicator pairs (flags). Digits and '#', which Unicode also counts as "Emoji", stay.
_EMOJI = regex.compile(
    r"[\p{Extended_Pictographic}\p{Emoji_Modifier}\p{Regional_Indicator}\u200d\ufe0f\u20e3]+"
)
_URL = regex.compile(r"\b(?:https?://|www\.)[^\s<>()\"']+", regex.IGNORECASE)
_SPACES = regex.compile(r"[ \t]+")
_SPACE_BEFORE_PUNCT = regex.compile(r"\s+([.,;:!?])")
_SENTENCE_END = (".", "!", "?", ":", ";", "…")
# Blocks whose end also ends a spoken sentence.
_SENTENCE_BLOCKS = {"heading_close", "list_item_close", "tr_close"}
# Blocks whose end is a comma's pause (a table's cells within a row).
_CLAUSE_BLOCKS = {"th_close", "td_close"}


@functools.cache
def _parser() -> MarkdownIt:
    # CommonMark plus tables and strikethrough (what chat models write); raw HTML is parsed as
    # HTML tokens so that it can be dropped.
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def _host(match: regex.Match[str]) -> str:
    url = match.group(0).rstrip(".,;:!?")
    tail = match.group(0)[len(url) :]
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = (parts.hostname or "").removeprefix("www.")
    return str(host + tail)


def _inline(children: Sequence[Token]) -> str:
    out: list[str] = []
    for tok in children:
        if tok.type in ("text", "code_inline"):
            out.append(tok.content)
        elif tok.type in ("softbreak", "hardbreak"):
            out.append(" ")
        elif tok.type == "image":
            out.append(_inline(tok.children or []))
        # link_open/close, em/strong/s open/close and html_inline carry no words: dropped.
    return "".join(out)


def _end_sentence(parts: list[str]) -> None:
    """End the text so far as a sentence (a period unless it already ends like one)."""
    while parts and not parts[-1].strip(" ,"):
        parts.pop()
    if parts:
        parts[-1] = parts[-1].rstrip(" ,")
        if not parts[-1].endswith(_SENTENCE_END):
            parts[-1] += "."
        parts.append(" ")


def speakable(text: str) -> str:
    """``text`` (Markdown, as a language model writes it) as plain words to speak."""
    parts: list[str] = []
    for tok in _parser().parse(text):
        if tok.type == "inline":
            parts.append(_inline(tok.children or []))
        elif tok.type in ("fence", "code_block"):
            parts.append(tok.content)
            _end_sentence(parts)
        elif tok.type in _SENTENCE_BLOCKS:
            _end_sentence(parts)
        elif tok.type in _CLAUSE_BLOCKS:
            parts.append(", ")
        elif tok.type == "paragraph_close":
            parts.append(" ")
    spoken = _URL.sub(_host, "".join(parts))
    spoken = _EMOJI.sub(" ", spoken)
    spoken = _SPACES.sub(" ", spoken)
    return str(_SPACE_BEFORE_PUNCT.sub(r"\1", spoken)).strip()
