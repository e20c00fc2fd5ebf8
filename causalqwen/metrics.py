r"""Monitoring metrics (math_overview §5, decision D13).

All metrics look at *valid* positions only. For next-token metrics a position $i$ is valid when it and
its target $i+1$ are real tokens (``attention_mask``) and ``labels[i+1] != ignore_index`` -- the same
pairs the loss scores. Predictions come from standard inference (`causalqwen.inference.predict`):
token $\hat k_i = \arg\max_k P_{k,i}$, value $\hat y_i = \mathrm{loc}_{Y_i}$.

| name | definition |
|---|---|
| ``accuracy`` | $\Pr[\hat k_i = x_{i+1}]$ over valid $i$ |
| ``num_precision`` | $TP / \#\{\hat k_i = \langle NUM\rangle\}$; **0 when no ``<NUM>`` is predicted** |
| ``num_recall`` | $TP / \#\{x_{i+1} = \langle NUM\rangle\}$; **0 when there is no ``<NUM>`` target**, flagged by ``num_targets = 0`` |
| ``num_f1`` | $2PR/(P + R)$, 0 when $P + R = 0$ |
| ``reg_mae``, ``reg_mdae`` | mean / median of $|\mathrm{loc}_{Y_i} - v_{i+1}|$ over valid $i$ whose target is ``<NUM>`` (whatever was predicted); 0 with ``reg_count = 0`` when there is none |
| ``U_loc_*``, ``U_scale_*`` | mean, median, std, iqr of every component of $\mathrm{loc}_U$ / $\mathrm{scale}_U$ at real tokens |
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

from .inference import decision_input, predict
from .losses import ovr_probability

__all__ = [
    "next_token_valid_mask",
    "classification_metrics",
    "regression_metrics",
    "distribution_stats",
    "ovr_prob_sums",
    "ovr_prob_sum_median",
    "evaluate_batch",
    "with_log_prefixes",
]


def next_token_valid_mask(labels: Tensor, attention_mask: Tensor | None, ignore_index: int = -100) -> Tensor:
    """``[B, S-1]`` bool: position $i$ and its target $i+1$ are real, and ``labels[i+1]`` is scored."""
    valid = labels[:, 1:] != ignore_index
    if attention_mask is not None:
        real = attention_mask.bool()
        valid = valid & real[:, :-1] & real[:, 1:]
    return valid


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
    return {"reg_mae": float(errors.mean()), "reg_mdae": float(np.median(errors.cpu().numpy())), "reg_count": errors.numel()}


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
    r"""$\sum_k P_{k,i}$ at the positions in ``mask``, ``[N]`` (``loc_S``, ``scale_S`` ``[..., V]``, ``mask`` ``[...]``)."""
    return ovr_probability(loc_S, scale_S, threshold).sum(-1)[mask]  # [N]


def _median(values: Tensor) -> float:
    return float(np.median(values.double().cpu().numpy())) if values.numel() else 0.0


def ovr_prob_sum_median(loc_S: Tensor, scale_S: Tensor, threshold, mask: Tensor) -> float:
    r"""$\mathrm{median}_i \sum_k P_{k,i}$ over the positions in ``mask``; 0.0 if there are none."""
    return _median(ovr_prob_sums(loc_S, scale_S, threshold, mask))


# The largest [rows, S, V] decision tensor `evaluate_batch` forms at once (2^25 floats: 128 MiB in float32).
EVAL_MAX_DECISION_ELEMENTS = 2**25


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

    The rows go through the model a few at a time, so that no ``[rows, S, V]`` decision tensor holds more
    than ``max_decision_elements`` values (at Qwen2.5's $V = 151936$ and $S = 128$ that is one row); the
    per-position quantities are gathered and every metric is computed once over all rows, so the result
    does not depend on the chunking (except through the causal draws, which follow the chunks).
    """
    if isinstance(max_decision_elements, bool) or not isinstance(max_decision_elements, int) or max_decision_elements < 1:
        raise ValueError(f"max_decision_elements must be an int >= 1, got {max_decision_elements!r}")
    config = model.config
    num_rows, length = batch["input_ids"].shape
    rows_per_chunk = max(1, max_decision_elements // (length * config.vocab_size))
    gathered = {name: [] for name in ("predicted", "targets", "predicted_values", "target_values", "loc_U", "scale_U",
                                      "sums", "sums_causal")}
    for start in range(0, num_rows, rows_per_chunk):
        rows = {key: value[start : start + rows_per_chunk] for key, value in batch.items()}
        out = model(rows["input_ids"], numeric_values=rows["numeric_values"], attention_mask=rows["attention_mask"])
        valid = next_token_valid_mask(rows["labels"], rows["attention_mask"], config.ignore_index)  # [b, S-1]
        loc_S, scale_S, loc_Y = out.loc_S[:, :-1], out.scale_S[:, :-1], out.loc_Y[:, :-1]  # [b, S-1, V] x2, [b, S-1]
        predicted, _ = predict(loc_S, scale_S, loc_Y, model.ovr_threshold, config.num_token_id)
        gathered["predicted"].append(predicted[valid])
        gathered["targets"].append(rows["labels"][:, 1:][valid])
        gathered["predicted_values"].append(loc_Y[valid])
        gathered["target_values"].append(rows["numeric_values"][:, 1:][valid])
        real = rows["attention_mask"].bool()  # [b, S]
        gathered["loc_U"].append(out.loc_U[real])  # [n, C]
        gathered["scale_U"].append(out.scale_U[real])
        gathered["sums"].append(ovr_prob_sums(loc_S, scale_S, model.ovr_threshold, valid))
        loc, scale = decision_input("causal", out.loc_U[:, :-1], out.scale_U[:, :-1], model.action.noise_scale, generator=generator)
        causal = model.action.decide(loc, scale)
        gathered["sums_causal"].append(ovr_prob_sums(causal.loc_S, causal.scale_S, model.ovr_threshold, valid))
    flat = {name: torch.cat(parts) for name, parts in gathered.items()}  # every position, in batch order

    targets = flat["targets"]  # [N]
    everywhere = torch.ones_like(targets, dtype=torch.bool)
    metrics = classification_metrics(flat["predicted"], targets, everywhere, config.num_token_id)
    metrics |= regression_metrics(flat["predicted_values"], flat["target_values"], targets == config.num_token_id)
    real = torch.ones(flat["loc_U"].shape[0], dtype=torch.bool)
    metrics |= distribution_stats(flat["loc_U"], real, "U_loc") | distribution_stats(flat["scale_U"], real, "U_scale")
    metrics["ovr_prob_sum_median"] = _median(flat["sums"])
    metrics["ovr_prob_sum_median_causal"] = _median(flat["sums_causal"])
    return metrics


def with_log_prefixes(metrics: dict[str, float]) -> dict[str, float]:
    """Name `evaluate_batch` metrics as logged (D13): ``dist/`` for U statistics and OvR sums, ``eval/`` otherwise."""
    return {(f"dist/{k}" if k.startswith(("U_", "ovr")) else f"eval/{k}"): v for k, v in metrics.items()}
