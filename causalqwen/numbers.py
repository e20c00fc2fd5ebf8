"""The number grammar: which spans of a text are quantities, their float32 values, and their shortest text.

A *quantity* becomes one ``<NUM>`` token with its value (decision D3); everything else, identifiers
that happen to be written with digits included, stays text. The grammar is one regular expression,
`NUMBER_REGEX`, plus three value rules; both are documented here, next to the code, with examples.
`causalqwen.tokenization` uses them to encode, and `format_number` to write numbers the model
generated. Numbers that came from a text are written back as they were written (their *surface
text* travels with the encoding), so the grammar decides only what the model reads, never what
comes back out.
"""

from __future__ import annotations

import math
import numbers
import struct
from decimal import Decimal
from typing import NamedTuple

import numpy as np
import regex

__all__ = ["NUMBER_REGEX", "NumberMatch", "find_numbers", "split_numbers", "parse_number", "format_number", "join_numbers"]

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
#   V1  its exact decimal value, rounded to the nearest float32 (half to even), is finite, is not
#       0.0 for a non-zero literal, and, if subnormal, is as close as a normal float32 would be
#       (or the literal is the shortest text of that subnormal, as decode writes it).
#       So "1e100", "1e-50" and "8e-46" are text, never an error.
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

_CASED = r"\p{Lu}\p{Ll}\p{Lt}"
_UNIT = r"\p{L}\p{M}%％‰℃℉°′″"
NUMBER_REGEX = regex.compile(
    rf"""
    (?= [\-\u2212.0-9a-fA-F] )  # every alternative starts with one of these: a quick test at each position
    (?:
    (?P<skip>
        (?<! [0-9A-Za-z_\-] ) [0-9a-fA-F]{{8}} (?: -[0-9a-fA-F]{{4}} ){{3}} -[0-9a-fA-F]{{12}} (?! [0-9A-Za-z_] )
      | (?<! [0-9A-Za-z_.] ) [0-9]+ (?: \.[0-9]+ ){{2,}} (?! [0-9] )
      | (?<! [0-9A-Za-z_:] ) (?= [0-9a-fA-F:]* [a-fA-F] ) [0-9a-fA-F]{{1,4}} (?: :{{1,2}} [0-9a-fA-F]{{1,4}} ){{2,7}}
            (?! [0-9A-Za-z_:] )
      | (?<! [0-9A-Za-z_] ) [0-9]+ (?: (?P<joint> [\-/:] ) [0-9]+ ) (?: (?P=joint) [0-9]+ )+
            (?! [0-9A-Za-z_] | (?P=joint) [0-9A-Za-z] )
      | (?<! [0-9A-Za-z_] ) 0[xX][0-9a-fA-F]+
    )
  | (?P<number>
        (?<! [0-9{_CASED}_\#] | [0-9]\. )
        (?P<sign>
            (?! (?<= [0-9] (?P<unit> [{_UNIT}]{{1,2}} ) ) [\-\u2212] [0-9][0-9.,]* (?P=unit) )
            [\-\u2212] (?= \.?[0-9] ) )?
        (?:
            (?P<integer> (?> [1-9][0-9]{{0,2}} (?: ,[0-9]{{3}} )+ (?! [0-9] ) | [1-9][0-9]* | 0 ) )
            (?P<fraction> \.[0-9]+ )?
          | (?<! \. ) (?P<fraction_only> \.[0-9]+ )
        )
        (?P<exponent> [eE][+\-]?[0-9]+ )?
        (?! [0-9] | \.[0-9]
          | [A-Za-z][0-9A-Za-z]*?[0-9][0-9A-Za-z]* (?! [0-9A-Za-z_] )
          | (?(exponent) (?<= [eE][0-9]+ ) [0-9a-fA-F]+ (?! [0-9A-Za-z_] ) | (?!) ) )
    )
    )
    """,
    regex.VERBOSE,
)

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_IDENTIFIER_DIGITS = 9  # rule V2: a plain digit run with more significant digits than this is an identifier
_OVERFLOW_THRESHOLD = 2.0**128 - 2.0**103  # halfway between the largest float32 and 2**128
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 1.1754944e-38
# format_number writes zero and values with _POSITIONAL_LOWER <= |v| < _POSITIONAL_UPPER
# positionally, all others in scientific notation (numpy's bounds for float64 scalars).
_POSITIONAL_LOWER = 1e-4
_POSITIONAL_UPPER = 1e16


class NumberMatch(NamedTuple):
    """One number found in a text: its character span ``[start, end)``, its text and value."""

    start: int
    end: int
    text: str
    value: float


class _NumberError(ValueError):
    """A literal that matches the grammar but has no finite, faithful float32 value (rule V1)."""


_FLOAT32 = struct.Struct("<f")
_GROUPS = ("number", "sign", "integer", "fraction", "fraction_only", "exponent")


def _round_decimal_to_float32(magnitude: str) -> float:
    """Round a non-negative decimal literal (digits, optional fraction and exponent) to float32.

    The result is the correctly rounded float32 value (round half to even), returned as a Python
    float; it is ``inf`` when the literal is too large for float32.

    Python's ``float`` rounds the literal correctly to float64, and the C cast to float (``struct``'s
    ``"f"`` format) rounds that float64 to float32, half to even. Rounding twice can only go wrong when
    the float64 lands exactly on the midpoint between two neighbouring float32 values although the
    literal itself is not on it. A midpoint has at most 25 significant bits, so only such a float64 is
    settled the slow way (`_round_at_float32_midpoint`).
    """
    as_double = float(magnitude)
    try:
        (as_single,) = _FLOAT32.unpack(_FLOAT32.pack(as_double))
    except OverflowError:  # rounds beyond the largest float32, unless it sits exactly on the threshold
        return _round_at_float32_midpoint(magnitude, as_double) if as_double == _OVERFLOW_THRESHOLD else math.inf
    if as_single == as_double or not (math.frexp(as_double)[0] * 2**25).is_integer():
        return as_single
    return _round_at_float32_midpoint(magnitude, as_double)


def _round_at_float32_midpoint(magnitude: str, as_double: float) -> float:
    """The float32 nearest to the literal when its float64 may sit exactly between two float32 values:
    the exact decimal value is compared with that midpoint."""
    with np.errstate(over="ignore"):
        as_single = np.float32(as_double)
        # The two float32 values around as_double; an infinite upper neighbour stands for 2**128,
        # where the next float32 would be if the exponent range went on.
        if float(as_single) > as_double:
            upper, lower = as_single, np.nextafter(as_single, np.float32(0))
        else:
            lower, upper = as_single, np.nextafter(as_single, np.float32(np.inf))
    upper_value = float(upper) if np.isfinite(upper) else 2.0**128
    midpoint = (float(lower) + upper_value) / 2  # exact: both are float32 values
    if as_double != midpoint:
        return float(as_single)
    exact = Decimal(magnitude)
    if exact < Decimal(midpoint):
        return float(lower)
    if exact > Decimal(midpoint):
        return float(upper)
    return float(as_single)  # a true tie: numpy already rounded half to even


def _value_of_parts(sign, integer, fraction, exponent) -> float:
    """The float32 value (as a Python float) of a number of the grammar, from its groups (rules V1 and V3).

    Raises:
        _NumberError: the value overflows float32, a non-zero literal rounds to zero, or a subnormal
            float32 would change it beyond float32's usual precision.
    """
    mantissa = (integer or "0").replace(",", "") + (fraction or "")
    literal = mantissa + (exponent or "")
    magnitude = _round_decimal_to_float32(literal)
    if math.isinf(magnitude):
        raise _NumberError(f"overflows float32 (the largest finite float32 is {_FLOAT32_MAX:.8g})")
    if magnitude < _FLOAT32_TINY:
        _check_underflow(literal, mantissa, magnitude)
    return -magnitude if sign else magnitude


def _check_underflow(literal: str, mantissa: str, magnitude: float) -> None:
    """Rule V1 below float32's normal range: no non-zero literal becomes 0.0, and a subnormal is taken only
    if it holds the literal as closely as a normal float32 would, or the literal is its shortest text."""
    if magnitude == 0.0:
        if any(digit in "123456789" for digit in mantissa):
            raise _NumberError("is not zero but rounds to 0.0 in float32 (underflow)")
        return
    exact = Decimal(literal)
    faithful = abs(Decimal(magnitude) - exact) <= exact * Decimal(2) ** -24
    if not (faithful or Decimal(format_number(magnitude)) == exact):
        raise _NumberError(
            f"underflows float32's normal range (|v| < {_FLOAT32_TINY:.8g}): the nearest float32 is the "
            f"subnormal {format_number(magnitude)}, which would silently change it"
        )


def _is_identifier(integer, fraction, exponent) -> bool:
    """Rule V2: a plain digit run with more than 9 significant digits (trailing zeros do not count)."""
    if integer is None or fraction or exponent or "," in integer:
        return False
    return len(integer.rstrip("0")) > _IDENTIFIER_DIGITS


def find_numbers(text: str) -> list[NumberMatch]:
    """Every quantity in ``text``, left to right, following `NUMBER_REGEX` and its value rules.

    Spans that look numeric but are not quantities (identifiers, values outside float32) are left
    out: they are text. Nothing in a text makes this function fail.

    Raises:
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    found = []
    for match in NUMBER_REGEX.finditer(text):
        number, sign, integer, fraction, fraction_only, exponent = match.group(*_GROUPS)
        if number is None:
            continue
        try:
            value = _value_of_parts(sign, integer, fraction or fraction_only, exponent)
        except _NumberError:
            continue
        if not _is_identifier(integer, fraction, exponent):
            start, end = match.span()
            found.append(NumberMatch(start, end, number, value))
    return found


def split_numbers(text: str) -> list[tuple[str, str | float]]:
    """Split ``text`` into pieces ``("text", str)`` and ``("number", value)``, in order.

    Text pieces are never empty, and joining the text pieces with the original number literals
    gives back ``text``.
    """
    pieces: list[tuple[str, str | float]] = []
    position = 0
    for number in find_numbers(text):
        if number.start > position:
            pieces.append(("text", text[position : number.start]))
        pieces.append(("number", number.value))
        position = number.end
    if position < len(text):
        pieces.append(("text", text[position:]))
    return pieces


def join_numbers(pieces: list[tuple[str, bool]]) -> str:
    """Concatenate ``(text, is_number)`` pieces so that every number piece reads back as itself.

    Concatenated, a number can run into its neighbours: "0.88" and "-0.24" read as 0.88, a dash and
    0.24; "found" and "5" as the identifier "found5"; "0" and "xe" as the hex literal "0xe". Such a
    number gets a space before it, and if that is not enough, a space after it too: between spaces,
    every output of `format_number` and every number as written in a text reads as itself. Pieces
    that came from one text, unchanged, already read back: they are joined as they are.
    """
    numbers_at = [index for index, (_, is_number) in enumerate(pieces) if is_number]
    spaces = dict.fromkeys(numbers_at, 0)
    for _ in range(3):
        parts, spans, length = [], {}, 0
        for index, (text, _) in enumerate(pieces):
            before = " " if spaces.get(index, 0) >= 1 else ""
            after = " " if spaces.get(index, 0) >= 2 else ""
            spans[index] = (length + len(before), length + len(before) + len(text))
            parts += [before, text, after]
            length += len(before) + len(text) + len(after)
        joined = "".join(parts)
        if not numbers_at:
            return joined
        read = {(number.start, number.end) for number in find_numbers(joined)}
        wrong = [index for index in numbers_at if spans[index] not in read]
        if not wrong:
            return joined
        for index in wrong:
            spaces[index] += 1
    raise RuntimeError(f"a number does not read back even between spaces: {joined!r}")


def parse_number(literal: str) -> float:
    """The float32 value (as a Python float) of a single number literal.

    The whole of ``literal`` must be one quantity of the grammar of `NUMBER_REGEX`, for example
    ``"-15.5"``, ``"−2"``, ``".5"``, ``"1,000,000"``, ``"2E-2"`` or ``"1e+30"``.

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not exactly one number; its value overflows float32, underflows to
            zero or to an unfaithful subnormal; or it is a digit run float32 cannot hold (an identifier).
    """
    if not isinstance(literal, str):
        raise TypeError(f"literal must be a str, got {type(literal).__name__}")
    match = NUMBER_REGEX.fullmatch(literal)
    if match is None or match.group("number") is None:
        raise ValueError(f"{literal!r} is not a single number of the numeric grammar")
    _, sign, integer, fraction, fraction_only, exponent = match.group(*_GROUPS)
    try:
        value = _value_of_parts(sign, integer, fraction or fraction_only, exponent)
    except _NumberError as error:
        raise ValueError(f"number {literal!r} {error}") from None
    if _is_identifier(integer, fraction, exponent):
        raise ValueError(
            f"{literal!r} has more than {_IDENTIFIER_DIGITS} significant digits (float32 would read it as "
            f"{format_number(value)}): the grammar takes it for an identifier, not a quantity"
        )
    return value


def format_number(value) -> str:
    """The shortest decimal text that rounds back to the float32 value of ``value``.

    ``value`` is first rounded to float32, giving v. When v is zero or ``1e-4 <= |v| < 1e16``
    (compared exactly, in float64) it is written positionally, otherwise in scientific notation.
    The digits are numpy's shortest unique digits for float32 (so they are the same decimal
    number as ``str(np.float32(v))``), and no trailing ``.0`` is kept. The bounds are the ones
    numpy uses for float64 scalars; numpy itself switches float32 scalars to scientific notation
    from 1e6 on, which this function does not::

        99.9 -> "99.9"    5.0 -> "5"    -0.0 -> "-0"    1e30 -> "1e+30"    1e-5 -> "1e-05"

    Note that float32(1e-4) is slightly below 1e-4, so it is written ``"1e-04"``.

    Every output is accepted by `parse_number` and gives back the same float32 value.

    Raises:
        TypeError: ``value`` is not a real number (bools are rejected too).
        ValueError: ``value`` is NaN or infinite, or overflows float32.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    try:
        as_float = float(value)
    except OverflowError:  # a Python int beyond the float64 range
        raise ValueError(f"cannot format {value!r}: it overflows float32") from None
    if not math.isfinite(as_float):
        raise ValueError(f"cannot format {value!r}: the numeric grammar has no NaN or infinity")
    with np.errstate(over="ignore"):
        single = np.float32(value)
    if not np.isfinite(single):
        raise ValueError(f"cannot format {value!r}: it overflows float32")
    magnitude = abs(float(single))
    if magnitude == 0.0 or _POSITIONAL_LOWER <= magnitude < _POSITIONAL_UPPER:
        return np.format_float_positional(single, unique=True, trim="-")
    return np.format_float_scientific(single, unique=True, trim="-")
