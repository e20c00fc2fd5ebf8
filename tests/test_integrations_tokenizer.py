"""The transformers tokenizer (`causalqwen.integrations.tokenizer`): a script written from transformers
habit, run against `causalqwen.NumericTokenizer`, and the number token it adds.

The oracles: the texts themselves (round trips), a fresh wrapped tokenizer that never saw ``<NUM>`` (special
tokens, vocabulary, token strings), the wrapped tokenizer's own ``decode`` (which writes ``<NUM>``, its special
added token, literally), numpy's float32 rounding of the values written in the texts, and values chosen here.
The number token named by a ``tokenizer_config.json`` (or passed to the constructor) must not be a token the
wrapped tokenizer already has for another role (end of text, padding, its chat template's specials) nor an
ordinary token; the error names the file, the token and the clash.
"""

import copy
import json
import re
import time

import numpy as np
import pytest
import torch
from transformers import (
    AutoTokenizer,
    DataCollatorWithPadding,
)
from wall_clock import budget

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm, build_tiny_tokenizer
from causalqwen.files.data import TextDataset, read_jsonl, synthetic_texts
from causalqwen.float32 import format_number
from causalqwen.numbers import parse_number

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


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model, tokenizer


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
