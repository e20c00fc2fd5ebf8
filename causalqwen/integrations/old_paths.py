"""Import paths from before the package had sub-packages, kept as aliases that warn.

A directory saved before the move carries a ``causalqwen_auto.py`` that imports
``causalqwen.pipelines``; scripts import ``causalqwen.tiny`` or ``causalqwen.lora``. Each old name in
`OLD_PATHS` still imports: the module it gives is a thin alias of the new module (the same functions and
classes, so ``isinstance`` and ``is`` hold), and importing it issues a ``DeprecationWarning`` that names the
new path. The aliases are served by an import hook (`install`) rather than files, so the top level of
``causalqwen/`` lists the design's sections only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# old module -> new module (both absolute)
OLD_PATHS = {
    "causalqwen.fused": "causalqwen.kernels.fused",
    "causalqwen.compiled": "causalqwen.kernels.compiled",
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
}


class OldPathLoader(importlib.abc.Loader):
    """Builds the alias module of one old path: the new module's public and private names, copied."""

    def create_module(self, spec):
        return None  # the default: a fresh module object named after the old path

    def exec_module(self, module: types.ModuleType) -> None:
        new_name = OLD_PATHS[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new_name}; import it from there "
                      f"(the old path is an alias and will be removed)", DeprecationWarning, stacklevel=2)
        new_module = importlib.import_module(new_name)
        names = {key: value for key, value in vars(new_module).items()
                 if not (key.startswith("__") and key.endswith("__"))}
        module.__dict__.update(names)
        module.__doc__ = f"Alias of `{new_name}` (deprecated path)."
        module.__all__ = getattr(new_module, "__all__", [key for key in names if not key.startswith("_")])


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `OLD_PATHS`, and nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in OLD_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, OldPathLoader())


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing causalqwen calls this)."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
