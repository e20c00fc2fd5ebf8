r"""Losses (decisions D8–D9): One-vs-Rest classification, gated Cauchy regression, and their total.

Every class $k$ has its own Cauchy decision score $S_k \sim \mathrm{Cauchy}(\mathrm{loc}_{S_k}, \mathrm{scale}_{S_k})$
and is "on" when the score clears its threshold $C_k$:

$$P_k = P(S_k > C_k) = \frac12 + \frac1\pi \arctan\frac{\mathrm{loc}_{S_k} - C_k}{\mathrm{scale}_{S_k}}.$$

Each class is a separate binary decision, so the classification loss is a sum of $V$ binary
cross-entropies, evaluated entirely in log space with the one tail kernel `cauchy.tail_terms`
(`cauchy.tail_nll` for autograd; decision D8; no ``eps`` inside a logarithm):
$-\log(1 - P_k) = a(d_k, s_k)$ and $-\log P_k = a(-d_k, s_k)$ with $d_k = \mathrm{loc}_{S_k} - C_k$.
$P_k$, its logs and the gate's $P_{\langle NUM\rangle}$ are formed once, in `causalqwen.action` (`ovr_probability`,
`ovr_log_probability`, `ovr_tail_nll`, `num_probability`); the names ``ovr_probability`` and
``ovr_log_probability`` are importable from here too.

The next-token shift, which position is scored against which label, is `next_token_targets`; the functions before it
take labels already aligned with positions.
Each formula has one name and checks its arguments while `causalqwen.cauchy.validating` (the package's one
switch); the model's forward calls them under ``cauchy.validation(False)`` once its door has checked its inputs.

**The loss interface.** The model computes its loss from the law of $U$ with one of the functions in
`LOSS_FUNCTIONS`, chosen on one line by ``config.loss_algorithm`` (as transformers chooses an attention
implementation). The registry names where each algorithm lives, and `loss_function` imports it on first use (so
importing a module registers nothing, and the fused kernels load only when a fused loss runs). All have the signature
of `literal_loss`, the eager reference: the action network's decisions ``[..., V]`` and `total_loss` on them,
differentiated by autograd. ``"fused"`` (`causalqwen.kernels.fused.fused_loss`) is the same loss, tile by tile, never
forming ``[..., V]``.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cauchy
from .action import (
    ActionOutput,
    check_threshold,
    num_probability,
    ovr_log_probability,
    ovr_probability,
    ovr_tail_nll,
)

__all__ = [
    "LOSS_ALGORITHMS",
    "LOSS_FUNCTIONS",
    "LossParts",
    "NextTokenTargets",
    "as_bool_mask",
    "at_least_float32",
    "check_labels",
    "check_loss_inputs",
    "gated_regression_loss",
    "literal_loss",
    "loss_function",
    "next_token_targets",
    "ovr_classification_loss",
    "ovr_log_probability",
    "ovr_probability",
    "total_from_classification",
    "total_loss",
]

# The loss algorithms by name (``config.loss_algorithm``), each as the place it lives, "module:function"; each is
# imported when `loss_function` first asks for it.
LOSS_FUNCTIONS = {"fused": "causalqwen.kernels.fused:fused_loss", "literal": "causalqwen.losses:literal_loss"}
LOSS_ALGORITHMS = tuple(LOSS_FUNCTIONS)  # the names a config may choose


# ---- the checks of the rules this module owns ----


def check_labels(labels: Tensor, num_classes: int, ignore_index: int) -> None:
    """Labels are an integer tensor, each a class in ``[0, num_classes)`` or ``ignore_index``."""
    if not isinstance(labels, Tensor) or labels.dtype == torch.bool or labels.dtype.is_floating_point:
        raise TypeError(f"labels must be an integer tensor, got {getattr(labels, 'dtype', type(labels))}")
    out_of_range = (labels != ignore_index) & ((labels < 0) | (labels >= num_classes))
    if bool(out_of_range.any()):
        bad = labels[out_of_range][0].item()
        raise ValueError(f"labels must lie in [0, {num_classes}) or equal ignore_index={ignore_index}; found {bad}")


def as_bool_mask(mask: Tensor, name: str) -> Tensor:
    """Return ``mask`` as a bool tensor; raise ``ValueError`` naming it if it holds anything but 0 and 1."""
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0 and 1")
    return mask.bool()


def at_least_float32(t: Tensor) -> Tensor:
    """Losses are computed in float32 (or float64) even for a bf16/fp16 model."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# ---- the two per-position losses ----


def ovr_classification_loss(loc_S, scale_S, labels, threshold, ignore_index: int = -100) -> Tensor:
    r"""Per-position OvR loss $L_{\mathrm{cls}} = -\sum_k \big[y_k \log P_k + (1 - y_k)\log(1 - P_k)\big]$.

    $y$ is the one-hot of the label. Shapes: ``loc_S``, ``scale_S`` ``[..., V]``, ``labels`` ``[...]``;
    result ``[...]``, exactly 0 where ``labels == ignore_index``.
    """
    if cauchy.validating():
        if labels.shape != loc_S.shape[:-1]:
            raise ValueError(
                f"labels shape {tuple(labels.shape)} must equal loc_S shape without its last dim "
                f"{tuple(loc_S.shape[:-1])}"
            )
        check_labels(labels, loc_S.shape[-1], ignore_index)
        check_threshold(threshold, loc_S.shape[-1], loc_S.dtype)
        cauchy.check_arguments(threshold, loc_S, scale_S)
    scored = labels != ignore_index  # [...]
    on, off = ovr_tail_nll(loc_S, scale_S, threshold)  # -log P_k, -log(1 - P_k) [..., V]
    target = labels.masked_fill(~scored, 0)  # any class index; these rows are zeroed below
    is_target = torch.arange(loc_S.shape[-1], device=labels.device) == target.unsqueeze(-1)  # [..., V] one-hot y
    loss = torch.where(is_target, on, off).sum(-1)  # [...]
    return torch.where(scored, loss, torch.zeros_like(loss))


def gated_regression_loss(loc_Y, scale_Y, targets, p_num, num_mask, alpha: float = 0.0) -> Tensor:
    r"""Gated Cauchy regression loss $\mathrm{gate}_i \cdot \mathrm{nll}_i$ (decision D9).

    $$\mathrm{nll}_i = \log(\pi\,\mathrm{scale}_{Y_i}) + \log\Big(1 + \big(\tfrac{y_i -
    \mathrm{loc}_{Y_i}}{\mathrm{scale}_{Y_i}}\big)^2\Big),
    \qquad \mathrm{gate}_i = m_i\,\big(\alpha + (1 - \alpha)\,P_{\langle NUM\rangle, i}\big).$$

    ``num_mask`` ($m$) is a boolean (or 0/1) tensor; the result is exactly 0 where it is off.
    """
    if cauchy.validating():
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha (gate_alpha) must lie in [0, 1], got {alpha}")
        for name, tensor in (("p_num", p_num), ("num_mask", num_mask)):
            if not isinstance(tensor, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not bool(((p_num >= 0) & (p_num <= 1)).all()):
            raise ValueError("p_num (the gate's P_<NUM>) must lie in [0, 1] everywhere: it is a probability")
        cauchy.check_scale(scale_Y)
        num_mask = as_bool_mask(num_mask, "num_mask")
    gated = (alpha + (1.0 - alpha) * p_num) * cauchy.nll(targets, loc_Y, scale_Y)  # [...]
    return torch.where(num_mask.bool(), gated, torch.zeros_like(gated))


# ---- the total ----


class LossParts(NamedTuple):
    """The total loss and its parts. ``n_cls`` / ``n_reg`` count the scored / regression positions.

    ``cls_loss`` (per position) is None on the fused path, which only forms the sum."""

    total: Tensor  # [] cls_loss_mean + regression_weight * reg_loss_effective
    cls_loss_mean: Tensor  # [] the OvR loss summed over scored positions, divided by max(n_cls, 1)
    reg_loss_effective: Tensor  # [] the gated regression loss summed, divided by max(n_reg, 1)
    n_cls: Tensor  # [] scored positions
    n_reg: Tensor  # [] scored <NUM> targets
    cls_loss: Tensor | None  # [...] per position
    reg_loss: Tensor  # [...] per position (gated)


def check_loss_inputs(
    labels,
    numeric_targets,
    num_classes: int,
    *,
    shapes: dict,
    num_token_id: int,
    threshold,
    attention_mask=None,
    ignore_index: int = -100,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
) -> None:
    r"""The checks of a total loss's arguments besides the laws: every tensor in ``shapes`` (and ``attention_mask``)
    of the shape of ``labels``, $C$ finite (also in float32, the least the losses compute in), the ``<NUM>`` id a
    class, $\lambda \ge 0$ finite, $\alpha \in [0, 1]$,
    finite ``numeric_targets`` and labels that are classes or ``ignore_index``."""
    if attention_mask is not None:
        shapes = {**shapes, "attention_mask": attention_mask.shape}
    for name, shape in shapes.items():
        if shape != labels.shape:
            raise ValueError(f"{name} shape {tuple(shape)} must equal labels shape {tuple(labels.shape)}")
    check_threshold(threshold, num_classes, torch.float32)
    if not 0 <= num_token_id < num_classes:
        raise ValueError(f"num_token_id={num_token_id} is not a class index in [0, {num_classes})")
    if not (math.isfinite(float(regression_weight)) and float(regression_weight) >= 0):
        raise ValueError(f"regression_weight (lambda) must be a finite number >= 0, got {regression_weight}")
    if not 0.0 <= gate_alpha <= 1.0:
        raise ValueError(f"alpha (gate_alpha) must lie in [0, 1], got {gate_alpha}")
    if not bool(torch.isfinite(numeric_targets).all()):  # even where unscored: its NaN gradient would reach loc_Y
        where = tuple((~torch.isfinite(numeric_targets)).nonzero()[0].tolist())
        raise ValueError(
            f"numeric_targets must be finite: found {numeric_targets[where].item()} at position {list(where)}"
        )
    check_labels(labels, num_classes, ignore_index)
    if attention_mask is not None:
        as_bool_mask(attention_mask, "attention_mask")


def total_from_classification(
    cls_loss_sum: Tensor,
    cls_loss: Tensor | None,
    num_law: ActionOutput,
    labels: Tensor,
    numeric_targets: Tensor,
    scored: Tensor,
    *,
    num_token_id: int,
    threshold,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
    detach_gate: bool,
) -> LossParts:
    r"""$L = \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg,eff}}$ from $\sum_i L_{\mathrm{cls},i}$ (``cls_loss_sum``;
    the
    per-position ``cls_loss`` if formed) and ``num_law``: the law of $S_{\langle NUM\rangle}$ (``loc_S``, ``scale_S``)
    and of $Y$, all ``[...]`` in at least float32. ``scored`` ``[...]`` marks the positions scored. Both loss
    functions end here, so that the gate and the regression have one definition."""
    n_cls = scored.sum()
    cls_loss_mean = cls_loss_sum / n_cls.clamp(min=1)
    p_num = num_probability(num_law.loc_S, num_law.scale_S, threshold, num_token_id)  # [...]
    if detach_gate:
        p_num = p_num.detach()
    num_mask = scored & (labels == num_token_id)  # [...]
    reg_loss = gated_regression_loss(
        num_law.loc_Y, num_law.scale_Y, numeric_targets, p_num, num_mask, gate_alpha
    )  # [...]
    n_reg = num_mask.sum()
    reg_loss_effective = reg_loss.sum() / n_reg.clamp(min=1)
    return LossParts(
        total=cls_loss_mean + regression_weight * reg_loss_effective,
        cls_loss_mean=cls_loss_mean,
        reg_loss_effective=reg_loss_effective,
        n_cls=n_cls,
        n_reg=n_reg,
        cls_loss=cls_loss,
        reg_loss=reg_loss,
    )


def total_loss(
    loc_S: Tensor,
    scale_S: Tensor,
    loc_Y: Tensor,
    scale_Y: Tensor,
    labels: Tensor,
    numeric_targets: Tensor,
    *,
    num_token_id: int,
    threshold,
    attention_mask: Tensor | None = None,
    ignore_index: int = -100,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
    detach_gate: bool,
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
    ``detach_gate`` it carries no gradient. ``threshold`` and ``detach_gate`` have no default: the config's
    ``ovr_threshold`` and ``detach_gate`` are the one set of defaults (the drafts' $C = 100$ is
    `causalqwen.initialization.DRAFT_INIT`'s). This is the literal path, from the full ``[..., V]`` decisions (in at
    least float32).
    """
    if cauchy.validating():
        check_loss_inputs(
            labels,
            numeric_targets,
            loc_S.shape[-1],
            shapes={"loc_Y": loc_Y.shape, "numeric_targets": numeric_targets.shape},
            num_token_id=num_token_id,
            threshold=threshold,
            attention_mask=attention_mask,
            ignore_index=ignore_index,
            regression_weight=regression_weight,
            gate_alpha=gate_alpha,
        )
        cauchy.check_arguments(threshold, loc_S, scale_S)
        cauchy.check_scale(scale_Y)
        if scale_Y.shape != labels.shape:
            raise ValueError(f"scale_Y shape {tuple(scale_Y.shape)} must equal labels shape {tuple(labels.shape)}")
    scored = labels != ignore_index  # [...]
    if attention_mask is not None:
        scored = scored & attention_mask.bool()
    loc_S, scale_S = at_least_float32(loc_S), at_least_float32(scale_S)  # [..., V] each
    cls_loss = ovr_classification_loss(
        loc_S, scale_S, labels.masked_fill(~scored, ignore_index), threshold, ignore_index
    )  # [...]
    k = num_token_id
    num_law = ActionOutput(loc_S[..., k], scale_S[..., k], at_least_float32(loc_Y), at_least_float32(scale_Y))  # [...]
    return total_from_classification(
        cls_loss.sum(),
        cls_loss,
        num_law,
        labels,
        numeric_targets,
        scored,
        num_token_id=num_token_id,
        threshold=threshold,
        regression_weight=regression_weight,
        gate_alpha=gate_alpha,
        detach_gate=detach_gate,
    )


# ---- the loss interface: from the law of U to the total, chosen by name ----


def literal_loss(
    action,
    loc_U: Tensor,
    scale_U: Tensor,
    labels: Tensor,
    numeric_targets: Tensor,
    *,
    num_token_id: int,
    threshold,
    attention_mask: Tensor | None = None,
    ignore_index: int = -100,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
    detach_gate: bool,
) -> tuple[LossParts, ActionOutput]:
    r"""The total loss from the law of $U$ ``[..., C]`` and the `ActionNetwork` ``action``: its standard decisions
    ``action(loc_U, scale_U)`` ``[..., V]`` and `total_loss` on them. Returns the loss parts and the decisions.

    This is the eager reference of `LOSS_FUNCTIONS` (``"literal"``); every other algorithm has this signature and
    returns the same parts (``cls_loss`` may be None) and, where it does not form ``[..., V]``, the decisions at
    the ``<NUM>`` column alone (``loc_S``, ``scale_S`` ``[..., 1]``)."""
    decision = action(loc_U, scale_U)  # [..., V] x2, [...] x2
    parts = total_loss(
        *decision,
        labels,
        numeric_targets,
        num_token_id=num_token_id,
        threshold=threshold,
        attention_mask=attention_mask,
        ignore_index=ignore_index,
        regression_weight=regression_weight,
        gate_alpha=gate_alpha,
        detach_gate=detach_gate,
    )
    return parts, decision


@functools.cache
def loss_function(name: str) -> Callable[..., tuple[LossParts, ActionOutput]]:
    """The loss algorithm ``name`` of `LOSS_FUNCTIONS`, imported from where it lives on its first use; an unknown
    name is a ``ValueError`` naming it."""
    if name not in LOSS_FUNCTIONS:
        raise ValueError(f"loss_algorithm must be one of {', '.join(LOSS_FUNCTIONS)}, got {name!r}")
    module, function = LOSS_FUNCTIONS[name].split(":")
    return getattr(importlib.import_module(module), function)


class NextTokenTargets(NamedTuple):
    """What position $i$ is scored against (decision D9), all ``[B, S]`` and aligned with the positions."""

    scored: Tensor  # bool: positions i and i+1 are real and labels[i+1] != ignore_index; False at the last position
    labels: Tensor  # labels[i+1] where scored, ignore_index elsewhere
    values: Tensor  # the numeric target v[i+1] (at least float32), 0 at the last position
    is_num: Tensor  # bool: scored and labels[i+1] == <NUM>


def next_token_targets(
    labels: Tensor,
    numeric_targets: Tensor | None,
    attention_mask: Tensor | None,
    ignore_index: int = -100,
    num_token_id: int | None = None,
) -> NextTokenTargets:
    r"""The scoring rule (decision D9): position $i$ is scored against ``labels[i+1]`` (and ``numeric_targets[i+1]``)
    when positions $i$ and $i+1$ are both real tokens and ``labels[i+1] != ignore_index``. All inputs ``[B, S]``;
    ``is_num`` is all False without a ``num_token_id``."""
    real = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
    next_labels = F.pad(labels[:, 1:], (0, 1), value=ignore_index)  # [B, S]
    scored = F.pad(real[:, :-1] & real[:, 1:], (0, 1), value=False) & (next_labels != ignore_index)
    if numeric_targets is None:
        next_values = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
    else:
        next_values = F.pad(at_least_float32(numeric_targets[:, 1:]), (0, 1), value=0.0)  # [B, S]
    is_num = scored & (next_labels == num_token_id) if num_token_id is not None else torch.zeros_like(scored)
    return NextTokenTargets(scored, next_labels.masked_fill(~scored, ignore_index), next_values, is_num)
