"""How often one miss moves between the project's files: the file transitions of a one-sentence
miss of ``POST /v1/audio/speech``, traced on the event loop's thread.

The gateway is built in this process (``create_app`` with the bundled Piper voice in a thread
runner, memory and disk tiers in a temporary directory, no Redis, no API keys), served on loopback
by aiohttp's ``TestServer`` and asked by an aiohttp client in the same loop. After a warm-up miss
(imports, memos and pools made), each traced request is a miss of a new one-sentence text:
``sys.setprofile`` records every Python function called on the loop's thread from the request's
send to its last byte; calls in the project's packages (``gateway``, ``cache``, ``synth``,
``metrics``) are kept, in order, and runs of calls in one file collapse to one step. Reported:

- ``transitions``: steps from one project file to another (the collapsed sequence's length - 1);
- ``returns``: steps into a file the request had already left (how often the path calls back);
- ``files``: distinct project files called;
- ``step_pairs``: how often the path stepped from one file straight into another (e.g.
  ``gateway/speech/assembly.py -> gateway/speech/service.py``: the assembler calling back up).

The engine runs in a worker thread the tracer does not follow (what it does is not the gateway's
path), and the client's calls are aiohttp's, not the project's. The figures are the median over
``--runs`` texts (they differ by a background task's tick at most).

With ``--before REF`` the same trace runs, side by side in this run, on the tree of git commit
``REF`` (exported to a temporary directory, run there in a subprocess), and both are written to
``docs/bench/miss_trace.json`` (with ``--plot``, a PNG beside it).

    python -m bench.miss_trace                      # this tree only
    python -m bench.miss_trace --before 7dfa0c1     # and the tree of commit 7dfa0c1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGES = ("gateway", "cache", "synth", "metrics")
TEXTS = [
    "Your parcel left the depot at nine.",
    "The meeting moved to the blue room.",
    "Please check the second drawer again.",
    "Lunch is served on the upper deck.",
    "The river rose a foot overnight.",
    "Bring the green folder on Monday.",
    "The last train leaves at midnight.",
]


def project_files(root: Path) -> tuple[str, ...]:
    """Directory prefixes of the project's packages under ``root``."""
    return tuple(str(root / pkg) + "/" for pkg in PACKAGES)


def collapse(files: list[str]) -> list[str]:
    """``files`` with runs of one file made one step."""
    steps: list[str] = []
    for f in files:
        if not steps or steps[-1] != f:
            steps.append(f)
    return steps


def summarize(steps: list[str]) -> dict[str, Any]:
    """Transitions, returns to a file left before, distinct files of one collapsed trace."""
    seen: set[str] = set()
    returns = 0
    for f in steps:
        if f in seen:
            returns += 1
        seen.add(f)
    return {
        "transitions": max(0, len(steps) - 1),
        "returns": returns,
        "files": len(seen),
        "steps": steps,
    }


async def trace_misses(root: Path, runs: int) -> list[dict[str, Any]]:
    """Trace ``runs`` one-sentence misses through a gateway built from the tree at ``root``."""
    from aiohttp.test_utils import TestClient, TestServer

    from gateway.http.app import create_app
    from gateway.runtime.settings import Settings
    from metrics import Metrics
    from synth.piper_engine import PiperEngine, PiperVoiceFiles

    prefixes = project_files(root)
    engine = PiperEngine([PiperVoiceFiles.bundled_joe()], intra_op_threads=1)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.load(
            env={}, overrides={"cache_dir": tmp, "port": "0", "access_log": "false"}
        )
        app = create_app(settings, metrics=Metrics(), engines={"piper": engine})
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        try:
            for _ in range(600):
                if (await client.get("/readyz")).status == 200:
                    break
                await asyncio.sleep(0.05)

            async def ask(text: str) -> None:
                body = {"model": "piper", "voice": "joe", "input": text, "response_format": "wav"}
                resp = await client.post("/v1/audio/speech", json=body)
                await resp.read()
                if resp.status != 200 or resp.headers.get("X-Cache") != "MISS":
                    raise RuntimeError(f"not a miss: {resp.status} {resp.headers.get('X-Cache')}")

            await ask("A warm-up sentence, said once.")
            for text in TEXTS[:runs]:
                calls: list[str] = []

                def profile(
                    frame: FrameType, event: str, arg: object, calls: list[str] = calls
                ) -> None:
                    if event == "call":
                        name = frame.f_code.co_filename
                        if name.startswith(prefixes):
                            calls.append(name[len(str(root)) + 1 :])

                sys.setprofile(profile)
                try:
                    await ask(text)
                finally:
                    sys.setprofile(None)
                out.append(summarize(collapse(calls)))
        finally:
            await client.close()
    return out


def measure(root: Path, runs: int) -> dict[str, Any]:
    """The trace of the tree at ``root`` (this process's imports come from there)."""
    traces = asyncio.run(trace_misses(root, runs))
    middle = sorted(traces, key=lambda t: t["transitions"])[len(traces) // 2]
    revisited = Counter(middle["steps"])
    return {
        "transitions": statistics.median(t["transitions"] for t in traces),
        "returns": statistics.median(t["returns"] for t in traces),
        "files": statistics.median(t["files"] for t in traces),
        "per_run": [{k: t[k] for k in ("transitions", "returns", "files")} for t in traces],
        # The median run's steps, and how many times each file was entered in it.
        "steps": middle["steps"],
        "entries_per_file": dict(revisited.most_common()),
        # Steps from one file straight into another, by pair ("a -> b": count), in that run.
        "step_pairs": dict(
            Counter(
                f"{a} -> {b}" for a, b in zip(middle["steps"], middle["steps"][1:], strict=False)
            )
        ),
    }


def measure_commit(ref: str, runs: int) -> dict[str, Any]:
    """:func:`measure` on the tree of commit ``ref``, in a subprocess run in an export of it."""
    from bench.harness import ROOT

    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", commit], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        # This script runs there as it is here, so both trees are measured the same way.
        script = Path(tmp) / "bench" / "miss_trace.py"
        script.write_text(Path(__file__).read_text())
        done = subprocess.run(
            [sys.executable, "-m", "bench.miss_trace", "--runs", str(runs), "--json-only"],
            cwd=tmp,
            env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
            check=True,
            capture_output=True,
            text=True,
        )
    return {"commit": commit, **json.loads(done.stdout.strip().splitlines()[-1])}


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    """Transitions and returns per tree, side by side."""
    from bench.common import bar_plot

    labels = [f"{name} transitions" for name in rows] + [f"{name} returns" for name in rows]
    values = [rows[n]["transitions"] for n in rows] + [rows[n]["returns"] for n in rows]
    bar_plot(path.stem, "One one-sentence miss: project file steps", labels, values, "steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="misses traced (median reported)")
    parser.add_argument("--before", help="also trace the tree of this git commit, side by side")
    parser.add_argument("--plot", action="store_true", help="write a PNG beside the JSON")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    if args.json_only:
        print(json.dumps(measure(root, args.runs)))
        return
    from bench.common import provenance, write_results

    provenance()
    rows: dict[str, dict[str, Any]] = {}
    if args.before:
        rows["before"] = measure_commit(args.before, args.runs)
    rows["this tree"] = measure(root, args.runs)
    for name, row in rows.items():
        print(
            f"{name:>10}: {row['transitions']} transitions, {row['returns']} returns to a file "
            f"left, {row['files']} files"
        )
    path = write_results("miss_trace", {"runs": args.runs, "trees": rows})
    if args.plot:
        plot(rows, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
