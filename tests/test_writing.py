"""Executable specification of causalqwen.writing: the resolution a literal states, a value written at a resolution,
and `NumericTokenizer.decode` writing generated numbers at one.

Expectations come from hand-written tables and from exact decimal arithmetic (``decimal.Decimal``), never from the
code under test.
"""

from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.numbers import find_numbers, parse_number
from causalqwen.tokenization import NumericTokenizer
from causalqwen.writing import check_resolution, literal_resolution, prompt_resolution, write_at_resolution


@pytest.mark.parametrize("literal, resolution", [
    ("2.5", 0.1), ("37", 1.0), ("1,000", 1.0), (".05", 0.01), ("1.20e3", 10.0), ("-3", 1.0), ("−2.50", 0.01),
    ("1E-2", 0.01), ("2.5e+1", 1.0), ("0", 1.0), ("7.000", 0.001),
])
def test_literal_resolution_table(literal, resolution):
    assert literal_resolution(literal) == pytest.approx(resolution, rel=1e-15)


@pytest.mark.parametrize("bad, error", [("2024-03-15", ValueError), ("abc", ValueError), ("1 2", ValueError),
                                         (2.5, TypeError)])
def test_literal_resolution_refuses_what_is_not_one_number(bad, error):
    with pytest.raises(error):
        literal_resolution(bad)


@pytest.mark.parametrize("value, resolution, expected", [
    (2.5007427, 0.01, "2.50"), (2.5007427, 0.1, "2.5"), (2.5007427, 1, "3"), (1234.5, 10, "1230"),
    (1234.5, 100, "1200"), (-0.04, 0.1, "0.0"), (0.5, 1, "0"), (1.5, 1, "2"), (-7.25, 0.1, "-7.2"),
    (1234567936.0, 1, "1,234,567,936"), (2.5007427, None, "2.5007427"),
])
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


@pytest.mark.parametrize("bad, error", [(0.3, ValueError), ("coarse", ValueError), (True, TypeError),
                                         (-1, ValueError), (float("nan"), ValueError), (1e40, ValueError),
                                         ([0.1], TypeError)])
def test_check_resolution_names_a_bad_resolution(bad, error):
    with pytest.raises(error, match="number_resolution"):
        check_resolution(bad)


def test_prompt_resolution_is_the_finest_of_the_prompts_numbers():
    assert prompt_resolution(["2.5", "37", "1.25"]) == pytest.approx(0.01)
    assert prompt_resolution([]) is None


def test_decode_writes_generated_numbers_at_the_resolution_and_keeps_the_values():
    """A generated value 2.5007427 after a prompt with "1.25": written 2.50 with "prompt", 2.5007427 by default;
    the value beside the ids is the same in every case."""
    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    encoding = tokenizer("It was 1.25, now it is", padding=False, return_tensors=None)
    ids = encoding["input_ids"][0] + [tokenizer.num_token_id]
    values = encoding["numeric_values"][0] + [2.5007427]
    texts = encoding.number_texts[0]
    assert tokenizer.decode(ids, values, number_texts=texts).endswith("2.5007427")
    assert tokenizer.decode(ids, values, number_texts=texts, number_resolution="prompt").endswith("is 2.50")
    assert tokenizer.decode(ids, values, number_texts=texts, number_resolution=1).endswith("is 3")
    _, continuation = tokenizer.decode_continuation(ids, values, len(ids) - 1, number_texts=texts,
                                                    number_resolution=0.1)
    assert continuation == " 2.5"
    assert tokenizer.batch_decode([ids], [values], number_texts=[texts], number_resolution="prompt")[0].endswith("2.50")
    with pytest.raises(ValueError, match="number_resolution"):
        tokenizer.decode(ids, values, number_resolution=0.5)
