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
    PromptCompletion,
    TextDataset,
    collate,
    prompt_completion_features,
    read_jsonl,
    synthetic_texts,
)
from causalqwen.integrations.collator import NumericDataCollator
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
        ('{"text": 5}\n', r"line 1: the field 'text' must be a string, got int"),
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


# ---- the prompt-completion form ----


def _rows(path, *records):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in records))
    return path


def test_read_jsonl_reads_prompt_completion_rows(tmp_path):
    path = _rows(
        tmp_path / "pairs.jsonl",
        {"prompt": "x = 3, y = ", "completion": "7", "id": 1},
        "",
        {"prompt": "a", "completion": " b 2"},
    )
    rows, sources = read_jsonl(path)
    assert rows == [PromptCompletion("x = 3, y = ", "7"), PromptCompletion("a", " b 2")]
    assert sources == [f"{path}, line 1", f"{path}, line 3"]


@pytest.mark.parametrize(
    "records, message",
    [
        (
            ({"prompt": "a", "completion": "1"}, {"text": "b"}),
            r"line 2: a text row after a prompt-completion row \(line 1\)",
        ),
        (
            ({"text": "b"}, {"prompt": "a", "completion": "1"}),
            r"line 2: a prompt-completion row after a text row \(line 1\)",
        ),
        (({"prompt": "a"},), r"line 1: .*the field 'completion' is missing"),
        (({"completion": "1"},), r"line 1: .*the field 'prompt' is missing"),
        (({"prompt": "a", "completion": 1},), r"line 1: the field 'completion' must be a string, got int"),
        (({"prompt": None, "completion": "1"},), r"line 1: the field 'prompt' must be a string, got NoneType"),
        (({"prompt": "a", "completion": ""},), r"line 1: the completion is empty"),
        (({"prompt": "", "completion": "1"},), r"line 1: the prompt is empty"),
        (({"text": "a", "prompt": "b", "completion": "1"},), r"line 1: an object with both \"text\" and 'prompt'"),
        (
            ({"input": "a", "output": "1"},),
            r"line 1: expected .*\"prompt\" and \"completion\"; got keys \['input', 'output'\]",
        ),
    ],
)
def test_malformed_prompt_completion_rows_are_named_by_line(tmp_path, records, message):
    path = _rows(tmp_path / "bad.jsonl", *records)
    with pytest.raises(ValueError, match=message):
        read_jsonl(path)


def test_a_prompt_completion_row_is_the_prompt_then_the_completion_scored_alone(tokenizer):
    prompt, completion = "The price is 37 yuan. Again, the price is ", "37 yuan."
    features = prompt_completion_features(tokenizer, prompt, completion)
    prompt_ids, prompt_values = tokenizer.encode(prompt)
    completion_ids, completion_values = tokenizer.encode(completion)
    eos = tokenizer.eos_token_id
    assert features["input_ids"] == prompt_ids + completion_ids + [eos]
    assert features["numeric_values"] == prompt_values + completion_values + [0.0]
    assert features["completion_mask"] == [0] * len(prompt_ids) + [1] * (len(completion_ids) + 1)

    dataset = TextDataset([PromptCompletion(prompt, completion), "a 1"], tokenizer, 64)
    batch = collate(dataset.items, tokenizer.pad_token_id)
    n = len(features["input_ids"])
    expected = [-100] * len(prompt_ids) + completion_ids + [eos]
    assert batch["labels"][0, :n].tolist() == expected
    text_ids = dataset[1]["input_ids"].tolist()  # the text row is scored at every token, -100 on its padding
    assert batch["labels"][1].tolist() == text_ids + [-100] * (batch["labels"].shape[1] - len(text_ids))

    # the Trainer path: features from a map, the collator turns completion_mask into the same labels
    collated = NumericDataCollator(tokenizer)([features, prompt_completion_features(tokenizer, "b ", "2")])
    assert collated["labels"][0].tolist() == expected and "completion_mask" not in collated
    assert collated["labels"][1].tolist()[:3] == [-100] * len(tokenizer.encode("b ")[0]) + [tokenizer.num_token_id]


def test_a_prompt_completion_row_longer_than_max_length_is_named_not_cut(tokenizer):
    long_prompt = "The price is 37 yuan. " * 8
    with pytest.raises(
        ValueError, match=r"text 2: the prompt and completion take \d+ or more tokens, more than max_length = 16"
    ):
        TextDataset([PromptCompletion("a ", "1"), PromptCompletion(long_prompt, "37")], tokenizer, 16)
    with pytest.raises(TypeError, match="completion must be a str, got int"):
        prompt_completion_features(tokenizer, "a", 1)


def test_the_losses_score_the_completion_alone():
    """Oracle: the same row with every label kept, scored per position by the literal OvR loss and the gated Cauchy
    NLL of `causalqwen.losses`; the completion-only loss is their mean over the completion's targets."""
    from causalqwen.app.tiny import build_tiny_causal_lm
    from causalqwen.losses import gated_regression_loss, ovr_classification_loss, ovr_probability

    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    model, tokenizer = tiny.model, tiny.tokenizer
    dataset = TextDataset([PromptCompletion("It costs 12 and then ", "13 and 14.")], tokenizer, 64)
    batch = collate(dataset.items, tokenizer.pad_token_id)
    with torch.no_grad():
        out = model(**batch)
        full = model(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])  # every decision
    completion = dataset[0]["completion_mask"].bool()  # [S]
    targets = batch["input_ids"][0, 1:]  # position i predicts token i + 1
    scored = completion[1:]  # [S - 1]
    loc_S, scale_S = full.loc_S[:, :-1], full.scale_S[:, :-1]
    threshold = model.ovr_threshold
    cls = ovr_classification_loss(loc_S, scale_S, targets[None], threshold)[0]  # [S - 1]
    assert int(out.n_cls) == int(scored.sum()) == len(tokenizer.encode("13 and 14.")[0]) + 1
    assert float(out.cls_loss) == pytest.approx(float(cls[scored].mean()), rel=1e-5)
    num = tokenizer.num_token_id
    is_num = (targets == num) & scored
    assert int(out.n_reg) == 2  # 13 and 14; the prompt's 12 is context
    p_num = ovr_probability(loc_S[..., num], scale_S[..., num], threshold)
    values = batch["numeric_values"][:, 1:]
    reg = gated_regression_loss(full.loc_Y[:, :-1], full.scale_Y[:, :-1], values, p_num, is_num[None])[0]
    assert float(out.reg_loss) == pytest.approx(float(reg[is_num].sum() / is_num.sum()), rel=1e-5)


def test_prompt_completion_rows_refuse_what_would_train_a_sequence_no_text_gives(tokenizer):
    with pytest.raises(ValueError, match="the prompt ends with a number and the completion starts with one"):
        prompt_completion_features(tokenizer, "x = 3", "5")
    for bad in (-5, 2.5, True, 1):
        with pytest.raises(ValueError, match=f"max_length must be an int >= 2 or None, got {bad!r}"):
            prompt_completion_features(tokenizer, "x = ", "5", bad)
    with pytest.raises(TypeError, match="text 2: a row is a str or a PromptCompletion, got dict"):
        TextDataset(["a 1", {"prompt": "a", "completion": "1"}], tokenizer, 16)


def test_the_collator_refuses_labels_beside_a_completion_mask_and_a_mask_other_than_0_and_1(tokenizer):
    features = prompt_completion_features(tokenizer, "x = ", "5")
    with pytest.raises(ValueError, match=r"features\[0\] has both labels and a completion_mask"):
        NumericDataCollator(tokenizer)([features | {"labels": features["input_ids"]}])
    halves = features | {"completion_mask": [0.5] * len(features["input_ids"])}
    with pytest.raises(ValueError, match=r"features\[0\]\['completion_mask'\] must hold 0 \(prompt\) and 1"):
        NumericDataCollator(tokenizer)([halves])


def test_an_answer_missing_from_a_regression_set_is_named_and_text_sets_pass():
    from causalqwen.files.data import check_answers_present

    sources = ["f.jsonl, line 1", "f.jsonl, line 2", "f.jsonl, line 3"]
    numbers = [PromptCompletion("x is 2, y is ", "4"), PromptCompletion("x is 3, y is ", "6")]
    check_answers_present(numbers, sources[:2])
    check_answers_present([PromptCompletion("Say hi: ", "hello"), PromptCompletion("Say bye: ", "bye")], sources[:2])
    check_answers_present(["a text with 3 numbers 4 5", "a text without"], sources[:2])
    with pytest.raises(ValueError, match=r"f.jsonl, line 3: the completion 'n/a' holds no number, while 2 of the 3"):
        check_answers_present(numbers + [PromptCompletion("x is 9, y is ", "n/a")], sources)
