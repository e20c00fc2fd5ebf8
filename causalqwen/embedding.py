r"""Numerical embedding (decision D4; docs: embedding.md).

Every position carries a token id $x_i$ and a value $v_i$ (0 except at ``<NUM>``). The embedding
that enters the Qwen2 stack is

$$e_i = \mathrm{embed}(x_i) + \phi(v_i), \qquad \phi(v) = \operatorname{sign}(v)\,\ln(1 + |v|)\;\vec w_{\mathrm{num}},$$

with a learnable direction $\vec w_{\mathrm{num}} \in \mathbb R^H$, initialised as a random unit vector.
Since $\phi(0) = 0$, positions without a number keep their plain token embedding, and the
logarithm compresses any float32 magnitude (up to $3.4\cdot10^{38}$) to at most $\ln(3.4\cdot10^{38}) \approx 88.7$.

**Periodic features (opt-in, beyond the design; decision D27).** One direction puts every number on one line, so a
function of $v$ that repeats or breaks (a cosine, a piecewise rule) must be unfolded by the backbone. With periods
$T_1, \dots, T_J$ (config ``number_encoding="log_fourier"``, ``number_periods``) the embedding adds, as FoNE does,
sinusoids of $v$:

$$\phi(v) = \operatorname{sign}(v)\ln(1+|v|)\,\vec w_{\mathrm{num}}
+ \sum_{j=1}^{J} \Big(\sin\tfrac{2\pi v}{T_j}\,\vec a_j + \big(1 - \cos\tfrac{2\pi v}{T_j}\big)\,\vec b_j\Big),$$

with $\vec a_j, \vec b_j$ (the rows of ``w_fourier``, ``[2J, H]``) initialised at zero. Both features vanish at
$v = 0$ and the weights start at zero, so $\phi$ starts as the design's for every $v$, and the initialization
equivalence (D7) holds unchanged. The angle is formed in float64 from $|v| \bmod T_j$ (exact in floating point;
the sine takes the sign of $v$), and $1 - \cos\theta$ as $2\sin^2(\theta/2)$, so the features are accurate wherever
$v / T_j$ is below about $10^{15}$ and bounded everywhere.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

__all__ = [
    "NumericalEmbedding",
    "NUMBER_ENCODINGS",
    "DECIMAL_PERIODS",
    "signed_log1p",
    "fourier_features",
    "check_periods",
]

# The encodings of a value: "log", the design's phi alone; "log_fourier", phi plus the periodic features.
NUMBER_ENCODINGS = ("log", "log_fourier")
# The periods "log_fourier" takes unless given: FoNE's, one per decimal place from hundredths to ten thousands.
DECIMAL_PERIODS = tuple(10.0**j for j in range(-2, 5))


def signed_log1p(values: Tensor) -> Tensor:
    r"""$\operatorname{sign}(v)\,\ln(1 + |v|)$: odd, monotone, $0 \mapsto 0$, and finite for every finite $v$."""
    return torch.sign(values) * torch.log1p(values.abs())


def fourier_features(values: Tensor, periods) -> Tensor:
    r"""$[\sin\theta_j,\ 1 - \cos\theta_j]_{j}$ with $\theta_j = 2\pi v / T_j$, in float64: ``[B, S] -> [B, S, 2J]``."""
    period = torch.tensor(periods, dtype=torch.float64, device=values.device)  # [J]
    v = values.double().unsqueeze(-1)  # [B, S, 1]
    turns = torch.fmod(v.abs(), period) / period  # [B, S, J], |v| mod T exactly, over T: in [0, 1)
    sine = torch.sign(v) * torch.sin(2 * math.pi * turns)  # [B, S, J], odd in v by construction
    versine = 2 * torch.sin(math.pi * turns) ** 2  # [B, S, J], 1 - cos(theta) without cancellation
    return torch.stack((sine, versine), dim=-1).flatten(-2)  # [B, S, 2J]: sin_1, 1-cos_1, sin_2, ...


def check_periods(periods, name: str = "periods") -> tuple[float, ...]:
    """The periods as a tuple of distinct positive finite floats; a ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(periods, (str, bytes)) or not isinstance(periods, (list, tuple)):
        raise TypeError(f"{name} must be a list of positive numbers, got {periods!r}")
    if not periods:
        raise ValueError(f"{name} must hold at least one period, got {periods!r}")
    for index, period in enumerate(periods):
        if isinstance(period, bool) or not isinstance(period, numbers.Real) or not (0 < period < math.inf):
            raise ValueError(f"{name}[{index}] must be a positive finite number, got {period!r}")
    checked = tuple(float(period) for period in periods)
    for period in checked:
        if checked.count(period) > 1:
            raise ValueError(f"{name} must be distinct, got {period!r} twice")
    return checked


def encoding_periods(encoding, periods, limit: float) -> list[float] | None:
    """The config fields ``number_encoding`` and ``number_periods`` checked together: the periods of
    ``"log_fourier"`` (`DECIMAL_PERIODS` unless given), each in [1/``limit``, ``limit``]; None for ``"log"``. A
    ``TypeError``/``ValueError`` names the field and the value."""
    if not isinstance(encoding, str) or encoding not in NUMBER_ENCODINGS:
        raise ValueError(f"config field number_encoding must be one of {', '.join(NUMBER_ENCODINGS)}, got {encoding!r}")
    if encoding == "log":
        if periods is not None:
            raise ValueError(
                'config field number_periods are the periods of "log_fourier"; number_encoding is "log", so it must '
                f"be None, got {periods!r}"
            )
        return None
    checked = check_periods(DECIMAL_PERIODS if periods is None else periods, "config field number_periods")
    for index, period in enumerate(checked):
        if not 1 / limit <= period <= limit:
            raise ValueError(
                f"config field number_periods[{index}] must be a number in [{1 / limit:g}, {limit:g}], got {period!r}"
            )
    return list(checked)


class NumericalEmbedding(nn.Module):
    r"""$\phi(v) = \operatorname{sign}(v)\ln(1+|v|)\,\vec w_{\mathrm{num}}$ (plus the periodic features when
    ``periods`` are given); ``[B, S] -> [B, S, H]``."""

    def __init__(self, hidden_size: int, periods=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.periods = None if periods is None else check_periods(periods)
        self.w_num = nn.Parameter(torch.empty(hidden_size))
        if self.periods is not None:
            self.w_fourier = nn.Parameter(torch.empty(2 * len(self.periods), hidden_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A direction drawn uniformly on the unit sphere (a normalised Gaussian vector); periodic weights at zero."""
        direction = torch.randn(self.hidden_size, device=self.w_num.device)  # [H]
        self.w_num.copy_((direction / direction.norm()).to(self.w_num.dtype))  # transformers skips a loaded module
        if self.periods is not None:
            self.w_fourier.zero_()

    def forward(self, numeric_values: Tensor) -> Tensor:
        magnitude = signed_log1p(numeric_values.float())  # [B, S], in float32 whatever the model dtype
        phi = magnitude.unsqueeze(-1).to(self.w_num.dtype) * self.w_num  # [B, S, H]
        if self.periods is not None:
            features = fourier_features(numeric_values, self.periods)  # [B, S, 2J], float64
            phi = phi + features.to(self.w_fourier.dtype) @ self.w_fourier  # [B, S, H]
        return phi

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}" + ("" if self.periods is None else f", periods={self.periods}")
