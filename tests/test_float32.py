"""Executable specification of float32 values and their text (causalqwen.float32): the correctly rounded
float32 of a decimal literal, the exact relative bound of rule V1, and the shortest text of a float32.

The expected values come from hand-written tables, from exact rational arithmetic (``fractions.Fraction``),
from numpy's own float32 printing, or from Hypothesis laws -- never from the code under test.
"""

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from causalqwen.float32 import (
    format_number,
    nearest_float32,
    nearest_float32_many,
    subnormal_text,
    within_float32_precision,
)
from causalqwen.numbers import parse_number


def f32(x: float) -> float:
    """The float32 rounding of ``x``, as a Python float (``inf`` beyond the float32 range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def bits(x: float) -> int:
    """The float32 bit pattern of ``x`` (so that 0.0 and -0.0 differ)."""
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def _float32_nearest(exact: Fraction) -> float:
    """Oracle: the float32 nearest to ``exact`` (ties to even), by exact rational arithmetic."""
    with np.errstate(over="ignore"):
        guess = np.float32(float(exact))
        candidates = {guess, np.nextafter(guess, np.float32(-np.inf)), np.nextafter(guess, np.float32(np.inf))}
    candidates = [c for c in candidates if np.isfinite(c)]

    def key(c):
        return (abs(Fraction(float(c)) - exact), bits(float(c)) & 1)

    return float(min(candidates, key=key))


# ---------------------------------------------------------------------------------------------
# A decimal literal's float32, exactly
# ---------------------------------------------------------------------------------------------


@given(
    st.floats(width=32, min_value=2.0**-126, max_value=float(np.finfo(np.float32).max)),
    st.sampled_from([-1, 0, 1]),
    st.integers(160, 200),
)
def test_nearest_float32_settles_literals_at_and_around_a_midpoint(value, side, digits):
    """Between a float32 and the next one, the midpoint goes to the even one, and a literal a hair above or below
    it (too close for float64 to tell apart) to the nearer one: against exact rational rounding."""
    lower = np.float32(value)
    with np.errstate(over="ignore"):
        upper = np.nextafter(lower, np.float32(np.inf))
    upper_value = float(upper) if np.isfinite(upper) else 2.0**128  # where the next float32 would be
    with localcontext(prec=300):  # exact: a float32 midpoint has at most 150 significant digits
        midpoint = (Decimal(float(lower)) + Decimal(upper_value)) / 2
        literal = format(midpoint + side * Decimal(10) ** (midpoint.adjusted() - digits), "f")
    if np.isfinite(upper):
        expected = _float32_nearest(Fraction(Decimal(literal)))
    else:  # at or above 2**128 - 2**103, halfway to 2**128, a literal overflows (the tie goes to the even 2**128)
        expected = math.inf if side >= 0 else float(lower)
    assert bits(nearest_float32(literal)) == bits(expected)


@given(st.integers(1, 2**23 - 1), st.integers(-8, 8))
def test_within_float32_precision_is_the_exact_relative_bound(multiple, nudge):
    """``|v - x| <= 2**-24 |x|`` for a subnormal v and decimals x around it, against rational arithmetic."""
    value = multiple * 2.0**-149
    exact = Decimal(value) * (1 + Decimal(nudge) * Decimal(2) ** -27 * (1 + Decimal(multiple % 7) / 10))
    oracle = abs(Fraction(value) - Fraction(exact)) <= abs(Fraction(exact)) / 2**24
    assert within_float32_precision(exact, value) == oracle


@given(
    st.lists(
        st.tuples(
            st.floats(width=32, min_value=2.0**-149, max_value=float(np.finfo(np.float32).max)),
            st.sampled_from([-1, 0, 1]),
            st.integers(30, 60),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_nearest_float32_many_is_nearest_float32_of_each(cases):
    """Literals at, a hair above and a hair below float32 midpoints (where float64 cannot tell them apart), and at
    the overflow threshold: rounded together, each gets exactly what `nearest_float32` gives it alone."""
    literals = []
    for value, side, digits in cases:
        lower = np.float32(value)
        with np.errstate(over="ignore"):
            upper = np.nextafter(lower, np.float32(np.inf))
        upper_value = float(upper) if np.isfinite(upper) else 2.0**128
        with localcontext(prec=300):
            midpoint = (Decimal(float(lower)) + Decimal(upper_value)) / 2
            literals.append(format(midpoint + side * Decimal(10) ** (midpoint.adjusted() - digits), "f"))
    literals += ["0", "1e999", "340282356779733661637539395458142568448", "3.4028235e38", "1e-50", "0.1"]
    assert [bits(value) for value in nearest_float32_many(literals)] == [bits(nearest_float32(x)) for x in literals]


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
        (
            3e-45,
            ValueError,
            r"cannot format 3e-45: float32 holds it only as the subnormal 2\.802597e-45, off by 0\.066",
        ),
        (
            1e-40,
            ValueError,
            r"cannot format 1e-40: float32 holds it only as the subnormal 9\.999946e-41, off by 5\.4e-06",
        ),
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


@pytest.mark.parametrize(
    "value, expected",
    [
        (2.0**-149, "1.4012985e-45"),  # numpy's shortest unique text is "1e-45", 29% off
        (2 * 2.0**-149, "2.802597e-45"),  # the float32 of "3e-45"
        (-(2.0**-126 - 2.0**-149), "-1.1754942e-38"),  # the largest subnormal
        (2.0**-126, "1.1754944e-38"),  # the smallest normal: numpy's text, which is within 2**-24
        (np.float32(1e-40), "9.999946e-41"),
    ],
)
def test_format_number_subnormal_table(value, expected):
    assert format_number(value) == expected
    assert bits(parse_number(expected)) == bits(float(value))


@pytest.mark.parametrize(
    "literal, expected",
    [
        ("1" + "0" * 1_000_000, math.inf),  # a million digits: beyond float32
        ("0." + "0" * 100_000 + "1", 0.0),  # below half the smallest subnormal
        ("340282356779733661637539395458142568447", float(np.finfo(np.float32).max)),  # a hair below the threshold
        ("340282356779733661637539395458142568448", math.inf),  # 2**128 - 2**103 exactly: the tie goes to 2**128
        (format(Decimal(2.0**-150), "f"), 0.0),  # halfway between 0 and 2**-149: to the even one, 0
        (format(Decimal(3 * 2.0**-150), "f"), 2 * 2.0**-149),  # halfway between 2**-149 and 2**-148: to 2**-148
    ],
)
def test_nearest_float32_at_the_ends_of_the_range(literal, expected):
    """Literals of any length at and beyond float32's ends, against the bounds written out exactly."""
    assert bits(nearest_float32(literal)) == bits(expected)


def test_within_float32_precision_keeps_every_digit_of_a_long_literal():
    """A literal of 100,001 digits differing from 1 in its last digit is within 2**-24 of 1.0; one that differs
    by 2**-23 is not."""
    assert within_float32_precision(Decimal("1." + "0" * 100_000 + "1"), 1.0)
    assert not within_float32_precision(Decimal(1) + Decimal(2) ** -23, 1.0)


@pytest.mark.parametrize("multiple", [1, 2, 3, 7, 2**22, 2**23 - 1])
def test_subnormal_text_is_within_float32_precision_and_reads_back(multiple):
    """The text of a subnormal float32 is within 2**-24 of it (rational arithmetic) and rounds back to it."""
    value = float(np.float32(multiple * 2.0**-149))
    text = subnormal_text(np.float32(value))
    assert abs(Fraction(Decimal(text)) - Fraction(value)) <= abs(Fraction(value)) / 2**24
    assert bits(float(text)) == bits(value)


@pytest.mark.parametrize(
    "value, oracle",
    [
        (Fraction(1, 3), np.float32(1 / 3)),  # any numbers.Real
        (np.float16(0.1), np.float32(np.float16(0.1))),  # a half: its own value, widened exactly
        (np.float64(2.0**128 - 2.0**104), np.finfo(np.float32).max),  # the largest float32, given as a float64
        (np.float64(np.nextafter(2.0**128 - 2.0**103, 0)), np.finfo(np.float32).max),  # a hair below overflow
        (-(2**53 + 1), np.float32(-(2**53))),  # a Python int float64 cannot hold: rounded, not refused
    ],
)
def test_format_number_of_other_real_types_is_numpys_float32_text(value, oracle):
    text = format_number(value)
    assert Decimal(text) == Decimal(str(oracle))
    assert bits(parse_number(text)) == bits(float(oracle))


@pytest.mark.parametrize(
    "value, error, match",
    [
        (Decimal("1.5"), TypeError, "real number, got Decimal"),  # not a numbers.Real: refused, never guessed
        (np.bool_(True), TypeError, "real number, got bool"),
        (1 + 2j, TypeError, "real number, got complex"),
        ([1.0], TypeError, "real number, got list"),
        (np.float64(2.0**128 - 2.0**103), ValueError, "overflows float32"),  # the tie rounds to 2**128
        (-(10**400), ValueError, "overflows float32"),
        (np.float64(-np.inf), ValueError, "no NaN or infinity"),
    ],
)
def test_format_number_names_what_it_refuses(value, error, match):
    with pytest.raises(error, match=match):
        format_number(value)
