"""API keys: 401 without or with a wrong key, 403 outside a key's scopes,
200 with Bearer and with X-API-Key; URLs that authorize themselves; reload; `voxgate keys add`;
no secret in any log line at any level."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness import CACHE_SECRET, RedisServer, free_port
from gateway.errors import TooManyRequests
from gateway.http import keys as app_keys
from gateway.runtime.apikeys import APIKey, Authenticator, KeyRing, KeysFileError, key_table
from gateway.runtime.ratelimit import KeyLimits, limits_storage_uri
from gateway.runtime.settings import Settings
from metrics import Metrics
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import clear_of_a_minute_edge

ROOT = Path(__file__).resolve().parents[1]
SPEAK_SECRET = canary("speak")
READ_SECRET = canary("read")
ADMIN_SECRET = canary("admin")
BODY = {"model": "piper", "voice": "joe", "input": "Press one for sales.", "response_format": "wav"}


def write_keys(path: Path, *tables: str) -> Path:
    path.write_text("\n".join(tables), encoding="utf-8")
    return path


def standard_keys(path: Path) -> Path:
    return write_keys(
        path,
        key_table("ivr-prod", SPEAK_SECRET, ["speak"]),
        key_table("player", READ_SECRET, ["read"]),
        key_table("ops", ADMIN_SECRET, ["admin"]),
    )


@pytest.fixture
def keyed(settings: Settings, tmp_path: Path) -> Settings:
    return settings.replace(api_keys_file=str(standard_keys(tmp_path / "keys.toml")))


def error_of(body: bytes) -> dict[str, object]:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


async def test_401_403_and_200_by_bearer_and_x_api_key(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    http = await gateway(settings=keyed)
    missing = await http.post("/v1/audio/speech", json=BODY)
    assert missing.status == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert error_of(await missing.read())["code"] == "missing_api_key"
    for headers in (
        {"Authorization": "Bearer not-a-key"},
        {"X-API-Key": "not-a-key"},
        {"Authorization": f"Basic {SPEAK_SECRET}"},  # a secret under another scheme is no key
    ):
        wrong = await http.post("/v1/audio/speech", json=BODY, headers=headers)
        assert wrong.status == 401, headers
        assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
    scope = await http.post(
        "/v1/audio/speech", json=BODY, headers={"Authorization": f"Bearer {READ_SECRET}"}
    )
    assert scope.status == 403
    err = error_of(await scope.read())
    assert err["type"] == "permission_error" and err["code"] == "insufficient_scope"
    bearer = await http.post(
        "/v1/audio/speech", json=BODY, headers={"Authorization": f"bearer {SPEAK_SECRET}"}
    )
    assert bearer.status == 200 and (await bearer.read())[:4] == b"RIFF"
    by_header = await http.post("/v1/audio/speech", json=BODY, headers={"X-API-Key": SPEAK_SECRET})
    assert by_header.status == 200 and by_header.headers["X-Cache"] == "HIT"
    # The other synthesis endpoints are speak too; health stays open.
    assert (await http.get("/synthesize", params={"text": "Hi."})).status == 401
    assert (await http.get("/v1/say/joe/Hello.wav")).status == 401
    assert (await http.get("/healthz")).status == 200
    assert (await http.get("/openapi.json")).status == 200


async def test_admin_routes_listings_and_metrics(gateway: GatewayFactory, keyed: Settings) -> None:
    http = await gateway(settings=keyed)
    prompts = {"prompts": ["Goodbye."]}
    speak = {"X-API-Key": SPEAK_SECRET}
    assert (await http.post("/v1/prompts", json=prompts)).status == 401
    assert (await http.post("/v1/prompts", json=prompts, headers=speak)).status == 403
    ok = await http.post("/v1/prompts", json=prompts, headers={"X-API-Key": ADMIN_SECRET})
    assert ok.status == 200, await ok.text()
    # Listings: any valid key, none without one.
    assert (await http.get("/v1/models")).status == 401
    for secret in (SPEAK_SECRET, READ_SECRET, ADMIN_SECRET):
        assert (await http.get("/v1/models", headers={"X-API-Key": secret})).status == 200
    # With keys on, metrics need a key of the admin (or metrics) scope on the serving port.
    assert (await http.get("/metrics")).status == 401
    assert (await http.get("/metrics", headers=speak)).status == 403
    assert (await http.get("/metrics", headers={"X-API-Key": ADMIN_SECRET})).status == 200


async def test_content_addresses_are_capabilities_unless_turned_off(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    http = await gateway(settings=keyed)
    made = await http.post("/v1/audio/speech", json=BODY, headers={"X-API-Key": SPEAK_SECRET})
    key = made.headers["X-Audio-Key"]
    assert (await http.get(f"/v1/audio/{key}")).status == 200
    assert (await http.get(f"/v1/audio/{key}.ulaw")).status == 200
    closed = await gateway(settings=keyed.replace(public_audio_urls=False))
    made = await closed.post("/v1/audio/speech", json=BODY, headers={"X-API-Key": SPEAK_SECRET})
    key = made.headers["X-Audio-Key"]
    assert (await closed.get(f"/v1/audio/{key}")).status == 401
    assert (await closed.get(f"/v1/audio/{key}", headers={"X-API-Key": SPEAK_SECRET})).status == 403
    assert (await closed.get(f"/v1/audio/{key}", headers={"X-API-Key": READ_SECRET})).status == 200


async def test_public_content_addresses_are_read_with_any_valid_key(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    # The studio sends its key with every call, Download included: a speak-only key must read
    # the audio its own answer named, as a caller without a key may.
    http = await gateway(settings=keyed)
    speak = {"X-API-Key": SPEAK_SECRET}
    made = await http.post("/v1/audio/speech", json=BODY, headers=speak)
    key = made.headers["X-Audio-Key"]
    for path in (f"/v1/audio/{key}", f"/v1/audio/{key}.ulaw", f"/v1/audio/{key}.wav"):
        for headers in (speak, {"Authorization": f"Bearer {ADMIN_SECRET}"}, {}):
            got = await http.get(path, headers=headers)
            assert got.status == 200, (path, headers, await got.text())
        # A key the gateway does not know is still refused: it is a mistake worth saying.
        assert (await http.get(path, headers={"X-API-Key": "not-a-key"})).status == 401


async def test_metrics_scope_reads_metrics_and_nothing_else(
    gateway: GatewayFactory, keyed: Settings, tmp_path: Path
) -> None:
    scrape = canary("prometheus")
    path = standard_keys(tmp_path / "with-metrics.toml")
    path.write_text(path.read_text() + key_table("prometheus", scrape, ["metrics"]))
    http = await gateway(settings=keyed.replace(api_keys_file=str(path), metrics_auth=True))
    headers = {"Authorization": f"Bearer {scrape}"}
    assert (await http.get("/metrics", headers=headers)).status == 200
    assert (await http.post("/v1/audio/speech", json=BODY, headers=headers)).status == 403
    prompts = await http.post("/v1/prompts", json={"prompts": ["Hi."]}, headers=headers)
    assert prompts.status == 403


async def test_signed_say_urls_authorize_themselves(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    http = await gateway(settings=keyed.replace(url_signing_secret=canary("sign-me")))
    signed = await http.post(
        "/v1/say/sign",
        json={"voice": "joe", "text": "Hello.", "ext": "wav"},
        headers={"X-API-Key": SPEAK_SECRET},
    )
    assert signed.status == 200
    path = (await signed.json())["path"]
    assert (await http.get(path)).status == 200  # no key: the signature is the authorization
    forged = path.replace("/Hello", "/Goodbye")
    assert forged != path
    bad = await http.get(forged)
    assert bad.status == 403 and error_of(await bad.read())["type"] == "permission_error"


async def test_without_a_keys_file_everything_is_open(gateway: GatewayFactory) -> None:
    http = await gateway()
    assert (await http.post("/v1/audio/speech", json=BODY)).status == 200
    assert (await http.post("/v1/prompts", json={"prompts": ["Goodbye."]})).status == 200


async def test_reload_swaps_keys_and_keeps_them_when_the_file_is_bad(tmp_path: Path) -> None:
    path = write_keys(tmp_path / "keys.toml", key_table("a", SPEAK_SECRET, ["speak"]))
    auth = Authenticator(str(path))
    ring = await auth.load()
    assert ring is not None and ring.identify(SPEAK_SECRET) is not None
    write_keys(path, key_table("b", READ_SECRET, ["read"]))
    assert await auth.reload()
    assert auth.ring is not None
    assert auth.ring.identify(SPEAK_SECRET) is None
    found = auth.ring.identify(READ_SECRET)
    assert found is not None and found.name == "b"
    path.write_text("[[key]]\nname = 'c'\n", encoding="utf-8")  # no hash, no scopes
    assert not await auth.reload()
    assert auth.ring.identify(READ_SECRET) is not None


async def test_reload_is_seen_by_a_running_gateway(
    gateway: GatewayFactory, keyed: Settings
) -> None:
    from gateway.http import keys

    http = await gateway(settings=keyed)
    headers = {"X-API-Key": SPEAK_SECRET}
    assert (await http.post("/v1/audio/speech", json=BODY, headers=headers)).status == 200
    write_keys(Path(keyed.api_keys_file), key_table("player", READ_SECRET, ["read"]))
    assert await http.app[keys.AUTH].reload()
    assert (await http.post("/v1/audio/speech", json=BODY, headers=headers)).status == 401


def test_keys_file_errors_name_the_problem(tmp_path: Path) -> None:
    cases = {
        "dup.toml": key_table("a", "s1", ["speak"]) + key_table("a", "s2", ["read"]),
        "scope.toml": '[[key]]\nname = "a"\nsha256 = "' + "0" * 64 + '"\nscopes = ["write"]\n',
        "hash.toml": '[[key]]\nname = "a"\nsha256 = "xyz"\nscopes = ["speak"]\n',
        "toml.toml": "[[key]\n",
    }
    for name, text in cases.items():
        path = write_keys(tmp_path / name, text)
        with pytest.raises(KeysFileError, match=name):
            KeyRing.load(path)
    with pytest.raises(KeysFileError, match="no-such"):
        KeyRing.load(tmp_path / "no-such.toml")


def test_keys_add_round_trip_and_serve_refuses_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli.main import main

    path = tmp_path / "keys.toml"

    def keys_add(*args: str) -> subprocess.CompletedProcess[str]:
        """``voxgate keys add ARGS`` through the command's main in this process (what ``python
        -m gateway`` exits with; it starts nothing), its output captured; serve below is run
        as a process (test_malformed_requests_log_no_secret_and_few_lines runs keys add as one)."""
        argv = ["keys", "add", *args, "--file", str(path)]
        code = main(argv)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    first = keys_add("ivr-prod", "--scopes", "speak,read", "--rpm", "600")
    assert first.returncode == 0, first.stderr
    secret = first.stdout.strip()
    assert len(secret) >= 43 and "\n" not in secret
    second = keys_add("ops", "--scopes", "admin")
    assert second.returncode == 0, second.stderr
    text = path.read_text()
    assert secret not in text and second.stdout.strip() not in text  # hashes only
    assert path.stat().st_mode & 0o777 == 0o600
    ring = KeyRing.load(path)
    found = ring.identify(secret)
    assert found is not None and found.name == "ivr-prod"
    assert found.scopes == {"speak", "read"} and found.requests_per_minute == 600
    assert ring.names() == ["ivr-prod", "ops"]
    again = keys_add("ops", "--scopes", "read")
    assert again.returncode == 2 and "exists already" in again.stderr
    bad_scope = keys_add("x", "--scopes", "write")
    assert bad_scope.returncode == 2 and "scopes" in bad_scope.stderr
    assert KeyRing.load(path).names() == ["ivr-prod", "ops"]
    broken = write_keys(tmp_path / "broken.toml", "[[key]]\nname = 1\n")
    serve = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--api-keys-file", str(broken)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 2 and "api_keys_file" in serve.stderr


async def test_no_secret_in_any_log_line(
    gateway: GatewayFactory,
    keyed: Settings,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    http = await gateway(settings=keyed.replace(log_level="debug"))
    for secret in (SPEAK_SECRET, READ_SECRET, ADMIN_SECRET, "wrong-" + SPEAK_SECRET):
        for headers in ({"Authorization": f"Bearer {secret}"}, {"X-API-Key": secret}):
            await http.post("/v1/audio/speech", json=BODY, headers=headers)
            await http.post("/v1/prompts", json={"prompts": ["Bye."]}, headers=headers)
    await http.close()  # flushes the access log
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    assert '"client":"ivr-prod"' in logged or "client=ivr-prod" in logged  # the name is logged
    for secret in (SPEAK_SECRET, READ_SECRET, ADMIN_SECRET):
        # Any 12-character piece of a secret would already be a leak.
        assert secret[:12] not in logged and secret[-12:] not in logged


# ---- limits per key ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_requests_per_minute_3_gives_200_200_200_then_429(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, metrics: Metrics
) -> None:
    path = write_keys(
        tmp_path / "keys.toml",
        key_table("tight", SPEAK_SECRET, ["speak"], requests_per_minute=3),
        key_table("free", READ_SECRET, ["speak"]),
    )
    http = await gateway(settings=settings.replace(api_keys_file=str(path)))
    await clear_of_a_minute_edge()
    statuses = []
    for _ in range(4):
        r = await http.post("/v1/audio/speech", json=BODY, headers={"X-API-Key": SPEAK_SECRET})
        statuses.append(r.status)
    assert statuses == [200, 200, 200, 429]
    assert int(r.headers["Retry-After"]) >= 1
    err = error_of(await r.read())
    assert err["type"] == "rate_limit_exceeded" and err["code"] == "requests_per_minute"
    # Another key's budget is its own; an unlimited key is never counted.
    for _ in range(5):
        r = await http.post("/v1/audio/speech", json=BODY, headers={"X-API-Key": READ_SECRET})
        assert r.status == 200
    count = metrics.registry.get_sample_value
    assert count("voxgate_api_key_requests_total", {"key": "tight", "result": "ok"}) == 3
    assert count("voxgate_api_key_requests_total", {"key": "tight", "result": "rate_limited"}) == 1
    assert count("voxgate_api_key_requests_total", {"key": "free", "result": "ok"}) == 5


async def test_two_replicas_sharing_redis_spend_one_budget(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, redis: RedisServer
) -> None:
    path = write_keys(
        tmp_path / "keys.toml", key_table("shared", SPEAK_SECRET, ["speak"], requests_per_minute=6)
    )
    shared = settings.replace(
        api_keys_file=str(path), redis_url=redis.url, cache_secret=CACHE_SECRET
    )
    replicas = [
        await gateway(settings=shared.replace(cache_dir=str(tmp_path / f"cache{i}")))
        for i in range(2)
    ]
    await clear_of_a_minute_edge()
    statuses = []
    for i in range(10):
        r = await replicas[i % 2].get("/v1/models", headers={"X-API-Key": SPEAK_SECRET})
        statuses.append(r.status)
    assert statuses.count(200) == 6 and statuses.count(429) == 4, statuses
    assert statuses[:6] == [200] * 6


async def test_chars_per_minute_counts_misses_only(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, metrics: Metrics
) -> None:
    path = write_keys(
        tmp_path / "keys.toml", key_table("chatty", SPEAK_SECRET, ["speak"], chars_per_minute=40)
    )
    http = await gateway(settings=settings.replace(api_keys_file=str(path)))
    headers = {"X-API-Key": SPEAK_SECRET}
    await clear_of_a_minute_edge()
    first = {**BODY, "input": "Press one for sales."}  # 20 characters
    second = {**BODY, "input": "Press two for support."}  # 22: 42 in all, over 40
    assert (await http.post("/v1/audio/speech", json=first, headers=headers)).status == 200
    over = await http.post("/v1/audio/speech", json=second, headers=headers)
    assert over.status == 429 and int(over.headers["Retry-After"]) >= 1
    assert error_of(await over.read())["code"] == "chars_per_minute"
    # A hit sends nothing to synthesis: still served.
    again = await http.post("/v1/audio/speech", json=first, headers=headers)
    assert again.status == 200 and again.headers["X-Cache"] == "HIT"
    count = metrics.registry.get_sample_value
    assert count("voxgate_api_key_synthesis_chars_total", {"key": "chatty"}) == 42
    assert count("voxgate_api_key_chars_limited_total", {"key": "chatty"}) == 1


async def test_redis_down_falls_back_to_local_limits_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    limits = KeyLimits(metrics, redis_url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    key = APIKey("k", b"\0" * 32, frozenset({"speak"}), requests_per_minute=2)
    caplog.set_level(logging.INFO, logger="voxgate.auth")
    await limits.start()
    await clear_of_a_minute_edge()
    try:
        await limits.admit_request(key)
        await limits.admit_request(key)
        with pytest.raises(TooManyRequests) as refused:
            await limits.admit_request(key)
    finally:
        await limits.close()
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
    assert metrics.registry.get_sample_value("voxgate_rate_limit_fallbacks_total") == 3
    warnings = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(warnings) == 1


def test_limits_storage_for_each_redis_url_form() -> None:
    from limits.aio.storage import RedisClusterStorage, RedisSentinelStorage, RedisStorage

    assert limits_storage_uri("redis://:pw@h:6379/2") == (
        RedisStorage,
        "async+redis://:pw@h:6379/2",
        {},
    )
    assert limits_storage_uri("unix:///run/redis.sock")[1] == "async+redis+unix:///run/redis.sock"
    assert limits_storage_uri("redis+cluster://h:7000")[:2] == (
        RedisClusterStorage,
        "async+redis+cluster://h:7000",
    )
    assert limits_storage_uri("redis+sentinel://h:26379,g:26379/mymaster/0") == (
        RedisSentinelStorage,
        "async+redis+sentinel://h:26379,g:26379",
        {"service_name": "mymaster"},
    )


def test_bench_keys_file_holds_n_keys_and_one_works(tmp_path: Path) -> None:
    from bench.hit_path import write_keys_file

    secret = write_keys_file(tmp_path / "keys.toml", 100)
    ring = KeyRing.load(tmp_path / "keys.toml")
    assert len(ring.keys) == 100
    found = ring.identify(secret)
    assert found is not None and found.scopes == {"speak", "read"}
    assert not (found.requests_per_minute or found.chars_per_minute)


def test_sighup_reloads_the_keys_of_every_worker(tmp_path: Path) -> None:
    """`voxgate serve` (a gateway process per core): SIGHUP to the supervisor reaches each
    gateway process, and each rereads the keys file (the old key is refused everywhere, the new
    one accepted)."""
    import signal
    import time
    import urllib.error
    import urllib.request

    from tests.served import DefaultServer

    keys_file = write_keys(tmp_path / "keys.toml", key_table("old", SPEAK_SECRET, ["speak"]))
    server = DefaultServer(
        tmp_path / "srv", "--api-keys-file", str(keys_file), "--log-level", "info"
    )

    def status(secret: str) -> int:
        req = urllib.request.Request(server.url + "/v1/models", headers={"X-API-Key": secret})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        server.wait_ready()
        assert [status(SPEAK_SECRET) for _ in range(10)] == [200] * 10
        write_keys(keys_file, key_table("new", READ_SECRET, ["read"]))
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while server.logs().count("API keys reloaded") < server.gateways:
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.1)
        # New connections land on either worker (SO_REUSEPORT): every one knows the new keys.
        assert [status(SPEAK_SECRET) for _ in range(10)] == [401] * 10
        assert [status(READ_SECRET) for _ in range(10)] == [200] * 10
        assert server.terminate() == 0
    finally:
        server.close()
    assert SPEAK_SECRET not in server.logs() and READ_SECRET not in server.logs()


# ---- signed say URLs are charged to the key that signed them ----------------------------------


async def test_a_signed_url_spends_its_signers_budget_and_dies_with_it(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    """A URL signed by a key charges that key on every fetch (requests, and the characters its
    misses send to synthesis), so signing cannot launder a key's budget; once the key is gone
    from the keys file, its URLs answer 403."""
    keys_file = write_keys(
        tmp_path / "keys.toml",
        key_table("ivr", SPEAK_SECRET, ["speak"], requests_per_minute=3, chars_per_minute=60),
        key_table("ops", ADMIN_SECRET, ["admin", "speak"]),
    )
    http = await gateway(
        settings=settings.replace(
            api_keys_file=str(keys_file), url_signing_secret=canary("signing")
        )
    )
    ivr = {"X-API-Key": SPEAK_SECRET}
    long_text = "This sentence alone has more than sixty characters in it, surely."
    # Over the key's characters per minute on the speech route ...
    over = await http.post("/v1/audio/speech", json={**BODY, "input": long_text}, headers=ivr)
    assert over.status == 429 and error_of(await over.read())["code"] == "chars_per_minute"
    # ... and as a signed URL of the same text: the same key pays, the same answer.
    sign = {"voice": "joe", "text": long_text, "ext": "wav", "expires_in": 600}
    made = await http.post("/v1/say/sign", json=sign, headers=ivr)
    assert made.status == 200 and (await made.json())["key"] == "ivr"
    laundered = await http.get((await made.json())["path"])  # no key sent
    assert laundered.status == 429 and error_of(await laundered.read())["code"] == (
        "chars_per_minute"
    )
    # Requests per minute: 3 for the key, its URLs' fetches included (spent above: the speech
    # request, the signing, the signed fetch).
    short = await http.post(
        "/v1/say/sign", json={**sign, "text": "Press one."}, headers={"X-API-Key": ADMIN_SECRET}
    )
    by_ops = (await short.json())["path"]
    ivr_url = (await http.post("/v1/say/sign", json={**sign, "text": "Hi."}, headers=ivr)).status
    assert ivr_url == 429  # the key's fourth request
    assert (await http.get(by_ops)).status == 200  # another key's URL: its own budget
    # The key is revoked: every URL it signed answers 403, others still play.
    write_keys(keys_file, key_table("ops", ADMIN_SECRET, ["admin", "speak"]))
    assert await http.server.app[app_keys.AUTH].reload()
    revoked = await http.get((await made.json())["path"])
    assert revoked.status == 403 and error_of(await revoked.read())["code"] == "signer_revoked"
    assert (await http.get(by_ops)).status == 200


async def test_a_url_signed_without_keys_stops_playing_once_keys_are_on(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    signing = settings.replace(url_signing_secret=canary("signing"))
    open_gateway = await gateway(settings=signing)
    made = await open_gateway.post(
        "/v1/say/sign", json={"voice": "joe", "text": "Hi.", "ext": "wav"}
    )
    path = (await made.json())["path"]
    assert (await open_gateway.get(path)).status == 200
    keyed = await gateway(
        settings=signing.replace(api_keys_file=str(standard_keys(tmp_path / "keys.toml")))
    )
    refused = await keyed.get(path)
    assert refused.status == 403 and error_of(await refused.read())["code"] == "signer_revoked"


def test_an_open_gateway_beyond_loopback_says_so_when_it_starts_listening(tmp_path: Path) -> None:
    """Open is for a laptop: listening on every address without keys, each process's
    "listening on" line is a warning that says so (on loopback it is plain information)."""
    from tests.served import DefaultServer

    server = DefaultServer(tmp_path, "--host", "0.0.0.0", "--log-format", "json")
    try:
        server.wait_ready()
        lines = [x for x in server.json_lines() if x["msg"].startswith("listening on")]
        assert len(lines) == server.gateways, server.logs()
        for line in lines:
            assert line["level"] == "warning"
            assert "beyond loopback with no API keys" in line["msg"]
            assert "api_keys_file" in line["msg"]
    finally:
        server.close()


# ---- requests the HTTP parser refuses: logged without their bytes, and boundedly -------------


def malformed_requests(secret: str) -> list[bytes]:
    """Requests aiohttp's parser refuses, each carrying a real key where the refused bytes are:
    a control byte in the Authorization header, an oversized Authorization line, a header name
    with a control byte, a bad request line after a good request (aiohttp logs a bad first
    request line at debug only), and a bad HTTP version."""
    good = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    auth = f"Authorization: Bearer {secret}".encode()
    return [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"\x01\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"A" * 9000 + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-K\x01ey: " + secret.encode() + b"\r\n\r\n",
        good + b"G\x01T /v1/models?k=" + secret.encode() + b" HTTP/1.1\r\n" + auth + b"\r\n\r\n",
        b"GET /v1/models?k=" + secret.encode() + b" HTTP/9.x\r\nHost: x\r\n" + auth + b"\r\n\r\n",
    ]


async def refused(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on its own connection; the status line of the last answer before the
    server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(30):
            answer = b""
            while piece := await reader.read(65536):
                answer += piece
    finally:
        writer.close()
    return re.findall(rb"HTTP/1\.[01] (\d{3}) ", answer)[-1]


async def test_malformed_requests_log_no_secret_and_few_lines(tmp_path: Path) -> None:
    """`voxgate serve` as users start it, with a keys file made by `voxgate keys add`: 1,000
    requests the HTTP parser refuses, each holding a real key in the refused bytes, are all
    answered 400; no log output of any process holds any piece of the key, and they cost a few
    warning lines (one per process per 10 s, as docs/observability.md says), not one each."""
    from tests.ops_support import run_cli
    from tests.served import DefaultServer

    every_s = 10.0

    keys_file = tmp_path / "keys.toml"
    made = await asyncio.to_thread(
        run_cli, "keys", "add", "ivr", "--scopes", "speak", "--file", str(keys_file)
    )
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    server = DefaultServer(tmp_path / "srv", "--api-keys-file", str(keys_file))
    try:
        await asyncio.to_thread(server.wait_ready)
        processes = server.gateways
        before = len(server.logs().splitlines())
        started = time.monotonic()
        requests = malformed_requests(secret) * 200
        limit = asyncio.Semaphore(16)

        async def send(raw: bytes) -> bytes:
            async with limit:
                return await refused(server.port, raw)

        statuses = await asyncio.gather(*(send(raw) for raw in requests))
        elapsed = time.monotonic() - started
        assert statuses == [b"400"] * len(requests)
        assert server.terminate() == 0
    finally:
        server.close()
    logs = server.logs()
    for piece in (secret[:12], secret[12:24], secret[-12:]):
        assert piece not in logs
    added = logs.splitlines()[before:]
    warnings = [line for line in added if "refused by the HTTP parser" in line]
    assert warnings and all('"level": "warning"' in line for line in warnings)
    bound = processes * (1 + elapsed / every_s)
    assert len(warnings) <= bound, (len(warnings), bound)
    # Nothing else per refusal: beside the warnings, the access lines of the good requests that
    # came first on their connections, and the shutdown's few lines.
    others = [x for x in added if '"voxgate.access"' not in x and x not in warnings]
    assert len(others) <= 40, others[:50]
