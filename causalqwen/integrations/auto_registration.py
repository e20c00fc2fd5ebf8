"""CausalQwen in transformers' Auto classes, registered by name: ``import causalqwen`` imports no transformers.

transformers' Auto mappings are lazy tables of names. ``CONFIG_MAPPING_NAMES`` maps a model type to the name of
its config class, ``MODEL_MAPPING_NAMES`` and ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` map it to the names of its model
classes, and a mapping imports a class from the model type's module the first time it is looked up (the mapping
keeps that module in its ``_modules``; a model's lazy mappings also keep the model type of each config class name,
``_reverse_config_mapping``). `add_names` writes ``causal_qwen`` into these tables with the top-level ``causalqwen``
namespace as its module, which imports each class when it is first read (PEP 562). So after ``import causalqwen``,
``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` load a saved directory without ``trust_remote_code``,
and the configuration and the model are imported only when one of them asks for ``causal_qwen``.

Importing transformers' Auto modules costs seconds (torch among them), so ``import causalqwen`` does not: `install`
adds the names at once where those modules are loaded already, and otherwise puts `AutoModulesFinder` on
``sys.meta_path``, which adds them right after transformers loads each module (`WATCHED`). This module imports only
the standard library.

The tokenizer is not registered here: a saved ``tokenizer_config.json`` names its wrapped class
(``Qwen2Tokenizer``), which ``AutoTokenizer`` takes without consent; ``AutoTokenizer`` gives a `NumericTokenizer`
with ``trust_remote_code=True`` (`causalqwen.integrations.auto`), and ``NumericTokenizer.from_pretrained`` always.
"""

from __future__ import annotations

import importlib.abc
import sys
import types

MODEL_TYPE = "causal_qwen"  # `causalqwen.CausalQwenConfig.model_type`
CONFIG_CLASS = "CausalQwenConfig"

# transformers' table of model class names -> the mapping built from it -> the class it names for causal_qwen
MODEL_TABLES = (
    ("MODEL_MAPPING_NAMES", "MODEL_MAPPING", "CausalQwenModel"),
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_CAUSAL_LM_MAPPING", "CausalQwenForCausalLM"),
)

CONFIGURATION_AUTO = "transformers.models.auto.configuration_auto"
MODELING_AUTO = "transformers.models.auto.modeling_auto"
WATCHED = (CONFIGURATION_AUTO, MODELING_AUTO)


def add_names(module: types.ModuleType) -> None:
    """Write ``causal_qwen`` into the Auto tables of ``module`` (one of `WATCHED`, loaded): the class names, and the
    top-level ``causalqwen`` namespace as the module each mapping imports them from."""
    configuration_auto = sys.modules[CONFIGURATION_AUTO]  # modeling_auto imports it first
    module_name = configuration_auto.model_type_to_module_name(MODEL_TYPE)
    causalqwen = sys.modules["causalqwen"]
    configuration_auto.CONFIG_MAPPING_NAMES[MODEL_TYPE] = CONFIG_CLASS
    configuration_auto.CONFIG_MAPPING._modules[module_name] = causalqwen
    if module.__name__ != MODELING_AUTO:
        return
    for names, mapping, class_name in MODEL_TABLES:
        getattr(module, names)[MODEL_TYPE] = class_name
        lazy = getattr(module, mapping)
        lazy._reverse_config_mapping[CONFIG_CLASS] = MODEL_TYPE  # a mapping built before the config name was added
        lazy._modules[module_name] = causalqwen


class AddNamesLoader(importlib.abc.Loader):
    """Loads one of `WATCHED` with its own loader, then adds causalqwen's names to its tables."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        add_names(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self.loader, name)


class AutoModulesFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of `WATCHED` through the other finders and wraps their loaders; nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = AddNamesLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Add the names to the Auto modules already loaded, and put the finder on ``sys.meta_path`` for the others, once
    (importing causalqwen calls this)."""
    for name in WATCHED:
        if name in sys.modules:
            add_names(sys.modules[name])
    if not any(isinstance(finder, AutoModulesFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AutoModulesFinder())
