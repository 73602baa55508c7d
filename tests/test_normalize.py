"""Number normalization at the edges: numbers of any size, in any of num2words' languages, are
spoken or refused with a 400 naming the problem, never a server error, on every route that
normalizes (and a Wyoming connection goes on after a refusal); ISO dates and 24-hour times are
said as dates and times."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from num2words import CONVERTER_CLASSES, num2words
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

from bench.harness import free_port
from gateway.api import normalize
from gateway.api.normalize import MAX_NUMBER_DIGITS, normalize_numbers, say_as
from gateway.errors import BadRequest
from gateway.runtime.settings import Settings
from tests.conftest import GatewayFactory

LANGUAGES = sorted(CONVERTER_CLASSES)
THIRTY_NINES = "9" * 30
# 30 digits: past the 28 digits of Python's default decimal context, and short to say.
BIG_AMOUNT = "$1" + "0" * 29
BIG_AMOUNT_WORDS = "one hundred octillion dollars"
TOO_BIG = "9" * (MAX_NUMBER_DIGITS + 4)

# What a prompt's numbers are written with: digits (ASCII and other scripts, and digits int()
# cannot read such as superscripts), separators, signs, currency marks, suffixes and codes.
_PIECES = st.one_of(
    st.text(alphabet="0123456789", min_size=1, max_size=45),
    st.sampled_from(
        [
            *(" ", ",", ".", ":", "/", "-", "+", "$", "€", "£", "\u2212", "(", ")"),
            *("st", "nd", "th", "am", "p.m.", "EUR", "USD", "JPY", "ème", "º"),
            *("٣", "߂", "²", "¼", "0" * 20, "9" * 40, "T", "Z"),
        ]
    ),
)
NUMERIC_TEXT = st.lists(_PIECES, min_size=1, max_size=8).map("".join)


@settings(
    # Derandomized with no example database: the same examples on every run and machine, so the
    # test cannot pass or fail by chance; no deadline (a wall-clock bound would).
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=1500,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    text=NUMERIC_TEXT,
    lang=st.sampled_from(LANGUAGES),
    kind=st.sampled_from([*normalize.SAY_AS_KINDS, "numbers"]),
)
def test_normalize_raises_nothing_but_bad_request(text: str, lang: str, kind: str) -> None:
    """Arbitrary numeric text in every num2words language, through plain-text normalization and
    every say-as kind: words, or a :class:`BadRequest` (a 400), nothing else."""
    try:
        said = normalize_numbers(text, lang) if kind == "numbers" else say_as(kind, text, lang)
    except BadRequest as exc:
        assert exc.status == 400 and exc.param == "input" and exc.message
    else:
        assert isinstance(said, str)


def test_amounts_past_28_digits_are_said_exactly() -> None:
    whole = num2words(int(THIRTY_NINES), lang="en")
    assert say_as("currency", "$" + THIRTY_NINES, "en") == f"{whole} dollars"
    assert say_as("currency", f"${THIRTY_NINES}.99", "en") == (
        f"{whole} dollars, ninety-nine cents"
    )
    assert say_as("cardinal", THIRTY_NINES, "en") == whole
    assert normalize_numbers(f"Pay ${THIRTY_NINES} now.", "en") == f"Pay {whole} dollars now."
    # Past 28 digits num2words' own Decimal arithmetic rounded: "nine duodecillion, one
    # duodecillion" for forty nines. Whole numbers go to it as ints, exact at any size.
    assert say_as("cardinal", "9" * 36, "en") == num2words(int("9" * 36), lang="en")
    assert say_as("ordinal", "9" * 36, "en") == num2words(int("9" * 36), lang="en", to="ordinal")


def test_fractions_longer_than_a_float_keep_every_digit() -> None:
    assert say_as("cardinal", "3.14", "en") == "three point one four"
    digits = "1234567890" * 3
    assert say_as("cardinal", f"-0.{digits}", "en") == "minus zero point " + " ".join(
        num2words(int(d), lang="en") for d in digits
    )
    assert say_as("cardinal", f"12.{digits}", "fr").startswith("douze virgule un deux trois")


@pytest.mark.parametrize("kind", ["cardinal", "ordinal", "currency"])
def test_numbers_past_the_bound_are_refused_naming_it(kind: str) -> None:
    text = ("$" if kind == "currency" else "") + TOO_BIG
    with pytest.raises(BadRequest) as caught:
        say_as(kind, text, "en")
    assert caught.value.code == "number_too_large"
    assert f"{len(TOO_BIG)} digits" in caught.value.message
    assert f"at most {MAX_NUMBER_DIGITS} digits" in caught.value.message
    # Plain text leaves what it cannot say as written, for the voice to read.
    assert normalize_numbers(f"Ref {text} ok.", "en") == f"Ref {text} ok."


def test_iso_dates_and_24_hour_times() -> None:
    assert normalize_numbers("Due 2026-12-24 at 14:30.", "en") == (
        "Due December twenty-fourth, twenty twenty-six at fourteen thirty."
    )
    assert normalize_numbers("From 00:00 to 09:05.", "en") == "From midnight to nine oh five."
    assert say_as("date", "2026-12-24", "en") == "December twenty-fourth, twenty twenty-six"
    assert say_as("date", "2026/12/24", "en") == "December twenty-fourth, twenty twenty-six"
    assert say_as("date", "12/24/2026", "en") == "December twenty-fourth, twenty twenty-six"
    assert say_as("time", "00:00", "en") == "midnight"
    assert say_as("time", "00:30", "en") == "twelve thirty a m"
    # In the voice's language: the day, the month and the year as its number words.
    assert (
        normalize_numbers("Le 2026-12-24.", "fr") == "Le vingt-quatre douze deux mille vingt-six."
    )


# ---- every route that normalizes -----------------------------------------------------------


def say_as_doc(text: str) -> str:
    return f'<speak>Pay <say-as interpret-as="currency">{text}</say-as>.</speak>'


async def test_big_amounts_on_every_http_route(gateway: GatewayFactory, settings: Settings) -> None:
    """A 30-digit amount (a 500 before: decimal.InvalidOperation) is spoken on every route,
    plain with ``numbers`` and in say-as, as its written-out words; a 40-digit one in say-as is
    a 400 naming the problem."""
    client = await gateway(settings=settings.replace(normalize="numbers"))
    words = await client.post(
        "/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": f"Pay {BIG_AMOUNT_WORDS}."},
    )
    assert words.status == 200
    key = words.headers["X-Audio-Key"]
    too_big = say_as_doc("$" + TOO_BIG)

    def speech(text: str) -> Any:
        return client.post(
            "/v1/audio/speech",
            json={"model": "tts-1", "voice": "alloy", "input": text, "normalize": "numbers"},
        )

    requests: dict[str, Any] = {
        "speech": speech,
        "coqui": lambda text: client.post("/api/tts", data={"text": text}),
        "synthesize": lambda text: client.get("/synthesize", params={"text": text}),
        "say": lambda text: client.get("/v1/say/joe/" + quote(text, safe="") + ".wav"),
        "piper": lambda text: client.post("/", json={"text": text}),
    }
    for route, send in requests.items():
        for text in (f"Pay {BIG_AMOUNT}.", say_as_doc(BIG_AMOUNT)):
            resp = await send(text)
            assert resp.status == 200, (route, await resp.text())
            assert resp.content_type.startswith("audio/"), route
            if route == "speech":
                assert resp.headers["X-Audio-Key"] == key  # the words, said
        refused = await send(too_big)
        assert refused.status == 400, (route, await refused.text())
        error = (await refused.json())["error"]
        assert error["code"] == "number_too_large", route
        assert f"{len(TOO_BIG)} digits" in error["message"], route


async def test_wyoming_answers_an_unsayable_amount_with_an_error_and_goes_on(
    gateway: GatewayFactory, settings: Settings
) -> None:
    port = free_port()
    await gateway(settings=settings.replace(normalize="numbers", wyoming_port=port))

    async def utterance(client: AsyncTcpClient) -> tuple[int, Error | None]:
        """Bytes of audio of one answer, or the error it was."""
        size = 0
        while True:
            event = await asyncio.wait_for(client.read_event(), timeout=120)
            assert event is not None, "the server closed the connection"
            if Error.is_type(event.type):
                return size, Error.from_event(event)
            if AudioChunk.is_type(event.type):
                size += len(AudioChunk.from_event(event).audio)
            elif AudioStop.is_type(event.type):
                return size, None

    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=f"Pay {BIG_AMOUNT}.").event())
        spoken, error = await utterance(client)
        assert error is None and spoken > 0
        await client.write_event(Synthesize(text=say_as_doc("$" + TOO_BIG)).event())
        _, error = await utterance(client)
        assert error is not None and error.code == "number_too_large", error
        assert f"{len(TOO_BIG)} digits" in error.text
        # The same connection goes on.
        await client.write_event(Synthesize(text=say_as_doc(BIG_AMOUNT)).event())
        spoken, error = await utterance(client)
        assert error is None and spoken > 0


async def test_iso_dates_share_the_address_of_their_words(gateway: GatewayFactory) -> None:
    client = await gateway()

    async def key(text: str, **kw: Any) -> str:
        body = {"model": "tts-1", "voice": "alloy", "input": text, **kw}
        resp = await client.post("/v1/audio/speech", json=body)
        assert resp.status == 200, await resp.text()
        return str(resp.headers["X-Audio-Key"])

    written = await key("Due December twenty-fourth, twenty twenty-six at fourteen thirty.")
    assert await key("Due 2026-12-24 at 14:30.", normalize="numbers") == written
    doc = (
        '<speak>Due <say-as interpret-as="date">2026-12-24</say-as> at '
        '<say-as interpret-as="time">14:30</say-as>.</speak>'
    )
    assert await key(doc) == written
