"""Strict loading of a saved CausalQwen or a Qwen2 base: all of it, or an ``OSError`` that names what is wrong.

transformers only *warns* when a checkpoint lacks some of the model's tensors and initialises them at
random, which hands back a half-loaded model. `strict_from_pretrained` wraps
``PreTrainedModel.from_pretrained`` with the checks of `causalqwen.files.checkpoint`, before any model is
built and after it is loaded; `check_qwen_base` does the same for the base that ``from_qwen`` reads.
A checkpoint written before the model was split into `CausalQwenModel` and its head (keys
``numerical_embedding.*``, ``abduction.*``, ``ovr_threshold``) still loads: its keys are renamed
(`causalqwen.files.earlier_versions.LEGACY_KEYS`) on the way in.
"""

from __future__ import annotations

import json
import os
import re

from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from transformers import AutoTokenizer, Qwen2ForCausalLM

from ..checks.tokenizer_door import check_num_token
from .checkpoint import (
    check_local_source,
    check_sizes_against_headers,
    expected_state_shapes,
    header_shapes,
    shape_problems,
    state_problems,
    weight_files,
)
from .earlier_versions import LEGACY_KEYS, cache_keyword

__all__ = [
    "strict_from_pretrained",
    "check_qwen_base",
    "num_token_id_from_tokenizer",
    "VOCABULARY_FILES",
    "check_tokenizer_directory",
    "load_config",
    "check_generation_mode",
    "saved_generation_mode",
]

# transformers' name of the KV cache argument and output field (`causalqwen.files.earlier_versions.cache_keyword`)
CACHE_NAME = cache_keyword()


def _renamed(shapes: dict) -> tuple[dict, dict | None]:
    """``shapes`` under the current key names, and the key mapping transformers must apply (None: no legacy key)."""
    used = {
        pattern: target for pattern, target in LEGACY_KEYS.items() if any(re.search(pattern, key) for key in shapes)
    }
    if not used:
        return shapes, None
    renamed = {}
    for key, value in shapes.items():
        for pattern, target in used.items():
            key = re.sub(pattern, target, key)
        renamed[key] = value
    return renamed, used


def _for_class(cls, shapes: dict) -> dict:
    """The checkpoint's tensors as ``cls`` sees them: the base model of a causal-LM checkpoint keeps its own keys."""
    prefix = cls.base_model_prefix + "."
    if getattr(cls, "is_base_model", False) and any(key.startswith(prefix) for key in shapes):
        return {key[len(prefix) :]: value for key, value in shapes.items() if key.startswith(prefix)}
    return shapes


def load_config(config_class, path, subfolder: str = ""):
    """The config of a local checkpoint, validated; a bad field is a ``ValueError`` naming ``config.json``."""
    file = os.path.join(path, subfolder or "", "config.json")
    try:
        return config_class.from_pretrained(path, subfolder=subfolder or "")
    except (ValueError, TypeError, StrictDataclassError) as error:
        message = " ".join(str(error).split())
        raise ValueError(message if message.startswith(file) else f"{file}: {message}") from error


def check_generation_mode(mode, file: str | None = None) -> None:
    """A ``ValueError`` naming the field (and ``file``, when given) unless ``mode`` (a generation config's
    CausalQwen ``mode``) is None or one of `causalqwen.inference.MODES`."""
    from ..inference import MODES

    if mode is not None and (not isinstance(mode, str) or mode not in MODES):
        raise ValueError(
            f"{file + ': ' if file else ''}generation_config field mode must be one of "
            f"{', '.join(MODES)} (or null), got {mode!r}"
        )


def saved_generation_mode(path, subfolder: str = ""):
    """The CausalQwen ``mode`` stored in the ``generation_config.json`` of a local checkpoint directory (None when
    there is no such file or key), checked: an invalid one is a ``ValueError`` naming the file and the field.

    transformers drops the key on load when the file also says ``"_from_model_config": true`` (what
    ``save_pretrained`` wrote before causalqwen saved it as false), so `strict_from_pretrained` restores it."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    file = os.path.join(os.path.expanduser(os.fspath(path)), subfolder or "", "generation_config.json")
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):  # unreadable: named by check_local_source or transformers' loader
        return None
    if not isinstance(saved, dict):
        return None
    check_generation_mode(saved.get("mode"), os.path.join(os.fspath(path), subfolder or "", "generation_config.json"))
    return saved.get("mode")


def _refusal(where: str, name: str, problems: list[str]) -> str:
    return (
        f"the checkpoint {where!r} does not hold a complete, valid {name}; refusing to return a partly loaded "
        "model: " + "; ".join(problems)
    )


def _loaded_problems(cls, info: dict, allow_mismatch: bool) -> list[str]:
    problems = []
    unexpected = info["unexpected_keys"]
    if getattr(cls, "is_base_model", False):  # the head's tensors of a causal-LM checkpoint are not the base's
        unexpected = [key for key in unexpected if key.startswith(cls.base_model_prefix + ".")]
    if info["missing_keys"]:
        problems.append(f"missing from the checkpoint: {', '.join(sorted(info['missing_keys']))}")
    if unexpected:
        problems.append(f"in the checkpoint but not in the model: {', '.join(sorted(unexpected))}")
    if info["mismatched_keys"] and not allow_mismatch:
        problems.extend(
            f"{key} has shape {tuple(saved)} in the checkpoint but {tuple(expected)} in the model"
            for key, saved, expected in sorted(info["mismatched_keys"])
        )
    return problems + list(info["error_msgs"])


def strict_from_pretrained(cls, load, path, model_args, kwargs):
    """``load(path, *model_args, **kwargs)`` (the transformers loader of ``cls``) with the checks of this module.

    For a local directory, before any model is built: safetensors only (a pickled ``pytorch_model.bin``
    is never loaded), every file readable, ``config.json`` validated field by field and its sizes
    compared with the tensors' headers, and every tensor of the model present with its shape and no
    other (unless ``ignore_mismatched_sizes=True``, transformers' explicit request to re-initialise
    mismatched ones). After loading: no missing or unexpected key, no integer tensor for a
    floating-point parameter, nothing NaN or ±inf. ``output_loading_info=True`` still returns
    ``(model, info)``. A model loaded from a local directory has that directory's absolute path as its
    ``name_or_path`` (a LoRA adapter's record of its base: `causalqwen.integrations.lora_base`).
    """
    if isinstance(path, (str, os.PathLike)):
        check_local_source(path, "model")
    want_info = kwargs.pop("output_loading_info", False)
    allow_mismatch = kwargs.pop("ignore_mismatched_sizes", False)
    if kwargs.pop("use_safetensors", True) is False:
        raise ValueError("use_safetensors=False would unpickle pytorch_model.bin; causalqwen loads safetensors only")
    where = str(path)
    mode = saved_generation_mode(path, kwargs.get("subfolder", ""))
    files = weight_files(path, kwargs.get("subfolder", ""))
    shapes, key_mapping = _renamed(header_shapes(files)) if files else ({}, None)
    if files and not allow_mismatch:
        config = kwargs.get("config")
        if not isinstance(config, cls.config_class):
            config = load_config(cls.config_class, path, kwargs.get("subfolder", ""))
        check_sizes_against_headers(config, shapes, "model." if any(k.startswith("model.") for k in shapes) else "")
        problems = shape_problems(expected_state_shapes(cls, config), _for_class(cls, shapes))
        if problems:
            raise OSError(_refusal(where, cls.__name__, problems))
    if key_mapping:
        kwargs.setdefault("key_mapping", key_mapping)
    try:
        # mismatches are reported in the loading info (and raised below) rather than as transformers' generic error
        model, info = load(
            path, *model_args, output_loading_info=True, ignore_mismatched_sizes=True, use_safetensors=True, **kwargs
        )
    except SafetensorError as error:  # a remote or cached file: the local files were checked above
        raise OSError(
            f"the safetensors checkpoint {where!r} cannot be read: {error} (truncated or corrupt file)"
        ) from error
    problems = _loaded_problems(cls, info, allow_mismatch) + state_problems(_for_class(cls, shapes), model)
    if problems:
        raise OSError(_refusal(where, cls.__name__, problems))
    generation = getattr(model, "generation_config", None)
    if mode is not None and generation is not None and "generation_config" not in kwargs:
        generation.mode = mode  # a file with "_from_model_config": true loses the key in transformers' loader
    if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
        # A local directory is remembered by its absolute path, found from any working directory: what peft
        # records as a LoRA adapter's base (get_peft_model reads model.name_or_path), not "model" as typed.
        model.name_or_path = model.config.name_or_path = os.path.realpath(path)
    return (model, info) if want_info else model


def check_qwen_base(path, base_config) -> None:
    """The checks of `strict_from_pretrained` for a Qwen2 base directory (a tied lm_head may be absent)."""
    files = weight_files(path)
    if not files:  # a hub id: transformers fetches it, then from_qwen checks the instance's type
        return
    check_sizes_against_headers(base_config, shapes := header_shapes(files))
    tied = ("lm_head.weight",) if base_config.tie_word_embeddings else ()
    problems = shape_problems(expected_state_shapes(Qwen2ForCausalLM, base_config), shapes, tied)
    if problems:
        raise OSError(_refusal(str(path), "Qwen2ForCausalLM", problems))


# The files that hold a vocabulary; one of them makes a directory a tokenizer's. Without any, transformers builds
# an empty tokenizer from the config alone (its one token <|endoftext|>), whose length would pass for a vocabulary.
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")


def check_tokenizer_directory(path, reads: str = "causalqwen reads it from the model's directory") -> None:
    """A ``ValueError`` when ``path`` is a directory without any of `VOCABULARY_FILES` (a hub id is left to the hub);
    ``reads`` says why a tokenizer is needed there."""
    path = os.fspath(path)
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, name)) for name in VOCABULARY_FILES):
        raise ValueError(
            f"cannot load a tokenizer from {path!r}: the directory holds no tokenizer file "
            f"({', '.join(VOCABULARY_FILES[:-1])} or {VOCABULARY_FILES[-1]}); {reads}"
        )


def num_token_id_from_tokenizer(path) -> int:
    """The ``<NUM>`` id of the tokenizer saved at ``path``: its own if it has one, else ``len(tokenizer)`` (D2). A
    ``<NUM>`` that `NumericTokenizer` would refuse (an ordinary vocabulary entry, the end of text, ...) is a
    ``ValueError`` naming the directory, by the same check (`causalqwen.checks.tokenizer_door.check_num_token`)."""
    check_tokenizer_directory(
        path,
        "from_qwen reads the <NUM> id from the base's tokenizer: save the tokenizer beside the weights, or give "
        "num_token_id",
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    check_num_token(tokenizer, "<NUM>", where=os.fspath(path))
    vocab = tokenizer.get_vocab()
    return vocab["<NUM>"] if "<NUM>" in vocab else len(tokenizer)
