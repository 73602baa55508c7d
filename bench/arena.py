"""ONNX Runtime's arena on the miss path: shrink after every run, keep it, or keep it for runs up
to ``KEEP_ARENA_IDS`` (voxgate's rule, synth/onnx_memory.py).

One Piper engine (the bundled voice, one intra-op thread, as a synthesis worker runs it) in this
process; the three policies take turns, round after round, on the same texts:

- CPU per ordinary IVR sentence (one-sentence prompts of 3-4 s, 165 ids), process time;
- the RSS above the engine's resting value after those sentences, and after one long run
  (a 12 s sentence, 499 ids) followed by ordinary ones again.

    python -m bench.arena [--rounds 3] [--sentences 40]

Writes docs/bench/arena.json and docs/bench/arena.png.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psutil

from bench.common import bar_plot, write_results

SHORT = "Thank you for calling Wonka, your parcel {} is ready for pickup in Austin."
LONG = (
    "Thank you for calling Wonka, your parcel 1 is ready for pickup in Austin, and your other "
    "parcel from the Chicago depot arrives on Monday morning between nine and eleven, please have "
    "your reference number ready when the driver calls you"
)
POLICIES = ("shrink_every_run", "keep_below_bound", "keep_always")


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def run(rounds: int, sentences: int) -> dict[str, Any]:
    from gateway.runtime.components import default_engine_specs
    from gateway.runtime.settings import Settings
    from synth.engine import SynthesisItem
    from synth.onnx_memory import KEEP_ARENA_IDS, ShrinkingSession

    spec = default_engine_specs(Settings.load(env={}))["piper"][0]
    engine: Any = spec.build(intra_op_threads=1)
    engine.load()
    engine.warm_up()
    sessions = [v.session for v in engine._voices.values()]
    assert all(isinstance(s, ShrinkingSession) for s in sessions)
    bounds = {"shrink_every_run": 0, "keep_below_bound": KEEP_ARENA_IDS, "keep_always": 1 << 30}
    texts = [SHORT.format(i) for i in range(sentences)]

    def speak(text: str) -> float:
        """Synthesize ``text``; the seconds of audio made."""
        (audio,) = engine.synthesize_batch([SynthesisItem(text, "joe")])
        return float(len(audio.pcm)) / engine.sample_rate

    def use(policy: str) -> None:
        # Start every measure from a shrunk arena: one run that shrinks.
        for session in sessions:
            session.keep_ids = 0
        speak("Warming up.")
        for session in sessions:
            session.keep_ids = bounds[policy]

    resting = _rss_mb()
    cpu: dict[str, list[float]] = {p: [] for p in POLICIES}
    rss_short: dict[str, list[float]] = {p: [] for p in POLICIES}
    rss_long: dict[str, list[float]] = {p: [] for p in POLICIES}
    long_s = 0.0
    for r in range(rounds):
        order = POLICIES if r % 2 == 0 else tuple(reversed(POLICIES))
        for policy in order:
            use(policy)
            started = time.process_time()
            for text in texts:
                speak(text)
            cpu[policy].append(1000 * (time.process_time() - started) / len(texts))
            rss_short[policy].append(_rss_mb() - resting)
            long_s = speak(LONG)
            for text in texts[:5]:  # ordinary sentences again after it
                speak(text)
            rss_long[policy].append(_rss_mb() - resting)
            print(
                f"round {r + 1} {policy}: {cpu[policy][-1]:.1f} ms CPU per sentence, "
                f"RSS +{rss_short[policy][-1]:.0f} MB, after a long run +{rss_long[policy][-1]:.0f} MB",
                flush=True,
            )
    # The ratios are those of the medians as reported (to 0.1 ms), so the JSON agrees with itself.
    med = {p: round(statistics.median(cpu[p]), 1) for p in POLICIES}
    return {
        "benchmark": "arena",
        "description": (
            "ONNX Runtime's CPU arena on the miss path, one Piper engine (bundled voice, one "
            "intra-op thread) in one process; policies take turns on the same texts each round"
        ),
        "keep_arena_ids": KEEP_ARENA_IDS,
        "ordinary_sentence": SHORT.format(1),
        "long_sentence_audio_s": round(long_s, 2),
        "resting_rss_mb": round(resting, 1),
        "cpu_ms_per_sentence": {p: [round(v, 1) for v in cpu[p]] for p in POLICIES},
        "median_cpu_ms_per_sentence": med,
        "rss_above_rest_mb_after_sentences": {
            p: [round(v) for v in rss_short[p]] for p in POLICIES
        },
        "rss_above_rest_mb_after_long_run": {p: [round(v) for v in rss_long[p]] for p in POLICIES},
        "shrink_every_run_over_keep_below_bound_cpu": round(
            med["shrink_every_run"] / med["keep_below_bound"], 3
        ),
        "keep_always_over_keep_below_bound_cpu": round(
            med["keep_always"] / med["keep_below_bound"], 3
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=40, help="ordinary sentences per measure")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    result = run(args.rounds, args.sentences)
    med = result["median_cpu_ms_per_sentence"]
    print("| policy | CPU ms per sentence (median) | RSS after sentences | after a long run |")
    print("|---|---|---|---|")
    for p in POLICIES:
        short = statistics.median(result["rss_above_rest_mb_after_sentences"][p])
        long = statistics.median(result["rss_above_rest_mb_after_long_run"][p])
        print(f"| {p} | {med[p]} | +{short:.0f} MB | +{long:.0f} MB |")
    print(
        "shrink every run / keep below the bound, CPU: "
        f"{result['shrink_every_run_over_keep_below_bound_cpu']}x"
    )
    if not args.no_write:
        print(write_results("arena", result))
        print(
            bar_plot(
                "arena",
                "Piper CPU per ordinary sentence by arena policy (lower is better)",
                list(POLICIES),
                [med[p] for p in POLICIES],
                "ms CPU per sentence",
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
