"""Time to first audio: streaming a 5-sentence text vs its first sentence alone vs the whole text.

A real gateway (the bundled Piper voice, memory + disk tiers in a temp dir) on loopback. Each round
uses fresh numbers in the sentences so nothing is cached, and measures, side by side:

- ``stream_ttfa_s``: POST with ``stream: true``, time until the first audio bytes arrive;
- ``first_sentence_s``: a non-streamed request for the first sentence alone (its synthesis time,
  plus the small HTTP and encoding overhead every request pays);
- ``full_response_s``: the whole text, not streamed, until the last byte.

The order of the three requests rotates every round so drift in the machine's load spreads evenly.

With ``--sse`` the streamed request is OpenAI's ``stream_format: "sse"`` for the first three
sentences (raw ``pcm``), timed until its first ``speech.audio.delta`` event has arrived whole
(to compare with the first sentence alone: SSE framing should add little); the others are timed as above, in
``pcm``, on the same three sentences.

    python -m bench.ttfa [--rounds 7] [--sse]

Writes docs/bench/ttfa.json and docs/bench/ttfa.png (with --sse: ttfa_sse.json, ttfa_sse.png).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import RESULTS, provenance, write_results
from bench.plots import dot_rounds, pyplot, save_figure
from gateway.http.app import create_app, wait_ready
from gateway.runtime.settings import Settings

TEMPLATE = (
    "Your balance is {a} dollars and {b} cents.",
    "Your last payment of {c} dollars was received on the {d}th.",
    "Press 1 to hear your recent transactions.",
    "Press 2 to speak with an agent about account {e}.",
    "Thank you for calling, and have a good day.",
)


def sentences(seed: int) -> list[str]:
    """Five sentences whose numbers (and so whose cache keys) are new for every ``seed``."""
    values = {
        "a": 100 + seed,
        "b": 10 + seed,
        "c": 200 + seed,
        "d": 4 + seed % 20,
        "e": 3000 + seed,
    }
    return [s.format(**values) for s in TEMPLATE]


async def first_byte(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    """Seconds until the first body bytes of a streamed response (the rest is drained)."""
    started = time.perf_counter()
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        chunk = await resp.content.readany()
        elapsed = time.perf_counter() - started
        assert len(chunk) > 44, "the first chunk must carry audio, not only the WAV header"
        await resp.read()
    return elapsed


async def first_delta(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    """Seconds until the first whole ``speech.audio.delta`` event of an SSE response (the rest is
    drained)."""
    started = time.perf_counter()
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Cache"] == "MISS"
        line = await resp.content.readline()  # one event's data line: the whole first delta
        elapsed = time.perf_counter() - started
        event = json.loads(line.removeprefix(b"data: "))
        assert event["type"] == "speech.audio.delta" and len(event["audio"]) > 1000
        await resp.read()
    return elapsed


async def whole(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    """Seconds until the last byte of a non-streamed response."""
    started = time.perf_counter()
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        await resp.read()
        assert resp.headers["X-Cache"] == "MISS"
    return time.perf_counter() - started


async def run(rounds: int, *, sse: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.load(env={}, overrides={"cache_dir": tmp, "port": "0"})
        app = create_app(settings)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/v1/audio/speech"
        await wait_ready(app)
        base = {"model": "tts-1", "voice": "alloy", "response_format": "pcm" if sse else "wav"}
        count = 3 if sse else 5
        results: dict[str, list[float]] = {
            "stream_ttfa_s": [],
            "first_sentence_s": [],
            "full_response_s": [],
        }
        try:
            async with aiohttp.ClientSession() as session:
                await whole(session, url, {**base, "input": " ".join(sentences(999))})  # warm-up
                for r in range(rounds):
                    texts = [sentences(3 * r + i)[:count] for i in range(3)]
                    streamed = (
                        first_delta(
                            session,
                            url,
                            {**base, "input": " ".join(texts[0]), "stream_format": "sse"},
                        )
                        if sse
                        else first_byte(
                            session, url, {**base, "input": " ".join(texts[0]), "stream": True}
                        )
                    )
                    jobs = [
                        ("stream_ttfa_s", streamed),
                        ("first_sentence_s", whole(session, url, {**base, "input": texts[1][0]})),
                        (
                            "full_response_s",
                            whole(session, url, {**base, "input": " ".join(texts[2])}),
                        ),
                    ]
                    shift = r % 3
                    for name, job in jobs[shift:] + jobs[:shift]:
                        results[name].append(await job)
        finally:
            await runner.cleanup()
    med = {name: statistics.median(v) for name, v in results.items()}
    return {
        "benchmark": "ttfa_sse" if sse else "ttfa",
        "description": (
            "Time to the first whole speech.audio.delta event of a 3-sentence text streamed as "
            "server-sent events (stream_format sse, pcm)"
            if sse
            else "Time to first audio byte streaming a 5-sentence text"
        )
        + ", vs the non-streamed time of its first sentence alone and of the whole text (real "
        "Piper voice, cold cache).",
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
        },
        "rounds": rounds,
        "sentences": count,
        "format": base["response_format"],
        "settings": {
            "synth_threads": settings.synth_threads,
            "sentence_pause_ms": settings.sentence_pause_ms,
        },
        "runs_s": results,
        "median_s": med,
        "ttfa_over_first_sentence": med["stream_ttfa_s"] / med["first_sentence_s"],
        # The same ratio taken within each round (the two requests ran back to back, so a load
        # change on a shared machine moves both), then the median of the rounds.
        "ttfa_over_first_sentence_per_round_median": statistics.median(
            t / f
            for t, f in zip(results["stream_ttfa_s"], results["first_sentence_s"], strict=True)
        ),
        "ttfa_over_full_response": med["stream_ttfa_s"] / med["full_response_s"],
    }


def plot(report: dict[str, Any], path: Path) -> None:
    sse = report["benchmark"] == "ttfa_sse"
    names = ["stream_ttfa_s", "first_sentence_s", "full_response_s"]
    first = "SSE:\nfirst delta event" if sse else "streamed:\nfirst audio byte"
    labels = [first, "first sentence\nalone", "whole text,\nnot streamed"]
    fig, ax = pyplot().subplots(figsize=(7, 4))
    meds = [report["median_s"][n] * 1000 for n in names]
    ax.bar(labels, meds, color=["#2a9d8f", "#e9c46a", "#e76f51"])
    dot_rounds(ax, [[v * 1000 for v in report["runs_s"][n]] for n in names])
    ax.set_ylabel("milliseconds (bar: median, dots: rounds)")
    ax.set_title(
        f"{report['sentences']}-sentence text, cold cache: TTFA = "
        f"{report['ttfa_over_first_sentence']:.2f}x first sentence, "
        f"{report['ttfa_over_full_response']:.2f}x whole",
        fontsize=9,
    )
    save_figure(fig, path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--sse", action="store_true", help="time the first SSE delta of a 3-sentence text"
    )
    args = parser.parse_args()
    provenance()  # the commit and date as the run starts
    report = asyncio.run(run(args.rounds, sse=args.sse))
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "ttfa_sse" if args.sse else "ttfa"
    write_results(name, report)
    plot(report, RESULTS / f"{name}.png")
    print(f"{'measure':<20}{'median ms':>10}   rounds (ms)")
    for name, values in report["runs_s"].items():
        runs = " ".join(f"{v * 1000:.0f}" for v in values)
        print(f"{name:<20}{report['median_s'][name] * 1000:>10.0f}   {runs}")
    print(f"TTFA / first sentence alone: {report['ttfa_over_first_sentence']:.2f}x")
    print(
        "  (median of per-round ratios: "
        f"{report['ttfa_over_first_sentence_per_round_median']:.2f}x)"
    )
    print(f"TTFA / whole text response:  {report['ttfa_over_full_response']:.2f}x")


if __name__ == "__main__":
    main()
