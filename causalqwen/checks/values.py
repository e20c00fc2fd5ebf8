"""Checks made at the public doors (decision D10: bad input is an error that names it, never clamped away).

Every function here either returns its input in canonical form or raises a ``ValueError`` /
``TypeError`` that names the argument. They are called once, where a user's value enters the
package (a public function, ``forward``, ``generate``, the tokenizer, the CLI); internal calls trust
their callers and check nothing. A check that needs a value from the device (``bool(tensor)``) costs a
host synchronisation, so the model's ``forward`` folds all of its data checks into one transfer
(`all_good`) and only looks for the culprit once that transfer says something is wrong.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["TrainingDiverged", "check_finite_parameters", "as_bool_mask", "check_threshold", "check_labels", "check_positive_int", "all_good", "first_index"]


def as_bool_mask(mask: Tensor, name: str) -> Tensor:
    """Return ``mask`` as a bool tensor; raise ``ValueError`` naming it if it holds anything but 0 and 1."""
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0 and 1")
    return mask.bool()


def check_threshold(threshold, num_classes: int) -> None:
    """A threshold is a finite number, a 0-d tensor or a ``[V]`` tensor (a NaN or ±inf $C_k$ makes every $P_k$ NaN, 0 or 1)."""
    if isinstance(threshold, Tensor) and threshold.dim() > 0 and threshold.shape != (num_classes,):
        raise ValueError(
            f"a per-class threshold must have shape ({num_classes},) to match the {num_classes} classes, "
            f"got {tuple(threshold.shape)}"
        )
    if isinstance(threshold, Tensor):
        finite = bool(torch.isfinite(threshold).all())
    elif isinstance(threshold, numbers.Real) and not isinstance(threshold, bool):
        finite = math.isfinite(threshold)
    else:
        raise TypeError(f"threshold must be a real number or a tensor, got {type(threshold).__name__}")
    if not finite:
        raise ValueError("threshold (the OvR threshold C_k) must be finite: found NaN or ±inf")


def check_labels(labels: Tensor, num_classes: int, ignore_index: int) -> Tensor:
    """Return the mask of scored positions; raise if a label is neither a class nor ``ignore_index``."""
    if not isinstance(labels, Tensor) or labels.dtype == torch.bool or labels.dtype.is_floating_point:
        raise TypeError(f"labels must be an integer tensor, got {getattr(labels, 'dtype', type(labels))}")
    scored = labels != ignore_index
    out_of_range = scored & ((labels < 0) | (labels >= num_classes))
    if bool(out_of_range.any()):
        bad = labels[out_of_range][0].item()
        raise ValueError(f"labels must lie in [0, {num_classes}) or equal ignore_index={ignore_index}; found {bad}")
    return scored


def check_positive_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 1 (not a bool); otherwise a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def all_good(conditions: list[Tensor]) -> list[bool]:
    """Every condition (a bool tensor, reduced with ``all``) brought to the host in *one* transfer."""
    if not conditions:
        return []
    flags = torch.stack([condition.all() for condition in conditions])  # [n] on the device
    return flags.tolist()  # the one synchronisation


def first_index(bad: Tensor) -> tuple[int, ...]:
    """Index of the first True element of ``bad`` (called only once a check has failed)."""
    return tuple(bad.nonzero()[0].tolist())


class TrainingDiverged(ValueError):
    """Training produced a non-finite loss or gradient (or parameters that break the forward pass)."""


def check_finite_parameters(model, step: int, learning_rate: float, weight_decay: float) -> None:
    """`TrainingDiverged` naming the step and the first trainable parameter holding NaN or ±inf: run before a
    checkpoint is written and once when training ends (a model that `from_pretrained` refuses is never saved)."""
    named = [(name, p.detach()) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        return
    finite = torch.stack([torch.isfinite(p).all().to(named[0][1].device) for _, p in named])
    if bool(finite.all()):  # one sync
        return
    for (name, _), ok in zip(named, finite.tolist()):
        if not ok:
            raise TrainingDiverged(
                f"training diverged by step {step}: the parameter {name} holds NaN or ±inf values, so neither a "
                f"checkpoint nor the model is written; lower the learning rate (now {learning_rate:g}) or "
                f"the weight decay (now {weight_decay:g})"
            )
