r"""What the model's forward returns, as transformers' ``ModelOutput`` containers: `CausalQwenModelOutput` (the law
of $U$ and Qwen2's outputs) and `CausalQwenOutput` (the decisions and, with labels, the loss). The KV cache is a field
under the installed transformers' name (`causalqwen.files.earlier_versions.cache_keyword`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache
from transformers.modeling_outputs import ModelOutput

from ..files.loading import CACHE_NAME
from ..losses import NextTokenTargets

__all__ = ["CausalQwenModelOutput", "CausalQwenOutput"]


@dataclass
class CausalQwenModelOutput(ModelOutput):
    r"""Output of `CausalQwenModel.forward`: the law of the individual $U$ and the Qwen2 outputs.

    Attributes:
        loc_U: location of $U$, ``[B, S, C]``.
        scale_U: scale of $U$, ``[B, S, C]``.
        last_hidden_state: the features $z$, ``[B, S, H]``.
        cache: the Qwen2 KV cache, when ``use_cache`` (``past_key_values`` before transformers 5.24; that
            name still reads it).
    """

    loc_U: torch.FloatTensor | None = None
    scale_U: torch.FloatTensor | None = None
    last_hidden_state: torch.FloatTensor | None = None
    if CACHE_NAME == "cache":
        cache: Cache | None = None
    else:
        past_key_values: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CausalQwenOutput(ModelOutput):
    r"""Output of `CausalQwenForCausalLM.forward`.

    Attributes:
        loss: total loss $\bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg,eff}}$ (when ``labels`` are given).
        cls_loss: $\bar L_{\mathrm{cls}}$, the mean OvR loss over scored positions.
        reg_loss: $L_{\mathrm{reg,eff}}$, the gated regression loss averaged over ``<NUM>`` targets.
        n_cls: the number of scored positions (a 0-d tensor; the denominator of ``cls_loss``).
        n_reg: the number of scored ``<NUM>`` targets (the denominator of ``reg_loss``).
        loc_U: location of the individual $U$, ``[B, S, C]``.
        scale_U: scale of $U$, ``[B, S, C]``.
        loc_S: locations of the class scores $S_k$, ``[B, S, V]`` (noise infused).
        scale_S: scales of the class scores, ``[B, S, V]``.
        loc_Y: location of the regression value $Y$, ``[B, S]`` (noise infused).
        scale_Y: scale of $Y$, ``[B, S]``.
        cache: the Qwen2 KV cache, when ``use_cache`` (``past_key_values`` before transformers 5.24; that
            name still reads it).
        logits: what transformers reads as the next-token scores. With decisions, $\mathrm{loc}_S$ (the
            class locations, which equal Qwen's logits at initialization, decision D7). In a transformers
            generation step, the last position's scores ``[B, 1, V]`` under the step's mode, written by the
            generation mixin from the law of $U$: $\log P_k$ of the decision input (argmax: the mode's choice),
            or $\mathrm{loc}_S$ for ``traditional`` (`causalqwen.integrations.generation_mixin`).
        targets: with ``labels``, what each position was scored against (`causalqwen.losses.NextTokenTargets`:
            ``scored``, ``labels``, ``values``, ``is_num``, ``[B, S]`` each), so that metrics need not rebuild them.
        numeric_labels: with ``labels``, the numeric labels the loss read, ``[B, S]`` as given (not shifted):
            ``numeric_labels``, or ``numeric_values`` without them. `Trainer` gathers it for ``compute_metrics``,
            whose labels are ``labels`` alone (`causalqwen.integrations.trainer`).
    """

    loss: torch.FloatTensor | None = None
    cls_loss: torch.FloatTensor | None = None
    reg_loss: torch.FloatTensor | None = None
    n_cls: torch.LongTensor | None = None
    n_reg: torch.LongTensor | None = None
    loc_U: torch.FloatTensor | None = None
    scale_U: torch.FloatTensor | None = None
    loc_S: torch.FloatTensor | None = None
    scale_S: torch.FloatTensor | None = None
    loc_Y: torch.FloatTensor | None = None
    scale_Y: torch.FloatTensor | None = None
    if CACHE_NAME == "cache":
        cache: Cache | None = None
    else:
        past_key_values: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    logits: torch.FloatTensor | None = None
    targets: NextTokenTargets | None = None
    numeric_labels: torch.FloatTensor | None = None
