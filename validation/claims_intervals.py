r"""The ledger row of the intervals (V13): are the central Cauchy intervals of the predicted value calibrated?

The design gives every position a law $Y \sim \mathrm{Cauchy}(\mathrm{loc}_Y, \mathrm{scale}_Y)$ and calls
$\mathrm{scale}_Y$ the predicted uncertainty; its central interval at level $q$,
$\mathrm{loc}_Y \mp \mathrm{scale}_Y \tan(\pi q / 2)$, should then hold a fresh answer with probability $q$. The row
reads the raw answers the outside studies write beside their pages, where the model predicted a law for a value it
had not seen:

- LIFT at each arm's best (V17's ``CausalQwen`` arm, V16's protocol): the law read at each prompt of the validation
  splits, whose targets are noisy observations, against those targets (``v17_predictions.json``);
- LLMTime at CausalQwen's best (V18): the one-step law of each value of the test part given the true values before
  it (``v18_predictions.json``).

Coverage is counted by SciPy's Cauchy interval (``stats.cauchy.interval``) and the PIT by its CDF, independently of
`causalqwen.regression.answer_figures`, which the row's claim holds equal to them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from causalqwen.regression import answer_figures

from .claims_ledger import FOUNDATIONS, INFERENCE, LedgerRow
from .common import check, fmt

__all__ = ["interval_rows", "residual_sources", "LEVELS", "TOLERANCE"]

LEVELS = (0.5, 0.8, 0.9, 0.95)
TOLERANCE = 0.05  # calibrated: every level's coverage within this of nominal, in every source


def residual_sources(study_dir) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{source: (values, loc, scale)}`` from the studies' raw answers in ``study_dir``; a ``FileNotFoundError``
    names a missing file and the study that writes it."""
    study_dir = Path(study_dir)
    files = {"v17_predictions.json": "V17", "v18_predictions.json": "V18"}
    for name, study in files.items():
        if not (study_dir / name).is_file():
            raise FileNotFoundError(f"{study_dir / name} is missing: run python -m validation --only {study}")
    lift = json.loads((study_dir / "v17_predictions.json").read_text(encoding="utf-8"))
    values, loc, scale = [], [], []
    for key, run in lift["arms"]["CausalQwen"].items():
        values += lift["datasets"][key]["y_valid"]
        loc += run["valid"]
        scale += run["valid_scale"]
    sources = {"LIFT (V17, validation splits)": (values, loc, scale)}
    series = json.loads((study_dir / "v18_predictions.json").read_text(encoding="utf-8"))
    values, loc, scale = [], [], []
    for one in series.values():
        values += one["test"]
        loc += one["one_step"]["loc"]
        scale += one["one_step"]["scale"]
    sources["LLMTime (V18, one step on the test parts)"] = (values, loc, scale)
    return {name: tuple(np.asarray(part, dtype=np.float64) for part in parts) for name, parts in sources.items()}


def scipy_figures(values: np.ndarray, loc: np.ndarray, scale: np.ndarray) -> dict[str, float]:
    """Coverage at `LEVELS` (SciPy's central interval) and the PIT's Kolmogorov–Smirnov distance from uniform."""
    figures = {}
    for level in LEVELS:
        low, high = stats.cauchy.interval(level, loc=loc, scale=scale)
        figures[f"coverage_{round(level * 100)}"] = float(np.mean((values >= low) & (values <= high)))
    figures["pit_ks"] = float(stats.kstest(stats.cauchy.cdf(values, loc=loc, scale=scale), "uniform").statistic)
    return figures


def interval_rows(study_dir) -> list[LedgerRow]:
    sources = residual_sources(study_dir)
    measured = {name: scipy_figures(*parts) for name, parts in sources.items()}
    gaps = [abs(f[f"coverage_{round(q * 100)}"] - q) for f in measured.values() for q in LEVELS]
    package_gap = 0.0
    for name, (values, loc, scale) in sources.items():
        tensors = [torch.as_tensor(part) for part in (values, loc, scale)]
        mine = answer_figures(*tensors, LEVELS)
        for q in LEVELS:
            key = f"coverage_{round(q * 100)}"
            package_gap = max(package_gap, abs(mine[f"answer_{key}"] - measured[name][key]))
    figures = "; ".join(
        f"{name} (n = {len(sources[name][0])}): "
        + ", ".join(f"{round(q * 100)}% → {fmt(f[f'coverage_{round(q * 100)}'], 3)}" for q in LEVELS)
        + f", PIT KS {fmt(f['pit_ks'], 3)}"
        for name, f in measured.items()
    )
    row = LedgerRow(
        where=f"{INFERENCE} §2 (scale_Y, the predicted uncertainty); {FOUNDATIONS} §1",
        statement="The central Cauchy intervals of the predicted value are calibrated: at level q they hold a fresh "
        "answer with probability q.",
        method="the laws CausalQwen predicted for values it had not seen in the outside studies at their best (LIFT's "
        "noisy validation targets, V17; the one-step laws of LLMTime's test parts, V18), their coverage at 50, 80, "
        f"90 and 95% by SciPy's Cauchy interval and the PIT's KS distance; calibrated when every coverage lies "
        f"within {fmt(TOLERANCE)} of its level in every source.",
        figures=figures,
        verdict="holds" if max(gaps) <= TOLERANCE else "fails",
        claims=[
            check(
                "answer_figures' coverage equals SciPy's Cauchy interval count on the studies' answers (largest gap)",
                package_gap,
                "<=",
                1e-12,
            )
        ],
    )
    return [row]
