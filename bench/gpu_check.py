"""One prepared GPU check: Coqui VITS (LJSpeech size, random weights) on CUDA, fp32 vs fp16/bf16
autocast, at batch 1 and batch 8; plus exactness of batch 8 against single runs and ONNX Runtime's
CUDA provider when it is installed. Prints a table and writes ``docs/bench/gpu_check.json``.

Not run so far: the task that wrote it had no GPU. Run it on a CUDA host (about 1-2 minutes):

    .venv/bin/python -m bench.gpu_check [--device cuda:0]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from bench.common import provenance, write_results
from synth.coqui_engine import CoquiEngine
from synth.engine import SynthesisItem

TEXTS = [
    "Your call is important to us.",
    "Please hold the line.",
    "Press one for billing questions.",
    "The office opens at nine.",
    "Thank you for calling today.",
    "Say your account number now.",
    "We are transferring your call.",
    "Goodbye and have a nice day.",
]
QUIET = {"noise_scale": 0.0, "noise_scale_dp": 0.0}


def timed(engine: CoquiEngine, batch: int, repeats: int = 3) -> tuple[float, float]:
    import torch

    items = [SynthesisItem(t, "default", params=QUIET) for t in TEXTS]
    best = float("inf")
    audio = 0.0
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        audio = 0.0
        for i in range(0, len(items), batch):
            audio += sum(a.duration_s for a in engine.synthesize_batch(items[i : i + batch]))
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best, audio


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    provenance()  # the commit and date as the run starts
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check needs a GPU")
    from bench.engines import ljspeech_vits

    model, config = ljspeech_vits()
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(args.device), "rows": rows}
    reference = None
    for mode in ("torch", "fp16", "bf16"):
        engine = CoquiEngine(model, config, mode=mode, device=args.device)
        engine.load()
        engine.warm_up()
        for batch in (1, 8):
            wall, audio = timed(engine, batch)
            rows.append(
                {
                    "mode": mode,
                    "batch": batch,
                    "wall_s": round(wall, 4),
                    "rtf": round(wall / audio, 5),
                }
            )
            print(rows[-1], flush=True)
        items = [SynthesisItem(t, "default", params=QUIET) for t in TEXTS]
        batched = engine.synthesize_batch(items)
        singles = [engine.synthesize_batch([i])[0] for i in items]
        diffs = [
            float(np.abs(b.pcm[:-256] - s.pcm[:-256]).max())
            for b, s in zip(batched, singles, strict=True)
        ]
        same_len = all(len(b.pcm) == len(s.pcm) for b, s in zip(batched, singles, strict=True))
        result[f"{mode}_batch8_vs_single_max_abs_diff"] = max(diffs)
        result[f"{mode}_batch8_lengths_equal"] = same_len
        if mode == "torch":
            reference = singles
        elif reference is not None:
            n = [min(len(a.pcm), len(b.pcm)) for a, b in zip(singles, reference, strict=True)]
            result[f"{mode}_vs_fp32_max_abs_diff"] = max(
                float(np.abs(a.pcm[:k] - b.pcm[:k]).max())
                for a, b, k in zip(singles, reference, n, strict=True)
            )
        del engine
        torch.cuda.empty_cache()
    try:
        engine = CoquiEngine(model, config, mode="onnx", device=args.device)
        engine.load()
        engine.warm_up()
        wall, audio = timed(engine, 1)
        rows.append(
            {
                "mode": "onnx-cuda",
                "batch": 1,
                "wall_s": round(wall, 4),
                "rtf": round(wall / audio, 5),
                "providers": engine._onnx.get_providers(),
            }
        )
        print(rows[-1], flush=True)
    except Exception as exc:  # onnxruntime-gpu may be absent: record it, keep the torch results
        result["onnx_cuda_error"] = f"{type(exc).__name__}: {exc}"
    out = write_results("gpu_check", result)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
