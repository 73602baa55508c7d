"""Upstream bench: a paid TTS provider called directly, against the same provider behind voxgate.

The provider is a local OpenAI-compatible server (this module, ``--provider PORT``, in its own
process) that takes ``--latency-ms`` (default 400) per call and counts calls and characters. The
workload is an IVR's: ``--prompts`` (default 300) three-sentence prompts (bench.hit_path's
templated prompts: 300 of them share 21 sentences), asked with Zipf popularity (exponent 1) by
``--clients`` (default 16) closed-loop clients for ``--seconds`` (default 60), as 24 kHz WAV.

- ``direct``: the clients call the provider themselves (what a bot without a cache pays);
- ``voxgate``: the clients call ``voxgate serve`` as users start it (no topology flags), with the
  provider as an upstream (``split = "sentence"``, a fresh cache directory).

For each: requests answered, provider calls, characters billed, and the clients' latency p50 and
p99. Writes docs/bench/upstream.json and upstream.png.

    python -m bench.upstream [--seconds 60] [--clients 16] [--prompts 300] [--latency-ms 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import RESULTS, start_gateway, stop, wait_http, write_results
from bench.harness import ROOT, free_port, voiced
from bench.hit_path import zipf_prompts, zipf_sequence

RATE = 24000


# ---- the provider ---------------------------------------------------------------------------


def provider_app(latency_s: float) -> web.Application:
    """OpenAI's ``POST /v1/audio/speech`` taking ``latency_s`` per call (made-up speech the take
    checks accept, :func:`bench.harness.voiced`, as 16-bit pcm or WAV at 24 kHz), and ``GET
    /stats`` (calls, characters)."""
    stats = {"calls": 0, "chars": 0}

    async def speech(request: web.Request) -> web.Response:
        body = await request.json()
        text = str(body["input"])
        stats["calls"] += 1
        stats["chars"] += len(text)
        await asyncio.sleep(latency_s)  # the provider's time per call
        pcm = voiced(text, 1.0, RATE).tobytes()
        if body.get("response_format") == "pcm":
            return web.Response(body=pcm, content_type="application/octet-stream")
        import io
        import wave

        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(pcm)
        return web.Response(body=out.getvalue(), content_type="audio/wav")

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(stats)

    app = web.Application()
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/stats", get_stats)
    return app


def start_provider(port: int, latency_ms: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "bench.upstream"),
            *("--provider", str(port), "--latency-ms", str(latency_ms)),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_http(f"http://127.0.0.1:{port}/stats")
    return proc


async def provider_stats(session: aiohttp.ClientSession, port: int) -> dict[str, int]:
    async with session.get(f"http://127.0.0.1:{port}/stats") as r:
        stats: dict[str, int] = await r.json()
        return stats


# ---- the load ---------------------------------------------------------------------------------


async def load(
    url: str,
    bodies: list[dict[str, Any]],
    sequence: list[int],
    clients: int,
    seconds: float,
    min_requests: int = 0,
) -> dict[str, Any]:
    """``clients`` closed-loop clients, each walking its own slice of ``sequence``, for
    ``seconds`` and until ``min_requests`` are answered (a slow machine runs longer, not
    fewer)."""
    latencies: list[float] = []
    errors = 0
    chars = 0
    began = time.monotonic()
    end = began + seconds

    async def client(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal errors, chars
        j = i * 7919
        while time.monotonic() < end or len(latencies) + errors < min_requests:
            body = bodies[sequence[j % len(sequence)]]
            j += 1
            started = time.perf_counter()
            async with session.post(url, json=body) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    continue
            latencies.append(time.perf_counter() - started)
            chars += len(body["input"])

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "chars_requested": chars,
        "requests_per_s": len(latencies) / (time.monotonic() - began),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
    }


async def run(
    *,
    seconds: float,
    clients: int,
    prompts: int,
    latency_ms: int,
    directory: Path,
    min_requests: int = 0,
) -> dict[str, Any]:
    texts = zipf_prompts(prompts)
    sequence = zipf_sequence(len(texts), 1.0, 100_000)
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for mode in ("direct", "voxgate"):
            port = free_port()
            provider = start_provider(port, latency_ms)
            gateway = None
            try:
                if mode == "direct":
                    url = f"http://127.0.0.1:{port}/v1/audio/speech"
                    model = "tts-1"
                else:
                    upstreams = directory / "upstreams.toml"
                    upstreams.write_text(
                        "[[upstream]]\n"
                        'name = "paid"\nkind = "openai"\n'
                        f'base_url = "http://127.0.0.1:{port}/v1"\n'
                        'model = "tts-1"\nvoices = ["alloy"]\n'
                        f"max_concurrency = {clients}\ntimeout_s = 60\n"
                        "price_per_million_chars = 15.0\n"
                    )
                    gw_port = free_port()
                    gateway = start_gateway(
                        gw_port,
                        directory / "cache",
                        "--upstreams-file",
                        str(upstreams),
                        "--log-level",
                        "warning",
                    )
                    url = f"http://127.0.0.1:{gw_port}/v1/audio/speech"
                    model = "paid"
                bodies = [
                    {"model": model, "input": t, "voice": "alloy", "response_format": "wav"}
                    for t in texts
                ]
                figures = await load(url, bodies, sequence, clients, seconds, min_requests)
                stats = await provider_stats(session, port)
                figures["provider_calls"] = stats["calls"]
                figures["chars_billed"] = stats["chars"]
                figures["billed_per_char_requested"] = stats["chars"] / max(
                    1, figures["chars_requested"]
                )
                results[mode] = figures
            finally:
                if gateway is not None:
                    stop(gateway)
                stop(provider)
    return results


def plot(results: dict[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["direct", "voxgate"]
    panels = [
        ("provider calls", "provider_calls"),
        ("characters billed", "chars_billed"),
        ("p50 latency (ms)", "p50_ms"),
        ("p99 latency (ms)", "p99_ms"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.8))
    for ax, (title, key) in zip(axes, panels, strict=True):
        values = [float(results[m][key] or 0) for m in modes]
        bars = ax.bar(modes, values, color=["#9aa5b1", "#3b7dd8"])
        for b, v in zip(bars, values, strict=True):
            ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom")
        ax.set_title(title)
    fig.suptitle("A 400 ms TTS provider, IVR Zipf over 300 prompts, 16 clients: direct vs voxgate")
    fig.tight_layout()
    path = RESULTS / "upstream.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--latency-ms", type=int, default=400)
    ap.add_argument("--provider", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.provider:
        web.run_app(
            provider_app(args.latency_ms / 1000),
            host="127.0.0.1",
            port=args.provider,
            print=None,
            access_log=None,
        )
        return
    with tempfile.TemporaryDirectory(prefix="voxgate-bench-upstream-") as tmp:
        results = asyncio.run(
            run(
                seconds=args.seconds,
                clients=args.clients,
                prompts=args.prompts,
                latency_ms=args.latency_ms,
                directory=Path(tmp),
            )
        )
    report = {
        "benchmark": "upstream",
        "seconds": args.seconds,
        "clients": args.clients,
        "prompts": args.prompts,
        "provider_latency_ms": args.latency_ms,
        "zipf_s": 1.0,
        "format": "wav",
        "results": results,
        "calls_ratio": results["voxgate"]["provider_calls"]
        / max(1, results["direct"]["provider_calls"]),
        "chars_billed_ratio": results["voxgate"]["chars_billed"]
        / max(1, results["direct"]["chars_billed"]),
    }
    print(json.dumps(report, indent=2))
    if not args.no_write:
        write_results("upstream", report)
        plot(results)


if __name__ == "__main__":
    main()
