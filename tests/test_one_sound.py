"""One sound per address: the local engines draw their noise from what an item's address covers
(synth/seeded_noise.py) and every format's encoder writes the same bytes for the same audio
(synth/ogg.py), so two stores that each make one address (two replicas without a shared
Redis, a store made again after eviction) hold the same bytes under the same ETag.
docs/synthesis.md, "One sound per address"."""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cache.tier import PurgeFilter
from gateway.http import keys
from synth import audio
from synth.engine import SynthesisItem
from synth.ogg import fixed_serial, ogg_crc
from synth.piper_engine import PiperEngine, PiperVoiceFiles
from synth.seeded_noise import normal_values
from tests.conftest import GatewayFactory
from tests.served import DefaultServer
from tests.support import CountingEngine

TEXTS = [
    "Hello.",
    "Your call is important to us.",
    "Please hold.",
    "Press one for sales. Press two for support.",
    "Goodbye!",
    "The number is 42.",
    "Thank you for waiting.",
]
FORMATS = ["wav", "mp3", "opus", "aac", "flac", "mulaw"]


def speech(text: str, fmt: str, speed: float = 1.0) -> dict[str, object]:
    return {
        "model": "piper",
        "voice": "joe",
        "input": text,
        "response_format": fmt,
        "speed": speed,
        "stream": False,
    }


# 20 addresses: every (text, format) pair differs (7 texts and 6 formats taken in turn), and
# the last is at another speed.
BODIES = [speech(TEXTS[i % len(TEXTS)], FORMATS[i % len(FORMATS)]) for i in range(19)]
BODIES.append(speech(TEXTS[1], "opus", speed=1.25))


def test_two_fresh_servers_store_the_same_bytes_under_the_same_etags(tmp_path: Path) -> None:
    """Two ``voxgate serve``, each on its own fresh cache, asked in opposite orders (so nothing
    ran before an item alike): each synthesizes every text itself (a text's first answer is a
    miss; its other formats are made from that master), and every address comes back the same."""
    spoken = {(body["input"], body["speed"]) for body in BODIES}
    answers: dict[tuple[str, str], tuple[str, str, bytes]] = {}

    async def ask(server: DefaultServer, bodies: list[dict[str, object]]) -> None:
        missed = set()
        for body in bodies:
            status, headers, data = await server.request("POST", "/v1/audio/speech", json=body)
            assert status == 200, data[:200]
            named = {name.lower(): value for name, value in headers.items()}
            if named["x-cache"] == "MISS":
                missed.add((body["input"], body["speed"]))
            answers[server.url, str(body)] = (named["etag"], named["x-audio-key"], data)
        assert missed == spoken

    with contextlib.ExitStack() as stack:
        # Both start before either is waited for: their starts overlap.
        pending = [DefaultServer(tmp_path / name) for name in ("a", "b")]
        for server in pending:
            stack.callback(server.close)
        a, b = (stack.enter_context(server.serving()) for server in pending)
        asyncio.run(ask(a, BODIES))
        asyncio.run(ask(b, BODIES[::-1]))
    etags = set()
    for body in BODIES:
        first, second = (answers[server.url, str(body)] for server in (a, b))
        assert first[1] == second[1]  # one address
        assert first[0] == second[0], f"{body}: ETags differ"
        assert first[2] == second[2], f"{body}: bytes differ"
        etags.add(first[0])
    assert len(etags) == len(BODIES)


async def test_a_master_made_again_after_eviction_is_the_same_audio(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    body = speech("Please hold, an agent will be with you shortly.", "opus")
    first = await client.post("/v1/audio/speech", json=body)
    assert first.status == 200 and first.headers["X-Cache"] == "MISS"
    made = counting_engine.items
    purged = await client.app[keys.STORE].purge(PurgeFilter())
    assert sum(purged.values()) >= 2  # the master and the rendition, in each tier
    again = await client.post("/v1/audio/speech", json=body)
    assert again.headers["X-Cache"] == "MISS" and counting_engine.items == made + 1
    assert again.headers["ETag"] == first.headers["ETag"]
    assert await again.read() == await first.read()


def test_an_item_sounds_the_same_in_any_batch_and_any_engine(piper_engine: PiperEngine) -> None:
    """With the voice's noise on: a batch's items, each alone in reverse order, and each in a
    freshly loaded engine (whose first run guesses how much noise a graph reads) are the same
    samples, bit for bit; a retake is other audio."""
    items = [SynthesisItem(text, "joe") for text in TEXTS[:4]]
    items.append(SynthesisItem(TEXTS[1], "joe", speed=0.5))
    items.append(SynthesisItem("hɛloʊ", "joe", phonemes=True))
    batched = piper_engine.synthesize_batch(items)
    singles = [piper_engine.synthesize_batch([item])[0] for item in reversed(items)][::-1]
    # Threads as many as the session's engine: ONNX Runtime's sums may group otherwise on two
    # (docs/synthesis.md, "One sound per address").
    fresh = PiperEngine([PiperVoiceFiles.bundled_joe()], intra_op_threads=1)
    fresh.load()
    firsts = [fresh.synthesize_batch([item])[0] for item in items]
    for b, s, f in zip(batched, singles, firsts, strict=True):
        assert np.array_equal(b.pcm, s.pcm) and np.array_equal(b.pcm, f.pcm)
        assert b.words == s.words == f.words
    retake = piper_engine.synthesize_batch([SynthesisItem(TEXTS[1], "joe", take=1)])[0]
    assert not np.array_equal(retake.pcm, batched[1].pcm)


def test_a_noise_stream_begins_alike_however_much_is_drawn() -> None:
    """What lets a run given too little noise be run again with more, to the same result."""
    whole = normal_values(1234, 0, 1, 5000)
    for count in (1, 17, 4096, 4999):
        assert np.array_equal(normal_values(1234, 0, 1, count), whole[:count])
    assert not np.array_equal(normal_values(1234, 1, 1, 100), whole[:100])


@pytest.mark.parametrize("name", sorted(audio.FORMATS))
def test_every_format_encodes_the_same_audio_to_the_same_bytes(name: str) -> None:
    pcm = (np.random.default_rng(7).standard_normal(22050) * 0.1).astype(np.float32)
    fmt = audio.FORMATS[name]
    rate = audio.output_rate(fmt, 22050, None)
    first = audio.render(pcm, 22050, fmt, rate)
    assert audio.render(pcm, 22050, fmt, rate) == first


def test_an_ogg_file_gets_a_serial_of_its_own_and_valid_checksums() -> None:
    rng = np.random.default_rng(3)
    pcm = (rng.standard_normal(48000) * 0.1).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, pcm, 24000, format="OGG", subtype="OPUS")
    written = buf.getvalue()
    fixed = fixed_serial(written)
    assert len(fixed) == len(written) and fixed != written
    pages = 0
    at = 0
    serials = set()
    while at < len(fixed):
        assert fixed[at : at + 4] == b"OggS"
        segments = fixed[at + 26]
        end = at + 27 + segments + sum(fixed[at + 27 : at + 27 + segments])
        page = bytearray(fixed[at:end])
        serials.add(bytes(page[14:18]))
        (crc,) = struct.unpack("<I", page[22:26])
        page[22:26] = bytes(4)
        assert ogg_crc(bytes(page)) == crc
        pages += 1
        at = end
    assert pages > 2 and len(serials) == 1
    # libogg checks each page's checksum as it reads: a wrong one would lose the page's audio.
    assert np.array_equal(sf.read(io.BytesIO(fixed))[0], sf.read(io.BytesIO(written))[0])
    other = (rng.standard_normal(48000) * 0.1).astype(np.float32)
    assert audio.render(other, 24000, audio.FORMATS["opus"], 24000)[14:18] not in serials
