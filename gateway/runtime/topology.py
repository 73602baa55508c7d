"""How many processes and threads this host runs: the ``auto`` settings resolved at start.

The rules and the measurements they follow (docs/bench/engines.json): docs/deploy.md ("Process and
thread counts: auto").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

AUTO: Literal["auto"] = "auto"


# cgroup v2's CPU bandwidth limit of this process's group (a container's `--cpus`, a Kubernetes
# CPU limit): "max 100000" when unlimited, else "<quota> <period>" in microseconds.
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cpu_quota(text: str) -> int | None:
    """Whole cores a cgroup v2 ``cpu.max`` line allows (rounded up), None when unlimited."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (a container's cpuset), bounded by a
    cgroup v2 CPU limit (a pod's CPU limit leaves every core in the affinity mask), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    try:
        quota = cpu_quota(CGROUP_CPU_MAX.read_text())
    except OSError:  # no cgroup v2 CPU controller here: the affinity is all there is
        quota = None
    return max(1, min(cores, quota) if quota is not None else cores)


@dataclass(frozen=True)
class Topology:
    """The resolved process and thread counts, with the reason for each one chosen by ``auto``."""

    gateway_processes: int
    synth_workers: int  # synthesis processes per model; 0: engines run in gateway threads
    intra_op_threads: int  # ONNX Runtime / torch threads per engine
    cores: int
    reasons: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the start log: the numbers, then why."""
        pool = (
            f"{self.synth_workers} synthesis processes per model"
            if self.synth_workers
            else "engines in gateway threads"
        )
        line = (
            f"{self.gateway_processes} gateway process(es), {pool}, "
            f"{self.intra_op_threads} intra-op thread(s) per engine on {self.cores} core(s)"
        )
        return f"{line} ({'; '.join(self.reasons)})" if self.reasons else line


def resolve_topology(
    *,
    workers: int | Literal["auto"],
    synth_workers: int | Literal["auto"],
    intra_op_threads: int | Literal["auto"],
    synth_threads: int,
    devices: Sequence[str],
    cores: int | None = None,
) -> Topology:
    """Resolve the ``auto`` counts for ``cores`` (default: :func:`usable_cores`)."""
    cores = usable_cores() if cores is None else max(1, cores)
    cuda = any(d.startswith("cuda") for d in devices)
    reasons: list[str] = []

    if synth_workers == AUTO:
        if cuda:
            pool = len(devices)
            reasons.append(f"synthesis processes auto: {pool}, one per CUDA device")
        else:
            pool = cores
            reasons.append(
                f"synthesis processes auto: {pool}, one per core (processes x 1 thread measured "
                "fastest for Piper on CPU)"
            )
    elif synth_workers and cuda:
        pool = len(devices)  # the pool always runs one worker per GPU
    else:
        pool = synth_workers

    if workers == AUTO:
        # With synthesis in worker processes, the host runs one pool shared by every gateway
        # process, so more gateway processes cost HTTP memory only and spread the hits over the
        # cores; engines in gateway threads would be loaded once per process instead.
        gateway = cores if pool else 1
        reasons.append(
            f"gateway processes auto: {gateway}"
            + (", one per core sharing one synthesis pool" if pool else " (engines in-process)")
        )
    else:
        gateway = workers

    if intra_op_threads == AUTO or intra_op_threads == 0:
        # One pool per host: its engines share the cores; in-process engines are per gateway.
        share = pool if pool else gateway * synth_threads
        threads = max(1, cores // max(1, share))
        if intra_op_threads == AUTO:
            reasons.append(f"intra-op threads auto: {threads} = cores / engines running at once")
    else:
        threads = intra_op_threads
    return Topology(gateway, pool, threads, cores, tuple(reasons))
