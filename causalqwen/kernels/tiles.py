r"""The tiles of the fused OvR head and loss (`causalqwen.kernels.fused`): one tile's law and kernel, the walk over
all of them with the analytic gradients, and the tiled argmax of standard inference.

A tile is ``Tiling.rows`` scored rows by ``Tiling.classes`` classes of the literal decisions
($\mathrm{loc}_S - C = \mathrm{loc}_{U} W_b^\top + b_b - C_b$, $\mathrm{scale}_S = \mathrm{scale}_{U'} |W_b|^\top$,
floored at ``scale_eps``), scored by the tail kernel `cauchy.tail_terms` (`tile_elementwise`, compiled into one
loop by `compiled`): the kernel of `causalqwen.action.ovr_tail_nll`, where the literal path forms $-\log P_k$ and
$-\log(1 - P_k)$, applied to a tile (the loss and its gradients are tested equal to the literal path's, and
`ovr_argmax` to `action.ovr_token`, in ``tests/test_kernels_fused.py``). `fused_pass` walks every tile once and
returns the per-row loss and, for the inputs flagged in ``need``, the gradients of $\sum_n w_n L_n$, formed by
hand: the kernel's derivatives pushed through the two matrix products. The derivation is in
`causalqwen.kernels.fused`'s docstring and docs/losses.md.

## The compiled tile

A literal function, compiled with ``torch.compile`` where that works, the function itself
otherwise.

The tiled head (`causalqwen.kernels.fused`) spends most of a tile's time outside its two matrix products in about
twenty elementwise passes (``atan``, ``log``, ``log1p``, ``where``, divisions), each a kernel of its own that
reads and writes the whole tile. Compiled by inductor (its C++ backend on CPU, Triton on CUDA), they become
one loop over the tile. The literal function stays the readable specification and the fallback:

* `compiled` (function) returns a callable that runs ``torch.compile(function, dynamic=True)`` and, if
  compiling or running the compiled code fails (no C++ compiler, an unsupported platform), warns once with the
  reason and runs the literal function from then on;
* inside a region that is itself being compiled (``torch.compile`` of a whole training step), the literal
  function is called, so that the outer compilation sees through it;
* under a Python tensor mode (a ``TorchDispatchMode`` or a ``TorchFunctionMode``, other than the one
  ``with torch.device(...)`` installs: tracers, counters, fake tensors), the literal function is called too:
  the mode is there to see the operations, and compiling beneath it is fragile (torch 2.13 can fail to
  recompile under a function mode after compiling under a dispatch mode);
* the environment variable ``CAUSALQWEN_COMPILE=0`` (read at each call) turns compilation off: the literal
  function runs everywhere, for debugging or for a comparison.

The compiled code computes the same formulas with the same operations in the same precision; it may round
differently (fused multiply-adds, vectorised ``atan``/``log``), so it equals the literal code to a few ulp,
not bit for bit (``tests/test_kernels_tiles.py`` measures it).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .. import cauchy
from ..action import noise_infused_scale
from ..checks.values import check_positive_int

__all__ = [
    "COMPILE_ENV",
    "compile_enabled",
    "compiled",
    "FUSED_CHUNK_SIZE",
    "FUSED_CUDA_CHUNK_SIZE",
    "FUSED_CUDA_VOCAB_CHUNK_SIZE",
    "FUSED_VOCAB_CHUNK_SIZE",
    "HeadInputs",
    "Tiling",
    "autocast_gemm_dtype",
    "default_tiling",
    "fused_pass",
    "ovr_argmax",
    "tile_elementwise",
    "tile_elementwise_compiled",
]

COMPILE_ENV = "CAUSALQWEN_COMPILE"


def _tensor_mode_active() -> bool:
    """Whether a Python dispatch mode, or a function mode other than ``torch.device``'s, is active."""
    if _get_current_dispatch_mode_stack():
        return True
    return any(not isinstance(mode, DeviceContext) for mode in _get_current_function_mode_stack())


def compile_enabled() -> bool:
    """False when ``CAUSALQWEN_COMPILE`` is set to ``0``, ``false``, ``no`` or ``off`` (any case)."""
    return os.environ.get(COMPILE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class _Compiled:
    """``function``, compiled on first use; the literal function where compilation is off or has failed."""

    def __init__(self, function: Callable):
        self.function = function
        self.failure: str | None = None  # why compilation failed, once it has
        self._compiled = None
        functools.update_wrapper(self, function)

    def __call__(self, *args, **kwargs):
        if self.failure is not None or not compile_enabled() or torch.compiler.is_compiling() or _tensor_mode_active():
            return self.function(*args, **kwargs)
        if self._compiled is None:
            self._compiled = torch.compile(self.function, dynamic=True)
        try:
            return self._compiled(*args, **kwargs)
        except Exception as error:  # inductor raises many types (no compiler, unsupported op, codegen errors)
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            warnings.warn(
                f"causalqwen: torch.compile of {self.function.__qualname__} failed ({self.failure}); running the "
                f"literal (eager) code from now on. Set {COMPILE_ENV}=0 to skip the attempt.",
                RuntimeWarning,
                stacklevel=2,
            )
            return self.function(*args, **kwargs)


def compiled(function: Callable) -> Callable:
    """``function`` compiled with ``torch.compile(dynamic=True)`` on first use, falling back to ``function`` itself
    (one ``RuntimeWarning`` naming the reason) where that fails; see the module docstring."""
    return _Compiled(function)


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
    rows = FUSED_CUDA_CHUNK_SIZE if cuda else FUSED_CHUNK_SIZE
    classes = FUSED_CUDA_VOCAB_CHUNK_SIZE if cuda else FUSED_VOCAB_CHUNK_SIZE
    if chunk_size is not None:
        rows = check_positive_int("chunk_size", chunk_size)
    if vocab_chunk_size is not None:
        classes = check_positive_int("vocab_chunk_size", vocab_chunk_size)
    return Tiling(rows, classes, scale_eps)


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
    compiled into one loop (`compiled`), or this one where compilation is off or unavailable.
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


def _gradient_buffers(rows: _Rows, weight: Tensor, need: HeadInputs, tiling: Tiling):
    r"""The accumulators of `_walk_tiles`, in the working dtype: ``[n, C]`` for $\mathrm{loc}$ and $\mathrm{scale}$,
    ``[V, C]`` for $W$, ``[V]`` for the classes, and two ``[b, C]`` block buffers of the weight gradient (None for
    what ``need`` does not ask)."""
    n, dtype, device = rows.loc.shape[0], rows.loc.dtype, weight.device
    grad_loc = torch.zeros_like(rows.loc) if need.loc_U else None
    grad_scale = torch.zeros_like(rows.loc) if (need.scale_U or need.noise_scale) else None
    # every block writes its own rows of the weight gradient (unless no row is scored): no [V, C] zeroing pass
    grad_weight = (torch.empty if n else torch.zeros)(weight.shape, dtype=dtype, device=device) if need.weight else None
    grad_classes = torch.zeros(weight.shape[0], dtype=dtype, device=device) if (need.bias or need.threshold) else None
    block_buffers = None
    if grad_weight is not None:  # reused by every block, so that their pages are touched once
        block_buffers = torch.empty(
            2, min(tiling.classes, weight.shape[0]), weight.shape[1], dtype=dtype, device=device
        )
    return grad_loc, grad_scale, grad_weight, grad_classes, block_buffers


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
    grad_loc, grad_scale, grad_weight, grad_classes, block_buffers = _gradient_buffers(rows, weight, need, tiling)
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


def fused_pass(
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
    `action.ovr_token` of the standard decisions (`DecisionHead.predict`'s token), with no ``[N, V]`` tensor beyond
    one tile. Ties go to the lower class id."""
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
