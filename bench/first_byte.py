"""First audio for a client that sets nothing: the openai SDK's plain ``with_streaming_response``.

Against ``voxgate serve`` with no flags (its port and a fresh cache directory only; the topology
is what ``auto`` makes of this machine), each round sends, with the real ``openai`` SDK
(``AsyncOpenAI``, its defaults: ``mp3``, no ``stream`` field):

- ``six_first_byte_s``: a six-sentence text through ``with_streaming_response``, timed until the
  first body bytes arrive (the rest is drained);
- ``one_whole_s``: a one-sentence text whose sentence has the same length as the six-sentence
  text's first one, through ``with_raw_response`` (the whole answer read).

Every round's texts carry new numbers (of the same digit counts, so the lengths stay equal), so
both requests are misses. The order of the two rotates every round so drift in the machine's load
spreads evenly; the figure is the median of the per-round ratios (the two requests ran back to
back, so a load change moves both).

    python -m bench.first_byte [--rounds 9] [--no-write]

Writes docs/bench/first_byte.json (with the command, date and commit) and first_byte.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS, provenance, start_gateway, stop, write_results
from bench.harness import free_port
from bench.plots import dot_rounds, pyplot, save_figure

SIX = (
    "Your balance is {a} dollars and {b} cents.",
    "Your last payment of {c} dollars was received on the {d}th.",
    "Press 1 to hear your recent transactions.",
    "Press 2 to speak with an agent about account {e}.",
    "Your next statement will be ready on the {f}th.",
    "Thank you for calling, and have a good day.",
)
TARGET = 1.3


def six_sentences(seed: int) -> list[str]:
    """Six sentences whose numbers (so whose cache keys) are new for every ``seed`` < 1000; each
    number has a fixed digit count, so a sentence's length does not depend on ``seed``."""
    values = {
        "a": 1000 + seed,
        "b": 10 + seed % 90,
        "c": 2000 + seed,
        "d": 10 + seed % 19,
        "e": 3000 + seed,
        "f": 10 + (seed * 7) % 19,
    }
    return [s.format(**values) for s in SIX]


def one_sentence(seed: int) -> str:
    """A first sentence of the same length as ``six_sentences(seed)[0]``, other numbers."""
    return SIX[0].format(a=5000 + seed, b=10 + (seed + 45) % 90)


async def first_byte(client: Any, text: str) -> tuple[float, int]:
    """Seconds until the first body bytes of the SDK's plain streaming call, and their size."""
    started = time.perf_counter()
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text
    ) as resp:
        if resp.headers.get("x-cache") != "MISS":
            raise RuntimeError(f"expected a miss, got {resp.headers.get('x-cache')}")
        chunks = resp.iter_bytes()
        first = await anext(chunks)
        elapsed = time.perf_counter() - started
        async for _ in chunks:
            pass
    return elapsed, len(first)


async def whole(client: Any, text: str) -> float:
    """Seconds until the whole answer of the SDK's raw (non-streaming) call has arrived."""
    started = time.perf_counter()
    resp = await client.audio.speech.with_raw_response.create(
        model="tts-1", voice="alloy", input=text
    )
    body = resp.content
    elapsed = time.perf_counter() - started
    if resp.headers.get("x-cache") != "MISS" or not body:
        raise RuntimeError(f"expected a miss with audio, got {resp.headers.get('x-cache')}")
    return elapsed


async def rounds(url: str, count: int) -> dict[str, list[float]]:
    from openai import AsyncOpenAI

    out: dict[str, list[float]] = {"six_first_byte_s": [], "one_whole_s": [], "first_bytes": []}
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        # Both paths once, outside the figures (first connections, first encoder use).
        await whole(client, one_sentence(999))
        await first_byte(client, " ".join(six_sentences(999)))
        for r in range(count):
            six = " ".join(six_sentences(r))

            async def streamed(text: str = six) -> None:
                elapsed, size = await first_byte(client, text)
                out["six_first_byte_s"].append(elapsed)
                out["first_bytes"].append(size)

            async def single(text: str = one_sentence(r)) -> None:
                out["one_whole_s"].append(await whole(client, text))

            jobs = [streamed, single] if r % 2 == 0 else [single, streamed]
            for job in jobs:
                await job()
    return out


def run(count: int, tmp: Path) -> dict[str, Any]:
    port = free_port()
    log_path = tmp / "gateway.log"
    gw = start_gateway(port, tmp / "cache", log_path=log_path)
    load_before = os.getloadavg()
    try:
        topology = re.search(r'topology: ([^"\n]*)', log_path.read_text(errors="replace"))
        runs = asyncio.run(rounds(f"http://127.0.0.1:{port}", count))
    finally:
        stop(gw)
    ratios = [s / o for s, o in zip(runs["six_first_byte_s"], runs["one_whole_s"], strict=True)]
    med = {k: statistics.median(runs[k]) for k in ("six_first_byte_s", "one_whole_s")}
    return {
        "benchmark": "first_byte",
        "description": (
            "openai SDK (AsyncOpenAI) plain with_streaming_response on a six-sentence uncached "
            "text: seconds to its first body bytes, vs with_raw_response on a one-sentence "
            "uncached text of the same first-sentence length, whole; voxgate serve with no "
            "flags, the bundled Piper voice, mp3 (the SDK's default)."
        ),
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m": {"start": load_before[0], "end": os.getloadavg()[0]},
        },
        "server": {"flags": [], "topology": topology.group(1) if topology else None},
        "rounds": count,
        "first_sentence_chars": len(six_sentences(0)[0]),
        "example_six": " ".join(six_sentences(0)),
        "runs_s": runs,
        "median_s": med,
        "ratio_per_round": [round(x, 3) for x in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
        "ratio_of_medians": round(med["six_first_byte_s"] / med["one_whole_s"], 3),
        "target": TARGET,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    names = ["six_first_byte_s", "one_whole_s"]
    labels = ["six sentences, plain SDK stream:\nfirst byte", "one sentence,\nwhole"]
    fig, ax = pyplot().subplots(figsize=(7, 4))
    ax.bar(labels, [report["median_s"][n] * 1000 for n in names], color=["#2a9d8f", "#e9c46a"])
    dot_rounds(ax, [[v * 1000 for v in report["runs_s"][n]] for n in names])
    ax.set_ylabel("milliseconds (bar: median, dots: rounds)")
    ax.set_title(
        f"openai SDK, uncached, voxgate serve (no flags): median per-round ratio "
        f"{report['median_ratio']:.2f}x (target <= {TARGET}x)",
        fontsize=9,
    )
    save_figure(fig, path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9, help="pairs of fresh texts")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds < 999:
        ap.error("--rounds must be 1..998 (the texts' numbers stay new and of fixed width)")
    provenance()  # the commit and date as the run starts
    with tempfile.TemporaryDirectory(prefix="first-byte-") as tmp:
        report = run(args.rounds, Path(tmp))
    for name, values in report["runs_s"].items():
        if name.endswith("_s"):
            shown = " ".join(f"{v * 1000:.0f}" for v in values)
            print(f"{name:<18}{report['median_s'][name] * 1000:>8.0f} ms median   ({shown})")
    print(
        f"first byte (six) / whole (one): {report['median_ratio']}x median of rounds, "
        f"{report['ratio_of_medians']}x of medians (target <= {TARGET}x)"
    )
    if not args.no_write:
        print(write_results("first_byte", report))
        path = RESULTS / "first_byte.png"
        plot(report, path)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
