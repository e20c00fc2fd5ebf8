r"""The robustness suite: where the implementation must fail loudly, and where it must not fail at all.

Four parts, each data plus a runner, shared by the tests (``tests/test_validation_robustness.py``) and by the
validation report (`summary_markdown`); this module runs them all (`run_suite`) and writes the report's
section. Each part's names are imported from the module that owns it:

1. **Bad inputs** (`BAD_INPUT_CASES`): one row per kind of wrong input, across the tokenizer, the
   model, the losses, the inference modes, generation and the command line. Each row holds a
   zero-argument callable that commits the mistake, the exception type it must raise and a regular
   expression its message must contain, naming what is wrong. No row may end in a bare
   ``IndexError``, a shape error from deep inside torch, a silent NaN or a silently clamped value.
2. **Tampered checkpoints** (`CHECKPOINT_CASES`): a tiny model saved with ``save_pretrained``, then its
   ``model.safetensors`` truncated, its header corrupted, a tensor removed, reshaped, added, stored as
   integers or set to NaN. ``CausalQwenForCausalLM.from_pretrained`` must raise an ``OSError`` that names
   the file or the tensor; it must never hand back a half-loaded model (`validation.tampered_checkpoints`).
3. **Extreme but finite inputs** (`ModelCase`, `LossCase`): numbers up to the largest float32
   ($3.4\cdot10^{38}$), denormals and zeros in ``numeric_values``; $|\mathrm{loc}_U|$ up to
   $10^{30}$ (the abduction map $W_{\mathrm{loc}}$ scaled up); every scale at ``scale_eps``;
   all-padding rows; all-ignored labels. Forward, loss and backward must leave no NaN or ±inf in the
   loss or in any gradient. The tests draw these cases with Hypothesis; the report draws a fixed-seed
   sample with `random.Random` (`validation.extreme_inputs`).

4. **Trust boundaries** (`validation.trust`, one table per boundary): files and inputs from outside --
   planted pickles and links, shard paths that leave their directory, oversized configs, foreign output
   directories, changed settings on resume, misspelt keywords, wrong types -- with what the project reads
   and refuses (`READS_AND_REFUSALS`; the report's security section).

How a row is written and judged: `validation.cases`. Fixtures (the tiny base, the model, the saved
checkpoint; `validation.fixtures`) are built on first use and cached, so that importing this module costs
nothing and the whole summary runs in a few seconds.
"""

from __future__ import annotations

import dataclasses
import html
import random
import time
from dataclasses import dataclass

from .bad_inputs import BAD_INPUT_CASES
from .cases import COMPONENTS, KINDS, CaseOutcome, TrustOutcome, run_case, run_trust_case
from .common import table, verdict
from .extreme_inputs import (
    LOSS_PATHS,
    FiniteCheck,
    LossCase,
    ModelCase,
    random_loss_case,
    random_model_case,
    run_loss_case,
    run_model_case,
)
from .fixtures import scratch_dir
from .real_text import real_text_markdown
from .tampered_checkpoints import CHECKPOINT_CASES, intact_checkpoint_round_trip
from .trust import BOUNDARIES, TRUST_CASES

__all__ = [
    "READS_AND_REFUSALS",
    "SuiteResult",
    "run_suite",
    "summary_markdown",
]

# What the project reads, and what it refuses: the table of the report's security section.
READS_AND_REFUSALS = [
    (
        "model weights (`from_pretrained`, `from_qwen`, `generate --model`, `train --base`)",
        "`model.safetensors`, or the shards of `model.safetensors.index.json`",
        "pickles (`pytorch_model.bin`, `use_safetensors=False`); shard names that leave the directory "
        "(`..`, absolute); "
        "truncated or corrupt files; missing, extra, reshaped, integer-typed or non-finite tensors",
    ),
    (
        "`config.json`",
        "JSON, every CausalQwen field type- and range-checked; sizes compared with the weights' headers",
        "a string for a boolean or a number, a float for an integer, settings beyond ±1e30, a vocabulary, width, depth "
        "or MLP size that the weights do not have (before anything is allocated)",
    ),
    (
        "checkpoints (`--resume`)",
        "`model.safetensors`, `training_state.safetensors`, `trainer_state.json`, `history.json`",
        "`training_state.pt` (a pickle: never loaded); another model config, other settings or data (unless "
        "`--allow-changed-settings`); optimizer tensors that do not fit their parameters; a directory with no run",
    ),
    (
        "tokenizers",
        "`AutoTokenizer.from_pretrained` files (`tokenizer.json`, ...)",
        "a missing path or corrupt files: one error naming the path",
    ),
    (
        "data (`--data`, `--eval-data`)",
        'UTF-8 JSONL, one `{"text": ...}` per line; only as much of a long text as `--max-length` tokens need',
        "invalid UTF-8 (file, line, byte), lone surrogates (line, character), numbers beyond float32 or changed by "
        "a subnormal float32, datasets with nothing to score",
    ),
    (
        "output directories (`--out`)",
        "new or empty directories, or a run of the same kind (marker `causalqwen-run.json`)",
        "directories no run wrote (even with `--overwrite`), a training run as a demo's output, a directory another "
        "run holds (`flock`); `--overwrite` removes only the files a run writes",
    ),
]


# =============================================================================================
# The summary for the validation report
# =============================================================================================


@dataclass
class SuiteResult:
    """Everything `run_suite` measured; ``markdown`` is the report section's body."""

    bad_inputs: list[CaseOutcome]
    checkpoints: list[CaseOutcome]
    intact_round_trip: bool
    model_checks: list[FiniteCheck]
    loss_checks: list[FiniteCheck]
    seconds: float
    trust: list = dataclasses.field(default_factory=list)  # outcomes of validation.trust.TRUST_CASES
    real_text: bool = True  # every row of validation.real_text holds
    markdown: str = ""

    @property
    def passed(self) -> bool:
        return (
            all(outcome.passed for outcome in self.bad_inputs + self.checkpoints + self.trust)
            and self.intact_round_trip
            and self.real_text
            and all(check.ok for check in self.model_checks + self.loss_checks)
        )


def _code(text: str) -> str:
    """``text`` as an inline code span (a backtick inside would end it)."""
    return "`" + text.replace("`", "'") + "`"


def _shortened(outcome: CaseOutcome, limit: int = 170) -> str:
    """The raised message on one line, the scratch directory written ``DIR``; a long one keeps its start and
    its end (where the checkpoint errors list what is wrong), about ``limit`` characters in all."""
    line = " ".join(outcome.actual.split()).replace(scratch_dir(), "DIR")
    if len(line) <= limit:
        return line
    head = limit // 3
    return f"{line[:head]} … {line[-(limit - head) :]}"


def _outcome_rows(outcomes: list[CaseOutcome], with_component: bool) -> list[list[str]]:
    rows = []
    for outcome in outcomes:
        case = outcome.case
        row = [f"`{case.id}`"] + ([case.component] if with_component else [])
        row += [
            html.escape(case.description, quote=False),
            f"`{case.error.__name__}`",
            _code(_shortened(outcome)),
            verdict(outcome.passed),
        ]
        rows.append(row)
    return rows


def run_suite(model_examples: int = 24, loss_examples: int = 60, seed: int = 0) -> SuiteResult:
    """Run the bad-input table, the checkpoint cases and a fixed-seed fuzz sample; build the markdown.

    ``model_examples`` cases go through the whole model (forward, loss, backward; about 0.1 s each on
    2 CPU cores), ``loss_examples`` through the losses alone (three loss computations each).
    """
    started = time.perf_counter()
    bad_inputs = [run_case(case) for case in BAD_INPUT_CASES]
    checkpoints = [run_case(case) for case in CHECKPOINT_CASES]
    round_trip = intact_checkpoint_round_trip()
    rng = random.Random(seed)
    model_cases = [random_model_case(rng) for _ in range(model_examples)]
    loss_cases = [random_loss_case(rng) for _ in range(loss_examples)]
    model_checks = [run_model_case(case) for case in model_cases]
    loss_checks = [run_loss_case(case) for case in loss_cases]
    trust = [run_trust_case(case) for case in TRUST_CASES]
    real_text, real_text_ok = real_text_markdown()
    result = SuiteResult(
        bad_inputs,
        checkpoints,
        round_trip,
        model_checks,
        loss_checks,
        time.perf_counter() - started,
        trust,
        real_text_ok,
    )
    result.markdown = _markdown(result, model_cases, loss_cases, seed) + "\n" + real_text
    return result


def _markdown(result: SuiteResult, model_cases: list[ModelCase], loss_cases: list[LossCase], seed: int) -> str:
    """The section's body before the real-text table: headline, bad inputs, checkpoints, fuzz sample, trust."""
    parts = [
        _headline(result),
        "",
        "The same tables are the test suite `tests/test_validation_robustness.py` (where Hypothesis "
        "draws the extreme inputs); `validation/robustness.py` holds them as data.",
        "",
    ]
    parts += _bad_inputs_section(result) + _checkpoints_section(result)
    parts += _fuzz_section(result, model_cases, loss_cases, seed)
    return "\n".join(parts + _trust_markdown(result.trust))


def _headline(result: SuiteResult) -> str:
    failures = sum(not check.ok for check in result.model_checks + result.loss_checks)
    return (
        f"{verdict(result.passed)} · {sum(o.passed for o in result.bad_inputs)} of {len(result.bad_inputs)} bad "
        f"inputs give their clear error · {sum(o.passed for o in result.trust)} of {len(result.trust)} "
        f"trust-boundary cases hold · {sum(o.passed for o in result.checkpoints)} of {len(result.checkpoints)} "
        f"tampered checkpoints are refused · {failures} of {len(result.model_checks) + len(result.loss_checks)} "
        f"extreme inputs left a NaN or ±inf · {result.seconds:.1f} s"
    )


def _bad_inputs_section(result: SuiteResult) -> list[str]:
    by_component = {c: sum(o.case.component == c for o in result.bad_inputs) for c in COMPONENTS}
    return [
        "### Bad inputs give a clear error",
        "",
        "Each row commits one mistake and must raise exactly the listed exception with a message that names what "
        "is wrong (the message shown is the one actually raised, shortened). Rows per component: "
        + ", ".join(f"{name} {count}" for name, count in by_component.items())
        + ".",
        "",
        table(
            ["case", "component", "bad input", "expected", "raised", "verdict"],
            _outcome_rows(result.bad_inputs, with_component=True),
        ),
        "",
    ]


def _checkpoints_section(result: SuiteResult) -> list[str]:
    return [
        "### Tampered checkpoints are refused, never half-loaded",
        "",
        "A tiny CausalQwen saved with `save_pretrained`, then its `model.safetensors` tampered with; "
        "`CausalQwenForCausalLM.from_pretrained` must raise an `OSError` naming the file or the tensor. "
        f"Control: the untouched checkpoint loads and every tensor equals the saved one: "
        f"{verdict(result.intact_round_trip)}.",
        "",
        table(
            ["case", "tampering", "expected", "raised", "verdict"],
            _outcome_rows(result.checkpoints, with_component=False),
        ),
        "",
    ]


def _fuzz_row(through: str, checks: list[FiniteCheck], coverage: str) -> list[str]:
    """One row of the fuzz table: cases, the extremes reached, coverage, failures, verdict."""
    failures = sum(not check.ok for check in checks)
    return [
        through,
        str(len(checks)),
        f"{max(c.max_abs_loc for c in checks):.3g}" if checks else "-",
        f"{min(c.min_scale for c in checks):.3g}" if checks else "-",
        coverage,
        str(failures),
        verdict(failures == 0),
    ]


def _fuzz_section(
    result: SuiteResult, model_cases: list[ModelCase], loss_cases: list[LossCase], seed: int
) -> list[str]:
    all_padding = ("one_row_all_padding", "all_padding")
    model_coverage = (
        ", ".join(f"{sum(case.path == p for case in model_cases)} {p}" for p in LOSS_PATHS)
        + f"; {sum(case.mask in all_padding for case in model_cases)} with all-padding rows"
        + f"; {sum(case.labels == 'all_ignored' for case in model_cases)} all-ignored"
        + f"; {sum(case.scale_setting == 'scale_eps' for case in model_cases)} at scale_eps"
    )
    loss_coverage = (
        f"{sum(case.scale_at_eps for case in loss_cases)} with every scale at scale_eps"
        + f"; {sum(case.mask in all_padding for case in loss_cases)} with all-padding rows"
        + f"; {sum(case.labels == 'all_ignored' for case in loss_cases)} all-ignored"
    )
    fuzz_rows = [
        _fuzz_row("whole model: forward(labels) + backward", result.model_checks, model_coverage),
        _fuzz_row(
            "losses alone: total_loss, ActionNetwork + total_loss, fused_loss", result.loss_checks, loss_coverage
        ),
    ]
    largest_number = max(abs(v) for case in model_cases for v in case.values + case.targets) if model_cases else 0.0
    failures = [name for check in result.model_checks + result.loss_checks for name in check.non_finite]
    parts = [
        "### Extreme but finite inputs stay finite",
        "",
        f"A fixed-seed sample (`random.Random({seed})`) of extreme inputs: numbers at `<NUM>` positions up to "
        f"{largest_number:.4g} in magnitude (also denormals, zeros and negatives), `W_loc` scaled so that "
        "|loc_U| reaches about 1e30, scales at `scale_eps`, padding and ignored labels; each case runs forward, "
        "loss and backward and counts a failure if the loss or any gradient holds a NaN or ±inf.",
        "",
        table(
            ["through", "cases", "max |loc| reached", "min scale reached", "coverage", "cases with NaN/inf", "verdict"],
            fuzz_rows,
        ),
        "",
    ]
    if failures:
        parts += ["Non-finite values found: " + ", ".join(sorted(set(failures))), ""]
    return parts


def _kind_counts(outcomes: list[TrustOutcome]) -> str:
    """``"security 7 of 7, silent 5 of 5, clarity 2 of 2"``: the rows that hold, per kind of finding present."""
    return ", ".join(
        f"{kind} {sum(o.passed for o in outcomes if o.case.kind == kind)} of "
        f"{sum(o.case.kind == kind for o in outcomes)}"
        for kind in KINDS
        if any(o.case.kind == kind for o in outcomes)
    )


def _trust_markdown(outcomes: list[TrustOutcome]) -> list[str]:
    """The security section: what the project reads and refuses, then the trust-boundary cases, one table per
    boundary (`validation.trust.BOUNDARIES`) with the kind of finding a column."""
    if not outcomes:
        return []
    by_id = {o.case.id: o for o in outcomes}
    listed = {case.id for boundary in BOUNDARIES for case in boundary.cases}
    unlisted = [case_id for case_id in by_id if case_id not in listed]
    if unlisted:
        raise ValueError(f"trust outcomes of cases in no boundary of validation.trust.BOUNDARIES: {unlisted}")
    parts = [
        "### Security: what the project reads, and what it refuses",
        "",
        "Nothing the project reads is unpickled, and nothing it did not write is deleted "
        "(`causalqwen.files.checkpoint`, `causalqwen.files.rundir`; the [trust boundaries](../security.md) page "
        "explains why).",
        "",
        table(["what", "read from", "refused"], [list(row) for row in READS_AND_REFUSALS]),
        "",
        "### Trust boundaries: files and inputs from outside",
        "",
        f"{verdict(all(o.passed for o in outcomes))} · {sum(o.passed for o in outcomes)} of {len(outcomes)} cases "
        f"({_kind_counts(outcomes)}), in {len(BOUNDARIES)} boundaries. A row must raise exactly its exception "
        "with a message naming the file, line, field or character, or, where the expected outcome is *the right "
        "result*, run and give it. Its kind says what the input did before: **security**, code from a file ran or "
        "the user's files were touched; **silent**, a wrong answer without a word; **clarity**, an error that named "
        "nothing. Rows that plant a pickle or keep a user's file also check that the pickle never ran and the file "
        "is still there, and rows that plant a link check that the file it points to is unchanged "
        "(`validation/trust/`, one module per boundary).",
        "",
    ]
    for boundary in BOUNDARIES:
        shown = [by_id[case.id] for case in boundary.cases if case.id in by_id]
        if not shown:
            continue
        rows = [
            [
                f"`{o.case.id}`",
                o.case.kind,
                html.escape(o.case.description, quote=False),
                f"`{o.case.error.__name__}`" if o.case.error is not None else "the right result",
                _code(_shortened(o)),
                verdict(o.passed),
            ]
            for o in shown
        ]
        parts += [
            f"#### {boundary.name.capitalize()}: {boundary.crosses}",
            "",
            f"{sum(o.passed for o in shown)} of {len(shown)} cases ({_kind_counts(shown)}).",
            "",
            table(["case", "kind", "input", "expected", "outcome", "verdict"], rows),
            "",
        ]
    return parts


def summary_markdown() -> str:
    """The body of the validation report's Robustness section (`run_suite` with its defaults)."""
    return run_suite().markdown
