"""``auto`` process and thread counts: resolved from the cores and devices, explained."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.runtime.settings import Settings, SettingsError
from gateway.runtime.topology import cpu_quota, resolve_topology, usable_cores


def test_defaults_are_auto_and_fill_the_cores_with_one_thread_per_synthesis_process() -> None:
    s = Settings.load(env={})
    assert (s.workers, s.synth_workers, s.intra_op_threads) == ("auto", "auto", "auto")
    for cores in (1, 2, 8):
        t = s.topology(cores)
        # One gateway process per core, all sharing the host's one pool of one process per core.
        assert (t.gateway_processes, t.synth_workers, t.intra_op_threads) == (cores, cores, 1)
        assert t.cores == cores
        text = t.describe()
        assert f"{cores} synthesis processes per model" in text
        assert "measured fastest for Piper" in text  # the start log says why
    assert s.topology().cores == usable_cores()


def test_cuda_auto_is_one_synthesis_process_per_device() -> None:
    s = Settings.load(env={}, overrides={"devices": "cuda:0,cuda:1"})
    t = s.topology(16)
    assert t.synth_workers == 2
    assert t.intra_op_threads == 8
    assert "per CUDA device" in t.describe()


def test_given_numbers_are_kept_and_not_explained() -> None:
    s = Settings.load(
        env={"VOXGATE_SYNTH_WORKERS": "3", "VOXGATE_INTRA_OP_THREADS": "2"},
        overrides={"workers": "2"},
    )
    t = s.topology(8)
    assert (t.gateway_processes, t.synth_workers, t.intra_op_threads) == (2, 3, 2)
    assert t.reasons == ()
    assert t.describe().endswith("on 8 core(s)")  # nothing chosen, nothing to explain


def test_in_process_engines_share_the_cores_between_their_threads() -> None:
    t = resolve_topology(
        workers=1, synth_workers=0, intra_op_threads=0, synth_threads=2, devices=("cpu",), cores=8
    )
    assert (t.synth_workers, t.intra_op_threads) == (0, 4)
    assert "engines in gateway threads" in t.describe()


def test_gateway_processes_share_one_pool_and_in_process_engines_stay_in_one() -> None:
    t = resolve_topology(
        workers=2,
        synth_workers="auto",
        intra_op_threads="auto",
        synth_threads=1,
        devices=("cpu",),
        cores=8,
    )
    # One pool per host whatever the gateway processes: it takes the cores, not a share of them.
    assert (t.gateway_processes, t.synth_workers, t.intra_op_threads) == (2, 8, 1)
    t = resolve_topology(
        workers="auto",
        synth_workers=0,
        intra_op_threads="auto",
        synth_threads=1,
        devices=("cpu",),
        cores=8,
    )
    # Engines in gateway threads would load once per process: one gateway process then.
    assert (t.gateway_processes, t.synth_workers, t.intra_op_threads) == (1, 0, 8)
    assert "engines in-process" in t.describe()


def test_auto_in_toml_and_bad_values_name_the_key(tmp_path: Path) -> None:
    toml = tmp_path / "voxgate.toml"
    toml.write_text('synth_workers = "auto"\nintra_op_threads = 1\nworkers = 1\n')
    s = Settings.load(config_file=toml, env={})
    assert (s.synth_workers, s.intra_op_threads, s.workers) == ("auto", 1, 1)
    for key, value in (("synth_workers", "many"), ("workers", "0"), ("intra_op_threads", "-1")):
        with pytest.raises(SettingsError, match=key):
            Settings.load(env={}, overrides={key: value})
    toml.write_text("synth_workers = true\n")
    with pytest.raises(SettingsError, match="boolean"):
        Settings.load(config_file=toml, env={})


def test_a_cgroup_cpu_limit_bounds_the_cores() -> None:
    assert cpu_quota("max 100000") is None
    assert cpu_quota("200000 100000") == 2
    assert cpu_quota("150000 100000") == 2  # 1.5 CPUs: two processes, each mostly busy
    assert cpu_quota("50000 100000") == 1
    assert cpu_quota("garbage") is None
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))
