r"""Compiled kernels: a literal function, compiled with ``torch.compile`` where that works, the function itself
otherwise.

The tiled head (`causalqwen.kernels.fused`) spends most of a tile's time outside its two matrix products in about
twenty elementwise passes (``atan``, ``log``, ``log1p``, ``where``, divisions), each a kernel of its own that
reads and writes the whole tile. Compiled by inductor (its C++ backend on CPU, Triton on CUDA), they become
one loop over the tile. The literal function stays the readable specification and the fallback:

* `compiled` (function) returns a callable that runs ``torch.compile(function, dynamic=True)`` and, if
  compiling or running the compiled code fails (no C++ compiler, an unsupported platform), warns once with the
  reason and runs the literal function from then on;
* inside a region that is itself being compiled (``torch.compile`` of a whole training step), the literal
  function is called, so that the outer compilation sees through it;
* under a Python tensor mode (a ``TorchDispatchMode`` or a ``TorchFunctionMode``, other than the one
  ``with torch.device(...)`` installs: tracers, counters, fake tensors), the literal function is called too:
  the mode is there to see the operations, and compiling beneath it is fragile (torch 2.13 can fail to
  recompile under a function mode after compiling under a dispatch mode);
* the environment variable ``CAUSALQWEN_COMPILE=0`` (read at each call) turns compilation off: the literal
  function runs everywhere, for debugging or for a comparison.

The compiled code computes the same formulas with the same operations in the same precision; it may round
differently (fused multiply-adds, vectorised ``atan``/``log``), so it equals the literal code to a few ulp,
not bit for bit (``tests/test_compiled.py`` measures it).
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

__all__ = ["COMPILE_ENV", "compiled", "compile_enabled"]

logger = logging.getLogger(__name__)

COMPILE_ENV = "CAUSALQWEN_COMPILE"


def _tensor_mode_active() -> bool:
    """Whether a Python dispatch mode, or a function mode other than ``torch.device``'s, is active."""
    if _get_current_dispatch_mode_stack():
        return True
    return any(not isinstance(mode, DeviceContext) for mode in _get_current_function_mode_stack())


def compile_enabled() -> bool:
    """False when ``CAUSALQWEN_COMPILE`` is set to ``0``, ``false``, ``no`` or ``off`` (any case)."""
    return os.environ.get(COMPILE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class _Compiled:
    """``function``, compiled on first use; the literal function where compilation is off or has failed."""

    def __init__(self, function: Callable):
        self.function = function
        self.failure: str | None = None  # why compilation failed, once it has
        self._compiled = None
        functools.update_wrapper(self, function)

    def __call__(self, *args, **kwargs):
        if self.failure is not None or not compile_enabled() or torch.compiler.is_compiling() or _tensor_mode_active():
            return self.function(*args, **kwargs)
        if self._compiled is None:
            self._compiled = torch.compile(self.function, dynamic=True)
        try:
            return self._compiled(*args, **kwargs)
        except Exception as error:  # inductor raises many types (no compiler, unsupported op, codegen errors)
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            warnings.warn(
                f"causalqwen: torch.compile of {self.function.__qualname__} failed ({self.failure}); running the "
                f"literal (eager) code from now on. Set {COMPILE_ENV}=0 to skip the attempt.",
                RuntimeWarning,
                stacklevel=2,
            )
            return self.function(*args, **kwargs)


def compiled(function: Callable) -> Callable:
    """``function`` compiled with ``torch.compile(dynamic=True)`` on first use, falling back to ``function`` itself
    (one ``RuntimeWarning`` naming the reason) where that fails; see the module docstring."""
    return _Compiled(function)
