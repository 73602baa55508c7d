"""Speech at the speed asked: how long each rendition lasts against 1/speed of speed 1's, and
how many phonemes go unheard (no frame), over IVR prompts at speeds 0.5-3.

A rendition is made as the gateway makes it: the text split into sentences
(``SentenceSplitter``, ``max_sentence_chars``), each said by the engine, joined with the sentence
pause at the speed (``assembly.pause_at_speed`` of ``sentence_pause_ms``). Its duration is its
whole length in samples, edge silence and pauses included: what a caller plays, and what the
speed contract is about (OpenAI's ``speed``: the audio lasts 1/speed). The voice's own edge
silence is made of the edge ids' frames, which the speed rule divides like the rest, and the
pauses are divided by the gateway, so nothing is left out of the measure. The span of speech
(first to last sample within 40 dB of the rendition's peak) is given beside it, as a check that
the edges are not what holds the length.

Synthesis is noise-free by default (noise scales 0: each rendition is the same every run, so a
ratio is the rule's, not chance's). With ``--noise default`` the voice's own noise scales are used,
drawn as the engine draws them: from a seed that leaves the speed out, so each speed divides the
same speed-1 durations (before that seed, each rendition drew its durations anew, and its length
differed from the speed-1 rendition's by chance as well as by the rule).

Per id, the frames are the graph's own (Piper's durations output, the one the speech marks
read; Coqui's ONNX export likewise): a phoneme is any id but the blank between phonemes (Piper's
pad, Coqui's ``add_blank`` id), BOS and EOS included.

Before and after: run on the tree before (``--save FILE --no-write``, e.g. in a worktree of the
commit before), then here with ``--before FILE``: both go into the JSON, the table and the PNG.

    python -m bench.speed                              # joe + the Coqui test model: ~3 min
    python -m bench.speed --save /tmp/before.json --no-write
    python -m bench.speed --before /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, provenance, write_results
from bench.plots import pyplot, save_figure

SPEEDS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
TOLERANCE = 0.05
PAUSE_MS = 250  # the default sentence_pause_ms
MAX_SENTENCE_CHARS = 300  # the default max_sentence_chars
SPAN_DB = 40.0

# IVR prompts: greetings and menus, confirmations, numbers read as words, short replies, and a
# few long notices (one word to five sentences).
PROMPTS = (
    "Hello.",
    "Goodbye.",
    "Yes.",
    "Press one.",
    "Thank you.",
    "Please hold.",
    "One moment please.",
    "Sorry, I didn't catch that.",
    "Thank you for calling.",
    "Please say yes or no.",
    "Your call is important to us.",
    "Please hold while we connect you.",
    "Welcome to Riverside Medical Center.",
    "To repeat this message, press star.",
    "Please enter your account number followed by the pound key.",
    "Your appointment is confirmed for Tuesday at three in the afternoon.",
    "For billing, press two. For technical support, press three.",
    "Your balance is forty two dollars and seventeen cents.",
    "Your estimated wait time is less than five minutes.",
    "We are currently experiencing higher than normal call volumes.",
    "Please have your insurance card ready.",
    "I can help you reschedule. Which day works best for you?",
    "Your package was delivered on Monday, June third, at the front door.",
    "To hear these options again, stay on the line.",
    "The pharmacy is open from eight in the morning until nine at night, seven days a week.",
    "Your prescription is ready for pickup.",
    "I'm sorry, that number is not valid. Please try again.",
    "Our offices are closed for the holiday. Please call back tomorrow.",
    "Please state the reason for your call after the tone.",
    "Your verification code is four, seven, one, nine.",
    "Your flight to Denver departs at six fifteen from gate twenty two.",
    "Press zero at any time to speak with an operator.",
    "Thank you for your patience. An agent will be with you shortly.",
    "Your payment of one hundred and twelve dollars has been received. Thank you.",
    "Is there anything else I can help you with today?",
    "Please listen carefully, as our menu options have changed.",
    "To check the status of an order, press one. To return an item, press two. For all other "
    "questions, press three.",
    "We could not find an account with that phone number. Please enter the number again, "
    "starting with the area code.",
    "This call may be recorded for quality and training purposes.",
    "Your next appointment is with Doctor Alvarez on Friday, the fourteenth, at ten thirty in "
    "the morning. Please arrive fifteen minutes early to complete your paperwork. If you need "
    "to cancel, call us at least one day before.",
    "Good morning! You've reached the service desk.",
    "Transferring you now.",
    "Your claim has been approved, and a check will be mailed within ten business days. You "
    "can also track your claim online. Is there anything else?",
    "Please remain on the line. Your call will be answered in the order it was received. We "
    "appreciate your patience. Thank you for choosing us.",
)


def silences(speed: float, rate: int) -> int:
    """Samples of one sentence pause at ``speed``, as the gateway joins them."""
    from gateway.speech.assembly import pause_at_speed

    return round(pause_at_speed(PAUSE_MS, speed) / 1000 * rate)


def span(pcm: np.ndarray[Any, Any]) -> int:
    """Samples from the first to the last within ``SPAN_DB`` of the peak."""
    loud = np.flatnonzero(np.abs(pcm) >= np.max(np.abs(pcm)) * 10 ** (-SPAN_DB / 20))
    return int(loud[-1] - loud[0] + 1) if loud.size else 0


class Piper:
    """The bundled voice joe, per espeak sentence run as the engine runs it."""

    name = "piper joe"

    def __init__(self, noise: bool) -> None:
        from piper.config import SynthesisConfig
        from piper.const import PAD

        from synth.piper_engine import PiperEngine, PiperVoiceFiles

        self.engine = PiperEngine([PiperVoiceFiles.bundled_joe()], speech_marks=True)
        self.engine.load()
        self.voice = self.engine._voices["joe"]
        self.rate = self.engine.sample_rate
        self.blank = self.voice.config.phoneme_id_map[PAD][0]
        params = self.engine.default_params("joe")
        self.config = SynthesisConfig(
            length_scale=float(params["length_scale"]),
            noise_scale=float(params["noise_scale"]) if noise else 0.0,
            noise_w_scale=float(params["noise_w"]) if noise else 0.0,
        )

    def sentence(self, text: str, speed: float) -> tuple[np.ndarray[Any, Any], int, int, float]:
        """Audio of one sentence, its phonemes with no frame, its phonemes, and the fewest
        frames a phoneme of its runs has (its frames over its phonemes)."""
        chunks, zero, phonemes, fewest = [], 0, 0, np.inf
        # The noise of every speed is the text's, as the engine's seed leaves the speed out.
        noise = (self.engine._noise["joe"], zlib.crc32(text.encode()))
        runs: Iterator[Any] = self.engine._runs(
            self.voice, self.voice.phonemize(text), self.config, speed, True, noise
        )
        for pcm, run, samples in runs:
            chunks.append(pcm)
            ids = self.voice.phonemes_to_ids(run)
            if samples is None or len(samples) != len(ids):
                raise RuntimeError("the graph gave no durations for the run")
            heard = [n for i, n in zip(ids, samples, strict=True) if i != self.blank]
            zero += sum(1 for n in heard if n == 0)
            phonemes += len(heard)
            fewest = min(fewest, len(pcm) / self.voice.config.hop_length / len(heard))
        return np.concatenate(chunks), zero, phonemes, fewest


class Coqui:
    """The tests' Coqui VITS (reduced size, random weights) as its ONNX export: its durations
    are no voice's, about one frame per id, so from speed 2 it has fewer frames than phonemes."""

    name = "coqui test model"

    def __init__(self, noise: bool, directory: Path) -> None:
        from bench.harness import build_vits
        from synth.coqui_engine import CoquiEngine

        model, config = build_vits(directory / "model")
        self.engine = CoquiEngine(model, config, mode="onnx", onnx_dir=directory / "onnx")
        self.engine.load()
        self.rate = self.engine.sample_rate
        tokenizer = self.engine._synth.tts_model.tokenizer
        self.blank = tokenizer.characters.blank_id if tokenizer.add_blank else None
        self.params = {} if noise else {"noise_scale": 0.0, "noise_scale_dp": 0.0}
        self.names = {i.name for i in self.engine._onnx.get_inputs()}

    def sentence(self, text: str, speed: float) -> tuple[np.ndarray[Any, Any], int, int, float]:
        from synth.engine import SynthesisItem

        item = SynthesisItem(text, "default", speed, self.params)
        feeds = self.engine._onnx_feeds(item, self.names)
        outputs = ["output", self.engine._onnx_durations]
        seed = zlib.crc32(text.encode())
        pcm, frames = self.engine._noise.run(self.engine._onnx, outputs, feeds, seed)
        ids = feeds["input"][0].tolist()
        heard = [
            n for i, n in zip(ids, np.asarray(frames).reshape(-1), strict=True) if i != self.blank
        ]
        zero = sum(1 for n in heard if n == 0)
        return pcm.reshape(-1), zero, len(heard), float(np.sum(frames)) / len(heard)


def rendition(engine: Any, text: str, speed: float) -> dict[str, Any]:
    from synth.sentences import SentenceSplitter

    parts, zero, phonemes, fewest = [], 0, 0, np.inf
    for sentence in SentenceSplitter().split(text, MAX_SENTENCE_CHARS):
        pcm, z, n, least = engine.sentence(sentence, speed)
        parts.append(pcm)
        zero, phonemes, fewest = zero + z, phonemes + n, min(fewest, least)
    gap = np.zeros(silences(speed, engine.rate), dtype=np.float32)
    joined = [p for part in parts for p in (gap, part)][1:]
    pcm = np.concatenate(joined)
    return {
        "samples": len(pcm),
        "span": span(pcm),
        "zero": zero,
        "phonemes": phonemes,
        "frames_per_phoneme": fewest,
    }


def measure(engine: Any, prompts: Sequence[str]) -> dict[str, Any]:
    """Per speed, each prompt's ratio of its length (and span) to 1/speed of speed 1's; and
    beside them the fewest frames per phoneme of any engine run at speed 1: the fastest speed
    at which every phoneme of it can have a frame and its length hold."""
    rows: dict[str, Any] = {}
    made = {(p, s): rendition(engine, p, s) for s in SPEEDS for p in prompts}
    per_phoneme = [made[p, 1.0]["frames_per_phoneme"] for p in prompts]
    rows["frames_per_phoneme_at_speed_1"] = {
        "min": round(float(np.min(per_phoneme)), 2),
        "median": round(float(np.median(per_phoneme)), 2),
    }
    for s in SPEEDS:
        ratios = [made[p, s]["samples"] * s / made[p, 1.0]["samples"] for p in prompts]
        spans = [made[p, s]["span"] * s / made[p, 1.0]["span"] for p in prompts]
        errors = np.abs(np.asarray(ratios) - 1)
        rows[f"{s:g}"] = {
            "renditions": len(prompts),
            "mean_ratio": round(float(np.mean(ratios)), 4),
            "min_ratio": round(float(np.min(ratios)), 4),
            "max_ratio": round(float(np.max(ratios)), 4),
            "max_error_pct": round(100 * float(errors.max()), 2),
            "outside_tolerance": int(np.sum(errors > TOLERANCE)),
            "span_max_error_pct": round(100 * float(np.max(np.abs(np.asarray(spans) - 1))), 2),
            "zero_frame_phonemes": sum(made[p, s]["zero"] for p in prompts),
            "renditions_with_zero_frame_phonemes": sum(1 for p in prompts if made[p, s]["zero"]),
            "phonemes": sum(made[p, s]["phonemes"] for p in prompts),
            "ratios": [round(r, 4) for r in ratios],
        }
    return rows


def table(label: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"\n{label}")
    head = (
        f"{'engine':18} {'speed':>5} {'mean':>7} {'min':>7} {'max':>7} {'max|err|':>9} "
        f"{'>5%':>4} {'span err':>9} {'0-frame ph.':>12}"
    )
    print(head)
    print("-" * len(head))
    for engine, rows in results.items():
        for speed, r in rows.items():
            if "renditions" not in r:
                print(f"{engine:18} fewest frames per phoneme at speed 1: {r['min']}")
                continue
            print(
                f"{engine:18} {speed:>5} {r['mean_ratio']:7.4f} {r['min_ratio']:7.4f} "
                f"{r['max_ratio']:7.4f} {r['max_error_pct']:8.2f}% "
                f"{r['outside_tolerance']:>2}/{r['renditions']:<2}{r['span_max_error_pct']:8.2f}% "
                f"{r['zero_frame_phonemes']:>5}/{r['phonemes']}"
            )


def plot(runs: dict[str, dict[str, Any]], name: str) -> Path:
    """Each rendition's ratio per speed (left), zero-frame phonemes per speed (right), per
    engine and run (before/after)."""
    plt = pyplot()
    engines = list(dict.fromkeys(e for run in runs.values() for e in run["engines"]))
    fig, axes = plt.subplots(len(engines), 2, figsize=(11, 3.6 * len(engines)), squeeze=False)
    colors = {"before": "#e07b39", "after": "#3b7dd8"}
    for row, engine in zip(axes, engines, strict=True):
        left, right = row
        width = 0.8 / max(1, len(runs))
        for k, (label, run) in enumerate(runs.items()):
            rows = run["engines"].get(engine)
            if not rows:
                continue
            speeds = [k for k in rows if "renditions" in rows[k]]
            for i, s in enumerate(speeds):
                ys = rows[s]["ratios"]
                xs = np.full(len(ys), i + (k - (len(runs) - 1) / 2) * width)
                left.scatter(
                    xs,
                    ys,
                    s=8,
                    color=colors.get(label, "gray"),
                    alpha=0.7,
                    label=label if i == 0 else None,
                )
            zeros = [rows[s]["zero_frame_phonemes"] for s in speeds]
            bars = right.bar(
                np.arange(len(speeds)) + (k - (len(runs) - 1) / 2) * width,
                zeros,
                width,
                color=colors.get(label, "gray"),
                label=label,
            )
            right.bar_label(bars, fontsize=8)
            left.set_xticks(range(len(speeds)), speeds)
            right.set_xticks(range(len(speeds)), speeds)
        left.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="green", alpha=0.08)
        left.axhline(1, color="green", linewidth=0.8)
        left.set_title(f"{engine}: length x speed / speed-1 length (band: 5%)")
        left.set_xlabel("speed")
        left.legend()
        right.set_title(f"{engine}: phonemes with no frame")
        right.set_xlabel("speed")
        right.legend()
    return save_figure(fig, RESULTS / f"{name}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--noise", choices=("off", "default"), default="off")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="first N prompts")
    parser.add_argument("--no-coqui", action="store_true", help="the Piper voice only")
    parser.add_argument("--save", type=Path, help="also write this run's results here")
    parser.add_argument("--before", type=Path, help="a --save of the tree before, to compare")
    parser.add_argument("--name", default="speed", help="docs/bench/<name>.json and .png")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/bench")
    args = parser.parse_args()
    provenance()  # the tree as the run starts
    started = time.perf_counter()
    prompts = PROMPTS[: args.prompts]
    noise = args.noise == "default"
    engines: dict[str, Any] = {}
    piper = Piper(noise)
    engines[piper.name] = measure(piper, prompts)
    if not args.no_coqui:
        with tempfile.TemporaryDirectory(prefix="voxgate-speed-") as tmp:
            coqui = Coqui(noise, Path(tmp))
            engines[coqui.name] = measure(coqui, prompts)
    run = {**provenance(), "noise": args.noise, "engines": engines}
    runs = {"after": run}
    if args.before:
        runs = {"before": json.loads(args.before.read_text()), "after": run}
    for label, r in runs.items():
        table(f"{label} ({r['git_commit'][:12]}, noise {r['noise']})", r["engines"])
    if args.save:
        args.save.write_text(json.dumps(run, indent=2) + "\n")
    if not args.no_write:
        setup = {
            "prompts": len(prompts),
            "speeds": list(SPEEDS),
            "tolerance": TOLERANCE,
            "duration": "whole rendition in samples, sentence pauses and edge silence included",
            "span": f"first to last sample within {SPAN_DB:g} dB of the rendition's peak",
            "sentence_pause_ms": PAUSE_MS,
            "noise": args.noise,
        }
        write_results(
            args.name,
            {"setup": setup, "runs": runs, "runtime_s": round(time.perf_counter() - started, 1)},
        )
        plot(runs, args.name)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
