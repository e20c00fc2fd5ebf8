"""Checks made at the public doors (decision D10: bad input is an error that names it, never clamped away).

Every function here either returns its input in canonical form or raises a ``ValueError`` /
``TypeError`` that names the argument. They are called once, where a user's value enters the
package (a public function, ``forward``, ``generate``, the tokenizer, the CLI); internal calls trust
their callers and check nothing. A check that needs a value from the device (``bool(tensor)``) costs a
host synchronisation, so the model's ``forward`` folds all of its data checks into one transfer
(`causalqwen.checks.doors.open_door`) and only looks for the culprit once that transfer says something is wrong.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = [
    "TrainingDiverged",
    "check_finite_parameters",
    "check_finite_real",
    "check_positive_int",
    "check_positive_integral",
    "first_index",
]


def check_positive_int(name: str, value) -> int:
    """``value`` if it is an ``int`` >= 1 (not a bool); otherwise a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_positive_integral(name: str, value) -> int:
    """``value`` as an ``int`` if it is an integral number >= 1 (not a bool): ``TypeError`` for another type,
    ``ValueError`` for one below 1, each naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_finite_real(name: str, value) -> float:
    """``value`` as a ``float`` if it is a finite real number (not a bool): ``TypeError`` for another type,
    ``ValueError`` for NaN or ±inf, each naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


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
