"""Text normalization on IVR corpora (bench/corpora): which library reads prompts right.

Corpus format: bench/corpora/README.md.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import NamedTuple

CORPORA = Path(__file__).parent / "corpora"


class Case(NamedTuple):
    section: str
    text: str
    readings: tuple[str, ...]


def load_corpus(name: str) -> list[Case]:
    """The cases of ``bench/corpora/<name>.txt``."""
    cases: list[Case] = []
    section = ""
    for line in (CORPORA / f"{name}.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            section = line.lstrip("#").strip() or section
            continue
        text, *readings = line.split("\t")
        if not readings:
            raise ValueError(f"{name}: no accepted reading for {text!r}")
        cases.append(Case(section, text, tuple(readings)))
    return cases


_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def canon(text: str, lang: str) -> str:
    """What two readings must share to sound alike: case, punctuation and spacing aside."""
    text = unicodedata.normalize("NFKC", text).lower().replace("-", " ")
    text = _PUNCT.sub(" ", text)
    if lang == "zh":
        return re.sub(r"\s+", "", text)
    return " ".join(text.split())


def accepted(output: str, case: Case, lang: str) -> bool:
    """Whether ``output`` reads ``case`` as one of its accepted readings."""
    got = canon(output, lang)
    return any(got == canon(r, lang) for r in case.readings)
