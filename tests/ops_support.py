"""A real ``python -m gateway serve`` subprocess for the operations tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import free_port, serve_command
from tests import canary

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any voxgate or multiprocess-metrics settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("VOXGATE_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """Run ``python -m gateway ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class ServerProcess:
    """``voxgate serve`` on a free loopback port; stdout and stderr captured to one file."""

    def __init__(self, directory: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "server.log"
        directory.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            serve_command(self.port, directory / "cache", *args),
            cwd=ROOT,
            env=env if env is not None else clean_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                status, body = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        canary.note(f"the body of GET {self.url}{path}", body)
        return status, body

    def wait_ready(self, workers: int = 1, timeout: float = 180) -> None:
        """Until /readyz answers 200 and ``workers`` processes logged that they are ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.logs()}")
            ready = self.logs().count("voxgate ready on")
            try:
                status, _ = self.get("/readyz")
            except OSError:
                status = 0
            if status == 200 and ready >= workers:
                return
            # Finely: every test that starts a server waits here, up to one interval past ready.
            time.sleep(0.05)
        raise TimeoutError(f"server not ready:\n{self.logs()}")

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200
        return body.decode()

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM and wait for the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the server (if it runs), and fail where its log shows a canary secret
        (tests/canary.py) and the running test does not allow one."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if self._log.closed:
            return
        self._log.close()
        shown = canary.found(self.log_path.read_bytes())
        if shown and not canary.allowed:
            raise AssertionError(f"a canary secret in the log of voxgate serve: {shown}")

    def json_lines(self) -> list[dict[str, Any]]:
        """Every log line parsed as JSON (fails on any line that is not)."""
        return [json.loads(line) for line in self.logs().splitlines() if line.strip()]
