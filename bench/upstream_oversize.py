"""What refused oversize provider answers leave held: the reader of this tree against the one
of ``--before`` (a commit; default the last before answers were read into one dropped buffer).

Each round streams ``--answers`` answers (default 6) of ``--mb`` MiB (default 66, past the
default ``max_audio_mb`` of 64) of raw pcm, in 64 KiB pieces as aiohttp hands them on, through
:class:`synth.providers.base.AnswerReader`, and keeps each refusal as a failed task keeps it
(its traceback whole). The process's RSS after the round, less before it, is what the
refusals hold. One process per reader, so neither sees the other's heap.

    python -m bench.upstream_oversize [--answers 6] [--mb 66] [--before COMMIT]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from bench.common import RESULTS, write_results
from bench.harness import ROOT

BEFORE = "ed5fbf4"
MIB = 1024 * 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


async def body(mb: int) -> AsyncIterator[bytes]:
    piece = bytes(range(256)) * 256  # 64 KiB
    for _ in range(mb * 16):
        yield bytes(bytearray(piece))  # a new object each time, as a socket read makes


async def measure(module_path: str, answers: int, mb: int) -> dict[str, float]:
    """RSS (MiB) before and after ``answers`` refusals through the reader at ``module_path``."""
    spec = importlib.util.spec_from_file_location("reader_under_test", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    from synth.engine import SynthesisItem
    from synth.upstream import UpstreamConfig

    config = UpstreamConfig(
        name="p", kind="openai", base_url="http://127.0.0.1:9/v1", model="m", sample_rate=48000
    )
    # A text long enough that max_audio_mb, not its plausible length, is the bound.
    item = SynthesisItem("word " * 800, "alloy")
    gc.collect()
    before = rss_mb()
    kept: list[BaseException] = []
    for _ in range(answers):
        try:
            await module.AnswerReader(config, item).read(body(mb))
        except module.ProviderError as exc:
            kept.append(exc)
    gc.collect()
    after = rss_mb()
    assert len(kept) == answers, "every answer is refused"
    return {"rss_before_mb": before, "rss_after_mb": after, "held_mb": after - before}


def child(module_path: str, answers: int, mb: int) -> dict[str, float]:
    code = (
        "import asyncio, json, sys; from bench.upstream_oversize import measure; "
        "print(json.dumps(asyncio.run(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, module_path, str(answers), str(mb)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=6)
    parser.add_argument("--mb", type=int, default=66)
    parser.add_argument("--before", default=BEFORE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old_base.py"
        old.write_text(
            subprocess.run(
                ["git", "show", f"{args.before}:synth/providers/base.py"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        rows = {
            f"before ({args.before})": child(str(old), args.answers, args.mb),
            "this tree": child(str(ROOT / "synth/providers/base.py"), args.answers, args.mb),
        }
    print(f"{args.answers} refused answers of {args.mb} MiB, each refusal kept")
    print(f"{'reader':<22}{'RSS before':>12}{'RSS after':>12}{'held':>10}  (MiB)")
    for name, r in rows.items():
        print(
            f"{name:<22}{r['rss_before_mb']:>12.0f}{r['rss_after_mb']:>12.0f}{r['held_mb']:>10.0f}"
        )
    write_results(
        "upstream_oversize", {"answers": args.answers, "answer_mb": args.mb, "readers": rows}
    )
    from bench.common import bar_plot

    bar_plot(
        "upstream_oversize",
        f"RSS held after {args.answers} refused {args.mb} MiB answers",
        list(rows),
        [r["held_mb"] for r in rows.values()],
        "MiB held",
    )
    print(f"wrote {RESULTS / 'upstream_oversize.json'} and .png")


if __name__ == "__main__":
    main()
