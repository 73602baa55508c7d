"""Packaging by need: a base install serves Piper voices without torch or coqui-tts, and a Coqui model
configured without the ``coqui`` extra is a clear start error.

This suite's venv has the extra (the ``dev`` extra includes it), so a base install is simulated: a
``sitecustomize`` on the child's path puts ``None`` in ``sys.modules`` for the extra's packages,
which makes importing them fail and ``importlib.util.find_spec`` report them missing, as when they
are not installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import soundfile as sf

from gateway.runtime.extras import COQUI_INSTALL, check_extras
from gateway.runtime.settings import Settings, SettingsError
from synth.coqui_engine import REQUIRED_MODULES, missing_modules
from tests.ops_support import clean_env, run_cli
from tests.support import shortest_audio_s

SLIM_TEXT = "Hello from a slim install."

ROOT = Path(__file__).resolve().parents[1]
# The heavy packages only the Coqui engine may import (the `coqui` extra's, less `six`, which other
# libraries may use too).
HEAVY = ("torch", "TTS", "torchaudio", "torchcodec", "onnx")
# Modules that exist to run Coqui models: their heavy imports are inside functions, but the gateway
# imports them only when a Coqui model is configured.
COQUI_ONLY = ("synth.coqui_engine", "synth.onnx_layout")


def all_modules() -> list[str]:
    """Every module of the installed packages except ``__main__`` ones (importing them runs them)."""
    names = []
    for pkg in ("gateway", "cache", "metrics", "synth"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def without_coqui_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python processes (workers included) see no ``coqui`` extra."""
    site = tmp_path / "no-coqui"
    site.mkdir()
    # Every finder is told to know nothing of them, as where they are not installed: import
    # fails and find_spec is None, and (unlike a None in sys.modules) a library that looks
    # for them in sys.modules, as scipy's array API layer does for torch, finds them absent.
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"ABSENT = set({REQUIRED_MODULES!r})\n"
        "class Hide:\n"
        "    def __init__(self, inner):\n"
        "        self.inner = inner\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in ABSENT:\n"
        "            return None\n"
        "        return self.inner.find_spec(name, path, target)\n"
        "    def __getattr__(self, attr):\n"
        "        return getattr(self.inner, attr)\n"
        "sys.meta_path[:] = [Hide(f) if hasattr(f, 'find_spec') else f for f in sys.meta_path]\n"
    )
    return clean_env(PYTHONPATH=f"{site}:{ROOT}")


def test_importing_server_and_cli_loads_no_torch() -> None:
    code = textwrap.dedent(
        f"""
        import importlib, json, sys
        for name in {[m for m in all_modules() if m not in COQUI_ONLY]!r}:
            importlib.import_module(name)
        print(json.dumps(sorted(sys.modules)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = set(json.loads(out.stdout))
    assert {"gateway.http.app", "gateway.cli.main", "synth.piper_engine"} <= loaded
    # The check is not vacuous: the venv has every heavy package, so only laziness keeps them out.
    assert missing_modules() == []
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in COQUI_ONLY)
    assert heavy == []


def test_every_module_imports_without_the_extra(tmp_path: Path) -> None:
    # The Coqui-only modules too: they import torch and TTS inside the functions that need them.
    code = f"import importlib\nfor n in {all_modules()!r}:\n    importlib.import_module(n)\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=without_coqui_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    check_extras(settings.replace(coqui_model="/m/model.pth"))  # installed here: no error
    monkeypatch.setitem(sys.modules, "TTS", None)
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert missing_modules() == ["TTS", "onnx"]
    check_extras(settings)  # no Coqui model configured: nothing needed
    with pytest.raises(SettingsError) as err:
        check_extras(settings.replace(coqui_model="/m/model.pth"))
    message = str(err.value)
    assert "'coqui' extra" in message and COQUI_INSTALL in message
    assert "missing: TTS, onnx" in message


def test_serve_with_coqui_but_no_extra_is_a_start_error(tmp_path: Path) -> None:
    args = ("serve", "--port", "0", "--cache-dir", str(tmp_path / "cache"))
    env = without_coqui_env(tmp_path)
    for extra in ((), ("--workers", "2")):
        out = run_cli(
            *args,
            *extra,
            "--coqui-model",
            "tts_models/en/ljspeech/vits",
            env=env,
            timeout=60,
        )
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr
        assert out.stderr.strip() == (
            "voxgate: setting 'coqui_model': the Coqui engine needs the 'coqui' extra, which is "
            "not installed here (missing: TTS, torch, torchaudio, torchcodec, six, onnx): "
            "pip install 'voxgate[coqui]'"
        )
    assert not (tmp_path / "cache").exists()  # refused before anything started


def test_say_with_coqui_but_no_extra_is_a_start_error(tmp_path: Path) -> None:
    out = run_cli(
        "say",
        "Hello.",
        "-o",
        str(tmp_path / "a.wav"),
        "--cache-dir",
        str(tmp_path / "cache"),
        env={**without_coqui_env(tmp_path), "VOXGATE_COQUI_MODEL": "tts_models/en/ljspeech/vits"},
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert COQUI_INSTALL in out.stderr


def test_piper_speaks_without_the_extra(tmp_path: Path) -> None:
    wav = tmp_path / "hello.wav"
    out = run_cli(
        "say",
        SLIM_TEXT,
        "-o",
        str(wav),
        "--cache-dir",
        str(tmp_path / "c"),
        env=without_coqui_env(tmp_path),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cache"] == "miss"
    audio, rate = sf.read(wav)
    assert rate == 22050 and len(audio) / rate >= shortest_audio_s(SLIM_TEXT)


def test_dev_extra_installs_everything() -> None:
    # `bash .ci/install` installs `.[dev]`: the whole suite needs the Coqui extra (its engine
    # tests), the bench extra (the seed baseline the bench smoke tests start) and the clients extra
    # (the real client libraries the compatibility tests drive), the openai extra (the upstream
    # client of kind "openai" the upstream tests run), the polly extra (botocore's signer,
    # which the tests of kind "polly" check signatures with) and the asr extra (pocketsphinx, the
    # take checks' recognizer).
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    selves = [d for d in project["optional-dependencies"]["dev"] if d.startswith("voxgate[")]
    assert len(selves) == 1
    assert set(selves[0][len("voxgate[") : -1].split(",")) == {
        "coqui",
        "bench",
        "clients",
        "openai",
        "polly",
        "asr",
    }
    heavy = ("torch", "torchaudio", "torchcodec", "coqui-tts", "onnx", "six")
    names = {re.split(r"[=<>~;\[ ]", d)[0] for d in project["dependencies"]}
    assert names.isdisjoint(heavy)
    coqui = {re.split(r"[=<>~;\[ ]", d)[0]: d for d in project["optional-dependencies"]["coqui"]}
    assert set(coqui) == set(heavy)
    # pinned: an exact release or a bounded range, never a bare name
    assert all(re.search(r"==|<", spec) for spec in coqui.values()), coqui


def test_the_voxgate_command_is_installed_and_runs() -> None:
    """The installed ``voxgate`` console script names a callable that exists (a stale entry point,
    such as one naming a module that became a package, fails here, not on a user's machine)."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="voxgate")
    assert callable(script.load()), script.value
    exe = Path(sys.executable).with_name("voxgate")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "serve" in out.stdout and "warm" in out.stdout
