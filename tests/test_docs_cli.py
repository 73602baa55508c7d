"""The README stays true (settings table, commands) and the CLI works end to end."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from gateway.cli.main import COMMANDS, build_parser
from gateway.runtime.settings import OPENAI_VOICES, Settings, SettingsError, settings_table
from tests.support import shortest_audio_s

ROOT = Path(__file__).resolve().parents[1]


def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_settings_table_matches_settings() -> None:
    text = readme()
    m = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", text, re.S)
    assert m is not None
    assert m.group(1) == settings_table(), (
        "regenerate: python -m gateway.runtime.settings README.md"
    )


def test_ci_runs_the_readme_commands() -> None:
    text, ci = readme(), (ROOT / ".ci" / "run").read_text()
    for command in ("bash .ci/install", ".venv/bin/python -m pytest"):
        assert f"\n{command}\n" in text
        assert f"\n{command}\n" in ci


def test_settings_precedence_and_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "voxgate.toml"
    cfg.write_text('port = 9000\nqueue_size = 5\n[voice_aliases]\nalloy = "amy"\nbob = "joe"\n')
    s = Settings.load(config_file=cfg, env={"VOXGATE_PORT": "9100"}, overrides={"queue_size": "7"})
    assert (s.port, s.queue_size) == (9100, 7)
    # The user's aliases are added to OpenAI's; one of the same name replaces OpenAI's.
    assert s.voice_aliases == {**dict.fromkeys(OPENAI_VOICES, "joe"), "alloy": "amy", "bob": "joe"}
    for env, key in (
        ({"VOXGATE_PORT": "eighty"}, "port"),
        ({"VOXGATE_QUEUE_SIZE": "0"}, "queue_size"),
        ({"VOXGATE_ACCESS_LOG": "maybe"}, "access_log"),
    ):
        try:
            Settings.load(env=env)
        except SettingsError as exc:
            assert key in str(exc)
        else:
            raise AssertionError(f"{env} was accepted")
    bad = tmp_path / "bad.toml"
    bad.write_text("colour = 'blue'\n")
    try:
        Settings.load(config_file=bad, env={})
    except SettingsError as exc:
        assert "colour" in str(exc)
    else:
        raise AssertionError("unknown key accepted")


def cli_command(*args: str, cache: Path) -> list[str]:
    return [sys.executable, "-m", "gateway", *args, "--cache-dir", str(cache)]


def run_cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(*args, cache=cache), cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_say_goes_through_the_store_and_stats_counts(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out.wav"
    text = "Your call is important to us."
    first = run_cli("say", text, "-o", str(out), cache=cache)
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    assert info["cache"] == "miss" and len(info["key"]) == 64
    data, rate = sf.read(out)
    assert rate == 22050 and len(data) / rate >= shortest_audio_s(text)
    second = run_cli("say", "Your  call is important to us. ", "-o", str(out), cache=cache)
    assert json.loads(second.stdout)["cache"] == "hit"
    stats = run_cli("cache", "stats", "--json", cache=cache)
    assert stats.returncode == 0, stats.stderr
    disk = json.loads(stats.stdout)[0]
    assert disk["entries"] == 2 and disk["bytes"] > 0  # the master and the WAV rendition
    bad = run_cli("say", "   ", "-o", str(out), cache=cache)
    assert bad.returncode == 2 and "empty" in bad.stderr


@pytest.mark.slow
def test_a_pin_quota_error_exits_the_same_in_warm_and_rollout(tmp_path: Path) -> None:
    """One error, one exit status in every command (README.md, "Command line")."""
    cache, fresh, pinned = tmp_path / "cache", tmp_path / "fresh.txt", tmp_path / "pinned.txt"
    fresh.write_text("Thank you for calling.\n")
    pinned.write_text("Please hold.\n")
    # The refused warm and the one that pins share nothing but the cache: they run at once.
    refused = subprocess.Popen(
        cli_command("warm", str(fresh), "--pin-quota-mb", "0", cache=cache),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ok = run_cli("warm", str(pinned), cache=cache)
        out, err = refused.communicate(timeout=120)
    finally:
        refused.kill()
        refused.wait()
    warm = subprocess.CompletedProcess(refused.args, refused.returncode, out, err)
    assert ok.returncode == 0, ok.stderr
    rollout = run_cli(
        "rollout", "piper", "--revision", "2", "--quiet", "--pin-quota-mb", "0", cache=cache
    )
    for name, r in (("warm", warm), ("rollout", rollout)):
        assert r.returncode == 2, r.stderr
        assert f"voxgate {name}: pinning this catalogue needs" in r.stderr
        assert "(pin_quota_mb = 0): nothing was pinned" in r.stderr
    assert rollout.stderr.endswith("; the model was not switched\n")


def test_refusals_exit_2_naming_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli.main import main

    sign = ["sign-url", "joe", "Hi.", "wav", "--url-signing-secret", "s", "--expires-in", "0"]
    assert main(sign) == 2
    assert main(["cache", "purge", "--pinned", "--unpinned", "--cache-dir", str(tmp_path)]) == 2
    assert main(["keys", "add", "k", "--scopes", "speak", "--file", str(tmp_path / "a" / "k")]) == 2
    sign_err, purge_err, keys_err = capsys.readouterr().err.splitlines()
    assert sign_err.startswith("voxgate sign-url: --expires-in must be 1 to ")
    assert purge_err == "voxgate cache purge: --pinned and --unpinned exclude each other"
    assert keys_err.startswith("voxgate keys add: ") and "No such file" in keys_err


def test_bad_setting_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    r = run_cli("serve", "--port", "99999", cache=tmp_path)
    assert r.returncode == 2
    assert "'port'" in r.stderr


def test_cache_stats_reports_redis_and_never_prints_its_password(tmp_path: Path) -> None:
    from bench.harness import CACHE_SECRET, free_port, redis_server

    secret = ("--cache-secret", CACHE_SECRET)
    with redis_server(tmp_path / "redis") as redis:
        ok = run_cli(
            "cache", "stats", "--json", "--redis-url", redis.url, *secret, cache=tmp_path / "c"
        )
        assert ok.returncode == 0, ok.stderr
        disk, shared, pins = json.loads(ok.stdout)
        assert disk["tier"] == "disk"
        assert shared["tier"] == "redis" and shared["keys"] == 0
        assert shared["used_memory_bytes"] > 0
        # With Redis the pin registry is Redis's (every replica's): nothing pinned yet.
        assert pins["tier"] == "pins" and pins["registry"] == "redis"
        assert pins["pinned_bytes"] == 0 and pins["owners"] == {}
    down = f"redis://ops:hunter2@127.0.0.1:{free_port()}/0"
    bad = run_cli(
        "cache",
        "stats",
        "--redis-url",
        down,
        *secret,
        "--redis-timeout-ms",
        "300",
        cache=tmp_path / "c",
    )
    assert bad.returncode == 1
    assert "unreachable" in bad.stdout and "ops:***@127.0.0.1" in bad.stdout
    assert "hunter2" not in bad.stdout + bad.stderr


def commands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_a_command_parses_as_under_the_whole_parser() -> None:
    # `voxgate NAME ...` registers only NAME's module; the rest by name, for the usage line.
    whole = build_parser()
    assert list(commands_of(whole)) == list(COMMANDS)
    for name in COMMANDS:
        one = build_parser(name)
        assert one.format_usage() == whole.format_usage()
        assert list(commands_of(one)) == list(COMMANDS)
        assert commands_of(one)[name].format_help() == commands_of(whole)[name].format_help()


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys\n"
        "from gateway.cli.main import main\n"
        "try:\n"
        "    main(['config', 'show', '--help'])\n"
        "except SystemExit:\n"
        "    print(sorted(m for m in sys.modules if m.startswith('gateway.cli.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.splitlines()[-1]  # after the command's help
    assert loaded == str(["gateway.cli.common", "gateway.cli.config", "gateway.cli.main"])
