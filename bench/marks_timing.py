"""How far each word mark after a punctuation mark is from where the word is heard, this tree
against an earlier commit's (docs/speech-marks.md, "Accuracy").

Each line of ``bench/corpora/marks_timing.txt`` (two sentences with commas, semicolons and
colons in them) is one request to a ``voxgate serve`` of each tree (Piper's ``POST /``, the
route that takes Piper's noise scales: the bundled voice ``joe``, WAV), then its marks by key
(``GET /v1/audio/{key}.marks``). For each word whose text is
preceded by a comma, semicolon, colon or a sentence's end (``.``, ``?``, ``!``), the error is
its mark minus the onset of its sound in the audio served:

- the onset is the first sample above the silence floor (0.01 of full scale, -40 dBFS: the level
  the gateway trims an engine's edge silence at, ``synth.sentences.SILENCE_LEVEL``; Piper
  peak-normalizes each run to full scale) after the pause before the word;
- the pause is the longest run of samples at or under the floor from the previous word's mark
  to 150 ms after the word's own (or the next word's mark, if sooner): a punctuation mark's
  pause is a silence of 50-500 ms, longer than any stop closure inside a word, and a mark
  150 ms early still has its onset in the window, while the pause after the word (a comma after
  it) is not, which the next word's mark alone let in where that mark was late. The marks only
  bound where it is looked for; the audio decides where the pause ends. A word with no quiet run
  of at least 30 ms there is counted as unmeasured, not measured.

Two conditions: Piper's noise scales at 0 (the same audio every run: the rows compare one
audio), and the voice's own noise (what a request gets by default; each run draws its own).

    python -m bench.marks_timing                 # this tree against main: ~4 minutes on 2 cores
    python -m bench.marks_timing --before HEAD~1 --no-write

Writes ``docs/bench/marks_timing.json`` and ``.png``: per tree, condition and punctuation kind,
the number of words and the p50, p90 and largest absolute error (ms), and the mean signed error
(negative: marks early). Target: p90 <= 30 ms for every kind.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from bench.common import RESULTS, post, provenance, stop, wait_http, write_results
from bench.harness import ROOT, free_port, serve_command
from bench.plots import label_bars, pyplot, save_figure

CORPUS = ROOT / "bench" / "corpora" / "marks_timing.txt"
FLOOR = 0.01
MIN_PAUSE_MS = 30.0
REACH_MS = 150
KINDS = (",", ";", ":", ".")
KIND_NAMES = {",": "comma", ";": "semicolon", ":": "colon", ".": "sentence end"}
CONDITIONS = {"noise-free": {"noise_scale": 0.0, "noise_w_scale": 0.0}, "voice noise": {}}
TARGET_P90_MS = 30.0


def corpus() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def kind_between(gap: str) -> str | None:
    """The punctuation kind a word's preceding text (after the word before) says, if any."""
    if any(ch in ".?!" for ch in gap):
        return "."
    return next((ch for ch in gap if ch in ",;:"), None)


def onset_after_pause(pcm: np.ndarray[Any, Any], rate: int, lo: int, hi: int) -> int | None:
    """The first loud sample after the longest quiet run in ``pcm[lo:hi]`` (None: no run of at
    least MIN_PAUSE_MS)."""
    loud = np.flatnonzero(np.abs(pcm[lo:hi]) > FLOOR)
    if len(loud) < 2:
        return None
    gaps = np.diff(loud)
    k = int(np.argmax(gaps))
    if gaps[k] < MIN_PAUSE_MS * rate / 1000:
        return None
    return lo + int(loud[k + 1])


def window(marks_ms: list[int], i: int, rate: int, samples: int) -> tuple[int, int]:
    """Where the pause before word ``i`` is looked for (samples): from the previous word's mark
    to REACH_MS after its own, or the next word's mark if that is sooner."""
    lo = round(marks_ms[i - 1] * rate / 1000)
    reach = marks_ms[i] + REACH_MS
    if i + 1 < len(marks_ms):
        reach = min(reach, marks_ms[i + 1])
    return lo, min(samples, round(reach * rate / 1000))


def errors_of(text: str, wav: bytes, marks: list[dict[str, Any]]) -> dict[str, Any]:
    """Each measurable word's error (ms) by kind, and the words no pause was found before."""
    pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
    raw = text.encode()
    words = [m for m in marks if m["type"] == "word"]
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    unmeasured = 0
    for i in range(1, len(words)):
        kind = kind_between(raw[words[i - 1]["end"] : words[i]["start"]].decode())
        if kind is None:
            continue
        lo, hi = window([w["time"] for w in words], i, rate, len(pcm))
        onset = onset_after_pause(pcm, rate, lo, hi)
        if onset is None:
            unmeasured += 1
            continue
        out[kind].append(words[i]["time"] - onset * 1000 / rate)
    return {"errors": out, "unmeasured": unmeasured}


def exported(commit: str, into: Path) -> Path:
    """The tree of ``commit`` written out under ``into`` (``git archive``: no worktree)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def resolve(commit: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def synthesize(tree: Path, texts: list[str], log: Path, save: Path) -> None:
    """Every text through a gateway of ``tree``, in each condition: its WAV and marks written
    under ``save/<condition>/`` (``<n>.wav``, ``<n>.json``), so the measure can run again on the
    same audio (``--load``)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="voxgate-marks-timing-") as cache:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        with open(log, "wb") as sink:
            proc = subprocess.Popen(
                serve_command(port, Path(cache)), cwd=tree, env=env, stdout=sink, stderr=sink
            )
        try:
            wait_http(f"http://127.0.0.1:{port}/readyz")
            base = f"http://127.0.0.1:{port}"
            for c, params in enumerate(CONDITIONS.values()):
                into = save / str(c)
                into.mkdir(parents=True, exist_ok=True)
                for n, text in enumerate(texts):
                    # Piper's own route: the one that takes its noise scales.
                    body = {"voice": "joe", "text": text, **params}
                    status, headers, wav = post(f"{base}/", body)
                    assert status == 200, status
                    url = f"{base}/v1/audio/{headers['X-Audio-Key']}.marks"
                    with urllib.request.urlopen(url, timeout=60) as r:
                        marks = [json.loads(line) for line in r.read().decode().splitlines()]
                    (into / f"{n}.wav").write_bytes(wav)
                    (into / f"{n}.json").write_text(json.dumps({"text": text, "marks": marks}))
        finally:
            stop(proc)


def measure(saved: Path) -> dict[str, Any]:
    """The errors of what :func:`synthesize` saved under ``saved``, per condition."""
    result: dict[str, Any] = {}
    for c, name in enumerate(CONDITIONS):
        found: dict[str, list[float]] = {k: [] for k in KINDS}
        unmeasured = 0
        folder = saved / str(c)
        for meta in sorted(folder.glob("*.json"), key=lambda p: int(p.stem)):
            request = json.loads(meta.read_text())
            wav = meta.with_suffix(".wav").read_bytes()
            got = errors_of(request["text"], wav, request["marks"])
            for kind in KINDS:
                found[kind] += got["errors"][kind]
            unmeasured += got["unmeasured"]
        result[name] = {"errors_ms": found, "unmeasured": unmeasured}
    return result


def stats(errors: list[float]) -> dict[str, Any]:
    a = np.abs(np.asarray(errors, dtype=float))
    if not len(a):
        return {"n": 0}
    return {
        "n": len(a),
        "p50_abs_ms": round(float(np.percentile(a, 50)), 1),
        "p90_abs_ms": round(float(np.percentile(a, 90)), 1),
        "max_abs_ms": round(float(a.max()), 1),
        "mean_ms": round(float(np.mean(errors)), 1),
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    conditions = list(CONDITIONS)
    fig, axes = pyplot().subplots(1, len(conditions), figsize=(11, 4), sharey=True)
    width = 0.38
    for ax, condition in zip(axes, conditions, strict=True):
        for j, (tree, color) in enumerate((("before", "tab:gray"), ("after", "tab:blue"))):
            rows = summary[tree][condition]
            values = [rows[k].get("p90_abs_ms", 0.0) for k in KINDS]
            xs = [i + (j - 0.5) * width for i in range(len(KINDS))]
            bars = ax.bar(xs, values, width, color=color, label=f"{tree}: p90")
            label_bars(ax, bars, values, small=".0f", fontsize=8)
            maxes = [rows[k].get("max_abs_ms", 0.0) for k in KINDS]
            ax.scatter(xs, maxes, color=color, marker="_", s=200, zorder=3)
        ax.axhline(TARGET_P90_MS, color="tab:red", linestyle="--", linewidth=1, label="30 ms")
        ax.set_xticks(range(len(KINDS)), [KIND_NAMES[k] for k in KINDS])
        ax.set_title(f"{condition}: |mark - onset| after ... (dash: max)")
        ax.set_ylabel("ms")
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="the commit to compare with (main)")
    parser.add_argument("--lines", type=int, default=0, help="only the first N lines (0: all)")
    parser.add_argument("--no-write", action="store_true", help="print, write nothing")
    parser.add_argument("--save", type=Path, help="keep each tree's audio and marks here")
    parser.add_argument(
        "--load", type=Path, help="measure what an earlier --save kept (no synthesis)"
    )
    args = parser.parse_args()
    provenance()
    texts = corpus()[: args.lines or None]
    before = resolve(args.before)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="voxgate-before-") as tmp:
        kept = args.load or args.save or Path(tmp) / "audio"
        if args.load is None:
            trees = {"before": exported(before, Path(tmp) / "tree"), "after": ROOT}
            for name, tree in trees.items():
                synthesize(tree, texts, Path(tmp) / f"{name}.log", kept / name)
        runs = {name: measure(kept / name) for name in ("before", "after")}
    summary = {
        tree: {
            condition: {
                **{k: stats(got["errors_ms"][k]) for k in KINDS},
                "unmeasured": got["unmeasured"],
            }
            for condition, got in conditions.items()
        }
        for tree, conditions in runs.items()
    }
    print(
        f"\n{'tree':<7} {'condition':<11} {'after':<13} {'n':>4} {'p50':>6} {'p90':>6} "
        f"{'max':>6} {'mean':>7}   (|mark - onset| ms; mean signed)"
    )
    for tree, conditions in summary.items():
        for condition, rows in conditions.items():
            for k in KINDS:
                s = rows[k]
                print(
                    f"{tree:<7} {condition:<11} {KIND_NAMES[k]:<13} {s['n']:>4} "
                    f"{s.get('p50_abs_ms', 0):>6.1f} {s.get('p90_abs_ms', 0):>6.1f} "
                    f"{s.get('max_abs_ms', 0):>6.1f} {s.get('mean_ms', 0):>7.1f}"
                )
            print(f"{tree:<7} {condition:<11} unmeasured (no pause found): {rows['unmeasured']}")
    met = all(
        summary["after"][c][k].get("p90_abs_ms", 0) <= TARGET_P90_MS
        for c in CONDITIONS
        for k in KINDS
    )
    print(
        f"target p90 <= {TARGET_P90_MS:.0f} ms for every kind after: {'met' if met else 'NOT met'}"
    )
    if args.no_write:
        return
    write_results(
        "marks_timing",
        {
            "before_commit": before,
            "texts": len(texts),
            "floor": FLOOR,
            "min_pause_ms": MIN_PAUSE_MS,
            "target_p90_ms": TARGET_P90_MS,
            "target_met": met,
            "seconds": round(time.perf_counter() - started, 1),
            "summary": summary,
            "errors_ms": {
                tree: {c: got["errors_ms"] for c, got in conditions.items()}
                for tree, conditions in runs.items()
            },
        },
    )
    plot(summary, RESULTS / "marks_timing.png")
    print(f"wrote {RESULTS / 'marks_timing.json'} and marks_timing.png")


if __name__ == "__main__":
    main()
