r"""Abduction network (decision D6; docs: abduction.md): from features $z$ to the law of the individual $U$.

$$\mathrm{loc}_U = W_{\mathrm{loc}}\, z + b_{\mathrm{loc}}, \qquad
\mathrm{scale}_U = \operatorname{softplus}(W_{\mathrm{scale}}\, z + b_{\mathrm{scale}}), \qquad
U \sim \mathrm{Cauchy}(\mathrm{loc}_U, \mathrm{scale}_U)\ \text{(independent components)}.$$

Initialization: $W_{\mathrm{loc}} = I$ (so $C = H$ is required), $b_{\mathrm{loc}} = 0$, $W_{\mathrm{scale}} = 0$,
$b_{\mathrm{scale}} = \operatorname{softplus}^{-1}(\gamma)$, which gives
$U_i \sim \mathrm{Cauchy}(z_i, \gamma\mathbf 1)$ at the start.

A second architecture (``abduction_type="mlp"``, `MLPAbductionNetwork`) adds a residual MLP to both maps,

$$h = \operatorname{GELU}(W_{\mathrm{in}}\, z + b_{\mathrm{in}}), \qquad
\mathrm{loc}_U = W_{\mathrm{loc}}\, z + b_{\mathrm{loc}} + W_{\mathrm{loc},h}\, h, \qquad
\mathrm{scale}_U = \operatorname{softplus}(W_{\mathrm{scale}}\, z + b_{\mathrm{scale}} + W_{\mathrm{scale},h}\, h),$$

with $W_{\mathrm{loc},h} = W_{\mathrm{scale},h} = 0$ at the start, so it begins at exactly the same law of $U$ (and
Qwen's logits, D7) while $W_{\mathrm{in}}$ is random, so the residual weights receive a gradient from the first step.
`causalqwen.save_abduction` / `causalqwen.load_abduction` (`causalqwen.files.abduction_weights`) move a trained
abduction network between models of the same base.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn import init  # transformers guards these while it initialises a loaded model: loaded tensors are kept

__all__ = [
    "ABDUCTION_TYPES",
    "AbductionNetwork",
    "MLPAbductionNetwork",
    "build_abduction",
    "inverse_softplus",
]

ABDUCTION_TYPES = ("linear", "mlp")


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
    ``scale_init`` is $\gamma$ and has no default here: the config's ``abduction_scale_init`` (0.1) is the one
    default (`build_abduction`), the drafts' 10.0 is `causalqwen.initialization.DRAFT_INIT`'s.
    """

    def __init__(self, hidden_size: int, causal_size: int, scale_init: float, scale_eps: float = 1e-6):
        super().__init__()
        self._create(hidden_size, causal_size, scale_init, scale_eps)
        self.reset_parameters()

    def _create(self, hidden_size: int, causal_size: int, scale_init: float, scale_eps: float) -> None:
        """The linear maps' parameters (uninitialised)."""
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


class MLPAbductionNetwork(AbductionNetwork):
    r"""The linear abduction plus a residual MLP of width $M$ (``mlp_size``) on both maps.

    $$h = \operatorname{GELU}(W_{\mathrm{in}}\, z + b_{\mathrm{in}}) \quad [\dots, M],$$

    $$\mathrm{loc}_U = W_{\mathrm{loc}}\, z + b_{\mathrm{loc}} + W_{\mathrm{loc},h}\, h, \qquad
    \mathrm{scale}_U = \operatorname{softplus}(W_{\mathrm{scale}}\, z + b_{\mathrm{scale}}
    + W_{\mathrm{scale},h}\, h).$$

    The linear maps are the residual (skip) path and start as in D6; ``W_loc_h`` and ``W_scale_h`` ``[C, M]``
    start at zero, so the initial law of $U$ is bit for bit the linear network's ($x + 0 = x$ in floating
    point). ``W_in`` ``[M, H]`` starts at $\mathcal N(0, 1/H)$ and ``b_in`` ``[M]`` at zero. The module holds
    $2H(H+1) + M(H + 1) + 2CM$ parameters.
    """

    def __init__(
        self,
        hidden_size: int,
        causal_size: int,
        scale_init: float,
        scale_eps: float = 1e-6,
        mlp_size: int | None = None,
    ):
        mlp_size = hidden_size if mlp_size is None else mlp_size
        if isinstance(mlp_size, bool) or not isinstance(mlp_size, int) or mlp_size < 1:
            raise ValueError(f"mlp_size must be a positive int, got {mlp_size!r}")
        self.mlp_size = mlp_size
        nn.Module.__init__(self)
        self._create(hidden_size, causal_size, scale_init, scale_eps)
        self.W_in = nn.Parameter(torch.empty(mlp_size, hidden_size))
        self.b_in = nn.Parameter(torch.empty(mlp_size))
        self.W_loc_h = nn.Parameter(torch.empty(causal_size, mlp_size))
        self.W_scale_h = nn.Parameter(torch.empty(causal_size, mlp_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        r"""D6 for the linear path; $W_{\mathrm{in}} \sim \mathcal N(0, 1/H)$, $b_{\mathrm{in}} = 0$ and zero residual
        weights."""
        super().reset_parameters()
        init.normal_(self.W_in, mean=0.0, std=self.W_in.shape[1] ** -0.5)
        init.zeros_(self.b_in)
        init.zeros_(self.W_loc_h)
        init.zeros_(self.W_scale_h)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        h = F.gelu(F.linear(z, self.W_in, self.b_in))  # [B, S, M]
        loc_U = F.linear(z, self.W_loc, self.b_loc) + F.linear(h, self.W_loc_h)  # [B, S, C]
        scale_U = F.softplus(F.linear(z, self.W_scale, self.b_scale) + F.linear(h, self.W_scale_h))  # [B, S, C]
        return loc_U, scale_U.clamp_min(self.scale_eps)


def build_abduction(config) -> AbductionNetwork:
    """The abduction network that ``config.abduction_type`` names (``"linear"``: D6; ``"mlp"``: with a residual MLP
    of width ``config.abduction_mlp_size``, default ``hidden_size``)."""
    arguments = (config.hidden_size, config.causal_size, config.abduction_scale_init, config.scale_eps)
    if config.abduction_type == "linear":
        return AbductionNetwork(*arguments)
    if config.abduction_type == "mlp":
        return MLPAbductionNetwork(*arguments, mlp_size=config.abduction_mlp_size)
    raise ValueError(f"abduction_type must be one of {', '.join(ABDUCTION_TYPES)}, got {config.abduction_type!r}")
