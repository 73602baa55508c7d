"""Splitting text into sentences (the unit of the sentence-level cache) and joining their audio.

Templated prompts ("Your balance is 42 dollars. Press 1 to repeat.") share most sentences, so each
sentence is cached and synthesized on its own. pysbd is rule-based (abbreviations, decimals,
initials: "Dr. Smith paid $4.50." stays one sentence) and costs about 0.2-1 ms per text, so callers
run it off the event loop and only on a miss.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pysbd

from synth.audio import FloatPCM


class SentenceSplitter:
    """Splits normalized text into normalized sentences.

    A pysbd ``Segmenter`` keeps per-call state, so each thread gets its own (callers split on an
    executor's threads).
    """

    def __init__(self, language: str = "en") -> None:
        self.language = language
        self._local = threading.local()

    def _segmenter(self) -> pysbd.Segmenter:
        seg: pysbd.Segmenter | None = getattr(self._local, "segmenter", None)
        if seg is None:
            seg = pysbd.Segmenter(language=self.language, clean=False)
            self._local.segmenter = seg
        return seg

    def split(self, text: str) -> list[str]:
        """The sentences of ``text`` (already whitespace-normalized), stripped, none empty.

        Joining the result with single spaces gives ``text`` back, so nothing is dropped.
        """
        sentences: list[str] = []
        pending = ""  # leading fragments with nothing to say, carried into the next sentence
        for part in self._segmenter().segment(text):
            part = part.strip()
            if not part:
                continue
            if not any(ch.isalnum() for ch in part):
                # "...", "?!", a dash: a voice produces no audio for these alone, so they stay
                # attached to a neighbour, as they were in the text.
                if sentences:
                    sentences[-1] = f"{sentences[-1]} {part}"
                else:
                    pending = f"{pending} {part}".strip()
                continue
            sentences.append(f"{pending} {part}".strip() if pending else part)
            pending = ""
        if pending:
            return [text]  # nothing speakable anywhere: the engine decides what to do with it
        return sentences or [text]


def join(parts: Sequence[FloatPCM], sample_rate: int, pause_s: float) -> FloatPCM:
    """Concatenate sentence audio with ``pause_s`` of silence between consecutive sentences."""
    if len(parts) == 1:
        return parts[0]
    gap = np.zeros(round(pause_s * sample_rate), dtype=np.float32)
    pieces: list[FloatPCM] = []
    for i, part in enumerate(parts):
        if i:
            pieces.append(gap)
        pieces.append(part)
    return np.concatenate(pieces).astype(np.float32, copy=False)


def leading_pause(pcm: FloatPCM, sample_rate: int, pause_s: float) -> FloatPCM:
    """``pcm`` preceded by the inter-sentence pause: a streamed sentence after the first, so that
    the streamed chunks add up to exactly :func:`join`'s output."""
    gap = np.zeros(round(pause_s * sample_rate), dtype=np.float32)
    return np.concatenate([gap, pcm]).astype(np.float32, copy=False)
