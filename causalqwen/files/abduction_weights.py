r"""Abduction weights on disk: one trained abduction network (decision D6) in a safetensors file, moved between
models of the same base (docs: fine-tuning.md, abduction.md).

`save_abduction` writes ``model.abduction``'s tensors to ``abduction.safetensors`` with the architecture in the
file's metadata; `load_abduction` reads such a file into another model after checking that architecture, every
tensor's shape and dtype, and its values (`causalqwen.files.checkpoint.value_problem`). The network itself, its
formulas and its initialization are `causalqwen.abduction`.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .checkpoint import value_problem
from .rundir import check_write_targets

__all__ = ["ABDUCTION_FILE", "load_abduction", "save_abduction"]

ABDUCTION_FILE = "abduction.safetensors"


def _architecture(model) -> dict[str, str]:
    """What a saved abduction network must match in the model it is loaded into."""
    config = model.config
    return {
        "abduction_type": config.abduction_type,
        "hidden_size": str(config.hidden_size),
        "causal_size": str(config.causal_size),
        "abduction_mlp_size": str(config.abduction_mlp_size),
        "scale_eps": repr(float(config.scale_eps)),
        "num_hidden_layers": str(config.num_hidden_layers),
        "vocab_size": str(config.vocab_size),
    }


def save_abduction(model, directory: str | os.PathLike) -> str:
    """Write ``model``'s abduction network to ``directory/abduction.safetensors`` (its tensors, and the architecture
    in the file's metadata); return the file's path. ``directory`` is created if needed; an existing file is replaced.

    This is how an abduction network fine-tuned on one domain travels to another model of the same base
    (`load_abduction`).

    Nothing is written through a link: ``directory`` itself, the file, or its temporary name being a symbolic
    link (or a hard-linked file) is an ``OSError`` naming it, before anything is written
    (`causalqwen.files.rundir.check_write_targets`)."""
    directory = os.fspath(directory)
    check_write_targets(directory, (ABDUCTION_FILE, ABDUCTION_FILE + ".tmp"))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, ABDUCTION_FILE)
    tensors = {name: parameter.detach().contiguous().cpu() for name, parameter in model.abduction.named_parameters()}
    metadata = {"format": "pt", "causalqwen_abduction": json.dumps(_architecture(model), sort_keys=True)}
    save_file(tensors, path + ".tmp", metadata=metadata)
    os.replace(path + ".tmp", path)  # replaces the name, never writes into what it named
    return path


@torch.no_grad()
def load_abduction(model, path: str | os.PathLike) -> None:
    """Load an abduction network written by `save_abduction` (a directory or the file itself) into ``model``, in place.

    Refused with ``ValueError`` (naming each difference) unless the file was written from a model with the same
    abduction architecture and base shape (``abduction_type``, sizes, ``scale_eps``, layers, vocabulary); refused with
    ``FileNotFoundError`` when there is no such file. The file is read with ``safetensors`` (nothing is unpickled);
    every tensor must be present with its shape and a floating dtype, and pass
    `causalqwen.files.checkpoint.value_problem` against its parameter's dtype: finite there (a float64 1e300 would
    become inf in a float32 parameter, and is refused naming the file and the tensor).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, ABDUCTION_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no abduction network at {path!r} (save_abduction writes {ABDUCTION_FILE})")
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as error:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path!r} is not a readable safetensors file: {error}") from error
    try:
        saved = json.loads(metadata["causalqwen_abduction"])
    except (KeyError, json.JSONDecodeError) as error:
        raise ValueError(f"{path!r} was not written by save_abduction (no architecture in its metadata)") from error
    expected = _architecture(model)
    differences = [
        f"{key}: file {saved.get(key)!r}, model {value!r}" for key, value in expected.items() if saved.get(key) != value
    ]
    if differences:
        raise ValueError(f"the abduction network in {path!r} does not fit this model: " + "; ".join(differences))
    parameters = dict(model.abduction.named_parameters())
    if set(tensors) != set(parameters):
        raise ValueError(
            f"{path!r} holds tensors {sorted(tensors)}; the model's abduction network has {sorted(parameters)}"
        )
    for name, tensor in tensors.items():
        if tensor.shape != parameters[name].shape or not tensor.is_floating_point():
            raise ValueError(
                f"{path!r}: tensor {name} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}; "
                f"expected {tuple(parameters[name].shape)}, floating point"
            )
        problem = value_problem(name, tensor, parameters[name].dtype)
        if problem is not None:
            raise ValueError(
                f"{path!r}: tensor {problem} (non-finite in the model's "
                f"{str(parameters[name].dtype).replace('torch.', '')})"
            )
    for name, tensor in tensors.items():
        parameters[name].copy_(tensor)
