"""jambonz as a client of voxgate: the custom TTS vendor request and the streaming protocol, as
jambonz's own code sends and reads them."""

from __future__ import annotations

import asyncio
import io
import re
import wave
from pathlib import Path

import pytest
from aiohttp import WSMsgType

from gateway.http import keys as app_keys
from gateway.http.jambonz import STREAM_AHEAD
from gateway.runtime.apikeys import key_table
from gateway.runtime.settings import Settings
from tests.canary import canary
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, clear_of_a_minute_edge, error_of, until


def jambonz_file_ext(mime: str) -> tuple[str, int]:
    """jambonz/speech-utils lib/synth-audio.js ``getFileExtFromMime``: how jambonz reads a
    custom vendor's Content-Type (an exact string match for the WAV and MP3 types; a regular
    expression for L16; anything else is WAV). The rate is what jambonz plays the file at."""
    if mime in ("audio/wav", "audio/x-wav"):
        return "wav", 8000
    for rate in (8000, 16000, 24000, 32000, 48000):
        if re.search(rf"audio/l16.*rate={rate}", mime):
            return f"r{rate // 1000}", rate
    if mime in ("audio/mpeg", "audio/mp3"):
        return "mp3", 8000
    return "wav", 8000


def jambonz_body(text: str, voice: str = "joe", language: str = "en-US") -> dict[str, str]:
    """speech-utils ``synthCustomVendor``: ``{language, voice, type, text}``, type "ssml" when
    the text starts with <speak>."""
    return {
        "language": language,
        "voice": voice,
        "type": "ssml" if text.startswith("<speak>") else "text",
        "text": text,
    }


TEXT = "Thanks for calling. One moment please."


@pytest.mark.parametrize(
    ("content_type", "ext", "rate"),
    [
        ("audio/l16;rate=8000", "r8", 8000),
        ("audio/l16;rate=16000", "r16", 16000),
        ("audio/wav", "wav", 8000),
    ],
)
async def test_jambonz_plays_the_answer_at_the_declared_rate(
    gateway: GatewayFactory,
    settings: Settings,
    counting_engine: CountingEngine,
    content_type: str,
    ext: str,
    rate: int,
) -> None:
    """The answer's Content-Type is one jambonz maps to the intended file type, exactly; the
    body's length at that rate matches the WAV rendering's duration within one 20 ms frame."""
    client = await gateway(settings=settings.replace(jambonz_content_type=content_type))
    r = await client.post(
        "/v1/jambonz/tts",
        json=jambonz_body(TEXT),
        headers={"Authorization": "Bearer some-token"},
    )
    assert r.status == 200, await r.text()
    assert r.headers["Content-Type"] == content_type
    assert jambonz_file_ext(r.headers["Content-Type"]) == (ext, rate)
    body = await r.read()
    reference = await client.get(f"/v1/say/joe/{TEXT.replace(' ', '%20')}.wav")
    with wave.open(io.BytesIO(await reference.read())) as w:
        wav_s = w.getnframes() / w.getframerate()
    if ext == "wav":
        with wave.open(io.BytesIO(body)) as w:
            assert w.getframerate() == 8000  # jambonz takes every WAV as 8 kHz
            assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
            seconds = w.getnframes() / 8000
    else:
        seconds = len(body) / 2 / rate
    assert abs(seconds - wav_s) <= 0.020, (seconds, wav_s)
    assert counting_engine.items == 2  # both are the same two sentence masters


async def test_voice_and_language_map_through_aliases(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    aliased = settings.replace(voice_aliases="en-GB=joe,polly.Joanna=joe")
    client = await gateway(settings=aliased)
    for body in (
        jambonz_body("Hello.", voice="polly.Joanna"),
        jambonz_body("Hello.", voice="unknown", language="en-GB"),
        jambonz_body("Hello.", voice="alloy"),
    ):
        r = await client.post("/v1/jambonz/tts", json=body)
        assert r.status == 200, await r.text()
    assert counting_engine.items == 1  # all three are the joe voice: one synthesis


async def test_unknown_voice_is_the_default_or_a_400_by_setting(
    gateway: GatewayFactory, settings: Settings
) -> None:
    lenient = await gateway()
    r = await lenient.post(
        "/v1/jambonz/tts", json=jambonz_body("Hi.", voice="nobody", language="xx")
    )
    assert r.status == 200
    strict = await gateway(settings=settings.replace(jambonz_unknown_voice="reject"))
    r = await strict.post(
        "/v1/jambonz/tts", json=jambonz_body("Hi.", voice="nobody", language="xx")
    )
    error = await error_of(r, 400)
    assert error["param"] == "voice" and "nobody" in error["message"]


async def test_ssml_type_goes_to_the_ssml_front_end(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """jambonz sends type "ssml" for a <speak> text: it is expanded, so a
    document that is just words shares plain text's audio, and a break makes other audio."""
    client = await gateway()
    plain = await client.post("/v1/jambonz/tts", json=jambonz_body("Hello."))
    assert plain.status == 200
    wrapped = await client.post("/v1/jambonz/tts", json=jambonz_body("<speak>Hello.</speak>"))
    assert wrapped.status == 200
    assert wrapped.headers["X-Audio-Key"] == plain.headers["X-Audio-Key"]
    assert await wrapped.read() == await plain.read()
    assert counting_engine.items == 1
    paused = await client.post(
        "/v1/jambonz/tts", json=jambonz_body('<speak>Hello.<break time="1s"/></speak>')
    )
    assert paused.status == 200
    assert paused.headers["X-Audio-Key"] != plain.headers["X-Audio-Key"]
    # It ends in the break: a second of zero samples (16-bit, any byte order), less what the
    # resampler's filter spreads of the last word into it (measured: 25 samples at 8 kHz).
    audio = await paused.read()
    rate = jambonz_file_ext(paused.headers["Content-Type"])[1]
    silent = len(audio) - len(audio.rstrip(b"\0"))
    assert 2 * (rate - rate // 100) <= silent <= 2 * (rate + rate // 100), (silent, rate)
    assert counting_engine.items == 1  # the same sentence, one second of silence more


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (jambonz_body("<speak><foo/>Hello.</speak>"), "unsupported tag <foo>"),
        ({"text": "1 < 2", "type": "ssml"}, "not well-formed XML"),
        ({"voice": "joe", "type": "text"}, "missing required field 'text'"),
        ({"text": "Hi.", "type": "html"}, "unsupported type 'html'"),
        ({"text": "   ", "type": "text"}, "'text' is empty"),
    ],
)
async def test_bad_jambonz_bodies_are_400(
    gateway: GatewayFactory, body: dict[str, str], fragment: str
) -> None:
    client = await gateway()
    r = await client.post("/v1/jambonz/tts", json=body)
    assert fragment in (await error_of(r, 400))["message"]


async def test_streaming_protocol_sentence_by_sentence_from_the_cache(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """jambonz/custom-speech-example lib/tts/streaming/elevenlabs.js: voice, language and
    sampleRate in the query; the server sends ``{type: "connect", data: {sample_rate,
    base64_encoding}}``, then binary PCM; jambonz sends ``stream`` (text pieces), ``flush`` and
    ``stop``."""
    client = await gateway()
    r = await client.post(
        "/v1/audio/speech",
        json={
            "model": "tts-1",
            "input": "How can I help you today?",
            "voice": "alloy",
            "response_format": "pcm",
            "sample_rate": 16000,
        },
    )
    cached = await r.read()
    assert counting_engine.items == 1
    async with client.ws_connect(
        "/v1/jambonz/stream?voice=joe&language=en-US&sampleRate=16000"
    ) as ws:
        hello = await ws.receive_json()
        assert hello == {
            "type": "connect",
            "data": {"sample_rate": 16000, "base64_encoding": False},
        }
        for piece in ("How can I help", " you today? Your order", " has shipped."):
            await ws.send_json({"type": "stream", "text": piece})
        first = await ws.receive()
        assert first.type == WSMsgType.BINARY
        assert first.data == cached  # the first sentence came from the cache
        await ws.send_json({"type": "flush"})
        second = await ws.receive()
        assert second.type == WSMsgType.BINARY
        assert len(second.data) % 2 == 0 and len(second.data) > 16000  # over half a second
        await ws.send_json({"type": "nonsense"})
        error = await ws.receive_json()
        assert "stream, flush or stop" in error["error"]
        await ws.send_json({"type": "stop"})
        closing = await ws.receive()
        assert closing.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
    assert counting_engine.items == 2  # only "Your order has shipped." was new
    bad = await client.get("/v1/jambonz/stream?sampleRate=11025")
    assert "sampleRate" in (await error_of(bad, 400))["message"]


# ---- the stream on its key's account -------------------------------------------------------

A_SECRET = canary("jambonz-a")
B_SECRET = canary("jambonz-b")
STREAM = "/v1/jambonz/stream?voice=joe&language=en-US&sampleRate=8000"
# Words for sentences told apart (digits followed by a full stop are split as sentences).
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
]


def keyed(settings: Settings, tmp_path: Path, **a_limits: int) -> Settings:
    keys = tmp_path / "keys.toml"
    keys.write_text(
        key_table("a", A_SECRET, ["speak"], **a_limits) + "\n" + key_table("b", B_SECRET, ["speak"])
    )
    return settings.replace(api_keys_file=str(keys))


async def test_each_stream_message_is_a_request_of_the_key(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    client = await gateway(settings=keyed(settings, tmp_path, requests_per_minute=3))
    await clear_of_a_minute_edge()
    async with client.ws_connect(STREAM, headers={"X-API-Key": A_SECRET}) as ws:  # request 1
        assert (await ws.receive_json(timeout=30))["type"] == "connect"
        for i in range(4):  # requests 2 and 3 pass, then the key is over its limit
            await ws.send_json({"type": "stream", "text": f"Item {i}, "})
        errors = [await ws.receive_json(timeout=30) for _ in range(2)]
        assert all("over its limit of 3 requests per minute" in e["error"] for e in errors)
        await ws.send_json({"type": "stop"})


async def test_a_stream_message_is_bounded_like_a_request(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    client = await gateway(settings=settings.replace(max_input_chars=200))
    async with client.ws_connect(STREAM) as ws:
        assert (await ws.receive_json(timeout=30))["type"] == "connect"
        await ws.send_json({"type": "stream", "text": "Word. " * 40})  # 240 characters
        error = await ws.receive_json(timeout=30)
        assert "at most 200 characters (max_input_chars)" in error["error"]
        await ws.send_json({"type": "flush"})
        await ws.send_json({"type": "stop"})
        closing = await ws.receive(timeout=30)
        assert closing.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
    assert counting_engine.items == 0  # nothing of it was spoken


async def test_the_close_frame_is_read_while_synthesis_is_behind(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    """60 sentences sent at once, then a close: the server reads the close at once (the text is
    read ahead of synthesis) and cancels the rest. What was already queued for the engine (at
    most STREAM_AHEAD sentences, plus the one being sent and the one being queued) is finished
    and stored, as for any request that hangs up; the other 50 are never synthesized."""
    client = await gateway()
    scheduler = client.server.app[app_keys.SPEECH].models["piper"].scheduler
    counting_engine.release.clear()  # the engine holds every batch until the close is done
    try:
        async with client.ws_connect(STREAM) as ws:
            assert (await ws.receive_json(timeout=30))["type"] == "connect"
            for i in range(60):
                await ws.send_json({"type": "stream", "text": f"Sentence number {i} of the list. "})
            # Batches are running (held) and more sentences wait behind them.
            await until(lambda: scheduler.depth >= 1, what="sentences queued behind the engine")
            async with asyncio.timeout(10):  # the server answers the close, engine still held
                await ws.close()
    finally:
        counting_engine.release.set()
    await until(
        lambda: counting_engine.active == 0 and scheduler.depth == 0,
        what="nothing left running or queued",
    )
    assert counting_engine.items <= STREAM_AHEAD + 2


async def test_one_key_cannot_fill_the_queue_through_sockets(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, counting_engine: CountingEngine
) -> None:
    """Sentences a socket sends take its key's queue share (queue_per_client), as an HTTP
    request's do: one key's sockets cannot fill the queue that other keys' misses need. Their
    sentences past the share wait their turn and are all spoken."""
    client = await gateway(
        settings=keyed(settings, tmp_path).replace(
            queue_size=8, queue_per_client=2, max_parallel_sentences=1
        )
    )
    app = client.server.app
    scheduler = app[app_keys.SPEECH].models["piper"].scheduler
    slots = app[app_keys.STREAM_SLOTS]
    rejected = app[app_keys.METRICS].client_rejected.labels("piper")
    counting_engine.release.clear()
    sockets = []
    try:
        for n in range(3):
            ws = await client.ws_connect(STREAM, headers={"X-API-Key": A_SECRET})
            sockets.append(ws)
            assert (await ws.receive_json(timeout=30))["type"] == "connect"
            for i in range(5):
                await ws.send_json(
                    {"type": "stream", "text": f"Socket {WORDS[n]} says {WORDS[i]}. "}
                )
            await ws.send_json({"type": "flush"})
        # 15 sentences of one key: at most its share in the queue, the rest waiting their turn.
        await until(
            lambda: scheduler.waiting_for("key:a") >= 1 and slots.waiting("key:a") == 15,
            what="the key's sentences in the queue and waiting",
        )
        assert scheduler.waiting_for("key:a") <= 2
        other = asyncio.ensure_future(
            client.post(
                "/v1/audio/speech",
                json={
                    "model": "piper",
                    "voice": "joe",
                    "input": "Other key.",
                    "response_format": "wav",
                },
                headers={"X-API-Key": B_SECRET},
            )
        )
        await until(lambda: scheduler.waiting_for("key:b") == 1, what="the other key's miss queued")
        counting_engine.release.set()
        assert (await other).status == 200
        for ws in sockets:
            for _ in range(5):
                assert (await ws.receive(timeout=30)).type == WSMsgType.BINARY
        assert rejected._value.get() == 0
    finally:
        counting_engine.release.set()
        for ws in sockets:
            await ws.close()


async def speak_on_sockets(client: object, sockets: int, sentences: int) -> list[list[bytes]]:
    """``sockets`` sockets of one client, each sending ``sentences`` distinct sentences at once;
    the messages each receives until it has one per sentence (audio, or an error's text)."""

    async def one(n: int) -> list[bytes]:
        async with client.ws_connect(STREAM) as ws:  # type: ignore[attr-defined]
            assert (await ws.receive_json(timeout=30))["type"] == "connect"
            for i in range(sentences):
                await ws.send_json(
                    {"type": "stream", "text": f"Line {WORDS[i]} of socket {WORDS[n]}. "}
                )
            await ws.send_json({"type": "flush"})
            got = []
            for _ in range(sentences):
                message = await ws.receive(timeout=60)
                got.append(message.data if message.type == WSMsgType.BINARY else b"")
            await ws.send_json({"type": "stop"})
            return got

    return list(await asyncio.gather(*(one(n) for n in range(sockets))))


async def test_a_clients_sockets_share_its_renditions_and_every_sentence_is_spoken(
    gateway: GatewayFactory,
    settings: Settings,
    counting_engine: CountingEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """4 sockets x 20 sentences of one client (its address) against renders_per_client 16: the
    sentences past its share wait instead of being refused, each gets its audio, and no refused
    sentence is left as a task exception nobody retrieved."""
    client = await gateway(settings=settings.replace(renders_per_client=16))
    received = await speak_on_sockets(client, sockets=4, sentences=20)
    spoken = [sum(1 for audio in socket if len(audio) > 1000) for socket in received]
    assert spoken == [20, 20, 20, 20]
    assert counting_engine.items == 80
    assert "never retrieved" not in caplog.text


async def test_closing_a_socket_cancels_its_waiting_sentences(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, counting_engine: CountingEngine
) -> None:
    """Two sockets of one key with a share of 2: the first one's close cancels its sentences
    waiting for a turn (never synthesized); the second still gets all of its own."""
    client = await gateway(
        settings=keyed(settings, tmp_path).replace(queue_per_client=2, max_parallel_sentences=1)
    )
    slots = client.server.app[app_keys.STREAM_SLOTS]
    counting_engine.release.clear()
    first = await client.ws_connect(STREAM, headers={"X-API-Key": A_SECRET})
    second = await client.ws_connect(STREAM, headers={"X-API-Key": A_SECRET})
    try:
        for n, ws in enumerate((first, second)):
            assert (await ws.receive_json(timeout=30))["type"] == "connect"
            for i in range(6):
                await ws.send_json(
                    {"type": "stream", "text": f"Socket {WORDS[n]} line {WORDS[i]}. "}
                )
            await ws.send_json({"type": "flush"})

        # The second socket is read all along (its reader answers the server's pings).
        async def hear() -> list[WSMsgType]:
            return [(await second.receive(timeout=120)).type for _ in range(6)]

        heard = asyncio.ensure_future(hear())
        await until(lambda: slots.waiting("key:a") == 12, what="both sockets' sentences waiting")
        async with asyncio.timeout(10):
            await first.close()
        # What the first socket had waiting is gone; at most its share was given to the engine.
        await until(lambda: slots.waiting("key:a") <= 6 + 2, what="the first socket's cancelled")
        counting_engine.release.set()
        assert await heard == [WSMsgType.BINARY] * 6
        await until(lambda: slots.waiting("key:a") == 0, what="nothing left waiting")
        assert counting_engine.items <= 6 + 2
    finally:
        counting_engine.release.set()
        await second.close()


async def test_a_sentence_whose_share_stays_full_ends_as_an_error_message(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The key's render share held elsewhere (its socket on another gateway process of the host,
    taken here in the host's table) for longer than batch_timeout_s: the waiting sentence ends
    as jambonz reads a failure, an ``{"error": ...}`` message, and the socket goes on speaking
    once the share is free."""
    client = await gateway(
        settings=keyed(settings, tmp_path).replace(renders_per_client=1, batch_timeout_s=1)
    )
    table = client.server.app[app_keys.HOST_TABLE]
    assert table.take_share("render:key:a", 1)
    async with client.ws_connect(STREAM, headers={"X-API-Key": A_SECRET}) as ws:
        assert (await ws.receive_json(timeout=30))["type"] == "connect"
        await ws.send_json({"type": "stream", "text": "Nobody hears this."})
        await ws.send_json({"type": "flush"})
        failed = await ws.receive_json(timeout=30)
        assert "stayed full for 1 s (batch_timeout_s)" in failed["error"]
        table.give_share("render:key:a")
        # The voice's synthesis that follows gets 120 s: the 1 s bound was for the share's
        # wait, and a real synthesis on a loaded machine can take that long.
        runner = client.server.app[app_keys.SPEECH].models["piper"].scheduler.runner
        runner.batch_timeout_s = 120
        await ws.send_json({"type": "stream", "text": "Now it is heard."})
        await ws.send_json({"type": "flush"})
        assert (await ws.receive(timeout=30)).type == WSMsgType.BINARY
    assert "never retrieved" not in caplog.text


async def test_a_revoked_keys_sockets_are_closed_at_the_reload(
    gateway: GatewayFactory, settings: Settings, tmp_path: Path
) -> None:
    config = keyed(settings, tmp_path)
    client = await gateway(settings=config)
    a = await client.ws_connect(STREAM, headers={"X-API-Key": A_SECRET})
    b = await client.ws_connect(STREAM, headers={"X-API-Key": B_SECRET})
    for ws in (a, b):
        assert (await ws.receive_json(timeout=30))["type"] == "connect"
    await asyncio.to_thread(
        Path(config.api_keys_file).write_text, key_table("b", B_SECRET, ["speak"])
    )
    assert await client.server.app[app_keys.AUTH].reload()
    closing = await a.receive(timeout=30)  # (sent at the reload: a bound for a hung test)
    assert closing.type == WSMsgType.CLOSE and closing.data == 1008
    assert closing.extra == "API key revoked"
    # The other key's socket still speaks.
    await b.send_json({"type": "stream", "text": "Still here."})
    await b.send_json({"type": "flush"})
    audio = await b.receive(timeout=30)
    assert audio.type == WSMsgType.BINARY
    await b.close()
    await a.close()
