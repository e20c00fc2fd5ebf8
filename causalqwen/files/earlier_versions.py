"""What keeps files written by earlier versions of causalqwen loading: the one place that knows them.

Every mapping from an earlier version's name to today's lives in this module, as a short table:

- `OLD_PATHS`: module paths that no longer exist (``causalqwen.pipelines``, ``causalqwen.cli``, ...). A saved
  directory's ``causalqwen_auto.py`` or a script may import them, or run them with ``python -m``; each imports as
  an alias module holding the new module's names (the same objects, so ``isinstance`` and ``is`` hold), with a
  ``DeprecationWarning`` naming the new path.
- `MOVED_NAMES`: names that left a module which still exists (``causalqwen.tokenization.NumericTokenizer``, which
  directories saved before the tokenizer class moved to `causalqwen.integrations.tokenizer` import). The module
  itself does not re-export them: reading one of them through the old module resolves it here, with the warning.
- `LEGACY_KEYS`: weight names of checkpoints written before the model was split into `CausalQwenModel` and its
  head, renamed on the way in (`causalqwen.files.loading`).
- a config saved while the drafts' scale and threshold were the class defaults leaves those fields out: each one
  missing means its `causalqwen.initialization.DRAFT_INIT` value (`causalqwen.CausalQwenConfig.from_dict`, where
  the config is read, since the config must not depend on the files layer);
- `cache_keyword`: transformers 5.24 renamed the KV cache argument and output field from ``past_key_values`` to
  ``cache``; the model passes and returns it under the installed name.

Directories saved from now on import only from the top-level ``causalqwen`` namespace
(`causalqwen.integrations.auto`), so a later move of a module cannot break them. This module imports only the
standard library: ``import causalqwen`` installs its import hook (`install`), which answers for the names above
and for nothing else.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

# old module -> new module (both absolute); where the old module was split, its other parts are in `SPLIT_PARTS`
OLD_PATHS = {
    "causalqwen.fused": "causalqwen.kernels.fused",
    "causalqwen.compiled": "causalqwen.kernels.tiles",
    "causalqwen.kernels.compiled": "causalqwen.kernels.tiles",
    "causalqwen.checkpoint": "causalqwen.files.checkpoint",
    "causalqwen.loading": "causalqwen.files.loading",
    "causalqwen.rundir": "causalqwen.files.rundir",
    "causalqwen.data": "causalqwen.files.data",
    "causalqwen.auto": "causalqwen.integrations.auto",
    "causalqwen.hf_generation": "causalqwen.integrations.generation_mixin",
    "causalqwen.pipelines": "causalqwen.integrations.pipelines",
    "causalqwen.lora": "causalqwen.integrations.lora",
    "causalqwen.doors": "causalqwen.checks.doors",
    "causalqwen.cli": "causalqwen.app.cli",
    "causalqwen.demo": "causalqwen.app.demo",
    "causalqwen.tiny": "causalqwen.app.tiny",
    "causalqwen.head": "causalqwen.decision",
    "causalqwen.integrations.lm_eval_adapter": "causalqwen.app.lm_eval_adapter",
    "causalqwen.files.runs": "causalqwen.app.runs",
    "causalqwen.integrations.numeric_encoding": "causalqwen.integrations.tokenizer",
}

# the other homes of an old module's names (the first home is `OLD_PATHS`'s; a name found in both is its)
SPLIT_PARTS = {"causalqwen.cli": ("causalqwen.app.commands",)}

# module that still exists -> {name that left it: its module now}
MOVED_NAMES = {
    "causalqwen.training": {
        "train": "causalqwen.app.training_run",
        "check_training_inputs": "causalqwen.app.training_run",
    },
    "causalqwen.integrations.lora_base": {"load_base": "causalqwen.app.commands"},
    "causalqwen.divergence": {"DivergenceBoundTrainer": "causalqwen.integrations.bounded_trainer"},
    "causalqwen.abduction": {
        "load_abduction": "causalqwen.files.abduction_weights",
        "save_abduction": "causalqwen.files.abduction_weights",
    },
    "causalqwen.tokenization": {
        "NumericTokenizer": "causalqwen.integrations.tokenizer",
        "NumericEncoding": "causalqwen.integrations.tokenizer",
    },
}

# checkpoint key (regex) -> key of the split model, for checkpoints written by causalqwen 0.1.0 before the split
LEGACY_KEYS = {
    r"^numerical_embedding\.": "model.numerical_embedding.",
    r"^abduction\.": "model.abduction.",
    r"^ovr_threshold$": "action.ovr_threshold",
}


@functools.cache
def cache_keyword() -> str:
    """The installed transformers' name of the KV cache argument and output field: ``cache`` or ``past_key_values``."""
    import inspect

    from transformers import Qwen2Model

    return "cache" if "cache" in inspect.signature(Qwen2Model.forward).parameters else "past_key_values"


def warn_moved(old_name: str, new_name: str) -> None:
    """The ``DeprecationWarning`` of an old import site, naming the new one."""
    warnings.warn(
        f"{old_name} moved to {new_name}; import it from there, or from the top-level causalqwen "
        f"(the old path is an alias and will be removed)",
        DeprecationWarning,
        stacklevel=3,
    )


class OldPathLoader(importlib.abc.InspectLoader):
    """Builds the alias module of one old path: the names of its new module(s), copied. ``python -m`` on an old
    path runs the new module's code (`get_code`), as ``python -m`` on the new path would."""

    def create_module(self, spec):
        return None  # the default: a fresh module object named after the old path

    def exec_module(self, module: types.ModuleType) -> None:
        old_name = module.__name__
        warn_moved(old_name, OLD_PATHS[old_name])
        names, public = {}, []
        for new_name in reversed((OLD_PATHS[old_name], *SPLIT_PARTS.get(old_name, ()))):  # the first home wins
            new_module = importlib.import_module(new_name)
            names |= {
                key: value
                for key, value in vars(new_module).items()
                if not (key.startswith("__") and key.endswith("__"))
            }
            public += getattr(new_module, "__all__", [key for key in vars(new_module) if not key.startswith("_")])
        module.__dict__.update(names)
        module.__doc__ = f"Alias of `{OLD_PATHS[old_name]}` (deprecated path)."
        module.__all__ = sorted(set(public))

    def get_code(self, fullname: str):
        """For ``python -m`` on an old path (runpy asks for the code): run the new module as ``__main__``."""
        warn_moved(fullname, OLD_PATHS[fullname])
        return compile(self.get_source(fullname), f"<alias of {OLD_PATHS[fullname]}>", "exec")

    def get_source(self, fullname: str) -> str:
        return f"import runpy\nrunpy.run_module({OLD_PATHS[fullname]!r}, run_name='__main__', alter_sys=True)\n"

    def is_package(self, fullname: str) -> bool:
        return False


def moved_name_resolver(module_name: str):
    """The module ``__getattr__`` that answers the names `MOVED_NAMES` lists for ``module_name`` (PEP 562)."""
    moved = MOVED_NAMES[module_name]

    def resolve(name: str):
        if name not in moved:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        warn_moved(f"{module_name}.{name}", f"{moved[name]}.{name}")
        return getattr(importlib.import_module(moved[name]), name)

    return resolve


class MovedNamesLoader(importlib.abc.Loader):
    """Loads a module that still exists with its own loader, then lets it answer the names that left it."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        if "__getattr__" not in vars(module):
            module.__getattr__ = moved_name_resolver(module.__name__)


class EarlierVersionsFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `OLD_PATHS` and wraps the modules of `MOVED_NAMES`; nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in OLD_PATHS:
            return importlib.util.spec_from_loader(fullname, OldPathLoader())
        if fullname in MOVED_NAMES:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = MovedNamesLoader(spec.loader)
            return spec
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once (importing causalqwen calls this)."""
    if not any(isinstance(finder, EarlierVersionsFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, EarlierVersionsFinder())
