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

The tiles themselves, their walk and the tiled argmax are `causalqwen.kernels.tiles`; this module holds the
autograd functions around the walk and the entry points. Its two fast paths are named ``"fused"`` in the registries,
which import this module on their first use: `fused_loss` in `causalqwen.losses.LOSS_FUNCTIONS` (the model's loss,
with the signature of `losses.literal_loss`) and `fused_standard_token` in
`causalqwen.decision.STANDARD_TOKEN_FUNCTIONS` (the standard decision's argmax).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from .. import cauchy
from ..action import ActionOutput, check_law, check_threshold
from ..losses import (
    LossParts,
    at_least_float32,
    check_labels,
    check_loss_inputs,
    total_from_classification,
)
from .tiles import HeadInputs, Tiling, autocast_gemm_dtype, default_tiling, fused_pass, ovr_argmax

__all__ = ["fused_loss", "fused_ovr_classification_loss", "fused_standard_token", "tiled_ovr_loss"]


def as_threshold(threshold) -> Tensor:
    """The threshold as the tiles take it, a tensor: a number becomes a 0-d float64 tensor on the CPU, which torch
    treats as a scalar beside tensors of every device and dtype (as it treats the number); a tensor is returned as it
    is."""
    return threshold if isinstance(threshold, Tensor) else torch.tensor(float(threshold), dtype=torch.float64)


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
    _, grads = fused_pass(inputs, labels, rows, row_weight, need=need, tiling=ctx.tiling, value=False)
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
        loss, _ = fused_pass(inputs, labels, rows, None, need=settings.need, tiling=settings.tiling, value=True)
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
        loss, grads = fused_pass(inputs, labels, rows, None, need=settings.need, tiling=settings.tiling, value=True)
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
        check_threshold(threshold, weight.shape[0], torch.float32)
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
    threshold,
    attention_mask: Tensor | None = None,
    ignore_index: int = -100,
    regression_weight: float = 1.0,
    gate_alpha: float = 0.0,
    detach_gate: bool,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
) -> tuple[LossParts, ActionOutput]:
    r"""`losses.literal_loss` from the law of $U$ and the `ActionNetwork` ``action``, never forming ``[..., V]``:
    registered as ``LOSS_FUNCTIONS["fused"]``.

    The classification part is `tiled_ovr_loss` (``reduction="sum"``) over the scored positions; the gate's
    $P_{\langle NUM\rangle}$ and the regression come from the action restricted to the ``<NUM>`` class, and both
    end in `losses.total_from_classification`, as the literal loss does. Returns the loss parts (``cls_loss`` is
    None) and that restricted action output (``loc_S``, ``scale_S`` ``[..., 1]``; ``loc_Y``, ``scale_Y`` ``[...]``).
    Shapes: ``loc_U``, ``scale_U`` ``[..., C]``, everything else ``[...]``. ``chunk_size`` and ``vocab_chunk_size``
    set the tiles (`default_tiling`).
    """
    settings = dict(regression_weight=regression_weight, gate_alpha=gate_alpha)
    if cauchy.validating():
        check_law(loc_U, scale_U, action.causal_size, ("loc_U", "scale_U"))
        check_loss_inputs(
            labels,
            numeric_targets,
            action.classification_head.weight.shape[0],
            shapes={"loc_Y": loc_U.shape[:-1], "numeric_targets": numeric_targets.shape},
            num_token_id=num_token_id,
            threshold=threshold,
            attention_mask=attention_mask,
            ignore_index=ignore_index,
            **settings,
        )
    tiling = default_tiling(loc_U.device, action.scale_eps, chunk_size, vocab_chunk_size)
    scored = labels != ignore_index  # [...]
    if attention_mask is not None:
        scored = scored & attention_mask.bool()
    loc_U, scale_U = at_least_float32(loc_U), at_least_float32(scale_U)  # [..., C] each
    # the <NUM> column in the action's own dtype (as the literal path forms it), scored in >= float32
    dtype = action.classification_head.weight.dtype
    num_decision = action(loc_U.to(dtype), scale_U.to(dtype), classes=[num_token_id])  # [..., 1] x2, [...] x2
    inputs = _head_inputs(action, loc_U, scale_U, threshold)  # [N, C] rows
    cls_loss_sum = tiled_ovr_loss(inputs, labels.reshape(-1), scored.reshape(-1), tiling, reduction="sum")
    loc_S_num, scale_S_num, loc_Y, scale_Y = (at_least_float32(t) for t in num_decision)
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
        detach_gate=detach_gate,
        **settings,
    )
    return parts, num_decision


def _head_inputs(action, loc_U: Tensor, scale_U: Tensor, threshold) -> HeadInputs:
    """The tiles' inputs: the law of $U$ as ``[N, C]`` rows and the action's weights, bias, noise and threshold."""
    head, C = action.classification_head, loc_U.shape[-1]
    return HeadInputs(
        loc_U.reshape(-1, C),
        scale_U.reshape(-1, C),
        head.weight,
        head.bias,
        action.noise_scale,
        as_threshold(threshold),
    )


def fused_standard_token(head, loc_U: Tensor, scale_U: Tensor) -> Tensor:
    r"""`decision.literal_standard_token` from the law of $U$ ``[N, C]`` without forming ``[N, V]`` (`ovr_argmax`):
    registered as ``STANDARD_TOKEN_FUNCTIONS["fused"]``."""
    inputs = HeadInputs(
        None, None, head.classification_head.weight, head.classification_head.bias, head.noise_scale, head.ovr_threshold
    )
    return ovr_argmax(loc_U, scale_U, inputs, default_tiling(loc_U.device, head.scale_eps))
