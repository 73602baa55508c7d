"""Hostile input against every endpoint: each case is answered below 500 (the specific 4xx where
one is clearly right), errors in OpenAI's JSON shape with a bounded message, and after the whole
table the server is healthy and still speaks.

One real gateway serves the whole module (on loopback, in a thread with its own event loop), and
the cases are sent as raw bytes over a socket: a well-behaved HTTP client would refuse to send
half of them (control characters in a path, an unknown method, a header that is not ASCII).
Requests that would synthesize are tiny, or refused before synthesis.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from aiohttp import web

from gateway.api.say import signed_say_path
from gateway.http.app import create_app
from gateway.http.routes import route_table
from gateway.runtime.settings import Settings
from synth.piper_engine import PiperEngine
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, ServerThread

# One pytest-xdist worker runs the whole module: its tests share the module-scoped gateways.
pytestmark = pytest.mark.xdist_group("hostile")

SECRET = canary("hostile-signing")
GOOD = {"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "wav"}
KEY = "0" * 64
TAKE_ID = "0123456789abcdef"  # a well-formed id of a refused take that is not there
# The longest error message any case may receive: names and values are echoed truncated.
MAX_MESSAGE = 1024


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Gateway:
    host: str
    port: int
    engine: CountingEngine | None = None  # (None: a server in its own processes)


@pytest.fixture(scope="module")
def hostile_gateway(
    piper_engine: PiperEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    directory: Path = tmp_path_factory.mktemp("hostile")
    settings = Settings.load(
        env={},
        overrides={
            "cache_dir": str(directory / "cache"),
            "port": "0",
            "url_signing_secret": SECRET,
        },
    )
    engine = CountingEngine(piper_engine)
    server = ServerThread(settings, engine)
    server.start()
    gateway = Gateway("127.0.0.1", server.port, engine)
    try:
        wait_ready(gateway)
        yield gateway
    finally:
        server.stop()


def wait_ready(gateway: Gateway) -> None:
    """Until /readyz says the models are warm."""
    deadline = time.monotonic() + 120
    while send(gateway, "GET", "/readyz").status != 200:
        if time.monotonic() > deadline:
            raise TimeoutError("gateway did not become ready")
        time.sleep(0.05)


# ---- a raw HTTP/1.1 client ---------------------------------------------------------------------


def _complete(data: bytes, method: str) -> bool:
    """Whether ``data`` holds a whole response (so a reply is read without waiting for the
    server to close: aiohttp lingers up to 10 s reading a body it refused)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    lines = head.decode("latin-1").lower().split("\r\n")
    if method == "HEAD" or lines[0].split(" ")[1:2] in (["204"], ["304"]):
        return True
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip() == "content-length":
            return len(body) >= int(value)
        if name.strip() == "transfer-encoding" and "chunked" in value:
            return body.endswith(b"0\r\n\r\n")
    return False


def _read_reply(sock: socket.socket, method: str) -> bytes:
    data = b""
    while not _complete(data, method):
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += body[:size]
        body = body[size + 2 :]
    return bytes(out)


def parse_reply(data: bytes, method: str, seconds: float) -> Reply:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if method == "HEAD":
        body = b""
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return Reply(status, headers, body, seconds)


def exchange(gateway: Gateway, raw: bytes, method: str = "GET", timeout: float = 30) -> Reply:
    """Send ``raw`` (a whole request, the connection closed after) and read the reply. A server
    that answers before the body is all sent (413) may reset the connection under the sender."""
    started = time.perf_counter()
    with socket.create_connection((gateway.host, gateway.port), timeout=timeout) as sock:
        # (a 413 may come, and the connection close, before the body is all sent)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
        data = _read_reply(sock, method)
    return parse_reply(data, method, time.perf_counter() - started)


def request_bytes(
    method: str | bytes,
    target: str | bytes,
    headers: dict[str, str | bytes] | None = None,
    body: bytes = b"",
    *,
    length: bool = True,
) -> bytes:
    """A request as bytes; ``Content-Length`` added for a body unless ``headers`` has one (or
    ``length`` is off)."""
    m = method.encode() if isinstance(method, str) else method
    t = target.encode() if isinstance(target, str) else target
    lines = [m + b" " + t + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    given = {k.lower() for k in (headers or {})}
    for name, value in (headers or {}).items():
        lines.append(name.encode() + b": " + (value.encode() if isinstance(value, str) else value))
    if length and body and "content-length" not in given and "transfer-encoding" not in given:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def send(
    gateway: Gateway,
    method: str | bytes,
    target: str | bytes,
    headers: dict[str, str | bytes] | None = None,
    body: bytes = b"",
) -> Reply:
    name = method.decode("latin-1") if isinstance(method, bytes) else method
    return exchange(gateway, request_bytes(method, target, headers, body), name)


# ---- the table ---------------------------------------------------------------------------------

JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Case:
    """One hostile request: ``raw`` bytes, or method/target/headers/body."""

    method: str | bytes = "GET"
    target: str | bytes = "/"
    headers: dict[str, str | bytes] = field(default_factory=dict)
    body: bytes = b""
    status: int | None = None  # the exact status, where one is clearly right
    json_error: bool = True  # answered with an OpenAI-shaped JSON error
    param: str | None = None  # the error's param, where it names one
    raw: bytes | None = None
    max_seconds: float | None = None

    def to_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return request_bytes(self.method, self.target, self.headers, self.body)


SSML_BOMB = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lollollollol">'
    + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 9)).replace(
        "&lol0;", "&lol;"
    )
    + "]><speak>&lol8;</speak>"
)


def post_json(
    target: str, body: Any, status: int | None = 400, param: str | None = None, **kw: Any
) -> Case:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Case("POST", target, dict(JSON), data, status=status, param=param, **kw)


def speech(status: int | None = 400, param: str | None = None, **fields: Any) -> Case:
    return post_json("/v1/audio/speech", {**GOOD, **fields}, status, param)


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def nested_list(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


DEEP = nested(5000)
HUGE_INT = b"1" + b"0" * 400
CONTROL = "Hi\x01there."
NUL_ONLY = "\x00\x00\x00"
LONG_NAME = "v" * 200_000

CASES: list[Any] = [
    # ---- POST /v1/audio/speech ----
    # ---- SSML: refused at parse, before anything is expanded (more below) ----
    pytest.param(
        speech(input="<speak>" + "<s>a</s>" * 10_000 + "</speak>", param="input"),
        id="speech-ssml-10000-elements",
    ),
    pytest.param(
        speech(input='<speak><audio src="http://169.254.169.254/"/></speak>', param="input"),
        id="speech-ssml-audio-fetch",
    ),
    pytest.param(speech(input="Hi\x00there."), id="speech-nul-in-input"),
    pytest.param(speech(input=NUL_ONLY), id="speech-nul-only-input"),
    pytest.param(speech(input=CONTROL), id="speech-control-char"),
    pytest.param(speech(input="\x1b[31mred\x1b[0m"), id="speech-ansi-escape"),
    pytest.param(speech(input="\x7f\x7f"), id="speech-del-only"),
    pytest.param(speech(input="\u0085\u009b"), id="speech-c1-controls"),
    pytest.param(post_json("/v1/audio/speech", DEEP), id="speech-json-5000-deep"),
    pytest.param(post_json("/v1/audio/speech", nested_list(5000)), id="speech-list-5000-deep"),
    pytest.param(
        post_json(
            "/v1/audio/speech",
            json.dumps({**GOOD, "extra": {}}).encode().replace(b"{}", nested(3000)),
            status=None,
        ),
        id="speech-deep-unknown-field",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech",
            b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":' + HUGE_INT + b"}",
            param="speed",
        ),
        id="speech-speed-10e400",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech",
            b'{"model":"tts-1","input":"Hi.","voice":"alloy","sample_rate":' + HUGE_INT + b"}",
            param="sample_rate",
        ),
        id="speech-rate-10e400",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech",
            b'{"model":"tts-1","input":"Hi.","voice":"alloy","sample_rate":-' + HUGE_INT + b"}",
            param="sample_rate",
        ),
        id="speech-rate-minus-10e400",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech",
            b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":1e400}',
            param="speed",
        ),
        id="speech-speed-1e400-float",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech", b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":NaN}'
        ),
        id="speech-speed-nan",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech", b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":Infinity}'
        ),
        id="speech-speed-infinity",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech", b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":-Infinity}'
        ),
        id="speech-speed-minus-infinity",
    ),
    pytest.param(speech(speed=True, param="speed"), id="speech-speed-bool"),
    pytest.param(speech(speed=[1], param="speed"), id="speech-speed-list"),
    pytest.param(speech(sample_rate=16000.5, param="sample_rate"), id="speech-rate-float"),
    pytest.param(speech(sample_rate="16000", param="sample_rate"), id="speech-rate-string"),
    pytest.param(speech(input=["Hi."], param="input"), id="speech-input-list"),
    pytest.param(speech(input={"text": "Hi."}, param="input"), id="speech-input-object"),
    pytest.param(speech(input=None, param="input"), id="speech-input-null"),
    pytest.param(speech(model=1, param="model"), id="speech-model-int"),
    pytest.param(speech(voice=None, param="voice"), id="speech-voice-null"),
    pytest.param(speech(stream="yes", param="stream"), id="speech-stream-string"),
    pytest.param(speech(stream_format="websocket"), id="speech-stream-format-bad"),
    pytest.param(speech(stream_format="sse", stream=False), id="speech-sse-stream-false"),
    pytest.param(speech(stream_format="sse", response_format="mp4"), id="speech-sse-bad-format"),
    pytest.param(speech(stream=True, response_format="flac"), id="speech-stream-unstreamable"),
    pytest.param(speech(stream_format=1), id="speech-stream-format-int"),
    pytest.param(speech(normalize="shout"), id="speech-normalize-bad"),
    pytest.param(speech(instructions="x" * 5000), id="speech-instructions-too-long"),
    pytest.param(speech(voice=LONG_NAME, param="voice"), id="speech-overlong-voice-echo"),
    pytest.param(speech(model=LONG_NAME, param="model"), id="speech-overlong-model-echo"),
    pytest.param(
        speech(response_format=LONG_NAME, param="response_format"), id="speech-overlong-format"
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech", {**GOOD, **{f"f{i}" * 50: 1 for i in range(2000)}}, status=None
        ),
        id="speech-2000-unknown-fields",
    ),
    pytest.param(
        post_json("/v1/audio/speech", {**GOOD, "a\r\nX-Evil: 1": 1}, status=None),
        id="speech-crlf-field-name",
    ),
    pytest.param(speech(input="a" * 4097, param="input"), id="speech-input-over-limit"),
    # ---- SSML (input_type "ssml") ----
    pytest.param(speech(input_type="ssml", input="<speak>Hi."), id="ssml-unclosed"),
    pytest.param(
        speech(
            input_type="ssml", input="<speak>" + "<p>" * 1000 + "Hi." + "</p>" * 1000 + "</speak>"
        ),
        id="ssml-1000-deep",
    ),
    pytest.param(
        speech(
            input_type="ssml",
            input='<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><speak>&b;</speak>',
        ),
        id="ssml-entity-expansion",
    ),
    pytest.param(
        speech(
            input_type="ssml",
            input='<!DOCTYPE s [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
        ),
        id="ssml-external-entity",
    ),
    pytest.param(speech(input_type="ssml", input="<speak>Hi\x00</speak>"), id="ssml-nul"),
    pytest.param(
        speech(
            input_type="ssml",
            input='<speak><say-as interpret-as="cardinal">' + "9" * 4000 + "</say-as></speak>",
        ),
        id="ssml-say-as-4000-digits",
    ),
    pytest.param(
        speech(
            input_type="ssml",
            input='<speak><say-as interpret-as="cardinal">1e999999</say-as></speak>',
            status=None,
        ),
        id="ssml-say-as-exponent",
    ),
    pytest.param(
        speech(input_type="ssml", input='<speak>Hi.<break time="99999999999999s"/></speak>'),
        id="ssml-huge-break",
    ),
    pytest.param(
        speech(input_type="ssml", input='<speak><prosody rate="1e400">Hi.</prosody></speak>'),
        id="ssml-rate-1e400",
    ),
    pytest.param(
        speech(input_type="ssml", input='<speak><prosody rate="\u00b2%">Hi.</prosody></speak>'),
        id="ssml-rate-superscript",
    ),
    pytest.param(
        speech(input_type="ssml", input='<speak><phoneme ph="\x01">Hi</phoneme></speak>'),
        id="ssml-phoneme-control",
    ),
    pytest.param(speech(input_type="xml"), id="ssml-bad-input-type"),
    pytest.param(
        Case("POST", "/v1/audio/speech", dict(JSON), b"", status=400), id="speech-empty-body"
    ),
    pytest.param(
        # No Content-Type: not JSON (require_json_content_type), 415 before the body is read.
        Case("POST", "/v1/audio/speech", {}, b"", status=415),
        id="speech-no-body-no-type",
    ),
    pytest.param(post_json("/v1/audio/speech", b"null"), id="speech-json-null"),
    pytest.param(post_json("/v1/audio/speech", b'"Hi."'), id="speech-json-string"),
    pytest.param(post_json("/v1/audio/speech", b"1" * 5000), id="speech-json-5000-digit-number"),
    pytest.param(
        post_json("/v1/audio/speech", b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), status=None),
        id="speech-utf8-bom",
    ),
    pytest.param(
        post_json("/v1/audio/speech", json.dumps(GOOD).encode("utf-16")), id="speech-utf16-body"
    ),
    pytest.param(
        post_json("/v1/audio/speech", b'{"model":"tts-1","model":"x","input":"Hi.","voice":"a"}'),
        id="speech-duplicate-keys",
    ),
    pytest.param(
        post_json("/v1/audio/speech", b'{"input": "\\u0000"}'), id="speech-escaped-nul-only"
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json; charset=\x01"},
            json.dumps(GOOD).encode(),
            status=400,
            json_error=False,
        ),
        id="speech-content-type-control",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": ";;;==="},
            json.dumps(GOOD).encode(),
            status=415,
        ),
        id="speech-content-type-malformed",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "multipart/form-data"},
            b"--x\r\n\r\n",
            status=415,
        ),
        id="speech-multipart-no-boundary",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Length": str(10**10)},
            b"{}",
            status=413,
            max_seconds=5,
        ),
        id="speech-declared-10gb",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Length": "1" + "0" * 30},
            b"{}",
            status=None,
            json_error=False,
            max_seconds=5,
        ),
        id="speech-declared-length-30-digits",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Length": "-1"},
            b"{}",
            status=400,
            json_error=False,
        ),
        id="speech-negative-length",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Length": "\u00b2".encode()},
            b"{}",
            status=400,
            json_error=False,
        ),
        id="speech-length-non-ascii-digit",
    ),
    pytest.param(
        post_json(
            "/v1/audio/speech",
            json.dumps({**GOOD, "input": "x" * 400_000}).encode(),
            status=413,
            max_seconds=5,
        ),
        id="speech-400kb-input",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            b"".join(b"%x\r\n" % 65536 + b"x" * 65536 + b"\r\n" for _ in range(64)) + b"0\r\n\r\n",
            status=413,
            max_seconds=10,
        ),
        id="speech-chunked-4mb",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
            b"zz\r\nxx\r\n0\r\n\r\n",
            status=400,
            json_error=False,
        ),
        id="speech-bad-chunk-size",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            b"not gzip at all",
        ),
        id="speech-bad-gzip",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            gzip.compress(b" " * 4_000_000),
            status=413,
        ),
        id="speech-gzip-bomb",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json", "Content-Encoding": "br"},
            b"abcd",
            status=400,
            json_error=False,
        ),
        id="speech-unsupported-content-encoding",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {
                "Content-Type": "application/json",
                "Content-Length": str(10**10),
                "Expect": "100-continue",
            },
            status=413,
            max_seconds=5,
        ),
        id="speech-expect-100-continue-10gb",
    ),
    # ---- JSON-only POST routes and Content-Type (require_json_content_type: 415) ----
    *[
        pytest.param(
            Case("POST", target, {"Content-Type": ctype}, json.dumps(GOOD).encode(), status=415),
            id=f"415-{name}-{target}",
        )
        for target in ("/v1/audio/speech", "/v1/prompts", "/v1/say/sign", "/v1/jambonz/tts", "/")
        for name, ctype in (
            ("text-plain", "text/plain"),
            ("form", "application/x-www-form-urlencoded"),
        )
    ],
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/" + "x" * 5000 + "+xml"},
            json.dumps(GOOD).encode(),
            status=415,
        ),
        id="415-overlong-content-type",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/json\u00b2".encode()},
            json.dumps(GOOD).encode(),
            status=415,
        ),
        id="415-content-type-non-ascii",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "APPLICATION/JSON; charset=UTF-8"},
            json.dumps(GOOD).encode(),
            status=200,
            json_error=False,
        ),
        id="json-content-type-any-case",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/audio/speech",
            {"Content-Type": "application/vnd.x+json"},
            json.dumps(GOOD).encode(),
            status=200,
            json_error=False,
        ),
        id="json-content-type-plus-json",
    ),
    # ---- GET /v1/audio/{key} and {key}.{ext} ----
    pytest.param(
        Case("GET", "/v1/audio/" + KEY + "%0A", status=400, param="key"), id="key-trailing-newline"
    ),
    pytest.param(Case("GET", "/v1/audio/" + "A" * 64, status=400, param="key"), id="key-uppercase"),
    pytest.param(
        Case("GET", "/v1/audio/" + "0" * 63 + "%00", status=400, param="key"), id="key-nul"
    ),
    pytest.param(Case("GET", "/v1/audio/" + "g" * 64, status=400, param="key"), id="key-not-hex"),
    pytest.param(
        Case("GET", "/v1/audio/" + "0" * 7000, status=400, param="key"), id="key-7000-chars"
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + "0" * 10_000, status=None, json_error=False),
        id="key-over-line-limit",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + quote("\u0660" * 64), status=400, param="key"),
        id="key-arabic-digits",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + "\u0660" * 64, status=400, json_error=False),
        id="key-raw-utf8-in-path",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY, {"Range": "bytes=\u00b2-"}, status=404),
        id="key-range-superscript",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY + ".ulaw", {"Range": "bytes=0-\u0663"}, status=404),
        id="key-ext-range-arabic",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY + ".mp4", status=400, param="ext"), id="key-ext-unknown"
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY + "." + "x" * 5000, status=400, param="ext"),
        id="key-ext-overlong",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY + "%0A.wav", status=400, param="key"),
        id="key-ext-trailing-newline",
    ),
    pytest.param(
        Case(
            "GET", "/v1/audio/" + KEY, {"If-None-Match": "\x01" * 100}, status=400, json_error=False
        ),
        id="key-if-none-match-control",
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY, {"If-None-Match": 'W/"' + "x" * 5000}, status=404),
        id="key-if-none-match-junk",
    ),
    pytest.param(
        Case(
            "GET", "/v1/audio/" + KEY, {"If-Modified-Since": "yesterday\u00b2".encode()}, status=404
        ),
        id="key-if-modified-since-junk",
    ),
    pytest.param(
        Case("HEAD", "/v1/audio/" + KEY + "%0A", status=400, json_error=False),
        id="key-head-newline",
    ),
    pytest.param(Case("DELETE", "/v1/audio/" + KEY, status=405), id="key-delete"),
    # ---- say URLs ----
    pytest.param(Case("GET", "/v1/say/joe/Hi%00there.wav", status=400, param="text"), id="say-nul"),
    pytest.param(
        Case("GET", "/v1/say/joe/%00%00.wav", status=400, param="text"), id="say-nul-only"
    ),
    pytest.param(
        Case("GET", "/v1/say/joe/%01%02%03.ulaw", status=400, param="text"), id="say-control-only"
    ),
    pytest.param(Case("GET", "/v1/say/joe/%ZZ.wav", status=None), id="say-bad-percent"),
    pytest.param(Case("GET", "/v1/say/joe/%.wav", status=None), id="say-lone-percent"),
    pytest.param(Case("GET", "/v1/say/joe/%C3%28.wav", status=None), id="say-bad-utf8-percent"),
    pytest.param(Case("GET", "/v1/say/joe/%ED%A0%80.wav", status=None), id="say-surrogate"),
    pytest.param(Case("GET", "/v1/say/joe/%2F%2F%2F.wav", status=None), id="say-encoded-slashes"),
    pytest.param(
        Case("GET", "/v1/say/joe/..%2F..%2Fetc%2Fpasswd.wav", status=None), id="say-dot-dot"
    ),
    pytest.param(Case("GET", "/v1/say/joe/Hi.wma", status=400, param="ext"), id="say-unknown-ext"),
    pytest.param(
        Case("GET", "/v1/say/" + "n" * 5000 + "/Hi.wav", status=400, param="voice"),
        id="say-overlong-voice",
    ),
    pytest.param(
        Case("GET", "/v1/say/joe/" + "a" * 5000 + ".wav", status=400, param="text"),
        id="say-text-over-limit",
    ),
    pytest.param(
        Case("GET", "/v1/say/joe/" + "%20" * 50 + ".wav", status=400, param="text"),
        id="say-blank-text",
    ),
    pytest.param(
        Case(
            "GET", "/v1/say/joe/Hi.wav", {"Range": "bytes=\u00b2-"}, status=None, json_error=False
        ),
        id="say-range-superscript",
    ),
    pytest.param(
        Case("GET", "/v1/say/s/%C2%B2.abc/joe/Hi.wav", status=403, param="token"),
        id="signed-superscript-expiry",
    ),
    pytest.param(
        Case("GET", "/v1/say/s/" + "9" * 5000 + ".abc/joe/Hi.wav", status=403),
        id="signed-huge-expiry",
    ),
    pytest.param(
        Case("GET", "/v1/say/s/" + "x" * 5000 + "/joe/Hi.wav", status=403),
        id="signed-overlong-token",
    ),
    pytest.param(Case("GET", "/v1/say/s/%00/joe/Hi.wav", status=403), id="signed-nul-token"),
    pytest.param(
        Case(
            "GET",
            signed_say_path(SECRET, "joe", "Hi\x00.", "wav", int(time.time()) + 3600),
            status=400,
            param="text",
        ),
        id="signed-valid-nul-text",
    ),
    # ---- POST /v1/say/sign ----
    pytest.param(
        post_json(
            "/v1/say/sign",
            {"voice": "joe", "text": "Hi.", "ext": "wav", "expires_in": int("1" + "0" * 400)},
        ),
        id="sign-expires-10e400",
    ),
    pytest.param(
        post_json(
            "/v1/say/sign",
            {"voice": "joe", "text": "Hi.", "ext": "wav", "expires_in": -1},
            param="expires_in",
        ),
        id="sign-expires-negative",
    ),
    pytest.param(
        post_json("/v1/say/sign", {"voice": "joe", "text": "\x00", "ext": "wav"}, param="text"),
        id="sign-nul-text",
    ),
    pytest.param(
        post_json("/v1/say/sign", {"voice": LONG_NAME, "text": "Hi.", "ext": "wav"}, param="voice"),
        id="sign-overlong-voice",
    ),
    pytest.param(
        post_json("/v1/say/sign", {"voice": "joe", "text": "Hi.", "ext": LONG_NAME}, param="ext"),
        id="sign-overlong-ext",
    ),
    pytest.param(post_json("/v1/say/sign", DEEP), id="sign-json-deep"),
    pytest.param(post_json("/v1/say/sign", b"[]"), id="sign-json-list"),
    pytest.param(
        Case("POST", "/v1/say/sign", {"Content-Type": "multipart/form-data"}, b"x", status=415),
        id="sign-multipart-no-boundary",
    ),
    # ---- /api/tts ----
    pytest.param(Case("GET", "/api/tts?text=%00", status=400, param="text"), id="coqui-get-nul"),
    pytest.param(
        Case("GET", "/api/tts?text=Hi%01.", status=400, param="text"), id="coqui-get-control"
    ),
    pytest.param(Case("GET", "/api/tts?text=%FF%FE", status=None), id="coqui-get-bad-utf8"),
    pytest.param(
        Case("GET", "/api/tts?text=Hi.&speaker_id=" + "s" * 5000, status=400, param="speaker_id"),
        id="coqui-overlong-speaker",
    ),
    pytest.param(
        Case("GET", "/api/tts?text=Hi.&language_id=" + "l" * 5000, status=400, param="language_id"),
        id="coqui-overlong-language",
    ),
    pytest.param(
        Case("GET", "/api/tts?text=Hi.&style_wav=x", status=400, param="style_wav"),
        id="coqui-style-wav",
    ),
    pytest.param(
        Case("GET", "/api/tts?text=Hi.&" + "&".join(f"u{i}=1" for i in range(500)), status=400),
        id="coqui-500-unknown-params",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/tts",
            {"text": "\u00e9\x01".encode("latin-1")},
            status=400,
            json_error=False,
        ),
        id="coqui-text-header-control",
    ),
    pytest.param(
        Case("GET", "/api/tts", {"text": "caf\u00e9.".encode("latin-1")}, status=None),
        id="coqui-text-header-latin1",
    ),
    pytest.param(Case("GET", "/api/tts", status=400), id="coqui-get-no-text"),
    pytest.param(
        Case(
            "POST", "/api/tts", {"Content-Type": "multipart/form-data"}, b"--x\r\n\r\n", status=400
        ),
        id="coqui-multipart-no-boundary",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": 'multipart/form-data; boundary=""'},
            b"--\r\n\r\n",
            status=None,
        ),
        id="coqui-multipart-empty-boundary",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b'--b\r\nContent-Disposition: form-data; name="text"\r\n\r\nHi\x00\r\n--b--\r\n',
            status=400,
        ),
        id="coqui-multipart-nul",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b'--b\r\nContent-Disposition: form-data; name="text"; filename="a.txt"\r\n\r\n'
            b"Hi.\r\n--b--\r\n",
            status=400,
        ),
        id="coqui-multipart-file",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b"garbage without any boundary",
            status=None,
        ),
        id="coqui-multipart-garbage",
    ),
    pytest.param(
        # (found by schemathesis: a part with no header lines)
        Case(
            "POST",
            "/api/tts?text=%0A",
            {"Content-Type": "multipart/form-data; boundary=4a55"},
            b"--4a55\r\n70941--4a55--\r\n",
        ),
        id="coqui-multipart-part-without-headers",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b"--b\r\nContent-Disposition: form-data; name=text\r\n\r\nHi.\r\n--b",
        ),
        id="coqui-multipart-unterminated",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b"--b\r\nContent-Disposition: form-data; name=text\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\n!!!\r\n--b--\r\n",
        ),
        id="coqui-multipart-bad-base64",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b"--b\r\nContent-Disposition: form-data; name=text\r\n"
            b"Content-Encoding: gzip\r\n\r\nnot gzip\r\n--b--\r\n",
        ),
        id="coqui-multipart-part-bad-gzip",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b"--b\r\nContent-Type: multipart/mixed; boundary=c\r\n"
            b"Content-Disposition: form-data; name=text\r\n\r\n--c\r\n\r\nx\r\n--c--\r\n--b--\r\n",
        ),
        id="coqui-multipart-nested",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "application/x-www-form-urlencoded"},
            b"text=%00",
            status=400,
        ),
        id="coqui-form-nul",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "application/x-www-form-urlencoded"},
            b"text=%ZZ%",
            status=None,
        ),
        id="coqui-form-bad-percent",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "application/x-www-form-urlencoded"},
            b"\xff\xfe=\xff",
            status=None,
        ),
        id="coqui-form-bad-utf8",
    ),
    pytest.param(post_json("/api/tts", DEEP), id="coqui-json-deep"),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "application/x-www-form-urlencoded; charset=bogus-9"},
            b"text=Hi.",
        ),
        id="coqui-form-unknown-charset",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "multipart/form-data; boundary=b"},
            b'--b\r\nContent-Disposition: form-data; name="text"\r\n'
            b"Content-Type: text/plain; charset=nope\r\n\r\nHi.\r\n--b--\r\n",
        ),
        id="coqui-multipart-unknown-charset",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "application/x-www-form-urlencoded", "Content-Encoding": "gzip"},
            b"text=Hi.",
        ),
        id="coqui-form-bad-gzip",
    ),
    pytest.param(
        post_json(
            "/api/tts", {"text": 10**400 if False else "Hi.", "speaker_id": 1}, param="speaker_id"
        ),
        id="coqui-json-speaker-int",
    ),
    pytest.param(
        post_json("/api/tts", b'{"text":"Hi.","speaker_id":' + HUGE_INT + b"}"),
        id="coqui-json-huge-int",
    ),
    pytest.param(
        Case("POST", "/api/tts", {"Content-Type": "text/plain"}, b"Hi.", status=None),
        id="coqui-text-plain",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/tts",
            {"Content-Type": "\x00/\x00"},
            b"text=Hi.",
            status=400,
            json_error=False,
        ),
        id="coqui-content-type-nul",
    ),
    # ---- GET /synthesize ----
    pytest.param(
        Case("GET", "/synthesize?text=%00", status=400, param="text"), id="synthesize-nul"
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&speed=1e400", status=400, param="speed"),
        id="synthesize-speed-1e400",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&speed=nan", status=400, param="speed"),
        id="synthesize-speed-nan",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&speed=inf", status=400, param="speed"),
        id="synthesize-speed-inf",
    ),
    pytest.param(
        Case(
            "GET", "/synthesize?text=Hi.&sample_rate=" + "9" * 5000, status=400, param="sample_rate"
        ),
        id="synthesize-rate-5000-digits",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&sample_rate=%C2%B2", status=400, param="sample_rate"),
        id="synthesize-rate-superscript",
    ),
    pytest.param(
        Case(
            "GET", "/synthesize?text=Hi.&sample_rate=%D9%A3%D9%A3", status=400, param="sample_rate"
        ),
        id="synthesize-rate-arabic-digits",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&speed=%D9%A1", status=400, param="speed"),
        id="synthesize-speed-arabic-digit",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&format=" + "f" * 5000, status=400, param="format"),
        id="synthesize-overlong-format",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&speaker=" + "s" * 5000, status=400, param="speaker"),
        id="synthesize-overlong-speaker",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&model=" + "m" * 5000, status=400, param="model"),
        id="synthesize-overlong-model",
    ),
    pytest.param(
        Case("GET", "/synthesize?text=Hi.&text=Again.", status=None), id="synthesize-repeated-param"
    ),
    pytest.param(Case("GET", "/synthesize?" + "&" * 5000, status=400), id="synthesize-ampersands"),
    pytest.param(
        Case("GET", "/synthesize?text=" + "a" * 5000, status=400, param="text"),
        id="synthesize-text-over-limit",
    ),
    # ---- POST / (Piper) ----
    pytest.param(post_json("/", {"text": "\x00"}, param="text"), id="piper-nul"),
    pytest.param(
        post_json("/", b'{"text":"Hi.","speaker_id":' + HUGE_INT + b"}", param="speaker_id"),
        id="piper-speaker-id-10e400",
    ),
    pytest.param(post_json("/", b'{"text":"Hi.","length_scale":NaN}'), id="piper-length-nan"),
    pytest.param(post_json("/", b'{"text":"Hi.","noise_scale":1e999}'), id="piper-noise-1e999"),
    pytest.param(
        post_json("/", {"text": "Hi.", "speaker_id": -1}, param="speaker_id"),
        id="piper-speaker-id-negative",
    ),
    pytest.param(
        post_json("/", {"text": "Hi.", "voice": LONG_NAME}, param="voice"),
        id="piper-overlong-voice",
    ),
    pytest.param(
        post_json("/", {"text": "Hi.", "speaker": LONG_NAME}, status=None),
        id="piper-overlong-speaker",
    ),
    pytest.param(post_json("/", DEEP), id="piper-json-deep"),
    pytest.param(post_json("/", b""), id="piper-empty"),
    pytest.param(
        Case("POST", "/", {"Content-Type": "multipart/form-data"}, b"x", status=415),
        id="piper-multipart-no-boundary",
    ),
    # ---- POST /v1/prompts ----
    pytest.param(
        post_json("/v1/prompts", {"prompts": ["\x00"]}, param="prompts[0].input"),
        id="prompts-nul-string",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [{"input": "Hi\x07."}]}, param="prompts[0].input"),
        id="prompts-bell-object",
    ),
    pytest.param(post_json("/v1/prompts", {"prompts": []}, param="prompts"), id="prompts-empty"),
    pytest.param(
        post_json("/v1/prompts", {"prompts": "Hi."}, param="prompts"), id="prompts-not-list"
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [1]}, param="prompts[0]"), id="prompts-int-row"
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [None]}, param="prompts[0]"), id="prompts-null-row"
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [[["Hi."]]]}, param="prompts[0]"),
        id="prompts-nested-list-row",
    ),
    pytest.param(post_json("/v1/prompts", {"prompts": [{}]}), id="prompts-empty-object-row"),
    pytest.param(
        post_json(
            "/v1/prompts", {"prompts": [{"input": "Hi.", "id": "../x"}]}, param="prompts[0].id"
        ),
        id="prompts-path-id",
    ),
    # (ids are stripped, as a catalogue file's cells are: "a\n" is "a")
    pytest.param(
        post_json("/v1/prompts", {"prompts": [{"input": "Hi.", "id": "a\n"}]}, status=200),
        id="prompts-id-trailing-newline",
    ),
    pytest.param(
        post_json(
            "/v1/prompts", {"prompts": [{"input": "Hi.", "id": "a\nb"}]}, param="prompts[0].id"
        ),
        id="prompts-id-inner-newline",
    ),
    pytest.param(
        post_json(
            "/v1/prompts", {"prompts": [{"input": "Hi.", "id": "x" * 5000}]}, param="prompts[0].id"
        ),
        id="prompts-overlong-id",
    ),
    pytest.param(
        post_json(
            "/v1/prompts", {"prompts": [{"input": "Hi.", "id": "a"}, {"input": "Ho.", "id": "a"}]}
        ),
        id="prompts-duplicate-id",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [{"input": "Hi.", LONG_NAME: 1}]}, param="prompts"),
        id="prompts-overlong-unknown-field",
    ),
    pytest.param(
        post_json(
            "/v1/prompts",
            {"prompts": [{"input": "Hi.", "speed": 10**400}]},
            param="prompts[0].speed",
        ),
        id="prompts-speed-10e400",
    ),
    pytest.param(
        post_json(
            "/v1/prompts",
            b'{"prompts":[{"input":"Hi.","rate":' + HUGE_INT + b"}]}",
            param="prompts[0].rate",
        ),
        id="prompts-rate-10e400-raw",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [{"input": "Hi.", "voice": LONG_NAME}]}),
        id="prompts-overlong-voice",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": ["Hi."], "defaults": {"id": "x"}}, param="defaults"),
        id="prompts-defaults-id",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": ["Hi."], "defaults": []}, param="defaults"),
        id="prompts-defaults-list",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": ["Hi."], "extensions": ["exe"]}, param="extensions"),
        id="prompts-bad-extension",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": ["Hi."] * 100_000}, status=None),
        id="prompts-100k-rows",
    ),
    pytest.param(
        post_json("/v1/prompts", {"prompts": [nested(10).decode()]}, status=None, json_error=True),
        id="prompts-json-text-row",
    ),
    pytest.param(post_json("/v1/prompts", DEEP), id="prompts-json-deep"),
    # ---- jambonz ----
    pytest.param(
        post_json("/v1/jambonz/tts", {"text": "\x00", "type": "text"}, param="text"),
        id="jambonz-nul",
    ),
    pytest.param(
        post_json("/v1/jambonz/tts", {"text": "<speak>Hi.", "type": "ssml"}),
        id="jambonz-ssml-unclosed",
    ),
    pytest.param(
        post_json("/v1/jambonz/tts", {"text": "<speak>Hi\x00</speak>", "type": "ssml"}),
        id="jambonz-ssml-nul",
    ),
    pytest.param(
        post_json("/v1/jambonz/tts", {"text": SSML_BOMB, "type": "ssml"}, param="text"),
        id="jambonz-ssml-entity-expansion",
    ),
    pytest.param(
        post_json("/v1/jambonz/tts", {"text": "Hi.", "type": ["text"]}, param="type"),
        id="jambonz-type-list",
    ),
    pytest.param(post_json("/v1/jambonz/tts", {"text": 1}, param="text"), id="jambonz-text-int"),
    pytest.param(
        post_json("/v1/jambonz/tts", {"voice": "joe"}, param="text"), id="jambonz-no-text"
    ),
    pytest.param(
        post_json("/v1/jambonz/tts", {"text": "Hi.", "voice": 1}, param="voice"),
        id="jambonz-voice-int",
    ),
    pytest.param(post_json("/v1/jambonz/tts", DEEP), id="jambonz-json-deep"),
    pytest.param(post_json("/v1/jambonz/tts", b"[]"), id="jambonz-json-list"),
    pytest.param(
        Case("GET", "/v1/jambonz/stream?sampleRate=%C2%B2", status=400, param="sampleRate"),
        id="jambonz-stream-rate-superscript",
    ),
    pytest.param(
        Case("GET", "/v1/jambonz/stream?sampleRate=" + "9" * 5000, status=400, param="sampleRate"),
        id="jambonz-stream-rate-5000-digits",
    ),
    pytest.param(
        Case("GET", "/v1/jambonz/stream?voice=" + "v" * 5000 + "&language=x", status=None),
        id="jambonz-stream-overlong-voice",
    ),
    pytest.param(
        Case("GET", "/v1/jambonz/stream", status=400, json_error=False),
        id="jambonz-stream-not-websocket",
    ),
    pytest.param(
        Case(
            "GET",
            "/v1/jambonz/stream",
            {
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "\x01",
            },
            status=400,
            json_error=False,
        ),
        id="jambonz-stream-bad-ws-key",
    ),
    # ---- listings, health, metrics, openapi ----
    pytest.param(
        Case("GET", "/v1/models?x=%00", status=200, json_error=False), id="models-junk-query"
    ),
    pytest.param(Case("POST", "/v1/models", status=405), id="models-post"),
    pytest.param(Case("PUT", "/v1/audio/models", status=405), id="audio-models-put"),
    pytest.param(Case("PATCH", "/v1/audio/voices", status=405), id="audio-voices-patch"),
    pytest.param(Case("DELETE", "/v1/voices", status=405), id="voices-delete"),
    pytest.param(Case("POST", "/voices", status=405), id="piper-voices-post"),
    pytest.param(Case("POST", "/healthz", status=405), id="healthz-post"),
    pytest.param(Case("PUT", "/readyz", status=405), id="readyz-put"),
    pytest.param(Case("DELETE", "/metrics", status=405), id="metrics-delete"),
    pytest.param(Case("POST", "/openapi.json", status=405), id="openapi-post"),
    pytest.param(Case("DELETE", "/v1/prompts", status=405), id="prompts-delete"),
    pytest.param(
        Case("GET", "/v1/prompts?x=%00&" + "y" * 5000, status=200, json_error=False),
        id="prompts-get-junk-query",
    ),
    pytest.param(Case("PUT", "/", status=405), id="studio-put"),
    pytest.param(Case("GET", "/?%00=%ff", status=200, json_error=False), id="studio-junk-query"),
    # ---- GET /v1/audio/{key}.marks, .vtt, .srt (a stored file's speech marks and captions) ----
    *(
        pytest.param(
            Case("GET", "/v1/audio/" + bad + ext, status=400, param="key"), id=f"{ext}-{name}"
        )
        for ext in (".marks", ".vtt", ".srt")
        for name, bad in (("not-hex", "g" * 64), ("uppercase", "A" * 64))
    ),
    *(
        pytest.param(Case("GET", "/v1/audio/" + KEY + ext, status=404), id=f"{ext}-absent")
        for ext in (".marks", ".vtt", ".srt")
    ),
    pytest.param(
        Case("GET", "/v1/audio/" + KEY + ".marks?types=word,nonsense", status=400, param="types"),
        id="marks-unknown-type",
    ),
    # ---- POST /v1/audio/speech/with-timestamps (a speech body; audio and marks in JSON) ----
    pytest.param(
        post_json("/v1/audio/speech/with-timestamps", {**GOOD, "input": "Hi\x00."}, param="input"),
        id="timestamps-nul",
    ),
    pytest.param(post_json("/v1/audio/speech/with-timestamps", DEEP), id="timestamps-json-deep"),
    pytest.param(
        post_json(
            "/v1/audio/speech/with-timestamps",
            b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":' + HUGE_INT + b"}",
            param="speed",
        ),
        id="timestamps-speed-10e400",
    ),
    pytest.param(
        post_json("/v1/audio/speech/with-timestamps", {**GOOD, "voice": "nobody"}, param="voice"),
        id="timestamps-unknown-voice",
    ),
    # ---- POST /v1/ssml/explain (a speech body, nothing synthesized) ----
    pytest.param(
        post_json("/v1/ssml/explain", {**GOOD, "input": "Hi\x00."}, param="input"),
        id="explain-nul",
    ),
    pytest.param(post_json("/v1/ssml/explain", DEEP), id="explain-json-deep"),
    pytest.param(
        post_json(
            "/v1/ssml/explain",
            b'{"model":"tts-1","input":"Hi.","voice":"alloy","speed":' + HUGE_INT + b"}",
            param="speed",
        ),
        id="explain-speed-10e400",
    ),
    pytest.param(
        post_json("/v1/ssml/explain", {**GOOD, "input_type": "ssml", "input": "<speak>Hi."}),
        id="explain-ssml-unclosed",
    ),
    pytest.param(
        post_json(
            "/v1/ssml/explain",
            {
                **GOOD,
                "input_type": "ssml",
                "input": '<!DOCTYPE s [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
            },
        ),
        id="explain-ssml-external-entity",
    ),
    pytest.param(
        post_json("/v1/ssml/explain", {**GOOD, "voice": LONG_NAME}, param="voice"),
        id="explain-overlong-voice",
    ),
    pytest.param(
        Case(
            "POST",
            "/v1/ssml/explain",
            {"Content-Type": "text/plain"},
            json.dumps(GOOD).encode(),
            status=415,
        ),
        id="explain-text-plain",
    ),
    pytest.param(Case("GET", "/v1/ssml/explain", status=405), id="explain-get"),
    pytest.param(post_json("/v1/ssml/explain", b""), id="explain-empty"),
    pytest.param(Case("GET", "/v1/say/sign", status=405), id="sign-get"),
    pytest.param(Case("GET", "/v1/jambonz/tts", status=405), id="jambonz-get"),
    pytest.param(Case("PUT", "/api/tts", status=405), id="coqui-put"),
    pytest.param(Case("TRACE", "/v1/audio/speech", status=405), id="speech-trace"),
    # (aiohttp's HTTP parser refuses a method it does not know, as text, before any route)
    pytest.param(
        Case("BREW", "/v1/audio/speech", status=400, json_error=False), id="speech-unknown-method"
    ),
    pytest.param(Case("PROPFIND", "/v1/audio/speech", status=405), id="speech-webdav-method"),
    pytest.param(Case("X" * 5000, "/healthz", status=None, json_error=False), id="overlong-method"),
    pytest.param(Case(b"G\x00T", "/healthz", status=400, json_error=False), id="nul-in-method"),
    pytest.param(Case("OPTIONS", "/v1/audio/speech", status=None), id="speech-options"),
    pytest.param(Case("GET", "*", status=None, json_error=False), id="asterisk-target"),
    # Read-only routes take no input: junk query strings and headers change nothing.
    *[
        pytest.param(
            Case("GET", f"{route}?{query}", headers, status=200, json_error=False),
            id=f"{name}-{route}",
        )
        for route in (
            "/v1/models",
            "/v1/audio/models",
            "/v1/audio/voices",
            "/v1/voices",
            "/voices",
            "/healthz",
            "/readyz",
            "/metrics",
            "/openapi.json",
        )
        for name, query, headers in (
            ("junk-query", "%00=%ff&" + "q" * 5000 + "=1", {}),
            ("junk-accept", "", {"Accept": "*/*;q=" + "9" * 500, "Accept-Encoding": "x" * 2000}),
        )
    ],
    # ---- the quarantine's review (admin: this gateway has no keys, so it is open here) ----
    # A take's id is 16 lowercase hex digits, checked before the quarantine is read: anything
    # else in the path is a 400 naming it, whatever a body or the method carries.
    *(
        pytest.param(
            Case(method, f"/v1/takes/{bad}/{action}", status=400, param="id"),
            id=f"takes-{action}-{name}",
        )
        for method, action in (("GET", "audio"), ("POST", "approve"), ("POST", "discard"))
        for name, bad in (
            ("uppercase", TAKE_ID.upper()),
            ("15-digits", TAKE_ID[:-1]),
            ("nul", TAKE_ID[:-1] + "%00"),
            ("trailing-newline", TAKE_ID + "%0A"),
            ("5000-chars", "0" * 5000),
            ("arabic-digits", quote("\u0660" * 16)),
            ("encoded-slash", "..%2F..%2F" + TAKE_ID),
        )
    ),
    # A well-formed id that names no take: 404, never a look elsewhere.
    *(
        pytest.param(
            Case(method, f"/v1/takes/{TAKE_ID}/{action}", status=404), id=f"takes-{action}-absent"
        )
        for method, action in (("GET", "audio"), ("POST", "approve"), ("POST", "discard"))
    ),
    # approve and discard read no body: a hostile one changes nothing.
    *(
        pytest.param(
            post_json(f"/v1/takes/{TAKE_ID}/{action}", body, status=404),
            id=f"takes-{action}-{name}",
        )
        for action in ("approve", "discard")
        for name, body in (
            ("json-deep", DEEP),
            ("list-deep", nested_list(5000)),
            ("huge-int", HUGE_INT),
        )
    ),
    pytest.param(
        post_json(f"/v1/takes/{TAKE_ID.upper()}/approve", DEEP, param="id"),
        id="takes-approve-bad-id-deep-body",
    ),
    pytest.param(Case("GET", f"/v1/takes/{TAKE_ID}/approve", status=405), id="takes-approve-get"),
    pytest.param(
        Case("DELETE", f"/v1/takes/{TAKE_ID}/discard", status=405), id="takes-discard-delete"
    ),
    pytest.param(Case("POST", f"/v1/takes/{TAKE_ID}/audio", status=405), id="takes-audio-post"),
    pytest.param(Case("GET", f"/v1/takes/{TAKE_ID}", status=404), id="takes-no-action"),
    pytest.param(Case("POST", "/v1/takes", status=405), id="takes-list-post"),
    pytest.param(Case("DELETE", "/v1/takes", status=405), id="takes-list-delete"),
    pytest.param(
        Case("GET", "/v1/takes?x=%00&" + "y" * 5000, status=200, json_error=False),
        id="takes-list-junk-query",
    ),
    # ---- paths, headers, request lines ----
    pytest.param(Case("GET", "/" + "p" * 5000, status=404), id="path-5000-echo"),
    pytest.param(
        Case("GET", "/" + "p" * 9000, status=None, json_error=False), id="path-over-line-limit"
    ),
    pytest.param(Case("GET", "/nothing/%00%ff", status=404), id="path-nul-percent"),
    pytest.param(
        Case("GET", b"/nothing/\xff\xfe", status=None, json_error=False), id="path-raw-non-utf8"
    ),
    pytest.param(Case("GET", "/healthz%", status=404), id="path-trailing-percent"),
    pytest.param(Case("GET", "//healthz", status=None, json_error=False), id="path-double-slash"),
    pytest.param(
        Case("GET", "/healthz", {"X-Big": "h" * 9000}, status=None, json_error=False),
        id="header-over-limit",
    ),
    pytest.param(
        Case(
            "GET", "/healthz", {f"X-H{i}": "1" for i in range(200)}, status=None, json_error=False
        ),
        id="headers-200",
    ),
    pytest.param(
        Case("GET", "/healthz", {"X-Bin": b"\x00\x01"}, status=None, json_error=False),
        id="header-nul",
    ),
    pytest.param(
        Case("GET", "/v1/voices", {"Accept": "\u00b2".encode()}, status=200, json_error=False),
        id="header-non-ascii-accept",
    ),
    pytest.param(
        Case(
            raw=b"GET /healthz HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n",
            status=None,
            json_error=False,
        ),
        id="http-version-9",
    ),
    pytest.param(
        Case(raw=b"GET /healthz\r\n\r\n", status=None, json_error=False), id="http-09-request-line"
    ),
    pytest.param(
        Case(
            raw=b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 64,
            status=400,
            json_error=False,
        ),
        id="tls-client-hello",
    ),
]

HEAD_TARGETS = [
    "/v1/models",
    "/v1/audio/models",
    "/v1/audio/voices",
    "/v1/audio/" + KEY,
    "/v1/audio/" + KEY + ".ulaw",
    "/v1/voices",
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/tts?text=%00",
    "/synthesize?speed=nan&text=Hi.",
    "/openapi.json",
    "/voices",
    "/v1/say/joe/%00.wav",
    "/v1/say/s/bad/joe/Hi.wav",
    "/v1/jambonz/stream?sampleRate=%C2%B2",
    "/v1/audio/speech",
    "/v1/prompts",
    "/",
    "/v1/say/sign",
    "/v1/jambonz/tts",
    "/v1/ssml/explain",
    "/v1/audio/speech/with-timestamps",
    "/v1/audio/" + KEY + ".marks",
    "/v1/audio/" + KEY + ".vtt",
    "/v1/audio/" + KEY + ".srt",
    "/v1/takes",
    f"/v1/takes/{TAKE_ID}/audio",
    f"/v1/takes/{TAKE_ID}/approve",
    f"/v1/takes/{TAKE_ID}/discard",
]
CASES += [
    pytest.param(Case("HEAD", target, status=None, json_error=False), id=f"head-{target}")
    for target in HEAD_TARGETS
]


def _path_of(target: str | bytes) -> str:
    return urlsplit(target if isinstance(target, str) else target.decode("latin-1")).path


def _query_of(target: str | bytes) -> str:
    return urlsplit(target if isinstance(target, str) else target.decode("latin-1")).query


def test_every_input_of_every_route_has_refused_cases(tmp_path: Path) -> None:
    """Each input a route of the route table reads is attacked by cases the gateway must refuse
    (a 4xx): a route with a body gets bodies sent with its own method, a route with query
    parameters gets query strings, a route with path parameters gets bad path segments. A route
    or an input added later without such cases fails here."""
    settings = Settings.load(env={}, overrides={"cache_dir": str(tmp_path), "port": "0"})
    cases = [param.values[0] for param in CASES if param.values[0].raw is None]
    refused = [case for case in cases if case.status is not None and 400 <= case.status < 500]
    router = web.UrlDispatcher()
    for route in route_table(settings).routes:
        info = router.add_resource(route.path).get_info()

        def on_route(case: Case, info: Any = info, method: str = route.method) -> bool:
            if case.method != method:
                return False
            path = _path_of(case.target)
            if "path" in info:
                return bool(path == info["path"])
            return info["pattern"].fullmatch(path) is not None

        name = f"{route.method} {route.path}"
        mine = [case for case in refused if on_route(case)]
        if route.body is not None:
            assert len([case for case in mine if case.body]) >= 3, name
        if route.query is not None or any(p.where == "query" for p in route.params):
            assert any(_query_of(case.target) for case in mine), name
        if any(p.where == "path" for p in route.params):
            assert mine, name


def test_every_route_has_cases(tmp_path: Path) -> None:
    """A route added later without hostile cases fails here: each route of the app (built, not
    started) matches the target of at least 3 cases, and a HEAD case."""
    settings = Settings.load(env={}, overrides={"cache_dir": str(tmp_path), "port": "0"})
    app = create_app(settings, engines={})
    targets = [
        urlsplit(
            case.target if isinstance(case.target, str) else case.target.decode("latin-1")
        ).path
        for case in (param.values[0] for param in CASES)
        if case.raw is None
    ]
    heads = [urlsplit(t).path for t in HEAD_TARGETS]
    for resource in app.router.resources():
        info = resource.get_info()
        if resource.canonical == "/{tail}":
            continue  # (the 404 fallback)

        def matches(path: str, info: Any = info) -> bool:
            if "path" in info:
                return bool(path == info["path"])
            return info["pattern"].fullmatch(path) is not None

        assert sum(map(matches, targets)) >= 3, resource.canonical
        assert any(map(matches, heads)), resource.canonical


@pytest.mark.parametrize("case", CASES)
def test_hostile_input(hostile_gateway: Gateway, case: Case) -> None:
    method = case.method.decode("latin-1") if isinstance(case.method, bytes) else case.method
    reply = exchange(hostile_gateway, case.to_bytes(), method)
    assert reply.status < 500, reply.body[:500]
    if case.status is not None:
        assert reply.status == case.status, reply.body[:500]
    if reply.status >= 400:
        # aiohttp's own refusals (a malformed request line or header) quote the line, which
        # its parser bounds at 8 KiB.
        assert len(reply.body) <= 10_000
    if case.max_seconds is not None:
        assert reply.seconds < case.max_seconds
    if case.json_error and reply.status >= 400:
        assert reply.headers.get("content-type", "").startswith("application/json"), reply.body
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]
        assert len(error["message"]) <= MAX_MESSAGE, error["message"][:200]
        if case.param is not None:
            assert error["param"] == case.param, error
        # The whole body is small: nothing else echoes a name either.
        assert len(reply.body) <= 2 * MAX_MESSAGE


@pytest.fixture(scope="module")
def stored_key(hostile_gateway: Gateway) -> str:
    """The content address of a stored entry (Range is parsed only where there is audio)."""
    reply = send(hostile_gateway, "POST", "/v1/audio/speech", dict(JSON), json.dumps(GOOD).encode())
    assert reply.status == 200
    return reply.headers["x-audio-key"]


# (Range header, status): a header that is not a satisfiable single range of ASCII digits is
# ignored (the whole entity, 200), as RFC 9110 allows; one past the end is a 416.
RANGES = [
    pytest.param("bytes=\u00b2-", 200, id="superscript-two"),
    pytest.param("bytes=0-\u0663", 200, id="arabic-indic-three"),
    pytest.param("bytes=\uff11-", 200, id="fullwidth-one"),
    pytest.param("bytes=" + "9" * 5000 + "-", 200, id="5000-digits"),
    pytest.param("bytes=-" + "9" * 30, 200, id="30-digit-suffix"),
    pytest.param("bytes=5-1", 200, id="reversed"),
    pytest.param("bytes=0-0,1-1", 200, id="two-ranges"),
    pytest.param("bytes=1-2-3", 200, id="three-numbers"),
    pytest.param("bytes=+1-2", 200, id="plus-sign"),
    pytest.param("bytes= 1_0-2", 200, id="underscore"),
    pytest.param("bytes=-0", 416, id="empty-suffix"),
    pytest.param("bytes=99999999-", 416, id="past-the-end"),
    pytest.param("pages=1-2", 200, id="other-unit"),
    pytest.param("bytes=" + "," * 5000, 200, id="5000-commas"),
]


@pytest.mark.parametrize("ext", ["", ".ulaw"])
@pytest.mark.parametrize(("range_header", "status"), RANGES)
def test_hostile_range_on_stored_audio(
    hostile_gateway: Gateway, stored_key: str, ext: str, range_header: str, status: int
) -> None:
    headers: dict[str, str | bytes] = {"Range": range_header.encode()}
    reply = send(hostile_gateway, "GET", f"/v1/audio/{stored_key}{ext}", headers)
    assert reply.status == status, reply.body[:300]
    if status == 416:
        assert reply.json()["error"]["code"] == "range_not_satisfiable"
    else:
        assert len(reply.body) == int(reply.headers["content-length"]) > 0
    # If-Range with junk: the range is dropped, never a 5xx.
    headers["If-Range"] = "\u00b2".encode()
    assert send(hostile_gateway, "GET", f"/v1/audio/{stored_key}{ext}", headers).status < 500


# Messages a jambonz streaming client may send that are not what the protocol expects: each is
# answered {"error": ...} on the socket, which stays open.
WS_MESSAGES = [
    pytest.param("not json", id="not-json"),
    pytest.param(nested(5000).decode(), id="json-5000-deep"),
    pytest.param("1" * 5000, id="5000-digit-number"),
    pytest.param("[]", id="list"),
    pytest.param('{"type": "dance"}', id="unknown-type"),
    pytest.param('{"type": "stream", "text": 1}', id="text-not-string"),
    pytest.param(json.dumps({"type": "stream", "text": "\x00\x00."}), id="nul-text"),
    pytest.param('{"type": ' + "[" * 3000 + "]" * 3000 + "}", id="type-3000-deep"),
]


@pytest.mark.parametrize("message", WS_MESSAGES)
async def test_hostile_jambonz_stream_messages(hostile_gateway: Gateway, message: str) -> None:
    import aiohttp

    url = f"http://{hostile_gateway.host}:{hostile_gateway.port}/v1/jambonz/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        hello = await ws.receive_json(timeout=10)
        assert hello["type"] == "connect"
        await ws.send_str(message)
        if message.startswith('{"type": "stream"') and "\\u0000" in message:
            # (the NUL is refused when the buffered text is spoken: on flush)
            await ws.send_str('{"type": "flush"}')
        answer = await ws.receive_json(timeout=10)
        assert set(answer) == {"error"} and isinstance(answer["error"], str)
        assert len(answer["error"]) <= MAX_MESSAGE
        # Still open and still serving: a good sentence comes back as audio.
        await ws.send_str(json.dumps({"type": "stream", "text": "Hi. "}))
        await ws.send_str('{"type": "flush"}')
        audio = await ws.receive(timeout=30)
        assert audio.type == aiohttp.WSMsgType.BINARY and len(audio.data) > 0
        await ws.send_str('{"type": "stop"}')


SPEAK_SECRET = canary("hostile-speak")
ADMIN_SECRET = canary("hostile-admin")


@pytest.fixture(scope="module")
def keyed_gateway(
    piper_engine: PiperEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A second gateway, with API keys on: a speak key and an admin key."""
    directory: Path = tmp_path_factory.mktemp("hostile-keys")
    keys_file = directory / "keys.toml"
    keys_file.write_text(
        "".join(
            f'[[key]]\nname = "{name}"\nsha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"\n'
            f'scopes = ["{scope}"]\n\n'
            for name, secret, scope in (
                ("speaker", SPEAK_SECRET, "speak"),
                ("operator", ADMIN_SECRET, "admin"),
            )
        )
    )
    settings = Settings.load(
        env={},
        overrides={
            "cache_dir": str(directory / "cache"),
            "port": "0",
            "api_keys_file": str(keys_file),
        },
    )
    engine = CountingEngine(piper_engine)
    server = ServerThread(settings, engine)
    server.start()
    gateway = Gateway("127.0.0.1", server.port, engine)
    try:
        wait_ready(gateway)
        yield gateway
    finally:
        server.stop()


# (credential headers, status on a speak route): what a hostile client may present as a key.
CREDENTIALS = [
    pytest.param({}, 401, id="none"),
    pytest.param({"Authorization": "Bearer"}, 401, id="bearer-without-secret"),
    pytest.param({"Authorization": "Bearer    "}, 401, id="bearer-blank"),
    pytest.param({"Authorization": "Basic dXNlcjpwYXNz"}, 401, id="basic"),
    pytest.param({"Authorization": "Bearer " + "x" * 8000}, 401, id="bearer-8000-chars"),
    pytest.param({"Authorization": b"Bearer \xff\xfe\x80"}, 401, id="bearer-not-utf8"),
    pytest.param({"Authorization": "Bearer " + SPEAK_SECRET[:-1]}, 401, id="bearer-one-short"),
    pytest.param({"Authorization": "Bearer " + SPEAK_SECRET + "x"}, 401, id="bearer-one-long"),
    pytest.param({"Authorization": "Bearer " + SPEAK_SECRET.upper()}, 401, id="bearer-case"),
    pytest.param({"X-API-Key": "\u00b2".encode()}, 401, id="x-api-key-non-ascii"),
    pytest.param({"X-API-Key": "x" * 8000}, 401, id="x-api-key-8000-chars"),
    pytest.param({"Authorization": "Bearer " + ADMIN_SECRET}, 403, id="admin-key-on-speak"),
    pytest.param({"authorization": "bEaReR " + SPEAK_SECRET}, 200, id="bearer-any-case"),
    pytest.param({"X-API-Key": SPEAK_SECRET}, 200, id="x-api-key"),
]


@pytest.mark.parametrize(("credentials", "status"), CREDENTIALS)
def test_hostile_credentials(
    keyed_gateway: Gateway, credentials: dict[str, str | bytes], status: int
) -> None:
    body = json.dumps(GOOD).encode()
    reply = send(keyed_gateway, "POST", "/v1/audio/speech", {**JSON, **credentials}, body)
    assert reply.status == status, reply.body[:300]
    if status >= 400:
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert len(reply.body) <= 2 * MAX_MESSAGE
        if status == 401:
            assert reply.headers.get("www-authenticate", "").startswith("Bearer")
        # No part of what was presented comes back.
        for value in credentials.values():
            shown = value if isinstance(value, str) else value.decode("latin-1")
            secret = shown.partition(" ")[2] or shown
            assert len(secret) < 8 or secret not in reply.body.decode("latin-1")
    # The admin route refuses the speak key and takes the admin one; a hostile body behind a
    # good key is still a 4xx.
    admin = send(keyed_gateway, "POST", "/v1/prompts", {**JSON, **credentials}, b'{"a":' * 5000)
    assert 400 <= admin.status < 500


# The quarantine's review: (method, path, status with the admin key). Refused takes and their
# text are for an admin only: no key, a bad one or a speak key never reach the handler.
REVIEW = [
    pytest.param("GET", "/v1/takes", 200, id="list"),
    pytest.param("GET", f"/v1/takes/{TAKE_ID}/audio", 404, id="audio"),
    pytest.param("POST", f"/v1/takes/{TAKE_ID}/approve", 404, id="approve"),
    pytest.param("POST", f"/v1/takes/{TAKE_ID}/discard", 404, id="discard"),
    pytest.param("GET", "/v1/takes/" + "0" * 5000 + "/audio", 400, id="audio-5000-chars"),
    pytest.param("POST", f"/v1/takes/{TAKE_ID.upper()}/approve", 400, id="approve-uppercase"),
]


@pytest.mark.parametrize(("method", "path", "admin_status"), REVIEW)
def test_hostile_credentials_on_the_review_routes(
    keyed_gateway: Gateway, method: str, path: str, admin_status: int
) -> None:
    for credentials, status in (
        ({}, 401),
        ({"Authorization": "Bearer " + ADMIN_SECRET[:-1]}, 401),
        ({"Authorization": b"Bearer \xff\xfe\x80"}, 401),
        ({"X-API-Key": "x" * 8000}, 401),
        ({"X-API-Key": SPEAK_SECRET}, 403),
        ({"X-API-Key": ADMIN_SECRET}, admin_status),
    ):
        reply = send(keyed_gateway, method, path, dict(credentials))
        assert reply.status == status, (credentials, reply.body[:300])
        assert reply.headers.get("content-type", "").startswith("application/json")
        if status >= 400:
            error = reply.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert len(reply.body) <= 2 * MAX_MESSAGE
        else:
            assert reply.json() == {"takes": []}
    assert send(keyed_gateway, "GET", "/healthz").status == 200


def test_healthy_after_the_table(hostile_gateway: Gateway) -> None:
    """Runs after the table (pytest keeps file order): the server still answers and speaks."""
    assert send(hostile_gateway, "GET", "/healthz").status == 200
    assert send(hostile_gateway, "GET", "/readyz").status == 200
    reply = send(hostile_gateway, "POST", "/v1/audio/speech", dict(JSON), json.dumps(GOOD).encode())
    assert reply.status == 200, reply.body[:300]
    assert reply.body[:4] == b"RIFF"
    say = send(hostile_gateway, "GET", "/v1/say/joe/" + quote("Hi.", safe="") + ".ulaw")
    assert say.status == 200
    assert say.body


# ---- the whole table, live, against what users run ---------------------------------------------


@pytest.mark.slow
def test_the_table_against_voxgate_serve(tmp_path: Path) -> None:
    """Every case above, and every credential case, sent to `voxgate serve` with no topology
    flags (a gateway process per core, uvloop, the host's synthesis pool): no answer is a 5xx,
    no log line of any process holds a secret, and the server is healthy and speaks after."""
    from tests.served import DefaultServer

    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        "".join(
            f'[[key]]\nname = "{name}"\nsha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"\n'
            f'scopes = ["{scope}"]\n\n'
            for name, secret, scope in (
                ("speaker", SPEAK_SECRET, "speak"),
                ("operator", ADMIN_SECRET, "admin"),
            )
        )
    )
    failures: list[str] = []
    logs = ""
    for keyed in (False, True):
        args = ["--url-signing-secret", SECRET, "--log-level", "debug"]
        if keyed:
            args += ["--api-keys-file", str(keys_file)]
        server = DefaultServer(tmp_path / ("keyed" if keyed else "open"), *args)
        try:
            server.wait_ready()
            live = Gateway("127.0.0.1", server.port)
            cases = [p.values[0] for p in CASES]
            if keyed:
                body = json.dumps(GOOD).encode()
                cases = [
                    Case("POST", "/v1/audio/speech", {**JSON, **creds}, body, json_error=False)
                    for creds in (p.values[0] for p in CREDENTIALS)
                ]
            for case in cases:
                method = (
                    case.method.decode("latin-1") if isinstance(case.method, bytes) else case.method
                )
                reply = exchange(live, case.to_bytes(), method)
                if reply.status >= 500:
                    failures.append(f"{reply.status} for {case.to_bytes()[:120]!r}")
            assert send(live, "GET", "/healthz").status == 200
            reply = send(
                live,
                "POST",
                "/v1/audio/speech",
                {**JSON, "X-API-Key": SPEAK_SECRET},
                json.dumps(GOOD).encode(),
            )
            assert reply.status == 200 and reply.body[:4] == b"RIFF"
        finally:
            server.close()
        logs += server.logs()
    assert not failures, failures
    # Refused input is the client's fault: no traceback for it (aiohttp logged one for the rest
    # of a body that does not decode, read after its 400).
    assert "Unhandled exception" not in logs
    for secret in (SECRET, SPEAK_SECRET, ADMIN_SECRET):
        assert secret not in logs


async def test_a_body_that_does_not_decode_closes_its_connection(gateway: GatewayFactory) -> None:
    """A gzip body that is not gzip gets its 400 with ``Connection: close``: the rest of it cannot
    be read, and a connection left open was dropped by aiohttp after the answer, so a client
    that sent its next request on it got a disconnection instead of an answer."""
    client = await gateway()
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    body = b"not gzip at all" * 4096
    for _ in range(3):
        reply = await client.post("/v1/audio/speech", data=body, headers=headers)
        assert reply.status == 400
        assert (await reply.json())["error"]["code"] == "malformed_body"
        assert reply.headers["Connection"].lower() == "close"
