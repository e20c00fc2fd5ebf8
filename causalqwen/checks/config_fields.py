"""The checks of single configuration values: a dtype name, the kind of a field (a JSON boolean, an integer, a finite
number within the float range), a number in its range, every integer of a config within 64 bits. Each error is a
``TypeError`` or ``ValueError`` naming the field; `causalqwen.configuration` applies them when a config is made,
loaded or changed, and the loaders add the file."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

__all__ = ["FLOAT_DTYPES", "checked_dtype", "checked_field", "check_ranges", "finite_float", "check_integers_fit"]

# The dtype names a config may hold (``null`` or ``"auto"``: none recorded).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def checked_dtype(name: str, value):
    """A ``dtype`` or ``torch_dtype`` as a float dtype name, or None (``"auto"`` too); else a ValueError naming it."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return None
    text = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
    if not isinstance(text, str) or text not in FLOAT_DTYPES:
        raise ValueError(f'config field {name} must be one of {", ".join(FLOAT_DTYPES)}, "auto" or null, got {value!r}')
    return text if isinstance(value, str) else value


def checked_field(name: str, value, kind: str):
    """``value`` as a Python bool / int / finite float, or a ``TypeError`` naming the field (a string is never cast)."""
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"config field {name} must be true or false (a JSON boolean), got {value!r}")
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"config field {name} must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}")
    if kind == "int":
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"config field {name} must be an integer, got {value!r}")
        return int(value)
    return finite_float(name, value)


def finite_float(name: str, value) -> float:
    """The real ``value`` of the config field ``name`` as a finite Python float; a ``ValueError`` naming the field if
    it is not finite or is an integer beyond the float range (``int(10**400)`` has no float: Python's
    ``OverflowError`` named nothing)."""
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(
            f"config field {name} must be a finite number, got an integer of {value.bit_length()} bits, beyond the "
            "float range (about 1.8e308)"
        ) from None
    if not math.isfinite(number):
        raise ValueError(f"config field {name} must be finite, got {value!r}")
    return number


def check_ranges(config, ranges: dict) -> None:
    """Each ``name: (rule, allowed)``: a ``ValueError`` naming the field unless ``rule(value)`` (or not finite)."""
    for name, (rule, allowed) in ranges.items():
        value = getattr(config, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"config field {name} must be finite, got {value!r}")
        if isinstance(value, int) and not isinstance(value, bool):
            finite_float(name, value)
        if not rule(value):
            raise ValueError(f"config field {name} must be a number {allowed}, got {value!r}")


INT64 = (-(2**63), 2**63 - 1)


def check_integers_fit(fields: dict) -> None:
    """Every integer among the config's ``fields`` (nested in objects and lists too, named by their path) within 64
    bits, as torch holds it; a ``ValueError`` naming the field otherwise."""
    pending = list(fields.items())
    while pending:
        name, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((f"{name}.{key}", item) for key, item in value.items())
        elif isinstance(value, (list, tuple)):
            pending.extend((f"{name}[{index}]", item) for index, item in enumerate(value))
        elif isinstance(value, numbers.Integral) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            raise ValueError(
                f"config field {name} must be an integer within 64 bits (|value| < 2**63), got one of "
                f"{int(value).bit_length()} bits"
            )
