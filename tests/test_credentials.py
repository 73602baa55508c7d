"""Provider credentials in no log line and no answer: every upstream kind against its local
provider (tests/upstream_support.py), with a canary key that the provider quotes back in its
error text and, for the openai kind, a canary password in ``base_url``. Every log record (DEBUG,
every logger: the HTTP clients' included) and every body is searched for them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from synth import credentials
from synth.upstream import UpstreamConfig
from tests import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine
from tests.upstream_support import (
    AzureServer,
    CartesiaServer,
    ContractServer,
    DeepgramServer,
    ElevenLabsServer,
    GoogleServer,
    LoopbackProvider,
    OpenAISpeechServer,
    PollyServer,
    Scripted,
)

CANARY_KEY = "sk-canary-7Hq2ZpW9xLr4mN5b"
CANARY_PASSWORD = "pw-canary-Qm8Tt3Vv0Kd2"
KEY_ENV = "VOXGATE_TEST_CANARY_KEY"
ID_ENV = "VOXGATE_TEST_CANARY_KEY_ID"
ECHO = f"invalid key {CANARY_KEY} for this voice"
# The provider's error text in every shape the kinds read (each takes the first it knows).
ECHO_BODY = json.dumps(
    {"error": {"message": ECHO}, "detail": {"message": ECHO}, "err_msg": ECHO, "message": ECHO}
).encode()


class EchoingElevenLabs(ElevenLabsServer):
    """ElevenLabs' endpoint, with ``script`` answers (status, body) given first."""

    def __init__(self) -> None:
        super().__init__(api_key=CANARY_KEY)
        self.script: deque[tuple[int, bytes]] = deque()

    async def _handle(self, request: web.Request) -> web.Response:
        if self.script:
            status, body = self.script.popleft()
            return web.Response(status=status, body=body, content_type="application/json")
        return await super()._handle(request)


def contract(kind: type[ContractServer]) -> ContractServer:
    server = kind()
    server.api_key = CANARY_KEY
    return server


SERVERS: dict[str, Any] = {
    "openai": lambda: OpenAISpeechServer(api_key=CANARY_KEY),
    "elevenlabs": EchoingElevenLabs,
    "azure": lambda: contract(AzureServer),
    "google": lambda: contract(GoogleServer),
    "deepgram": lambda: contract(DeepgramServer),
    "polly": lambda: contract(PollyServer),
    "cartesia": lambda: contract(CartesiaServer),
}
EXTRA: dict[str, dict[str, Any]] = {
    "openai": {"model": "gpt-4o-mini-tts"},
    "elevenlabs": {"model": "eleven_multilingual_v2"},
    "polly": {"key_id_env": ID_ENV, "region": "us-east-1", "model": "neural", "sample_rate": 16000},
    "cartesia": {"model": "sonic-2"},
}


def script_echo(kind: str, server: LoopbackProvider) -> None:
    if isinstance(server, OpenAISpeechServer):
        server.script.append(Scripted(400, ECHO))
    elif isinstance(server, EchoingElevenLabs):
        server.script.append((400, ECHO_BODY))
    else:
        assert isinstance(server, ContractServer), kind
        server.script.append((400, {"Content-Type": "application/json"}, ECHO_BODY))


def leaks(text: str) -> list[str]:
    return [c for c in (CANARY_KEY, CANARY_PASSWORD) if c in text]


@pytest.mark.parametrize("kind", sorted(SERVERS))
async def test_no_credential_in_a_log_line_or_a_relayed_message(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_ENV, CANARY_KEY)
    server = await SERVERS[kind]().start()
    monkeypatch.setenv(ID_ENV, getattr(server, "key_id", "AKIDCANARY"))
    voice = server.voices[0]
    bodies: list[str] = []
    try:
        config = UpstreamConfig(
            name=kind,
            kind=kind,
            base_url=server.url,
            api_key_env=KEY_ENV,
            voices=(voice,),
            max_retries=0,
            **EXTRA.get(kind, {}),
        )
        http = await gateway(engines={"piper": counting_engine, kind: config})
        body = {"model": kind, "input": "Thank you for calling.", "voice": voice}
        ok = await http.post("/v1/audio/speech", json={**body, "response_format": "wav"})
        assert ok.status == 200, await ok.text()
        # The provider quotes the key it was sent in its refusal: relayed, without the key.
        script_echo(kind, server)
        refused = await http.post("/v1/audio/speech", json={**body, "input": "Another text."})
        text = await refused.text()
        bodies.append(text)
        assert refused.status == 400, text
        assert credentials.MASK in json.loads(text)["error"]["message"]
    finally:
        await server.stop()
    assert [leaks(b) for b in bodies] == [[]]
    assert [r.name for r in caplog.records if leaks(r.getMessage())] == []
    assert leaks(caplog.text) == []


async def test_a_password_in_an_openai_base_url_is_sent_and_never_logged(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The HTTP client logged the URL it called, user:password included, on every call: the
    password now goes as Basic auth (what the client made of it before) and not in the URL."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_ENV, CANARY_KEY)
    server = await OpenAISpeechServer(api_key=CANARY_KEY).start()
    try:
        url = server.url.replace("http://", f"http://voxgate:{CANARY_PASSWORD}@")
        config = UpstreamConfig(
            name="openai",
            kind="openai",
            base_url=url,
            api_key_env=KEY_ENV,
            model="gpt-4o-mini-tts",
            voices=("alloy",),
            max_retries=0,
        )
        http = await gateway(engines={"piper": counting_engine, "openai": config})
        r = await http.post(
            "/v1/audio/speech", json={"model": "openai", "input": "Hello.", "voice": "alloy"}
        )
        text = await r.text()
        # This provider wants the key as a bearer token; the URL's credentials replace it.
        assert r.status == 502 and leaks(text) == [], text
        import base64

        sent = base64.b64encode(f"voxgate:{CANARY_PASSWORD}".encode()).decode()
        assert server.headers[-1]["Authorization"] == f"Basic {sent}"
    finally:
        await server.stop()
    assert any(r.name.startswith("httpx") for r in caplog.records)  # (the client did log)
    assert [r.name for r in caplog.records if leaks(r.getMessage())] == []
    assert leaks(caplog.text) == []


def test_scrub_masks_every_form_of_a_secret_and_a_clipped_one() -> None:
    credentials.register(["s3cr3t-canary/+x"])
    assert credentials.scrub("a s3cr3t-canary/+x b") == "a [redacted] b"
    assert credentials.scrub("a s3cr3t-canary%2F%2Bx b") == "a [redacted] b"
    assert credentials.scrub("cut at s3cr3t-ca...") == "cut at [redacted]..."
    assert credentials.scrub("nothing here") == "nothing here"
    assert credentials.userinfo("http://u%40x:p%2Fw@h/") == ("u%40x", "u@x", "p%2Fw", "p/w")
    assert credentials.strip_userinfo("http://u:p@h:1/v1") == "http://h:1/v1"


def test_a_record_whose_arguments_do_not_fit_is_left_to_the_handler() -> None:
    credentials.register(["s3cr3t-canary/+x"])
    credentials.install()
    record = logging.getLogRecordFactory()("httpx2", logging.INFO, "f", 1, "%d", ("x",), None)
    assert (record.msg, record.args) == ("%d", ("x",))
    key = logging.getLogRecordFactory()(
        "httpx2", logging.INFO, "f", 1, "k=%s", ("s3cr3t-canary/+x",), None
    )
    assert key.getMessage() == "k=[redacted]"


@pytest.mark.canary_allowed("it shows canaries to see that the suite-wide check notes them")
async def test_the_suite_wide_check_sees_a_canary_in_a_log_record_and_a_body_whole_or_streamed() -> (
    None
):
    import httpx2
    from aiohttp.test_utils import TestClient, TestServer

    shown = canary.canary("check")
    logging.getLogger("voxgate.check").debug("key %s", shown)

    async def answer(_: web.Request) -> web.Response:
        return web.Response(text=shown)

    async def trickle(request: web.Request) -> web.StreamResponse:
        """The canary split across two chunks of a streamed answer."""
        response = web.StreamResponse()
        await response.prepare(request)
        for part in (b"event: x\ndata: " + shown[:20].encode(), shown[20:].encode() + b"\n\n"):
            await response.write(part)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", answer)
    app.router.add_get("/stream", trickle)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert await (await client.get("/")).text() == shown
        url = str(client.make_url("/"))
        streamed = await client.get("/stream")
        assert b"".join([part async for part in streamed.content.iter_chunked(7)]).endswith(
            shown.encode() + b"\n\n"
        )
        async with (
            httpx2.AsyncClient() as httpx_client,
            httpx_client.stream("GET", url + "stream?httpx") as answered,
        ):
            assert shown.encode() in b"".join([part async for part in answered.aiter_bytes()])
    request = httpx2.Request("GET", url + "openai")
    read = httpx2.Response(200, content=shown.encode(), request=request).read()
    assert read == shown.encode()
    assert canary.shown() == [
        f"log record voxgate.check DEBUG: {shown}",
        f"the body of GET {url}: {shown}",
        f"the body of GET {url}stream: {shown}",
        f"the body of GET {url}stream?httpx: {shown}",
        f"the body of GET {url}openai: {shown}",
    ]


def test_a_canary_in_the_log_of_voxgate_serve_fails_its_close(tmp_path: Path) -> None:
    from tests.ops_support import ServerProcess

    server = ServerProcess(tmp_path)
    server._log.write(f"key {canary.canary('serve')}\n".encode())
    with pytest.raises(AssertionError, match=canary.canary("serve")):
        server.close()


async def test_voxgate_serve_logs_and_answers_no_credential(tmp_path: Path) -> None:
    """The same through `voxgate serve` at --log-level debug (upstream calls are made in its
    pool process): its whole output, and every body, is searched."""
    from tests.served import DefaultServer
    from tests.test_upstream_serve import write_upstreams

    provider = await OpenAISpeechServer(api_key=CANARY_KEY).start()
    common = {"kind": "openai", "api_key_env": KEY_ENV, "model": "gpt-4o-mini-tts"}
    proxied = provider.url.replace("http://", f"http://voxgate:{CANARY_PASSWORD}@")
    upstreams = write_upstreams(
        tmp_path / "upstreams.toml",
        {"name": "openai", "base_url": provider.url, "max_retries": 0, **common},
        {"name": "proxied", "base_url": proxied, "max_retries": 0, **common},
    )
    server = DefaultServer(
        tmp_path / "srv",
        "--upstreams-file",
        str(upstreams),
        "--log-level",
        "debug",
        env={KEY_ENV: CANARY_KEY},
    )
    bodies: list[bytes] = []
    try:
        await asyncio.to_thread(server.wait_ready)
        speak = {"input": "Thank you for calling.", "voice": "alloy", "response_format": "wav"}
        status, _, body = await server.request(
            "POST", "/v1/audio/speech", json={**speak, "model": "openai"}
        )
        assert status == 200
        provider.script.append(Scripted(400, ECHO))
        status, _, body = await server.request(
            "POST", "/v1/audio/speech", json={**speak, "model": "openai", "input": "Two."}
        )
        bodies.append(body)
        assert status == 400 and credentials.MASK.encode() in body, body
        status, _, body = await server.request(
            "POST", "/v1/audio/speech", json={**speak, "model": "proxied", "input": "Three."}
        )
        bodies.append(body)
        assert status == 502, body
        assert provider.headers[-1]["Authorization"].startswith("Basic ")
    finally:
        server.close()
        await provider.stop()
    logs = server.logs()
    assert "HTTP Request: POST" in logs  # (the HTTP client's own lines are in the output)
    assert leaks(logs) == []
    assert [leaks(b.decode(errors="replace")) for b in bodies] == [[], []]
