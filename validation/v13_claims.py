r"""The design's claims, checked

**What this is.** V1–V8 prove the design's formulas and V9–V12 measure its purpose against Qwen. This ledger
takes the other half: claim by claim, which statements of the current design documents (the seeds
`forward_pass`, `inference`, `math_overview_reviewed` with the author's review comments, and `math_foundations_v1`
where not superseded) are true. One row per claim: where it is made, the statement in plain English, the method,
the figures this run computed, and a verdict computed from them: **holds**, **fails**, **holds only under** a
stated condition, or **diverges from the draft** (what the code does instead, measured).

**Method.** Every verdict comes from an oracle independent of the code under test: mpmath at 40 digits (the
shape of the OvR loss), SciPy's Cauchy law and Kolmogorov-Smirnov tests on NumPy draws from fixed seeds (the
Cauchy toolkit, the action network's closure), transformers' own Qwen2 model and ``TopPLogitsWarper`` (the
conversion, top-p), or a measurement on the embedded tiny base (64 hidden units, 704 classes), including a few
seconds of OvR training by the package's loop. The real Qwen2.5's figures (its embedding norms, its logit range)
are not measured: nothing is downloaded.

**Verdicts are data.** A claim that fails is a finding, not a failure of this experiment. What the experiment
itself claims, and what makes the run exit 0, is that every measurement ran, that every row carries a verdict of
the allowed kinds, and that wherever the package computes the same quantity as the oracle, the two agree.

**Not measured here** (left to the studies that train): whether the gate learns classification before regression
(the gate study); whether $|b_{\mathrm{noise}}|$ shrinks as $U$ explains more (the noise study); the calibration
signals on the pretrained base (the calibration study); whether the shared modes give more consistent sequences
than top-k/top-p at matched diversity.
"""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from causalqwen.app.tiny import build_tiny_causal_lm

from .claims_closed_form import closed_form_rows, ovr_loss_second_derivative_root
from .claims_initialization import DRAFT_SETTINGS, TinyStart, initialization_rows, softmax_path_difference
from .claims_intervals import interval_rows
from .claims_ledger import LedgerRow, is_allowed_verdict, ledger_table, verdict_counts
from .claims_parameters import parameter_rows
from .claims_training import training_rows
from .common import Claim, ExperimentResult, check, module_text, save_figure, table, verdict
from .fixtures import sentence_batch

__all__ = ["run", "ledger_rows", "write_ledger_page", "MIN_ROWS", "PAGE"]

MIN_ROWS = 15
PAGE = "v13.md"
DATA_SEED = 13
STUDY_ANSWERS = Path(__file__).resolve().parent.parent / "docs" / "validation"  # the studies' committed raw answers


def ledger_rows(quick: bool) -> list[LedgerRow]:
    """Every row of the ledger, in order: the Cauchy toolkit and the OvR loss, inference, initialization, the free
    parameters, and the rows that need training."""
    tokenizer = build_tiny_causal_lm().tokenizer
    batch = sentence_batch(tokenizer, 8 if quick else 16, DATA_SEED)
    start = TinyStart(batch)
    drafts = TinyStart(batch, **DRAFT_SETTINGS)
    return [
        *closed_form_rows(quick),
        *initialization_rows(start, drafts, quick),
        *parameter_rows(batch, start, drafts),
        *training_rows(batch, softmax_path_difference(start), quick),
        *interval_rows(STUDY_ANSWERS),
    ]


def _loss_shape_figure(out_dir: Path) -> str:
    r"""$g''(t)$ of the true class's OvR loss, and $|g'(t)|$ beside logistic BCE's, from the closed forms
    $P = \tfrac12 + \arctan(t)/\pi$, $g' = -P'/P$, $g'' = (P'^2 - P''P)/P^2$ (float64)."""
    t = np.linspace(-6.0, 6.0, 601)
    p = 0.5 + np.arctan(t) / np.pi
    p1, p2 = 1.0 / (np.pi * (1.0 + t**2)), -2.0 * t / (np.pi * (1.0 + t**2) ** 2)
    second = (p1**2 - p2 * p) / p**2
    far = -np.logspace(-1, 3, 200)
    far_p = 0.5 + np.arctan(far) / np.pi
    cauchy_gradient = 1.0 / (np.pi * (1.0 + far**2)) / far_p  # |g'(t)|
    logistic_gradient = 1.0 / (1.0 + np.exp(far))  # |d(−log σ(t))/dt| = 1 − σ(t)
    root = ovr_loss_second_derivative_root()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(t, second, label="g''(t), g(t) = −log(½ + arctan(t)/π)")
    left.axhline(0.0, color="k", lw=0.8)
    left.axvline(root, color="tab:red", ls="--", lw=0.8, label=f"sign change t = {root:.3f} (mpmath)")
    left.set(xlabel="t = (loc_S − C) / scale_S", title="OvR loss of the true class: not convex")
    left.legend(fontsize=8)
    right.loglog(-far, cauchy_gradient, label="Cauchy OvR |d(−log P)/dt|")
    right.loglog(-far, logistic_gradient, label="logistic BCE |d(−log σ)/dt|")
    right.set(xlabel="|t| of a misclassified true class (t < 0)", title="Gradient of the loss: decays like 1/|t|")
    right.legend(fontsize=8)
    return save_figure(figure, out_dir, "v13_ovr_loss_shape.png")


def _claims(rows: list[LedgerRow]) -> list[Claim]:
    allowed = sum(is_allowed_verdict(row.verdict) for row in rows)
    claims = [
        check(f"the ledger lists at least {MIN_ROWS} claims", len(rows), ">=", MIN_ROWS),
        check(
            "rows whose verdict is not holds / fails / holds only under … / diverges from the draft: …",
            len(rows) - allowed,
            "==",
            0,
        ),  # fmt: skip
    ]
    for index, row in enumerate(rows, start=1):
        claims += [Claim(f"C{index}: {claim.statement}", claim.measured, claim.threshold, claim.passed) for claim in
                   row.claims]  # fmt: skip
    return claims


def write_ledger_page(rows: list[LedgerRow], claims: list[Claim], settings: list[tuple[str, str]], out_dir: Path,
                      figure: str) -> Path:  # fmt: skip
    """Write ``out_dir / v13.md``: the ledger's own page (run settings, verdict counts, the ledger, the oracle
    checks, the figure)."""
    title, text = module_text(__name__)
    counts = verdict_counts(rows)
    parts = [
        f"# V13 · {title}",
        "",
        "Written by `python -m validation` (every run that includes V13, the default run among them; `--quick` "
        "uses fewer Monte Carlo draws and training steps). Every number on this page was computed by the run that "
        "wrote it; the [validation report](index.md) summarizes it in its V13 section.",
        "",
        text,
        "",
        "## Run settings",
        "",
        table(["setting", "value"], [[name, value] for name, value in settings]),
        "",
        "## Verdicts",
        "",
        table(["verdict", "claims"], [[name, count] for name, count in counts.items()]),
        "",
        "## The ledger",
        "",
        ledger_table(rows),
        "",
        "## Oracle checks (what makes the run pass)",
        "",
        table(
            ["check", "measured", "threshold", "verdict"],
            [[claim.statement, claim.measured, claim.threshold, verdict(claim.passed)] for claim in claims],
        ),
        "",
        f"![V13: {figure}]({figure})",
        "",
    ]
    path = Path(out_dir) / PAGE
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    began = time.perf_counter()
    rows = ledger_rows(quick)
    figure = _loss_shape_figure(out_dir)
    claims = _claims(rows)
    counts = verdict_counts(rows)
    settings = [
        ("mode", "quick (`--quick`)" if quick else "full"),
        ("seeds", "NumPy draws 2024–2026, 7, 17; torch 2024, 3; tiny base and initialization 0; data 13"),
        ("tiny training", f"{20 if quick else 60} steps, batch 8, lr 3e-3, preset all, literal loss"),
        ("wall time of the ledger (s)", f"{time.perf_counter() - began:.1f}"),
    ]
    write_ledger_page(rows, claims, settings, out_dir, figure)
    title, _ = module_text(__name__)
    summary = ", ".join(f"{count} {name}" for name, count in counts.items())
    body = "\n\n".join(
        [
            f"The ledger has its own page, [V13 · the design's claims, checked]({PAGE}): {len(rows)} claims of the "
            f"design documents, each with the place it is made, the method, the figures and a computed verdict "
            f"({summary}). Verdicts are data: a claim that fails is a finding. This section's verdicts are the "
            "oracle checks: every measurement ran and the package agrees with the independent oracles it is held to.",
            table(["verdict", "claims"], [[name, count] for name, count in counts.items()]),
        ]
    )
    return ExperimentResult(
        name="V13",
        title=title,
        claims=claims,
        body=body,
        figures=[figure],
        headline=f"{len(rows)} claims: {summary}",
        settings="; ".join(f"{name}: {value}" for name, value in settings),
    )
