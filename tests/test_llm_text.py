"""The ``llm`` text front end: a language model's Markdown made speakable before the content
address is computed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gateway.api.frontend import FRONT_ENDS, NORMALIZE_MODES, front_end
from gateway.api.llmtext import speakable
from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory
from tests.support import CountingEngine


@pytest.mark.parametrize(
    ("markdown", "spoken"),
    [
        ("**Hello** there, *friend*!", "Hello there, friend!"),
        ("It is __really__ ~~not~~ fine.", "It is really not fine."),
        ("Run `pip install voxgate` first.", "Run pip install voxgate first."),
        ("```python\nprint('hi')\n```\nThen stop.", "print('hi'). Then stop."),
        ("See [the docs](https://example.com/docs) now.", "See the docs now."),
        ("![a cat](cat.png) sleeps.", "a cat sleeps."),
        ("Visit https://www.example.com/a/b?c=1 today.", "Visit example.com today."),
        ("Go to www.voxgate.dev, then call.", "Go to voxgate.dev, then call."),
        ("Great job 👍🏽 🎉 and 🇫🇷 flags!", "Great job and flags!"),
        ("# Steps\n1. Open it\n2. Close it", "Steps. Open it. Close it."),
        ("- one\n- two!", "one. two!"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a, b. 1, 2."),
        ("snake_case_name stays, 5 * 3 * 2 too.", "snake_case_name stays, 5 * 3 * 2 too."),
        ("Press \\* to repeat.", "Press * to repeat."),
        ("Plain text. Nothing to do.", "Plain text. Nothing to do."),
        ("Call 1-800-555-0100 #4", "Call 1-800-555-0100 #4"),
        ("Line one\nline two", "Line one line two"),
        ("<b>bold</b> words", "bold words"),
    ],
)
def test_speakable(markdown: str, spoken: str) -> None:
    assert speakable(markdown) == spoken


def test_front_end_table_matches_the_setting() -> None:
    field = Settings.model_fields["normalize"]
    assert field.annotation is not None
    assert set(field.annotation.__args__) == set(NORMALIZE_MODES)
    assert front_end("**x**", "none") == "**x**"


def speech(**kw: Any) -> dict[str, Any]:
    return {"model": "tts-1", "voice": "alloy", "response_format": "wav", **kw}


async def test_llm_front_end_shares_the_plain_texts_entry(
    gateway: GatewayFactory, counting_engine: CountingEngine, settings: Settings
) -> None:
    client = await gateway()
    plain = await client.post("/v1/audio/speech", json=speech(input="Hello there, friend!"))
    md = await client.post(
        "/v1/audio/speech",
        json=speech(input="**Hello** there, *friend*! 👋", normalize="llm"),
    )
    assert md.status == 200
    assert md.headers["X-Audio-Key"] == plain.headers["X-Audio-Key"]
    assert md.headers["X-Cache"] == "HIT"
    assert counting_engine.items == 1
    # Without the front end the markup is text: another entry.
    raw = await client.post("/v1/audio/speech", json=speech(input="**Hello** there, *friend*!"))
    assert raw.headers["X-Audio-Key"] != plain.headers["X-Audio-Key"]
    # The setting makes it the default, and a request can still opt out.
    llm = await gateway(settings=settings.replace(normalize="llm"))
    by_default = await llm.post("/v1/audio/speech", json=speech(input="**Hello** there, *friend*!"))
    assert by_default.headers["X-Audio-Key"] == plain.headers["X-Audio-Key"]
    opted_out = await llm.post(
        "/v1/audio/speech", json=speech(input="**Hello** there, *friend*!", normalize="none")
    )
    assert opted_out.headers["X-Audio-Key"] == raw.headers["X-Audio-Key"]


async def test_llm_front_end_errors(gateway: GatewayFactory) -> None:
    client = await gateway()
    r = await client.post("/v1/audio/speech", json=speech(input="🎉👍 🚀", normalize="llm"))
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == "input" and err["code"] == "nothing_to_speak"
    assert "'llm' text front end" in err["message"]
    r = await client.post("/v1/audio/speech", json=speech(input="Hi.", normalize="markdown"))
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == "normalize" and "'markdown'" in err["message"]


async def test_front_end_runs_off_the_event_loop(
    gateway: GatewayFactory, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Markdown parsing of a long hostile text takes tens of milliseconds: never on the loop."""
    threads: list[str] = []

    def recording(text: str, language: str) -> str:
        threads.append(threading.current_thread().name)
        return speakable(text)

    monkeypatch.setitem(FRONT_ENDS, "llm", recording)
    client = await gateway()
    r = await client.post("/v1/audio/speech", json=speech(input="**Hi.**", normalize="llm"))
    assert r.status == 200
    llm = await gateway(settings=settings.replace(normalize="llm"))
    for path, payload in (("/", {"text": "**Hi.**"}), ("/api/tts", {"text": "**Hi.**"})):
        assert (await llm.post(path, json=payload)).status == 200, path
    assert (await llm.get("/synthesize", params={"text": "**Hi.**"})).status == 200
    loop_thread = threading.current_thread().name
    assert len(threads) == 4
    assert loop_thread not in threads
