"""Operations across real processes: graceful SIGTERM drain, several workers on one port with
aggregated metrics, logs free of request text and API keys, catalogue warming, purge, settings."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families

from tests.canary import canary
from tests.ops_support import ServerProcess, clean_env, run_cli
from tests.served import DefaultServer
from tests.support import shortest_audio_s


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def speech(text: str) -> dict[str, str]:
    return {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "wav"}


@pytest.mark.slow
async def test_sigterm_finishes_twenty_in_flight_requests(tmp_path: Path) -> None:
    # One client with 20 misses in flight: beyond the default queue_per_client and
    # renders_per_client (16 each) the rest would get 429 before the shutdown this test is about.
    server = ServerProcess(
        tmp_path,
        "--shutdown-timeout-s",
        "120",
        "--log-format",
        "json",
        "--queue-per-client",
        "32",
        "--renders-per-client",
        "32",
    )
    try:
        server.wait_ready()
        # The start log says what the `auto` defaults became.
        topology = [line["msg"] for line in server.json_lines() if "topology:" in line["msg"]]
        assert len(topology) == 1, server.logs()
        assert "synthesis processes per model" in topology[0]
        texts = [
            f"Request number {i} is waiting for its turn on the only engine thread we have."
            for i in range(20)
        ]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

            async def one(text: str) -> tuple[int, int | None, bytes]:
                async with session.post(server.url + "/v1/audio/speech", json=speech(text)) as r:
                    return r.status, r.content_length, await r.read()

            tasks = [asyncio.ensure_future(one(t)) for t in texts]
            # All 20 are in the server: one synthesizing, the rest queued behind it.
            deadline = time.monotonic() + 60
            while True:
                m = await asyncio.to_thread(server.metrics)
                queued = sample(m, "voxgate_synthesis_queue_depth", model="piper")
                done = sample(m, "voxgate_http_requests_total", route="/v1/audio/speech")
                if queued >= 15 and done == 0:
                    break
                assert time.monotonic() < deadline, f"requests never queued: {queued=} {done=}"
                await asyncio.sleep(0.05)
            server.proc.send_signal(15)
            # It stops accepting: a new connection is refused while the 20 finish. Asked until
            # it is (the signal takes a moment to be acted on), not after a guessed pause.
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with session.get(
                        server.url + "/healthz", headers={"Connection": "close"}
                    ) as r:
                        await r.read()
                except aiohttp.ClientConnectionError:
                    break
                assert time.monotonic() < deadline, "still accepting 60 s after SIGTERM"
                await asyncio.sleep(0.05)
            results = await asyncio.gather(*tasks)
        for (status, length, body), text in zip(results, texts, strict=True):
            assert status == 200
            assert length == len(body)
            data, rate = sf.read(io.BytesIO(body))
            assert rate == 22050 and len(data) / rate >= shortest_audio_s(text)  # a full sentence
        rc = await asyncio.to_thread(server.proc.wait, 120)
        assert rc == 0
        logs = server.logs()
        assert "draining in-flight requests" in logs
        assert '"msg": "stopped"' in logs
        assert "(event loop: uvloop" in logs  # the default, where uvloop is installed
    finally:
        server.close()


def command_lines(pid: int) -> tuple[list[str], list[list[str]]]:
    """The command line of process ``pid`` and those of its children (Linux's /proc)."""

    def line(p: str) -> list[str]:
        return Path(f"/proc/{p}/cmdline").read_bytes().decode().split("\0")

    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return line(str(pid)), [line(child) for child in children]


@pytest.mark.slow
async def test_two_workers_share_port_disk_metrics_and_one_synthesis_pool(tmp_path: Path) -> None:
    """`voxgate serve` (a gateway process per core) on one port: the processes share the disk
    tier and /metrics sums theirs; a gateway process that dies is replaced. Then the host's one
    synthesis pool: identical misses spread over both gateway processes are synthesized once,
    the engines are loaded once, and a pool process that dies is replaced.

    (One server for both parts: a start costs seconds of both cores, and what the second part
    counts it counts from its own requests.)"""
    server = DefaultServer(tmp_path, "--log-format", "json")
    try:
        server.wait_ready()
        assert server.gateways == 2, "this test needs 2 cores (CI has 2)"
        # The gateway processes are forks of the supervisor (its command line, no interpreter
        # of their own); the pool process is a new interpreter.
        own, children = command_lines(server.proc.pid)
        assert sorted(line == own for line in children) == [False, True, True]
        assert ["--serve-pool" in line for line in children].count(True) == 1
        n_health = 40
        async with aiohttp.ClientSession() as session:
            for _ in range(n_health):  # a new connection each: the kernel spreads them
                async with session.get(
                    server.url + "/healthz", headers={"Connection": "close"}
                ) as r:
                    assert r.status == 200
            caches = []
            for _ in range(8):
                async with session.post(
                    server.url + "/v1/audio/speech",
                    json=speech("Shared by every worker."),
                    headers={"Connection": "close"},
                ) as r:
                    assert r.status == 200
                    caches.append(r.headers["X-Cache"])
        assert caches[0] == "MISS" and set(caches[1:]) == {"HIT"}

        def health_lines() -> list[dict[str, Any]]:
            return [
                line
                for line in server.json_lines()
                if line["logger"] == "voxgate.access" and line["route"] == "/healthz"
            ]

        # Each worker writes its access log in batches (at most 0.2 s later, longer on a loaded
        # machine): wait until every request's line is there before counting who served it.
        deadline = time.monotonic() + 30
        while len(access := health_lines()) < n_health:
            assert time.monotonic() < deadline, f"{len(access)} of {n_health} access lines"
            await asyncio.sleep(0.05)
        assert len(access) == n_health
        by_pid: dict[int, int] = {}
        for line in access:
            by_pid[line["pid"]] = by_pid.get(line["pid"], 0) + 1
        assert len(by_pid) == 2, f"one worker served everything: {by_pid}"
        speech_pids = {
            line["pid"]
            for line in server.json_lines()
            if line["logger"] == "voxgate.access" and line["route"] == "/v1/audio/speech"
        }
        # Each process's counters hold only its own requests; /metrics must give the sum. A
        # process adds its request tallies to its metric files within 0.1 s of a request
        # (gateway/http/observe.py): wait for that, then the sum must hold on every scrape.
        deadline = time.monotonic() + 30
        while (
            sample(m := server.metrics(), "voxgate_speech_requests_total", cache="hit") != 7
            or sample(m, "voxgate_http_requests_total", route="/healthz") != n_health
        ):
            assert time.monotonic() < deadline, "request tallies never reached /metrics"
            await asyncio.sleep(0.05)
        for _ in range(3):
            m = server.metrics()
            assert sample(m, "voxgate_http_requests_total", route="/healthz") == n_health
            assert sample(m, "voxgate_speech_requests_total", cache="miss") == 1
            assert sample(m, "voxgate_speech_requests_total", cache="hit") == 7
            assert sample(m, "voxgate_syntheses_total", outcome="ok") == 1
            assert sample(m, "voxgate_engine_ready", model="piper") == 1
            assert sample(m, "voxgate_build_info") == 1
        promtool = shutil.which("promtool")
        assert promtool is not None, "promtool missing: apt-get install -y prometheus"
        check = await asyncio.to_thread(
            subprocess.run,
            [promtool, "check", "metrics"],
            input=m,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr  # the aggregate is valid too
        if len(speech_pids) == 2:
            # The worker that did not synthesize answered from the shared disk tier.
            m = server.metrics()
            assert sample(m, "voxgate_cache_lookups_total", tier="disk", result="hit") >= 1

        # A worker that dies is replaced; what it counted stays in the aggregate, and its live
        # gauges (per-process cache sizes, labelled by pid) are dropped.
        def gauge_pids() -> set[int]:
            return {
                int(s.labels["pid"])
                for f in text_string_to_metric_families(server.metrics())
                for s in f.samples
                if s.name == "voxgate_cache_bytes"
            }

        reported = gauge_pids()
        victim = next(iter(reported & set(by_pid)), next(iter(by_pid)))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while server.logs().count("voxgate ready on") < 3:
            assert time.monotonic() < deadline, server.logs()
            await asyncio.sleep(0.2)
        assert f"(pid {victim}) exited with -9; restarting" in server.logs()
        m = server.metrics()
        assert sample(m, "voxgate_http_requests_total", route="/healthz") == n_health
        assert victim not in gauge_pids()
        await one_synthesis_pool_for_the_host(server)
        assert server.terminate() == 0
    finally:
        server.close()


async def one_synthesis_pool_for_the_host(server: DefaultServer) -> None:
    """The host's one synthesis pool, on a running `voxgate serve` of two gateway processes:
    identical misses spread over both are synthesized once, the engines were loaded once, and
    a pool process that dies is replaced (counted from this part's own requests: its text is
    new, its access lines are found by its audio key)."""
    n = 32  # spread by the kernel's hash of each address: all on one process, 1 run in 2**31
    before = sample(server.metrics(), "voxgate_syntheses_total", outcome="ok")
    async with aiohttp.ClientSession() as session:

        async def one() -> tuple[int, str]:
            async with session.post(
                server.url + "/v1/audio/speech",
                json=speech("One synthesis for the whole host, however many ask."),
                headers={"Connection": "close"},  # a new connection each: both processes
            ) as r:
                await r.read()
                return r.status, r.headers["X-Audio-Key"]

        answers = await asyncio.gather(*(one() for _ in range(n)))
    assert all(status == 200 for status, _ in answers), answers
    (key,) = {key for _, key in answers}
    deadline = time.monotonic() + 30
    while (
        len(
            speech_lines := [
                line
                for line in server.json_lines()
                if line["logger"] == "voxgate.access"
                and line["route"] == "/v1/audio/speech"
                and line.get("key") == key
            ]
        )
        < n
    ):
        assert time.monotonic() < deadline, f"{len(speech_lines)} of {n} access lines"
        await asyncio.sleep(0.05)
    assert len({line["pid"] for line in speech_lines}) == 2, "one process served all"
    m = server.metrics()
    assert sample(m, "voxgate_syntheses_total", outcome="ok") - before == 1
    logs = server.json_lines()
    pools = [line for line in logs if line["msg"].startswith("worker pool ready")]
    assert len(pools) == 1, pools  # one pool of engines on the host, not one per process
    assert sum(line["msg"].startswith("synthesis pool ready") for line in logs) == 1

    # The pool process dies: the supervisor starts another, and the gateways, which stayed
    # up, reach it again for the next miss.
    started = [
        line["msg"] for line in logs if line["msg"].startswith("synthesis pool process started")
    ]
    pool_pid = int(re.search(r"pid (\d+)", started[0]).group(1))  # type: ignore[union-attr]
    os.kill(pool_pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while server.logs().count("synthesis pool ready") < 2:
        assert time.monotonic() < deadline, server.logs()[-3000:]
        await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as session:
        for attempt in range(50):
            async with session.post(
                server.url + "/v1/audio/speech", json=speech("After the pool came back.")
            ) as r:
                await r.read()
            if r.status == 200:
                break
            # A gateway may find the new socket a moment after the pool logs it is ready.
            assert r.status == 503 and attempt < 49
            await asyncio.sleep(0.1)
    assert f"(pid {pool_pid}) exited with -9; restarting" in server.logs()


@pytest.mark.slow
async def test_logs_hold_no_request_text_or_api_key(tmp_path: Path) -> None:
    secret_text = "Zanzibar platypus codeword 7731 must never reach a log."
    api_key = canary("sk-client")
    server = ServerProcess(tmp_path, "--log-level", "debug", "--log-format", "json")
    try:
        server.wait_ready()
        auth = {"Authorization": f"Bearer {api_key}"}
        async with aiohttp.ClientSession(headers=auth) as session:
            url = server.url
            for _ in range(2):  # a miss, then a hit
                async with session.post(url + "/v1/audio/speech", json=speech(secret_text)) as r:
                    assert r.status == 200
                    key = r.headers["X-Audio-Key"]
            bad = {**speech(secret_text), "speed": 99}
            async with session.post(url + "/v1/audio/speech", json=bad) as r:
                assert r.status == 400
            async with session.post(url + "/v1/prompts", json={"prompts": [secret_text]}) as r:
                assert r.status == 200
            async with session.get(url + "/synthesize", params={"text": secret_text}) as r:
                assert r.status in (200, 404)
            async with session.post(
                url + "/v1/audio/speech",
                data=b"{" + api_key.encode(),
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 400
        assert server.terminate() == 0
        logs = server.logs()
        for needle in (secret_text, "Zanzibar", "platypus", api_key, "sk-test"):
            assert needle not in logs
        lines = server.json_lines()  # every line is JSON in json mode
        access = [x for x in lines if x["logger"] == "voxgate.access"]
        assert len(access) >= 6
        hits = [x for x in access if x["route"] == "/v1/audio/speech" and x["status"] == 200]
        # (Sorted: with a gateway per core the two may be answered and logged by two
        # processes, each writing its own batches.)
        assert sorted(x["cache"] for x in hits) == ["hit", "miss"]
        assert {x["key"] for x in hits} == {key}
        for x in hits:
            assert x["bytes"] > 10_000
            assert x["ms"] > 0
            assert x["client"] is None  # no authentication configured: no client id
            assert x["method"] == "POST"
    finally:
        server.close()


@pytest.mark.slow
def test_warm_a_catalogue_then_nothing_to_synthesize(tmp_path: Path) -> None:
    catalogue = tmp_path / "prompts.txt"
    # Three times the prompts warm renders at once (catalogue_concurrency 4): every count below
    # is in terms of n, which no size of catalogue changes.
    n = 12
    lines = ["# IVR prompts", ""] + [f"Option {i}." for i in range(n)]
    catalogue.write_text("\n".join(lines) + "\n")
    args = ["warm", str(catalogue), "--cache-dir", str(tmp_path / "cache"), "--json"]
    first = run_cli(*args, "--format", "mulaw", "--rate", "8000")
    assert first.returncode == 0, first.stderr
    s1 = json.loads(first.stdout)
    assert s1["prompts"] == n and s1["synthesized"] == n and s1["failed"] == 0
    assert f"{n}/{n}" in first.stderr  # the progress bar reached the end
    second = run_cli(*args, "--format", "mulaw", "--rate", "8000")
    assert second.returncode == 0, second.stderr
    s2 = json.loads(second.stdout)
    assert s2["synthesized"] == 0 and s2["cached"] == n and s2["failed"] == 0
    assert s2["bytes"] == s1["bytes"]
    stats = run_cli("cache", "stats", "--json", "--cache-dir", str(tmp_path / "cache"))
    disk = json.loads(stats.stdout)[0]
    assert disk["pinned"] == 2 * n  # the masters and their mu-law renditions, all pinned
    # Pinned entries survive an unpinned purge.
    purge = run_cli(
        "cache", "purge", "--unpinned", "--json", "--cache-dir", str(tmp_path / "cache")
    )
    assert json.loads(purge.stdout) == {"removed": {"disk": 0}}


@pytest.mark.slow
def test_warm_csv_and_yaml_catalogues_then_purge(tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    csv_file = tmp_path / "p.csv"
    csv_file.write_text('text,voice,format,rate\n"Hello, caller.",joe,wav,16000\nGoodbye.,,flac,\n')
    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text(
        "defaults: {format: wav}\nprompts:\n  - Thanks.\n  - {text: Hold please., rate: 8000}\n"
    )
    out = run_cli("warm", str(csv_file), "--cache-dir", cache, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["synthesized"] == 2
    out = run_cli("warm", str(yaml_file), "--cache-dir", cache, "--json")
    assert json.loads(out.stdout)["synthesized"] == 2
    said = run_cli("say", "Not pinned.", "-o", str(tmp_path / "x.wav"), "--cache-dir", cache)
    assert said.returncode == 0, said.stderr

    bad = tmp_path / "bad.csv"
    bad.write_text("text,voice\nHi.,joe\nBye.,nobody\n")
    out = run_cli("warm", str(bad), "--cache-dir", cache)
    assert out.returncode == 2
    assert "line 3" in out.stderr and "nobody" in out.stderr

    def purge(*a: str) -> dict[str, int]:
        res = run_cli("cache", "purge", "--json", "--cache-dir", cache, *a)
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout)["removed"])

    assert purge("--unpinned") == {"disk": 2}  # the say: master + rendition
    assert purge("--older-than", "1h") == {"disk": 0}
    assert purge("--model", "other") == {"disk": 0}
    nothing = run_cli("cache", "purge", "--cache-dir", cache)
    assert nothing.returncode == 2 and "--all" in nothing.stderr
    bad_age = run_cli("cache", "purge", "--older-than", "soon", "--cache-dir", cache)
    assert bad_age.returncode == 2 and "invalid duration" in bad_age.stderr
    assert purge("--voice", "joe", "--pinned") == {"disk": 8}


BAD_SETTINGS = [
    ("workers", "0"),
    ("log_format", "xml"),
    ("shutdown_timeout_s", "soon"),
    ("port", "99999"),
    ("event_loop", "gevent"),
]


def bad_serve(
    tmp_path: Path, source: str, key: str, value: str
) -> tuple[list[str], dict[str, str]]:
    """The ``serve`` arguments and the environment variables that give setting ``key`` the
    value ``value`` from ``source``: the environment, a TOML file or a flag."""
    env: dict[str, str] = {}
    args = ["serve", "--cache-dir", str(tmp_path / "c")]
    if source == "env":
        env[f"VOXGATE_{key.upper()}"] = value
    elif source == "toml":
        toml = tmp_path / "voxgate.toml"
        quoted = value if value.isdigit() else f'"{value}"'
        toml.write_text(f"[voxgate]\n{key} = {quoted}\n")
        args += ["--config", str(toml)]
    else:
        args += [f"--{key.replace('_', '-')}", value]
    return args, env


@pytest.mark.parametrize("source", ["env", "toml", "flag"])
@pytest.mark.parametrize(("key", "value"), BAD_SETTINGS)
def test_bad_setting_fails_at_start_naming_the_key(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    key: str,
    value: str,
) -> None:
    """Every bad setting from every source, through the command's ``main`` in this process
    (what ``python -m gateway`` exits with; a settings error stops it before anything starts).
    :func:`test_a_bad_setting_ends_the_process_with_status_2` runs the process itself."""
    from gateway.cli.main import main

    args, env = bad_serve(tmp_path, source, key, value)
    for name in list(os.environ):  # as clean_env gives a process
        if name.startswith("VOXGATE_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    for name, setting in env.items():
        monkeypatch.setenv(name, setting)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"'{key}'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("source", ["env", "toml", "flag"])
def test_a_bad_setting_ends_the_process_with_status_2(tmp_path: Path, source: str) -> None:
    """``python -m gateway serve`` as a process, a bad setting from each source: exit status 2,
    the setting named, no traceback (one setting: the matrix of them runs in-process above)."""
    args, env = bad_serve(tmp_path, source, "port", "99999")
    res = run_cli(*args, env=clean_env(**env), timeout=60)
    assert res.returncode == 2
    assert "'port'" in res.stderr
    assert "Traceback" not in res.stderr


def test_config_show_precedence_of_new_settings(tmp_path: Path) -> None:
    toml = tmp_path / "voxgate.toml"
    toml.write_text('[voxgate]\nworkers = 3\nlog_format = "text"\nshutdown_timeout_s = 5\n')
    env = clean_env(VOXGATE_WORKERS="4", VOXGATE_CONFIG=str(toml))
    res = run_cli("config", "show", "--shutdown-timeout-s", "9", env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["log_format"] == "text"  # TOML over the default
    assert shown["workers"] == 4  # env over TOML
    assert shown["shutdown_timeout_s"] == 9  # flag over TOML
    assert re.fullmatch(r"\d+", str(shown["max_catalogue_prompts"]))
