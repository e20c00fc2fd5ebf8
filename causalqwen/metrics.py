r"""Monitoring metrics (decision D13; docs: training.md).

All metrics look at *valid* positions only. For next-token metrics a position $i$ is valid when it and
its target $i+1$ are real tokens (``attention_mask``) and ``labels[i+1] != ignore_index`` -- the same
pairs the loss scores. Predictions come from standard inference (`causalqwen.inference.predict`):
token $\hat k_i = \arg\max_k P_{k,i}$, value $\hat y_i = \mathrm{loc}_{Y_i}$.

| name | definition |
|---|---|
| ``accuracy`` | $\Pr[\hat k_i = x_{i+1}]$ over valid $i$ |
| ``num_precision`` | $TP / \#\{\hat k_i = \langle NUM\rangle\}$; **0 when no ``<NUM>`` is predicted** |
| ``num_recall`` | $TP / \#\{x_{i+1} = \langle NUM\rangle\}$; **0 without a ``<NUM>`` target** (``num_targets = 0``) |
| ``num_f1`` | $2PR/(P + R)$, 0 when $P + R = 0$ |
| ``reg_mae``, ``reg_mdae`` | mean, median $|\mathrm{loc}_{Y_i} - v_{i+1}|$ at ``<NUM>`` targets (0 if there are none) |
| ``U_loc_*``, ``U_scale_*`` | mean, median, std, iqr of $\mathrm{loc}_U$, $\mathrm{scale}_U$ (at real tokens) |
| ``ovr_prob_sum_median`` | median over valid $i$ of $\sum_k P_{k,i}$, under standard inference |
| ``ovr_prob_sum_median_causal`` | the same under causal sampling (one individual $u_i$ per position) |

Counts (``num_predicted``, ``num_targets``, ``reg_count``, ``tokens``) are reported beside the rates,
so that a 0 that means "undefined" can be told from a measured 0. No metric is ever NaN.
A well-calibrated OvR model has $\sum_k P_k \approx 1$: exactly one next token is true; under causal
sampling this should hold for each individual (the reviewed draft's comment).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import cauchy
from .losses import next_token_targets, ovr_probability

__all__ = [
    "training_metrics",
    "TrainerMetrics",
    "classification_metrics",
    "distribution_stats",
    "evaluate_batch",
    "next_token_valid_mask",
    "ovr_prob_sum_median",
    "ovr_prob_sums",
    "regression_metrics",
    "with_log_prefixes",
]


def next_token_valid_mask(labels: Tensor, attention_mask: Tensor | None, ignore_index: int = -100) -> Tensor:
    """``[B, S-1]`` bool: position $i$ and its target $i+1$ are real, and ``labels[i+1]`` is scored.

    The rule itself is `DecisionHead.next_token_targets`; this is it for a caller without a model."""
    return next_token_targets(labels, None, attention_mask, ignore_index).scored[:, :-1]


def _rate(numerator: Tensor, denominator: Tensor) -> float:
    return float(numerator) / float(denominator) if int(denominator) > 0 else 0.0


def classification_metrics(predicted: Tensor, targets: Tensor, valid: Tensor, num_token_id: int) -> dict[str, float]:
    """Accuracy and ``<NUM>`` precision / recall / F1 of ``predicted`` against ``targets`` at ``valid``."""
    tokens = valid.sum()
    predicted_num = (predicted == num_token_id) & valid
    target_num = (targets == num_token_id) & valid
    true_positive = (predicted_num & target_num).sum()
    precision = _rate(true_positive, predicted_num.sum())
    recall = _rate(true_positive, target_num.sum())
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {
        "accuracy": _rate(((predicted == targets) & valid).sum(), tokens),
        "num_precision": precision,
        "num_recall": recall,
        "num_f1": f1,
        "num_predicted": int(predicted_num.sum()),
        "num_targets": int(target_num.sum()),
        "tokens": int(tokens),
    }


def regression_metrics(predicted_values: Tensor, target_values: Tensor, num_mask: Tensor) -> dict[str, float]:
    r"""MAE and MdAE of $|\hat y - y|$ at ``num_mask``; 0 with ``reg_count = 0`` when the mask is empty."""
    errors = (predicted_values.double() - target_values.double()).abs()[num_mask]
    if errors.numel() == 0:
        return {"reg_mae": 0.0, "reg_mdae": 0.0, "reg_count": 0}
    return {
        "reg_mae": float(errors.mean()),
        "reg_mdae": float(np.median(errors.cpu().numpy())),
        "reg_count": errors.numel(),
    }


def distribution_stats(values: Tensor, mask: Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}_mean, _median, _std, _iqr`` of ``values[mask]`` (all trailing components pooled)."""
    selected = values[mask].detach().double().flatten().cpu().numpy()
    if selected.size == 0:
        return {f"{prefix}_{name}": 0.0 for name in ("mean", "median", "std", "iqr")}
    q25, median, q75 = np.percentile(selected, [25, 50, 75])
    return {
        f"{prefix}_mean": float(selected.mean()),
        f"{prefix}_median": float(median),
        f"{prefix}_std": float(selected.std()),
        f"{prefix}_iqr": float(q75 - q25),
    }


def ovr_prob_sums(loc_S: Tensor, scale_S: Tensor, threshold, mask: Tensor) -> Tensor:
    r"""$\sum_k P_{k,i}$ at the positions in ``mask``, ``[N]`` (``loc_S``, ``scale_S`` ``[..., V]``, ``mask``
    ``[...]``)."""
    return ovr_probability(loc_S, scale_S, threshold).sum(-1)[mask]  # [N]


def _median(values: Tensor) -> float:
    return float(np.median(values.double().cpu().numpy())) if values.numel() else 0.0


def ovr_prob_sum_median(loc_S: Tensor, scale_S: Tensor, threshold, mask: Tensor) -> float:
    r"""$\mathrm{median}_i \sum_k P_{k,i}$ over the positions in ``mask``; 0.0 if there are none."""
    return _median(ovr_prob_sums(loc_S, scale_S, threshold, mask))


# The largest [positions, V] decision tensor `evaluate_batch` forms at once (2^25 floats: 128 MiB in float32).
EVAL_MAX_DECISION_ELEMENTS = 2**25


@torch.no_grad()
def position_statistics(
    head,
    loc_U: Tensor,
    scale_U: Tensor,
    generator: torch.Generator | None = None,
    max_decision_elements: int = EVAL_MAX_DECISION_ELEMENTS,
    causal_sums: bool = True,
) -> dict:
    r"""Per-position quantities from the law of $U$ ``[N, C]``, a few positions at a time, so that no ``[n, V]``
    decision tensor holds more than ``max_decision_elements`` values: the prediction, $\mathrm{loc}_Y$, and
    $\sum_k P_k$ under standard inference and (with ``causal_sums``) under causal sampling. Each ``[N]``."""
    rows = max(1, max_decision_elements // head.classification_head.weight.shape[0])
    parts = {name: [] for name in ("predicted", "loc_Y", "sums", "sums_causal")}
    for start in range(0, loc_U.shape[0], rows):
        loc, scale = loc_U[start : start + rows], scale_U[start : start + rows]  # [n, C]
        with cauchy.validation(False):  # the model's own law of U
            decision = head(loc, scale)  # [n, V] x2, [n] x2
            parts["predicted"].append(head.predict(decision)[0])
            parts["loc_Y"].append(decision.loc_Y)
            parts["sums"].append(head.probabilities(decision).sum(-1))
            if causal_sums:  # one individual u_i per position (causal mode, D11)
                causal, _, _ = head.decide_step("causal", loc, scale, generator=generator)  # [n, V] x2, [n] x2
                parts["sums_causal"].append(head.probabilities(causal).sum(-1))
    return {name: torch.cat(values) for name, values in parts.items() if values}


@torch.no_grad()
def evaluate_batch(
    model,
    batch: dict[str, Tensor],
    generator: torch.Generator | None = None,
    *,
    max_decision_elements: int = EVAL_MAX_DECISION_ELEMENTS,
) -> dict[str, float]:
    """Every ``eval/*`` and ``dist/*`` metric of D13 on one batch (``input_ids``, ``numeric_values``,
    ``attention_mask``, ``labels``), by standard inference; the causal OvR sum draws from ``generator``.

    The model runs once on the batch and forms the law of $U$ only; the decisions are formed for the
    scored positions a few at a time (`position_statistics`), so no decision tensor holds more than
    ``max_decision_elements`` values. The result does not depend on that chunking (except through the
    causal draws, which follow the chunks).
    """
    if (
        isinstance(max_decision_elements, bool)
        or not isinstance(max_decision_elements, int)
        or max_decision_elements < 1
    ):
        raise ValueError(f"max_decision_elements must be an int >= 1, got {max_decision_elements!r}")
    config, head = model.config, model.action
    law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    targets = head.next_token_targets(batch["labels"], batch["numeric_values"], batch["attention_mask"])
    stats = position_statistics(
        head, law.loc_U[targets.scored], law.scale_U[targets.scored], generator, max_decision_elements
    )
    real = batch["attention_mask"].bool()  # [B, S]
    return _metrics(config.num_token_id, stats, targets, law.loc_U[real], law.scale_U[real])


def _metrics(num_token_id: int, stats: dict, targets, loc_U: Tensor, scale_U: Tensor) -> dict[str, float]:
    """The metrics of D13 from `position_statistics` at the scored positions of ``targets`` (in order) and the
    law of $U$ ``[N, C]`` at real tokens."""
    labels = targets.labels[targets.scored]  # [N]
    everywhere = torch.ones_like(labels, dtype=torch.bool)
    metrics = classification_metrics(stats["predicted"], labels, everywhere, num_token_id)
    metrics |= regression_metrics(stats["loc_Y"], targets.values[targets.scored], labels == num_token_id)
    real = torch.ones(loc_U.shape[:-1], dtype=torch.bool, device=loc_U.device)
    metrics |= distribution_stats(loc_U, real, "U_loc") | distribution_stats(scale_U, real, "U_scale")
    metrics["ovr_prob_sum_median"] = _median(stats["sums"])
    metrics["ovr_prob_sum_median_causal"] = _median(stats["sums_causal"])
    return metrics


class TrainerMetrics:
    r"""The metrics of `evaluate_batch` over a whole evaluation set, for `transformers.Trainer`::

        metrics = TrainerMetrics(model, generator=torch.Generator().manual_seed(0))
        Trainer(model, args, eval_dataset=..., data_collator=..., compute_metrics=metrics.compute_metrics,
                preprocess_logits_for_metrics=metrics.preprocess_logits_for_metrics)

    Any collator whose batches hold ``labels`` will do: transformers' ``default_data_collator`` on rows of
    ``input_ids``, ``numeric_values``, ``attention_mask``, ``labels``, or `causalqwen.files.data.collate`.
    Trainer passes `preprocess_logits_for_metrics` each evaluation batch's outputs -- ``(loc_U, scale_U, loc_Y,
    scale_Y, numeric_labels)``, since `CausalQwenConfig.keys_to_ignore_at_inference` leaves out the losses, counts,
    cache and ``[B, S, V]`` decisions -- and its labels: ``labels`` (Trainer's label names are ``["labels"]``,
    `causalqwen.integrations.trainer`), or the pair ``(labels, numeric_labels)`` with
    ``TrainingArguments(label_names=["labels", "numeric_labels"])``. It keeps per position ``[B, S, 5 + 2C]``: the
    prediction, $\mathrm{loc}_Y$ and the two OvR sums at scored positions (`position_statistics`), the numeric
    label, then $\mathrm{loc}_U$ and $\mathrm{scale}_U$, not the ``[B, S, V]`` decisions. Trainer concatenates the
    batches (padding with -100), and `compute_metrics` forms the metrics from them. On one batch they equal
    `evaluate_batch` with the same generator.

    Trainer hands over no attention mask, so the labels stand for it: a position is scored when the next
    position's label is not ``ignore_index`` (D9's rule for batches padded on the right with ignored labels, as
    `causalqwen.files.data.collate` makes them), and the statistics of $U$ pool the positions whose own label is not
    ignored.
    """

    def __init__(
        self, model, generator: torch.Generator | None = None, max_decision_elements: int = EVAL_MAX_DECISION_ELEMENTS
    ):
        self.model = model
        self.generator = generator
        self.max_decision_elements = max_decision_elements

    @torch.no_grad()
    def preprocess_logits_for_metrics(self, outputs, labels) -> Tensor:
        r"""``[B, S, 5 + 2C]`` from one batch: prediction, $\mathrm{loc}_Y$, OvR sum (standard, causal) at
        scored positions (0 elsewhere), the numeric label, then $\mathrm{loc}_U$, $\mathrm{scale}_U$."""
        loc_U, scale_U = outputs[0], outputs[1]  # [B, S, C] each
        labels, numeric_labels = _label_pair(labels, outputs)
        head = self.model.action
        scored = head.next_token_targets(labels, numeric_labels, None).scored  # [B, S]
        stats = position_statistics(head, loc_U[scored], scale_U[scored], self.generator, self.max_decision_elements)
        per_position = torch.zeros(*scored.shape, 5, device=loc_U.device)  # [B, S, 5], float32: ids < 2^24 exact
        per_position[scored, :4] = torch.stack(
            [stats[name].float() for name in ("predicted", "loc_Y", "sums", "sums_causal")], -1
        )
        if numeric_labels is not None:
            per_position[..., 4] = numeric_labels.float()
        return torch.cat([per_position, loc_U.float(), scale_U.float()], dim=-1)  # [B, S, 5 + 2C]

    def compute_metrics(self, prediction) -> dict[str, float]:
        """The metrics of `evaluate_batch` from Trainer's ``EvalPrediction`` of the whole evaluation set."""
        kept = torch.as_tensor(prediction.predictions)  # [N, S, 5 + 2C]
        label_ids = prediction.label_ids
        labels = torch.as_tensor(label_ids[0] if isinstance(label_ids, (tuple, list)) else label_ids)  # [N, S]
        head = self.model.action
        targets = head.next_token_targets(labels, kept[..., 4], None)
        scored = targets.scored
        stats = {
            "predicted": kept[..., 0][scored].round().long(),
            "loc_Y": kept[..., 1][scored],
            "sums": kept[..., 2][scored],
            "sums_causal": kept[..., 3][scored],
        }
        causal_size = (kept.shape[-1] - 5) // 2
        labelled = labels != head.ignore_index  # [N, S]
        loc_U, scale_U = kept[..., 5 : 5 + causal_size][labelled], kept[..., 5 + causal_size :][labelled]
        return _metrics(head.num_token_id, stats, targets, loc_U, scale_U)


def _label_pair(labels, outputs) -> tuple:
    """``(labels, numeric_labels)`` from what Trainer passes: ``labels`` alone, the numeric labels then being the
    model's output ``numeric_labels`` (its fifth gathered output; None without numeric values), or the pair of
    label columns."""
    if isinstance(labels, torch.Tensor):
        return labels, outputs[4] if len(outputs) > 4 else None
    if isinstance(labels, (tuple, list)) and len(labels) == 2:
        return labels[0], labels[1]
    raise ValueError(
        "TrainerMetrics needs the batches' labels: Trainer's label names must be [\"labels\"] (the "
        'default) or ["labels", "numeric_labels"]; got ' + f"{type(labels).__name__}"
    )


def with_log_prefixes(metrics: dict[str, float]) -> dict[str, float]:
    """Name `evaluate_batch` metrics as logged (D13): ``dist/`` for U statistics and OvR sums, ``eval/`` otherwise."""
    return {(f"dist/{k}" if k.startswith(("U_", "ovr")) else f"eval/{k}"): v for k, v in metrics.items()}


@torch.no_grad()
def training_metrics(model, out) -> dict[str, float]:
    """The ``train/*`` losses and accuracy of a step, from its forward output (``out.targets``: what each position
    was scored against): the predictions are the standard decision's tokens by the model's loss algorithm
    (`DecisionHead.standard_token`): tile by tile under ``fused``, never from the ``[B, S, V]`` decisions the fused
    loss exists to avoid."""
    scored = out.targets.scored  # [B, S]
    with cauchy.validation(False):  # the model's own law of U
        predicted = model.action.standard_token(out.loc_U[scored], out.scale_U[scored])  # [N]
    correct, total = (predicted == out.targets.labels[scored]).sum(), scored.sum()
    return {
        "train/total_loss": out.loss.item(),
        "train/cls_loss_mean": out.cls_loss.item(),
        "train/reg_loss_effective": out.reg_loss.item(),
        "train/accuracy": float(correct) / float(total) if int(total) > 0 else 0.0,
    }
