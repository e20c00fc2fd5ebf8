r"""CausalQwen on the `transformers` Qwen2 stack (forward_pass §1–5, math_overview §4).

The forward pass, position by position:

$$
e_i = \mathrm{embed}(x_i) + \phi(v_i) \;\xrightarrow{\ \text{Qwen2Model}\ }\; z_i
\;\xrightarrow{\ \text{abduction}\ }\; U_i \sim \mathrm{Cauchy}(\mathrm{loc}_{U_i}, \mathrm{scale}_{U_i})
\;\xrightarrow{\ \text{action}\ }\; S_{k,i},\ Y_i \sim \mathrm{Cauchy}(\cdot, \cdot)
\;\xrightarrow{\ \text{loss}\ }\; L.
$$

**Initialization equivalence.** With $W_{\mathrm{loc}} = I$, $b_{\mathrm{loc}} = 0$, $W_{\mathrm{cls}}$ = the base
model's lm_head and $b_{\mathrm{cls}} = 0$, $\mathrm{loc}_{S,i} = W_{\mathrm{cls}} z_i$, which is exactly the base model's
logit vector whenever no number is present ($\phi(0) = 0$). The scales are
$\mathrm{scale}_{S_k} = (\gamma + |b_{\mathrm{noise}}|)\cdot\|W_{\mathrm{cls},k}\|_1$ (for a constant noise vector) and
differ per class, so $\arg\max_k P_k$ need not be the base model's greedy token.
"""

from __future__ import annotations

import difflib
import logging
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import ModelOutput
from transformers.models.qwen2.modeling_qwen2 import Qwen2PreTrainedModel

from .abduction import AbductionNetwork
from .action import ActionNetwork
from .checkpoint import (
    check_sizes_against_headers,
    expected_state_shapes,
    header_shapes,
    shape_problems,
    state_problems,
    weight_files,
)
from .embedding import NumericalEmbedding
from .losses import at_least_float32, as_bool_mask, fused_total_loss, total_loss

__all__ = ["CausalQwenConfig", "CausalQwenForCausalLM", "CausalQwenOutput"]

logger = logging.getLogger(__name__)


# Magnitude bound of the real-valued settings. The stability tests (validation/robustness.py) cover
# thresholds, noise and scales up to 1e30; beyond that the float32 head overflows (a threshold of -1e35
# gives an infinite loss), so such a setting is refused when the config is made or loaded.
SETTING_LIMIT = 1e30

_FIELD_KINDS = {
    "num_token_id": "int",
    "causal_size": "int",
    "abduction_scale_init": "real",
    "noise_init": "real",
    "ovr_threshold": "real",
    "ovr_threshold_per_class": "bool",
    "learnable_threshold": "bool",
    "regression_weight": "real",
    "gate_alpha": "real",
    "detach_gate": "bool",
    "scale_eps": "real",
    "ignore_index": "int",
}


def _checked_field(name: str, value, kind: str):
    """``value`` as a Python bool / int / finite float, or a ``TypeError`` naming the field (never a cast
    of a string: ``"false"`` is not a boolean)."""
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"config field {name} must be true or false (a JSON boolean), got {value!r}")
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"config field {name} must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}")
    if kind == "int":
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"config field {name} must be an integer, got {value!r}")
        return int(value)
    if not math.isfinite(value):
        raise ValueError(f"config field {name} must be finite, got {value!r}")
    return float(value)


@strict
class CausalQwenConfig(Qwen2Config):
    r"""A `Qwen2Config` plus the CausalQwen hyper-parameters (decisions D2–D10).

    Attributes:
        num_token_id: id of the ``<NUM>`` token (``len(tokenizer)`` before it was added, decision D2).
        causal_size: dimension $C$ of $U$; must equal ``hidden_size`` (defaults to it).
        abduction_scale_init: $\gamma$, the initial ``scale_U`` (10.0).
        noise_init: initial value of every component of $b_{\mathrm{noise}}$ (0.1).
        ovr_threshold: the OvR threshold $C_k$ (100.0), shared or, with ``ovr_threshold_per_class``, a
            vector of $V$ thresholds initialised to this value; a parameter when ``learnable_threshold``.
        regression_weight: $\lambda$ in $L = \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg}}$ (1.0).
        gate_alpha: $\alpha$ of the regression gate (0.0: the gate is $P_{\langle NUM\rangle}$ alone).
        detach_gate: stop the gradient through the gate's $P_{\langle NUM\rangle}$ (off, as specified).
        scale_eps: lower clamp for every scale before it divides (1e-6).
        ignore_index: label value that is not scored (-100).
    """

    model_type = "causal_qwen"

    num_token_id: int | None = None
    causal_size: int | None = None
    abduction_scale_init: float = 10.0
    noise_init: float = 0.1
    ovr_threshold: float = 100.0
    ovr_threshold_per_class: bool = False
    learnable_threshold: bool = False
    regression_weight: float = 1.0
    gate_alpha: float = 0.0
    detach_gate: bool = False
    scale_eps: float = 1e-6
    ignore_index: int = -100

    def __post_init__(self, **kwargs):
        for name, kind in _FIELD_KINDS.items():
            value = getattr(self, name)
            if value is None and name in ("num_token_id", "causal_size"):
                continue
            setattr(self, name, _checked_field(name, value, kind))
        if self.causal_size is None:
            self.causal_size = self.hidden_size
        if self.causal_size != self.hidden_size:
            raise ValueError(
                f"causal_size ({self.causal_size}) must equal hidden_size ({self.hidden_size}): "
                "the abduction network is initialised as the identity (decision D6)"
            )
        limit = SETTING_LIMIT
        ranges = {
            "abduction_scale_init": (0 < self.abduction_scale_init <= limit, f"in (0, {limit:g}]"),
            "scale_eps": (1 / limit <= self.scale_eps <= limit, f"in [{1 / limit:g}, {limit:g}]"),
            "gate_alpha": (0.0 <= self.gate_alpha <= 1.0, "in [0, 1]"),
            "regression_weight": (0 <= self.regression_weight <= limit, f"in [0, {limit:g}]"),
            "noise_init": (abs(self.noise_init) <= limit, f"in [-{limit:g}, {limit:g}]"),
            "ovr_threshold": (abs(self.ovr_threshold) <= limit, f"in [-{limit:g}, {limit:g}]"),
        }
        for name, (ok, allowed) in ranges.items():
            if not ok:
                raise ValueError(f"config field {name} must be a number {allowed}, got {getattr(self, name)!r}")
        if self.num_token_id is not None and not 0 <= self.num_token_id < self.vocab_size:
            raise ValueError(f"num_token_id ({self.num_token_id}) must lie in [0, vocab_size={self.vocab_size})")
        super().__post_init__(**kwargs)


@dataclass
class CausalQwenOutput(ModelOutput):
    r"""Output of `CausalQwenForCausalLM.forward`.

    Attributes:
        loss: total loss $\bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg,eff}}$ (when ``labels`` are given).
        cls_loss: $\bar L_{\mathrm{cls}}$, the mean OvR loss over scored positions.
        reg_loss: $L_{\mathrm{reg,eff}}$, the gated regression loss averaged over ``<NUM>`` targets.
        loc_U: location of the individual $U$, ``[B, S, C]``.
        scale_U: scale of $U$, ``[B, S, C]``.
        loc_S: locations of the class scores $S_k$, ``[B, S, V]`` (noise infused).
        scale_S: scales of the class scores, ``[B, S, V]``.
        loc_Y: location of the regression value $Y$, ``[B, S]`` (noise infused).
        scale_Y: scale of $Y$, ``[B, S]``.
        past_key_values: the Qwen2 KV cache, when ``use_cache``.
    """

    loss: torch.FloatTensor | None = None
    cls_loss: torch.FloatTensor | None = None
    reg_loss: torch.FloatTensor | None = None
    loc_U: torch.FloatTensor | None = None
    scale_U: torch.FloatTensor | None = None
    loc_S: torch.FloatTensor | None = None
    scale_S: torch.FloatTensor | None = None
    loc_Y: torch.FloatTensor | None = None
    scale_Y: torch.FloatTensor | None = None
    past_key_values: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


# Keywords that forward/abduce hand on to Qwen2Model; everything else is refused by name.
PASSED_TO_QWEN2 = ("output_attentions", "output_hidden_states")
_ABDUCE_ARGS = ("input_ids", "numeric_values", "attention_mask", "position_ids", "past_key_values", "use_cache")
_FORWARD_ARGS = _ABDUCE_ARGS + ("labels", "numeric_labels", "return_decisions")


class CausalQwenForCausalLM(Qwen2PreTrainedModel):
    """CausalQwen: numerical embedding, the Qwen2 decoder stack, abduction, action, OvR + gated losses."""

    config: CausalQwenConfig
    config_class = CausalQwenConfig
    # The loss is a mean over this batch's scored positions and ignores Trainer's num_items_in_batch, so
    # Trainer must divide by the gradient-accumulation steps itself (and not pass that keyword).
    accepts_loss_kwargs = False

    def __init__(self, config: CausalQwenConfig):
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.numerical_embedding = NumericalEmbedding(config.hidden_size)
        self.abduction = AbductionNetwork(
            config.hidden_size, config.causal_size, config.abduction_scale_init, config.scale_eps
        )
        self.action = ActionNetwork(config.causal_size, config.vocab_size, config.noise_init, config.scale_eps)
        if config.ovr_threshold_per_class or config.learnable_threshold:
            shape = (config.vocab_size,) if config.ovr_threshold_per_class else ()
            threshold = torch.full(shape, config.ovr_threshold)
            if config.learnable_threshold:
                self.ovr_threshold = nn.Parameter(threshold)
            else:
                self.register_buffer("ovr_threshold", threshold, persistent=True)
        else:
            self.ovr_threshold = config.ovr_threshold  # a plain number
        self.post_init()

    # ---- initialization (called by transformers for every module whose weights were not loaded) ----

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, (NumericalEmbedding, AbductionNetwork, ActionNetwork)):
            module.reset_parameters()
        elif isinstance(module, CausalQwenForCausalLM) and isinstance(module.ovr_threshold, Tensor):
            init.constant_(module.ovr_threshold, module.config.ovr_threshold)

    def _check_extra_kwargs(self, method: str, kwargs: dict, own: tuple[str, ...]) -> None:
        """Only transformers' output switches pass through to Qwen2Model; any other keyword is a ``TypeError``.

        Qwen2Model silently drops keywords it does not know, so a misspelt ``numeric_value=`` or
        ``attention_masks=`` would lose the numbers or the mask without a word.
        """
        unknown = sorted(set(kwargs) - set(PASSED_TO_QWEN2))
        if not unknown:
            return
        if "inputs_embeds" in unknown:
            raise TypeError(
                f"{method}() does not take inputs_embeds: CausalQwen forms the embeddings itself, "
                "embed(input_ids) + phi(numeric_values)"
            )
        known = own + PASSED_TO_QWEN2
        hints = [f"{name!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(name, known, 1)) else repr(name)
                 for name in unknown]
        raise TypeError(f"{method}() got unexpected keyword argument(s) {', '.join(hints)}")

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    # ---- input checks ----

    def _check_inputs(self, input_ids, numeric_values, attention_mask, past_length, position_ids=None):
        if not isinstance(input_ids, Tensor) or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise TypeError("input_ids must be an integer torch.Tensor of shape [B, S]")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape [B, S], got {tuple(input_ids.shape)}")
        if input_ids.numel() == 0:
            raise ValueError(f"input_ids must hold at least one row and one token, got shape {tuple(input_ids.shape)}")
        vocab_size = self.config.vocab_size
        if bool(((input_ids < 0) | (input_ids >= vocab_size)).any()):
            raise ValueError(f"input_ids must lie in [0, vocab_size={vocab_size})")
        if numeric_values is None:
            if bool((input_ids == self.config.num_token_id).any()):
                b, s = (input_ids == self.config.num_token_id).nonzero()[0].tolist()
                raise ValueError(
                    f"input_ids hold <NUM> (id {self.config.num_token_id}) at position [{b}, {s}] but numeric_values is "
                    "None: pass the values the tokenizer returned (a <NUM> never stands for 0 by default)"
                )
        else:
            self._check_like_input_ids("numeric_values", numeric_values, input_ids, values=True)
            stray = (numeric_values != 0) & (input_ids != self.config.num_token_id)
            if bool(stray.any()):
                b, s = stray.nonzero()[0].tolist()
                raise ValueError(
                    f"numeric_values must be 0 wherever input_ids is not <NUM> (id {self.config.num_token_id}); "
                    f"found {numeric_values[b, s].item()} at position [{b}, {s}] holding token {input_ids[b, s].item()}"
                )
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor):
                raise TypeError(f"attention_mask must be a torch.Tensor of 0s and 1s, got {type(attention_mask).__name__}")
            expected = (input_ids.shape[0], past_length + input_ids.shape[1])
            if tuple(attention_mask.shape) != expected:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} must be {expected} "
                    f"([B, cached + new tokens])"
                )
            as_bool_mask(attention_mask, "attention_mask")
        if attention_mask is not None:
            longest = int(attention_mask.sum(-1).max())  # positions count real tokens only
        else:
            longest = past_length + input_ids.shape[1]
        if longest > self.config.max_position_embeddings:
            raise ValueError(
                f"the sequence has {longest} positions, more than max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )
        if position_ids is not None:
            allowed = [tuple(input_ids.shape)] + ([(1, input_ids.shape[1])] if input_ids.shape[0] != 1 else [])
            if not isinstance(position_ids, Tensor) or tuple(position_ids.shape) not in allowed:
                got = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
                raise ValueError(
                    f"position_ids must be a tensor of shape {' or '.join(map(str, allowed))} to match input_ids, got {got}"
                )

    @staticmethod
    def _check_like_input_ids(name, tensor, input_ids, values=False):
        r"""``tensor`` must be a tensor of input_ids' shape; with ``values``, real numbers that float32 holds.

        The values enter $\phi$ in float32 (decision D3: a number beyond float32 is an error, never clamped), so
        a float64 value beyond $\pm 3.4\cdot10^{38}$ is rejected here rather than turning into ±inf.
        """
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape [B, S] like input_ids, got {type(tensor).__name__}")
        if tuple(tensor.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name} shape {tuple(tensor.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
        if not values:
            return
        if tensor.dtype == torch.bool or tensor.is_complex():
            raise TypeError(f"{name} must hold real numbers (a float or integer tensor), got {tensor.dtype}")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name} must be finite: found NaN or ±inf")
        too_large = ~torch.isfinite(tensor.float())  # finite here, but beyond float32 once cast
        if bool(too_large.any()):
            b, s = too_large.nonzero()[0].tolist()
            raise ValueError(
                f"{name} must be representable in float32 (|v| <= {torch.finfo(torch.float32).max:.8g}); "
                f"found {tensor[b, s].item()!r} at position [{b}, {s}]"
            )

    # ---- forward ----

    def abduce(
        self,
        input_ids: torch.LongTensor,
        numeric_values: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> CausalQwenOutput:
        r"""The first half of the forward pass: $e = \mathrm{embed}(x) + \phi(v)$, $z = \mathrm{Qwen2}(e)$,
        $(\mathrm{loc}_U, \mathrm{scale}_U) = \mathrm{abduction}(z)$.

        Returns a `CausalQwenOutput` with ``loc_U``, ``scale_U`` ``[B, S, C]`` and the Qwen2 outputs
        (``past_key_values``, ``hidden_states``, ``attentions``); the decision fields are left empty.
        The inference modes (`causalqwen.inference`) start from here.
        With an ``attention_mask`` and no ``position_ids``, positions count real tokens only, so that
        left padding does not shift them.
        """
        self._check_extra_kwargs("abduce", kwargs, _ABDUCE_ARGS)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        self._check_inputs(input_ids, numeric_values, attention_mask, past_length, position_ids)
        if numeric_values is None:
            numeric_values = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        if position_ids is None and attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -input_ids.shape[1] :]  # [B, S]

        inputs_embeds = self.model.embed_tokens(input_ids) + self.numerical_embedding(numeric_values)  # [B, S, H]
        features = self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
        loc_U, scale_U = self.abduction(features.last_hidden_state)  # [B, S, C] each
        return CausalQwenOutput(
            loc_U=loc_U,
            scale_U=scale_U,
            past_key_values=features.past_key_values,
            hidden_states=features.hidden_states,
            attentions=features.attentions,
        )

    def forward(
        self,
        input_ids: torch.LongTensor,
        numeric_values: torch.FloatTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        numeric_labels: torch.FloatTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        return_decisions: bool | None = None,
        **kwargs,
    ) -> CausalQwenOutput:
        r"""Run the whole model (`abduce`, then the standard action); with ``labels``, also the loss of D8–D9.

        ``labels`` are aligned with ``input_ids`` (transformers convention) and shifted inside:
        position $i$ is scored against ``labels[i+1]`` and ``numeric_labels[i+1]`` (default:
        ``numeric_values``), and only where ``attention_mask[i]``, ``attention_mask[i+1]`` are both 1
        and ``labels[i+1] != ignore_index``.

        ``return_decisions`` (default: only when no ``labels`` are given) fills ``loc_S``/``scale_S``
        ``[B, S, V]``. Without them the loss takes the fused path (`losses.fused_total_loss`), which
        never forms a ``[B, S, V]`` tensor; with them it takes the literal path (`losses.total_loss`).
        The two are equal; the fused one is what training should use.
        """
        self._check_extra_kwargs("forward", kwargs, _FORWARD_ARGS)
        if labels is not None:
            self._check_like_input_ids("labels", labels, input_ids)
        if numeric_labels is not None:
            self._check_like_input_ids("numeric_labels", numeric_labels, input_ids, values=True)
        if return_decisions is None:
            return_decisions = labels is None
        if not return_decisions and labels is None:
            raise ValueError("return_decisions=False without labels leaves nothing to compute; pass labels or drop it")
        individual = self.abduce(
            input_ids, numeric_values, attention_mask, position_ids, past_key_values, use_cache, **kwargs
        )
        loc_U, scale_U = individual.loc_U, individual.scale_U  # [B, S, C] each

        loss = cls_loss = reg_loss = loc_S = scale_S = loc_Y = scale_Y = None
        if return_decisions:
            loc_S, scale_S, loc_Y, scale_Y = self.action(loc_U, scale_U)  # [B, S, V] x2, [B, S] x2
        if labels is not None:
            targets = numeric_labels if numeric_labels is not None else numeric_values
            if targets is None:
                if bool((labels[:, 1:] == self.config.num_token_id).any()):
                    raise ValueError(
                        "labels hold <NUM> targets but neither numeric_labels nor numeric_values is given: the "
                        "regression would be trained toward 0; pass the values beside the labels"
                    )
                targets = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
            mask = attention_mask[:, -input_ids.shape[1] :] if attention_mask is not None else torch.ones_like(labels)
            # position i is scored against token i+1; the last position has no target
            pair_mask = F.pad(mask[:, :-1].bool() & mask[:, 1:].bool(), (0, 1), value=False)  # [B, S]
            next_labels = F.pad(labels[:, 1:], (0, 1), value=self.config.ignore_index)  # [B, S]
            next_targets = F.pad(at_least_float32(targets[:, 1:]), (0, 1), value=0.0)  # [B, S]
            settings = dict(
                num_token_id=self.config.num_token_id,
                threshold=self.ovr_threshold,
                attention_mask=pair_mask,
                ignore_index=self.config.ignore_index,
                regression_weight=self.config.regression_weight,
                gate_alpha=self.config.gate_alpha,
                detach_gate=self.config.detach_gate,
            )
            if return_decisions:
                parts = total_loss(
                    at_least_float32(loc_S),
                    at_least_float32(scale_S),
                    at_least_float32(loc_Y),
                    at_least_float32(scale_Y),
                    next_labels,
                    next_targets,
                    **settings,
                )
            else:
                parts, num_decision = fused_total_loss(
                    at_least_float32(loc_U), at_least_float32(scale_U), self.action, next_labels, next_targets, **settings
                )
                loc_Y, scale_Y = num_decision.loc_Y, num_decision.scale_Y  # [B, S] each
            loss, cls_loss, reg_loss = parts.total, parts.cls_loss_mean, parts.reg_loss_effective

        return CausalQwenOutput(
            loss=loss,
            cls_loss=cls_loss,
            reg_loss=reg_loss,
            loc_U=loc_U,
            scale_U=scale_U,
            loc_S=loc_S,
            scale_S=scale_S,
            loc_Y=loc_Y,
            scale_Y=scale_Y,
            past_key_values=individual.past_key_values,
            hidden_states=individual.hidden_states,
            attentions=individual.attentions,
        )

    def generate(self, input_ids: torch.LongTensor, **kwargs):
        """`causalqwen.generation.generate` with this model; see there for the arguments.

        This is not transformers' ``GenerationMixin.generate``: each step emits a (token, value) pair,
        and the value must re-enter the next step's embedding.
        """
        from .generation import generate  # a late import: generation imports this module inside generate()

        return generate(self, input_ids, **kwargs)

    # ---- loading a saved CausalQwen: all of it, or an error ----

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> "CausalQwenForCausalLM":
        """`PreTrainedModel.from_pretrained`, made strict: a checkpoint loads completely or raises ``OSError``.

        transformers only *warns* when a checkpoint lacks some of the model's tensors and initialises
        them at random, which hands back a half-loaded model. Here, for a local directory, before any
        model is built (`causalqwen.checkpoint`):

        - the weights must be safetensors (``model.safetensors``, or shards named by its index that
          stay inside the directory); a pickled ``pytorch_model.bin`` is never loaded;
        - every safetensors file must be readable (not truncated, header intact);
        - ``config.json`` is validated field by field (types and ranges) and its sizes are compared
          with the tensors' headers, so that no oversized model is allocated;
        - every tensor of the model must be in the checkpoint with its shape, and no other tensor may
          be (unless ``ignore_mismatched_sizes=True`` is passed, transformers' explicit request to
          re-initialise mismatched ones).

        After loading, an integer or boolean checkpoint tensor for a floating-point parameter and a
        parameter holding NaN or ±inf are refused as well. Every other argument is passed on;
        ``output_loading_info=True`` still returns ``(model, info)``.
        """
        want_info = kwargs.pop("output_loading_info", False)
        allow_mismatch = kwargs.pop("ignore_mismatched_sizes", False)
        if kwargs.pop("use_safetensors", True) is False:
            raise ValueError("use_safetensors=False would unpickle pytorch_model.bin; causalqwen loads safetensors only")
        where = str(pretrained_model_name_or_path)
        files = weight_files(pretrained_model_name_or_path, kwargs.get("subfolder", ""))
        if files and not allow_mismatch:
            config = kwargs.get("config")
            if not isinstance(config, CausalQwenConfig):
                config = _load_config(cls.config_class, pretrained_model_name_or_path, kwargs.get("subfolder", ""))
            check_sizes_against_headers(config, shapes := header_shapes(files))
            problems = shape_problems(expected_state_shapes(cls, config), shapes)
            if problems:
                raise OSError(_refusal(where, cls.__name__, problems))
        try:
            # mismatches are reported in the loading info (and raised below) rather than as transformers' generic error
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, output_loading_info=True, ignore_mismatched_sizes=True,
                use_safetensors=True, **kwargs
            )
        except SafetensorError as error:  # a remote or cached file: the local files were checked above
            raise OSError(f"the safetensors checkpoint {where!r} cannot be read: {error} (truncated or corrupt file)") from error
        problems = []
        if info["missing_keys"]:
            problems.append(f"missing from the checkpoint: {', '.join(sorted(info['missing_keys']))}")
        if info["unexpected_keys"]:
            problems.append(f"in the checkpoint but not in the model: {', '.join(sorted(info['unexpected_keys']))}")
        if info["mismatched_keys"] and not allow_mismatch:
            problems.extend(
                f"{key} has shape {tuple(saved)} in the checkpoint but {tuple(expected)} in the model"
                for key, saved, expected in sorted(info["mismatched_keys"])
            )
        problems.extend(info["error_msgs"])
        problems.extend(state_problems(header_shapes(files), model))
        if problems:
            raise OSError(_refusal(where, cls.__name__, problems))
        return (model, info) if want_info else model

    # ---- construction from a Qwen2 base ----

    @classmethod
    def from_qwen(cls, base: Qwen2ForCausalLM | str | os.PathLike, **config_overrides) -> "CausalQwenForCausalLM":
        r"""Build CausalQwen from a Qwen2 base and apply the initialization of decisions D4–D7.

        ``base`` is a `Qwen2ForCausalLM` instance, a local directory or a hub id (loaded with
        ``Qwen2ForCausalLM.from_pretrained``). ``config_overrides`` set `CausalQwenConfig` fields;
        ``num_token_id`` is required for an instance and read from the tokenizer saved with a path
        (its ``<NUM>`` id if present, else ``len(tokenizer)``).

        The backbone weights are copied, ``W_cls`` becomes a copy of the base lm_head weight (its own
        parameter, never tied), and the new modules get their D4–D7 initialization. If
        ``num_token_id == vocab_size`` the embedding and the head grow by one row (decision D2).
        """
        if isinstance(base, (str, os.PathLike)):
            base_config = AutoConfig.from_pretrained(base)
            if base_config.model_type != "qwen2":
                raise ValueError(f"base {str(base)!r} is a {base_config.model_type!r} model; CausalQwen needs a Qwen2 base")
            files = weight_files(base)
            if files:  # a local directory: sizes and tensors checked before the base is built
                check_sizes_against_headers(base_config, shapes := header_shapes(files))
                tied = ("lm_head.weight",) if base_config.tie_word_embeddings else ()
                problems = shape_problems(expected_state_shapes(Qwen2ForCausalLM, base_config), shapes, tied)
                if problems:
                    raise OSError(_refusal(str(base), "Qwen2ForCausalLM", problems))
            if "num_token_id" not in config_overrides:
                config_overrides["num_token_id"] = _num_token_id_from_tokenizer(base)
            base = Qwen2ForCausalLM.from_pretrained(base, use_safetensors=True)
        if not isinstance(base, Qwen2ForCausalLM):
            raise TypeError(
                f"base must be a transformers Qwen2ForCausalLM (or a path / hub id of one), got {type(base).__name__}"
            )
        if config_overrides.get("num_token_id") is None:
            raise ValueError(
                "from_qwen(instance) needs num_token_id: pass num_token_id=NumericTokenizer(tokenizer).num_token_id "
                "(= len(tokenizer) before <NUM> is added)"
            )

        base_vocab = base.config.vocab_size
        settings = {
            k: v
            for k, v in base.config.to_dict().items()
            if k not in ("model_type", "architectures", "transformers_version", "auto_map", "_name_or_path")
        }
        settings.update(config_overrides)
        settings["tie_word_embeddings"] = False  # W_cls is its own copy of lm_head
        grow = settings["num_token_id"] == base_vocab
        if grow:
            settings["vocab_size"] = base_vocab + 1
            logger.warning(
                "num_token_id=%d equals the base vocab_size: growing the embedding and the head by one row for <NUM>",
                base_vocab,
            )
        config = CausalQwenConfig.from_dict(settings)

        model = cls(config).to(base.dtype)
        with torch.no_grad():
            backbone = base.model.state_dict()
            if grow:
                new_row = model.model.embed_tokens.weight[base_vocab:]  # initialised like the other rows
                backbone["embed_tokens.weight"] = torch.cat([backbone["embed_tokens.weight"], new_row], dim=0)
            model.model.load_state_dict(backbone)
            model.action.classification_head.weight[:base_vocab].copy_(base.get_output_embeddings().weight)
        return model


def _load_config(config_class, path, subfolder: str = ""):
    """The config of a local checkpoint, validated; a bad field is a ``ValueError`` naming ``config.json``."""
    file = os.path.join(path, subfolder or "", "config.json")
    try:
        return config_class.from_pretrained(path, subfolder=subfolder or "")
    except (ValueError, TypeError, StrictDataclassError) as error:
        raise ValueError(f"{file}: {' '.join(str(error).split())}") from error


def _refusal(where: str, name: str, problems: list[str]) -> str:
    return (f"the checkpoint {where!r} does not hold a complete, valid {name}; refusing to return a partly loaded "
            "model: " + "; ".join(problems))


def _num_token_id_from_tokenizer(path) -> int:
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab = tokenizer.get_vocab()
    return vocab["<NUM>"] if "<NUM>" in vocab else len(tokenizer)


AutoConfig.register(CausalQwenConfig.model_type, CausalQwenConfig, exist_ok=True)
AutoModel.register(CausalQwenConfig, CausalQwenForCausalLM, exist_ok=True)
