"""What a saved directory needs so that transformers' Auto classes and ``pipeline`` load CausalQwen from it.

transformers' mechanism for classes that live outside the library: ``config.json`` (``auto_map``,
``custom_pipelines``) and ``tokenizer_config.json`` (``auto_map``) name them as ``module.Class``, and the
module is a file in the directory. causalqwen writes that module, `AUTO_MODULE` ``.py``, as a few import
lines from the installed package, so the directory carries no code of its own. Loading through it needs
``trust_remote_code=True``: transformers' consent to import a module found in a directory.

Where the package is missing, transformers' own message advises ``pip install causalqwen``, which cannot work:
causalqwen is not on the Python package index. The module's docstring says how it is installed: from a
clone of the repository, or from a wheel built there with ``python -m build``.
"""

from __future__ import annotations

import copy
import json
import os

import torch
from transformers import GenerationConfig

from ..files.loading import check_generation_mode
from ..files.rundir import check_write_targets, open_for_writing

AUTO_MODULE = "causalqwen_auto"

AUTO_MODULE_SOURCE = (
    '"""Written by causalqwen\'s save_pretrained: the classes that config.json and tokenizer_config.json name,\n'
    "from the installed causalqwen package.\n"
    "\n"
    "causalqwen is not on the Python package index, so transformers' advice `pip install causalqwen` cannot\n"
    "work: install it from a clone of its repository (`pip install -e .` in the clone), or from a wheel built\n"
    "there with `python -m build --wheel` (`pip install dist/causalqwen-*.whl`).\n"
    '"""\n'
    "from causalqwen import (  # noqa: F401  (the top-level namespace: a later move of a module cannot break this)\n"
    "    CausalQwenConfig,\n"
    "    CausalQwenForCausalLM,\n"
    "    CausalQwenModel,\n"
    "    NumericTextGenerationPipeline,\n"
    "    NumericTokenizer,\n"
    ")\n"
)

MODEL_AUTO_MAP = {
    "AutoConfig": f"{AUTO_MODULE}.CausalQwenConfig",
    "AutoModel": f"{AUTO_MODULE}.CausalQwenModel",
    "AutoModelForCausalLM": f"{AUTO_MODULE}.CausalQwenForCausalLM",
}

# AutoTokenizer reads a pair (slow class, fast class) and takes the fast one when it is given.
TOKENIZER_AUTO_MAP = {"AutoTokenizer": [None, f"{AUTO_MODULE}.NumericTokenizer"]}

CUSTOM_PIPELINES = {
    "text-generation": {
        "impl": f"{AUTO_MODULE}.NumericTextGenerationPipeline",
        "pt": ["AutoModelForCausalLM"],
        "type": "text",
    }
}


# What save_pretrained writes into its directory (shell patterns): checked beforehand for links
# (`causalqwen.files.rundir.check_write_targets`), since transformers opens these files itself and follows links.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    AUTO_MODULE + ".py",
)
TOKENIZER_FILES = (
    "*tokenizer*.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "chat_template.*",
    "additional_chat_templates",
    AUTO_MODULE + ".py",
)

# The config fields a CausalQwen save_pretrained sets for the saved file only (the model in memory keeps its own).
SAVED_ONLY_FIELDS = ("auto_map", "custom_pipelines")


def write_auto_module(directory: str | os.PathLike) -> None:
    """Write `AUTO_MODULE` ``.py`` into ``directory`` (the same text every time), never through a link."""
    with open_for_writing(os.path.join(directory, AUTO_MODULE + ".py")) as handle:
        handle.write(AUTO_MODULE_SOURCE)


def update_json(path: str | os.PathLike, entries: dict) -> None:
    """Add ``entries`` to the JSON object in ``path`` (written by transformers a moment before); the file is
    rewritten in place, never through a link (`causalqwen.files.rundir.open_for_writing`)."""
    with open(path, encoding="utf-8") as handle:
        content = json.load(handle)
    content.update(entries)
    with open_for_writing(path) as handle:
        json.dump(content, handle, indent=2, ensure_ascii=False, sort_keys=True)
        handle.write("\n")


def save_with_auto_classes(model, save, save_directory, *args, **kwargs):
    """``save(save_directory, *args, **kwargs)`` (transformers' ``PreTrainedModel.save_pretrained`` of ``model``) with
    the config naming the classes (`MODEL_AUTO_MAP`, `CUSTOM_PIPELINES`) for the saved file only, `AUTO_MODULE`
    ``.py`` written beside it, no link written through, and a CausalQwen ``generation_config.mode`` kept."""
    model.config.check_loads_back()  # before anything is written: a save never writes what its loader refuses
    check_config_describes_weights(model)
    if kwargs.get("is_main_process", True):
        check_write_targets(save_directory, MODEL_FILES)
    generation = getattr(model, "generation_config", None)
    mode = getattr(generation, "mode", None)
    check_generation_mode(mode)
    saved = {name: model.config.__dict__[name] for name in SAVED_ONLY_FIELDS if name in model.config.__dict__}
    model.config.auto_map = dict(MODEL_AUTO_MAP)
    model.config.custom_pipelines = dict(CUSTOM_PIPELINES)
    if mode is not None:  # transformers' loader drops every key it does not know from a config marked as
        # derived from the model's: the mode would be lost, so a copy marked otherwise is saved
        model.generation_config = GenerationConfig.from_dict({**generation.to_dict(), "_from_model_config": False})
    try:
        result = save(save_directory, *args, **kwargs)
    finally:  # the model in memory keeps its configs as they were
        if mode is not None:
            model.generation_config = generation
        for name in SAVED_ONLY_FIELDS:
            if name in saved:
                setattr(model.config, name, saved[name])
            else:
                delattr(model.config, name)
    if kwargs.get("is_main_process", True):
        write_auto_module(save_directory)
    return result


def check_config_describes_weights(model) -> None:
    """A ``ValueError`` unless ``model.config`` still describes the weights it is saved beside: the numerical
    embedding's periods are the config's, and a model built from the config (on the meta device: shapes, no memory)
    has the same tensors with the same shapes.

    A field that fixes a module (``number_encoding``, ``number_periods``, ``vocab_size``, ``intermediate_size``, ...)
    set on a built model passes the config's own checks but changes no module; the directory saved with it would not
    load, or would load other periods than the weights were learnt for. ``resize_token_embeddings`` changes the
    weights and the config together; peft's layers injected into the model are named as such."""
    config, prefix = model.config, "save_pretrained: the config no longer describes the weights: "
    periods = model.numerical_embedding.periods
    built_with = None if periods is None else list(periods)
    if built_with != config.number_periods:
        raise ValueError(
            f"{prefix}number_encoding is {config.number_encoding!r} and number_periods {config.number_periods}, but "
            f"the numerical embedding was built with periods {built_with} (a field set after the model was built: set "
            "it back, or build a new model from the config)"
        )
    with torch.device("meta"):
        described = type(model)(copy.deepcopy(config)).state_dict()
    weights = model.state_dict()
    for name in sorted(weights.keys() | described.keys()):
        shapes = [tuple(tensors[name].shape) if name in tensors else None for tensors in (weights, described)]
        if shapes[0] != shapes[1]:
            held, wanted = (f"shape {list(shape)}" if shape is not None else "absent" for shape in shapes)
            if "lora_" in name or ".base_layer." in name:  # peft's layers, injected into the model's own modules
                why = "an adapter was injected into the model (save the PeftModel, or merge_and_unload() first)"
            else:
                why = (
                    "a field that fixes a module was set after the model was built (set it back, use "
                    "resize_token_embeddings for vocab_size, or build a new model from the config)"
                )
            raise ValueError(
                f"{prefix}{name} is {held} in the model but {wanted} in a model built from its config: {why}"
            )
