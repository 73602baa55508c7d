"""The miss path under load: the gateway against the seed article's service, same engine.

16 concurrent clients each send unique texts (so every request is a synthesis: the gateway's
store never hits) to (a) voxgate with a pool of 2 Piper worker processes x 1 thread and (b) the
seed article's FastAPI service re-implemented in ``bench/seed_service.py`` (ThreadPoolExecutor(4),
one global model, WAV through a temp file). Both serve the bundled Piper voice ``joe`` as WAV.
Rounds alternate A-B-B-A in one run so machine noise hits both alike.

Targets: gateway throughput >= 1.0x the baseline's and p99 <= the baseline's.
Writes ``docs/bench/miss_path.json`` and ``.png``. Needs the ``bench`` extra (fastapi, uvicorn).

    .venv/bin/python bench/miss_path.py          # ~2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402

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


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)


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


async def load(
    name: str, url: str, body_for: Any, texts: list[str], clients: int
) -> dict[str, Any]:
    """``clients`` concurrent clients work through ``texts``; latency per request."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for t in texts:
        queue.put_nowait(t)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            while not queue.empty():
                text = queue.get_nowait()
                started = time.perf_counter()
                async with session.post(url, json=body_for(text)) as resp:
                    data = await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    if resp.status == 200 and not data.startswith(b"RIFF"):
                        raise AssertionError(f"{name}: response is not WAV")
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - started
    return {
        "server": name,
        "requests": len(texts),
        "wall_s": wall,
        "latencies": latencies,
        "statuses": statuses,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = np.asarray([x for r in runs for x in r["latencies"]])
    requests = sum(r["requests"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    statuses: dict[str, int] = {}
    for r in runs:
        for k, v in r["statuses"].items():
            statuses[str(k)] = statuses.get(str(k), 0) + v
    return {
        "requests": requests,
        "throughput_rps": round(requests / wall, 3),
        "p50_s": round(float(np.percentile(lat, 50)), 3),
        "p90_s": round(float(np.percentile(lat, 90)), 3),
        "p99_s": round(float(np.percentile(lat, 99)), 3),
        "max_s": round(float(lat.max()), 3),
        "statuses": statuses,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="voxgate-miss-"))
    gw_port, base_port = free_port(), free_port()
    gateway = start(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--port",
            str(gw_port),
            "--cache-dir",
            str(tmp / "cache"),
            "--synth-workers",
            str(args.workers),
            "--log-level",
            "warning",
        ],
        tmp / "gateway.log",
    )
    env_cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.seed_service:app",
        "--port",
        str(base_port),
        "--log-level",
        "warning",
    ]
    baseline = start(env_cmd, tmp / "baseline.log")
    try:
        await wait_ok(f"http://127.0.0.1:{gw_port}/readyz")
        await wait_ok(f"http://127.0.0.1:{base_port}/health")
        servers = {
            "voxgate": (
                f"http://127.0.0.1:{gw_port}/v1/audio/speech",
                lambda t: {"model": "piper", "voice": "joe", "input": t, "response_format": "wav"},
            ),
            "seed-fastapi": (f"http://127.0.0.1:{base_port}/tts", lambda t: {"text": t}),
        }
        # One warm-up request each (first-request costs are not the miss path).
        for name, (url, body) in servers.items():
            await load(name, url, body, [f"Warm up {name}."], 1)
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in servers}
        per_round = args.clients * args.per_client
        order = ["seed-fastapi", "voxgate", "voxgate", "seed-fastapi"]
        for i, name in enumerate(order):
            texts = [
                f"{SENTENCES[n % len(SENTENCES)]}, ticket {i * per_round + n}."
                for n in range(per_round)
            ]
            url, body = servers[name]
            run = await load(name, url, body, texts, args.clients)
            print(f"  round {i + 1} {name}: {per_round / run['wall_s']:.2f} req/s", flush=True)
            runs[name].append(run)
        return {name: summarize(r) for name, r in runs.items()}
    finally:
        for proc in (gateway, baseline):
            proc.terminate()
        for proc in (gateway, baseline):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, [result[n]["throughput_rps"] for n in names], color=["tab:blue", "tab:gray"])
    ax1.set_ylabel("requests / s (all misses)")
    ax1.set_title("Miss-path throughput, 16 clients")
    width = 0.25
    for j, q in enumerate(("p50_s", "p90_s", "p99_s")):
        ax2.bar(
            [i + (j - 1) * width for i in range(len(names))],
            [result[n][q] for n in names],
            width,
            label=q[:-2],
        )
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("latency (s)")
    ax2.set_title("Miss-path latency")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--per-client", type=int, default=3, help="unique texts per client per round"
    )
    parser.add_argument("--workers", type=int, default=2, help="gateway synthesis worker processes")
    args = parser.parse_args()
    started = time.perf_counter()
    servers = asyncio.run(main_async(args))
    gw, base = servers["voxgate"], servers["seed-fastapi"]
    summary = {
        "throughput_ratio": round(gw["throughput_rps"] / base["throughput_rps"], 3),
        "p99_ratio": round(gw["p99_s"] / base["p99_s"], 3),
    }
    print(f"\n{'server':<13} {'req/s':>7} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7}  statuses")
    for name, s in servers.items():
        print(
            f"{name:<13} {s['throughput_rps']:>7.2f} {s['p50_s']:>7.2f} {s['p90_s']:>7.2f} "
            f"{s['p99_s']:>7.2f}  {s['statuses']}"
        )
    print(
        f"\ngateway / baseline throughput: {summary['throughput_ratio']:.2f}x; "
        f"p99: {summary['p99_ratio']:.2f}x"
    )
    result = {
        "machine": {"cores": os.cpu_count()},
        "setup": {
            "clients": args.clients,
            "per_client_per_round": args.per_client,
            "rounds": "A-B-B-A",
            "gateway_workers": args.workers,
            "engine": "piper joe",
            "format": "wav",
        },
        "servers": servers,
        "summary": summary,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "miss_path.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(servers, OUT / "miss_path.png")
    print(f"wrote {OUT / 'miss_path.json'} and miss_path.png")


if __name__ == "__main__":
    main()
