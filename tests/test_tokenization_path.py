"""Text to numbers in one pass: following ``texts`` from `NumericTokenizer.__call__`, control comes back to a file of
the package it had left at most `MAX_RETURNS` times.

The walk is what a profiler sees (``sys.setprofile``): at each call and each return, the package file control is in
(the innermost frame of ``causalqwen/`` on the stack; the wrapped tokenizer's own code stays in the file that called
it). A *stay* is a run of consecutive events in one file; a *return to a file* is a stay in a file that had been left
before. The door (`causalqwen.checks.tokenizer_door`), the number grammar (`causalqwen.numbers`, with
`causalqwen.float32`), the section's rows and padding (`causalqwen.tokenization`) and the wrapper
(`causalqwen.integrations.tokenizer`) are each entered a fixed number of times, whatever the texts and however many
numbers they hold: no step goes back and forth per text or per number. Before the numbers pipeline was one pass,
``tokenizer(TEXT)`` made 19 stays in 5 files (14 returns), and one more return per number and per text.

The pipeline's files also keep every function within `MAX_FUNCTION_LINES` lines, its docstring left out.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import causalqwen
from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer

MAX_RETURNS = 6
PACKAGE = Path(causalqwen.__file__).resolve().parent
TEXT = "A cup of coffee costs 3.5 dollars, and 12 cups cost 42 dollars."
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


MAX_FUNCTION_LINES = 60
PIPELINE_FILES = [
    "numbers.py",
    "tokenization.py",
    "checks/tokenizer_door.py",
    "integrations/tokenizer.py",
    "integrations/tokenizer_mixin.py",
    "integrations/tokenizer_decoding.py",
    "integrations/wrapped_tokenizer.py",
]


def body_lines(function: ast.FunctionDef) -> int:
    """The lines from a function's ``def`` to its end, its docstring's lines left out."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_no_function_of_the_numbers_pipeline_is_over_sixty_lines():
    too_long = []
    for file in PIPELINE_FILES:
        for node in ast.walk(ast.parse((PACKAGE / file).read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and body_lines(node) > MAX_FUNCTION_LINES:
                too_long.append(f"{file}:{node.name} {body_lines(node)}")
    assert too_long == []
