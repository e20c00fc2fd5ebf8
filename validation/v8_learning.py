r"""Learning on the demo task: loss parts and metrics over the training steps

**Claim.** Trained by the real training loop (`causalqwen.train`) on the synthetic corpus of
`causalqwen.files.data`, whose numbers are partly predictable from the context, the model learns: the
held-out total loss

$$
L = \bar L_{\mathrm{cls}} + \lambda\, L_{\mathrm{reg,eff}}
$$

falls well below its value at initialization, and standard inference learns *where* numbers come:
the held-out $F_1$ of predicting ``<NUM>`` rises to a high value from its value at initialization
(where standard inference follows the random base's own greedy token, which is rarely ``<NUM>``: nothing in the
base makes that row likely where a number comes; see V3).

**Method.** The set-up of ``causalqwen demo`` (`causalqwen.app.demo`): the embedded tiny base, preset
``all`` (the random backbone must learn too), AdamW with linear warm-up and cosine decay, gradient
clipping, and the config's loss settings (the design's gate, detached, $\lambda = 1$: decision D24), training
sentences drawn with seed 0 and held-out sentences
with seed 1. The run is shorter than the demo's (see the settings): the full run uses the demo's
learning rate, the quick run a higher one so that it learns in fewer steps. The held-out metrics
(`causalqwen.metrics.evaluate_batch`: accuracy, ``<NUM>`` precision / recall / $F_1$, regression
MAE / MdAE, OvR sums) come from the loop's periodic evaluation; the held-out loss from the model's
forward with labels before and after training.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import torch

from causalqwen import train
from causalqwen.app.demo import DEMO_OVERRIDES, DEMO_STEPS
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.metrics import evaluate_batch, with_log_prefixes
from causalqwen.training import TrainingConfig

from .common import ExperimentResult, check, fmt, module_text, save_figure, table
from .fixtures import sentence_batch

SEED = 0
QUICK = dict(
    steps=250, learning_rate=1e-2, warmup_steps=15, eval_every=30, train_sentences=2000, eval_sentences=100, min_f1=0.5
)
FULL = dict(
    steps=600, learning_rate=3e-3, warmup_steps=50, eval_every=60, train_sentences=4000, eval_sentences=200, min_f1=0.8
)
LOSS_RATIO = 0.5  # held-out total loss after training <= this x its value at init


def _held_out_loss(model, batch) -> dict[str, float]:
    with torch.no_grad():
        out = model(**batch)
    return {"total": float(out.loss), "cls": float(out.cls_loss), "reg": float(out.reg_loss)}


METRIC_KEYS = [
    "eval/accuracy",
    "eval/num_precision",
    "eval/num_recall",
    "eval/num_f1",
    "eval/reg_mae",
    "eval/reg_mdae",
    "dist/ovr_prob_sum_median",
    "dist/ovr_prob_sum_median_causal",
    "dist/U_scale_median",
]


def _training_config(settings: dict) -> TrainingConfig:
    return TrainingConfig(
        steps=settings["steps"],
        batch_size=16,
        learning_rate=settings["learning_rate"],
        weight_decay=0.01,
        warmup_steps=settings["warmup_steps"],
        preset="all",
        eval_every=settings["eval_every"],
        save_every=settings["steps"],
        log_every=10,
        seed=SEED,
    )


def _train_and_evaluate(settings: dict, config: TrainingConfig) -> dict:
    """The demo's set-up trained by the real loop: the held-out loss and metrics before, the loop's history (its
    periodic evaluations) and the held-out loss after."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=SEED, init_seed=SEED, **DEMO_OVERRIDES)
    train_set = TextDataset(synthetic_texts(settings["train_sentences"], seed=SEED), tokenizer, max_length=64)
    eval_batch = sentence_batch(tokenizer, settings["eval_sentences"], SEED + 1)
    before_loss = _held_out_loss(model, eval_batch)
    before = with_log_prefixes(evaluate_batch(model, eval_batch, generator=torch.Generator().manual_seed(SEED)))
    history = train(model, train_set, config, eval_batch=eval_batch, progress=False)
    after_loss = _held_out_loss(model, eval_batch)
    return {"before_loss": before_loss, "before": before, "history": history, "after_loss": after_loss}


def _series(measured: dict, key: str) -> tuple[list, list]:
    """``(steps, values)`` of one logged key: the value at init (step 0) when measured, then the loop's records."""
    points = [(0, measured["before"][key])] if key in measured["before"] else []
    points += [(record["step"], record[key]) for record in measured["history"] if key in record]
    return [p[0] for p in points], [p[1] for p in points]


def _learning_figure(measured: dict, steps: int, out_dir: Path) -> str:
    """Loss parts, held-out classification metrics, held-out regression error and OvR sums over the steps."""
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.3))
    for key in ("train/total_loss", "train/cls_loss_mean", "train/reg_loss_effective"):
        left.plot(*_series(measured, key), label=key.split("/")[1])
    left.plot(
        [0, steps],
        [measured["before_loss"]["total"], measured["after_loss"]["total"]],
        "k*",
        ms=9,
        label="held-out total_loss (init, trained)",
    )
    left.set(xlabel="step", ylabel="loss (training batches)", yscale="log", title="loss parts")
    left.legend(fontsize=8)
    for key in ("eval/accuracy", "eval/num_precision", "eval/num_recall", "eval/num_f1"):
        middle.plot(*_series(measured, key), marker="o", ms=3, label=key.split("/")[1])
    middle.set(xlabel="step", ylim=(-0.02, 1.02), title="held-out classification (standard inference)")
    middle.legend(fontsize=8)
    for key in ("eval/reg_mae", "eval/reg_mdae", "dist/ovr_prob_sum_median", "dist/ovr_prob_sum_median_causal"):
        right.plot(*_series(measured, key), marker="o", ms=3, label=key.split("/")[1])
    right.set(xlabel="step", yscale="log", title="held-out regression error and OvR sums")
    right.legend(fontsize=8)
    return save_figure(figure, out_dir, "v8_learning.png")


def _body(text: str, measured: dict) -> str:
    before_loss, after_loss, before, after = (
        measured["before_loss"],
        measured["after_loss"],
        measured["before"],
        measured["history"][-1],
    )
    evaluations = [record for record in measured["history"] if "eval/num_f1" in record]
    trajectory_rows = [["0 (init)"] + [before[key] for key in METRIC_KEYS]]
    trajectory_rows += [[record["step"]] + [record[key] for key in METRIC_KEYS] for record in evaluations]
    return "\n\n".join(
        [
            text,
            "**Held-out loss** (the model's forward with labels on the held-out batch):",
            table(
                ["", "total", "cls (mean OvR)", "reg (effective)"],
                [
                    ["init", before_loss["total"], before_loss["cls"], before_loss["reg"]],
                    ["trained", after_loss["total"], after_loss["cls"], after_loss["reg"]],
                    [
                        "ratio",
                        after_loss["total"] / before_loss["total"],
                        after_loss["cls"] / before_loss["cls"],
                        after_loss["reg"] / before_loss["reg"],
                    ],
                ],
            ),
            "**Held-out metrics over the steps** (the training loop's evaluations):",
            table(["step"] + [key.split("/")[1] for key in METRIC_KEYS], trajectory_rows),
            f"After training the median OvR sum is {fmt(after['dist/ovr_prob_sum_median'], 3)} under standard "
            f"inference and {fmt(after['dist/ovr_prob_sum_median_causal'], 3)} under causal sampling (calibrated "
            f"would be 1; at init {fmt(before['dist/ovr_prob_sum_median'], 3)} and "
            f"{fmt(before['dist/ovr_prob_sum_median_causal'], 3)}, see V4).",
        ]
    )


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    settings = QUICK if quick else FULL
    config = _training_config(settings)
    measured = _train_and_evaluate(settings, config)
    before_loss, after_loss, before = measured["before_loss"], measured["after_loss"], measured["before"]
    after = measured["history"][-1]  # the loop's final evaluation (it always evaluates at the last step)
    figure_name = _learning_figure(measured, settings["steps"], out_dir)

    title, text = module_text(__name__)
    claims = [
        check(
            f"held-out total loss falls to at most {fmt(LOSS_RATIO)} × its value at init (ratio trained / init)",
            after_loss["total"] / before_loss["total"],
            "<=",
            LOSS_RATIO,
        ),
        check(
            "held-out classification loss falls (ratio trained / init)",
            after_loss["cls"] / before_loss["cls"],
            "<",
            1.0,
        ),
        check("held-out `<NUM>` F1 after training", after["eval/num_f1"], ">=", settings["min_f1"]),
        check("held-out `<NUM>` F1 rises (trained − init)", after["eval/num_f1"] - before["eval/num_f1"], ">=", 0.3),
    ]
    return ExperimentResult(
        name="V8",
        title=title,
        claims=claims,
        body=_body(text, measured),
        figures=[figure_name],
        headline=(
            f"held-out loss {fmt(before_loss['total'], 3)} → {fmt(after_loss['total'], 3)}; num_f1 "
            f"{fmt(before['eval/num_f1'], 3)} → {fmt(after['eval/num_f1'], 3)}; reg_mdae "
            f"{fmt(before['eval/reg_mdae'], 3)} → {fmt(after['eval/reg_mdae'], 3)} ({settings['steps']} steps)"
        ),
        settings=(
            f"{settings['steps']} steps (the demo runs {DEMO_STEPS}), learning rate "
            f"{fmt(settings['learning_rate'])}, warm-up {settings['warmup_steps']}, batch {config.batch_size}, "
            f"{settings['train_sentences']} training sentences (seed {SEED}), "
            f"{settings['eval_sentences']} held-out sentences (seed {SEED + 1}), evaluation every "
            f"{settings['eval_every']} steps, gradient clipping at {fmt(config.max_grad_norm)}, weight decay "
            f"{fmt(config.weight_decay)}, training seed {SEED}, "
            + ", ".join(f"{key} = {fmt(value)}" for key, value in DEMO_OVERRIDES.items())
        ),
    )
