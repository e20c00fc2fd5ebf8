"""The path a reader follows from text to loss stays short: ``tokenizer(text)`` then ``model(**enc, labels=ids).loss``
crosses at most `MAX_FILES` files and `MAX_FUNCTIONS` functions of the package with the literal loss (the readable
reference, docs/path.md), and at most `MAX_FILES_FUSED` files with the default, fused one.

Functions are counted as a profiler sees them (``sys.setprofile``): each distinct function, method or property of
``causalqwen/`` entered at least once; comprehensions and lambdas are part of the function that holds them.

The limits are a ratchet, set at what the path takes now: 13 files and 48 functions with the literal loss (16 and
77 before the redesign), 15 files with the fused one (18 before). The core model (`causalqwen.model`, the design's
steps in one place) joined the path as its thirteenth file, and two functions with it (12 files and 45 functions
before it); the tail NLL's one home (`causalqwen.action.ovr_tail_nll`) one more. The goals are 40 functions for the
literal path and 14 files for the fused one; lower the limits as the path gets there, never raise them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import causalqwen
from causalqwen.app.tiny import build_tiny_causal_lm

MAX_FILES, MAX_FUNCTIONS = 13, 48
MAX_FILES_FUSED = 15
TEXT = "A cup of coffee costs 3.5 dollars, and 12 cups cost 42 dollars."
PACKAGE = Path(causalqwen.__file__).resolve().parent


def traced_path(tokenizer, model) -> dict[str, set[str]]:
    """The package's files and functions entered by ``tokenizer(TEXT)`` and ``model(**enc, labels=ids).loss``."""
    seen: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            name = frame.f_code.co_qualname
            if path.is_relative_to(PACKAGE) and "<" not in name.rsplit(".", 1)[-1]:
                seen.setdefault(str(path.relative_to(PACKAGE)), set()).add(name)

    sys.setprofile(profile)
    try:
        encoding = tokenizer(TEXT, return_tensors="pt")
        loss = model(**encoding, labels=encoding["input_ids"]).loss
    finally:
        sys.setprofile(None)
    assert loss.isfinite()
    return seen


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_causal_lm(seed=0, init_seed=0)


def test_the_literal_path_from_text_to_loss_is_short(tiny):
    tiny.model.config.loss_algorithm = "literal"
    try:
        traced_path(tiny.tokenizer, tiny.model)  # first calls build caches; the path is what a second call runs
        seen = traced_path(tiny.tokenizer, tiny.model)
    finally:
        tiny.model.config.loss_algorithm = "fused"
    functions = sorted(f"{file}:{name}" for file, names in seen.items() for name in names)
    assert len(seen) <= MAX_FILES, sorted(seen)
    assert len(functions) <= MAX_FUNCTIONS, functions


def test_the_default_path_adds_the_fused_kernel_and_little_else(tiny):
    assert tiny.model.config.loss_algorithm == "fused"
    traced_path(tiny.tokenizer, tiny.model)
    seen = traced_path(tiny.tokenizer, tiny.model)
    assert len(seen) <= MAX_FILES_FUSED, sorted(seen)
