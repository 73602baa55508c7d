"""Text front ends: what a request's text becomes before it is normalized and hashed.

A request may ask for a front end (``normalize`` in its body); else the ``normalize`` setting
chooses. The front end runs before :func:`cache.keys.normalize_text`, so its output, not the raw
text, is the content address: two replies that differ only in markup share one entry.

- ``none``: the text as it is;
- ``llm``: a language model's Markdown reply as plain words (:mod:`gateway.api.llmtext`).

Issue 16 adds its front ends (numbers, SSML) here, in this table.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.api.llmtext import speakable


def _as_is(text: str) -> str:
    return text


FRONT_ENDS: dict[str, Callable[[str], str]] = {
    "none": _as_is,
    "llm": speakable,
}
NORMALIZE_MODES = tuple(FRONT_ENDS)


def front_end(text: str, mode: str) -> str:
    """``text`` through the front end ``mode`` (one of :data:`NORMALIZE_MODES`)."""
    return FRONT_ENDS[mode](text)
