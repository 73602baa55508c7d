"""The hit or miss path of this tree against an older commit's, side by side in one run.

An older commit's gateway (checked out beside this tree as a detached git worktree) and this
tree's gateway are each measured by this tree's ``bench.hit_path`` or ``bench.miss_path`` (same
load generator, same baselines, same figures), in pairs run in alternating order (old, new, then
new, old, ...), so
machine drift hits both sides alike. Each run compares its gateway with baselines it runs beside
(the same code on both sides), so what is compared across the commits are ratios that neighbours
move least:

- ``--bench hit_path``: ``ratio`` (gateway requests/s over the bare aiohttp server's, median of
  its rounds) and ``cpu_ratio_bare_over_gateway`` (the bare server's CPU time per request over
  the gateway's), per workload;
- ``--bench miss_path``: the gateway's throughput over the seed service tuned like it
  (``vs_seed_tuned``) and over this tree's engine pool driven without HTTP (``vs_pool_direct``),
  each as the median of per-round ratios;
- ``--bench vs_nginx``: the gateway's warm requests/s over nginx proxy_cache's in front of the
  seed service (``warm_qps_ratio``), per variant (GET or POST key, wrk threads).

The figure of merit is new/old of each (>= 0.95: this tree costs at most 5% more). Arguments
after ``--`` go to every run of the bench (``--no-write`` and ``--json-out`` are added).

    python -m bench.vs_commit --commit d2ff336 --pairs 2 -- --keys 100 --key-rpm 1000000000 --no-zipf
    python -m bench.vs_commit --commit d2ff336 --bench miss_path --pairs 2 -- --rounds 2
    python -m bench.vs_commit --commit 755c020 --bench vs_nginx --pairs 2 -- --cold-s 5 --warm-s 16

Writes ``docs/bench/<bench>_vs_<commit>[_keys].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import bar_plot, provenance, write_results
from bench.harness import ROOT

# Per bench: the figures compared, read from each group of its --json-out (a workload, a baseline).
FIGURES = {
    "hit_path": ("ratio", "cpu_ratio_bare_over_gateway"),
    "miss_path": ("throughput_ratio_median_of_rounds",),
    "vs_nginx": ("warm_qps_ratio",),
}


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def run_side(bench: str, tree: Path | None, bench_args: list[str], out: Path) -> dict[str, Any]:
    """One run of ``bench`` with ``tree``'s gateway (None: this tree's); its figures."""
    env = dict(os.environ)
    env.pop("VOXGATE_BENCH_TREE", None)
    if tree is not None:
        env["VOXGATE_BENCH_TREE"] = str(tree)
    cmd = [
        sys.executable,
        "-m",
        f"bench.{bench}",
        *bench_args,
        "--no-write",
        "--json-out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> int:
    argv = sys.argv[1:]
    bench_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, bench_args = argv[:at], argv[at + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", required=True, help="the older commit to compare with")
    ap.add_argument("--bench", choices=sorted(FIGURES), default="hit_path")
    ap.add_argument("--pairs", type=int, default=2, help="old/new pairs, order alternating")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/bench results")
    args = ap.parse_args(argv)
    base = git("rev-parse", "--short", args.commit)
    provenance()  # this tree's commit and the date, as the run starts

    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), base)
        try:
            for pair in range(args.pairs):
                order = ("old", "new") if pair % 2 == 0 else ("new", "old")
                for side in order:
                    print(f"== pair {pair + 1}/{args.pairs}: {side}", flush=True)
                    out = Path(tmp) / f"{side}-{pair}.json"
                    old_tree = tree if side == "old" else None
                    runs[side].append(run_side(args.bench, old_tree, bench_args, out))
        finally:
            git("worktree", "remove", "--force", str(tree))

    workloads = [w for w in sorted(runs["new"][0]) if w != "vs_seed_fastapi"]
    figures = FIGURES[args.bench]
    summary: dict[str, dict[str, Any]] = {}
    print(
        f"\n{args.bench}, {base} (old) vs this tree (new), {args.pairs} pairs; args: {bench_args}"
    )
    print(f"{'workload':<10}{'figure':<30}{'old':>8}{'new':>8}{'new/old':>9}")
    for w in workloads:
        summary[w] = {}
        for fig in figures:
            old = statistics.mean(r[w][fig] for r in runs["old"])
            new = statistics.mean(r[w][fig] for r in runs["new"])
            summary[w][fig] = {
                "old_per_run": [r[w][fig] for r in runs["old"]],
                "new_per_run": [r[w][fig] for r in runs["new"]],
                "old_mean": old,
                "new_mean": new,
                "new_over_old": new / old,
            }
            print(f"{w:<10}{fig:<30}{old:>8.3f}{new:>8.3f}{new / old:>9.3f}")
    if not args.no_write:
        name = f"{args.bench}_vs_{base}" + ("_keys" if "--keys" in bench_args else "")
        write_results(
            name,
            {
                "benchmark": "vs_commit",
                "bench": args.bench,
                "old_commit": base,
                "pairs": args.pairs,
                "bench_args": bench_args,
                "load_generator": f"as bench.{args.bench} runs it (its docstring)",
                "summary": summary,
                "runs": runs,
            },
        )
        labels, values = [], []
        for w in workloads:
            for fig in figures:
                labels.append(f"{w}\n{fig.split('_')[0]} new/old")
                values.append(summary[w][fig]["new_over_old"])
        bar_plot(
            name,
            f"{args.bench}, this tree over {base} (>= 0.95 wanted)",
            labels,
            values,
            "x",
            target=0.95,
        )
        print(f"wrote docs/bench/{name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
