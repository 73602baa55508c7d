"""``voxgate tune``: splits measured, the fastest written to the config file, which
``voxgate config show`` then reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gateway.cli.tune import Measurement, best_for, splits, table, write_config
from tests.ops_support import ROOT, clean_env, run_cli


def test_splits_use_every_core_plus_one_by_one() -> None:
    assert splits(1) == [(1, 1)]
    assert splits(2) == [(1, 1), (1, 2), (2, 1)]
    assert splits(4) == [(1, 1), (1, 4), (2, 2), (4, 1)]
    assert splits(4, max_processes=2) == [(1, 1), (1, 4), (2, 2)]


def test_best_is_the_fastest_of_the_default_model() -> None:
    results = [
        Measurement("piper", 1, 2, 30, 10.0, 90.0),
        Measurement("piper", 2, 1, 40, 10.0, 120.0),
        Measurement("coqui", 1, 2, 9, 10.0, 20.0),
    ]
    assert best_for(results, "piper") is results[1]
    assert best_for(results, "coqui") is results[2]
    assert best_for(results, "absent") is results[1]  # the first model measured
    rows = table(results, results[1]).splitlines()
    assert rows[3] == "| piper | 2 | 1 | 4.00 | 12.0 | yes |"


def test_write_config_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    fresh = tmp_path / "new" / "voxgate.toml"
    write_config(fresh, {"synth_workers": 2, "intra_op_threads": 1})
    assert tomllib.loads(fresh.read_text()) == {"synth_workers": 2, "intra_op_threads": 1}

    table_file = tmp_path / "table.toml"
    table_file.write_text('[voxgate]\nport = 9000 # mine\nsynth_workers = 5\n\n[other]\nx = "y"\n')
    write_config(table_file, {"synth_workers": 2, "intra_op_threads": 1})
    text = table_file.read_text()
    assert "port = 9000 # mine" in text
    assert tomllib.loads(text) == {
        "voxgate": {"port": 9000, "synth_workers": 2, "intra_op_threads": 1},
        "other": {"x": "y"},
    }

    top = tmp_path / "top.toml"
    top.write_text("log_level = 'debug'\nintra_op_threads = 4\n")
    write_config(top, {"synth_workers": 3, "intra_op_threads": 1})
    assert tomllib.loads(top.read_text()) == {
        "log_level": "debug",
        "synth_workers": 3,
        "intra_op_threads": 1,
    }


@pytest.mark.slow
def test_tune_writes_what_config_show_then_reports(tmp_path: Path) -> None:
    toml = tmp_path / "voxgate.toml"
    toml.write_text('[voxgate]\nlog_format = "text"\n')
    res = run_cli(
        "tune",
        "--config",
        str(toml),
        # A split's share of the time only bounds its measuring: each of its processes makes
        # one synthesis at least, so a rate is measured however short the share.
        "--seconds",
        "0.3",
        "--cache-dir",
        str(tmp_path / "cache"),
        env=clean_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    chosen = [ln for ln in res.stdout.splitlines() if ln.endswith("| yes |")]
    assert len(chosen) == 1, res.stdout
    _, model, processes, threads, rate, _, _ = [c.strip() for c in chosen[0].split("|")[:7]]
    assert model == "piper" and float(rate) > 0
    assert "tuning" in res.stderr  # the progress bar
    assert f"wrote synth_workers = {processes}, intra_op_threads = {threads}" in res.stdout
    measured = [ln for ln in res.stdout.splitlines() if re.match(r"\| piper \| \d", ln)]
    assert len(measured) >= 2  # more than one split was measured

    shown = run_cli("config", "show", "--config", str(toml), env=clean_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr
    settings = json.loads(shown.stdout)
    assert settings["synth_workers"] == int(processes)
    assert settings["intra_op_threads"] == int(threads)
    assert settings["log_format"] == "text"  # what the file held before stays


@pytest.mark.slow
def test_tune_creates_the_config_file_the_readme_names(tmp_path: Path) -> None:
    """``voxgate tune --config voxgate.toml`` as README.md writes it, on a machine where the file
    does not exist yet: it is created (not refused as a missing config file)."""
    assert not (tmp_path / "voxgate.toml").exists()
    env = clean_env(PYTHONPATH=str(ROOT))  # this tree's gateway, run from another directory
    tune = ["tune", "--config", "voxgate.toml", "--seconds", "0.2", "--max-processes", "1"]
    res = subprocess.run(
        [sys.executable, "-m", "gateway", *tune, "--cache-dir", str(tmp_path / "cache")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    written = tomllib.loads((tmp_path / "voxgate.toml").read_text(encoding="utf-8"))
    assert set(written) == {"synth_workers", "intra_op_threads"}
    assert written["synth_workers"] == 1  # --max-processes 1
    assert f"intra_op_threads = {written['intra_op_threads']} to voxgate.toml" in res.stdout
