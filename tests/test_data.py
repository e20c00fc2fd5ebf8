"""The synthetic corpus obeys its documented rules; the JSONL reader and the dataset report bad input by line."""

import json
import re

import pytest
import torch

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.files.data import (
    BAG_WEIGHTS,
    DRINK_PRICES,
    TEMPLATES,
    TextDataset,
    collate,
    read_jsonl,
    synthetic_texts,
)
from causalqwen.numbers import find_numbers


@pytest.fixture(scope="module")
def tokenizer():
    return NumericTokenizer(build_tiny_tokenizer())


def _numbers(text):
    return [match.value for match in find_numbers(text)]


def test_every_synthetic_sentence_follows_its_rule():
    """Each number that the table calls a target is the stated function of the context (parsed back)."""
    seen = set()
    for text in synthetic_texts(2000, seed=3):
        numbers = _numbers(text)
        if match := re.fullmatch(r"A cup of (\w+) costs [\d.]+ dollars\.", text):
            seen.add("fixed_price")
            assert numbers == [DRINK_PRICES[match.group(1)]]
        elif match := re.fullmatch(r"A bag of (\w+) weighs [\d.]+ kilograms\.", text):
            seen.add("bag")
            assert numbers == [BAG_WEIGHTS[match.group(1)]]
        elif text.startswith("The price is"):
            seen.add("copy")
            assert len(numbers) == 2 and numbers[0] == numbers[1] and 1 <= numbers[0] <= 99
        elif " won " in text:
            seen.add("count")
            assert numbers == [numbers[0], numbers[0] + 1, numbers[0] + 2] and 1 <= numbers[0] <= 60
        elif text.startswith("One "):
            seen.add("double")
            assert len(numbers) == 2 and numbers[1] == 2 * numbers[0] and 1 <= numbers[0] <= 30
        else:
            seen.add("week")
            assert numbers == [7, 24]
    assert seen == set(TEMPLATES)


def test_synthetic_texts_are_reproducible():
    assert synthetic_texts(50, seed=1) == synthetic_texts(50, seed=1) != synthetic_texts(50, seed=2)
    with pytest.raises(ValueError, match="n must be a positive int"):
        synthetic_texts(0)


def test_dataset_encodes_numbers_and_appends_eos(tokenizer):
    data = TextDataset(["A cup of tea costs 1.5 dollars."], tokenizer, max_length=64)
    item = data[0]
    assert item["input_ids"][-1].item() == tokenizer.eos_token_id
    num = item["input_ids"] == tokenizer.num_token_id
    assert num.sum() == 1 and item["numeric_values"][num].item() == 1.5
    assert torch.all(item["numeric_values"][~num] == 0)
    assert len(TextDataset(["word " * 100], tokenizer, max_length=10)[0]["input_ids"]) == 10


def test_collate_pads_on_the_right_and_masks_labels(tokenizer):
    """Every position against the literal loop: real tokens first, then the pad id, value 0.0, mask 0 and label -100."""
    data = TextDataset(
        ["A week has 7 days, and a day has 24 hours.", "hi", "A cup of tea costs 1.5 dollars."], tokenizer
    )
    items = [data[index] for index in range(len(data))]
    batch = collate(items, tokenizer.pad_token_id)
    assert list(batch) == ["input_ids", "numeric_values", "attention_mask", "labels", "numeric_labels"]
    width = max(len(item["input_ids"]) for item in items)
    assert batch["input_ids"].shape == (3, width) and batch["input_ids"].dtype == torch.int64
    for row, item in enumerate(items):
        length = len(item["input_ids"])
        for position in range(width):
            real = position < length
            token = item["input_ids"][position].item() if real else tokenizer.pad_token_id
            assert batch["input_ids"][row, position].item() == token
            assert batch["numeric_values"][row, position].item() == (
                item["numeric_values"][position].item() if real else 0.0
            )
            assert batch["attention_mask"][row, position].item() == int(real)
            assert batch["labels"][row, position].item() == (token if real else -100)
    assert batch["numeric_values"][2].max().item() == 1.5
    assert torch.equal(batch["numeric_labels"], batch["numeric_values"])
    assert batch["numeric_labels"].data_ptr() != batch["numeric_values"].data_ptr()  # a copy the model may not share


def test_read_jsonl_returns_texts_and_their_lines(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "a 1"}) + "\n\n" + json.dumps({"text": "b", "id": 3}) + "\n")
    texts, sources = read_jsonl(path)
    assert texts == ["a 1", "b"] and sources == [f"{path}, line 1", f"{path}, line 3"]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "ok"}\n{not json}\n', r"line 2: not valid JSON"),
        ('{"text": "ok"}\n{"body": "x"}\n', r'line 2: expected a JSON object with a string field "text"'),
        ('["text"]\n', r"line 1: expected a JSON object"),
        ('{"text": 5}\n', r"line 1: expected a JSON object"),
        ("\n  \n", r"the dataset is empty"),
    ],
)
def test_read_jsonl_rejects_bad_lines(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_jsonl(path)


def test_a_text_the_tokenizer_refuses_names_its_source(tmp_path, tokenizer):
    path = tmp_path / "big.jsonl"
    path.write_text('{"text": "fine 1"}\n\n{"text": "huge 1e39 here"}\n')
    texts, sources = read_jsonl(path)
    assert TextDataset(texts, tokenizer, 64, sources)[1]["numeric_values"].count_nonzero() == 0  # 1e39 is text
    with pytest.raises(ValueError, match=r"big.jsonl, line 3: character 4 of the text is '\\ud800', a lone surrogate"):
        TextDataset([texts[0], "bad \ud800"], tokenizer, 64, sources)
    with pytest.raises(ValueError, match="the dataset is empty"):
        TextDataset([], tokenizer)
