"""The miss path under load: the gateway against the same engine served three other ways.

16 concurrent clients each send unique texts (so every request is a synthesis: the gateway's
store never hits). Rows, all serving the bundled Piper voice ``joe``:

- ``voxgate``: the gateway with a pool of 2 synthesis worker processes (1 ONNX thread each on 2
  cores: the gateway's default threads for 2 workers), WAV out;
- ``pool-direct``: the gateway's own engine pool driven without HTTP: the scheduler and worker
  pool that ``gateway.runtime.components.open_models`` builds from the same settings, fed the same
  texts with the same concurrency. The upper bound for the gateway: what it adds per miss (HTTP,
  parsing, keys, store, encoding) is the difference;
- ``seed-tuned``: the seed article's design (``bench/seed_service.py``) tuned like the gateway:
  as many uvicorn processes as gateway workers, 1 executor thread each, the ONNX Runtime session
  built with the gateway engine's options;
- ``seed-fastapi``: the seed article's design as it was (1 process, ``ThreadPoolExecutor(4)`` on
  one ONNX session with default options).

All rows are measured in one run in interleaved rounds (each round gives every row the same
texts, in a rotated order), so machine noise hits every row alike; the ratios are what counts.

Targets: gateway throughput >= 0.95x pool-direct and >= 1.0x seed-tuned, p99 <= seed-tuned's.
Writes ``docs/bench/miss_path.json`` and ``.png``. Needs the ``bench`` extra (fastapi, uvicorn).

    python -m bench.miss_path          # 4 rows x 320 requests: ~12 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.common import (
    RESULTS,
    cpu_seconds,
    miss_gateway_command,
    miss_parser,
    miss_result,
    provenance,
    write_results,
)
from bench.harness import ROOT, TREE, free_port
from bench.plots import pyplot, save_figure

SENTENCES = [
    "Your call is important to us",
    "Please hold while we connect you",
    "Press one for billing questions",
    "The office opens at nine tomorrow",
    "Thank you for calling the support line",
    "Say your account number after the tone",
    "We are transferring your call now",
    "Goodbye and have a nice day",
]
ROWS = ("voxgate", "pool-direct", "seed-tuned", "seed-fastapi")
TARGETS = {"vs_pool_direct": 0.95, "vs_seed_tuned": 1.0}

# One request: raise on anything but audio.
Speak = Callable[[str], Awaitable[None]]


def texts_for(round_index: int, count: int) -> list[str]:
    """``count`` distinct texts for one round; every row gets the same ones."""
    return [
        f"{SENTENCES[n % len(SENTENCES)]}, ticket {round_index * count + n}." for n in range(count)
    ]


def start(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(
            cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


async def wait_ok(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise TimeoutError(f"{url} did not become ready")


def http_speaker(
    session: aiohttp.ClientSession, name: str, url: str, body_for: Callable[[str], Any]
) -> Speak:
    """POST ``body_for(text)`` to ``url``; the answer must be a WAV."""

    async def speak(text: str) -> None:
        async with session.post(url, json=body_for(text)) as resp:
            data = await resp.read()
            if resp.status != 200 or not data.startswith(b"RIFF"):
                raise AssertionError(f"{name}: status {resp.status}, not a WAV")

    return speak


async def load(speak: Speak, texts: Sequence[str], clients: int) -> dict[str, Any]:
    """``clients`` concurrent clients work through ``texts``; latency per request."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for t in texts:
        queue.put_nowait(t)
    latencies: list[float] = []

    async def client() -> None:
        while not queue.empty():
            text = queue.get_nowait()
            started = time.perf_counter()
            await speak(text)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"requests": len(texts), "wall_s": time.perf_counter() - started, "latencies": latencies}


@contextlib.asynccontextmanager
async def pool_direct(workers: int) -> AsyncIterator[Speak]:
    """The gateway's scheduler + worker pool for Piper, built as the gateway builds them."""
    from prometheus_client import CollectorRegistry

    from gateway.runtime.components import open_models
    from gateway.runtime.settings import Settings
    from metrics import Metrics
    from synth.engine import SynthesisItem

    settings = Settings(synth_workers=workers)
    async with open_models(settings, Metrics(CollectorRegistry()), wait_ready=True) as models:
        scheduler = models["piper"].scheduler

        async def speak(text: str) -> None:
            audio = await scheduler.submit(SynthesisItem(text, "joe"))
            if audio.pcm.size == 0:
                raise AssertionError("pool-direct: no audio")

        yield speak


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = np.asarray([x for r in runs for x in r["latencies"]])
    requests = sum(r["requests"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    return {
        "requests": requests,
        "throughput_rps": round(requests / wall, 3),
        "p50_s": round(float(np.percentile(lat, 50)), 3),
        "p90_s": round(float(np.percentile(lat, 90)), 3),
        "p99_s": round(float(np.percentile(lat, 99)), 3),
        "max_s": round(float(lat.max()), 3),
        "round_rps": [round(r["requests"] / r["wall_s"], 3) for r in runs],
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="voxgate-miss-"))
    gw_port, seed_port, tuned_port = free_port(), free_port(), free_port()
    gateway = start(
        miss_gateway_command(gw_port, tmp / "cache", args.workers),
        tmp / "gateway.log",
        cwd=TREE,  # the gateway under test (bench.vs_commit: an older commit's)
    )
    uvicorn = [sys.executable, "-m", "uvicorn", "bench.seed_service:app", "--log-level", "warning"]
    seed = start([*uvicorn, "--port", str(seed_port)], tmp / "seed.log")
    # Tuned like the gateway: its processes x threads and its engine's ONNX session options.
    threads = max(1, (os.cpu_count() or 1) // args.workers)  # Settings.worker_threads()
    tuned = start(
        [*uvicorn, "--port", str(tuned_port), "--workers", str(args.workers)],
        tmp / "seed-tuned.log",
        env={
            "SEED_THREADS": "1",
            "SEED_ONNX_THREADS": str(threads),
            **{v: str(threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
            "OPENBLAS_NUM_THREADS": str(threads),
        },
    )
    procs = (gateway, seed, tuned)
    gateway_cpu = 0.0
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            pool_direct(args.workers) as direct,
        ):
            await wait_ok(f"http://127.0.0.1:{gw_port}/readyz")
            await wait_ok(f"http://127.0.0.1:{seed_port}/health")
            await wait_ok(f"http://127.0.0.1:{tuned_port}/health")
            seed_body: Callable[[str], Any] = lambda t: {"text": t}  # noqa: E731
            speakers: dict[str, Speak] = {
                "voxgate": http_speaker(
                    session,
                    "voxgate",
                    f"http://127.0.0.1:{gw_port}/v1/audio/speech",
                    lambda t: {
                        "model": "piper",
                        "voice": "joe",
                        "input": t,
                        "response_format": "wav",
                    },
                ),
                "pool-direct": direct,
                "seed-tuned": http_speaker(
                    session, "seed-tuned", f"http://127.0.0.1:{tuned_port}/tts", seed_body
                ),
                "seed-fastapi": http_speaker(
                    session, "seed-fastapi", f"http://127.0.0.1:{seed_port}/tts", seed_body
                ),
            }
            # A warm-up round each, not measured: first-run costs (ONNX Runtime's arena growing,
            # connections, every process of a multi-process server) are not the miss path.
            for speak in speakers.values():
                await load(
                    speak, [f"Warm up, number {n}." for n in range(args.clients)], args.clients
                )
            runs: dict[str, list[dict[str, Any]]] = {n: [] for n in ROWS}
            per_round = args.clients * args.per_client
            for i in range(args.rounds):
                # Rotate (and alternate the direction of) the order, so no row always runs first
                # or last, and each row gets the same texts.
                order = list(ROWS[i % len(ROWS) :] + ROWS[: i % len(ROWS)])
                if i % 2:
                    order.reverse()
                texts = texts_for(i, per_round)
                for name in order:
                    before = cpu_seconds(gateway.pid) if name == "voxgate" else 0.0
                    run = await load(speakers[name], texts, args.clients)
                    if name == "voxgate":
                        gateway_cpu += cpu_seconds(gateway.pid) - before
                    runs[name].append(run)
                    print(
                        f"  round {i + 1} {name:<13} {per_round / run['wall_s']:.2f} req/s",
                        flush=True,
                    )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows = {name: summarize(r) for name, r in runs.items()}
    rows["voxgate"]["gateway_process_cpu_ms_per_request"] = round(
        1000 * gateway_cpu / rows["voxgate"]["requests"], 2
    )
    return rows


def ratios(rows: dict[str, Any]) -> dict[str, Any]:
    """Gateway over each other row: of the aggregate throughputs, and the median of the
    per-round ratios (each round measures every row back to back)."""
    gw = rows["voxgate"]
    out: dict[str, Any] = {}
    for key, other in (
        ("vs_pool_direct", "pool-direct"),
        ("vs_seed_tuned", "seed-tuned"),
        ("vs_seed_fastapi", "seed-fastapi"),
    ):
        o = rows[other]
        per_round = [g / b for g, b in zip(gw["round_rps"], o["round_rps"], strict=True)]
        out[key] = {
            "throughput_ratio": round(gw["throughput_rps"] / o["throughput_rps"], 3),
            "throughput_ratio_median_of_rounds": round(statistics.median(per_round), 3),
            "round_ratios": [round(r, 3) for r in per_round],
            "p99_ratio": round(gw["p99_s"] / o["p99_s"], 3),
        }
    return out


def plot(rows: dict[str, Any], path: Path) -> None:
    names = list(rows)
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4))
    bars = ax1.bar(
        names,
        [rows[n]["throughput_rps"] for n in names],
        color=["tab:blue", "tab:green", "tab:orange", "tab:gray"][: len(names)],
    )
    for b, n in zip(bars, names, strict=True):
        ax1.annotate(
            f"{rows[n]['throughput_rps']:.2f}",
            (b.get_x() + b.get_width() / 2, b.get_height()),
            ha="center",
            va="bottom",
        )
    ax1.set_ylabel("requests / s (all misses)")
    ax1.set_title("Miss-path throughput")
    width = 0.25
    for j, q in enumerate(("p50_s", "p90_s", "p99_s")):
        ax2.bar(
            [i + (j - 1) * width for i in range(len(names))],
            [rows[n][q] for n in names],
            width,
            label=q[:-2],
        )
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("latency (s)")
    ax2.set_title("Miss-path latency")
    ax2.legend()
    save_figure(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every row; the result as written to the JSON (without the provenance)."""
    started = time.perf_counter()
    rows = asyncio.run(main_async(args))
    summary = ratios(rows)
    order = "rows rotated each round, direction alternating; same texts for every row"
    result = miss_result(args, order, rows, summary, started, targets=TARGETS)
    return {"machine": {"cores": os.cpu_count()}, **result}


def main() -> None:
    parser = miss_parser(__doc__, rounds=5)
    parser.add_argument(
        "--json-out", type=Path, help="also write the ratios to this file (bench.vs_commit)"
    )
    args = parser.parse_args()
    provenance()  # the commit and date as the run starts
    result = run(args)
    rows, summary = result["servers"], result["summary"]
    print(f"\n{'row':<13} {'req/s':>7} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'requests':>9}")
    for name, s in rows.items():
        print(
            f"{name:<13} {s['throughput_rps']:>7.2f} {s['p50_s']:>7.2f} {s['p90_s']:>7.2f} "
            f"{s['p99_s']:>7.2f} {s['requests']:>9}"
        )
    print()
    for key, r in summary.items():
        print(
            f"gateway {key:<16} throughput {r['throughput_ratio']:.3f}x "
            f"(median of rounds {r['throughput_ratio_median_of_rounds']:.3f}x), "
            f"p99 {r['p99_ratio']:.3f}x"
        )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(summary, indent=2) + "\n")
    if args.no_write:
        return
    write_results("miss_path", result)
    plot(rows, RESULTS / "miss_path.png")
    print(f"wrote {RESULTS / 'miss_path.json'} and miss_path.png")


if __name__ == "__main__":
    main()
