"""The server's event loop setting (gateway/runtime/eventloop.py): uvloop by default, asyncio on request,
a clear error when uvloop is asked for and missing."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main as cli
from gateway.runtime import eventloop
from tests.ops_support import ServerProcess

UVLOOP = importlib.util.find_spec("uvloop") is not None


def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "uvloop" else real(name, *args)

    monkeypatch.setattr(eventloop.importlib.util, "find_spec", find_spec)


def test_auto_is_uvloop_where_installed_else_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    assert UVLOOP, "uvloop is a dependency on this platform"
    assert eventloop.resolve("auto") == "uvloop"
    assert eventloop.resolve("asyncio") == "asyncio"
    no_uvloop(monkeypatch)
    assert eventloop.resolve("auto") == "asyncio"
    with pytest.raises(eventloop.EventLoopUnavailable, match="not installed"):
        eventloop.resolve("uvloop")
    with pytest.raises(ValueError, match="auto, uvloop, asyncio"):
        eventloop.resolve("gevent")


@pytest.mark.parametrize(("choice", "expected"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_run_runs_on_the_chosen_loop(
    choice: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test session's own loop policy must not matter: run() makes its loop itself.
    async def which() -> str:
        return eventloop.describe(asyncio.get_running_loop())

    monkeypatch.setattr(asyncio, "get_event_loop_policy", lambda: pytest.fail("policy used"))
    assert eventloop.run(which(), choice).split()[0] == expected
    assert eventloop.label(choice).split()[0] == expected


def test_serve_with_uvloop_missing_exits_2_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    no_uvloop(monkeypatch)
    rc = cli.main(["serve", "--event-loop", "uvloop", "--cache-dir", str(tmp_path / "c")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "'event_loop'" in err and "--event-loop asyncio" in err


@pytest.mark.slow
def test_the_server_serves_on_asyncio_when_asked(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--event-loop", "asyncio", "--log-format", "json")
    try:
        server.wait_ready()
        status, _ = server.get("/v1/voices")
        assert status == 200
        assert "(event loop: asyncio)" in server.logs()
        assert server.terminate() == 0
    finally:
        server.close()


@pytest.mark.slow
async def test_uvloop_server_with_worker_processes_synthesizes_then_hits(tmp_path: Path) -> None:
    """The default loop with the pieces that touch the loop most: a synthesis worker process
    (pipes, executor threads), a miss, then a hit."""
    import aiohttp

    server = ServerProcess(tmp_path, "--event-loop", "uvloop", "--synth-workers", "1")
    try:
        await asyncio.to_thread(server.wait_ready)
        body = {
            "model": "tts-1",
            "input": "Your call is important to us.",
            "voice": "alloy",
            "response_format": "wav",
        }
        async with aiohttp.ClientSession() as session:
            seen = []
            for _ in range(2):
                async with session.post(server.url + "/v1/audio/speech", json=body) as r:
                    assert r.status == 200
                    seen.append((r.headers["X-Cache"], await r.read()))
        assert [c for c, _ in seen] == ["MISS", "HIT"]
        assert seen[0][1] == seen[1][1] and seen[0][1][:4] == b"RIFF"
        assert "(event loop: uvloop" in server.logs()
        assert await asyncio.to_thread(server.terminate) == 0
    finally:
        server.close()
