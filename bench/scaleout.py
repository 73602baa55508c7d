"""Scale-out with Redis: (1) the hit path served from the Redis tier alone (memory and disk tiers
off) against a bare aiohttp handler serving the same bytes, under the same concurrent load, in one
run with interleaved rounds; (2) the herd: 300 concurrent identical requests over 3 gateway
processes sharing one Redis (syntheses in total), next to 3 replicas without Redis.

    .venv/bin/python -m bench.scaleout [--seconds 6] [--rounds 3] [--connections 16]
                                       [--event-loop auto|uvloop|asyncio] [--skip-herd]

Target for (1): gateway-from-Redis >= 0.4 x bare. Writes docs/bench/scaleout.json and .png.
The load generator is wrk in its own process (or, without wrk, this script's own aiohttp client
in a subprocess). On 2+ CPUs the server under test (gateway or bare) runs on the last CPU and
wrk and redis-server on the others, as Redis would run on its own host in a deployment.

Both servers run on the same event loop (``--event-loop``, default: the gateway's default).

It also measures, in the same run and on the same core, what a Redis client alone spends to GET
the same value (no HTTP, no gateway): redis-py's asyncio client, and the lean reader the tier
reads entries with (cache/resp.py). With the bare server's CPU per request, each bounds the
ratio a gateway reading through it can reach here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    cpu_seconds,
    cpu_split,
    event_loop_argument,
    pin,
    placement,
    provenance,
    wait_http,
    write_results,
)
from bench.harness import (
    ROOT,
    GatewayProcess,
    free_port,
    gateway_processes,
    metric_sum,
    redis_server,
    speech_body,
)
from bench.plots import dot_rounds, pyplot, save_figure
from gateway.runtime.eventloop import label

# About 5.7 s of speech: a ~250 KB PCM16 WAV at the voice's 22,050 Hz.
TEXT = (
    "Thank you for calling. Your call is important to us. All of our agents are currently "
    "helping other customers."
)
HERD_TEXT = "Please hold while we connect you to the next available agent."


def post(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, dict(r.headers), r.read()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return r.read().decode()


# ---- the baseline server and the fallback load generator (run as subprocesses) ------------


async def _python_load(
    url: str, payload: bytes, seconds: float, connections: int
) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            async with session.post(
                url, data=payload, headers={"Content-Type": "application/json"}
            ) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
            latencies.append(time.perf_counter() - t0)

    conn = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=conn) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(connections)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "requests": len(latencies),
        "errors": errors,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def load(
    url: str,
    payload: dict[str, Any],
    seconds: float,
    connections: int,
    cpus: set[int] | None = None,
) -> dict[str, Any]:
    """Drive ``url`` from a separate process (on ``cpus`` when given) for ``seconds``;
    requests/s and latency."""
    affinity = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    wrk = shutil.which("wrk")
    data = json.dumps(payload)
    if wrk is None:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.scaleout",
                "--load",
                url,
                "--payload",
                data,
                "--seconds",
                str(seconds),
                "--connections",
                str(connections),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            preexec_fn=affinity,
        ).stdout
        return dict(json.loads(out), generator="python-aiohttp")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(
            f'wrk.method = "POST"\nwrk.body = {json.dumps(data)}\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        script = f.name
    out = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", script, url],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=affinity,
    ).stdout
    Path(script).unlink()

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if m is None:
            return float("nan")
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = re.search(r"(\d+) requests in", out)
    return {
        "rps": rps,
        "errors": int(non2xx.group(1)) if non2xx else 0,
        "p50_ms": ms("50%"),
        "p99_ms": ms("99%"),
        "generator": "wrk",
        "requests": int(total.group(1)) if total else None,
    }


# ---- the two measurements -----------------------------------------------------------------


def hit_path(
    work: Path, redis_url: str, args: argparse.Namespace, redis_pid: int
) -> dict[str, Any]:
    gw = GatewayProcess(
        work / "gw" / "cache",
        redis_url=redis_url,
        args=["--memory-cache-mb", "0", "--disk-cache-mb", "0", "--event-loop", args.event_loop],
    )
    bare_proc = None
    try:
        gw.wait_ready()
        speech = gw.url + "/v1/audio/speech"
        status, headers, audio = post(speech, speech_body(TEXT))
        assert status == 200 and headers["X-Cache"] == "MISS", headers
        status, headers, again = post(speech, speech_body(TEXT))
        assert headers["X-Cache"] == "HIT" and again == audio, "second request must be a hit"
        wav = work / "same.wav"
        wav.write_bytes(audio)
        bare_port = free_port()
        bare_proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.bare_server",
                str(bare_port),
                str(wav),
                "audio/wav",
                args.event_loop,
            ],
            cwd=ROOT,
        )
        bare = f"http://127.0.0.1:{bare_port}"
        bare_pid = bare_proc.pid
        wait_http(bare + "/readyz")
        status, _, same = post(bare + "/v1/audio/speech", speech_body(TEXT))
        assert same == audio
        split = cpu_split()
        server_cpus, other_cpus = split if split else (None, None)
        pin(gw.proc.pid, server_cpus)
        pin(bare_pid, server_cpus)
        pin(redis_pid, other_cpus)
        before = scrape(gw.url)
        rounds: dict[str, list[dict[str, Any]]] = {"gateway_redis_only": [], "bare_aiohttp": []}
        for r in range(args.rounds):
            for name, url in (("gateway_redis_only", speech), ("bare_aiohttp", bare + "/x")):
                # CPU per request is robust to a busy host where requests/s is not: record both.
                pids = [gw.proc.pid, redis_pid] if name == "gateway_redis_only" else [bare_pid]
                cpu0 = [cpu_seconds(p) for p in pids]
                res = load(url, speech_body(TEXT), args.seconds, args.connections, other_cpus)
                used = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
                n = res.get("requests") or res["rps"] * args.seconds
                res["server_cpu_us_per_request"] = 1e6 * used[0] / n
                if len(used) > 1:
                    res["redis_cpu_us_per_request"] = 1e6 * used[1] / n
                rounds[name].append(res)
                print(
                    f"round {r + 1} {name:20s} {res['rps']:8.1f} req/s  "
                    f"p50 {res['p50_ms']:6.2f} ms  p99 {res['p99_ms']:6.2f} ms  "
                    f"errors {res['errors']}  server CPU {res['server_cpu_us_per_request']:.0f} us/req",
                    flush=True,
                )
        after = scrape(gw.url)
        floor = client_floor(
            redis_url, audio, args.connections, server_cpus, "redis-py", args.event_loop
        )
        lean = client_floor(
            redis_url, audio, args.connections, server_cpus, "lean", args.event_loop
        )
        print(
            f"GET of the {len(audio) // 1000} KB value alone: redis-py asyncio {floor:.0f} us "
            f"CPU, voxgate's lean reader {lean:.0f} us",
            flush=True,
        )
        lookups = "voxgate_cache_lookups_total"
        redis_hits = metric_sum(after, lookups, tier="redis", result="hit") - metric_sum(
            before, lookups, tier="redis", result="hit"
        )
        local = sum(metric_sum(after, lookups, tier=t) for t in ("memory", "disk"))
        med = {k: statistics.median(x["rps"] for x in v) for k, v in rounds.items()}
        bare_cpu = statistics.median(x["server_cpu_us_per_request"] for x in rounds["bare_aiohttp"])
        return {
            "payload_bytes": len(audio),
            "connections": args.connections,
            "seconds_per_round": args.seconds,
            "rounds": rounds,
            "median_rps": med,
            "ratio": med["gateway_redis_only"] / med["bare_aiohttp"],
            "median_cpu_us_per_request": {
                "gateway": statistics.median(
                    x["server_cpu_us_per_request"] for x in rounds["gateway_redis_only"]
                ),
                "redis_server": statistics.median(
                    x["redis_cpu_us_per_request"] for x in rounds["gateway_redis_only"]
                ),
                "bare_aiohttp": statistics.median(
                    x["server_cpu_us_per_request"] for x in rounds["bare_aiohttp"]
                ),
            },
            "target_ratio": 0.4,
            "placement": placement(server_cpus, other_cpus, "wrk and redis-server"),
            "event_loop": label(args.event_loop),
            "redis_py_asyncio_get_cpu_us": floor,
            "ratio_bound_for_redis_asyncio": bare_cpu / (bare_cpu + floor),
            "lean_reader_get_cpu_us": lean,
            "ratio_bound_for_lean_reader": bare_cpu / (bare_cpu + lean),
            "redis_tier_hits_during_load": redis_hits,
            "local_tier_lookups": local,
        }
    finally:
        if bare_proc is not None:
            bare_proc.terminate()
            bare_proc.wait(10)
        gw.stop()


_FLOOR = """
import asyncio, os, sys, time
import redis.asyncio as ra
from cache.resp import RespReader
from gateway.runtime.eventloop import run
async def main(url, size, conns, kind):
    r = ra.Redis.from_url(url, socket_read_size=1 << 20)
    await r.set("voxgate-bench-floor", os.urandom(size))
    lean = RespReader.for_url(url)
    if kind == "lean":
        get = lambda: lean.get(b"voxgate-bench-floor", bytes)  # one copy, as the tier's decode
    else:
        get = lambda: r.get("voxgate-bench-floor")
    async def worker(n):
        for _ in range(n):
            await get()
    await asyncio.gather(*(worker(20) for _ in range(conns)))  # warm
    n = 4000 // conns
    t = time.process_time()
    await asyncio.gather(*(worker(n) for _ in range(conns)))
    print(1e6 * (time.process_time() - t) / (n * conns))
    await r.delete("voxgate-bench-floor")
    await r.aclose()
    await lean.close()
run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]), sys.argv[5])
"""


def client_floor(
    redis_url: str,
    audio: bytes,
    connections: int,
    cpus: set[int] | None,
    kind: str,
    event_loop: str,
) -> float:
    """CPU microseconds one client spends per GET of a value of ``audio``'s size, with
    ``connections`` concurrent callers, on ``cpus``: ``kind`` is ``redis-py`` (its asyncio
    client, with the settings the tier used to read with) or ``lean`` (cache.resp.RespReader)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _FLOOR,
            redis_url,
            str(len(audio)),
            str(connections),
            kind,
            event_loop,
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)),
    ).stdout
    return float(out.strip())


async def _herd(urls: list[str], n: int) -> tuple[list[int], list[bytes], float]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(i: int) -> tuple[int, bytes]:
            async with s.post(
                urls[i % len(urls)] + "/v1/audio/speech", json=speech_body(HERD_TEXT)
            ) as r:
                return r.status, await r.read()

        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(i) for i in range(n)))
        return [st for st, _ in res], [b for _, b in res], time.perf_counter() - t0


def herd(work: Path, redis_url: str, *, requests: int = 300) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": requests, "replicas": 3}
    for name, url in (("with_redis", redis_url), ("without_redis", "")):
        with gateway_processes(work / f"herd-{name}", 3, redis_url=url) as reps:
            urls = [r.url for r in reps]
            statuses, bodies, wall = asyncio.run(_herd(urls, requests))
            texts = [scrape(u) for u in urls]
            out[name] = {
                "syntheses_per_replica": [
                    metric_sum(t, "voxgate_syntheses_total", outcome="ok") for t in texts
                ],
                "ok_responses": statuses.count(200),
                "distinct_bodies": len(set(bodies)),
                "wall_s": wall,
                "lock_waits_result": sum(
                    metric_sum(t, "voxgate_redis_lock_waits_total", outcome="result") for t in texts
                ),
            }
            out[name]["syntheses_total"] = sum(out[name]["syntheses_per_replica"])
            print(
                f"herd {name:14s} syntheses {out[name]['syntheses_total']:.0f}  "
                f"ok {out[name]['ok_responses']}/{requests}  distinct bodies "
                f"{out[name]['distinct_bodies']}  wall {wall:.2f} s",
                flush=True,
            )
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    hp, hd = result["hit_path"], result["herd"]
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(10, 4))
    names = ["gateway_redis_only", "bare_aiohttp"]
    meds = [hp["median_rps"][n] for n in names]
    ax1.bar(
        ["voxgate hit\n(Redis tier only)", "bare aiohttp\n(same bytes)"],
        meds,
        color=["tab:red", "tab:gray"],
    )
    dot_rounds(ax1, [[x["rps"] for x in hp["rounds"][n]] for n in names], size=12)
    ax1.set_ylabel("requests/s (median of rounds; dots: rounds)")
    ax1.set_title(
        f"Hit path, {hp['payload_bytes'] // 1024} KB WAV, {hp['connections']} conns: "
        f"{hp['ratio']:.2f}x"
    )
    ax2.bar(
        ["3 replicas\n+ Redis", "3 replicas\nno Redis"],
        [hd["with_redis"]["syntheses_total"], hd["without_redis"]["syntheses_total"]],
        color=["tab:red", "tab:gray"],
    )
    ax2.set_ylabel("syntheses in total")
    ax2.set_title(f"{hd['requests']} concurrent identical requests")
    fig.suptitle(result["host"])
    save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--skip-herd", action="store_true")
    ap.add_argument("--unix", action="store_true", help="reach Redis over a unix socket")
    event_loop_argument(ap)
    ap.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--payload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        res = asyncio.run(
            _python_load(args.load, args.payload.encode(), args.seconds, args.connections)
        )
        print(json.dumps(res))
        return
    provenance()  # the commit and date as the run starts
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sock = work / "redis" / "redis.sock"
        extra = ["--unixsocket", str(sock), "--unixsocketperm", "700"] if args.unix else []
        with redis_server(work / "redis", extra=extra) as redis:
            url = f"unix://{sock}" if args.unix else redis.url
            result: dict[str, Any] = {
                "bench": "scaleout",
                "host": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores), "
                f"redis-server {_redis_version()}",
                "redis_transport": "unix socket" if args.unix else "tcp loopback",
                "hit_path": hit_path(work, url, args, redis.proc.pid if redis.proc else 0),
            }
            if not args.skip_herd:
                result["herd"] = herd(work, redis.url)
    hp = result["hit_path"]
    print(
        f"\nhit path from the Redis tier alone: {hp['median_rps']['gateway_redis_only']:.0f} "
        f"req/s vs bare aiohttp {hp['median_rps']['bare_aiohttp']:.0f} req/s = "
        f"{hp['ratio']:.2f}x (target >= 0.4x); Redis-tier hits during load: "
        f"{hp['redis_tier_hits_during_load']:.0f}"
    )
    cpu = hp["median_cpu_us_per_request"]
    print(
        f"CPU per request: gateway {cpu['gateway']:.0f} us + redis-server "
        f"{cpu['redis_server']:.0f} us vs bare aiohttp {cpu['bare_aiohttp']:.0f} us"
    )
    print(
        f"GET alone: redis-py asyncio {hp['redis_py_asyncio_get_cpu_us']:.0f} us CPU (a gateway "
        f"reading through it that cost nothing else would reach at most "
        f"{hp['ratio_bound_for_redis_asyncio']:.2f}x here); the lean reader "
        f"{hp['lean_reader_get_cpu_us']:.0f} us (bound {hp['ratio_bound_for_lean_reader']:.2f}x); "
        f"event loop: {hp['event_loop']}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_results("scaleout", result)
    if "herd" in result:
        plot(result, RESULTS / "scaleout.png")
    print(f"wrote {RESULTS / 'scaleout.json'}")


def _redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else "?"


if __name__ == "__main__":
    main()
