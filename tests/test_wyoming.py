"""The Wyoming server (Home Assistant), driven by the ``wyoming`` package's own client.

What the client does is what Home Assistant's wyoming integration does
(home-assistant/core homeassistant/components/wyoming/tts.py): ``describe`` for the voices,
``synthesize`` for a text (or ``synthesize-start`` / ``-chunk``s / ``-stop`` when the server says
``supports_synthesize_streaming``), then it collects ``audio-chunk`` payloads between
``audio-start`` and ``audio-stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info, SelectProgram
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from bench.harness import free_port
from gateway.http import keys
from gateway.runtime.settings import Settings
from gateway.runtime.topology import usable_cores
from metrics import Metrics
from synth.piper_engine import PiperEngine
from tests.conftest import GatewayFactory
from tests.ops_support import ServerProcess
from tests.served import DefaultServer
from tests.support import CountingEngine, eventually, shortest_audio_s, until

# One pytest-xdist worker runs the whole module: its tests share the module-scoped servers.
pytestmark = pytest.mark.xdist_group("wyoming")

TEXT = "Turning on the kitchen lights. They will dim at ten."


@dataclass
class Spoken:
    """What a client received for one utterance."""

    rate: int = 0
    audio: bytearray = field(default_factory=bytearray)

    @property
    def seconds(self) -> float:
        return len(self.audio) / 2 / self.rate


async def start(
    gateway: GatewayFactory, settings: Settings, **kw: Any
) -> tuple[TestClient[Any, Any], int]:
    port = free_port()
    client = await gateway(settings=settings.replace(wyoming_port=port, **kw))
    return client, port


async def utterance(client: AsyncTcpClient) -> Spoken:
    """Read one audio-start ... audio-stop."""
    spoken = Spoken()
    while True:
        event = await client.read_event()
        assert event is not None, "connection closed mid-utterance"
        assert not Error.is_type(event.type), event.data
        if AudioStart.is_type(event.type):
            spoken.rate = AudioStart.from_event(event).rate
            assert AudioStart.from_event(event).width == 2
        elif AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            assert chunk.rate == spoken.rate
            spoken.audio += chunk.audio
        elif AudioStop.is_type(event.type):
            return spoken


async def say(port: int, text: str, voice: SynthesizeVoice | None = None) -> Spoken:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=text, voice=voice).event())
        return await utterance(client)


async def wav_seconds(http: TestClient[Any, Any], text: str) -> float:
    r = await http.post(
        "/v1/audio/speech",
        json={"model": "piper", "voice": "joe", "input": text, "response_format": "wav"},
    )
    info = sf.info(io.BytesIO(await r.read()))
    return float(info.frames) / float(info.samplerate)


def syntheses(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value(
        "voxgate_syntheses_total", {"model": "piper", "outcome": "ok"}
    )
    return value or 0.0


async def test_describe_lists_every_voice(gateway: GatewayFactory, settings: Settings) -> None:
    _, port = await start(gateway, settings)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        event = await client.read_event()
    assert event is not None and Info.is_type(event.type)
    info = Info.from_event(event)
    assert [p.name for p in info.tts] == ["piper"]
    program = info.tts[0]
    assert program.supports_synthesize_streaming
    assert program.installed
    assert [(v.name, v.languages) for v in program.voices] == [("joe", ["en_US"])]


async def test_synthesize_lasts_as_long_as_the_wav_and_a_repeat_costs_nothing(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics
) -> None:
    http, port = await start(gateway, settings)
    first = await say(port, TEXT, SynthesizeVoice(name="joe"))
    assert first.rate == 22050
    assert syntheses(metrics) == 2  # two sentences
    seconds = await wav_seconds(http, TEXT)
    assert abs(first.seconds - seconds) / seconds < 0.03
    again = await say(port, TEXT)  # the default voice: the same audio, from the store
    assert again.audio == first.audio
    by_language = await say(port, TEXT, SynthesizeVoice(language="en_US"))
    assert by_language.audio == first.audio
    assert syntheses(metrics) == 2


async def test_streaming_speaks_sentence_by_sentence(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    http, port = await start(gateway, settings)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="joe")).event())
        # Chunks split words, and carry runs of spaces and newlines, as a model's tokens do.
        for piece in ("Turning on  the kit", "chen lights.\n\nThey will ", "dim at ten."):
            await client.write_event(SynthesizeChunk(text=piece).event())
        # Home Assistant also sends the whole text as a plain synthesize, for older servers.
        await client.write_event(Synthesize(text=TEXT).event())
        # The first sentence is complete once the second has begun: it is spoken already.
        first = await utterance(client)
        await client.write_event(SynthesizeStop().event())
        second = await utterance(client)
        stopped = await client.read_event()
    assert stopped is not None and SynthesizeStopped.is_type(stopped.type)
    assert counting_engine.texts == ["Turning on the kitchen lights.", "They will dim at ten."]
    for spoken, text in (
        (first, "Turning on the kitchen lights."),
        (second, "They will dim at ten."),
    ):
        seconds = await wav_seconds(http, text)
        assert abs(spoken.seconds - seconds) / seconds < 0.03
    assert counting_engine.items == 2  # the WAVs are the same masters: no second synthesis


async def test_each_connection_is_a_client_with_its_own_queue_share(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    """The protocol has no keys: each connection's sentences take that connection's share of
    the synthesis queue (queue_per_client), so one connection cannot fill it for the others."""
    http, port = await start(gateway, settings, max_parallel_sentences=4, queue_per_client=4)
    scheduler = http.server.app[keys.SPEECH].models["piper"].scheduler
    text = "One. Two. Three. Four. Five. Six."
    other = "Seven. Eight. Nine. Ten."  # (its sentences to queue outnumber the batches run)
    # Each text's first sentence stored first: a stream's later sentences are queued only once
    # its first is made, and here nothing is made while the engine waits.
    async with AsyncTcpClient("127.0.0.1", port) as warm:
        for first in ("One.", "Seven."):
            await warm.write_event(Synthesize(text=first).event())
            assert (await utterance(warm)).seconds > 0
    counting_engine.release.clear()  # every batch waits: sentences stay queued
    try:
        async with AsyncTcpClient("127.0.0.1", port) as a, AsyncTcpClient("127.0.0.1", port) as b:
            await a.write_event(Synthesize(text=text).event())
            await b.write_event(Synthesize(text=other).event())
            # The server names a connection by its peer: this client's own address.
            names = []
            for c in (a, b):
                host, port_ = c._writer.get_extra_info("sockname")[:2]
                names.append(f"wyoming:{os.getpid()}:{host}:{port_}")
            await until(
                lambda: (
                    scheduler.waiting_for(names[0]) >= 3 and scheduler.waiting_for(names[1]) >= 1
                ),
                what="both connections' sentences queued, each under its own name",
            )
            assert scheduler.waiting_for(names[0]) <= 4
            counting_engine.release.set()
            assert (await utterance(a)).seconds >= shortest_audio_s(text)
            assert (await utterance(b)).seconds >= shortest_audio_s(other)
    finally:
        counting_engine.release.set()


async def test_bad_events_get_an_error_and_the_connection_keeps_serving(
    gateway: GatewayFactory, settings: Settings
) -> None:
    _, port = await start(gateway, settings)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = AsyncTcpClient("127.0.0.1", port)
    client._reader, client._writer = reader, writer  # the package's reader over our socket
    bad: list[bytes] = [
        b"this is not json\n",
        b'{"type": 7}\n',
        b'{"type": "synthesize", "data": {"text": 42}}\n',
        b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": "nobody"}}}\n',
        b'{"type": "synthesize", "data": {"text": "   "}}\n',
        b'{"type": "synthesize-chunk", "data": {"text": "orphan"}}\n',
        b'{"type": "select-program", "data": {"name": "nobody"}}\n',
        # Declared data that is not JSON, and a payload a TTS server does not want: both read
        # and dropped, so the framing holds.
        b'{"type": "synthesize", "data_length": 5, "payload_length": 3}\nnope!xyz',
        # Hostile: nesting past the stack, a number past int()'s limit, control
        # characters in the text; each an error event, not a dropped connection.
        b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n",
        b'{"type": "synthesize", "data": {"text": "Hi."}, "x": ' + b"9" * 5000 + b"}\n",
        b'{"type": "synthesize", "data_length": 20000}\n' + b"[" * 10000 + b"]" * 10000,
        b'{"type": "synthesize", "data": {"text": "\\u0000\\u0000"}}\n',
        b'{"type": "synthesize", "data": {"text": "Hi\\u0007."}}\n',
    ]
    for raw in bad:
        writer.write(raw)
        await writer.drain()
        event = await client.read_event()
        assert event is not None and Error.is_type(event.type), (raw, event)
        assert Error.from_event(event).text
    await client.write_event(Synthesize(text="Still here.").event())
    spoken = await utterance(client)
    assert spoken.seconds >= shortest_audio_s("Still here.")
    # Data larger than any text may be: refused without being kept, the framing still holds.
    huge = 2_000_000
    writer.write(b'{"type": "synthesize", "data_length": %d}\n' % huge + b" " * huge)
    await writer.drain()
    event = await client.read_event()
    assert event is not None and Error.is_type(event.type)
    assert "limit" in Error.from_event(event).text
    await client.write_event(Describe().event())
    event = await client.read_event()
    assert event is not None and Info.is_type(event.type)
    writer.close()
    await writer.wait_closed()


async def test_fifty_concurrent_clients_are_all_answered(
    gateway: GatewayFactory, settings: Settings, counting_engine: CountingEngine
) -> None:
    _, port = await start(gateway, settings)
    texts = [f"Timer {i % 5} is done." for i in range(50)]
    spoken = await asyncio.gather(*(say(port, t) for t in texts))
    assert all(s.seconds >= shortest_audio_s(t) for s, t in zip(spoken, texts, strict=True))
    # Five distinct texts: each synthesized once, whatever the concurrency.
    assert counting_engine.items == 5
    assert spoken[0].audio == spoken[5].audio


async def test_connections_over_the_bound_are_refused(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics
) -> None:
    http, port = await start(gateway, settings, wyoming_max_connections=2)
    server = http.server.app[keys.WYOMING]
    held = [AsyncTcpClient("127.0.0.1", port) for _ in range(2)]
    for c in held:
        await c.connect()
        await c.write_event(Describe().event())
        assert (await c.read_event()) is not None  # both served, so both counted as open
    async with AsyncTcpClient("127.0.0.1", port) as extra:
        event: Event | None = await extra.read_event()
        assert event is not None and Error.is_type(event.type)
        assert Error.from_event(event).code == "too_many_connections"
        assert await extra.read_event() is None  # and closed
    assert metrics.registry.get_sample_value("voxgate_wyoming_connections") == 2
    for c in held:
        await c.disconnect()
    # Once they have left (their handlers have ended), a new client is served again.
    if server.tasks:
        async with asyncio.timeout(10):
            await asyncio.wait(set(server.tasks))
    assert metrics.registry.get_sample_value("voxgate_wyoming_connections") == 0
    spoken = await say(port, "Done.")
    assert spoken.seconds >= shortest_audio_s("Done.")


async def test_ssml_over_wyoming_shares_the_http_audio(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics
) -> None:
    """Home Assistant may send SSML like any client: the same front end, the same
    content address, so a document that is just words costs no second synthesis."""
    _, port = await start(gateway, settings)
    plain = await say(port, "Press one.")
    wrapped = await say(port, "<speak><p>Press one.</p></speak>")
    assert wrapped.audio == plain.audio
    paused = await say(port, '<speak>Press one.<break time="1s"/></speak>')
    assert syntheses(metrics) == 1
    # The same sentence, its near-silent tail trimmed, then the break's exact second of zeros
    # (at the voice's rate: no resampling), so the samples compare exactly.
    assert paused.rate == plain.rate == 22050
    words, silence = paused.audio[: -2 * 22050], paused.audio[-2 * 22050 :]
    assert silence == bytes(2 * 22050) and words[-2:] != b"\0\0"
    assert plain.audio.startswith(words)
    tail = np.frombuffer(plain.audio[len(words) :], dtype="<i2")
    assert np.abs(tail).max() <= round(0.01 * 32768)  # what was trimmed was near-silence


# ---- the default topology: `voxgate serve --wyoming-port N`, as Home Assistant users start it --

# A text whose audio (about 3 s, 130 KB of PCM) is far more than a socket buffers for a client
# that has stopped reading.
LONG_TEXT = "The front door is locked. The garage door is closed. All the lights are off."


async def test_unknown_event_types_are_dropped_unanswered(
    gateway: GatewayFactory, settings: Settings, metrics: Metrics
) -> None:
    """The package: servers drop the events they do not know (a client of a later protocol
    version sends them): no error event, the next answer is the next request's."""
    _, port = await start(gateway, settings)
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for kind in ("transcribe", "audio-chunk", "some-future-event"):
            await client.write_event(Event(type=kind, data={"text": "Hi."}))
        await client.write_event(Describe().event())
        event = await client.read_event()
    assert event is not None and Info.is_type(event.type), event
    dropped = metrics.registry.get_sample_value(
        "voxgate_wyoming_events_total", {"type": "other", "result": "dropped"}
    )
    assert dropped == 3


async def test_select_program_steers_synthesize_among_models_sharing_a_voice(
    gateway: GatewayFactory, settings: Settings, piper_engine: PiperEngine
) -> None:
    """Two programs (models) with a voice of the same name: select-program then synthesize (the
    real client library's events) speaks with the chosen one's engine, no error; a text stream
    follows the selection too."""
    first, second = CountingEngine(piper_engine), CountingEngine(piper_engine)
    port = free_port()
    await gateway(
        settings=settings.replace(wyoming_port=port),
        engines={"piper": first, "piper-b": second},
    )
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        event = await client.read_event()
        assert event is not None
        programs = Info.from_event(event).tts
        assert [(p.name, [v.name for v in p.voices]) for p in programs] == [
            ("piper", ["joe"]),
            ("piper-b", ["joe"]),
        ]
        await client.write_event(SelectProgram(name="piper-b").event())
        await client.write_event(
            Synthesize(text="Choose me.", voice=SynthesizeVoice("joe")).event()
        )
        spoken = await utterance(client)
        assert spoken.seconds >= shortest_audio_s("Choose me.")
        assert (first.items, second.items) == (0, 1)
        await client.write_event(Synthesize(text="Me too.").event())  # no voice: its default
        await utterance(client)
        assert (first.items, second.items) == (0, 2)
        # Matched as clients match advertised names: ignoring case.
        await client.write_event(SelectProgram(name="PIPER").event())
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice("joe")).event())
        await client.write_event(SynthesizeChunk(text="Streamed here.").event())
        await client.write_event(SynthesizeStop().event())
        await utterance(client)
        event = await client.read_event()
        assert event is not None and SynthesizeStopped.is_type(event.type), event
        assert (first.items, second.items) == (1, 2)
        await client.write_event(SelectProgram(name="nobody").event())
        event = await client.read_event()
        assert event is not None and Error.is_type(event.type)
        error = Error.from_event(event)
        assert error.code == "program_not_found" and "piper, piper-b" in error.text


@pytest.fixture(scope="module", params=["auto", "asyncio"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, int]]:
    """`voxgate serve` with no topology flags (a gateway process per core sharing the Wyoming
    port, the shared pool host, uvloop), and the same on asyncio's loop (only the loop changed:
    DefaultServer would make that one process); short idle and write timeouts so that the tests
    of them wait seconds, not minutes."""
    port = free_port()
    args = ["--wyoming-port", str(port), "--wyoming-idle-timeout-s", "2", "--write-timeout-s", "2"]
    home = tmp_path_factory.mktemp(f"wyoming-{request.param}")
    server = (
        DefaultServer(home, *args)
        if request.param == "auto"
        else ServerProcess(home, *args, "--event-loop", request.param)
    )
    try:
        server.wait_ready(workers=usable_cores())
        loop = "uvloop" if request.param == "auto" else request.param
        assert server.logs().count(f"event loop: {loop}") == usable_cores(), server.logs()
        yield server, port
        assert server.terminate() == 0, server.logs()
    finally:
        server.close()


async def dropped(server: ServerProcess, reason: str) -> float:
    """``voxgate_wyoming_connections_dropped_total{reason}`` summed over the gateway processes."""
    text = await asyncio.to_thread(server.metrics)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "voxgate_wyoming_connections_dropped_total"
                and sample.labels.get("reason") == reason
            ):
                return float(sample.value)
    return 0.0


async def test_every_gateway_process_serves_wyoming(
    served: tuple[ServerProcess, int],
) -> None:
    """Every process listens on the one port (SO_REUSEPORT): concurrent clients, spread over
    them by the kernel, all get their audio, and HTTP is ready beside it."""
    server, port = served
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        event = await client.read_event()
    assert event is not None and Info.is_type(event.type)
    assert [v.name for v in Info.from_event(event).tts[0].voices] == ["joe"]
    texts = [f"Timer {i % 3} is done." for i in range(12)]
    spoken = await asyncio.gather(*(say(port, text) for text in texts))
    assert all(
        s.rate == 22050 and s.seconds >= shortest_audio_s(text)
        for s, text in zip(spoken, texts, strict=True)
    )
    assert spoken[0].audio == spoken[3].audio  # the same text: the same stored audio
    status, _ = await asyncio.to_thread(server.get, "/readyz")
    assert status == 200


async def test_an_idle_client_is_closed(served: tuple[ServerProcess, int]) -> None:
    """A client that sends nothing (or nothing more, or not the rest of an event) is closed
    after wyoming_idle_timeout_s."""
    server, port = served
    before = await dropped(server, "idle")
    async with asyncio.timeout(30):
        async with AsyncTcpClient("127.0.0.1", port) as silent:
            assert await silent.read_event() is None  # the server closed it
        async with AsyncTcpClient("127.0.0.1", port) as quiet:
            await quiet.write_event(Describe().event())
            event = await quiet.read_event()
            assert event is not None and Info.is_type(event.type)
            assert await quiet.read_event() is None
        async with AsyncTcpClient("127.0.0.1", port) as stalled:
            assert stalled._writer is not None
            stalled._writer.write(b'{"type": "synthesize", "data_length": 100}\n{"text": ')
            await stalled._writer.drain()
            assert await stalled.read_event() is None  # half an event is not kept open
    assert await dropped(server, "idle") >= before + 3
    spoken = await say(port, "Still here.")
    assert spoken.seconds >= shortest_audio_s("Still here.")


async def test_a_client_that_stops_reading_is_cut_off(served: tuple[ServerProcess, int]) -> None:
    """A client that asks for audio and never reads it is dropped after write_timeout_s: the
    audio does not pile up in the gateway."""
    server, port = served
    before = await dropped(server, "write_timeout")
    # A small receive buffer, so the server's writes stall after little audio (the kernel
    # would otherwise buffer megabytes on loopback).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    client = AsyncTcpClient("127.0.0.1", port)
    client._reader, client._writer = reader, writer  # the package's client over this socket
    for _ in range(100):  # up to 13 MB of audio asked for; none of it read
        await client.write_event(Synthesize(text=LONG_TEXT).event())
    # (The first answer is a synthesis; the rest are hits.)
    await eventually(
        lambda: dropped(server, "write_timeout"),
        lambda n: n >= before + 1,
        within_s=120,
        what="the client that stopped reading dropped",
    )
    # What the server had sent before it gave up can still be read, then the connection ends.
    async with asyncio.timeout(30):
        with contextlib.suppress(ConnectionResetError):
            while await reader.read(65536):
                pass
    writer.close()
    spoken = await say(port, LONG_TEXT)
    assert spoken.seconds >= shortest_audio_s(LONG_TEXT)


async def test_wyoming_bench_programs_pass_against_voxgate_serve(
    served: tuple[ServerProcess, int], tmp_path: Path
) -> None:
    """A third-party client of the protocol: wyoming-bench's ``--programs`` sends select-program
    before each synthesis (both modes); it fails on any error event."""
    _, port = served
    bench = Path(sys.executable).with_name("wyoming-bench")
    texts = ["The door is locked.", "Two lights are on. The heater is off."]
    proc = await asyncio.create_subprocess_exec(
        str(bench),
        "tts",
        f"127.0.0.1:{port}",
        "--programs",
        "all",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--timeout",
        "60",
        "--texts",
        *texts,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    report = out.decode()
    assert proc.returncode == 0, report
    assert f"=== 127.0.0.1:{port} (piper) ===" in report, report
    assert "FAIL" not in report and "error" not in report.lower(), report
    assert "NOT SUPPORTED" not in report, report
