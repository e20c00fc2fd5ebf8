r"""Ledger rows that need a few seconds of training (V13): learned per-class thresholds, the traditional mode after
OvR training, and the OvR probability sum under standard and causal inference before and after.

The tiny model is trained by the package's own loop (`causalqwen.train`, preset ``"all"``, the literal loss) on
synthetic sentences, and measured on held-out ones. Every probability below is formed from the model's laws by
SciPy (``stats.cauchy.sf``) or torch's ``log_softmax`` in float64; the causal individuals are drawn by NumPy from a
fixed seed, several per position, not by the package's sampler.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from causalqwen import train
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.metrics import next_token_valid_mask, ovr_prob_sum_median
from causalqwen.training import TrainingConfig

from .claims_ledger import FORWARD, FOUNDATIONS, OVERVIEW, LedgerRow
from .claims_parameters import LITERAL
from .common import check, fmt

__all__ = ["training_rows", "TRAIN_SEED", "LEARNING_RATE"]

TRAIN_SEED = 0
DRAW_SEED = 17
LEARNING_RATE = 3e-3
CONVERGING = 0.5  # the sum converges to 1 in a run when its distance from 1 at least halves
DROP_IN_MARGIN = 1.1  # softmax(loc_S) is a drop-in while its held-out cross-entropy is within 10% of the OvR one's


class Snapshot:
    """What one evaluation of the model on the held-out batch measured (float64 throughout)."""

    def __init__(self, model, batch: dict, draws: int):
        with torch.no_grad():
            out = model(
                batch["input_ids"], numeric_values=batch["numeric_values"], attention_mask=batch["attention_mask"]
            )
        valid = next_token_valid_mask(batch["labels"], batch["attention_mask"])  # [B, S-1]
        targets = batch["labels"][:, 1:][valid][:, None]  # [N, 1]
        loc_S, scale_S = out.loc_S[:, :-1][valid].double(), out.scale_S[:, :-1][valid].double()  # [N, V] each
        threshold = np.asarray(model.ovr_threshold.detach().double().numpy())
        p = stats.cauchy.sf(threshold, loc_S.numpy(), scale_S.numpy())  # [N, V], P_k by SciPy
        log_p = torch.from_numpy(np.log(p))  # [N, V]
        self.softmax_ce = -float(torch.log_softmax(loc_S, -1).gather(-1, targets).mean())  # nats per token
        self.ovr_ce = -float(torch.log_softmax(log_p, -1).gather(-1, targets).mean())  # P_k / Σ_j P_j
        self.standard_sum = float(np.median(p.sum(-1)))
        self.package_sum = ovr_prob_sum_median(loc_S, scale_S, model.ovr_threshold.detach().double(),
                                               torch.ones(len(p), dtype=torch.bool))  # fmt: skip
        self.causal_sums = self._causal_sums(model, out, valid, threshold, draws)  # [draws]
        self.vocab_size = loc_S.shape[-1]

    @staticmethod
    def _causal_sums(model, out, valid, threshold, draws: int) -> np.ndarray:
        """Median over positions of Σ_k P_k for ``draws`` individuals u per position (NumPy, seed `DRAW_SEED`):
        u = loc_U + scale_U·tan(π(ε − ½)), then S ~ Cauchy(W u + b, |W|·|b_noise|)."""
        loc_U = out.loc_U[:, :-1][valid].double().numpy()  # [N, C]
        scale_U = out.scale_U[:, :-1][valid].double().numpy()  # [N, C]
        head = model.action.classification_head
        weight, bias = head.weight.detach().double().numpy(), head.bias.detach().double().numpy()  # [V, C], [V]
        scale_S = np.maximum(model.action.noise_scale.detach().double().numpy() @ np.abs(weight).T, 1e-6)  # [V]
        generator = np.random.default_rng(DRAW_SEED)
        sums = []
        for _ in range(draws):
            u = loc_U + scale_U * np.tan(np.pi * (generator.uniform(size=loc_U.shape) - 0.5))  # [N, C]
            sums.append(float(np.median(stats.cauchy.sf(threshold, u @ weight.T + bias, scale_S).sum(-1))))
        return np.array(sums)


def _training_config(steps: int) -> TrainingConfig:
    return TrainingConfig(
        steps=steps,
        batch_size=8,
        learning_rate=LEARNING_RATE,
        warmup_steps=0,
        preset="all",
        eval_every=steps,
        save_every=steps,
        log_every=steps,
        seed=TRAIN_SEED,
    )


def _training_set(tokenizer) -> TextDataset:
    return TextDataset(synthetic_texts(64, seed=1), tokenizer, max_length=64)


def _trained(steps: int, batch: dict, draws: int) -> tuple[Snapshot, Snapshot]:
    model, tokenizer, _ = build_tiny_causal_lm(seed=TRAIN_SEED, init_seed=TRAIN_SEED, **LITERAL)
    before = Snapshot(model, batch, draws)
    train(model.train(), _training_set(tokenizer), _training_config(steps), progress=False)
    return before, Snapshot(model.eval(), batch, draws)


def learned_threshold_row(steps: int) -> LedgerRow:
    """Per-class learnable thresholds trained with the rest: does C_k end lower for the tokens that are frequent
    targets? Spearman's rank correlation (SciPy) of the change of C_k with the token's count as a target."""
    settings = {"ovr_threshold_per_class": True, "learnable_threshold": True}
    model, tokenizer, _ = build_tiny_causal_lm(seed=TRAIN_SEED, init_seed=TRAIN_SEED, **settings, **LITERAL)
    start = model.action.ovr_threshold.detach().clone()  # [V]
    train_set = _training_set(tokenizer)
    train(model.train(), train_set, _training_config(steps), progress=False)
    change = (model.action.ovr_threshold.detach() - start).double().numpy()  # [V]
    targets = torch.cat([item["input_ids"][1:] for item in train_set.items])  # every next-token target
    counts = torch.bincount(targets, minlength=len(change)).numpy()  # [V]
    seen = counts > 0
    correlation = stats.spearmanr(counts[seen], change[seen])
    frequent = np.argsort(-counts)[:20]
    lower = correlation.statistic < 0 and correlation.pvalue < 0.01
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 6 (future extension); {FORWARD} §5.1 (design outlook)",
        statement="A learned per-class threshold ends lower for frequent tokens and higher for rare ones.",
        method=f"the tiny model with learnable per-class thresholds, trained {steps} steps like the rows below; "
        "Spearman's rank correlation (scipy.stats.spearmanr) of the change of C_k with the token's count as a "
        f"target in the training set, over the {int(seen.sum())} tokens that occur.",
        figures=f"Spearman ρ = {fmt(float(correlation.statistic))} (p = {fmt(float(correlation.pvalue))}); median "
        f"change of C_k: {fmt(float(np.median(change[frequent])))} for the 20 most frequent tokens, "
        f"{fmt(float(np.median(change[~seen])))} for tokens that never occur",
        verdict="holds" if lower else "fails",
    )


def traditional_row(start_difference: float, before: Snapshot, after: Snapshot, steps: int) -> LedgerRow:
    at_start = start_difference <= 1e-12
    drop_in = after.softmax_ce <= DROP_IN_MARGIN * after.ovr_ce
    verdict = "holds" if at_start and drop_in else "fails"
    if at_start and not drop_in:
        verdict = (
            "holds only under initialization: after OvR training softmax(loc_S) is not the model's distribution "
            f"(held-out cross-entropy {fmt(after.softmax_ce)} nats against {fmt(after.ovr_ce)} for P_k/Σ P_j)"
        )
    uniform = float(np.log(after.vocab_size))
    return LedgerRow(
        where=f"{OVERVIEW} §3.3; {FOUNDATIONS} §5.3",
        statement="loc_S can be used directly as logits: softmax(loc_S) with top-k/top-p makes CausalQwen a drop-in "
        "replacement for Qwen's sampling.",
        method="at init: `inference.traditional_probabilities` on loc_S against torch's softmax of the base's logits; "
        f"after {steps} steps of OvR training of the tiny model (lr {fmt(LEARNING_RATE)}): the held-out "
        f"cross-entropy of softmax(loc_S) against that of the OvR distribution P_k/Σ P_j (a drop-in: within "
        f"{fmt(DROP_IN_MARGIN)}×).",
        figures=f"at init max |Δp| = {fmt(start_difference)}; cross-entropy (nats/token) softmax(loc_S) "
        f"{fmt(before.softmax_ce)} → {fmt(after.softmax_ce)}, OvR {fmt(before.ovr_ce)} → {fmt(after.ovr_ce)} "
        f"(uniform over V = {after.vocab_size}: {fmt(uniform)})",
        verdict=verdict,
    )


def ovr_sum_row(before: Snapshot, after: Snapshot, steps: int) -> LedgerRow:
    draws = len(after.causal_sums)
    distance = {  # |median sum − 1| before and after training
        "standard": (abs(before.standard_sum - 1.0), abs(after.standard_sum - 1.0)),
        "causal": (abs(float(np.median(before.causal_sums)) - 1.0), abs(float(np.median(after.causal_sums)) - 1.0)),
    }
    converging = {mode: end <= CONVERGING * start for mode, (start, end) in distance.items()}
    verdict = "holds" if all(converging.values()) else "fails"
    if any(converging.values()) and not all(converging.values()):
        verdict = f"holds only under {'standard' if converging['standard'] else 'causal'} inference"
    closer = min(distance, key=lambda mode: distance[mode][1])

    def causal(snapshot: Snapshot) -> str:
        sums = snapshot.causal_sums
        return f"{fmt(float(np.median(sums)))} (draws {fmt(float(sums.min()))} to {fmt(float(sums.max()))})"

    return LedgerRow(
        where=f"{OVERVIEW} §5.4 (and the author's comment on causal sampling)",
        statement="A well-calibrated model's median OvR sum Σ_k P_k converges to 1; under causal sampling too (one "
        "individual, one true next token).",
        method=f"median over held-out positions of Σ_k P_k, standard and causal ({draws} individuals per position, "
        f"NumPy seed {DRAW_SEED}; the median of each draw's median, its range over draws), before and after {steps} "
        "training steps of the tiny model; converging: the distance from 1 at least halves. The pretrained base is "
        "the calibration study's.",
        figures=f"standard {fmt(before.standard_sum)} → {fmt(after.standard_sum)}; causal {causal(before)} → "
        f"{causal(after)}; closer to 1 after training: {closer}",
        verdict=verdict,
        claims=[
            check(
                "the package's `ovr_prob_sum_median` equals the SciPy median OvR sum (standard, after training)",
                abs(after.package_sum - after.standard_sum) / after.standard_sum,
                "<=",
                1e-6,
            )
        ],
    )


def training_rows(batch: dict, start_difference: float, quick: bool) -> list[LedgerRow]:
    """The rows of this module; ``start_difference`` is the softmax path's largest difference from Qwen's softmax at
    initialization (`claims_initialization.softmax_path_difference`)."""
    steps, draws = (20, 4) if quick else (60, 16)
    before, after = _trained(steps, batch, draws)
    return [
        learned_threshold_row(steps),
        traditional_row(start_difference, before, after, steps),
        ovr_sum_row(before, after, steps),
    ]
