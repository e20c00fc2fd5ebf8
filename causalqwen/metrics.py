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
| ``ovr_prob_sum_median_causal`` | median over valid $i$ of the mean over $D$ draws of $\sum_k P_k(u_{i,d})$, causal sampling |
| ``ovr_prob_sum_causal_spread`` | median over valid $i$ of the standard deviation ($1/D$) of $\sum_k P_k(u_{i,d})$ over the draws |
| ``ovr_prob_sum_causal_error`` | median over valid $i$ of the mean over the draws of $\lvert\sum_k P_k(u_{i,d}) - 1\rvert$ |
| ``ovr_causal_draws`` | $D$, the individuals $u_{i,d} = \mathrm{loc}_{U_i} + \mathrm{scale}_{U_i} \odot \tan(\pi(\varepsilon_{i,d} - \tfrac12))$ per position |
| ``noise_scale_mean``, ``noise_scale_median`` | mean, median of $\lvert b_{\mathrm{noise}}\rvert$ over its $C$ components |
| ``noise_scale_over_U_scale`` | median $\lvert b_{\mathrm{noise}}\rvert$ over median $\mathrm{scale}_U$ (all components, real tokens) |
| ``bits_per_byte``, ``bytes`` | $-\sum_t \log_2 P(\text{text}_t)$ over the UTF-8 bytes of held-out texts (`evaluate_texts`), and that count |

Counts (``num_predicted``, ``num_targets``, ``reg_count``, ``tokens``) are reported beside the rates,
so that a 0 that means "undefined" can be told from a measured 0. No metric is ever NaN.
A well-calibrated OvR model has $\sum_k P_k \approx 1$: exactly one next token is true; under causal
sampling this should hold for each individual (the reviewed draft's comment). The mean over draws of the causal
sum estimates the standard sum (the standard law is the causal one averaged over $u$, so
$\mathbb E_u[\sum_k P_k(u)] = \sum_k P_k$ exactly); what only the draws show is how far single individuals are from
a sum of 1 (``ovr_prob_sum_causal_error``, ``ovr_prob_sum_causal_spread``). The draws are taken for all positions
at once, one draw after the other, from ``generator`` (or a generator seeded with ``seed``), so the numbers do not
depend on how the positions are split into chunks.
"""  # noqa: E501 -- the table rows above: a Markdown table row is one line

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import cauchy
from .action import ovr_probability
from .inference import draw_uniform
from .likelihood import bits_per_byte
from .losses import next_token_targets
from .regression import answer_figures, answer_positions

__all__ = [
    "training_metrics",
    "TrainerMetrics",
    "classification_metrics",
    "distribution_stats",
    "causal_ovr_sums",
    "draws_generator",
    "DEFAULT_CAUSAL_DRAWS",
    "evaluate_batch",
    "evaluate_texts",
    "noise_statistics",
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
DEFAULT_CAUSAL_DRAWS = 8  # individuals drawn per position for the causal OvR sums
SEED_LIMIT = 2**63  # the causal draws' seed is an int in [0, 2**63)


def noise_statistics(noise_scale: Tensor, scale_U: Tensor) -> dict[str, float]:
    r"""``noise_scale_mean``, ``noise_scale_median``: mean and median of $\lvert b_{\mathrm{noise}}\rvert$
    (``noise_scale`` ``[C]``) over its components; ``noise_scale_over_U_scale``: its median over the median of
    ``scale_U`` ``[..., C]`` (every component of every row given), 0.0 when ``scale_U`` holds no row. A negative or
    NaN ``noise_scale`` (a signed ``b_noise`` passed for its absolute value) is a ``ValueError``."""
    noise = noise_scale.detach().double().cpu().numpy()  # [C]
    if not bool((noise >= 0).all()):
        raise ValueError(
            f"noise_scale must be >= 0 everywhere (it is |b_noise|), found {float(noise[~(noise >= 0)][0]):g}"
        )
    scales = scale_U.detach().double().flatten().cpu().numpy()  # [N * C]
    median_scale = float(np.median(scales)) if scales.size else 0.0
    return {
        "noise_scale_mean": float(noise.mean()),
        "noise_scale_median": float(np.median(noise)),
        "noise_scale_over_U_scale": float(np.median(noise)) / median_scale if median_scale > 0 else 0.0,
    }


def draws_generator(causal_draws, seed, generator: torch.Generator | None) -> torch.Generator:
    """The generator of the causal draws: ``generator``, or one seeded with ``seed``; ``causal_draws`` (an int >= 1)
    and ``seed`` (an int in [0, 2**63)) are checked here, a ``ValueError`` naming the one that is wrong."""
    if isinstance(causal_draws, bool) or not isinstance(causal_draws, int) or causal_draws < 1:
        raise ValueError(f"causal_draws must be an int >= 1, got {causal_draws!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an int from 0 to 2**63 - 1, got {seed!r}")
    return torch.Generator().manual_seed(seed) if generator is None else generator


@torch.no_grad()
def causal_ovr_sums(
    head, loc_U: Tensor, scale_U: Tensor, draws: int, generator: torch.Generator | None = None, rows: int | None = None
) -> Tensor:
    r"""$\sum_k P_k(u_{i,d})$ under causal sampling, ``[D, N]`` in float64: for each of ``draws`` rounds one
    individual $u_{i,d} = \mathrm{loc}_{U_i} + \mathrm{scale}_{U_i} \odot \tan(\pi(\varepsilon_{i,d} - \tfrac12))$
    per position of the law ``[N, C]``, its decision $\mathrm{Cauchy}(u_{i,d}, \lvert b_{\mathrm{noise}}\rvert)$
    (`DecisionHead.decide_step` in ``causal`` mode) and the sum of its $P_k$. Each round draws $\varepsilon$ for all
    $N$ positions at once (``[N, C]``, `causalqwen.inference.draw_uniform` on the generator's device), before the
    decisions are formed ``rows`` positions at a time: the result does not depend on ``rows``."""
    rows = max(1, loc_U.shape[0]) if rows is None else rows
    for name, value in (("draws", draws), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    device = generator.device if generator is not None else torch.device("cpu")
    sums = torch.empty(draws, loc_U.shape[0], dtype=torch.float64, device=loc_U.device)  # [D, N]
    for draw in range(draws):
        uniform = draw_uniform(loc_U.shape, generator=generator, device=device).to(loc_U.device)  # [N, C]
        for start in range(0, loc_U.shape[0], rows):
            part = slice(start, start + rows)
            with cauchy.validation(False):  # the model's own law of U; the draws lie inside (0, 1)
                decision, _, _ = head.decide_step("causal", loc_U[part], scale_U[part], uniform=uniform[part])
                sums[draw, part] = head.probabilities(decision).double().sum(-1)  # [n]
    return sums


@torch.no_grad()
def position_statistics(
    head,
    loc_U: Tensor,
    scale_U: Tensor,
    generator: torch.Generator | None = None,
    max_decision_elements: int = EVAL_MAX_DECISION_ELEMENTS,
    causal_draws: int = DEFAULT_CAUSAL_DRAWS,
) -> dict:
    r"""Per-position quantities from the law of $U$ ``[N, C]``, a few positions at a time, so that no ``[n, V]``
    decision tensor holds more than ``max_decision_elements`` values: the prediction, $\mathrm{loc}_Y$, and
    $\sum_k P_k$ under standard inference; with ``causal_draws`` $= D \ge 1$ the causal sums of `causal_ovr_sums`
    summarised per position: their mean, their standard deviation ($1/D$) and the mean of $\lvert\cdot - 1\rvert$
    over the draws; and $\mathrm{scale}_Y$ for the answers' figures. Each ``[N]``."""
    rows = max(1, max_decision_elements // head.classification_head.weight.shape[0])
    parts = {name: [] for name in ("predicted", "loc_Y", "scale_Y", "sums")}
    for start in range(0, loc_U.shape[0], rows):
        loc, scale = loc_U[start : start + rows], scale_U[start : start + rows]  # [n, C]
        with cauchy.validation(False):  # the model's own law of U
            decision = head(loc, scale)  # [n, V] x2, [n] x2
            parts["predicted"].append(head.predict(decision)[0])
            parts["loc_Y"].append(decision.loc_Y)
            parts["scale_Y"].append(decision.scale_Y)
            parts["sums"].append(head.probabilities(decision).sum(-1))
    stats = {name: torch.cat(values) for name, values in parts.items()}
    if causal_draws > 0:
        sums = causal_ovr_sums(head, loc_U, scale_U, causal_draws, generator, rows)  # [D, N]
        stats["sums_causal"] = sums.mean(0)  # [N]
        stats["sums_causal_spread"] = sums.std(0, correction=0)  # [N]
        stats["sums_causal_error"] = (sums - 1).abs().mean(0)  # [N]
    return stats


@torch.no_grad()
def evaluate_batch(
    model,
    batch: dict[str, Tensor],
    generator: torch.Generator | None = None,
    *,
    max_decision_elements: int = EVAL_MAX_DECISION_ELEMENTS,
    causal_draws: int = DEFAULT_CAUSAL_DRAWS,
    seed: int = 0,
) -> dict[str, float]:
    """Every ``eval/*`` and ``dist/*`` metric of D13 on one batch (``input_ids``, ``numeric_values``,
    ``attention_mask``, ``labels``), by standard inference; the causal OvR sums average ``causal_draws``
    individuals per position drawn from ``generator``, or, without one, from a generator seeded with ``seed`` (so
    that two calls give the same numbers).

    The model runs once on the batch and forms the law of $U$ only; the decisions are formed for the
    scored positions a few at a time (`position_statistics`), so no decision tensor holds more than
    ``max_decision_elements`` values. The result does not depend on that chunking, the causal draws included
    (`causal_ovr_sums`).
    """
    if (
        isinstance(max_decision_elements, bool)
        or not isinstance(max_decision_elements, int)
        or max_decision_elements < 1
    ):
        raise ValueError(f"max_decision_elements must be an int >= 1, got {max_decision_elements!r}")
    generator = draws_generator(causal_draws, seed, generator)
    config, head = model.config, model.action
    law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    targets = head.next_token_targets(batch["labels"], batch["numeric_values"], batch["attention_mask"])
    stats = position_statistics(
        head, law.loc_U[targets.scored], law.scale_U[targets.scored], generator, max_decision_elements, causal_draws
    )
    real = batch["attention_mask"].bool()  # [B, S]
    reads = answer_reading_positions(batch["labels"], batch["attention_mask"], config.num_token_id, head.ignore_index)
    metrics = _metrics(config.num_token_id, stats, targets, law.loc_U[real], law.scale_U[real], reads)
    return metrics | _noise_and_draws(head, law.scale_U[real], causal_draws)


def answer_reading_positions(labels: Tensor, attention_mask: Tensor, num_token_id: int, ignore_index: int) -> Tensor:
    """``[B, S]``, True at the position that reads each row's answer (`causalqwen.regression.answer_positions`,
    one position before it)."""
    answers = answer_positions(labels, attention_mask, num_token_id, ignore_index)  # [B]
    reads = torch.zeros(labels.shape, dtype=torch.bool, device=labels.device)
    rows = torch.nonzero(answers >= 0).squeeze(-1)
    reads[rows, answers[rows] - 1] = True
    return reads


def _noise_and_draws(head, scale_U: Tensor, causal_draws: int) -> dict[str, float]:
    """`noise_statistics` of ``head`` against ``scale_U`` ``[N, C]``, and the number of causal draws."""
    return noise_statistics(head.noise_scale, scale_U) | {"ovr_causal_draws": causal_draws}


def _metrics(num_token_id: int, stats: dict, targets, loc_U: Tensor, scale_U: Tensor, reads: Tensor) -> dict:
    """The metrics of D13 from `position_statistics` at the scored positions of ``targets`` (in order) and the
    law of $U$ ``[N, C]`` at real tokens; with answers (``reads`` ``[B, S]``: where they are read), their figures
    (`causalqwen.regression.answer_figures`)."""
    labels = targets.labels[targets.scored]  # [N]
    everywhere = torch.ones_like(labels, dtype=torch.bool)
    metrics = classification_metrics(stats["predicted"], labels, everywhere, num_token_id)
    metrics |= regression_metrics(stats["loc_Y"], targets.values[targets.scored], labels == num_token_id)
    real = torch.ones(loc_U.shape[:-1], dtype=torch.bool, device=loc_U.device)
    metrics |= distribution_stats(loc_U, real, "U_loc") | distribution_stats(scale_U, real, "U_scale")
    metrics["ovr_prob_sum_median"] = _median(stats["sums"])
    metrics["ovr_prob_sum_median_causal"] = _median(stats["sums_causal"])
    metrics["ovr_prob_sum_causal_spread"] = _median(stats["sums_causal_spread"])
    metrics["ovr_prob_sum_causal_error"] = _median(stats["sums_causal_error"])
    answers = reads[targets.scored]  # [N]: the scored positions that read an answer
    if bool(answers.any()):
        values = targets.values[targets.scored][answers]
        metrics |= answer_figures(values, stats["loc_Y"][answers], stats["scale_Y"][answers])
    return metrics


# the per-position columns `TrainerMetrics` keeps, in order (then the numeric label, loc_U, scale_U)
PER_POSITION = ("predicted", "loc_Y", "scale_Y", "sums", "sums_causal", "sums_causal_spread", "sums_causal_error")


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
    ``TrainingArguments(label_names=["labels", "numeric_labels"])``. It keeps per position ``[B, S, 8 + 2C]``: the
    prediction, $\mathrm{loc}_Y$, $\mathrm{scale}_Y$, the standard OvR sum and the three causal ones (mean, spread,
    error) at scored positions (`position_statistics`), the numeric label, then $\mathrm{loc}_U$ and
    $\mathrm{scale}_U$, not the ``[B, S, V]`` decisions. Trainer concatenates the batches (padding with -100), and
    `compute_metrics` forms the metrics from them.
    On one batch they equal `evaluate_batch` with the same generator and ``causal_draws``;
    without a generator, one seeded with ``seed`` is made once, and each evaluation draws on from it.

    Trainer hands over no attention mask, so the labels stand for it: a position is scored when the next
    position's label is not ``ignore_index`` (D9's rule for batches padded on the right with ignored labels, as
    `causalqwen.files.data.collate` makes them), and the statistics of $U$ pool the positions whose own label is not
    ignored. A row whose first label is ignored is a prompt–completion row, and its answer's figures are reported
    (`causalqwen.regression.answer_positions`).
    """

    def __init__(
        self,
        model,
        generator: torch.Generator | None = None,
        max_decision_elements: int = EVAL_MAX_DECISION_ELEMENTS,
        *,
        causal_draws: int = DEFAULT_CAUSAL_DRAWS,
        seed: int = 0,
    ):
        self.model = model
        self.generator = draws_generator(causal_draws, seed, generator)
        self.max_decision_elements = max_decision_elements
        self.causal_draws = causal_draws

    @torch.no_grad()
    def preprocess_logits_for_metrics(self, outputs, labels) -> Tensor:
        r"""``[B, S, 8 + 2C]`` from one batch: prediction, $\mathrm{loc}_Y$, $\mathrm{scale}_Y$, OvR sum (standard;
        causal mean, spread, error) at scored positions (0 elsewhere), the numeric label, then $\mathrm{loc}_U$,
        $\mathrm{scale}_U$."""
        loc_U, scale_U = outputs[0], outputs[1]  # [B, S, C] each
        labels, numeric_labels = _label_pair(labels, outputs)
        head = self.model.action
        scored = head.next_token_targets(labels, numeric_labels, None).scored  # [B, S]
        stats = position_statistics(
            head, loc_U[scored], scale_U[scored], self.generator, self.max_decision_elements, self.causal_draws
        )
        columns = len(PER_POSITION) + 1
        per_position = torch.zeros(*scored.shape, columns, device=loc_U.device)  # [B, S, 8], float32: ids < 2^24 exact
        per_position[scored, :-1] = torch.stack([stats[name].float() for name in PER_POSITION], -1)
        if numeric_labels is not None:
            per_position[..., -1] = numeric_labels.float()
        return torch.cat([per_position, loc_U.float(), scale_U.float()], dim=-1)  # [B, S, 8 + 2C]

    def compute_metrics(self, prediction) -> dict[str, float]:
        """The metrics of `evaluate_batch` from Trainer's ``EvalPrediction`` of the whole evaluation set."""
        kept = torch.as_tensor(prediction.predictions)  # [N, S, 8 + 2C]
        label_ids = prediction.label_ids
        labels = torch.as_tensor(label_ids[0] if isinstance(label_ids, (tuple, list)) else label_ids)  # [N, S]
        head = self.model.action
        columns = len(PER_POSITION) + 1  # the per-position statistics, then the numeric label
        targets = head.next_token_targets(labels, kept[..., columns - 1], None)
        scored = targets.scored
        stats = {name: kept[..., column][scored] for column, name in enumerate(PER_POSITION)}
        stats["predicted"] = stats["predicted"].round().long()
        causal_size = (kept.shape[-1] - columns) // 2
        labelled = labels != head.ignore_index  # [N, S]
        loc_U = kept[..., columns : columns + causal_size][labelled]  # [M, C]
        scale_U = kept[..., columns + causal_size :][labelled]  # [M, C]
        everywhere = torch.ones_like(labels)  # the labels stand for the mask (the class docstring)
        reads = answer_reading_positions(labels, everywhere, head.num_token_id, head.ignore_index)
        metrics = _metrics(head.num_token_id, stats, targets, loc_U, scale_U, reads)
        return metrics | _noise_and_draws(head, scale_U, self.causal_draws)


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


@torch.no_grad()
def evaluate_texts(model, tokenizer, texts, token_probability: str = "ovr") -> dict[str, float]:
    r"""The evaluation perplexity of held-out ``texts`` in bits per byte, from the likelihood of decision D16
    (`causalqwen.likelihood.bits_per_byte`: every text scored whole, numbers as written), and their UTF-8 bytes.
    Logged as ``eval/bits_per_byte`` and ``eval/bytes`` (`with_log_prefixes`)."""
    value = bits_per_byte(model, tokenizer, texts, token_probability)  # checks texts
    return {"bits_per_byte": value, "bytes": float(sum(len(text.encode("utf-8")) for text in texts))}


def with_log_prefixes(metrics: dict[str, float]) -> dict[str, float]:
    """Name `evaluate_batch` metrics as logged (D13): ``dist/`` for U statistics, OvR sums and the noise, ``eval/``
    otherwise."""
    return {(f"dist/{k}" if k.startswith(("U_", "ovr", "noise")) else f"eval/{k}"): v for k, v in metrics.items()}


@torch.no_grad()
def training_metrics(model, out) -> dict[str, float]:
    r"""The ``train/*`` losses and accuracy of a step, from its forward output (``out.targets``: what each position
    was scored against): the predictions are the standard decision's tokens by the model's loss algorithm
    (`DecisionHead.standard_token`): tile by tile under ``fused``, never from the ``[B, S, V]`` decisions the fused
    loss exists to avoid. Beside them the noise, `noise_statistics` against $\mathrm{scale}_U$ at the step's scored
    positions (``train/noise_scale_mean``, ``_median``, ``train/noise_scale_over_U_scale``)."""
    scored = out.targets.scored  # [B, S]
    with cauchy.validation(False):  # the model's own law of U
        predicted = model.action.standard_token(out.loc_U[scored], out.scale_U[scored])  # [N]
    correct, total = (predicted == out.targets.labels[scored]).sum(), scored.sum()
    return {
        "train/total_loss": out.loss.item(),
        "train/cls_loss_mean": out.cls_loss.item(),
        "train/reg_loss_effective": out.reg_loss.item(),
        "train/accuracy": float(correct) / float(total) if int(total) > 0 else 0.0,
    } | {
        f"train/{name}": value
        for name, value in noise_statistics(model.action.noise_scale, out.scale_U[scored]).items()
    }
