r"""Configuration: `CausalQwenConfig`, a `Qwen2Config` plus the CausalQwen hyper-parameters, checked once.

Every field is checked once, when a config is made, loaded or updated (`CausalQwenConfig.update`), so the modules
built from it trust it: the kinds of the Qwen2 backbone's fields by transformers' ``@strict`` (huggingface_hub's
type validation: an int where a float belongs, a bool where an int belongs, a string anywhere is refused), the kinds
of CausalQwen's own fields here (a bool is a JSON boolean, an int an integer, a real a finite number: a ``TypeError``
naming the field), and in ``__post_init__`` every range, the backbone's sizes and rotary parameters.

One set of defaults: ``CausalQwenConfig()`` starts where `CausalQwenForCausalLM.from_qwen` does, at the
calibrated initialization ($\gamma = 0.1$ and the threshold rule ``"top_two_midpoint"``, the class defaults, which
a conversion reads from here); without a base there are no logits to calibrate on, so $C$ starts at 0.0, what the rule
gives for a base whose logits are all zero. A saved config names its scale and threshold (`INITIALIZATION_FIELDS`,
which every save writes); a config file that leaves one out was written when the class defaults were the drafts',
and loads with the drafts' value (`causalqwen.initialization.DRAFT_INIT`). `conversion_settings` and
`config_from_base` are how ``from_qwen`` builds a config from a base and its overrides.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import json
import logging
import numbers
import os

import numpy as np
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import Qwen2Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .abduction import ABDUCTION_TYPES
from .checks.config_fields import check_integers_fit, check_ranges, checked_dtype, checked_field
from .embedding import encoding_periods
from .initialization import DRAFT_INIT, check_threshold_init, threshold_rule_settings
from .losses import LOSS_ALGORITHMS

__all__ = [
    "CausalQwenConfig",
    "SETTING_LIMIT",
    "FIELDS_A_FILE_MUST_NAME",
    "INITIALIZATION_FIELDS",
    "conversion_settings",
    "config_from_base",
]

logger = logging.getLogger(__name__)

# Magnitude bound of the real-valued settings. The stability tests (validation/robustness.py) cover
# thresholds, noise and scales up to 1e30; beyond that the float32 head overflows (a threshold of -1e35
# gives an infinite loss), so such a setting is refused when the config is made or loaded.
SETTING_LIMIT = 1e30

# The kinds of CausalQwen's own fields, annotated as text (``from __future__ import annotations``), which @strict does
# not check, so that a wrong kind is a TypeError naming the field in these words; the Qwen2 backbone's fields carry
# real annotations, whose kinds @strict refuses before __post_init__ runs. Only their values are checked here.
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
}

# Fields of `_FIELD_KINDS` that may be None (null in config.json).
_NULLABLE_FIELDS = frozenset({"num_token_id", "causal_size", "abduction_mlp_size"})


def _activation_names() -> list[str]:
    from transformers.activations import ACT2FN

    return sorted(ACT2FN)


@strict
class CausalQwenConfig(Qwen2Config):
    r"""A `Qwen2Config` plus the CausalQwen hyper-parameters.

    Attributes:
        num_token_id: id of the ``<NUM>`` token (``len(tokenizer)`` before it was added).
        causal_size: dimension $C$ of $U$; must equal ``hidden_size`` (defaults to it).
        abduction_scale_init: $\gamma$, the initial ``scale_U`` (0.1, as `from_qwen` starts; a saved config without
            the field means the drafts' 10.0, `causalqwen.initialization.DRAFT_INIT`).
        abduction_type: the abduction architecture, ``"linear"`` (the identity map, the default) or ``"mlp"`` (that
            plus a residual MLP whose output weights start at zero, `causalqwen.abduction.MLPAbductionNetwork`); both
            start at $U \sim \mathrm{Cauchy}(z, \gamma)$.
        abduction_mlp_size: the width $M$ of that MLP (default ``hidden_size``; ``None`` for ``"linear"``).
        number_encoding: how a value enters the embedding (`causalqwen.embedding`): ``"log"`` (the default, the
            design's $\phi$) or ``"log_fourier"`` ($\phi$ plus sinusoids of $v$ whose weights start at zero;
            beyond the design, decision D27).
        number_periods: the periods $T_j$ of ``"log_fourier"`` (default: FoNE's decimal periods
            $10^{-2}, \dots, 10^{4}$; ``None`` for ``"log"``).
        noise_init: initial value of every component of $b_{\mathrm{noise}}$ (0.1).
        ovr_threshold: the OvR threshold $C_k$, shared or, with ``ovr_threshold_per_class``, a vector of $V$ thresholds
            initialised to this value. `from_qwen` computes it by ``ovr_threshold_init``; without a base it is 0.0, the
            rule's value for all-zero logits (a saved config without the field means the drafts' 100.0).
        learnable_threshold: make $C$ a parameter (off): the bias $b_{\mathrm{cls}}$ under another name, so it changes
            no OvR quantity, only the optimisation and what reads $\mathrm{loc}_S$ alone (``traditional``'s softmax).
        ovr_threshold_init: how `from_qwen` computes ``ovr_threshold`` (`causalqwen.initialization`):
            ``"top_two_midpoint"`` (the default: the median midpoint of the base's two largest logits on a calibration
            batch), ``"top_logit_quantile"`` or ``"fixed"`` (as given; what a saved config without the field means). A
            record of the conversion: whatever the rule, a model uses ``ovr_threshold``.
        ovr_threshold_quantile: the quantile of ``"top_logit_quantile"`` (0.5).
        regression_weight: $\lambda$ in $L = \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg}}$ (1.0).
        gate_alpha: $\alpha$ of the regression gate (0.0: the gate is $P_{\langle NUM\rangle}$ alone).
        detach_gate: stop the gradient through the gate's $P_{\langle NUM\rangle}$ (on: measured, decision D24).
        scale_eps: lower clamp for every scale before it divides (1e-6).
        ignore_index: label value that is not scored (-100).
        loss_algorithm: ``"fused"`` (the default: the tiled head + loss of `causalqwen.kernels.fused`, never forming
            ``[B, S, V]``) or ``"literal"`` (the full decisions, differentiable twice). Equal in value and gradient.
    """

    model_type = "causal_qwen"
    # What transformers.Trainer leaves out of the outputs it gathers in evaluation: the losses and counts (the
    # loss is gathered on its own), the cache (``cache`` from transformers 5.24 on) and the [B, S, V] decisions;
    # what a batch with labels gathers is (loc_U, scale_U, loc_Y, scale_Y, numeric_labels), in that order
    # (causalqwen.metrics.TrainerMetrics reads them; docs/training.md, "With transformers' Trainer").
    keys_to_ignore_at_inference = [
        "cls_loss",
        "reg_loss",
        "n_cls",
        "n_reg",
        "loc_S",
        "scale_S",
        "past_key_values",
        "cache",
        "logits",
        "hidden_states",
        "attentions",
        "targets",
    ]

    num_token_id: int | None = None
    causal_size: int | None = None
    abduction_scale_init: float = 0.1
    abduction_type: str = "linear"
    abduction_mlp_size: int | None = None
    number_encoding: str = "log"
    number_periods: list[float] | None = None
    noise_init: float = 0.1
    ovr_threshold: float = 0.0
    ovr_threshold_init: str = "top_two_midpoint"
    ovr_threshold_quantile: float = 0.5
    ovr_threshold_per_class: bool = False
    learnable_threshold: bool = False
    regression_weight: float = 1.0
    gate_alpha: float = 0.0
    detach_gate: bool = True
    scale_eps: float = 1e-6
    ignore_index: int = -100
    loss_algorithm: str = "fused"

    def __post_init__(self, **kwargs):
        """Every field checked once, before transformers' own post-init: CausalQwen's (`_check_own_fields`), then the
        backbone's values (`_check_backbone`), then the rotary parameters transformers has standardized."""
        if self.loss_algorithm not in LOSS_ALGORITHMS:
            raise ValueError(
                f"config field loss_algorithm must be one of {', '.join(LOSS_ALGORITHMS)}, got {self.loss_algorithm!r}"
            )
        self.dtype = checked_dtype("dtype", self.dtype)
        _refuse_misspelt_fields(kwargs, type(self))
        if "torch_dtype" in kwargs:
            kwargs["torch_dtype"] = checked_dtype("torch_dtype", kwargs["torch_dtype"])
        self._check_own_fields()
        self._check_backbone()
        super().__post_init__(**kwargs)
        self._check_rope()
        check_integers_fit({name: value for name, value in vars(self).items() if not name.startswith("_")})
        object.__setattr__(self, "_fields_checked", True)  # from here on a field set is checked (`__setattr__`)

    def __setattr__(self, name: str, value) -> None:
        """A field set on a made config (``config.gate_alpha = 5.0``) passes the checks of a config made with it, and
        takes the value they give (a ``TypeError`` or ``ValueError`` naming the field otherwise, the config unchanged):
        the modules built from the config read it at every forward pass, and trust it."""
        if self.__dict__.get("_fields_checked") and name in _dataclass_fields():
            self.update({name: value})
        else:
            super().__setattr__(name, value)

    def check_loads_back(self) -> None:
        """A ``ValueError`` or ``TypeError`` unless ``config.json`` as `save_pretrained` writes it loads back (what
        `from_pretrained` checks, `from_dict`): a save never writes a file its own loader refuses (a NaN put in place
        into ``rope_parameters``, a config without ``num_token_id``)."""
        try:
            type(self).from_dict(json.loads(self.to_json_string()))
        except (ValueError, TypeError, StrictDataclassError) as error:
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(f"save_pretrained: config.json would not load back: {' '.join(str(error).split())}") from None

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedConfig.save_pretrained`, after `check_loads_back` (nothing written if it fails)."""
        self.check_loads_back()
        return super().save_pretrained(save_directory, *args, **kwargs)

    def update(self, config_dict: dict) -> None:
        """`PreTrainedConfig.update` once a config made with it passes every check; else its error, naming the field.
        The values are set together, as checked together (one by one, `__setattr__` would check each alone), with the
        defaults that follow from them filled as that config fills them (``number_encoding="log_fourier"`` brings
        its default ``number_periods``)."""
        checked = type(self)(**(self.to_dict() | dict(config_dict)))
        followed = [name for name in _dataclass_fields() if getattr(self, name, None) is None]
        object.__setattr__(self, "_fields_checked", False)
        try:
            super().update({key: getattr(checked, key) for key in [*config_dict, *followed]})
        finally:
            object.__setattr__(self, "_fields_checked", True)

    def _check_own_fields(self) -> None:
        """CausalQwen's fields: their kinds (`_FIELD_KINDS`), the choices, the defaults that follow from other
        fields (``causal_size``, ``abduction_mlp_size``) and the ranges; a ``TypeError`` or ``ValueError`` names
        the field."""
        for name, kind in _FIELD_KINDS.items():
            value = getattr(self, name)
            if value is None and name in _NULLABLE_FIELDS:
                continue
            setattr(self, name, checked_field(name, value, kind))
        if self.causal_size is None:
            self.causal_size = self.hidden_size
        check_threshold_init(self.ovr_threshold_init, self.ovr_threshold_quantile)
        if not isinstance(self.abduction_type, str) or self.abduction_type not in ABDUCTION_TYPES:
            raise ValueError(
                f"config field abduction_type must be one of {', '.join(ABDUCTION_TYPES)}, got {self.abduction_type!r}"
            )
        if self.abduction_type == "mlp" and self.abduction_mlp_size is None:
            self.abduction_mlp_size = self.hidden_size
        if self.abduction_type == "linear" and self.abduction_mlp_size is not None:
            raise ValueError(
                'config field abduction_mlp_size is the width of the "mlp" abduction; '
                f'abduction_type is "linear", so it must be None, got {self.abduction_mlp_size!r}'
            )
        if self.abduction_mlp_size is not None and not (1 <= self.abduction_mlp_size <= SETTING_LIMIT):
            raise ValueError(f"config field abduction_mlp_size must be a positive int, got {self.abduction_mlp_size!r}")
        self.number_periods = encoding_periods(self.number_encoding, self.number_periods, SETTING_LIMIT)
        if self.causal_size != self.hidden_size:
            raise ValueError(
                f"causal_size ({self.causal_size}) must equal hidden_size ({self.hidden_size}): "
                "the abduction network is initialised as the identity"
            )
        limit = SETTING_LIMIT
        check_ranges(
            self,
            {
                "abduction_scale_init": (lambda v: 0 < v <= limit, f"in (0, {limit:g}]"),
                "scale_eps": (lambda v: 1 / limit <= v <= limit, f"in [{1 / limit:g}, {limit:g}]"),
                "gate_alpha": (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
                "regression_weight": (lambda v: 0 <= v <= limit, f"in [0, {limit:g}]"),
                "noise_init": (lambda v: abs(v) <= limit, f"in [-{limit:g}, {limit:g}]"),
                "ovr_threshold": (lambda v: abs(v) <= limit, f"in [-{limit:g}, {limit:g}]"),
            },
        )
        if self.num_token_id is not None and not 0 <= self.num_token_id < self.vocab_size:
            raise ValueError(f"num_token_id ({self.num_token_id}) must lie in [0, vocab_size={self.vocab_size})")

    def _check_backbone(self) -> None:
        """The values of the Qwen2 fields (their kinds are @strict's): sizes, head counts, token ids, activation and
        the real-valued settings; a ``ValueError`` names the field."""
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
        ):
            if not 1 <= getattr(self, name) <= SETTING_LIMIT:
                raise ValueError(f"config field {name} must be a positive integer, got {getattr(self, name)!r}")
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if kv_heads is not None and not 1 <= kv_heads <= heads:
            raise ValueError(
                f"config field num_key_value_heads must be an integer in [1, num_attention_heads={heads}] "
                f"(or null), got {kv_heads!r}"
            )
        if self.hidden_size % heads:
            raise ValueError(
                f"config field hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({heads})"
            )
        if (self.hidden_size // heads) % 2:
            raise ValueError(
                f"config fields hidden_size / num_attention_heads ({self.hidden_size} / {heads}) must "
                "give an even head size: the rotary embedding turns pairs of components"
            )
        if kv_heads is not None and heads % kv_heads:
            raise ValueError(
                f"config field num_attention_heads ({heads}) must be divisible by num_key_value_heads ({kv_heads})"
            )
        if self.max_window_layers < 0:
            raise ValueError(f"config field max_window_layers must be an integer >= 0, got {self.max_window_layers!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(
                f"config field sliding_window must be a positive integer or null, got {self.sliding_window!r}"
            )
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]
            if any(i is not None and not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(
                    f"config field {name} must be null or an id in [0, vocab_size={self.vocab_size}), got {value!r}"
                )
        if not isinstance(self.hidden_act, str) or self.hidden_act not in (names := _activation_names()):
            raise ValueError(f"config field hidden_act must be one of {', '.join(names)}, got {self.hidden_act!r}")
        limit = SETTING_LIMIT
        check_ranges(
            self,
            {
                "rms_norm_eps": (lambda v: 0 < v <= limit, f"in (0, {limit:g}]"),
                "initializer_range": (lambda v: 0 <= v <= limit, f"in [0, {limit:g}]"),
                "attention_dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
            },
        )
        self.attention_dropout = float(self.attention_dropout)  # @strict lets an int through here (float | int)

    def _check_rope(self) -> None:
        """``rope_parameters`` (standardized by transformers, the legacy ``rope_theta`` moved into it): a
        ``rope_type`` transformers can build and a finite, positive ``rope_theta``."""
        rope = self.rope_parameters
        if not isinstance(rope, dict):
            raise ValueError(f"config field rope_parameters must be an object, got {rope!r}")
        nested = self.nested_rope_parameter_keys(rope)
        for where, parameters in [(f"rope_parameters.{key}", rope[key]) for key in nested] or [
            ("rope_parameters", rope)
        ]:
            if parameters is None:
                continue
            if not isinstance(parameters, dict):
                raise ValueError(f"config field {where} must be an object, got {parameters!r}")
            rope_type = parameters.get("rope_type")
            if not isinstance(rope_type, str) or rope_type not in (types := ["default", *sorted(ROPE_INIT_FUNCTIONS)]):
                raise ValueError(f"config field {where}.rope_type must be one of {', '.join(types)}, got {rope_type!r}")
            theta = parameters.get("rope_theta")
            if (
                isinstance(theta, (bool, np.bool_))
                or not isinstance(theta, numbers.Real)
                or not 0 < theta <= SETTING_LIMIT  # NaN and an integer beyond the float range too
            ):
                raise ValueError(
                    f"config field {where}.rope_theta must be a finite number in (0, {SETTING_LIMIT:g}], got {theta!r}"
                )

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
        argument may supply one). A ``ValueError`` names the missing fields; ``from_pretrained`` adds the file.

        A field of `INITIALIZATION_FIELDS` that ``config_dict`` leaves out means the drafts' value (`DRAFT_INIT`),
        and a missing ``detach_gate`` False: the class defaults of the versions that wrote such a file."""
        if isinstance(config_dict, dict):
            missing = [
                " or ".join(names)
                for names in FIELDS_A_FILE_MUST_NAME
                if all(config_dict.get(name) is None and kwargs.get(name) is None for name in names)
            ]
            if missing:
                raise ValueError(
                    f"config field{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing (or null): a saved "
                    "CausalQwen config must name the <NUM> id and the sizes of the model's tensors; a default "
                    "would describe another model"
                )
            config_dict = {**DRAFT_INIT, "detach_gate": False, **config_dict}
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
FIELDS_A_FILE_MUST_NAME = (
    ("num_token_id",),
    ("vocab_size",),
    ("hidden_size",),
    ("intermediate_size",),
    ("num_hidden_layers",),
    ("num_attention_heads",),
    ("num_key_value_heads",),
    ("rope_parameters", "rope_theta"),
)

# The fields whose class defaults were once the drafts' values (DRAFT_INIT) and are now the calibrated ones. Every
# save writes them (transformers' ``to_diff_dict`` drops a field only where `PreTrainedConfig` itself has it, at the
# same value), so a file names the values it was saved with; one without them was written when the drafts' values
# were the class defaults (``ovr_threshold_init`` did not exist yet).
INITIALIZATION_FIELDS = tuple(DRAFT_INIT)


def _config_file(source, subfolder: str) -> str:
    """The config file that ``from_pretrained(source, subfolder=...)`` reads, for error messages."""
    text = os.fspath(source)
    if os.path.isfile(text):
        return text
    if os.path.isdir(text):
        return os.path.join(text, subfolder, "config.json")
    return "/".join(part for part in (text, subfolder, "config.json") if part)


@functools.cache
def _dataclass_fields() -> frozenset[str]:
    """The fields of `CausalQwenConfig` and of the transformers config classes under it: what `__setattr__` checks."""
    return frozenset(field.name for field in dataclasses.fields(CausalQwenConfig))


@functools.cache
def _config_fields() -> frozenset[str]:
    """The names `CausalQwenConfig` knows: its own and `Qwen2Config`'s arguments and serialized keys."""
    arguments = set(inspect.signature(CausalQwenConfig.__init__).parameters) - {"self", "kwargs"}
    return frozenset(arguments | set(CausalQwenConfig().to_dict()))


def _refuse_misspelt_fields(extra: dict, config_class: type) -> None:
    """An extra key that is a near spelling of a field (``ovr_treshold``) would be kept and change nothing: a
    ``ValueError``. Other extra keys are kept, as transformers keeps them, and so are the class's own names."""
    for key in [key for key in extra if key not in _config_fields()]:  # an empty extra asks nothing (no recursion)
        lower = {name.lower(): name for name in _config_fields()}
        if key.lower() in lower:  # OVR_THRESHOLD: the names are case-sensitive, as in JSON and Python
            raise ValueError(
                f"config field {key!r} is not a CausalQwenConfig field (names are case-sensitive); did you mean "
                f"{lower[key.lower()]!r}?"
            )
        close = difflib.get_close_matches(key, _config_fields(), n=1, cutoff=0.85)
        if close and not hasattr(config_class, key):
            raise ValueError(f"config field {key!r} is not a CausalQwenConfig field; did you mean {close[0]!r}?")


def conversion_settings(overrides: dict, calibration) -> dict:
    """The settings of a conversion (`CausalQwenForCausalLM.from_qwen`): ``overrides`` with the threshold's rule
    settled, by default the class's (`causalqwen.initialization.threshold_rule_settings`). An unknown field is a
    ``ValueError``."""
    unknown = sorted(set(overrides) - _config_fields())
    if unknown:
        raise ValueError(f"from_qwen: {', '.join(map(repr, unknown))} is not a CausalQwenConfig field")
    return threshold_rule_settings(overrides, calibration, CausalQwenConfig.ovr_threshold_init)


# What a conversion does not take from the base's config: the records of the base's own file and class, and the
# loader records (``auto_map``, ``custom_pipelines``) that name the base's remote code, not CausalQwen's.
_BASE_RECORDS = ("model_type", "architectures", "transformers_version", "_name_or_path", "auto_map", "custom_pipelines")


def config_from_base(base_config: Qwen2Config, overrides: dict) -> CausalQwenConfig:
    r"""The base's settings with ``overrides``; one more row for ``<NUM>`` when its id is the base's vocab_size.
    The fields a file may leave out for the drafts' values (`INITIALIZATION_FIELDS`, ``detach_gate``) start at the
    class defaults, unless overridden: $\gamma$, the rule and the threshold (0.0 until a rule computes it)."""
    settings = {k: v for k, v in base_config.to_dict().items() if k not in _BASE_RECORDS}
    settings |= {name: getattr(CausalQwenConfig, name) for name in (*INITIALIZATION_FIELDS, "detach_gate")}
    settings.update(overrides)
    settings["tie_word_embeddings"] = False  # W_cls is its own copy of lm_head
    if settings["num_token_id"] == base_config.vocab_size:
        settings["vocab_size"] = base_config.vocab_size + 1
        logger.warning(
            "num_token_id=%d equals the base vocab_size: growing the embedding and the head by one row for <NUM>",
            base_config.vocab_size,
        )
    return CausalQwenConfig.from_dict(settings)
