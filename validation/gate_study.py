r"""The regression gate, measured: the design's gate against the drafts-era override

**Question.** The design gates the value's Cauchy NLL by the probability of ``<NUM>``,
$\mathrm{gate}_i = \alpha + (1 - \alpha)\,P_{\langle NUM\rangle, i}$ with $\alpha = 0$, and says the model then
"learns classification first, then regression" (forward pass §5.2). The demo and V8–V11 train instead with
$\alpha = 1$ (a plain masked NLL) and $\lambda = 0.1$, overrides chosen under the drafts' $C = 100$. Does the design's
gate train as well at D14's defaults, and is classification learned before regression?

**Method.** V9's harness (`validation.v9_comparison`): CausalQwen converted from the pretrained tiny base with D14's
defaults, preset ``causal`` (the numerical embedding, abduction and the head train; the backbone is frozen), AdamW at
V9's learning rate and batch, on the domain-B corpus. Arms: $\alpha \in \{0, 0.5, 1\}$, the gate detached or not
($\alpha = 1$ has no gate to detach), $\lambda \in \{0.1, 1\}$; each with several seeds (the new parameters' draw and
the batch order). Every ``eval_every`` steps the held-out batch gives the accuracy over all scored tokens and the
median absolute error of $\mathrm{loc}_Y$ at ``<NUM>`` targets (`causalqwen.metrics.evaluate_batch`); at the end,
V9's metrics on the held-out records (`validation.comparison_eval.evaluate_causal`: text accuracy, ECE, number MdAE)
and the ``<NUM>`` F1 of the standard decision. **Order:** $t_{\mathrm{cls}}$ is the first evaluation step at which
the accuracy has made half its total gain, $t_{\mathrm{reg}}$ the first at which the MdAE has made half its total
drop; "classification first" when $t_{\mathrm{cls}} < t_{\mathrm{reg}}$. **Verdict:** for each $\lambda$ the design's
gate ($\alpha = 0$, not detached) is compared with $\alpha = 1$ metric by metric; a difference smaller than the larger
of the two arms' standard deviations over seeds is a tie.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch

from causalqwen import CausalQwenForCausalLM, train
from causalqwen.files.data import TextDataset, collate
from causalqwen.metrics import evaluate_batch, with_log_prefixes
from causalqwen.training import TrainingConfig

from .common import ExperimentResult, check, fmt, module_text, table
from .comparison_eval import evaluate_causal
from .domain_b import domain_b_records
from .domains import pretrained_starting_point
from .v9_comparison import BATCH, SEED

ARMS = ((0.0, False), (0.0, True), (0.5, False), (0.5, True), (1.0, False))  # (alpha, detach_gate)
FULL = dict(steps=300, train_texts=4000, eval_texts=120, learning_rate=1e-2, eval_every=25, seeds=(0, 1, 2),
            arms=ARMS, weights=(0.1, 1.0))  # fmt: skip
QUICK = dict(steps=20, train_texts=200, eval_texts=24, learning_rate=1e-2, eval_every=10, seeds=(0,),
             arms=((0.0, False), (1.0, False)), weights=(0.1,))  # fmt: skip
# the end-of-run metrics compared between arms, and whether higher is better
METRICS = (("text_accuracy", True), ("num_f1", True), ("mdae", False), ("ece", False))


def half_way_step(steps: list[int], values: list[float], higher_is_better: bool) -> float:
    """The first of ``steps`` at which ``values`` has made half its change from the first value to the last
    (in the direction ``higher_is_better``); NaN if the last value is no better than the first."""
    start, end = values[0], values[-1]
    gain = (end - start) if higher_is_better else (start - end)
    if not gain > 0:
        return float("nan")
    for step, value in zip(steps, values):
        if ((value - start) if higher_is_better else (start - value)) >= gain / 2:
            return float(step)
    return float(steps[-1])


def harness_config(settings: dict, seed: int) -> TrainingConfig:
    """How the studies on V9's harness (this one and `validation.noise_study`) train: preset ``causal``,
    ``settings``' steps and learning rate, 10% warm-up, batch `BATCH`, an evaluation every ``eval_every`` steps,
    no checkpoint."""
    return TrainingConfig(
        steps=settings["steps"],
        batch_size=BATCH,
        learning_rate=settings["learning_rate"],
        warmup_steps=max(1, settings["steps"] // 10),
        preset="causal",
        log_every=settings["eval_every"],
        eval_every=settings["eval_every"],
        save_every=10**9,
        seed=seed,
    )


def one_run(base, tokenizer, data: dict, settings: dict, *, alpha: float, detach: bool, weight: float, seed: int):
    """Train one arm and return its end-of-run metrics and its order of learning."""
    torch.manual_seed(seed)
    model = CausalQwenForCausalLM.from_qwen(
        base, num_token_id=tokenizer.num_token_id, gate_alpha=alpha, detach_gate=detach, regression_weight=weight
    )
    config = harness_config(settings, seed)
    model.eval()
    start = with_log_prefixes(evaluate_batch(model, data["batch"]))
    history = train(model, data["train"], config, data["batch"], progress=False)
    curve = [(0, start)] + [(record["step"], record) for record in history if "eval/accuracy" in record]
    steps = [step for step, _ in curve]
    t_cls = half_way_step(steps, [record["eval/accuracy"] for _, record in curve], True)
    t_reg = half_way_step(steps, [record["eval/reg_mdae"] for _, record in curve], False)
    final = evaluate_causal(model.eval(), tokenizer, data["held_out"])
    return {
        "text_accuracy": final["text_accuracy"],
        "num_f1": curve[-1][1]["eval/num_f1"],
        "mdae": final["mdae"],
        "ece": final["ece"],
        "t_cls": t_cls,
        "t_reg": t_reg,
        "classification_first": t_cls < t_reg,
    }


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def compare(design: list[dict], override: list[dict]) -> dict[str, str]:
    """Per metric: which of the design's gate and alpha = 1 is better, a tie within the seeds' spread."""
    outcome = {}
    for metric, higher in METRICS:
        (m0, s0), (m1, s1) = mean_sd([r[metric] for r in design]), mean_sd([r[metric] for r in override])
        if abs(m0 - m1) <= max(s0, s1) or m0 == m1:
            outcome[metric] = "tie"
        else:
            outcome[metric] = "design gate" if (m0 > m1) == higher else "alpha = 1"
    return outcome


def _arm_name(alpha: float, detach: bool) -> str:
    return f"α = {fmt(alpha)}" + (", detached" if detach else "")


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    settings = QUICK if quick else FULL
    started = time.perf_counter()
    base, _, tokenizer = pretrained_starting_point()
    held_out = domain_b_records(settings["eval_texts"], SEED + 1)
    data = dict(
        train=TextDataset([r.text for r in domain_b_records(settings["train_texts"], SEED)], tokenizer, max_length=64),
        held_out=held_out,
        batch=collate(TextDataset([r.text for r in held_out], tokenizer, max_length=64).items, tokenizer.pad_token_id),
    )
    results: dict[tuple, list[dict]] = {}
    for weight in settings["weights"]:
        for alpha, detach in settings["arms"]:
            results[(alpha, detach, weight)] = [
                one_run(base, tokenizer, data, settings, alpha=alpha, detach=detach, weight=weight, seed=seed)
                for seed in settings["seeds"]
            ]
    rows = []
    for (alpha, detach, weight), runs in results.items():
        cells = []
        for metric, _ in METRICS:
            mean, sd = mean_sd([r[metric] for r in runs])
            cells.append(f"{fmt(mean)} ± {fmt(sd)}")
        first = sum(r["classification_first"] for r in runs)
        t_cls = ", ".join(fmt(r["t_cls"]) for r in runs)
        t_reg = ", ".join(fmt(r["t_reg"]) for r in runs)
        rows.append([_arm_name(alpha, detach), fmt(weight), *cells, f"{first} of {len(runs)}", t_cls, t_reg])
    verdicts = []
    ties_or_wins = {False: True, True: True}  # the design's gate, not detached / detached, against alpha = 1
    for weight in settings["weights"]:
        for detach in (False, True):
            if (0.0, detach, weight) not in results:
                continue
            outcome = compare(results[(0.0, detach, weight)], results[(1.0, False, weight)])
            ties_or_wins[detach] &= "alpha = 1" not in outcome.values()
            verdicts.append(
                f"- λ = {fmt(weight)}, {_arm_name(0.0, detach)} against α = 1: "
                + "; ".join(f"{metric}: {won}" for metric, won in outcome.items())
            )
    every = [r for runs in results.values() for r in runs]
    finite = all(math.isfinite(r[metric]) for r in every for metric, _ in METRICS)
    first_share = sum(r["classification_first"] for r in every) / len(every)
    title, text = module_text(__name__)
    headers = ["arm", "λ", *[f"{metric} (mean ± sd)" for metric, _ in METRICS], "cls first", "t_cls", "t_reg"]
    body = "\n\n".join(
        [
            text,
            "## The arms",
            table(headers, rows),
            "## The design's gate against α = 1",
            "\n".join(verdicts),
            " ".join(
                f"**The design's gate{', detached,' if detach else ''} "
                + ("ties or beats α = 1 on every metric at every λ.**" if holds else "loses to α = 1 somewhere.**")
                for detach, holds in ties_or_wins.items()
                if any((0.0, detach, weight) in results for weight in settings["weights"])
            ),
            f"Classification reached half its gain before regression in {first_share:.0%} of the runs.",
            f"Wall time {time.perf_counter() - started:.0f} s, {torch.get_num_threads()} thread(s).",
        ]
    )
    return ExperimentResult(
        name="GATE",
        title=title,
        claims=[check("every run's end-of-run metrics are finite", float(finite), "==", 1.0)],
        body=body,
        headline=(
            f"against α = 1 the design's gate {'ties or wins' if ties_or_wins[False] else 'loses'}, detached "
            f"{'ties or wins' if ties_or_wins[True] else 'loses'}; "
            f"classification first in {first_share:.0%} of runs"
        ),
        settings=f"{settings}",
    )
