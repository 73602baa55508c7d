"""The SSML front end and number normalization against the corpus."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.api.normalize import language_of, normalize_numbers
from gateway.api.ssml import SsmlLimits, expand, is_ssml, plain_text
from gateway.errors import BadRequest

CORPUS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "ssml_cases.json").read_text(encoding="utf-8")
)["cases"]
# Refusals are pure parsing: a bound on its time, measured directly (not over HTTP). Generous
# (a refusal takes about a millisecond): it tells a pathological parse from a loaded machine.
REFUSAL_BOUND_S = 1.0


def _expand(case: dict[str, Any]) -> list[list[object]]:
    takes_phonemes = bool(case.get("takes_phonemes", False))
    segments = expand(
        case["ssml"],
        language=case["language"],
        engine="piper" if takes_phonemes else "coqui",
        takes_phonemes=takes_phonemes,
    )
    return [[s.words, s.pause_ms, s.rate, *([True] if s.phonemes else [])] for s in segments]


def test_corpus_is_large_and_covers_every_refusal_and_say_as() -> None:
    assert len(CORPUS) >= 80
    errors = {c["error"] for c in CORPUS if "error" in c}
    assert {
        "ssml_forbidden",
        "ssml_fetch",
        "ssml_unsupported_tag",
        "ssml_too_many_elements",
        "invalid_ssml",
        "ssml_too_deep",
    } <= errors
    names = " ".join(c["name"] for c in CORPUS)
    for kind in ("characters", "spell-out", "digits", "cardinal", "number", "ordinal"):
        assert f"say-as {kind}" in names
    for kind in ("telephone", "currency", "date", "time"):
        assert f"say-as {kind}" in names
    for refusal in ("entity expansion", "external entity", "audio", "unknown tag"):
        assert refusal in names
    assert "ten thousand elements" in names and "unbalanced tags" in names


@pytest.mark.parametrize(
    "case", [c for c in CORPUS if "ssml" in c and "error" not in c], ids=lambda c: c["name"]
)
def test_expansion(case: dict[str, Any]) -> None:
    assert is_ssml(case["ssml"])
    assert _expand(case) == case["expect"]


@pytest.mark.parametrize("case", [c for c in CORPUS if "error" in c], ids=lambda c: c["name"])
def test_refusal_is_a_fast_400(case: dict[str, Any]) -> None:
    # CPU time of this thread, best of three: the bound is on what parsing costs, not on how
    # long a machine shared with other work takes to schedule it.
    timings = []
    for _ in range(3):
        started = time.thread_time()
        with pytest.raises(BadRequest) as caught:
            _expand(case)
        timings.append(time.thread_time() - started)
    elapsed = min(timings)
    assert caught.value.status == 400
    assert caught.value.code == case["error"]
    assert caught.value.param == "input"
    assert elapsed < REFUSAL_BOUND_S, f"{case['name']}: {elapsed * 1000:.1f} ms"


@pytest.mark.parametrize("case", [c for c in CORPUS if "text" in c], ids=lambda c: c["name"])
def test_plain_text_numbers(case: dict[str, Any]) -> None:
    assert not is_ssml(case["text"])
    assert normalize_numbers(case["text"], language_of(case["language"])) == case["expect_text"]


def test_plain_expansion_is_the_text_itself() -> None:
    assert plain_text(expand("<speak>Hi.</speak>", language="en_US")) == "Hi."
    assert plain_text(expand("<speak><p>Hi.</p><p>Bye.</p></speak>", language="en_US")) == (
        "Hi. Bye."
    )
    assert plain_text(expand('<speak>A <break time="1s"/> B</speak>', language="en_US")) is None
    slow = '<speak><prosody rate="slow">Hi.</prosody></speak>'
    assert plain_text(expand(slow, language="en_US")) is None


def test_sub_and_its_alias_expand_alike_digits_and_cardinal_do_not() -> None:
    sub = expand('<speak><sub alias="World Health Organization">WHO</sub></speak>', language="en")
    words = expand("<speak>World Health Organization</speak>", language="en")
    assert sub == words
    digits = expand('<speak><say-as interpret-as="digits">42</say-as></speak>', language="en")
    number = expand('<speak><say-as interpret-as="cardinal">42</say-as></speak>', language="en")
    assert digits != number


def test_limits_are_settings() -> None:
    doc = "<speak>" + "<s>a.</s>" * 20 + "</speak>"
    assert expand(doc, language="en", limits=SsmlLimits(max_elements=21))
    with pytest.raises(BadRequest) as caught:
        expand(doc, language="en", limits=SsmlLimits(max_elements=20))
    assert caught.value.code == "ssml_too_many_elements"
    with pytest.raises(BadRequest) as caught:
        expand(doc, language="en", limits=SsmlLimits(max_expanded_chars=10))
    assert caught.value.code == "input_too_long"
    nested = "<speak><p><s>x</s></p></speak>"
    with pytest.raises(BadRequest) as caught:
        expand(nested, language="en", limits=SsmlLimits(max_depth=2))
    assert caught.value.code == "ssml_too_deep"
    stripped = expand(
        '<speak><voice name="x">Hi.</voice></speak>',
        language="en",
        limits=SsmlLimits(unknown_tags="strip"),
    )
    assert plain_text(stripped) == "Hi."


def test_unknown_language_refuses_say_as_but_not_plain_words() -> None:
    assert plain_text(expand("<speak>Hola.</speak>", language="xx_XX")) == "Hola."
    with pytest.raises(BadRequest) as caught:
        expand('<speak><say-as interpret-as="cardinal">4</say-as></speak>', language="xx_XX")
    assert caught.value.code == "unsupported_language"


def test_refusal_messages_never_echo_the_text() -> None:
    secret = "hunter2-secret"
    for doc in (
        f"<speak><foo>{secret}</foo></speak>",
        f"<speak>{secret}",
        f'<speak><say-as interpret-as="cardinal">{secret}</say-as></speak>',
    ):
        with pytest.raises(BadRequest) as caught:
            expand(doc, language="en")
        assert secret not in caught.value.message


def test_a_refused_attribute_is_echoed_cut_short() -> None:
    with pytest.raises(BadRequest) as caught:
        expand(f'<speak>Hi.<break time="{"x" * 500}"/></speak>', language="en")
    assert "<break> time 'xxx" in caught.value.message
    assert "x" * 80 not in caught.value.message and "...'" in caught.value.message


def test_breaks_in_a_row_stay_under_a_minute() -> None:
    six = '<break time="10s"/>' * 6
    assert expand(f"<speak>Hi.{six}</speak>", language="en")[0].pause_ms == 60_000
    with pytest.raises(BadRequest) as caught:
        expand(f'<speak>Hi.{six}<break time="1ms"/></speak>', language="en")
    assert caught.value.code == "ssml_break_too_long"
