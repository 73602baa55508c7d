"""The ``auto`` text front end, the default: each model's own (``numbers`` for the local voices
and wyoming upstreams, ``none`` for a provider that reads digits itself, or as an upstream's
``normalize`` says), what it does to content addresses, and what ``POST /v1/ssml/explain`` shows
of it (docs/api.md, "Text front ends"; docs/upstreams.md, "Numbers")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.api.frontend import NORMALIZE_MODES, front_end_mode
from gateway.api.parsing import SMALL_BODY, front_end_may_run, speech_text
from gateway.api.readings import read_numbers
from gateway.runtime.settings import Settings
from gateway.speech.vocabulary import Vocabulary
from synth.engine import VoiceInfo
from synth.providers import SPECS
from synth.upstream import UpstreamConfig, UpstreamEngine
from tests.conftest import GatewayFactory
from tests.support import CountingEngine

PIN = "Your PIN is 0042."


def upstream(kind: str, **kw: Any) -> UpstreamConfig:
    values: dict[str, Any] = {
        "name": kind,
        "kind": kind,
        "base_url": "tcp://127.0.0.1:10200" if kind == "wyoming" else "https://tts.example",
        "voices": ["v1"],
        "language": "en_US",
        "api_key_env": "TTS_KEY",
        **kw,
    }
    spec = SPECS[kind]
    if spec.model is not None:
        values.setdefault("model", spec.model or "m1")
    if spec.rates:
        values.setdefault("sample_rate", spec.rates[0])
    if kind == "polly":
        values.setdefault("region", "us-east-1")
    return UpstreamConfig.model_validate(values)


async def speak(client: TestClient[Any, Any], text: str, **kw: Any) -> str:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav", **kw}
    resp = await client.post("/v1/audio/speech", json=body)
    assert resp.status == 200, await resp.text()
    return str(resp.headers["X-Audio-Key"])


# ---- resolving auto ------------------------------------------------------------------------


def test_auto_is_the_models_own_front_end_and_none_without_a_known_language() -> None:
    assert NORMALIZE_MODES[0] == "auto"
    assert Settings.load(env={}).normalize == "auto"
    assert front_end_mode("auto", "numbers", "en_US") == "numbers"
    assert front_end_mode("auto", "numbers", "zh_CN") == "numbers"
    assert front_end_mode("auto", "numbers", "de_DE") == "numbers"
    assert front_end_mode("auto", "none", "en_US") == "none"
    # No number words for the voice: left as it is, as before auto.
    assert front_end_mode("auto", "numbers", "") == "none"
    assert front_end_mode("auto", "numbers", "xx_XX") == "none"
    # Any other mode is what it says, whatever the model's own.
    for mode in ("none", "llm", "numbers"):
        assert front_end_mode(mode, "none", "en_US") == mode
        assert front_end_mode(mode, "numbers", "") == mode


def test_a_long_text_is_read_off_the_event_loop() -> None:
    """Reading the digits of a long text takes tens of milliseconds: such a body is validated in
    a thread; a prompt-sized one on the loop (well under a millisecond)."""
    auto = Settings.load(env={})
    small, large = b"x" * SMALL_BODY, b"x" * (SMALL_BODY + 1)
    assert not front_end_may_run(auto, small)
    assert front_end_may_run(auto, large)
    assert front_end_may_run(auto, None)  # (a text of any length)
    assert not front_end_may_run(auto.replace(normalize="none"), large)
    assert front_end_may_run(auto.replace(normalize="llm"), small)


def test_each_upstream_kind_reads_numbers_as_its_service_does() -> None:
    """wyoming (a Piper or similar behind it) gets the words; a hosted kind whose service reads
    digits itself gets the text as written; the entry's own ``normalize`` decides over both."""
    own = {kind: upstream(kind).front_end for kind in SPECS}
    assert own == {
        "openai": "none",
        "elevenlabs": "none",
        "azure": "none",
        "google": "none",
        "polly": "none",
        "cartesia": "none",
        "deepgram": "none",
        "wyoming": "numbers",
    }
    assert upstream("elevenlabs", normalize="numbers").front_end == "numbers"
    assert upstream("wyoming", normalize="none").front_end == "none"
    engine = UpstreamEngine(upstream("wyoming"))
    assert engine.capabilities.front_end == "numbers"
    assert engine.describe()["front_end"] == "numbers"
    # Bodies already validated stand for their text: a change needs a restart.
    assert "normalize" in engine.reconfigure(upstream("wyoming", normalize="none"))
    assert engine.reconfigure(upstream("wyoming", normalize="numbers")) == ""


def test_per_upstream_auto_and_the_explicit_setting_over_it() -> None:
    words = Vocabulary(
        {
            "wy": UpstreamEngine(upstream("wyoming")),
            "el": UpstreamEngine(upstream("elevenlabs")),
            "el-read": UpstreamEngine(upstream("elevenlabs", normalize="numbers")),
        }
    )
    text = "Pay $42.50 by 3 pm."
    read = read_numbers(text, "en")
    assert read != text

    def said(model: str, settings: Settings, **kw: Any) -> str:
        return speech_text(text, settings, words, model, "v1", **kw).text

    auto = Settings.load(env={})
    assert said("wy", auto) == read
    assert said("el", auto) == text
    assert said("el-read", auto) == read
    # The request's normalize, then the setting, decide over the model's own.
    assert said("wy", auto, normalize="none") == text
    assert said("el", auto, normalize="numbers") == read
    numbers = auto.replace(normalize="numbers")
    assert said("el", numbers) == read
    assert said("el", numbers, normalize="auto") == text
    # A voice id the entry does not list ("*") speaks the entry's language.
    any_voice = Vocabulary(
        {"wy": UpstreamEngine(upstream("wyoming", voices=["*"], language="en_US"))}
    )
    assert speech_text(text, auto, any_voice, "wy", "other").text == read


# ---- through the gateway -------------------------------------------------------------------


async def test_a_default_request_shares_the_address_of_its_words(gateway: GatewayFactory) -> None:
    """A client that only changed its base URL gets the PIN read as words: the default request
    is the spelled-out text's content address, under numbers and as written alike."""
    client = await gateway()
    spelled = read_numbers(PIN, "en")
    assert spelled != PIN and not any(ch.isdigit() for ch in spelled)
    default = await speak(client, PIN)
    assert default == await speak(client, PIN, normalize="numbers")
    assert default == await speak(client, PIN, normalize="auto")
    assert default == await speak(client, spelled, normalize="none")
    assert default == await speak(client, spelled)
    # As written is another text, so another address.
    assert default != await speak(client, PIN, normalize="none")


class UnlabelledEngine(CountingEngine):
    """The counting engine, with voices of no known language."""

    def voices(self) -> Sequence[VoiceInfo]:
        return [dataclasses.replace(v, language="") for v in self.inner.voices()]


async def test_a_voice_of_no_known_language_keeps_its_digits_under_auto(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """auto never starts refusing what worked before: with no number words for the voice the
    text is said as written; an explicit numbers still refuses digits it cannot read."""
    client = await gateway(engines={"piper": UnlabelledEngine(counting_engine.inner)})
    assert await speak(client, PIN) == await speak(client, PIN, normalize="none")
    resp = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": PIN, "normalize": "numbers"},
    )
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "unsupported_language"


async def explain(client: TestClient[Any, Any], text: str, **kw: Any) -> dict[str, Any]:
    body = {"model": "tts-1", "voice": "alloy", "input": text, **kw}
    resp = await client.post("/v1/ssml/explain", json=body)
    assert resp.status == 200, await resp.text()
    got: dict[str, Any] = await resp.json()
    return got


async def test_explain_shows_the_front_end_and_the_text_the_engine_reads(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    got = await explain(client, PIN)
    assert got["front_end"] == "numbers"
    assert [s["text"] for s in got["sentences"]] == [read_numbers(PIN, "en")]
    # What it shows is what the engine is given.
    await speak(client, PIN)
    assert counting_engine.texts[-1] == got["sentences"][0]["text"]
    plain = await explain(client, PIN, normalize="none")
    assert plain["front_end"] == "none"
    assert [s["text"] for s in plain["sentences"]] == [PIN]


@pytest.mark.parametrize("normalize", [None, "numbers"])
async def test_say_as_decides_how_its_own_digits_are_read(
    gateway: GatewayFactory, normalize: str | None
) -> None:
    """In SSML the number front end reads the document's bare digits; a ``say-as`` reads its own
    (here digit by digit, where the front end would read a number)."""
    client = await gateway()
    doc = '<speak>Room <say-as interpret-as="digits">42</say-as>, floor 42.</speak>'
    kw = {"normalize": normalize} if normalize else {}
    got = await explain(client, doc, **kw)
    assert got["front_end"] == "numbers"
    floor = read_numbers("floor 42.", "en")
    assert got["text"] == f"Room four two, {floor}"
    assert "four two" not in floor
    as_written = await explain(client, doc, normalize="none")
    assert as_written["front_end"] == "none"
    assert as_written["text"] == "Room four two, floor 42."
