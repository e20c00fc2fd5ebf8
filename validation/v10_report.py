"""V10's report: the arms' summary, its table, the figure, the verdict lines and the claims.

`validation.v10_defaults` trains and evaluates the arms; this module turns its rows (one dict per run: the
``arm``, ``trainable``, the threshold ``C`` at initialization and ``C_after`` training, ``agreement``,
``accuracy``, ``traditional``, ``ece``, ``mdae``, ``outlier_mdae`` (NaN when not run), ``a_after``,
``sum_p_before``, ``sum_p_after``) into one entry per arm (`arm_summary`: the finalists averaged over their
seeds), the report's tables (`report_body`), its figure (`defaults_figure`), its verdict lines
(`verdict_lines`) and its claims (`report_claims`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from .common import check, fmt, save_figure, table

__all__ = ["GOAL_TEXT_ACCURACY", "arm_summary", "defaults_figure", "verdict_lines", "report_body", "report_claims"]


GOAL_TEXT_ACCURACY = 0.93


def _mean(rows, key):
    values = [r[key] for r in rows if not math.isnan(r[key])]
    return statistics.fmean(values) if values else math.nan


def arm_summary(rows: list[dict]) -> list[dict]:
    """One entry per arm: the finalists' mean over their seeds (and their accuracy per seed), the others as run."""
    finalists = {}
    for row in rows:
        if row["arm"].group == "finalists":
            finalists.setdefault(row["arm"].label, []).append(row)
    keys = (
        "trainable",
        "C",
        "agreement",
        "accuracy",
        "traditional",
        "ece",
        "mdae",
        "outlier_mdae",
        "a_after",
        "sum_p_before",
        "sum_p_after",
        "C_after",
    )
    summary = [
        dict(
            {k: _mean(group, k) for k in keys},
            label=label,
            group="finalists",
            seeds=len(group),
            accuracies=[r["accuracy"] for r in group],
        )
        for label, group in finalists.items()
    ]
    summary += [
        dict({k: r[k] for k in keys}, label=r["arm"].label, group=r["arm"].group, seeds=1, accuracies=[r["accuracy"]])
        for r in rows
        if r["arm"].group != "finalists"
    ]
    return summary


def _arm_rows(summary: list[dict]) -> list[list]:
    def cell(value):
        return "—" if isinstance(value, float) and math.isnan(value) else value

    return [
        [
            s["group"],
            s["label"],
            s["seeds"],
            int(s["trainable"]),
            s["C"],
            s["agreement"],
            s["accuracy"],
            s["traditional"],
            s["ece"],
            s["mdae"],
            cell(s["outlier_mdae"]),
            s["a_after"],
            s["sum_p_before"],
            s["sum_p_after"],
        ]
        for s in summary
    ]


def _accuracy_panel(left, summary: list[dict], qwen_metrics: dict) -> None:
    """Text accuracy per arm, with Qwen `head`'s and the goal as lines."""
    names = [
        f"{s['label']} ({s['group']})" if s["group"] != "finalists" else f"{s['label']} (mean of {s['seeds']})"
        for s in summary
    ]
    colors = [
        "tab:green" if s["label"] == "D14 defaults" else "tab:red" if "drafts" in s["label"] else "tab:orange"
        for s in summary
    ]
    left.barh(names, [s["accuracy"] for s in summary], color=colors)
    for index, s in enumerate(summary):
        left.text(
            0.01, index, fmt(s["accuracy"], 3), va="center", ha="left", fontsize=9, color="white", fontweight="bold"
        )
    left.axvline(
        qwen_metrics["text_accuracy"],
        color="tab:blue",
        ls="--",
        label=f"Qwen `head` (V9's counterpart): {fmt(qwen_metrics['text_accuracy'], 3)}",
    )
    left.axvline(GOAL_TEXT_ACCURACY, color="black", ls=":", label=f"goal {GOAL_TEXT_ACCURACY}")
    left.set(
        xlim=(0, 1),
        xlabel="domain-B held-out text accuracy (standard decision)",
        title="one change from D14's defaults per arm",
    )
    left.invert_yaxis()
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=2, fontsize=9)


def _threshold_panel(right, summary: list[dict], by_label: dict) -> None:
    """Agreement at init and accuracy after training against C at γ = 0.1."""
    default, drafts = by_label["D14 defaults"], by_label["drafts (γ = 10, C = 100)"]
    c_rows = sorted([s for s in summary if s["group"] == "C" and s["C"] <= 20] + [default], key=lambda s: s["C"])
    right.plot(
        [s["C"] for s in c_rows],
        [s["agreement"] for s in c_rows],
        "o-",
        color="tab:purple",
        label="argmax P = Qwen's greedy token at init (domain A)",
    )
    right.plot(
        [s["C"] for s in c_rows],
        [s["accuracy"] for s in c_rows],
        "s-",
        color="tab:orange",
        label="text accuracy after training (domain B)",
    )
    right.axvline(default["C"], color="tab:green", ls="--", label=f"the rule's C = {fmt(default['C'], 3)}")
    far = by_label.get("C = 100 fixed")
    note = (
        f"C = 100 (off the axis): agreement {fmt(drafts['agreement'], 3)};\ntext accuracy "
        + (f"{fmt(far['accuracy'], 3)} at γ = 0.1, " if far else "")
        + f"{fmt(drafts['accuracy'], 3)} at γ = 10"
    )
    right.text(0.02, 0.04, note, transform=right.transAxes, fontsize=9)
    right.set(
        xlabel="threshold C at initialization (γ = 0.1)",
        ylim=(0.5, 1.01),
        title="the threshold: agreement at init and learning",
    )
    right.legend(fontsize=9, loc="lower right", bbox_to_anchor=(1.0, 0.1))


def defaults_figure(summary: list[dict], by_label: dict, qwen_metrics: dict, out_dir: Path) -> str:
    """Text accuracy per arm, and agreement / accuracy against C at γ = 0.1."""
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(16, max(6.0, 0.36 * len(summary) + 2.0)), gridspec_kw={"width_ratios": [1.6, 1]}
    )
    _accuracy_panel(left, summary, qwen_metrics)
    _threshold_panel(right, summary, by_label)
    return save_figure(figure, out_dir, "v10_defaults.png")


def verdict_lines(by_label: dict, qwen_metrics: dict, qwen_trainable: int, big: dict) -> list[str]:
    default, drafts = by_label["D14 defaults"], by_label["drafts (γ = 10, C = 100)"]
    goal_met = default["accuracy"] >= GOAL_TEXT_ACCURACY
    return [
        f"- **Text accuracy** (domain B, standard decision): D14 defaults {fmt(default['accuracy'], 3)}, the drafts' "
        f"{fmt(drafts['accuracy'], 3)}, Qwen `head` {fmt(qwen_metrics['text_accuracy'], 3)}. The goal "
        f"≥ {GOAL_TEXT_ACCURACY} is {'met' if goal_met else 'not met'}: Qwen still wins on text by "
        f"{fmt(qwen_metrics['text_accuracy'] - default['accuracy'], 3)}.",
        f"- **Calibration** (ECE): D14 {fmt(default['ece'], 3)}, drafts {fmt(drafts['ece'], 3)}, Qwen "
        f"{fmt(qwen_metrics['ece'], 3)}: the goal ECE ≤ Qwen's is "
        f"{'met' if default['ece'] <= qwen_metrics['ece'] else 'not met'}.",
        f"- **Numbers** (MdAE of the predictable numbers): D14 {fmt(default['mdae'], 4)}, drafts "
        f"{fmt(drafts['mdae'], 3)}, Qwen `head` {fmt(qwen_metrics['target_mdae_strict'], 4)}: the goal MdAE ≤ Qwen "
        f"`head`'s is {'met' if default['mdae'] <= qwen_metrics['target_mdae_strict'] else 'not met'}.",
        f"- **What moves text accuracy**: γ (at C = 100: "
        f"{fmt(by_label['C = 100 fixed']['accuracy'], 3) if 'C = 100 fixed' in by_label else '—'} "
        f"with γ = 0.1 against {fmt(drafts['accuracy'], 3)} with γ = 10) more than C, which decides the agreement at "
        "initialization; the MLP abduction network "
        + (
            f"({fmt(by_label['mlp abduction']['accuracy'], 3)}, with "
            f"{fmt(by_label['mlp abduction']['trainable'] / qwen_trainable, 3)}× the trainable values of Qwen `head`) "
            if "mlp abduction" in by_label
            else ""
        )
        + "and more steps "
        + (f"({fmt(by_label['1500 steps']['accuracy'], 3)} at 1500) " if "1500 steps" in by_label else "")
        + "go further; no other arm at the same budget and steps rises above the spread of D14's seeds "
        + f"({fmt(min(default['accuracies']), 3)}–{fmt(max(default['accuracies']), 3)}), and some fall below it "
        "(C = 0, noise_init = 1, a smaller learning rate).",
        f"- **Decision at initialization** (domain A): argmax P = Qwen's greedy token at "
        f"{fmt(100 * default['agreement'], 4)}% of positions with the rule's C = {fmt(default['C'], 4)}, "
        f"{fmt(100 * drafts['agreement'], 3)}% with C = 100.",
        f"- **A random base of the Qwen2.5-0.5B shape** ({big['layers']} layers): the rule gives C = "
        f"{fmt(big['rule_C'], 3)} (its median top logit on its own samples: {fmt(big['top_logit_median'], 3)}); "
        f"argmax P "
        f"= greedy at {fmt(100 * big['rule'], 4)}% of positions with it, {fmt(100 * big['C = 10'], 3)}% with C = 10, "
        f"{fmt(100 * big['C = 100'], 3)}% with C = 100. `from_qwen` chose C = {fmt(big['converted_C'], 4)}; "
        f"max |loc_S − logits| = {fmt(big['max_logit_error'], 3)}.",
    ]


def report_body(text: str, summary: list[dict], verdict: list[str], qwen: tuple[int, dict], elapsed: float) -> str:
    qwen_trainable, qwen_metrics = qwen
    seeds_rows = [
        [s["label"], ", ".join(fmt(a, 3) for a in s["accuracies"])] for s in summary if s["group"] == "finalists"
    ]
    return "\n\n".join(
        [
            text,
            "**Per arm** (one seed unless stated; finalists: mean over seeds; C = the threshold at initialization; "
            "agreement on domain A at initialization; accuracy, ECE, MdAE and ΣP on domain B; "
            "“—”: not run for this arm):",
            table(
                [
                    "group",
                    "arm",
                    "seeds",
                    "trainable",
                    "C",
                    "argmax P = greedy at init",
                    "text acc. (standard)",
                    "text acc. (traditional)",
                    "ECE",
                    "MdAE",
                    "MdAE, outlier-trained",
                    "domain-A acc. after",
                    "median ΣP before",
                    "median ΣP after",
                ],
                _arm_rows(summary),
            ),
            "**Finalists, text accuracy per seed:**",
            table(["arm", "text accuracy per seed"], seeds_rows),
            f"**Qwen `head`** on the same harness ({qwen_trainable} trainable values): text accuracy "
            f"{fmt(qwen_metrics['text_accuracy'], 3)}, ECE "
            f"{fmt(qwen_metrics['ece'], 3)}, MdAE {fmt(qwen_metrics['target_mdae_strict'], 3)}.",
            "**What it says.**",
            "\n".join(verdict),
            f"The study took {fmt(elapsed, 3)} s.",
        ]
    )


def report_claims(summary: list[dict], by_label: dict, big: dict, quick: bool) -> list:
    default, drafts = by_label["D14 defaults"], by_label["drafts (γ = 10, C = 100)"]
    gamma_rows = [s for s in summary if s["group"] == "γ"] + [default]
    return [
        check(
            "at D14's defaults, argmax P = Qwen's greedy token at initialization (share of domain-A positions)",
            default["agreement"],
            ">=",
            0.99,
        ),
        check(
            "γ does not change the decision at initialization (largest spread of the agreement over γ)",
            max(s["agreement"] for s in gamma_rows) - min(s["agreement"] for s in gamma_rows),
            "<=",
            1e-9,
        ),
        check(
            "D14's defaults learn text better than the drafts' (text accuracy, D14 − drafts)",
            default["accuracy"] - drafts["accuracy"],
            ">=",
            0.1 if quick else 0.3,
        ),
        check("the 0.5B-shape random base: the rule's agreement − C = 100's", big["rule"] - big["C = 100"], ">=", 0.5),
        check(
            "the 0.5B-shape random base: from_qwen's threshold is the rule's (|difference|)",
            abs(big["converted_C"] - big["rule_C"]),
            "<=",
            1e-9,
        ),
        check("the 0.5B-shape random base: loc_S = logits (max |difference|)", big["max_logit_error"], "<=", 1e-4),
    ]
