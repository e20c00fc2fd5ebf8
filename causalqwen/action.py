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
decision path), `num_probability` (the gate's $P_{\langle NUM\rangle}$, read by the losses). `ActionNetwork` has
one name per map: ``forward`` (from the law of $U$, noise infused), ``decide`` (from a given decision input) and
``locations`` (the locations alone). Each checks its law while `causalqwen.cauchy.validating`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import cauchy

__all__ = [
    "ActionNetwork",
    "ActionOutput",
    "check_law",
    "noise_infused_scale",
    "num_probability",
]


def noise_infused_scale(scale_U: Tensor, noise_scale: Tensor) -> Tensor:
    r"""Standard noise infusion, $\mathrm{scale}_{U'} = \mathrm{scale}_U + |b_{\mathrm{noise}}|$: the scale of
    $U + \varepsilon$, $\varepsilon \sim \mathrm{Cauchy}(0, |b_{\mathrm{noise}}|)$ (the location stays
    $\mathrm{loc}_U$).
    ``scale_U`` ``[..., C]``, ``noise_scale`` $= |b_{\mathrm{noise}}|$ ``[C]``; returns ``[..., C]``."""
    return scale_U + noise_scale  # [..., C] + [C]


def num_probability(loc_S_num: Tensor, scale_S_num: Tensor, threshold, num_token_id: int) -> Tensor:
    r"""The gate's $P_{\langle NUM\rangle} = P(S_{\langle NUM\rangle} > C_{\langle NUM\rangle})$ (decisions D8,
    D9), from the ``<NUM>`` column of the class law alone, ``loc_S_num`` and ``scale_S_num`` ``[...]``; ``threshold``
    is a number, a ``[]`` or a ``[V]`` tensor (then $C_{\langle NUM\rangle}$ = ``threshold[num_token_id]``). It is
    $\exp(-a(-d, s))$ with the OvR loss's own tail kernel $a$ (`cauchy.tail_nll`), $d = \mathrm{loc} - C$, in the
    dtype and on the device of ``loc_S_num`` (a number or a 0-d tensor enters as a scalar, as in every formula)."""
    per_class = isinstance(threshold, Tensor) and threshold.dim() > 0
    threshold_num = threshold[num_token_id] if per_class else threshold  # C_<NUM>, a number or []
    diff, scale = torch.broadcast_tensors(loc_S_num - threshold_num, scale_S_num)  # d = loc_S - C [...]
    return torch.exp(-cauchy.tail_nll(-diff, scale))  # P = exp(-a(-d, s)) [...]


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
        scale_S = F.linear(scale, abs_weight).clamp_min(self.scale_eps)  # [..., V]
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
