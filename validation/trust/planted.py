"""What a trust case plants, and what it checks afterwards.

A planted pickle creates a witness file if it is ever unpickled; a planted link points at a file outside
every run directory, whose text must come back unchanged; a file the user wrote must still exist. Each
check runs after the case's call, also after the error the case expects, and replaces whatever was
raised with `WrongResult` when it fails. `replace_tensor` rewrites one tensor of a safetensors file
(its metadata kept); `deadline` tells linear work from quadratic.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time

import torch

from ..cases import WrongResult
from ..fixtures import fresh_dir

__all__ = [
    "plant_pickle",
    "guarded",
    "outside_file",
    "untouched",
    "replace_tensor",
    "deadline",
]

_OUTSIDE_TEXT = "a file outside the run directory\n"


class _Planted:
    """Unpickling this creates the file ``path``: proof that code from the file ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant_pickle(target: str, witness: str) -> None:
    """Write to ``target`` a pickle that, once unpickled, creates the file ``witness``."""
    with open(target, "wb") as handle:
        pickle.dump(_Planted(witness), handle)


@contextlib.contextmanager
def guarded(witness: str | None = None, kept: tuple[str, ...] = ()):
    """Afterwards (also after the expected error): the planted pickle must not have run, and every path in
    ``kept`` must still exist. A violation replaces whatever was raised with `WrongResult`."""
    try:
        yield
    finally:
        if witness is not None and os.path.exists(witness):
            raise WrongResult(f"the planted pickle ran: {witness} was created")
        missing = [path for path in kept if not os.path.exists(path)]
        if missing:
            raise WrongResult(f"deleted although no run wrote it: {', '.join(missing)}")


def outside_file() -> str:
    """A file outside every run directory, which no planted link may change."""
    path = os.path.join(fresh_dir("outside"), "precious.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_OUTSIDE_TEXT)
    return path


@contextlib.contextmanager
def untouched(path: str):
    """Afterwards (also after the expected error): ``path`` (an `outside_file`) still holds what it held."""
    try:
        yield
    finally:
        with open(path, encoding="utf-8") as handle:
            if handle.read() != _OUTSIDE_TEXT:
                raise WrongResult(f"{path} was written through a planted link")


def replace_tensor(file: str, name: str, value: torch.Tensor) -> None:
    """``file`` with its tensor ``name`` replaced by ``value`` (the file's metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(file, framework="pt") as handle:
        metadata = handle.metadata()
    state = load_file(file)
    if name not in state:
        raise WrongResult(f"{file} holds no tensor {name} (holds {sorted(state)[:5]} ...)")
    state[name] = value
    save_file(state, file, metadata=metadata)


def deadline(seconds: float, what: str, action) -> None:
    """Run ``action``; `WrongResult` if it took longer than ``seconds`` (linear work takes a small fraction)."""
    started = time.perf_counter()
    action()
    took = time.perf_counter() - started
    if took > seconds:
        raise WrongResult(f"{what} took {took:.1f} s (deadline {seconds:g} s): not linear in the text's length")
