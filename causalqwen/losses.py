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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cauchy

__all__ = [
    "ovr_probability",
    "ovr_log_probability",
    "ovr_classification_loss",
    "gated_regression_loss",
    "total_loss",
    "LossParts",
    "as_bool_mask",
    "fused_ovr_classification_loss",
]


def _check_threshold(threshold, num_classes: int) -> None:
    if isinstance(threshold, Tensor) and threshold.dim() > 0 and threshold.shape != (num_classes,):
        raise ValueError(
            f"a per-class threshold must have shape ({num_classes},) to match the {num_classes} classes, "
            f"got {tuple(threshold.shape)}"
        )


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
    """The total loss and its parts. ``n_cls`` / ``n_reg`` count the scored / regression positions."""

    total: Tensor
    cls_loss_mean: Tensor
    reg_loss_effective: Tensor
    n_cls: Tensor
    n_reg: Tensor
    cls_loss: Tensor  # [...] per position
    reg_loss: Tensor  # [...] per position (gated)


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

    $$\mathrm{valid}_i = \mathrm{mask}_i \wedge (y_i \ne \mathrm{ignore}),\quad
    \bar L_{\mathrm{cls}} = \frac{\sum_i \mathrm{valid}_i L_{\mathrm{cls},i}}{\max(\sum_i \mathrm{valid}_i, 1)},$$
    $$m_i = \mathrm{valid}_i \wedge (y_i = \langle NUM\rangle),\quad
    L_{\mathrm{reg,eff}} = \frac{\sum_i \mathrm{gate}_i\,\mathrm{nll}_i}{\max(\sum_i m_i, 1)}.$$

    Inputs are aligned (position $i$ is scored against ``labels[i]``); ``attention_mask`` (optional,
    0/1, same shape as ``labels``) switches positions off. ``threshold`` is a number or a ``[V]``
    tensor. The gate's $P_{\langle NUM\rangle}$ uses the ``<NUM>`` column only; with
    ``detach_gate`` it carries no gradient.
    """
    num_classes = loc_S.shape[-1]
    _check_threshold(threshold, num_classes)
    shapes = {"loc_Y": loc_Y.shape, "scale_Y": scale_Y.shape, "numeric_targets": numeric_targets.shape}
    if attention_mask is not None:
        shapes["attention_mask"] = attention_mask.shape
    for name, shape in shapes.items():
        if shape != labels.shape:
            raise ValueError(f"{name} shape {tuple(shape)} must equal labels shape {tuple(labels.shape)}")
    if not 0 <= num_token_id < num_classes:
        raise ValueError(f"num_token_id={num_token_id} is not a class index in [0, {num_classes})")

    valid = _check_labels(labels, num_classes, ignore_index)
    if attention_mask is not None:
        valid = valid & as_bool_mask(attention_mask, "attention_mask")
    masked_labels = labels.masked_fill(~valid, ignore_index)

    cls_loss = ovr_classification_loss(loc_S, scale_S, masked_labels, threshold, ignore_index)  # [...]
    n_cls = valid.sum()
    cls_loss_mean = cls_loss.sum() / n_cls.clamp(min=1)

    num_mask = valid & (labels == num_token_id)
    num_threshold = threshold[num_token_id] if isinstance(threshold, Tensor) and threshold.dim() > 0 else threshold
    num_column = slice(num_token_id, num_token_id + 1)
    p_num = ovr_probability(loc_S[..., num_column], scale_S[..., num_column], num_threshold).squeeze(-1)  # [...]
    if detach_gate:
        p_num = p_num.detach()
    reg_loss = gated_regression_loss(loc_Y, scale_Y, numeric_targets, p_num, num_mask, gate_alpha)  # [...]
    n_reg = num_mask.sum()
    reg_loss_effective = reg_loss.sum() / n_reg.clamp(min=1)

    total = cls_loss_mean + regression_weight * reg_loss_effective
    return LossParts(
        total=total,
        cls_loss_mean=cls_loss_mean,
        reg_loss_effective=reg_loss_effective,
        n_cls=n_cls,
        n_reg=n_reg,
        cls_loss=cls_loss,
        reg_loss=reg_loss,
    )


# ---- the fused, chunked path (memory-flat head + loss) ----

FUSED_CHUNK_SIZE = 256  # rows per chunk; provisional until measured by the head benchmark


def _fused_chunk_loss(loc_U, scale_U, weight, abs_weight, bias, noise_scale, threshold, labels, scale_eps) -> Tensor:
    r"""OvR loss of a chunk of rows, never forming a one-hot:
    $L_n = -\sum_k \log(1 - P_{nk}) - \big[\log P_{n y_n} - \log(1 - P_{n y_n})\big]$."""
    scale_in = (scale_U + noise_scale).clamp_min(scale_eps)  # [n, C], as ActionNetwork.decide
    loc_S = F.linear(loc_U, weight, bias)  # [n, V]
    scale_S = F.linear(scale_in, abs_weight).clamp_min(scale_eps)  # [n, V]
    log_not_p = cauchy.log_cdf(threshold, loc_S, scale_S)  # [n, V]
    column = labels.unsqueeze(-1)  # [n, 1]
    threshold_y = threshold[labels] if threshold.dim() > 0 else threshold  # [n] or []
    log_p_y = cauchy.log_sf(threshold_y, loc_S.gather(-1, column).squeeze(-1), scale_S.gather(-1, column).squeeze(-1))
    return -(log_not_p.sum(-1) + log_p_y - log_not_p.gather(-1, column).squeeze(-1))  # [n]


class _FusedOvRLoss(torch.autograd.Function):
    """Saves only its inputs; forward and backward walk the scored rows chunk by chunk."""

    @staticmethod
    def forward(ctx, loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, chunk_size, scale_eps):
        abs_weight = weight.abs()  # [V, C]
        loss = loc_U.new_zeros(loc_U.shape[0])  # [N]
        for start in range(0, rows.numel(), chunk_size):
            r = rows[start : start + chunk_size]
            loss[r] = _fused_chunk_loss(loc_U[r], scale_U[r], weight, abs_weight, bias, noise_scale, threshold, labels[r], scale_eps)
        ctx.save_for_backward(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows)
        ctx.chunk_size, ctx.scale_eps = chunk_size, scale_eps
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows = ctx.saved_tensors
        abs_weight = weight.detach().abs()
        leaves = [weight.detach(), abs_weight, bias.detach(), noise_scale.detach(), threshold.detach()]
        totals = [torch.zeros_like(leaf) for leaf in leaves]  # d W (loc path), d |W|, d b, d |b_noise|, d C
        grad_loc_U, grad_scale_U = torch.zeros_like(loc_U), torch.zeros_like(scale_U)
        for start in range(0, rows.numel(), ctx.chunk_size):
            r = rows[start : start + ctx.chunk_size]
            with torch.enable_grad():
                chunk = [loc_U[r].detach().requires_grad_(), scale_U[r].detach().requires_grad_()]
                params = [leaf.requires_grad_() for leaf in leaves]
                loss = _fused_chunk_loss(chunk[0], chunk[1], params[0], params[1], params[2], params[3], params[4],
                                         labels[r], ctx.scale_eps)
                grads = torch.autograd.grad(loss, chunk + params, grad_loss[r])
            grad_loc_U[r], grad_scale_U[r] = grads[0], grads[1]
            for total, grad in zip(totals, grads[2:]):
                total += grad
        grad_weight = totals[0] + totals[1] * torch.sign(weight)  # the loc path plus the |W| path
        return grad_loc_U, grad_scale_U, grad_weight, totals[2], totals[3], totals[4], None, None, None, None


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
) -> Tensor:
    r"""The head and the OvR loss in one pass, row chunk by row chunk: per-position loss ``[N]``.

    Equal to the literal path ``ovr_classification_loss(*ActionNetwork.forward(loc_U, scale_U)[:2], labels,
    threshold)`` with $\mathrm{loc}_S = \mathrm{loc}_U W^\top + b$ and
    $\mathrm{scale}_S = \max(\max(\mathrm{scale}_U + |b_{\mathrm{noise}}|, \epsilon)\,|W|^\top, \epsilon)$, but
    the OvR loss is separable over classes, so each chunk of rows gives its exact loss and gradient:
    no ``[N, V]`` tensor beyond one chunk exists, ignored rows never enter a matrix product, and no
    one-hot is built. Backward recomputes each chunk (nothing of size ``[N, V]`` is saved) and
    returns the gradients of ``loc_U``, ``scale_U``, ``weight`` (through $W$ and $|W|$), ``bias``,
    ``noise_scale`` and a tensor ``threshold``.

    Shapes: ``loc_U``, ``scale_U`` ``[N, C]``; ``weight`` ``[V, C]``; ``bias`` ``[V]``;
    ``noise_scale`` ``[C]`` ($|b_{\mathrm{noise}}|$); ``threshold`` a number, ``[]`` or ``[V]``; ``labels`` ``[N]``.
    """
    if loc_U.dim() != 2 or scale_U.shape != loc_U.shape:
        raise ValueError(f"loc_U and scale_U must both be [N, C], got {tuple(loc_U.shape)} and {tuple(scale_U.shape)}")
    num_classes = weight.shape[0]
    _check_threshold(threshold, num_classes)
    if labels.shape != loc_U.shape[:1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be [N] = {tuple(loc_U.shape[:1])}")
    scored = _check_labels(labels, num_classes, ignore_index)
    if chunk_size is None:
        chunk_size = FUSED_CHUNK_SIZE
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not isinstance(threshold, Tensor):
        threshold = torch.tensor(float(threshold), dtype=loc_U.dtype, device=loc_U.device)
    rows = scored.nonzero().squeeze(-1)  # [n] the scored rows; the others never reach a GEMM
    return _FusedOvRLoss.apply(loc_U, scale_U, weight, bias, noise_scale, threshold, labels, rows, chunk_size, scale_eps)
