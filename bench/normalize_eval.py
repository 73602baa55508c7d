"""Text normalization on IVR corpora (bench/corpora): which library reads prompts right, how fast.

Corpus format: bench/corpora/README.md. Every system reads every prompt of the English and the
Mandarin corpora (the development ones the readings were built against, and the held-out ones
written apart from them), side by side:

- ``nemo``: NeMo text processing's ``Normalizer`` (``input_case="cased"``), WFST grammars on
  pynini, compiled on first use (minutes; ``--nemo-cache`` keeps them);
- ``wetextprocessing``: WeTextProcessing's ``tn`` package (its prebuilt grammars);
- ``wetext``: WeTextProcessing's runtime (the same grammars on kaldifst, without pynini);
- ``num2words``: the gateway's num2words front end (``gateway.api.normalize.normalize_numbers``);
- ``voxgate``: the gateway's readings (``gateway.api.readings.read_numbers``).

Per system and corpus: accuracy (whole sentence, after ``canon``; and per section), the share of
prompts with a leading zero whose reading keeps its zeros, per-sentence latency warm (median and
p90; each prompt timed once, after a first call), and start-up (import and construction, then
the first call). Each system and language runs in its own process (``--worker``), so start-up is
measured cold and a library that fails to import or crashes is reported as such.

The libraries are heavy (NeMo pulls pynini and transformers): install them in a venv of their own,
never in the project's, and run the bench with the tree on PYTHONPATH::

    python -m venv /tmp/tn2 && /tmp/tn2/bin/pip install nemo-text-processing \\
        wetextprocessing wetext num2words matplotlib
    PYTHONPATH=. /tmp/tn2/bin/python -m bench.normalize_eval --nemo-cache /tmp/nemo_cache

Writes docs/bench/normalize.json and docs/bench/normalize.png (``--no-write``: neither).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

CORPORA = Path(__file__).parent / "corpora"
ROOT = Path(__file__).resolve().parents[1]

# name -> (what it is, the distribution its version is read from)
SYSTEMS: dict[str, tuple[str, str]] = {
    "nemo": ("NeMo text processing", "nemo-text-processing"),
    "wetextprocessing": ("WeTextProcessing (tn)", "WeTextProcessing"),
    "wetext": ("wetext runtime", "wetext"),
    "num2words": ("num2words front end (normalize_numbers)", "num2words"),
    "voxgate": ("voxgate readings (read_numbers)", ""),
}
CORPUS_NAMES = {"en": ("ivr_en", "ivr_en_heldout"), "zh": ("ivr_zh", "ivr_zh_heldout")}


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


# ---- leading zeros ---------------------------------------------------------------------------

_LEADING_ZERO = re.compile(r"(?<![\d.,])0\d")
_ZERO_WORDS = {"zero": 1, "oh": 1, "o": 1}
_REPEATS = {"double": 2, "triple": 3}


def zeros_said(reading: str, lang: str) -> int:
    """How many zero digits ``reading`` says ("double oh" is two; Mandarin 零, 〇 or 洞)."""
    text = canon(reading, lang)
    if lang == "zh":
        return sum(text.count(ch) for ch in "零〇洞")
    words, count = text.split(), 0
    for i, word in enumerate(words):
        if word in _ZERO_WORDS:
            before = words[i - 1] if i else ""
            count += _REPEATS.get(before, 1)
    return count


def zeros_needed(case: Case, lang: str) -> int:
    """The zeros a reading of ``case`` must say to keep its leading zeros: none when its text
    has no digit string starting with 0, else the fewest any accepted reading says (so a zero
    the corpus lets go unsaid, as in a time "04:10", is not asked for)."""
    if not _LEADING_ZERO.search(case.text):
        return 0
    return min(zeros_said(r, lang) for r in case.readings)


# ---- one system in its own process -----------------------------------------------------------


def make_reader(system: str, lang: str, nemo_cache: str | None) -> Callable[[str], str]:
    """``system``'s reading of a prompt in ``lang``, constructed (imports included)."""
    if system == "nemo":
        from nemo_text_processing.text_normalization.normalize import Normalizer

        nemo = Normalizer(input_case="cased", lang=lang, cache_dir=nemo_cache)
        return lambda text: str(nemo.normalize(text))
    if system == "wetextprocessing":
        if lang == "en":
            from tn.english.normalizer import Normalizer as TextNormalizer
        else:
            from tn.chinese.normalizer import Normalizer as TextNormalizer
        return TextNormalizer().normalize  # type: ignore[no-any-return]
    if system == "wetext":
        from wetext import Normalizer as Runtime

        runtime = Runtime(lang=lang, operator="tn")
        return lambda text: str(runtime.normalize(text))
    if system == "num2words":
        from gateway.api.normalize import normalize_numbers

        return lambda text: normalize_numbers(text, lang)
    if system == "voxgate":
        from gateway.api.readings import read_numbers

        return lambda text: read_numbers(text, lang)
    raise ValueError(f"unknown system {system!r}")


def worker(
    system: str, lang: str, corpora: Sequence[str], nemo_cache: str | None
) -> dict[str, Any]:
    """Construct ``system`` for ``lang``, make a first call, then read every prompt of
    ``corpora`` once, timed: what the parent scores."""
    dist = SYSTEMS[system][1]
    result: dict[str, Any] = {"version": _version(dist) if dist else ""}
    started = time.perf_counter()
    try:
        read = make_reader(system, lang, nemo_cache)
    except Exception as e:  # an import or grammar failure is a result: reported, not dropped
        result["error"] = f"{type(e).__name__}: {e}"
        return result
    result["construct_s"] = time.perf_counter() - started
    loaded = {name: load_corpus(name) for name in corpora if (CORPORA / f"{name}.txt").exists()}
    first = next((c[0].text for c in loaded.values() if c), _FIRST[lang])
    started = time.perf_counter()
    try:
        read(first)
    except Exception as e:
        result["first_call_error"] = f"{type(e).__name__}: {e}"
    result["first_call_s"] = time.perf_counter() - started
    result["corpora"] = {}
    for name in corpora:
        if name not in loaded:
            result["corpora"][name] = {"missing": True}
            continue
        outputs: list[str | None] = []
        errors: list[str] = []
        seconds: list[float] = []
        for case in loaded[name]:
            started = time.perf_counter()
            try:
                outputs.append(read(case.text))
            except Exception as e:
                outputs.append(None)
                errors.append(f"{type(e).__name__}: {e}"[:200])
            seconds.append(time.perf_counter() - started)
        result["corpora"][name] = {"outputs": outputs, "seconds": seconds, "errors": errors}
    return result


# The first call of a worker given no corpus (``--nemo-cold`` times start-up alone).
_FIRST = {"en": "Call 1-800-555-0199 by 5:30 PM.", "zh": "请在17:30前拨打010-12345678。"}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run_worker(
    system: str, lang: str, corpora: Sequence[str], nemo_cache: str | None, timeout_s: float
) -> dict[str, Any]:
    """:func:`worker` in a fresh interpreter (cold start-up; a crash stays there)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.normalize_eval", "--worker", system, lang]
        cmd += ["--out", str(out), "--corpora", *corpora]
        if nemo_cache:
            cmd += ["--nemo-cache", nemo_cache]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {timeout_s:.0f} s"}
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"error": f"worker exited {proc.returncode}: {tail[0][:300]}"}
        return json.loads(out.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


# ---- scoring ---------------------------------------------------------------------------------


def _ms(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def score(name: str, lang: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Accuracy, per section, leading zeros kept and latency of one system on corpus ``name``."""
    if raw.get("missing"):
        return {"status": "corpus missing"}
    cases = load_corpus(name)
    outputs, seconds = raw["outputs"], raw["seconds"]
    right = [o is not None and accepted(o, c, lang) for o, c in zip(outputs, cases, strict=True)]
    sections: dict[str, list[bool]] = {}
    for case, ok in zip(cases, right, strict=True):
        sections.setdefault(case.section, []).append(ok)
    zero_cases = [(c, o) for c, o in zip(cases, outputs, strict=True) if zeros_needed(c, lang)]
    kept = sum(
        o is not None and zeros_said(o, lang) >= zeros_needed(c, lang) for c, o in zero_cases
    )
    return {
        "status": "ok",
        "cases": len(cases),
        "correct": sum(right),
        "accuracy": round(sum(right) / len(cases), 4),
        "sections": {s: round(sum(v) / len(v), 3) for s, v in sections.items()},
        "leading_zero_cases": len(zero_cases),
        "leading_zero_kept": kept,
        "leading_zero_rate": round(kept / len(zero_cases), 4) if zero_cases else None,
        "errors": len(raw["errors"]),
        "first_errors": raw["errors"][:3],
        "latency_median_ms": round(1000 * statistics.median(seconds), 3),
        "latency_p90_ms": _ms(seconds, 0.9),
    }


def misses(name: str, lang: str, raw: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    """(prompt, reading, first accepted) of every prompt ``raw`` read wrong."""
    cases = load_corpus(name)
    return [
        (c.text, o, c.readings[0])
        for c, o in zip(cases, raw["outputs"], strict=True)
        if o is None or not accepted(o, c, lang)
    ]


def run(
    systems: Sequence[str],
    corpora: Sequence[str],
    nemo_cache: str | None,
    timeout_s: float,
    show_misses: Sequence[str] = (),
    nemo_cold: bool = False,
) -> dict[str, Any]:
    """Every system on every corpus, one worker per system and language; the figures. With
    ``nemo_cold``, NeMo's start-up is also timed with an empty cache (its grammars compiled)."""
    by_lang = {lang: [c for c in names if c in corpora] for lang, names in CORPUS_NAMES.items()}
    report: dict[str, Any] = {}
    for system in systems:
        row: dict[str, Any] = {"label": SYSTEMS[system][0], "startup": {}, "corpora": {}}
        for lang, names in by_lang.items():
            if not names:
                continue
            cache = _nemo_cache_state(nemo_cache, lang) if system == "nemo" else None
            raw = run_worker(system, lang, names, nemo_cache, timeout_s)
            row["version"] = raw.get("version", row.get("version", ""))
            if "error" in raw:
                row["startup"][lang] = {"status": "unavailable", "error": raw["error"]}
                for name in names:
                    row["corpora"][name] = {"status": "unavailable", "error": raw["error"]}
                continue
            row["startup"][lang] = {
                "status": "ok",
                "construct_s": round(raw["construct_s"], 3),
                "first_call_s": round(raw["first_call_s"], 3),
                "total_s": round(raw["construct_s"] + raw["first_call_s"], 3),
                **({"nemo_cache": cache} if cache else {}),
                **(
                    {"first_call_error": raw["first_call_error"]}
                    if "first_call_error" in raw
                    else {}
                ),
            }
            if system == "nemo" and nemo_cold:
                with tempfile.TemporaryDirectory() as empty:
                    cold = run_worker(system, lang, [], empty, timeout_s)
                row["startup"][lang]["cold_cache"] = (
                    {"error": cold["error"]}
                    if "error" in cold
                    else {
                        "construct_s": round(cold["construct_s"], 3),
                        "first_call_s": round(cold["first_call_s"], 3),
                        "total_s": round(cold["construct_s"] + cold["first_call_s"], 3),
                    }
                )
            for name in names:
                row["corpora"][name] = score(name, lang, raw["corpora"][name])
                if system in show_misses and row["corpora"][name]["status"] == "ok":
                    for text, got, want in misses(name, lang, raw["corpora"][name]):
                        print(f"[{system} {name}] {text}\n    got:  {got}\n    want: {want}")
        report[system] = row
    return report


def _nemo_cache_state(cache: str | None, lang: str) -> str:
    """Whether NeMo's grammars for ``lang`` were compiled before this run ("hit") or by it."""
    if not cache:
        return "none (grammars compiled in start-up)"
    return "hit" if any(Path(cache).glob(f"{lang}_tn_*.far")) else "compiled in start-up"


# ---- output ----------------------------------------------------------------------------------


def table(report: dict[str, Any], corpora: Sequence[str]) -> str:
    lines = [
        f"{'system':<17} {'corpus':<15} {'accuracy':>9} {'lead-0 kept':>12} "
        f"{'median ms':>10} {'p90 ms':>8} {'start-up s':>11}"
    ]
    for system, row in report.items():
        for name in corpora:
            got = row["corpora"].get(name)
            if got is None:
                continue
            lang = "zh" if "_zh" in name else "en"
            if got["status"] != "ok":
                lines.append(
                    f"{system:<17} {name:<15} {got['status']}: {got.get('error', '')}"[:150]
                )
                continue
            zero = (
                f"{got['leading_zero_kept']}/{got['leading_zero_cases']}"
                if got["leading_zero_cases"]
                else "-"
            )
            start = row["startup"][lang]["total_s"]
            lines.append(
                f"{system:<17} {name:<15} {got['accuracy']:>9.1%} {zero:>12} "
                f"{got['latency_median_ms']:>10.3f} {got['latency_p90_ms']:>8.3f} {start:>11.2f}"
            )
    for system, row in report.items():
        for lang, start in row["startup"].items():
            cold = start.get("cold_cache")
            if cold:
                took = f"{cold['total_s']:.1f} s" if "total_s" in cold else cold["error"]
                lines.append(f"{system} {lang} start-up with an empty grammar cache: {took}")
    return "\n".join(lines)


def plot(report: dict[str, Any], corpora: Sequence[str]) -> Path:
    from bench.common import RESULTS
    from bench.plots import label_bars, pyplot, save_figure

    plt = pyplot()
    systems = list(report)
    fig, (acc, lat, start) = plt.subplots(
        1, 3, figsize=(17, 4.5), gridspec_kw={"width_ratios": [2, 2, 1]}
    )
    width = 0.8 / max(len(systems), 1)
    colors = ("#3b7dd8", "#9aa5b1", "#e07b39", "#5aa469", "#b04fb0")
    for i, system in enumerate(systems):
        rows = [report[system]["corpora"].get(name, {}) for name in corpora]
        values = [r.get("accuracy", 0.0) * 100 if r.get("status") == "ok" else 0.0 for r in rows]
        xs = [j + i * width for j in range(len(corpora))]
        bars = acc.bar(xs, values, width, label=system, color=colors[i % len(colors)])
        label_bars(acc, bars, values, small=".0f", fontsize=6)
        medians = [
            r.get("latency_median_ms", 0.0) if r.get("status") == "ok" else 0.0 for r in rows
        ]
        lat.bar(xs, medians, width, label=system, color=colors[i % len(colors)])
        langs = list(CORPUS_NAMES)
        startup = [report[system]["startup"].get(lang, {}).get("total_s", 0.0) for lang in langs]
        start.bar(
            [j + i * width for j in range(len(langs))],
            startup,
            width,
            color=colors[i % len(colors)],
        )
    for ax in (acc, lat):
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(corpora))])
        ax.set_xticklabels(corpora)
    acc.set_ylabel("sentences read as accepted (%)")
    acc.set_ylim(0, 110)
    acc.set_title("Accuracy per corpus (0: unavailable)")
    acc.legend(fontsize=7)
    lat.set_yscale("log")
    lat.set_ylabel("median ms per sentence, warm (log)")
    lat.set_title("Latency per sentence")
    start.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(CORPUS_NAMES))])
    start.set_xticklabels(list(CORPUS_NAMES))
    start.set_yscale("log")
    start.set_ylabel("seconds: construction + first call (log)")
    start.set_title("Start-up (grammar cache warm)")
    return save_figure(fig, RESULTS / "normalize.png")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    all_corpora = [n for names in CORPUS_NAMES.values() for n in names]
    parser.add_argument("--corpora", nargs="*", default=all_corpora, choices=all_corpora)
    parser.add_argument("--nemo-cache", help="NeMo's cache_dir: compiled grammars kept there")
    parser.add_argument(
        "--nemo-cold", action="store_true", help="also time NeMo's start-up with an empty cache"
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per worker")
    parser.add_argument("--show-misses", nargs="*", default=[], help="systems whose misses print")
    parser.add_argument("--note", default="", help="recorded in the JSON (which trees ran)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    parser.add_argument("--worker", nargs=2, metavar=("SYSTEM", "LANG"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        system, lang = args.worker
        result = worker(system, lang, args.corpora, args.nemo_cache)
        Path(args.out).write_text(json.dumps(result), encoding="utf-8")
        return

    from bench.common import provenance, write_results

    provenance()
    started = time.perf_counter()
    report = run(
        args.systems, args.corpora, args.nemo_cache, args.timeout, args.show_misses, args.nemo_cold
    )
    print(table(report, args.corpora))
    if args.no_write:
        return
    setup = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "note": args.note,
        "corpora": {
            n: len(load_corpus(n)) if (CORPORA / f"{n}.txt").exists() else None
            for n in args.corpora
        },
        "latency": "each prompt timed once, after a first call (start-up); one process per "
        "system and language",
        "leading_zero": "prompts with a digit string starting with 0 whose accepted readings say "
        "a zero; kept when the reading says at least as many zero digits as the fewest accepted",
    }
    path = write_results(
        "normalize",
        {"setup": setup, "systems": report, "runtime_s": round(time.perf_counter() - started, 1)},
    )
    print(f"wrote {path} and {plot(report, args.corpora)}")


if __name__ == "__main__":
    main()
