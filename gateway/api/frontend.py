"""Text front ends: what a request's text becomes before it is normalized and hashed.

Which one runs, and why its output is the content address: docs/api.md, "Text front ends".

- ``none``: the text as it is;
- ``llm``: a language model's Markdown reply as plain words (:mod:`gateway.api.llmtext`);
- ``numbers``: numbers, amounts, dates, times and phone numbers as words, in the voice's
  language (:mod:`gateway.api.readings`);
- ``auto`` (the default): the model's own front end (:func:`front_end_mode`), ``numbers`` for an
  engine that reads digits badly, ``none`` for a provider that reads them itself.

SSML is not a mode: a text that starts with ``<speak`` is a document (:mod:`gateway.api.ssml`),
whatever the mode; ``numbers`` (as asked, or as ``auto`` resolves) also applies to its words.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.api.llmtext import speakable
from gateway.api.normalize import language_of
from gateway.api.readings import read_numbers

# front end(text, language of the voice as numbers_language gives it) -> text
FRONT_ENDS: dict[str, Callable[[str, str], str]] = {
    "none": lambda text, language: text,
    "llm": lambda text, language: speakable(text),
    "numbers": read_numbers,
}
AUTO = "auto"
NORMALIZE_MODES = (AUTO, *FRONT_ENDS)


# Languages the numbers front end reads in beyond num2words' (gateway.api.readings: Mandarin).
OWN_READINGS = ("zh",)


def numbers_language(voice_language: str) -> str:
    """The language the numbers front end reads a voice of ``voice_language`` ("en_US",
    "zh-CN") in: num2words' (:func:`gateway.api.normalize.language_of`) or one of
    :data:`OWN_READINGS`; "" when it has none."""
    lang = language_of(voice_language)
    if lang:
        return lang
    base = voice_language.replace("-", "_").split("_")[0].lower()
    return base if base in OWN_READINGS else ""


def front_end_mode(mode: str, model_front_end: str, voice_language: str) -> str:
    """The front end (a key of :data:`FRONT_ENDS`) that ``mode`` (one of
    :data:`NORMALIZE_MODES`) runs for a voice of ``voice_language`` ("en_US") on a model whose
    own front end is ``model_front_end`` (:attr:`synth.engine.EngineCapabilities.front_end`).

    ``auto`` is the model's own, except that it never reads numbers in no known language: a
    voice whose language has no number words takes its text as it is, as it did before ``auto``
    (an explicit ``numbers`` refuses digits there)."""
    if mode != AUTO:
        return mode
    if model_front_end == "numbers" and not numbers_language(voice_language):
        return "none"
    return model_front_end


def front_end(text: str, mode: str, language: str = "") -> str:
    """``text`` through the front end ``mode`` (a key of :data:`FRONT_ENDS`); ``language`` is
    the voice's reading language (:func:`numbers_language`)."""
    return FRONT_ENDS[mode](text, language)
