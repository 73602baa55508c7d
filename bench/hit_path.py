"""Hit path: one cached ~250 KB WAV served by the gateway vs the same bytes from a bare aiohttp
handler, under the same concurrent load, in one run (rounds interleaved so drift hits both).

    python bench/hit_path.py [--seconds 4] [--rounds 7] [--connections 32] [--no-pin]
                             [--event-loop auto|uvloop|asyncio] [--disk-only]

Target: gateway >= 0.8 x bare. Writes docs/bench/hit_path.json and hit_path.png.

On a machine with 2+ CPUs both servers run on the last CPU (each in its own rounds) and wrk on
the others, so the load generator never competes with the server it measures. Each round also
records each server's CPU time per request (from /proc), the figure least moved by neighbours.
Both servers run on the same event loop (``--event-loop``, default: the gateway's default).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    bar_plot,
    cpu_seconds,
    cpu_split,
    free_port,
    median,
    pin,
    placement,
    post,
    start_gateway,
    stop,
    wait_http,
    write_results,
    wrk_rate,
)

sys.path.insert(0, str(ROOT))
from gateway.runtime.eventloop import label

# About 5.7 s of speech: a ~250 KB PCM16 WAV at the voice's 22,050 Hz.
TEXT = (
    "Thank you for calling. Your call is important to us. All of our agents are currently "
    "helping other customers."
)


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
        "--event-loop",
        default="auto",
        choices=("auto", "uvloop", "asyncio"),
        help="event loop of both servers (default: auto, as the gateway's default)",
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        gport, bport = free_port(), free_port()
        extra = ["--memory-cache-mb", "0"] if args.disk_only else []
        extra += ["--event-loop", args.event_loop]
        gateway = start_gateway(gport, tmpdir / "cache", *extra, log_path=tmpdir / "gateway.log")
        bare = None
        try:
            url = f"http://127.0.0.1:{gport}/v1/audio/speech"
            body = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "wav"}
            status, headers, audio = post(url, body)
            assert status == 200 and headers["X-Cache"] == "MISS"
            status, headers, again = post(url, body)
            assert headers["X-Cache"] == "HIT" and again == audio
            (tmpdir / "audio.wav").write_bytes(audio)
            bare = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "bench" / "bare_server.py"),
                    str(bport),
                    str(tmpdir / "audio.wav"),
                    "audio/wav",
                    args.event_loop,
                ],
                cwd=ROOT,
            )
            wait_http(f"http://127.0.0.1:{bport}/readyz")
            burl = f"http://127.0.0.1:{bport}/v1/audio/speech"
            payload = json.dumps(body)
            split = None if args.no_pin else cpu_split()
            server_cpus, load_cpus = split if split else (None, None)
            pin(gateway.pid, server_cpus)
            pin(bare.pid, server_cpus)

            def measure(target: str, pid: int) -> dict[str, float]:
                before = cpu_seconds(pid)
                run = wrk_rate(
                    target,
                    body=payload,
                    seconds=args.seconds,
                    connections=args.connections,
                    cpus=load_cpus,
                )
                run["server_cpu_us_per_request"] = (
                    1e6 * (cpu_seconds(pid) - before) / run["requests"]
                )
                return run

            # warm both (connection setup, caches)
            measure(url, gateway.pid)
            measure(burl, bare.pid)
            g_runs: list[dict[str, float]] = []
            b_runs: list[dict[str, float]] = []
            for i in range(args.rounds):
                # alternate which server goes first, so neither always gets the warmer slot
                order = [(url, gateway.pid, g_runs), (burl, bare.pid, b_runs)]
                for target, pid, runs in order if i % 2 == 0 else reversed(order):
                    runs.append(measure(target, pid))
        finally:
            stop(gateway)
            if bare is not None:
                stop(bare)

    g = median([r["rps"] for r in g_runs])
    b = median([r["rps"] for r in b_runs])
    # Each round measures both servers back to back: the median of the per-round ratios cancels
    # most of the machine's drift (the bare server alone varied by 25% between rounds here).
    ratios = [gr["rps"] / br["rps"] for gr, br in zip(g_runs, b_runs, strict=True)]
    ratio = median(ratios)
    g_p50 = median([r.get("p50_ms", 0.0) for r in g_runs])
    b_p50 = median([r.get("p50_ms", 0.0) for r in b_runs])
    g_cpu = median([r["server_cpu_us_per_request"] for r in g_runs])
    b_cpu = median([r["server_cpu_us_per_request"] for r in b_runs])
    where = placement(server_cpus, load_cpus)
    tier = "disk" if args.disk_only else "memory"
    print(
        f"\n{tier} hit path, {len(audio):,} byte WAV, {args.connections} connections, "
        f"{args.rounds} x {args.seconds:g} s rounds (median), {where}"
    )
    print(f"{'server':<28}{'req/s':>10}{'p50 ms':>10}{'CPU us/req':>12}")
    print(f"{'gateway (POST speech, HIT)':<28}{g:>10.0f}{g_p50:>10.2f}{g_cpu:>12.1f}")
    print(f"{'bare aiohttp (same bytes)':<28}{b:>10.0f}{b_p50:>10.2f}{b_cpu:>12.1f}")
    print("per-round ratios: " + ", ".join(f"{r:.3f}" for r in ratios))
    print(
        f"ratio gateway/bare (median of rounds): {ratio:.3f} (target >= 0.8) -> "
        f"{'PASS' if ratio >= 0.8 else 'MISS'}"
    )
    print(f"CPU per request, bare/gateway: {b_cpu / g_cpu:.3f}")
    if not args.no_write and not args.disk_only:
        write_results(
            "hit_path",
            {
                "benchmark": "hit_path",
                "command": "python bench/hit_path.py " + " ".join(sys.argv[1:]),
                "audio_bytes": len(audio),
                "connections": args.connections,
                "seconds_per_round": args.seconds,
                "rounds": args.rounds,
                "gateway_rps": g_runs,
                "bare_rps": b_runs,
                "gateway_rps_median": g,
                "bare_rps_median": b,
                "ratio": ratio,
                "round_ratios": ratios,
                "placement": where,
                "event_loop": label(args.event_loop),
                "gateway_cpu_us_per_request_median": g_cpu,
                "bare_cpu_us_per_request_median": b_cpu,
                "cpu_ratio_bare_over_gateway": b_cpu / g_cpu,
                "target_ratio": 0.8,
                "machine": {
                    "cpus": __import__("os").cpu_count(),
                    "python": platform.python_version(),
                },
            },
        )
        bar_plot(
            "hit_path",
            f"Cached {len(audio) // 1000} KB WAV: gateway vs bare aiohttp",
            ["gateway hit", "bare aiohttp"],
            [g, b],
            "requests/s",
        )
        print("wrote docs/bench/hit_path.json and docs/bench/hit_path.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
