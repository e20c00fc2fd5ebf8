"""Executable specification of causalqwen.writing: the resolution a literal states, a value written at a resolution,
and `NumericTokenizer.decode` writing generated numbers at one -- any finite float32 at any resolution float32 allows,
beside prompts whose numbers have any number of digits.

Expectations come from hand-written tables and from exact decimal arithmetic (``decimal.Decimal``, in a context
holding every digit), never from the code under test.
"""

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.float32 import format_number
from causalqwen.numbers import find_numbers, parse_number
from causalqwen.writing import (
    check_resolution,
    literal_resolution,
    prompt_exponent,
    resolution_exponent,
    resolution_for,
    write_at_resolution,
)


@pytest.mark.parametrize(
    "literal, resolution",
    [
        ("2.5", 0.1),
        ("37", 1.0),
        ("1,000", 1.0),
        (".05", 0.01),
        ("1.20e3", 10.0),
        ("-3", 1.0),
        ("−2.50", 0.01),
        ("1E-2", 0.01),
        ("2.5e+1", 1.0),
        ("0", 1.0),
        ("7.000", 0.001),
    ],
)
def test_literal_resolution_table(literal, resolution):
    assert literal_resolution(literal) == pytest.approx(resolution, rel=1e-15)


@pytest.mark.parametrize(
    "bad, error", [("2024-03-15", ValueError), ("abc", ValueError), ("1 2", ValueError), (2.5, TypeError)]
)
def test_literal_resolution_refuses_what_is_not_one_number(bad, error):
    with pytest.raises(error):
        literal_resolution(bad)


@pytest.mark.parametrize(
    "value, resolution, expected",
    [
        (2.5007427, 0.01, "2.50"),
        (2.5007427, 0.1, "2.5"),
        (2.5007427, 1, "3"),
        (1234.5, 10, "1230"),
        (1234.5, 100, "1200"),
        (-0.04, 0.1, "0.0"),
        (0.5, 1, "0"),
        (1.5, 1, "2"),
        (-7.25, 0.1, "-7.2"),
        (1234567936.0, 1, "1,234,567,936"),
        (2.5007427, None, "2.5007427"),
    ],
)
def test_write_at_resolution_table(value, resolution, expected):
    """Half to even on the float32 value's exact decimal expansion; more than 9 significant digits of a plain run
    would be an identifier (rule V2), so such integers are grouped."""
    assert write_at_resolution(value, check_resolution(resolution)) == expected


@given(st.floats(width=32, min_value=-(2.0**40), max_value=2.0**40, allow_nan=False), st.integers(-6, 6))
def test_written_text_reads_back_within_half_the_resolution(value, exponent):
    """The text is one number of the grammar, within h/2 of the float32 value (exactly, in decimal), with as many
    decimals as the resolution asks for."""
    resolution = check_resolution(10.0**exponent)
    text = write_at_resolution(value, resolution)
    found = find_numbers(text)
    assert [(n.start, n.end) for n in found] == [(0, len(text))]
    written = Decimal(text.replace(",", ""))
    assert abs(written - Decimal(float(np.float32(value)))) <= Decimal(10) ** exponent / 2
    assert (len(text.split(".")[1]) if "." in text else 0) == max(0, -exponent)
    parse_number(text)


@pytest.mark.parametrize(
    "bad, error",
    [
        (0.3, ValueError),
        ("coarse", ValueError),
        (True, TypeError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (1e40, ValueError),
        ([0.1], TypeError),
    ],
)
def test_check_resolution_names_a_bad_resolution(bad, error):
    with pytest.raises(error, match="number_resolution"):
        check_resolution(bad)


def test_prompt_exponent_is_that_of_the_finest_of_the_prompts_numbers():
    assert prompt_exponent(["2.5", "37", "1.25"]) == -2
    assert prompt_exponent(["1.20e3"]) == 1
    assert prompt_exponent([]) is None


def test_decode_writes_generated_numbers_at_the_resolution_and_keeps_the_values():
    """A generated value 2.5007427 after a prompt with "1.25": written 2.50 with "prompt", 2.5007427 by default;
    the value beside the ids is the same in every case."""
    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    ids, values, texts = tokenizer.encode("It was 1.25, now it is", return_number_texts=True)
    ids, values = ids + [tokenizer.num_token_id], values + [2.5007427]
    assert tokenizer.decode(ids, values, number_texts=texts).endswith("2.5007427")
    assert tokenizer.decode(ids, values, number_texts=texts, number_resolution="prompt").endswith("is 2.50")
    assert tokenizer.decode(ids, values, number_texts=texts, number_resolution=1).endswith("is 3")
    _, continuation = tokenizer.decode_continuation(
        ids, values, len(ids) - 1, number_texts=texts, number_resolution=0.1
    )
    assert continuation == " 2.5"
    assert tokenizer.batch_decode([ids], [values], number_texts=[texts], number_resolution="prompt")[0].endswith("2.50")
    with pytest.raises(ValueError, match="number_resolution"):
        tokenizer.decode(ids, values, number_resolution=0.5)


# ---------------------------------------------------------------------------------------------
# number_resolution="prompt": the prompt's resolution (the unit without one), keeping two significant digits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, prompt, expected",
    [
        (2.4996202, [], "2.5"),
        (2.4996204, [], "2.5"),
        (2.4996202, ["12.50"], "2.50"),
        (2.4996202, ["1.20e3"], "2.5"),
        (2.4996202, ["3e5"], "2.5"),
        (2.4996202, ["3.14159"], "2.49962"),
        (24.01, ["7"], "24"),
        (32.7, ["58"], "33"),
        (2026.3, [], "2026"),
        (2026.3, ["2,025"], "2026"),
        (0.0, [], "0"),
        (0.0, ["0.25"], "0.00"),
        (-0.000123456, [], "-0.00012"),
        (0.0312, ["7"], "0.031"),
        (123456.7, ["1e3"], "123000"),
        (123456.7, ["1.20e3"], "123460"),
        (1234567936.0, [], "1,234,567,936"),
        (9.996, [], "10.0"),
        (2.5, ["1e-3"], "2.500"),
    ],
)
def test_a_generated_number_is_written_at_the_prompts_resolution_keeping_two_digits(value, prompt, expected):
    """h = min(h_prompt, 10^(floor(log10|v|) - 1)), h_prompt the unit without a prompt number: 24 after "7 days",
    2.50 after prices in cents, a year 2026.3 is 2026, and a coarse prompt ("1.20e3", "3e5") never writes 2.5 as 2
    or 0; float32 noise below the written digits does not change the text."""
    prompt_k = min((resolution_exponent(text) for text in prompt), default=None)
    assert write_at_resolution(value, resolution_for(value, prompt_k)) == expected


def _floor_log10(value: float) -> int:
    """floor(log10 |v|) of a non-zero float, by exact rational comparison with powers of ten."""
    exact = abs(Fraction(value))
    exponent = math.floor(math.log10(float(exact)))  # then corrected exactly: the float log10 can be one off
    while Fraction(10) ** exponent > exact:
        exponent -= 1
    while Fraction(10) ** (exponent + 1) <= exact:
        exponent += 1
    return exponent


@given(st.floats(width=32, allow_nan=False, allow_infinity=False), st.one_of(st.none(), st.integers(-200, 40)))
def test_resolution_for_is_the_finer_of_the_prompts_and_two_significant_digits(value, prompt_k):
    """Against floor(log10 |v|) by exact rational comparison; 10^-149 bounds it below (no float32 has a digit
    beyond) and 10^38 above (float32's largest order, which only a zero after a coarser prompt reaches)."""
    candidates = [0 if prompt_k is None else prompt_k]
    if value != 0:
        candidates.append(_floor_log10(value) - 1)
    assert resolution_for(value, prompt_k) == 10.0 ** max(min(candidates + [38]), -149)  # float32's orders


def test_decode_at_prompt_never_writes_a_value_as_a_number_that_loses_it():
    """A prompt whose only number is coarser than the unit ("1.20e3", h = 10) wrote a generated 2.4996202 as "0";
    it is 2.5. Without a prompt number, 2.5 too, and the float32 noise of a padded batch gives the same text."""
    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    for prompt, expected in (("It was 1.20e3, now it is", "is 2.5"), ("Now it is", "is 2.5")):
        ids, values, texts = tokenizer.encode(prompt, return_number_texts=True)
        ids, values = ids + [tokenizer.num_token_id], values + [2.4996202]
        assert tokenizer.decode(ids, values, number_texts=texts, number_resolution="prompt").endswith(expected)
        noisy = values[:-1] + [2.4996204]
        assert tokenizer.decode(ids, noisy, number_texts=texts, number_resolution="prompt").endswith(expected)


@pytest.mark.parametrize(
    "bad, error, match",
    [(2.5, TypeError, "prompt_exponent"), (True, TypeError, "prompt_exponent"), ("-2", TypeError, "prompt_exponent")],
)
def test_resolution_for_names_a_bad_prompt_exponent(bad, error, match):
    with pytest.raises(error, match=match):
        resolution_for(2.5, bad)


@pytest.mark.parametrize(
    "value, error", [(math.nan, ValueError), (math.inf, ValueError), (1e39, ValueError), ("2.5", TypeError)]
)
def test_resolution_for_names_a_bad_value(value, error):
    with pytest.raises(error):
        resolution_for(value, None)


@pytest.mark.parametrize("resolution", [1e-45, 1e38, 1e-30, 1e30])
def test_check_resolution_takes_powers_of_ten_across_float32s_range(resolution):
    assert check_resolution(resolution) == resolution


@pytest.mark.parametrize("bad", [1e-46, 1e39, 10**400, 1e-149])
def test_check_resolution_refuses_powers_of_ten_beyond_float32s_range(bad):
    with pytest.raises(ValueError, match="between 1e-45 and 1e38"):
        check_resolution(bad)


@pytest.mark.parametrize("value, resolution", [(2.0**-149, 1e-45), (2.0**-148, 1e-45), (3 * 2.0**-149, 1e-46)])
def test_a_subnormal_whose_rounded_text_would_be_text_is_written_at_the_next_finer_power_that_reads_back(
    value, resolution
):
    """2**-149 at 1e-45 would round to "0.000...001", 1e-45, which rule V1 reads as text (float32 holds it only
    29% off): the text is then the fewest further decimals that read back, here those of its faithful scientific text
    (`format_number`'s "1.4012985e-45"), written positionally."""
    expected = format(Decimal(format_number(value)), "f")
    text = write_at_resolution(value, resolution)
    assert text == expected
    assert parse_number(text) == value


def test_the_largest_float32_at_1e35_would_round_past_float32_and_is_written_one_digit_finer():
    """3.4028235e38 to the nearest 1e35 is 3.403e38, beyond the largest float32 (text, rule V1): 1e34 gives
    3.4028e38."""
    largest = float(np.finfo(np.float32).max)
    assert write_at_resolution(largest, 1e35) == "34028" + "0" * 34
    assert write_at_resolution(largest, 1e34) == "34028" + "0" * 34


# ---------------------------------------------------------------------------------------------
# Written: any finite float32 at any allowed resolution, beside prompts of any size
# ---------------------------------------------------------------------------------------------
# Oracle: exact decimal arithmetic (``decimal.Decimal`` in a context holding every digit).

FLOAT32_MAX = float(np.finfo(np.float32).max)


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
