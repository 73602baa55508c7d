"""Streaming by default, as OpenAI's endpoint does: the openai SDK's plain
``with_streaming_response`` (no voxgate field) gets a miss of several sentences chunked, sentence
by sentence, from ``voxgate serve`` with no topology flags; ``stream: false`` answers whole; a
hit keeps its Content-Length, ETag and 304.

Which sentence is made when is set by a local provider following OpenAI's published speech API
(tests/upstream_support.py cites the document) serving an upstream model: it holds the call for
the last sentence until the test has the first chunk, so the order of the two events is what is
asserted, not a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI

from bench.harness import free_port
from tests.canary import canary
from tests.served import DefaultServer
from tests.support import eventually
from tests.test_upstream_serve import KEY_ENV, write_upstreams
from tests.upstream_support import OPENAI_KEY, OpenAISpeechServer

# Module-scoped engines and servers: one xdist worker builds them.
pytestmark = pytest.mark.xdist_group("stream_default")

SENTENCES = [
    "Thank you for calling the billing line.",
    "Your last payment was received on Monday.",
    "Your next statement will be ready on Friday.",
    "To hear your balance again, press one.",
    "To speak with an agent, press zero.",
    "Goodbye for now, and have a good day.",
]
SIX = " ".join(SENTENCES)
OTHER = ["Welcome back to the billing line.", "Your balance is paid in full.", "Goodbye."]


@pytest.fixture(scope="module")
def provider_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, provider_port: int) -> Iterator[DefaultServer]:
    home = tmp_path_factory.mktemp("stream-default")
    upstreams = write_upstreams(
        home / "upstreams.toml",
        {
            "name": "held",
            "kind": "openai",
            "base_url": f"http://127.0.0.1:{provider_port}/v1",
            "api_key_env": KEY_ENV,
            "model": "gpt-4o-mini-tts",
            "voices": ["alloy"],
            "timeout_s": 60,
        },
    )
    srv = DefaultServer(home / "srv", "--upstreams-file", str(upstreams), env={KEY_ENV: OPENAI_KEY})
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.close()


def openai_client(server: DefaultServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{server.url}/v1", api_key=canary("client"), max_retries=0)


async def stored(server: DefaultServer, key: str) -> None:
    """Until the rendition ``key`` is stored: the last chunk goes out before the whole file is
    written (by the gateway process that streamed it; another one answers the next request)."""
    await eventually(
        lambda: server.request("GET", f"/v1/audio/{key}"),
        lambda answer: answer[0] == 200,
        what=f"rendition {key} stored",
    )


def one_mp3_frame_then(whole: bytes, streamed: bytes) -> bool:
    """Whether ``whole`` is one MP3 frame (the Xing/LAME "Info" frame a stream cannot write:
    it gives the exact length, known only at the end) followed by ``streamed``."""
    head = whole[: len(whole) - len(streamed)]
    return (
        whole.endswith(streamed)
        and head[:1] == b"\xff"
        and (b"Info" in head or b"Xing" in head)
        and len(head) < 2000
    )


async def test_the_sdk_gets_first_audio_before_the_last_sentence_is_made(
    server: DefaultServer, provider_port: int
) -> None:
    provider = await OpenAISpeechServer(port=provider_port).start()
    provider.held_inputs = {SENTENCES[-1]}
    try:
        async with openai_client(server) as oa:
            async with oa.audio.speech.with_streaming_response.create(
                model="held", voice="alloy", input=SIX
            ) as resp:
                assert resp.headers["x-cache"] == "MISS"
                assert resp.headers["transfer-encoding"] == "chunked"
                assert "content-length" not in resp.headers and "etag" not in resp.headers
                chunks = resp.iter_bytes()
                first = await anext(chunks)
                # The first audio is here; the last sentence's call is still unanswered.
                assert first and SENTENCES[-1] not in provider.texts
                assert SENTENCES[0] in provider.texts  # (the others are made concurrently)
                provider.release.set()
                streamed = first + b"".join([c async for c in chunks])
            assert sorted(provider.texts) == sorted(SENTENCES)
            key = resp.headers["x-audio-key"]
            await stored(server, key)
            # A later request is a whole HIT of the stored file: the streamed MP3 is it, less the
            # frame that gives decoders the exact length.
            again = await oa.audio.speech.with_raw_response.create(
                model="held", voice="alloy", input=SIX
            )
            hit = again.content
            assert again.headers["x-cache"] == "HIT" and again.headers["x-audio-key"] == key
            assert again.headers["content-length"] == str(len(hit))
            assert one_mp3_frame_then(hit, streamed)
            # ... and the stored file's ETag gets 304.
            etag = again.headers["etag"]
            status, _, _ = await server.request(
                "POST",
                "/v1/audio/speech",
                headers={"If-None-Match": etag},
                json={"model": "held", "voice": "alloy", "input": SIX},
            )
            assert status == 304
            # Another format of it is made of stored sentences: nothing to wait for, so whole.
            other = await oa.audio.speech.with_raw_response.create(
                model="held", voice="alloy", input=SIX, response_format="pcm"
            )
            assert other.headers["x-cache"] == "HIT"
            assert other.headers["content-length"] == str(len(other.content))
            # pcm (what Pipecat and LiveKit ask for) of a new text: the streamed body is the
            # later HIT's body.
            provider.release = asyncio.Event()
            provider.held_inputs = {OTHER[-1]}
            async with oa.audio.speech.with_streaming_response.create(
                model="held", voice="alloy", input=" ".join(OTHER), response_format="pcm"
            ) as resp:
                assert resp.headers["x-cache"] == "MISS"
                assert "content-length" not in resp.headers
                chunks = resp.iter_bytes()
                first = await anext(chunks)
                assert OTHER[-1] not in provider.texts
                provider.release.set()
                pcm_streamed = first + b"".join([c async for c in chunks])
            await stored(server, resp.headers["x-audio-key"])
            pcm_hit = await oa.audio.speech.with_raw_response.create(
                model="held", voice="alloy", input=" ".join(OTHER), response_format="pcm"
            )
            assert pcm_hit.headers["x-cache"] == "HIT"
            assert pcm_hit.content == pcm_streamed
        assert await server.conformance_failures() == []
    finally:
        await provider.stop()


FRESH = [
    "Thank you for calling the parts desk.",
    "Your order number is seven four one.",
    "It left our warehouse this morning.",
    "It should reach you by Thursday.",
    "To track it online, press one.",
    "Goodbye, and thank you for waiting.",
]


async def test_a_streams_first_sentence_is_made_before_the_others_start(
    server: DefaultServer, provider_port: int
) -> None:
    """The listener of a plain SDK stream waits for the first sentence only: it is made alone,
    the later sentences start once it is done (beside it, on a CPU engine, they slowed it by
    1.3x-2x; bench.first_byte measures the first byte against a one-sentence text's whole
    answer)."""
    provider = await OpenAISpeechServer(port=provider_port).start()
    provider.held_inputs = {FRESH[0]}
    listener: asyncio.Future[tuple[bytes, bytes]] | None = None
    try:
        async with openai_client(server) as oa:

            async def listen() -> tuple[bytes, bytes]:
                async with oa.audio.speech.with_streaming_response.create(
                    model="held", voice="alloy", input=" ".join(FRESH)
                ) as resp:
                    assert resp.headers["x-cache"] == "MISS"
                    assert resp.headers["transfer-encoding"] == "chunked"
                    chunks = resp.iter_bytes()
                    first = await anext(chunks)
                    return first, b"".join([c async for c in chunks])

            listener = asyncio.ensure_future(listen())
            await eventually(
                lambda: asyncio.sleep(0, [e for e in provider.events if e[1] in FRESH]),
                lambda events: ("received", FRESH[0]) in events,
                what="the first sentence's call",
            )
            # Held there: no later sentence has been asked for, and none is until it is done.
            assert [e for e in provider.events if e[1] in FRESH] == [("received", FRESH[0])]
            provider.release.set()
            first, rest = await listener
            assert first and rest
        events = [e for e in provider.events if e[1] in FRESH]
        answered_first = events.index(("answered", FRESH[0]))
        assert events[: answered_first + 1] == [("received", FRESH[0]), ("answered", FRESH[0])]
        assert sorted(t for kind, t in events if kind == "received") == sorted(FRESH)
        assert await server.conformance_failures() == []
    finally:
        provider.release.set()  # a failed assertion leaves no call held
        if listener is not None and not listener.done():
            listener.cancel()
        await provider.stop()


async def test_stream_false_one_sentence_and_whole_formats_answer_whole(
    server: DefaultServer,
) -> None:
    """On the default model (Piper, in the host's pool process)."""
    text = "Please hold. Your call matters to us. An agent will answer soon."
    async with openai_client(server) as oa:
        whole = await oa.audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input=text, extra_body={"stream": False}
        )
        assert whole.headers["x-cache"] == "MISS"
        assert whole.headers["content-length"] == str(len(whole.content))
        assert "etag" in whole.headers
        for fmt, body in (("wav", "One sentence only, said whole."), ("flac", text + " Thanks.")):
            answer = await oa.audio.speech.with_raw_response.create(
                model="tts-1",
                voice="alloy",
                input=body,
                response_format=fmt,
            )
            assert answer.headers["x-cache"] == "MISS", fmt
            assert answer.headers["content-length"] == str(len(answer.content)), fmt
        # The default model streams a miss of several sentences too.
        async with oa.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text + " Goodbye."
        ) as resp:
            assert resp.headers["x-cache"] == "MISS"
            assert resp.headers["transfer-encoding"] == "chunked"
            assert "content-length" not in resp.headers
            assert len(b"".join([c async for c in resp.iter_bytes()])) > 1000
    assert await server.conformance_failures() == []
