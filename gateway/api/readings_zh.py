"""Mandarin readings of a prompt's digits (docs/ssml.md, "Readings")."""

from __future__ import annotations

from gateway.api.normalize import normalize_numbers


def read_chinese(text: str) -> str:
    """``text`` with its numbers read as a Mandarin-speaking caller expects."""
    return normalize_numbers(text, "zh")
