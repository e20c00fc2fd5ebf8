"""The batch `causalqwen.tokenization.NumericTokenizer` returns: a transformers ``BatchEncoding`` with values.

`NumericEncoding` holds ``input_ids``, ``numeric_values`` and ``attention_mask`` as transformers' tokenizers
hold theirs: ``[B, S]`` torch tensors (``return_tensors="pt"``), numpy arrays (``"np"``) or Python lists
(``None``; then rows may have different lengths when nothing pads them), plus the surface text of every
number (``number_texts``). `pad_rows` is the one padding of the package: the tokenizer and
`causalqwen.files.data.collate` both pad with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from transformers import BatchEncoding

__all__ = ["NumericEncoding", "pad_rows", "padded_lists", "as_tensor_type", "RETURN_TENSORS", "FLOAT_KEYS"]

# What ``return_tensors`` may be: torch tensors, numpy arrays, or Python lists (None).
RETURN_TENSORS = ("pt", "np", None)
# The keys that hold values (float32); every other key holds ids or flags (int64).
FLOAT_KEYS = ("numeric_values", "numeric_labels")


class NumericEncoding(BatchEncoding):
    """What `NumericTokenizer.__call__` returns: a `transformers.BatchEncoding` with ``input_ids``,
    ``numeric_values`` and ``attention_mask`` (``[B, S]`` tensors by default; ``model(**encoding)`` works), plus the
    attribute ``number_texts``.

    ``number_texts[b][k]`` is the text of the k-th number of row b as it was written (``"43.60"``,
    ``"−2"``, ``"1,000"``). It is an attribute, not a key, so that it never reaches the model; pass the
    whole encoding to `NumericTokenizer.batch_decode` to get the texts back, or give
    ``number_texts=encoding.number_texts`` when decoding what `causalqwen.generate` made from it. The encoding of
    one text as lists (``tokenizer("one text")``) holds flat rows, and ``number_texts[k]`` is its k-th number.

    ``NumericEncoding(mapping)`` builds one from a plain mapping, as transformers' ``Trainer`` rebuilds every
    mapping it moves to the device (``type(batch)({...})``): the keys are kept, and ``number_texts`` is None
    (not known; decoding then writes the values).
    """

    def __init__(self, data: Mapping | None = None, number_texts: list | None = None):
        super().__init__(data)
        self.number_texts = number_texts

    def __getstate__(self):
        return super().__getstate__() | {"number_texts": self.number_texts}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.number_texts = state.get("number_texts")


def padded_lists(input_ids: list[list[int]], numeric_values: list[list[float]], width: int | None,
                 pad_token_id: int | None, padding_side: str = "right") -> dict[str, list]:
    """Rows of ids and values as lists, each padded on ``padding_side`` to ``width`` (None: not padded): padded
    positions hold ``pad_token_id``, the value 0.0 and ``attention_mask`` 0 (1 on real tokens)."""
    left = padding_side == "left"

    def padded(row: list, fill) -> list:
        if width is None:
            return list(row)
        return [fill] * (width - len(row)) + list(row) if left else list(row) + [fill] * (width - len(row))

    return {
        "input_ids": [padded(row, pad_token_id) for row in input_ids],
        "numeric_values": [padded([float(value) for value in row], 0.0) for row in numeric_values],
        "attention_mask": [padded([1] * len(row), 0) for row in input_ids],
    }


def as_tensor_type(data: dict[str, list], return_tensors: str | None) -> dict:
    """Rows of equal length (``[B, S]``, also S = 0) as torch tensors (``"pt"``) or numpy arrays (``"np"``):
    ``numeric_values`` and ``numeric_labels`` float32, the others (ids, mask, labels) int64; ``None`` leaves the
    lists as they are."""
    if return_tensors is None:
        return data
    converted = {}
    for key, rows in data.items():
        shape = (len(rows), len(rows[0]) if rows else 0)
        array = np.asarray(rows, dtype=np.float32 if key in FLOAT_KEYS else np.int64).reshape(shape)
        converted[key] = torch.from_numpy(array) if return_tensors == "pt" else array  # numpy reads lists 3x faster
    return converted


def pad_rows(input_ids: list[list[int]], numeric_values: list[list[float]], width: int, pad_token_id: int,
             padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Rows of ids and values as ``[B, width]`` tensors, each padded on ``padding_side`` to ``width``: padded
    positions hold ``pad_token_id``, the value 0.0 and ``attention_mask`` 0 (1 on real tokens). The one padding
    of the package: `NumericTokenizer.__call__` and `causalqwen.files.data.collate` both pad with it."""
    return as_tensor_type(padded_lists(input_ids, numeric_values, width, pad_token_id, padding_side), "pt")
