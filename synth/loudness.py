"""Loudness normalization of sentence masters: integrated loudness per ITU-R BS.1770-4
(K-weighting and gating, measured by pyloudnorm) brought to a target, and the true peak
(BS.1770-4 Annex 2: the peak of the signal oversampled 4x) held under a ceiling by a look-ahead
limiter. Every master passes here once, local voice or upstream provider alike, before it is
stored (``gateway.speech.masters``); renditions and streams are made of masters, so they carry
the same level. docs/synthesis.md, "Loudness", says why per sentence and why these numbers.

CPU work: the gateway runs it off the event loop, in the job that makes the master. pyloudnorm
and scipy are imported on first use: a gateway with ``loudness_lufs = "off"`` never loads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatPCM = npt.NDArray[np.float32]

# AES TD1008 (2021, "Recommendations for Loudness of Internet Audio Streaming and On-Demand
# Distribution", Table 1) anchors content whose speech is measurable, automated voice
# announcements included, at -18 LUFS, with true peaks at most -1 dBTP; AES TD1004 (2015) had
# -16 to -20 LUFS for streamed speech. TD1008's -1 dBTP is for what the listener decodes; its
# section on codec overshoot has the limiter before a low-rate coder set under -1 dBTP, since
# overshoot grows as the bit rate falls. One master feeds every rendition, so its ceiling sits
# the largest overshoot measured on speech under -1 dBTP: GSM 06.10 (13 kbit/s, which codes
# the waveform's envelope, not the waveform) adds up to 1.16 dB, AAC 0.80, G.722 0.70 (the
# bundled voice, 40 prompts; docs/synthesis.md).
DEFAULT_TARGET_LUFS = -18.0
CEILING_DBTP = -2.5
# What every rendition a caller receives is held to: the master's ceiling is set to keep it.
RENDITION_CEILING_DBTP = -1.0
# BS.1770's gating block; a shorter sentence is measured as one block over its sound.
BLOCK_S = 0.4
# BS.1770's absolute gate: a take quieter than this is silence, and is left as it is.
SILENCE_LUFS = -70.0
# Gain is never raised by more than this: a near-silent take (noise, a provider's hiss) is not
# brought up to speech level.
MAX_GAIN_DB = 24.0
# The limiter's gain falls within, and recovers over, this much around each over: long enough
# that the gain moves below the voice's pitch, short enough to leave the syllables beside alone.
LIMIT_WINDOW_S = 0.010
# Edges quieter than this (dBFS, sample magnitude) are not part of a short sentence's sound.
EDGE_DBFS = -50.0
# Passes of gain then limiting: the limiter takes a little loudness off, the next pass puts it
# back (a sentence limited by several dB needs the most).
PASSES = 4
CLOSE_ENOUGH_LU = 0.05
OVERSAMPLE = 4


@dataclass(frozen=True)
class Loudness:
    """A loudness target for masters: ``target_lufs`` integrated loudness (BS.1770-4), true
    peak at most ``ceiling_dbtp``."""

    target_lufs: float = DEFAULT_TARGET_LUFS
    ceiling_dbtp: float = CEILING_DBTP

    @property
    def address(self) -> str:
        """What enters a master's content address: the target, the ceiling and this module's
        rule (a change to the rule must give new addresses, as a new target does)."""
        return f"bs1770-4 v1 {self.target_lufs:g} LUFS {self.ceiling_dbtp:g} dBTP"

    def apply(self, pcm: FloatPCM, rate: int) -> FloatPCM:
        """``pcm`` at the target loudness, its true peak under the ceiling."""
        return normalize(pcm, rate, self.target_lufs, self.ceiling_dbtp)


def integrated_loudness(pcm: npt.NDArray[np.floating], rate: int) -> float:
    """BS.1770-4 integrated loudness in LUFS (-inf for silence). Under one gating block (400 ms)
    gating cannot run: the sentence is measured as one block over its sound, from its first to
    its last sample above :data:`EDGE_DBFS` (without that, a short word's own edge silence,
    50-250 ms on the bundled voice, would read several LU quiet and the word would be made that
    much too loud)."""
    import pyloudnorm

    x = np.asarray(pcm, dtype=np.float64)
    if x.size > BLOCK_S * rate:
        return float(pyloudnorm.Meter(rate, block_size=BLOCK_S).integrated_loudness(x))
    sound = np.flatnonzero(np.abs(x) > 10.0 ** (EDGE_DBFS / 20.0))
    if sound.size == 0:
        return float("-inf")
    x = x[sound[0] : sound[-1] + 1]
    # The K-weighting filters need a few samples; a click shorter than 2 ms is not a word.
    if x.size < 0.002 * rate:
        return float("-inf")
    # (pyloudnorm wants the signal longer than its block: one sample more.)
    return float(pyloudnorm.Meter(rate, block_size=(x.size - 1) / rate).integrated_loudness(x))


def _peak_envelope(x: FloatPCM) -> FloatPCM:
    """Per sample, the largest magnitude of the 4x oversampled signal around it (BS.1770-4
    Annex 2's true peak, taken sample by sample): an over between two samples is charged to
    the sample before it."""
    from scipy.signal import resample_poly

    up = resample_poly(x, OVERSAMPLE, 1)
    env = np.abs(x)
    for phase in range(1, OVERSAMPLE):
        np.maximum(env, np.abs(up[phase::OVERSAMPLE][: x.size]), out=env)
    return env


def true_peak(pcm: npt.NDArray[np.floating], rate: int) -> float:
    """BS.1770-4 Annex 2 true peak, linear (1.0 = full scale): the largest magnitude of the
    signal oversampled 4x. ``rate`` is not needed by the measure; it is taken for symmetry with
    :func:`integrated_loudness`."""
    x = np.asarray(pcm, dtype=np.float32)
    if x.size == 0:
        return 0.0
    return float(_peak_envelope(x).max())


def db(value: float) -> float:
    """A linear amplitude in dB (-inf for 0)."""
    return float(20.0 * np.log10(value)) if value > 0 else float("-inf")


def _limit(x: FloatPCM, env: FloatPCM, ceiling: float, width: int) -> FloatPCM:
    """``x`` with its gain lowered where its true-peak envelope ``env`` passes ``ceiling``.

    The gain each sample needs is held at its minimum over ``width`` samples either side, then
    averaged over the same window: every sample of the window around an over sees that over's
    gain in its minimum, so the average is never above the gain the over needs (a look-ahead
    limiter, without a sample-by-sample loop)."""
    from scipy.ndimage import minimum_filter1d, uniform_filter1d

    need = np.minimum(np.float32(1.0), np.float32(ceiling) / np.maximum(env, np.float32(1e-12)))
    if float(need.min()) >= 1.0:
        return x
    size = 2 * width + 1
    held = minimum_filter1d(need, size=size, mode="nearest")
    gain: FloatPCM = uniform_filter1d(held, size=size, mode="nearest")
    return x * gain


def normalize(pcm: FloatPCM, rate: int, target_lufs: float, ceiling_dbtp: float) -> FloatPCM:
    """``pcm`` brought to ``target_lufs`` (BS.1770-4 integrated loudness), its true peak at
    most ``ceiling_dbtp``; silence (below the absolute gate) comes back as it was."""
    measured = integrated_loudness(pcm, rate)
    if not np.isfinite(measured) or measured < SILENCE_LUFS:
        return pcm
    # A constant offset goes first: K-weighting does not hear it, so the gain would carry it
    # toward full scale, and a lossy coder rings at its edges (the tests' random-weight Coqui
    # model sits at -0.18: its AAC reached +4 dBTP with the offset kept).
    x = np.asarray(pcm, dtype=np.float32)
    x = x - np.float32(np.mean(x))
    ceiling = 10.0 ** (ceiling_dbtp / 20.0)
    width = max(1, round(LIMIT_WINDOW_S * rate))
    gain_db = min(target_lufs - measured, MAX_GAIN_DB)
    # The envelope scales with the gain: one oversampling for every pass.
    env = _peak_envelope(x)
    out = x
    for _ in range(PASSES):
        gain = np.float32(10.0 ** (gain_db / 20.0))
        out = _limit(x * gain, env * gain, ceiling, width)
        short = target_lufs - integrated_loudness(out, rate)
        if abs(short) < CLOSE_ENOUGH_LU or gain_db >= MAX_GAIN_DB:
            break
        gain_db = min(gain_db + short, MAX_GAIN_DB)
    # The limiter's gain moves slowly against the samples, so the oversampled peak of the
    # limited signal is the limited envelope to a hair; that hair is taken off here.
    over = true_peak(out, rate) / ceiling
    if over > 1.0:
        out = out / np.float32(over)
    return out.astype(np.float32)
