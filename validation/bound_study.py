r"""``python -m validation.bound_study``: does ``max_u_divergence`` hold at the end of a run? The grid of
[fine-tuning](../docs/fine-tuning.md#the-bound-as-a-constraint).

On the tiny base (preset ``abduction``, batch 8, 64 synthetic training texts, AdamW with the default warm-up and
cosine schedule, ``divergence_dual_lr`` 1.0), for learning rates 0.003, 0.01, 0.03, 0.1, 40 and 200 steps, D14's
calibrated $\gamma = 0.1$ and the drafts' $\gamma = 10$ (`causalqwen.initialization.DRAFT_INIT`), without a bound and
with $\varepsilon = 0.05$ and $0.5$: the mean divergence of $U$ from the starting model's on 32 held-out synthetic
texts at the end of the run, the KL closed form summed over the components in float64 on a separate copy of the
starting model. Prints a markdown table and the largest ratio to $\varepsilon$. About 10 minutes on one core.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from causalqwen import train
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.initialization import DRAFT_INIT
from causalqwen.training import TrainingConfig

INITS = {"calibrated (0.1)": {}, "drafts (10)": DRAFT_INIT}
LEARNING_RATES = (0.003, 0.01, 0.03, 0.1)
STEPS = (40, 200)
EPSILONS = (0.05, 0.5)


def held_out_divergence(model, starting, tokenizer) -> float:
    r"""$\bar D$ on 32 held-out synthetic texts: the float64 closed form over the real positions."""
    batch = collate(TextDataset(synthetic_texts(32, seed=7), tokenizer, max_length=32).items, tokenizer.pad_token_id)
    laws = []
    for network in (model, starting):
        with torch.no_grad():
            out = network.eval().abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
        laws += [out.loc_U.double().numpy(), out.scale_U.double().numpy()]
    lp, sp, lq, sq = laws
    per_position = np.log(((sp + sq) ** 2 + (lp - lq) ** 2) / (4 * sp * sq)).sum(-1)  # [B, S]
    return float(per_position[batch["attention_mask"].bool().numpy()].mean())


def one_run(init: str, learning_rate: float, steps: int, epsilon: float | None) -> float:
    """The held-out divergence at the end of one run."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0, **INITS[init])
    starting = copy.deepcopy(model)
    config = TrainingConfig(
        steps=steps,
        batch_size=8,
        learning_rate=learning_rate,
        preset="abduction",
        log_every=steps,
        eval_every=10**6,
        save_every=10**6,
        seed=0,
        max_u_divergence=epsilon,
    )
    train(model, TextDataset(synthetic_texts(64, seed=0), tokenizer, max_length=32), config, progress=False)
    return held_out_divergence(model, starting, tokenizer)


def main() -> None:
    torch.set_num_threads(1)
    print("| init ($\\gamma$) | steps | learning rate | no bound | " + " | ".join(f"ε = {e}" for e in EPSILONS) + " |")
    print("|---|---|---|---|" + "---|" * len(EPSILONS))
    worst = 0.0
    for init in INITS:
        for steps in STEPS:
            for learning_rate in LEARNING_RATES:
                free = one_run(init, learning_rate, steps, None)
                held = [one_run(init, learning_rate, steps, epsilon) for epsilon in EPSILONS]
                worst = max([worst] + [d / e for d, e in zip(held, EPSILONS)])
                cells = " | ".join(f"{d:.3g}" for d in held)
                print(f"| {init} | {steps} | {learning_rate} | {free:.3g} | {cells} |", flush=True)
    print(f"\nlargest held-out divergence / epsilon with the bound: {worst:.3f}")


if __name__ == "__main__":
    main()
