"""Hand-written parts of the hot paths, each measured against the maintained code it stands in for,
side by side: rounds interleaved (the order flips every round, so a drift of the machine hits both
alike), medians and the spread (lowest and highest round) reported. A part earns its place at
1.15x or more on the measure it was written for.

- ``resp``: a Redis-tier hit (memory and disk tiers off, so every request reads Redis; the entry's
  HMAC checked on every read) served by two gateways sharing one Redis and one stored entry: one
  reading entries through ``cache/resp.py`` (``--redis-lean-reads true``), one through redis-py
  with hiredis (``false``). wrk drives each in turn; throughput and the gateway's CPU per request
  (from /proc). Both gateways run on the default event loop.

    python -m bench.handmade [--parts resp] [--rounds 6] [--seconds 4] [--connections 16]
                             [--no-write]

Writes docs/bench/handmade_<part>.json. On 2+ CPUs the servers under test run on the last CPU
(each in its own turn) and wrk and redis-server on the others.

The parts that measured the hand-written WAV writer against stdlib ``wave`` and ``AudioResponse``
against aiohttp's ``web.Response`` went with the code they compared (neither reached 1.15x); their
results stay in docs/bench/handmade_wav.json and handmade_send.json, with the commit they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    cpu_seconds,
    cpu_split,
    pin,
    placement,
    post,
    provenance,
    write_results,
    wrk_rate,
)
from bench.harness import GatewayProcess, redis_server
from gateway.runtime.eventloop import label

KEEP_AT = 1.15
# About 5.7 s of speech: a ~250 KB PCM16 WAV at the voice's 22,050 Hz (as bench/scaleout.py).
TEXT = (
    "Thank you for calling. Your call is important to us. All of our agents are currently "
    "helping other customers."
)


def spread(values: list[float]) -> dict[str, float]:
    """Median, lowest and highest of ``values`` (rounded for the JSON)."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def interleaved(
    contenders: dict[str, Callable[[], dict[str, float]]], rounds: int
) -> dict[str, list[dict[str, float]]]:
    """Each contender measured once a round; the order flips every round (A B, B A, ...)."""
    names = list(contenders)
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            res = contenders[name]()
            runs[name].append(res)
            shown = "  ".join(f"{k} {v:,.1f}" for k, v in res.items() if k != "requests")
            print(f"round {r + 1} {name:<22} {shown}", flush=True)
    return runs


def compare(
    runs: dict[str, list[dict[str, float]]], handmade: str, maintained: str
) -> dict[str, Any]:
    """Per-round ratios of the hand-written contender over the maintained one: throughput
    (requests/s, higher is better) and CPU per request (maintained over hand-written)."""
    h, m = runs[handmade], runs[maintained]
    rps = [a["rps"] / b["rps"] for a, b in zip(h, m, strict=True)]
    cpu = [b["cpu_us_per_request"] / a["cpu_us_per_request"] for a, b in zip(h, m, strict=True)]
    return {
        "rps": {n: spread([x["rps"] for x in runs[n]]) for n in (handmade, maintained)},
        "cpu_us_per_request": {
            n: spread([x["cpu_us_per_request"] for x in runs[n]]) for n in (handmade, maintained)
        },
        "speedup_rps": spread(rps),
        "speedup_cpu": spread(cpu),
    }


def loaded(
    url: str,
    pids: list[int],
    args: argparse.Namespace,
    cpus: set[int] | None,
    body: dict[str, Any] | None = None,
) -> dict[str, float]:
    """One wrk run against ``url``: requests/s, p50, and CPU per request of ``pids[0]`` (and of
    each further pid, as ``cpu_us_per_request_<i>``)."""
    before = [cpu_seconds(p) for p in pids]
    res = wrk_rate(
        url,
        body=None if body is None else json.dumps(body),
        seconds=args.seconds,
        connections=args.connections,
        cpus=cpus,
    )
    used = [cpu_seconds(p) - c for p, c in zip(pids, before, strict=True)]
    n = res["requests"]
    out = {"rps": res["rps"], "p50_ms": res.get("p50_ms", 0.0), "requests": n}
    out["cpu_us_per_request"] = 1e6 * used[0] / n
    for i, u in enumerate(used[1:], 1):
        out[f"cpu_us_per_request_{i}"] = 1e6 * u / n
    return out


# ---- resp: the lean RESP reader against redis-py with hiredis --------------------------------


def resp(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import hiredis
    import redis

    split = cpu_split()
    server_cpus, other_cpus = split if split else (None, None)
    tiers_off = ["--memory-cache-mb", "0", "--disk-cache-mb", "0"]
    with redis_server(work / "redis") as rs:
        assert rs.proc is not None
        pin(rs.proc.pid, other_cpus)
        gws = {
            "lean_reader": GatewayProcess(
                work / "lean" / "cache",
                redis_url=rs.url,
                args=[*tiers_off, "--redis-lean-reads", "true"],
            ),
            "redis_py_hiredis": GatewayProcess(
                work / "redispy" / "cache",
                redis_url=rs.url,
                args=[*tiers_off, "--redis-lean-reads", "false"],
            ),
        }
        try:
            for gw in gws.values():
                gw.wait_ready()
            payload = {
                "model": "tts-1",
                "input": TEXT,
                "voice": "alloy",
                "response_format": "wav",
                "stream": False,
            }
            bodies = []
            for name, gw in gws.items():
                speech = gw.url + "/v1/audio/speech"
                status, headers, audio = post(speech, payload)  # the first one synthesizes
                status, headers, again = post(speech, payload)
                assert status == 200 and headers["X-Cache"] == "HIT", (name, headers)
                bodies += [audio, again]
            assert len(set(bodies)) == 1, "every answer is the one stored entry"
            for gw in gws.values():
                pin(gw.proc.pid, server_cpus)
            runs = interleaved(
                {
                    name: (
                        lambda gw=gw: loaded(
                            gw.url + "/v1/audio/speech",
                            [gw.proc.pid, rs.proc.pid],  # type: ignore[union-attr]
                            args,
                            other_cpus,
                            payload,
                        )
                    )
                    for name, gw in gws.items()
                },
                args.rounds,
            )
        finally:
            for gw in gws.values():
                gw.stop()
    result = compare(runs, "lean_reader", "redis_py_hiredis")
    return {
        "part": "resp",
        "what": "a Redis-tier hit (memory and disk tiers off, HMAC checked) through the gateway: "
        "entries read by cache/resp.py's RespReader vs redis-py with hiredis",
        "payload_bytes": len(bodies[0]),
        "event_loop": label("auto"),
        "redis_py": redis.__version__,
        "hiredis": hiredis.__version__,
        "redis_server_cpu_us_per_request": {
            n: spread([x["cpu_us_per_request_1"] for x in v]) for n, v in runs.items()
        },
        **result,
        "rounds": runs,
        "placement": placement(server_cpus, other_cpus, "wrk and redis-server"),
        "verdict": verdict(result),
    }


def verdict(result: dict[str, Any]) -> str:
    """``keep`` when both the throughput and the CPU per request say >= 1.15x, else ``drop``."""
    rps, cpu = result["speedup_rps"]["median"], result["speedup_cpu"]["median"]
    return "keep" if min(rps, cpu) >= KEEP_AT else "drop"


PARTS = ("resp",)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    provenance()  # the commit and date as the run starts
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts: {', '.join(sorted(unknown))}")
    host = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores)"
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            work = Path(tmp) / part
            work.mkdir()
            result = resp(args, work)
            result = {"host": host, "rounds_run": args.rounds, **result}
            summary = {
                k: result[k] for k in ("speedup_rps", "speedup_cpu", "verdict") if k in result
            }
            print(f"{part}: {json.dumps(summary)}", flush=True)
            if not args.no_write:
                print(f"wrote {write_results(f'handmade_{part}', result)}")


if __name__ == "__main__":
    main()
