"""What speech marks cost: the miss path (and the hit path) with marks on and off, side by side.

Two gateways, the same but for ``speech_marks`` (``VOXGATE_SPEECH_MARKS``): with it on, each
Piper voice's graph outputs its phoneme durations and every sentence's words are aligned beside
its synthesis (``synth/alignment.py``), the rendition's marks composed and stored with its audio;
off, none of that runs. Each gateway as ``bench.miss_path`` starts its own (one gateway process,
2 synthesis workers, its own empty cache), serving the bundled voice ``joe``.

Rows, measured in interleaved rounds (rows rotated each round, the same texts for every row, so
machine noise hits both alike; each gateway has its own cache, so both synthesize them):

- ``marks-on`` / ``marks-off``: 16 clients each send unique texts: every request a synthesis;
- ``marks-on-hit`` / ``marks-off-hit``: the same texts again: every request a hit.

Besides requests/s, the CPU seconds each gateway's process tree (the gateway and its synthesis
workers) spent per request: the cost itself, which other load on the machine moves far less than
the throughput of a few rounds (on a shared 2-core machine, rounds of one row differ by 20%).

Target: marks-on over marks-off >= 0.95 on the miss path (the marks are computed beside the
synthesis, not by a second one), and the hit path unchanged. Writes
``docs/bench/marks_cost.json`` and ``.png``.

    python -m bench.marks_cost          # 6 rounds x 64 texts per row: ~5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.common import (
    RESULTS,
    miss_gateway_command,
    miss_parser,
    miss_result,
    provenance,
    write_results,
)
from bench.harness import TREE, free_port
from bench.miss_path import Speak, http_speaker, load, start, summarize, texts_for, wait_ok
from bench.plots import label_bars, pyplot, save_figure

ROWS = ("marks-on", "marks-off")
TARGET = 0.95


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and every process under it (its workers)."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _gateway(port: int, cache: Path, marks: bool, workers: int, log: Path) -> Any:
    return start(
        miss_gateway_command(port, cache, workers),
        log,
        env={"VOXGATE_SPEECH_MARKS": "true" if marks else "false", "PYTHONPATH": str(TREE)},
        cwd=TREE,
    )


async def main_async(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, Any]]]]:
    tmp = Path(tempfile.mkdtemp(prefix="voxgate-marks-"))
    ports = {name: free_port() for name in ROWS}
    procs = {
        name: _gateway(
            ports[name],
            tmp / f"{name}-cache",
            name == "marks-on",
            args.workers,
            tmp / f"{name}.log",
        )
        for name in ROWS
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {"miss": [], "hit": []} for n in ROWS}
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            speakers: dict[str, Speak] = {}
            for name in ROWS:
                await wait_ok(f"http://127.0.0.1:{ports[name]}/readyz")
                speakers[name] = http_speaker(
                    session,
                    name,
                    f"http://127.0.0.1:{ports[name]}/v1/audio/speech",
                    lambda t: {
                        "model": "piper",
                        "voice": "joe",
                        "input": t,
                        "response_format": "wav",
                    },
                )
            # Not measured: first-run costs (the ONNX arena growing, connections).
            for speak in speakers.values():
                await load(
                    speak, [f"Warm up, number {n}." for n in range(args.clients)], args.clients
                )
            per_round = args.clients * args.per_client
            for i in range(args.rounds):
                order = list(ROWS) if i % 2 == 0 else list(reversed(ROWS))
                texts = texts_for(i, per_round)
                for name in order:
                    for kind in ("miss", "hit"):
                        before = tree_cpu_seconds(procs[name].pid)
                        run = await load(speakers[name], texts, args.clients)
                        run["cpu_s"] = tree_cpu_seconds(procs[name].pid) - before
                        runs[name][kind].append(run)
                        print(
                            f"  round {i + 1} {name:<10} {kind:<4} "
                            f"{per_round / run['wall_s']:.2f} req/s",
                            flush=True,
                        )
            # The marks the "on" gateway stored are there (and the "off" one has none).
            key_of = {}
            for name in ROWS:
                async with session.post(
                    f"http://127.0.0.1:{ports[name]}/v1/audio/speech",
                    json={"model": "piper", "voice": "joe", "input": texts_for(0, 1)[0]},
                ) as resp:
                    key_of[name] = resp.headers["X-Audio-Key"]
                    await resp.read()
                async with session.get(
                    f"http://127.0.0.1:{ports[name]}/v1/audio/{key_of[name]}.marks"
                ) as resp:
                    expected = 200 if name == "marks-on" else 400
                    if resp.status != expected:
                        raise AssertionError(f"{name}: marks answered {resp.status}")
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return runs


def ratios(rows: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
    """marks-on over marks-off for ``kind`` (miss or hit): aggregate throughput, the median of
    the per-round ratios (each round runs both back to back) and the latency quantiles'."""
    on, off = rows["marks-on"][kind], rows["marks-off"][kind]
    per_round = [a / b for a, b in zip(on["round_rps"], off["round_rps"], strict=True)]
    return {
        # (None where a run was too short for the clock's 10 ms ticks)
        "cpu_per_request_ratio": round(on["cpu_ms_per_request"] / off["cpu_ms_per_request"], 3)
        if off["cpu_ms_per_request"] > 0
        else None,
        "throughput_ratio": round(on["throughput_rps"] / off["throughput_rps"], 3),
        "throughput_ratio_median_of_rounds": round(statistics.median(per_round), 3),
        "round_ratios": [round(r, 3) for r in per_round],
        "p50_ratio": round(on["p50_s"] / off["p50_s"], 3),
        "p99_ratio": round(on["p99_s"] / off["p99_s"], 3),
    }


def plot(rows: dict[str, dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(10, 4))
    for ax, kind in zip(axes, ("miss", "hit"), strict=True):
        values = [rows[name][kind]["throughput_rps"] for name in ROWS]
        label_bars(ax, ax.bar(ROWS, values, color=["tab:blue", "tab:gray"]), values)
        ratio = summary[kind]["throughput_ratio_median_of_rounds"]
        ax.set_title(f"{kind} path: on/off {ratio:.3f}x (median of rounds)")
        ax.set_ylabel("requests / s")
    save_figure(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure both gateways; the result as written to the JSON (without the provenance)."""
    started = time.perf_counter()
    runs = asyncio.run(main_async(args))
    rows = {
        name: {
            kind: {
                **summarize(r),
                "cpu_ms_per_request": round(
                    1000 * sum(x["cpu_s"] for x in r) / sum(x["requests"] for x in r), 3
                ),
            }
            for kind, r in kinds.items()
        }
        for name, kinds in runs.items()
    }
    summary = {kind: ratios(rows, kind) for kind in ("miss", "hit")}
    order = "rows alternated each round; the same texts for both; misses, then the same texts "
    order += "again as hits"
    return miss_result(args, order, rows, summary, started, target_miss_ratio=TARGET)


def main() -> None:
    args = miss_parser(__doc__, rounds=6).parse_args()
    provenance()  # the commit and date as the run starts
    result = run(args)
    rows, summary = result["servers"], result["summary"]
    print(f"\n{'row':<10} {'kind':<5} {'req/s':>8} {'p50 s':>7} {'p99 s':>7} {'cpu ms/req':>10}")
    for name, kinds in rows.items():
        for kind, s in kinds.items():
            print(
                f"{name:<10} {kind:<5} {s['throughput_rps']:>8.2f} {s['p50_s']:>7.3f} "
                f"{s['p99_s']:>7.3f} {s['cpu_ms_per_request']:>10.2f}"
            )
    for kind, r in summary.items():
        print(
            f"{kind}: marks on/off CPU per request {r['cpu_per_request_ratio']}x, throughput "
            f"{r['throughput_ratio']:.3f}x (median of rounds "
            f"{r['throughput_ratio_median_of_rounds']:.3f}x), p50 {r['p50_ratio']:.3f}x"
        )
    if args.no_write:
        return
    write_results("marks_cost", result)
    plot(rows, summary, RESULTS / "marks_cost.png")
    print(f"wrote {RESULTS / 'marks_cost.json'} and marks_cost.png")


if __name__ == "__main__":
    main()
