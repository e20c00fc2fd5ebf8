r"""The model (decisions D4–D9), torch only and in the design's order: from token ids and values to decisions and loss,
around any backbone that maps embeddings to features.

$$
e = \mathrm{embed}(x) + \phi(v) \;\xrightarrow{\ \text{backbone}\ }\; z
\;\xrightarrow{\ \text{abduction}\ }\; U \sim \mathrm{Cauchy}(\mathrm{loc}_U, \mathrm{scale}_U)
\;\xrightarrow{\ \text{action}\ }\; S_k,\ Y \;\xrightarrow{\ \text{loss}\ }\; L.
$$

Step by step, as `CausalLM` runs it:

    e = embed_tokens(x) + numerical_embedding(v)           # [B, S, H]   D4, causalqwen.embedding
    z = backbone(e)                                        # [B, S, H]   D5, any map; Qwen2 in causalqwen.modeling
    loc_U, scale_U = abduction(z)                          # [B, S, C]   D6, causalqwen.abduction
    loc_S, scale_S, loc_Y, scale_Y = head(loc_U, scale_U)  # [B, S, V], [B, S]   D7, causalqwen.action
    loss = OvR(S; next token) + λ gated NLL(Y; next value) # []   D8-D9, causalqwen.losses (config.loss_algorithm)

`CausalLM` holds the modules and no parameter of its own, so the transformers model (`causalqwen.modeling`) keeps
its state dict's names: it runs its door, builds a `CausalLM` from its own modules and Qwen2, and calls `forward`. It
makes no check of its own and no host synchronisation: the inputs are a door's to check, and the sections check
theirs while `causalqwen.cauchy.validating`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

from .action import ActionOutput
from .decision import DecisionHead
from .losses import NextTokenTargets, loss_function, next_token_targets

__all__ = ["CausalLM", "CausalLMOutput"]


class CausalLMOutput(NamedTuple):
    """What `CausalLM.forward` returns: the law of $U$; with labels, the loss and its parts; with decisions, the
    standard decisions of the kept positions. A field not formed is None."""

    loc_U: Tensor  # [B, S, C]
    scale_U: Tensor  # [B, S, C]
    loc_S: Tensor | None = None  # [B, K, V]: the last K positions (K = S when every one is kept)
    scale_S: Tensor | None = None  # [B, K, V]
    loc_Y: Tensor | None = None  # [B, K]; [B, S] with the loss and no decisions
    scale_Y: Tensor | None = None  # [B, K]; [B, S] with the loss and no decisions
    loss: Tensor | None = None  # [] the total, cls_loss + regression_weight * reg_loss
    cls_loss: Tensor | None = None  # [] the mean OvR loss over scored positions
    reg_loss: Tensor | None = None  # [] the gated regression loss over <NUM> targets
    n_cls: Tensor | None = None  # [] scored positions
    n_reg: Tensor | None = None  # [] scored <NUM> targets
    targets: NextTokenTargets | None = None  # [B, S] x4: what each position was scored against
    numeric_labels: Tensor | None = None  # [B, S]: the values the loss read (numeric_labels, else numeric_values)


@dataclass(frozen=True)
class CausalLM:
    """The model's modules in the design's order. Any callables of these shapes do: ``backbone`` may be a plain torch
    module, or Qwen2 with one forward's mask, positions and cache (`causalqwen.modeling.Qwen2Backbone`)."""

    embed_tokens: Callable[[Tensor], Tensor]  # ids [B, S] -> [B, S, H]
    numerical_embedding: Callable[[Tensor], Tensor]  # values [B, S] -> phi(v) [B, S, H]
    backbone: Callable[[Tensor], Tensor]  # e [B, S, H] -> z [B, S, H]
    abduction: Callable[[Tensor], tuple[Tensor, Tensor]]  # z [B, S, H] -> loc_U, scale_U [B, S, C]
    head: DecisionHead | None = None  # the action, the threshold C_k, the <NUM> id and the loss settings (its config)

    def law_of_U(self, input_ids: Tensor, numeric_values: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        r"""The first half: $e = \mathrm{embed}(x) + \phi(v)$, $z = \mathrm{backbone}(e)$,
        $(\mathrm{loc}_U, \mathrm{scale}_U) = \mathrm{abduction}(z)$. Returns ``loc_U``, ``scale_U`` and ``z``."""
        e = self.embed_tokens(input_ids)  # [B, S, H]
        if numeric_values is not None:
            e = e + self.numerical_embedding(numeric_values)  # phi(0) = 0: only <NUM> positions change
        z = self.backbone(e)  # [B, S, H]
        loc_U, scale_U = self.abduction(z)  # [B, S, C] each
        return loc_U, scale_U, z

    def forward(
        self,
        input_ids: Tensor,
        numeric_values: Tensor | None = None,
        *,
        labels: Tensor | None = None,
        numeric_labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        return_decisions: bool | None = None,
        logits_to_keep: int = 0,
    ) -> CausalLMOutput:
        r"""The whole model: the law of $U$, then with ``labels`` the loss of D8–D9, and the standard decisions.

        ``labels`` ``[B, S]`` are aligned with ``input_ids`` and shifted here (`causalqwen.losses.next_token_targets`):
        position $i$ is scored against ``labels[i+1]`` and ``numeric_labels[i+1]`` (default: ``numeric_values``),
        only where ``attention_mask`` (``[B, S]``, or ``[B, cached + S]`` whose last ``S`` columns are read) holds
        both positions. The loss is ``config.loss_algorithm``'s (`causalqwen.losses.loss_function`): ``"literal"``
        returns the ``[B, S, V]`` decisions it scored, ``"fused"`` only the ``<NUM>`` column.

        ``return_decisions`` (default: without ``labels``) forms ``loc_S``, ``scale_S`` ``[B, K, V]`` and ``loc_Y``,
        ``scale_Y`` ``[B, K]`` for the last ``K = logits_to_keep`` positions (every one when 0); decisions the loss
        formed already are reused, gradients and all."""
        head, config = self.head, self.head.config
        loc_U, scale_U, _ = self.law_of_U(input_ids, numeric_values)  # [B, S, C] each
        if return_decisions is None:
            return_decisions = labels is None
        fields, loss_decisions = {}, None
        if labels is not None:
            window = attention_mask[:, -input_ids.shape[1] :] if attention_mask is not None else None  # [B, S]
            numeric_labels = numeric_labels if numeric_labels is not None else numeric_values
            targets = next_token_targets(labels, numeric_labels, window, config.ignore_index, config.num_token_id)
            parts, loss_decisions = loss_function(config.loss_algorithm)(
                head,
                loc_U,
                scale_U,
                targets.labels,
                targets.values,
                num_token_id=config.num_token_id,
                threshold=head.ovr_threshold,
                ignore_index=config.ignore_index,
                regression_weight=config.regression_weight,
                gate_alpha=config.gate_alpha,
                detach_gate=config.detach_gate,
            )
            fields = dict(loss=parts.total, cls_loss=parts.cls_loss_mean, reg_loss=parts.reg_loss_effective)
            fields |= dict(n_cls=parts.n_cls, n_reg=parts.n_reg, targets=targets, numeric_labels=numeric_labels)
            fields |= dict(loc_Y=loss_decisions.loc_Y, scale_Y=loss_decisions.scale_Y)  # [B, S] each
        if return_decisions:
            kept = slice(-logits_to_keep, None)  # every position when 0
            formed = loss_decisions is not None and loss_decisions.loc_S.shape[-1] == config.vocab_size  # [B, S, V]
            if formed:  # the decisions the loss formed (the literal loss forms them all), gradients too
                decision = ActionOutput(*(t[:, kept] for t in loss_decisions)) if logits_to_keep else loss_decisions
            else:
                decision = head(loc_U[:, kept], scale_U[:, kept])  # [B, K, V] x2, [B, K] x2
            fields |= decision._asdict()
        return CausalLMOutput(loc_U, scale_U, **fields)
