r"""The OvR head and loss in one pass: the literal path (`causalqwen.losses`), tiled.

The literal path forms the whole ``[N, V]`` law of the class scores and sums
$a(d_{nk}, s_{nk}) = -\log(1 - P_{nk})$ over the classes, swapping in $a(-d, s) = -\log P$ at the label
(`cauchy.tail_terms`, with $d = \mathrm{loc}_S - C$, $s = \mathrm{scale}_S$). The sum is separable over rows
*and* classes, so the same loss is

$$L_n = \underbrace{\sum_k a(d_{nk}, s_{nk})}_{\text{tile by tile}}
\;+\; \underbrace{a(-d_{n y_n}, s_{n y_n}) - a(d_{n y_n}, s_{n y_n})}_{\text{the label's class, on } [n] \text{
vectors}}.$$

Each tile is ``chunk_size`` rows by ``vocab_chunk_size`` classes, formed by the same linear closure as the
literal path (`ActionNetwork.decide`, with the threshold folded into the bias) and scored by the same
kernel; its gradients are the kernel's analytic derivatives, pushed through the two matrix products by
hand. No tile outlives its loop iteration, no one-hot is built, $|W|$ is formed block by block, and
ignored rows never enter a product.

Importing this module registers its two fast paths under the name ``"fused"``: `fused_loss` in
`causalqwen.losses.LOSS_FUNCTIONS` (the model's loss, with the signature of `losses.literal_loss`) and
`fused_standard_token` in `causalqwen.decision.STANDARD_TOKEN_FUNCTIONS` (the standard decision's argmax).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import cauchy
from ..action import ActionOutput, check_law, noise_infused_scale
from ..checks.values import check_positive_int
from ..decision import STANDARD_TOKEN_FUNCTIONS
from ..losses import (
    LOSS_FUNCTIONS,
    LossParts,
    as_threshold,
    at_least_float32,
    check_labels,
    check_loss_inputs,
    check_threshold,
    total_from_classification,
)
from .compiled import compiled

__all__ = [
    "fused_loss",
    "fused_standard_token",
    "fused_ovr_classification_loss",
    "tiled_ovr_loss",
    "ovr_argmax",
    "FUSED_CHUNK_SIZE",
    "FUSED_VOCAB_CHUNK_SIZE",
    "FUSED_CUDA_CHUNK_SIZE",
    "FUSED_CUDA_VOCAB_CHUNK_SIZE",
    "HeadInputs",
    "Tiling",
    "default_tiling",
]

FUSED_CHUNK_SIZE = 512  # rows per tile on the CPU; measured by `python -m benchmarks head` (and `--tune`)
FUSED_VOCAB_CHUNK_SIZE = 1024  # classes per tile on the CPU; measured likewise
# On CUDA a tile is a handful of kernel launches whatever its size, so it is sized to keep the launches few:
# 8 x 2048 positions at V = 151936 make 4 x 19 tiles (not 128 x 149). Chosen by that count, not measured:
# no GPU was lent while this was written. Four [4096, 8192] float32 tensors are 0.5 GiB.
FUSED_CUDA_CHUNK_SIZE = 4096
FUSED_CUDA_VOCAB_CHUNK_SIZE = 8192


class HeadInputs(NamedTuple):
    """The six differentiable inputs of the fused loss; gradients come back in the same tuple."""

    loc_U: Tensor | None  # [N, C]
    scale_U: Tensor | None  # [N, C]
    weight: Tensor | None  # W_cls [V, C]
    bias: Tensor | None  # b_cls [V]
    noise_scale: Tensor | None  # |b_noise| [C]
    threshold: Tensor | None  # C_k: [] or [V]


class Tiling(NamedTuple):
    rows: int  # chunk_size
    classes: int  # vocab_chunk_size
    scale_eps: float
    gemm_dtype: torch.dtype | None = None  # the products' dtype under autocast; None: the working dtype


def default_tiling(
    device: torch.device, scale_eps: float, chunk_size: int | None = None, vocab_chunk_size: int | None = None
) -> Tiling:
    """The tiles for inputs on ``device``: ``chunk_size`` rows by ``vocab_chunk_size`` classes where given (checked
    to be positive integers), else the device's defaults (``FUSED_CUDA_*`` on CUDA, ``FUSED_*`` elsewhere)."""
    cuda = torch.device(device).type == "cuda"
    rows = (FUSED_CUDA_CHUNK_SIZE if cuda else FUSED_CHUNK_SIZE) if chunk_size is None else chunk_size
    classes = (
        (FUSED_CUDA_VOCAB_CHUNK_SIZE if cuda else FUSED_VOCAB_CHUNK_SIZE)
        if vocab_chunk_size is None
        else vocab_chunk_size
    )
    return Tiling(check_positive_int("chunk_size", rows), check_positive_int("vocab_chunk_size", classes), scale_eps)


def autocast_gemm_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype autocast would run a matrix product of ``dtype`` operands on ``device_type`` in, or None outside
    autocast (and for float64, which autocast leaves alone)."""
    if dtype == torch.float64 or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


class _Rows(NamedTuple):
    """The scored rows' decision input U' (standard mode) and labels, in the working dtype."""

    loc: Tensor  # [n, C]
    scale: Tensor  # [n, C], floored at scale_eps
    floored: Tensor  # [n, C] bool: where the floor was applied (no gradient passes)
    labels: Tensor  # [n]


def _scored_rows(inputs: HeadInputs, labels: Tensor, rows: Tensor, dtype, scale_eps: float) -> _Rows:
    loc = inputs.loc_U[rows].to(dtype)  # [n, C]
    scale_raw = noise_infused_scale(inputs.scale_U[rows].to(dtype), inputs.noise_scale.to(dtype))  # [n, C]
    return _Rows(loc, scale_raw.clamp_min(scale_eps), scale_raw < scale_eps, labels[rows])


def tile_elementwise(diff: Tensor, scale_raw: Tensor, scale_eps: float, value: bool, grads: bool):
    r"""The elementwise part of one tile ``[c, b]``: the kernel $a$ on the floored scale, summed per row ``[c]``, and
    $\partial a/\partial \mathrm{loc}_S$, $\partial a/\partial \mathrm{scale}_S$ (zero where the floor applied)
    ``[c, b]``.

    This literal function is the specification; the tile runs `tile_elementwise_compiled`, the same function
    compiled into one loop (`causalqwen.kernels.compiled`), or this one where compilation is off or unavailable.
    """
    terms = cauchy.tail_terms(diff, scale_raw.clamp_min(scale_eps), value=value, grads=grads)
    row_sums = terms.value.sum(-1) if value else None  # [c]
    d_scale = terms.d_scale.masked_fill(scale_raw < scale_eps, 0.0) if grads else None  # through the floor
    return row_sums, terms.d_diff, d_scale


tile_elementwise_compiled = compiled(tile_elementwise)


def _tile_law(
    loc: Tensor, scale: Tensor, weight_b: Tensor, abs_weight_b: Tensor, shift_b: Tensor
) -> tuple[Tensor, Tensor]:
    r"""One tile's $(\mathrm{loc}_S - C,\ \mathrm{scale}_S)$ ``[c, b]`` in the working dtype of ``shift_b``.

    In the working dtype the threshold is folded into the bias of the product (as `ActionNetwork.decide` forms
    $\mathrm{loc}_S$). Under
    autocast the operands come in its dtype (bfloat16, float16): the products run there, as autocast runs
    the literal path's, and their results are widened before the shift is added, so that $C$ is not rounded
    to a few significant digits along with them."""
    if loc.dtype == shift_b.dtype:
        return F.linear(loc, weight_b, shift_b), F.linear(scale, abs_weight_b)  # [c, b] each
    diff = F.linear(loc, weight_b).to(shift_b.dtype) + shift_b  # [c, b]
    return diff, F.linear(scale, abs_weight_b).to(shift_b.dtype)


def _add_product(out: Tensor, a: Tensor, b: Tensor, accumulate: bool = True) -> None:
    """``out += a @ b`` (``out = a @ b`` without ``accumulate``), the product in ``b``'s dtype (the working one, or
    autocast's) and accumulated in ``out``'s."""
    if a.dtype == b.dtype == out.dtype:
        out.addmm_(a, b) if accumulate else torch.mm(a, b, out=out)
    else:
        product = torch.mm(a.to(b.dtype), b)
        out.add_(product) if accumulate else out.copy_(product)


def _tile_terms(loc, scale, weight_b, abs_weight_b, shift_b, *, scale_eps: float, value: bool, grads: bool):
    r"""The kernel on one tile: $a$ summed per row, and $\partial a/\partial \mathrm{loc}_S$,
    $\partial a/\partial \mathrm{scale}_S$."""
    diff, scale_raw = _tile_law(loc, scale, weight_b, abs_weight_b, shift_b)  # [c, b] each
    return tile_elementwise_compiled(diff, scale_raw, scale_eps, value, grads)


def _walk_tiles(inputs: HeadInputs, rows: _Rows, row_weight, need: HeadInputs, tiling: Tiling, value: bool):
    r"""Every tile: the per-row sum of $a$ ``[n]`` and the gradients of $\sum_n w_n \sum_k a_{nk}$ (``[n, C]`` for the
    decision input, ``[V, C]`` for $W$, ``[V]`` for $\mathrm{loc}_S$ summed over rows).

    The products run in ``tiling.gemm_dtype`` (autocast's) where it is set, everything else in the working dtype."""
    weight, n = inputs.weight, rows.loc.shape[0]
    dtype = rows.loc.dtype
    gemm = tiling.gemm_dtype or dtype
    loc_g, scale_g = rows.loc.to(gemm), rows.scale.to(gemm)  # [n, C]: the same tensors without autocast
    grads = any(need)
    row_loss = rows.loc.new_zeros(n) if value else None
    grad_loc = torch.zeros_like(rows.loc) if need.loc_U else None
    grad_scale = torch.zeros_like(rows.loc) if (need.scale_U or need.noise_scale) else None
    # every block writes its own rows of the weight gradient (unless no row is scored): no [V, C] zeroing pass
    grad_weight = (
        (torch.empty if n else torch.zeros)(weight.shape, dtype=dtype, device=weight.device) if need.weight else None
    )
    grad_classes = (
        torch.zeros(weight.shape[0], dtype=dtype, device=weight.device) if (need.bias or need.threshold) else None
    )
    if grad_weight is not None:  # reused by every block, so that their pages are touched once
        block_buffers = torch.empty(
            2, min(tiling.classes, weight.shape[0]), weight.shape[1], dtype=dtype, device=weight.device
        )
    for v0 in range(0, weight.shape[0], tiling.classes):
        block = slice(v0, v0 + tiling.classes)
        weight_b = weight[block].to(dtype)  # [b, C]
        weight_g, abs_weight_g = weight_b.to(gemm), weight_b.abs().to(gemm)
        threshold_b = inputs.threshold[block] if inputs.threshold.dim() > 0 else inputs.threshold
        shift_b = inputs.bias[block].to(dtype) - threshold_b  # loc_S - C = loc W^T + (b - C)
        if grad_weight is not None:  # written by the first row chunk's products, accumulated by the others
            grad_w_loc = block_buffers[0][: weight_b.shape[0]]  # [b, C] the W path
            grad_w_abs = block_buffers[1][: weight_b.shape[0]]  # [b, C] the |W| path
        for r0 in range(0, n, tiling.rows):
            chunk = slice(r0, r0 + tiling.rows)
            row_sums, d_loc, d_scale = _tile_terms(
                loc_g[chunk],
                scale_g[chunk],
                weight_g,
                abs_weight_g,
                shift_b,
                scale_eps=tiling.scale_eps,
                value=value,
                grads=grads,
            )
            if value:
                row_loss[chunk] += row_sums
            if not grads:
                continue
            if row_weight is not None:
                d_loc, d_scale = d_loc * row_weight[chunk, None], d_scale * row_weight[chunk, None]
            if grad_loc is not None:
                _add_product(grad_loc[chunk], d_loc, weight_g)
            if grad_scale is not None:
                _add_product(grad_scale[chunk], d_scale, abs_weight_g)
            if grad_weight is not None:
                _add_product(grad_w_loc, d_loc.t(), loc_g[chunk], accumulate=r0 > 0)
                _add_product(grad_w_abs, d_scale.t(), scale_g[chunk], accumulate=r0 > 0)
            if grad_classes is not None:
                grad_classes[block] += d_loc.sum(0)
        if grad_weight is not None and n:
            torch.addcmul(grad_w_loc, grad_w_abs, weight_b.sign(), out=grad_weight[block])  # d|W|/dW = sign(W)
    return row_loss, HeadInputs(grad_loc, grad_scale, grad_weight, grad_classes, None, None)


def _label_class(inputs: HeadInputs, rows: _Rows, row_weight, tiling: Tiling, value: bool, grads: bool):
    r"""The label's own class on ``[n]`` vectors: $B_n = a(-d_n, s_n) - a(d_n, s_n)$ with its two derivatives."""
    dtype = rows.loc.dtype
    weight_y = inputs.weight[rows.labels].to(dtype)  # [n, C]
    threshold_y = inputs.threshold[rows.labels] if inputs.threshold.dim() > 0 else inputs.threshold
    shift_y = inputs.bias[rows.labels].to(dtype) - threshold_y  # [n]
    diff = (rows.loc * weight_y).sum(-1) + shift_y  # [n]  loc_S - C at the label
    scale_raw = (rows.scale * weight_y.abs()).sum(-1)  # [n]
    scale = scale_raw.clamp_min(tiling.scale_eps)
    on = cauchy.tail_terms(-diff, scale, value=value, grads=grads)  # -log P
    off = cauchy.tail_terms(diff, scale, value=value, grads=grads)  # -log(1 - P)
    correction = on.value - off.value if value else None
    if not grads:
        return correction, None, None, weight_y
    d_diff = -on.d_diff - off.d_diff  # [n]
    d_scale = (on.d_scale - off.d_scale).masked_fill_(scale_raw < tiling.scale_eps, 0.0)
    if row_weight is not None:
        d_diff, d_scale = d_diff * row_weight, d_scale * row_weight
    return correction, d_diff, d_scale, weight_y


def _add_label_grads(grads: HeadInputs, rows: _Rows, d_diff, d_scale, weight_y) -> None:
    r"""Push the label class's derivatives through $\mathrm{loc}_S = W_y \cdot \mathrm{loc}$ and
    $\mathrm{scale}_S = |W_y| \cdot \mathrm{scale}$."""
    if grads.loc_U is not None:
        grads.loc_U.add_(d_diff[:, None] * weight_y)
    if grads.scale_U is not None:
        grads.scale_U.add_(d_scale[:, None] * weight_y.abs())
    if grads.weight is not None:
        grads.weight.index_add_(
            0, rows.labels, d_diff[:, None] * rows.loc + d_scale[:, None] * rows.scale * weight_y.sign()
        )
    if grads.bias is not None:
        grads.bias.index_add_(0, rows.labels, d_diff)


def _fused_pass(
    inputs: HeadInputs, labels: Tensor, rows: Tensor, row_weight, *, need: HeadInputs, tiling: Tiling, value: bool
) -> tuple[Tensor | None, HeadInputs]:
    r"""The per-row loss ``[N]`` (if ``value``) and the gradients of $\sum_n w_n L_n$ for the inputs flagged in
    ``need`` ($w$ = ``row_weight`` ``[N]``, None for all ones). All arithmetic is in at least float32."""
    with torch.autocast(inputs.loc_U.device.type, enabled=False):  # the products' dtype is tiling.gemm_dtype
        return _fused_pass_in_working_dtype(inputs, labels, rows, row_weight, need=need, tiling=tiling, value=value)


def _fused_pass_in_working_dtype(
    inputs: HeadInputs, labels: Tensor, rows: Tensor, row_weight, *, need: HeadInputs, tiling: Tiling, value: bool
) -> tuple[Tensor | None, HeadInputs]:
    dtype = torch.promote_types(inputs.weight.dtype, torch.float32)
    scored = _scored_rows(inputs, labels, rows, dtype, tiling.scale_eps)
    w_n = row_weight[rows].to(dtype) if row_weight is not None else None  # [n]
    row_loss, grads = _walk_tiles(inputs, scored, w_n, need, tiling, value)
    correction, d_diff, d_scale, weight_y = _label_class(inputs, scored, w_n, tiling, value, any(need))
    loss = None
    if value:
        loss = torch.zeros(inputs.loc_U.shape[0], dtype=dtype, device=inputs.loc_U.device)
        loss[rows] = row_loss + correction
    if not any(need):
        return loss, HeadInputs(*(None,) * 6)
    _add_label_grads(grads, scored, d_diff, d_scale, weight_y)
    return loss, _input_grads(inputs, rows, grads, scored.floored, need, dtype)


def _input_grads(inputs: HeadInputs, rows: Tensor, grads: HeadInputs, floored: Tensor, need: HeadInputs, dtype):
    """From the scored rows' gradients to the gradients of the six inputs (rows scattered back, the floor applied)."""
    grad_scale_in = grads.scale_U.masked_fill_(floored, 0.0) if grads.scale_U is not None else None

    def scattered(grad_rows, like):
        return torch.zeros(like.shape, dtype=dtype, device=like.device).index_copy_(0, rows, grad_rows)

    per_class = inputs.threshold.dim() > 0
    return HeadInputs(
        loc_U=scattered(grads.loc_U, inputs.loc_U) if need.loc_U else None,
        scale_U=scattered(grad_scale_in, inputs.scale_U) if need.scale_U else None,
        weight=grads.weight,
        bias=grads.bias if need.bias else None,
        noise_scale=grad_scale_in.sum(0) if need.noise_scale else None,  # d |b_noise|
        # d C = -d loc_S, summed over the rows (and over the classes for a shared threshold)
        threshold=(-grads.bias if per_class else -grads.bias.sum()) if need.threshold else None,
    )


@torch.no_grad()
def ovr_argmax(loc_U: Tensor, scale_U: Tensor, inputs: HeadInputs, tiling: Tiling) -> Tensor:
    r"""$\arg\max_k \log P_k$ for each row of the law of $U$ ``[N, C]`` under standard inference, tile by tile:
    `DecisionHead.predict`'s token, with no ``[N, V]`` tensor beyond one tile. Ties go to the lower class id."""
    dtype = torch.promote_types(inputs.weight.dtype, torch.float32)
    gemm = autocast_gemm_dtype(loc_U.device.type, dtype) or dtype
    with torch.autocast(loc_U.device.type, enabled=False):
        return _ovr_argmax(loc_U, scale_U, inputs, tiling, dtype, gemm)


def _ovr_argmax(loc_U: Tensor, scale_U: Tensor, inputs: HeadInputs, tiling: Tiling, dtype, gemm) -> Tensor:
    loc = loc_U.to(dtype)  # [N, C]
    scale = noise_infused_scale(scale_U.to(dtype), inputs.noise_scale.to(dtype)).clamp_min(tiling.scale_eps)  # [N, C]
    loc_g, scale_g = loc.to(gemm), scale.to(gemm)
    best = torch.full((loc.shape[0],), torch.inf, dtype=dtype, device=loc.device)  # smallest -log P so far
    token = torch.zeros(loc.shape[0], dtype=torch.long, device=loc.device)
    for v0 in range(0, inputs.weight.shape[0], tiling.classes):
        block = slice(v0, v0 + tiling.classes)
        weight_b = inputs.weight[block].to(dtype)  # [b, C]
        threshold_b = inputs.threshold[block] if inputs.threshold.dim() > 0 else inputs.threshold
        shift_b = inputs.bias[block].to(dtype) - threshold_b
        weight_g, abs_weight_g = weight_b.to(gemm), weight_b.abs().to(gemm)
        for r0 in range(0, loc.shape[0], tiling.rows):
            chunk = slice(r0, r0 + tiling.rows)
            diff, scale_raw = _tile_law(loc_g[chunk], scale_g[chunk], weight_g, abs_weight_g, shift_b)  # [c, b] each
            neg_log_p = cauchy.tail_terms(-diff, scale_raw.clamp_min(tiling.scale_eps)).value  # -log P
            value, index = neg_log_p.min(-1)  # [c]: the first of equal values, as argmax
            better = value < best[chunk]  # strictly: an earlier block keeps a tie
            best[chunk] = torch.where(better, value, best[chunk])
            token[chunk] = torch.where(better, index + v0, token[chunk])
    return token


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
                "Hessian): use the literal path, loss_algorithm='literal' (forward(..., return_decisions=True)) or "
                "losses.total_loss, which autograd differentiates twice"
            )
        return backward(ctx, *grad_outputs)

    return wrapper


def _cast_like(grads: HeadInputs, inputs: HeadInputs) -> HeadInputs:
    return HeadInputs(*(g.to(x.dtype) if g is not None else None for g, x in zip(grads, inputs)))


def _recomputed_grads(ctx, row_weight) -> HeadInputs:
    *tensors, labels, rows = ctx.saved_tensors
    inputs = HeadInputs(*tensors)
    need = HeadInputs(*ctx.needs_input_grad[3:])  # after (settings, labels, rows)
    _, grads = _fused_pass(inputs, labels, rows, row_weight, need=need, tiling=ctx.tiling, value=False)
    return _cast_like(grads, inputs)


class _PassSettings(NamedTuple):
    """What the autograd functions take besides tensors: the tiles, and the gradients to form in the forward pass."""

    tiling: Tiling
    need: HeadInputs  # of bools; all False for reduction="none", whose backward recomputes every tile


class _FusedOvRLoss(torch.autograd.Function):
    """``reduction="none"``: saves only its inputs; backward recomputes every tile (8 GEMMs per tile in all).

    ``inputs`` are the six tensors of `HeadInputs`, in its order."""

    @staticmethod
    def forward(ctx, settings: _PassSettings, labels, rows, *inputs):
        inputs = HeadInputs(*inputs)
        loss, _ = _fused_pass(inputs, labels, rows, None, need=settings.need, tiling=settings.tiling, value=True)
        ctx.save_for_backward(*inputs, labels, rows)
        ctx.tiling = settings.tiling
        return loss.to(inputs.loc_U.dtype)

    @staticmethod
    @_first_order_only
    def backward(ctx, grad_loss):
        return (None, None, None, *_recomputed_grads(ctx, grad_loss))


class _FusedOvRLossSum(torch.autograd.Function):
    """``reduction="sum"``: the gradients are formed in the forward pass (6 GEMMs per tile) and kept
    until backward, which hands them over scaled by the incoming scalar. A second backward through a
    retained graph recomputes them from the saved inputs. ``inputs`` as in `_FusedOvRLoss`."""

    @staticmethod
    def forward(ctx, settings: _PassSettings, labels, rows, *inputs):
        inputs = HeadInputs(*inputs)
        loss, grads = _fused_pass(inputs, labels, rows, None, need=settings.need, tiling=settings.tiling, value=True)
        ctx.grads = _cast_like(grads, inputs) if any(settings.need) else None
        ctx.save_for_backward(*inputs, labels, rows)
        ctx.tiling = settings.tiling
        return loss.sum().to(inputs.loc_U.dtype)

    @staticmethod
    @_first_order_only
    def backward(ctx, grad_total):
        if ctx.grads is not None:
            grads, ctx.grads = ctx.grads, None  # hand the buffers over: nothing [V, C] is copied
            grads = [g.mul_(grad_total) if g is not None else None for g in grads]
        else:
            grads = _recomputed_grads(ctx, grad_total.expand(ctx.saved_tensors[0].shape[0]))
        return (None, None, None, *grads)


def fused_ovr_classification_loss(
    loc_U: Tensor,
    scale_U: Tensor,
    weight: Tensor,
    bias: Tensor,
    noise_scale: Tensor,
    threshold,
    *,
    labels: Tensor,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    scale_eps: float = 1e-6,
    vocab_chunk_size: int | None = None,
    reduction: str = "none",
) -> Tensor:
    r"""The head and the OvR loss in one pass, tile by tile: per-position loss ``[N]`` (or its sum).

    Equal to the literal path ``ovr_classification_loss(*ActionNetwork.forward(loc_U, scale_U)[:2], labels,
    threshold)`` with $\mathrm{loc}_S = \mathrm{loc}_U W^\top + b$ and
    $\mathrm{scale}_S = \max(\max(\mathrm{scale}_U + |b_{\mathrm{noise}}|, \epsilon)\,|W|^\top, \epsilon)$ (see the
    module docstring). The gradients (of ``loc_U``, ``scale_U``, ``weight`` through both $W$ and $|W|$,
    ``bias``, ``noise_scale`` $= |b_{\mathrm{noise}}|$ and a tensor ``threshold``) are written analytically per tile.

    ``reduction="none"`` returns ``[N]`` (0 at ignored rows); the autograd function saves only its
    inputs and backward recomputes each tile (8 matrix products per tile in all).
    ``reduction="sum"`` returns $\sum_n L_n$; when a gradient is needed it is formed during the
    forward pass and kept until backward (6 matrix products per tile, the floor, at the cost of
    holding a ``[V, C]`` gradient between the two passes, as Liger's and Apple's fused
    cross-entropies do).

    Shapes: ``loc_U``, ``scale_U`` ``[N, C]``; ``weight`` ``[V, C]``; ``bias`` ``[V]``;
    ``noise_scale`` ``[C]``; ``threshold`` a number, ``[]`` or ``[V]``; ``labels`` ``[N]``. The arguments are
    checked while `causalqwen.cauchy.validating`; the tile sizes always.
    """
    if cauchy.validating():
        if loc_U.dim() != 2 or scale_U.shape != loc_U.shape:
            raise ValueError(
                f"loc_U and scale_U must both be [N, C], got {tuple(loc_U.shape)} and {tuple(scale_U.shape)}"
            )
        if weight.dim() != 2 or weight.shape[1] != loc_U.shape[1]:
            raise ValueError(f"weight must be [V, C] with C = {loc_U.shape[1]}, got {tuple(weight.shape)}")
        if bias.shape != (weight.shape[0],) or noise_scale.shape != (loc_U.shape[1],):
            raise ValueError(
                f"bias must be [V] and noise_scale [C]; got {tuple(bias.shape)} and {tuple(noise_scale.shape)}"
            )
        check_threshold(threshold, weight.shape[0])
        if labels.shape != loc_U.shape[:1]:
            raise ValueError(f"labels shape {tuple(labels.shape)} must be [N] = {tuple(loc_U.shape[:1])}")
        check_labels(labels, weight.shape[0], ignore_index)
    tiling = default_tiling(loc_U.device, scale_eps, chunk_size, vocab_chunk_size)
    if reduction not in ("none", "sum"):
        raise ValueError(f'reduction must be "none" or "sum", got {reduction!r}')
    inputs = HeadInputs(loc_U, scale_U, weight, bias, noise_scale, as_threshold(threshold))
    return tiled_ovr_loss(inputs, labels, labels != ignore_index, tiling, reduction=reduction)


def tiled_ovr_loss(inputs: HeadInputs, labels: Tensor, scored: Tensor, tiling: Tiling, *, reduction: str) -> Tensor:
    """The tiled pass behind `fused_ovr_classification_loss` and `fused_loss`: ``labels`` ``[N]`` scored where
    ``scored`` ``[N]`` (bool), ``inputs.threshold`` a ``[]`` or ``[V]`` tensor, ``reduction`` ``"none"`` or
    ``"sum"``."""
    loc_U, weight = inputs.loc_U, inputs.weight
    rows = scored.nonzero().squeeze(-1)  # [n] the scored rows; the others never reach a GEMM (one synchronisation)
    tiling = tiling._replace(
        gemm_dtype=autocast_gemm_dtype(loc_U.device.type, torch.promote_types(weight.dtype, torch.float32))
    )
    if reduction == "none":
        return _FusedOvRLoss.apply(_PassSettings(tiling, HeadInputs(*(False,) * 6)), labels, rows, *inputs)
    need = HeadInputs(*(torch.is_grad_enabled() and x.requires_grad for x in inputs))
    return _FusedOvRLossSum.apply(_PassSettings(tiling, need), labels, rows, *inputs)


def fused_loss(
    action,
    loc_U: Tensor,
    scale_U: Tensor,
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
    r"""`losses.literal_loss` from the law of $U$ and the `ActionNetwork` ``action``, never forming ``[..., V]``:
        registered as ``LOSS_FUNCTIONS["fused"]``.

        The classification part is `tiled_ovr_loss` (``reduction="sum"``) over the scored positions; the gate's
        $P_{\langle NUM
    angle}$ and the regression come from the action restricted to the ``<NUM>`` class, and both end
        in `losses.total_from_classification`, as the literal loss does. Returns the loss parts (``cls_loss`` is None)
        and that restricted action output (``loc_S``, ``scale_S`` ``[..., 1]``; ``loc_Y``, ``scale_Y`` ``[...]``).
        Shapes: ``loc_U``, ``scale_U`` ``[..., C]``, everything else ``[...]``. ``chunk_size`` and ``vocab_chunk_size``
        set the tiles (`default_tiling`).
    """
    head = action.classification_head
    if cauchy.validating():
        check_law(loc_U, scale_U, action.causal_size, ("loc_U", "scale_U"))
        check_loss_inputs(
            labels,
            numeric_targets,
            head.weight.shape[0],
            shapes={"loc_Y": loc_U.shape[:-1], "numeric_targets": numeric_targets.shape},
            num_token_id=num_token_id,
            threshold=threshold,
            attention_mask=attention_mask,
            ignore_index=ignore_index,
            regression_weight=regression_weight,
            gate_alpha=gate_alpha,
        )
    tiling = default_tiling(loc_U.device, action.scale_eps, chunk_size, vocab_chunk_size)
    threshold = as_threshold(threshold)  # [] or [V]
    scored = labels != ignore_index  # [...]
    if attention_mask is not None:
        scored = scored & attention_mask.bool()
    loc_U, scale_U = at_least_float32(loc_U), at_least_float32(scale_U)  # [..., C] each
    # the <NUM> column in the action's own dtype (as the literal path forms it), scored in >= float32
    num_decision = action(loc_U.to(head.weight.dtype), scale_U.to(head.weight.dtype), classes=[num_token_id])
    loc_S_num, scale_S_num, loc_Y, scale_Y = (at_least_float32(t) for t in num_decision)  # [..., 1] x2, [...] x2
    C = loc_U.shape[-1]
    inputs = HeadInputs(
        loc_U.reshape(-1, C), scale_U.reshape(-1, C), head.weight, head.bias, action.noise_scale, threshold
    )
    cls_loss_sum = tiled_ovr_loss(inputs, labels.reshape(-1), scored.reshape(-1), tiling, reduction="sum")
    num_law = ActionOutput(loc_S_num[..., 0], scale_S_num[..., 0], loc_Y, scale_Y)  # [...] each
    parts = total_from_classification(
        cls_loss_sum,
        None,
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
    return parts, num_decision


def fused_standard_token(head, loc_U: Tensor, scale_U: Tensor) -> Tensor:
    r"""`decision.literal_standard_token` from the law of $U$ ``[N, C]`` without forming ``[N, V]`` (`ovr_argmax`):
    registered as ``STANDARD_TOKEN_FUNCTIONS["fused"]``."""
    inputs = HeadInputs(
        None, None, head.classification_head.weight, head.classification_head.bias, head.noise_scale, head.ovr_threshold
    )
    return ovr_argmax(loc_U, scale_U, inputs, default_tiling(loc_U.device, head.scale_eps))


LOSS_FUNCTIONS["fused"] = fused_loss
STANDARD_TOKEN_FUNCTIONS["fused"] = fused_standard_token
