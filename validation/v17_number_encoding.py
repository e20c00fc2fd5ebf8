r"""What one log-scaled direction cannot express: the number encodings on LIFT

**Question.** The design reads a number as one point on one line, $\phi(v) = \operatorname{sign}(v)\ln(1+|v|)\,\vec
w_{\mathrm{num}}$. At its tuned best (V16) CausalQwen learns linear, quadratic, exponential and l1norm better than
LIFT/GPT-J, but cosine and piecewise stay near the RAE of predicting the mean. Is that the encoding: must the
backbone unfold a function that repeats or breaks from one log-scaled coordinate? Here CausalQwen is trained the same
way with the opt-in periodic features of `causalqwen.embedding` (config ``number_encoding="log_fourier"``, beyond the
design, decision D27), which add sinusoids of $v$ at fixed periods whose weights start at zero, so every arm starts
exactly where the design does.

| arm | $\phi(v)$ | periods $T_j$ |
|---|---|---|
| CausalQwen | the design's: $\operatorname{sign}(v)\ln(1+\lvert v\rvert)\,\vec w_{\mathrm{num}}$ | none |
| CausalQwen, log_fourier 10^j | the design's $+ \sum_j \sin(2\pi v/T_j)\,\vec a_j + (1-\cos(2\pi v/T_j))\,\vec b_j$ | $10^{-2}, \dots, 10^{4}$ (FoNE's decimal places; the default) |
| CausalQwen, log_fourier 2^j | the same | $2^{-3}, \dots, 2^{6}$ (powers of two, as NeRF's positional encoding) |

**Protocol**: V16's CausalQwen arm, unchanged, for each encoding (`validation.v16_lift_tuned.train_arm`): all weights
trainable, the answer alone trained (prompt–completion rows), the learning rate chosen per arm and function from the
same grid by the RAE on LIFT's validation split of simulation 1 with outliers, the same steps, batch and seed, the
answer read as $\mathrm{loc}_Y$ at the prompt's last token. The robust polynomial is re-run beside them; the
published LIFT/GPT-J row is quoted. **Metric**: LIFT RAE (after LIFT's 3-RMSE filter); 1 is the score of predicting
the test mean.

**Caveat, stated before the numbers.** LIFT's cosine is $9\cos(\pi x/2)$, of period 4 $= 2^2$: one of the binary
periods, none of the decimal ones. A period set that holds a function's own period is a strong prior; the decimal set
is the one chosen without looking at LIFT. The piecewise function has no period at all.
"""  # noqa: E501

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .common import ExperimentResult, check, fmt, module_text, save_figure, table
from .lift_baselines import QUICK_METHODS, ROBUST
from .lift_data import CONDITIONS, FUNCTIONS, PUBLISHED, generate, lift_rae
from .v14_report import cell, chosen_settings, run_claims, save_predictions, scores
from .v16_lift_tuned import CAUSAL_ARMS, LEARNING_RATES, STEPS, measure
from .v16_report import flatness_table, selection_table

__all__ = ["ARMS", "run"]

ARMS = tuple(CAUSAL_ARMS)
FULL = {
    "arms": ARMS,
    "functions": FUNCTIONS,
    "conditions": CONDITIONS,
    "sims": (1, 2, 3),
    "learning_rates": LEARNING_RATES,
    "steps": STEPS,
    "methods": ROBUST,
    "workers": 2,
}
QUICK = {
    "arms": ARMS,
    "functions": ("cosine",),
    "conditions": ("outliers",),
    "sims": (1,),
    "learning_rates": (3e-3,),
    "steps": 20,
    "methods": QUICK_METHODS,
    "workers": 1,
}
HARD = ("cosine", "piecewise")  # V16's two losses


def _lift_table(measured: dict, condition: str) -> str:
    functions = measured["settings"]["functions"]
    rows = []
    for arm in measured["settings"]["arms"]:
        arm_scores = scores(measured, arm, lift_rae)
        rows.append([arm] + [cell(arm_scores[(f, condition)]) for f in functions])
    for method in measured["settings"]["methods"]:
        method_scores = scores(measured, method, lift_rae)
        rows.append([f"{method} (re-run)"] + [cell(method_scores[(f, condition)]) for f in functions])
    rows.append(["LIFT/GPT-J (published)"] + [fmt(PUBLISHED[condition][f]["gptj"], 3) for f in functions])
    return table(["LIFT RAE, " + condition] + list(functions), rows)


def findings(measured: dict) -> list[str]:
    """Per function and condition, the design's LIFT RAE and each periodic arm's, and which arm is best."""
    settings = measured["settings"]
    arms = settings["arms"]
    per_arm = {arm: scores(measured, arm, lift_rae) for arm in arms}
    lines = []
    for condition in settings["conditions"]:
        for function in settings["functions"]:
            means = {arm: float(per_arm[arm][(function, condition)].mean()) for arm in arms}
            best = min(means, key=means.get)
            written = ", ".join(f"{arm} {fmt(value, 3)}" for arm, value in means.items())
            lines.append(f"- {function}, {condition}: {written}; best: {best}.")
    return lines


def _figure(measured: dict, out_dir) -> str:
    """The test answers of every arm on the two functions V16 lost, first simulation, outliers (or the first run)."""
    settings = measured["settings"]
    functions = [f for f in HARD if f in settings["functions"]] or list(settings["functions"][:1])
    condition = "outliers" if "outliers" in settings["conditions"] else settings["conditions"][0]
    figure, axes = plt.subplots(1, len(functions), figsize=(5.5 * len(functions), 3.6), squeeze=False)
    for axis, function in zip(axes[0], functions):
        data = generate(function, settings["sims"][0], condition)
        order = np.argsort(data.x_test)
        axis.plot(data.x_test[order], data.y_test[order], color="black", linewidth=2, label="truth")
        for arm in settings["arms"]:
            answers = np.asarray(measured["runs"][arm][data.key]["predicted"])
            axis.plot(data.x_test[order], answers[order], marker=".", linewidth=0.8, label=arm)
        axis.set_title(f"{function}, {condition}, simulation {settings['sims'][0]}")
        axis.set_xlabel("x")
    axes[0][0].legend(fontsize=7)
    return save_figure(figure, out_dir, "v17_number_encoding.png")


def report_body(text: str, measured: dict) -> str:
    parts = [text, ""]
    for condition in measured["settings"]["conditions"]:
        parts += [f"**LIFT RAE, {condition}** (mean ± standard deviation over the simulations):", ""]
        parts += [_lift_table(measured, condition), ""]
    parts += ["**Per function**, mean LIFT RAE of each arm:", "", *findings(measured), ""]
    parts += ["**The learning rates** (validation RAE per rate; the chosen one in bold):", ""]
    parts += [selection_table(measured), "", "**Steps to a flat loss** (as V16):", "", flatness_table(measured), ""]
    parts.append(f"The whole study took {fmt(measured['elapsed'] / 60, 3)} minutes.")
    return "\n".join(parts)


def report_claims(measured: dict) -> list:
    settings, runs = measured["settings"], measured["runs"]
    keys = [data.key for data in measured["datasets"]]
    return [
        *run_claims(measured, tuple(settings["arms"]) + tuple(settings["methods"])),
        check(
            "every weight of every arm trained, the periodic ones included (runs where a weight was frozen)",
            sum(runs[arm][k]["trainable"] != runs[arm][k]["parameters"] for arm in settings["arms"] for k in keys),
            "==",
            0,
        ),
    ]


def report_headline(measured: dict) -> str:
    settings = measured["settings"]
    condition = "outliers" if "outliers" in settings["conditions"] else settings["conditions"][0]
    hard = [f for f in HARD if f in settings["functions"]] or list(settings["functions"])
    parts = []
    for arm in settings["arms"]:
        arm_scores = scores(measured, arm, lift_rae)
        parts.append(f"{arm} {fmt(float(np.mean([arm_scores[(f, condition)].mean() for f in hard])), 3)}")
    return f"mean LIFT RAE on {', '.join(hard)} ({condition}): " + ", ".join(parts)


def run(quick: bool, out_dir, **choices) -> ExperimentResult:
    """The study (`FULL`, or `QUICK`), with any setting replaced by ``choices`` (``functions=("cosine",)``)."""
    from pathlib import Path

    settings = chosen_settings(QUICK if quick else FULL, choices)
    unknown = [arm for arm in settings["arms"] if arm not in CAUSAL_ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; V17's are {', '.join(CAUSAL_ARMS)}")
    measured = measure(settings)
    out_dir = Path(out_dir)
    save_predictions(measured, out_dir / "v17_predictions.json")
    title, text = module_text(__name__)
    return ExperimentResult(
        name="V17",
        title=title,
        claims=report_claims(measured),
        body=report_body(text, measured),
        figures=[_figure(measured, out_dir)],
        headline=report_headline(measured),
        settings=(
            f"{settings['steps']} steps, learning rates {', '.join(fmt(r) for r in settings['learning_rates'])} "
            f"(chosen per arm and function); functions {', '.join(settings['functions'])}; conditions "
            f"{', '.join(settings['conditions'])}; simulations {', '.join(map(str, settings['sims']))}; "
            f"{settings['workers']} worker process(es) of one torch thread; raw answers in v17_predictions.json"
        ),
    )
