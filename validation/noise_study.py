r"""The exogenous noise over a training run, and the OvR sums as calibration monitors

**Questions.** (1) The reviewed overview expects $\lvert b_{\mathrm{noise}}\rvert$ to shrink as $U$ explains more.
The control: if every scale shrinks (V8 sees $\mathrm{scale}_U$ fall), a falling $\lvert b_{\mathrm{noise}}\rvert$
says nothing about the noise; the ratio of its median to the median $\mathrm{scale}_U$ does. (2) Which OvR sum is
the better calibration monitor: the standard one, or the one under causal sampling that the author proposes (one
individual has exactly one true next token)?

**Method.** V9's harness, shortened: CausalQwen converted from the pretrained tiny base (`validation.domains`) with
V9's overrides, preset ``causal``, AdamW at V9's learning rate on the domain-B corpus, the held-out domain-B texts
evaluated every ``eval_every`` steps by `causalqwen.metrics.evaluate_batch` (the noise against the scale of $U$,
and the OvR sums: standard, and causal averaged over ``draws`` individuals per position, with their spread and their
distance from 1). Before and after training the causal sums are also measured with another seed and with the
positions split one row at a time (the numbers must not depend on the split). Only the numbers are printed; the
conclusions are in ``docs/action.md`` and ``docs/training.md``.
"""

from __future__ import annotations

import argparse
import time

import torch

from causalqwen import train
from causalqwen.files.data import TextDataset, collate
from causalqwen.metrics import evaluate_batch, with_log_prefixes

from .common import table
from .domain_b import domain_b_records
from .domains import pretrained_starting_point
from .gate_study import harness_config
from .v9_comparison import SEED, causal_model

SETTINGS = dict(steps=150, train_texts=1600, eval_texts=80, learning_rate=1e-2, eval_every=25, draws=32, seed=SEED)
NOISE_KEYS = (
    "dist/noise_scale_mean",
    "dist/noise_scale_median",
    "dist/U_scale_median",
    "dist/noise_scale_over_U_scale",
)
SUM_KEYS = (
    "dist/ovr_prob_sum_median",
    "dist/ovr_prob_sum_median_causal",
    "dist/ovr_prob_sum_causal_spread",
    "dist/ovr_prob_sum_causal_error",
)


def calibration_row(name: str, model, batch, draws: int) -> list:
    """The OvR sums of ``model`` on ``batch``: standard; causal with seeds 0 and 1 (mean, spread, distance from 1);
    and whether splitting the positions one row at a time changes the causal mean."""
    seeded = [evaluate_batch(model, batch, causal_draws=draws, seed=seed) for seed in (0, 1)]
    one_row = batch["input_ids"].shape[1] * model.config.vocab_size
    split = evaluate_batch(model, batch, causal_draws=draws, seed=0, max_decision_elements=one_row)
    return [
        name,
        seeded[0]["ovr_prob_sum_median"],
        seeded[0]["ovr_prob_sum_median_causal"],
        seeded[1]["ovr_prob_sum_median_causal"],
        seeded[0]["ovr_prob_sum_causal_spread"],
        seeded[0]["ovr_prob_sum_causal_error"],
        split["ovr_prob_sum_median_causal"] == seeded[0]["ovr_prob_sum_median_causal"],
    ]


def kink_gradient() -> float:
    """torch's gradient of ``abs`` at exactly 0."""
    point = torch.zeros((), requires_grad=True)
    point.abs().backward()
    return float(point.grad)


def run(settings: dict) -> str:
    """The study's tables, as Markdown."""
    started = time.perf_counter()
    torch.set_num_threads(1)
    base, _, tokenizer = pretrained_starting_point()
    model = causal_model(base, tokenizer, seed=settings["seed"])
    texts = [record.text for record in domain_b_records(settings["train_texts"], SEED)]
    held_out = [record.text for record in domain_b_records(settings["eval_texts"], SEED + 1)]
    batch = collate(TextDataset(held_out, tokenizer, max_length=64).items, tokenizer.pad_token_id)
    sums = [calibration_row("before training", model, batch, settings["draws"])]
    initial = with_log_prefixes(evaluate_batch(model, batch, causal_draws=settings["draws"]))
    config = harness_config(settings, settings["seed"])
    history = train(model, TextDataset(texts, tokenizer, max_length=64), config, batch, progress=False)
    model.eval()
    sums.append(calibration_row(f"after {settings['steps']} steps", model, batch, settings["draws"]))
    rows = [[0, float("nan"), initial["eval/accuracy"], *(initial[key] for key in NOISE_KEYS)]]
    rows += [
        [r["step"], r["train/cls_loss_mean"], r["eval/accuracy"], *(r[key] for key in NOISE_KEYS)]
        for r in history
        if "eval/accuracy" in r
    ]
    noise = table(
        [
            "step",
            "train cls loss",
            "held-out accuracy",
            "mean abs b_noise",
            "median abs b_noise",
            "median scale_U",
            "ratio (medians)",
        ],
        rows,
    )
    calibration = table(
        [
            "model",
            "standard sum",
            "causal mean (seed 0)",
            "causal mean (seed 1)",
            "spread over draws",
            "distance from 1",
            "same when split by rows",
        ],
        sums,
    )
    return (
        f"Settings: {settings}; torch's d|b|/db at b = 0: {kink_gradient()}; "
        f"{time.perf_counter() - started:.0f} s on {torch.get_num_threads()} thread(s).\n\n"
        f"{noise}\n\n{calibration}\n"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=SETTINGS["steps"], help="training steps")
    parser.add_argument("--draws", type=int, default=SETTINGS["draws"], help="causal draws per position")
    parser.add_argument(
        "--seed", type=int, default=SETTINGS["seed"], help="the new parameters' draw and the batch order"
    )
    arguments = parser.parse_args(argv)
    print(run(SETTINGS | {"steps": arguments.steps, "draws": arguments.draws, "seed": arguments.seed}))


if __name__ == "__main__":
    main()
