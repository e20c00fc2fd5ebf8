"""V18's report: CausalQwen's three forecasts beside the simple ones, the choices made on validation, the paths'
bands, the one-step intervals raw and mended, the goals and the claims.

`validation.v18_llmtime_tuned.measure` hands over ``{"settings", "series", "elapsed"}``; per series the training and
test parts, the ``chosen`` (values, learning rate), every candidate's validation run in ``grid``, the ``final`` run
(paths per mode, losses, one-step laws on the test part) and the ``baselines``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from causalqwen.regression import answer_figures, conformal_factors

from .common import check, fmt, save_figure, table
from .llmtime_series import PUBLISHED, SERIES, scaled_mae
from .v16_report import flatness

__all__ = ["forecasts", "report_body", "report_claims", "report_figure", "report_headline"]

CAUSAL = {
    "standard": "CausalQwen, loc_Y path",
    "causal": "CausalQwen, causal paths' median",
    "shared_individual": "CausalQwen, shared-individual paths' median",
}
BASELINES = ("training mean", "last value", "seasonal naive", "ARIMA")
LEVELS = (0.5, 0.8, 0.9, 0.95)


def forecasts(one: dict) -> dict:
    """Every forecast of one series' test part: CausalQwen's per mode (the median path), then the baselines."""
    out = {CAUSAL[mode]: np.median(paths, axis=0) for mode, paths in one["final"]["paths"].items()}
    return out | {name: np.asarray(one["baselines"][name]) for name in BASELINES}


def scores(measured: dict) -> dict:
    """``{forecast: {series: scaled MAE, "mean": ...}}``."""
    table_ = {}
    for name, one in measured["series"].items():
        for arm, values in forecasts(one).items():
            table_.setdefault(arm, {})[name] = scaled_mae(one["test"], values)
    return {arm: per | {"mean": float(np.mean(list(per.values())))} for arm, per in table_.items()}


def _main_table(measured: dict, scored: dict) -> str:
    names = list(measured["series"])
    rows = [[arm] + [scored[arm][n] for n in names] + [scored[arm]["mean"]] for arm in scored]
    published = [PUBLISHED["ARIMA"][SERIES.index(n)] for n in names]
    rows.append(["ARIMA (published)"] + published + [float(np.mean(published))])
    return table(["scaled MAE"] + names + ["mean"], rows)


def _choice_table(measured: dict) -> str:
    rows = []
    for name, one in measured["series"].items():
        for (kind, rate), run in one["grid"].items():
            mark = "**" if (kind, rate) == one["chosen"] else ""
            rows.append([name, kind, fmt(rate), f"{mark}{fmt(run['score'], 4)}{mark}", fmt(flatness(run["losses"]), 3)])
    return table(["series", "values", "learning rate", "validation scaled MAE", "flatness"], rows)


def band_coverage(one: dict, mode: str, low: float, high: float) -> float:
    """The share of the test part inside the paths' [low, high] quantile band of ``mode``."""
    paths = one["final"]["paths"][mode]
    lower, upper = np.quantile(paths, low, axis=0), np.quantile(paths, high, axis=0)
    return float(np.mean((one["test"] >= lower) & (one["test"] <= upper)))


def _band_table(measured: dict) -> str:
    rows = []
    for name, one in measured["series"].items():
        for mode in ("causal", "shared_individual"):
            rows.append([name, mode, band_coverage(one, mode, 0.25, 0.75), band_coverage(one, mode, 0.05, 0.95)])
    return table(["series", "mode", "test inside the 25–75% band (nominal 0.5)", "inside 5–95% (nominal 0.9)"], rows)


def interval_figures(one: dict) -> tuple[dict, dict]:
    """``(raw, mended)``: the one-step laws' coverage at `LEVELS` and PIT KS on the test part, and the coverage with
    the conformal factors fitted on the chosen candidate's validation split."""

    def tensor(values):
        return torch.as_tensor(np.asarray(values, dtype=np.float64))

    final, valid = one["final"], one["grid"][one["chosen"]]
    raw = answer_figures(tensor(one["test"]), tensor(final["loc"]), tensor(final["scale"]), LEVELS)
    factors = conformal_factors(tensor(valid["valid"]), tensor(valid["loc"]), tensor(valid["scale"]), LEVELS)
    mended = {}
    for level, factor in factors.items():
        figures = answer_figures(tensor(one["test"]), tensor(final["loc"]), tensor(final["scale"] * factor), (level,))
        mended[level] = figures[f"answer_coverage_{round(level * 100)}"]
    return raw, mended


def _interval_table(measured: dict) -> str:
    rows = []
    for name, one in measured["series"].items():
        raw, mended = interval_figures(one)
        rows.append([name, "raw"] + [raw[f"answer_coverage_{round(q * 100)}"] for q in LEVELS] + [raw["answer_pit_ks"]])
        rows.append([name, "conformal"] + [mended[q] for q in LEVELS] + ["--"])
    headers = ["series", "intervals"] + [f"coverage at {round(q * 100)}%" for q in LEVELS] + ["PIT KS"]
    return table(headers, rows)


def goal_lines(measured: dict, scored: dict) -> list[str]:
    best = min(CAUSAL.values(), key=lambda arm: scored[arm]["mean"])
    names = list(measured["series"])
    mine = scored[best]
    naive = scored["seasonal naive"]["mean"]
    beaten = [n for n in names if mine[n] >= scored["training mean"][n]]
    arima = scored["ARIMA"]["mean"]
    lines = [
        f"- CausalQwen's best forecast on the mean: {best}, {fmt(mine['mean'], 4)}.",
        f"- **Goal: below seasonal naive** ({fmt(naive, 4)}): {'met' if mine['mean'] < naive else 'not met'}.",
        "- **Goal: below the training mean on every series**: "
        + ("met." if not beaten else f"not met ({', '.join(beaten)})."),
        f"- **Moonshot: at or below ARIMA** (re-run {fmt(arima, 4)}): {'met' if mine['mean'] <= arima else 'not met'}.",
    ]
    order = sorted(scored, key=lambda arm: scored[arm]["mean"])
    lines.append(
        "- **Who wins** (mean scaled MAE, best first): " + " < ".join(f"{a} {fmt(scored[a]['mean'], 4)}" for a in order)
    )
    return lines


def report_body(text: str, measured: dict) -> str:
    scored = scores(measured)
    parts = [text, "", "**Scaled MAE of the test part** (lower is better):", "", _main_table(measured, scored), ""]
    parts += ["**Goals.**", "", *goal_lines(measured, scored), ""]
    parts += ["**Raw or scaled, and the learning rate** (chosen in bold, per series):", "", _choice_table(measured), ""]
    parts += ["**The paths' bands** (multi-step: each path extends its own history):", "", _band_table(measured), ""]
    parts += [
        "**One-step intervals** along the true history of the test part, raw and with the conformal factors of the "
        "validation split:",
        "",
        _interval_table(measured),
        "",
        f"The whole study took {fmt(measured['elapsed'] / 60, 3)} minutes.",
    ]
    return "\n".join(parts)


def report_claims(measured: dict) -> list:
    settings = measured["settings"]
    unfinished = 0
    for one in measured["series"].values():
        for arm, values in forecasts(one).items():
            unfinished += len(values) != len(one["test"]) or not np.isfinite(values).all()
    return [
        check(
            "every forecast of every series finite and as long as its test part (those that are not)",
            unfinished,
            "==",
            0,
        ),
        check(
            "paths per sampled mode and series",
            min(
                len(one["final"]["paths"][m])
                for one in measured["series"].values()
                for m in ("causal", "shared_individual")
            ),
            ">=",
            settings["paths"],
        ),
        check(
            "equal steps: runs whose logged loss does not reach the last step (series × candidate)",
            sum(
                len(run["losses"]) < settings["steps"] // 10
                for one in measured["series"].values()
                for run in one["grid"].values()
            ),
            "==",
            0,
        ),
    ]


def report_headline(measured: dict) -> str:
    scored = scores(measured)
    return "mean scaled MAE: " + ", ".join(f"{arm} {fmt(per['mean'], 3)}" for arm, per in scored.items())


def report_figure(measured: dict, out_dir) -> str:
    names = list(measured["series"])
    figure, axes = plt.subplots(1, len(names), figsize=(4.4 * len(names), 3.4), squeeze=False)
    for axis, name in zip(axes[0], names):
        one = measured["series"][name]
        n_train = len(one["train"])
        steps = np.arange(n_train, n_train + len(one["test"]))
        axis.plot(np.arange(n_train), one["train"], color="black", linewidth=0.8)
        axis.plot(steps, one["test"], color="black", linewidth=1.6, label="test")
        paths = one["final"]["paths"]["causal"]
        axis.fill_between(steps, np.quantile(paths, 0.05, 0), np.quantile(paths, 0.95, 0), alpha=0.2, label="5–95%")
        axis.plot(steps, np.median(paths, 0), label="causal median")
        axis.plot(steps, np.median(one["final"]["paths"]["standard"], 0), label="loc_Y path")
        axis.plot(steps, one["baselines"]["seasonal naive"], linestyle=":", label="seasonal naive")
        axis.set_title(name)
        axis.set_xlim(max(0, n_train - 3 * len(one["test"])), steps[-1])
    axes[0][0].legend(fontsize=7)
    return save_figure(figure, out_dir, "v18_forecasts.png")
