r"""LoRA adapters on the Qwen2 backbone of CausalQwen, with the causal preset trained beside them (`peft`).

**What is adapted.** Every targeted linear layer $W \in \mathbb R^{d_{\mathrm{out}} \times d_{\mathrm{in}}}$ of the
backbone's ``model.layers`` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``,
``down_proj``) becomes

$$h = W x + \frac{\alpha}{r}\, B A x, \qquad A \in \mathbb R^{r \times d_{\mathrm{in}}},\quad
B \in \mathbb R^{d_{\mathrm{out}} \times r},$$

with $A$ Kaiming-uniform and $B = 0$ at creation, so the wrapped model computes exactly what the plain model
computes (bit for bit) until $B$ has been trained. A target adds $r\,(d_{\mathrm{in}} + d_{\mathrm{out}})$
trainable numbers. $W$, the token embedding and the final norm stay frozen.

**What is trained in full.** The modules of the ``causal`` preset (`causalqwen.training.set_trainable`): the
numerical embedding ($\vec w_{\mathrm{num}}$), the abduction network ($W_{\mathrm{loc}}, b_{\mathrm{loc}},
W_{\mathrm{scale}}, b_{\mathrm{scale}}$) and the decision head ($b_{\mathrm{noise}}$, $W_{\mathrm{cls}}$,
$b_{\mathrm{cls}}$, the regression head, a learnable threshold). peft wraps each of them in a
``ModulesToSaveWrapper`` holding two copies: ``original_module`` (the base's, frozen, never changed) and
``modules_to_save["default"]`` (a deep copy, trainable). The trained copies are written with the adapter, so a
saved adapter directory holds $A$, $B$ for every target and these three modules, nothing of the frozen base.

**The base model's pass** is ``peft_model.disable_adapter()`` with every ``requires_grad`` flag kept
(`base_reference`, `causalqwen.divergence.adapters_disabled`, whose docstring says what peft does inside).

**Known peft quirks met (peft 0.21.2, transformers 5):**

- ``modules_to_save`` copies its modules with ``copy.deepcopy``, which copies the head's `CausalQwenConfig`
  too: the trained head would stop seeing changes to ``model.config``. `add_lora`, `load_lora` and `merge_lora`
  point it back at the model's config.
- peft matches ``modules_to_save`` by name suffix (``key.endswith(name)``); the names used here
  (`CAUSAL_MODULES`) match exactly the three modules. LoRA targets are given as one regular expression
  (fully matched) that only accepts ``model.layers.<i>.self_attn.*`` / ``model.layers.<i>.mlp.*``.
- `causalqwen.generation.generate` checks that ``model.action`` is a `DecisionHead`; on a `PeftModel` it is a
  ``ModulesToSaveWrapper``, so use ``peft_model.generate(...)`` (transformers' loop,
  `causalqwen.integrations.generation_mixin`, which works through the wrapper) or the merged model (`merge_lora`).
- ``merge_and_unload`` consumes the `PeftModel`: the LoRA layers are replaced in place by merged ``nn.Linear``
  layers and each wrapper by its trained copy (the base copies are dropped). Use only the returned model afterwards.
- peft's ``PeftModel`` reads ``model.is_gradient_checkpointing``, which transformers 5 deprecates with a
  ``FutureWarning``; that one warning is silenced here.
- ``save_pretrained`` also writes a ``README.md`` model card beside ``adapter_config.json`` and
  ``adapter_model.safetensors``.

**Files.** `save_lora` writes safetensors only, never the embedding, and records the base as a local directory's
absolute path or a hub id (`causalqwen.integrations.lora_base`); it refuses a planted link among the files peft
writes. `load_lora` reads ``adapter_config.json`` (JSON; it must be what `add_lora` makes) and
``adapter_model.safetensors`` with `safetensors` itself, after checking every tensor's name, shape, dtype and
finiteness against the adapter the model would get; a pickled ``adapter_model.bin`` is refused, never unpickled.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import re
import warnings
from collections.abc import Iterator

import torch
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from peft.utils.other import AuxiliaryTrainingWrapper
from safetensors.torch import load_file

from ..checks.values import check_finite_real, check_positive_integral
from ..configuration import CausalQwenConfig
from ..decision import DecisionHead
from ..divergence import adapters_disabled
from ..files.checkpoint import header_shapes, shape_problems, value_problem
from ..files.rundir import check_write_targets
from .lora_base import portable_base, read_adapter_config

__all__ = [
    "LORA_TARGET_MODULES",
    "CAUSAL_MODULES",
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "add_lora",
    "save_lora",
    "load_lora",
    "restore_lora",
    "merge_lora",
    "base_reference",
    "is_peft_model",
    "trainable_parameter_count",
    "lora_target_pattern",
]

# The linear layers of a Qwen2 decoder layer, by the sub-module that owns them.
_ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
LORA_TARGET_MODULES = _ATTENTION_PROJECTIONS + _MLP_PROJECTIONS

# The modules of the "causal" preset, named as in CausalQwenForCausalLM: trained in full, saved with the adapter.
CAUSAL_MODULES = ("model.numerical_embedding", "model.abduction", "action")

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PICKLED_ADAPTERS = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")
_ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, "README.md")  # what peft's save_pretrained writes
# adapter_config.json fields that record where an adapter came from, not what it computes: they may differ.
_ADAPTER_BOOKKEEPING = ("auto_mapping", "base_model_name_or_path", "revision", "peft_version", "inference_mode")
_ADAPTER_NAME = "default"


# =============================================================================================
# Argument checks (the public door)
# =============================================================================================


def is_causal_lm(model) -> bool:
    """Whether ``model`` is a `causalqwen.CausalQwenForCausalLM`: a module with a CausalQwen config and a decision head
    (``action``, which peft may have wrapped), unlike `causalqwen.CausalQwenModel`, which has none."""
    return (
        isinstance(model, torch.nn.Module)
        and isinstance(getattr(model, "config", None), CausalQwenConfig)
        and isinstance(getattr(model, "action", None), torch.nn.Module)
    )


def _check_model(model) -> None:
    """``TypeError`` unless ``model`` is a plain `CausalQwenForCausalLM` without adapters."""
    if isinstance(model, PeftModel):
        raise TypeError("model is already a PeftModel; pass a plain CausalQwenForCausalLM (merge_lora gives one back)")
    if not is_causal_lm(model):
        raise TypeError(
            f"model must be a CausalQwenForCausalLM (convert a Qwen2 model with CausalQwenForCausalLM.from_qwen), "
            f"got {type(model).__name__}"
        )
    if any(isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper)) for module in model.modules()):
        raise TypeError("model already holds peft adapter layers; start from a model without adapters")


def is_peft_model(model) -> bool:
    """Whether ``model`` is a `peft.PeftModel` (what `add_lora` and `load_lora` return)."""
    return isinstance(model, PeftModel)


def _check_peft_model(peft_model) -> None:
    """``TypeError`` unless ``peft_model`` is a LoRA `PeftModel` around a `CausalQwenForCausalLM`."""
    if not isinstance(peft_model, PeftModel):
        raise TypeError(f"expected a peft.PeftModel (from add_lora or load_lora), got {type(peft_model).__name__}")
    if not is_causal_lm(peft_model.get_base_model()):
        raise TypeError(
            f"the PeftModel must wrap a CausalQwenForCausalLM, it wraps {type(peft_model.get_base_model()).__name__}"
        )
    if not isinstance(peft_model.peft_config.get(peft_model.active_adapter), LoraConfig):
        raise TypeError("the PeftModel's active adapter is not a LoRA adapter")


def _check_targets(target_modules) -> tuple[str, ...]:
    """The target names, each one of `LORA_TARGET_MODULES`, in that order, without repeats."""
    if isinstance(target_modules, str) or not isinstance(target_modules, (list, tuple, set, frozenset)):
        raise TypeError(
            f"target_modules must be a list or tuple of names among {', '.join(LORA_TARGET_MODULES)}, "
            f"got {target_modules!r}"
        )
    names = set(target_modules)
    unknown = sorted(str(name) for name in names - set(LORA_TARGET_MODULES))
    if unknown:
        raise ValueError(
            f"target_modules may only name the backbone's linear layers ({', '.join(LORA_TARGET_MODULES)}); "
            f"got {', '.join(unknown)}"
        )
    if not names:
        raise ValueError("target_modules is empty: name at least one of " + ", ".join(LORA_TARGET_MODULES))
    return tuple(name for name in LORA_TARGET_MODULES if name in names)


def _check_path(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    return os.fspath(path)


# =============================================================================================
# Creation
# =============================================================================================


def lora_target_pattern(target_modules=LORA_TARGET_MODULES) -> str:
    r"""The regular expression peft matches (in full) against module names to place LoRA layers.

    For the default targets it reads
    ``model\.layers\.\d+\.(?:self_attn\.(?:q_proj|k_proj|v_proj|o_proj)|mlp\.(?:gate_proj|up_proj|down_proj))``:
    only the decoder layers of the backbone. The head (``action.*``) and the abduction network never match.
    """
    names = _check_targets(target_modules)
    attention = [name for name in names if name in _ATTENTION_PROJECTIONS]
    mlp = [name for name in names if name in _MLP_PROJECTIONS]
    owners = []
    if attention:
        owners.append(r"self_attn\.(?:" + "|".join(attention) + ")")
    if mlp:
        owners.append(r"mlp\.(?:" + "|".join(mlp) + ")")
    return r"model\.layers\.\d+\.(?:" + "|".join(owners) + ")"


def _share_config(model) -> None:
    """Point every `DecisionHead` in ``model`` (the trained copy and the base copy) back at ``model.config``:
    peft's deep copy gave the trained copy a config of its own (see the module docstring)."""
    for module in model.modules():
        if isinstance(module, DecisionHead):
            module.config = model.config


def _wrap(model, config: LoraConfig) -> PeftModel:
    """`get_peft_model` with the config shared again, and peft's one transformers-deprecation warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(model, config, adapter_name=_ADAPTER_NAME)
    _share_config(model)
    config.base_model_name_or_path = portable_base(config.base_model_name_or_path)  # peft_config[_ADAPTER_NAME]
    return peft_model


def add_lora(
    model, rank: int = 8, alpha: float = 16, dropout: float = 0.0, target_modules=LORA_TARGET_MODULES
) -> PeftModel:
    r"""Wrap ``model`` in LoRA adapters of rank $r$ on the backbone and train the causal preset beside them.

    Args:
        model: a `CausalQwenForCausalLM` without adapters. It is modified in place (peft swaps its targeted
            linear layers for LoRA layers and wraps the causal modules) and becomes the `PeftModel`'s base.
        rank: $r$, a positive int.
        alpha: $\alpha > 0$; the update is scaled by $\alpha / r$.
        dropout: the dropout probability on the LoRA input $x$ (training mode only), in $[0, 1)$.
        target_modules: which of `LORA_TARGET_MODULES` get adapters, in every decoder layer.

    Returns:
        The `PeftModel`. Trainable: $A$, $B$ of every target and every parameter of `CAUSAL_MODULES` (their
        trained copies); everything else frozen. At creation its outputs equal ``model``'s bit for bit ($B = 0$).
        ``with peft_model.disable_adapter():`` (or `base_reference`) gives the base model's pass.
    """
    _check_model(model)
    return _wrap(model, _lora_config(rank, alpha, dropout, target_modules))


def _lora_config(rank, alpha, dropout, target_modules, *, source: str | None = None) -> LoraConfig:
    """The one `LoraConfig` causalqwen makes, after the one set of checks on its settings.

    `add_lora` passes its arguments; `load_lora` passes the fields of a saved ``adapter_config.json`` (``source``,
    the file: ``target_modules`` is then the pattern `lora_target_pattern` wrote), so a saved adapter loads only
    with settings that `add_lora` accepts (a NaN or negative ``lora_alpha`` is refused), and an error names
    the file and its field instead of the argument.
    """

    def name(argument: str, field: str) -> str:
        return f"{source!r}: field {field}" if source else argument

    rank = check_positive_integral(name("rank", "r"), rank)
    alpha = check_finite_real(name("alpha", "lora_alpha"), alpha)
    if alpha <= 0:
        raise ValueError(f"{name('alpha', 'lora_alpha')} must be > 0, got {alpha!r}")
    dropout = check_finite_real(name("dropout", "lora_dropout"), dropout)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{name('dropout', 'lora_dropout')} must lie in [0, 1), got {dropout!r}")
    if source is not None:
        target_modules = _targets_of_pattern(target_modules, name("target_modules", "target_modules"))
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        bias="none",
        target_modules=lora_target_pattern(target_modules),
        modules_to_save=list(CAUSAL_MODULES),
    )


def _targets_of_pattern(pattern, what: str) -> tuple[str, ...]:
    """The target names whose `lora_target_pattern` is ``pattern``; ``ValueError`` naming ``what`` if none."""
    names = LORA_TARGET_MODULES
    subsets = (tuple(n for i, n in enumerate(names) if mask >> i & 1) for mask in range(1, 2 ** len(names)))
    for subset in subsets:
        if lora_target_pattern(subset) == pattern:
            return subset
    raise ValueError(
        f"{what} must be a pattern that add_lora writes (lora_target_pattern of some of "
        f"{', '.join(names)}), got {pattern!r}"
    )


def trainable_parameter_count(model: torch.nn.Module) -> int:
    """The number of scalars with ``requires_grad`` in ``model`` (a shared parameter counted once)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


@contextlib.contextmanager
def base_reference(peft_model: PeftModel) -> Iterator[PeftModel]:
    """The base model inside ``peft_model``: `causalqwen.divergence.adapters_disabled` (peft's ``disable_adapter``,
    every parameter's ``requires_grad`` restored on exit), after checking that it is a LoRA model of CausalQwen."""
    _check_peft_model(peft_model)
    with adapters_disabled(peft_model):
        yield peft_model


# =============================================================================================
# Saving and loading
# =============================================================================================


def save_lora(peft_model: PeftModel, path) -> str:
    """Write the adapter to the directory ``path``: ``adapter_config.json``, ``adapter_model.safetensors``
    ($A$, $B$ of every target and the trained causal modules) and peft's ``README.md``. Never a pickle, never
    the frozen embedding. Returns ``path`` as a string."""
    _check_peft_model(peft_model)
    path = _check_path(path, "path")
    if os.path.exists(path) and not os.path.isdir(path):
        raise OSError(f"adapter directory {path!r} exists but is not a directory")
    check_write_targets(path, _ADAPTER_FILES)  # peft follows links: a planted one is refused, by name, first
    config = peft_model.peft_config[peft_model.active_adapter]
    config.base_model_name_or_path = portable_base(config.base_model_name_or_path)
    peft_model.save_pretrained(path, safe_serialization=True, save_embedding_layers=False)
    return path


def _read_adapter_config(path: str) -> LoraConfig:
    """The `LoraConfig` of the adapter directory ``path`` (already known to hold ``adapter_config.json``), which
    must be exactly what `add_lora` makes (`_lora_config`) for its ``r``, ``lora_alpha``, ``lora_dropout`` and
    ``target_modules``, checked as `add_lora` checks them. Fields that record where the adapter came from
    (`_ADAPTER_BOOKKEEPING`) may differ. ``init_lora_weights`` must be a plain ``true`` or ``false``: the
    adapter's tensors are loaded over whatever the initialisation gives, so it does not matter, but an
    initialisation that reads data or decomposes the base weights (``"pissa"``, ``"corda"``, ``"olora"``,
    ``"loftq"``, ``"eva"``, ...) would run inside peft before the load, and fail there without naming the file.
    Every refusal is a ``ValueError`` or ``TypeError`` naming the file and the field, raised before peft
    reads the file."""
    file = os.path.join(path, ADAPTER_CONFIG)
    raw = read_adapter_config(file)
    init = raw.get("init_lora_weights", True)
    if not isinstance(init, bool):
        raise ValueError(
            f"{file!r}: field init_lora_weights must be true or false, got {init!r}; a loaded adapter's tensors "
            "replace its initialisation, and one that reads data or decomposes the base weights is not run"
        )
    if raw.get("peft_type") != "LORA":
        raise ValueError(f"the adapter in {path!r} is a {raw.get('peft_type')} adapter, not LoRA")
    for field in ("r", "lora_alpha", "lora_dropout", "target_modules"):
        if field not in raw:
            raise ValueError(f"{file!r}: field {field} is missing")
    expected = _lora_config(raw["r"], raw["lora_alpha"], raw["lora_dropout"], raw["target_modules"], source=file)
    try:
        config = PeftConfig.from_pretrained(path)
    except (ValueError, TypeError, KeyError) as error:
        raise OSError(f"{file!r} is not a valid peft adapter config: {error}") from error
    if not isinstance(config, LoraConfig):
        raise ValueError(f"the adapter in {path!r} is a {config.peft_type} adapter, not LoRA")
    if sorted(config.modules_to_save or []) != sorted(CAUSAL_MODULES):
        raise ValueError(
            f"the adapter in {path!r} saves the modules {config.modules_to_save!r}, not the causal preset "
            f"{list(CAUSAL_MODULES)!r}: it was not written by add_lora / save_lora"
        )
    differences = [
        f"field {field.name} is {getattr(config, field.name)!r}, add_lora makes {getattr(expected, field.name)!r}"
        for field in dataclasses.fields(LoraConfig)
        if field.name not in _ADAPTER_BOOKKEEPING + ("init_lora_weights", "modules_to_save")
        and getattr(config, field.name) != getattr(expected, field.name)
    ]
    if differences:
        raise ValueError(f"{file!r} is not an adapter that add_lora makes: " + "; ".join(differences))
    return config


def _expected_adapter_tensors(model, config: LoraConfig) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` (on the meta device: shape and dtype, no values) of the adapter file that ``config``
    gives ``model``, from a copy built on the meta device in ``model``'s dtype (nothing allocated, ``model``
    untouched), so each dtype is the one the loaded tensor takes (peft keeps LoRA matrices in float32 on a
    half-precision base). ``ValueError`` if a LoRA layer would land outside the backbone's decoder layers."""
    with torch.device("meta"):
        shadow = type(model)(model.config).to(model.dtype)
    shadow_peft = _wrap(shadow, copy.deepcopy(config))
    adapted = [name for name, module in shadow.named_modules() if isinstance(module, BaseTunerLayer)]
    outside = [name for name in adapted if not re.fullmatch(r"model\.layers\.\d+\..+", name)]
    if outside:
        raise ValueError(f"the adapter config places LoRA layers outside model.layers: {', '.join(outside)}")
    return get_peft_model_state_dict(shadow_peft)


def _checked_adapter_state(model, config: LoraConfig, weights: str) -> dict[str, torch.Tensor]:
    """The tensors of ``weights``, after checking that they are exactly what ``config`` gives ``model`` (names,
    shapes) and `causalqwen.files.checkpoint.value_problem` for each (floating point, finite in the dtype it is loaded
    into: a float64 1e300 is refused, not turned into inf); ``ValueError`` naming the file and every problem."""
    stored = header_shapes([weights])  # OSError for a truncated or corrupt file
    expected = _expected_adapter_tensors(model, config)
    problems = shape_problems({name: tuple(tensor.shape) for name, tensor in expected.items()}, stored)
    problems += [
        f"{name} is stored as {dtype}, not floating point"
        for name, (_, dtype, _) in stored.items()
        if not dtype.startswith(("F", "BF"))
    ]
    state = {}
    if not problems:
        state = load_file(weights)
        problems = [
            problem
            for name, tensor in state.items()
            if (problem := value_problem(name, tensor, expected[name].dtype)) is not None
        ]
    if problems:
        raise ValueError(f"the adapter {weights!r} does not fit this model: " + "; ".join(problems))
    return state


@torch.no_grad()
def restore_lora(peft_model: PeftModel, path) -> None:
    """Load the adapter tensors saved in ``path`` (`save_lora`) into ``peft_model`` in place (a training run's
    resume): the same checks as `load_lora`, against ``peft_model``'s own adapter config."""
    _check_peft_model(peft_model)
    weights = os.path.join(_check_path(path, "path"), ADAPTER_WEIGHTS)
    if not os.path.isfile(weights):
        raise OSError(f"{path!r} holds no {ADAPTER_WEIGHTS}")
    state = _checked_adapter_state(peft_model.get_base_model(), peft_model.peft_config[_ADAPTER_NAME], weights)
    result = set_peft_model_state_dict(peft_model, state, adapter_name=_ADAPTER_NAME)
    if result.unexpected_keys:
        raise ValueError(f"peft did not place these adapter tensors: {', '.join(result.unexpected_keys)}")


def load_lora(model, path, *, trainable: bool = False) -> PeftModel:
    """Put the adapter saved in the directory ``path`` (`save_lora`) onto ``model``, a fresh
    `CausalQwenForCausalLM` of the same base the adapter was trained on.

    Every tensor of ``adapter_model.safetensors`` is checked before ``model`` is touched: the names and shapes
    must be exactly those the adapter's config gives this model (``ValueError`` otherwise: another base, other
    sizes), floating point and finite. The tensors are read with `safetensors`; nothing is unpickled.

    Args:
        model: the base, modified in place as by `add_lora`. Its own numerical embedding, abduction and head
            stay as the base copies (`base_reference`); the saved trained copies are loaded beside them.
        path: the adapter directory.
        trainable: ``False`` (peft's default): every parameter frozen, for inference. ``True``: the LoRA
            matrices and the causal modules trainable, as after `add_lora`.

    Returns:
        The `PeftModel` (in eval mode unless ``trainable``).
    """
    _check_model(model)
    path = _check_path(path, "path")
    if not isinstance(trainable, bool):
        raise TypeError(f"trainable must be True or False, got {trainable!r}")
    if not os.path.exists(path):
        raise OSError(f"adapter directory {path!r} does not exist")
    if not os.path.isdir(path):
        raise OSError(f"adapter directory {path!r} exists but is not a directory")
    weights = os.path.join(path, ADAPTER_WEIGHTS)
    if not os.path.isfile(os.path.join(path, ADAPTER_CONFIG)):
        raise OSError(f"{path!r} holds no LoRA adapter: {ADAPTER_CONFIG} is missing")
    if not os.path.isfile(weights):
        pickled = [name for name in _PICKLED_ADAPTERS if os.path.exists(os.path.join(path, name))]
        hint = f"; it holds {', '.join(pickled)} (pickle), which causalqwen never loads" if pickled else ""
        raise OSError(f"{path!r} holds no {ADAPTER_WEIGHTS}{hint}")

    config = _read_adapter_config(path)
    config.inference_mode = not trainable
    state = _checked_adapter_state(model, config, weights)
    peft_model = _wrap(model, config)
    result = set_peft_model_state_dict(peft_model, state, adapter_name=_ADAPTER_NAME)
    if result.unexpected_keys:  # cannot happen after the checks above; kept as a guard against peft changes
        raise ValueError(f"peft did not place these adapter tensors: {', '.join(result.unexpected_keys)}")
    if not trainable:
        peft_model.eval()
    return peft_model


# =============================================================================================
# Merging
# =============================================================================================


def merge_lora(peft_model: PeftModel) -> torch.nn.Module:
    r"""Fold the adapters into the weights and return the plain `CausalQwenForCausalLM`.

    Every LoRA layer becomes an ``nn.Linear`` with $W + \frac{\alpha}{r} B A$ (peft's ``merge_and_unload``
    with ``safe_merge``: a non-finite merged weight is an error), and every causal module becomes its trained
    copy. The result computes what the `PeftModel` computed (up to float rounding of the merged product) and
    saves with ``save_pretrained`` as an ordinary CausalQwen checkpoint. ``peft_model`` is consumed: use only
    the returned model afterwards.
    """
    _check_peft_model(peft_model)
    merged = peft_model.merge_and_unload(progressbar=False, safe_merge=True)
    if not is_causal_lm(merged):
        raise TypeError(f"merging gave a {type(merged).__name__}, not a CausalQwenForCausalLM")
    _share_config(merged)
    return merged
