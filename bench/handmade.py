"""Hand-written parts of the hot paths, each measured against the maintained code it stands in for,
side by side: rounds interleaved (the order flips every round, so a drift of the machine hits both
alike), medians and the spread (lowest and highest round) reported. A part earns its place at
1.15x or more on the measure it was written for.

- ``resp``: a Redis-tier hit (memory and disk tiers off, so every request reads Redis; the entry's
  HMAC checked on every read) served by two gateways sharing one Redis and one stored entry: one
  reading entries through ``cache/resp.py`` (``--redis-lean-reads true``), one through redis-py
  with hiredis (``false``). wrk drives each in turn; throughput and the gateway's CPU per request
  (from /proc). Both gateways run on the default event loop.
- ``wav``: ``synth.audio.wav_pcm16`` against stdlib ``wave`` writing the same bytes (checked), for
  the prompt sizes a miss encodes; set against a miss's gateway CPU (docs/bench/miss_path.json).
- ``send``: ``gateway.http.conditional.audio_body`` (an ``AudioResponse`` for a large body on a
  loop where aiohttp skips ``writelines``) against aiohttp's own ``web.Response``: two bare
  aiohttp servers on asyncio's loop serving the same ~270 KB body.

    python -m bench.handmade [--parts resp,wav,send] [--rounds 6] [--seconds 4]
                             [--connections 16] [--no-write]

Writes docs/bench/handmade_<part>.json. On 2+ CPUs the servers under test run on the last CPU
(each in its own turn) and wrk and redis-server on the others.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    cpu_seconds,
    cpu_split,
    pin,
    placement,
    post,
    provenance,
    stop,
    wait_http,
    write_results,
    wrk_rate,
)
from bench.harness import ROOT, GatewayProcess, free_port, redis_server
from gateway.runtime.eventloop import label

KEEP_AT = 1.15
# About 5.7 s of speech: a ~250 KB PCM16 WAV at the voice's 22,050 Hz (as bench/scaleout.py).
TEXT = (
    "Thank you for calling. Your call is important to us. All of our agents are currently "
    "helping other customers."
)
SEND_BYTES = 270_000
CALLS = 2000  # files written per timing of a WAV writer


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
            payload = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "wav"}
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


# ---- wav: the hand-written WAV writer against stdlib wave ------------------------------------


def wave_pcm16(samples: Any, sample_rate: int) -> bytes:
    """A mono 16-bit WAV of ``samples`` written by the standard library."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(samples.astype("<i2", copy=False).data)
    return buf.getvalue()


def wav(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from synth import audio

    rng = np.random.default_rng(0)
    cases = {"1.5 s at 8 kHz": (8000, 12_000), "5.7 s at 22.05 kHz": (22050, 125_685)}
    out: dict[str, Any] = {}
    for case, (rate, n) in cases.items():
        samples = audio.to_int16((rng.standard_normal(n) * 0.3).astype(np.float32))
        assert audio.wav_pcm16(samples, rate) == wave_pcm16(samples, rate), "not the same bytes"

        def timed(fn: Callable[[Any, int], bytes], s: Any = samples, r: int = rate) -> float:
            t = time.process_time()
            for _ in range(CALLS):
                fn(s, r)
            return 1e6 * (time.process_time() - t) / CALLS

        runs: dict[str, list[float]] = {"wav_pcm16": [], "stdlib_wave": []}
        for r in range(args.rounds * 3):
            order = [("wav_pcm16", audio.wav_pcm16), ("stdlib_wave", wave_pcm16)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                runs[name].append(timed(fn))
        ratios = [w / h for h, w in zip(runs["wav_pcm16"], runs["stdlib_wave"], strict=True)]
        extra = statistics.median(runs["stdlib_wave"]) - statistics.median(runs["wav_pcm16"])
        out[case] = {
            "bytes": 44 + 2 * n,
            "cpu_us_per_file": {k: spread(v) for k, v in runs.items()},
            "speedup_cpu": spread(ratios),
            "stdlib_extra_us_per_file": round(extra, 2),
        }
        print(f"{case}: {json.dumps(out[case]['cpu_us_per_file'])}", flush=True)
    miss = json.loads((RESULTS / "miss_path.json").read_text())
    miss_ms = float(miss["servers"]["voxgate"]["gateway_process_cpu_ms_per_request"])
    worst = max(c["stdlib_extra_us_per_file"] for c in out.values())
    return {
        "part": "wav",
        "what": "synth.audio.wav_pcm16 vs stdlib wave writing the same bytes (CPU per file, "
        "in process)",
        "python": platform.python_version(),
        "cases": out,
        "miss_gateway_cpu_ms_per_request": miss_ms,
        "miss_gateway_cpu_from": f"docs/bench/miss_path.json ({miss['git_commit'][:7]})",
        # A WAV miss encodes one file: the most a faster writer can take off its gateway CPU.
        "speedup_bound_on_a_wav_miss": round(miss_ms / (miss_ms - worst / 1000), 4),
        "verdict": ("keep" if miss_ms / (miss_ms - worst / 1000) >= KEEP_AT else "use stdlib wave"),
    }


# ---- send: AudioResponse against aiohttp's own Response on asyncio's loop --------------------


def serve(port: int, path: Path, kind: str) -> None:
    """A bare aiohttp server on asyncio's loop answering every request with ``path``'s bytes,
    as ``kind``: ``audio_body`` (the gateway's send path) or ``response`` (``web.Response``)."""
    import asyncio

    from aiohttp import web

    from gateway.http.conditional import audio_body

    data = path.read_bytes()
    headers = {"Content-Type": "audio/wav", "ETag": '"0123456789abcdef"'}

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        if kind == "audio_body":
            return audio_body(request, data, headers)
        return web.Response(body=data, headers=headers)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/readyz", ok)
    app.router.add_get("/audio", handler)
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, loop=asyncio.new_event_loop()
    )


def send(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from aiohttp import http_writer

    from gateway.http.conditional import AudioResponse

    split = cpu_split()
    server_cpus, other_cpus = split if split else (None, None)
    body = work / "audio.bin"
    body.write_bytes(os.urandom(SEND_BYTES))
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for kind in ("audio_body", "response"):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.handmade", "--serve", str(port), str(body), kind],
                cwd=ROOT,
            )
            procs[kind] = (proc, f"http://127.0.0.1:{port}")
            wait_http(f"http://127.0.0.1:{port}/readyz")
            pin(proc.pid, server_cpus)
        runs = interleaved(
            {
                kind: (lambda p=p, url=url: loaded(url + "/audio", [p.pid], args, other_cpus))
                for kind, (p, url) in procs.items()
            },
            args.rounds,
        )
    finally:
        for proc, _ in procs.values():
            stop(proc)
    result = compare(runs, "audio_body", "response")
    return {
        "part": "send",
        "what": "a bare aiohttp server on asyncio's loop sending a ~270 KB body: "
        "conditional.audio_body (AudioResponse: headers sent on their own, the body not "
        "copied) vs web.Response",
        "payload_bytes": SEND_BYTES,
        "python": platform.python_version(),
        # AudioResponse is made only where aiohttp skips writelines (asyncio's loop on Python
        # before 3.12.9); elsewhere audio_body is a plain Response.
        "aiohttp_skips_writelines": http_writer.SKIP_WRITELINES,
        "audio_response_used": http_writer.SKIP_WRITELINES and SEND_BYTES >= 16 * 1024,
        "audio_response_class": AudioResponse.__qualname__,
        **result,
        "rounds": runs,
        "placement": placement(server_cpus, other_cpus),
        "verdict": verdict(result),
    }


def verdict(result: dict[str, Any]) -> str:
    """``keep`` when both the throughput and the CPU per request say >= 1.15x, else ``drop``."""
    rps, cpu = result["speedup_rps"]["median"], result["speedup_cpu"]["median"]
    return "keep" if min(rps, cpu) >= KEEP_AT else "drop"


PARTS = ("resp", "wav", "send")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--serve", nargs=3, metavar=("PORT", "FILE", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(int(args.serve[0]), Path(args.serve[1]), args.serve[2])
        return
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
            if part == "resp":
                result = resp(args, work)
            elif part == "wav":
                result = wav(args)
            else:
                result = send(args, work)
            result = {"host": host, "rounds_run": args.rounds, **result}
            summary = {
                k: result[k]
                for k in ("speedup_rps", "speedup_cpu", "speedup_bound_on_a_wav_miss", "verdict")
                if k in result
            }
            print(f"{part}: {json.dumps(summary)}", flush=True)
            if not args.no_write:
                print(f"wrote {write_results(f'handmade_{part}', result)}")


if __name__ == "__main__":
    main()
