r"""Numerical embedding (decision D4; docs: embedding.md).

Every position carries a token id $x_i$ and a value $v_i$ (0 except at ``<NUM>``). The embedding
that enters the Qwen2 stack is

$$e_i = \mathrm{embed}(x_i) + \phi(v_i), \qquad \phi(v) = \operatorname{sign}(v)\,\ln(1 + |v|)\;\vec w_{\mathrm{num}},$$

with a learnable direction $\vec w_{\mathrm{num}} \in \mathbb R^H$, initialised as a random unit vector.
Since $\phi(0) = 0$, positions without a number keep their plain token embedding, and the
logarithm compresses any float32 magnitude (up to $3.4\cdot10^{38}$) to at most $\ln(3.4\cdot10^{38}) \approx 88.7$.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["NumericalEmbedding", "signed_log1p"]


def signed_log1p(values: Tensor) -> Tensor:
    r"""$\operatorname{sign}(v)\,\ln(1 + |v|)$: odd, monotone, $0 \mapsto 0$, and finite for every finite $v$."""
    return torch.sign(values) * torch.log1p(values.abs())


class NumericalEmbedding(nn.Module):
    r"""$\phi(v) = \operatorname{sign}(v)\ln(1+|v|)\,\vec w_{\mathrm{num}}$; ``[B, S] -> [B, S, H]``."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.w_num = nn.Parameter(torch.empty(hidden_size))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """A direction drawn uniformly on the unit sphere (a normalised Gaussian vector)."""
        direction = torch.randn(self.hidden_size, device=self.w_num.device)  # [H]
        self.w_num.copy_((direction / direction.norm()).to(self.w_num.dtype))  # transformers skips a loaded module

    def forward(self, numeric_values: Tensor) -> Tensor:
        magnitude = signed_log1p(numeric_values.float())  # [B, S], in float32 whatever the model dtype
        return magnitude.unsqueeze(-1).to(self.w_num.dtype) * self.w_num  # [B, S, H]
