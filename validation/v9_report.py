r"""V9's report: table cells with their reasons, the winner of each matched pair, the figure and the verdict lines.

`validation.v9_comparison` trains and evaluates the models; this module turns its rows (one dict per model:
``name``, ``kind`` (``"qwen"`` or ``"causal"``), ``trainable``, the metric dicts ``clean``, ``outliers`` (None when
not trained on the outlier corpus) and ``extrapolation``, ``a_accuracy``, ``divergence``) and its ε sweep into the
report's tables (`result_tables`), its figure (`comparison_figure`) and its verdict lines (`verdict`). No cell
reads ``nan``: a missing number is a dash with its reason as a footnote.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from .common import fmt, save_figure, table

__all__ = [
    "PAIRS",
    "Metric",
    "METRICS",
    "threshold_text",
    "setting_text",
    "result_tables",
    "comparison_figure",
    "verdict",
]

DASH = "—"
_SUPERSCRIPTS = "¹²³⁴⁵⁶⁷⁸⁹"
NONE_PARSED = "no parseable prediction among these numbers, so the error is undefined"
INFINITE = (
    "∞: half or more of these numbers got no parseable prediction, and the strict median counts those as "
    "infinite errors"
)
# the matched pairs: (Qwen variant, CausalQwen preset), both unbounded
PAIRS = (("head", "causal"), ("lora", "lora"), ("adapter", "abduction"))


class _Missing(str):
    """A table cell with no number, and the reason (shown as a footnote under the table)."""


def _value(value, reason: str = NONE_PARSED):
    """``value``, or a `_Missing` with ``reason`` where it is None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return _Missing(reason)
    return value


def _table(headers: list[str], rows: list[list]) -> str:
    """`table`, with every `_Missing` cell as "—" (numbered when a table has several reasons) and a footnote
    line per reason under the table; an infinity as "∞", explained the same way. No cell reads ``nan``."""
    rows = [
        [_value(v, "not defined: no data for this cell") if isinstance(v, float) else v for v in row] for row in rows
    ]
    reasons = list(dict.fromkeys(v for row in rows for v in row if isinstance(v, _Missing)))
    marks = {r: DASH if len(reasons) == 1 else DASH + _SUPERSCRIPTS[i] for i, r in enumerate(reasons)}
    infinite = any(isinstance(v, float) and math.isinf(v) for row in rows for v in row)
    cells = [
        [
            marks[v] if isinstance(v, _Missing) else ("∞" if isinstance(v, float) and math.isinf(v) and v > 0 else v)
            for v in row
        ]
        for row in rows
    ]
    notes = [f"{marks[r]} {r}." for r in reasons] + ([INFINITE + "."] if infinite else [])
    return table(headers, cells) + ("\n\n" + "<br>\n".join(f"*{note}*" for note in notes) if notes else "")


def _number(value) -> str:
    """A number for the text: 3 significant digits, or the whole integer part; ∞ as "∞ (unparseable)"."""
    if isinstance(value, float) and math.isinf(value):
        return "∞ (half or more unparseable)" if value > 0 else "-∞"
    digits = 3 if value == 0 or abs(value) < 1000 else len(str(int(abs(value))))
    return fmt(value, digits)


def _winner(qwen: float, causal: float, lower: bool, tolerance: float, relative: bool) -> str:
    """``"qwen"``, ``"causal"`` or ``"tie"``: a tie is a difference within ``tolerance`` (of the larger magnitude
    when ``relative``), or two infinities."""
    if qwen == causal:
        return "tie"
    if math.isfinite(qwen) and math.isfinite(causal):
        limit = tolerance * max(abs(qwen), abs(causal)) if relative else tolerance
        if abs(qwen - causal) <= limit:
            return "tie"
    return "qwen" if (qwen < causal) == lower else "causal"


def _tolerance_text(tolerance: float, relative: bool) -> str:
    return f"{fmt(100 * tolerance)}%" if relative else fmt(tolerance)


def threshold_text(threshold) -> str:
    """The OvR threshold as the text states it: one number, or the range and median of per-class thresholds."""
    if isinstance(threshold, torch.Tensor):
        values = threshold.detach().double().flatten().cpu()
        if values.numel() == 1 or bool((values == values[0]).all()):
            threshold = float(values[0])
        else:
            return (
                f"$C_k$ per class from {fmt(float(values.min()), 3)} to {fmt(float(values.max()), 3)} "
                f"(median {fmt(float(values.median()), 3)})"
            )
    return f"$C_k = {fmt(float(threshold), 4)}$ for every class"


def setting_text(value) -> str:
    """A setting for the text: a threshold tensor as `threshold_text` says it, a number through `fmt`."""
    if isinstance(value, torch.Tensor):
        return threshold_text(value).replace("$", "")
    return fmt(value) if isinstance(value, (int, float)) else str(value)


@dataclass(frozen=True)
class Metric:
    """One metric of the verdict: its title and what it measures, how to read it off a row (None: not run),
    whether lower is better, and the tolerance within which two values tie (a share of the larger magnitude
    when ``relative``); ``short`` names it in the headline."""

    title: str
    what: str
    value: Callable[[dict], float | None]
    lower: bool
    tolerance: float
    relative: bool
    short: str


def _part(part: str, key: str) -> Callable[[dict], float | None]:
    """Reads ``row[part][key]`` (None where the row has no ``part``)."""
    return lambda r: None if r[part] is None else r[part][key]


METRICS = (
    Metric(
        "Text accuracy",
        "held-out domain B, text targets; higher is better",
        _part("clean", "text_accuracy"),
        False,
        0.01,
        False,
        "text acc.",
    ),
    Metric(
        "ECE",
        "calibration of the top-1 decision's confidence on those targets; lower is better",
        _part("clean", "ece"),
        True,
        0.01,
        False,
        "ECE",
    ),
    Metric("Brier", "of the top-1 decision; lower is better", _part("clean", "brier"), True, 0.005, False, "Brier"),
    Metric(
        "Number MdAE, strict",
        "held-out predictable numbers, unparseable counted as infinite; lower is better",
        _part("clean", "target_mdae_strict"),
        True,
        0.05,
        True,
        "number MdAE",
    ),
    Metric(
        "Outlier-trained MdAE, strict",
        "trained with 10% outliers, clean held-out numbers; lower is better",
        _part("outliers", "target_mdae_strict"),
        True,
        0.05,
        True,
        "outlier-trained MdAE",
    ),
    Metric(
        "Extrapolation MdAE, strict",
        "numbers 200–5000, outside the training range; lower is better",
        _part("extrapolation", "target_mdae_strict"),
        True,
        0.05,
        True,
        "extrapolation MdAE",
    ),
    Metric(
        "Forgetting",
        "domain-A text accuracy after fine-tuning on B; higher is better",
        lambda r: r["a_accuracy"],
        False,
        0.01,
        False,
        "domain A after",
    ),
)


def _pair_text(
    qwen_name: str, qwen_value: float, causal_name: str, causal_value: float, metric: Metric
) -> tuple[str, str]:
    """``(winner, text)`` for one matched pair on one metric."""
    tolerance, relative = metric.tolerance, metric.relative
    winner = _winner(qwen_value, causal_value, metric.lower, tolerance, relative)
    if winner == "tie" and math.isinf(qwen_value) and math.isinf(causal_value):
        return winner, f"tie: {qwen_name} and {causal_name} both {_number(qwen_value)}"
    if winner == "tie":
        return winner, (
            f"tie within {_tolerance_text(tolerance, relative)}: {qwen_name} {_number(qwen_value)}, "
            f"{causal_name} {_number(causal_value)}"
        )
    first, second = (qwen_name, causal_name) if winner == "qwen" else (causal_name, qwen_name)
    values = (qwen_value, causal_value) if winner == "qwen" else (causal_value, qwen_value)
    return winner, f"{first} wins: {_number(values[0])} vs {_number(values[1])} ({second})"


# ---- the tables ----

NOT_RUN = (
    "not run: the robustness runs train the `head`/`causal` and `lora`/`lora` pairs on the outlier "
    "corpus; Qwen `adapter` and CausalQwen `abduction` (the abduction network alone) are not trained on it"
)
NO_DIVERGENCE = (
    r"not defined for Qwen: $\bar D(U, U_{\mathrm{base}})$ compares CausalQwen's abduced law of $U$ "
    "with the starting model's, and Qwen has no $U$"
)


def _metric(result, key):
    return _Missing(NOT_RUN) if result is None else _value(result[key])


def result_tables(rows: list[dict], sweep: list[dict], baseline: dict) -> dict[str, str]:
    """The report's tables as markdown: ``main`` (held-out domain B), ``groups`` (MdAE by template),
    ``robustness``, ``forgetting`` (with the domain-A accuracies before, ``baseline["qwen"]`` and
    ``baseline["causal"]``) and ``sweep`` (the bound ε sweep)."""
    main_rows = [
        [r["name"], r["trainable"]]
        + [
            _metric(r["clean"], key)
            for key in ("text_accuracy", "ece", "brier", "mae", "mdae", "mdae_strict", "unparseable", "n_numbers")
        ]
        for r in rows
    ]
    group_rows = []
    for r in rows:
        groups = r["clean"]["by_group"]
        group_rows.append(
            [r["name"]]
            + [_value(groups.get(g, {}).get("mdae")) for g in ("price/target", "copy/target", "scaled/target")]
            + [_value(r["clean"]["target_mdae_strict"])]
        )
    robust_rows = [
        [r["name"]]
        + [_metric(r["outliers"], key) for key in ("text_accuracy", "target_mdae", "target_mdae_strict", "unparseable")]
        + [
            _metric(r["extrapolation"], key)
            for key in ("text_accuracy", "target_mdae", "target_mdae_strict", "unparseable")
        ]
        for r in rows
    ]
    forget_rows = [
        [
            r["name"],
            baseline["qwen"] if r["kind"] == "qwen" else baseline["causal"],
            r["a_accuracy"],
            _value(r["divergence"], NO_DIVERGENCE) if r["kind"] == "causal" else _Missing(NO_DIVERGENCE),
        ]
        for r in rows
    ]
    sweep_rows = [
        [
            "none" if s["epsilon"] is None else s["epsilon"],
            s["divergence"],
            s["a_accuracy"],
            s["b_accuracy"],
            _value(s["b_mdae"]),
        ]
        for s in sweep
    ]
    return {
        "main": _table(
            [
                "model",
                "trainable",
                "text acc.",
                "ECE",
                "Brier",
                "number MAE",
                "MdAE",
                "MdAE strict",
                "unparseable",
                "numbers",
            ],
            main_rows,
        ),
        "groups": _table(["model", "price", "copy", "doubled", "all, strict"], group_rows),
        "robustness": _table(
            [
                "model",
                "outliers: text acc.",
                "target MdAE",
                "strict",
                "unparseable",
                "extrapolation: text acc.",
                "target MdAE",
                "strict",
                "unparseable",
            ],
            robust_rows,
        ),
        "forgetting": _table(["model", "domain A before", "domain A after", "held-out D(U, U_base)"], forget_rows),
        "sweep": _table(
            ["ε", "held-out D(U, U_base)", "domain-A text acc.", "domain-B text acc.", "domain-B target MdAE"],
            sweep_rows,
        ),
    }


# ---- the figure: 2 x 2, model names on every bar panel, values on the bars ----


def _color(r: dict) -> str:
    if r["kind"] == "qwen":
        return "tab:blue"
    return "tab:orange" if "bound" not in r["name"] else "#f7b26b"


def _bar_panel(axis, rows: list[dict], values: list[float], *, xlabel: str, title: str, xlim=None) -> None:
    """One horizontal bar per model, its value written beside it (an infinity as "∞", drawn at 0)."""
    bar_at = list(range(len(rows)))
    finite = [v if math.isfinite(v) else 0.0 for v in values]
    axis.barh(bar_at, finite, color=[_color(r) for r in rows])
    axis.set_yticks(bar_at, [r["name"].replace("`", "") for r in rows], fontsize=10)
    axis.invert_yaxis()
    right = xlim[1] if xlim else 1.22 * max(finite)
    axis.set(xlabel=xlabel, title=title, xlim=(0, right))
    for index, value in enumerate(values):
        text = "∞: half or more unparseable" if math.isinf(value) else fmt(value, 3)
        axis.text(finite[index] + 0.01 * right, index, text, va="center", fontsize=10)
    axis.grid(axis="x", alpha=0.3)


def _forgetting_panel(axis, rows: list[dict], baseline: dict, bound: float) -> None:
    """Domain-A accuracy after fine-tuning (bars) and before (black ticks), with the colour legend."""
    bar_at = list(range(len(rows)))
    axis.barh(bar_at, [r["a_accuracy"] for r in rows], color=[_color(r) for r in rows])
    axis.set_yticks(bar_at, [r["name"].replace("`", "") for r in rows], fontsize=10)
    axis.invert_yaxis()
    for index, r in enumerate(rows):
        before = baseline["qwen"] if r["kind"] == "qwen" else baseline["causal"]
        axis.plot([before, before], [index - 0.4, index + 0.4], color="black", lw=2)
        axis.text(
            max(r["a_accuracy"], before) + 0.015,
            index,
            f"{fmt(r['a_accuracy'], 3)} (before {fmt(before, 3)})",
            va="center",
            fontsize=10,
        )
    axis.set(
        xlim=(0, 1.5),
        xlabel="domain-A text accuracy after fine-tuning on B (higher = less forgetting)",
        title="forgetting: domain A after (bar) and before (black tick)",
    )
    axis.grid(axis="x", alpha=0.3)
    axis.set_xticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    axis.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:orange", "#f7b26b")],
        labels=["Qwen", "CausalQwen", f"CausalQwen, bound ε = {fmt(bound)}"],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncol=3,
        fontsize=10,
        frameon=False,
    )


def _sweep_panel(axis, sweep: list[dict], before_causal: float) -> None:
    """CausalQwen `abduction` over the bound ε: domain-B against domain-A text accuracy."""
    xs = [s["a_accuracy"] for s in sweep]
    ys = [s["b_accuracy"] for s in sweep]
    axis.plot(xs, ys, "-", color="lightgray", zorder=1)
    markers = "osD^vP*X"
    for index, (s, x, y) in enumerate(zip(sweep, xs, ys)):
        label = "ε = none" if s["epsilon"] is None else f"ε = {fmt(s['epsilon'])}"
        axis.scatter(
            [x],
            [y],
            s=90,
            marker=markers[index % len(markers)],
            zorder=2,
            label=f"{label}: domain A {fmt(x, 3)}, domain B {fmt(y, 3)}, D̄ = {fmt(s['divergence'], 3)}",
        )
    axis.axvline(
        before_causal, color="gray", ls="--", lw=1, label=f"domain A before fine-tuning ({fmt(before_causal, 3)})"
    )
    axis.set(
        xlabel="domain-A text accuracy after fine-tuning (forgetting ← left)",
        ylabel="domain-B text accuracy",
        title="CausalQwen `abduction`: the bound ε sweep",
    )
    axis.margins(x=0.15, y=0.25)
    axis.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    axis.grid(alpha=0.3)


def comparison_figure(rows: list[dict], sweep: list[dict], baseline: dict, bound: float, out_dir: Path) -> str:
    """``v9_comparison.png``: text accuracy, number MdAE, forgetting and the ε sweep; returns its file name."""
    plt.rcParams.update({"font.size": 11})
    figure, ((accuracy_axis, mdae_axis), (forget_axis, sweep_axis)) = plt.subplots(2, 2, figsize=(16, 11))
    _bar_panel(
        accuracy_axis,
        rows,
        [r["clean"]["text_accuracy"] for r in rows],
        xlabel="text accuracy (higher is better)",
        title="held-out domain B: next-token accuracy on text",
        xlim=(0, 1.12),
    )
    _bar_panel(
        mdae_axis,
        rows,
        [r["clean"]["target_mdae_strict"] for r in rows],
        xlabel="median absolute error (lower is better; unparseable = ∞)",
        title="held-out domain B: number MdAE (strict)",
    )
    _forgetting_panel(forget_axis, rows, baseline, bound)
    _sweep_panel(sweep_axis, sweep, baseline["causal"])
    figure_name = save_figure(figure, out_dir, "v9_comparison.png")
    plt.rcParams.update({"font.size": plt.rcParamsDefault["font.size"]})
    return figure_name


# ---- the verdict: the winner of each matched pair on each metric ----


def _metric_line(metric: Metric, by_name: dict, counts: dict, headline: list[str]) -> str:
    """The verdict line of one metric over the matched pairs; counts the winners into ``counts`` and adds the
    `head` / `causal` pair's result to ``headline``."""
    parts = []
    for qwen_variant, causal_preset in PAIRS:
        qwen_name, causal_name = f"Qwen `{qwen_variant}`", f"CausalQwen `{causal_preset}`"
        q, c = metric.value(by_name[qwen_name]), metric.value(by_name[causal_name])
        if q is None or c is None or math.isnan(q) or math.isnan(c):
            parts.append(
                f"{qwen_name} vs {causal_name} not run (not trained on the outlier corpus)"
                if q is None or c is None
                else f"{qwen_name} vs {causal_name}: undefined"
            )
            continue
        winner, text = _pair_text(qwen_name, q, causal_name, c, metric)
        counts[winner] += 1
        parts.append(text)
        if qwen_variant == "head":
            headline.append(
                f"{metric.short} "
                + ("tie" if winner == "tie" else "Qwen" if winner == "qwen" else "CausalQwen")
                + f" ({_number(q).split(' ')[0]} vs {_number(c).split(' ')[0]})"
            )
    return f"- **{metric.title}** ({metric.what}): " + "; ".join(parts) + "."


def verdict(rows: list[dict], baseline: dict, bound: float) -> tuple[list[str], list[str], dict[str, int]]:
    """``(lines, headline, counts)``: the verdict lines (who wins each metric, per matched pair, and the bound's
    effect on forgetting), the `head` / `causal` pair's result per metric, and the wins of each side and ties."""
    by_name = {r["name"]: r for r in rows}
    counts = {"qwen": 0, "causal": 0, "tie": 0}
    lines, headline = [], []
    for metric in METRICS:
        extra = ""
        if metric.title == "Forgetting":
            extra = f" Before fine-tuning: Qwen {fmt(baseline['qwen'], 3)}, CausalQwen {fmt(baseline['causal'], 3)}."
        lines.append(_metric_line(metric, by_name, counts, headline) + extra)
    compared = sum(counts.values())
    lines.insert(
        0,
        f"Matched pairs: Qwen `head` vs CausalQwen `causal` (frozen backbone), Qwen `lora` vs "
        f"CausalQwen `lora`, Qwen `adapter` vs CausalQwen `abduction` (all without the bound). Over the "
        f"{compared} comparisons run, Qwen wins {counts['qwen']}, CausalQwen {counts['causal']}, and "
        f"{counts['tie']} are ties (a difference within a tolerance: "
        + ", ".join(
            f"{m.short} {_tolerance_text(m.tolerance, m.relative)}" + (" of the larger value" if m.relative else "")
            for m in METRICS
        )
        + ").\n",
    )
    abduction, causal = by_name["CausalQwen `abduction`"], by_name["CausalQwen `causal`"]
    abduction_bounded = by_name[f"CausalQwen `abduction`, bound ε = {fmt(bound)}"]
    bounded = by_name[f"CausalQwen `causal`, bound ε = {fmt(bound)}"]
    lines.append(
        f"\nThe bound (ε = {fmt(bound)}) on forgetting: domain-A text accuracy after fine-tuning, CausalQwen "
        f"`abduction` {fmt(abduction['a_accuracy'], 3)} without it, {fmt(abduction_bounded['a_accuracy'], 3)} with "
        f"it; CausalQwen `causal` {fmt(causal['a_accuracy'], 3)} without, {fmt(bounded['a_accuracy'], 3)} with. "
        "The bound is on $U$ only: with `abduction` the head is frozen and the bound on $U$ bounds how far the "
        "decisions move; with `causal` the head trains too, and a bound on $U$ does not hold its decisions on "
        "domain A in place."
    )
    return lines, headline, counts
