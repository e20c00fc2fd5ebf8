"""The path a reader follows from text to loss stays short: ``tokenizer(text)`` then ``model(**enc, labels=ids).loss``
crosses at most `MAX_FILES` files and `MAX_FUNCTIONS` functions of the package with the literal loss (the readable
reference, docs/path.md), and at most `MAX_FILES_FUSED` files with the default, fused one.

Functions are counted as a profiler sees them (``sys.setprofile``): each distinct function, method or property of
``causalqwen/`` entered at least once; comprehensions and lambdas are part of the function that holds them.

The limits are a ratchet, set at what the path takes now: 13 files and 50 functions with the literal loss (16 and
77 before the redesign), 15 files with the fused one (18 before). The core model (`causalqwen.model`, the design's
steps in one place) joined the path as its thirteenth file, and two functions with it (12 files and 45 functions
before it); the tail NLL's one home (`causalqwen.action.ovr_tail_nll`) one more, and the door's checks split to keep
every function within 60 lines two more. The goals are 40 functions for the
literal path and 14 files for the fused one; lower the limits as the path gets there, never raise them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import causalqwen
from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_causal_lm, build_tiny_tokenizer

MAX_FILES, MAX_FUNCTIONS = 13, 50
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


# ---- following texts through the tokenizer: control comes back to a file of the package at most MAX_RETURNS times ----
# The walk is what a profiler sees: at each call and return, the package file control is in (the innermost frame of
# causalqwen/ on the stack). A *stay* is a run of consecutive events in one file; a *return to a file* is a stay in a
# file that had been left before. Before the numbers pipeline was one pass, tokenizer(TEXT) made 19 stays in 5 files
# (14 returns), and one more return per number and per text.

MAX_RETURNS = 6
LINES = [
    TEXT,
    "价格是99.9元，温度-15.5度，第1章共2,345字。",
    "no numbers here",
    "1-2, 3-4, 5-6, 7-8, 9-10, 11-12",  # number-dense: its runs between numbers repeat
    "Version 3.10.2 shipped on 2024-03-15 with 1.5e3 fixes and 0x1F flags.",
]


def package_file(frame) -> str | None:
    """The package file of the innermost frame of ``causalqwen/`` on the stack from ``frame``, or None."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(PACKAGE):
            return str(path.relative_to(PACKAGE))
        frame = frame.f_back
    return None


def stays(call) -> list[str]:
    """The package files control stays in while ``call()`` runs, in order (consecutive events in one file: one stay)."""
    walk: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            where = package_file(frame)
        elif event == "return":
            where = package_file(frame.f_back)
        else:
            return
        if where is not None and (not walk or walk[-1] != where):
            walk.append(where)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return walk


def returns_to_a_file(walk: list[str]) -> int:
    """How many stays are in a file that an earlier stay was in."""
    return len(walk) - len(set(walk))


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = NumericTokenizer(build_tiny_tokenizer())
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


CALLS = {
    "one text, tensors": lambda tokenizer: tokenizer(TEXT, return_tensors="pt"),
    "one text, lists": lambda tokenizer: tokenizer(TEXT),
    "a batch, padded": lambda tokenizer: tokenizer(LINES),
    "a batch, right, numpy": lambda tokenizer: tokenizer(LINES, padding_side="right", return_tensors="np"),
    "a batch, lists, no mask": lambda tokenizer: tokenizer(
        LINES, padding=False, return_tensors=None, return_attention_mask=False
    ),
    "a number-dense batch": lambda tokenizer: tokenizer([LINES[3]] * 8 + [TEXT]),
    "a batch padded to max_length": lambda tokenizer: tokenizer(LINES, padding="max_length", max_length=64),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_following_texts_returns_to_a_file_at_most_six_times(tokenizer, name):
    call = CALLS[name]
    call(tokenizer)  # first calls fill caches; the walk is what a second call runs
    walk = stays(lambda: call(tokenizer))
    assert walk[0] == walk[-1] == "integrations/tokenizer.py"
    assert returns_to_a_file(walk) <= MAX_RETURNS, walk


def test_the_walk_is_counted_as_stays_and_returns():
    walk = ["a.py", "b.py", "a.py", "c.py", "b.py", "a.py"]
    assert returns_to_a_file(walk) == 3
    assert stays(lambda: sorted([3, 1, 2])) == []  # nothing of the package runs
