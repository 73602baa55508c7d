"""What the take checks cost a stream's first byte: ``voxgate serve`` with ``--take-checks signal``
(the default) against ``--take-checks off``, side by side in one run.

A stream says a sentence once its take has passed the checks, so the checks sit between the
first sentence's synthesis and the first byte. Both servers run with no other flags (the default
topology; each its own cache) and are up together; each round sends the same fresh six-sentence
text (``bench.first_byte``'s, new numbers every round, so a miss on both) to each, in turns
that alternate (A B, B A, ...), with the real ``openai`` SDK's plain ``with_streaming_response``
(mp3, the SDK's default), timed until the first body bytes. The idle server uses no CPU while
the other is measured. Figures: each server's median first byte, and the median of the
per-round differences and ratios (checks on over off).

    python -m bench.take_first_byte [--rounds 15] [--no-write]

Writes docs/bench/take_first_byte.json (with the command, date and commit) and
take_first_byte.png.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import bar_plot, provenance, start_gateway, stop, write_results
from bench.first_byte import first_byte, six_sentences
from bench.harness import free_port

VARIANTS = ("signal", "off")


async def rounds(urls: dict[str, str], count: int) -> dict[str, list[float]]:
    from openai import AsyncOpenAI

    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    clients = {
        v: AsyncOpenAI(base_url=f"{urls[v]}/v1", api_key="unused", max_retries=0) for v in VARIANTS
    }
    try:
        for v in VARIANTS:  # once each, outside the figures (first connections, first encoder)
            await first_byte(clients[v], " ".join(six_sentences(998)))
        for r in range(count):
            text = " ".join(six_sentences(r))
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for v in order:
                elapsed, _ = await first_byte(clients[v], text)
                out[v].append(elapsed)
    finally:
        for client in clients.values():
            await client.close()
    return out


def run(count: int, tmp: Path) -> dict[str, Any]:
    ports = {v: free_port() for v in VARIANTS}
    servers = {
        v: start_gateway(ports[v], tmp / v, "--take-checks", v, log_path=tmp / f"{v}.log")
        for v in VARIANTS
    }
    try:
        runs = asyncio.run(rounds({v: f"http://127.0.0.1:{p}" for v, p in ports.items()}, count))
    finally:
        for proc in servers.values():
            stop(proc)
    on, off = runs["signal"], runs["off"]
    diffs = [(a - b) * 1000 for a, b in zip(on, off, strict=True)]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {
        "benchmark": "take_first_byte",
        "description": (
            "openai SDK (AsyncOpenAI) plain with_streaming_response on a fresh six-sentence "
            "text (mp3): seconds to the first body bytes, voxgate serve --take-checks signal "
            "against --take-checks off, both up, turns alternating; the bundled Piper voice."
        ),
        "rounds": count,
        "first_sentence_chars": len(six_sentences(0)[0]),
        "runs_s": runs,
        "median_first_byte_ms": {v: round(statistics.median(runs[v]) * 1000, 1) for v in runs},
        "median_difference_ms": round(statistics.median(diffs), 2),
        "median_ratio": round(statistics.median(ratios), 3),
    }


def plot(report: dict[str, Any]) -> Path:
    """Each server's median first byte: docs/bench/take_first_byte.png."""
    medians = report["median_first_byte_ms"]
    return bar_plot(
        "take_first_byte",
        f"a stream's first byte, uncached: checks on - off = {report['median_difference_ms']} "
        f"ms, {report['median_ratio']}x (medians of {report['rounds']} rounds)",
        [f"take_checks = {v}" for v in VARIANTS],
        [medians[v] for v in VARIANTS],
        "first byte, ms (median)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    # (Up to 997: the texts' numbers stay new and of fixed width.)
    rounds = range(1, 998)
    ap.add_argument("--rounds", type=int, default=15, choices=rounds, metavar="1..997")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    provenance()  # the commit and date as the run starts
    with tempfile.TemporaryDirectory(prefix="take-first-byte-") as tmp:
        report = run(args.rounds, Path(tmp))
    medians = report["median_first_byte_ms"]
    print(
        *(f"take checks {v:<7} first byte {medians[v]:>7.1f} ms median" for v in VARIANTS),
        f"on - off: {report['median_difference_ms']} ms, on / off: {report['median_ratio']}x "
        "(medians of rounds)",
        sep="\n",
    )
    written = [] if args.no_write else [write_results("take_first_byte", report), plot(report)]
    print(*written, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
