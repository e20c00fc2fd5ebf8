r"""Action network (decision D7; docs: action.md): exogenous noise, then the linear Cauchy closure.

Noise infusion adds independent $\varepsilon \sim \mathrm{Cauchy}(0, |b_{\mathrm{noise}}|)$ to each component of
$U$; by closure under addition

$$U' = U + \varepsilon \sim \mathrm{Cauchy}(\mathrm{loc}_U,\ \mathrm{scale}_U + |b_{\mathrm{noise}}|).$$

The decisions are linear in $U'$, so their laws are again Cauchy, computed on parameters alone:

$$\mathrm{loc}_{S} = W_{\mathrm{cls}}\,\mathrm{loc}_{U'} + b_{\mathrm{cls}},\quad
\mathrm{scale}_{S} = |W_{\mathrm{cls}}|\,\mathrm{scale}_{U'},\qquad
\mathrm{loc}_{Y} = w_{\mathrm{reg}}\cdot\mathrm{loc}_{U'} + b_{\mathrm{reg}},\quad
\mathrm{scale}_{Y} = |w_{\mathrm{reg}}|\cdot\mathrm{scale}_{U'}.$$

$W_{\mathrm{cls}}$ is ``classification_head.weight`` (``[V, C]``, a copy of the base model's lm_head),
$w_{\mathrm{reg}}$ is ``regression_head.weight`` (``[1, C]``). Initialization: $b_{\mathrm{cls}} = 0$,
$w_{\mathrm{reg}}$ Xavier-uniform, $b_{\mathrm{reg}} = 0$, $b_{\mathrm{noise}}$ equal to ``noise_init`` (0.1) in every
component.
A zero ``b_noise`` is possible but never learns: $\partial|b|/\partial b = 0$ at $b = 0$ in PyTorch.

One owner each: `noise_infused_scale` (standard noise infusion), `check_law` (the check of a law handed to the
decision path). `ActionNetwork` has one name per map: ``forward`` (from the law of $U$, noise infused), ``decide``
(from a given decision input) and ``locations`` (the locations alone). Each checks its law while
`causalqwen.cauchy.validating`.

**One-vs-Rest (decision D8).** Class $k$ is "on" when its score clears its threshold $C_k$:

$$P_k = P(S_k > C_k) = \tfrac12 + \tfrac1\pi \arctan\frac{\mathrm{loc}_{S_k} - C_k}{\mathrm{scale}_{S_k}}.$$

Every OvR quantity is formed here, once, and read by the losses, the decision head, the inference modes and the
regression: `ovr_probability` ($P_k$, the Cauchy survival function at $C_k$), `ovr_tail_nll`
($-\log P_k$ and $-\log(1 - P_k)$ from the one tail kernel, in log space with no ``eps``),
`ovr_log_probability` (their negatives, checked), `ovr_token` (the decision $\arg\max_k P_k$, taken over
$\log P_k$) and `num_probability` (the ``<NUM>`` gate $P_{\langle NUM\rangle}$ of the regression loss).
`causalqwen.kernels.tiles` forms the same kernel tile by tile and is tested equal to these
(``tests/test_kernels_fused.py``).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import cauchy

__all__ = [
    "ActionNetwork",
    "ActionOutput",
    "check_law",
    "check_threshold",
    "noise_infused_scale",
    "num_probability",
    "ovr_log_probability",
    "ovr_probability",
    "ovr_tail_nll",
    "ovr_token",
]


def noise_infused_scale(scale_U: Tensor, noise_scale: Tensor) -> Tensor:
    r"""Standard noise infusion, $\mathrm{scale}_{U'} = \mathrm{scale}_U + |b_{\mathrm{noise}}|$: the scale of
    $U + \varepsilon$, $\varepsilon \sim \mathrm{Cauchy}(0, |b_{\mathrm{noise}}|)$ (the location stays
    $\mathrm{loc}_U$).
    ``scale_U`` ``[..., C]``, ``noise_scale`` $= |b_{\mathrm{noise}}|$ ``[C]``; returns ``[..., C]``."""
    return scale_U + noise_scale  # [..., C] + [C]


def check_law(loc, scale, causal_size: int | None = None, names: tuple[str, str] = ("loc", "scale")) -> None:
    """The one check of a Cauchy law handed to the decision path: ``loc`` and ``scale`` floating-point tensors with
    last dimension $C$ (``causal_size``; ``loc``'s own last dimension if None), and ``scale >= 0`` (NaN fails).

    The clamp at ``scale_eps`` is for spreads that are legitimately zero or tiny (decision D10); a negative or NaN
    scale is not a Cauchy law and is an error, not something to clamp away.
    """
    for name, tensor in zip(names, (loc, scale)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [..., C], got {type(tensor).__name__}")
        if not tensor.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor [..., C], got {tensor.dtype}")
    if causal_size is None and loc.dim() > 0:
        causal_size = loc.shape[-1]
    for name, tensor in zip(names, (loc, scale)):
        if tensor.dim() == 0 or tensor.shape[-1] != causal_size:
            raise ValueError(f"{name} must have last dimension C = {causal_size}, got shape {tuple(tensor.shape)}")
    if not bool((scale >= 0).all()):
        bad = scale[~(scale >= 0)].flatten()[0].item()
        raise ValueError(f"{names[1]} must be >= 0 everywhere (a Cauchy scale); found {bad!r}")


class ActionOutput(NamedTuple):
    loc_S: Tensor  # [..., V]
    scale_S: Tensor  # [..., V]
    loc_Y: Tensor  # [...]
    scale_Y: Tensor  # [...]


class ActionNetwork(nn.Module):
    """Exogenous noise $b_{\\mathrm{noise}}$ plus the classification and regression heads."""

    def __init__(self, causal_size: int, vocab_size: int, noise_init: float = 0.1, scale_eps: float = 1e-6):
        super().__init__()
        self.noise_init = noise_init
        self.scale_eps = scale_eps
        self.classification_head = nn.Linear(causal_size, vocab_size)  # W_cls [V, C], b_cls [V]
        self.regression_head = nn.Linear(causal_size, 1)  # w_reg [1, C], b_reg [1]
        self.b_noise = nn.Parameter(torch.empty(causal_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Decision D7. ``classification_head.weight`` keeps whatever it holds (``from_qwen`` copies lm_head). The
        ``torch.nn.init`` functions keep a tensor transformers has loaded (it guards them while it initialises)."""
        nn.init.zeros_(self.classification_head.bias)
        nn.init.xavier_uniform_(self.regression_head.weight)
        nn.init.zeros_(self.regression_head.bias)
        nn.init.constant_(self.b_noise, self.noise_init)

    @property
    def noise_scale(self) -> Tensor:
        r"""$|b_{\mathrm{noise}}|$, ``[C]``."""
        return self.b_noise.abs()

    @property
    def causal_size(self) -> int:
        """$C$, the number of components of $U$."""
        return self.b_noise.shape[0]

    def forward(self, loc_U: Tensor, scale_U: Tensor, *, classes=None) -> ActionOutput:
        r"""Standard (noise-infused) decisions from the law of $U$ ``[..., C]``: `decide` on the decision input
        $(\mathrm{loc}_U,\ \mathrm{scale}_U + |b_{\mathrm{noise}}|)$ (`noise_infused_scale`). ``classes`` as in
        `decide`."""
        if cauchy.validating():
            check_law(loc_U, scale_U, self.causal_size, ("loc_U", "scale_U"))  # scale_U >= 0, so the sum is too
        return self.decide(loc_U, noise_infused_scale(scale_U, self.b_noise.abs()), classes=classes)

    def decide(self, loc: Tensor, scale: Tensor, *, abs_weight: Tensor | None = None, classes=None) -> ActionOutput:
        r"""The four decision parameters for a given decision input
        $U' \sim \mathrm{Cauchy}(\mathrm{loc}, \mathrm{scale})$, ``[..., C]``: the linear closure of the module
        docstring.

        No noise is added here. The input scale and the output scales are clamped below at
        ``scale_eps`` (decision D10), so a decision input with no spread at all (causal mode with
        $b_{\mathrm{noise}} = 0$) still gives finite OvR probabilities. ``abs_weight`` is
        $|W_{\mathrm{cls}}|$ precomputed by a caller that decides many times with the same weights
        (`cauchy.linear`). ``classes`` (a list or index tensor of class ids) keeps only those columns
        of ``loc_S``/``scale_S``, in that order, in the spirit of transformers' ``logits_to_keep``.
        """
        if cauchy.validating():
            check_law(loc, scale, self.causal_size)
        scale = scale.clamp_min(self.scale_eps)  # [..., C], max(scale, eps) (D10)
        weight, bias = self.classification_head.weight, self.classification_head.bias  # [V, C], [V]
        if classes is not None:
            weight, bias = weight[classes], bias[classes]  # [K, C], [K]
            abs_weight = abs_weight[classes] if abs_weight is not None else None
        abs_weight = weight.abs() if abs_weight is None else abs_weight
        w_reg, b_reg = self.regression_head.weight, self.regression_head.bias  # [1, C], [1]
        # loc_S = loc W^T + b,  scale_S = max(scale |W|^T, eps)
        # loc_Y = loc . w + b_reg,  scale_Y = max(scale . |w|, eps)
        loc_S = F.linear(loc, weight, bias)  # [..., V] (or [..., K])
        scale_S = F.linear(scale, abs_weight).clamp_min(self.scale_eps)  # [..., V] (or [..., K])
        loc_Y = F.linear(loc, w_reg, b_reg).squeeze(-1)  # [...]
        scale_Y = F.linear(scale, w_reg.abs()).squeeze(-1).clamp_min(self.scale_eps)  # [...]
        return ActionOutput(loc_S, scale_S, loc_Y, scale_Y)

    def locations(self, loc: Tensor) -> tuple[Tensor, Tensor]:
        r"""The locations alone,
        $(\mathrm{loc}_S, \mathrm{loc}_Y) = (W_{\mathrm{cls}}\,\mathrm{loc} + b_{\mathrm{cls}},\
        w_{\mathrm{reg}}\cdot\mathrm{loc} + b_{\mathrm{reg}})$, ``[..., V]`` and ``[...]``, for a decision input with
        location ``loc`` ``[..., C]``: equal to `decide`'s ``loc_S`` and ``loc_Y``, without the
        $|W_{\mathrm{cls}}|$ product the scales need. A location does not depend on the scale, so neither the
        noise nor the floor enters."""
        loc_S = F.linear(loc, self.classification_head.weight, self.classification_head.bias)  # [..., V]
        loc_Y = F.linear(loc, self.regression_head.weight, self.regression_head.bias).squeeze(-1)  # [...]
        return loc_S, loc_Y


# ---- One-vs-Rest: P_k, its logs, the decision and the <NUM> gate ----


def check_threshold(threshold, num_classes: int, dtype: torch.dtype | None = None) -> None:
    """A threshold is a finite number, a 0-d tensor or a ``[V]`` tensor (a NaN or ±inf $C_k$ makes every $P_k$ NaN, 0
    or 1); a number must also be finite in ``dtype``, the floating type the formula computes in (``1e39`` is ±inf in
    float32)."""
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
    if dtype is not None and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()  # integer decisions are computed in the default float
    if not isinstance(threshold, Tensor) and dtype is not None and abs(threshold) > torch.finfo(dtype).max:
        raise ValueError(
            f"threshold={threshold!r} is beyond the range of {dtype}, the type the OvR probabilities are computed in "
            "(it would be ±inf there)"
        )


def ovr_probability(loc_S, scale_S, threshold) -> Tensor:
    r"""One-vs-Rest probability $P_k = P(S_k > C_k)$, the Cauchy survival function at the threshold (`cauchy.sf`).

    ``threshold`` is a number, a 0-d tensor, or a per-class tensor of shape ``[V]``. Same shape as ``loc_S``.
    """
    if cauchy.validating():
        check_threshold(threshold, loc_S.shape[-1], loc_S.dtype)
    return cauchy.sf(threshold, loc_S, scale_S)


def ovr_tail_nll(loc_S: Tensor, scale_S: Tensor, threshold, *, off: bool = True) -> tuple[Tensor, Tensor | None]:
    r"""$(-\log P_k,\ -\log(1 - P_k)) = (a(-d, s),\ a(d, s))$ with the tail kernel $a$ (`cauchy.tail_terms`,
    through `cauchy.tail_nll` for autograd), $d = \mathrm{loc}_S - C$, $s = \mathrm{scale}_S$; both ``[..., V]`` (the
    second only with ``off``), in the dtype of ``loc_S``. The one place $d$ meets the kernel; the inputs' checks are its
    callers'."""
    diff, scale = torch.broadcast_tensors(loc_S - threshold, scale_S)  # d = loc_S - C, s = scale_S [..., V]
    return cauchy.tail_nll(-diff, scale), (cauchy.tail_nll(diff, scale) if off else None)


def ovr_log_probability(loc_S, scale_S, threshold) -> tuple[Tensor, Tensor]:
    r"""$(\log P_k,\ \log(1 - P_k))$ computed without cancellation: the negatives of `ovr_tail_nll`, after checking
    the arguments while `causalqwen.cauchy.validating`."""
    if cauchy.validating():
        check_threshold(threshold, loc_S.shape[-1], loc_S.dtype)
        cauchy.check_arguments(threshold, loc_S, scale_S)
    on, off = ovr_tail_nll(loc_S, scale_S, threshold)
    return -on, -off


def ovr_token(loc_S: Tensor, scale_S: Tensor, threshold) -> Tensor:
    r"""The decision $\hat k = \arg\max_k P_k$ on inputs already checked; ``[..., V]`` in, ``[...]`` (long) out.

    The argmax is taken over $\log P_k$ (`ovr_tail_nll`), which is monotone in $P_k$ but keeps classes apart where
    $P_k$ itself rounds to 1. Ties go to the lower class id.
    """
    neg_log_p, _ = ovr_tail_nll(loc_S, scale_S, threshold, off=False)  # -log P_k [..., V]
    return neg_log_p.argmin(dim=-1)  # argmax_k log P_k [...]


def num_probability(loc_S_num: Tensor, scale_S_num: Tensor, threshold, num_token_id: int) -> Tensor:
    r"""The gate's $P_{\langle NUM\rangle} = P(S_{\langle NUM\rangle} > C_{\langle NUM\rangle})$ (decisions D8,
    D9), from the ``<NUM>`` column of the class law alone, ``loc_S_num`` and ``scale_S_num`` ``[...]``; ``threshold``
    is a number, a ``[]`` or a ``[V]`` tensor (then $C_{\langle NUM\rangle}$ = ``threshold[num_token_id]``). It is
    $\exp(-a(-d, s))$ with the OvR loss's own kernel (`ovr_tail_nll`), in the dtype and on the device of
    ``loc_S_num``."""
    per_class = isinstance(threshold, Tensor) and threshold.dim() > 0
    threshold_num = threshold[num_token_id] if per_class else threshold  # C_<NUM>, a number or []
    neg_log_p, _ = ovr_tail_nll(loc_S_num, scale_S_num, threshold_num, off=False)  # -log P_<NUM> [...]
    return torch.exp(-neg_log_p)  # [...]
