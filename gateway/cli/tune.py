"""``voxgate tune``: measure this machine's synthesis split, write the best one to the config file.

See docs/deploy.md ("voxgate tune: measure this machine").
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gateway.cli.common import add_setting_flags, command, load_settings, quiet_logging
from gateway.runtime.settings import CONFIG_ENV, Settings, SettingsError
from gateway.runtime.topology import usable_cores

# Short, different IVR sentences: what a cache-miss synthesis usually is.
SENTENCES = (
    "Thank you for calling, your call is important to us.",
    "Press one for billing, or two for technical support.",
    "Your order has shipped and will arrive on Tuesday.",
    "Please hold while we connect you to the next available agent.",
    "Your appointment is confirmed for nine thirty tomorrow morning.",
)


@dataclass(frozen=True)
class Measurement:
    """One engine x processes x threads split and what it did."""

    model: str
    processes: int
    threads: int
    syntheses: int
    seconds: float
    audio_s: float

    @property
    def rate(self) -> float:
        """Syntheses per second."""
        return self.syntheses / self.seconds if self.seconds > 0 else 0.0


def splits(cores: int, max_processes: int | None = None) -> list[tuple[int, int]]:
    """``(processes, threads)`` splits to measure: every one that uses all ``cores``, and 1 x 1."""
    out = {(1, 1)}
    for p in range(1, cores + 1):
        if cores % p == 0 and (max_processes is None or p <= max_processes):
            out.add((p, cores // p))
    return sorted(out)


async def measure(
    settings: Settings, model: str, processes: int, threads: int, seconds: float
) -> Measurement:
    """Run a pool of ``processes`` x ``threads`` for ``model`` busy for ``seconds``."""
    from gateway.runtime.components import default_engine_specs
    from metrics import Metrics
    from synth.engine import SynthesisItem
    from synth.pool import LogSetup, WorkerPool

    split = settings.replace(synth_workers=processes, intra_op_threads=threads)
    specs = (await asyncio.to_thread(default_engine_specs, split))[model]
    meta = await asyncio.to_thread(specs[0].build)
    # The workers' own INFO lines (voices loaded) would break up the progress bar.
    quiet = LogSetup("gateway.runtime.logs:configure_logging", {"level": "warning", "fmt": "text"})
    pool = WorkerPool(model, meta, specs[:processes], Metrics(), threads=threads, log_setup=quiet)
    voice = meta.voices()[0].name
    params = dict(meta.default_params(voice))
    items = itertools.cycle([SynthesisItem(text, voice, 1.0, params) for text in SENTENCES])
    done = 0
    audio_s = 0.0
    try:
        await pool.start()
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()

        async def keep_busy() -> None:
            nonlocal done, audio_s
            while time.perf_counter() < deadline:
                (audio,) = await pool.run_batch([next(items)])
                done += 1
                audio_s += audio.duration_s

        await asyncio.gather(*(keep_busy() for _ in range(processes)))
        elapsed = time.perf_counter() - started
    finally:
        await pool.close()
    return Measurement(model, processes, threads, done, elapsed, audio_s)


async def tune(settings: Settings, seconds: float, max_processes: int | None) -> list[Measurement]:
    """Measure every split of every configured model, with a progress bar on stderr."""
    from gateway.runtime.components import default_engine_specs

    models = list(await asyncio.to_thread(default_engine_specs, settings))
    candidates = [(m, p, t) for m in models for p, t in splits(usable_cores(), max_processes)]
    share = seconds / len(candidates)
    results: list[Measurement] = []
    with tqdm(total=len(candidates), desc="tuning", unit="split", file=sys.stderr) as bar:
        for model, p, t in candidates:
            bar.set_postfix_str(f"{model} {p} process(es) x {t} thread(s)")
            results.append(await measure(settings, model, p, t, share))
            bar.update(1)
    return results


def best_for(results: list[Measurement], model: str) -> Measurement:
    """The fastest split measured for ``model`` (the first model's when it was not measured)."""
    mine = [r for r in results if r.model == model] or [
        r for r in results if r.model == results[0].model
    ]
    return max(mine, key=lambda r: (r.rate, -r.processes * r.threads))


def table(results: list[Measurement], best: Measurement) -> str:
    """The measurements as a Markdown table, the chosen split marked."""
    rows = [
        "| model | processes | threads | syntheses/s | audio s per s | chosen |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.model} | {r.processes} | {r.threads} | {r.rate:.2f} | "
            f"{r.audio_s / r.seconds if r.seconds else 0:.1f} | {'yes' if r is best else ''} |"
        )
    return "\n".join(rows)


def write_config(path: Path, values: dict[str, int]) -> None:
    """Set ``values`` in the TOML file at ``path``, keeping everything else in it.

    The keys go where the file keeps its settings (a ``[voxgate]`` table, else the top level); a
    line that sets one of them is replaced in place. The result is parsed again before it
    replaces the file, so a file voxgate cannot read is never left behind.
    """
    from gateway.speech.export import write_atomically

    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    data = tomllib.loads(text) if text else {}
    lines = text.splitlines()
    in_table = isinstance(data.get("voxgate"), dict)
    start = 0
    if in_table:
        start = next(i for i, ln in enumerate(lines) if re.match(r"\s*\[voxgate\]\s*(#.*)?$", ln))
        start += 1
    end = next((i for i in range(start, len(lines)) if re.match(r"\s*\[", lines[i])), len(lines))
    while end > start and not lines[end - 1].strip():
        end -= 1  # new keys go after the region's last setting, not after its blank lines
    pending = dict(values)
    for i in range(start, end):
        m = re.match(r"\s*([A-Za-z0-9_]+)\s*=", lines[i])
        if m and m.group(1) in pending:
            lines[i] = f"{m.group(1)} = {pending.pop(m.group(1))}"
    added = [f"{k} = {v}" for k, v in pending.items()]
    if added and not text:
        added.insert(0, "# Written by `voxgate tune`: the measured-fastest synthesis split.")
    lines[end:end] = added
    new_text = "\n".join(lines) + "\n"
    parsed = tomllib.loads(new_text)
    table_ = parsed["voxgate"] if in_table else parsed
    assert all(table_[k] == v for k, v in values.items()), "config rewrite lost a value"
    write_atomically(path, new_text.encode("utf-8"))


def cmd_tune(args: argparse.Namespace) -> int:
    # The file tune writes may not exist yet (README: `voxgate tune --config voxgate.toml` on a
    # fresh machine): it is then created, with its directory.
    settings = load_settings(args, creates_config=True)
    quiet_logging(settings)
    target = Path(args.config or os.environ.get(CONFIG_ENV) or "voxgate.toml")
    results = asyncio.run(tune(settings, args.seconds, args.max_processes))
    best = best_for(results, settings.default_model)
    print(table(results, best))
    if args.dry_run:
        return 0
    values = {"synth_workers": best.processes, "intra_op_threads": best.threads}
    try:
        write_config(target, values)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"config file {target}: {exc}") from None
    print(
        f"wrote synth_workers = {best.processes}, intra_op_threads = {best.threads} to {target}"
        + ("" if args.config or os.environ.get(CONFIG_ENV) else f" (serve with --config {target})")
    )
    return 0


def add_command(sub: Any) -> None:
    """Register ``tune``."""
    tune_ = command(
        sub,
        "tune",
        cmd_tune,
        "Measure synthesis processes x threads on this machine and write the fastest "
        "split to the config file (--config, $VOXGATE_CONFIG, else ./voxgate.toml).",
    )
    tune_.add_argument(
        "--seconds", type=float, default=60.0, help="Measuring time in all (default 60)."
    )
    tune_.add_argument(
        "--max-processes", type=int, default=None, help="Most synthesis processes to try."
    )
    tune_.add_argument("--dry-run", action="store_true", help="Print the table; write nothing.")
    add_setting_flags(tune_)
