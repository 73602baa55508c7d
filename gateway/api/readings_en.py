"""English readings of an IVR prompt's digits (docs/ssml.md, "Readings").

num2words says numbers; what no library knows is which reading a caller expects: a PIN, a phone
number or a ZIP code is said digit by digit ("0042" as "zero zero four two", never "forty-two"),
an amount in dollars and cents, a date as a month and an ordinal, a year in pairs. The prompt
goes through a fixed series of passes, each one regex compiled at import; a pass writes its
matches out as words, so no later pass sees them again. Every pattern starts a match only at a
token's start and bounds its repetitions, so a pass is linear in the text's length whatever the
text holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from num2words import num2words

from gateway.api.normalize import MAX_NUMBER_DIGITS, MONTHS_EN

_DIGIT = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_MONTH_RE = "|".join(MONTHS_EN)
_WEEKDAYS = {
    "mon": "Monday",
    "tue": "Tuesday",
    "tues": "Tuesday",
    "wed": "Wednesday",
    "thu": "Thursday",
    "thur": "Thursday",
    "thurs": "Thursday",
    "fri": "Friday",
    "sat": "Saturday",
    "sun": "Sunday",
}
_WEEKDAY_RE = (
    "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|Mon|Tues|Tue|Wed|Thurs|Thur|Thu"
    "|Fri|Sat|Sun"
)


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# ---- words for numbers ----------------------------------------------------------------------


def _digits(text: str) -> str:
    """Each ASCII digit of ``text`` as a word, the rest dropped."""
    return " ".join(_DIGIT[ord(ch) - 48] for ch in text if "0" <= ch <= "9")


def _grouped(groups: list[str]) -> str:
    """Digit groups read one digit at a time, a comma (a short pause) between groups."""
    return ", ".join(_digits(g) for g in groups if g)


@lru_cache(maxsize=4096)
def _int_words(number: int) -> str:
    return str(num2words(number, lang="en"))


@lru_cache(maxsize=1024)
def _ordinal_words(number: int) -> str:
    return str(num2words(number, lang="en", to="ordinal"))


def _cardinal(whole: str, fraction: str | None = None, sign: str = "") -> str:
    """A number written with optional thousands commas and fraction; past the digits number
    words go to, digit by digit (a page of "decillions" helps nobody)."""
    whole = whole.replace(",", "").lstrip("0") or ("0" if whole else "")
    if len(whole) > MAX_NUMBER_DIGITS:
        said = _digits(whole)
    elif whole:
        said = _int_words(int(whole))
    else:
        said = ""
    if fraction:
        said = f"{said} point {_digits(fraction)}".strip()
    if sign and said and set(whole + (fraction or "")) != {"0"}:
        said = ("minus " if sign in "-\u2212" else "plus ") + said
    return said


def _ordinal(digits: str) -> str:
    digits = digits.lstrip("0") or "0"
    if len(digits) > MAX_NUMBER_DIGITS:
        return _digits(digits)
    return _ordinal_words(int(digits))


@lru_cache(maxsize=512)
def _year(year: int) -> str:
    """A year in pairs: 1999 "nineteen ninety-nine", 2026 "twenty twenty-six", but 2005 "two
    thousand five" (the 2000s are said as a number, without num2words' "and")."""
    if 2000 <= year <= 2009:
        return "two thousand" + (f" {_DIGIT[year - 2000]}" if year > 2000 else "")
    return str(num2words(year, lang="en", to="year")).replace(" and ", " ")


def _plural(words: str) -> str:
    """The decade of a year's words: "nineteen ninety" -> "nineteen nineties"."""
    head, _, last = words.rpartition(" ")
    if last.endswith("y"):
        last = last[:-1] + "ies"
    elif last.endswith("x"):
        last += "es"
    else:
        last += "s"
    return f"{head} {last}".strip()


def _fraction(numerator: int, denominator: int) -> str:
    top = _int_words(numerator)
    if denominator == 2:
        bottom = "half" if numerator == 1 else "halves"
    elif denominator == 4:
        bottom = "quarter" if numerator == 1 else "quarters"
    else:
        bottom = _ordinal_words(denominator) + ("" if numerator == 1 else "s")
    return f"{top} {bottom}"


# ---- context: the words around a match ------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z]+|[0-9]+|#")
_NEXT_WORD = re.compile(r"[ \t]*([A-Za-z]+|[0-9]|[^\sA-Za-z0-9])?")


def _before(text: str, start: int, count: int = 5) -> list[str]:
    """The last ``count`` words or digit runs before ``start`` in its sentence."""
    window = text[max(0, start - 48) : start]
    cut = max(window.rfind(". "), window.rfind("? "), window.rfind("! "), window.rfind(";"))
    if cut >= 0:
        window = window[cut + 1 :]
    return _TOKEN.findall(window)[-count:]


def _after(text: str, end: int) -> str:
    """The word (or the character) right after ``end``, "" at the end."""
    match = _NEXT_WORD.match(text, end)
    return (match.group(1) or "") if match else ""


# Words that make the digits after them a code, said one digit at a time ("Your PIN is 0042").
_CODE_WORDS = _word_set(
    """
    pin code passcode password extension ext account acct confirmation conf reference ref order
    ticket case member membership policy tracking card ending ends flight zip postal id claim
    invoice serial booking reservation transaction routing voucher coupon promo verification
    security access badge employee patient customer record locator otp cvv ssn digits subscriber
    login text reply
    """
)
# Code words that also name small numbers ("number 3 in the queue", "gate 12", "room 12"): their
# digits are said one by one from three digits on.
_SOFT_CODE_WORDS = _word_set("number no num nr gate room option seat platform box")
_DIAL_VERBS = _word_set("dial call press text enter key type punch input redial")
# Words that may stand between a code word and its digits ("PIN is", "card ending in").
_FILLERS = _word_set(
    """
    is was are were will be now the your my a an with reads code id digits last four at please
    has been changed set to new following us then just number no pound star hash
    """
)
# Words that make the number after them an amount, not a code ("account balance is 250").
_BLOCKERS = _word_set(
    """
    of balance total amount due owe owed cost costs price fee fees pay paid charge charged
    points about approximately around over under than least most within up limit minimum maximum
    worth spend spent save saved earn earned remaining left prices rate rates
    """
)
# Words that may follow a code ("PIN 0042 and", "order 12345 has"); another lowercase word
# after a number makes it a count ("ships in 10 days").
_CONNECTORS = _word_set(
    """
    and or to for at on is was are were has have had will would can could may might must should
    does did be been if then when now please from with by as so but again followed instead which
    that before after until once here there today tomorrow tonight only also not yet since in
    into expires expired departs arrives boards leaves lands ships shipped is matches begins
    starts opens closes we you i they it our this
    """
)
_QUANTITY_NOUNS = _word_set(
    """
    dollars euros pounds cents yen miles kilometers points people customers users callers calls
    members subscribers residents visitors units items copies bytes times votes steps hours
    minutes seconds days weeks months years acres feet meters tons gallons liters views
    downloads employees households homes students patients messages records rows entries
    transactions locations stores seats digits characters
    """
)
_YEAR_WORDS = _word_set(
    """
    in since of by year until till before after from through during circa copyright early late
    mid fiscal fy spring summer fall autumn winter class vintage established est founded around
    back
    """
)
# Words after which four digits are a year whatever follows ("fiscal year 2025 report").
_YEAR_ALWAYS = _word_set("year fiscal fy copyright class since circa established est founded")
_YEAR_NOUNS = _word_set(
    "season model tax edition calendar school holiday census election budget fiscal"
)
_STATES = _word_set(
    """
    AL AK AZ AR CA CO CT DE DC FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ
    NM NY NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY PR
    """
)


def _is_count_word(word: str) -> bool:
    """A lowercase word after a number that makes it a count ("10 days", "3 new messages")."""
    return word.isalpha() and word.islower() and word not in _CONNECTORS


def _code_reading(text: str, start: int, end: int, digits: str, dialed: bool = True) -> bool:
    """Whether the digits at ``start:end`` are a code, said one digit at a time (after dial or
    press too, unless not ``dialed``)."""
    following = _after(text, end)
    quantity = following.lower() in _QUANTITY_NOUNS
    if len(digits) >= 2 and digits[0] == "0":
        return True
    if not quantity and digits in ("911", "999", "112"):
        return True
    before = _before(text, start)
    tight = True  # only fillers so far between the code word and the digits
    words = [w.lower() for w in reversed(before)]
    for distance, (word, low) in enumerate(zip(reversed(before), words, strict=True), 1):
        if word[0].isdigit() or low in _BLOCKERS:
            break
        if dialed and low in _DIAL_VERBS and tight and (low == "press" or len(digits) >= 2):
            return not _is_count_word(following)
        soft = low in _SOFT_CODE_WORDS and (low != "no" or distance == 1)
        if low in _CODE_WORDS or (soft and len(digits) >= 3):
            # Further off, the code word holds only for digits said as its value ("The
            # extension for billing is 4521"), not for a number in a clause of its own.
            loose = words[0] in _FILLERS and not _is_count_word(following)
            if tight or (distance <= 5 and loose):
                return True
            break
        ending_in = low == "in" and distance < len(words) and words[distance] in ("ending", "ends")
        prefix = word.isupper() and len(word) <= 3  # an airline's or a series' letters: "DL 405"
        if low not in _FILLERS and not soft and not ending_in and not prefix:
            tight = False
    if len(digits) == 5 and before and before[-1] in _STATES:
        return True
    return len(digits) >= 6 and not quantity


# ---- passes ---------------------------------------------------------------------------------

Pass = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_TLDS = "com|org|net|edu|gov|io|co|us|uk|ca|info|biz|app|ai|tv|de|fr|au|ly|dev|mil|int"
# Top-level domains said letter by letter ("dot e d u"); the others are said as words.
_SPELLED_TLDS = _word_set("edu io us uk ca ai tv de fr au ly")
_URL_EMAIL = re.compile(
    rf"(?<![\w.+@/-])(?P<local>[A-Za-z0-9](?:[A-Za-z0-9._+-]{{0,62}}[A-Za-z0-9])?)"
    rf"@(?P<domain>{_LABEL}(?:\.{_LABEL}){{0,4}}\.[A-Za-z]{{2,24}})(?![\w-]|\.[A-Za-z0-9])"
    rf"|(?<![\w.@/-])(?P<url>(?:(?:https?://)?www\.{_LABEL}(?:\.{_LABEL}){{0,4}}"
    rf"|(?:https?://)?{_LABEL}(?:\.{_LABEL}){{0,4}}\.(?:{_TLDS}))(?![\w-])"
    rf"(?P<path>/(?:[\w\-./?=&%~+#]{{0,200}}[\w/])?)?)",
    re.IGNORECASE,
)
_SCHEME = re.compile(r"^https?://", re.IGNORECASE)
_URL_PIECE = re.compile(r"[A-Za-z]+|[0-9]+|[^A-Za-z0-9]")
_URL_SYMBOLS = {
    ".": "dot",
    "/": "slash",
    "-": "dash",
    "_": "underscore",
    "+": "plus",
    "?": "question mark",
    "=": "equals",
    "&": "and",
    "~": "tilde",
    "#": "hash",
    "%": "percent",
    ":": "colon",
}


def _spell_address(text: str) -> str:
    words: list[str] = []
    for piece in _URL_PIECE.findall(text):
        if piece.isdigit():
            words.append(_digits(piece))
        elif piece.isalpha():
            low = piece.lower()
            words.append(" ".join(low) if low == "www" else piece)
        elif piece in _URL_SYMBOLS:
            words.append(_URL_SYMBOLS[piece])
    return " ".join(words)


def _domain(domain: str) -> str:
    head, _, tld = domain.rpartition(".")
    low = tld.lower()
    said_tld = " ".join(low) if low in _SPELLED_TLDS else low
    return f"{_spell_address(head)} dot {said_tld}"


def _url_email(match: re.Match[str]) -> str:
    if match.group("local"):
        return f"{_spell_address(match.group('local'))} at {_domain(match.group('domain'))}"
    path = match.group("path")
    url = match.group("url")[: -len(path)] if path else match.group("url")
    said = _domain(_SCHEME.sub("", url))
    if path and path != "/":
        said += " " + _spell_address(path)
    return said


_ABBREVIATIONS = {
    "Mr": "Mister",
    "Mrs": "Missus",
    "Ms": "Miz",
    "Jr": "Junior",
    "Sr": "Senior",
    "Mt": "Mount",
    "Ft": "Fort",
    "Ave": "Avenue",
    "Blvd": "Boulevard",
    "Rd": "Road",
    "Ln": "Lane",
    "Hwy": "Highway",
    "Pkwy": "Parkway",
    "Ct": "Court",
    "Apt": "Apartment",
    "Ste": "Suite",
    "Dept": "Department",
    "Inc": "Incorporated",
    "Ltd": "Limited",
    "Corp": "Corporation",
    "approx": "approximately",
    "Approx": "Approximately",
    "etc": "et cetera",
    "vs": "versus",
    "e.g": "for example",
    "i.e": "that is",
    "No": "number",
    "no": "number",
    "Ext": "extension",
    "ext": "extension",
    "Acct": "account",
    "acct": "account",
    "Ref": "reference",
    "ref": "reference",
    "Tel": "telephone",
    "tel": "telephone",
    "Sept": "September",
    **{month[:3]: month for month in MONTHS_EN if month != "May"},
}
# Said with the sentence's period kept when a capital follows ("123 Main St. We open at 9").
_ENDS_SENTENCE = _word_set("Ave Blvd Rd Ln Hwy Pkwy Ct Jr Sr Inc Ltd Corp etc St Dr approx Dept")
_TITLES = _word_set("Mr Mrs Ms Mt Ft")
_NEEDS_NUMBER = frozenset(
    [
        *_word_set("No no Ext ext Acct acct Ref ref Apt Ste Sept approx Approx Tel tel"),
        *(m[:3] for m in MONTHS_EN),
    ]
)
_ABBREVIATION = re.compile(
    r"(?<![\w.])(?P<ab>e\.g|i\.e|Dr|St|"
    + "|".join(sorted((a for a in _ABBREVIATIONS if "." not in a), key=len, reverse=True))
    + r")(?P<dot>\.)?(?=[\s,;:)]|$)"
    + r"|(?<![\w.])(?P<wd>Mon|Tues|Tue|Wed|Thurs|Thur|Thu|Fri|Sat|Sun)\."
    + r"(?=,?\s+(?:[A-Z0-9]|and\b|or\b|to\b|through\b)|\s*$)"
    + r"|(?<=[0-9] )(?P<compass>N|S|E|W|NE|NW|SE|SW)\.?(?=\s[A-Z0-9])"
    + rf"|(?<![\w.])(?P<d1>{_WEEKDAY_RE})\.?\s?[-\u2013]\s?(?P<d2>{_WEEKDAY_RE})\b"
)
_COMPASS = {
    "N": "North",
    "S": "South",
    "E": "East",
    "W": "West",
    "NE": "Northeast",
    "NW": "Northwest",
    "SE": "Southeast",
    "SW": "Southwest",
}
_ADDRESS_BEFORE = re.compile(
    r"[0-9]{1,6}(?:st|nd|rd|th)?(?:\s+[A-Z][\w'.]{0,30}){1,3}\s*$|[0-9]{1,4}(?:st|nd|rd|th)\s+$"
)
_CAPITAL_AFTER = re.compile(r"\s+[A-Z]")
_DIGIT_AFTER = re.compile(r":?\s?[#0-9(+$€£¥]")


def _weekday(name: str) -> str:
    return _WEEKDAYS.get(name.lower(), name)


def _abbreviation(match: re.Match[str]) -> str:
    text, end = match.string, match.end()
    if match.group("wd"):
        return _weekday(match.group("wd")) + ("." if not text[end:].strip() else "")
    if match.group("compass"):
        return _COMPASS[match.group("compass")]
    if match.group("d1"):
        return f"{_weekday(match.group('d1'))} to {_weekday(match.group('d2'))}"
    ab, dot = match.group("ab"), match.group("dot")
    if ab in ("Dr", "St"):
        before = text[max(0, match.start() - 48) : match.start()]
        capital_next = _CAPITAL_AFTER.match(text, end) is not None
        if _ADDRESS_BEFORE.search(before):
            said = "Drive" if ab == "Dr" else "Street"
        elif not dot and not capital_next:
            return ab
        elif capital_next:
            said = "Doctor" if ab == "Dr" else "Saint"
        elif before.rstrip()[-1:].isalpha() and before.rstrip().split()[-1][:1].isupper():
            said = "Drive" if ab == "Dr" else "Street"
        else:
            said = "Doctor" if ab == "Dr" else "Saint"
        titled = said in ("Doctor", "Saint")
    else:
        if ab in _NEEDS_NUMBER and not _DIGIT_AFTER.match(text, end):
            if not dot or ab in ("No", "no"):
                return match.group(0)
        elif (
            not dot
            and ab not in ("e.g", "i.e")
            and ab not in _NEEDS_NUMBER
            and (ab not in _TITLES or not _CAPITAL_AFTER.match(text, end))
        ):
            # Without its period an abbreviation is a word unless a number ("Ext 42", "Jan 5")
            # or, for a title, a name ("Mr Lee") follows it; "Ave" alone is left to the voice.
            return match.group(0)
        if ab == "Ft" and not _CAPITAL_AFTER.match(text, end):
            return match.group(0)
        said = _ABBREVIATIONS[ab]
        if ab[0].isupper():  # "Tel:" opening a line stays capitalized: "Telephone:"
            said = said[0].upper() + said[1:]
        titled = ab in _TITLES
    if dot and not titled:
        rest = text[end:]
        if not rest.strip() or (ab in _ENDS_SENTENCE and _CAPITAL_AFTER.match(text, end)):
            said += "."
    return said


_KEYS = re.compile(
    r"(?<![\w*\u2022])(?P<mask>(?:[*xX\u2022]{3,8}[ \-]?){1,4})(?=[0-9])|"
    r"(?<![\w#&])#(?P<numbered>(?=\s?[0-9]|[A-Z]{1,4}-?[0-9]))"
    r"|(?<![\w#&])(?P<pound>#{1,4})(?![\w#])"
    r"|(?<![\w*])(?P<stars>\*{1,4})(?P<star>[0-9]{0,12})(?![\w*])"
)


def _key(match: re.Match[str]) -> str:
    if match.group("mask"):
        return ""  # "****1234", "XXXX-XXXX-1234": the hidden digits are not said
    if match.group("numbered") is not None:
        # "#611" after dial or press is keys ("pound six one one"); elsewhere "number"
        before = _before(match.string, match.start(), 1)
        dialed = before and before[0].lower() in _DIAL_VERBS
        return "pound " if dialed else "number "
    if match.group("pound"):
        if match.string.startswith(":", match.end()):  # "Account #: 1234"
            return "number"
        return " ".join(["pound"] * len(match.group("pound")))
    stars = " ".join(["star"] * len(match.group("stars")))
    digits = match.group("star")
    return f"{stars} {_digits(digits)}" if digits else stars


_PHONE = re.compile(
    r"(?<![\w+])(?P<intl>\+[0-9]{1,3}(?:[ .\-]?\([0-9]{1,4}\)\s?[0-9]{0,5}|[ .\-][0-9]{1,5}){1,6}"
    r"|\+[0-9]{7,15})(?![\w]|[.\-][0-9])"
    r"|(?<![\w+(.\-])(?P<nanp>(?:1[ .\-]?)?(?:\([0-9]{3}\)[ .\-]?|[0-9]{3}[ .\-])[0-9]{3}[ .\-]"
    r"[0-9]{4})(?:\s?[xX](?P<x>[0-9]{1,6}))?(?![\w]|[.\-][0-9])"
    r"|(?<![\w+(.,\-])(?P<local>[0-9]{3}-[0-9]{4}|[0-9]{5}-[0-9]{4}|[0-9]{3}-[0-9]{2}-[0-9]{4}"
    r"|[0-9]{3,4}(?:[ \-][0-9]{3,4}){2,4})(?![\w]|[.\-][0-9])"
    r"|(?<![\w+(.,\-])(?P<chain>[0-9]{1,6}(?:-[0-9]{1,6}){2,5})(?![\w]|[.\-][0-9])"
    r"|(?<![\w+(.\-])(?P<vanity>(?:1[ \-])?8(?:00|88|77|66|55|44|33)-)(?P<letters>[A-Z]{3,10})"
    r"(?![\w])"
)
_GROUPS = re.compile(r"[0-9]+")


def _phone(match: re.Match[str]) -> str:
    if match.group("vanity"):
        return f"{_grouped(_GROUPS.findall(match.group('vanity')))}, {match.group('letters')}"
    if match.group("intl"):
        groups = _GROUPS.findall(match.group("intl"))
        total = sum(len(g) for g in groups)
        if not 7 <= total <= 15:
            return match.group(0)
        if len(groups) == 1 and total == 11 and groups[0][0] == "1":
            one = groups[0]
            groups = [one[0], one[1:4], one[4:7], one[7:]]
        return "plus " + _grouped(groups)
    if match.group("nanp"):
        said = _grouped(_GROUPS.findall(match.group("nanp")))
        if match.group("x"):
            said += ", extension " + _digits(match.group("x"))
        return said
    if match.group("chain"):
        groups = _GROUPS.findall(match.group("chain"))
        shape = tuple(len(g) for g in groups)
        if len(shape) == 3 and (shape[0] == 4 or (shape[0] <= 2 and shape[2] in (2, 4))):
            return match.group(0)  # a date ("2026-12-25", "12-25-2026"), read by the dates
        return _grouped(groups)
    return _grouped(_GROUPS.findall(match.group("local")))


_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
}
_SCALES = {
    "k": "thousand",
    "K": "thousand",
    "M": "million",
    "MM": "million",
    "mn": "million",
    "B": "billion",
    "bn": "billion",
}
_PER = {
    "mo": "month",
    "yr": "year",
    "hr": "hour",
    "wk": "week",
    "min": "minute",
    "GB": "gigabyte",
    "gb": "gigabyte",
}
_AMOUNT = r"[0-9]{1,3}(?:,[0-9]{3}){1,12}|[0-9]+"
_CURRENCY = re.compile(
    rf"(?<![\w$€£¥])(?P<neg>[-\u2212])?(?P<sym>[$€£¥])\s?(?P<num>{_AMOUNT}|(?=\.[0-9]))"
    r"(?:\.(?P<frac>[0-9]{1,40}))?(?![0-9]|[.,][0-9])"
    r"(?:\s?(?P<scale>thousand|million|billion|trillion|[kKMB]|MM|bn|mn)(?![\w]))?"
    rf"(?:\s?[-\u2013]\s?[$€£¥]?(?P<num2>{_AMOUNT})(?:\.(?P<frac2>[0-9]{{1,2}}))?"
    r"(?![\w]|[.,][0-9]))?"
    r"(?:/(?P<per>mo|month|yr|year|hr|hour|day|wk|week|min|minute|night|person|user|GB|gb)"
    r"(?![\w]))?"
)


def _money(whole: str, frac: str | None, names: tuple[str, str, str, str]) -> str:
    one, many, cent, cents = names
    whole = whole.replace(",", "") or "0"
    if frac and (len(frac) > 2 or not cent):
        return f"{_cardinal(whole, frac)} {many}"
    amount = int(whole) if len(whole) <= MAX_NUMBER_DIGITS else -1
    minor = int(frac.ljust(2, "0")) if frac else 0
    parts = []
    if amount != 0 or not minor:
        parts.append(f"{_cardinal(whole)} {one if amount == 1 else many}")
    if minor:
        parts.append(f"{_int_words(minor)} {cent if minor == 1 else cents}")
    return " and ".join(parts)


def _currency(match: re.Match[str]) -> str:
    names = _CURRENCIES[match.group("sym")]
    whole, frac, scale = match.group("num"), match.group("frac"), match.group("scale")
    if scale:
        said = f"{_cardinal(whole, frac)} {_SCALES.get(scale, scale)} {names[1]}"
    elif match.group("num2"):
        whole2, frac2 = match.group("num2"), match.group("frac2")
        if frac or frac2:
            said = f"{_money(whole, frac, names)} to {_money(whole2, frac2, names)}"
        else:
            said = f"{_cardinal(whole)} to {_money(whole2, None, names)}"
    else:
        said = _money(whole, frac, names)
    if match.group("neg"):
        said = "minus " + said
    if match.group("per"):
        per = match.group("per")
        said += " per " + _PER.get(per, per)
    return said


_DATE = re.compile(
    r"(?<![\w/])(?P<always>24/7(?:/365)?)(?![\w/])|"
    r"(?<![\w/.\-])(?P<iy>[0-9]{4})-(?P<im>[0-9]{1,2})-(?P<id>[0-9]{1,2})(?![\w]|[.\-/][0-9])"
    r"|(?<![\w/.\-])(?P<m1>[0-9]{1,2})(?P<sep>[/.\-])(?P<d1>[0-9]{1,2})(?P=sep)"
    r"(?P<y1>[0-9]{4}|[0-9]{2})(?![\w]|[.\-/][0-9])"
    r"|(?<![\w/.,\-])(?P<mw>[0-9]{1,3})\s(?P<mn>[0-9])/(?P<md>[0-9]{1,2})(?![\w/]|[.,][0-9])"
    r"|(?<![\w/.\-])(?P<a>[0-9]{1,3})/(?P<b>[0-9]{1,3})(?![\w/]|[.\-][0-9])"
    rf"|\b(?P<mon>{_MONTH_RE})\.?\s(?P<day>[0-9]{{1,2}})(?:st|nd|rd|th)?"
    r"(?:\s?[-\u2013]\s?(?P<until>[0-9]{1,2})(?:st|nd|rd|th)?)?(?![\w:])"
    r"(?:,?\s(?P<yr>[0-9]{4})(?![\w]))?"
    rf"|(?<![\w.,])(?P<day2>[0-9]{{1,2}})(?:st|nd|rd|th)?\s(?:of\s)?(?P<mon2>{_MONTH_RE})\b"
    r"(?:,?\s(?P<yr2>[0-9]{4})(?![\w]))?"
    rf"|\b(?P<mon3>{_MONTH_RE})\s(?P<yr3>[0-9]{{4}})(?![\w])"
    r"|(?<![\w'\u2019])['\u2019](?P<yy>[0-9]{2})(?P<ys>s)?(?![\w])"
    r"|(?<![\w.,'\u2019])(?P<decade>[0-9]{1,3}0)['\u2019]?s(?![\w])"
)
# Words before a bare m/d that make it a date ("on 3/4"), not a fraction.
_DATE_BEFORE = _word_set(
    """
    on by until till before after since from through thru due dated starting effective expires
    expiring between to and monday tuesday wednesday thursday friday saturday sunday appointment
    scheduled date delivery deliver arrive arrives renews renew birthday born closed open opens
    starts ends begins
    """
)


def _date_words(month: int, day: int | None, year: str | None, day_first: bool = False) -> str:
    name = MONTHS_EN[month - 1]
    if day is None:
        head = name
    elif day_first:
        head = f"the {_ordinal_words(day)} of {name}"
    else:
        head = f"{name} {_ordinal_words(day)}"
    return f"{head}, {_year(int(year))}" if year else head


def _valid(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= 31


_EXPIRY = _word_set("card expiration expiry exp")


def _slash(match: re.Match[str], a: int, b: int) -> str:
    """A bare "a/b": a date after "on" or near a date word, else a fraction when it reads as one
    ("1/2 cup", "3/4"), else a date when it is one ("1/5"), else "a over b"."""
    text = match.string
    before = [w.lower() for w in _before(text, match.start(), 4)]
    following = _after(text, match.end())
    if (a, b) == (24, 7) or a == b:
        return f"{_int_words(a)} {_int_words(b)}"
    near = _before(text, match.start(), 6)
    on_a_day = bool(before) and before[-1] in ("on", "by", "before", "after", "until", "from")
    expiry = any(w.lower() in _EXPIRY for w in near) and not on_a_day
    if expiry and 1 <= a <= 12 and len(match.group("b")) == 2:
        return f"{MONTHS_EN[a - 1]} {_year(2000 + b)}"  # a card's expiry, month and year
    date_context = any(w in _DATE_BEFORE for w in before) or following.lower() == "at"
    if date_context and _valid(a, b):
        return _date_words(a, b, None)
    fraction_context = following == "of" or _is_count_word(following)
    if 0 < a < b and (fraction_context or b in (2, 3, 4, 8)):
        return _fraction(a, b)
    if _valid(a, b):
        return _date_words(a, b, None)
    if _valid(b, a):
        return _date_words(b, a, None, day_first=True)
    if 0 < a < b <= 100:
        return _fraction(a, b)
    return f"{_int_words(a)} over {_int_words(b)}"


def _full_year(digits: str) -> str:
    if len(digits) == 2:
        short = int(digits)
        return str(2000 + short if short <= 49 else 1900 + short)
    return digits


def _date(match: re.Match[str]) -> str:
    g = match.group
    if g("always"):
        return "twenty-four seven" + (" three sixty-five" if g("always").endswith("365") else "")
    if g("iy"):
        month, day = int(g("im")), int(g("id"))
        return _date_words(month, day, g("iy")) if _valid(month, day) else g(0)
    if g("m1"):
        month, day = int(g("m1")), int(g("d1"))
        if g("sep") != "/" and len(g("y1")) == 2:
            return g(0)  # "3-4-5" is no date
        if _valid(month, day):
            return _date_words(month, day, _full_year(g("y1")))
        if _valid(day, month):
            return _date_words(day, month, _full_year(g("y1")), day_first=True)
        return g(0)
    if g("mw"):
        numerator, denominator = int(g("mn")), int(g("md"))
        whole = _int_words(int(g("mw")))
        if not 0 < numerator < denominator:
            return f"{whole} {_int_words(numerator)} over {_int_words(denominator)}"
        if (numerator, denominator) == (1, 2):
            return f"{whole} and a half"
        return f"{whole} and {_fraction(numerator, denominator)}"
    if g("a"):
        return _slash(match, int(g("a")), int(g("b")))
    if g("mon"):
        day = int(g("day"))
        if not 1 <= day <= 31:
            return g(0)
        said = _date_words(MONTHS_EN.index(g("mon")) + 1, day, None)
        if g("until") and 1 <= int(g("until")) <= 31:
            said += " to " + _ordinal_words(int(g("until")))
        return f"{said}, {_year(int(g('yr')))}" if g("yr") else said
    if g("mon2"):
        day = int(g("day2"))
        if not 1 <= day <= 31:
            return g(0)
        said = _date_words(MONTHS_EN.index(g("mon2")) + 1, day, g("yr2"), day_first=True)
        before = _before(match.string, match.start(), 1)
        return said[4:] if before and before[0].lower() == "the" else said
    if g("mon3"):
        return f"{g('mon3')} {_year(int(g('yr3')))}"
    if g("yy"):
        short = g("yy")
        said = f"oh {_DIGIT[int(short[1])]}" if short[0] == "0" else _int_words(int(short))
        if g("ys"):
            return "two thousands" if short == "00" else _plural(_int_words(int(short)))
        return said
    decade = g("decade")
    if len(decade) == 4:
        return _plural(_year(int(decade)))
    return _plural(_int_words(int(decade)))


_AP = r"(?:[aApP]\.\s?[mM]\.?|[aApP][mM](?![\w]))"
_CLOCK = rf"[0-9]{{1,2}}(?::[0-9]{{2}})?(?:\s?{_AP})?"
_TIME = re.compile(
    rf"(?<![\w:.])(?P<t1>{_CLOCK})(?:\s?[-\u2013]\s?|\s(?:to|until|till|through)\s)"
    rf"(?P<t2>{_CLOCK})(?![\w:]|\.[0-9])"
    rf"|(?<![\w:.])(?P<t>[0-9]{{1,2}}(?::[0-9]{{2}})?\s?{_AP}"
    r"|[0-9]{1,2}:[0-9]{2}(?![0-9]|:[0-9]|\.[0-9]))"
)
_CLOCK_PARTS = re.compile(r"([0-9]{1,2})(?::([0-9]{2}))?\s?([aApP])?")


def _clock(text: str, on_the_hour: str = " o'clock") -> str | None:
    """A clock time as said; ``on_the_hour`` follows a whole hour written with ":00" and no
    a.m./p.m. (a range's other end may carry them: "3:00 to 4:30 PM" is "three to ...")."""
    match = _CLOCK_PARTS.match(text)
    if match is None:
        return None
    hour, minute = int(match.group(1)), int(match.group(2) or 0)
    ap = match.group(3)
    if hour > 23 or minute > 59 or (ap and not 1 <= hour <= 12):
        return None
    if not ap and hour == 0:
        return "midnight" if not minute else _clock(f"12:{minute:02d} am")
    said = _int_words(hour)
    if minute:
        said += (" oh " if minute < 10 else " ") + _int_words(minute)
    elif not ap and match.group(2):
        said += on_the_hour if hour <= 12 else " hundred"
    if ap:
        said += " a m" if ap in "aA" else " p m"
    return said


def _keeps_period(match: re.Match[str]) -> bool:
    """Whether a match that swallowed a final "." (as in "a.m.") also ended its sentence."""
    text, end = match.string, match.end()
    return text[end - 1] == "." and (
        not text[end:].strip() or bool(_CAPITAL_AFTER.match(text, end))
    )


def _time(match: re.Match[str]) -> str:
    if match.group("t"):
        said = _clock(match.group("t"))
    else:
        first, second = match.group("t1"), match.group("t2")
        if not any(c in first + second for c in ":aApP"):
            return match.group(0)  # "3-5" or "9 to 5": a range of numbers, read later
        hour = "" if any(c in first + second for c in "aApP") else " o'clock"
        one, two = _clock(first, hour), _clock(second, hour)
        said = f"{one} to {two}" if one and two else None
    if said is None:
        return match.group(0)
    return said + "." if _keeps_period(match) else said


_UNITS = {
    "%": ("percent", "percent"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "° F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "° C": ("degree Celsius", "degrees Celsius"),
    "°": ("degree", "degrees"),
    "¢": ("cent", "cents"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "yd": ("yard", "yards"),
    "yds": ("yard", "yards"),
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "KB": ("kilobyte", "kilobytes"),
    "kB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "TB": ("terabyte", "terabytes"),
    "Kbps": ("kilobit per second", "kilobits per second"),
    "Mbps": ("megabit per second", "megabits per second"),
    "Gbps": ("gigabit per second", "gigabits per second"),
    "Hz": ("hertz", "hertz"),
    "kHz": ("kilohertz", "kilohertz"),
    "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "kW": ("kilowatt", "kilowatts"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "sec": ("second", "seconds"),
    "secs": ("second", "seconds"),
    "ms": ("millisecond", "milliseconds"),
    "sq ft": ("square foot", "square feet"),
}
_NUMBER = r"[0-9]{1,3}(?:,[0-9]{3}){1,12}|[0-9]{1,40}"
_UNIT = re.compile(
    rf"(?<![\w.,])(?P<neg>[-\u2212])?(?P<n1>{_NUMBER})(?:\.(?P<f1>[0-9]{{1,40}}))?"
    rf"(?:\s?(?:[-\u2013]|to)\s?(?P<n2>{_NUMBER})(?:\.(?P<f2>[0-9]{{1,40}}))?)?\s?"
    r"(?P<unit>"
    + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
    + r")(?![\w])",
    re.IGNORECASE,  # "5 KM", "10 Lbs": units are written in any case
)
_UNITS_FOLDED = {unit.lower(): said for unit, said in _UNITS.items()}


def _unit(match: re.Match[str]) -> str:
    one, many = _UNITS_FOLDED[match.group("unit").lower()]
    first = _cardinal(match.group("n1"), match.group("f1"), match.group("neg") or "")
    if match.group("n2"):
        return f"{first} to {_cardinal(match.group('n2'), match.group('f2'))} {many}"
    single = match.group("n1") == "1" and not match.group("f1") and not match.group("neg")
    return f"{first} {one if single else many}"


_BY = re.compile(r"(?<![\w.,])([0-9]{1,4}(?:\.[0-9]{1,2})?)\s?[x\u00d7]\s?(?=[0-9])")


def _by(match: re.Match[str]) -> str:
    """Dimensions: "22 x 14" is "22 by 14" (the numbers are read by the passes after)."""
    return f"{match.group(1)} by "


_VULGAR = {"½": (1, 2), "¼": (1, 4), "¾": (3, 4), "⅓": (1, 3), "⅔": (2, 3), "⅛": (1, 8)}
_VULGAR_FRACTION = re.compile(r"(?<![\w.,])(?:([0-9]{1,6})\s?)?([½¼¾⅓⅔⅛])")


def _vulgar(match: re.Match[str]) -> str:
    numerator, denominator = _VULGAR[match.group(2)]
    said = "a half" if (numerator, denominator) == (1, 2) else _fraction(numerator, denominator)
    if match.group(1):
        return f"{_cardinal(match.group(1))} and {said}"
    return "one half" if said == "a half" else said


_ORDINAL = re.compile(r"(?<![\w.,])(?P<n>[0-9]{1,60})(?:st|nd|rd|th|ST|ND|RD|TH)(?![\w])")


def _ordinal_match(match: re.Match[str]) -> str:
    return _ordinal(match.group("n"))


_CODE = re.compile(
    r"(?<![\w.,'\u2019\-])(?P<code>[A-Z]{1,3}-[0-9]{1,12}|[A-Za-z]{1,40}[0-9][A-Za-z0-9]{0,40}"
    r"|[0-9]{1,40}[A-Za-z][A-Za-z0-9]{0,40})(?![\w])"
)
_RUNS = re.compile(r"[A-Za-z]+|[0-9]+")


_SHORT_NUMBER_FIRST = re.compile(r"([1-9][0-9]{0,2})([A-Za-z]+)")


_FISCAL = re.compile(r"FY((?:19|20)[0-9]{2})")
_ROAD = re.compile(r"([A-Z])-([1-9][0-9]?)")


def _code(match: re.Match[str]) -> str:
    short = _SHORT_NUMBER_FIRST.fullmatch(match.group("code"))
    if short:  # "4B", "12C", "10x": a number and its letter
        return f"{_int_words(int(short.group(1)))} {' '.join(short.group(2).upper())}"
    fiscal = _FISCAL.fullmatch(match.group("code"))
    if fiscal:  # "FY2026": a fiscal year
        return f"F Y {_year(int(fiscal.group(1)))}"
    road = _ROAD.fullmatch(match.group("code"))
    if road:  # "I-95", "A-1": a road's letter and number
        return f"{road.group(1)} {_int_words(int(road.group(2)))}"
    words = []
    for run in _RUNS.findall(match.group("code")):
        if run.isdigit():
            words.append(_digits(run))
        elif len(run) <= 3 or run.isupper():
            words.append(" ".join(run.upper()))
        else:
            words.append(run)
    return " ".join(words)


_RANGE = re.compile(
    r"(?<![\w.,:/\-])(?P<a>[0-9]{1,4})\s?[-\u2013]\s?(?P<b>[0-9]{1,4})(?![\w]|[.,:/\-][0-9])"
)


def _range_end(digits: str, other: str) -> str:
    if len(digits) > 1 and digits[0] == "0":
        return _digits(digits)
    if len(digits) == 4 and len(other) in (2, 4) and 1100 <= int(digits) <= 2099:
        return _year(int(digits))
    return _int_words(int(digits))


def _range(match: re.Match[str]) -> str:
    a, b = match.group("a"), match.group("b")
    if _code_reading(match.string, match.start(), match.end(), a, dialed=False):
        return _grouped([a, b])  # "claim 88-1234": a code in two groups, not a range
    return f"{_range_end(a, b)} to {_range_end(b, a)}"


_PLAIN = re.compile(
    r"(?<![\w.,])(?P<sign>[-\u2212+](?=\.?[0-9]))?"
    rf"(?:(?P<int>{_AMOUNT})(?:\.(?P<frac>[0-9]+))?|\.(?P<frac0>[0-9]+))"
    r"(?P<plus>\+(?![\w]))?(?![\w]|[.,][0-9])"
)
_STREET_AFTER = re.compile(
    r"(?:\s+[A-Za-z][\w'.\-]{0,30}){1,3}?\s+(?:Street|Avenue|Road|Drive|Boulevard|Lane|Way|"
    r"Court|Place|Parkway|Highway|Circle|Terrace|Trail|Plaza|Square)\b"
)


def _street_number(digits: str) -> str:
    """A house number as it is said: "1234" twelve thirty-four, "123" one twenty-three."""
    if len(digits) in (3, 4) and digits[0] != "0":
        return _year(int(digits))
    if len(digits) <= 2:
        return _int_words(int(digits))
    return _digits(digits)


def _is_year(text: str, start: int, end: int, value: int) -> bool:
    before = [w.lower() for w in _before(text, start, 4)]
    following = _after(text, end)
    if following.lower() in _YEAR_NOUNS or (before and before[-1] in _YEAR_ALWAYS):
        return True
    if _is_count_word(following):
        return False
    if any(w in _BLOCKERS for w in before[-2:]) or before[-1:] in (["have"], ["has"], ["had"]):
        return False
    if before and before[-1] in _YEAR_WORDS:
        return before[-2:] != ["out", "of"] and before[-2:] != ["total", "of"]
    return 1900 <= value <= 2099


_MILITARY = re.compile(r"(?:[01][0-9]|2[0-3])(?:00|[1-5][0-9]|0[1-9])")


def _plain(match: re.Match[str]) -> str:
    text, start, end = match.string, match.start(), match.end()
    sign = match.group("sign") or ""
    whole = match.group("int")
    frac = match.group("frac") if whole else match.group("frac0")
    plus = " plus" if match.group("plus") else ""
    if whole is None or frac is not None or "," in whole:
        return _cardinal(whole or "", frac, sign) + plus
    if len(whole) == 1 or (sign in ("-", "\u2212") and whole[0] != "0"):
        return _cardinal(whole, None, sign) + plus
    if sign == "+" and len(whole) >= 6:
        return "plus " + _digits(whole)
    if len(whole) == 4 and _after(text, end) == "hours" and _MILITARY.fullmatch(whole):
        minute = int(whole[2:])
        hundred = "hundred" if not minute else ("oh " * (minute < 10)) + _int_words(minute)
        hour = _digits(whole[:2]) if whole[0] == "0" else _int_words(int(whole[:2]))
        return f"{hour} {hundred}"
    if len(whole) > MAX_NUMBER_DIGITS or _code_reading(text, start + len(sign), end, whole):
        if len(whole) in (10, 11) and (len(whole) == 10 or whole[0] == "1"):
            head = [whole[0]] if len(whole) == 11 else []
            body = whole[len(head) :]
            return _grouped([*head, body[:3], body[3:6], body[6:]]) + plus
        return _digits(whole) + plus
    if len(whole) <= 4 and _STREET_AFTER.match(text, end):
        return _street_number(whole)
    value = int(whole)
    if len(whole) == 4 and 1100 <= value <= 2099 and _is_year(text, start, end, value):
        return _year(value) + plus
    return _cardinal(whole, None, sign) + plus


_DOTTED = re.compile(r"(?<![\w.,])[0-9]{1,4}(?:\.[0-9]{1,4}){2,6}(?![\w]|\.[0-9])")


def _dotted(match: re.Match[str]) -> str:
    """A version or an address ("1.2.3", "10.0.0.1"): each part a number, "dot" between."""
    return " dot ".join(
        _digits(part) if part[0] == "0" and len(part) > 1 else _int_words(int(part))
        for part in match.group(0).split(".")
    )


_LEFTOVER = re.compile(r"[0-9]+")


def _leftover(match: re.Match[str]) -> str:
    """Digits no pattern read (a version "1.2.3", an address "10.0.0.1"): one by one."""
    text, start, end = match.string, match.start(), match.end()
    said = _digits(match.group(0))
    if start and text[start - 1].isalpha():
        said = " " + said
    if end < len(text) and text[end].isalpha():
        said += " "
    return said


_PASSES: tuple[Pass, ...] = (
    (_URL_EMAIL, _url_email),
    (_ABBREVIATION, _abbreviation),
    (_KEYS, _key),
    (_PHONE, _phone),
    (_CURRENCY, _currency),
    (_DATE, _date),
    (_TIME, _time),
    (_UNIT, _unit),
    (_BY, _by),
    (_VULGAR_FRACTION, _vulgar),
    (_ORDINAL, _ordinal_match),
    (_CODE, _code),
    (_RANGE, _range),
    (_DOTTED, _dotted),
    (_PLAIN, _plain),
    (_LEFTOVER, _leftover),
)
# Text with none of these has nothing any pass reads (no digit, address, key or abbreviation).
_TRIGGER = re.compile(r"[0-9@#*.\-\u2013]|\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Apt|vs|etc)\b")


def read_prompt(text: str) -> str:
    """``text`` with its numbers, amounts, dates, times, codes, phone numbers, addresses and
    abbreviations read as an English-speaking caller expects (docs/ssml.md, "Readings")."""
    if _TRIGGER.search(text) is None:
        return text
    for pattern, said in _PASSES:
        text = pattern.sub(said, text)
    return text
