"""Engine speed: RTF per execution mode at batch 1, 4, 8, and worker-pool throughput.

Engines: the bundled Piper voice (joe) and a Coqui VITS with the full LJSpeech-size architecture
(Coqui's default ``VitsArgs``) and random weights: speed does not depend on the weights.

- RTF = engine time / seconds of audio produced (lower is faster), on the same 8 texts, every
  engine on ONE intra-op thread. Reported as wall RTF and CPU RTF (process CPU time): on a shared,
  busy machine CPU time is the fair measure of compute, and the ratios quoted use it. Configurations
  run in interleaved rounds (``--rounds``); the table shows each one's best round, and the ONNX vs
  eager figure is the median over rounds of the ratio within each round (best-of-rounds also given).
- Batch 4 and 8: Coqui torch runs real exact batches (what the engine serves). Piper and Coqui ONNX
  graphs return no per-item lengths, so their engines run batch 1; their padded-batch rows here are
  measured straight on the ONNX session only to show what batching would buy (``exact: false``).
- Pool throughput: syntheses/s through :class:`synth.pool.WorkerPool` with workers x threads
  = 1x1, 1x2, 2x1 (Piper) and 1x2, 2x1 (Coqui ONNX), the items submitted all at once; all pools
  are started first, then measured in interleaved rounds, best round kept.

Everything runs in one process run, side by side, so the ratios survive a noisy shared machine.
Writes ``docs/bench/engines.json`` and ``docs/bench/engines.png``.

``--int8`` runs only fp32 against int8 (``synthesis_precision``): the Piper voice and Coqui's VITS
export (``--no-coqui``: Piper only), each at both precisions on one intra-op thread, the voice's
noise off, in interleaved rounds. Speed is CPU seconds (``getrusage``: user + system of this
process, which busy neighbours on the same cores move least) per synthesized second, and its
inverse, audio seconds per core second; the int8 speedup is the median of the per-round ratios.
Distance from fp32: mel-cepstral distortion (``bench.harness.mel_cepstral_distortion``) and
duration, beside two yardsticks: voxgate's MP3 of the same fp32 audio (the bound) and the voice's
own noise. Writes ``docs/bench/engines_int8.json`` and ``docs/bench/engines_int8.png``.

    .venv/bin/python -m bench.engines            # ~3 minutes on 2 idle cores (much longer on a loaded machine)
    .venv/bin/python -m bench.engines --int8     # the first run derives the int8 graphs (minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, provenance, write_results
from metrics import Metrics
from synth.coqui_engine import CoquiEngine
from synth.engine import Engine, SynthesisItem
from synth.piper_engine import PiperEngine, PiperVoiceFiles
from synth.pool import EngineSpec, WorkerPool

TEXTS = [
    "Please hold.",
    "Press one now.",
    "Thank you for calling.",
    "The office is closed.",
    "Say your number.",
    "Goodbye for now.",
    "We are transferring you.",
    "One moment please.",
]
CORES = os.cpu_count() or 1


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxgate-bench"


def ljspeech_vits() -> tuple[Path, Path]:
    """The LJSpeech-size random VITS, built once into the bench cache."""
    from bench.harness import build_vits

    directory = cache_dir() / "vits-ljspeech"
    if (directory / "model.pth").is_file() and (directory / "config.json").is_file():
        return directory / "model.pth", directory / "config.json"
    return build_vits(directory, size="ljspeech")


Timing = tuple[float, float]  # (wall_s, cpu_s)


def timed(fn: Callable[[], float]) -> tuple[float, float, float]:
    """``(wall_s, cpu_s, audio_s)`` of ``fn`` (which returns seconds of audio)."""
    wall, cpu = time.perf_counter(), time.process_time()
    audio = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, audio


def engine_run(engine: Engine, voice: str, batch: int) -> Callable[[], float]:
    """The 8 texts in batches of ``batch`` through the engine; returns audio seconds."""
    items = [SynthesisItem(t, voice) for t in TEXTS]

    def run() -> float:
        audio = 0.0
        for i in range(0, len(items), batch):
            audio += sum(a.duration_s for a in engine.synthesize_batch(items[i : i + batch]))
        return audio

    return run


def padded_onnx_run(
    session: Any, ids: list[list[int]], scales: np.ndarray, batch: int, audio_s: float
) -> Callable[[], float]:
    """The ids in padded ONNX batches of ``batch`` (pad id 0). Returns the true audio seconds
    (measured from single runs): the padded outputs cannot be split back exactly."""

    def run() -> float:
        for i in range(0, len(ids), batch):
            chunk = ids[i : i + batch]
            longest = max(len(x) for x in chunk)
            x = np.zeros((len(chunk), longest), dtype=np.int64)
            for r, seq in enumerate(chunk):
                x[r, : len(seq)] = seq
            lengths = np.asarray([len(q) for q in chunk], dtype=np.int64)
            session.run(None, {"input": x, "input_lengths": lengths, "scales": scales})
        return audio_s

    return run


def row(
    engine: str, mode: str, batch: int, wall: float, cpu: float, audio: float, exact: bool
) -> dict[str, Any]:
    return {
        "engine": engine,
        "mode": mode,
        "batch": batch,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "audio_s": round(audio, 3),
        "rtf": round(wall / audio, 4),
        "cpu_rtf": round(cpu / audio, 4),
        "exact": exact,
    }


def bench_rtf(model: Path, config: Path, rounds: int) -> list[dict[str, Any]]:
    """Every (engine, mode, batch) on one intra-op thread, rounds interleaved, best round kept.

    One thread makes CPU time a fair measure of compute even on a busy shared machine; the best
    of interleaved rounds keeps bursts of foreign load out of the ratios.
    """
    piper = PiperEngine([PiperVoiceFiles.bundled_joe()], intra_op_threads=1)
    piper.load()
    piper.warm_up()
    engines: dict[str, CoquiEngine] = {}
    for mode in ("torch", "int8", "onnx"):
        e = CoquiEngine(model, config, mode=mode, intra_op_threads=1, onnx_dir=cache_dir() / "onnx")
        started = time.perf_counter()
        e.load()
        e.warm_up()
        print(f"  coqui {mode}: loaded in {time.perf_counter() - started:.1f}s", flush=True)
        engines[mode] = e
    configs: list[tuple[str, str, int, bool, Callable[[], float]]] = [
        ("piper", "onnxruntime", 1, True, engine_run(piper, "joe", 1))
    ]
    piper_audio = engine_run(piper, "joe", 1)()
    voice = piper._voices["joe"]
    ids = [voice.phonemes_to_ids([p for s in voice.phonemize(t) for p in s]) for t in TEXTS]
    d = piper.default_params("joe")
    scales = np.asarray([d["noise_scale"], d["length_scale"], d["noise_w"]], dtype=np.float32)
    for batch in (4, 8):
        run = padded_onnx_run(voice.session, ids, scales, batch, piper_audio)
        configs.append(("piper", "onnxruntime", batch, False, run))
    for batch in (1, 4, 8):
        configs.append(
            ("coqui-vits", "torch", batch, True, engine_run(engines["torch"], "default", batch))
        )
    configs.append(("coqui-vits", "int8", 1, True, engine_run(engines["int8"], "default", 1)))
    onnx = engines["onnx"]
    configs.append(("coqui-vits", "onnx", 1, True, engine_run(onnx, "default", 1)))
    onnx_audio = engine_run(onnx, "default", 1)()
    tok = onnx._synth.tts_model.tokenizer
    cids = [list(tok.text_to_ids(t)) for t in TEXTS]
    p = onnx.default_params("default")
    cscales = np.asarray(
        [p["noise_scale"], p["length_scale"], p["noise_scale_dp"]], dtype=np.float32
    )
    for batch in (4, 8):
        run = padded_onnx_run(onnx._onnx, cids, cscales, batch, onnx_audio)
        configs.append(("coqui-vits", "onnx", batch, False, run))
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    per_round: dict[tuple[str, str, int], list[float]] = {}
    for r in range(rounds):
        for engine, mode, batch, exact, run in configs:
            wall, cpu, audio = timed(run)
            key = (engine, mode, batch)
            cand = row(engine, mode, batch, wall, cpu, audio, exact)
            per_round.setdefault(key, []).append(cand["cpu_rtf"])
            if key not in best or cand["cpu_rtf"] < best[key]["cpu_rtf"]:
                best[key] = cand
            print(f"  round {r + 1}: {cand}", flush=True)
    rows = [{**b, "cpu_rtf_rounds": per_round[k]} for k, b in best.items()]
    if not engines["int8"].describe().get("quantized_layers"):
        # Quantization was a no-op: int8 is the torch model; its batches are the torch rows.
        for batch in (4, 8):
            rows.append(
                {
                    **best[("coqui-vits", "torch", batch)],
                    "mode": "int8",
                    "note": "no-op: same model as torch",
                }
            )
    return rows


async def bench_pools(model: Path, config: Path, coqui: bool, rounds: int) -> list[dict[str, Any]]:
    """Throughput of pools with workers x threads, rounds interleaved.

    Each pool is started just before its measurement and closed after it: with every pool alive
    at once, the idle pools' processes and ONNX Runtime thread pools would share the same cores
    and hold the 2-worker figure well below twice one worker's."""
    voices = [PiperVoiceFiles.bundled_joe()]
    setups: list[tuple[str, str, EngineSpec, int, int, int]] = []
    for workers, threads in ((1, 1), (1, 2), (2, 1)):
        spec = EngineSpec(
            "synth.piper_engine:PiperEngine", {"voices": voices, "intra_op_threads": threads}
        )
        setups.append(("piper", "joe", spec, workers, threads, 24))
    if coqui:
        for workers, threads in ((1, 2), (2, 1)):
            kwargs = {
                "model_path": model,
                "config_path": config,
                "mode": "onnx",
                "intra_op_threads": threads,
                "onnx_dir": cache_dir() / "onnx",
            }
            spec = EngineSpec("synth.coqui_engine:CoquiEngine", kwargs)
            setups.append(("coqui-vits", "default", spec, workers, threads, 6))
    best: dict[int, dict[str, Any]] = {}
    for r in range(rounds):
        for i, (name, voice, spec, workers, threads, n) in enumerate(setups):
            pool = WorkerPool(name, spec.build(), [spec] * workers, Metrics(), threads=threads)
            await pool.start()
            try:
                work = [
                    SynthesisItem(f"{TEXTS[k % len(TEXTS)]} Round {r} item {k}.", voice)
                    for k in range(n)
                ]
                sem = asyncio.Semaphore(workers)

                async def one(
                    item: SynthesisItem, pool: WorkerPool = pool, sem: asyncio.Semaphore = sem
                ) -> float:
                    async with sem:
                        return (await pool.run_batch([item]))[0].duration_s

                started = time.perf_counter()
                audio = sum(await asyncio.gather(*(one(it) for it in work)))
                wall = time.perf_counter() - started
                cand = {
                    "engine": name,
                    "workers": workers,
                    "threads": threads,
                    "items": n,
                    "wall_s": round(wall, 3),
                    "syntheses_per_s": round(n / wall, 3),
                    "audio_s_per_s": round(audio / wall, 3),
                }
                print(f"  round {r + 1}: {cand}", flush=True)
                if i not in best or cand["syntheses_per_s"] > best[i]["syntheses_per_s"]:
                    best[i] = cand
            finally:
                await pool.close()
    return [best[i] for i in range(len(setups))]


def ratio(rows: list[dict[str, Any]], key: str, a: dict[str, Any], b: dict[str, Any]) -> float:
    def pick(sel: dict[str, Any]) -> float:
        return float(next(r for r in rows if all(r[k] == v for k, v in sel.items()))[key])

    return round(pick(a) / pick(b), 3)


def paired_median(rtf: list[dict[str, Any]], slow: dict[str, Any], fast: dict[str, Any]) -> float:
    """Median over rounds of slow/fast CPU RTF, each round's pair measured back to back.

    Eager torch's time for the same texts moved by up to 25% between rounds here (new input
    lengths, new oneDNN kernels) where ONNX Runtime's did not: the best round of each alone
    compares torch's luckiest round with an ordinary ONNX one."""

    def pick(sel: dict[str, Any]) -> list[float]:
        return list(
            next(r for r in rtf if all(r[k] == v for k, v in sel.items()))["cpu_rtf_rounds"]
        )

    return round(statistics.median(a / b for a, b in zip(pick(slow), pick(fast), strict=True)), 3)


def summarize(rtf: list[dict[str, Any]], pools: list[dict[str, Any]]) -> dict[str, float]:
    s: dict[str, float] = {}
    s["coqui_onnx_speedup_vs_torch"] = paired_median(
        rtf,
        {"engine": "coqui-vits", "mode": "torch", "batch": 1},
        {"engine": "coqui-vits", "mode": "onnx", "batch": 1},
    )
    s["coqui_onnx_speedup_vs_torch_best_rounds"] = ratio(
        rtf,
        "cpu_rtf",
        {"engine": "coqui-vits", "mode": "torch", "batch": 1},
        {"engine": "coqui-vits", "mode": "onnx", "batch": 1},
    )
    s["coqui_int8_speedup_vs_torch"] = ratio(
        rtf,
        "cpu_rtf",
        {"engine": "coqui-vits", "mode": "torch", "batch": 1},
        {"engine": "coqui-vits", "mode": "int8", "batch": 1},
    )
    for engine, mode in (("piper", "onnxruntime"), ("coqui-vits", "torch"), ("coqui-vits", "onnx")):
        for batch in (4, 8):
            s[f"{engine}_{mode}_batch{batch}_speedup_vs_batch1"] = ratio(
                rtf,
                "cpu_rtf",
                {"engine": engine, "mode": mode, "batch": 1},
                {"engine": engine, "mode": mode, "batch": batch},
            )
    p = "syntheses_per_s"
    s["piper_pool_2x1_vs_1x2"] = ratio(
        pools, p, {"engine": "piper", "workers": 2}, {"engine": "piper", "workers": 1, "threads": 2}
    )
    s["piper_pool_2x1_vs_1x1"] = ratio(
        pools, p, {"engine": "piper", "workers": 2}, {"engine": "piper", "workers": 1, "threads": 1}
    )
    if any(r["engine"] == "coqui-vits" for r in pools):
        s["coqui_onnx_pool_2x1_vs_1x2"] = ratio(
            pools, p, {"engine": "coqui-vits", "workers": 2}, {"engine": "coqui-vits", "workers": 1}
        )
    return s


def plot(rtf: list[dict[str, Any]], pools: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    groups = sorted({(r["engine"], r["mode"]) for r in rtf}, key=lambda g: (g[0] != "piper", g))
    width = 0.25
    for j, batch in enumerate((1, 4, 8)):
        values = [
            next(r["cpu_rtf"] for r in rtf if (r["engine"], r["mode"]) == g and r["batch"] == batch)
            for g in groups
        ]
        xs = [i + (j - 1) * width for i in range(len(groups))]
        bars = ax1.bar(xs, values, width, label=f"batch {batch}")
        for bar, g in zip(bars, groups, strict=True):
            exact = next(
                r["exact"] for r in rtf if (r["engine"], r["mode"]) == g and r["batch"] == batch
            )
            if not exact:
                bar.set_hatch("//")
    ax1.set_xticks(range(len(groups)), [f"{e}\n{m}" for e, m in groups])
    ax1.set_ylabel("CPU RTF, 1 thread (CPU s per audio s, lower is faster)")
    ax1.set_title("RTF by mode and batch (hatched: padded ONNX, not exact)")
    ax1.legend()
    labels = [f"{r['engine']}\n{r['workers']}w x {r['threads']}t" for r in pools]
    ax2.bar(range(len(pools)), [r["syntheses_per_s"] for r in pools], color="tab:green")
    ax2.set_xticks(range(len(pools)), labels)
    ax2.set_ylabel("syntheses / s")
    ax2.set_title(f"Worker pool throughput ({CORES} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- precision: fp32 against int8 (``--int8``) -----------------------------------------------

NOISE_OFF = {
    "piper": {"noise_scale": 0.0, "noise_w": 0.0},
    "coqui-vits": {"noise_scale": 0.0, "noise_scale_dp": 0.0},
}
# The bound an int8 mode's distance from fp32 must stay within to be a default, per engine: the
# distance voxgate's own MP3 rendition (at its default bit rate) puts between a listener and the
# same fp32 audio, measured in the same run (docs/synthesis.md, "int8").
DEFAULT_SPEEDUP = 1.3
DURATION_TOLERANCE = 0.01


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (``getrusage``): what a busy neighbour on the
    same cores moves least, unlike the wall clock."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def mp3_round_trip(pcm: np.ndarray[Any, Any], rate: int) -> np.ndarray[Any, Any]:
    """``pcm`` encoded as voxgate serves MP3 (synth.audio) and decoded again."""
    import io

    import soundfile

    from synth.audio import FORMATS, encode

    data, _ = soundfile.read(io.BytesIO(encode(pcm, rate, FORMATS["mp3"])), dtype="float32")
    return np.asarray(data, dtype=np.float32).reshape(-1)


def precision_engines(coqui: bool) -> list[tuple[str, str, Engine, str]]:
    """``(engine, precision, engine object, voice)``, loaded and warmed, fp32 before int8."""
    out: list[tuple[str, str, Engine, str]] = []
    for precision in ("fp32", "int8"):
        started = time.perf_counter()
        piper = PiperEngine(
            [PiperVoiceFiles.bundled_joe()],
            intra_op_threads=1,
            precision=precision,
            derived_dir=cache_dir() / "piper-int8",
        )
        piper.load()
        piper.warm_up()
        print(f"  piper {precision}: ready in {time.perf_counter() - started:.1f}s", flush=True)
        out.append(("piper", precision, piper, "joe"))
    if coqui:
        model, config = ljspeech_vits()
        for precision in ("fp32", "int8"):
            started = time.perf_counter()
            engine = CoquiEngine(
                model,
                config,
                mode="onnx",
                intra_op_threads=1,
                onnx_dir=cache_dir() / "onnx",
                precision=precision,
            )
            engine.load()
            engine.warm_up()
            print(f"  coqui {precision}: ready in {time.perf_counter() - started:.1f}s", flush=True)
            out.append(("coqui-vits", precision, engine, "default"))
    return out


def bench_precision(rounds: int, coqui: bool) -> dict[str, Any]:
    """fp32 against int8 per engine, noise off: CPU and wall time per synthesized second in
    interleaved rounds (each round runs every configuration once, in turn), then the int8 audio's
    distance from fp32 (MCD, duration) with two yardsticks beside it: the voice's own noise
    (default noise scales against noise off) and voxgate's MP3 rendition of the fp32 audio."""
    from bench.harness import mel_cepstral_distortion

    engines = precision_engines(coqui)
    items = {
        name: [SynthesisItem(t, voice, params=NOISE_OFF[name]) for t in TEXTS]
        for name, _, _, voice in engines
    }
    times: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(rounds):
        for name, precision, engine, _ in engines:
            wall, cpu = time.perf_counter(), cpu_seconds()
            audio = sum(a.duration_s for a in engine.synthesize_batch(items[name]))
            wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
            times.setdefault((name, precision), []).append(
                {"wall_s": wall, "cpu_s": cpu, "audio_s": audio}
            )
            print(
                f"  round {r + 1}: {name} {precision}: cpu {cpu:.2f}s wall {wall:.2f}s "
                f"audio {audio:.2f}s",
                flush=True,
            )
    rows: list[dict[str, Any]] = []
    quality: list[dict[str, Any]] = []
    decisions: dict[str, dict[str, Any]] = {}
    for name in items:
        fp32 = next(e for n, p, e, _ in engines if n == name and p == "fp32")
        int8 = next(e for n, p, e, _ in engines if n == name and p == "int8")
        for precision in ("fp32", "int8"):
            runs = times[(name, precision)]
            cpu_rtf = [t["cpu_s"] / t["audio_s"] for t in runs]
            wall_rtf = [t["wall_s"] / t["audio_s"] for t in runs]
            rows.append(
                {
                    "engine": name,
                    "precision": precision,
                    "cpu_s_per_audio_s_rounds": [round(x, 4) for x in cpu_rtf],
                    "cpu_s_per_audio_s": round(statistics.median(cpu_rtf), 4),
                    "wall_s_per_audio_s": round(statistics.median(wall_rtf), 4),
                    # one intra-op thread: CPU seconds are core seconds
                    "audio_s_per_core_s": round(1.0 / statistics.median(cpu_rtf), 3),
                    "syntheses_per_core_s": round(
                        statistics.median(len(TEXTS) / t["cpu_s"] for t in runs), 3
                    ),
                }
            )
        speedups = [
            a["cpu_s"] / a["audio_s"] / (b["cpu_s"] / b["audio_s"])
            for a, b in zip(times[(name, "fp32")], times[(name, "int8")], strict=True)
        ]
        wall_speedups = [
            a["wall_s"] / a["audio_s"] / (b["wall_s"] / b["audio_s"])
            for a, b in zip(times[(name, "fp32")], times[(name, "int8")], strict=True)
        ]
        ref = fp32.synthesize_batch(items[name])
        out = int8.synthesize_batch(items[name])
        noisy = fp32.synthesize_batch([SynthesisItem(t, items[name][0].voice) for t in TEXTS])
        rate = fp32.sample_rate
        for text, a, b, c in zip(TEXTS, ref, out, noisy, strict=True):
            quality.append(
                {
                    "engine": name,
                    "text": text,
                    "int8_mcd_db": round(mel_cepstral_distortion(a.pcm, b.pcm, rate), 3),
                    "int8_duration_ratio": round(b.duration_s / a.duration_s, 4),
                    "voice_noise_mcd_db": round(mel_cepstral_distortion(a.pcm, c.pcm, rate), 3),
                    "mp3_mcd_db": round(
                        mel_cepstral_distortion(a.pcm, mp3_round_trip(a.pcm, rate), rate), 3
                    ),
                }
            )
        mine = [q for q in quality if q["engine"] == name]
        mcd = statistics.mean(q["int8_mcd_db"] for q in mine)
        bound = statistics.mean(q["mp3_mcd_db"] for q in mine)
        duration = sum(o.duration_s for o in out) / sum(a.duration_s for a in ref)
        speedup = statistics.median(speedups)
        # The Coqui model here has random weights: its "speech" is noise, which MP3 renders
        # badly and int8 barely changes, so its distances say nothing about a trained voice's.
        judged = name == "piper"
        decisions[name] = {
            "weights": "trained (joe)" if judged else "random (LJSpeech-size architecture)",
            "int8_cpu_speedup_median": round(speedup, 3),
            "int8_cpu_speedup_rounds": [round(x, 3) for x in speedups],
            "int8_wall_speedup_median": round(statistics.median(wall_speedups), 3),
            "int8_mcd_db_mean": round(mcd, 3),
            "mcd_bound_db (mp3 of fp32, mean)": round(bound, 3),
            "voice_noise_mcd_db_mean": round(
                statistics.mean(q["voice_noise_mcd_db"] for q in mine), 3
            ),
            "int8_duration_ratio": round(duration, 4),
            "int8_as_default": (
                bool(
                    speedup >= DEFAULT_SPEEDUP
                    and mcd <= bound
                    and abs(duration - 1.0) <= DURATION_TOLERANCE
                )
                if judged
                else None
            ),
            "why": (
                "speedup >= 1.3, MCD <= the MP3 bound and duration within 1% all needed"
                if judged
                else "random weights: the speed holds, the audio distances mean nothing"
            ),
            "int8_describe": dict(int8.describe()),
        }
    return {"rows": rows, "quality": quality, "decision": decisions}


def plot_precision(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    rows = report["rows"]
    labels = [f"{r['engine']}\n{r['precision']}" for r in rows]
    colors = ["tab:blue" if r["precision"] == "fp32" else "tab:orange" for r in rows]
    ax1.bar(range(len(rows)), [r["cpu_s_per_audio_s"] for r in rows], color=colors)
    ax1.set_xticks(range(len(rows)), labels)
    ax1.set_ylabel("CPU s per synthesized s (1 thread, median of rounds; lower is faster)")
    ax1.set_title("fp32 vs int8, noise off, interleaved rounds")
    q = report["quality"]
    width = 0.27
    xs = np.arange(len(q))
    for j, (key, label) in enumerate(
        (
            ("int8_mcd_db", "int8 vs fp32"),
            ("mp3_mcd_db", "MP3 of fp32 (the bound)"),
            ("voice_noise_mcd_db", "voice noise on vs off"),
        )
    ):
        ax2.bar(xs + (j - 1) * width, [r[key] for r in q], width, label=label)
    ax2.set_xticks(xs, [f"{r['engine'][:5]}\n{TEXTS.index(r['text']) + 1}" for r in q])
    ax2.set_xlabel("engine, text number (coqui: random weights, its distances mean nothing)")
    ax2.set_ylabel("mel-cepstral distortion from fp32, dB")
    ax2.set_title("Distance from fp32 audio (noise off)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main_int8(rounds: int, coqui: bool) -> None:
    provenance()
    started = time.perf_counter()
    report = bench_precision(rounds, coqui)
    for r in report["rows"]:
        print(
            f"{r['engine']:<11} {r['precision']:<5} cpu s/audio s {r['cpu_s_per_audio_s']:.4f} "
            f"audio s per core s {r['audio_s_per_core_s']:.2f}"
        )
    for name, d in report["decision"].items():
        print(name, {k: v for k, v in d.items() if k != "int8_describe"})
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": {"cores": CORES, "platform": platform.platform(), "gpu": None},
        "texts": TEXTS,
        "rounds": rounds,
        "threads_per_engine": 1,
        **report,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    write_results("engines_int8", result)
    plot_precision(report, RESULTS / "engines_int8.png")
    print(f"\nwrote {RESULTS / 'engines_int8.json'} and engines_int8.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-coqui-pool", action="store_true", help="skip the Coqui pool runs")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--int8",
        action="store_true",
        help="only fp32 against int8 (speed, MCD, duration): docs/bench/engines_int8.json",
    )
    parser.add_argument("--no-coqui", action="store_true", help="with --int8: Piper only")
    args = parser.parse_args()
    if args.int8:
        main_int8(args.rounds, coqui=not args.no_coqui)
        return
    provenance()  # the commit and date as the run starts
    started = time.perf_counter()
    print("building / loading the LJSpeech-size random VITS ...", flush=True)
    model, config = ljspeech_vits()
    print("RTF (1 thread, interleaved rounds) ...", flush=True)
    rtf = bench_rtf(model, config, args.rounds)
    print("pool throughput ...", flush=True)
    pools = asyncio.run(
        bench_pools(model, config, coqui=not args.no_coqui_pool, rounds=args.rounds)
    )
    summary = summarize(rtf, pools)

    print(f"\n{'engine':<11} {'mode':<12} {'batch':>5} {'RTF':>7} {'cpuRTF':>7} {'exact':>6}")
    for r in rtf:
        print(
            f"{r['engine']:<11} {r['mode']:<12} {r['batch']:>5} {r['rtf']:>7.3f} "
            f"{r['cpu_rtf']:>7.3f} {r['exact']!s:>6}"
        )
    print(f"\n{'engine':<11} {'workers':>7} {'threads':>7} {'synth/s':>8} {'audio s/s':>9}")
    for r in pools:
        print(
            f"{r['engine']:<11} {r['workers']:>7} {r['threads']:>7} "
            f"{r['syntheses_per_s']:>8.2f} {r['audio_s_per_s']:>9.2f}"
        )
    print()
    for k, v in summary.items():
        print(f"{k:<45} {v:.3f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": {"cores": CORES, "platform": platform.platform(), "gpu": None},
        "texts": TEXTS,
        "rtf": rtf,
        "pool": pools,
        "summary": summary,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    write_results("engines", result)
    plot(rtf, pools, RESULTS / "engines.png")
    print(f"\nwrote {RESULTS / 'engines.json'} and engines.png in {result['runtime_s']}s")


if __name__ == "__main__":
    main()
