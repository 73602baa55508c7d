"""voxgate against what users build instead: the seed article's service behind nginx proxy_cache.

The baseline is ``bench/seed_service.py`` (FastAPI, one Piper model, ``ThreadPoolExecutor(4)``)
run by uvicorn, with nginx in front (Debian's nginx-light, ``/usr/sbin/nginx``, started here on
loopback with a temporary config): ``proxy_cache_lock on`` so concurrent misses of one prompt
reach the service once, one nginx worker per core, its access log on (nginx's default, as
voxgate's is). Against it, ``voxgate serve`` with no flags (only its port, a fresh cache
directory, and the per-client queue share lifted: every request here comes from one loopback
address standing for many clients).

Two ways to key nginx's cache, both measured (``--keys``):

- **get**: ``GET /synthesize?text=...`` to both servers; nginx keys on the URL
  (``$request_uri``), voxgate answers its plain query-string route;
- **post**: a JSON body; nginx's ``POST /tts`` keyed on ``$request_uri|$request_body``,
  voxgate's ``POST /v1/audio/speech`` (OpenAI's body).

Each with wrk at one and at two threads (``--threads``): four variants in one run, side by side.
Workload, in each variant for each server, both from an empty cache: ``--prompts`` (default 343)
distinct one-sentence IVR-style prompts, requested with Zipf popularity (exponent 1.0) by wrk
with ``--clients`` (16) connections, a Lua script walking one fixed Zipf sequence:

- **cold**: ``--cold-s`` seconds from an empty cache (misses synthesize, repeats hit);
- then every prompt fetched once (so the whole set is stored), and the syntheses counted: the
  seed's synthesis lines in uvicorn's access log, voxgate's ``voxgate_syntheses_total``;
- **warm**: after one unmeasured second of load on each server, ``--warm-s`` (40) seconds of
  the same Zipf load, every answer a stored one, on each server, cut into ``--warm-rounds`` (8)
  rounds interleaved between the two (A B, B A, A B, ...; both servers stay up, the idle one
  uses no CPU), so that a change in the machine's speed during the variant (a shared VM's
  neighbours moved one 20 s warm figure by 2x here) falls on both alike: requests/s is the mean
  of a server's rounds, p50 and p99 the median of its rounds' (each round's figures are in the
  JSON). Eight rounds, not four: with one wrk thread one server's round p99 spread 1.7-4.3 ms
  within a variant here (the kernel's scheduling of three busy threads on two cores,
  docs/performance.md), and the median of four such rounds moved by a millisecond between runs.

Which server goes first alternates from variant to variant. ``--cold-runs N`` repeats the cold
minute N times per server (each from an empty cache, the order alternating run by run):
requests/s the mean of the runs, p50 and p99 the median (each run's figures in the JSON); one
server's cold p99 moved 1.4x between runs of the same build here. The targets (``TARGETS``): voxgate
>= 1.0x nginx's warm QPS and >= 1.1x its cold QPS, with p99 <= nginx's in both phases, in every
variant. wrk's p99 is corrected for coordinated omission (wg/wrk ``src/stats.c``,
``stats_correct``): a miss weighs a sample per mean request interval it lasted, so the cold p99
reads the longest misses (docs/performance.md). ``--workers-runs`` adds ``voxgate serve
--workers 1`` against ``--workers 2``, cold (syntheses per distinct prompt: one synthesis pool
per host).

    .venv/bin/python -m bench.vs_nginx [--prompts 343] [--cold-s 60] [--warm-s 40]
                                       [--clients 16] [--keys get,post] [--threads 1,2]
                                       [--cold-runs 1] [--warm-rounds 8]
                                       [--workers-runs] [--no-write]

Writes docs/bench/vs_nginx.json (with the command, date and git commit) and vs_nginx.png, and
prints the table. Takes about 25 minutes on a 2-core machine with the defaults. Run it on a
quiet machine: the servers and wrk share the cores (as they would on one host), so other load
moves the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    provenance,
    start_gateway,
    stop,
    tree_cpu_seconds,
    wait_http,
    write_results,
    wrk_rate,
)
from bench.harness import ROOT, free_port
from bench.hit_path import CITIES, COMPANIES, THINGS, write_wrk_script, zipf_sequence
from bench.plots import label_bars, pyplot, save_figure

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
    """A self-contained nginx config under ``directory``: proxy_cache with the lock on, keyed on
    the body for ``POST /tts`` and on the URL for ``GET /synthesize``."""
    for sub in ("cache", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    # As root, nginx's workers switch to `nobody`, who cannot write a private temp directory.
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = directory / "nginx.conf"
    cache = f"""proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 120s;
            proxy_cache tts;
            proxy_cache_valid 200 1d;
            proxy_cache_lock on;
            proxy_cache_lock_timeout {int(REQUEST_TIMEOUT_S)}s;
            proxy_cache_lock_age {int(REQUEST_TIMEOUT_S)}s;
            add_header X-Cache $upstream_cache_status;"""
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
            proxy_cache_methods POST;
            proxy_cache_key "$request_uri|$request_body";
            {cache}
        }}
        # The text in the URL: the URL is the key (GET is cached by default).
        location /synthesize {{
            proxy_pass http://seed;
            proxy_cache_key "$request_uri";
            {cache}
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
    """Synthesis requests (``POST /tts``, ``GET /synthesize``) the seed answered through nginx
    (each one a synthesis: it has no cache), less the warm-up request."""
    answered = re.findall(
        r'"(?:POST /tts|GET /synthesize\?\S*) HTTP/1\.1" 200', log_path.read_text(errors="replace")
    )
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


@dataclasses.dataclass(frozen=True)
class Requests:
    """One server's requests for the prompts: POST bodies to ``path``, or (``bodies`` None)
    GET ``paths`` (the text in the query string)."""

    base: str
    path: str
    bodies: Sequence[str] | None = None
    paths: Sequence[str] | None = None

    @property
    def url(self) -> str:
        return self.base + self.path

    def script(self, directory: Path, sequence: Sequence[int]) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        if self.bodies is not None:
            return write_wrk_script(directory, self.bodies, sequence)
        return write_get_script(directory, self.paths or (), sequence)

    def count(self) -> int:
        return len(self.bodies if self.bodies is not None else self.paths or ())


def write_get_script(directory: Path, paths: Sequence[str], sequence: Sequence[int]) -> Path:
    """A wrk Lua script that GETs ``paths[i]`` for each ``i`` of ``sequence`` in turn."""
    (directory / "paths.txt").write_text("".join(p + "\n" for p in paths))
    (directory / "sequence.txt").write_text("".join(f"{i + 1}\n" for i in sequence))
    script = directory / "zipf.lua"
    script.write_text(
        f"""
local paths = {{}}
for line in io.lines("{directory / "paths.txt"}") do paths[#paths + 1] = line end
local sequence = {{}}
for line in io.lines("{directory / "sequence.txt"}") do sequence[#sequence + 1] = tonumber(line) end
local n = 0
request = function()
  n = n % #sequence + 1
  return wrk.format("GET", paths[sequence[n]])
end
"""
    )
    return script


async def fetch_all(reqs: Requests, clients: int) -> tuple[int, int]:
    """Request every prompt once with ``clients`` connections; the counts of 200 answers and
    of those answered from the cache (``X-Cache: HIT``, from either server)."""
    import aiohttp
    import yarl

    # The URL exactly as wrk sends it (yarl would re-quote it otherwise, and a URL-keyed cache
    # would store another key than the load then asks for).
    if reqs.bodies is not None:
        todo = iter([("POST", yarl.URL(reqs.url), b) for b in reqs.bodies])
    else:
        todo = iter(
            [("GET", yarl.URL(reqs.base + p, encoded=True), None) for p in reqs.paths or ()]
        )
    ok = hits = 0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S * 4)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            nonlocal ok, hits
            for method, url, body in todo:
                headers = {"Content-Type": "application/json"} if body else None
                async with session.request(method, url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status} while filling the cache")
                    ok += 1
                    hits += r.headers.get("X-Cache") == "HIT"

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok, hits


def load(url: str, lua: Path, seconds: float, clients: int, threads: int) -> dict[str, float]:
    """wrk's figures for ``seconds`` of the scripted Zipf load."""
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


def cold_and_fill(server: Running, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Cold load from empty, then every prompt fetched once, the syntheses counted."""
    reqs = server.reqs
    out: dict[str, Any] = {"cold": load(reqs.url, server.lua, args.cold_s, args.clients, threads)}
    started = time.perf_counter()
    asyncio.run(fetch_all(reqs, args.clients))
    out["fill_s"] = round(time.perf_counter() - started, 2)
    count = int(server.syntheses())
    out["syntheses"] = count
    out["syntheses_per_prompt"] = round(count / reqs.count(), 3)
    # Every prompt again, as the load asks for it: answered from the cache (X-Cache: HIT)?
    out["hits_after_fill"] = asyncio.run(fetch_all(reqs, args.clients))[1]
    return out


def combined(figures: Sequence[dict[str, float]], label: str) -> dict[str, Any]:
    """wrk's figures of several loads of one server as one: requests/s the mean, p50, p99 and
    the server's CPU per request the median, requests the sum; each load's requests/s, p99 and
    CPU kept under ``label``."""
    return {
        "rps": round(statistics.fmean(f["rps"] for f in figures), 2),
        **{
            key: round(statistics.median(f[key] for f in figures), 2)
            for key in ("p50_ms", "p99_ms", "cpu_us_per_request")
            if all(key in f for f in figures)
        },
        "requests": sum(f["requests"] for f in figures),
        label: [
            {k: f[k] for k in ("rps", "p99_ms", "cpu_us_per_request") if k in f} for f in figures
        ],
    }


def cold_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One server's cold runs as one: requests/s the mean of the runs, p50 and p99 the median
    of the runs' (each run's figures kept under ``runs``); syntheses the most any run made,
    stored answers after the fill the fewest any run had."""
    return {
        "cold": combined([r["cold"] for r in runs], "runs"),
        "fill_s": max(r["fill_s"] for r in runs),
        "syntheses": max(r["syntheses"] for r in runs),
        "syntheses_per_prompt": max(r["syntheses_per_prompt"] for r in runs),
        "hits_after_fill": min(r["hits_after_fill"] for r in runs),
    }


def warm_rounds(
    servers: dict[str, Running],
    order: Sequence[str],
    args: argparse.Namespace,
    threads: int,
    rounds: int,
) -> dict[str, dict[str, Any]]:
    """``warm_s`` seconds of the Zipf load on each server (every prompt stored), in ``rounds``
    rounds interleaved (:func:`in_turn`), so that a change in the machine's speed during the
    variant (a shared VM's neighbours) falls on both servers alike. Per server: requests/s the
    mean of its rounds, p50, p99 and CPU per request (its processes', wrk's not) the median of
    its rounds'."""
    seconds = args.warm_s / rounds
    # One unmeasured second each first: a server's first moments under load after the fill
    # (connections accepted, buffers grown, nginx's cache files opened) are no steady state.
    # (``warmup_s`` 0 leaves it out: the tests' smoke runs, whose figures are not kept.)
    if warmup_s(args) > 0:
        for name in order:
            s = servers[name]
            load(s.reqs.url, s.lua, min(warmup_s(args), seconds), args.clients, threads)
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in order}
    for r in range(rounds):
        for name in in_turn(order, r):
            s = servers[name]
            cpu = s.cpu_seconds()
            figure = load(s.reqs.url, s.lua, seconds, args.clients, threads)
            used = s.cpu_seconds() - cpu
            figure["cpu_us_per_request"] = round(1e6 * used / max(1.0, figure["requests"]), 1)
            figures[name].append(figure)
    return {name: combined(runs, "rounds") for name, runs in figures.items()}


def query(text: str) -> str:
    return "/synthesize?" + urllib.parse.urlencode({"text": text})


@dataclasses.dataclass
class Running:
    """A server under test, started and ready: its requests, wrk script, synthesis count."""

    reqs: Requests
    lua: Path
    syntheses: Callable[[], int]
    procs: list[subprocess.Popen[bytes]]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the server's processes and every one they started."""
        return sum(tree_cpu_seconds(proc.pid) for proc in self.procs)


def open_nginx(tmp: Path, key: str, prompts: Sequence[str], sequence: Sequence[int]) -> Running:
    """nginx proxy_cache in front of the seed service, both started, caches empty."""
    tmp.mkdir(parents=True)
    seed_port, nginx_port = free_port(), free_port()
    base = f"http://127.0.0.1:{nginx_port}"
    if key == "post":
        reqs = Requests(base, "/tts", bodies=[_json({"text": p}) for p in prompts])
    else:
        reqs = Requests(base, "/synthesize", paths=[query(p) for p in prompts])
    lua = reqs.script(tmp / "wrk", sequence)
    seed_log = tmp / "seed.log"
    seed = start_seed(seed_port, seed_log)
    conf = nginx_config(tmp / "nginx", nginx_port, seed_port, _cores())
    nginx = subprocess.Popen(
        [NGINX, "-p", str(tmp / "nginx"), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    running = Running(reqs, lua, lambda: seed_syntheses(seed_log), [nginx, seed])
    try:
        wait_http(f"{base}/health")
    except BaseException:
        running.stop()
        raise
    return running


def open_server(
    server: str, tmp: Path, key: str, prompts: Sequence[str], sequence: Sequence[int]
) -> Running:
    """``server`` (nginx_seed or voxgate) started with an empty cache."""
    if server == "nginx_seed":
        return open_nginx(tmp, key, prompts, sequence)
    return open_voxgate(tmp, key, prompts, sequence)


def in_turn(order: Sequence[str], i: int) -> Sequence[str]:
    """``order`` on even turns, reversed on odd ones (A B, B A, A B, ...): drift in the
    machine's speed falls on every server alike."""
    return order if i % 2 == 0 else tuple(reversed(order))


def voxgate_requests(base: str, key: str, prompts: Sequence[str]) -> Requests:
    """voxgate's requests for ``prompts`` at ``base``: OpenAI's JSON bodies to
    ``POST /v1/audio/speech`` (``key`` post), or ``GET /synthesize`` URLs (get)."""
    if key == "post":
        body = {"model": "tts-1", "voice": "alloy", "response_format": "wav"}
        bodies = [_json({**body, "input": p}) for p in prompts]
        return Requests(base, "/v1/audio/speech", bodies=bodies)
    return Requests(base, "/synthesize", paths=[query(p) for p in prompts])


def open_voxgate(
    tmp: Path,
    key: str,
    prompts: Sequence[str],
    sequence: Sequence[int],
    flags: Sequence[str] = (),
) -> Running:
    """``voxgate serve`` (no flags unless given) started, its cache empty."""
    tmp.mkdir(parents=True)
    port = free_port()
    log_path = tmp / "voxgate.log"
    gw = start_gateway(port, tmp / "cache", *flags, log_path=log_path)
    reqs = voxgate_requests(f"http://127.0.0.1:{port}", key, prompts)
    topology = re.search(r'topology: ([^"\n]*)', log_path.read_text(errors="replace"))
    info = {"flags": list(flags), "topology": topology.group(1) if topology else None}
    return Running(
        reqs, reqs.script(tmp / "wrk", sequence), lambda: gateway_syntheses(port), [gw], info
    )


# What the comparison asks of voxgate with no flags, in every variant.
TARGETS = {"warm_qps_ratio": 1.0, "cold_qps_ratio": 1.1}

# The warm phase's defaults (module doc: why eight rounds), one source for the CLI and run().
WARM_S = 40.0
WARM_ROUNDS = 8
# The unmeasured load on each server before the warm rounds (warm_rounds).
WARMUP_S = 1.0


def warmup_s(args: argparse.Namespace) -> float:
    """Seconds of unmeasured load before the warm rounds: ``args.warmup_s``, else WARMUP_S."""
    return float(getattr(args, "warmup_s", WARMUP_S))


def _keys(value: str) -> list[str]:
    keys = value.split(",")
    if not keys or not set(keys) <= {"get", "post"}:
        raise argparse.ArgumentTypeError("get, post or both")
    return keys


def add_warm_options(ap: argparse.ArgumentParser) -> None:
    """The warm load's options (bench.fast_path has them too): its seconds and rounds, wrk's
    connections and threads, the requests (--keys)."""
    ap.add_argument("--warm-s", type=float, default=WARM_S, help="seconds of load, all stored")
    ap.add_argument("--warm-rounds", type=int, default=WARM_ROUNDS, help="of --warm-s, interleaved")
    ap.add_argument("--clients", type=int, default=16, help="wrk connections")
    ap.add_argument(
        "--keys",
        type=_keys,
        default=["get", "post"],
        help="requests to run: get (GET /synthesize?text=..., nginx keyed on the URL), post "
        "(a JSON body: nginx's POST /tts keyed on it, voxgate's POST /v1/audio/speech); "
        "comma-separated",
    )
    ap.add_argument(
        "--threads",
        type=lambda v: [int(t) for t in v.split(",")],
        default=[1, 2],
        help="wrk thread counts to run, comma-separated",
    )


def compare(nx: dict[str, Any], vx: dict[str, Any]) -> dict[str, Any]:
    """voxgate over nginx + seed in one variant, and whether it met each target."""
    out: dict[str, Any] = {
        "cold_qps_ratio": _ratio(vx["cold"]["rps"], nx["cold"]["rps"]),
        "warm_qps_ratio": _ratio(vx["warm"]["rps"], nx["warm"]["rps"]),
        "cold_p99_ms": {"voxgate": vx["cold"].get("p99_ms"), "nginx": nx["cold"].get("p99_ms")},
        "warm_p99_ms": {"voxgate": vx["warm"].get("p99_ms"), "nginx": nx["warm"].get("p99_ms")},
    }
    met = {name: out[name] is not None and out[name] >= target for name, target in TARGETS.items()}
    for phase in ("cold", "warm"):
        p99 = out[f"{phase}_p99_ms"]
        met[f"{phase}_p99"] = (
            p99["voxgate"] is not None
            and p99["nginx"] is not None
            and p99["voxgate"] <= p99["nginx"]
        )
    out["met"] = met
    return out


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every variant (cache key x wrk threads), each server from empty; the result document."""
    keys: list[str] = list(getattr(args, "keys", ["get", "post"]))
    thread_counts: list[int] = list(getattr(args, "threads", [1, 2]))
    cold_runs = max(1, int(getattr(args, "cold_runs", 1)))
    warm_count = max(1, int(getattr(args, "warm_rounds", WARM_ROUNDS)))
    prompts = ivr_prompts(args.prompts)
    sequence = zipf_sequence(len(prompts), 1.0, 200_000)
    cores = _cores()
    # Other work on the machine moves every figure here: say how loaded it was.
    load_before = os.getloadavg()
    variants: dict[str, Any] = {}
    for n, (key, threads) in enumerate(itertools.product(keys, thread_counts)):
        name = f"{key}_{threads}t"
        print(f"{name}: nginx + seed, voxgate (each cold, fill, warm) ...", flush=True)
        here = tmp / name
        # Alternate which server goes first, so drift in the machine's load spreads evenly.
        order = ("nginx_seed", "voxgate") if n % 2 == 0 else ("voxgate", "nginx_seed")
        results: dict[str, Any] = {}
        running: dict[str, Running] = {}
        colds: dict[str, list[dict[str, Any]]] = {server: [] for server in order}
        try:
            for i in range(cold_runs):
                # Each cold run from empty, the servers' order alternating run by run too; the
                # servers of the last run stay up for the warm rounds.
                for server in in_turn(order, i):
                    up = open_server(server, here / f"{server}-{i}", key, prompts, sequence)
                    try:
                        colds[server].append(cold_and_fill(up, args, threads))
                    finally:
                        if i < cold_runs - 1:
                            up.stop()
                        else:
                            running[server] = up
            for server in order:
                results[server] = cold_summary(colds[server])
            for server, warm in warm_rounds(running, order, args, threads, warm_count).items():
                results[server]["warm"] = warm
        finally:
            for r in running.values():
                r.stop()
        results["voxgate"].update(running["voxgate"].info)
        variants[name] = {
            "key": key,
            "wrk_threads": threads,
            "results": {s: results[s] for s in ("nginx_seed", "voxgate")},
            "summary": compare(results["nginx_seed"], results["voxgate"]),
        }

    extra: dict[str, Any] = {}
    if getattr(args, "workers_runs", False):
        # `--workers 1` against `--workers 2`, cold only, POST-keyed, the last thread count.
        threads = thread_counts[-1]
        for workers in ("1", "2"):
            print(f"voxgate --workers {workers}: cold, fill ...", flush=True)
            flags = ["--workers", workers]
            gw = open_voxgate(tmp / f"workers-{workers}", "post", prompts, sequence, flags)
            try:
                extra[f"voxgate_workers_{workers}"] = {
                    **cold_and_fill(gw, args, threads),
                    **gw.info,
                }
            finally:
                gw.stop()
        w1, w2 = extra["voxgate_workers_1"], extra["voxgate_workers_2"]
        extra["workers_2_over_1_cold"] = _ratio(w2["cold"]["rps"], w1["cold"]["rps"])

    return {
        "benchmark": "vs_nginx",
        "machine": machine(load_before),
        "workload": {
            **warm_workload(prompts, args, thread_counts, warm_count),
            "cold_s": args.cold_s,
            "cold_runs": cold_runs,
            "cold_figures": "cold_runs runs per server, each from an empty cache, the servers' "
            "order alternating; requests/s the mean of a server's runs, p50 and p99 the median",
            "keys": {
                "get": "GET /synthesize?text=... to both: nginx keys on $request_uri; voxgate's "
                "plain query-string route",
                "post": "POST JSON: nginx's POST /tts keyed on $request_uri|$request_body; "
                "voxgate's POST /v1/audio/speech",
            },
        },
        "nginx": {
            "workers": cores,
            "proxy_cache_lock": "on",
            "access_log": "on (combined, to a file)",
            "upstream": "bench/seed_service.py (one uvicorn process, ThreadPoolExecutor(4))",
        },
        "voxgate": {"flags": [], "topology": _first_topology(variants)},
        "targets": {
            **TARGETS,
            "cold_p99": "voxgate <= nginx",
            "warm_p99": "voxgate <= nginx",
        },
        "variants": variants,
        "all_met": all(all(v["summary"]["met"].values()) for v in variants.values()),
        **({"workers": extra} if extra else {}),
    }


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The machine, and how loaded it was (``os.getloadavg()`` as the run started, and now)."""
    return {
        "cores": _cores(),
        "python": platform.python_version(),
        "load_average_1m": {"start": load_before[0], "end": os.getloadavg()[0]},
    }


def warm_workload(
    prompts: Sequence[str], args: argparse.Namespace, threads: Sequence[int], rounds: int
) -> dict[str, Any]:
    """The warm Zipf load as the results record it (bench.fast_path's too)."""
    return {
        "prompts": len(prompts),
        "zipf_s": 1.0,
        "load_generator": "wrk (Lua script: the Zipf sequence in turn)",
        "connections": args.clients,
        "wrk_threads": list(threads),
        "warm_s": args.warm_s,
        "warm_rounds": rounds,
        "warmup_s": warmup_s(args),
        "warm_figures": "both servers up; warmup_s unmeasured seconds of load each, then "
        "rounds of warm_s / warm_rounds seconds each, interleaved ABBA; requests/s the mean "
        "of a server's rounds, p50, p99 and the server's CPU per request the median",
        "format": "wav",
        "example_prompt": prompts[0],
    }


def _first_topology(variants: dict[str, Any]) -> str | None:
    for v in variants.values():
        topology: str | None = v["results"]["voxgate"].get("topology")
        return topology
    return None


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _ratio(a: float, b: float) -> float | None:
    """``a / b`` to 3 places; None when ``b`` is 0 (nothing answered in a very short phase)."""
    return round(a / b, 3) if b else None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def plot(report: dict[str, Any]) -> Path:
    """QPS and p99 of both servers in every variant, cold and warm: docs/bench/vs_nginx.png."""
    variants = report["variants"]
    names = list(variants)
    fig, axes = pyplot().subplots(2, 2, figsize=(11, 7))
    servers = (("nginx_seed", "nginx + seed", "#9aa5b1"), ("voxgate", "voxgate", "#3b7dd8"))
    width = 0.38
    for col, phase in enumerate(("cold", "warm")):
        for row, (metric, label) in enumerate((("rps", "requests/s"), ("p99_ms", "p99 ms"))):
            ax = axes[row][col]
            for i, (server, legend, color) in enumerate(servers):
                values = [variants[n]["results"][server][phase].get(metric) or 0 for n in names]
                xs = [j + (i - 0.5) * width for j in range(len(names))]
                bars = ax.bar(xs, values, width, label=legend, color=color)
                label_bars(ax, bars, values, small=",.1f", fontsize=7)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(
                [
                    f"{variants[n]['key'].upper()} key\n{variants[n]['wrk_threads']} wrk thread(s)"
                    for n in names
                ],
                fontsize=8,
            )
            ax.set_title(f"{phase} {label}")
            ax.set_ylabel(label)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    w = report["workload"]
    fig.suptitle(
        f"voxgate serve (no flags) vs nginx proxy_cache + seed: Zipf over {w['prompts']} prompts, "
        f"wrk {w['connections']} connections\ncold {w['cold_s']:g} s from empty x "
        f"{w.get('cold_runs', 1)} run(s) (mean QPS, median p99); warm {w['warm_s']:g} s in "
        f"{w.get('warm_rounds', 1)} rounds interleaved (mean QPS, median p99)",
        fontsize=10,
    )
    return save_figure(fig, RESULTS / "vs_nginx.png")


def table(report: dict[str, Any]) -> str:
    """The variants side by side, as a Markdown table."""
    rows = [
        "| variant | phase | nginx + seed QPS | voxgate QPS | ratio | nginx p99 ms | voxgate p99 ms "
        "| met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in report["variants"].values():
        s, res = v["summary"], v["results"]
        for phase in ("cold", "warm"):
            nx, vx = res["nginx_seed"][phase], res["voxgate"][phase]
            met = s["met"][f"{phase}_qps_ratio"] and s["met"][f"{phase}_p99"]
            rows.append(
                f"| {v['key'].upper()} key, {v['wrk_threads']} wrk thread(s) | {phase} "
                f"| {nx['rps']:,.1f} | {vx['rps']:,.1f} | {s[f'{phase}_qps_ratio']}x "
                f"| {nx.get('p99_ms')} | {vx.get('p99_ms')} | {'yes' if met else 'no'} |"
            )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=343, help="distinct prompts (>= 300 for docs)")
    ap.add_argument("--cold-s", type=float, default=60.0, help="seconds of load from empty")
    ap.add_argument(
        "--cold-runs",
        type=int,
        default=1,
        help="cold minutes per server and variant, each from empty (mean QPS, median p99)",
    )
    add_warm_options(ap)
    ap.add_argument(
        "--workers-runs", action="store_true", help="also voxgate --workers 1 vs 2, cold"
    )
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    ap.add_argument(
        "--json-out",
        type=Path,
        help="also write each variant's ratios to this file (bench.vs_commit)",
    )
    args = ap.parse_args(argv)
    provenance()  # taken as the run starts
    if not Path(NGINX).is_file() or shutil.which("wrk") is None:
        print("vs_nginx needs nginx-light and wrk: bash .ci/install installs them", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vs-nginx-") as tmp:
        report = run(args, Path(tmp))
    print(table(report))
    if args.json_out is not None:
        ratios = {name: v["summary"] for name, v in report["variants"].items()}
        args.json_out.write_text(json.dumps(ratios, indent=2) + "\n")
    print("every target met" if report["all_met"] else "some targets not met")
    if "workers" in report:
        print(f"workers 2 / 1 cold: {report['workers']['workers_2_over_1_cold']}x")
    if not args.no_write:
        print(write_results("vs_nginx", report))
        print(plot(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
