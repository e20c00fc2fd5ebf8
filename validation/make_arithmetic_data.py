r"""Generate the V11 data once: arithmetic problems from DeepMind's `mathematics-dataset`, written to
``validation/data/arithmetic.jsonl``.

The file is committed, so V11 (`validation.v11_arithmetic`) does not need `mathematics-dataset` at run time.
This script is how it was made, and it reproduces the file byte for byte:

    pip install --no-deps --target /tmp/mdslib mathematics-dataset==1.0.1 absl-py six
    PYTHONPATH=/tmp/mdslib python -m validation.make_arithmetic_data

**Source.** `mathematics-dataset` 1.0.1 (PyPI; Saxton et al., "Analysing Mathematical Reasoning Abilities of
Neural Models", ICLR 2019), with sympy 1.14.0 and numpy from this project's environment, absl-py and six
(imported by the package; they draw no random numbers). The package imports ``base_solution_linear`` from
``sympy.solvers.diophantine``, which sympy moved to ``sympy.solvers.diophantine.diophantine``; the shim
`_sympy_shim` sets that one attribute on the old module before the package is imported. The arithmetic
modules used here never call it.

**Splits and modules** (the package's own, `mathematics_dataset.modules.arithmetic`):

| split here | the package's split | modules | entropy of the two operands |
|---|---|---|---|
| ``train`` | ``train`` (all difficulty levels: the entropy range not cut into easy/medium/hard) | ``add_or_sub``, ``mul`` | add/sub 4–16, mul 3–10 |
| ``interpolate`` | ``interpolate`` (test) | ``add_or_sub``, ``mul`` | add/sub 12, mul 8 |
| ``extrapolate`` | ``extrapolate`` (test_extra) | ``add_or_sub_big``, ``mul_big`` | add/sub 16–20, mul 10–12 |

The entropy (in nats, spread over the two operands) sets how many digits the operands have: the extrapolation
split has longer numbers than anything in training. Problems are drawn module by module in the order of the
table, ``COUNTS`` per module and split, with ``random.seed(SEED)`` and ``numpy.random.seed(SEED)`` set once
before the first draw.

**What is kept.** As the package's generator does, a problem whose question is longer than 160 characters or
whose answer is longer than 30 is drawn again. Then a problem is kept only if the project's number grammar
(`causalqwen.numbers.find_numbers`) reads

* the answer (as the package writes it: an integer or a decimal, with ``-`` for negatives) as exactly one
  number that spans the whole answer, and
* exactly two numbers in the question (the two operands).

So every number becomes one ``<NUM>`` for CausalQwen. What is dropped: plain integers with more than 9
significant digits (the grammar's rule V2 reads them as identifiers), which only the large modules produce.
Questions that occur twice, or in the training split and an evaluation split, are dropped from the later one.
The counts drawn and kept are printed and written to the file's first line.

**File format.** JSON Lines. The first line is a header ``{"source": ..., "seed": ..., "counts": ...}``; then
one problem per line: ``{"split": "train" | "interpolate" | "extrapolate", "module": ..., "question": ...,
"answer": ...}`` with the question and the answer exactly as the package writes them.
"""  # noqa: E501

from __future__ import annotations

import importlib
import json
import random
import sys
from pathlib import Path

import numpy as np

from causalqwen.numbers import find_numbers

SEED = 11
PACKAGE = "mathematics-dataset==1.0.1"
# how many problems to keep per (split, module)
COUNTS = {
    ("train", "add_or_sub"): 1500,
    ("train", "mul"): 1500,
    ("interpolate", "add_or_sub"): 150,
    ("interpolate", "mul"): 150,
    ("extrapolate", "add_or_sub_big"): 150,
    ("extrapolate", "mul_big"): 150,
}
MAX_QUESTION_LENGTH = 160  # the package's generate_settings
MAX_ANSWER_LENGTH = 30
DATA_PATH = Path(__file__).resolve().parent / "data" / "arithmetic.jsonl"


def _sympy_shim() -> None:
    """Make ``from sympy.solvers.diophantine import base_solution_linear`` work with sympy >= 1.7."""
    package = importlib.import_module("sympy.solvers.diophantine")
    if not hasattr(package, "base_solution_linear"):
        inner = importlib.import_module("sympy.solvers.diophantine.diophantine")
        sys.modules["sympy.solvers.diophantine"].base_solution_linear = inner.base_solution_linear


def answer_is_one_number(answer: str) -> bool:
    """The grammar reads ``answer`` as exactly one number covering all of it."""
    found = find_numbers(answer)
    return len(found) == 1 and found[0].start == 0 and found[0].end == len(answer)


def keep(question: str, answer: str) -> bool:
    """The selection rule of the module docstring (lengths, then the grammar)."""
    if len(question) > MAX_QUESTION_LENGTH or len(answer) > MAX_ANSWER_LENGTH:
        return False
    return answer_is_one_number(answer) and len(find_numbers(question)) == 2


def generate() -> tuple[dict, list[dict]]:
    """The header and the problems (see the module docstring)."""
    _sympy_shim()
    from mathematics_dataset.modules import arithmetic

    def whole_range(entropy_range):  # the train entropy range as it is (not cut into difficulty levels)
        return entropy_range

    modules = {
        "train": arithmetic.train(whole_range),
        "interpolate": arithmetic.test(),
        "extrapolate": arithmetic.test_extra(),
    }
    random.seed(SEED)
    np.random.seed(SEED)
    problems, seen, counts = [], set(), {}
    for (split, module), wanted in COUNTS.items():
        draw = modules[split][module]
        drawn = 0
        kept = 0
        while kept < wanted:
            problem = draw()
            drawn += 1
            question, answer = str(problem.question), str(problem.answer)
            if not keep(question, answer) or question in seen:
                continue
            seen.add(question)
            problems.append({"split": split, "module": module, "question": question, "answer": answer})
            kept += 1
        counts[f"{split}/{module}"] = {"drawn": drawn, "kept": kept}
    header = {
        "source": PACKAGE,
        "sympy_shim": "sympy.solvers.diophantine.base_solution_linear",
        "seed": SEED,
        "counts": counts,
    }
    return header, problems


def main() -> None:
    header, problems = generate()
    DATA_PATH.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(header, sort_keys=True)] + [json.dumps(p, ensure_ascii=True) for p in problems]
    DATA_PATH.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name, count in header["counts"].items():
        print(f"{name}: kept {count['kept']} of {count['drawn']} drawn")
    print(f"wrote {DATA_PATH} ({DATA_PATH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
