r"""Losses (decisions D8–D9): One-vs-Rest classification, gated Cauchy regression, and their total.

Every class $k$ has its own Cauchy decision score $S_k \sim \mathrm{Cauchy}(\mathrm{loc}_{S_k}, \mathrm{scale}_{S_k})$
and is "on" when the score clears its threshold $C_k$:

$$P_k = P(S_k > C_k) = \frac12 + \frac1\pi \arctan\frac{\mathrm{loc}_{S_k} - C_k}{\mathrm{scale}_{S_k}}.$$

Each class is a separate binary decision, so the classification loss is a sum of $V$ binary
cross-entropies, evaluated entirely in log space with the one tail kernel `cauchy.tail_terms`
(decision D8; no ``eps`` inside a logarithm):
$-\log(1 - P_k) = a(d_k, s_k)$ and $-\log P_k = a(-d_k, s_k)$ with $d_k = \mathrm{loc}_{S_k} - C_k$.

This module is the *literal* path: it takes the full ``[..., V]`` tensors. `causalqwen.kernels.fused` computes
the same classification loss tile by tile, and `fused_total_loss` assembles the same total from it.
Labels here are already aligned with positions; the next-token shift is `DecisionHead.next_token_targets`.

Two kinds of function, one of each per job:

| job | the door (checks its arguments) | the trusted form (the decision head's, inputs checked once) |
|---|---|---|
| $P_k$, $\log P_k$, $\log(1 - P_k)$ | `ovr_probability`, `ovr_log_probability` | `ovr_tail_nll` |
| $L_{\mathrm{cls}}$ per position | `ovr_classification_loss` | (inside the totals) |
| $\mathrm{gate}\cdot\mathrm{nll}$ | `gated_regression_loss` | (inside the totals) |
| $L$ from the decisions ``[..., V]`` | `total_loss` | `total_from_decisions` |
| $L$ from the law of $U$, tiled | `fused_total_loss` | `total_from_law_of_U` |

The gate's $P_{\langle NUM\rangle}$ is `causalqwen.action.num_probability`, the same for both totals.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from . import cauchy
from .action import ActionOutput, check_law, num_probability
from .checks.values import as_bool_mask, check_labels, check_threshold
from .kernels.fused import (
    HeadInputs,
    Tiling,
    default_tiling,
    fused_ovr_classification_loss,
    tiled_ovr_loss,
)

__all__ = [
    "ovr_probability",
    "ovr_log_probability",
    "ovr_classification_loss",
    "gated_regression_loss",
    "total_loss",
    "fused_total_loss",
    "ovr_tail_nll",
    "total_from_decisions",
    "total_from_law_of_U",
    "LossParts",
    "LossSettings",
    "at_least_float32",
    "fused_ovr_classification_loss",
]


def at_least_float32(t: Tensor) -> Tensor:
    """Losses are computed in float32 (or float64) even for a bf16/fp16 model."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def ovr_probability(loc_S, scale_S, threshold) -> Tensor:
    r"""One-vs-Rest probability $P_k = P(S_k > C_k)$, the Cauchy survival function at the threshold.

    ``threshold`` is a number, a 0-d tensor, or a per-class tensor of shape ``[V]``. Same shape as ``loc_S``.
    """
    check_threshold(threshold, loc_S.shape[-1])
    return cauchy.sf(threshold, loc_S, scale_S)


def ovr_log_probability(loc_S, scale_S, threshold) -> tuple[Tensor, Tensor]:
    r"""$(\log P_k,\ \log(1 - P_k))$ computed without cancellation: $(-a(-d, s),\ -a(d, s))$ with the tail
    kernel $a$ (`cauchy.tail_terms`), $d = \mathrm{loc}_S - C$, $s = \mathrm{scale}_S$."""
    check_threshold(threshold, loc_S.shape[-1])
    cauchy.check_arguments(threshold, loc_S, scale_S)
    on, off = ovr_tail_nll(loc_S, scale_S, threshold)
    return -on, -off


def ovr_tail_nll(loc_S: Tensor, scale_S: Tensor, threshold, *, off: bool = True) -> tuple[Tensor, Tensor | None]:
    r"""$(-\log P_k,\ -\log(1 - P_k)) = (a(-d, s),\ a(d, s))$, unchecked; both ``[..., V]`` (the second only with ``off``)."""
    diff, scale = torch.broadcast_tensors(loc_S - threshold, scale_S)  # d = loc_S - C
    return cauchy.tail_nll(-diff, scale), (cauchy.tail_nll(diff, scale) if off else None)


def _ovr_loss(loc_S: Tensor, scale_S: Tensor, labels: Tensor, scored: Tensor, threshold) -> Tensor:
    r"""$\sum_k$ of $-\log P_k$ at the label and $-\log(1 - P_k)$ elsewhere, per position; 0 where not ``scored``."""
    on, off = ovr_tail_nll(loc_S, scale_S, threshold)  # [..., V] each
    target = labels.masked_fill(~scored, 0)  # any class index; these rows are zeroed below
    is_target = torch.arange(loc_S.shape[-1], device=labels.device) == target.unsqueeze(-1)  # [..., V]
    loss = torch.where(is_target, on, off).sum(-1)  # [...]
    return torch.where(scored, loss, torch.zeros_like(loss))


def ovr_classification_loss(loc_S, scale_S, labels, threshold, ignore_index: int = -100) -> Tensor:
    r"""Per-position OvR loss $L_{\mathrm{cls}} = -\sum_k \big[y_k \log P_k + (1 - y_k)\log(1 - P_k)\big]$.

    $y$ is the one-hot of the label. Shapes: ``loc_S``, ``scale_S`` ``[..., V]``, ``labels`` ``[...]``;
    result ``[...]``, exactly 0 where ``labels == ignore_index``.
    """
    if labels.shape != loc_S.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal loc_S shape without its last dim {tuple(loc_S.shape[:-1])}")
    scored = check_labels(labels, loc_S.shape[-1], ignore_index)
    check_threshold(threshold, loc_S.shape[-1])
    cauchy.check_arguments(threshold, loc_S, scale_S)
    return _ovr_loss(loc_S, scale_S, labels, scored, threshold)


def gated_regression_loss(loc_Y, scale_Y, targets, p_num, num_mask, alpha: float = 0.0) -> Tensor:
    r"""Gated Cauchy regression loss $\mathrm{gate}_i \cdot \mathrm{nll}_i$ (decision D9).

    $$\mathrm{nll}_i = \log(\pi\,\mathrm{scale}_{Y_i}) + \log\Big(1 + \big(\tfrac{y_i - \mathrm{loc}_{Y_i}}{\mathrm{scale}_{Y_i}}\big)^2\Big),
    \qquad \mathrm{gate}_i = m_i\,\big(\alpha + (1 - \alpha)\,P_{\langle NUM\rangle, i}\big).$$

    ``num_mask`` ($m$) is a boolean (or 0/1) tensor; the result is exactly 0 where it is off.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (gate_alpha) must lie in [0, 1], got {alpha}")
    cauchy.check_scale(scale_Y)
    return _gated_regression(loc_Y, scale_Y, targets, p_num, as_bool_mask(num_mask, "num_mask"), alpha)


def _gated_regression(loc_Y, scale_Y, targets, p_num, num_mask, alpha: float) -> Tensor:
    gated = (alpha + (1.0 - alpha) * p_num) * cauchy.nll(targets, loc_Y, scale_Y)
    return torch.where(num_mask, gated, torch.zeros_like(gated))


class LossSettings(NamedTuple):
    """What the total loss needs besides the tensors: owned by the decision head and the config."""

    num_token_id: int
    threshold: float | Tensor = 100.0
    ignore_index: int = -100
    regression_weight: float = 1.0
    gate_alpha: float = 0.0
    detach_gate: bool = False


class LossParts(NamedTuple):
    """The total loss and its parts. ``n_cls`` / ``n_reg`` count the scored / regression positions.

    ``cls_loss`` (per position) is None on the fused path, which only forms the sum."""

    total: Tensor
    cls_loss_mean: Tensor
    reg_loss_effective: Tensor
    n_cls: Tensor
    n_reg: Tensor
    cls_loss: Tensor | None  # [...] per position
    reg_loss: Tensor  # [...] per position (gated)


def _check_settings(settings: LossSettings, num_classes: int) -> None:
    r"""$C$ finite, the ``<NUM>`` id a class, $\lambda \ge 0$ finite and $\alpha \in [0, 1]$."""
    check_threshold(settings.threshold, num_classes)
    if not 0 <= settings.num_token_id < num_classes:
        raise ValueError(f"num_token_id={settings.num_token_id} is not a class index in [0, {num_classes})")
    if not (math.isfinite(float(settings.regression_weight)) and float(settings.regression_weight) >= 0):
        raise ValueError(f"regression_weight (lambda) must be a finite number >= 0, got {settings.regression_weight}")
    if not 0.0 <= settings.gate_alpha <= 1.0:
        raise ValueError(f"alpha (gate_alpha) must lie in [0, 1], got {settings.gate_alpha}")


def _loss_masks(labels, num_classes, numeric_targets, loc_Y, attention_mask, settings: LossSettings):
    """Check shapes, targets and labels at the door; return the scored positions ``valid``."""
    shapes = {"loc_Y": loc_Y.shape, "numeric_targets": numeric_targets.shape}
    if attention_mask is not None:
        shapes["attention_mask"] = attention_mask.shape
    for name, shape in shapes.items():
        if shape != labels.shape:
            raise ValueError(f"{name} shape {tuple(shape)} must equal labels shape {tuple(labels.shape)}")
    _check_settings(settings, num_classes)
    if not bool(torch.isfinite(numeric_targets).all()):  # even where unscored: its NaN gradient would reach loc_Y
        where = tuple((~torch.isfinite(numeric_targets)).nonzero()[0].tolist())
        raise ValueError(f"numeric_targets must be finite: found {numeric_targets[where].item()} at position {list(where)}")
    valid = check_labels(labels, num_classes, settings.ignore_index)
    if attention_mask is not None:
        valid = valid & as_bool_mask(attention_mask, "attention_mask")
    return valid


def _total(cls_loss_sum: Tensor, cls_loss: Tensor | None, num_decision: ActionOutput, labels: Tensor,
           numeric_targets: Tensor, *, scored: Tensor, settings: LossSettings) -> LossParts:
    r"""$L = \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg,eff}}$ from $\sum_i L_{\mathrm{cls},i}$ and ``num_decision``: the
    law of $S_{\langle NUM\rangle}$ (``loc_S``, ``scale_S``) and of $Y$, all ``[...]``, in at least float32."""
    n_cls = scored.sum()
    cls_loss_mean = cls_loss_sum / n_cls.clamp(min=1)
    p_num = num_probability(num_decision.loc_S, num_decision.scale_S, settings.threshold, settings.num_token_id)  # [...]
    if settings.detach_gate:
        p_num = p_num.detach()
    num_mask = scored & (labels == settings.num_token_id)  # [...]
    reg_loss = _gated_regression(num_decision.loc_Y, num_decision.scale_Y, numeric_targets, p_num, num_mask,
                                 settings.gate_alpha)  # [...]
    n_reg = num_mask.sum()
    reg_loss_effective = reg_loss.sum() / n_reg.clamp(min=1)
    return LossParts(
        total=cls_loss_mean + settings.regression_weight * reg_loss_effective,
        cls_loss_mean=cls_loss_mean,
        reg_loss_effective=reg_loss_effective,
        n_cls=n_cls,
        n_reg=n_reg,
        cls_loss=cls_loss,
        reg_loss=reg_loss,
    )


def total_from_decisions(decision: ActionOutput, labels: Tensor, numeric_targets: Tensor, *, scored: Tensor,
                         settings: LossSettings) -> LossParts:
    """`total_loss` on checked inputs: ``scored`` ``[...]`` marks the positions scored (labels elsewhere are ignored)."""
    loc_S, scale_S, loc_Y, scale_Y = (at_least_float32(t) for t in decision)  # [..., V] x2, [...] x2
    cls_loss = _ovr_loss(loc_S, scale_S, labels, scored, settings.threshold)  # [...]
    k = settings.num_token_id
    num_decision = ActionOutput(loc_S[..., k], scale_S[..., k], loc_Y, scale_Y)  # [...] each
    return _total(cls_loss.sum(), cls_loss, num_decision, labels, numeric_targets, scored=scored, settings=settings)


def total_from_law_of_U(loc_U: Tensor, scale_U: Tensor, action, labels: Tensor, numeric_targets: Tensor, *,
                        scored: Tensor, settings: LossSettings, tiling: Tiling | None = None) -> tuple[LossParts, ActionOutput]:
    """`fused_total_loss` on checked inputs; returns the loss parts and the action's output at ``<NUM>`` alone."""
    head = action.classification_head
    tiling = tiling or default_tiling(loc_U.device, action.scale_eps)
    # the <NUM> column in the action's own dtype (as the literal path forms it), scored in >= float32
    decision = action.standard(loc_U.to(head.weight.dtype), scale_U.to(head.weight.dtype), classes=[settings.num_token_id])
    loc_S_num, scale_S_num, loc_Y, scale_Y = (at_least_float32(t) for t in decision)  # [..., 1] x2, [...] x2
    C = loc_U.shape[-1]
    inputs = HeadInputs(at_least_float32(loc_U).reshape(-1, C), at_least_float32(scale_U).reshape(-1, C), head.weight,
                        head.bias, action.noise_scale, settings.threshold)
    cls_loss_sum = tiled_ovr_loss(inputs, labels.reshape(-1), scored.reshape(-1), tiling, reduction="sum")
    num_decision = ActionOutput(loc_S_num[..., 0], scale_S_num[..., 0], loc_Y, scale_Y)  # [...] each
    parts = _total(cls_loss_sum, None, num_decision, labels, numeric_targets, scored=scored, settings=settings)
    return parts, decision


def total_loss(
    loc_S: Tensor,
    scale_S: Tensor,
    loc_Y: Tensor,
    scale_Y: Tensor,
    labels: Tensor,
    numeric_targets: Tensor,
    *,
    num_token_id: int,
    threshold=100.0,
    attention_mask: Tensor | None = None,
    ignore_index: int = -100,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
    detach_gate: bool = False,
) -> LossParts:
    r"""$L = \bar L_{\mathrm{cls}} + \lambda\, L_{\mathrm{reg,eff}}$ with the masks of decisions D8–D9.

    $$
    \mathrm{valid}_i = \mathrm{mask}_i \wedge (y_i \ne \mathrm{ignore}),\quad
    \bar L_{\mathrm{cls}} = \frac{\sum_i \mathrm{valid}_i L_{\mathrm{cls},i}}{\max(\sum_i \mathrm{valid}_i, 1)},
    $$

    $$
    m_i = \mathrm{valid}_i \wedge (y_i = \langle NUM\rangle),\quad
    L_{\mathrm{reg,eff}} = \frac{\sum_i \mathrm{gate}_i\,\mathrm{nll}_i}{\max(\sum_i m_i, 1)}.
    $$

    Inputs are aligned (position $i$ is scored against ``labels[i]``); ``attention_mask`` (optional,
    0/1, same shape as ``labels``) switches positions off. ``threshold`` is a number or a ``[V]``
    tensor. The gate's $P_{\langle NUM\rangle}$ uses the ``<NUM>`` column only; with
    ``detach_gate`` it carries no gradient. This is the literal path, from the full ``[..., V]``
    decisions; `fused_total_loss` is the same loss computed without them.
    """
    settings = LossSettings(num_token_id, threshold, ignore_index, regression_weight, gate_alpha, detach_gate)
    valid = _loss_masks(labels, loc_S.shape[-1], numeric_targets, loc_Y, attention_mask, settings)
    cauchy.check_arguments(threshold, loc_S, scale_S)
    cauchy.check_scale(scale_Y)
    if scale_Y.shape != labels.shape:
        raise ValueError(f"scale_Y shape {tuple(scale_Y.shape)} must equal labels shape {tuple(labels.shape)}")
    return total_from_decisions(ActionOutput(loc_S, scale_S, loc_Y, scale_Y), labels, numeric_targets, scored=valid,
                                settings=settings)


def fused_total_loss(
    loc_U: Tensor,
    scale_U: Tensor,
    action,
    labels: Tensor,
    numeric_targets: Tensor,
    *,
    num_token_id: int,
    threshold=100.0,
    attention_mask: Tensor | None = None,
    ignore_index: int = -100,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
    detach_gate: bool = False,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
) -> tuple[LossParts, ActionOutput]:
    r"""`total_loss` from the law of $U$ and the `ActionNetwork` ``action``, never forming ``[..., V]``.

    The classification part is `fused_ovr_classification_loss` (``reduction="sum"``) over the valid
    positions; the gate's $P_{\langle NUM\rangle}$ and the regression come from the action restricted to
    the ``<NUM>`` class. Returns the loss parts (``cls_loss`` is None) and that restricted action
    output (``loc_S``, ``scale_S`` ``[..., 1]``; ``loc_Y``, ``scale_Y`` ``[...]``). Shapes: ``loc_U``,
    ``scale_U`` ``[..., C]``, everything else ``[...]``.
    """
    settings = LossSettings(num_token_id, threshold, ignore_index, regression_weight, gate_alpha, detach_gate)
    check_law(loc_U, scale_U, action.causal_size, ("loc_U", "scale_U"))
    valid = _loss_masks(labels, action.classification_head.weight.shape[0], numeric_targets, loc_U[..., 0],
                        attention_mask, settings)
    tiling = default_tiling(loc_U.device, action.scale_eps, chunk_size, vocab_chunk_size)
    return total_from_law_of_U(loc_U, scale_U, action, labels, numeric_targets, scored=valid, settings=settings,
                               tiling=tiling)
