"""Loudness-normalized masters (synth/loudness.py, docs/synthesis.md "Loudness"): the measures
against BS.1770's reference values, the normalizer on the bundled voice, the setting in the
content address, and every format of ``voxgate serve`` (the bundled voice and an upstream
provider) decoded: no sample at full scale, true peak at most -1 dBTP, the target's loudness."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from bench.loudness import decode
from gateway.runtime.settings import Settings
from synth import audio, loudness
from synth.engine import SynthesisItem
from synth.piper_engine import PiperEngine
from synth.upstream import UpstreamConfig
from tests.conftest import COQUI_BUZZ_LIMITS, GatewayFactory
from tests.served import DefaultServer
from tests.support import CountingEngine
from tests.upstream_support import KEY_ENV, OpenAISpeechServer, voiced

TARGET = loudness.DEFAULT_TARGET_LUFS
CEILING = loudness.CEILING_DBTP
RENDITION_CEILING = loudness.RENDITION_CEILING_DBTP


def sine(freq: float, amplitude: float, rate: int, seconds: float, phase: float = 0.0) -> Any:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t + phase)).astype(np.float32)


def test_measures_give_bs1770_reference_values() -> None:
    """BS.1770-4: a 997 Hz sine at 0 dBFS peak reads -3.01 LUFS (so at -20 dBFS, -23.01);
    a sine at a quarter of the rate sampled 45 degrees off its crests has samples at 0.707 and
    a true peak (4x oversampled, Annex 2) of 1.0, where the sample peak misses 3 dB."""
    assert loudness.integrated_loudness(sine(997, 0.1, 48000, 5.0), 48000) == pytest.approx(
        -23.01, abs=0.05
    )
    quarter = sine(12000, 1.0, 48000, 0.5, phase=np.pi / 4)
    # Faded in and out: an abrupt start rings in any oversampling filter.
    quarter[:480] *= np.linspace(0.0, 1.0, 480, dtype=np.float32)
    quarter[-480:] *= np.linspace(1.0, 0.0, 480, dtype=np.float32)
    assert float(np.max(np.abs(quarter))) == pytest.approx(0.7071, abs=1e-3)
    assert loudness.true_peak(quarter, 48000) == pytest.approx(1.0, abs=0.01)


def test_the_bundled_voice_is_brought_to_the_target_under_the_ceiling(
    piper_engine: PiperEngine,
) -> None:
    """Sentences long and short (a word at speed 4 lasts under one 400 ms gating block) land at
    the target, their true peak at most the master's ceiling; the loudest and quietest of them,
    several LU apart as the voice says them, end within 1 LU of each other."""
    texts = [
        ("Thank you for calling. Your call is important to us.", 1.0),
        ("Please hold while we connect you to the next available agent.", 1.0),
        ("Goodbye!", 1.0),
        ("Yes.", 4.0),
    ]
    before, after = [], []
    for text, speed in texts:
        take = piper_engine.synthesize_batch(
            [SynthesisItem(text, "joe", speed, {"noise_scale": 0.0, "noise_w": 0.0})]
        )[0]
        rate = take.sample_rate
        out = loudness.normalize(take.pcm, rate, TARGET, CEILING)
        assert out.dtype == np.float32 and out.shape == take.pcm.shape
        before.append(loudness.integrated_loudness(take.pcm, rate))
        after.append(loudness.integrated_loudness(out, rate))
        assert loudness.db(loudness.true_peak(out, rate)) <= CEILING + 0.01, text
    assert max(before) - min(before) > 2.0  # the voice's own spread, for contrast
    assert max(after) - min(after) < 1.0
    assert all(abs(level - TARGET) < 1.0 for level in after), after


def test_silence_is_left_as_it_is() -> None:
    quiet = np.zeros(22050, dtype=np.float32)
    assert loudness.normalize(quiet, 22050, TARGET, CEILING) is quiet
    click = np.zeros(22050, dtype=np.float32)
    click[100] = 1e-6  # below the absolute gate (-70 LUFS)
    assert np.array_equal(loudness.normalize(click, 22050, TARGET, CEILING), click)


async def test_the_target_is_part_of_the_content_address(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    """One text at -18 LUFS, at -23 and with loudness off: three addresses, three audios."""
    keys, bodies = set(), set()
    for target in ("-18", "-23", "off"):
        settings = Settings.load(
            env={},
            overrides={
                "cache_dir": str(tmp_path / f"cache{target}"),
                "port": "0",
                "take_limits": COQUI_BUZZ_LIMITS,
                "loudness_lufs": target,
            },
        )
        client = await gateway(settings=settings)
        body = {"model": "tts-1", "input": "Press one.", "voice": "alloy", "response_format": "wav"}
        r = await client.post("/v1/audio/speech", json=body)
        assert r.status == 200, await r.text()
        keys.add(r.headers["X-Audio-Key"])
        bodies.add(await r.read())
    assert len(keys) == 3 and len(bodies) == 3


# Every rendition of speech decodes at most -1 dBTP (RENDITION_CEILING), the master's ceiling
# being set low enough for that. The audio is the same every run (synthesis is seeded from the
# address), so what is left to allow for is the measure, not the take: the decoded samples pass
# through float and 16-bit rounding (one step of 16 bits at -1 dBFS is 0.0003 dB), and another
# ffmpeg build's decoders round otherwise. 0.01 dB covers that many times over and is a small
# fraction of the smallest margin measured (python -m bench.loudness; docs/synthesis.md).
MEASURE_EPSILON_DB = 0.01
LONG = "Thank you for calling Acme Travel. Your call is important to us. Please stay on the line."


@pytest.mark.slow
async def test_every_format_of_voice_and_upstream_is_at_the_target_and_never_clips(
    tmp_path: Path,
) -> None:
    """``voxgate serve`` as users start it, with one upstream (the local OpenAI-compatible
    provider, whose buzz is 9 dB under full scale) beside the bundled voice: every format of a
    long and a short text decodes with no sample at full scale and a true peak at most
    -1 dBTP; the long text's WAV is within 1 LU of the target from both."""
    provider = await OpenAISpeechServer().start()
    upstreams = tmp_path / "upstreams.toml"
    upstreams.write_text(
        "[[upstream]]\n"
        'name = "openai"\nkind = "openai"\n'
        f'base_url = "{provider.url}"\napi_key_env = "{KEY_ENV}"\nmodel = "gpt-4o-mini-tts"\n'
        'voices = ["alloy"]\n'
    )
    server = DefaultServer(
        tmp_path / "s", "--upstreams-file", str(upstreams), env={KEY_ENV: provider.api_key}
    )
    found: dict[tuple[str, str, str], tuple[float, float, float]] = {}
    try:
        await asyncio.to_thread(server.wait_ready)
        async with aiohttp.ClientSession() as session:
            for model in ("tts-1", "openai"):
                for text in (LONG, "Yes."):
                    for fmt in audio.FORMATS:
                        body = {"model": model, "input": text, "voice": "alloy"}
                        body["response_format"] = fmt
                        async with session.post(f"{server.url}/v1/audio/speech", json=body) as r:
                            assert r.status == 200, await r.text()
                            data = await r.read()
                            rate = int(r.headers["X-Audio-Sample-Rate"])
                        pcm = decode(data, fmt, rate, tmp_path)
                        rate = 48000 if fmt == "opus" else rate
                        found[model, text, fmt] = (
                            float(np.max(np.abs(pcm))),
                            loudness.db(loudness.true_peak(pcm, rate)),
                            loudness.integrated_loudness(pcm, rate),
                        )
    finally:
        server.terminate()
        await provider.stop()
    for (model, text, fmt), (peak, tp, level) in found.items():
        where = (model, text[:10], fmt, round(tp, 2), round(level, 2))
        assert peak < 0.99, where  # no sample at (or a step from) full scale
        assert tp <= RENDITION_CEILING + MEASURE_EPSILON_DB, where
        if text == LONG and fmt == "wav":
            assert abs(level - TARGET) <= 1.0, where


async def test_with_a_target_a_clipped_take_is_still_refused_and_the_retake_kept_at_it(
    gateway: GatewayFactory,
    counting_engine: CountingEngine,
    provider: OpenAISpeechServer,
    tmp_path: Path,
) -> None:
    """With a target, a provider's take driven into flat tops at full scale is refused as
    clipped as it is without one, the retake is kept, and what is served is that retake at
    the target."""
    settings = Settings.load(
        env={},
        overrides={"cache_dir": str(tmp_path / "cache"), "port": "0", "loudness_lufs": "-18"},
    )
    config = UpstreamConfig.model_validate(
        {
            "name": "openai",
            "kind": "openai",
            "base_url": provider.url,
            "api_key_env": KEY_ENV,
            "model": "gpt-4o-mini-tts",
            "voices": ["alloy"],
            "timeout_s": 5,
        }
    )
    client = await gateway(settings=settings, engines={"piper": counting_engine, "openai": config})
    text = "Your order has shipped and will arrive on Friday."
    driven = np.clip(voiced(text).astype(np.int32) * 6, -32768, 32767).astype("<i2")
    assert np.count_nonzero(np.abs(driven.astype(np.int32)) >= 32767) > 1000
    provider.takes.append(driven)
    body = {"model": "openai", "voice": "alloy", "input": text, "response_format": "wav"}
    r = await client.post("/v1/audio/speech", json=body)
    assert r.status == 200, await r.text()
    assert provider.calls == 2  # the clipped take, then the retake
    kept = (await (await client.get("/v1/takes")).json())["takes"]
    assert [t["reasons"] for t in kept] == [["clipped"]]
    pcm, rate = sf.read(io.BytesIO(await r.read()), dtype="float32")
    assert abs(loudness.integrated_loudness(pcm, rate) - TARGET) < 0.5
    assert loudness.db(loudness.true_peak(pcm, rate)) <= CEILING + MEASURE_EPSILON_DB
