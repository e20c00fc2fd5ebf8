r"""Abduction network (decision D6; docs: abduction.md): from features $z$ to the law of the individual $U$.

$$\mathrm{loc}_U = W_{\mathrm{loc}}\, z + b_{\mathrm{loc}}, \qquad
\mathrm{scale}_U = \operatorname{softplus}(W_{\mathrm{scale}}\, z + b_{\mathrm{scale}}), \qquad
U \sim \mathrm{Cauchy}(\mathrm{loc}_U, \mathrm{scale}_U)\ \text{(independent components)}.$$

Initialization: $W_{\mathrm{loc}} = I$ (so $C = H$ is required), $b_{\mathrm{loc}} = 0$, $W_{\mathrm{scale}} = 0$,
$b_{\mathrm{scale}} = \operatorname{softplus}^{-1}(\gamma)$, which gives $U_i \sim \mathrm{Cauchy}(z_i, \gamma\mathbf 1)$ at the start.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import initialization as init

__all__ = ["AbductionNetwork", "inverse_softplus"]


def inverse_softplus(y: float) -> float:
    r"""$\operatorname{softplus}^{-1}(y) = \log(e^y - 1) = y + \log(1 - e^{-y})$ for $y > 0$.

    The second form neither overflows for large $y$ nor loses precision for small $y$.
    """
    if not (isinstance(y, (int, float)) and math.isfinite(y) and y > 0):
        raise ValueError(f"softplus only takes values > 0; cannot invert {y!r}")
    return y + math.log(-math.expm1(-y))


class AbductionNetwork(nn.Module):
    r"""$z \mapsto (\mathrm{loc}_U, \mathrm{scale}_U)$; ``[B, S, H] -> ([B, S, C], [B, S, C])``.

    Parameters are named as in the formulas: ``W_loc`` ``[C, H]``, ``b_loc`` ``[C]``, ``W_scale`` ``[C, H]``,
    ``b_scale`` ``[C]``. ``scale_U`` is clamped below at ``scale_eps`` (decision D10), so it can always divide.
    """

    def __init__(self, hidden_size: int, causal_size: int, scale_init: float = 10.0, scale_eps: float = 1e-6):
        super().__init__()
        if causal_size != hidden_size:
            raise ValueError(
                f"causal_size ({causal_size}) must equal hidden_size ({hidden_size}): "
                "the abduction network starts as the identity map z -> z"
            )
        self.scale_init = scale_init
        self.scale_eps = scale_eps
        self.W_loc = nn.Parameter(torch.empty(causal_size, hidden_size))
        self.b_loc = nn.Parameter(torch.empty(causal_size))
        self.W_scale = nn.Parameter(torch.empty(causal_size, hidden_size))
        self.b_scale = nn.Parameter(torch.empty(causal_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        r"""Identity location map and constant scale $\gamma$ (decision D6)."""
        init.eye_(self.W_loc)
        init.zeros_(self.b_loc)
        init.zeros_(self.W_scale)
        init.constant_(self.b_scale, inverse_softplus(self.scale_init))

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        loc_U = F.linear(z, self.W_loc, self.b_loc)  # [B, S, C]
        scale_U = F.softplus(F.linear(z, self.W_scale, self.b_scale)).clamp_min(self.scale_eps)  # [B, S, C]
        return loc_U, scale_U
