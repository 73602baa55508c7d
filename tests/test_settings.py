"""Settings on pydantic-settings: layers, error messages, secrets, aliases and groups."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.harness import CACHE_SECRET
from gateway.cli.common import add_setting_flags
from gateway.cli.main import main
from gateway.runtime.settings import (
    GROUPS,
    OPENAI_MODELS,
    OPENAI_VOICES,
    Settings,
    SettingsError,
)
from tests.conftest import GatewayFactory


def test_each_layer_is_named_in_the_error(tmp_path: Path) -> None:
    cfg = tmp_path / "voxgate.toml"
    cfg.write_text("[voxgate]\nworkers = 65\n")
    with pytest.raises(SettingsError, match=rf"'workers' \(from {cfg}\): .*64"):
        Settings.load(config_file=cfg, env={})
    with pytest.raises(SettingsError, match=r"'workers' \(from VOXGATE_WORKERS\)"):
        Settings.load(config_file=cfg, env={"VOXGATE_WORKERS": "0"})
    with pytest.raises(SettingsError, match=r"'workers' \(from --workers\)"):
        Settings.load(config_file=cfg, env={"VOXGATE_WORKERS": "2"}, overrides={"workers": "99"})
    # A good value from a higher layer hides the bad one below it.
    assert Settings.load(config_file=cfg, env={"VOXGATE_WORKERS": "2"}).workers == 2


def test_file_problems_stop_the_start(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="no such file"):
        Settings.load(config_file=tmp_path / "missing.toml", env={})
    broken = tmp_path / "broken.toml"
    broken.write_text("port = \n")
    with pytest.raises(SettingsError, match="config file"):
        Settings.load(env={"VOXGATE_CONFIG": str(broken)})
    boolean = tmp_path / "bool.toml"
    boolean.write_text("port = true\n")  # pydantic alone would take it as 1
    with pytest.raises(SettingsError, match=r"'port'.*boolean"):
        Settings.load(config_file=boolean, env={})


def test_comma_forms_of_env_and_flags_and_lists_in_toml(tmp_path: Path) -> None:
    s = Settings.load(
        env={"VOXGATE_DEVICES": "cuda:0, cuda:1", "VOXGATE_PORT": ""},  # empty: not set
        overrides={"piper_voices": "joe,amy=/m/amy.onnx", "access_log": "off"},
    )
    assert s.devices == ("cuda:0", "cuda:1") and s.port == 8080
    assert s.piper_voices == ("joe", "amy=/m/amy.onnx") and s.access_log is False
    cfg = tmp_path / "voxgate.toml"
    cfg.write_text('devices = ["cpu"]\nlog_level = "DEBUG"\ncache_dir = "~/vg"\n')
    t = Settings.load(config_file=cfg, env={})
    assert t.devices == ("cpu",) and t.log_level == "debug"
    assert t.cache_dir == Path.home() / "vg"
    with pytest.raises(SettingsError, match=r"'devices'.*'cuda:x'"):
        Settings.load(env={"VOXGATE_DEVICES": "cpu,cuda:x"})


def test_code_built_settings_ignore_the_process_environment(
    monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    monkeypatch.setenv("VOXGATE_QUEUE_SIZE", "3")
    assert settings.replace(port=1).queue_size == 64
    assert Settings().queue_size == 64
    assert Settings.load().queue_size == 3  # load() reads os.environ by default
    with pytest.raises(SettingsError, match="'queue_size'"):
        settings.replace(queue_size=0)


def test_redis_url_is_a_secret_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    url = "redis://ops:hunter2@127.0.0.1:6379/0"
    s = Settings.load(env={"VOXGATE_REDIS_URL": url, "VOXGATE_CACHE_SECRET": CACHE_SECRET})
    assert s.redis_url.get_secret_value() == url
    assert "hunter2" not in repr(s) + str(s) + json.dumps(s.shown())
    with pytest.raises(SettingsError, match="'redis_url'") as bad:
        Settings.load(env={}, overrides={"redis_url": "http://ops:hunter2@h:6379"})
    assert "hunter2" not in str(bad.value)
    flags = ["--redis-url", url, "--cache-secret", CACHE_SECRET, "--cache-dir", "/tmp/x"]
    assert main(["config", "show", *flags]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["redis_url"] == "****" and shown["cache_dir"] == "/tmp/x"
    assert shown["cache_secret"] == "****"
    assert CACHE_SECRET not in repr(s) + str(s) + json.dumps(s.shown())


def test_a_redis_url_needs_a_cache_secret() -> None:
    """Without a secret, whoever can write to Redis decides what every
    replica serves; so no Redis tier starts without one, and the error says how to give it."""
    url = "redis://127.0.0.1:6379/0"
    with pytest.raises(SettingsError, match=r"'cache_secret'.*required when redis_url is set"):
        Settings.load(env={"VOXGATE_REDIS_URL": url})
    with pytest.raises(SettingsError, match=r"'cache_secret'.*at least 16"):
        Settings.load(env={"VOXGATE_REDIS_URL": url, "VOXGATE_CACHE_SECRET": "short"})
    assert Settings.load(env={"VOXGATE_CACHE_SECRET": CACHE_SECRET}).cache_secret  # no Redis: ok
    assert main(["config", "show", "--redis-url", url]) == 2


def test_aliases_are_added_to_openai_names() -> None:
    s = Settings.load(
        env={"VOXGATE_MODEL_ALIASES": "fast=piper,tts-1=coqui"},
        overrides={"voice_aliases": "narrator=joe"},
    )
    assert s.model_aliases == {
        **dict.fromkeys(OPENAI_MODELS, "piper"),
        "fast": "piper",
        "tts-1": "coqui",
    }
    assert s.voice_aliases == {**dict.fromkeys(OPENAI_VOICES, "joe"), "narrator": "joe"}
    assert s.replace(queue_size=2).model_aliases == s.model_aliases  # re-validation keeps them
    with pytest.raises(SettingsError, match=r"'model_aliases'.*alias=target"):
        Settings.load(env={"VOXGATE_MODEL_ALIASES": "fast"})
    for name in ("model_aliases", "voice_aliases"):
        assert "added to OpenAI's" in (Settings.model_fields[name].description or "")


async def test_a_user_alias_and_openai_names_both_speak(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await gateway(
        settings=settings.replace(
            model_aliases={"fast": "piper"}, voice_aliases={"narrator": "joe"}
        )
    )
    for model, voice in (("fast", "narrator"), ("tts-1", "alloy")):
        body = {"model": model, "voice": voice, "input": "Hello there.", "response_format": "wav"}
        resp = await client.post("/v1/audio/speech", json=body)
        assert resp.status == 200, await resp.text()
    listing = await (await client.get("/v1/voices")).json()
    assert listing["model_aliases"]["fast"] == listing["model_aliases"]["tts-1"] == "piper"
    assert listing["voice_aliases"]["narrator"] == listing["voice_aliases"]["nova"] == "joe"


def test_every_setting_has_a_group_and_help_lists_flags_by_group() -> None:
    assert {Settings.group_of(n) for n in Settings.names()} == set(GROUPS)
    serve = argparse.ArgumentParser(prog="voxgate serve")
    add_setting_flags(serve)
    sections = {g.title: {a.dest for a in g._group_actions} for g in serve._action_groups}
    for group, title in GROUPS.items():
        members = {n for n in Settings.names() if Settings.group_of(n) == group}
        assert sections[title] == members, title
    options = serve.format_help().split("\n\n", 1)[1]  # past the usage line
    assert options.index(GROUPS["server"]) < options.index("--port") < options.index("Redis")


def test_take_limits_are_read_from_file_env_and_flag_and_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "voxgate.toml"
    cfg.write_text(
        '[voxgate.take_limits."piper/joe"]\nmax_hole_s = 3\n'
        '[voxgate.take_limits.openai]\nskip = ["speed_ignored"]\n'
    )
    limits = Settings.load(config_file=cfg, env={}).take_limits
    assert limits == {"piper/joe": {"max_hole_s": 3}, "openai": {"skip": ["speed_ignored"]}}
    env = {"VOXGATE_TAKE_LIMITS": '{"coqui": {"skip": ["not_speech"]}}'}
    assert Settings.load(env=env).take_limits == {"coqui": {"skip": ["not_speech"]}}
    for bad, named in [
        ('{"openai": {"max_holes": 3}}', "unknown take limit 'max_holes'"),
        ('{"openai": {"skip": ["loud"]}}', "unknown reasons: loud"),
        ('{"openai": {"max_hole_s": "long"}}', "must be a number"),
        ('{"openai": 3}', "openai: expected a table"),
    ]:
        with pytest.raises(SettingsError, match=rf"'take_limits' \(from --take-limits\).*{named}"):
            Settings.load(env={}, overrides={"take_limits": bad})
    with pytest.raises(SettingsError, match="'take_checks'"):
        Settings.load(env={"VOXGATE_TAKE_CHECKS": "always"})
