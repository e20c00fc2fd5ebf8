"""What `causalqwen.integrations.tokenizer.NumericTokenizer` returns and remembers of the texts it encoded.

`NumericEncoding` holds ``input_ids``, ``numeric_values`` and ``attention_mask`` as transformers' tokenizers
hold theirs: ``[B, S]`` torch tensors (``return_tensors="pt"``), numpy arrays (``"np"``) or Python lists
(``None``; then rows may have different lengths when nothing pads them), plus the surface text of every
number (``number_texts``); `causalqwen.tokenization.pad_rows` pads its rows, and `TENSORS_FOR_A_BATCH` is the
default type of its rows. `NumberTextsSeen` keeps how the
numbers of the last texts encoded alone were written, for a streamer that is handed their ids and values only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import torch
from transformers import BatchEncoding

__all__ = ["NumericEncoding", "TENSORS_FOR_A_BATCH", "NumberTextsSeen"]


class _TensorsForABatch:
    """The default of ``NumericTokenizer.__call__``'s ``return_tensors``: ``"pt"`` for a list of texts, None (Python
    lists) for one str, as transformers returns one text."""

    def __repr__(self) -> str:
        return "TENSORS_FOR_A_BATCH"


TENSORS_FOR_A_BATCH = _TensorsForABatch()


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


class NumberTextsSeen:
    """How the numbers of the last `SIZE` texts with numbers that a tokenizer encoded alone (one str, or a list of
    one) were written, found by the ids and values of their row: ``"12.50"`` where the values say 12.5 only.

    ``model.generate(**tokenizer([prompt]), streamer=...)`` hands a streamer the prompt's ids and values, not its
    text; `causalqwen.integrations.streamer.NumericTextStreamer` asks here how the prompt's numbers were written.
    A row is known by a 16-byte digest of its ids (int64) and values (float32), so a long text costs its digest
    alone; two texts with the same ids and values (``"12.5"`` and ``"12.50"``) share a row, and the one encoded
    last is found.
    """

    SIZE = 16

    def __init__(self):
        self.texts_by_row: OrderedDict[bytes, list[str]] = OrderedDict()

    def remember(self, input_ids, numeric_values, number_texts: list[str]) -> None:
        """Keep the texts of one row's numbers (a row without numbers needs none: it decodes as written)."""
        if not number_texts:
            return
        key = self.row_digest(input_ids, numeric_values)
        self.texts_by_row[key] = list(number_texts)
        self.texts_by_row.move_to_end(key)
        if len(self.texts_by_row) > self.SIZE:
            self.texts_by_row.popitem(last=False)

    def find(self, input_ids, numeric_values) -> list[str] | None:
        """The texts of the numbers of a row encoded lately, or None if no such row was."""
        return self.texts_by_row.get(self.row_digest(input_ids, numeric_values))

    @staticmethod
    def row_digest(input_ids, numeric_values) -> bytes:
        """A digest of a row's ids and values (lists, CPU tensors or arrays of one row)."""
        ids = np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids, dtype=np.int64)
        values = np.asarray(
            numeric_values.cpu() if isinstance(numeric_values, torch.Tensor) else numeric_values, dtype=np.float32
        )
        return hashlib.blake2b(ids.tobytes() + b"|" + values.tobytes(), digest_size=16).digest()
