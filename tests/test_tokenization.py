"""Executable specification of numeric-aware tokenization (causalqwen.tokenization).

The expected values in these tests come from hand-written tables, from exact rational
arithmetic (``fractions.Fraction``), from numpy's own float32 printing, or from the wrapped Hugging
Face tokenizer itself -- never from the code under test.
"""

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from causalqwen.tiny import build_tiny_tokenizer
from causalqwen.tokenization import (
    NumericTokenizer,
    find_numbers,
    format_number,
    parse_number,
    split_numbers,
)


def f32(x: float) -> float:
    """The float32 rounding of ``x``, as a Python float (``inf`` beyond the float32 range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def bits(x: float) -> int:
    """The float32 bit pattern of ``x`` (so that 0.0 and -0.0 differ)."""
    return int(np.array(x, dtype=np.float32).view(np.uint32))


@pytest.fixture(scope="module")
def base_tokenizer():
    """A tiny Qwen2 tokenizer that is never wrapped, to compare against."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def tokenizer():
    """A NumericTokenizer around its own tiny Qwen2 tokenizer."""
    return NumericTokenizer(build_tiny_tokenizer())


# ---------------------------------------------------------------------------------------------
# The number grammar
# ---------------------------------------------------------------------------------------------

T, N = "text", "number"

GRAMMAR_TABLE = [
    # sign: "-" or U+2212, unless right after a digit, a cased letter, or a digit and a short unit
    ("温度-15.5度", [(T, "温度"), (N, -15.5), (T, "度")]),
    ("2020-2021", [(N, 2020.0), (T, "-"), (N, 2021.0)]),
    ("x-5", [(T, "x-"), (N, 5.0)]),
    ("X-5", [(T, "X-"), (N, 5.0)]),
    ("Ω-5", [(T, "Ω-"), (N, 5.0)]),  # Greek capital letter: cased
    ("ж-5", [(T, "ж-"), (N, 5.0)]),  # Cyrillic small letter: cased
    ("ǅ-5", [(T, "ǅ-"), (N, 5.0)]),  # a titlecase letter (Lt)
    ("-3", [(N, -3.0)]),
    ("a -3", [(T, "a "), (N, -3.0)]),
    ("(-5)", [(T, "("), (N, -5.0), (T, ")")]),
    ("=-2.5", [(T, "="), (N, -2.5)]),
    ("--5", [(T, "-"), (N, -5.0)]),
    ("5--3", [(N, 5.0), (T, "-"), (N, -3.0)]),
    ("−5", [(N, -5.0)]),  # U+2212 MINUS SIGN is a sign
    ("3−5", [(N, 3.0), (T, "−"), (N, 5.0)]),  # ... under the same rule as "-"
    ("+5", [(T, "+"), (N, 5.0)]),
    ("1+-2", [(N, 1.0), (T, "+"), (N, -2.0)]),
    # ranges: a "-" after a digit and a unit of one or two letters or unit symbols
    ("3月-5月", [(N, 3.0), (T, "月-"), (N, 5.0), (T, "月")]),
    ("气温从-5到-3度", [(T, "气温从"), (N, -5.0), (T, "到"), (N, -3.0), (T, "度")]),  # no repeated unit: a sign
    ("-5℃至-10℃", [(N, -5.0), (T, "℃至"), (N, -10.0), (T, "℃")]),
    ("增长-5%至-3%", [(T, "增长"), (N, -5.0), (T, "%至"), (N, -3.0), (T, "%")]),
    ("16℃-32℃", [(N, 16.0), (T, "℃-"), (N, 32.0), (T, "℃")]),
    ("5%-10%", [(N, 5.0), (T, "%-"), (N, 10.0), (T, "%")]),
    ("5％-10％", [(N, 5.0), (T, "％-"), (N, 10.0), (T, "％")]),
    ("2020年-2021年", [(N, 2020.0), (T, "年-"), (N, 2021.0), (T, "年")]),
    ("3公里-5公里", [(N, 3.0), (T, "公里-"), (N, 5.0), (T, "公里")]),
    ("3 月-5", [(N, 3.0), (T, " 月"), (N, -5.0)]),  # a space ends the unit: a sign again
    ("气温零下-3度", [(T, "气温零下"), (N, -3.0), (T, "度")]),
    # exponent
    ("1.5e3", [(N, 1500.0)]),
    ("2E-2", [(N, f32(0.02))]),
    ("1e+30", [(N, f32(1e30))]),
    ("6.02e23 atoms", [(N, f32(6.02e23)), (T, " atoms")]),
    ("3eggs", [(N, 3.0), (T, "eggs")]),
    ("3e", [(N, 3.0), (T, "e")]),
    ("3e-x", [(N, 3.0), (T, "e-x")]),
    # fraction
    ("5.", [(N, 5.0), (T, ".")]),
    (".5", [(N, 0.5)]),
    (".05 cups", [(N, f32(0.05)), (T, " cups")]),
    ("wait...5 minutes", [(T, "wait..."), (N, 5.0), (T, " minutes")]),  # an ellipsis is not a decimal point
    ("1...3", [(N, 1.0), (T, "..."), (N, 3.0)]),
    ("-.5", [(N, -0.5)]),
    ("No.5", [(T, "No."), (N, 5.0)]),
    ("43.60元", [(N, f32(43.6)), (T, "元")]),
    # dotted runs: versions and addresses are text
    ("1.2.3", [(T, "1.2.3")]),
    ("Python 3.10.2", [(T, "Python 3.10.2")]),
    ("10.0.172.16", [(T, "10.0.172.16")]),
    ("Python 3.10", [(T, "Python "), (N, f32(3.1))]),
    # group commas
    ("1,000,000", [(N, 1000000.0)]),
    ("1,234.5", [(N, 1234.5)]),
    ("12,345", [(N, 12345.0)]),
    ("162,881,323", [(N, f32(162881323))]),  # a grouped count: a quantity, rounded to float32
    ("1,00", [(N, 1.0), (T, ",00")]),
    ("1,0000", [(N, 1.0), (T, ",0000")]),
    ("1234,567", [(N, 1234.0), (T, ","), (N, 567.0)]),
    ("1,000,0000", [(N, 1000.0), (T, ",0000")]),
    ("1, 000", [(N, 1.0), (T, ", 000")]),
    ("1,2,3", [(N, 1.0), (T, ","), (N, 2.0), (T, ","), (N, 3.0)]),
    ("-1,500.25", [(N, -1500.25)]),
    # leading zeros: identifiers
    ("0", [(N, 0.0)]),
    ("-0", [(N, -0.0)]),
    ("0.5", [(N, 0.5)]),
    ("007", [(T, "007")]),
    ("$007", [(T, "$007")]),
    ("12:00", [(N, 12.0), (T, ":00")]),
    # digit runs joined three times or more by the same "-", "/" or ":": dates, times, phone numbers
    ("2007-03-13", [(T, "2007-03-13")]),
    ("3/14/2024", [(T, "3/14/2024")]),
    ("2:03:59", [(T, "2:03:59")]),
    ("138-0013-8000", [(T, "138-0013-8000")]),
    ("123-45-6789", [(T, "123-45-6789")]),
    ("1/4 cup", [(N, 1.0), (T, "/"), (N, 4.0), (T, " cup")]),
    ("2020-2021-x", [(N, 2020.0), (T, "-"), (N, 2021.0), (T, "-x")]),
    # hex groups with colons: IPv6 and MAC addresses
    ("fe80::1ff:fe23:4567:890a", [(T, "fe80::1ff:fe23:4567:890a")]),
    ("12:34:56:78:9a:bc", [(T, "12:34:56:78:9a:bc")]),
    # more digits than float32 holds, or outside its range: text (rules V1, V2)
    ("13409860099", [(T, "13409860099")]),
    ("ISBN 9787111213826", [(T, "ISBN 9787111213826")]),
    ("16777217", [(N, 16777216.0)]),  # 2**24 + 1: a quantity; float32 holds it as 16777216
    ("123456789", [(N, f32(123456789))]),  # 9 significant digits: a quantity
    ("1234567891", [(T, "1234567891")]),  # 10: an identifier (rule V2)
    ("1412600000", [(N, 1412600000.0)]),  # trailing zeros do not count
    ("1e100", [(T, "1e100")]),
    ("1e39 and 2", [(T, "1e39 and "), (N, 2.0)]),
    ("1e-50", [(T, "1e-50")]),
    ("8e-46", [(T, "8e-46")]),
    # words and hex identifiers stay text; units follow freely
    ("H2O", [(T, "H2O")]),
    ("mp3", [(T, "mp3")]),
    ("Qwen2.5", [(T, "Qwen2.5")]),
    ("COVID-19", [(T, "COVID-"), (N, 19.0)]),
    ("a1e5f9", [(T, "a1e5f9")]),
    ("#1e90ff", [(T, "#1e90ff")]),
    ("#333333", [(T, "#333333")]),
    ("bug #4521", [(T, "bug #4521")]),
    ("1e5g1", [(T, "1e5g1")]),
    ("commit 3e45a1c", [(T, "commit 3e45a1c")]),
    ("0x1e10", [(T, "0x1e10")]),
    ("1e5f", [(T, "1e5f")]),
    ("550e8400-e29b-41d4-a716-446655440000", [(T, "550e8400-e29b-41d4-a716-446655440000")]),
    ("5kg", [(N, 5.0), (T, "kg")]),
    ("10am", [(N, 10.0), (T, "am")]),
    ("98.6F", [(N, f32(98.6)), (T, "F")]),
    ("$5B", [(T, "$"), (N, 5.0), (T, "B")]),
    ("2x3", [(T, "2x3")]),  # letters then a digit to the end of the word: an identifier
    ("1Z999AA10123456784", [(T, "1Z999AA10123456784")]),
    ("9f2b7d0", [(T, "9f2b7d0")]),
    ("room 4B", [(T, "room "), (N, 4.0), (T, "B")]),
    # sentences
    ("In 2020-2021 sales grew by 12.5%.", [(T, "In "), (N, 2020.0), (T, "-"), (N, 2021.0),
                                          (T, " sales grew by "), (N, 12.5), (T, "%.")]),
    ("The price is 99.9 yuan.", [(T, "The price is "), (N, f32(99.9)), (T, " yuan.")]),
    ("价格是99.9元", [(T, "价格是"), (N, f32(99.9)), (T, "元")]),
    # no numbers
    ("", []),
    ("no numbers here", [(T, "no numbers here")]),
    ("１２３ ٣ ²", [(T, "１２３ ٣ ²")]),  # only ASCII digits count
]


@pytest.mark.parametrize("text, expected", GRAMMAR_TABLE)
def test_grammar_table(text, expected):
    pieces = split_numbers(text)
    assert [kind for kind, _ in pieces] == [kind for kind, _ in expected]
    for (kind, got), (_, want) in zip(pieces, expected):
        if kind == T:
            assert got == want
        else:
            assert bits(got) == bits(want), (got, want)


@pytest.mark.parametrize("text, expected", GRAMMAR_TABLE)
def test_grammar_table_through_encode(tokenizer, text, expected):
    ids, values = tokenizer.encode(text)
    assert len(ids) == len(values)
    number_positions = [i for i, token_id in enumerate(ids) if token_id == tokenizer.num_token_id]
    expected_numbers = [want for kind, want in expected if kind == N]
    assert [bits(values[i]) for i in number_positions] == [bits(v) for v in expected_numbers]
    assert all(values[i] == 0.0 for i in range(len(ids)) if i not in number_positions)
    assert all(type(value) is float for value in values)


def test_find_numbers_spans():
    text = "温度-15.5度, 1,000 and 2E-2"
    found = find_numbers(text)
    assert [(m.start, m.end, m.text) for m in found] == [(2, 7, "-15.5"), (10, 15, "1,000"), (20, 24, "2E-2")]
    for match in found:
        assert text[match.start : match.end] == match.text


def test_price_example_position(tokenizer, base_tokenizer):
    """价格是99.9元: the <NUM> id sits exactly between the tokens of 价格是 and of 元."""
    ids, values = tokenizer.encode("价格是99.9元")
    before = base_tokenizer("价格是", add_special_tokens=False)["input_ids"]
    after = base_tokenizer("元", add_special_tokens=False)["input_ids"]
    assert ids == before + [tokenizer.num_token_id] + after
    assert values == [0.0] * len(before) + [f32(99.9)] + [0.0] * len(after)


@pytest.mark.parametrize(
    "literal, expected",
    [
        ("0", 0.0),
        ("-0", -0.0),
        ("99.9", f32(99.9)),
        ("-15.5", -15.5),
        ("1,000,000", 1e6),
        ("2E-2", f32(0.02)),
        ("1e+30", f32(1e30)),
        ("3.4028235e38", float(np.finfo(np.float32).max)),
        # a subnormal is read only when written within float32's relative precision 2**-24 of it (rule V1)
        ("1.4012985e-45", float(np.finfo(np.float32).smallest_subnormal)),
        ("1.1754942e-38", f32(np.nextafter(np.float32(np.finfo(np.float32).tiny), np.float32(0)))),
        # exactly halfway between 1 and the next float32: ties go to the even one, 1.0
        ("1.000000059604644775390625", 1.0),
        # just above / below that midpoint; float64 cannot tell these apart from the midpoint
        ("1.00000005960464477539062500001", f32(np.nextafter(np.float32(1), np.float32(2)))),
        ("1.00000005960464477539062499999", 1.0),
        # just below the float32 overflow threshold 2**128 - 2**103
        ("340282356779733661637539395458142568447.0", float(np.finfo(np.float32).max)),
        (".5", 0.5),
        ("−2", -2.0),
        ("162,881,323", f32(162881323)),
    ],
)
def test_parse_number_values(literal, expected):
    assert bits(parse_number(literal)) == bits(expected)


def _float32_nearest(exact: Fraction) -> float:
    """Oracle: the float32 nearest to ``exact`` (ties to even), by exact rational arithmetic."""
    with np.errstate(over="ignore"):
        guess = np.float32(float(exact))
        candidates = {guess, np.nextafter(guess, np.float32(-np.inf)), np.nextafter(guess, np.float32(np.inf))}
    candidates = [c for c in candidates if np.isfinite(c)]

    def key(c):
        return (abs(Fraction(float(c)) - exact), bits(float(c)) & 1)

    return float(min(candidates, key=key))


@given(
    integer=st.integers(0, 10**12).map(str),
    fraction=st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=25).map(lambda d: "." + d)),
    exponent=st.one_of(st.just(""), st.integers(-40, 30).map(lambda e: f"e{e:+d}")),
)
def test_parse_number_rounds_correctly(integer, fraction, exponent):
    literal = integer + fraction + exponent
    exact = Fraction(Decimal(literal))
    if exact != 0 and (exact < Fraction(1, 10**44) or exact > Fraction(3 * 10**38)):
        return  # outside float32's range; the error cases are tested separately
    expected = _float32_nearest(exact)
    # rule V1: the float32 must be within float32's relative precision 2**-24 of the literal
    unfaithful = abs(Fraction(expected) - exact) > exact * Fraction(1, 2**24)
    if unfaithful:  # rounds to zero, or to a subnormal that changes it
        with pytest.raises(ValueError, match="underflow"):
            parse_number(literal)
    elif not fraction and not exponent and len(integer.rstrip("0")) > 9:
        with pytest.raises(ValueError, match="identifier"):  # more than 9 significant digits (rule V2)
            parse_number(literal)
    else:
        assert bits(parse_number(literal)) == bits(expected)


@pytest.mark.parametrize("literal", ["5.", "+5", " 5", "5 ", "1,00", "x", "", "1e", "--5", "5-", "007", "3.10.2", "1e5f",
                                     "0x10", "5kg"])
def test_parse_number_rejects_non_numbers(literal):
    with pytest.raises(ValueError, match="not a single number"):
        parse_number(literal)


def test_parse_number_rejects_non_str():
    with pytest.raises(TypeError, match="str"):
        parse_number(5)


# ---------------------------------------------------------------------------------------------
# format_number
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (99.9, "99.9"),
        (5.0, "5"),
        (0.0, "0"),
        (-0.0, "-0"),
        (-15.5, "-15.5"),
        (1e30, "1e+30"),
        (1e-5, "1e-05"),
        (1e16, "1e+16"),
        (1e15, "1000000000000000"),
        (1234567.0, "1234567"),  # numpy would write float32 1234567 as "1.234567e+06"
        (0.00011, "0.00011"),
        (1e-4, "1e-04"),  # float32(1e-4) is a little below 1e-4
        (2020, "2020"),
        (np.float32(0.1), "0.1"),
        (np.int64(3), "3"),
        (float(np.finfo(np.float32).max), "3.4028235e+38"),
        (-1.5e-7, "-1.5e-07"),
    ],
)
def test_format_number_table(value, expected):
    assert format_number(value) == expected


@pytest.mark.parametrize(
    "value, error, match",
    [
        (float("nan"), ValueError, "NaN"),
        (float("inf"), ValueError, "infinity"),
        (1e39, ValueError, "overflows float32"),
        (10**400, ValueError, "overflows float32"),
        (1e-50, ValueError, r"cannot format 1e-50: it is not zero but underflows float32 \(it rounds to 0\)"),
        (-1e-46, ValueError, r"cannot format -1e-46: it is not zero but underflows float32"),
        (3e-45, ValueError, r"cannot format 3e-45: float32 holds it only as the subnormal 2\.802597e-45, off by 0\.066"),
        (1e-40, ValueError, r"cannot format 1e-40: float32 holds it only as the subnormal 9\.999946e-41, off by 5\.4e-06"),
        (True, TypeError, "real number"),
        ("5", TypeError, "real number"),
        (None, TypeError, "real number"),
    ],
)
def test_format_number_bad_input(value, error, match):
    with pytest.raises(error, match=match):
        format_number(value)


def _significant_digits(literal: str) -> int:
    """Number of significant decimal digits written in ``literal``."""
    mantissa = literal.lstrip("-").split("e")[0].replace(".", "")
    return max(1, len(mantissa.strip("0")))


def _shortest_digit_count(value: float) -> int:
    """Oracle: the fewest significant digits of a decimal that rounds to float32 ``value``.

    For each digit count n, the only candidates are the n-digit decimals just below and just
    above the value; if neither rounds back to the value, no n-digit decimal does.
    """
    if value == 0.0:
        return 1
    exact = Decimal(abs(value))
    for n in range(1, 10):
        quantum = Decimal(1).scaleb(exact.adjusted() - n + 1)
        down = (exact / quantum).to_integral_value(rounding="ROUND_FLOOR") * quantum
        up = (exact / quantum).to_integral_value(rounding="ROUND_CEILING") * quantum
        if any(f32(float(candidate)) == abs(value) for candidate in (down, up)):
            return n
    raise AssertionError(f"no decimal of at most 9 digits rounds to {value!r}")


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_format_number_round_trips_and_is_shortest(value):
    if 0 < abs(value) < float(np.finfo(np.float32).tiny):
        return  # subnormals: test_format_number_writes_subnormals_faithfully
    text = format_number(value)
    # round trip through Python's float and through the grammar
    assert bits(float(text)) == bits(value)
    assert bits(parse_number(text)) == bits(value)
    # the same decimal number as numpy's shortest float32 text, positional exactly in [1e-4, 1e16)
    assert Decimal(text) == Decimal(str(np.float32(value)))
    positional = value == 0.0 or 1e-4 <= abs(value) < 1e16
    assert ("e" not in text) == positional
    assert not text.endswith(".0")
    # and no decimal with fewer significant digits would do
    assert _significant_digits(text) == _shortest_digit_count(value)


def _faithful(text: str, value: float) -> bool:
    """Oracle for rule V1: the float32 ``value`` is within float32's relative precision 2**-24 of ``text``."""
    exact = Fraction(Decimal(text))
    return abs(Fraction(value) - exact) <= abs(exact) * Fraction(1, 2**24)


def _shortest_faithful_digit_count(value: float) -> int:
    """Oracle: the fewest significant digits of a decimal within 2**-24 (relative) of the subnormal ``value``."""
    exact = Decimal(abs(value))
    for n in range(1, 10):
        quantum = Decimal(1).scaleb(exact.adjusted() - n + 1)
        down = (exact / quantum).to_integral_value(rounding="ROUND_FLOOR") * quantum
        up = (exact / quantum).to_integral_value(rounding="ROUND_CEILING") * quantum
        if any(_faithful(str(candidate), abs(value)) for candidate in (down, up)):
            return n
    raise AssertionError(f"no decimal of at most 9 digits is within 2**-24 of {value!r}")


@given(st.integers(1, 2**23 - 1), st.booleans())
def test_format_number_writes_subnormals_faithfully(multiple, negative):
    """A subnormal float32 (a multiple of 2**-149) is written with the fewest digits within 2**-24 of it, so
    that its text reads back as itself under rule V1; numpy's shortest unique text would not ("1e-45")."""
    value = float(np.float32(multiple * 2.0**-149)) * (-1 if negative else 1)
    text = format_number(value)
    assert _faithful(text, value)
    assert bits(parse_number(text)) == bits(value) and bits(float(text)) == bits(value)
    assert _significant_digits(text) == _shortest_faithful_digit_count(value)
    assert "e-" in text and not text.endswith(".0")


@pytest.mark.parametrize("value, expected", [
    (2.0**-149, "1.4012985e-45"),  # numpy's shortest unique text is "1e-45", 29% off
    (2 * 2.0**-149, "2.802597e-45"),  # the float32 of "3e-45"
    (-(2.0**-126 - 2.0**-149), "-1.1754942e-38"),  # the largest subnormal
    (2.0**-126, "1.1754944e-38"),  # the smallest normal: numpy's text, which is within 2**-24
    (np.float32(1e-40), "9.999946e-41"),
])
def test_format_number_subnormal_table(value, expected):
    assert format_number(value) == expected
    assert bits(parse_number(expected)) == bits(float(value))


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def test_num_token_id_is_K(base_tokenizer):
    hf = build_tiny_tokenizer()
    size_before = len(hf)
    assert size_before == len(base_tokenizer)
    wrapped = NumericTokenizer(hf)
    assert wrapped.num_token_id == size_before
    assert wrapped.num_token == "<NUM>"
    assert len(wrapped) == size_before + 1
    assert hf.added_tokens_decoder[size_before].special
    assert wrapped.hf_tokenizer is hf
    assert wrapped.pad_token_id == hf.pad_token_id == hf.convert_tokens_to_ids("<|endoftext|>")
    assert wrapped.eos_token_id == hf.eos_token_id


def test_wrapping_twice_reuses_the_num_token():
    hf = build_tiny_tokenizer()
    first = NumericTokenizer(hf)
    second = NumericTokenizer(hf)
    assert second.num_token_id == first.num_token_id
    assert len(second) == len(first)


def test_existing_non_special_num_token_is_rejected():
    hf = build_tiny_tokenizer()
    hf.add_tokens(["<NUM>"])  # an ordinary added token: text "<NUM>" would turn into it
    with pytest.raises(ValueError, match="not as a special"):
        NumericTokenizer(hf)


@pytest.mark.parametrize(
    "args, error, match",
    [
        (("not a tokenizer",), TypeError, "PreTrainedTokenizerBase"),
    ],
)
def test_constructor_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        NumericTokenizer(*args)


@pytest.mark.parametrize("num_token, error, match", [(5, TypeError, "num_token"), ("", ValueError, "non-empty"),
                                                     ("<N 1>", ValueError, "must not contain a number")])
def test_constructor_bad_num_token(num_token, error, match):
    with pytest.raises(error, match=match):
        NumericTokenizer(build_tiny_tokenizer(), num_token=num_token)


@pytest.mark.parametrize(
    "text",
    [
        "The price is 99.9 yuan.",
        "温度-15.5度",
        "In 2020-2021 sales grew by 12.5%.",
        "今天的气温是25度，明天会降到18度。 Mixed text, 1234.5 and 3eggs!",
        "   leading and trailing spaces 7   ",
        "line one 1\nline two -2\n",
    ],
)
def test_text_runs_match_the_hf_tokenizer(tokenizer, base_tokenizer, text):
    ids, values = tokenizer.encode(text)
    expected_ids = []
    for kind, content in split_numbers(text):
        if kind == N:
            expected_ids.append(tokenizer.num_token_id)
        else:
            expected_ids.extend(base_tokenizer(content, add_special_tokens=False)["input_ids"])
    assert ids == expected_ids
    assert tokenizer.decode(ids, values) == text


def test_numbers_decode_as_written_or_canonically_without_their_texts(tokenizer):
    text = "1,234.50 and 007 and 1.5E3 and 2e+0 and −3"
    ids, values, number_texts = tokenizer.encode(text, return_number_texts=True)
    assert number_texts == ["1,234.50", "1.5E3", "2e+0", "−3"]  # "007" is an identifier: text
    assert tokenizer.decode(ids, values, number_texts=number_texts) == text
    assert tokenizer.decode(ids, values) == "1234.5 and 007 and 1500 and 2 and -3"  # as if generated
    assert tokenizer.decode(ids, values, number_texts=number_texts[:2]) == "1,234.50 and 007 and 1.5E3 and 2 and -3"


def test_text_without_numbers_matches_the_hf_tokenizer(tokenizer, base_tokenizer):
    text = "Good morning! 早上好！ The weather is sunny."
    ids, values = tokenizer.encode(text)
    assert ids == base_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert values == [0.0] * len(ids)


def test_literal_num_text_stays_text(tokenizer):
    text = "a <NUM> b"
    hf = tokenizer.hf_tokenizer
    # the wrapped tokenizer on its own would turn the literal into the special token ...
    assert tokenizer.num_token_id in hf(text, add_special_tokens=False)["input_ids"]
    # ... but encode keeps it as ordinary characters
    ids, values = tokenizer.encode(text)
    assert tokenizer.num_token_id not in ids
    assert values == [0.0] * len(ids)
    assert tokenizer.decode(ids, values) == text
    # with a real number next to it, only the number becomes <NUM>
    ids, values = tokenizer.encode("<NUM>5<NUM>")
    assert ids.count(tokenizer.num_token_id) == 1
    assert tokenizer.decode(ids, values) == "<NUM>5<NUM>"
    # the wrapped tokenizer is left as it was: it still matches special tokens by default
    assert hf.convert_tokens_to_ids("<NUM>") in hf("<NUM>", add_special_tokens=False)["input_ids"]


def test_literal_special_token_text_stays_text(tokenizer):
    text = "<|endoftext|><|im_start|>user 5"
    ids, values = tokenizer.encode(text)
    special_ids = set(tokenizer.hf_tokenizer.all_special_ids)
    assert not special_ids & set(ids)
    assert tokenizer.decode(ids, values) == text


@pytest.mark.parametrize(
    "text, match",
    [
        ("1e39", r"'1e39' overflows float32"),
        ("value 1e400!", r"'1e400' overflows float32"),
        ("x = -1e39", r"'-1e39' overflows float32"),
        ("tiny 1e-50", r"'1e-50' .*underflow"),
        ("3.4028236e38", r"overflows float32"),
        ("7e-46", r"underflow"),
    ],
)
def test_numbers_outside_float32_stay_text(tokenizer, base_tokenizer, text, match):
    """Rule V1: nothing in a text fails the batch; a literal float32 cannot hold faithfully is text."""
    ids, values = tokenizer.encode(text)
    assert ids == base_tokenizer(text, add_special_tokens=False)["input_ids"] and not any(values)
    batch = tokenizer([text, "5"])
    assert tokenizer.batch_decode(batch) == [text, "5"]
    with pytest.raises(ValueError, match=match):  # as a single literal, the reason is named
        parse_number(text.split()[-1].rstrip("!"))


def test_zero_with_huge_or_tiny_exponent_is_fine(tokenizer):
    _, values = tokenizer.encode("0e-50 and 0.000e400")
    assert [v for v in values if v != 0.0] == []


@pytest.mark.parametrize("text", [None, 5, b"bytes", ["a list"]])
def test_encode_rejects_non_str(tokenizer, text):
    with pytest.raises(TypeError, match="text must be a str"):
        tokenizer.encode(text)


# ---------------------------------------------------------------------------------------------
# Round trip on canonical numbers
# ---------------------------------------------------------------------------------------------

# Characters that can never glue onto a number: no ASCII digits, no "." "," "-" "+", no "e"/"E", and no ":"
# ("0:0:0" is a time and "0:0:ab" a hex address: identifiers, text).
LETTERS = "abcdxyzABCDXYZ"
OTHERS = "价格温度元是 ()%：;!?¥$"
SNIPPET = st.text(LETTERS + OTHERS, max_size=6)
SEPARATOR = st.text(LETTERS + OTHERS, min_size=1, max_size=6)


@st.composite
def texts_with_canonical_numbers(draw):
    """A text of snippets and canonical numbers, together with the float32 numbers in it."""
    numbers = draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=4))
    parts = [draw(SNIPPET)]
    for index, value in enumerate(numbers):
        if index > 0:
            parts.append(draw(SEPARATOR))
        # a number right after a cased letter continues a word, and a "-" after "digit + unit" is a range
        # dash: a space before the number keeps it a number with its sign
        if parts[-1] and (parts[-1][-1] in LETTERS or math.copysign(1.0, value) < 0):
            parts[-1] += " "
        parts.append(format_number(value))
    parts.append(draw(SNIPPET))
    return "".join(parts), numbers


@given(texts_with_canonical_numbers())
def test_round_trip_canonical_numbers(tokenizer, case):
    text, numbers = case
    ids, values = tokenizer.encode(text)
    found = [values[i] for i, token_id in enumerate(ids) if token_id == tokenizer.num_token_id]
    assert [bits(v) for v in found] == [bits(v) for v in numbers]
    assert tokenizer.decode(ids, values) == text  # canonical numbers: the same text without their surface texts
    batch = tokenizer([text, "x"], padding_side="left")
    assert tokenizer.batch_decode(batch["input_ids"], batch["numeric_values"]) == [text, "x"]


# ---------------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------------

BATCH = ["价格是99.9元", "温度-15.5度，明天-3度。", "x", "In 2020-2021 sales grew by 12.5%."]


def _rows_without_padding(batch):
    rows = []
    for ids, values, mask in zip(batch["input_ids"], batch["numeric_values"], batch["attention_mask"]):
        keep = mask.bool()
        rows.append((ids[keep].tolist(), values[keep].tolist()))
    return rows


def test_batch_shapes_and_dtypes(tokenizer):
    batch = tokenizer(BATCH)
    lengths = [len(tokenizer.encode(text)[0]) for text in BATCH]
    assert set(batch) == {"input_ids", "numeric_values", "attention_mask"}
    assert batch["input_ids"].dtype == torch.int64
    assert batch["numeric_values"].dtype == torch.float32
    assert batch["attention_mask"].dtype == torch.int64
    assert batch["input_ids"].shape == (len(BATCH), max(lengths))
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths


def test_left_and_right_padding_agree(tokenizer):
    right = tokenizer(BATCH, padding_side="right")
    left = tokenizer(BATCH, padding_side="left")
    expected = [tokenizer.encode(text) for text in BATCH]
    expected = [(ids, [f32(v) for v in values]) for ids, values in expected]
    assert _rows_without_padding(right) == expected
    assert _rows_without_padding(left) == expected
    for batch in (left, right):
        pad = batch["attention_mask"] == 0
        assert (batch["input_ids"][pad] == tokenizer.pad_token_id).all()
        assert (batch["numeric_values"][pad] == 0.0).all()
    # right padding puts the real tokens first, left padding last
    assert (right["attention_mask"][:, 0] == 1).all()
    assert (left["attention_mask"][:, -1] == 1).all()
    assert tokenizer.batch_decode(left["input_ids"], left["numeric_values"]) == BATCH
    assert tokenizer.batch_decode(right["input_ids"], right["numeric_values"]) == BATCH


def test_single_string_is_a_batch_of_one(tokenizer):
    batch = tokenizer("价格是99.9元")
    ids, values = tokenizer.encode("价格是99.9元")
    assert batch["input_ids"].tolist() == [ids]
    assert batch["numeric_values"].tolist() == [[f32(v) for v in values]]
    assert batch["attention_mask"].tolist() == [[1] * len(ids)]


def test_padding_longest_equals_true(tokenizer):
    a, b = tokenizer(BATCH, padding=True), tokenizer(BATCH, padding="longest")
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_padding_max_length(tokenizer):
    batch = tokenizer(BATCH, padding="max_length", max_length=40, padding_side="left")
    assert batch["input_ids"].shape == (len(BATCH), 40)
    assert _rows_without_padding(batch) == _rows_without_padding(tokenizer(BATCH))


def test_padding_false(tokenizer):
    with pytest.raises(ValueError, match="equal token length"):
        tokenizer(BATCH, padding=False)
    same = tokenizer(["5 a", "7 b"], padding=False)
    assert same["attention_mask"].all()


def test_truncation(tokenizer):
    lengths = [len(tokenizer.encode(text)[0]) for text in BATCH]
    index = next(i for i, length in enumerate(lengths) if length > 3)  # the first row that is too long
    with pytest.raises(ValueError, match=rf"text {index} has more than max_length=3 tokens"):
        tokenizer(BATCH, max_length=3)
    batch = tokenizer(BATCH, max_length=3, truncation=True)
    assert batch["input_ids"].shape == (len(BATCH), 3)
    for (ids, values), text in zip(_rows_without_padding(batch), BATCH):
        full_ids, full_values = tokenizer.encode(text)
        assert ids == full_ids[:3]
        assert values == [f32(v) for v in full_values[:3]]
    # truncation followed by padding=False works when the cut rows are equally long
    cut = tokenizer(["价格是99.9元", "In 2020-2021"], max_length=2, truncation=True, padding=False)
    assert cut["input_ids"].shape == (2, 2)


def test_empty_text_in_a_batch(tokenizer):
    batch = tokenizer(["", "5"])
    assert batch["attention_mask"].tolist() == [[0], [1]]
    assert tokenizer.batch_decode(batch["input_ids"], batch["numeric_values"]) == ["", "5"]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(texts=[]), ValueError, "empty list"),
        (dict(texts=7), TypeError, "texts must be a str or a list"),
        (dict(texts=["a", 3]), TypeError, r"texts\[1\] must be a str"),
        (dict(texts=["a"], padding_side="middle"), ValueError, "padding_side"),
        (dict(texts=["a"], padding="yes"), ValueError, "padding must be one of"),
        (dict(texts=["a"], padding=1), ValueError, "padding must be one of"),
        (dict(texts=["a"], padding="max_length"), ValueError, "needs max_length"),
        (dict(texts=["a"], truncation=True), ValueError, "needs max_length"),
        (dict(texts=["a"], max_length=0), ValueError, "max_length must be positive"),
        (dict(texts=["a"], max_length=2.5), TypeError, "max_length must be an int"),
        (dict(texts=["a"], truncation="yes"), TypeError, "truncation must be a bool"),
    ],
)
def test_call_bad_input(tokenizer, kwargs, error, match):
    with pytest.raises(error, match=match):
        tokenizer(**kwargs)


def test_padding_without_pad_token():
    hf = build_tiny_tokenizer()
    hf.pad_token = None
    wrapped = NumericTokenizer(hf)
    with pytest.raises(ValueError, match="no pad token"):
        wrapped.pad_token_id
    with pytest.raises(ValueError, match="no pad token"):
        wrapped(["a b c", "a"])
    # nothing to pad: no pad token needed
    assert wrapped(["a", "b"])["input_ids"].shape == (2, 1)


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def test_decode_accepts_lists_and_tensors(tokenizer):
    ids, values = tokenizer.encode("温度-15.5度")
    as_lists = tokenizer.decode(ids, values)
    as_tensors = tokenizer.decode(torch.tensor(ids), torch.tensor(values, dtype=torch.float32))
    as_arrays = tokenizer.decode(np.array(ids), np.array(values))
    assert as_lists == as_tensors == as_arrays == "温度-15.5度"


def test_decode_writes_shortest_numbers(tokenizer):
    num = tokenizer.num_token_id
    assert tokenizer.decode([num], [99.9]) == "99.9"
    assert tokenizer.decode([num], torch.tensor([99.9])) == "99.9"
    assert tokenizer.decode([num], [5.0]) == "5"
    assert tokenizer.decode([num], [1e30]) == "1e+30"
    assert tokenizer.decode([num], [-0.0]) == "-0"


def test_decode_ignores_values_off_num_positions(tokenizer):
    ids, values = tokenizer.encode("a 5 b")
    noisy = [v if token_id == tokenizer.num_token_id else 123.0 for token_id, v in zip(ids, values)]
    assert tokenizer.decode(ids, noisy) == "a 5 b"


def test_decode_special_tokens(tokenizer):
    ids, values = tokenizer.encode("5 apples")
    eos = tokenizer.eos_token_id
    assert tokenizer.decode(ids + [eos], values + [0.0]) == "5 apples"
    assert tokenizer.decode(ids + [eos], values + [0.0], skip_special_tokens=False) == "5 apples<|endoftext|>"
    # <NUM> is never skipped
    assert tokenizer.decode([tokenizer.num_token_id], [7.0], skip_special_tokens=True) == "7"


@pytest.mark.parametrize(
    "ids, values, error, match",
    [
        ([1, 2], [0.0], ValueError, "input_ids has length 2 but numeric_values has length 1"),
        ([10**6], [0.0], ValueError, r"input_ids\[0\] = 1000000 is not a token id"),
        ([-1], [0.0], ValueError, r"input_ids\[0\] = -1 is not a token id"),
        ([1.5], [0.0], TypeError, r"input_ids\[0\] must be an int"),
        ([1], ["x"], TypeError, r"numeric_values\[0\] must be a real number"),
        (torch.tensor([[1]]), [0.0], ValueError, "input_ids must be 1-D"),
        (torch.tensor([1.0]), [0.0], TypeError, "input_ids must hold integers"),
        ("abc", [0.0], TypeError, "input_ids must be a list of ints"),
    ],
)
def test_decode_bad_input(tokenizer, ids, values, error, match):
    with pytest.raises(error, match=match):
        tokenizer.decode(ids, values)


@pytest.mark.parametrize("value, match", [(float("nan"), "NaN"), (float("inf"), "infinity")])
def test_decode_rejects_non_finite_numbers(tokenizer, value, match):
    with pytest.raises(ValueError, match=rf"numeric_values\[1\]: .*{match}"):
        tokenizer.decode([0, tokenizer.num_token_id], [0.0, value])


def test_batch_decode_bad_input(tokenizer):
    batch = tokenizer(BATCH)
    with pytest.raises(ValueError, match="rows"):
        tokenizer.batch_decode(batch["input_ids"], batch["numeric_values"][:2])
    with pytest.raises(ValueError, match="row 0: input_ids has length"):
        tokenizer.batch_decode(batch["input_ids"], batch["numeric_values"][:, :2])
    with pytest.raises(ValueError, match="2-D"):
        tokenizer.batch_decode(batch["input_ids"][0], batch["numeric_values"][0])


# ---------------------------------------------------------------------------------------------
# Saving and loading
# ---------------------------------------------------------------------------------------------


def test_save_and_load(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = NumericTokenizer.from_pretrained(tmp_path)
    assert loaded.num_token_id == tokenizer.num_token_id
    assert len(loaded) == len(tokenizer)
    for text in BATCH + ["a <NUM> b 5", "<|im_start|>-1e+30"]:
        assert loaded.encode(text) == tokenizer.encode(text)
    batch = tokenizer(BATCH)
    assert loaded.batch_decode(batch["input_ids"], batch["numeric_values"]) == BATCH


def test_save_records_the_class_and_num_token_for_transformers(tmp_path):
    """tokenizer_config.json names NumericTokenizer (auto_map) and its num_token: a custom one comes back without
    being passed again, AutoTokenizer with trust_remote_code gives a NumericTokenizer, and without it
    transformers' own class, which knows the number token as its special ``num_token``. (A fresh process that
    never imported causalqwen is tested in test_modeling.)"""
    import json
    import os

    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    custom = NumericTokenizer(build_tiny_tokenizer(), num_token="<QTY>")
    files = custom.save_pretrained(tmp_path)
    assert {os.path.basename(f) for f in files} == {"tokenizer.json", "tokenizer_config.json", "causalqwen_auto.py"}
    with open(tmp_path / "tokenizer_config.json", encoding="utf-8") as handle:
        config = json.load(handle)
    assert config["num_token"] == "<QTY>"
    assert config["auto_map"] == {"AutoTokenizer": [None, "causalqwen_auto.NumericTokenizer"]}
    loaded = NumericTokenizer.from_pretrained(tmp_path)
    assert loaded.num_token == "<QTY>" and loaded.num_token_id == custom.num_token_id
    assert loaded.encode("a 5 b") == custom.encode("a 5 b")
    auto = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    assert isinstance(auto, NumericTokenizer) and auto.encode("x 2.5") == custom.encode("x 2.5")
    plain = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(plain, PreTrainedTokenizerBase) and plain.num_token == "<QTY>"
    assert plain.convert_tokens_to_ids("<QTY>") == custom.num_token_id


def test_the_attributes_transformers_reads(tokenizer):
    """Trainer reads model_input_names and pad_token_id; pipeline batching reads and sets padding_side."""
    assert tokenizer.model_input_names[0] == "input_ids" and set(tokenizer.model_input_names) == set(tokenizer(["a"]))
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    assert tokenizer.hf_tokenizer.padding_side == "left"
    tokenizer.padding_side = side
    with pytest.raises(ValueError, match='padding_side must be "left" or "right"'):
        tokenizer.padding_side = "middle"


def test_decode_can_mark_ids_of_reserved_rows(tokenizer):
    """A model has more rows than the tokenizer has tokens; an untrained one can predict those ids."""
    size = len(tokenizer)
    ids, values = tokenizer.encode("cost 5 now")
    ids = ids + [size + 7] + [tokenizer.num_token_id]
    values = values + [0.0, 2.5]
    assert tokenizer.decode(ids, values, out_of_vocab="mark") == f"cost 5 now<unk:{size + 7}>2.5"
    with pytest.raises(ValueError, match=rf"input_ids\[{len(ids) - 2}\] = {size + 7} is not a token id"):
        tokenizer.decode(ids, values)
    with pytest.raises(ValueError, match=r"input_ids\[0\] = -1 is not a token id"):
        tokenizer.decode([-1], [0.0], out_of_vocab="mark")
    with pytest.raises(ValueError, match='out_of_vocab must be "raise" or "mark"'):
        tokenizer.decode(ids, values, out_of_vocab="skip")
    assert tokenizer.batch_decode([ids], [values], out_of_vocab="mark") == [f"cost 5 now<unk:{size + 7}>2.5"]
