"""Shared benchmark plumbing: start servers as subprocesses, drive load with wrk (or a Python
fallback), write JSON + PNG results under docs/bench/. (What the tests share with the benches is
in :mod:`bench.harness`.)"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, TREE, serve_command
from bench.plots import label_bars, pyplot, save_figure

RESULTS = ROOT / "docs" / "bench"


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    """Wait until ``url`` answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s")


def _unshared() -> list[str]:
    """Flags lifting the per-client shares, those the tree under test has: an older commit's
    gateway (bench.vs_commit) refuses a flag it does not know."""
    settings = (TREE / "gateway" / "runtime" / "settings.py").read_text(encoding="utf-8")
    flags = ["--queue-per-client", "100000"]
    if "renders_per_client" in settings:
        flags += ["--renders-per-client", "100000"]
    return flags


def start_gateway(
    port: int, cache_dir: Path, *extra: str, log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """``python -m gateway serve`` on ``port`` with its own cache dir, ready."""
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(
        # Every request of a bench comes from one loopback address, which stands for many
        # clients: the per-client shares of the queue and of renditions in the making (429
        # beyond them) would refuse a pre-warm.
        serve_command(port, cache_dir, *_unshared(), *extra),
        cwd=TREE,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_http(f"http://127.0.0.1:{port}/readyz")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server process."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One JSON POST (with ``headers`` added); returns status, headers and body."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, dict(r.headers), r.read()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process below it (Linux /proc): a server
    with its worker and pool processes. A process that ends meanwhile is left out."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
        except OSError:
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        here = todo.pop()
        todo += children.get(here, [])
        try:
            total += cpu_seconds(here)
        except OSError:
            continue
    return total


def cpu_split() -> tuple[set[int], set[int]] | None:
    """``(server_cpus, load_cpus)``: the last CPU for the servers under test, the others for the
    load generator, so the two never compete for a core (None on a 1-CPU machine).

    Each server is measured on the same single core in turn; without this, wrk and the server
    fight over 2 cores and the scheduler's choices moved single rounds by +-25% here.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])


def placement(server_cpus: set[int] | None, load_cpus: set[int] | None, load: str = "wrk") -> str:
    """Where the servers and the load ran, for the printed table and the JSON."""
    if not server_cpus or not load_cpus:
        return "unpinned"
    return (
        f"servers pinned to CPU {','.join(map(str, sorted(server_cpus)))}, "
        f"{load} to CPU {','.join(map(str, sorted(load_cpus)))}"
    )


def pin(pid: int, cpus: set[int] | None) -> None:
    """Run ``pid`` (and the threads it starts later) on ``cpus`` only; no-op for None."""
    if cpus is not None:
        os.sched_setaffinity(pid, cpus)


def wrk_rate(
    url: str,
    *,
    body: str | None,
    seconds: float,
    connections: int,
    threads: int = 1,
    cpus: set[int] | None = None,
    lua: Path | None = None,
    timeout_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """Requests/s and latency percentiles from wrk (POST when ``body`` is given, or the requests
    a wrk Lua script ``lua`` makes), run on ``cpus`` when given, each request with ``headers``
    added (a script of its own sets them itself). ``timeout_s`` replaces wrk's 2 s request
    timeout (a cold cache's misses wait for synthesis); socket errors (timeouts included) are
    counted in ``socket_errors``."""
    wrk = shutil.which("wrk")
    if wrk is None:
        if lua is not None:
            raise RuntimeError("a scripted workload needs wrk (https://github.com/wg/wrk)")
        return python_rate(
            url, body=body, seconds=seconds, connections=connections, headers=headers
        )
    script = None
    args = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    if timeout_s is not None:
        args.append(f"--timeout={max(1, round(timeout_s))}s")
    if lua is not None:
        args += ["-s", str(lua)]
    elif body is not None or headers:
        script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)  # noqa: SIM115
        if body is not None:
            escaped = body.replace("\\", "\\\\").replace("'", "\\'")
            script.write(
                "wrk.method = 'POST'\n"
                f"wrk.body = '{escaped}'\n"
                "wrk.headers['Content-Type'] = 'application/json'\n"
            )
        for name, value in (headers or {}).items():
            script.write(f"wrk.headers['{name}'] = '{value}'\n")
        script.close()
        args += ["-s", script.name]
    out = subprocess.run(
        [*args, url],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    ).stdout
    if script is not None:
        os.unlink(script.name)
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = re.search(r"(\d+) requests in", out)
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} error responses from {url}")
    pct = {}
    sock_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    if sock_errors:
        pct["socket_errors"] = float(sum(int(g) for g in sock_errors.groups()))
    for label, key in (("50%", "p50_ms"), ("99%", "p99_ms")):
        m = re.search(rf"{re.escape(label)}\s+([\d.]+)(us|ms|s)", out)
        if m:
            scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
            pct[key] = float(m.group(1)) * scale
    return {"rps": rate, **pct, "requests": float(total.group(1)) if total else rate * seconds}


def python_rate(
    url: str,
    *,
    body: str | None,
    seconds: float,
    connections: int,
    headers: dict[str, str] | None = None,
) -> dict[str, float]:
    """Fallback load generator (aiohttp client in a child process) when wrk is missing."""
    code = f"""
import asyncio, json, time, aiohttp
async def main():
    n = 0
    stop = time.perf_counter() + {seconds}
    body = {body!r}
    async with aiohttp.ClientSession(headers={headers or {}!r}) as s:
        async def worker():
            nonlocal n
            while time.perf_counter() < stop:
                if body is None:
                    r = await s.get({url!r})
                else:
                    r = await s.post({url!r}, data=body,
                                     headers={{"Content-Type": "application/json"}})
                await r.read()
                assert r.status == 200, r.status
                n += 1
        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range({connections})))
        print(n / (time.perf_counter() - t))
asyncio.run(main())
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return {"rps": float(out.strip())}


def git_commit() -> str:
    """The commit the benchmark ran on, ``+dirty`` when the tree had uncommitted changes outside
    docs/ (the figures then belong to code no commit holds); ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # Only what can change a measurement counts: edits to docs/ (results written by an
            # earlier bench of the same session included) do not make the run dirty.
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


@functools.cache
def provenance() -> dict[str, str]:
    """How this run's results were made: the command line, the UTC date and time, and the git
    commit, taken at the first call (a bench calls it as it starts, so later edits to the tree
    do not mark its run dirty) and the same for the rest of the process.

    Every JSON under docs/bench/ carries this (``write_results`` adds it), so a figure quoted in
    the docs can be traced to the run and the code that produced it.
    """
    args = sys.argv
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:  # run as ``python -m bench.x``
        head = ["-m", spec.name.removesuffix(".__main__")]
    else:
        script = Path(args[0]) if args else Path("?")
        try:
            head = [str(script.resolve().relative_to(ROOT))]
        except (OSError, ValueError):
            head = [str(script)]
    return {
        "command": shlex.join(["python", *head, *args[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
    }


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``docs/bench/<name>.json`` with the run's :func:`provenance` first."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({**provenance(), **data}, indent=2) + "\n")
    return path


def event_loop_argument(parser: argparse.ArgumentParser) -> None:
    """``--event-loop``: the loop of the gateway and the server it is compared with."""
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=("auto", "uvloop", "asyncio"),
        help="event loop of both servers (default: auto, as the gateway's default)",
    )


# ---- the miss benches (miss_path, marks_cost): one setup, so their figures compare ----------


def miss_gateway_command(port: int, cache_dir: Path, synth_workers: int) -> list[str]:
    """``voxgate serve`` as the miss benches measure it: one gateway process (its CPU per request
    is read from its pid; with the default of one per core the pid would be the supervisor's),
    and no per-client queue share (one loopback address stands for many clients: 429s)."""
    return serve_command(
        port,
        cache_dir,
        "--synth-workers",
        str(synth_workers),
        "--workers",
        "1",
        "--log-level",
        "warning",
        "--queue-per-client",
        "100000",
    )


def miss_parser(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The command line of a miss bench (``doc`` its module docstring): the load it puts on."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--per-client", type=int, default=4, help="unique texts per client per round"
    )
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("--workers", type=int, default=2, help="gateway synthesis worker processes")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    return parser


def miss_result(
    args: argparse.Namespace, order: str, servers: Any, summary: Any, started: float, **more: Any
) -> dict[str, Any]:
    """A miss bench's result as its JSON records it (``order``: how its rows took turns;
    ``started``: its ``time.perf_counter()`` at the start)."""
    setup = {
        "clients": args.clients,
        "per_client_per_round": args.per_client,
        "rounds": args.rounds,
        "order": order,
        "gateway_workers": args.workers,
        "engine": "piper joe",
        "format": "wav",
    }
    return {
        "setup": setup,
        "servers": servers,
        "summary": summary,
        **more,
        "runtime_s": round(time.perf_counter() - started, 1),
    }


def bar_plot(
    name: str,
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    ylabel: str,
    *,
    target: float | None = None,
    colors: Sequence[str] = ("#3b7dd8", "#9aa5b1", "#e07b39", "#5aa469"),
) -> Path:
    """A bar chart saved as ``docs/bench/<name>.png``, the bars in ``colors`` in turn."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    bars = ax.bar(labels, values, color=[colors[i % len(colors)] for i in range(len(values))])
    label_bars(ax, bars, values)
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", label=f"target {target:g}")
        ax.legend()
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    return save_figure(fig, RESULTS / f"{name}.png")
