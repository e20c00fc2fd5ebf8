"""A data collator for transformers' ``Trainer`` and ``DataLoader`` that pads ``numeric_values`` with the ids.

transformers' ``DataCollatorWithPadding`` pads what its tokenizer's ``pad`` knows; `NumericDataCollator` is the
same recipe for rows of `causalqwen.integrations.tokenizer.NumericTokenizer`: each feature a dict with ``input_ids`` and
``numeric_values`` (lists, tensors or arrays, as ``tokenizer(text)`` or a ``datasets`` map gives them), and
optionally ``attention_mask``, ``labels``, ``numeric_labels`` and ``completion_mask`` (a prompt–completion row:
`causalqwen.files.data.prompt_completion_features`). It pads them to the
longest row (or a multiple of ``pad_to_multiple_of``): ids with the pad id, values with 0.0, the mask with 0,
labels with -100 and numeric labels with 0.0, by `causalqwen.tokenization.padded_lists`.

A feature with a ``completion_mask`` and no ``labels`` gets its ``input_ids`` as labels with ``label_pad_token_id``
where the mask is 0 (the prompt), as TRL's completion-only loss does: both losses then score the completion alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..tokenization import RETURN_TENSORS, as_tensor_type, padded_lists

__all__ = ["NumericDataCollator"]


@dataclass
class NumericDataCollator:
    """Pad a list of features into a batch of ``[B, S]`` tensors (``return_tensors="pt"``) or arrays (``"np"``).

    Args:
        tokenizer: the `NumericTokenizer` (its ``pad_token_id`` fills padded ids).
        padding_side: ``"right"`` (default: training) or ``"left"``.
        pad_to_multiple_of: round the width up to a multiple of it (None: the longest row).
        max_length: pad every row to at least this width (transformers' ``padding="max_length"``; None: the
            longest row).
        label_pad_token_id: what fills padded ``labels`` (-100: no loss there).
        add_labels: with True, a feature without ``labels`` gets its ``input_ids`` as labels (-100 on padding),
            as ``DataCollatorForLanguageModeling(mlm=False)`` does: the model shifts them inside.
        return_tensors: ``"pt"``, ``"np"`` or None (lists).

    Whenever the batch has ``labels`` and its features no ``numeric_labels``, ``numeric_labels`` is the padded
    ``numeric_values`` (what the model uses when none are given): transformers' ``Trainer`` counts every
    ``forward`` argument named ``*label*`` as a label and reports ``eval_loss`` only for batches with all of them.
    """

    tokenizer: object
    padding_side: str = "right"
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = -100
    add_labels: bool = False
    return_tensors: str | None = "pt"
    max_length: int | None = None

    def __post_init__(self):
        if self.padding_side not in ("left", "right"):
            raise ValueError(f'padding_side must be "left" or "right", got {self.padding_side!r}')
        if self.return_tensors not in RETURN_TENSORS:
            raise ValueError(f'return_tensors must be "pt", "np" or None, got {self.return_tensors!r}')
        for name in ("pad_to_multiple_of", "max_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")

    def __call__(self, features: list[Mapping]) -> dict:
        """The padded batch: ``input_ids``, ``numeric_values``, ``attention_mask``, and ``labels`` and
        ``numeric_labels`` where the features (or ``add_labels``) give labels."""
        rows = [_feature_rows(feature, index) for index, feature in enumerate(_checked_features(features))]
        width = max([len(row["input_ids"]) for row in rows] + [self.max_length or 0])
        if self.pad_to_multiple_of is not None:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        pad_token_id = self.tokenizer.pad_token_id
        if pad_token_id is None and any(len(row["input_ids"]) < width for row in rows):
            raise ValueError(
                "the tokenizer has no pad token; set tokenizer.pad_token before collating rows of different lengths"
            )
        data = padded_lists(
            [row["input_ids"] for row in rows],
            [row["numeric_values"] for row in rows],
            width,
            pad_token_id,
            self.padding_side,
        )
        data["attention_mask"] = [self._padded(row["attention_mask"], 0, width) for row in rows]
        if self.add_labels or any("labels" in row or "completion_mask" in row for row in rows):
            data["labels"] = [self._padded(self._labels(row), self.label_pad_token_id, width) for row in rows]
            if all("numeric_labels" in row for row in rows):
                data["numeric_labels"] = [self._padded(row["numeric_labels"], 0.0, width) for row in rows]
            else:
                data["numeric_labels"] = [list(values) for values in data["numeric_values"]]
        return as_tensor_type(data, self.return_tensors)

    def _labels(self, row: dict) -> list[int]:
        """A row's labels: its own, else its ids (with a ``completion_mask`` or ``add_labels``), -100 where its
        attention mask or its completion mask is 0."""
        if "labels" in row:
            return row["labels"]
        if not self.add_labels and "completion_mask" not in row:
            raise ValueError("some features have labels and some do not; give every feature labels, or none")
        scored = row.get("completion_mask", row["attention_mask"])
        return [
            token if keep and real else self.label_pad_token_id
            for token, keep, real in zip(row["input_ids"], scored, row["attention_mask"])
        ]

    def _padded(self, row: list, fill, width: int) -> list:
        """One row padded with ``fill`` to ``width`` on `padding_side`."""
        pads = [fill] * (width - len(row))
        return pads + list(row) if self.padding_side == "left" else list(row) + pads


def _checked_features(features) -> list[Mapping]:
    """A non-empty list of mappings, or a ``TypeError`` / ``ValueError`` saying what is wrong."""
    if not isinstance(features, (list, tuple)) or not features:
        raise ValueError(f"features must be a non-empty list of dicts, got {type(features).__name__}")
    for index, feature in enumerate(features):
        if not isinstance(feature, Mapping):
            raise TypeError(f"features[{index}] must be a dict, got {type(feature).__name__}")
    return list(features)


def _as_list(data) -> list:
    """A 1-D tensor, array or sequence as a list."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 1:
            raise ValueError(f"must be 1-D, got shape {tuple(data.shape)}")
        return data.tolist()
    return list(data)


def _feature_rows(feature: Mapping, index: int) -> dict[str, list]:
    """One feature's rows as lists, all of the length of its ``input_ids`` (``attention_mask`` all 1 if absent)."""
    missing = [key for key in ("input_ids", "numeric_values") if key not in feature]
    if missing:
        raise ValueError(f"features[{index}] has no {' and no '.join(missing)} (keys: {', '.join(map(str, feature))})")
    rows = {}
    for key in ("input_ids", "numeric_values", "attention_mask", "labels", "numeric_labels", "completion_mask"):
        if key in feature and feature[key] is not None:
            try:
                rows[key] = _as_list(feature[key])
            except ValueError as error:
                raise ValueError(f"features[{index}][{key!r}] {error}") from None
    rows.setdefault("attention_mask", [1] * len(rows["input_ids"]))
    if "completion_mask" in rows:
        if "labels" in rows:
            raise ValueError(
                f"features[{index}] has both labels and a completion_mask: give one (the mask makes the labels)"
            )
        if any(keep not in (0, 1) for keep in rows["completion_mask"]):
            raise ValueError(f"features[{index}]['completion_mask'] must hold 0 (prompt) and 1 (completion) only")
    for key, row in rows.items():
        if len(row) != len(rows["input_ids"]):
            raise ValueError(f"features[{index}][{key!r}] has length {len(row)} but input_ids {len(rows['input_ids'])}")
    return rows
