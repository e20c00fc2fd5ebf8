"""Argument checks shared by the comparison's corpora and batches (`validation.domain_a`, `validation.domain_b`,
`validation.domains`, `validation.qwen_batches`): a positive count and an int seed, each a clear error naming
the argument."""

from __future__ import annotations

__all__ = ["check_count", "check_seed"]


def check_count(n, name: str = "n") -> int:
    """``n``, or a ValueError unless it is a positive int (``name`` names it in the message)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int, got {n!r}")
    return n


def check_seed(seed) -> int:
    """``seed``, or a TypeError unless it is an int (a bool is not)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return seed
