r"""Losses (forward_pass §5): One-vs-Rest classification, gated Cauchy regression, and their total.

Every class $k$ has its own Cauchy decision score $S_k \sim \mathrm{Cauchy}(\mathrm{loc}_{S_k}, \mathrm{scale}_{S_k})$
and is "on" when the score clears its threshold $C_k$:

$$P_k = P(S_k > C_k) = \frac12 + \frac1\pi \arctan\frac{\mathrm{loc}_{S_k} - C_k}{\mathrm{scale}_{S_k}}.$$

Each class is a separate binary decision, so the classification loss is a sum of $V$ binary
cross-entropies, evaluated entirely in log space (decision D8; no ``eps`` inside a logarithm).

This module is the *literal* path: it takes the full ``[..., V]`` tensors. Labels here are already
aligned with positions; the model's ``forward`` does the next-token shift (decision D9).
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cauchy
from .action import ActionOutput


__all__ = [
    "ovr_probability",
    "ovr_log_probability",
    "ovr_classification_loss",
    "gated_regression_loss",
    "total_loss",
    "fused_total_loss",
    "LossParts",
    "as_bool_mask",
    "at_least_float32",
    "fused_ovr_classification_loss",
]


def at_least_float32(t: Tensor) -> Tensor:
    """Losses are computed in float32 (or float64) even for a bf16/fp16 model."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _check_threshold(threshold, num_classes: int) -> None:
    """A threshold is a finite number, a 0-d tensor or a ``[V]`` tensor (a NaN or ±inf $C_k$ makes every $P_k$ NaN, 0 or 1)."""
    if isinstance(threshold, Tensor) and threshold.dim() > 0 and threshold.shape != (num_classes,):
        raise ValueError(
            f"a per-class threshold must have shape ({num_classes},) to match the {num_classes} classes, "
            f"got {tuple(threshold.shape)}"
        )
    if isinstance(threshold, Tensor):
        finite = bool(torch.isfinite(threshold).all())
    elif isinstance(threshold, numbers.Real) and not isinstance(threshold, bool):
        finite = math.isfinite(threshold)
    else:
        raise TypeError(f"threshold must be a real number or a tensor, got {type(threshold).__name__}")
    if not finite:
        raise ValueError("threshold (the OvR threshold C_k) must be finite: found NaN or ±inf")


def _check_labels(labels: Tensor, num_classes: int, ignore_index: int) -> Tensor:
    """Return the mask of scored positions; raise if a label is neither a class nor ``ignore_index``."""
    if not isinstance(labels, Tensor) or labels.dtype in (torch.bool,) or labels.dtype.is_floating_point:
        raise TypeError(f"labels must be an integer tensor, got {getattr(labels, 'dtype', type(labels))}")
    scored = labels != ignore_index
    out_of_range = scored & ((labels < 0) | (labels >= num_classes))
    if bool(out_of_range.any()):
        bad = labels[out_of_range][0].item()
        raise ValueError(f"labels must lie in [0, {num_classes}) or equal ignore_index={ignore_index}; found {bad}")
    return scored


def ovr_probability(loc_S, scale_S, threshold) -> Tensor:
    r"""One-vs-Rest probability $P_k = P(S_k > C_k)$, the Cauchy survival function at the threshold.

    ``threshold`` is a number, a 0-d tensor, or a per-class tensor of shape ``[V]``. Same shape as ``loc_S``.
    """
    _check_threshold(threshold, loc_S.shape[-1])
    return cauchy.sf(threshold, loc_S, scale_S)


def ovr_log_probability(loc_S, scale_S, threshold) -> tuple[Tensor, Tensor]:
    r"""$(\log P_k,\ \log(1 - P_k))$ computed without cancellation.

    With $t = (\mathrm{loc}_S - C)/\mathrm{scale}_S$: $\log P = \log(\arctan(-1/t)/\pi)$ for $t < 0$ and
    $\log(1 - \arctan(1/t)/\pi)$ for $t \ge 0$ (via ``log1p``); $\log(1 - P(t)) = \log P(-t)$.
    """
    _check_threshold(threshold, loc_S.shape[-1])
    return cauchy.log_sf(threshold, loc_S, scale_S), cauchy.log_cdf(threshold, loc_S, scale_S)


def ovr_classification_loss(loc_S, scale_S, labels, threshold, ignore_index: int = -100) -> Tensor:
    r"""Per-position OvR loss $L_{\mathrm{cls}} = -\sum_k \big[y_k \log P_k + (1 - y_k)\log(1 - P_k)\big]$.

    $y$ is the one-hot of the label. Shapes: ``loc_S``, ``scale_S`` ``[..., V]``, ``labels`` ``[...]``;
    result ``[...]``, exactly 0 where ``labels == ignore_index``.
    """
    num_classes = loc_S.shape[-1]
    if labels.shape != loc_S.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal loc_S shape without its last dim {tuple(loc_S.shape[:-1])}")
    scored = _check_labels(labels, num_classes, ignore_index)
    log_p, log_not_p = ovr_log_probability(loc_S, scale_S, threshold)  # [..., V] each
    target = labels.masked_fill(~scored, 0)  # any class index; these rows are zeroed below
    is_target = torch.arange(num_classes, device=labels.device) == target.unsqueeze(-1)  # [..., V]
    loss = -torch.where(is_target, log_p, log_not_p).sum(-1)  # [...]
    return torch.where(scored, loss, torch.zeros_like(loss))


def gated_regression_loss(loc_Y, scale_Y, targets, p_num, num_mask, alpha: float = 0.0) -> Tensor:
    r"""Gated Cauchy regression loss $\mathrm{gate}_i \cdot \mathrm{nll}_i$ (forward_pass §5.2).

    $$\mathrm{nll}_i = \log(\pi\,\mathrm{scale}_{Y_i}) + \log\Big(1 + \big(\tfrac{y_i - \mathrm{loc}_{Y_i}}{\mathrm{scale}_{Y_i}}\big)^2\Big),
    \qquad \mathrm{gate}_i = m_i\,\big(\alpha + (1 - \alpha)\,P_{\langle NUM\rangle, i}\big).$$

    ``num_mask`` ($m$) is a boolean (or 0/1) tensor; the result is exactly 0 where it is off.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (gate_alpha) must lie in [0, 1], got {alpha}")
    num_mask = as_bool_mask(num_mask, "num_mask")
    nll = cauchy.nll(targets, loc_Y, scale_Y)
    gate = alpha + (1.0 - alpha) * p_num
    gated = gate * nll
    return torch.where(num_mask, gated, torch.zeros_like(gated))


def as_bool_mask(mask: Tensor, name: str) -> Tensor:
    """Return ``mask`` as a bool tensor; raise ``ValueError`` naming it if it holds anything but 0 and 1."""
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must contain only 0 and 1")
    return mask.bool()


@dataclass
class LossParts:
    """The total loss and its parts. ``n_cls`` / ``n_reg`` count the scored / regression positions.

    ``cls_loss`` (per position) is None on the fused path, which only forms the sum."""

    total: Tensor
    cls_loss_mean: Tensor
    reg_loss_effective: Tensor
    n_cls: Tensor
    n_reg: Tensor
    cls_loss: Tensor | None  # [...] per position
    reg_loss: Tensor  # [...] per position (gated)


def _check_loss_weights(regression_weight, gate_alpha) -> None:
    r"""$\lambda \ge 0$ finite and $\alpha \in [0, 1]$, checked before any work is done."""
    if not (math.isfinite(float(regression_weight)) and float(regression_weight) >= 0):
        raise ValueError(f"regression_weight (lambda) must be a finite number >= 0, got {regression_weight}")
    if not 0.0 <= gate_alpha <= 1.0:
        raise ValueError(f"alpha (gate_alpha) must lie in [0, 1], got {gate_alpha}")


def _loss_masks(labels, num_classes, numeric_targets, loc_Y, scale_Y, attention_mask, num_token_id, ignore_index):
    """Check shapes and labels; return ``(valid, num_mask)`` of decisions D8–D9."""
    shapes = {"loc_Y": loc_Y.shape, "scale_Y": scale_Y.shape, "numeric_targets": numeric_targets.shape}
    if attention_mask is not None:
        shapes["attention_mask"] = attention_mask.shape
    for name, shape in shapes.items():
        if shape != labels.shape:
            raise ValueError(f"{name} shape {tuple(shape)} must equal labels shape {tuple(labels.shape)}")
    if not 0 <= num_token_id < num_classes:
        raise ValueError(f"num_token_id={num_token_id} is not a class index in [0, {num_classes})")
    if not bool(torch.isfinite(numeric_targets).all()):  # even where unscored: its NaN gradient would reach loc_Y
        where = tuple((~torch.isfinite(numeric_targets)).nonzero()[0].tolist())
        raise ValueError(f"numeric_targets must be finite: found {numeric_targets[where].item()} at position {list(where)}")
    valid = _check_labels(labels, num_classes, ignore_index)
    if attention_mask is not None:
        valid = valid & as_bool_mask(attention_mask, "attention_mask")
    return valid, valid & (labels == num_token_id)


def _assemble(cls_loss_sum, cls_loss, p_num, loc_Y, scale_Y, numeric_targets, valid, num_mask, regression_weight,
              gate_alpha, detach_gate) -> LossParts:
    n_cls = valid.sum()
    cls_loss_mean = cls_loss_sum / n_cls.clamp(min=1)
    if detach_gate:
        p_num = p_num.detach()
    reg_loss = gated_regression_loss(loc_Y, scale_Y, numeric_targets, p_num, num_mask, gate_alpha)  # [...]
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


def _class_threshold(threshold, k: int):
    return threshold[k] if isinstance(threshold, Tensor) and threshold.dim() > 0 else threshold


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
    num_classes = loc_S.shape[-1]
    _check_threshold(threshold, num_classes)
    _check_loss_weights(regression_weight, gate_alpha)
    valid, num_mask = _loss_masks(labels, num_classes, numeric_targets, loc_Y, scale_Y, attention_mask, num_token_id,
                                  ignore_index)
    cls_loss = ovr_classification_loss(loc_S, scale_S, labels.masked_fill(~valid, ignore_index), threshold, ignore_index)
    num_column = slice(num_token_id, num_token_id + 1)
    p_num = ovr_probability(loc_S[..., num_column], scale_S[..., num_column], _class_threshold(threshold, num_token_id))
    return _assemble(cls_loss.sum(), cls_loss, p_num.squeeze(-1), loc_Y, scale_Y, numeric_targets, valid, num_mask,
                     regression_weight, gate_alpha, detach_gate)


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
    head = action.classification_head
    num_classes = head.weight.shape[0]
    _check_threshold(threshold, num_classes)
    _check_loss_weights(regression_weight, gate_alpha)
    # the <NUM> column in the action's own dtype (as the literal path forms it), scored in >= float32
    decision = action(loc_U.to(head.weight.dtype), scale_U.to(head.weight.dtype), classes=[num_token_id])
    loc_S_num, scale_S_num, loc_Y, scale_Y = (at_least_float32(t) for t in decision)  # [..., 1] x2, [...] x2
    valid, num_mask = _loss_masks(labels, num_classes, numeric_targets, loc_Y, scale_Y,
                                  attention_mask, num_token_id, ignore_index)
    C = loc_U.shape[-1]
    cls_loss_sum = fused_ovr_classification_loss(
        loc_U.reshape(-1, C), scale_U.reshape(-1, C), head.weight, head.bias, action.noise_scale, threshold,
        labels.masked_fill(~valid, ignore_index).reshape(-1), ignore_index, chunk_size, action.scale_eps,
        vocab_chunk_size=vocab_chunk_size, reduction="sum")
    p_num = ovr_probability(loc_S_num, scale_S_num, _class_threshold(threshold, num_token_id)).squeeze(-1)
    parts = _assemble(cls_loss_sum, None, p_num, loc_Y, scale_Y, numeric_targets, valid, num_mask,
                      regression_weight, gate_alpha, detach_gate)
    return parts, decision


# ---- the fused, chunked path (memory-flat head + loss) ----
#
# With t = (loc_S - C) / scale_S the OvR loss of a row splits into a label-free sum over all classes
# and a correction at the label y:
#
#     L = sum_k a(t_k) + [log F(-t_y) - log F(t_y)],     a(t) = -log F(-t) = -log(1 - P),
#
# (F the standard Cauchy CDF, P = F(t)). The sum is separable over rows *and* classes, so it is
# computed tile by tile (rows x a block of classes) and no tile outlives its loop iteration; the
# correction needs one class per row and is computed on [n] vectors.

FUSED_CHUNK_SIZE = 128  # rows per tile; measured by `python -m benchmarks head` (and `--tune`)
FUSED_VOCAB_CHUNK_SIZE = 1024  # classes per tile; measured likewise


def _negative_part(diff: Tensor, scale_S: Tensor, with_value: bool, with_grads: bool):
    r"""$a(t) = -\log F(-t)$ summed over a tile, and its derivatives, from $t = \mathrm{diff}/\mathrm{scale}_S$.

    Everything is formed from the reduced $r = \min(|t|, 1/|t|) \in [0, 1]$ and the small tail
    $m = F(-|t|)$ ($\arctan(r)/\pi$ when $|t| > 1$, else $\tfrac12 - \arctan(r)/\pi$), so nothing cancels
    or overflows: $a = -\log m$ for $t > 0$, $a = -\log1p(-m)$ otherwise, and

    $$\frac{\partial a}{\partial \mathrm{loc}_S} = \frac{f(t)}{F(-t)\,\mathrm{scale}_S},\qquad
    \frac{\partial a}{\partial \mathrm{scale}_S} = -\frac{t f(t)}{F(-t)\,\mathrm{scale}_S},$$

    with the density $f$ in reduced form: $\pi f(t) = 1/(1 + r^2)$ for $|t| \le 1$, $r^2/(1 + r^2)$
    beyond, and $\pi t f(t) = \mathrm{sign}(t)\, r/(1 + r^2)$ on both sides. In float32 the result is
    finite while $|t| < 1/\mathrm{tiny} \approx 8\cdot10^{37}$ (e.g. $|\mathrm{loc}_S - C| \le 10^{31}$ at
    $\mathrm{scale}_S = 10^{-6}$).

    Returns ``(row_sums [n] or None, d_loc [n, b] or None, d_scale [n, b] or None)``.
    """
    q = diff.abs().div_(scale_S)  # |t|
    far = q > 1
    r = torch.minimum(q, q.reciprocal())  # [n, b]
    del q
    tail = torch.atan(r).mul_(1.0 / math.pi)  # arctan(r) / pi, in [0, 1/4]
    m = torch.where(far, tail, torch.rsub(tail, 0.5))  # F(-|t|), in (0, 1/2]
    del tail
    positive = diff > 0
    row_sums = d_loc = d_scale = None
    if with_value:
        row_sums = -torch.where(positive, m.log(), m.neg().log1p_()).sum(-1)  # [n]
    if with_grads:
        den = torch.where(positive, m, torch.rsub(m, 1.0)).mul_(math.pi).mul_((r * r).add_(1.0))  # pi F(-t) (1 + r^2)
        z = r / den  # bounded: where F(-t) = arctan(r)/pi is tiny, z = (r / arctan r) / (1 + r^2)
        d_loc = torch.where(far, r.mul_(z), den.reciprocal_()).div_(scale_S)  # f / (F(-t) s)
        d_scale = z.copysign_(diff).neg_().div_(scale_S)  # -t f / (F(-t) s)
    return row_sums, d_loc, d_scale


def _target_correction(loc, scale_in, weight, bias, threshold, labels, scale_eps):
    r"""$B_n = \log F(-t_{n y_n}) - \log F(t_{n y_n})$, the label's class computed on its own (``[n]``
    vectors). Returns ``(B, loc_y, scale_raw_y)``; the last two are autograd leaves in grad mode."""
    weight_y = weight[labels]  # [n, C]
    loc_y = (loc * weight_y).sum(-1) + bias[labels]  # [n]
    scale_raw_y = (scale_in * weight_y.abs()).sum(-1)  # [n]
    if torch.is_grad_enabled():
        loc_y.requires_grad_()
        scale_raw_y.requires_grad_()
    threshold_y = threshold[labels] if threshold.dim() > 0 else threshold  # [n] or []
    scale_y = scale_raw_y.clamp_min(scale_eps)
    correction = cauchy.log_cdf(threshold_y, loc_y, scale_y) - cauchy.log_sf(threshold_y, loc_y, scale_y)
    return correction, loc_y, scale_raw_y


def _fused_pass(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, row_weight, need, chunk_size,
                vocab_chunk_size, scale_eps, with_value):
    r"""Walk the scored ``rows`` tile by tile: blocks of ``vocab_chunk_size`` classes, and in each block
    chunks of ``chunk_size`` rows. Returns the per-row loss ``[N]`` (if ``with_value``) and the
    gradients of $\sum_n w_n L_n$, $w$ = ``row_weight`` ``[N]``, for the inputs flagged in ``need`` =
    (loc_U, scale_U, weight, bias, noise_scale, threshold), None for the others.

    All arithmetic is in at least float32 (a bf16 weight block is upcast as it is used). The weight
    gradient of a block is accumulated in a ``[b, C]`` buffer and written once.
    """
    with_grads = any(need)
    num_classes = weight.shape[0]
    dtype = torch.promote_types(weight.dtype, torch.float32)
    per_class = threshold.dim() > 0
    loc = loc_U[rows].to(dtype)  # [n, C] the scored rows only
    scale_in_raw = scale_U[rows].to(dtype) + noise_scale.to(dtype)  # [n, C]
    scale_in = scale_in_raw.clamp_min(scale_eps)  # as ActionNetwork.forward
    labels = labels[rows]
    n = rows.numel()
    row_loss = loc.new_zeros(n)
    w_n = row_weight[rows].to(dtype).unsqueeze(-1) if row_weight is not None else None  # [n, 1]; None: all ones
    grad_loc = torch.zeros_like(loc) if need[0] else None  # [n, C]
    grad_scale_in = torch.zeros_like(loc) if (need[1] or need[4]) else None  # [n, C]
    grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need[2] else None  # [V, C]
    grad_classes = torch.zeros(num_classes, dtype=dtype, device=weight.device) if (need[3] or need[5]) else None  # sum_n d loc_S
    if grad_weight is not None:  # reused by every block, so that their pages are touched once
        block_buffers = torch.empty(2, min(vocab_chunk_size, num_classes), weight.shape[1], dtype=dtype, device=weight.device)

    for v0 in range(0, num_classes, vocab_chunk_size):
        block = slice(v0, v0 + vocab_chunk_size)
        weight_b = weight[block].to(dtype)  # [b, C]
        abs_weight_b = weight_b.abs()  # [b, C]
        threshold_minus_bias = (threshold[block] if per_class else threshold) - bias[block].to(dtype)  # [b]
        if grad_weight is not None:
            grad_w_loc = block_buffers[0][: weight_b.shape[0]].zero_()  # [b, C] the W path
            grad_w_abs = block_buffers[1][: weight_b.shape[0]].zero_()  # [b, C] the |W| path
        for r0 in range(0, n, chunk_size):
            chunk = slice(r0, r0 + chunk_size)
            diff = (loc[chunk] @ weight_b.t()).sub_(threshold_minus_bias)  # [c, b] loc_S - C
            scale_S = scale_in[chunk] @ abs_weight_b.t()  # [c, b], not yet clamped
            clamped = scale_S < scale_eps if with_grads else None
            scale_S.clamp_min_(scale_eps)
            row_sums, d_loc, d_scale = _negative_part(diff, scale_S, with_value, with_grads)
            del diff, scale_S
            if with_value:
                row_loss[chunk] += row_sums
            if not with_grads:
                continue
            if w_n is not None:
                d_loc.mul_(w_n[chunk])  # [c, b] d/d loc_S
                d_scale.mul_(w_n[chunk])
            d_scale.masked_fill_(clamped, 0.0)  # [c, b] d/d scale_S before its clamp
            if grad_loc is not None:
                grad_loc[chunk].addmm_(d_loc, weight_b)
            if grad_scale_in is not None:
                grad_scale_in[chunk].addmm_(d_scale, abs_weight_b)
            if grad_weight is not None:
                grad_w_loc.addmm_(d_loc.t(), loc[chunk])
                grad_w_abs.addmm_(d_scale.t(), scale_in[chunk])
            if grad_classes is not None:
                grad_classes[block] += d_loc.sum(0)
        if grad_weight is not None:
            grad_weight[block] = grad_w_loc.addcmul_(grad_w_abs, weight_b.sign())  # d|W|/dW = sign(W)

    # the label's own class: add B_n and its derivatives, all on [n] vectors
    with torch.enable_grad() if with_grads else torch.no_grad():
        correction, loc_y, scale_raw_y = _target_correction(loc, scale_in, weight.to(dtype), bias.to(dtype),
                                                            threshold, labels, scale_eps)
    row_loss += correction.detach()
    loss = None
    if with_value:
        loss = loc.new_zeros(loc_U.shape[0])
        loss[rows] = row_loss
    if not with_grads:
        return loss, [None] * 6

    d_loc_y, d_scale_y = torch.autograd.grad(correction, (loc_y, scale_raw_y),
                                             w_n.squeeze(-1) if w_n is not None else torch.ones_like(correction))  # [n] each
    label_rows = weight[labels].to(dtype)  # [n, C]
    if grad_loc is not None:
        grad_loc += d_loc_y.unsqueeze(-1) * label_rows
    if grad_scale_in is not None:
        grad_scale_in += d_scale_y.unsqueeze(-1) * label_rows.abs()
        grad_scale_in.masked_fill_(scale_in_raw < scale_eps, 0.0)  # through the clamp of the input scale
    if grad_weight is not None:
        grad_weight.index_add_(0, labels, d_loc_y.unsqueeze(-1) * loc + d_scale_y.unsqueeze(-1) * scale_in * label_rows.sign())
    if grad_classes is not None:
        grad_classes.index_add_(0, labels, d_loc_y)

    grads = [None] * 6
    if need[0]:
        grads[0] = torch.zeros(loc_U.shape, dtype=dtype, device=loc_U.device).index_copy_(0, rows, grad_loc)
    if need[1]:
        grads[1] = torch.zeros(scale_U.shape, dtype=dtype, device=scale_U.device).index_copy_(0, rows, grad_scale_in)
    grads[2] = grad_weight
    if need[3]:
        grads[3] = grad_classes
    if need[4]:
        grads[4] = grad_scale_in.sum(0)  # d |b_noise|
    if need[5]:  # d C = -d loc_S, summed over the rows (and over the classes for a shared threshold)
        grads[5] = -grad_classes if per_class else -grad_classes.sum()
    return loss, grads


def _first_order_only(backward):
    """Like ``torch.autograd.function.once_differentiable``, but loud when a graph of the gradient is asked for.

    The fused backward returns gradients formed without autograd, so a second derivative through them
    would be exactly 0. ``once_differentiable`` only complains when the incoming gradient itself requires
    grad, which ``loss.backward(create_graph=True)`` does not; this raises whenever grad mode is on in
    backward, i.e. whenever ``create_graph=True``.
    """

    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "the fused OvR loss has no second derivative (create_graph=True, a gradient of a gradient or a "
                "Hessian): use the literal path, forward(..., return_decisions=True) or losses.total_loss, "
                "which autograd differentiates twice"
            )
        return backward(ctx, *grad_outputs)

    return wrapper


class _FusedOvRLoss(torch.autograd.Function):
    """``reduction="none"``: saves only its inputs; backward recomputes every tile (8 GEMMs per tile in all)."""

    @staticmethod
    def forward(ctx, loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, chunk_size, vocab_chunk_size,
                scale_eps):
        loss, _ = _fused_pass(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, None, (False,) * 6,
                              chunk_size, vocab_chunk_size, scale_eps, with_value=True)
        ctx.save_for_backward(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows)
        ctx.sizes = (chunk_size, vocab_chunk_size, scale_eps)
        return loss.to(loc_U.dtype)

    @staticmethod
    @_first_order_only
    def backward(ctx, grad_loss):
        return (*_recomputed_grads(ctx, grad_loss), None, None, None, None, None)


class _FusedOvRLossSum(torch.autograd.Function):
    """``reduction="sum"``: the gradients are formed in the forward pass (6 GEMMs per tile) and kept
    until backward, which hands them over scaled by the incoming scalar. A second backward through a
    retained graph recomputes them from the saved inputs."""

    @staticmethod
    def forward(ctx, loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, chunk_size, vocab_chunk_size,
                scale_eps, need):
        loss, grads = _fused_pass(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, None, need,
                                  chunk_size, vocab_chunk_size, scale_eps, with_value=True)
        ctx.grads = _cast_like(grads, (loc_U, scale_U, weight, bias, noise_scale, threshold)) if any(need) else None
        ctx.save_for_backward(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows)
        ctx.sizes = (chunk_size, vocab_chunk_size, scale_eps)
        return loss.sum().to(loc_U.dtype)

    @staticmethod
    @_first_order_only
    def backward(ctx, grad_total):
        if ctx.grads is not None:
            grads, ctx.grads = ctx.grads, None  # hand the buffers over: nothing [V, C] is copied
            grads = [g.mul_(grad_total) if g is not None else None for g in grads]
        else:
            grads = _recomputed_grads(ctx, grad_total.expand(ctx.saved_tensors[0].shape[0]))
        return (*grads, None, None, None, None, None, None)


def _recomputed_grads(ctx, row_weight):
    loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows = ctx.saved_tensors
    _, grads = _fused_pass(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, row_weight,
                           tuple(ctx.needs_input_grad[:6]), *ctx.sizes, with_value=False)
    return _cast_like(grads, (loc_U, scale_U, weight, bias, noise_scale, threshold))


def _cast_like(grads, inputs):
    return [g.to(x.dtype) if g is not None else None for g, x in zip(grads, inputs)]


def fused_ovr_classification_loss(
    loc_U: Tensor,
    scale_U: Tensor,
    weight: Tensor,
    bias: Tensor,
    noise_scale: Tensor,
    threshold,
    labels: Tensor,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    scale_eps: float = 1e-6,
    *,
    vocab_chunk_size: int | None = None,
    reduction: str = "none",
) -> Tensor:
    r"""The head and the OvR loss in one pass, tile by tile: per-position loss ``[N]`` (or its sum).

    Equal to the literal path ``ovr_classification_loss(*ActionNetwork.forward(loc_U, scale_U)[:2], labels,
    threshold)`` with $\mathrm{loc}_S = \mathrm{loc}_U W^\top + b$ and
    $\mathrm{scale}_S = \max(\max(\mathrm{scale}_U + |b_{\mathrm{noise}}|, \epsilon)\,|W|^\top, \epsilon)$. The OvR loss is
    separable over classes, so a tile of ``chunk_size`` rows by ``vocab_chunk_size`` classes yields its
    exact share of loss and gradient with no normaliser across tiles:

    $$L_n = \sum_{k} -\log\big(1 - P_{nk}\big) \;+\; \log\big(1 - P_{n y_n}\big) - \log P_{n y_n}.$$

    No ``[N, V]`` tensor exists beyond one tile, no one-hot is built, $|W|$ is formed block by block,
    and ignored rows never enter a matrix product. The gradients (of ``loc_U``, ``scale_U``,
    ``weight`` through both $W$ and $|W|$, ``bias``, ``noise_scale`` $= |b_{\mathrm{noise}}|$ and a tensor
    ``threshold``) are written analytically per tile.

    ``reduction="none"`` returns ``[N]`` (0 at ignored rows); the autograd function saves only its
    inputs and backward recomputes each tile (8 matrix products per tile in all).
    ``reduction="sum"`` returns $\sum_n L_n$; when a gradient is needed it is formed during the
    forward pass and kept until backward (6 matrix products per tile, the floor, at the cost of
    holding a ``[V, C]`` gradient between the two passes, as Liger's and Apple's fused
    cross-entropies do).

    Shapes: ``loc_U``, ``scale_U`` ``[N, C]``; ``weight`` ``[V, C]``; ``bias`` ``[V]``;
    ``noise_scale`` ``[C]``; ``threshold`` a number, ``[]`` or ``[V]``; ``labels`` ``[N]``.
    """
    if loc_U.dim() != 2 or scale_U.shape != loc_U.shape:
        raise ValueError(f"loc_U and scale_U must both be [N, C], got {tuple(loc_U.shape)} and {tuple(scale_U.shape)}")
    num_classes = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != loc_U.shape[1]:
        raise ValueError(f"weight must be [V, C] with C = {loc_U.shape[1]}, got {tuple(weight.shape)}")
    if bias.shape != (num_classes,) or noise_scale.shape != (loc_U.shape[1],):
        raise ValueError(f"bias must be [V] and noise_scale [C]; got {tuple(bias.shape)} and {tuple(noise_scale.shape)}")
    _check_threshold(threshold, num_classes)
    if labels.shape != loc_U.shape[:1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be [N] = {tuple(loc_U.shape[:1])}")
    scored = _check_labels(labels, num_classes, ignore_index)
    chunk_size = FUSED_CHUNK_SIZE if chunk_size is None else chunk_size
    vocab_chunk_size = FUSED_VOCAB_CHUNK_SIZE if vocab_chunk_size is None else vocab_chunk_size
    for name, size in (("chunk_size", chunk_size), ("vocab_chunk_size", vocab_chunk_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    if reduction not in ("none", "sum"):
        raise ValueError(f'reduction must be "none" or "sum", got {reduction!r}')
    if not isinstance(threshold, Tensor):
        threshold = torch.tensor(float(threshold), dtype=loc_U.dtype, device=loc_U.device)
    rows = scored.nonzero().squeeze(-1)  # [n] the scored rows; the others never reach a GEMM
    inputs = (loc_U, scale_U, weight, bias, noise_scale, threshold)
    if reduction == "none":
        return _FusedOvRLoss.apply(*inputs, labels, rows, chunk_size, vocab_chunk_size, scale_eps)
    need = tuple(torch.is_grad_enabled() and x.requires_grad for x in inputs)
    return _FusedOvRLossSum.apply(*inputs, labels, rows, chunk_size, vocab_chunk_size, scale_eps, need)
