"""The collator (`causalqwen.integrations.collator`): ``NumericDataCollator`` pads values and labels as
written by hand, equals the project's ``collate`` with ``add_labels``, names what is wrong, and runs under
``Trainer``; transformers' stock collators pad the values through the tokenizer's ``pad``.
"""

import numpy as np
import pytest
import torch
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

from causalqwen.files.data import collate
from causalqwen.integrations.collator import NumericDataCollator

TEXTS = ["It costs 2.5 dollars.", "Add 37 and 5."]


def test_the_collator_pads_values_and_labels_as_written_by_hand(tiny):
    _, tok = tiny
    pad = tok.pad_token_id
    features = [
        {"input_ids": [5, tok.num_token_id], "numeric_values": [0.0, 2.5], "labels": [5, tok.num_token_id]},
        {"input_ids": torch.tensor([7]), "numeric_values": np.array([0.0], dtype=np.float32), "labels": [-100]},
    ]
    batch = NumericDataCollator(tok)(features)
    assert batch["input_ids"].tolist() == [[5, tok.num_token_id], [7, pad]]
    assert batch["numeric_values"].dtype == torch.float32
    assert batch["numeric_values"].tolist() == [[0.0, 2.5], [0.0, 0.0]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert batch["labels"].tolist() == [[5, tok.num_token_id], [-100, -100]]
    assert batch["numeric_labels"].tolist() == [[0.0, 2.5], [0.0, 0.0]]
    left = NumericDataCollator(tok, padding_side="left", pad_to_multiple_of=4, return_tensors="np")(features)
    assert left["input_ids"].tolist() == [[pad, pad, 5, tok.num_token_id], [pad, pad, pad, 7]]
    assert left["numeric_labels"].dtype == np.float32 and left["labels"][1].tolist() == [-100] * 4
    plain = NumericDataCollator(tok)([{key: f[key] for key in ("input_ids", "numeric_values")} for f in features])
    assert set(plain) == {"input_ids", "numeric_values", "attention_mask"}


def test_the_collator_with_add_labels_is_the_projects_collate(tiny):
    _, tok = tiny
    texts = ["It costs 2.5 dollars.", "Add 37 and 5.", "x 1e3"]
    rows = tok(texts, return_tensors=None, padding=False)
    features = [{"input_ids": rows["input_ids"][b], "numeric_values": rows["numeric_values"][b]} for b in range(3)]
    ours = NumericDataCollator(tok, add_labels=True)(features)
    theirs = collate([{key: torch.tensor(value) for key, value in f.items()} for f in features], tok.pad_token_id)
    assert set(ours) == set(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key


def test_the_collator_names_what_is_wrong(tiny):
    _, tok = tiny
    collator = NumericDataCollator(tok)
    with pytest.raises(ValueError, match="non-empty list"):
        collator([])
    with pytest.raises(ValueError, match=r"features\[1\] has no numeric_values"):
        collator([{"input_ids": [1], "numeric_values": [0.0]}, {"input_ids": [1]}])
    with pytest.raises(ValueError, match=r"features\[0\]\['numeric_values'\] has length 2 but input_ids 1"):
        collator([{"input_ids": [1], "numeric_values": [0.0, 1.0]}])
    with pytest.raises(ValueError, match="padding_side"):
        NumericDataCollator(tok, padding_side="middle")


def test_trainer_with_the_collator_reports_eval_loss(tiny, tmp_path):
    model, tok = tiny
    rows = tok(["It costs 2.5 dollars.", "Add 37 and 5."], return_tensors=None, padding=False)
    dataset = [
        {"input_ids": ids, "numeric_values": values} for ids, values in zip(rows["input_ids"], rows["numeric_values"])
    ]
    collator = NumericDataCollator(tok, add_labels=True)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True)
    metrics = Trainer(model=model, args=args, eval_dataset=dataset, data_collator=collator).evaluate()
    with torch.no_grad():
        expected = model(**collator(dataset)).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_transformers_stock_collators_pad_the_values_through_tokenizer_pad(tiny):
    _, tok = tiny
    rows = tok(TEXTS, return_tensors=None, padding=False)
    features = [{key: rows[key][b] for key in rows} for b in range(2)]
    expected = tok(TEXTS, return_tensors="pt", padding=True)  # the tokenizer's own padding, on its side (left)
    batch = DataCollatorWithPadding(tok)(features)
    assert set(batch) == set(expected)
    for key in expected:
        assert batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key]), key
    wide = DataCollatorWithPadding(tok, padding="max_length", max_length=12)(features)
    assert (
        wide["input_ids"].shape == (2, 12)
        and wide["numeric_values"][:, -9:].tolist() == expected["numeric_values"].tolist()
    )
    lm = DataCollatorForLanguageModeling(tok, mlm=False)(features)
    assert torch.equal(lm["numeric_values"], expected["numeric_values"])
    assert lm["labels"].tolist() == expected["input_ids"].masked_fill(expected["attention_mask"] == 0, -100).tolist()
    assert tok.batch_decode(batch) == TEXTS
    with pytest.raises(ValueError, match="pad needs padding=True"):
        tok.pad(features, padding=False)
