"""Text front ends: what a request's text becomes before it is normalized and hashed.

Which one runs, and why its output is the content address: docs/api.md, "Text front ends".

- ``none``: the text as it is;
- ``llm``: a language model's Markdown reply as plain words (:mod:`gateway.api.llmtext`);
- ``numbers``: numbers, amounts, dates, times and phone numbers as words, in the voice's
  language (:mod:`gateway.api.readings`).

SSML is not a mode: a text that starts with ``<speak`` is a document (:mod:`gateway.api.ssml`),
whatever the mode; ``numbers`` also applies to its words.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.api.llmtext import speakable
from gateway.api.readings import read_numbers

# front end(text, num2words language of the voice) -> text
FRONT_ENDS: dict[str, Callable[[str, str], str]] = {
    "none": lambda text, language: text,
    "llm": lambda text, language: speakable(text),
    "numbers": read_numbers,
}
NORMALIZE_MODES = tuple(FRONT_ENDS)


def front_end(text: str, mode: str, language: str = "") -> str:
    """``text`` through the front end ``mode`` (one of :data:`NORMALIZE_MODES`); ``language``
    is the voice's num2words language (:func:`gateway.api.normalize.language_of`)."""
    return FRONT_ENDS[mode](text, language)
