"""Numbers of any magnitude and any number of digits: tokenized, written and scored.

Oracles: exact rational arithmetic (``fractions.Fraction``) for what the grammar reads, the decimal exponent of a
literal counted from its digits for what must stay text, exact decimal arithmetic (``decimal.Decimal`` in a context
holding every digit) for written texts, and mpmath at 200 digits or more (as many as the interval needs) for the
likelihood. Never the code under test.
"""

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cauchy import _mp_log_interval

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.likelihood import number_log_probability
from causalqwen.numbers import find_numbers, parse_number
from causalqwen.writing import (
    check_resolution,
    literal_resolution,
    resolution_exponent,
    resolution_for,
    write_at_resolution,
)

FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.fixture(scope="module")
def tokenizer():
    return NumericTokenizer(build_tiny_tokenizer())


# ---------------------------------------------------------------------------------------------
# Tokenized: every text, whatever its literals
# ---------------------------------------------------------------------------------------------


def _decimal_exponent(digits: str, point: int, exponent: int) -> int | None:
    """floor(log10 |x|) of the literal 0.<digits> shifted: digits with the decimal point after ``point`` of them, times
    10^exponent; None for zero. Counted from the digits, with no arithmetic on the value."""
    first = next((index for index, digit in enumerate(digits) if digit != "0"), None)
    return None if first is None else point - first - 1 + exponent


@st.composite
def literals(draw):
    """``(literal, digits, point, exponent)``: 1-400 digits, a decimal point anywhere or none, an exponent up to
    +-10^9 (sometimes one of 20 to 30 digits), a sign or none."""
    digits = draw(st.text("0123456789", min_size=1, max_size=400))
    if len(digits) > 1 and draw(st.booleans()):
        digits = draw(st.sampled_from("123456789")) + digits[1:]  # no leading zero: an integer run of the grammar
    point = draw(st.integers(0, len(digits)))
    exponent = draw(
        st.one_of(
            st.integers(-(10**9), 10**9),
            st.integers(-60, 60),
            st.integers(10**19, 10**29),
            st.integers(-(10**29), -(10**19)),
        )
    )
    integer, fraction = digits[:point], digits[point:]
    literal = (integer or "0") + ("." + fraction if fraction else "")
    if not fraction and len(integer) > 1 and integer[0] == "0":
        literal = "0." + integer  # an integer run with a leading zero is an identifier; read it as a fraction
        point = 0
    written_exponent = draw(st.booleans()) or abs(exponent) > 60
    if written_exponent:
        literal += f"e{exponent:+d}" if draw(st.booleans()) else f"E{exponent}"
    else:
        exponent = 0
    sign = draw(st.sampled_from(["", "-", "\u2212"]))
    return sign + literal, digits, point, exponent


@settings(max_examples=300, deadline=None)
@given(literals(), st.sampled_from(["The value is {} units.", "{}", "价格是{}元", "x = ({}) and"]))
def test_every_literal_in_a_text_tokenizes_and_is_read_only_when_float32_holds_it(tokenizer, drawn, frame):
    """Nothing in a text makes the grammar or the tokenizer fail. A literal whose magnitude is above float32's range
    (decimal exponent > 38) or far below it (< -46) is text; one the grammar reads has a float32 value within
    float32's relative precision 2**-24 of its exact value (rule V1)."""
    literal, digits, point, exponent = drawn
    text = frame.format(literal)
    found = find_numbers(text)
    ids, _, texts = tokenizer.encode(text, return_number_texts=True)
    assert len(texts) == len(found) == ids.count(tokenizer.num_token_id)
    read = [number for number in found if number.text == literal]
    magnitude = _decimal_exponent(digits, point, exponent)
    if magnitude is not None and not -46 <= magnitude <= 38:
        assert read == []
    if read and magnitude is not None:
        exact = Fraction(int(digits), 10 ** (len(digits) - point)) * Fraction(10) ** exponent
        value = abs(Fraction(read[0].value))
        assert abs(value - exact) <= exact / 2**24


@pytest.mark.parametrize(
    "literal, reason",
    [
        ("1e999999999", "overflows float32"),
        ("0.5e400000", "overflows float32"),
        ("1e-99999999", "rounds to 0.0"),
        ("1e-9999999999999999999", "rounds to 0.0"),
        ("-5e-999999999999999999", "rounds to 0.0"),
        ("9" * 5000, "overflows float32"),
        ("9" * 12, "more than 9 significant digits"),
        ("1" + "0" * 5000 + ".5", "overflows float32"),
        ("0." + "0" * 5000 + "1", "rounds to 0.0"),
        ("1e" + "9" * 5000, "overflows float32"),
    ],
)
def test_parse_number_says_why_a_literal_of_any_size_is_not_a_number(literal, reason):
    with pytest.raises(ValueError, match=reason):
        parse_number(literal)
    assert find_numbers(f"a {literal} b") == []


@pytest.mark.parametrize(
    "literal, value",
    [
        ("0e999999999", 0.0),
        ("0.000e-99999999999999999999", 0.0),
        ("1." + "0" * 3000 + "1", 1.0),
        ("1" + "0" * 3000 + "e-3000", 1.0),
        ("0." + "0" * 3000 + "15e3001", 1.5),
    ],
)
def test_literals_of_thousands_of_digits_or_huge_exponents_that_float32_holds_are_numbers(tokenizer, literal, value):
    assert parse_number(literal) == value
    assert [number.value for number in find_numbers(f"it is {literal} now")] == [value]
    tokenizer.encode(f"it is {literal} now")


# ---------------------------------------------------------------------------------------------
# Written: any finite float32 at any allowed resolution
# ---------------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False), st.integers(-45, 38))
def test_any_float32_at_any_allowed_resolution_reads_back_as_one_number_within_half_of_it(value, exponent):
    """The text is one number of the grammar, whole (grouped where its integer part is a long run), whose exact
    decimal value is within h/2 of the float32 value; it has at least the decimals h asks for (more only where the
    grammar would read the rounded text as text, rule V1, or where rounding up would leave float32's range)."""
    resolution = check_resolution(10.0**exponent)
    text = write_at_resolution(value, resolution)
    found = find_numbers(text)
    assert [(number.start, number.end) for number in found] == [(0, len(text))]
    parse_number(text)
    with localcontext() as context:
        context.prec = 400
        written = Decimal(text.replace(",", ""))
        assert abs(written - Decimal(value)) <= Decimal(10) ** exponent / 2
    decimals = len(text.split(".")[1]) if "." in text else 0
    assert decimals >= max(0, -exponent)
    if abs(value) >= 2.0**-126 and exponent <= 31:  # a normal value, no rounding near float32's top
        assert decimals == max(0, -exponent)
    assert "e" not in text.lower()


@pytest.mark.parametrize(
    "value, resolution",
    [
        (1e30, 1),
        (1.0, 1e-30),
        (3e38, 1e-30),
        (FLOAT32_MAX, 1e-45),
        (-FLOAT32_MAX, 1e38),
        (2.0**-149, 1e-45),
        (float(np.float32(1e-38)), 1e-45),
    ],
)
def test_writing_at_extreme_resolutions_is_exact(value, resolution):
    """The float32 value's exact expansion (``int`` of a float, or ``Decimal`` of it), rounded half to even by hand."""
    single = Decimal(float(np.float32(value)))
    text = write_at_resolution(value, resolution)
    exponent = round(math.log10(resolution))
    with localcontext() as context:
        context.prec = 500
        assert abs(Decimal(text.replace(",", "")) - single) <= Decimal(10) ** exponent / 2
    parse_number(text)


def test_writing_the_float32_value_of_1e30_to_the_unit_writes_its_exact_integer_grouped():
    exact = int(float(np.float32(1e30)))  # 1000000015047466219876688855040
    assert write_at_resolution(1e30, 1) == f"{exact:,}"
    assert write_at_resolution(1.0, 1e-30) == "1." + "0" * 30


def test_decode_with_a_prompt_of_any_size_and_resolution(tokenizer):
    """A prompt holding 1e30 and a generated 1e30, written at "prompt" and at 1e-30, without a decimal error."""
    ids, values, texts = tokenizer.encode("The mass is 1e30 kg, or", return_number_texts=True)
    ids, values = ids + [tokenizer.num_token_id], values + [float(np.float32(1e30))]
    written = tokenizer.decode(ids, values, number_texts=texts, number_resolution="prompt")
    assert written.endswith(" or 1" + "0" * 30)  # at 10^29, two significant digits: one digit run, no group commas
    assert [number.value for number in find_numbers(written)] == [float(np.float32(1e30))] * 2
    fine = tokenizer.decode(ids, values, number_texts=texts, number_resolution=1e-30)
    assert fine.endswith(".000000000000000000000000000000")
    # a zero stating 10^-999999999: the exact expansion to 10^-149, where every float32's ends; 10^(10^5000): 2.5
    exact = f"{Decimal(float(np.float32(2.4996202))):.149f}"  # 2.4996201992034912109375 and zeros
    for zero, expected in (("0e-999999999", exact), ("0e" + "9" * 5000, "2.5")):
        ids, values, texts = tokenizer.encode(f"It was {zero}, now", return_number_texts=True)
        ids, values = ids + [tokenizer.num_token_id], values + [2.4996202]
        written = tokenizer.decode(ids, values, number_texts=texts, number_resolution="prompt")
        assert written.endswith(f", now {expected}")


def test_the_resolution_of_a_long_zero_fraction_is_never_zero():
    literal = "0.1" + "0" * 400
    assert resolution_exponent(literal) == -401
    with pytest.raises(ValueError, match=r"10\^-401 of the number '0\.1000"):
        literal_resolution(literal)
    assert resolution_exponent("0e-999999999") == -999999999
    assert resolution_exponent("0e" + "9" * 5000) == int("9" * 2000) * 10**3000 + int("9" * 3000)


def test_a_prompt_with_a_finer_resolution_than_any_float32_digit_writes_the_exact_expansion():
    """10^-401 is finer than the last digit of every float32 (10^-149): the value is written to 10^-149."""
    h = resolution_for(2.5, -401)
    assert h == 1e-149
    assert write_at_resolution(2.5, h) == "2.5" + "0" * 148


# ---------------------------------------------------------------------------------------------
# Scored: the interval of a literal with more digits than float64 holds, against mpmath
# ---------------------------------------------------------------------------------------------


def _mp_number_log_probability(literal: str, loc: float, scale: float) -> float:
    """log P(v - h/2 < Y <= v + h/2) for Y ~ Cauchy(loc, scale), v and h read from the literal's digits by mpmath, at
    200 digits plus as many as the literal and its resolution span (so no end is rounded), from the tail masses
    atan2(scale, d) / pi, which keep their relative precision however far out."""
    unsigned = literal.lstrip("-\u2212").replace(",", "")
    mantissa, _, exponent = unsigned.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    k = (int(exponent) if exponent else 0) - decimals
    digits = 200 + len(unsigned) + abs(k) + 330
    with mp.workdps(digits):
        value = mp.mpf(unsigned) * (-1 if literal[0] in "-\u2212" else 1)
        half = mp.mpf(10) ** k / 2
        return _mp_log_interval(value - half, value + half, loc, scale, digits=digits)


@pytest.mark.parametrize(
    "literal, loc, scale",
    [
        ("1234567.123456789012345", 1234567.0, 1.0),
        ("1234567.123456789012345", 1234567.123456789, 1e-9),
        ("0.1000000000000000055511151231257827", 0.1, 1e-3),
        ("0.1000000000000000055511151231257827", 0.1, 1e-17),
        ("-0.1000000000000000055511151231257827", 3.0, 2.0),
        ("1." + "0" * 400 + "1", 1.0, 1e-300),
        ("3.4028234e38", 0.0, 1.0),
        ("-1.17549435e-38", 0.0, 1e-40),
        ("1.4012985e-45", 0.0, 1e-45),
        ("0.1" + "0" * 400, 0.1, 1.0),
        ("123456789.5", 123456789.5, 1e-20),
        ("2.5", 1e300, 1e-300),
    ],
)
def test_a_literal_with_more_digits_than_float64_is_scored_as_written(literal, loc, scale):
    """The interval's ends and width come from the digits: no float64 rounding of v +- h/2."""
    value = number_log_probability(literal, loc, scale).item()
    expected = _mp_number_log_probability(literal, loc, scale)
    assert math.isfinite(value)
    assert value == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "literal, loc, scale",
    [
        ("0." + "0" * 400, 0.0, 1.0),
        ("0." + "0" * 400, 5e-324, 1.0),
        ("1." + "0" * 400, 1.0, 1.0),
        ("-2.5" + "0" * 500, -2.5, 1e-3),
        ("1." + "0" * 200, 1.0, 1e200),
        ("0." + "0" * 320, 0.0, 1e-10),
        ("123.456" + "0" * 350, 123.456, 1e-5),
    ],
)
def test_a_literal_finer_than_float64_at_its_location_is_scored_exactly(literal, loc, scale):
    """The location on (or within float64's reach of) a literal whose interval is narrower than float64's smallest
    number, beside the scale: both ends' distances to the location, over the scale, underflow float64 (the interval
    holds the location, so the mass is the two arctangents added), and the score is still finite and mpmath's."""
    value = number_log_probability(literal, loc, scale).item()
    assert math.isfinite(value)
    assert value == pytest.approx(_mp_number_log_probability(literal, loc, scale), rel=1e-12)


@st.composite
def scored_literals(draw):
    """``(literal, loc, scale)``: a literal of 1-400 digits whose value is a normal float32 magnitude, and a Cauchy law
    centred anywhere from on the literal to far from it, with a scale from 1e-12 to 1e12 of the value's size."""
    lead = draw(st.sampled_from("123456789"))
    fraction = draw(st.text("0123456789", min_size=0, max_size=399))
    exponent = draw(st.integers(-37, 37))
    sign = draw(st.sampled_from(["", "-"]))
    literal = f"{sign}{lead}{'.' + fraction if fraction else ''}e{exponent}"
    size = 10.0**exponent
    scale = size * 10.0 ** draw(st.floats(-12, 12))
    loc = float(Decimal(literal)) + draw(st.floats(-1e3, 1e3)) * draw(st.sampled_from([0.0, scale, size]))
    return literal, loc, scale


@settings(max_examples=150, deadline=None)
@given(scored_literals())
def test_the_likelihood_of_any_literal_is_mpmaths_at_200_digits(drawn):
    literal, loc, scale = drawn
    assert number_log_probability(literal, loc, scale).item() == pytest.approx(
        _mp_number_log_probability(literal, loc, scale), rel=1e-9
    )


def test_a_zero_of_any_resolution_is_scored_or_named():
    """'0e999999999' stands for (-h/2, h/2] with h = 10^999999999: all the mass but 4 scale / (pi h), log P = -0.0
    in float64. '0e-999999999' is an interval of width 10^-999999999 around 0: log P = log h + log f(0) to within
    h^2. Beyond 10^17 the exponent of the resolution is beyond exact decimal arithmetic: a ValueError naming it."""
    assert number_log_probability("0e999999999", 2.0, 3.0).item() == 0.0
    log_density = -math.log(math.pi * 3.0 * (1 + (2.0 / 3.0) ** 2))
    assert number_log_probability("0e-999999999", 2.0, 3.0).item() == pytest.approx(
        -999999999 * math.log(10) + log_density, rel=1e-15
    )
    assert number_log_probability("0e-999999999", 0.0, 3.0).item() == pytest.approx(  # on the location
        -999999999 * math.log(10) - math.log(math.pi * 3.0), rel=1e-15
    )
    with pytest.raises(ValueError, match="'0e99999999999999999999' states the resolution 10\\^99999999999999999999"):
        number_log_probability("0e99999999999999999999", 2.0, 3.0)
    with pytest.raises(
        ValueError,
        match=r"'0e99999999999999'...'999999999999' \(5002 characters\) states the "
        r"resolution 10\^k with \|k\| > 10\^40",
    ):
        number_log_probability("0e" + "9" * 5000, 2.0, 3.0)
    with pytest.raises(ValueError, match=r"10\^k with \|k\| > 10\^40 of the number '0e-9999999999999'"):
        literal_resolution("0e-" + "9" * 5000)


@pytest.mark.parametrize(
    "loc, scale, match",
    [
        (math.nan, 1.0, "loc_Y must be finite"),
        (math.inf, 1.0, "loc_Y must be finite"),
        (0.0, 0.0, "scale_Y must be a finite number > 0"),
        (0.0, math.nan, "scale_Y must be a finite number > 0"),
    ],
)
def test_the_likelihood_names_a_bad_law(loc, scale, match):
    with pytest.raises(ValueError, match=match):
        number_log_probability("2.5", loc, scale)


def test_the_likelihood_names_a_literal_that_is_not_a_number():
    with pytest.raises(ValueError, match="'1e999999999'.*overflows float32"):
        number_log_probability("1e999999999", 0.0, 1.0)
    with pytest.raises(ValueError, match="'abc' is not a single number"):
        number_log_probability("abc", 0.0, 1.0)


def test_the_likelihood_keeps_the_shape_of_the_law():
    loc = torch.tensor([[0.0, 2.5], [1e30, -3.0]], dtype=torch.float64)
    scale = torch.tensor([1.0, 0.5], dtype=torch.float64)
    terms = number_log_probability("2.5", loc, scale)
    assert terms.shape == (2, 2)
    for row in range(2):
        for column in range(2):
            assert terms[row, column].item() == pytest.approx(
                _mp_number_log_probability("2.5", loc[row, column].item(), scale[column].item()), rel=1e-12
            )
