"""What keeps files written by earlier versions of causalqwen loading: the one place that knows them.

Nothing here is loaded by ``import causalqwen``, and nothing is put on ``sys.meta_path``: each entry is read when a
file of an earlier version is (decision D26).

- module paths a saved directory's ``causalqwen_auto.py`` imports, which transformers runs with
  ``trust_remote_code=True``. Directories saved before the sub-packages (41679d3 and earlier) import
  ``causalqwen.pipelines``: ``causalqwen/pipelines.py`` is a real module of four statements, which imports the
  pipeline from `causalqwen.integrations.pipelines` and warns. Directories saved from 2065471 until b514a92 import
  ``NumericTokenizer`` from `causalqwen.tokenization`, which it left for the transformers wing: the section's
  ``__getattr__`` answers the names of `MOVED_NAMES` through `moved_name` when one is read. Directories saved from
  b514a92 on import only from the top-level ``causalqwen`` namespace (`causalqwen.integrations.auto`), so a later
  move of a module cannot break them. No other old path is kept: the other module paths of the unpublished 0.1.0
  were never written into a saved file.
- `LEGACY_KEYS`: weight names of checkpoints written before the model was split into `CausalQwenModel` and its
  head, renamed on the way in (`causalqwen.files.loading`).
- a config saved while the drafts' scale and threshold were the class defaults leaves those fields out: each one
  missing means its `causalqwen.initialization.DRAFT_INIT` value (`causalqwen.CausalQwenConfig.from_dict`, where
  the config is read, since the config must not depend on the files layer);
- `cache_keyword`: transformers 5.24 renamed the KV cache argument and output field from ``past_key_values`` to
  ``cache``; the model passes and returns it under the installed name.

This module imports only the standard library.
"""

from __future__ import annotations

import functools
import importlib
import warnings

# module that still exists -> {name that left it: its module now}; the module's ``__getattr__`` asks `moved_name`
MOVED_NAMES = {
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


def warn_moved(old_name: str, new_name: str, stacklevel: int = 3) -> None:
    """The ``DeprecationWarning`` of an old import site, naming the new one."""
    warnings.warn(
        f"{old_name} moved to {new_name}; import it from there, or from the top-level causalqwen "
        f"(the old path is an alias and will be removed)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_name(module_name: str, name: str):
    """``name`` read through ``module_name``, which it left (`MOVED_NAMES`): the object from its module now, with the
    warning naming that module; an ``AttributeError`` for any other name."""
    moved = MOVED_NAMES.get(module_name, {})
    if name not in moved:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    warn_moved(f"{module_name}.{name}", f"{moved[name]}.{name}", stacklevel=4)  # the caller of the module's __getattr__
    return getattr(importlib.import_module(moved[name]), name)
