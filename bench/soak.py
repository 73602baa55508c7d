"""Soak: a gateway under mixed load for a long time; memory, file descriptors and queue depth must
stay flat and no request may get a 5xx.

A real gateway (``python -m gateway serve``: the bundled Piper voice in a synthesis worker
process, memory + disk tiers in a temp dir, a real redis-server) on loopback, driven for
``--minutes`` (default 30) by a mix of clients, each kind in its own task:

- ``hit``: a catalogue of prompts asked again and again (whole, and by key on ``/v1/audio/{key}``);
- ``miss``: a new sentence each time (paced: synthesis is the expensive part);
- ``stream``: a new three-sentence text, streamed and read to the end;
- ``disconnect``: a new eight-sentence text, streamed, dropped after its first bytes;
- ``bad``: hostile or malformed input (bad JSON, unknown voice, empty text, control characters,
  a speed out of range, a text over the audio budget, a malformed key) that must get a 4xx;
- one Redis restart halfway: redis-server is killed and started again on the same port.

Before the mixed load, two long requests are measured: one unpunctuated sentence of 300, then of
900 characters, at speed 0.25, while a cached prompt is asked for again and again; each one's
status and time, the hits' latency, and the peak RSS growth of all server processes meanwhile.

Every ``--sample-s`` seconds it records the RSS and open file descriptors of every server process
(the gateway and its synthesis workers; Redis is recorded apart: it is the shared store, not the
gateway) and the synthesis queue depth from ``/metrics``. After ``--warmup-min`` minutes (the
bounded memory tier and memos filled), RSS growth is the change of the median of the last minute's
samples against the first minute's after warm-up.

    python -m bench.soak [--minutes 30]

Writes docs/bench/soak.json and docs/bench/soak.png (``--no-write``: neither).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from bench.common import RESULTS, provenance, stop, wait_http, write_results
from bench.harness import ROOT, RedisServer, free_port, speech_body, unpunctuated
from bench.plots import pyplot, save_figure
from gateway.runtime.settings import Settings

PROMPTS = [
    f"{greeting} {topic}."
    for greeting, topic in itertools.product(
        ("Thank you for calling about", "Please hold while we look into", "Press one to hear"),
        (
            "your balance",
            "your last payment",
            "a new card",
            "your address",
            "opening hours",
            "a lost card",
            "your statement",
            "a loan",
        ),
    )
]

# Hostile input, each answered with a 4xx (tests/test_hostile.py has the full table).
BAD_BODIES: list[tuple[str, bytes, dict[str, str]]] = [
    ("bad_json", b'{"input": "hi", ', {}),
    ("nul_only", b'{"model":"tts-1","voice":"alloy","input":"\\u0000\\u0000"}', {}),
    ("json_5000_deep", b'{"a":' * 5000 + b"1" + b"}" * 5000, {}),
    (
        "huge_int_speed",
        b'{"model":"tts-1","voice":"alloy","input":"hi","speed":1' + b"0" * 400 + b"}",
        {},
    ),
    ("unknown_voice", b'{"model":"tts-1","voice":"nobody","input":"hello there"}', {}),
    ("empty_input", b'{"model":"tts-1","voice":"alloy","input":"   "}', {}),
    ("speed_range", b'{"model":"tts-1","voice":"alloy","input":"hello","speed":10}', {}),
    ("huge_speed", b'{"model":"tts-1","voice":"alloy","input":"hello","speed":1e400}', {}),
    ("not_object", b"[1, 2, 3]", {}),
    (
        "over_budget",
        b'{"model":"tts-1","voice":"alloy","speed":0.25,"input":"'
        + b" ".join([b"word"] * 800)
        + b'"}',
        {},
    ),
]


class Load:
    """The clients' shared counters: responses by kind and status class, and failures."""

    def __init__(self) -> None:
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.fives: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.counter = itertools.count()

    def record(self, kind: str, status: int) -> None:
        self.statuses[(kind, status)] += 1
        if status >= 500 and len(self.fives) < 50:
            self.fives.append({"t_s": round(time.monotonic() - self.started, 1), "kind": kind})

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, dict[str, int]] = {}
        for (kind, status), n in sorted(self.statuses.items()):
            by_kind.setdefault(kind, {})[str(status)] = n
        return {
            "responses": by_kind,
            "total": sum(self.statuses.values()),
            "5xx": sum(n for (_, s), n in self.statuses.items() if s >= 500),
            "first_5xx": self.fives,
            "client_errors": {f"{k}:{e}": n for (k, e), n in sorted(self.errors.items())},
        }


async def forever(
    load: Load,
    kind: str,
    until: float,
    step: Callable[[], Awaitable[int | None]],
    pause_s: float = 0.0,
) -> None:
    """Run ``step`` until ``until`` (monotonic), recording each status; a transport error is
    counted as a client error (the server's side of it shows in its 5xx and health)."""
    while time.monotonic() < until:
        try:
            status = await step()
        except (aiohttp.ClientError, TimeoutError) as exc:
            load.errors[(kind, type(exc).__name__)] += 1
            await asyncio.sleep(0.2)
            continue
        if status is not None:
            load.record(kind, status)
        if pause_s:
            await asyncio.sleep(pause_s)


async def drive(
    base: str, minutes: float, load: Load, catalogue: list[str], keys: list[str]
) -> None:
    """Every client kind, concurrently, for ``minutes``; the hits ask for the ``catalogue``'s
    prompts (stored by :func:`warm`, their content ``keys``). Each kind is its own client (its
    own loopback address), as the gateway's per-client queue share sees clients."""
    until = time.monotonic() + minutes * 60
    timeout = aiohttp.ClientTimeout(total=120)
    url = f"{base}/v1/audio/speech"
    kinds = ("hit", "by_key", "miss", "stream", "disconnect", "bad")
    async with contextlib.AsyncExitStack() as stack:
        sessions = {
            kind: await stack.enter_async_context(
                aiohttp.ClientSession(
                    timeout=timeout,
                    connector=aiohttp.TCPConnector(local_addr=(f"127.0.0.{i + 2}", 0)),
                )
            )
            for i, kind in enumerate(kinds)
        }

        async def answered(kind: str, method: str, target: str, **kw: Any) -> int:
            """A request of ``kind``, its answer read to the end: its status."""
            async with sessions[kind].request(method, target, **kw) as r:
                await r.read()
                return r.status

        async def hit() -> int:
            return await answered("hit", "POST", url, json=speech_body(random.choice(catalogue)))

        async def by_key() -> int:
            return await answered("by_key", "GET", f"{base}/v1/audio/{random.choice(keys)}")

        async def miss() -> int:
            text = f"Your reference number is {next(load.counter)} {random.randint(0, 9999)}."
            return await answered("miss", "POST", url, json=speech_body(text))

        async def stream() -> int:
            n = next(load.counter)
            text = f"Ticket {n} is open. An agent replies soon. Goodbye from {n % 97}."
            return await answered("stream", "POST", url, json=speech_body(text, stream=True))

        async def disconnect() -> int:
            session = sessions["disconnect"]
            n = next(load.counter)
            text = " ".join(f"Step {i} of plan {n} is done." for i in range(8))
            r = await session.post(url, json=speech_body(text, stream=True))
            status = r.status
            await r.content.readany()
            r.close()  # gone after the first bytes
            return status

        async def bad() -> int:
            name, raw, headers = random.choice(BAD_BODIES)
            headers = {"Content-Type": "application/json", **headers}
            status = await answered("bad", "POST", url, data=raw, headers=headers)
            if not 400 <= status < 500:
                load.errors[("bad", f"{name}:{status}")] += 1
            return status

        async def bad_key() -> int:
            return await answered("bad", "GET", f"{base}/v1/audio/{'g' * 64}")

        await asyncio.gather(
            *(forever(load, "hit", until, hit) for _ in range(4)),
            forever(load, "hit_by_key", until, by_key),
            forever(load, "miss", until, miss, pause_s=1.0),
            forever(load, "stream", until, stream, pause_s=3.0),
            forever(load, "disconnect", until, disconnect, pause_s=5.0),
            forever(load, "bad", until, bad, pause_s=0.05),
            forever(load, "bad", until, bad_key, pause_s=0.2),
        )


def role_of(process: psutil.Process, root_pid: int) -> str:
    """What a server process is, from its command line: the supervisor (the pid the bench
    started), a gateway process, the host's synthesis pool process, or a synthesis worker."""
    if process.pid == root_pid:
        return "supervisor"
    try:
        cmdline = " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return "gone"
    if "--worker-of" in cmdline:
        return "gateway"
    if "multiprocessing" in cmdline:
        return "synthesis worker"
    return "pool host" if "pool" in cmdline else "other"


def server_processes(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def queue_depth(base: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("voxgate_synthesis_queue_depth{")
    )


async def sampler(
    base: str, gateway_pid: int, redis: RedisServer, minutes: float, every_s: float
) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    until = started + minutes * 60
    while time.monotonic() < until:
        rss = fds = 0
        by_role: dict[str, float] = {}
        procs = server_processes(gateway_pid)
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                one = p.memory_info().rss
                rss += one
                fds += p.num_fds()
                role = role_of(p, gateway_pid)
                by_role[role] = by_role.get(role, 0.0) + one / 2**20
        redis_rss = 0
        if redis.proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                redis_rss = psutil.Process(redis.proc.pid).memory_info().rss
        try:
            depth: float | None = await asyncio.to_thread(queue_depth, base)
        except OSError:
            depth = None
        samples.append(
            {
                "t_s": round(time.monotonic() - started, 1),
                "rss_mb": round(rss / 2**20, 1),
                # Which kind of process holds it (a growth is then found by its owner).
                "rss_mb_by_role": {k: round(v, 1) for k, v in sorted(by_role.items())},
                "fds": fds,
                "processes": len(procs),
                "queue_depth": depth,
                "redis_rss_mb": round(redis_rss / 2**20, 1),
            }
        )
        await asyncio.sleep(every_s)
    return samples


async def restart_redis(redis: RedisServer, at_s: float, down_s: float) -> dict[str, float]:
    await asyncio.sleep(at_s)
    killed = time.monotonic()
    await asyncio.to_thread(redis.stop)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(redis.start)
    return {"killed_at_s": round(at_s, 1), "down_s": round(time.monotonic() - killed, 1)}


def rss_total(pid: int) -> int:
    total = 0
    for p in server_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


async def long_request(base: str, pid: int, chars: int) -> dict[str, Any]:
    """An unpunctuated sentence of ``chars`` characters at speed 0.25 while a cached prompt is
    served: the request must be answered without holding up the hits, and the server's RSS must
    come back near its resting value within 10 s."""
    text = unpunctuated(chars)
    url = f"{base}/v1/audio/speech"
    base_rss = peak = rss_total(pid)
    latencies: list[float] = []
    hit_statuses: Counter[int] = Counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def big() -> tuple[int, int]:
            async with session.post(url, json=speech_body(text, speed=0.25)) as r:
                return r.status, len(await r.read())

        started = time.perf_counter()
        task = asyncio.create_task(big())
        while not task.done():
            t0 = time.perf_counter()
            async with session.post(url, json=speech_body(PROMPTS[0])) as r:
                await r.read()
                hit_statuses[r.status] += 1
            latencies.append(time.perf_counter() - t0)
            peak = max(peak, rss_total(pid))
            await asyncio.wait({task}, timeout=0.1)
        status, size = await task
        elapsed = time.perf_counter() - started
    at_end = rss_total(pid)
    await asyncio.sleep(10)
    latencies.sort()
    return {
        "request": f"{chars} characters, no punctuation, speed 0.25, wav",
        "status": status,
        "seconds": round(elapsed, 2),
        "audio_bytes": size,
        "rss_mb_before": round(base_rss / 2**20, 1),
        "rss_mb_peak_growth": round((peak - base_rss) / 2**20, 1),
        "rss_mb_growth_at_end": round((at_end - base_rss) / 2**20, 1),
        "rss_mb_growth_10s_after": round((rss_total(pid) - base_rss) / 2**20, 1),
        "cached_prompt_meanwhile": {
            "requests": len(latencies),
            "statuses": {str(k): v for k, v in hit_statuses.items()},
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
            "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
            "max_ms": round(1000 * latencies[-1], 1) if latencies else None,
        },
    }


def warm(base: str, catalogue: list[str]) -> list[str]:
    """Synthesize the prompt catalogue once; its content keys."""
    keys = []
    for text in catalogue:
        req = urllib.request.Request(
            f"{base}/v1/audio/speech",
            data=json.dumps(speech_body(text)).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            keys.append(r.headers["X-Audio-Key"])
    return keys


def steady_growth(
    samples: list[dict[str, Any]], warmup_s: float, window_s: float
) -> dict[str, Any]:
    """RSS and fds after warm-up: the median of the first and the last ``window_s`` compared."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    if len(after) < 2:
        return {"note": "too short for a steady state"}
    t0, t1 = after[0]["t_s"], after[-1]["t_s"]
    window_s = min(window_s, (t1 - t0) / 2) or window_s
    first = [s for s in after if s["t_s"] <= t0 + window_s]
    last = [s for s in after if s["t_s"] >= t1 - window_s]
    rss0 = statistics.median(s["rss_mb"] for s in first)
    rss1 = statistics.median(s["rss_mb"] for s in last)
    roles = sorted({r for s in after for r in s.get("rss_mb_by_role", {})})

    def role_median(window: list[dict[str, Any]], role: str) -> float:
        return statistics.median(s.get("rss_mb_by_role", {}).get(role, 0.0) for s in window)

    return {
        "rss_mb_by_role_start_end": {
            r: [role_median(first, r), role_median(last, r)] for r in roles
        },
        "from_s": t0,
        "to_s": t1,
        "rss_mb_start": rss0,
        "rss_mb_end": rss1,
        "rss_growth_pct": round(100 * (rss1 - rss0) / rss0, 2),
        "rss_mb_max": max(s["rss_mb"] for s in after),
        "fds_start": statistics.median(s["fds"] for s in first),
        "fds_end": statistics.median(s["fds"] for s in last),
        "fds_min": min(s["fds"] for s in after),
        "fds_max": max(s["fds"] for s in after),
        "queue_depth_max": max((s["queue_depth"] or 0) for s in after),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    samples = result["samples"]
    t = [s["t_s"] / 60 for s in samples]
    fig, axes = pyplot().subplots(3, 1, figsize=(8, 8), sharex=True)
    panels = (
        ("rss_mb", "RSS, all server processes (MB)"),
        ("fds", "open file descriptors"),
        ("queue_depth", "synthesis queue depth"),
    )
    for ax, (field, label) in zip(axes, panels, strict=True):
        ax.plot(t, [s[field] if s[field] is not None else float("nan") for s in samples])
        ax.set_ylabel(label, fontsize=8)
        ax.axvline(result["warmup_min"], color="gray", linestyle=":", label="end of warm-up")
        restart = result["redis_restart"]["killed_at_s"] / 60
        ax.axvline(restart, color="red", linestyle="--", label="Redis restart")
    axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("minutes")
    steady = result["steady_state"]
    fig.suptitle(
        f"soak {result['minutes']:g} min: {result['load']['total']:,} responses, "
        f"{result['load']['5xx']} 5xx, RSS growth after warm-up "
        f"{steady.get('rss_growth_pct', float('nan')):+.2f}%",
        fontsize=10,
    )
    save_figure(fig, path)


async def measure(
    args: argparse.Namespace,
    base: str,
    pid: int,
    redis: RedisServer,
    catalogue: list[str],
    keys: list[str],
) -> tuple[Load, list[dict[str, Any]], dict[str, float]]:
    """The load, the samples and the Redis restart, side by side."""
    load = Load()
    sampled, _, restart = await asyncio.gather(
        sampler(base, pid, redis, args.minutes, args.sample_s),
        drive(base, args.minutes, load, catalogue, keys),
        restart_redis(redis, args.minutes * 60 / 2, min(5.0, args.minutes * 60 / 10)),
    )
    return load, sampled, restart


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    # The hits' prompts (``args.prompts`` of them, all by default: a smoke run warms fewer).
    catalogue = PROMPTS[: getattr(args, "prompts", len(PROMPTS))]
    redis = RedisServer(work / "redis")
    redis.start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flags = [
        "--port",
        str(port),
        "--cache-dir",
        str(work / "cache"),
        "--redis-url",
        redis.url,
        "--synth-workers",
        str(args.workers),
        "--memory-cache-mb",
        str(args.memory_mb),
        "--access-log",
        "false",
    ]
    if "cache_secret" in Settings.model_fields:  # Redis values are authenticated: a secret
        flags += ["--cache-secret", "soak-" + os.urandom(8).hex()]
    log_path = work / "gateway.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", *flags],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_http(f"{base}/readyz", 300)
        keys = warm(base, catalogue)
        long = None
        if args.long_request:
            long = [asyncio.run(long_request(base, proc.pid, n)) for n in (300, 900)]
        load, sampled, restart = asyncio.run(measure(args, base, proc.pid, redis, catalogue, keys))
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as r:
            healthy_after = r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            stop(proc)
        redis.stop()
    server_log = log_path.read_text(errors="replace")
    tracebacks = server_log.count("Traceback")
    warmup_s = args.warmup_min * 60
    return {
        "bench": "soak",
        "host": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)",
        "minutes": args.minutes,
        "warmup_min": args.warmup_min,
        "setup": {
            "synth_workers": args.workers,
            "memory_cache_mb": args.memory_mb,
            "catalogue_prompts": len(catalogue),
            "tiers": "memory, disk, redis",
            "sample_every_s": args.sample_s,
        },
        "long_requests": long,
        "load": load.summary(),
        "redis_restart": restart,
        "healthy_after": healthy_after,
        "tracebacks_in_server_log": tracebacks,
        # What they were (the log is in a temporary directory that goes with the run).
        "traceback_excerpts": traceback_excerpts(server_log),
        "steady_state": steady_growth(sampled, warmup_s, 60.0),
        "samples": sampled,
    }


def traceback_excerpts(log: str, most: int = 5, lines: int = 12) -> list[str]:
    """The first ``most`` tracebacks of a server log, each from the line before it (the logged
    message) through ``lines`` lines."""
    out: list[str] = []
    rows = log.splitlines()
    for i, row in enumerate(rows):
        if "Traceback" in row:
            out.append("\n".join(rows[max(0, i - 1) : i + lines]))
            if len(out) == most:
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
    ap.add_argument(
        "--warmup-min",
        type=float,
        default=None,
        help="minutes before the steady state (default: a sixth of the run)",
    )
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--workers", type=int, default=1, help="synthesis worker processes")
    ap.add_argument("--memory-mb", type=int, default=16, help="memory tier bound, MiB")
    ap.add_argument(
        "--no-long-request",
        dest="long_request",
        action="store_false",
        help="skip the 900-character request at speed 0.25 before the load",
    )
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args()
    if args.warmup_min is None:
        args.warmup_min = args.minutes / 6
    provenance()  # the commit and date as the run starts
    with tempfile.TemporaryDirectory() as tmp:
        result = soak(args, Path(tmp))
    steady = result["steady_state"]
    load = result["load"]
    print(
        f"soak {args.minutes:g} min: {load['total']} responses, 5xx: {load['5xx']}, "
        f"client errors: {sum(load['client_errors'].values())}, healthy after: "
        f"{result['healthy_after']}"
    )
    print(f"steady state after {args.warmup_min:g} min: {steady}")
    for long in result["long_requests"] or []:
        print(f"long request: {long}")
    print(f"responses: {load['responses']}; client errors: {load['client_errors']}")
    if not args.no_write:
        write_results("soak", result)
        plot(result, RESULTS / "soak.png")
        print(f"wrote {RESULTS / 'soak.json'} and soak.png")


if __name__ == "__main__":
    main()
