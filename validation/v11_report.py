"""V11's report: the answer tables, the **Who wins** lines, the figure, the training line and the claims.

`validation.v11_arithmetic` trains the three arms and answers the held-out problems; this module turns what it
measured (a dict: the data file's ``header``, the ``train_problems``, the held-out problems per split
(``evaluation``), per arm and split the `validation.arithmetic_problems.scores` of its answers with the answers
themselves (``results``), the ``trainable`` values per arm, the ``seconds`` of each stage, the ``elapsed`` time,
the Qwen arms' ``train_losses``, the NTL term's ``ntl_values`` and CausalQwen's training ``history``) and the
reference of always answering 0 (``zero``) into the report's body (`report_body`), its figure
(`arithmetic_figure`), its headline (`headline_text`) and its claims (`report_claims`).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from causalqwen import CausalQwenConfig

from .arithmetic_problems import DATA_PATH, Problem, exact_causal, exact_qwen, scores
from .common import check, fmt, save_figure, table
from .v9_comparison import OVERRIDES

__all__ = ["SPLITS", "ARMS", "report_body", "arithmetic_figure", "headline_text", "report_claims"]


SPLITS = ("interpolate", "extrapolate")
ARMS = ("Qwen CE", "Qwen CE + NTL", "CausalQwen")
ZERO_TOLERANCE = 0.01  # an MdAE within 1% of always answering 0 is reported as that of answering 0
ARM_COLORS = {"Qwen CE": "tab:blue", "Qwen CE + NTL": "tab:green", "CausalQwen": "tab:orange"}


def _last_logged(history: list[dict], key: str) -> float:
    """The last value of ``key`` in a `causalqwen.train` history (NaN if never logged)."""
    values = [record[key] for record in history if key in record]
    return float(values[-1]) if values else math.nan


def _main_rows(results: dict, zero: dict) -> list[list]:
    """Per split: every arm's answer metrics, then the reference that always answers 0."""
    main_rows = []
    for split in SPLITS:
        for arm in ARMS:
            r = results[arm][split]
            main_rows.append(
                [
                    split,
                    arm,
                    r["n"],
                    r["exact"],
                    r["mdae_strict"],
                    r["mdae_parsed"],
                    r["unparseable"],
                    r["median_abs_prediction"],
                ]
            )
        r = zero[split]
        main_rows.append(
            [
                split,
                "*reference: always 0*",
                r["n"],
                r["exact"],
                r["mdae_strict"],
                r["mdae_parsed"],
                r["unparseable"],
                0.0,
            ]
        )
    return main_rows


def _module_rows(results: dict, evaluation: dict) -> list[list]:
    """Per split and module: every arm's exact match and strict MdAE."""
    module_rows = []
    for split in SPLITS:
        for module in dict.fromkeys(p.module for p in evaluation[split]):
            members = [i for i, p in enumerate(evaluation[split]) if p.module == module]
            subset = [evaluation[split][i] for i in members]
            row = [split, f"`{module}`", len(members)]
            for arm in ARMS:
                predicted = [results[arm][split]["predicted"][i] for i in members]
                exact_rule = exact_causal if arm == "CausalQwen" else exact_qwen
                r = scores(predicted, [exact_rule(y, p) for y, p in zip(predicted, subset)], subset)
                row += [r["exact"], r["mdae_strict"]]
            module_rows.append(row)
    return module_rows


def _magnitude_rows(train_problems: list[Problem], evaluation: dict) -> list[list]:
    """The median and largest |answer| of the training problems and of each split."""
    magnitude_rows = [
        [
            split,
            float(np.median([abs(p.value) for p in evaluation[split]])),
            max(abs(p.value) for p in evaluation[split]),
        ]
        for split in SPLITS
    ]
    magnitude_rows.insert(
        0,
        ["train", float(np.median([abs(p.value) for p in train_problems])), max(abs(p.value) for p in train_problems)],
    )
    return magnitude_rows


def _winner(results: dict, split: str, key: str, lower: bool) -> str:
    """The arm(s) with the best ``key`` on ``split``, and every arm's value."""
    values = {arm: results[arm][split][key] for arm in ARMS}
    best = min(values.values()) if lower else max(values.values())
    leaders = [arm for arm in ARMS if values[arm] == best]
    if key == "exact":  # as counts: a lead of one or two problems should read as what it is
        listing = ", ".join(
            f"{arm} {round(values[arm] * results[arm][split]['n'])} of {results[arm][split]['n']}" for arm in ARMS
        )
    else:
        listing = ", ".join(f"{arm} {fmt(values[arm], 4)}" for arm in ARMS)
    if len(leaders) == len(ARMS):
        return f"all tie ({listing})"
    return f"{' and '.join(leaders)} ({listing})"


def _against_zero(results: dict, zero: dict, split: str) -> str:
    """The line comparing every arm's MdAE on ``split`` with always answering 0."""
    reference = zero[split]["mdae_strict"]
    below_zero = [arm for arm in ARMS if results[arm][split]["mdae_strict"] < (1 - ZERO_TOLERANCE) * reference]
    causal_ratio = results["CausalQwen"][split]["mdae_strict"] / reference
    line = (
        f"- **Against answering 0**, {split}: always answering 0 has MdAE = the median |answer| = "
        f"{fmt(reference, 4)}; more than {fmt(100 * ZERO_TOLERANCE)}% below it: "
        + (", ".join(below_zero) if below_zero else "no arm")
        + ". CausalQwen's MdAE is "
        f"{fmt(causal_ratio, 4)} times it, its median |loc_Y| "
        f"{fmt(results['CausalQwen'][split]['median_abs_prediction'], 4)}"
    )
    if abs(causal_ratio - 1) <= ZERO_TOLERANCE:
        line += (
            ": its answers are near 0, so its MdAE is that of answering 0; it is ahead of the Qwen arms on "
            "MdAE because their wrong digit strings land further off, not because it computes the answer"
        )
    return line + "."


def _who_wins(results: dict, zero: dict, goal_met: bool) -> list[str]:
    """The **Who wins** lines: exact match and MdAE per split, the goal, and every arm against answering 0."""
    who_wins = []
    for split in SPLITS:
        best_exact = max(results[arm][split]["exact"] for arm in ARMS)
        beaten = " — no arm beats always answering 0" if best_exact <= zero[split]["exact"] else ""
        who_wins.append(
            f"- **Who wins, {split}, exact match** (higher is better): {_winner(results, split, 'exact', False)}; "
            f"always answering 0: {round(zero[split]['exact'] * zero[split]['n'])} of {zero[split]['n']}"
            f"{beaten}."
        )
        who_wins.append(
            f"- **Who wins, {split}, answer MdAE** (strict; lower is better): "
            f"{_winner(results, split, 'mdae_strict', True)}."
        )
    empty = (
        abs(results["CausalQwen"]["extrapolate"]["mdae_strict"] / zero["extrapolate"]["mdae_strict"] - 1)
        <= ZERO_TOLERANCE
    )
    who_wins.append(
        "- **The goal** (CausalQwen's extrapolation MdAE below both Qwen arms'): "
        + (
            "not met"
            if not goal_met
            else "met in the letter only: answering 0 meets it as well (below)"
            if empty
            else "met"
        )
        + " in this run."
    )
    for split in SPLITS:
        who_wins.append(_against_zero(results, zero, split))
    return who_wins


def _signed_log(values):  # sign(v) log10(1 + |v|): answers from -1e15 to 1e15 on one readable axis
    values = np.asarray(values, dtype=np.float64)
    return np.sign(values) * np.log10(1 + np.abs(values))


def _bar_panels(left, right, results: dict, zero: dict) -> None:
    """The strict MdAE (left) and the exact match (right) of every arm per split, always answering 0 dashed."""
    x = np.arange(len(SPLITS))
    width = 0.27
    for k, arm in enumerate(ARMS):
        mdae = [results[arm][split]["mdae_strict"] for split in SPLITS]
        finite = [m if math.isfinite(m) else 0.0 for m in mdae]
        left.bar(x + (k - 1) * width, finite, width, color=ARM_COLORS[arm], label=arm)
        for j, m in enumerate(mdae):
            if not math.isfinite(m):
                left.text(x[j] + (k - 1) * width, 1, "∞", ha="center", va="bottom")
        right.bar(
            x + (k - 1) * width,
            [results[arm][split]["exact"] for split in SPLITS],
            width,
            color=ARM_COLORS[arm],
            label=arm,
        )
    for j, split in enumerate(SPLITS):
        for axis, key in ((left, "mdae_strict"), (right, "exact")):
            axis.hlines(
                zero[split][key],
                x[j] - 1.5 * width,
                x[j] + 1.5 * width,
                colors="gray",
                linestyles="--",
                label="always 0" if j == 0 else None,
            )
    left.set(
        xticks=x,
        xticklabels=SPLITS,
        ylabel="answer MdAE (strict; ∞ = half or more unparseable)",
        yscale="symlog",
        title="median absolute error of the answer",
    )
    highest = max(
        [results[arm][split]["exact"] for arm in ARMS for split in SPLITS] + [zero[split]["exact"] for split in SPLITS]
    )
    right.set(
        xticks=x,
        xticklabels=SPLITS,
        ylabel="exact-match accuracy",
        ylim=(0, max(0.05, 1.3 * highest)),
        title="exact match of the answer (note the axis)",
    )
    right.legend(fontsize=8)
    left.legend(fontsize=8)


def arithmetic_figure(results: dict, zero: dict, evaluation: dict, out_dir: Path) -> str:
    """MdAE and exact match per split, and the extrapolation answers against the truth."""
    figure, (left, right, scatter) = plt.subplots(1, 3, figsize=(17, 4.5))
    _bar_panels(left, right, results, zero)
    truth = _signed_log([p.value for p in evaluation["extrapolate"]])
    for arm in ARMS:
        scatter.scatter(
            truth,
            _signed_log(results[arm]["extrapolate"]["predicted"]),
            s=10,
            alpha=0.6,
            color=ARM_COLORS[arm],
            label=arm,
        )
    limit = float(np.abs(truth).max())
    scatter.plot([-limit, limit], [-limit, limit], color="gray", lw=1, ls="--", label="answer = truth")
    scatter.set(
        xlabel="true answer, sign · log10(1 + |y|)",
        ylabel="answer given, same scale (unparseable not shown)",
        title="extrapolation: answers against the truth",
    )
    scatter.legend(fontsize=8)
    return save_figure(figure, out_dir, "v11_arithmetic.png")


def _training_text(measured: dict) -> str:
    """The final training losses of the three arms (and the NTL term's first and last values)."""
    train_losses, ntl_values, history = (
        measured["train_losses"],
        np.asarray(measured["ntl_values"]),
        measured["history"],
    )
    return (
        "**Training**: final training loss (mean of the last 10 steps) Qwen CE "
        f"{fmt(float(np.mean(train_losses['Qwen CE'][-10:])), 4)}, Qwen CE + NTL "
        f"{fmt(float(np.mean(train_losses['Qwen CE + NTL'][-10:])), 4)} (of which NTL, unweighted: first 10 steps "
        f"{fmt(float(ntl_values[:10].mean()), 4)}, last 10 {fmt(float(ntl_values[-10:].mean()), 4)}); CausalQwen "
        f"{fmt(_last_logged(history, 'train/total_loss'), 4)} at the last logged step (its own loss; not comparable "
        "in value), of which the gated regression part, before its weight λ = "
        f"{fmt(OVERRIDES.get('regression_weight', CausalQwenConfig.regression_weight))}, "
        f"{fmt(_last_logged(history, 'train/reg_loss_effective'), 4)}."
    )


def report_claims(measured: dict, prompt_mismatches: int, steps: int) -> list:
    results, trainable, evaluation = measured["results"], measured["trainable"], measured["evaluation"]
    ntl_values = np.asarray(measured["ntl_values"])
    n_eval = {arm: sum(results[arm][split]["n"] for split in SPLITS) for arm in ARMS}
    eval_questions = {p.question for split in SPLITS for p in evaluation[split]}
    training_questions = {p.question for p in measured["train_problems"]}
    return [
        check(
            "every arm answered the same problems (answers of Qwen CE + NTL and CausalQwen − Qwen CE)",
            abs(n_eval["Qwen CE + NTL"] - n_eval["Qwen CE"]) + abs(n_eval["CausalQwen"] - n_eval["Qwen CE"]),
            "==",
            0,
        ),
        check(
            "no evaluation question occurs in the training problems", len(eval_questions & training_questions), "==", 0
        ),
        check(
            "matched budget: CausalQwen trainable / Qwen CE trainable − 1 (absolute)",
            abs(trainable["CausalQwen"] / trainable["Qwen CE"] - 1),
            "<=",
            0.02,
        ),
        check(
            "matched budget: Qwen CE + NTL trainable / Qwen CE trainable",
            trainable["Qwen CE + NTL"] / trainable["Qwen CE"],
            "==",
            1.0,
        ),
        check("Qwen's prompts tokenize as the start of their texts (mismatches)", prompt_mismatches, "==", 0),
        check(
            "the NTL term was finite at every training step and took part (steps with it)",
            len(ntl_values) if np.isfinite(ntl_values).all() else 0,
            "==",
            steps,
        ),
    ]


def _goal_met(results: dict) -> bool:
    """The goal: CausalQwen's extrapolation MdAE below both Qwen arms'."""
    return all(
        results["CausalQwen"]["extrapolate"]["mdae_strict"] < results[arm]["extrapolate"]["mdae_strict"]
        for arm in ARMS[:2]
    )


def report_body(text: str, measured: dict, zero: dict) -> str:
    header, results, evaluation = measured["header"], measured["results"], measured["evaluation"]
    train_problems = measured["train_problems"]
    return "\n\n".join(
        [
            text,
            (
                f"Data: `{DATA_PATH.name}` from {header['source']} (seed {header['seed']}); "
                f"{len(train_problems)} training "
                f"problems, {', '.join(f'{len(evaluation[s])} {s}' for s in SPLITS)}. The answers' magnitudes:"
            ),
            table(["split", "median |answer|", "largest |answer|"], _magnitude_rows(train_problems, evaluation)),
            (
                "**Answers on held-out problems** (exact match; MdAE strict = unparseable counted as infinite; "
                "MdAE of the "
                "parseable answers only; unparseable share; median |answer given| over the parseable):"
            ),
            table(
                [
                    "split",
                    "arm",
                    "problems",
                    "exact match",
                    "MdAE strict",
                    "MdAE parseable",
                    "unparseable",
                    "median abs. answer given",
                ],
                _main_rows(results, zero),
            ),
            "**By module** (exact match, strict MdAE):",
            table(
                ["split", "module", "problems"] + [f"{arm}: {metric}" for arm in ARMS for metric in ("exact", "MdAE")],
                _module_rows(results, evaluation),
            ),
            _training_text(measured),
            "**What it says.**",
            "\n".join(_who_wins(results, zero, _goal_met(results))),
            (
                "Timings (one torch thread): "
                f"{', '.join(f'{name} {fmt(value, 3)} s' for name, value in measured['seconds'].items())}; "
                f"the whole experiment {fmt(measured['elapsed'], 3)} s."
            ),
        ]
    )


def headline_text(results: dict, zero: dict) -> str:
    return (
        f"extrapolation answer MdAE: Qwen CE {fmt(results['Qwen CE']['extrapolate']['mdae_strict'], 3)}, "
        f"+ NTL {fmt(results['Qwen CE + NTL']['extrapolate']['mdae_strict'], 3)}, CausalQwen "
        f"{fmt(results['CausalQwen']['extrapolate']['mdae_strict'], 3)} (always 0: "
        f"{fmt(zero['extrapolate']['mdae_strict'], 3)}); goal {'met' if _goal_met(results) else 'not met'}"
        + (
            "; no arm beats answering 0"
            if all(
                r["extrapolate"]["mdae_strict"] >= 0.99 * zero["extrapolate"]["mdae_strict"] for r in results.values()
            )
            else ""
        )
    )
