r"""Trust boundaries: what causalqwen reads from outside, what it refuses, and the cases that hold it to that.

One module per boundary, each a table `CASES` of `validation.cases.TrustCase` rows (`BOUNDARIES`, in the
order the report shows them):

- `validation.trust.configuration` -- ``config.json`` fields and the model's and the training's settings;
- `validation.trust.files` -- weights, checkpoints and saved networks, read and written;
- `validation.trust.run_directories` -- the directory a run writes, and the run it resumes;
- `validation.trust.model_inputs` -- what ``forward`` takes, and its loss;
- `validation.trust.generation` -- ``generate``, ``model.generate`` and the pipeline;
- `validation.trust.text` -- the tokenizer, texts and the JSONL files that hold them;
- `validation.trust.adapters` -- saved LoRA adapters loaded back;
- `validation.trust.command_line` -- the ``causalqwen`` command's options, output and exits.

Each row names the kind of finding it holds (`validation.cases.KINDS`): **security** (a file from someone
else that could run code, or the user's own files touched), **silent** (an input that gave a wrong answer
without a word) or **clarity** (an input that failed with a message that named nothing).

A row either must raise exactly its exception with a message that names the file, line, field or character
(``error`` and ``message``), or must *succeed* with the right result (``error`` is None: the trigger checks
the result and raises `WrongResult` otherwise); `validation.cases.run_trust_case` judges it. A row that
plants a pickle, a link or a file to be kept checks afterwards that the pickle never ran, the file the link
points to is unchanged and the kept file is still there (`validation.trust.planted`). The rows about
crafted texts give a generous deadline (seconds where a quadratic grammar takes minutes): they tell linear
from quadratic, and ``python -m benchmarks tokenizer`` holds the speed goal itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cases import KINDS, TrustCase, WrongResult, run_trust_case
from . import adapters, command_line, configuration, files, generation, model_inputs, run_directories, text

__all__ = ["Boundary", "BOUNDARIES", "KINDS", "TRUST_CASES", "TrustCase", "WrongResult", "run_trust_case"]


@dataclass(frozen=True)
class Boundary:
    """One boundary: its name, what crosses it (in words) and its rows."""

    name: str
    crosses: str
    cases: list[TrustCase]


BOUNDARIES = [
    Boundary(
        "configuration", "`config.json` fields, the model's settings, the training's settings", configuration.CASES
    ),
    Boundary("files and checkpoints", "weights, checkpoints and saved networks, read and written", files.CASES),
    Boundary("run directories", "the directory a run writes, and the run it resumes", run_directories.CASES),
    Boundary(
        "model inputs", "what `forward` takes (ids, values, masks, positions, labels), and its loss", model_inputs.CASES
    ),
    Boundary("generation", "`generate`, `model.generate` and the text-generation pipeline", generation.CASES),
    Boundary("tokenizer and text", "texts, the JSONL files that hold them, the tokenizer's files", text.CASES),
    Boundary("adapters", "a saved LoRA adapter loaded back", adapters.CASES),
    Boundary("command line", "the `causalqwen` command's options, output and exits", command_line.CASES),
]

TRUST_CASES = [case for boundary in BOUNDARIES for case in boundary.cases]
