"""Every bad input gets a 4xx JSON error in OpenAI's shape; nothing is cached; the server stays up."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, error_of

GOOD = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "wav"}

CASES: list[tuple[str, Any, int, str | None, str]] = [
    # (name, body (dict -> JSON, bytes -> raw), status, param, words in the message)
    ("empty input", {**GOOD, "input": ""}, 400, "input", "empty"),
    ("whitespace input", {**GOOD, "input": " \n\t "}, 400, "input", "whitespace"),
    ("input too long", {**GOOD, "input": "a" * 4097}, 400, "input", "limit is 4096"),
    ("unknown voice", {**GOOD, "voice": "nobody"}, 400, "voice", "unknown voice 'nobody'"),
    ("unknown model", {**GOOD, "model": "tts-9"}, 400, "model", "unknown model 'tts-9'"),
    ("unknown format", {**GOOD, "response_format": "wma"}, 400, "response_format", "wma"),
    ("speed too low", {**GOOD, "speed": 0.1}, 400, "speed", "between 0.25 and 4.0"),
    ("speed too high", {**GOOD, "speed": 4.5}, 400, "speed", "between 0.25 and 4.0"),
    ("speed not a number", {**GOOD, "speed": "fast"}, 400, "speed", "number"),
    ("input not a string", {**GOOD, "input": 42}, 400, "input", "must be a string"),
    ("missing input", {k: v for k, v in GOOD.items() if k != "input"}, 400, "input", "missing"),
    ("missing model", {k: v for k, v in GOOD.items() if k != "model"}, 400, "model", "missing"),
    ("missing voice", {k: v for k, v in GOOD.items() if k != "voice"}, 400, "voice", "missing"),
    ("sample rate out of range", {**GOOD, "sample_rate": 96000}, 400, "sample_rate", "8000"),
    ("invalid JSON", b'{"model": "tts-1", "input": ', 400, None, "not valid JSON"),
    ("not JSON at all", b"input=hello&voice=alloy", 400, None, "not valid JSON"),
    ("JSON but not an object", b'["tts-1", "hello"]', 400, None, "JSON object"),
    ("empty body", b"", 400, None, "empty"),
    (
        "invalid UTF-8",
        b'{"model": "tts-1", "input": "caf\xe9", "voice": "alloy"}',
        400,
        None,
        "UTF-8",
    ),
    (
        "lone surrogate",
        b'{"model": "tts-1", "input": "a\\ud800b", "voice": "alloy"}',
        400,
        "input",
        "invalid Unicode",
    ),
    ("oversized body", {**GOOD, "input": "x" * 300_000}, 413, None, "too large"),
]


@pytest.mark.parametrize(
    ("name", "payload", "status", "param", "words"), CASES, ids=[c[0] for c in CASES]
)
async def test_bad_input(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    name: str,
    payload: Any,
    status: int,
    param: str | None,
    words: str,
) -> None:
    client = await gateway()
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    resp = await client.post(
        "/v1/audio/speech", data=data, headers={"Content-Type": "application/json"}
    )
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    err = (await resp.json())["error"]
    assert set(err) >= {"message", "type", "param"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert words.lower() in err["message"].lower()
    assert counting_engine.items == 0
    # nothing was cached and the server still serves a good request
    ok = await client.post("/v1/audio/speech", json=GOOD)
    assert ok.status == 200
    assert ok.headers["X-Cache"] == "MISS"


async def test_input_limit_is_configurable(gateway: GatewayFactory, settings: Settings) -> None:
    client = await gateway(settings=settings.replace(max_input_chars=10))
    resp = await client.post("/v1/audio/speech", json={**GOOD, "input": "eleven char"})
    assert "limit is 10" in (await error_of(resp, 400))["message"]


async def test_unknown_route_and_method_are_json(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.get("/v1/nothing")
    assert (await error_of(r, 404))["type"] == "not_found_error"
    r = await client.delete("/v1/voices")
    assert "not allowed" in (await error_of(r, 405))["message"]


async def test_audio_by_key_malformed_and_unknown(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.get("/v1/audio/not-a-key")
    assert (await error_of(r, 400))["param"] == "key"
    r = await client.get("/v1/audio/" + "0" * 64)
    assert r.status == 404


async def test_input_with_nothing_to_speak_is_400_and_not_cached(
    gateway: GatewayFactory,
) -> None:
    client = await gateway()
    for _ in range(2):  # the second time too: a failure is never stored
        r = await client.post("/v1/audio/speech", json={**GOOD, "input": "?"})
        err = await error_of(r, 400)
        assert err["param"] == "input"
        assert err["code"] == "nothing_to_speak"
        assert "nothing to speak" in err["message"]
    ok = await client.post("/v1/audio/speech", json=GOOD)
    assert ok.status == 200


async def test_405_names_the_allowed_methods(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.get("/v1/audio/speech")
    assert r.status == 405
    assert r.headers["Allow"] == "POST"
    assert "allowed: POST" in (await r.json())["error"]["message"]
    r = await client.post("/v1/voices")
    assert r.status == 405
    assert r.headers["Allow"] == "GET, HEAD"


async def test_a_bug_in_a_handler_is_a_json_500_and_the_server_keeps_serving(
    gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.http import handlers as app_module

    client = await gateway()

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app_module, "serve_speech", broken)
    r = await client.post("/v1/audio/speech", json=GOOD)
    err = await error_of(r, 500)
    assert err["type"] == "server_error"
    assert "a bug" not in err["message"]  # internals stay in the log
    assert any(rec.exc_info and "a bug" in str(rec.exc_info[1]) for rec in caplog.records)
    assert GOOD["input"] not in caplog.text
    monkeypatch.undo()
    ok = await client.post("/v1/audio/speech", json=GOOD)
    assert ok.status == 200
