r"""Training data: a synthetic corpus whose numbers are learnable from context, and a JSONL reader.

**The synthetic corpus** (`synthetic_texts`) is what ``causalqwen demo`` trains on. Every sentence
comes from one of a few templates, and every number in it is either a free draw that the model cannot
predict (it only learns *that* a number comes, i.e. ``<NUM>``), or a *target* fixed by the context:

| template | example | rule for the target numbers |
|---|---|---|
| fixed price | ``A cup of tea costs 1.5 dollars.`` | the price is a fixed function of the drink (`DRINK_PRICES`) |
| copy | ``The price is 37 yuan. Again, the price is 37 yuan.`` | the second number repeats the first ($x \in [1, 99]$) |
| count | ``The team won 12 games, then 13 games, then 14 games.`` | each number is the previous plus 1 (start in $[1, 60]$) |
| double | ``One apple costs 6 yuan, so two apples cost 12 yuan.`` | the second number is twice the first ($p \in [1, 30]$) |
| bag | ``A bag of rice weighs 25 kilograms.`` | the weight is a fixed function of the good (`BAG_WEIGHTS`) |
| week | ``A week has 7 days, and a day has 24 hours.`` | constants |

So the positions before a target number must predict ``<NUM>`` (scored by ``num_precision``,
``num_recall``, ``num_f1``), and the value there is a deterministic function of the earlier text
(scored by ``reg_mae``, ``reg_mdae``). Sentences use words of the tiny tokenizer's training corpus, so
they tokenize into few pieces.

**Real data** (`read_jsonl`): one JSON object per line with a string field ``"text"``. Both go
through `NumericTokenizer`, and `TextDataset` turns texts into fixed-length training rows.
"""

from __future__ import annotations

import json
import os
import random

import torch
from torch.utils.data import Dataset

from .tokenization import NumericTokenizer, format_number

__all__ = ["DRINK_PRICES", "synthetic_texts", "read_jsonl", "TextDataset", "collate"]

DRINK_PRICES = {"tea": 1.5, "coffee": 2.5, "juice": 4.0, "water": 1.0}
BAG_WEIGHTS = {"rice": 25.0, "flour": 10.0, "sugar": 5.0, "salt": 2.0}
ITEMS = ["apple", "orange", "book", "cup"]
GAMES = ["team", "class", "company"]


def _fixed_price(rng: random.Random) -> str:
    drink = rng.choice(sorted(DRINK_PRICES))
    return f"A cup of {drink} costs {format_number(DRINK_PRICES[drink])} dollars."


def _bag(rng: random.Random) -> str:
    good = rng.choice(sorted(BAG_WEIGHTS))
    return f"A bag of {good} weighs {format_number(BAG_WEIGHTS[good])} kilograms."


def _copy(rng: random.Random) -> str:
    x = rng.randint(1, 99)
    return f"The price is {x} yuan. Again, the price is {x} yuan."


def _count(rng: random.Random) -> str:
    start = rng.randint(1, 60)
    who = rng.choice(GAMES)
    return f"The {who} won {start} games, then {start + 1} games, then {start + 2} games."


def _double(rng: random.Random) -> str:
    p = rng.randint(1, 30)
    item = rng.choice(ITEMS)
    return f"One {item} costs {p} yuan, so two {item}s cost {2 * p} yuan."


def _week(rng: random.Random) -> str:
    return "A week has 7 days, and a day has 24 hours."


TEMPLATES = {"fixed_price": _fixed_price, "bag": _bag, "copy": _copy, "count": _count, "double": _double, "week": _week}
WEIGHTS = {"fixed_price": 3, "bag": 3, "copy": 2, "count": 2, "double": 2, "week": 2}


def synthetic_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of the synthetic corpus (table above), drawn with ``random.Random(seed)``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rng = random.Random(seed)
    names = list(TEMPLATES)
    weights = [WEIGHTS[name] for name in names]
    return [TEMPLATES[rng.choices(names, weights)[0]](rng) for _ in range(n)]


def read_jsonl(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """``(texts, sources)``: the ``"text"`` of every non-blank line of a JSONL file, and for each a
    ``"PATH, line N"`` name that `TextDataset` uses in its errors.

    Raises ``ValueError`` naming the line (and the byte, for invalid UTF-8) for a line that is not
    UTF-8 or not a JSON object with a string ``"text"``, and for a file with no texts at all.
    """
    texts, sources = [], []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: invalid UTF-8 at byte {error.start} of the line "
                    f"({raw[error.start:error.start + 4]!r}); the file must be UTF-8 text"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'{path}, line {number}: expected a JSON object with a string field "text"')
            texts.append(record["text"])
            sources.append(f"{path}, line {number}")
    if not texts:
        raise ValueError(f"{path}: the dataset is empty (no line with a text)")
    return texts, sources


class TextDataset(Dataset):
    """Texts encoded with `NumericTokenizer`, each truncated to ``max_length`` tokens, EOS appended.

    An item is a dict of 1-D tensors ``input_ids`` (long), ``numeric_values`` (float32). Encoding
    happens once, here, and reads only as much of a long text as ``max_length`` tokens need; a number
    that does not fit float32 or a lone surrogate raises a ``ValueError`` naming the text
    (``sources[i]``, e.g. ``"data.jsonl, line 7"``; by default ``"text i"``, counted from 1).
    """

    def __init__(self, texts: list[str], tokenizer: NumericTokenizer, max_length: int = 64,
                 sources: list[str] | None = None):
        if not texts:
            raise ValueError("the dataset is empty: no texts to train on")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
        self.pad_token_id = tokenizer.pad_token_id
        self.items = []
        for index, text in enumerate(texts):
            try:
                ids, values = tokenizer.encode(text, max_length)  # only a prefix of a long text is encoded
            except ValueError as error:
                name = sources[index] if sources is not None else f"text {index + 1}"
                raise ValueError(f"{name}: {error}") from None
            eos = tokenizer.eos_token_id
            if eos is not None:
                ids, values = ids + [eos], values + [0.0]
            self.items.append(
                {
                    "input_ids": torch.tensor(ids[:max_length], dtype=torch.long),
                    "numeric_values": torch.tensor(values[:max_length], dtype=torch.float32),
                }
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


def collate(items: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of items into a batch: ``input_ids``, ``numeric_values``, ``attention_mask``,
    ``labels`` (= ``input_ids``, -100 at padding; the model shifts them inside) and ``numeric_labels``
    (= ``numeric_values``, what the model uses when none are given). Both label keys are there because
    `transformers.Trainer` takes every ``forward`` argument named ``*label*`` for a label, and computes an
    ``eval_loss`` only for batches that carry all of them."""
    length = max(len(item["input_ids"]) for item in items)
    batch = len(items)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    numeric_values = torch.zeros(batch, length)
    attention_mask = torch.zeros(batch, length, dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        input_ids[row, :n] = item["input_ids"]
        numeric_values[row, :n] = item["numeric_values"]
        attention_mask[row, :n] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "numeric_values": numeric_values, "attention_mask": attention_mask, "labels": labels,
            "numeric_labels": numeric_values.clone()}
