"""Text normalization: numbers, amounts, dates, times and telephone numbers as the words a voice
should say, in the voice's language.

Phonemizers guess at "4096", "$12.50" or "03/04/2026" (espeak-ng reads some, mangles others, and
never knows whether a date is month-first), so the gateway writes them out before the text is
hashed: the words, not the digits, are the content address. Words come from num2words (a
maintained library covering some 50 languages); where, and what is refused: docs/ssml.md,
"Numbers in the voice's language".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

from num2words import CONVERTER_CLASSES, num2words

from gateway.errors import BadRequest

DATE_FORMATS = ("mdy", "dmy", "ymd", "ydm", "md", "dm", "ym", "my", "y", "m", "d")

# Currency symbols a prompt writes, by ISO code (num2words speaks codes).
_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP"}
MONTHS_EN = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def language_of(voice_language: str) -> str:
    """num2words' language for a voice's language code ("en_US" -> "en", "pt_BR" stays), or ""
    when it has none."""
    code = voice_language.replace("-", "_")
    if code in CONVERTER_CLASSES:
        return code
    base = code.split("_")[0].lower()
    return base if base in CONVERTER_CLASSES else ""


def _bad(message: str, code: str = "invalid_ssml") -> BadRequest:
    return BadRequest(message, param="input", code=code)


def _need_language(lang: str, what: str) -> str:
    if not lang:
        raise _bad(
            f"{what} needs number words in the voice's language, and none are known for it",
            code="unsupported_language",
        )
    return lang


# Number words stop here: 36 digits is the undecillions (short scale), past what any prompt says
# and past what several of num2words' languages have names for. A longer number is refused
# (say-as) or left as written (plain text), not spoken as a page of words.
MAX_NUMBER_DIGITS = 36
# Languages whose num2words converter fails earlier; Amharic (num2words 0.5.14) never returns
# for some numbers of seven digits or more, so it is not asked.
_LANGUAGE_MAX_DIGITS = {"am": 6}
# A float holds this many significant digits exactly; num2words reads a number with a fractional
# part through a float, so a longer one is said here (whole part, the language's point word,
# each digit) rather than rounded silently.
_FLOAT_DIGITS = 15


def _check_size(digits: int, lang: str, what: str) -> None:
    """Refuse a number whose whole part has more ``digits`` than number words say in ``lang``."""
    limit = _LANGUAGE_MAX_DIGITS.get(lang, MAX_NUMBER_DIGITS)
    if digits > limit:
        raise _bad(
            f"{what}: a number of {digits} digits is too large to say as words (at most "
            f"{limit} digits in language '{lang}')",
            code="number_too_large",
        )


def _whole_digits(number: Decimal | int) -> int:
    if isinstance(number, int):
        return len(str(abs(number)))  # ints here come from at most MAX_NUMBER_DIGITS characters
    return max(1, number.adjusted() + 1) if number else 1


def _exact(number: Decimal) -> Context:
    """A decimal context that holds ``number`` and a few more digits exactly: num2words does
    Decimal arithmetic in the caller's context (28 digits by default), which raises or rounds
    beyond that."""
    return Context(prec=max(28, len(number.as_tuple().digits) + 8), rounding=ROUND_HALF_UP)


def _num2words(number: Decimal | int, lang: str, to: str, **kw: str) -> str:
    """num2words' words, or :class:`BadRequest`. Its ~60 languages are tables and code of their
    own, and a number some language has no words for fails in that language's way (OverflowError,
    NotImplementedError, KeyError, IndexError, TypeError, even AssertionError): every failure of
    the library means "no words for this number here", a refusal, never a server error. The
    property test in tests/test_normalize.py drives every language with arbitrary numbers."""
    _check_size(_whole_digits(number), lang, f"say-as {to}")
    try:
        if isinstance(number, Decimal):
            with localcontext(_exact(number)):
                return str(num2words(number, lang=lang, to=to, **kw))
        return str(num2words(number, lang=lang, to=to, **kw))
    except Exception as exc:  # any failure of the library is a refusal (see above)
        if "currency" in kw:
            raise _bad(
                f"say-as currency: no words for currency '{kw['currency']}' in language '{lang}'",
                code="unsupported_currency",
            ) from exc
        raise _bad(f"cannot say this number as {to} in language '{lang}'") from exc


def _words(number: Decimal | int, lang: str, to: str = "cardinal") -> str:
    if isinstance(number, Decimal):
        _check_size(_whole_digits(number), lang, f"say-as {to}")
        if number == number.to_integral_value():
            number = int(number)  # exact at any size (num2words' Decimal path rounds past 28)
        elif to == "cardinal" and len(number.as_tuple().digits) > _FLOAT_DIGITS:
            return _long_fraction(number, lang)
    return _num2words(number, lang, to)


def _long_fraction(number: Decimal, lang: str) -> str:
    """A number with more digits than a float holds, said as num2words says any fraction (its
    whole part, the point word, then digit by digit) without going through a float."""
    point = str(getattr(CONVERTER_CLASSES[lang], "pointword", "") or "")
    if not point or point == "(.)":  # num2words' placeholder: the language names no point
        raise _bad(
            f"cannot say a number with more than {_FLOAT_DIGITS} digits and a fractional part "
            f"in language '{lang}'"
        )
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # a finite Decimal (the pattern in _decimal admits no other)
    text = "".join(map(str, digits)).rjust(-exponent + 1, "0")
    whole, fraction = text[:exponent], text[exponent:]
    said = [_words(int(whole), lang), point, *(_words(int(d), lang) for d in fraction)]
    if sign:
        minus = str(getattr(CONVERTER_CLASSES[lang], "negword", "")).strip()
        if not minus or minus == "(-)":
            raise _bad(f"cannot say a negative number this long in language '{lang}'")
        said.insert(0, minus)
    return " ".join(said)


def _decimal(text: str, what: str) -> Decimal:
    cleaned = text.strip().replace(",", "").replace("\u2212", "-")
    if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", cleaned):
        raise _bad(f"say-as {what}: not a number")
    return Decimal(cleaned)  # (the pattern admits only what Decimal reads)


def _digit_words(text: str, lang: str) -> str:
    # isdecimal, not isdigit: "²" is a digit int() cannot read.
    return " ".join(_words(int(ch), lang) for ch in text if ch.isdecimal())


def characters(text: str, lang: str) -> str:
    """Each letter or digit on its own ("AB1" -> "A B one"); other characters are dropped."""
    return " ".join(
        _words(int(ch), _need_language(lang, "say-as characters")) if ch.isdecimal() else ch
        for ch in text
        if ch.isalnum()
    )


def digits(text: str, lang: str) -> str:
    """Every digit as a word ("4096" -> "four zero nine six")."""
    lang = _need_language(lang, "say-as digits")
    if not any(ch.isdecimal() for ch in text):
        raise _bad("say-as digits: no digits to say")
    return _digit_words(text, lang)


def cardinal(text: str, lang: str) -> str:
    """A number as words ("4,096" -> "four thousand and ninety-six", "3.5", "-7")."""
    return _words(_decimal(text, "cardinal"), _need_language(lang, "say-as cardinal"))


def ordinal(text: str, lang: str) -> str:
    """An ordinal ("3" or "3rd" -> "third")."""
    match = re.fullmatch(r"\s*(\d+)\s*(st|nd|rd|th|\.|º|ª|e|er|re|ème)?\s*", text, re.IGNORECASE)
    if match is None:
        raise _bad("say-as ordinal: not a whole number")
    lang = _need_language(lang, "say-as ordinal")
    _check_size(len(match.group(1).lstrip("0")), lang, "say-as ordinal")  # before int() reads it
    return _words(int(match.group(1)), lang, "ordinal")


def telephone(text: str, lang: str) -> str:
    """A telephone number digit by digit, its groups kept apart by a comma (a short pause):
    "+1 555 0100" -> "plus one, five five five, zero one zero zero"."""
    lang = _need_language(lang, "say-as telephone")
    stripped = text.strip()
    groups = [g for g in re.split(r"[\s\-./()]+", stripped.lstrip("+")) if g]
    if not groups or not all(g.isdecimal() for g in groups):
        raise _bad("say-as telephone: only digits, spaces, + ( ) - . are allowed")
    spoken = ", ".join(_digit_words(g, lang) for g in groups)
    return f"plus {spoken}" if stripped.startswith("+") and lang.startswith("en") else spoken


_CURRENCY_RE = re.compile(
    r"^\s*(?:(?P<sym>[$€£])\s*(?P<a>[\d,]*\.?\d+)|(?P<code1>[A-Z]{3})\s*(?P<b>[\d,]*\.?\d+)"
    r"|(?P<c>[\d,]*\.?\d+)\s*(?:(?P<sym2>[$€£])|(?P<code2>[A-Z]{3})))\s*$"
)


def currency(text: str, lang: str) -> str:
    """An amount ("$12.50", "12.50 EUR", "GBP 3") as words: "twelve dollars, fifty cents"."""
    lang = _need_language(lang, "say-as currency")
    match = _CURRENCY_RE.match(text)
    if match is None:
        raise _bad("say-as currency: write an amount with a symbol ($ € £) or an ISO code")
    code = (
        match.group("code1")
        or match.group("code2")
        or _SYMBOLS[match.group("sym") or match.group("sym2")]
    )
    amount = _decimal(match.group("a") or match.group("b") or match.group("c") or "", "currency")
    _check_size(_whole_digits(amount), lang, "say-as currency")
    # The context holds every digit: the default (28 digits) raises on a longer amount, here and
    # in num2words' own Decimal arithmetic.
    amount = amount.quantize(Decimal("0.01"), context=_exact(amount))
    said = _num2words(amount, lang, "currency", currency=code)
    if amount == amount.to_integral_value():
        # "twelve dollars", not "twelve dollars, zero cents": drop the zero-cents phrase the
        # language puts after its first ", " (where it has one that way).
        zero = _num2words(Decimal("0.00"), lang, "currency", currency=code)
        _, sep, cents = zero.partition(", ")
        if sep and said.endswith(sep + cents):
            said = said[: -len(sep + cents)]
    return said


def date(text: str, lang: str, fmt: str = "mdy") -> str:
    """A date in ``fmt`` order (``mdy``, ``dmy``, ``ymd``, ``md``, ``y``...) as words:
    "03/04/2026" (mdy) -> "March fourth, twenty twenty-six". Month names are English only;
    other languages say the month's number."""
    lang = _need_language(lang, "say-as date")
    if fmt not in DATE_FORMATS:
        raise _bad(f"say-as date: unsupported format '{fmt}'; supported: {', '.join(DATE_FORMATS)}")
    fields = [f for f in re.split(r"[\s/.\-,]+", text.strip()) if f]
    if len(fields) != len(fmt) or not all(f.isdecimal() and len(f) <= 4 for f in fields):
        raise _bad(
            f"say-as date: expected {len(fmt)} numeric fields of at most 4 digits for format "
            f"'{fmt}'"
        )
    parts = dict(zip(fmt, (int(f) for f in fields), strict=True))
    if not 1 <= parts.get("m", 1) <= 12 or not 1 <= parts.get("d", 1) <= 31:
        raise _bad("say-as date: month or day out of range")
    english = lang.startswith("en")
    month = MONTHS_EN[parts["m"] - 1] if "m" in parts and english else None
    if "m" in parts and month is None:
        month = _words(parts["m"], lang)
    # English says "the fourth"; other languages mostly say the day's number ("le quatre").
    day = _words(parts["d"], lang, "ordinal" if english else "cardinal") if "d" in parts else None
    year = _words(parts["y"], lang, "year") if "y" in parts else None
    if english:
        # "March fourth, twenty twenty-six" (US order) or "the fourth of March" (day first).
        if fmt.index("d") < fmt.index("m") if "d" in parts and "m" in parts else False:
            head = f"the {day} of {month}"
        else:
            head = " ".join(p for p in (month, day) if p)
        return f"{head}, {year}" if head and year else head or year or ""
    return " ".join(p for p in (day, month, year) if p)


_TIME_RE = re.compile(
    r"^\s*(?P<h>\d{1,2})(?::(?P<m>\d{2}))?(?::(?P<s>\d{2}))?\s*(?P<ap>[ap]\.?m\.?)?\s*$",
    re.IGNORECASE,
)


def time(text: str, lang: str) -> str:
    """A clock time ("14:30" -> "fourteen thirty", "09:05" -> "nine oh five", "9:05 am" -> "nine
    oh five a m"). English says the 24-hour clock's hour zero as "midnight" (00:00) or as
    twelve a m ("00:30" -> "twelve thirty a m"): "zero o'clock" is nobody's reading."""
    lang = _need_language(lang, "say-as time")
    match = _TIME_RE.match(text)
    if match is None:
        raise _bad("say-as time: write a time as H:MM (24-hour) or H:MM am/pm")
    hour, minute = int(match.group("h")), int(match.group("m") or 0)
    if hour > 23 or minute > 59 or (match.group("ap") and not 1 <= hour <= 12):
        raise _bad("say-as time: hour or minute out of range")
    english = lang.startswith("en")
    if english and hour == 0 and not match.group("ap"):
        return "midnight" if not minute else time(f"12:{minute:02d} am", lang)
    words = [_words(hour, lang)]
    if minute:
        words.append(("oh " if english and minute < 10 else "") + _words(minute, lang))
    elif english and not match.group("ap"):
        words.append("o'clock" if hour <= 12 else "hundred")
    if match.group("ap"):
        words.append("a m" if match.group("ap").lower().startswith("a") else "p m")
    return " ".join(words)


def date_order(text: str) -> str:
    """The field order of a date written without a ``format``: year first when its first field
    has four digits (ISO 8601's ``2026-12-24``, ``2026-12``, ``2026``), else month first."""
    fields = [f for f in re.split(r"[\s/.\-,]+", text.strip()) if f]
    if fields and len(fields[0]) == 4 and len(fields) <= 3:
        return "ymd"[: len(fields)]
    return "mdy"


_SAY_AS: dict[str, Callable[[str, str], str]] = {
    "characters": characters,
    "spell-out": characters,
    "digits": digits,
    "cardinal": cardinal,
    "number": cardinal,
    "ordinal": ordinal,
    "telephone": telephone,
    "currency": currency,
    "date": date,
    "time": time,
}
SAY_AS_KINDS = tuple(_SAY_AS)


def say_as(kind: str, text: str, lang: str, fmt: str = "") -> str:
    """``text`` said as ``kind`` (one of :data:`SAY_AS_KINDS`) in num2words language ``lang``."""
    if kind == "date":
        return date(text, lang, fmt or date_order(text))
    handler = _SAY_AS.get(kind)
    if handler is None:
        raise _bad(
            f"say-as: unsupported interpret-as '{kind[:40]}'; supported: {', '.join(SAY_AS_KINDS)}"
        )
    return handler(text, lang)


# Plain-text normalization ("normalize": "numbers"): the written forms a prompt commonly holds,
# tried in this order (a phone number before its digit groups are read as cardinals), each group
# named by the say-as kind that says it (an ISO date: year first).
_PLAIN = re.compile(
    r"(?P<telephone>\+\d{1,3}(?:[ \-.]\d{2,5}){2,5}\b)"
    r"|(?P<currency>[$€£]\s?\d[\d,]*(?:\.\d+)?)"
    r"|(?P<date>\b\d{1,4}/\d{1,2}/\d{2,4}\b)"
    r"|(?P<isodate>\b\d{4}-\d{2}-\d{2}\b)"
    r"|(?P<time>\b\d{1,2}:\d{2}(?:\s?[ap]\.?m\.?\b)?)"
    r"|(?P<ordinal>\b\d+(?:st|nd|rd|th)\b)"
    r"|(?P<cardinal>(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w]))",
    re.IGNORECASE,
)


def normalize_numbers(text: str, lang: str) -> str:
    """Plain ``text`` with its numbers, amounts, dates, times, ordinals and international
    telephone numbers written out in ``lang``; a date month first in ``en``, else day first."""
    if not any(ch.isdigit() for ch in text):
        return text
    lang = _need_language(lang, "normalize 'numbers'")
    order = "mdy" if lang == "en" else "dmy"

    def spoken(match: re.Match[str]) -> str:
        kind = match.lastgroup or "cardinal"
        value = match.group(0)
        try:
            if kind == "date" and len(value.split("/")[0]) != 4:
                return date(value, lang, order)
            if kind in ("date", "isodate"):
                return date(value, lang, "ymd")
            return _SAY_AS[kind](value, lang)
        except BadRequest:
            return value  # not a well-formed instance of its kind: leave it to the voice

    return _PLAIN.sub(spoken, text)
