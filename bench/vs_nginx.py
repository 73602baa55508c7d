"""voxgate against what users build instead: the seed article's service behind nginx proxy_cache.

The baseline is ``bench/seed_service.py`` (FastAPI, one Piper model, ``ThreadPoolExecutor(4)``)
run by uvicorn, with nginx in front (Debian's nginx-light, ``/usr/sbin/nginx``, started here on
loopback with a temporary config): ``proxy_cache`` keyed on the request body, ``proxy_cache_lock
on`` so concurrent misses of one prompt reach the service once, one nginx worker per core, its
access log on (nginx's default, as voxgate's is). Against
it, ``voxgate serve`` with no flags (only its port, a fresh cache directory, and the per-client
queue share lifted: every request here comes from one loopback address standing for many
clients).

Workload, in one run for each server: ``--prompts`` (default 343) distinct one-sentence IVR-style
prompts, requested with Zipf popularity (exponent 1.0) by ``--clients`` (16) connections of wrk:

- **cold**: ``--cold-s`` seconds from an empty cache (misses synthesize, repeats hit);
- then every prompt fetched once (so the whole set is stored), and the syntheses counted: the
  seed's ``POST /tts`` lines in uvicorn's access log, voxgate's ``voxgate_syntheses_total``;
- **warm**: ``--warm-s`` seconds of the same Zipf load, every answer a stored one.

Then ``voxgate serve --workers 1`` and ``--workers 2``, cold only, with their syntheses per
distinct prompt (one synthesis pool per host: a master is never synthesized twice); the one that
is the default topology here (``--workers 2`` on 2 cores) is the no-flags run, not run again.

    .venv/bin/python -m bench.vs_nginx [--prompts 343] [--cold-s 45] [--warm-s 20]
                                       [--clients 16] [--no-write] [--skip-workers]

Writes docs/bench/vs_nginx.json (with the command, date and git commit) and vs_nginx.png. Takes
about 6 minutes on a 2-core machine with the defaults. Run it on a quiet machine: the servers and
wrk share the cores (as they would on one host), so other load moves the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    provenance,
    start_gateway,
    stop,
    wait_http,
    write_results,
    wrk_rate,
)
from bench.harness import ROOT, free_port
from bench.hit_path import CITIES, COMPANIES, THINGS, write_wrk_script, zipf_sequence
from gateway.runtime.settings import Settings

NGINX = "/usr/sbin/nginx"
# Long enough for a miss queued behind 16 others on a cold cache; wrk's default is 2 s.
REQUEST_TIMEOUT_S = 60.0


def ivr_prompts(count: int, seed: int = 13) -> list[str]:
    """``count`` distinct one-sentence IVR prompts, in a shuffled popularity order.

    One sentence each, so that a prompt is exactly one master in voxgate (its syntheses are
    comparable one for one with the seed service's, which synthesizes whole texts).
    """
    side = 1
    while side**3 < count:
        side += 1
    if side > min(len(COMPANIES), len(THINGS), len(CITIES)):
        raise ValueError(f"at most {len(COMPANIES) ** 3} prompts")
    prompts = [
        f"Thank you for calling {a}, your {b} is ready for pickup in {c}."
        for a, b, c in itertools.product(COMPANIES[:side], THINGS[:side], CITIES[:side])
    ]
    random.Random(seed).shuffle(prompts)
    return prompts[:count]


def nginx_config(directory: Path, port: int, upstream_port: int, workers: int) -> Path:
    """A self-contained nginx config under ``directory``: proxy_cache with the lock on."""
    for sub in ("cache", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    # As root, nginx's workers switch to `nobody`, who cannot write a private temp directory.
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = directory / "nginx.conf"
    conf.write_text(
        f"""{user}worker_processes {workers};
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    # nginx's default, as voxgate's: one access line per request (combined format, to a file).
    access_log {directory}/access.log combined;
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    proxy_cache_path {directory}/cache levels=1:2 keys_zone=tts:32m max_size=4g inactive=1d
                     use_temp_path=off;
    upstream seed {{ server 127.0.0.1:{upstream_port}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{port};
        # The body is the cache key: it must be read into memory, never spooled to a file.
        client_body_buffer_size 64k;
        client_max_body_size 64k;
        location /tts {{
            proxy_pass http://seed;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 120s;
            proxy_cache tts;
            proxy_cache_methods POST;
            proxy_cache_key "$request_uri|$request_body";
            proxy_cache_valid 200 1d;
            proxy_cache_lock on;
            proxy_cache_lock_timeout {int(REQUEST_TIMEOUT_S)}s;
            proxy_cache_lock_age {int(REQUEST_TIMEOUT_S)}s;
            add_header X-Cache $upstream_cache_status;
        }}
        location /health {{ proxy_pass http://seed; }}
    }}
}}
"""
    )
    return conf


def start_seed(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """The seed service as the article ran it: one uvicorn process, its access log on."""
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.seed_service:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_http(f"http://127.0.0.1:{port}/health", timeout_s=180)
    # voxgate warms its engines before it reports ready; give the seed the same start (one
    # synthesis of a text outside the workload, sent to it directly, past nginx).
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/tts",
        data=_json({"text": "Warming up."}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
    return proc


def seed_syntheses(log_path: Path) -> int:
    """``POST /tts`` requests the seed answered through nginx (each one a synthesis: it has no
    cache), less the warm-up request."""
    answered = re.findall(r'"POST /tts HTTP/1\.1" 200', log_path.read_text(errors="replace"))
    return len(answered) - 1


def gateway_syntheses(port: int) -> int:
    """``voxgate_syntheses_total{outcome="ok"}`` summed over models (and processes)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for m in re.finditer(r"^voxgate_syntheses_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        if 'outcome="ok"' in m.group(1):
            total += float(m.group(2))
    return int(total)


async def fetch_all(url: str, bodies: Sequence[str], clients: int) -> int:
    """POST every body once with ``clients`` connections; the count of 200 answers."""
    import aiohttp

    todo = iter(bodies)
    ok = 0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S * 4)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            nonlocal ok
            for body in todo:
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status} while filling the cache")
                    ok += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok


def load(url: str, lua: Path, seconds: float, clients: int) -> dict[str, float]:
    """wrk's figures for ``seconds`` of the scripted Zipf load."""
    threads = min(clients, max(1, (os.cpu_count() or 1)))
    r = wrk_rate(
        url,
        body=None,
        seconds=seconds,
        connections=clients,
        threads=threads,
        lua=lua,
        timeout_s=REQUEST_TIMEOUT_S,
    )
    return {k: round(v, 2) for k, v in r.items()}


def run_phases(
    url: str,
    lua: Path,
    bodies: Sequence[str],
    args: argparse.Namespace,
    syntheses: Any,
    *,
    warm: bool,
) -> dict[str, Any]:
    """Cold load, fill, count syntheses, then (``warm``) warm load."""
    out: dict[str, Any] = {"cold": load(url, lua, args.cold_s, args.clients)}
    started = time.perf_counter()
    asyncio.run(fetch_all(url, bodies, args.clients))
    out["fill_s"] = round(time.perf_counter() - started, 2)
    count = int(syntheses())
    out["syntheses"] = count
    out["syntheses_per_prompt"] = round(count / len(bodies), 3)
    if warm:
        out["warm"] = load(url, lua, args.warm_s, args.clients)
    return out


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every server of the comparison, one after another; the result document."""
    prompts = ivr_prompts(args.prompts)
    sequence = zipf_sequence(len(prompts), 1.0, 200_000)
    seed_bodies = [_json({"text": p}) for p in prompts]
    vox_bodies = [
        _json({"model": "tts-1", "voice": "alloy", "input": p, "response_format": "wav"})
        for p in prompts
    ]
    (tmp / "seed").mkdir()
    (tmp / "vox").mkdir()
    seed_lua = write_wrk_script(tmp / "seed", seed_bodies, sequence)
    vox_lua = write_wrk_script(tmp / "vox", vox_bodies, sequence)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    results: dict[str, Any] = {}
    # Other work on the machine moves every figure here: say how loaded it was.
    load_before = os.getloadavg()

    # --- nginx proxy_cache + the seed service ---
    seed_port, nginx_port = free_port(), free_port()
    seed_log = tmp / "seed.log"
    seed = start_seed(seed_port, seed_log)
    conf = nginx_config(tmp / "nginx", nginx_port, seed_port, int(cores or 1))
    nginx = subprocess.Popen(
        [NGINX, "-p", str(tmp / "nginx"), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{nginx_port}/health")
        print("nginx + seed: cold, fill, warm ...", flush=True)
        results["nginx_seed"] = run_phases(
            f"http://127.0.0.1:{nginx_port}/tts",
            seed_lua,
            seed_bodies,
            args,
            lambda: seed_syntheses(seed_log),
            warm=True,
        )
    finally:
        stop(nginx)
        stop(seed)

    # --- voxgate: no flags, then --workers 1 and 2 cold ---
    configs: list[tuple[str, list[str], bool]] = [("voxgate", [], True)]
    if not args.skip_workers:
        configs += [
            ("voxgate_workers_1", ["--workers", "1"], False),
            ("voxgate_workers_2", ["--workers", "2"], False),
        ]
    # With no flags voxgate runs one gateway process per core: on a 2-core machine that is
    # `--workers 2` already, and its cold run is not repeated (the run stays within 8 minutes).
    default_gateways = Settings.load(env={}).topology().gateway_processes
    for name, flags, warm in configs:
        if flags == ["--workers", str(default_gateways)] and "voxgate" in results:
            results[name] = {
                k: v for k, v in results["voxgate"].items() if k not in ("warm", "flags")
            }
            results[name]["flags"] = flags
            results[name]["same_run_as"] = "voxgate"
            continue
        port = free_port()
        log_path = tmp / f"{name}.log"
        gw = start_gateway(port, tmp / f"{name}-cache", *flags, log_path=log_path)
        try:
            topology = re.search(r'topology: ([^"\n]*)', log_path.read_text(errors="replace"))
            print(f"{name}: cold, fill{', warm' if warm else ''} ...", flush=True)
            results[name] = run_phases(
                f"http://127.0.0.1:{port}/v1/audio/speech",
                vox_lua,
                vox_bodies,
                args,
                lambda port=port: gateway_syntheses(port),  # type: ignore[misc]
                warm=warm,
            )
            results[name]["flags"] = flags
            results[name]["topology"] = topology.group(1) if topology else None
        finally:
            stop(gw)

    nx, vx = results["nginx_seed"], results["voxgate"]
    summary: dict[str, Any] = {
        "cold_qps_ratio": _ratio(vx["cold"]["rps"], nx["cold"]["rps"]),
        "warm_qps_ratio": _ratio(vx["warm"]["rps"], nx["warm"]["rps"]),
        "warm_p99_ms": {"voxgate": vx["warm"].get("p99_ms"), "nginx": nx["warm"].get("p99_ms")},
    }
    if not args.skip_workers:
        w1, w2 = results["voxgate_workers_1"], results["voxgate_workers_2"]
        summary["workers_2_over_1_cold"] = _ratio(w2["cold"]["rps"], w1["cold"]["rps"])
        summary["syntheses_per_prompt"] = {
            "workers_1": w1["syntheses_per_prompt"],
            "workers_2": w2["syntheses_per_prompt"],
        }
    return {
        "benchmark": "vs_nginx",
        "machine": {
            "cores": cores,
            "python": platform.python_version(),
            "load_average_1m": {"start": load_before[0], "end": os.getloadavg()[0]},
        },
        "workload": {
            "prompts": len(prompts),
            "zipf_s": 1.0,
            "clients": args.clients,
            "cold_s": args.cold_s,
            "warm_s": args.warm_s,
            "format": "wav",
            "example_prompt": prompts[0],
        },
        "nginx": {
            "workers": cores,
            "proxy_cache_lock": "on",
            "access_log": "on (combined, to a file)",
            "upstream": "bench/seed_service.py",
        },
        "results": results,
        "summary": summary,
    }


def _ratio(a: float, b: float) -> float | None:
    """``a / b`` to 3 places; None when ``b`` is 0 (nothing answered in a very short phase)."""
    return round(a / b, 3) if b else None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def plot(report: dict[str, Any]) -> Path:
    """Cold and warm QPS of each server, grouped; saved as docs/bench/vs_nginx.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    # Cold and warm differ by three orders of magnitude on a small box: one panel each.
    fig, (ax_cold, ax_warm) = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, phase, color in ((ax_cold, "cold", "#3b7dd8"), (ax_warm, "warm", "#e07b39")):
        names = [n for n in res if phase in res[n]]
        values = [res[n][phase]["rps"] for n in names]
        bars = ax.bar([n.replace("_", " ") for n in names], values, color=color)
        for b, v in zip(bars, values, strict=True):
            ax.annotate(
                f"{v:,.1f}" if v < 100 else f"{v:,.0f}",
                (b.get_x() + b.get_width() / 2, v),
                ha="center",
                va="bottom",
            )
        ax.set_title(phase)
        ax.set_ylabel("requests/s")
        ax.tick_params(axis="x", labelrotation=15)
    w = report["workload"]
    fig.suptitle(
        f"Zipf over {w['prompts']} prompts, {w['clients']} clients "
        f"(cold {w['cold_s']:g} s from empty, warm {w['warm_s']:g} s)"
    )
    fig.tight_layout()
    path = RESULTS / "vs_nginx.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=343, help="distinct prompts (>= 300 for docs)")
    ap.add_argument("--cold-s", type=float, default=45.0, help="seconds of load from empty")
    ap.add_argument("--warm-s", type=float, default=20.0, help="seconds of load, all stored")
    ap.add_argument("--clients", type=int, default=16, help="concurrent connections")
    ap.add_argument("--skip-workers", action="store_true", help="no --workers 1 vs 2 runs")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    provenance()  # taken as the run starts
    if not Path(NGINX).is_file() or shutil.which("wrk") is None:
        print("vs_nginx needs nginx-light and wrk: bash .ci/install installs them", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vs-nginx-") as tmp:
        report = run(args, Path(tmp))
    for name, r in report["results"].items():
        warm = r.get("warm")
        print(
            f"{name:>18}: cold {r['cold']['rps']:8.1f} req/s (p99 {r['cold'].get('p99_ms')} ms)"
            + (f", warm {warm['rps']:8.1f} req/s (p99 {warm.get('p99_ms')} ms)" if warm else "")
            + f", syntheses per prompt {r['syntheses_per_prompt']}"
        )
    s = report["summary"]
    print(f"voxgate / nginx: cold {s['cold_qps_ratio']}x, warm {s['warm_qps_ratio']}x")
    if "workers_2_over_1_cold" in s:
        print(f"workers 2 / 1 cold: {s['workers_2_over_1_cold']}x")
    if not args.no_write:
        print(write_results("vs_nginx", report))
        print(plot(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
