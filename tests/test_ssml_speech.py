"""SSML and number normalization through a real gateway and the real Piper voice: the content
address comes from the expansion, breaks and rates are applied when sentences are joined, and
templated prompts reuse their fixed sentences.

Piper's durations are random (noise inside its ONNX graph), so nothing here compares the lengths
of two syntheses: a break is found in the samples as the exact silence the gateway inserts, and a
rate is compared on noise-free synthesis (Piper's noise scales at 0: the same audio every run)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient

from bench.harness import speech_body
from cache.entry import CorruptEntry, Entry
from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory
from tests.support import CountingEngine, error_of, shortest_audio_s

SENTENCE = "The quick brown fox jumps over the lazy dog."
# X-Audio-Key of SENTENCE (tts-1, alloy, wav) computed with main's code before SSML landed
# (cache.keys at 32a90e3, the bundled joe voice): plain text keeps its address, so no existing
# cache entry is invalidated.
SENTENCE_KEY_ON_MAIN = "6ba20f30427dc9042e6481d0e76746252972e4278e808bd5772f82f71c117df5"


async def speak(client: TestClient[Any, Any], text: str, **kw: Any) -> tuple[str, str, float]:
    """``(X-Audio-Key, X-Cache, seconds of audio)``."""
    resp = await client.post("/v1/audio/speech", json=speech_body(text, **kw))
    assert resp.status == 200, await resp.text()
    data, rate = sf.read(io.BytesIO(await resp.read()), dtype="float32")
    return resp.headers["X-Audio-Key"], resp.headers["X-Cache"], len(data) / rate


async def test_plain_text_keeps_its_address_and_speak_around_it_shares_it(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    key, cache, _ = await speak(client, SENTENCE)
    assert (key, cache) == (SENTENCE_KEY_ON_MAIN, "MISS")
    wrapped = (
        '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis">'
        f"<p>{SENTENCE}</p></speak>"
    )
    same, cache, _ = await speak(client, wrapped)
    assert (same, cache) == (key, "HIT")
    assert counting_engine.items == 1


async def test_sub_shares_its_alias_digits_and_cardinal_do_not(gateway: GatewayFactory) -> None:
    client = await gateway()
    sub, _, _ = await speak(
        client, '<speak><sub alias="World Health Organization">WHO</sub></speak>'
    )
    words, cache, _ = await speak(client, "World Health Organization")
    assert (words, cache) == (sub, "HIT")
    digits, _, _ = await speak(client, '<speak><say-as interpret-as="digits">42</say-as></speak>')
    number, _, _ = await speak(client, '<speak><say-as interpret-as="cardinal">42</say-as></speak>')
    assert digits != number


def zero_runs(samples: np.ndarray[Any, Any]) -> list[tuple[int, int]]:
    """``(length, start)`` of every run of zero samples, longest first."""
    zero = np.concatenate(([0], (samples == 0).astype(np.int8), [0]))
    edges = np.diff(zero)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return sorted(zip((ends - starts).tolist(), starts.tolist(), strict=True), reverse=True)


async def test_a_break_is_exact_silence_of_its_length(gateway: GatewayFactory) -> None:
    """The gateway joins the two halves with exactly 1.5 s of zero samples, having trimmed the
    voice's own near-silence (above 1 % of full scale) beside it: at the voice's rate (no
    resampling) the longest run of zero samples is the break, to the sample. Piper's own zero
    runs are a few milliseconds (measured: 49 samples at most), and each half lasts well under
    1.5 s, so no other run can be as long."""
    client = await gateway()
    doc = '<speak>Please <break time="1500ms"/> wait.</speak>'
    resp = await client.post("/v1/audio/speech", json=speech_body(doc, sample_rate=22050))
    assert resp.status == 200, await resp.text()
    pcm, rate = sf.read(io.BytesIO(await resp.read()), dtype="int16")
    assert rate == 22050
    (length, start), *_ = zero_runs(pcm)
    assert length == round(1.5 * rate)
    assert start > 0 and start + length < len(pcm)  # between the words, not at an edge


async def test_slow_prosody_lengthens_noise_free_speech(gateway: GatewayFactory) -> None:
    """``<prosody rate="slow">`` reaches the engine as speed 0.64. With Piper's noise scales at 0
    (Piper's ``POST /`` takes them) a text's audio is the same on every run, so the two lengths
    compare exactly (1/0.64 = 1.56 times as long: speeds are exact)."""
    client = await gateway()

    async def samples(text: str) -> int:
        piper = {"text": text, "noise_scale": 0, "noise_w_scale": 0}
        resp = await client.post("/", json=piper)
        assert resp.status == 200, await resp.text()
        return int(sf.info(io.BytesIO(await resp.read())).frames)

    plain = await samples("Please wait.")
    slow = await samples('<speak><prosody rate="slow">Please wait.</prosody></speak>')
    assert slow > plain * 1.3, (plain, slow)
    explained = await client.post(
        "/v1/ssml/explain",
        json=speech_body('<speak><prosody rate="slow">Please wait.</prosody></speak>'),
    )
    assert [s["speed"] for s in (await explained.json())["sentences"]] == [0.64]


async def test_trailing_and_leading_breaks_are_exact_silence(gateway: GatewayFactory) -> None:
    client = await gateway()
    resp = await client.post(
        "/v1/audio/speech",
        json=speech_body('<speak><break time="700ms"/>Hello.<break time="1s"/></speak>'),
    )
    pcm, rate = sf.read(io.BytesIO(await resp.read()), dtype="float32")
    lead, tail = pcm[: int(0.7 * rate)], pcm[-int(1.0 * rate) :]
    assert np.all(lead == 0) and np.all(tail == 0)
    assert np.any(pcm[int(0.7 * rate) : -int(1.0 * rate)] != 0)


async def test_templated_prompt_synthesizes_only_the_changed_sentence(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    template = (
        '<speak>Your balance is <say-as interpret-as="currency">{}</say-as>. '
        "Press one to pay.</speak>"
    )
    await speak(client, template.format("$42.17"))
    assert counting_engine.items == 2
    _, cache, _ = await speak(client, template.format("$13.05"))
    assert cache == "MISS"
    assert counting_engine.items == 3  # only the changed sentence
    assert counting_engine.texts[-1] == "Your balance is thirteen dollars, five cents."


@pytest.mark.parametrize(
    "doc",
    [
        '<speak><break time="300ms"/>One. <prosody rate="fast">Two and three.</prosody>'
        '<break time="1200ms"/>Four.<break time="500ms"/></speak>',
        # One sentence: its trailing break is all the stream sends after it.
        '<speak>Hold on.<break time="800ms"/></speak>',
    ],
    ids=["several-sentences", "one-sentence-trailing-break"],
)
async def test_ssml_stream_equals_the_whole_answer(
    gateway: GatewayFactory, counting_engine: CountingEngine, doc: str
) -> None:
    client = await gateway()
    streamed = await client.post(
        "/v1/audio/speech",
        json=speech_body(doc, response_format="pcm", sample_rate=22050, stream=True),
    )
    assert streamed.status == 200
    chunks = await streamed.read()
    synthesized = counting_engine.items
    whole = await client.post(
        "/v1/audio/speech", json=speech_body(doc, response_format="pcm", sample_rate=22050)
    )
    # The stream's last chunk can reach the client before its production has stored the whole
    # rendition: the request then joins that production (COALESCED), else it is a HIT. Either
    # way nothing is synthesized again and the bytes are the stream's.
    assert whole.headers["X-Cache"] in ("HIT", "COALESCED")
    assert await whole.read() == chunks
    assert counting_engine.items == synthesized


async def test_refusals_are_400s_in_openai_shape(gateway: GatewayFactory) -> None:
    client = await gateway()
    bomb = (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]><speak>&lol2;</speak>'
    )
    for doc, code in (
        (bomb, "ssml_forbidden"),
        ('<speak><audio src="https://example.com/a.mp3"/></speak>', "ssml_fetch"),
        ("<speak><foo>x</foo></speak>", "ssml_unsupported_tag"),
        ("<speak><p>unbalanced</s></speak>", "invalid_ssml"),
    ):
        resp = await client.post("/v1/audio/speech", json=speech_body(doc))
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert (error["code"], error["param"], error["type"]) == (
            code,
            "input",
            "invalid_request_error",
        )


async def test_input_type_overrides_detection(gateway: GatewayFactory) -> None:
    client = await gateway()
    plain, _, _ = await speak(client, "Hello there.")
    # SSML content without its root is put in a <speak>; markup that is not XML is a 400.
    assert await speak(client, "Hello <break strength='none'/>there.", input_type="ssml") == (
        plain,
        "HIT",
        (await speak(client, "Hello there."))[2],
    )
    resp = await client.post("/v1/audio/speech", json=speech_body("1 < 2", input_type="ssml"))
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "invalid_ssml"
    as_text, _, _ = await speak(client, "<speak>Hi.</speak>", input_type="text")
    as_ssml, _, _ = await speak(client, "<speak>Hi.</speak>")
    assert as_text != as_ssml


async def test_phoneme_reaches_piper_as_ipa(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    key, _, seconds = await speak(
        client, '<speak><phoneme alphabet="ipa" ph="həlˈoʊ wˈɜːld">hello world</phoneme></speak>'
    )
    assert seconds >= shortest_audio_s("həlˈoʊ wˈɜːld", ipa=True)
    words, _, _ = await speak(client, "hello world")
    assert words != key  # phonemes are their own speech
    assert counting_engine.items == 2


async def test_phoneme_before_punctuation_is_spoken(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    """The full stop after a ``<phoneme>`` is no segment of its own (no voice has audio for a
    lone "."): it ends the phoneme's sentence, and the document is spoken, not a 400."""
    client = await gateway()
    doc = '<speak>Say <phoneme alphabet="ipa" ph="təˈmeɪtoʊ">tomato</phoneme>.</speak>'
    explained = await client.post("/v1/ssml/explain", json=speech_body(doc))
    assert explained.status == 200, await explained.text()
    assert (await explained.json())["expansion"] == [
        {"words": "Say", "pause_ms": 0, "rate": 1.0, "phonemes": False},
        {"words": "təˈmeɪtoʊ", "pause_ms": None, "rate": 1.0, "phonemes": True},
    ]
    resp = await client.post("/v1/audio/speech", json=speech_body(doc))
    assert resp.status == 200, await resp.text()
    pcm, _ = sf.read(io.BytesIO(await resp.read()), dtype="float32")
    assert np.any(pcm != 0)
    assert counting_engine.texts == ["Say", "təˈmeɪtoʊ"]


async def test_numbers_front_end_shares_the_written_out_address(gateway: GatewayFactory) -> None:
    client = await gateway()
    written, _, _ = await speak(client, "There are four thousand and ninety-six bytes.")
    numbers, cache, _ = await speak(client, "There are 4096 bytes.", normalize="numbers")
    assert (numbers, cache) == (written, "HIT")


async def test_another_encoding_of_ssml_audio_is_a_transcode_with_the_same_breaks(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    key, _, seconds = await speak(client, '<speak>Hello.<break time="1s"/>Goodbye.</speak>')
    synthesized = counting_engine.items
    resp = await client.get(f"/v1/audio/{key}.sln16")
    assert resp.status == 200
    raw = await resp.read()
    assert abs(len(raw) / 2 / 16000 - seconds) < 0.01
    assert counting_engine.items == synthesized


def test_plain_entries_are_stored_as_before() -> None:
    plain = Entry.create(b"x", content_type="audio/wav", fmt="wav", sample_rate=8000)
    assert b"gaps_ms" not in plain.to_blob() and b"trims" not in plain.to_blob()
    ssml = Entry.create(
        b"x",
        content_type="audio/wav",
        fmt="wav",
        sample_rate=8000,
        parts=("a" * 64, "b" * 64),
        gaps_ms=(0, 1000, 0),
        trims=(False, True, False),
    )
    again = Entry.from_blob(ssml.to_blob())
    assert (again.meta.gaps_ms, again.meta.trims) == ((0, 1000, 0), (False, True, False))
    forged = ssml.to_blob().replace(b"[0,1000,0]", b"[0,1000]")
    with pytest.raises(CorruptEntry):
        Entry.from_blob(forged, verify=False)


async def test_explain_names_the_address_the_speech_answer_has(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    doc = '<speak>Hi.<break time="800ms"/><prosody rate="x-slow">Bye.</prosody></speak>'
    explained = await client.post("/v1/ssml/explain", json=speech_body(doc))
    assert explained.status == 200
    info = await explained.json()
    assert counting_engine.items == 0  # nothing synthesized
    assert info["expansion"] == [
        {"words": "Hi.", "pause_ms": 800, "rate": 1.0, "phonemes": False},
        {"words": "Bye.", "pause_ms": None, "rate": 0.5, "phonemes": False},
    ]
    assert [(s["text"], s["speed"], s["pause_before_ms"]) for s in info["sentences"]] == [
        ("Hi.", 1.0, 0),
        ("Bye.", 0.5, 800),
    ]
    key, _, _ = await speak(client, doc)
    assert info["key"] == key
    refused = await client.post("/v1/ssml/explain", json=speech_body("<speak><audio/></speak>"))
    assert (await error_of(refused, 400))["param"] == "input"


async def test_catalogue_rows_take_ssml(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    doc = '<speak>Press <say-as interpret-as="digits">12</say-as>.<break time="500ms"/></speak>'
    r = await client.post(
        "/v1/prompts",
        json={
            "prompts": [{"input": doc}, {"text": "Hello <break/> world.", "input_type": "ssml"}],
            "defaults": {"format": "wav"},
        },
    )
    assert r.status == 200, await r.text()
    rendered = counting_engine.items
    key, cache, _ = await speak(client, doc)
    assert cache == "HIT" and key == (await r.json())["prompts"][0]["key"]
    assert counting_engine.items == rendered


@pytest.mark.slow
def test_cli_say_explains_without_synthesizing(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "say", *args, "--cache-dir", str(tmp_path)],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=120,
        )

    explained = run(
        "--explain", "--ssml", 'Call <say-as interpret-as="telephone">555 0100</say-as>.'
    )
    assert explained.returncode == 0, explained.stderr
    info = json.loads(explained.stdout)
    assert info["text"] == "Call five five five, zero one zero zero."
    out = tmp_path / "out.wav"
    said = run(
        "-o", str(out), '<speak>Call <say-as interpret-as="telephone">555 0100</say-as>.</speak>'
    )
    assert said.returncode == 0, said.stderr
    assert json.loads(said.stdout)["key"] == info["key"]
    assert sf.info(str(out)).duration >= shortest_audio_s(info["text"])
    refused = run("--explain", "<speak><audio/></speak>")
    assert refused.returncode == 2 and "would fetch a URL" in refused.stderr


async def test_say_urls_carry_ssml(
    gateway: GatewayFactory, counting_engine: CountingEngine
) -> None:
    client = await gateway()
    plain = await client.get("/v1/say/joe/" + quote("Press one.", safe="") + ".wav")
    wrapped = await client.get(
        "/v1/say/joe/" + quote("<speak>Press one.</speak>", safe="") + ".wav"
    )
    assert (plain.status, wrapped.status) == (200, 200)
    assert wrapped.headers["X-Audio-Key"] == plain.headers["X-Audio-Key"]
    doc = '<speak>Press one.<break time="1s"/></speak>'
    paused = await client.get("/v1/say/joe/" + quote(doc, safe="") + ".wav")
    assert paused.status == 200
    # The answer ends in the break: one second of exact silence after the trimmed words. At
    # 8 kHz the resampler's filter spreads the last speech into its first samples (measured: 25
    # of 8,000); 10 ms either way covers that.
    pcm, rate = sf.read(io.BytesIO(await paused.read()), dtype="int16")
    (length, start), *_ = zero_runs(pcm)
    assert rate == 8000 and start + length == len(pcm)
    assert abs(length - rate) <= rate // 100, length
    assert counting_engine.items == 1


async def test_breaks_count_against_the_audio_budget(
    gateway: GatewayFactory, settings: Settings
) -> None:
    client = await gateway(settings=settings.replace(max_audio_s=20))
    doc = "<speak>Hi." + '<break time="10s"/>' * 3 + "</speak>"
    resp = await client.post("/v1/audio/speech", json=speech_body(doc))
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "audio_too_long"
    assert (
        await client.post("/v1/audio/speech", json=speech_body("<speak>Hi.</speak>"))
    ).status == 200


async def test_a_repeated_document_is_parsed_once(
    gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jambonz bodies (and say URLs the say memo has not seen, and the Coqui and Piper routes)
    are not in the request memo, which keys speech bodies by their bytes: their documents are
    memoized by raw text, so a repeat is not parsed again."""
    import gateway.api.parsing as parsing

    calls: list[str] = []
    real = parsing.expand

    def counting(text: str, **kw: Any) -> Any:
        calls.append(text)
        return real(text, **kw)

    monkeypatch.setattr(parsing, "expand", counting)
    client = await gateway()
    doc = '<speak>Press one.<break time="300ms"/></speak>'
    for voice in ("joe", "alloy", "joe"):  # different bodies, one document and voice
        body = {"voice": voice, "language": "en-US", "type": "ssml", "text": doc}
        assert (await client.post("/v1/jambonz/tts", json=body)).status == 200
    assert len(calls) == 1
    plain = {"voice": "joe", "language": "en-US", "type": "text", "text": "Plain words."}
    assert (await client.post("/v1/jambonz/tts", json=plain)).status == 200
    assert len(calls) == 1  # plain text never reaches the parser
