r"""The arithmetic problems of V11 (`validation.v11_arithmetic`): the data file, and how an answer is scored.

The file ``validation/data/arithmetic.jsonl`` (JSON Lines: a header line, then one problem per line) is made
once by `validation.make_arithmetic_data`. A `Problem` is its split, module, question and answer; its training
and evaluation text is ``Question: {question}\nAnswer:\n{answer}``. An answer is judged in float32, the
precision in which the project's number grammar reads every number: Qwen's written value must equal the
answer's (`exact_qwen`), CausalQwen's $\mathrm{loc}_Y$ rounded to the answer's resolution must (`exact_causal`);
`scores` gives exact match, the strict MdAE (unparseable = infinite) and the rest of V11's answer metrics.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from causalqwen.numbers import find_numbers

__all__ = ["DATA_PATH", "Problem", "load_problems", "select", "exact_qwen", "exact_causal", "scores"]

DATA_PATH = Path(__file__).resolve().parent / "data" / "arithmetic.jsonl"


@dataclass(frozen=True)
class Problem:
    """One problem of the data file: its split, module, question and answer (as the package wrote them)."""

    split: str
    module: str
    question: str
    answer: str

    @property
    def prompt(self) -> str:
        """The text before the answer."""
        return f"Question: {self.question}\nAnswer:\n"

    @property
    def text(self) -> str:
        """The training / evaluation text: the prompt, then the answer."""
        return self.prompt + self.answer

    @property
    def value(self) -> float:
        """The answer's exact decimal, as the nearest float64."""
        return float(self.answer)

    @property
    def value32(self) -> float:
        """The answer as the grammar reads it (float32)."""
        found = find_numbers(self.answer)
        if len(found) != 1 or found[0].start != 0 or found[0].end != len(self.answer):
            raise ValueError(f"the answer {self.answer!r} is not one number of the grammar")
        return found[0].value

    @property
    def decimals(self) -> int:
        """The answer's resolution: its number of digits after the decimal point."""
        return len(self.answer.partition(".")[2])


def load_problems(path: Path = DATA_PATH) -> tuple[dict, list[Problem]]:
    """``(header, problems)`` of the data file (JSON Lines: a header line, then one problem per line)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    problems = [Problem(**json.loads(line)) for line in lines[1:] if line.strip()]
    return header, problems


def select(problems: list[Problem], split: str, per_module: int | None = None) -> list[Problem]:
    """The problems of ``split`` in file order; with ``per_module``, the first that many of each module."""
    chosen, taken = [], {}
    for problem in problems:
        if problem.split != split:
            continue
        if per_module is not None and taken.get(problem.module, 0) >= per_module:
            continue
        taken[problem.module] = taken.get(problem.module, 0) + 1
        chosen.append(problem)
    return chosen


def exact_qwen(predicted: float, problem: Problem) -> bool:
    """Qwen's written value equals the answer's (both as the grammar reads them, float32)."""
    return not math.isnan(predicted) and predicted == problem.value32


def exact_causal(loc_y: float, problem: Problem) -> bool:
    r"""$\mathrm{loc}_Y$ rounded to the answer's resolution equals the answer (float32, as the grammar reads it)."""
    rounded = round(loc_y, problem.decimals)
    return float(np.float32(rounded)) == problem.value32


def scores(predicted: list[float], exact: list[bool], problems: list[Problem]) -> dict:
    """Exact-match accuracy, strict MdAE (unparseable = infinite), MdAE of the parseable, unparseable share, and
    the median |prediction| of the parseable."""
    truth = np.array([p.value for p in problems], dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    parsed = ~np.isnan(predicted)
    errors = np.where(parsed, np.abs(predicted - truth), np.inf)
    return {
        "n": len(problems),
        "exact": float(np.mean(exact)),
        "mdae_strict": float(np.median(errors)),
        "mdae_parsed": float(np.median(errors[parsed])) if parsed.any() else math.nan,
        "unparseable": float(np.mean(~parsed)),
        "median_abs_prediction": float(np.median(np.abs(predicted[parsed]))) if parsed.any() else math.nan,
    }
