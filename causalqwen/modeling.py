r"""CausalQwen on the `transformers` Qwen2 stack: `CausalQwenModel` (the law of $U$) and `CausalQwenForCausalLM`.

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

import functools
import inspect
import logging
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from transformers.cache_utils import Cache
from transformers.modeling_outputs import ModelOutput
from transformers.models.qwen2.modeling_qwen2 import Qwen2PreTrainedModel

from .abduction import ABDUCTION_TYPES, AbductionNetwork, build_abduction
from .action import ActionNetwork
from .auto import CUSTOM_PIPELINES, MODEL_AUTO_MAP, MODEL_FILES, SAVED_ONLY_FIELDS, write_auto_module
from .checkpoint import check_local_source
from .doors import check_forward, check_keywords
from .embedding import NumericalEmbedding
from .head import LOSS_ALGORITHMS, DecisionHead
from .hf_generation import CausalQwenGenerationMixin
from .initialization import DEFAULT_INIT, check_threshold_init, initial_threshold
from .loading import CACHE_NAME, check_generation_mode, check_qwen_base, num_token_id_from_tokenizer, strict_from_pretrained
from .rundir import check_write_targets

__all__ = ["CausalQwenConfig", "CausalQwenModel", "CausalQwenForCausalLM", "CausalQwenOutput", "CausalQwenModelOutput"]

logger = logging.getLogger(__name__)


# Magnitude bound of the real-valued settings. The stability tests (validation/robustness.py) cover
# thresholds, noise and scales up to 1e30; beyond that the float32 head overflows (a threshold of -1e35
# gives an infinite loss), so such a setting is refused when the config is made or loaded.
SETTING_LIMIT = 1e30

_FIELD_KINDS = {
    "num_token_id": "int",
    "causal_size": "int",
    "abduction_mlp_size": "int",
    "abduction_scale_init": "real",
    "noise_init": "real",
    "ovr_threshold": "real",
    "ovr_threshold_quantile": "real",
    "ovr_threshold_per_class": "bool",
    "learnable_threshold": "bool",
    "regression_weight": "real",
    "gate_alpha": "real",
    "detach_gate": "bool",
    "scale_eps": "real",
    "ignore_index": "int",
    # the Qwen2 backbone's fields: a nonsense value would load silently (a negative rms_norm_eps makes every
    # loc_S NaN) or fail later with a raw exception while the model is built
    "vocab_size": "int",
    "hidden_size": "int",
    "intermediate_size": "int",
    "num_hidden_layers": "int",
    "num_attention_heads": "int",
    "num_key_value_heads": "int",
    "max_position_embeddings": "int",
    "max_window_layers": "int",
    "sliding_window": "int",
    "pad_token_id": "int",
    "bos_token_id": "int",
    "eos_token_id": "int",
    "initializer_range": "real",
    "rms_norm_eps": "real",
    "attention_dropout": "real",
    "use_cache": "bool",
    "tie_word_embeddings": "bool",
    "use_sliding_window": "bool",
}

# Fields of `_FIELD_KINDS` that may be None (null in config.json).
_NULLABLE_FIELDS = frozenset({"num_token_id", "causal_size", "abduction_mlp_size", "num_key_value_heads",
                              "sliding_window", "pad_token_id", "bos_token_id", "eos_token_id"})

# The dtype names a config may hold (``null`` or ``"auto"``: none recorded).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _activation_names() -> list[str]:
    from transformers.activations import ACT2FN

    return sorted(ACT2FN)


def _rope_types() -> list[str]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ["default", *sorted(ROPE_INIT_FUNCTIONS)]


def _checked_dtype(name: str, value):
    """``value`` (a config's ``dtype`` or ``torch_dtype``) as a floating-point dtype name, or None (``"auto"``
    too: nothing recorded); anything else is a ``ValueError`` naming the field and the accepted names."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return None
    text = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
    if not isinstance(text, str) or text not in FLOAT_DTYPES:
        raise ValueError(f"config field {name} must be one of {', '.join(FLOAT_DTYPES)}, \"auto\" or null, "
                         f"got {value!r}")
    return text if isinstance(value, str) else value


def _checked_field(name: str, value, kind: str):
    """``value`` as a Python bool / int / finite float, or a ``TypeError`` naming the field (never a cast
    of a string: ``"false"`` is not a boolean). ``eos_token_id`` may be a list of ints."""
    if name == "eos_token_id" and isinstance(value, (list, tuple)):
        return [_checked_field(name, item, kind) for item in value]
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
        abduction_scale_init: $\gamma$, the initial ``scale_U``. The class default 10.0 is the drafts' value, what
            every saved config without other values means; `from_qwen` starts at 0.1 (decision D14,
            `causalqwen.initialization.DEFAULT_INIT`).
        abduction_type: the abduction architecture, ``"linear"`` (D6, the default) or ``"mlp"`` (D6 plus a residual
            MLP whose output weights start at zero, `causalqwen.abduction.MLPAbductionNetwork`); both start at
            $U \sim \mathrm{Cauchy}(z, \gamma)$.
        abduction_mlp_size: the width $M$ of that MLP (default ``hidden_size``; ``None`` for ``"linear"``).
        noise_init: initial value of every component of $b_{\mathrm{noise}}$ (0.1).
        ovr_threshold: the OvR threshold $C_k$, shared or, with ``ovr_threshold_per_class``, a vector of $V$
            thresholds initialised to this value; a parameter when ``learnable_threshold``. The class default
            100.0 is the drafts' value; `from_qwen` computes it from the base (``ovr_threshold_init``).
        ovr_threshold_init: how `from_qwen` chose ``ovr_threshold`` (`causalqwen.initialization`):
            ``"fixed"`` (as given; the class default, and what a saved config without the field means),
            ``"top_two_midpoint"`` (from_qwen's default: the median midpoint of the base's two largest logits on a
            calibration batch) or ``"top_logit_quantile"``. A record of the conversion: a model built from a
            config uses ``ovr_threshold`` whatever the rule.
        ovr_threshold_quantile: the quantile of ``"top_logit_quantile"`` (0.5).
        regression_weight: $\lambda$ in $L = \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg}}$ (1.0).
        gate_alpha: $\alpha$ of the regression gate (0.0: the gate is $P_{\langle NUM\rangle}$ alone).
        detach_gate: stop the gradient through the gate's $P_{\langle NUM\rangle}$ (off, as specified).
        scale_eps: lower clamp for every scale before it divides (1e-6).
        ignore_index: label value that is not scored (-100).
        loss_algorithm: ``"fused"`` (the default: the tiled head + loss of `causalqwen.fused`, never forming
            ``[B, S, V]``) or ``"literal"`` (the full decisions, differentiable twice). Equal in value and gradient.
    """

    model_type = "causal_qwen"
    # What transformers.Trainer leaves out of the outputs it gathers in evaluation: the losses and counts (the
    # loss is gathered on its own), the cache (``cache`` from transformers 5.24 on) and the [B, S, V] decisions;
    # loc_U and scale_U come first (causalqwen.metrics.TrainerMetrics reads them).
    keys_to_ignore_at_inference = ["cls_loss", "reg_loss", "n_cls", "n_reg", "loc_S", "scale_S", "past_key_values",
                                   "cache", "logits", "hidden_states", "attentions"]

    num_token_id: int | None = None
    causal_size: int | None = None
    abduction_scale_init: float = 10.0
    abduction_type: str = "linear"
    abduction_mlp_size: int | None = None
    noise_init: float = 0.1
    ovr_threshold: float = 100.0
    ovr_threshold_init: str = "fixed"
    ovr_threshold_quantile: float = 0.5
    ovr_threshold_per_class: bool = False
    learnable_threshold: bool = False
    regression_weight: float = 1.0
    gate_alpha: float = 0.0
    detach_gate: bool = False
    scale_eps: float = 1e-6
    ignore_index: int = -100
    loss_algorithm: str = "fused"

    def __post_init__(self, **kwargs):
        if self.loss_algorithm not in LOSS_ALGORITHMS:
            raise ValueError(f"config field loss_algorithm must be one of {', '.join(LOSS_ALGORITHMS)}, got {self.loss_algorithm!r}")
        self.dtype = _checked_dtype("dtype", self.dtype)
        if "torch_dtype" in kwargs:
            kwargs["torch_dtype"] = _checked_dtype("torch_dtype", kwargs["torch_dtype"])
        for name, kind in _FIELD_KINDS.items():
            value = getattr(self, name)
            if value is None and name in _NULLABLE_FIELDS:
                continue
            setattr(self, name, _checked_field(name, value, kind))
        if self.causal_size is None:
            self.causal_size = self.hidden_size
        check_threshold_init(self.ovr_threshold_init, self.ovr_threshold_quantile)
        if not isinstance(self.abduction_type, str) or self.abduction_type not in ABDUCTION_TYPES:
            raise ValueError(f"config field abduction_type must be one of {', '.join(ABDUCTION_TYPES)}, "
                             f"got {self.abduction_type!r}")
        if self.abduction_type == "mlp" and self.abduction_mlp_size is None:
            self.abduction_mlp_size = self.hidden_size
        if self.abduction_type == "linear" and self.abduction_mlp_size is not None:
            raise ValueError("config field abduction_mlp_size is the width of the \"mlp\" abduction; "
                             f"abduction_type is \"linear\", so it must be None, got {self.abduction_mlp_size!r}")
        if self.abduction_mlp_size is not None and not (1 <= self.abduction_mlp_size <= SETTING_LIMIT):
            raise ValueError(f"config field abduction_mlp_size must be a positive int, got {self.abduction_mlp_size!r}")
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
        self._check_backbone()
        super().__post_init__(**kwargs)
        self._check_rope()

    def _check_backbone(self) -> None:
        """The checks of the Qwen2 fields (their kinds are checked with CausalQwen's, `_FIELD_KINDS`): sizes,
        head counts, token ids, activation and the real-valued settings; a ``ValueError`` names the field."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"):
            if not 1 <= getattr(self, name) <= SETTING_LIMIT:
                raise ValueError(f"config field {name} must be a positive integer, got {getattr(self, name)!r}")
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if kv_heads is not None and not 1 <= kv_heads <= heads:
            raise ValueError(f"config field num_key_value_heads must be an integer in [1, num_attention_heads={heads}] "
                             f"(or null), got {kv_heads!r}")
        if self.hidden_size % heads:
            raise ValueError(f"config field hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({heads})")
        if (self.hidden_size // heads) % 2:
            raise ValueError(f"config fields hidden_size / num_attention_heads ({self.hidden_size} / {heads}) must "
                             "give an even head size: the rotary embedding turns pairs of components")
        if kv_heads is not None and heads % kv_heads:
            raise ValueError(f"config field num_attention_heads ({heads}) must be divisible by "
                             f"num_key_value_heads ({kv_heads})")
        if self.max_window_layers < 0:
            raise ValueError(f"config field max_window_layers must be an integer >= 0, got {self.max_window_layers!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"config field sliding_window must be a positive integer or null, got {self.sliding_window!r}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]
            if any(i is not None and not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"config field {name} must be null or an id in [0, vocab_size={self.vocab_size}), "
                                 f"got {value!r}")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in (names := _activation_names()):
            raise ValueError(f"config field hidden_act must be one of {', '.join(names)}, got {self.hidden_act!r}")
        limit = SETTING_LIMIT
        ranges = {
            "rms_norm_eps": (0 < self.rms_norm_eps <= limit, f"in (0, {limit:g}]"),
            "initializer_range": (0 <= self.initializer_range <= limit, f"in [0, {limit:g}]"),
            "attention_dropout": (0 <= self.attention_dropout < 1, "in [0, 1)"),
        }
        for name, (ok, allowed) in ranges.items():
            if not ok:
                raise ValueError(f"config field {name} must be a number {allowed}, got {getattr(self, name)!r}")

    def _check_rope(self) -> None:
        """``rope_parameters`` (standardized by transformers, the legacy ``rope_theta`` moved into it): a
        ``rope_type`` transformers can build and a finite, positive ``rope_theta``."""
        rope = self.rope_parameters
        if not isinstance(rope, dict):
            raise ValueError(f"config field rope_parameters must be an object, got {rope!r}")
        nested = self.nested_rope_parameter_keys(rope)
        for where, parameters in ([(f"rope_parameters.{key}", rope[key]) for key in nested] or [("rope_parameters", rope)]):
            if parameters is None:
                continue
            if not isinstance(parameters, dict):
                raise ValueError(f"config field {where} must be an object, got {parameters!r}")
            rope_type = parameters.get("rope_type")
            if not isinstance(rope_type, str) or rope_type not in (types := _rope_types()):
                raise ValueError(f"config field {where}.rope_type must be one of {', '.join(types)}, got {rope_type!r}")
            theta = parameters.get("rope_theta")
            if (isinstance(theta, (bool, np.bool_)) or not isinstance(theta, numbers.Real) or not math.isfinite(theta)
                    or not 0 < theta <= SETTING_LIMIT):
                raise ValueError(f"config field {where}.rope_theta must be a finite number in (0, {SETTING_LIMIT:g}], "
                                 f"got {theta!r}")

    def validate_rope(self) -> None:
        """transformers' check of the rotary parameters (a ``@strict`` class validator), with a missing
        parameter of the ``rope_type`` a ``ValueError`` rather than its ``KeyError``."""
        try:
            super().validate_rope()
        except KeyError as error:
            raise ValueError(f"config field rope_parameters: {error.args[0] if error.args else error}") from None

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """`PreTrainedConfig.from_dict` (what ``from_pretrained`` and ``AutoConfig`` build a config with), after
        checking that ``config_dict``, a saved config, names every field of `FIELDS_A_FILE_MUST_NAME` (a keyword
        argument may supply one). A ``ValueError`` names the missing fields; ``from_pretrained`` adds the file."""
        if isinstance(config_dict, dict):
            missing = [" or ".join(names) for names in FIELDS_A_FILE_MUST_NAME
                       if all(config_dict.get(name) is None and kwargs.get(name) is None for name in names)]
            if missing:
                raise ValueError(
                    f"config field{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing (or null): a saved "
                    "CausalQwen config must name the <NUM> id and the sizes of the model's tensors; a default "
                    "would describe another model"
                )
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedConfig.from_pretrained`, with a bad or missing field reported as a ``ValueError`` or
        ``TypeError`` that starts with the config file's path (`from_dict`, `__post_init__`)."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except (ValueError, TypeError, StrictDataclassError) as error:
            file = _config_file(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
            message = " ".join(str(error).split())
            if message.startswith(file):
                raise
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(f"{file}: {message}") from error

    @classmethod
    def from_json_file(cls, json_file):
        """`PreTrainedConfig.from_json_file` with the checks of `from_dict`; errors start with ``json_file``."""
        try:
            return cls.from_dict(cls._dict_from_json_file(json_file))
        except (ValueError, TypeError, StrictDataclassError) as error:
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(f"{os.fspath(json_file)}: {' '.join(str(error).split())}") from error


# What a saved CausalQwen config must name (each entry: one of these names), because its default would describe
# another model: no <NUM> id at all, or the sizes and rotary base of a 7B Qwen2 instead of this checkpoint's.
FIELDS_A_FILE_MUST_NAME = (("num_token_id",), ("vocab_size",), ("hidden_size",), ("intermediate_size",),
                           ("num_hidden_layers",), ("num_attention_heads",), ("num_key_value_heads",),
                           ("rope_parameters", "rope_theta"))


def _config_file(source, subfolder: str) -> str:
    """The config file that ``from_pretrained(source, subfolder=...)`` reads, for error messages."""
    text = os.fspath(source)
    if os.path.isfile(text):
        return text
    if os.path.isdir(text):
        return os.path.join(text, subfolder, "config.json")
    return "/".join(part for part in (text, subfolder, "config.json") if part)


def _one_cache(past_key_values, kwargs: dict):
    """The KV cache whichever name it came by (``cache=`` from transformers >= 5.24); both at once is an error."""
    if "cache" not in kwargs:
        return past_key_values
    cache = kwargs.pop("cache")
    if cache is not None and past_key_values is not None:
        raise TypeError("pass the KV cache as cache= or as past_key_values=, not both")
    return cache if cache is not None else past_key_values


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
            generation step, the last position's scores ``[B, 1, V]`` under the step's mode:
            $\log P_k$ of the decision input (argmax: the mode's choice), or $\mathrm{loc}_S$ for
            ``traditional`` (`causalqwen.hf_generation`).
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


_ABDUCE_ARGS = ("input_ids", "numeric_values", "attention_mask", "position_ids", "past_key_values", "use_cache")
_FORWARD_ARGS = _ABDUCE_ARGS + ("labels", "numeric_labels", "return_decisions", "generation_state")
# what transformers' generation loop passes besides: positions come from position_ids, the output is always a dict
_GENERATION_LOOP_ARGS = ("cache_position", "return_dict")


class CausalQwenPreTrainedModel(Qwen2PreTrainedModel):
    """What both CausalQwen classes share: the config class, the initialization of the new modules
    (decisions D4–D7, called by transformers for every module whose weights were not loaded), and
    strict loading (`causalqwen.loading`)."""

    config: CausalQwenConfig
    config_class = CausalQwenConfig
    base_model_prefix = "model"
    is_base_model = False

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus what lets a process that never imported causalqwen load the
        directory through the Auto classes and ``pipeline``: ``config.json`` names the classes (``auto_map``,
        and ``custom_pipelines`` for ``"text-generation"``) in a module ``causalqwen_auto.py`` written beside
        it, which imports them from the installed package (`causalqwen.auto`). Loading through it needs
        ``trust_remote_code=True``, transformers' consent to run a module from the directory.

        Nothing is written through a link: a ``save_directory`` that is a symbolic link, or a link (or a
        hard-linked file) under a name the save writes (``config.json``, ``model*.safetensors``, ...), is an
        ``OSError`` naming it, raised before anything is written (`causalqwen.rundir.check_write_targets`).

        A CausalQwen ``generation_config.mode`` is saved in ``generation_config.json`` with
        ``"_from_model_config": false``, so that transformers' loader keeps it; an invalid one is a ``ValueError``."""
        if kwargs.get("is_main_process", True):
            check_write_targets(save_directory, MODEL_FILES)
        generation = getattr(self, "generation_config", None)
        mode = getattr(generation, "mode", None)
        check_generation_mode(mode)
        from_model_config = getattr(generation, "_from_model_config", None)
        saved = {name: self.config.__dict__[name] for name in SAVED_ONLY_FIELDS if name in self.config.__dict__}
        self.config.auto_map = dict(MODEL_AUTO_MAP)
        self.config.custom_pipelines = dict(CUSTOM_PIPELINES)
        if mode is not None:  # transformers' loader drops every key it does not know from a config marked as
            generation._from_model_config = False  # derived from the model's: the mode would be lost
        try:
            result = super().save_pretrained(save_directory, *args, **kwargs)
        finally:  # the model in memory keeps its config as it was
            if mode is not None:
                generation._from_model_config = from_model_config
            for name in SAVED_ONLY_FIELDS:
                if name in saved:
                    setattr(self.config, name, saved[name])
                else:
                    delattr(self.config, name)
        if kwargs.get("is_main_process", True):
            write_auto_module(save_directory)
        return result

    def _init_weights(self, module) -> None:
        super()._init_weights(module)
        if isinstance(module, (NumericalEmbedding, AbductionNetwork, ActionNetwork)):
            module.reset_parameters()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, made strict: a checkpoint loads completely or raises ``OSError``
        (`causalqwen.loading.strict_from_pretrained`). Every argument is passed on."""
        load = super().from_pretrained
        return strict_from_pretrained(cls, load, pretrained_model_name_or_path, model_args, kwargs)


class CausalQwenModel(CausalQwenPreTrainedModel, Qwen2Model):
    r"""The Qwen2 stack with the numerical embedding in front and the abduction network on top:
    $e = \mathrm{embed}(x) + \phi(v)$, $z = \mathrm{Qwen2}(e)$, $(\mathrm{loc}_U, \mathrm{scale}_U) = \mathrm{abduction}(z)$.

    It *is* a `Qwen2Model` (``embed_tokens``, ``layers``, ``norm`` keep their names, so a Qwen2 state dict
    and peft's module names apply unchanged) plus ``numerical_embedding`` and ``abduction``.
    """

    is_base_model = True

    def __init__(self, config: CausalQwenConfig):
        super().__init__(config)
        self.numerical_embedding = NumericalEmbedding(config.hidden_size)
        self.abduction = build_abduction(config)
        self.post_init()

    def forward(self, input_ids: torch.LongTensor, numeric_values: torch.FloatTensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.LongTensor | None = None,
                past_key_values: Cache | None = None, use_cache: bool | None = None, **kwargs) -> CausalQwenModelOutput:
        r"""The law of $U$ at every position, ``[B, S, C]`` twice. Inputs are checked here (one host
        synchronisation, `causalqwen.doors`). With an ``attention_mask`` and no ``position_ids``, positions
        count real tokens only, so that left padding does not shift them."""
        past_key_values = _one_cache(past_key_values, kwargs)
        check_keywords("forward", kwargs, _ABDUCE_ARGS)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        mask = check_forward(self.config, input_ids, numeric_values, attention_mask, past_length, position_ids)
        if position_ids is None and mask is not None:
            position_ids = (mask.long().cumsum(-1) - 1).clamp_min(0)[:, -input_ids.shape[1]:]  # [B, S]
        return self.law_of_U(input_ids, numeric_values, mask, position_ids, past_key_values, use_cache, **kwargs)

    def law_of_U(self, input_ids, numeric_values, attention_mask, position_ids, past_key_values, use_cache,
                 **kwargs) -> CausalQwenModelOutput:
        """`forward` on inputs already checked (and positions already formed): no check, no synchronisation."""
        inputs_embeds = self.embed_tokens(input_ids)  # [B, S, H]
        if numeric_values is not None:
            inputs_embeds = inputs_embeds + self.numerical_embedding(numeric_values)  # phi(0) = 0 elsewhere
        features = Qwen2Model.forward(self, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                      position_ids=position_ids, use_cache=use_cache,
                                      **{CACHE_NAME: past_key_values}, **kwargs)
        loc_U, scale_U = self.abduction(features.last_hidden_state)  # [B, S, C] each
        return CausalQwenModelOutput(loc_U=loc_U, scale_U=scale_U, last_hidden_state=features.last_hidden_state,
                                     **{CACHE_NAME: getattr(features, CACHE_NAME)}, hidden_states=features.hidden_states,
                                     attentions=features.attentions)


class CausalQwenForCausalLM(CausalQwenPreTrainedModel, CausalQwenGenerationMixin):
    """CausalQwen: `CausalQwenModel` (the law of $U$) and the `DecisionHead` (decisions and loss).

    Attributes: ``model`` (the `CausalQwenModel`, a `Qwen2Model`), ``action`` (the `DecisionHead`, an
    `ActionNetwork`), and for reading convenience ``numerical_embedding``, ``abduction`` and
    ``ovr_threshold``, which belong to those two.
    """

    # The loss is a mean over this batch's scored positions and ignores Trainer's num_items_in_batch, so
    # Trainer must divide by the gradient-accumulation steps itself (and not pass that keyword).
    accepts_loss_kwargs = False

    def __init__(self, config: CausalQwenConfig):
        super().__init__(config)
        self.model = CausalQwenModel(config)
        self.action = DecisionHead(config)
        self.post_init()
        # Set, not left to defaults, so that callers which sample unless told otherwise (the text-generation
        # pipeline) do not: four of the five modes draw inside the model, and do_sample is traditional's.
        self.generation_config.do_sample = False

    @property
    def numerical_embedding(self) -> NumericalEmbedding:
        return self.model.numerical_embedding

    @property
    def abduction(self) -> AbductionNetwork:
        return self.model.abduction

    @property
    def ovr_threshold(self):
        """The OvR threshold $C_k$ (a number, or a ``[]`` / ``[V]`` tensor), owned by the head."""
        return self.action.ovr_threshold

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value) -> None:
        self.model.embed_tokens = value

    def abduce(self, input_ids: torch.LongTensor, numeric_values: torch.FloatTensor | None = None,
               attention_mask: torch.Tensor | None = None, position_ids: torch.LongTensor | None = None,
               past_key_values: Cache | None = None, use_cache: bool | None = None, **kwargs) -> CausalQwenModelOutput:
        r"""The first half of the forward pass, `CausalQwenModel.forward`: the law of $U$ ``[B, S, C]`` and the
        Qwen2 outputs. The inference modes (`causalqwen.inference`) start from here."""
        past_key_values = _one_cache(past_key_values, kwargs)
        check_keywords("abduce", kwargs, _ABDUCE_ARGS)
        return self.model(input_ids, numeric_values, attention_mask, position_ids, past_key_values, use_cache, **kwargs)

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
        r"""Run the whole model (the law of $U$, then the standard action); with ``labels``, also the loss of D8–D9.

        ``labels`` are aligned with ``input_ids`` (transformers convention) and shifted inside
        (`DecisionHead.next_token_targets`): position $i$ is scored against ``labels[i+1]`` and
        ``numeric_labels[i+1]`` (default: ``numeric_values``), and only where ``attention_mask[i]``,
        ``attention_mask[i+1]`` are both 1 and ``labels[i+1] != ignore_index``. The loss algorithm is
        ``config.loss_algorithm``.

        ``return_decisions`` (default: only when no ``labels`` are given) fills ``loc_S``/``scale_S``
        ``[B, S, V]``; it changes what is returned, never how the loss is computed.
        All inputs are checked here with one host synchronisation (`causalqwen.doors`).
        """
        generation_state = kwargs.pop("generation_state", None)
        past_key_values = _one_cache(past_key_values, kwargs)
        for name in _GENERATION_LOOP_ARGS:
            kwargs.pop(name, None)
        check_keywords("forward", kwargs, _FORWARD_ARGS)
        if generation_state is not None:
            return self._generation_step(input_ids, numeric_values, attention_mask, position_ids, past_key_values,
                                         use_cache, generation_state, **kwargs)
        if return_decisions is None:
            return_decisions = labels is None
        if not return_decisions and labels is None:
            raise ValueError("return_decisions=False without labels leaves nothing to compute; pass labels or drop it")
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        mask = check_forward(self.config, input_ids, numeric_values, attention_mask, past_length, position_ids,
                             labels=labels, numeric_labels=numeric_labels, threshold=self.ovr_threshold)
        if position_ids is None and mask is not None:
            position_ids = (mask.long().cumsum(-1) - 1).clamp_min(0)[:, -input_ids.shape[1]:]  # [B, S]
        law = self.model.law_of_U(input_ids, numeric_values, mask, position_ids, past_key_values, use_cache, **kwargs)
        loc_U, scale_U = law.loc_U, law.scale_U  # [B, S, C] each

        fields = dict(loc_U=loc_U, scale_U=scale_U)
        decision = self.action.standard(loc_U, scale_U) if return_decisions else None  # [B, S, V] x2, [B, S] x2
        if decision is not None:
            fields |= decision._asdict() | dict(logits=decision.loc_S)
        if labels is not None:
            window = attention_mask[:, -input_ids.shape[1]:] if attention_mask is not None else None
            targets = self.action.next_token_targets(
                labels, numeric_labels if numeric_labels is not None else numeric_values, window)
            parts, fields["loc_Y"], fields["scale_Y"] = self.action.loss(loc_U, scale_U, targets, decision)
            fields |= dict(loss=parts.total, cls_loss=parts.cls_loss_mean, reg_loss=parts.reg_loss_effective,
                           n_cls=parts.n_cls, n_reg=parts.n_reg)
        return CausalQwenOutput(**fields, **{CACHE_NAME: getattr(law, CACHE_NAME)}, hidden_states=law.hidden_states,
                                attentions=law.attentions)

    def _generation_step(self, input_ids, numeric_values, attention_mask, position_ids, past_key_values, use_cache,
                         state, **kwargs) -> CausalQwenOutput:
        """One step of transformers' generation loop: the law of U, then the mode's scores at the last position."""
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        mask = check_forward(self.config, input_ids, numeric_values, attention_mask, past_length, position_ids)
        law = self.model.law_of_U(input_ids, numeric_values, mask, position_ids, past_key_values, use_cache, **kwargs)
        logits = self._step_logits(law.loc_U, law.scale_U, state)  # [B, 1, V]
        return CausalQwenOutput(logits=logits, loc_U=law.loc_U, scale_U=law.scale_U,
                                **{CACHE_NAME: getattr(law, CACHE_NAME)}, hidden_states=law.hidden_states,
                                attentions=law.attentions)

    # ---- construction from a Qwen2 base ----

    @classmethod
    def from_qwen(cls, base: Qwen2ForCausalLM | str | os.PathLike, *, calibration=None,
                  **config_overrides) -> "CausalQwenForCausalLM":
        r"""Build CausalQwen from a Qwen2 base and apply the initialization of decisions D4–D7 and D14.

        ``base`` is a `Qwen2ForCausalLM` instance, a local directory or a hub id (loaded with
        ``Qwen2ForCausalLM.from_pretrained``). ``config_overrides`` set `CausalQwenConfig` fields;
        ``num_token_id`` is required for an instance and read from the tokenizer saved with a path
        (its ``<NUM>`` id if present, else ``len(tokenizer)``).

        The backbone weights are copied, ``W_cls`` becomes a copy of the base lm_head weight (its own
        parameter, never tied), and the new modules get their D4–D7 initialization. If
        ``num_token_id == vocab_size`` the embedding and the head grow by one row (decision D2).

        Scale and threshold (D14, `causalqwen.initialization`): unless overridden, $\gamma$ =
        ``abduction_scale_init`` = 0.1 and $C$ = ``ovr_threshold`` is computed from the base by the rule
        ``ovr_threshold_init`` (default ``"top_two_midpoint"``) on ``calibration`` (a mapping with ``input_ids``
        and optionally ``attention_mask``), or, without one, on text the base samples itself. Passing
        ``ovr_threshold`` alone fixes $C$ (rule ``"fixed"``); ``from_qwen(base, **DRAFT_INIT)`` gives the
        drafts' $\gamma = 10$, $C = 100$.
        """
        unknown = sorted(set(config_overrides) - _config_fields())
        if unknown:
            raise ValueError(f"from_qwen: {', '.join(map(repr, unknown))} is not a CausalQwenConfig field")
        config_overrides = _with_default_init(config_overrides, calibration)
        if isinstance(base, (str, os.PathLike)):
            check_local_source(base, "base model")
            base_config = AutoConfig.from_pretrained(base)
            if base_config.model_type != "qwen2":
                raise ValueError(f"base {str(base)!r} is a {base_config.model_type!r} model; CausalQwen needs a Qwen2 base")
            check_qwen_base(base, base_config)
            if "num_token_id" not in config_overrides:
                config_overrides["num_token_id"] = num_token_id_from_tokenizer(base)
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
        config = _config_from_base(base.config, config_overrides)  # every setting checked before the rule runs
        if config.ovr_threshold_init != "fixed":
            threshold = initial_threshold(base, config.ovr_threshold_init, config.ovr_threshold_quantile, calibration,
                                          config.num_token_id)
            config = CausalQwenConfig.from_dict({**config.to_dict(), "ovr_threshold": threshold})  # checked again
        model = cls(config).to(base.dtype)
        _copy_base_weights(base, model)
        return model


@functools.cache
def _config_fields() -> frozenset[str]:
    """The names `CausalQwenConfig` knows: its own and `Qwen2Config`'s arguments and serialized keys."""
    arguments = set(inspect.signature(CausalQwenConfig.__init__).parameters) - {"self", "kwargs"}
    return frozenset(arguments | set(CausalQwenConfig().to_dict()))


def _with_default_init(overrides: dict, calibration) -> dict:
    """``overrides`` over `DEFAULT_INIT` (D14): an ``ovr_threshold`` given alone means the rule ``"fixed"``; a
    threshold with another rule, or a calibration batch without a rule, is a ``ValueError``."""
    settings = dict(DEFAULT_INIT)
    if "ovr_threshold" in overrides:
        settings["ovr_threshold_init"] = "fixed"
    settings.update(overrides)
    rule = settings["ovr_threshold_init"]
    check_threshold_init(rule, settings.get("ovr_threshold_quantile", 0.5))
    if rule != "fixed" and "ovr_threshold" in overrides:
        raise ValueError(f"from_qwen: ovr_threshold={overrides['ovr_threshold']!r} fixes the threshold, "
                         f"ovr_threshold_init={rule!r} computes it from the base; pass one of them")
    if rule == "fixed" and "ovr_threshold" not in overrides:
        raise ValueError("from_qwen: ovr_threshold_init=\"fixed\" takes the threshold as given: pass ovr_threshold "
                         "too (the drafts' value is 100.0, causalqwen.initialization.DRAFT_INIT)")
    if "ovr_threshold_quantile" in overrides and rule != "top_logit_quantile":
        raise ValueError(f"from_qwen: ovr_threshold_quantile is read by the rule \"top_logit_quantile\" only; "
                         f"ovr_threshold_init is {rule!r}")
    if rule == "fixed" and calibration is not None:
        raise ValueError("from_qwen: calibration is read by a threshold rule (ovr_threshold_init), and the threshold "
                         "is fixed here; drop calibration or choose a rule")
    return settings


def _config_from_base(base_config: Qwen2Config, overrides: dict) -> CausalQwenConfig:
    """The base's settings with ``overrides``; one more row for ``<NUM>`` when its id is the base's vocab_size (D2)."""
    settings = {k: v for k, v in base_config.to_dict().items()
                if k not in ("model_type", "architectures", "transformers_version", "_name_or_path")
                and k not in SAVED_ONLY_FIELDS}
    settings.update(overrides)
    settings["tie_word_embeddings"] = False  # W_cls is its own copy of lm_head
    if settings["num_token_id"] == base_config.vocab_size:
        settings["vocab_size"] = base_config.vocab_size + 1
        logger.warning("num_token_id=%d equals the base vocab_size: growing the embedding and the head by one row "
                       "for <NUM>", base_config.vocab_size)
    return CausalQwenConfig.from_dict(settings)


@torch.no_grad()
def _copy_base_weights(base: Qwen2ForCausalLM, model: CausalQwenForCausalLM) -> None:
    """The Qwen2 stack into ``model.model`` and lm_head into $W_{\\mathrm{cls}}$ (decision D4–D7's initialization)."""
    base_vocab = base.config.vocab_size
    backbone = base.model.state_dict()
    if model.config.vocab_size > base_vocab:
        new_row = model.model.embed_tokens.weight[base_vocab:]  # initialised like the other rows
        backbone["embed_tokens.weight"] = torch.cat([backbone["embed_tokens.weight"], new_row], dim=0)
    missing, unexpected = model.model.load_state_dict(backbone, strict=False)
    own = tuple(name for name, _ in model.model.named_parameters() if name.startswith(("numerical_embedding.", "abduction.")))
    if unexpected or set(missing) - set(own):
        raise ValueError(f"the base's Qwen2 stack does not fit: missing {sorted(set(missing) - set(own))}, "
                         f"unexpected {sorted(unexpected)}")
    model.action.classification_head.weight[:base_vocab].copy_(base.get_output_embeddings().weight)


AutoConfig.register(CausalQwenConfig.model_type, CausalQwenConfig, exist_ok=True)
AutoModel.register(CausalQwenConfig, CausalQwenModel, exist_ok=True)
AutoModelForCausalLM.register(CausalQwenConfig, CausalQwenForCausalLM, exist_ok=True)
