"""V16's report: the tuned arms beside the published LIFT rows and the re-run baselines, the learning rates chosen, the
training-loss curves, the goals, where CausalQwen still loses, and the claims of a fair protocol.

`validation.v16_lift_tuned.measure` hands over a dict: the ``datasets``, the ``settings``, the ``chosen`` learning
rate per (arm, function), every selection run in ``grid`` per (arm, function, rate), the final ``runs`` per arm and
data-set key (test answers, losses, steps, trainable values), the tabular ``baselines`` and the ``elapsed`` time.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from causalqwen.regression import conformal_factors

from .common import check, fmt, save_figure, table
from .lift_baselines import LABELS
from .lift_data import PUBLISHED, generate, lift_rae, rae
from .v14_report import cell, run_claims, scores

__all__ = [
    "flatness",
    "flatness_table",
    "selection_table",
    "report_body",
    "report_claims",
    "report_headline",
    "tuned_figure",
]

ARMS = ("CausalQwen", "Qwen digits", "Qwen digits + NTL")
ROBUST_LINE = ("huber", "cauchy")
MOONSHOT = ("linear", "quadratic", "exponential")
LEVELS = (0.5, 0.8, 0.9, 0.95)  # the central intervals scored
FLAT = 0.9  # the median flatness ratio at least this: the loss no longer falls by a tenth over the last tenth
COLORS = {
    "linear": "tab:blue",
    "quadratic": "tab:orange",
    "exponential": "tab:green",
    "cosine": "tab:red",
    "l1norm": "tab:purple",
    "piecewise": "tab:brown",
}


def flatness(losses) -> float:
    """The mean training loss over the last 10% of the logged steps over the mean of the 10% before (1: flat)."""
    losses = np.asarray(losses, dtype=np.float64)
    tenth = max(1, len(losses) // 10)
    if len(losses) < 2 * tenth:
        return float("nan")
    return float(losses[-tenth:].mean() / losses[-2 * tenth : -tenth].mean())


def _robust(measured: dict, metric) -> dict | None:
    """The robust polynomial: per cell the better of Huber and Cauchy (by mean), or None without them."""
    if not all(method in measured["settings"]["methods"] for method in ROBUST_LINE):
        return None
    both = [scores(measured, method, metric) for method in ROBUST_LINE]
    return {cell: min((s[cell] for s in both), key=lambda v: float(v.mean())) for cell in both[0]}


def _lift_table(measured: dict, condition: str) -> str:
    functions = measured["settings"]["functions"]
    rows = []
    for arm in ARMS:
        arm_scores = scores(measured, arm, lift_rae)
        rows.append([f"{arm} (tuned, all weights)"] + [cell(arm_scores[(f, condition)]) for f in functions])
    robust = _robust(measured, lift_rae)
    if robust is not None:
        rows.append(
            ["robust polynomial (better of Huber, Cauchy; re-run)"] + [cell(robust[(f, condition)]) for f in functions]
        )
    for column, name in (
        ("gptj", "LIFT/GPT-J (published)"),
        ("gpt3", "LIFT/GPT-3 (published)"),
        ("poly", "polynomial (published)"),
    ):
        rows.append([name] + [fmt(PUBLISHED[condition][f][column], 3) for f in functions])
    return table(["LIFT RAE, " + condition] + list(functions), rows)


def _rae_table(measured: dict, condition: str) -> str:
    functions = measured["settings"]["functions"]
    rows = []
    for arm in ARMS + tuple(measured["settings"]["methods"]):
        arm_scores = scores(measured, arm)
        rows.append([LABELS.get(arm, arm)] + [cell(arm_scores[(f, condition)]) for f in functions])
    return table(["RAE, " + condition] + list(functions), rows)


def selection_table(measured: dict) -> str:
    """The validation RAE of every (arm, function, rate) of the grid, the chosen rate in bold."""
    settings = measured["settings"]
    rows = []
    for arm in settings["arms"]:
        for function in settings["functions"]:
            condition, sim = measured["grid"][(arm, function, settings["learning_rates"][0])]["selection"]
            valid_y = generate(function, sim, condition).y_valid
            cells = []
            for rate in settings["learning_rates"]:
                value = fmt(rae(measured["grid"][(arm, function, rate)]["valid"], valid_y), 3)
                cells.append(f"**{value}**" if rate == measured["chosen"][(arm, function)] else value)
            rows.append([arm, function] + cells)
    headers = ["arm", "function"] + [f"validation RAE at {fmt(rate)}" for rate in settings["learning_rates"]]
    return table(headers, rows)


def flatness_by_arm(measured: dict) -> dict:
    """``{arm: array of the flatness ratios of its final runs}`` (`flatness`)."""
    runs = measured["runs"]
    return {
        arm: np.asarray([flatness(run["losses"]) for run in runs[arm].values()]) for arm in measured["settings"]["arms"]
    }


def flatness_table(measured: dict) -> str:
    rows = []
    for arm, ratios in flatness_by_arm(measured).items():
        rows.append(
            [
                arm,
                fmt(float(np.nanmedian(ratios)), 3),
                fmt(float(np.nanmin(ratios)), 3),
                fmt(float(np.nanmax(ratios)), 3),
            ]
        )
    return table(["arm", "median", "smallest", "largest"], rows)


def coverage(measured: dict) -> dict:
    """``{condition: (raw, mended)}``, each ``{level: share}``: how often CausalQwen's central intervals at `LEVELS`
    hold the answers of the second half of every validation split of the condition (pooled); raw, and widened by the
    conformal factors fitted on the first half of the same split."""
    out = {}
    for condition in measured["settings"]["conditions"]:
        hits = {"raw": {q: [] for q in LEVELS}, "mended": {q: [] for q in LEVELS}}
        for data in (d for d in measured["datasets"] if d.condition == condition):
            run = measured["runs"]["CausalQwen"][data.key]
            y, loc, scale = (
                torch.tensor(np.asarray(v, dtype=np.float64)) for v in (data.y_valid, run["valid"], run["valid_scale"])
            )
            half = len(y) // 2
            factors = conformal_factors(y[:half], loc[:half], scale[:half], LEVELS)
            error = (y[half:] - loc[half:]).abs()  # [n - half]
            for q in LEVELS:
                width = scale[half:] * np.tan(np.pi * q / 2)
                hits["raw"][q] += (error <= width).tolist()
                hits["mended"][q] += (error <= factors[q] * width).tolist()
        out[condition] = tuple({q: float(np.mean(hits[kind][q])) for q in LEVELS} for kind in ("raw", "mended"))
    return out


def _coverage_table(measured: dict) -> str:
    rows = []
    for condition, (raw, mended) in coverage(measured).items():
        rows.append([f"{condition}, raw Cauchy"] + [fmt(raw[q], 3) for q in LEVELS])
        rows.append([f"{condition}, conformal (beyond the design)"] + [fmt(mended[q], 3) for q in LEVELS])
    return table(["CausalQwen's intervals"] + [f"coverage at {round(100 * q)}%" for q in LEVELS], rows)


def _goals(measured: dict) -> list[str]:
    functions = measured["settings"]["functions"]
    conditions = measured["settings"]["conditions"]
    lines = []
    causal, qwen = scores(measured, "CausalQwen"), scores(measured, "Qwen digits")
    cells = [(f, c) for c in conditions for f in functions]
    below_qwen = [cell for cell in cells if causal[cell].mean() < qwen[cell].mean()]
    lines.append(
        f"- **Goal** (CausalQwen's RAE below Qwen digits' on every cell): "
        f"{'met' if len(below_qwen) == len(cells) else 'not met'}: below on {len(below_qwen)} of {len(cells)}"
        + (
            f"; not below on {', '.join(f'{f} {c}' for f, c in cells if (f, c) not in below_qwen)}"
            if len(below_qwen) < len(cells)
            else ""
        )
        + "."
    )
    if "outliers" in conditions:
        lift = scores(measured, "CausalQwen", lift_rae)
        below = [f for f in functions if lift[(f, "outliers")].mean() < PUBLISHED["outliers"][f]["gptj"]]
        lines.append(
            "- **Goal** (with outliers, CausalQwen's LIFT RAE below the published LIFT/GPT-J on at least 4 of 6 "
            f"functions): {'met' if len(below) >= 4 else 'not met'}: below on {len(below)} of {len(functions)}"
            + (f" ({', '.join(below)})" if below else "")
            + "."
        )
        robust = _robust(measured, rae)
        smooth = [f for f in functions if f in MOONSHOT]
        if robust is not None and smooth:
            ratios = {f: float(causal[(f, "outliers")].mean() / robust[(f, "outliers")].mean()) for f in smooth}
            lines.append(
                "- **Moonshot** (with outliers, within 2× of the robust polynomial on linear, quadratic, exponential): "
                f"{'met' if all(r <= 2 for r in ratios.values()) else 'not met'}: CausalQwen / robust polynomial = "
                + ", ".join(f"{f} {fmt(r, 3)}" for f, r in ratios.items())
                + "."
            )
    for condition, (raw, mended) in coverage(measured).items():
        off = {q: abs(mended[q] - q) for q in (0.5, 0.9)}
        lines.append(
            f"- **Goal** (with the conformal factors, coverage within 0.05 of nominal at 50% and 90%; {condition}): "
            f"{'met' if max(off.values()) <= 0.05 else 'not met'}: {fmt(mended[0.5], 3)} and {fmt(mended[0.9], 3)} "
            f"(raw Cauchy intervals: {fmt(raw[0.5], 3)} and {fmt(raw[0.9], 3)})."
        )
    return lines


def _where_it_loses(measured: dict) -> list[str]:
    """Every cell where CausalQwen is not the best language model, or is above the published LIFT/GPT-J."""
    lines = []
    functions, conditions = measured["settings"]["functions"], measured["settings"]["conditions"]
    per_arm = {arm: scores(measured, arm) for arm in ARMS}
    lift = scores(measured, "CausalQwen", lift_rae)
    for condition in conditions:
        for f in functions:
            means = {arm: float(per_arm[arm][(f, condition)].mean()) for arm in ARMS}
            best = min(means, key=means.get)
            gptj = PUBLISHED[condition][f]["gptj"]
            causal = float(lift[(f, condition)].mean())
            if best != "CausalQwen" or causal >= gptj:
                lines.append(
                    f"- **{f}, {condition}**: CausalQwen RAE {fmt(means['CausalQwen'], 3)} (LIFT RAE {fmt(causal, 3)}, "
                    f"LIFT/GPT-J {fmt(gptj, 3)}); best language model {best} ({fmt(means[best], 3)})."
                )
    return lines or ["- nowhere in this run: CausalQwen is the best language model and below LIFT/GPT-J on every cell."]


def report_body(text: str, measured: dict) -> str:
    parts = [text, ""]
    for condition in measured["settings"]["conditions"]:
        parts += [
            f"**LIFT RAE, {condition}** (mean ± standard deviation over the simulations):",
            "",
            _lift_table(measured, condition),
            "",
        ]
    parts += [
        "**Goals.**",
        "",
        *_goals(measured),
        "",
        "**Where CausalQwen still loses.**",
        "",
        *_where_it_loses(measured),
        "",
    ]
    for condition in measured["settings"]["conditions"]:
        parts += [f"**RAE, {condition}**, every arm and re-run baseline:", "", _rae_table(measured, condition), ""]
    parts += [
        "**The learning rates**: each arm's validation RAE per rate (simulation 1 with outliers; the chosen one in "
        "bold):",
        "",
        selection_table(measured),
        "",
        "**Intervals** (second halves of the validation splits, pooled; nominal coverage in the header):",
        "",
        _coverage_table(measured),
        "",
        "**Steps to a flat loss**: the flatness ratio (mean training loss over the last 10% of steps over the 10% "
        "before; 1 is flat) of every final run; the figure shows the curves of simulation 1 with outliers.",
        "",
        flatness_table(measured),
        "",
        f"The whole study took {fmt(measured['elapsed'] / 60, 3)} minutes.",
    ]
    return "\n".join(parts)


def report_claims(measured: dict) -> list:
    settings, runs = measured["settings"], measured["runs"]
    steps = settings["steps"]
    keys = [data.key for data in measured["datasets"]]
    ratios = np.concatenate(list(flatness_by_arm(measured).values()))
    claims = [
        *run_claims(measured, ARMS + tuple(settings["methods"])),
        check(
            "every weight of every language model trained (runs where a weight was frozen)",
            sum(runs[arm][k]["trainable"] != runs[arm][k]["parameters"] for arm in ARMS for k in keys),
            "==",
            0,
        ),
        check(
            "the NTL term was finite at every step of every NTL run (runs where not)",
            sum(not runs["Qwen digits + NTL"][k]["ntl_finite"] for k in keys),
            "==",
            0,
        ),
    ]
    if steps >= 100:  # a quick run is too short for a flat loss
        claims.append(
            check(
                "the training loss has flattened: median flatness ratio over the runs",
                float(np.nanmedian(ratios)),
                ">=",
                FLAT,
            )
        )
    return claims


def report_headline(measured: dict) -> str:
    functions = measured["settings"]["functions"]
    parts = []
    for condition in measured["settings"]["conditions"]:
        means = {
            arm: np.mean([scores(measured, arm, lift_rae)[(f, condition)].mean() for f in functions]) for arm in ARMS
        }
        parts.append(f"{condition}: " + ", ".join(f"{arm} {fmt(float(v), 3)}" for arm, v in means.items()))
    return "mean LIFT RAE over the functions, tuned: " + "; ".join(parts)


def tuned_figure(measured: dict, out_dir) -> str:
    """The training loss of every arm and function at its chosen rate (the selection runs), one panel per arm."""
    figure, axes = plt.subplots(1, len(ARMS), figsize=(4.2 * len(ARMS), 3.4), sharey=False)
    for axis, arm in zip(np.atleast_1d(axes), ARMS):
        for function in measured["settings"]["functions"]:
            run = measured["grid"][(arm, function, measured["chosen"][(arm, function)])]
            losses = np.asarray(run["losses"], dtype=np.float64)
            every = run["steps"] / max(1, len(losses))
            axis.plot(np.arange(1, len(losses) + 1) * every, losses, lw=1, label=function, color=COLORS.get(function))
        axis.set_yscale("log")
        axis.set_title(f"{arm} (all weights)", fontsize=9)
        axis.set_xlabel("step")
        axis.set_ylabel("training loss (completion only)")
        axis.legend(fontsize=7)
    figure.tight_layout()
    return save_figure(figure, out_dir, "v16_training_loss.png")
