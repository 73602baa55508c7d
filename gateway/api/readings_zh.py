"""Mandarin readings of a prompt's digits (docs/ssml.md, "Readings", "Mandarin").

Numbers are read by WeTextProcessing's runtime (``wetext``: weighted FSTs shipped in its wheel),
after a pre-pass of our own for what it reads wrong in a customer-service prompt: telephone
numbers, codes and digit strings are read digit by digit (leading zeros kept), money in yuan,
jiao and fen, keys (# and *), and 两 where a count or a clock time wants it.

The FST tagger costs about 0.1 ms per character it is given, Chinese characters included, so it
is given only windows around the digits (at most 32 characters each, never across a clause's
punctuation), and at most :data:`WETEXT_BUDGET` characters per text: past that, and for digit
runs no number reading fits, digits are read one by one. A text's cost stays linear and small.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

# Longest window handed to the FSTs in one call (a prompt's longest, a date range, is about 25):
# one call holds the GIL, about 20 ms for 32 characters of digits and signs on a loaded core.
WINDOW_CHARS = 32
# What one text may hand the FSTs in all (characters, numbers): a prompt needs a few dozen
# characters, a page of them a few hundred; the rest is read digit by digit.
WETEXT_BUDGET = 1024
WETEXT_NUMBERS = 256
# A number with this many characters or more is no number a prompt says: read digit by digit.
_LONGEST_NUMBER = 32

_DIGITS = "零一二三四五六七八九"
# On the telephone 一 is said 幺 (yāo), not to be heard as 七.
_PHONE_DIGITS = "零幺二三四五六七八九"

_FULL_WIDTH = str.maketrans("０１２３４５６７８９％＃＊￥＋", "0123456789%#*¥+")
_FULL_WIDTH_BETWEEN_DIGITS = re.compile(r"(?<=[0-9])[：／－．～](?=[0-9])")
_ASCII_OF = {"：": ":", "／": "/", "－": "-", "．": ".", "～": "~"}

_normalizer: Any = None
_normalizer_lock = threading.Lock()


def _wetext() -> Any:
    """The Mandarin normalizer, built on first use: importing wetext reads its FSTs (about half
    a second), which a gateway without a Mandarin voice never pays."""
    global _normalizer
    if _normalizer is None:
        with _normalizer_lock:
            if _normalizer is None:
                from wetext import Normalizer

                _normalizer = Normalizer(lang="zh", operator="tn")
    return _normalizer


def _spell(text: str, digits: str = _DIGITS) -> str:
    """Digit by digit; letters kept, a run of separators one space."""
    out = []
    for ch in text:
        if "0" <= ch <= "9":
            out.append(digits[ord(ch) - 48])
        elif ch == "+":
            out.append("加")
        elif ch in "- \t":
            if out and out[-1] != " ":
                out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


def _spelled(group: int, digits: str = _DIGITS) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        start, end = match.span(group)
        whole = match.group(0)
        base = match.start()
        return (
            whole[: start - base]
            + _spell(whole[start - base : end - base], digits)
            + whole[end - base :]
        )

    return replace


# A code or a telephone number: alphanumeric groups (at least one digit) joined by - or a space.
_CODE = r"[A-Za-z]{0,4}[0-9][0-9A-Za-z]*(?:[-\s][0-9A-Za-z]*[0-9][0-9A-Za-z]*)*"
_GAP = (
    r"(?:[是为：:\s]|[后末前][0-9一二三四五六七八九十]{1,2}位(?:数字?)?"
    r"|(?:已经?|将)?(?:重置|修改|变更|更改|设置|设定|更新|初始化)为){0,8}"
)

# What follows a code or a telephone number; a count or an amount is neither (客服1000人,
# 密码错误已达10次).
_NOT_A_COUNT = r"(?![0-9A-Za-z%]|\.[0-9]|[次个位名人天秒元块点月日年时岁张件条笔份]|分钟|小时)"

# Words after which digits are said one by one, as a telephone number ...
_PHONE_WORDS = (
    "拨打|拨|致电|电话号码|电话|热线|客服|呼叫|回拨|来电|报警|火警|急救|求助|专线|手机号码|手机号|"
    "手机|号码"
)
_PHONE_AFTER_WORD = re.compile(
    rf"(?:{_PHONE_WORDS})(?:[是为：:\s]|号码|号){{0,4}}(\+?[0-9](?:[0-9]|[-\s](?=[0-9]))*[0-9]{{2}}){_NOT_A_COUNT}"
)
# ... and these shapes, wherever they stand: mobiles (+86 or not), landlines with an area code,
# 400 and 800 numbers.
_PHONE_SHAPE = re.compile(
    r"(?<![0-9.])("
    r"(?:\+86[-\s]?)?1[3-9][0-9](?:[-\s]?[0-9]{4}){2}"
    r"|0[1-9][0-9]{1,2}-[0-9]{3,4}[-\s]?[0-9]{4}"
    r"|[48]00[-\s]?[0-9]{3}[-\s]?[0-9]{4}"
    r")(?![0-9.])"
)
# ... and as a code: verification codes, PINs, order, account and staff numbers, rooms, flights.
_CODE_WORDS = (
    "验证码|校验码|动态码|确认码|激活码|兑换码|取件码|取货码|提货码|取餐码|取餐号|券码|"
    "密码|口令|工号|订单编号|订单号|运单号|单号|尾号|尾数|账号|帐号|卡号|会员号|客户号|"
    "编号|分机号|分机|房间号|房间|房号|航班号|航班|车次|桌号|排队号|预约号|流水号|"
    "序列号|合同号|保单号|身份证号码|身份证号|证件号码|证件号|邮编|邮政编码"
)
_CODE_AFTER_WORD = re.compile(rf"(?:{_CODE_WORDS}){_GAP}({_CODE}){_NOT_A_COUNT}")
_ROOM = re.compile(r"(?<![0-9])([0-9]{3,5})(?=室|房间|号房)")
# Flights and trains (CA1234, G123) and other letter-prefixed codes.
_LETTER_CODE = re.compile(r"(?<![A-Za-z0-9])[A-Z]{1,3}([0-9]{3,})(?![0-9.])")
_LONG_RUN = re.compile(r"(?<![0-9.])([0-9]{12,}[Xx]?)(?![0-9.])")
# A zero in front keeps every digit (0042 is a code, not forty-two); a zero-padded month, day
# or hour is the number.
_PADDED_DATE = re.compile(r"(?<![0-9])0([1-9])(?=[月日号点时])")
_LEADING_ZERO = re.compile(r"(?<![0-9.:/\-])(0[0-9]+)(?![0-9.:/\-])")

# A masked number (138****8000): its digits, one by one.
_MASKED = re.compile(r"[0-9]*\*{2,}[0-9]+|[0-9]+\*{2,}")
# A clock time; the FSTs read 14:32 before a counter as a score (十四比三两支).
_CLOCK = re.compile(r"(?<![0-9:.])([01]?[0-9]|2[0-4]):([0-5][0-9])(?::([0-5][0-9]))?(?![0-9:])")
_CLOCK_RANGE = re.compile(r"(?<=[点分秒])\s*[-~～—]\s*(?=[0-9])")
# The FSTs read 10.5 to 12.99 as dates (12.5GB is 十二月五日GB); in a prompt they are amounts.
_DATE_LIKE_DECIMAL = re.compile(r"(?<![0-9.])(1[0-2])\.([0-9]{1,2})(?![0-9.%‰℃°元万亿])")
_THOUSANDS = re.compile(r"(?<![0-9.,])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9,])")
_YUAN_SIGN = re.compile(r"¥\s*([0-9]+)(?:\.([0-9]+))?\s*([万亿]?)\s*元?")
_YUAN_DECIMAL = re.compile(r"(?<![0-9.])([0-9]+)\.([0-9]{1,2})\s*元")

_KEY_NAMES = {"#": "井号", "*": "星号"}
_KEY_SIGN = re.compile(r"(?:(?<=[按以])\s*)?[#*]\s*(?:号|(?=键))|(?<=[按以])\s*[#*]")
_KEY_DIGIT = re.compile(r"(?<=按)\s*([0-9])(?![0-9]|次|下)")
_PERCENT_RANGE = re.compile(r"%\s*[-~～—]\s*(?=[0-9])")
# 5/8 before 前, 起, 至 … is a date (the FSTs say 八分之五).
_SLASH_DATE = re.compile(
    r"(?<![0-9/.])(1[0-2]|0?[1-9])/(3[01]|[12][0-9]|0?[1-9])(?![0-9/.])"
    r"(?=\s*(?:前|后|起|至|到|止|之前|之后|以前|以后|当天|截止))"
)
_TIMES = re.compile(r"(?<=[0-9])\s*×\s*(?=[0-9])")
_KM_PER_HOUR = re.compile(r"(?<=[0-9])\s*km/h")
# A building's unit is numbered: 2单元 is 二单元 (the FSTs count it, 两单元).
_ER = re.compile(r"(?<![0-9.])2(?![0-9.])(?=单元|栋|幢)")
# 两, not 二, before counters the FSTs read with 二, and for the hour (两点).
_LIANG = re.compile(
    r"(?<![0-9.第周期])2(?![0-9.])(?=点|次|笔|年(?!级)|位|项|种|台|部|遍|倍|晚|间|剂|句|毛|公斤)"
)

_SPAN = re.compile(r"(?:(?<![0-9A-Za-z])[-+−]|[¥$€£])?[0-9](?:[0-9.:/%~\-]*[0-9%])?")
# A number's unit or counter: what the FSTs look at after it.
_AFTER = re.compile(r"[\u4e00-\u9fffA-Za-z℃°‰]{0,3}")
_ANY_DIGIT = re.compile(r"[0-9]")


def _yuan(whole: str, fraction: str | None) -> str:
    """An amount as yuan, jiao and fen (42.05 is 42元零5分), for the FSTs to read."""
    if len(fraction or "") > 2:
        return f"{whole}.{fraction}元"
    cents = (fraction or "") + "00"
    jiao, fen = cents[0], cents[1]
    parts = [] if whole == "0" and (jiao, fen) != ("0", "0") else [f"{whole}元"]
    if jiao != "0":
        parts.append(f"{jiao}角")
    if fen != "0":
        parts.append(("零" if jiao == "0" and parts else "") + f"{fen}分")
    return "".join(parts)


def _clock(match: re.Match[str]) -> str:
    """14:32 as 14点32分 (9:05 as 9点零5分, 9:00 as 9点), for the FSTs to read."""
    out = f"{int(match.group(1))}点"
    for value, unit in ((match.group(2), "分"), (match.group(3), "秒")):
        if value and value != "00":
            out += ("零" if value[0] == "0" else "") + f"{int(value)}{unit}"
    return out


def _yuan_sign(match: re.Match[str]) -> str:
    whole, fraction, scale = match.groups()
    if scale:
        return f"{whole}{'.' + fraction if fraction else ''}{scale}元"
    return _yuan(whole, fraction)


def _prepass(text: str) -> str:
    """What the FSTs read wrong in a prompt, read here first."""
    if "#" in text or "*" in text:
        text = _KEY_SIGN.sub(lambda m: _KEY_NAMES[m.group(0).strip()[0]], text)
    text = _PHONE_SHAPE.sub(_spelled(1, _PHONE_DIGITS), text)
    text = _PHONE_AFTER_WORD.sub(_spelled(1, _PHONE_DIGITS), text)
    text = _CODE_AFTER_WORD.sub(_spelled(1), text)
    text = _ROOM.sub(_spelled(1), text)
    text = _LETTER_CODE.sub(_spelled(1), text)
    text = _LONG_RUN.sub(_spelled(1), text)
    text = _KEY_DIGIT.sub(_spelled(1), text)
    if "*" in text:
        text = _MASKED.sub(_spelled(0), text)
    if ":" in text:
        text = _CLOCK.sub(_clock, text)
        text = _CLOCK_RANGE.sub("到", text)
    text = _PADDED_DATE.sub(r"\1", text)
    text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _LEADING_ZERO.sub(_spelled(1), text)
    text = _YUAN_SIGN.sub(_yuan_sign, text)
    text = _YUAN_DECIMAL.sub(lambda m: _yuan(m.group(1), m.group(2)), text)
    text = _PERCENT_RANGE.sub("%到", text)
    text = _SLASH_DATE.sub(lambda m: f"{int(m.group(1))}月{int(m.group(2))}日", text)
    text = _TIMES.sub("乘", text)
    text = _KM_PER_HOUR.sub("公里每小时", text)
    text = _ER.sub("二", text)
    text = _DATE_LIKE_DECIMAL.sub(lambda m: f"{m.group(1)}点{_spell(m.group(2))}", text)
    return _LIANG.sub("两", text)


def _windows(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, read by the FSTs) for each stretch of ``text`` around its numbers."""
    stretches: list[list[int]] = []  # [start, end, numbers in it]; end < 0: not for the FSTs
    for span in _SPAN.finditer(text):
        s, e = span.span()
        if e - s >= _LONGEST_NUMBER:
            stretches.append([s, -e, 1])
            continue
        # An ordinal's number is read alone: the FSTs read 第2名 as 第两名.
        after = _AFTER.match(text, e) if s == 0 or text[s - 1] != "第" else None
        e_ctx = after.end() if after else e
        last = stretches[-1] if stretches else None
        if last and 0 <= s <= last[1] and e_ctx - last[0] <= WINDOW_CHARS:
            last[1] = e_ctx
            last[2] += 1
        else:
            stretches.append([s, e_ctx, 1])
    chars, numbers = WETEXT_BUDGET, WETEXT_NUMBERS
    windows = []
    for s, e, count in stretches:
        fst = e >= 0 and chars >= e - s and numbers >= count
        if fst:
            chars -= e - s
            numbers -= count
        windows.append((s, abs(e), fst))
    return windows


def read_chinese(text: str) -> str:
    """``text`` with its numbers read as a Mandarin-speaking caller expects."""
    text = text.translate(_FULL_WIDTH)
    if not _ANY_DIGIT.search(text) and "#" not in text and "*" not in text:
        return text
    text = _FULL_WIDTH_BETWEEN_DIGITS.sub(lambda m: _ASCII_OF[m.group(0)], text)
    text = _prepass(text)
    if not _ANY_DIGIT.search(text):
        return text
    normalizer = _wetext()
    out = []
    done = 0
    for start, end, fst in _windows(text):
        out.append(text[done:start])
        piece = text[start:end]
        if fst:
            piece = normalizer.normalize(piece)
        # What the FSTs leave as digits (no reading fits) is read digit by digit.
        out.append(_spell(piece) if _ANY_DIGIT.search(piece) else piece)
        done = end
    out.append(text[done:])
    return "".join(out)
