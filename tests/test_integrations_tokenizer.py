"""The transformers tokenizer (`causalqwen.integrations.tokenizer`): a script written from transformers
habit, run against `causalqwen.NumericTokenizer`, and the number token it adds. Its bounds on crafted input: with
``max_length`` only a bounded prefix of a text is encoded, and gives the whole text's first tokens; a large batch
goes in chunks, each text getting the row it has alone; one transformers tokenizer is shared safely by threads and
by wrappers; and a literal at the bottom of float32's range that float32 holds only approximately stays text.

The oracles: the texts themselves (round trips), a fresh wrapped tokenizer that never saw ``<NUM>`` (special
tokens, vocabulary, token strings), the wrapped tokenizer's own ``decode`` (which writes ``<NUM>``, its special
added token, literally), numpy's float32 rounding of the values written in the texts, exact rational arithmetic,
the reference path (every run between numbers encoded on its own), the whole text encoded, and values chosen here.
The number token named by a ``tokenizer_config.json`` (or passed to the constructor) must not be a token the
wrapped tokenizer already has for another role (end of text, padding, its chat template's specials) nor an
ordinary token; the error names the file, the token and the clash.
"""

import base64
import copy
import gc
import json
import random
import re
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tokenization import VOCABULARIES  # the tiny and the real Qwen2.5 vocabulary
from transformers import (
    AutoTokenizer,
    DataCollatorWithPadding,
)
from wall_clock import budget

from causalqwen import NumericTokenizer, tokenization
from causalqwen.app.tiny import build_tiny_base, build_tiny_tokenizer
from causalqwen.files.data import TextDataset, read_jsonl, synthetic_texts
from causalqwen.float32 import format_number
from causalqwen.integrations import tokenizer as tokenizer_module
from causalqwen.numbers import find_numbers, parse_number, split_texts
from validation.qwen_vocabulary import build_qwen25_tokenizer

TEXTS = ["It costs 2.5 dollars.", "Add 37 and 5."]


SPECIAL_ATTRIBUTES = [
    "eos_token",
    "eos_token_id",
    "pad_token",
    "pad_token_id",
    "bos_token",
    "bos_token_id",
    "unk_token",
    "unk_token_id",
    "vocab_size",
]


def test_tokenize_run_the_model_and_decode_as_transformers_users_do(tiny):
    model, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    assert isinstance(enc["input_ids"], torch.Tensor) and enc.input_ids.shape == enc.numeric_values.shape
    with torch.no_grad():
        out = model(**enc)
    assert out.logits.shape[:2] == enc.input_ids.shape
    assert tok.batch_decode(enc.input_ids, enc.numeric_values, skip_special_tokens=True) == TEXTS
    assert tok.batch_decode(enc) == TEXTS
    # the values, float32-exact at the <NUM> positions, as numpy rounds the numbers written in the texts
    numbers = [enc.numeric_values[b][enc.input_ids[b] == tok.num_token_id].tolist() for b in range(2)]
    assert numbers == [[float(np.float32(2.5))], [float(np.float32(37)), float(np.float32(5))]]


def test_the_default_padding_is_on_the_left_for_generation(tiny):
    _, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    lengths = [len(tok.encode(text)[0]) for text in TEXTS]
    width = max(lengths)
    assert tok.padding_side == "left"
    for row, length in enumerate(lengths):
        assert enc.attention_mask[row].tolist() == [0] * (width - length) + [1] * length
        assert enc.input_ids[row, : width - length].tolist() == [tok.pad_token_id] * (width - length)
    right = tok(TEXTS, padding=True, padding_side="right")
    assert right.attention_mask[0].tolist() == [1] * lengths[0] + [0] * (width - lengths[0])


def test_decoding_plain_ids_writes_the_number_token_never_a_number(tiny):
    _, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    assert tok.decode(enc.input_ids[1]) == "Add <NUM> and <NUM>."
    assert tok.batch_decode(enc.input_ids, skip_special_tokens=True) == [
        "It costs <NUM> dollars.",
        "Add <NUM> and <NUM>.",
    ]
    for row in enc.input_ids:  # the wrapped tokenizer writes <NUM>, its special added token, as its text too
        expected = tok.hf_tokenizer.decode(row, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert tok.decode(row, skip_special_tokens=False) == expected
    with pytest.raises(TypeError, match="number_texts needs numeric_values"):
        tok.decode(enc.input_ids[0], number_texts=["2.5"])


def test_return_tensors_none_and_np_are_lists_and_arrays(tiny):
    _, tok = tiny
    lists = tok(TEXTS, return_tensors=None, padding=False)
    expected = [tok.encode(text) for text in TEXTS]  # rows of different lengths: nothing pads them
    assert lists["input_ids"] == [ids for ids, _ in expected]
    assert lists["numeric_values"] == [values for _, values in expected]
    assert lists["attention_mask"] == [[1] * len(ids) for ids, _ in expected]
    assert all(type(value) is float for row in lists["numeric_values"] for value in row)
    arrays = tok(TEXTS, return_tensors="np", padding="longest")
    tensors = tok(TEXTS, return_tensors="pt")
    assert arrays["input_ids"].dtype == np.int64 and arrays["numeric_values"].dtype == np.float32
    for key in tensors:
        assert arrays[key].tolist() == tensors[key].tolist()
    assert "attention_mask" not in tok(TEXTS, return_attention_mask=False)
    assert tok(TEXTS, padding="do_not_pad", return_tensors=None)["input_ids"] == lists["input_ids"]
    cut = tok(TEXTS, truncation="longest_first", max_length=3, return_tensors=None, padding=False)
    assert cut["input_ids"] == [ids[:3] for ids, _ in expected]


def test_bad_keywords_are_named(tiny):
    _, tok = tiny
    with pytest.raises(TypeError, match="return_tensor"):
        tok(TEXTS, return_tensor="pt")
    with pytest.raises(ValueError, match="return_tensors must be"):
        tok(TEXTS, return_tensors="tf")
    with pytest.raises(ValueError, match="padding=False needs texts of equal token length"):
        tok(TEXTS, padding=False)


def test_special_tokens_and_vocabulary_are_the_wrapped_tokenizers(tiny):
    _, tok = tiny
    fresh = build_tiny_tokenizer()  # never wrapped: no <NUM>
    for name in SPECIAL_ATTRIBUTES:
        assert getattr(tok, name) == getattr(fresh, name), name
    assert tok.bos_token is None and tok.bos_token_id is None  # Qwen2 has none
    assert tok.all_special_tokens == fresh.all_special_tokens + ["<NUM>"]
    assert tok.all_special_ids == fresh.all_special_ids + [tok.num_token_id]
    assert len(tok) == len(fresh) + 1 and tok.num_token_id == len(fresh)
    ids = list(range(len(fresh)))
    assert tok.convert_ids_to_tokens(ids) == fresh.convert_ids_to_tokens(ids)
    assert tok.convert_ids_to_tokens(tok.num_token_id) == "<NUM>"
    assert tok.convert_ids_to_tokens(torch.tensor([5, tok.num_token_id])) == [fresh.convert_ids_to_tokens(5), "<NUM>"]
    assert tok.convert_tokens_to_ids(fresh.convert_ids_to_tokens(ids)) == ids
    assert tok.convert_tokens_to_ids("<NUM>") == tok.num_token_id
    assert tok.get_vocab() == fresh.get_vocab() | {"<NUM>": tok.num_token_id}


def test_pad_token_can_be_set_as_transformers_users_do():
    hf = build_tiny_tokenizer()
    hf.pad_token = None
    tok = NumericTokenizer(hf)
    assert tok.pad_token is None and tok.pad_token_id is None
    with pytest.raises(ValueError, match="no pad token; set tokenizer.pad_token"):
        tok(TEXTS)
    tok.pad_token = tok.eos_token
    assert tok.pad_token_id == tok.eos_token_id == hf.eos_token_id
    assert tok.batch_decode(tok(TEXTS)) == TEXTS


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_interface_survives_a_save_and_autotokenizer(tiny, tmp_path, side):
    _, tok = tiny
    fresh = NumericTokenizer(build_tiny_tokenizer(), padding_side=side)
    fresh.save_pretrained(tmp_path)
    for loaded in (
        NumericTokenizer.from_pretrained(tmp_path),
        AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True),
    ):
        assert isinstance(loaded, NumericTokenizer) and loaded.padding_side == side
        for name in SPECIAL_ATTRIBUTES + ["all_special_tokens", "all_special_ids"]:
            assert getattr(loaded, name) == getattr(tok, name), name
        assert loaded.num_token_id == tok.num_token_id and len(loaded) == len(tok)
        enc = loaded(TEXTS, return_tensors="pt")
        assert loaded.batch_decode(enc.input_ids, enc.numeric_values) == TEXTS
        assert torch.equal(enc.numeric_values, tok(TEXTS, padding_side=side).numeric_values)


def test_numbers_survive_generate_on_the_documented_path(tiny):
    model, tok = tiny
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    plain = model.generate(**enc, max_new_tokens=3, do_sample=False)
    full = model.generate(**enc, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(plain, full.sequences)
    # plain ids: the prompt's numbers are written as <NUM>, never as a wrong number
    assert tok.decode(plain[1]).startswith("Add <NUM> and <NUM>.")
    # return_dict_in_generate=True gives the values: the prompt comes back with its numbers
    for row, text in enumerate(TEXTS):
        decoded = tok.decode(full.sequences[row], full.numeric_values[row])
        assert decoded.startswith(text)


def test_add_special_tokens_is_taken_where_it_adds_nothing(tiny):
    _, tok = tiny
    expected = tok(TEXTS)
    for flag in (True, False):  # Qwen2 adds no special token to a text: both are the plain encoding
        assert torch.equal(tok(TEXTS, add_special_tokens=flag).input_ids, expected.input_ids)
    with pytest.raises(TypeError, match="add_special_tokens must be a bool"):
        tok(TEXTS, add_special_tokens="yes")


def test_add_special_tokens_true_is_refused_where_the_wrapped_tokenizer_would_add_some():
    from tokenizers.processors import TemplateProcessing

    hf = build_tiny_tokenizer()
    start = hf.convert_tokens_to_ids("<|im_start|>")
    hf.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", start)]
    )
    assert hf("a")["input_ids"][0] == start  # the wrapped tokenizer now adds a token in front
    tok = NumericTokenizer(hf)
    with pytest.raises(ValueError, match="the wrapped tokenizer adds special tokens"):
        tok(TEXTS, add_special_tokens=True)
    enc = tok(TEXTS, add_special_tokens=False)
    assert start not in enc.input_ids.tolist()[1] and tok.batch_decode(enc, skip_special_tokens=False) == TEXTS


def test_decode_takes_one_id_as_transformers_does():
    """``decode(id)``: one id is a row of one; a ``<NUM>`` with its value writes the value, without it ``<NUM>``."""
    from causalqwen import NumericTokenizer
    from causalqwen.app.tiny import build_tiny_tokenizer

    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    (token,) = tokenizer.encode("a")[0]
    assert tokenizer.decode(token) == tokenizer.decode([token]) == "a"
    assert tokenizer.decode(tokenizer.num_token_id) == "<NUM>"
    assert tokenizer.decode(tokenizer.num_token_id, 2.5) == "2.5"


PLAIN = ["It costs dollars.", "价格是元", "a"]  # texts without numbers: the wrapped tokenizer is the oracle


def test_one_text_gives_lists_as_transformers_gives_them(tiny):
    """``tok("one text")``: flat lists, as the wrapped transformers tokenizer returns for one text; tensors
    ``[1, S]`` where ``return_tensors`` asks for them; a list of texts keeps tensors by default."""
    _, tok = tiny
    for text in PLAIN:
        theirs = tok.hf_tokenizer(text)
        ours = tok(text)
        assert ours["input_ids"] == theirs["input_ids"] and ours["attention_mask"] == theirs["attention_mask"]
        assert ours["numeric_values"] == [0.0] * len(theirs["input_ids"]) and ours.number_texts == []
        for asked in ("pt", "np"):
            assert (
                tok(text, return_tensors=asked)["input_ids"].tolist()
                == tok.hf_tokenizer(text, return_tensors=asked)["input_ids"].tolist()
            )
    one = tok("It costs 12.50 dollars, not 3.")
    ids, values, texts = tok.encode("It costs 12.50 dollars, not 3.", return_number_texts=True)
    assert one["input_ids"] == ids and one["numeric_values"] == values and one.number_texts == texts == ["12.50", "3"]
    assert all(type(token) is int for token in one["input_ids"]) and all(
        type(v) is float for v in one["numeric_values"]
    )
    assert tok("It costs 12.50 dollars, not 3.", return_tensors=None)["input_ids"] == ids  # None said: the same
    assert (
        tok.decode(one["input_ids"], one["numeric_values"], number_texts=one.number_texts)
        == "It costs 12.50 dollars, not 3."
    )
    assert tok.batch_decode(one) == ["It costs 12.50 dollars, not 3."]  # a batch of one, as transformers'
    wide = tok("x 1", padding="max_length", max_length=6, padding_side="right", return_attention_mask=False)
    assert wide["input_ids"] == tok.encode("x 1")[0] + [tok.pad_token_id] * 3 and "attention_mask" not in wide
    assert isinstance(tok(["x 1"])["input_ids"], torch.Tensor)  # a list of texts: tensors (D15)


def test_one_text_rows_go_through_datasets_map_and_the_stock_collator(tiny):
    """``dataset.map(lambda row: tok(row["text"]))`` stores rows of lists; transformers' own
    ``DataCollatorWithPadding`` pads them, values included, as the tokenizer pads the same texts."""
    from datasets import Dataset

    _, tok = tiny
    texts = ["It costs 12.50 dollars.", "Add 37 and 5.", "no number here at all"]
    dataset = Dataset.from_dict({"text": texts}).map(lambda row: tok(row["text"]), remove_columns=["text"])
    assert dataset.column_names == ["input_ids", "numeric_values", "attention_mask"]
    assert dataset[0]["input_ids"] == tok.encode(texts[0])[0]
    batch = DataCollatorWithPadding(tok)([dataset[index] for index in range(3)])
    expected = tok(texts)
    for key in expected:
        assert torch.equal(batch[key], expected[key]), key
    assert tok.batch_decode(batch, number_texts=expected.number_texts) == texts


def test_decode_of_a_batch_gives_one_text_per_row_as_transformers(tiny):
    """transformers' ``decode`` of a 2-D input (a [1, S] tensor, a list of rows) returns one text per row: so does
    ours, with the values given in the same shape, and ``batch_decode`` of one row gives a list of one text."""
    _, tok = tiny
    plain = tok(PLAIN[:1], return_tensors="pt")
    theirs = tok.hf_tokenizer.decode(plain["input_ids"], skip_special_tokens=True)
    assert isinstance(theirs, list) and tok.decode(plain["input_ids"]) == theirs == PLAIN[:1]
    enc = tok(TEXTS, return_tensors="pt", padding=True, padding_side="right")
    rows = [tok.decode(enc["input_ids"][b], enc["numeric_values"][b]) for b in range(2)]
    assert rows == TEXTS
    assert tok.decode(enc["input_ids"], enc["numeric_values"]) == TEXTS
    assert tok.decode(enc["input_ids"].tolist(), enc["numeric_values"].tolist()) == TEXTS
    assert tok.decode(enc["input_ids"][:1], enc["numeric_values"][:1]) == TEXTS[:1]
    assert tok.decode(enc["input_ids"].numpy(), enc["numeric_values"].numpy()) == TEXTS
    assert tok.decode(enc["input_ids"]) == ["It costs <NUM> dollars.", "Add <NUM> and <NUM>."]  # plain ids
    written = tok(["It was 12.50 and"], return_tensors="pt")
    assert tok.decode(written["input_ids"], written["numeric_values"], number_texts=written.number_texts) == [
        "It was 12.50 and"
    ]
    assert tok.batch_decode(enc["input_ids"][0], enc["numeric_values"][0]) == TEXTS[:1]  # one row: a list of one
    assert tok.batch_decode(enc["input_ids"][0].tolist(), enc["numeric_values"][0].tolist()) == TEXTS[:1]
    assert tok.batch_decode([]) == [] and tok.batch_decode(torch.zeros(0, 3, dtype=torch.long)) == []
    assert tok.decode([]) == ""


@pytest.mark.parametrize(
    "ids, values, match",
    [
        (torch.tensor([[1, 2]]), [0.0, 0.0], "input_ids is a batch of 1 rows but numeric_values is not"),
        ([[1, 2], [3, 4]], torch.zeros(2), "input_ids is a batch of 2 rows but numeric_values is not"),
        (torch.tensor([1, 2]), torch.zeros(1, 2), "numeric_values must be 1-D"),
        (torch.ones(1, 1, 2, dtype=torch.long), torch.zeros(1, 1, 2), "input_ids must be 2-D"),
        ([[1, 2], [3]], [[0.0, 0.0], [0.0, 0.0]], "row 1: input_ids has length 1 but numeric_values has length 2"),
    ],
)
def test_decode_names_a_batch_whose_values_do_not_fit(tiny, ids, values, match):
    _, tok = tiny
    with pytest.raises(ValueError, match=match):
        tok.decode(ids, values)


def test_decode_of_a_batch_names_number_texts_given_for_one_row(tiny):
    _, tok = tiny
    enc = tok(["It was 12.50 and"])
    with pytest.raises(TypeError, match=r"number_texts of a batch holds one list of str per row .*'12.50'"):
        tok.decode(enc["input_ids"], enc["numeric_values"], number_texts=["12.50"])


def test_decoding_at_the_prompts_resolution_asks_for_the_prompts_texts(tokenizer):
    """``number_resolution="prompt"`` without ``number_texts`` would write the prompt's own numbers as generated ones
    (``12.50`` as ``12``): a ValueError naming ``number_texts``, in ``decode``, ``decode_continuation`` and
    ``batch_decode``; with them (``[]`` for a row without numbers) the prompt is kept as written."""
    enc = tokenizer(["It was 12.50 and", "no number here"])
    ids, values = enc["input_ids"][0], enc["numeric_values"][0]
    for call in (
        lambda: tokenizer.batch_decode(enc["input_ids"], enc["numeric_values"], number_resolution="prompt"),
        lambda: tokenizer.decode(ids, values, number_resolution="prompt"),
        lambda: tokenizer.decode_continuation(ids, values, len(ids), number_resolution="prompt"),
    ):
        with pytest.raises(ValueError, match=r"number_resolution=\"prompt\" .* pass number_texts"):
            call()
    assert tokenizer.batch_decode(enc, number_resolution="prompt") == ["It was 12.50 and", "no number here"]
    assert tokenizer.decode(ids, values, number_texts=["12.50"], number_resolution="prompt") == "It was 12.50 and"
    row = enc["input_ids"][1][enc["attention_mask"][1].bool()]
    assert tokenizer.decode(row, torch.zeros(len(row)), number_resolution="prompt") == "no number here"
    assert tokenizer.decode(ids, values) == "It was 12.5 and"  # the values, losslessly: no resolution asked


def test_an_encodings_number_texts_name_exactly_its_numbers():
    """Every row of an encoding is a prompt: texts for only some of its numbers would write the rest from the values
    (12.50 then 3.0 as 3, the text's 3.0 lost), so fewer or more than the row's <NUM> are refused, naming the row."""
    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    encoding = tokenizer(["a 1", "up 12.50 from 3.0"])
    assert tokenizer.batch_decode(encoding) == ["a 1", "up 12.50 from 3.0"]
    for texts in (["12.50"], ["12.50", "3.0", "3.0"]):
        with pytest.raises(
            ValueError, match=rf"row 1: number_texts holds {len(texts)} texts but the prompt .* holds 2"
        ):
            tokenizer.batch_decode(encoding, number_texts=[["1"], texts])


def test_tokenize_gives_the_token_strings_with_the_number_token(tiny):
    """Text without numbers: the wrapped tokenizer's own ``tokenize``; each number: one ``<NUM>``, between the
    tokens the wrapped tokenizer gives the pieces around it."""
    _, tok = tiny
    for text in PLAIN + ["  spaces\tand\nlines ", "mixed 中文 and English"]:
        assert tok.tokenize(text) == tok.hf_tokenizer.tokenize(text)
    hf = tok.hf_tokenizer
    assert tok.tokenize("It costs 12.50 dollars") == hf.tokenize("It costs ") + ["<NUM>"] + hf.tokenize(" dollars")
    assert tok.tokenize("价格是99.9元") == hf.tokenize("价格是") + ["<NUM>"] + hf.tokenize("元")
    assert tok.tokenize("") == [] and tok.tokenize("1 2") == ["<NUM>", hf.tokenize(" ")[0], "<NUM>"]
    assert tok.convert_tokens_to_ids(tok.tokenize("It costs 12.50 dollars")) == tok.encode("It costs 12.50 dollars")[0]
    with pytest.raises(TypeError, match="must be a str"):
        tok.tokenize(["a list"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'add_special_tokens'"):
        tok.tokenize("a", add_special_tokens=True)


def test_the_encoding_is_rebuilt_from_a_plain_mapping_and_copied_with_its_texts(tiny):

    from causalqwen import NumericEncoding

    _, tok = tiny
    enc = tok(["It costs 12.50 dollars.", "Add 37 and 5."])
    rebuilt = type(enc)({key: value for key, value in enc.items()})  # what Trainer._prepare_input does
    assert isinstance(rebuilt, NumericEncoding) and rebuilt.number_texts is None
    assert set(rebuilt) == set(enc) and all(torch.equal(rebuilt[key], enc[key]) for key in enc)
    assert tok.batch_decode(rebuilt) == ["It costs 12.5 dollars.", "Add 37 and 5."]  # texts not known: the values
    assert NumericEncoding().keys() == set() and NumericEncoding().number_texts is None
    for copied in (copy.copy(enc), copy.deepcopy(enc)):
        assert copied.number_texts == [["12.50"], ["37", "5"]] and torch.equal(copied["input_ids"], enc["input_ids"])
        assert tok.batch_decode(copied) == ["It costs 12.50 dollars.", "Add 37 and 5."]
    padded = tok.pad([{"input_ids": [5], "numeric_values": [0.0]}])
    assert type(padded)(dict(padded)).keys() == padded.keys()


@pytest.mark.parametrize("pair", ["b 6", ["b 6"]])
def test_a_text_pair_in_transformers_positional_form_is_named(pair):
    """``tok("a 5", "b 6")``, transformers' text_pair habit: the second positional argument is padding here, and the
    error says that text pairs are not supported."""
    tok = NumericTokenizer(build_tiny_tokenizer())
    with pytest.raises(ValueError, match=r"padding must be one of .*text pairs, transformers' text_pair, are not"):
        tok("a 5", pair)


def test_generate_checks_the_number_texts_it_carries(tiny):
    """``generate``'s ``number_texts``: one list of str per row, as many as the row's <NUM>; the output carries them,
    so ``batch_decode(out)`` writes the prompts as given."""
    model, tok = tiny
    enc = tok(["It was 12.50 and", "no number"], padding_side="left")
    for bad, error, match in (
        ([["12.50"]], ValueError, r"one list of str per prompt row \(2\)"),
        (["12.50", []], TypeError, r"number_texts\[0\] must be a list of str"),
        (
            [["12.50", "3"], []],
            ValueError,
            r"row 0: number_texts holds 2 texts but the prompt \(its first 7 ids\) holds 1 <NUM>",
        ),
    ):
        with pytest.raises(error, match=match):
            model.generate(**enc, number_texts=bad, max_new_tokens=1)
    out = model.generate(**enc, number_texts=enc.number_texts, max_new_tokens=2, return_dict_in_generate=True)
    assert out.number_texts == [["12.50"], []]
    assert tok.batch_decode(out, out_of_vocab="mark", number_resolution="prompt")[0].startswith("It was 12.50 and")


def test_invalid_utf8_and_lone_surrogates_are_named(tokenizer, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9 12"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: invalid UTF-8 at byte 13 of the line \(b'\\xe9 12"):
        read_jsonl(bad)
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"text": "ok"}\n{"text": "ab\\ud800cd 5"}\n')
    texts, sources = read_jsonl(surrogate)
    with pytest.raises(
        ValueError, match=r"surrogate\.jsonl, line 2: character 2 of the text is '\\ud800', a lone surrogate"
    ):
        TextDataset(texts, tokenizer, 16, sources)
    with pytest.raises(ValueError, match=r"text 1: character 0 of the text is '\\udfff', a lone surrogate"):
        tokenizer(["fine", "\udfff"])


def test_a_huge_text_is_encoded_only_as_far_as_max_length_needs(tokenizer):
    words = " ".join(synthetic_texts(4000, seed=3))  # about 180,000 characters
    whole_ids, whole_values = tokenizer.encode(words)
    for max_length in (1, 7, 64, 500):
        ids, values = tokenizer.encode(words, max_length)
        assert ids == whole_ids[:max_length] and values == whole_values[:max_length]
    huge = "The price is 12.5 yuan. " * 2_200_000  # 52.8 million characters
    with pytest.raises(ValueError, match=r"52,800,000 characters, more than the 10,000,000 encoded whole"):
        tokenizer.encode(huge)
    started = time.perf_counter()
    item = TextDataset([huge], tokenizer, max_length=32)[0]
    assert time.perf_counter() - started < budget(10) and len(item["input_ids"]) == 32
    assert item["numeric_values"].tolist().count(12.5) == item["input_ids"].tolist().count(tokenizer.num_token_id) > 0


# ---------------------------------------------------------------------------------------------
# max_length: a bounded prefix, the whole text's first tokens
# ---------------------------------------------------------------------------------------------


def _blob(seed: int, size: int) -> str:
    return base64.b64encode(random.Random(seed).randbytes(size * 3 // 4)).decode()


PREFIX_TEXTS = {
    "base64 0": _blob(0, 6000),
    "base64 1": _blob(1, 6000),
    "base64 2": _blob(2, 6000),
    "digit run": "7" * 6000,
    "digit run after a number": "12.5元" + "7" * 6000,
    "Chinese without spaces": "价格是99.9元温度-15.5度第1章共2,345字" * 200,
    "Chinese letters only": "价格是元温度第章共字" * 600,
    "word with digits, then _": "1" + "a1" * 3000 + "_",
    "chain with a failing end": "1-" * 3000 + "1a",
    "grouped integer": "1" + ",111" * 1500 + " and 2",
    "ranges without spaces": "3月份-5月份" * 800,
    "letters only": "abcdefgh" * 800,
}


@pytest.mark.parametrize("name", PREFIX_TEXTS)
@pytest.mark.parametrize("max_length", [1, 5, 8, 33, 120])
def test_max_length_gives_the_whole_texts_first_tokens(tokenizer, name, max_length):
    text = PREFIX_TEXTS[name]
    ids, values, texts = tokenizer.encode(text, return_number_texts=True)
    assert len(ids) > max_length
    kept = ids[:max_length]
    assert tokenizer.encode(text, max_length, return_number_texts=True) == (
        kept,
        values[:max_length],
        texts[: kept.count(tokenizer.num_token_id)],
    )
    batch = tokenizer([text], max_length=max_length, truncation=True)
    assert batch["input_ids"][0].tolist() == kept


@pytest.mark.parametrize("offset", range(0, 40, 3))
@pytest.mark.parametrize("number", ["1,234,567.891", "3.14159e-7", "123456789012345", "1.5", "-2,000"])
def test_a_number_straddling_the_cut_is_read_whole(tokenizer, offset, number):
    """The budget for max_length=8 is 16 * 8 + 64 = 192 characters; numbers are put across that place."""
    text = "价" * (192 - offset) + number + "元" * 300
    ids, values, texts = tokenizer.encode(text, return_number_texts=True)
    for max_length in (8, 9, 40):
        kept = ids[:max_length]
        assert tokenizer.encode(text, max_length, return_number_texts=True) == (
            kept,
            values[:max_length],
            texts[: kept.count(tokenizer.num_token_id)],
        )


BLOB_ALPHABETS = {
    "base64": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    "digits and separators": "0123456789-/:,.e",
    "Chinese and digits": "价格是元温度第章共字0123456789.,-",
    "words": "ab1_ e+x",
}


@settings(max_examples=60)
@given(
    st.sampled_from(sorted(BLOB_ALPHABETS)).flatmap(
        lambda name: st.text(BLOB_ALPHABETS[name], min_size=100, max_size=1500)
    ),
    st.integers(1, 40),
)
def test_max_length_gives_the_whole_texts_first_tokens_on_random_blobs(tokenizer, text, max_length):
    ids, values, texts = tokenizer.encode(text, return_number_texts=True)
    kept = ids[:max_length]
    assert tokenizer.encode(text, max_length, return_number_texts=True) == (
        kept,
        values[:max_length],
        texts[: kept.count(tokenizer.num_token_id)],
    )


_CHINESE = "价格是元温度第章共字"
_BLOB = _blob(3, 2_000_000)


@pytest.mark.parametrize(
    "text, small",
    [
        (_BLOB, _BLOB[:6000]),  # 2 MB of base64: 5.5 s and the whole blob encoded before
        ("1" * 2_000_000, "1" * 6000),
        # the first number depends on the last character: the grammar reads it all, the tokenizer a prefix
        ("1" + "a1" * 1_000_000 + "_", "1" + "a1" * 3000 + "_"),
        ("1-" * 1_000_000 + "1a", "1-" * 3000 + "1a"),
        (_CHINESE * 200_000, _CHINESE * 600),
    ],
    ids=["base64", "digits", "1a1a_", "chain", "Chinese"],
)
def test_max_length_encodes_a_bounded_prefix(tokenizer, monkeypatch, text, small):
    """Spy on what reaches the wrapped tokenizer: a prefix of at most the budget, 16 * 8 + 64 characters.
    ``small`` is a short text with the same first tokens, encoded whole for the expected ids."""
    prefixes, rust_inputs = [], []

    class SpyPlan(tokenizer_module.EncodingPlan):
        def __init__(self, hf_tokenizer, pieces, *args, **kwargs):
            prefixes.extend(len(text_pieces.text) for text_pieces in pieces)
            super().__init__(hf_tokenizer, pieces, *args, **kwargs)
            rust_inputs.extend(len(t) for t in self.rust_texts)  # what the Rust tokenizer is given

    monkeypatch.setattr(tokenizer_module, "EncodingPlan", SpyPlan)
    ids, values = tokenizer.encode(text, max_length=8)
    assert prefixes and max(prefixes) <= 16 * 8 + 64
    assert sum(rust_inputs) <= 5 * (16 * 8 + 64)  # "<NUM>" stands for each number
    monkeypatch.undo()
    small_ids, small_values = tokenizer.encode(small)
    assert (ids, values) == (small_ids[:8], small_values[:8])


@settings(max_examples=80)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["1", "2.5", "-3", "1,000", "x", "7e5"]),
            st.sampled_from([" ", "-", ", ", "元", "ab ", "\n"]),
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 4),
)
def test_number_dense_texts_encode_as_the_reference_path(tokenizer, pieces, copies):
    """Texts where most runs between numbers repeat are encoded from each distinct run once: the same ids as
    the reference path, which encodes every run separately, and as a batch of such texts."""
    text = "".join(number + separator for number, separator in pieces)
    found = find_numbers(text)
    runs = split_texts([text])[0].runs
    (expected,) = tokenizer_module.encode_by_runs(tokenizer.hf_tokenizer, [runs], tokenizer.num_token_id)
    ids, values = tokenizer.encode(text)
    assert ids == expected
    assert [values[i] for i, token in enumerate(ids) if token == tokenizer.num_token_id] == [n.value for n in found]
    batch = tokenizer([text] * copies + ["no numbers"], padding_side="right")
    assert batch["input_ids"][0, : len(ids)].tolist() == ids


@pytest.mark.parametrize("count", [1, 2, 4, 5, 9, 40])
def test_batches_of_any_size_encode_as_the_reference_path(tokenizer, count):
    """A few texts are given to the Rust tokenizer one by one (its thread pool costs more than they do), more as one
    batch: real lines with numbers get the reference path's ids either way, in one call and one by one."""
    lines = (Path(__file__).parent / "data" / "real_text.txt").read_text(encoding="utf-8").splitlines()[:count]
    runs = [pieces.runs for pieces in split_texts(lines)]
    expected = tokenizer_module.encode_by_runs(tokenizer.hf_tokenizer, runs, tokenizer.num_token_id)
    batch = tokenizer(lines, padding=False, return_tensors=None)
    assert batch["input_ids"] == expected
    assert [tokenizer.encode(line)[0] for line in lines] == expected


# ---------------------------------------------------------------------------------------------
# A large batch: chunks encoded in a second thread give each text's own row
# ---------------------------------------------------------------------------------------------

LARGE_BATCH_NUMBERS = [
    "7",
    "-2.5",
    "−3",
    "1,000,000",
    ".5",
    "1e5",
    "2.5E-3",
    "0",
    "0.000",
    "-0",
    "99.9",
    "1,234.5",
    "123456789",
    "13409860099",
    "1e100",
    "3e-45",
    "1.4012985e-45",
    "2024-03-15",
    "0x1F",
    "3.10.2",
    "12:30",
    "5%-10%",
    "3月-5月",
    "16℃-32℃",
    "9" * 60,
    "1" + "0" * 45,
    "4.2e+38",
    "3.5e38",
    "550e8400-e29b-41d4-a716-446655440000",
    "fe80::1ff:fe23",
    "x2",
    "H2O",
    "1a2b",
    "#42",
    "v1.2",
]
LARGE_BATCH_WORDS = [
    "price",
    "the",
    "rose",
    "to",
    "kg",
    "元",
    "温度",
    "第",
    "章",
    "and",
    "by",
    "cost",
    "-",
    ", ",
    "%",
    "$",
    "\n",
    "  ",
    "(",
    ")",
    "，",
    "😀",
    "e",
    "E",
    "a",
    "f",
    "_",
    ".",
    ":",
    "/",
    "—",
    "<|endoftext|>",
    "<NUM>",
]


def large_batch(count: int, seed: int) -> list[str]:
    """``count`` documents: words and numbers of many shapes drawn at random (typed special tokens, identifiers,
    values float32 cannot hold, ranges, empty documents and documents without a digit among them)."""
    rng = random.Random(seed)
    documents = []
    for _ in range(count):
        pieces = [
            rng.choice(LARGE_BATCH_NUMBERS if rng.random() < 0.35 else LARGE_BATCH_WORDS)
            for _ in range(rng.choice([0, 1, 5, 20, 40, 80]))
        ]
        documents.append("".join(piece + rng.choice(["", " ", " ", "\n"]) for piece in pieces))
    return documents


def repeating_batch(count: int, seed: int) -> list[str]:
    """``count`` number-dense lines whose text between numbers repeats (each distinct run is encoded once, across
    chunks)."""
    rng = random.Random(seed)
    units = [" kg, ", " 元; ", "% and ", " to ", "\n", " -- "]
    return [
        "".join(rng.choice(LARGE_BATCH_NUMBERS[:12]) + rng.choice(units) for _ in range(rng.randint(1, 12)))
        for _ in range(count)
    ]


@pytest.fixture(scope="module", params=VOCABULARIES)
def any_tokenizer(request):
    return NumericTokenizer(build_tiny_tokenizer() if request.param == "tiny" else build_qwen25_tokenizer())


def reference_rows(tokenizer: NumericTokenizer, texts: list[str]) -> list[tuple[list[int], list[float], list[str]]]:
    """Each text alone: its numbers by `find_numbers`, every run between them encoded on its own by the wrapped
    tokenizer (the reference path), the value of each number at its ``<NUM>``."""
    rows = []
    for text in texts:
        found = find_numbers(text)
        (ids,) = tokenizer_module.encode_by_runs(
            tokenizer.hf_tokenizer, [split_texts([text])[0].runs], tokenizer.num_token_id
        )
        values = [0.0] * len(ids)
        positions = [position for position, token_id in enumerate(ids) if token_id == tokenizer.num_token_id]
        assert len(positions) == len(found)
        for position, number in zip(positions, found):
            values[position] = number.value
        rows.append((ids, values, [number.text for number in found]))
    return rows


@pytest.mark.parametrize("make", [large_batch, repeating_batch], ids=["many shapes", "repeating runs"])
def test_a_large_batch_encodes_each_text_as_it_is_encoded_alone(any_tokenizer, make):
    texts = make(3000, seed=38)
    assert len(tokenization.chunks_of(texts, tokenization.CHUNK_CHARACTERS)) >= 3  # goes in chunks
    expected = reference_rows(any_tokenizer, texts)
    batch = any_tokenizer(texts, padding=False, return_tensors=None)
    assert batch["input_ids"] == [ids for ids, _, _ in expected]
    assert batch["numeric_values"] == [values for _, values, _ in expected]
    assert batch.number_texts == [surfaces for _, _, surfaces in expected]
    padded = any_tokenizer(texts, padding_side="right", return_tensors="np")
    for row, (ids, values, _) in enumerate(expected):
        assert padded["input_ids"][row, : len(ids)].tolist() == ids
        assert padded["numeric_values"][row, : len(ids)].tolist() == [float(np.float32(v)) for v in values]
        assert padded["attention_mask"][row].sum() == len(ids)


@pytest.mark.parametrize("max_length", [1, 7, 64])
def test_a_large_batch_cut_at_max_length_keeps_each_texts_first_tokens(any_tokenizer, max_length):
    texts = large_batch(3000, seed=max_length) + ["12.5元" + "7" * 3000, "1-" * 2000 + "1a", "价格是99.9元" * 300]
    expected = reference_rows(any_tokenizer, texts)
    batch = any_tokenizer(texts, max_length=max_length, truncation=True, padding=False, return_tensors=None)
    for row, (ids, values, surfaces) in enumerate(expected):
        kept = ids[:max_length]
        assert batch["input_ids"][row] == kept, row
        assert batch["numeric_values"][row] == values[:max_length], row
        assert batch.number_texts[row] == surfaces[: kept.count(any_tokenizer.num_token_id)], row
    longest = max(len(ids) for ids, _, _ in expected)
    with pytest.raises(ValueError, match=r"text \d+ has more than max_length=\d+ tokens; pass truncation=True"):
        any_tokenizer(texts, max_length=longest - 1, padding=False, return_tensors=None)


@pytest.mark.parametrize("collecting", [True, False])
def test_a_large_batch_leaves_the_garbage_collector_as_it_found_it(tokenizer, collecting):
    """The collector is paused during a large batch; afterwards it runs if, and only if, it ran before."""
    texts = large_batch(3000, seed=1)
    was = gc.isenabled()
    try:
        gc.enable() if collecting else gc.disable()
        tokenizer(texts, padding=False, return_tensors=None)
        assert gc.isenabled() == collecting
    finally:
        gc.enable() if was else gc.disable()


# ---------------------------------------------------------------------------------------------
# The bottom of float32's range (rule V1)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, nearest",
    [
        ("8e-46", "1.4012985e-45"),
        ("1.23456789e-44", "1.2611686e-44"),
        ("-2e-45", "1.4012985e-45"),
        ("1e-45", "1.4012985e-45"),
    ],
)
def test_numbers_that_a_subnormal_float32_would_change_stay_text(tokenizer, text, nearest):
    ids, values = tokenizer.encode(f"x {text} y")
    assert tokenizer.num_token_id not in ids and tokenizer.decode(ids, values) == f"x {text} y"
    with pytest.raises(ValueError, match=rf"underflows float32's normal range .* the subnormal {nearest}, which would"):
        parse_number(text)


@pytest.mark.parametrize("text", ["1.4012985e-45", "-9.999946e-41", "1.5000003e-39", "1.1754942e-38"])
def test_subnormal_numbers_written_as_decode_writes_them_are_kept(tokenizer, text):
    ids, values = tokenizer.encode(text)
    assert ids == [tokenizer.num_token_id] and tokenizer.decode(ids, values) == text
    assert format_number(values[0]) == text  # decode's own text for that value


@pytest.mark.parametrize("literal", ["3e-45", "1e-45", "1.4e-45", "8e-46", "1e-40", "1.5e-39", "-2e-45"])
def test_a_literal_float32_holds_only_approximately_is_text(tokenizer, literal):
    exact = Fraction(Decimal(literal))
    nearest = Fraction(float(np.float32(float(literal))))
    assert abs(nearest - exact) > abs(exact) / 2**24  # the oracle: float32 would change it
    ids, values = tokenizer.encode(f"x {literal} y")
    assert tokenizer.num_token_id not in ids and tokenizer.decode(ids, values) == f"x {literal} y"
    with pytest.raises(ValueError, match=rf"number '{literal}' underflows float32's normal range"):
        parse_number(literal)


@pytest.mark.parametrize("multiple", [1, 2, 3, 1000, 71362, 2**22, 2**23 - 1])
def test_a_generated_subnormal_is_written_so_that_it_reads_back(tokenizer, multiple):
    value = float(np.float32(multiple * 2.0**-149))
    written = tokenizer.decode([tokenizer.num_token_id], [value])
    assert abs(Fraction(Decimal(written)) - Fraction(value)) <= Fraction(Decimal(written)) / 2**24
    ids, values = tokenizer.encode(written)
    assert ids == [tokenizer.num_token_id] and values == [value]


@pytest.mark.parametrize(
    "value, match",
    [
        (1e-50, r"numeric_values\[0\]: cannot format 1e-50: it is not zero but underflows float32"),
        (-3e-45, r"numeric_values\[0\]: cannot format -3e-45: float32 holds it only as the subnormal -2\.802597e-45"),
    ],
)
def test_decoding_a_value_float32_cannot_hold_names_it(tokenizer, value, match):
    with pytest.raises(ValueError, match=match):
        tokenizer.decode([tokenizer.num_token_id], [value])


# ---------------------------------------------------------------------------------------------
# The number token: refused where the wrapped tokenizer has it in another role
# ---------------------------------------------------------------------------------------------


def _saved_tokenizer(tmp_path, num_token):
    """The tiny tokenizer saved by NumericTokenizer, its tokenizer_config.json then naming ``num_token``."""
    NumericTokenizer(build_tiny_base(seed=0)[1]).save_pretrained(tmp_path / "tok")
    config_file = tmp_path / "tok" / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"num_token": num_token}))
    return tmp_path / "tok", config_file


CLASHES = [
    ("<|endoftext|>", "the wrapped tokenizer's eos_token, unk_token and pad_token (id 600)"),
    ("<|im_start|>", "one of the wrapped tokenizer's extra special tokens (id 601)"),
    ("<|im_end|>", "one of the wrapped tokenizer's extra special tokens (id 602)"),
]


@pytest.mark.parametrize("num_token, clash", CLASHES)
def test_a_tokenizer_config_naming_another_special_token_as_the_number_token_is_refused(tmp_path, num_token, clash):
    from transformers import AutoTokenizer

    directory, config_file = _saved_tokenizer(tmp_path, num_token)
    expected = f"{str(config_file)!r} names num_token {num_token!r}, which is {clash}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}: numbers would encode as that token"):
        NumericTokenizer.from_pretrained(directory)
    with pytest.raises(ValueError, match=re.escape(expected)):
        AutoTokenizer.from_pretrained(directory, trust_remote_code=True)


def test_the_pad_token_set_to_the_number_token_is_refused(tmp_path):
    directory, config_file = _saved_tokenizer(tmp_path, "<NUM>")
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(config | {"pad_token": "<NUM>"}))
    with pytest.raises(
        ValueError,
        match=f"{re.escape(repr(str(config_file)))} names num_token '<NUM>', which is the "
        r"wrapped tokenizer's pad_token \(id 603\)",
    ):
        NumericTokenizer.from_pretrained(directory)


def test_an_ordinary_token_as_the_number_token_is_refused_naming_the_file(tmp_path):
    hf_tokenizer = build_tiny_base(seed=0)[1]
    ordinary = next(token for token, index in hf_tokenizer.get_vocab().items() if index == 100)
    directory, config_file = _saved_tokenizer(tmp_path, ordinary)
    with pytest.raises(
        ValueError,
        match=f"names num_token {re.escape(repr(ordinary))}, which is an ordinary token of the "
        r"wrapped tokenizer \(id 100\)",
    ):
        NumericTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("num_token, clash", CLASHES)
def test_the_constructor_refuses_the_same_tokens_by_name(num_token, clash):
    hf_tokenizer = build_tiny_base(seed=0)[1]
    size = len(hf_tokenizer)
    with pytest.raises(
        ValueError,
        match=f"^num_token {re.escape(repr(num_token))} is {re.escape(clash)}: numbers would encode as that token",
    ):
        NumericTokenizer(hf_tokenizer, num_token=num_token)
    assert len(hf_tokenizer) == size  # nothing added


def test_the_constructor_refuses_an_ordinary_token(tokenizer):
    hf_tokenizer = build_tiny_base(seed=0)[1]
    ordinary = next(token for token, index in hf_tokenizer.get_vocab().items() if index == 100)
    with pytest.raises(
        ValueError,
        match=f"^num_token {re.escape(repr(ordinary))} is an ordinary token of the wrapped "
        r"tokenizer \(id 100\), which ordinary text also produces",
    ):
        NumericTokenizer(hf_tokenizer, num_token=ordinary)


def test_an_explicit_num_token_argument_is_named_as_the_argument(tmp_path):
    directory, _ = _saved_tokenizer(tmp_path, "<NUM>")
    with pytest.raises(ValueError, match=r"^num_token '<\|endoftext\|>' is the wrapped tokenizer's eos_token"):
        NumericTokenizer.from_pretrained(directory, num_token="<|endoftext|>")


def test_the_number_token_added_before_is_used_again(tmp_path):
    """A directory saved by NumericTokenizer, and a tokenizer wrapped twice: <NUM> keeps its id, numbers encode as
    it."""
    directory, _ = _saved_tokenizer(tmp_path, "<NUM>")
    loaded = NumericTokenizer.from_pretrained(directory)
    assert loaded.num_token_id == 603 and len(loaded) == 604
    again = NumericTokenizer(loaded.hf_tokenizer)
    assert again.num_token_id == 603 and len(again) == 604
    ids, values = loaded.encode("costs 12.5 yuan")
    assert ids.count(603) == 1 and values[ids.index(603)] == 12.5 and loaded.eos_token_id not in ids
    custom = NumericTokenizer(build_tiny_base(seed=0)[1], num_token="<QTY>")
    assert custom.num_token_id == 603 and torch.tensor(custom.encode("3 apples")[0]).eq(603).sum() == 1


@pytest.mark.parametrize(
    "plant, clash",
    [
        (lambda hf: hf.add_tokens(["<NUM>"]), "an ordinary token of the wrapped tokenizer"),
        (lambda hf: hf.add_special_tokens({"pad_token": "<NUM>"}), "the wrapped tokenizer's pad_token"),
    ],
    ids=["ordinary entry", "pad token"],
)
def test_from_qwen_refuses_the_num_token_that_numeric_tokenizer_refuses(tmp_path, plant, clash):
    """A base directory whose tokenizer holds ``<NUM>`` as another token (an ordinary vocabulary entry, its pad
    token): `NumericTokenizer` refuses it, and so does ``from_qwen(dir)``, by the same check, naming the directory,
    instead of taking that token's id as the number token."""
    from causalqwen import CausalQwenForCausalLM
    from causalqwen.app.tiny import build_tiny_base

    qwen, hf = build_tiny_base(seed=0)
    plant(hf)
    qwen.save_pretrained(tmp_path)
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"num_token '<NUM>' is {clash}"):
        NumericTokenizer(hf)
    with pytest.raises(ValueError, match=f"num_token '<NUM>' is {clash} .*{re.escape(str(tmp_path))}"):
        CausalQwenForCausalLM.from_qwen(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# One transformers tokenizer shared: by threads, by wrappers
# ---------------------------------------------------------------------------------------------


def test_threads_sharing_one_tokenizer_never_read_typed_special_text_as_special_ids():
    """The Rust backend's special-token matching is one flag shared by every caller: threads encoding a typed
    ``<|endoftext|>`` (matching off) and plain texts with numbers (``<NUM>`` matched) through one tokenizer, and
    through a second wrapper of the same transformers tokenizer, each get the ids the text has alone. The
    interpreter switches threads every microsecond, so that an unguarded flag is flipped between set and use."""
    import sys
    import threading

    hf = build_tiny_tokenizer()
    first, second = NumericTokenizer(hf), NumericTokenizer(hf)
    typed, plain = "say <|endoftext|> then 5", "price 12.50 and 3 more"
    expected = {typed: first.encode(typed), plain: first.encode(plain)}
    assert hf.convert_tokens_to_ids("<|endoftext|>") not in expected[typed][0]
    wrong = []

    def hammer(tok, text):
        for _ in range(400):
            try:
                got = tok.encode(text)
            except RuntimeError as error:  # <NUM> read as characters: the flag was the other thread's
                got = str(error)
            if got != expected[text]:
                wrong.append((text, got))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [
            threading.Thread(target=hammer, args=(tok, text)) for tok in (first, second) for text in (typed, plain)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []
    assert hf.backend_tokenizer.encode_special_tokens is False  # the flag as it was before


def test_wrappers_of_one_transformers_tokenizer_keep_their_own_padding_side():
    """``NumericTokenizer(hf, padding_side="right")`` beside a left-padding wrapper of the same ``hf``: each pads on
    its own side, and the transformers tokenizer's own setting is left as it was."""
    hf = build_tiny_tokenizer()
    hf.padding_side = "right"
    left = NumericTokenizer(hf)
    assert hf.padding_side == "right"
    hf.padding_side = "left"
    right = NumericTokenizer(hf, padding_side="right")
    assert (left.padding_side, right.padding_side, hf.padding_side) == ("left", "right", "left")
    assert left(["a", "a b 5"])["attention_mask"][0].tolist()[0] == 0
    assert right(["a", "a b 5"])["attention_mask"][0].tolist()[-1] == 0
    right.padding_side = "left"
    left.padding_side = "right"
    assert (left.padding_side, right.padding_side, hf.padding_side) == ("right", "left", "left")


def test_loading_the_tokenizer_alone_prints_no_model_type_notice(tmp_path):
    """A CausalQwen directory's tokenizer loaded in a process that imported the tokenizer alone: transformers reads
    ``config.json`` to guess a tokenizer class and, where it did not know ``causal_qwen``, printed "You are using a
    model of type `causal_qwen` to instantiate a model of type ``" (``import causalqwen`` now registers the name, and
    the tokenizer's own filter stays for a transformers that reads the file before the registration); nothing is
    printed, and transformers' other warnings still are (its logging is not muted)."""
    import subprocess
    import sys

    from causalqwen import CausalQwenConfig

    tok = NumericTokenizer(build_tiny_tokenizer())
    tok.save_pretrained(tmp_path)
    CausalQwenConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok), num_token_id=tok.num_token_id
    ).save_pretrained(tmp_path)
    script = (
        "import sys\n"
        "from causalqwen.integrations.tokenizer import NumericTokenizer\n"
        f"tok = NumericTokenizer.from_pretrained({str(tmp_path)!r})\n"
        "from transformers.utils import logging\n"
        "logging.get_logger('transformers.configuration_utils').warning('still heard')\n"
        "print(tok.decode(*tok.encode('a 12.50')))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=budget(300),
        cwd=Path(__file__).parent.parent,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "a 12.5\n"
    assert "model of type" not in run.stderr
    assert "still heard" in run.stderr
