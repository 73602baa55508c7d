"""Hit path: the gateway serving cached audio vs a bare aiohttp server serving the same bytes
for the same request bodies, under the same concurrent load, in one run (rounds interleaved so
drift hits every server alike). Two workloads:

- ``one-body``: one ~270 KB WAV, the same request body every time (every memo always hits);
- ``zipf``: ``--zipf-prompts`` (default 5,000) distinct IVR prompts, requested with Zipf
  popularity (exponent ``--zipf-s``, default 1.0) from a fixed pseudo-random sequence, 8 kHz
  mu-law WAV (what an IVR asks for; ~30 KB each). Each prompt is three sentences from three
  lists of ~18, so the pre-warm synthesizes only ~54 sentences and every prompt is then
  assembled from stored sentence masters by the gateway's own path; all prompts are in the
  store (memory tier) before any round is measured. The bare server holds every prompt's bytes
  in a dict by exact body. The JSON records how often memos of 4096 and 8192 entries (the
  gateway's request/header and key memos) miss over the request sequence.

- ``say-url`` (with ``--say-url``): the same text as a say URL, ``GET /v1/say/joe/<text>.wav``
  (8 kHz PCM16 WAV, what Asterisk plays), against a bare aiohttp GET of the same bytes at the
  same path: the hit path of a PBX fetching a prompt by URL.

    python -m bench.hit_path [--seconds 4] [--rounds 7] [--connections 32] [--no-pin]
                             [--event-loop auto|uvloop|asyncio] [--disk-only]
                             [--zipf-prompts 5000] [--zipf-s 1.0] [--no-zipf] [--say-url]
                             [--keys 100] [--no-warm-up]

Target: gateway >= 0.8 x bare for each workload. Writes docs/bench/hit_path.json and
hit_path.png (with ``--say-url``: hit_path_say_url.json and .png, so a say-URL run does not
replace the one-body and Zipf results; with ``--keys N``: ``_keys`` added to the name).

``--keys N`` runs the gateway with API keys on: a keys file of N keys (speak and read
scopes, no limits: the hit path's cost is the key lookup), and every request of the load
generator, to both servers, carries one of them as ``Authorization: Bearer``.

On a machine with 2+ CPUs the servers run on the last CPU (each in its own rounds) and wrk on
the others, so the load generator never competes with the server it measures. Each round also
records each server's CPU time per request (from /proc), the figure least moved by neighbours.
Both servers run on the same event loop (``--event-loop``, default: the gateway's default).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import pickle
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common import (
    bar_plot,
    cpu_seconds,
    cpu_split,
    event_loop_argument,
    pin,
    placement,
    post,
    provenance,
    start_gateway,
    stop,
    wait_http,
    write_results,
    wrk_rate,
)
from bench.harness import ROOT, free_port
from gateway.runtime.eventloop import label

# About 5.7 s of speech: a ~250 KB PCM16 WAV at the voice's 22,050 Hz.
TEXT = (
    "Thank you for calling. Your call is important to us. All of our agents are currently "
    "helping other customers."
)
TARGET = 0.8
MEMO_SIZES = (4096, 8192)  # gateway: request memo and hit-header memo 4096, key memo 8192

COMPANIES = [
    "Acme",
    "Globex",
    "Initech",
    "Umbrella",
    "Stark",
    "Wayne",
    "Wonka",
    "Hooli",
    "Vandelay",
    "Cyberdyne",
    "Soylent",
    "Tyrell",
    "Aperture",
    "Oscorp",
    "Monarch",
    "Massive",
    "Dunder",
    "Bluth",
    "Prestige",
    "Sterling",
    "Virtucon",
    "Nakatomi",
    "Gekko",
    "Krusty",
    "Duff",
    "Zorg",
    "Spacely",
    "Olivetti",
    "Contoso",
    "Fabrikam",
]
THINGS = [
    "order",
    "invoice",
    "refund",
    "parcel",
    "ticket",
    "appointment",
    "prescription",
    "statement",
    "contract",
    "quote",
    "booking",
    "delivery",
    "repair",
    "payment",
    "claim",
    "report",
    "upgrade",
    "card",
    "loan",
    "license",
    "permit",
    "visa",
    "passport",
    "transfer",
    "return",
    "exchange",
    "subscription",
    "renewal",
    "voucher",
    "reservation",
]
CITIES = [
    "Boston",
    "Denver",
    "Austin",
    "Seattle",
    "Chicago",
    "Dallas",
    "Miami",
    "Phoenix",
    "Portland",
    "Atlanta",
    "Detroit",
    "Houston",
    "Memphis",
    "Nashville",
    "Orlando",
    "Oakland",
    "Tampa",
    "Tucson",
    "Omaha",
    "Raleigh",
    "Richmond",
    "Buffalo",
    "Albany",
    "Madison",
    "Lincoln",
    "Boise",
    "Reno",
    "Fresno",
    "Toledo",
    "Spokane",
]


def zipf_prompts(count: int, seed: int = 11) -> list[str]:
    """``count`` distinct three-sentence prompts, in a shuffled popularity order (rank 1 first).

    The sentences come from three lists of ``ceil(count ** (1/3))`` entries, so ``count`` prompts
    share few sentences: the store holds each sentence's master once (as the gateway stores
    templated prompts) and the pre-warm synthesizes only those.
    """
    side = math.ceil(count ** (1 / 3))
    if side > min(len(COMPANIES), len(THINGS), len(CITIES)):
        raise ValueError(f"at most {len(COMPANIES) ** 3} Zipf prompts")
    prompts = [
        f"Thank you for calling {a}. Your {b} is ready. Goodbye from {c}."
        for a, b, c in itertools.product(COMPANIES[:side], THINGS[:side], CITIES[:side])
    ]
    rng = random.Random(seed)
    rng.shuffle(prompts)
    return prompts[:count]


def zipf_sequence(count: int, s: float, length: int, seed: int = 7) -> list[int]:
    """``length`` prompt indices drawn with P(rank k) proportional to 1 / k**s."""
    weights = [1 / (k**s) for k in range(1, count + 1)]
    return random.Random(seed).choices(range(count), weights=weights, k=length)


def memo_miss_rate(sequence: Sequence[int], size: int) -> float:
    """How often a memo of ``size`` entries that drops the oldest stored first (the gateway's
    ``BoundedMemo``) misses over ``sequence``, after one pass to fill it."""
    memo: OrderedDict[int, None] = OrderedDict()
    misses = 0
    warm = len(sequence) // 2
    for i, key in enumerate(sequence):
        if key in memo:
            continue
        if i >= warm:
            misses += 1
        memo[key] = None
        if len(memo) > size:
            memo.popitem(last=False)
    return misses / (len(sequence) - warm)


def write_keys_file(path: Path, count: int, rpm: int = 0) -> str:
    """A keys file of ``count`` keys (speak + read; ``rpm`` requests per minute each, 0: no
    limit) at ``path``; the secret of one of them (the middle one, so the lookup is no luckier
    than any other)."""
    from gateway.runtime.apikeys import key_table, new_secret

    secrets = [new_secret() for _ in range(count)]
    path.write_text(
        "\n".join(
            key_table(f"bench-{i}", s, ["speak", "read"], requests_per_minute=rpm)
            for i, s in enumerate(secrets)
        )
    )
    return secrets[count // 2]


def write_wrk_script(
    directory: Path,
    bodies: Sequence[str],
    sequence: Sequence[int],
    headers: dict[str, str] | None = None,
) -> Path:
    """A wrk Lua script that POSTs ``bodies[i]`` for each ``i`` of ``sequence`` in turn
    (cycling), with ``headers`` added; bodies and sequence are read from files beside it as wrk
    starts."""
    extra = "".join(f', ["{k}"] = "{v}"' for k, v in (headers or {}).items())
    (directory / "bodies.txt").write_text("".join(b + "\n" for b in bodies))
    (directory / "sequence.txt").write_text("".join(f"{i + 1}\n" for i in sequence))
    script = directory / "zipf.lua"
    script.write_text(
        f"""
local bodies = {{}}
for line in io.lines("{directory / "bodies.txt"}") do bodies[#bodies + 1] = line end
local sequence = {{}}
for line in io.lines("{directory / "sequence.txt"}") do sequence[#sequence + 1] = tonumber(line) end
local headers = {{["Content-Type"] = "application/json"{extra}}}
local n = 0
request = function()
  n = n % #sequence + 1
  return wrk.format("POST", nil, headers, bodies[sequence[n]])
end
"""
    )
    return script


async def prewarm(
    url: str,
    bodies: Sequence[str],
    concurrency: int = 8,
    headers: dict[str, str] | None = None,
) -> list[bytes]:
    """POST every body once (synthesizing each sentence once, assembling every prompt), then
    again, requiring a stored answer (``X-Cache: HIT``) with the same bytes."""
    import aiohttp

    async def pass_over(session: aiohttp.ClientSession, expect_hit: bool) -> list[bytes]:
        out: list[bytes] = [b""] * len(bodies)
        todo = iter(range(len(bodies)))

        async def client() -> None:
            for i in todo:
                async with session.post(
                    url,
                    data=bodies[i],
                    headers={"Content-Type": "application/json", **(headers or {})},
                ) as r:
                    data = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"pre-warm: status {r.status} for body {i}")
                    if expect_hit and r.headers["X-Cache"] != "HIT":
                        raise RuntimeError(f"pre-warm: body {i} was not stored")
                    out[i] = data

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return out

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        first = await pass_over(session, expect_hit=False)
        second = await pass_over(session, expect_hit=True)
    if first != second:
        raise RuntimeError("pre-warm: a stored prompt came back with other bytes")
    return second


def get(url: str, headers: dict[str, str] | None = None) -> tuple[bytes, str]:
    """The body and X-Cache of a GET."""
    import urllib.request

    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read(), r.headers["X-Cache"]


def cache_counters(port: int) -> dict[str, float]:
    """The gateway's store lookup and eviction counters by tier (from /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("voxgate_cache_lookups_total{", "voxgate_cache_evictions_total{")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


@dataclass
class Workload:
    """One workload: the gateway and bare URLs, what wrk sends, and each round's results."""

    name: str
    gateway_url: str
    bare_url: str
    body: str | None = None
    lua: Path | None = None
    gateway_runs: list[dict[str, float]] = field(default_factory=list)
    bare_runs: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        g = statistics.median([r["rps"] for r in self.gateway_runs])
        b = statistics.median([r["rps"] for r in self.bare_runs])
        # Each round measures both servers back to back: the median of the per-round ratios
        # cancels most of the machine's drift (the bare server alone varied by 25% here).
        ratios = [
            gr["rps"] / br["rps"] for gr, br in zip(self.gateway_runs, self.bare_runs, strict=True)
        ]
        g_cpu = statistics.median([r["server_cpu_us_per_request"] for r in self.gateway_runs])
        b_cpu = statistics.median([r["server_cpu_us_per_request"] for r in self.bare_runs])
        return {
            **self.info,
            "gateway_rps": self.gateway_runs,
            "bare_rps": self.bare_runs,
            "gateway_rps_median": g,
            "bare_rps_median": b,
            "gateway_p50_ms_median": statistics.median(
                [r.get("p50_ms", 0.0) for r in self.gateway_runs]
            ),
            "bare_p50_ms_median": statistics.median([r.get("p50_ms", 0.0) for r in self.bare_runs]),
            "ratio": statistics.median(ratios),
            "round_ratios": ratios,
            "gateway_cpu_us_per_request_median": g_cpu,
            "bare_cpu_us_per_request_median": b_cpu,
            "cpu_ratio_bare_over_gateway": b_cpu / g_cpu,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each measured round")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per server (interleaved)")
    ap.add_argument(
        "--disk-only",
        action="store_true",
        help="serve hits from the disk tier (memory tier off); results are not "
        "written, the target is for memory hits",
    )
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="let the OS place servers and wrk (default: pin them apart)",
    )
    ap.add_argument("--connections", type=int, default=32, help="concurrent connections")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    ap.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no unmeasured run of each server before the rounds (the tests' smoke run)",
    )
    event_loop_argument(ap)
    ap.add_argument("--zipf-prompts", type=int, default=5000, help="distinct prompts (Zipf)")
    ap.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--zipf-format", default="mulaw", help="response_format of the Zipf prompts")
    ap.add_argument("--no-zipf", action="store_true", help="no Zipf workload")
    ap.add_argument(
        "--say-url",
        action="store_true",
        help="add the say-URL workload (GET /v1/say/joe/<text>.wav); results go to "
        "docs/bench/hit_path_say_url.json",
    )
    ap.add_argument(
        "--keys",
        type=int,
        default=0,
        help="API keys on: a keys file of N keys, every request sending one (0: keys off)",
    )
    ap.add_argument(
        "--key-rpm",
        type=int,
        default=0,
        help="with --keys: each key's requests_per_minute (a budget check on every request; "
        "make it larger than the run sends, e.g. 1000000000, so none is refused)",
    )
    ap.add_argument(
        "--json-out",
        type=Path,
        help="also write the workloads' figures to this file (bench.vs_commit reads it)",
    )
    args = ap.parse_args()
    provenance()  # the commit and date as the run starts

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        gport = free_port()
        extra = ["--memory-cache-mb", "0"] if args.disk_only else []
        extra += ["--event-loop", args.event_loop]
        # One gateway process against one bare process on the same CPU: this bench is about a
        # hit's cost per process (serve's default, workers = cores, would spread the gateway over
        # every core while the bare server has one; bench/vs_nginx.py measures the default).
        extra += ["--workers", "1"]
        auth: dict[str, str] = {}
        if args.keys:
            secret = write_keys_file(tmpdir / "keys.toml", args.keys, args.key_rpm)
            extra += ["--api-keys-file", str(tmpdir / "keys.toml")]
            auth = {"Authorization": f"Bearer {secret}"}
        gateway = start_gateway(gport, tmpdir / "cache", *extra, log_path=tmpdir / "gateway.log")
        bares: list[subprocess.Popen[bytes]] = []

        def start_bare(path: Path, content_type: str, *flags: str) -> str:
            port = free_port()
            bares.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.bare_server",
                        str(port),
                        str(path),
                        content_type,
                        args.event_loop,
                        *flags,
                    ],
                    cwd=ROOT,
                )
            )
            wait_http(f"http://127.0.0.1:{port}/readyz")
            return f"http://127.0.0.1:{port}/v1/audio/speech"

        try:
            url = f"http://127.0.0.1:{gport}/v1/audio/speech"
            body = {
                "model": "tts-1",
                "input": TEXT,
                "voice": "alloy",
                "response_format": "wav",
                "stream": False,  # whole: a streamed miss is not the stored file
            }
            status, headers, audio = post(url, body, auth)
            assert status == 200 and headers["X-Cache"] == "MISS"
            status, headers, again = post(url, body, auth)
            assert headers["X-Cache"] == "HIT" and again == audio
            (tmpdir / "audio.wav").write_bytes(audio)
            workloads = [
                Workload(
                    "one-body",
                    url,
                    start_bare(tmpdir / "audio.wav", "audio/wav"),
                    body=json.dumps(body),
                    info={"audio_bytes": len(audio)},
                )
            ]
            if args.say_url:
                path = "/v1/say/joe/" + quote(TEXT, safe="") + ".wav"
                say_url = f"http://127.0.0.1:{gport}{path}"
                first, _ = get(say_url, auth)  # a transcode of the one-body text's masters
                again, cache = get(say_url, auth)
                assert cache == "HIT" and again == first, cache
                (tmpdir / "say.wav").write_bytes(first)
                bare = start_bare(tmpdir / "say.wav", "audio/x-wav")
                workloads.append(
                    Workload(
                        "say-url",
                        say_url,
                        bare.replace("/v1/audio/speech", path),
                        info={"audio_bytes": len(first), "path": "/v1/say/joe/<text>.wav"},
                    )
                )
            if not args.no_zipf:
                prompts = zipf_prompts(args.zipf_prompts)
                bodies = [
                    json.dumps(
                        {
                            "model": "tts-1",
                            "input": p,
                            "voice": "alloy",
                            "response_format": args.zipf_format,
                            "stream": False,  # whole: the pre-warm compares with the stored file
                        }
                    )
                    for p in prompts
                ]
                print(f"pre-warming {len(bodies)} prompts ...", flush=True)
                answers = asyncio.run(prewarm(url, bodies, headers=auth))
                table = {b.encode(): a for b, a in zip(bodies, answers, strict=True)}
                (tmpdir / "zipf.pickle").write_bytes(pickle.dumps(table))
                # Long enough that no round of wrk wraps around it on this machine.
                sequence = zipf_sequence(len(bodies), args.zipf_s, 200_000)
                sizes = [len(a) for a in answers]
                workloads.append(
                    Workload(
                        "zipf",
                        url,
                        start_bare(tmpdir / "zipf.pickle", "audio/wav", "--by-body"),
                        lua=write_wrk_script(tmpdir, bodies, sequence, auth),
                        info={
                            "prompts": len(bodies),
                            "zipf_s": args.zipf_s,
                            "format": args.zipf_format,
                            "audio_bytes_median": statistics.median(sizes),
                            "audio_bytes_total": sum(sizes),
                            "memo_miss_rate_over_sequence": {
                                str(n): round(memo_miss_rate(sequence, n), 4) for n in MEMO_SIZES
                            },
                        },
                    )
                )
            split = None if args.no_pin else cpu_split()
            server_cpus, load_cpus = split if split else (None, None)
            pin(gateway.pid, server_cpus)
            for bare in bares:
                pin(bare.pid, server_cpus)
            bare_pids = {w.bare_url: b.pid for w, b in zip(workloads, bares, strict=True)}

            def measure(w: Workload, target: str, pid: int) -> dict[str, float]:
                before = cpu_seconds(pid)
                run = wrk_rate(
                    target,
                    body=w.body,
                    lua=w.lua,
                    seconds=args.seconds,
                    connections=args.connections,
                    cpus=load_cpus,
                    headers=auth,
                )
                run["server_cpu_us_per_request"] = (
                    1e6 * (cpu_seconds(pid) - before) / run["requests"]
                )
                return run

            for w in workloads if args.warm_up else []:
                # warm both (connections, caches), not measured
                measure(w, w.gateway_url, gateway.pid)
                measure(w, w.bare_url, bare_pids[w.bare_url])
            counters_before = cache_counters(gport)
            for i in range(args.rounds):
                for w in workloads:
                    # alternate which server goes first, so neither always gets the warmer slot
                    order = [
                        (w.gateway_url, gateway.pid, w.gateway_runs),
                        (w.bare_url, bare_pids[w.bare_url], w.bare_runs),
                    ]
                    for target, pid, runs in order if i % 2 == 0 else reversed(order):
                        runs.append(measure(w, target, pid))
            counters_after = cache_counters(gport)
        finally:
            stop(gateway)
            for bare in bares:
                stop(bare)

    where = placement(server_cpus, load_cpus)
    tier = "disk" if args.disk_only else "memory"
    results = {w.name: w.summary() for w in workloads}
    print(
        f"\n{tier} hit path, {args.connections} connections, "
        f"{args.rounds} x {args.seconds:g} s rounds (median), {where}"
    )
    print(f"{'workload':<10}{'server':<28}{'req/s':>10}{'p50 ms':>10}{'CPU us/req':>12}")
    for name, r in results.items():
        server = "gateway (GET say URL, HIT)" if name == "say-url" else "gateway (POST speech, HIT)"
        print(
            f"{name:<10}{server:<28}{r['gateway_rps_median']:>10.0f}"
            f"{r['gateway_p50_ms_median']:>10.2f}{r['gateway_cpu_us_per_request_median']:>12.1f}"
        )
        print(
            f"{'':<10}{'bare aiohttp (same bytes)':<28}{r['bare_rps_median']:>10.0f}"
            f"{r['bare_p50_ms_median']:>10.2f}{r['bare_cpu_us_per_request_median']:>12.1f}"
        )
    for name, r in results.items():
        print(
            f"{name}: ratio gateway/bare (median of rounds) {r['ratio']:.3f} "
            f"(rounds {', '.join(f'{x:.3f}' for x in r['round_ratios'])}; target >= {TARGET}) -> "
            f"{'PASS' if r['ratio'] >= TARGET else 'MISS'}; CPU per request bare/gateway "
            f"{r['cpu_ratio_bare_over_gateway']:.3f}"
        )
    if "zipf" in results:
        print(
            f"zipf memo miss rates over the sequence: {results['zipf']['memo_miss_rate_over_sequence']}"
        )
    store_during_rounds = {
        k: counters_after[k] - counters_before.get(k, 0.0)
        for k in counters_after
        if counters_after[k] != counters_before.get(k, 0.0)
    }
    print(f"store counters during the measured rounds: {store_during_rounds}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    if not args.no_write and not args.disk_only:
        out = "hit_path_say_url" if args.say_url else "hit_path"
        if args.keys:
            out += "_keys"
        write_results(
            out,
            {
                "benchmark": "hit_path",
                "connections": args.connections,
                "seconds_per_round": args.seconds,
                "rounds": args.rounds,
                "placement": where,
                "gateway_processes": 1,
                "event_loop": label(args.event_loop),
                "target_ratio": TARGET,
                "api_keys": args.keys,
                "key_requests_per_minute": args.key_rpm,
                "workloads": results,
                "store_counters_during_rounds": store_during_rounds,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            },
        )
        labels, values = [], []
        for name, r in results.items():
            labels += [f"{name}\ngateway", f"{name}\nbare aiohttp"]
            values += [r["gateway_rps_median"], r["bare_rps_median"]]
        bar_plot(
            out,
            "Cached hits: gateway vs bare aiohttp ("
            + ", ".join(f"{n} {r['ratio']:.2f}x" for n, r in results.items())
            + ")",
            labels,
            values,
            "requests/s",
        )
        print(f"wrote docs/bench/{out}.json and docs/bench/{out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
