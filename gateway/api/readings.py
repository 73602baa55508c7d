"""Readings: what the ``numbers`` front end makes of digits, by the voice's language.

English (:mod:`gateway.api.readings_en`) and Mandarin (:mod:`gateway.api.readings_zh`) read an
IVR prompt as a caller expects (docs/ssml.md, "Readings"); any other language keeps the
num2words reading of :func:`gateway.api.normalize.normalize_numbers`.
"""

from __future__ import annotations

from gateway.api.normalize import normalize_numbers
from gateway.api.readings_en import read_prompt
from gateway.api.readings_zh import read_chinese


def read_numbers(text: str, lang: str) -> str:
    """``text`` with its digits read out in ``lang`` (a num2words language code)."""
    if lang == "en":
        return read_prompt(text)
    if lang == "zh":
        return read_chinese(text)
    return normalize_numbers(text, lang)
