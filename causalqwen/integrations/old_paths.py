"""Import paths from before the package had sub-packages, kept as aliases that warn.

A directory saved before the move carries a ``causalqwen_auto.py`` that imports
``causalqwen.pipelines``; scripts import ``causalqwen.tiny`` or ``causalqwen.lora``, or run
``python -m causalqwen.cli``. Each old name in `OLD_PATHS` still imports: the module it gives is a thin alias
that holds the names of the new module (or modules, where one was split: ``causalqwen.cli`` became
``causalqwen.app.cli`` and ``causalqwen.app.commands``), the same functions and classes, so ``isinstance``
and ``is`` hold; importing it, or running it with ``python -m``, issues a ``DeprecationWarning`` that names
the new path. The aliases are served by an import hook (`install`) rather than files, so the top level of
``causalqwen/`` lists the design's sections only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# old module -> new module (both absolute); where the old module was split, its parts follow in `SPLIT_PARTS`
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

# the other new homes of an old module's names (the first home is `OLD_PATHS`'s; a name found in both is its)
SPLIT_PARTS = {"causalqwen.cli": ("causalqwen.app.commands",)}


def warn_moved(old_name: str) -> None:
    """The ``DeprecationWarning`` of an old path, naming its new one."""
    warnings.warn(f"{old_name} moved to {OLD_PATHS[old_name]}; import it from there "
                  f"(the old path is an alias and will be removed)", DeprecationWarning, stacklevel=3)


class OldPathLoader(importlib.abc.InspectLoader):
    """Builds the alias module of one old path: the names of its new module(s), copied. ``python -m`` on an old
    path runs the new module's code (`get_code`), as ``python -m`` on the new path would."""

    def create_module(self, spec):
        return None  # the default: a fresh module object named after the old path

    def exec_module(self, module: types.ModuleType) -> None:
        old_name = module.__name__
        warn_moved(old_name)
        names, public = {}, []
        for new_name in reversed((OLD_PATHS[old_name], *SPLIT_PARTS.get(old_name, ()))):  # the first home wins
            new_module = importlib.import_module(new_name)
            names |= {key: value for key, value in vars(new_module).items()
                      if not (key.startswith("__") and key.endswith("__"))}
            public += getattr(new_module, "__all__", [key for key in vars(new_module) if not key.startswith("_")])
        module.__dict__.update(names)
        module.__doc__ = f"Alias of `{OLD_PATHS[old_name]}` (deprecated path)."
        module.__all__ = sorted(set(public))

    def get_code(self, fullname: str):
        """For ``python -m`` on an old path (runpy asks for the code): run the new module as ``__main__``."""
        warn_moved(fullname)
        return compile(self.get_source(fullname), f"<alias of {OLD_PATHS[fullname]}>", "exec")

    def get_source(self, fullname: str) -> str:
        return f"import runpy\nrunpy.run_module({OLD_PATHS[fullname]!r}, run_name='__main__', alter_sys=True)\n"

    def is_package(self, fullname: str) -> bool:
        return False


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
