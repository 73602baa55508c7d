"""English readings of an IVR prompt's digits (docs/ssml.md, "Readings")."""

from __future__ import annotations

from gateway.api.normalize import normalize_numbers


def read_prompt(text: str) -> str:
    """``text`` with its numbers read as an English-speaking caller expects."""
    return normalize_numbers(text, "en")
