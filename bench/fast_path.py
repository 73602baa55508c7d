"""The fast path on against off, side by side in one run: ``voxgate serve --fast-path true`` and
``voxgate serve --fast-path false``, both up, under the same warm load.

The fast path (the ``fast_path`` setting) is the gateway's own writer of memory hits and its
answers to repeated requests from their bytes, ahead of HTTP parsing (docs/architecture.md,
"Hit path cost"); off, aiohttp writes every response as it ships. Both servers run with no
other flags (the default topology; the per-client shares lifted, as every bench does), each
with its own cache, and are filled with every prompt, for each cache key measured, before any
round (every prompt fetched twice: the second time each must be a hit). Then, per variant
(``--keys`` x ``--threads``), the warm load of ``bench/vs_nginx.py``: ``--prompts`` (343)
one-sentence IVR prompts requested with Zipf popularity (exponent 1.0) by wrk with
``--clients`` (16) kept connections, ``--warm-s`` (40) seconds per server cut into
``--warm-rounds`` (8) rounds interleaved between the two (A B, B A, ...; the idle server uses no
CPU), after one unmeasured second each: a change in the machine's speed falls on both alike.

Per server and variant: requests/s (the mean of its rounds), p50 and p99 (the median), the CPU
its processes used per request (the median; /proc, wrk's own not counted) and the requests
answered from their bytes (``voxgate_fast_hits_total``; none with the fast path off, which the
run checks, and some with it on).

    .venv/bin/python -m bench.fast_path [--prompts 343] [--warm-s 40] [--warm-rounds 8]
                                        [--clients 16] [--keys get,post] [--threads 1,2]
                                        [--no-write]

Writes docs/bench/fast_path.json (with the command, date and git commit) and fast_path.png, and
prints the table. Run it on a quiet machine: the servers and wrk share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import bar_plot, provenance, start_gateway, stop, write_results
from bench.harness import free_port, metric_sum
from bench.hit_path import zipf_sequence
from bench.vs_nginx import (
    Running,
    add_warm_options,
    fetch_all,
    gateway_syntheses,
    ivr_prompts,
    machine,
    voxgate_requests,
    warm_rounds,
    warm_workload,
)

# The two servers, by the value of their --fast-path flag.
SERVERS = {"fast_path_on": "true", "fast_path_off": "false"}


def answered_from_bytes(port: int) -> float:
    """``voxgate_fast_hits_total`` of a server (summed over its processes)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return metric_sum(r.read().decode(), "voxgate_fast_hits_total")


def fill(port: int, keys: Sequence[str], prompts: Sequence[str], clients: int) -> None:
    """Every prompt fetched as each key asks for it, twice: the second time every one a hit."""
    for key in keys:
        reqs = voxgate_requests(f"http://127.0.0.1:{port}", key, prompts)
        asyncio.run(fetch_all(reqs, clients))
        ok, hits = asyncio.run(fetch_all(reqs, clients))
        if hits != ok or ok != len(prompts):
            raise RuntimeError(f"{key}: {hits} of {len(prompts)} prompts stored after the fill")


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Both servers up and filled, then every variant's interleaved warm rounds; the result
    document."""
    prompts = ivr_prompts(args.prompts)
    sequence = zipf_sequence(len(prompts), 1.0, 200_000)
    load_before = os.getloadavg()
    ports = {name: free_port() for name in SERVERS}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    variants: dict[str, Any] = {}
    try:

        def start(name: str) -> None:
            log = tmp / f"{name}.log"
            flags = ("--fast-path", SERVERS[name])
            procs[name] = start_gateway(ports[name], tmp / name / "cache", *flags, log_path=log)
            fill(ports[name], args.keys, prompts, args.clients)

        print("both servers: start, fill ...", flush=True)
        with ThreadPoolExecutor(len(SERVERS)) as pool:  # (their start-ups overlap)
            list(pool.map(start, SERVERS))
        for n, (key, threads) in enumerate(itertools.product(args.keys, args.threads)):
            variant = f"{key}_{threads}t"
            print(f"{variant}: warm rounds ...", flush=True)
            servers = {}
            for name, port in ports.items():
                reqs = voxgate_requests(f"http://127.0.0.1:{port}", key, prompts)
                lua = reqs.script(tmp / name / variant, sequence)
                syntheses = functools.partial(gateway_syntheses, port)
                servers[name] = Running(reqs, lua, syntheses, [procs[name]])
            before = {name: answered_from_bytes(port) for name, port in ports.items()}
            order = tuple(SERVERS) if n % 2 == 0 else tuple(reversed(SERVERS))
            results = warm_rounds(servers, order, args, threads, args.warm_rounds)
            for name, port in ports.items():
                results[name]["answered_from_bytes"] = answered_from_bytes(port) - before[name]
            variants[variant] = {
                "key": key,
                "wrk_threads": threads,
                "results": {name: results[name] for name in SERVERS},
                "summary": summary(results["fast_path_on"], results["fast_path_off"]),
            }
        syntheses = {name: gateway_syntheses(port) for name, port in ports.items()}
    finally:
        for proc in procs.values():
            stop(proc)
    for variant, v in variants.items():
        on, off = (v["results"][name]["answered_from_bytes"] for name in SERVERS)
        if off or not on:
            raise RuntimeError(
                f"{variant}: answered from bytes {on} with the fast path on, {off} off"
            )
    return {
        "benchmark": "fast_path",
        "machine": machine(load_before),
        "workload": warm_workload(prompts, args, args.threads, args.warm_rounds),
        "servers": {name: ["--fast-path", value] for name, value in SERVERS.items()},
        "syntheses": syntheses,
        "variants": variants,
    }


def summary(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """The fast path on over off in one variant: requests/s, CPU per request (off over on: how
    many times the CPU a request costs without it), p99 of each."""
    cpu_on, cpu_off = on.get("cpu_us_per_request"), off.get("cpu_us_per_request")
    return {
        "qps_on_over_off": round(on["rps"] / off["rps"], 3) if off["rps"] else None,
        "cpu_off_over_on": round(cpu_off / cpu_on, 3) if cpu_on and cpu_off else None,
        "p99_ms": {"on": on.get("p99_ms"), "off": off.get("p99_ms")},
    }


def table(report: dict[str, Any]) -> str:
    """Both servers in every variant, as a Markdown table, and each variant's ratios."""
    rows = [
        "| variant | fast path | QPS | p50 ms | p99 ms | CPU us/request | answered from bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in report["variants"].values():
        for name, r in v["results"].items():
            rows.append(
                f"| {v['key'].upper()} key, {v['wrk_threads']} wrk thread(s) "
                f"| {name.rpartition('_')[2]} | {r['rps']:,.1f} | {r.get('p50_ms')} "
                f"| {r.get('p99_ms')} | {r.get('cpu_us_per_request')} "
                f"| {r['answered_from_bytes']:,.0f} |"
            )
    rows.append("")
    for name, v in report["variants"].items():
        s = v["summary"]
        rows.append(
            f"{name}: QPS on / off {s['qps_on_over_off']}x, "
            f"CPU per request off / on {s['cpu_off_over_on']}x"
        )
    return "\n".join(rows)


def plot(report: dict[str, Any]) -> Path:
    """Requests/s of both servers in every variant: docs/bench/fast_path.png."""
    labels, values = [], []
    for v in report["variants"].values():
        for name, r in v["results"].items():
            labels.append(f"{v['key'].upper()} {v['wrk_threads']}t\n{name.rpartition('_')[2]}")
            values.append(r["rps"])
    ratios = ", ".join(
        f"{n} {v['summary']['qps_on_over_off']:.2f}x" for n, v in report["variants"].items()
    )
    w = report["workload"]
    title = (
        f"fast path on (blue) vs off: Zipf over {w['prompts']} prompts, "
        f"{w['connections']} connections\nQPS on / off: {ratios}"
    )
    return bar_plot("fast_path", title, labels, values, "requests/s", colors=("#3b7dd8", "#9aa5b1"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=343, help="distinct prompts")
    add_warm_options(ap)
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    provenance()  # taken as the run starts
    if shutil.which("wrk") is None:
        print("fast_path needs wrk: bash .ci/install installs it", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fast-path-") as tmp:
        report = run(args, Path(tmp))
    print(table(report))
    if not args.no_write:
        print(write_results("fast_path", report), plot(report), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
