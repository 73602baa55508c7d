"""Loudness of what voxgate serves, before (``loudness_lufs = "off"``: each engine's own level)
and after (the default, -18 LUFS with the master's true peak at most -2.5 dBTP, so that every
rendition stays at most -1 dBTP): 40 prompts in three voices,
the bundled Piper voice joe, the tests' small random-weight Coqui VITS and an upstream (the
local OpenAI-compatible provider of ``bench.upstream``, whose made-up speech peaks 9 dB under
full scale), each through ``voxgate serve``.

Per voice: mean integrated loudness (ITU-R BS.1770-4, of the WAV at the voice's rate); over all
prompts and voices: spread (max - min, standard deviation); per format, over all voices and per
voice: the largest true peak (BS.1770-4 Annex 2, 4x oversampled) of the decoded rendition, and
the samples at full scale.
Writes docs/bench/loudness.json and loudness.png.

    python -m bench.loudness [--prompts 40] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.common import RESULTS, start_gateway, stop, write_results
from bench.harness import build_vits, free_port
from bench.upstream import start_provider
from bench.vs_nginx import ivr_prompts
from synth import loudness

# Short answers, questions, menus and several-sentence prompts beside the IVR sentences, so the
# set spans what a menu mixes: a word under one 400 ms gating block up to four sentences.
OTHER_PROMPTS = [
    "Yes.",
    "No.",
    "Goodbye!",
    "Thank you.",
    "Press one.",
    "Sorry, I didn't catch that.",
    "What is your account number?",
    "Please hold.",
    "For sales, press one. For support, press two. For billing, press three.",
    "Your call is important to us. Please stay on the line.",
    "Welcome back! You have three new messages.",
    "I can help with that. Which city are you flying from?",
    "The office is closed. Our hours are nine to five, Monday to Friday.",
    "Please say or enter your date of birth.",
    "Transferring you now.",
    "That number is not valid. Please try again.",
    "Your balance is forty two dollars and seventeen cents.",
    "Are you still there?",
    "To hear these options again, press star. To return to the main menu, press pound.",
    "Wow!",
]
# The renditions whose peaks the headroom is for (lossy codecs, 8 kHz G.711, the telephony
# codecs GSM 06.10 and G.722), and the lossless ones at the voice's rate and OpenAI's 24 kHz pcm.
# (alaw quantizes as mulaw does, in its own steps: tests/test_loudness.py covers it.)
FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "mulaw", "gsm", "g722")
VOICES = {
    "piper joe": ("piper", "joe"),
    "coqui vits": ("coqui", "default"),
    "upstream": ("paid", "alloy"),
}
# The tests' Coqui model has random weights: it buzzes, which the take checks rightly refuse;
# its plumbing is let through as tests/conftest.py does.
COQUI_LIMITS = '{"coqui": {"skip": ["not_speech", "dc_offset"]}}'
FULL_SCALE = 0.999


def decode(data: bytes, fmt: str, rate: int, tmp: Path) -> Any:
    """Any format, decoded by ffmpeg to float samples at the rendition's rate (the headerless
    ones told their demuxer; Opus decodes at 48 kHz)."""
    demux = {
        "pcm": ["-f", "s16le", "-ar", str(rate), "-ac", "1"],
        "ulaw": ["-f", "mulaw", "-ar", str(rate), "-ac", "1"],
        "alaw-raw": ["-f", "alaw", "-ar", str(rate), "-ac", "1"],
        "gsm": ["-f", "gsm"],
        "g722": ["-f", "g722"],
    }.get(fmt, [])
    path = tmp / f"rendition.{fmt}"
    path.write_bytes(data)
    out = subprocess.run(
        ["ffmpeg", "-v", "error", *demux, "-i", str(path), "-f", "f32le", "-ac", "1", "-"],
        capture_output=True,
        check=True,
    )
    return np.frombuffer(out.stdout, dtype="<f4")


async def measure(url: str, prompts: list[str], tmp: Path) -> dict[str, Any]:
    """Every prompt in every voice and format through the gateway at ``url``."""
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for label, (model, voice) in VOICES.items():
            rows = []
            for text in prompts:
                row: dict[str, Any] = {"chars": len(text)}
                for fmt in FORMATS:
                    body = {"model": model, "voice": voice, "input": text, "response_format": fmt}
                    async with session.post(f"{url}/v1/audio/speech", json=body) as r:
                        if r.status != 200:
                            raise RuntimeError(f"{label} {fmt}: {r.status} {await r.text()}")
                        data = await r.read()
                        rate = int(r.headers["X-Audio-Sample-Rate"])
                    pcm = await asyncio.to_thread(decode, data, fmt, rate, tmp)
                    rate = 48000 if fmt == "opus" else rate
                    row[fmt] = {
                        "true_peak_dbtp": round(loudness.db(loudness.true_peak(pcm, rate)), 3),
                        "full_scale_samples": int(np.count_nonzero(np.abs(pcm) >= FULL_SCALE)),
                    }
                    if fmt == "wav":
                        row["lufs"] = round(loudness.integrated_loudness(pcm, rate), 3)
                        row["seconds"] = round(len(pcm) / rate, 3)
                rows.append(row)
            out[label] = rows
    return out


def summary(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per voice mean LUFS; spread over all; per format the largest true peak and the samples
    at full scale."""
    levels = [r["lufs"] for voice in rows.values() for r in voice]
    return {
        "mean_lufs": {
            v: round(statistics.fmean(r["lufs"] for r in rs), 2) for v, rs in rows.items()
        },
        "spread_lu": round(max(levels) - min(levels), 2),
        "std_lu": round(statistics.pstdev(levels), 2),
        "max_true_peak_dbtp": {
            f: round(max(r[f]["true_peak_dbtp"] for rs in rows.values() for r in rs), 2)
            for f in FORMATS
        },
        "max_true_peak_dbtp_by_voice": {
            v: {f: round(max(r[f]["true_peak_dbtp"] for r in rs), 2) for f in FORMATS}
            for v, rs in rows.items()
        },
        "full_scale_samples": {
            f: sum(r[f]["full_scale_samples"] for rs in rows.values() for r in rs) for f in FORMATS
        },
    }


async def run(prompts: list[str], directory: Path) -> dict[str, Any]:
    model, config = build_vits(directory / "vits")
    provider_port = free_port()
    provider = start_provider(provider_port, 0)
    upstreams = directory / "upstreams.toml"
    upstreams.write_text(
        "[[upstream]]\n"
        'name = "paid"\nkind = "openai"\n'
        f'base_url = "http://127.0.0.1:{provider_port}/v1"\n'
        'model = "tts-1"\nvoices = ["alloy"]\ntimeout_s = 60\n'
    )
    results: dict[str, Any] = {}
    try:
        for mode, target in (("before", "off"), ("after", str(loudness.DEFAULT_TARGET_LUFS))):
            port = free_port()
            gateway = start_gateway(
                port,
                directory / f"cache-{mode}",
                *("--upstreams-file", str(upstreams)),
                *("--coqui-model", str(model), "--coqui-config", str(config)),
                *("--take-limits", COQUI_LIMITS, "--loudness-lufs", target),
                *("--log-level", "warning"),
            )
            try:
                rows = await measure(f"http://127.0.0.1:{port}", prompts, directory)
            finally:
                stop(gateway)
            results[mode] = {"loudness_lufs": target, **summary(rows), "prompts": rows}
    finally:
        stop(provider)
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| | "
        + " | ".join(f"{v} mean LUFS" for v in VOICES)
        + " | spread LU | std LU | "
        + " | ".join(f"{f} max dBTP" for f in FORMATS)
        + " | samples at full scale |",
        "|---" * (len(VOICES) + len(FORMATS) + 4) + "|",
    ]
    for mode in ("before", "after"):
        r = results[mode]
        cells = [mode]
        cells += [f"{r['mean_lufs'][v]:.2f}" for v in VOICES]
        cells += [f"{r['spread_lu']:.2f}", f"{r['std_lu']:.2f}"]
        cells += [f"{r['max_true_peak_dbtp'][f]:+.2f}" for f in FORMATS]
        cells.append(str(sum(r["full_scale_samples"].values())))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| after: largest true peak by voice | " + " | ".join(f"{f} dBTP" for f in FORMATS) + " |",
        "|---" * (len(FORMATS) + 1) + "|",
    ]
    for voice, peaks in results["after"]["max_true_peak_dbtp_by_voice"].items():
        lines.append(f"| {voice} | " + " | ".join(f"{peaks[f]:+.2f}" for f in FORMATS) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any]) -> Path:
    from bench.plots import pyplot, save_figure

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.4))
    colors = {"piper joe": "#3b7dd8", "coqui vits": "#d8843b", "upstream": "#4a9a5b"}
    for i, mode in enumerate(("before", "after")):
        for j, (voice, rows) in enumerate(results[mode]["prompts"].items()):
            xs = [i + (j - 1) * 0.22 + k * 0.004 for k in range(len(rows))]
            left.scatter(
                xs,
                [r["lufs"] for r in rows],
                s=10,
                color=colors[voice],
                label=voice if i == 0 else None,
            )
    left.axhline(loudness.DEFAULT_TARGET_LUFS, color="gray", lw=0.8, ls="--")
    left.set_xticks([0, 1], ["before (engine's level)", "after (-18 LUFS target)"])
    left.set_ylabel("integrated loudness, LUFS (BS.1770-4)")
    left.set_title("each prompt's loudness, by voice")
    left.legend(fontsize=8)
    # The random-weight Coqui model makes noise, not speech: its bars stand apart from the voices'.
    after = results["after"]["max_true_peak_dbtp_by_voice"]
    bars = {
        "before, all voices": [results["before"]["max_true_peak_dbtp"][f] for f in FORMATS],
        "after, speech (joe, upstream)": [
            max(after[v][f] for v in VOICES if v != "coqui vits") for f in FORMATS
        ],
        "after, coqui vits (noise)": [after["coqui vits"][f] for f in FORMATS],
    }
    width = 0.27
    x = np.arange(len(FORMATS))
    for k, (label, peaks) in enumerate(bars.items()):
        right.bar(x + (k - 1) * width, peaks, width, label=label)
    right.axhline(0.0, color="red", lw=0.8)
    right.axhline(
        loudness.RENDITION_CEILING_DBTP, color="black", lw=0.8, ls=":", label="-1 dBTP (renditions)"
    )
    right.axhline(loudness.CEILING_DBTP, color="gray", lw=0.8, ls="--", label="master ceiling")
    right.set_xticks(x, FORMATS)
    right.set_ylabel("largest true peak, dBTP")
    right.set_title("largest true peak of any prompt, by format")
    right.legend(fontsize=8)
    fig.suptitle("python -m bench.loudness: 40 prompts x 3 voices through voxgate serve")
    fig.tight_layout()
    return save_figure(fig, RESULTS / "loudness.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    half = args.prompts // 2
    prompts = ivr_prompts(args.prompts - half) + OTHER_PROMPTS[:half]
    with tempfile.TemporaryDirectory(prefix="voxgate-bench-loudness-") as tmp:
        results = asyncio.run(run(prompts, Path(tmp)))
    print(table(results))
    report = {
        "benchmark": "loudness",
        "prompts": len(prompts),
        "voices": list(VOICES),
        "formats": list(FORMATS),
        "target_lufs": loudness.DEFAULT_TARGET_LUFS,
        "ceiling_dbtp": loudness.CEILING_DBTP,
        "rendition_ceiling_dbtp": loudness.RENDITION_CEILING_DBTP,
        "results": results,
    }
    if not args.no_write:
        write_results("loudness", report)
        plot(results)
    else:
        print(
            json.dumps(
                {m: {k: v for k, v in r.items() if k != "prompts"} for m, r in results.items()},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
