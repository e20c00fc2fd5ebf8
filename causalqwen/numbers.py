"""The number grammar: which spans of a text are quantities, their float32 values, and their shortest text.

A *quantity* becomes one ``<NUM>`` token with its value (decision D3); everything else, identifiers
that happen to be written with digits included, stays text. The grammar is one regular expression,
`NUMBER_REGEX`, plus three value rules; both are documented here, next to the code, with examples.
`causalqwen.tokenization` uses them to encode, and `format_number` to write numbers the model
generated. Numbers that came from a text are written back as they were written (their *surface
text* travels with the encoding), so the grammar decides only what the model reads, never what
comes back out. The exact float32 arithmetic of rule V1, and `format_number`, are `causalqwen.float32`.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import NamedTuple

import numpy as np
import regex

from .float32 import format_number, nearest_float32, nearest_float32_many, within_float32_precision

__all__ = [
    "NUMBER_REGEX",
    "NumberMatch",
    "TextPieces",
    "split_texts",
    "find_numbers",
    "find_numbers_in",
    "find_numbers_before",
    "next_cut_place",
    "last_cut_place",
    "split_numbers",
    "parse_number",
    "shown_literal",
]

# ---------------------------------------------------------------------------------------------
# The grammar
# ---------------------------------------------------------------------------------------------
#
# The regex has two alternatives, tried in this order at each position:
#
#   skip      an identifier written with digits, taken whole so that no part of it becomes a number:
#               - a UUID, 8-4-4-4-12 hex digits            "550e8400-e29b-41d4-a716-446655440000"
#               - three or more dot-separated digit runs   "3.10.2", "10.0.172.16"
#               - hex groups joined by colons, with a letter  "fe80::1ff:fe23", "12:34:56:78:9a:bc"
#               - three or more digit runs joined by the same "-", "/" or ":"
#                                                          "2024-03-15", "3/14/2024", "2:03:59",
#                                                          "138-0013-8000", "123-45-6789"
#               - a hex literal                            "0x1e10", "0XFF"
#   number    a quantity:
#     sign      optional: "-" or U+2212 "−". It is a sign only when the character before it is
#               (a) not a digit, a cased letter (Latin, Greek, Cyrillic, ...) or "_", and
#               (b) not a range dash: "digit + unit" before it and "number + the same unit"
#                   after it, the unit one or two letters or unit symbols (%, ％, ‰, ℃, ℉, °,
#                   ′, ″), as in "3月-5月", "16℃-32℃", "5%-10%", "2020年-2021年". With
#                   another word in between it stays a sign: "气温从-5到-3度", "-5℃至-10℃".
#               "+" is never a sign (it stays text; the value is the unsigned number).
#     start     the number does not continue a word: the character before it (before the sign, if
#               any) is not a digit, a cased letter, "_" or "#" (an issue number, a colour), and
#               not the dot of "digit + dot".
#               So "a1e5f9", "x2", "H2O", "mp3" keep their digits as text, while a CJK character
#               (Chinese has no spaces: "价格是99.9元") may stand right before a number.
#     integer   "0", or digits without a leading zero: 1-3 digits and groups of "," and exactly 3
#               digits ("1,000,000"), else a plain run ("2020", "1234" of "1234,567"); once taken,
#               a grouped integer is not given up for a shorter one. A run with a leading zero
#               ("007", "0013", the "03" of "2007-03-13") is an identifier: text.
#     fraction  "." and at least one digit. It may stand alone: ".05" is 0.05, but not after
#               another dot ("wait...5" holds 5, not 0.5).
#     exponent  optional: "e" or "E", an optional "+" or "-", then at least one digit.
#     end       the number is not followed by a digit, by "." and a digit, or by the rest of an
#               identifier: ASCII letters and digits to the end of the word with a digit after a
#               letter ("3e45a1c", "1Z999AA1", "9f2b7d0", "1e5g1"), or, after an unsigned
#               exponent, any hex digits ("1e5f").
#               Units follow freely: "5kg", "3eggs", "10am", "98.6F", "$5B".
#
# The value rules, applied to each match of the number alternative (a match that fails one is text):
#
#   V1  its exact decimal value x, rounded to the nearest float32 v (half to even), is finite and
#       within float32's relative precision of x: |v - x| <= 2**-24 * |x|. Rounding to a normal
#       float32 always is, so only the bottom of the range is tested: a non-zero literal that
#       rounds to 0.0, or to a subnormal further from it than that ("3e-45" would be read as
#       2.8025969e-45, 6.6% less; "1e-45" as 1.4012985e-45), is text, never an error. So "1e100",
#       "1e-50", "8e-46", "3e-45" and "1e-45" are text, "1.4012985e-45" is 2**-149.
#       format_number writes a subnormal with as many digits as this rule needs ("1.4012985e-45",
#       not the shortest unique "1e-45"), so every text it writes reads back, and it refuses a value
#       that float32 holds only this far off (``format_number(3e-45)`` is a ValueError).
#   V2  a plain digit run (no group commas, fraction or exponent) with more than 9 significant
#       digits (trailing zeros do not count) is an identifier, text: "13409860099" (a phone
#       number), "9787111213826" (an ISBN). "123456789" and "1412600000" are quantities, and so is
#       a run written with group commas ("162,881,323"); float32 holds their value to about 7
#       digits (the surface text keeps them all).
#   V3  the value is negative iff a sign was matched.
#
# Examples (| separates the pieces; numbers are shown as their float32 values):
#
#   "温度-15.5度"       ->  温度 | -15.5 | 度          a "-" after a CJK character is a sign
#   "3月-5月"           ->  3 | 月- | 5 | 月            a "-" after digit + unit is a range dash
#   "2020-2021"         ->  2020 | - | 2021
#   "−2"                ->  -2                          U+2212 is a sign
#   "x-5", "+5"         ->  x- | 5,  + | 5
#   ".05 cups"          ->  0.05 |  cups
#   "43.60元", "12:00"  ->  43.6 | 元,  12 | :00        surface text "43.60" comes back as written
#   "2024-03-15"        ->  2024-03-15                  skip: a date
#   "Python 3.10.2"     ->  Python 3.10.2               skip: a version
#   "1,000,000"         ->  1000000
#   "1,0000", "12,34"   ->  1 | ,0000,  12 | , | 34
#   "1.5e3", "5kg"      ->  1500,  5 | kg
#   "3e45a1c", "0x1e10" ->  text                        hex identifiers
#   "13409860099"       ->  text                        V2
#   "1e100"             ->  text                        V1
#
# Digits other than ASCII 0-9 (full-width "１", Arabic-Indic "٣", superscripts) are text.
#
# Linear time. `find_numbers` costs time proportional to the length of the text, whatever the text
# (`python -m benchmarks tokenizer` measures crafted ones). A match attempt starts at every position
# that could begin a match, so an attempt must never scan far unless no later attempt rescans the same
# characters. How each construct keeps to that, without changing what it matches:
#
#   - Every alternative needs a character before it that is not an ASCII letter, a digit or "_"; that
#     test comes first, so the inside of a word or a digit run costs one look back per character.
#   - Runs are taken possessively (`++`, `*+`) wherever giving back characters could never lead to a
#     match: a dotted run, a digit chain, a hex literal, a fraction, the digits of an exponent, the
#     identifier test after a number ("[A-Za-z]++[0-9][0-9A-Za-z]*+" holds iff the word after the
#     number contains a digit), the hex digits after an exponent. No nested loop is ever retried.
#   - The hex-colon lookahead looks for its letter only within the 46 characters such an address
#     can span (8 groups of 4 and 7 "::").
#   - Digit chains. A chain matches only as a whole: from a run where it may start, its runs are the
#     maximal digit runs joined by its first joint, and it matches iff there are at least 3 and its end
#     test holds. The end test is the same from any run of the chain, so once an attempt from one run
#     fails, an attempt from a later run of the same chain fails too, after scanning to the same end.
#     An attempt from the third or a later run (the text before it is "digit, joint, run, joint") is
#     therefore given up at once: the run before it was attempted and failed, or the chain would not
#     be read from here at all. One exception: the run before is the last group of a UUID (the UUID
#     took it, so nothing was attempted there); the attempt is then made in full. So every chain is
#     scanned from at most three of its runs.
#   - Grouped integers, the same way. A number that starts at a 3-digit group inside a run of
#     ",ddd" groups reads the same groups, fraction, exponent and end as one starting at an earlier
#     group; when the text before it is "digit, comma, a 3-digit group not starting with 0, any
#     ",ddd" groups, comma", that earlier group was attempted and failed, so this attempt fails at
#     once (it would take the grouped form, which cannot be given up for a shorter one).
#   - The range test of a sign scans only the digits, dots and commas right after that sign.
# No reading changed: `tests/test_numbers.py` keeps the regex as it was before these changes
# and checks, on random and on built adversarial strings, that both make exactly the same matches.

# Cutting a text. The prefix text[:i] reads exactly the numbers of the whole text that start before i
# (same spans, same values) when position i is a *cut place*: no match attempt that starts before i
# takes the character text[i], and every test that looks at it answers as it would at the end of the
# text. Which characters each construct takes after which gives the rule, on c = text[i], the character
# p before it and q before that:
#   - c is not an ASCII letter or digit, "_", ".", ",", "-", "/", ":", "+", nor a letter, mark or unit
#     symbol: a cut place (a space, most punctuation, "#", "−", "(", "，", an emoji);
#   - a letter other than ASCII, a mark or a unit symbol (a possible unit of a range): neither p nor q
#     is a digit, "." or ","  (a range's unit is read right after its digits, one or two characters);
#   - ".": p is not a digit, ".", ",", "-" or "−";   ",": p is not a digit, "." or ",";
#   - "-": p is not a hex digit;   "/": p is not a digit;   ":": p is not a hex digit or ":";
#   - "+": p is not "e" or "E";   "_": p is not an ASCII letter or digit;
#   - ASCII letters and digits never are.
# `causalqwen.tokenization` cuts long texts there (with max_length) and `find_numbers_before` reads numbers up
# to the next cut place only; a Hypothesis test checks the rule against whole texts.

_CASED = r"\p{Lu}\p{Ll}\p{Lt}"
_UNIT = r"\p{L}\p{M}%％‰℃℉°′″"
_UUID = r"[0-9a-fA-F]{8} (?: -[0-9a-fA-F]{4} ){3} -[0-9a-fA-F]{12}"
NUMBER_REGEX = regex.compile(
    rf"""
    (?= [\-\u2212.0-9a-fA-F] )  # every alternative starts with one of these: a quick test at each position
    (?<! [0-9A-Za-z_] )         # ... and none continues a word or a digit run (each tests more below)
    (?:
    (?P<skip>
        (?<! [0-9A-Za-z_\-] ) {_UUID} (?! [0-9A-Za-z_] )
      | (?<! [0-9A-Za-z_.] ) [0-9]++ (?: \.[0-9]++ ){{2,}}+ (?! [0-9] )
      | (?<! [0-9A-Za-z_:] ) (?= [0-9a-fA-F:]{{0,45}} [a-fA-F] )
            [0-9a-fA-F]{{1,4}} (?: :{{1,2}} [0-9a-fA-F]{{1,4}} ){{2,7}} (?! [0-9A-Za-z_:] )
      | (?<! [0-9A-Za-z_] ) [0-9]++ (?P<joint> [\-/:] )
            # not from the third or a later run of a chain, unless the run before ends a UUID
            (?<! [0-9] (?P=joint) [0-9]++ (?<! (?<! [0-9A-Za-z_\-] ) {_UUID} ) (?P=joint) [0-9]++ (?P=joint) )
            [0-9]++ (?: (?P=joint) [0-9]++ )++
            (?! [0-9A-Za-z_] | (?P=joint) [0-9A-Za-z] )
      | (?<! [0-9A-Za-z_] ) 0[xX][0-9a-fA-F]++
    )
  | (?P<number>
        (?<! [0-9{_CASED}_\#] | [0-9]\. )
        (?P<sign>
            (?= [\-\u2212] )
            (?! (?<= [0-9] (?P<unit> [{_UNIT}]{{1,2}} ) ) [\-\u2212] [0-9][0-9.,]*+ (?P=unit) )
            [\-\u2212] (?= \.?[0-9] ) )?
        (?:
            # not from a 3-digit group after an earlier one that would read the same grouped integer
            (?! (?<= , ) (?= [1-9][0-9]{{2}} ,[0-9]{{3}} (?: (?! [0-9] ) | ,[0-9]{{3}} ) )
                (?<= [0-9] ,[1-9][0-9]{{2}} (?: ,[0-9]{{3}} )*? , ) )
            (?P<integer> (?> [1-9][0-9]{{0,2}} (?: ,[0-9]{{3}} )+ (?! [0-9] ) | [1-9][0-9]* | 0 ) )
            (?P<fraction> \.[0-9]++ )?+
          | (?<! \. ) (?P<fraction_only> \.[0-9]++ )
        )
        (?P<exponent> [eE][+\-]?[0-9]++ )?+
        (?! [0-9] | \.[0-9] | _[0-9A-Za-z]
          | [A-Za-z]++ [0-9] [0-9A-Za-z]*+ (?! [0-9A-Za-z_] )
          | (?(exponent) (?<= [eE][0-9]++ ) [0-9a-fA-F]++ (?! [0-9A-Za-z_] ) | (?!) ) )
    )
    )
    """,
    regex.VERBOSE,
)

_CUT_PLACE_SOURCE = rf"""
    (?= [^0-9A-Za-z] ) (?<= [\s\S] )  # never an ASCII letter or digit, never the start of the text
    (?= [^_.,:/+\-{_UNIT}]
      | [{_UNIT}] (?<! [0-9.,] [{_UNIT}] | [0-9.,] [\s\S] [{_UNIT}] )
      | \. (?<! [0-9.,\-\u2212] \. )
      | ,  (?<! [0-9.,] , )
      | -  (?<! [0-9a-fA-F] - )
      | /  (?<! [0-9] / )
      | :  (?<! [0-9a-fA-F:] : )
      | \+ (?<! [eE] \+ )
      | _  (?<! [0-9A-Za-z] _ )
    )
"""
_CUT_PLACE = regex.compile(_CUT_PLACE_SOURCE, regex.VERBOSE)
_LAST_CUT_PLACE = regex.compile(_CUT_PLACE_SOURCE, regex.VERBOSE | regex.REVERSE)

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_IDENTIFIER_DIGITS = 9  # rule V2: a plain digit run with more significant digits than this is an identifier
# an unsigned literal whose digits before the exponent are all 0
_ZERO_LITERAL = re.compile(r"[0.]*+(?:[eE]|$)")
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 1.1754944e-38


class NumberMatch(NamedTuple):
    """One number found in a text: its character span ``[start, end)``, its text and value."""

    start: int
    end: int
    text: str
    value: float


class TextPieces(NamedTuple):
    """A text cut at its numbers (`split_texts`): what the tokenizer encodes, with each number's value and text."""

    text: str  # the text, or the prefix of it that is read (`split_texts` with bounds)
    runs: list[str]  # [numbers + 1]: the text before, between and after the numbers (a run may be empty)
    numbers: list[NumberMatch]  # [numbers]: each number's span, text as written and float32 value


class _NumberError(ValueError):
    """A literal that matches the grammar but has no finite, faithful float32 value (rule V1)."""


_GROUPS = ("number", "sign", "integer", "fraction", "fraction_only", "exponent")
_GROUP_INDICES = tuple(NUMBER_REGEX.groupindex[name] for name in _GROUPS)  # faster than the names
_NUMBER_GROUP = _GROUP_INDICES[0]


def _value_of_parts(sign, integer, fraction, exponent) -> float:
    """The float32 value (as a Python float) of a number of the grammar, from its groups (rules V1 and V3).

    Raises:
        _NumberError: the value overflows float32, or its float32 is further from it than float32's relative
            precision (a non-zero literal that rounds to zero or to a subnormal)."""
    literal = _unsigned_literal(integer, fraction, exponent)
    magnitude = nearest_float32(literal)
    if math.isinf(magnitude):
        raise _NumberError(f"overflows float32 (the largest finite float32 is {_FLOAT32_MAX:.8g})")
    if magnitude <= _FLOAT32_TINY:  # above it, rounding is always within float32's precision (rule V1)
        _check_underflow(literal, magnitude)
    return -magnitude if sign else magnitude


def _unsigned_literal(integer, fraction, exponent) -> str:
    """The digits of a number's groups as one literal without sign or group commas
    (``"1,000.5"`` → ``"1000.5"``)."""
    return (integer or "0").replace(",", "") + (fraction or "") + (exponent or "")


def _check_underflow(literal: str, magnitude: float) -> None:
    """Rule V1 at the bottom of float32's range: the literal is read only if its float32 ``magnitude`` is
    within float32's relative precision of it, so no non-zero literal becomes 0.0 and no subnormal changes it.
    A 0.0 is faithful only to a zero literal, told by its digits (``"0e-999999999999999999999"``: no decimal
    arithmetic on an exponent beyond any decimal context); otherwise the value is near 1e-40, and its exact
    decimal cheap."""
    if magnitude == 0.0:
        if _ZERO_LITERAL.match(literal):
            return
        raise _NumberError("is not zero but rounds to 0.0 in float32 (underflow)")
    if within_float32_precision(Decimal(literal), magnitude):
        return
    nearest = "the subnormal " if magnitude < _FLOAT32_TINY else "the smallest normal float32, "
    raise _NumberError(
        f"underflows float32's normal range (|v| < {_FLOAT32_TINY:.8g}): the nearest float32 is {nearest}"
        f"{format_number(magnitude)}, which would silently change it"
    )


def _is_identifier(integer, fraction, exponent) -> bool:
    """Rule V2: a plain digit run with more than 9 significant digits (trailing zeros do not count)."""
    if integer is None or fraction or exponent or "," in integer:
        return False
    return len(integer.rstrip("0")) > _IDENTIFIER_DIGITS


def find_numbers(text: str) -> list[NumberMatch]:
    """Every quantity in ``text``, left to right, following `NUMBER_REGEX` and its value rules.

    Spans that look numeric but are not quantities (identifiers, values outside float32) are left
    out: they are text. Nothing in a text makes this function fail, and its time is linear in the
    length of the text.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return find_numbers_before(text, len(text), len(text))


def find_numbers_before(text: str, stop: int, endpos: int) -> list[NumberMatch]:
    """The numbers of ``text[:endpos]`` that start before ``stop``: when ``endpos`` is a cut place (or
    ``len(text)``) and ``stop <= endpos``, the numbers of the whole text that start before ``stop``.

    Far from ``stop``, ``endpos`` only bounds what a match may read; positions from ``stop`` on are never
    tried: a match is tried at each place where one can start (`_MATCH_START`), as ``finditer`` would."""
    return find_numbers_in([text], [(stop, endpos)])[0]


def find_numbers_in(texts: list[str], bounds: list[tuple[int, int]] | None = None) -> list[list[NumberMatch]]:
    """``[find_numbers(text) for text in texts]`` for checked texts; with ``bounds``, one ``(stop, endpos)`` per text,
    the numbers of ``text[:endpos]`` that start before ``stop`` (`find_numbers_before`, `split_texts`)."""
    return [pieces.numbers for pieces in split_texts(texts, bounds)]


def split_texts(texts: list[str], bounds: list[tuple[int, int]] | None = None) -> list[TextPieces]:
    """Each checked text cut at its numbers, in one pass over the batch: its runs of text and its numbers (matches of
    the number alternative of `NUMBER_REGEX`, the identifiers skipped, whose value rules hold). Each distinct number
    text is valued once, for every text together (`_values_of`): its groups depend on its text alone.

    With ``bounds``, one ``(stop, endpos)`` per text: the numbers of ``text[:endpos]`` that start before ``stop``
    (`find_numbers_before`), and the prefix they cut, to ``stop`` or to the end of the last number if it is further."""
    groups_of: dict[str, tuple] = {}  # number text -> its `_GROUP_INDICES` groups
    matched: list[list[tuple[int, int, str]]] = []  # per text: (start, end, number text) of each match
    for index, text in enumerate(texts):
        stop, endpos = (len(text), len(text)) if bounds is None else bounds[index]
        found = []
        matched.append(found)
        if _ASCII_DIGIT.search(text, 0, endpos) is None:  # every number has one (a skipped identifier may not)
            continue
        if endpos - stop <= _FAR:
            matches = NUMBER_REGEX.finditer(text, 0, endpos)
        else:
            matches = _matches_before(text, stop, endpos)
        for match in matches:
            start, end = match.span()
            if start >= stop:
                break
            number = match.group(_NUMBER_GROUP)
            if number is not None:
                found.append((start, end, number))
                if number not in groups_of:
                    groups_of[number] = match.group(*_GROUP_INDICES)
    value_of = _values_of(groups_of)
    make = tuple.__new__  # a NamedTuple's own constructor costs twice as much
    numbers_of = [
        [
            make(NumberMatch, (start, end, number, value_of[number]))
            for start, end, number in found
            if value_of[number] is not None
        ]
        for found in matched
    ]
    split = []
    for index, (text, numbers) in enumerate(zip(texts, numbers_of)):
        runs, position = [], 0
        for start, end, _, _ in numbers:
            runs.append(text[position:start])
            position = end
        stop = len(text) if bounds is None else bounds[index][0]
        runs.append(text[position:stop])
        split.append(make(TextPieces, (text[: max(stop, position)], runs, numbers)))
    return split


def _values_of(groups_of: dict[str, tuple]) -> dict[str, float | None]:
    """The value of each number text (from its `_GROUP_INDICES` groups), or None where a value rule makes it text.

    Rule V1 rounds each literal to float32 (`nearest_float32_many`, all of them in one call); a value that overflows
    or reaches the bottom of float32's range is decided by the whole rule (`_value_of_groups`). Rule V2 tests only
    digit runs long enough to break it, rule V3 sets the sign.
    """
    # each literal without sign or group commas, "1,000.5" -> "1000.5" (`_unsigned_literal`, written out in this loop
    # over every distinct number)
    literals = [
        (integer or "0").replace(",", "") + (fraction or fraction_only or "") + (exponent or "")
        for _, _, integer, fraction, fraction_only, exponent in groups_of.values()
    ]
    magnitudes = nearest_float32_many(literals)
    value_of = {}
    for (number, groups), magnitude in zip(groups_of.items(), magnitudes):
        _, sign, integer, fraction, _, exponent = groups
        if not _FLOAT32_TINY < magnitude < math.inf:  # rule V1's rare cases, decided one by one
            value_of[number] = _value_of_groups(groups)
        elif len(integer or "") > _IDENTIFIER_DIGITS and _is_identifier(integer, fraction, exponent):
            value_of[number] = None
        else:
            value_of[number] = -magnitude if sign else magnitude
    return value_of


_ASCII_DIGIT = re.compile("[0-9]")
_FAR = 4096  # characters between stop and endpos above which find_numbers_before tries matches one by one
# Where a match of NUMBER_REGEX can start: its first two tests (it tests more after them).
_MATCH_START = regex.compile(r"(?= [\-\u2212.0-9a-fA-F] ) (?<! [0-9A-Za-z_] )", regex.VERBOSE)


def _matches_before(text: str, stop: int, endpos: int):
    """The matches of ``NUMBER_REGEX.finditer(text, 0, endpos)`` starting before ``stop``, none tried from
    ``stop`` on."""
    position = 0
    while (place := _MATCH_START.search(text, position, stop)) is not None:
        match = NUMBER_REGEX.match(text, place.start(), endpos)
        if match is None:
            position = place.start() + 1
        else:
            yield match
            position = match.end()


def _value_of_groups(groups: tuple) -> float | None:
    """The value of a number match, from its `_GROUP_INDICES` groups, or None if a value rule makes it
    text."""
    _, sign, integer, fraction, fraction_only, exponent = groups
    try:
        value = _value_of_parts(sign, integer, fraction or fraction_only, exponent)
    except _NumberError:
        return None
    return None if _is_identifier(integer, fraction, exponent) else value


def next_cut_place(text: str, start: int) -> int:
    """The first cut place at or after ``start`` (see "Cutting a text" above), or ``len(text)``."""
    match = _CUT_PLACE.search(text, start)
    return match.start() if match is not None else len(text)


def last_cut_place(text: str, low: int, high: int) -> int | None:
    """The last cut place in ``[low, high]``, or None."""
    match = _LAST_CUT_PLACE.search(text, low, high + 1)
    return match.start() if match is not None else None


def split_numbers(text: str) -> list[tuple[str, str | float]]:
    """Split ``text`` into pieces ``("text", str)`` and ``("number", value)``, in order. Text pieces are never
    empty, and joining the text pieces with the original number literals gives back ``text``."""
    pieces: list[tuple[str, str | float]] = []
    (split,) = split_texts([text])
    for run, number in zip(split.runs, split.numbers + [None]):
        if run:
            pieces.append(("text", run))
        if number is not None:
            pieces.append(("number", number.value))
    return pieces


def parse_number(literal: str) -> float:
    """The float32 value (as a Python float) of a single number literal.

    The whole of ``literal`` must be one quantity of the grammar of `NUMBER_REGEX`, for example ``"-15.5"``,
    ``"−2"``, ``".5"``, ``"1,000,000"``, ``"2E-2"`` or ``"1e+30"``.

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not exactly one number; its value overflows float32, underflows to zero or
            to an unfaithful subnormal; or it is a digit run float32 cannot hold (an identifier).
    """
    if not isinstance(literal, str):
        raise TypeError(f"literal must be a str, got {type(literal).__name__}")
    match = NUMBER_REGEX.fullmatch(literal)
    if match is None or match.group("number") is None:
        raise ValueError(f"{shown_literal(literal)} is not a single number of the numeric grammar")
    _, sign, integer, fraction, fraction_only, exponent = match.group(*_GROUPS)
    try:
        value = _value_of_parts(sign, integer, fraction or fraction_only, exponent)
    except _NumberError as error:
        raise ValueError(f"number {shown_literal(literal)} {error}") from None
    if _is_identifier(integer, fraction, exponent):
        raise ValueError(
            f"{shown_literal(literal)} has more than {_IDENTIFIER_DIGITS} significant digits "
            f"(float32 would read it as {format_number(value)}): the grammar takes it for an identifier, "
            "not a quantity"
        )
    return value


def shown_literal(literal: str) -> str:
    """A literal as a message names it: its repr, or for more than 40 characters its two ends around their
    count (``'1000000000000000'...'000000000000' (5003 characters)``)."""
    if len(literal) <= 40:
        return repr(literal)
    return f"{literal[:16]!r}...{literal[-12:]!r} ({len(literal)} characters)"
