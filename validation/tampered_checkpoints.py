r"""Part 2 of the robustness suite: tampered checkpoints are refused, never half-loaded.

A tiny model saved with ``save_pretrained`` (`saved_checkpoint`), then its ``model.safetensors``
truncated, its header corrupted, a tensor removed, reshaped, added, stored as integers or set to NaN
(`TAMPERINGS`). ``CausalQwenForCausalLM.from_pretrained`` must raise an ``OSError`` that names the file or
the tensor (`CHECKPOINT_CASES`); it must never hand back a half-loaded model. The control
(`intact_checkpoint_round_trip`): the untouched checkpoint loads, every tensor equal to the saved one.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import struct
from typing import Callable

import torch

from .cases import BadInputCase
from .fixtures import quiet_transformers, scratch_dir, shared_tiny

__all__ = ["TAMPERINGS", "CHECKPOINT_CASES", "saved_checkpoint", "tampered_checkpoint", "intact_checkpoint_round_trip"]


@functools.cache
def saved_checkpoint() -> str:
    """The tiny CausalQwen and its tokenizer, written by ``save_pretrained`` (cached; under the scratch dir)."""
    path = os.path.join(scratch_dir(), "intact")
    with quiet_transformers():
        shared_tiny().model.save_pretrained(path)
        shared_tiny().tokenizer.save_pretrained(path)
    return path


def _read_header(data: bytes) -> tuple[dict, bytes]:
    """Split a safetensors file into its JSON header and the tensor bytes."""
    length = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _write_header(header: dict, body: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(encoded)) + encoded + body


def _rewrite_tensors(edit: Callable[[dict], None]) -> Callable[[str], None]:
    """A tampering that loads the tensors, lets ``edit`` change the dict, and writes a valid file again."""

    def tamper(file: str) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(file)
        edit(tensors)
        save_file(tensors, file, metadata={"format": "pt"})

    return tamper


def _rewrite_bytes(edit: Callable[[bytes], bytes]) -> Callable[[str], None]:
    def tamper(file: str) -> None:
        with open(file, "rb") as handle:
            data = handle.read()
        with open(file, "wb") as handle:
            handle.write(edit(data))

    return tamper


def _halve_b_noise_in_header(data: bytes) -> bytes:
    """Edit only the header: ``action.b_noise`` claims half its shape (and half its bytes)."""
    header, body = _read_header(data)
    entry = header["action.b_noise"]
    start, end = entry["data_offsets"]
    entry["shape"] = [entry["shape"][0] // 2]
    entry["data_offsets"] = [start, start + (end - start) // 2]
    return _write_header(header, body)


def _set_nan(tensors: dict) -> None:
    tensors["model.numerical_embedding.w_num"] = tensors["model.numerical_embedding.w_num"].clone()
    tensors["model.numerical_embedding.w_num"][0] = math.nan


TAMPERINGS: dict[str, tuple[str, Callable[[str], None]]] = {
    "truncated": ("model.safetensors cut to half its bytes", _rewrite_bytes(lambda data: data[: len(data) // 2])),
    "empty": ("model.safetensors of zero bytes", _rewrite_bytes(lambda data: b"")),
    "corrupt-header": (
        "the JSON header overwritten with '#' bytes",
        _rewrite_bytes(lambda data: data[:8] + b"#" * 16 + data[24:]),
    ),
    "header-shape-edited": (
        "the header says action.b_noise has half its shape; the data is unchanged",
        _rewrite_bytes(_halve_b_noise_in_header),
    ),
    "missing-tensor": (
        "action.b_noise removed (a valid file otherwise)",
        _rewrite_tensors(lambda tensors: tensors.pop("action.b_noise")),
    ),
    "reshaped-tensor": (
        "action.b_noise saved with 32 components instead of 64",
        _rewrite_tensors(lambda tensors: tensors.update({"action.b_noise": tensors["action.b_noise"][:32].clone()})),
    ),
    "unexpected-tensor": (
        "an extra tensor action.extra_head.weight",
        _rewrite_tensors(lambda tensors: tensors.update({"action.extra_head.weight": torch.zeros(3)})),
    ),
    "integer-dtype": (
        "action.b_noise stored as int32 (its float bits reinterpreted)",
        _rewrite_tensors(
            lambda tensors: tensors.update({"action.b_noise": tensors["action.b_noise"].view(torch.int32).clone()})
        ),
    ),
    "non-finite-value": ("a NaN in model.numerical_embedding.w_num", _rewrite_tensors(_set_nan)),
}


@functools.cache
def tampered_checkpoint(kind: str) -> str:
    """A copy of the saved checkpoint (model and tokenizer) with ``TAMPERINGS[kind]`` applied to its weights."""
    path = os.path.join(scratch_dir(), kind)
    shutil.copytree(saved_checkpoint(), path)
    TAMPERINGS[kind][1](os.path.join(path, "model.safetensors"))
    return path


def _load(kind: str, auto: bool = False):
    from transformers import AutoModelForCausalLM

    from causalqwen import CausalQwenForCausalLM

    loader = AutoModelForCausalLM if auto else CausalQwenForCausalLM
    with quiet_transformers():
        return loader.from_pretrained(tampered_checkpoint(kind))


_UNREADABLE = r"the safetensors file '.*model\.safetensors' cannot be read: .*\(truncated or corrupt file\)"
_INCOMPLETE = r"does not hold a complete, valid CausalQwenForCausalLM; refusing to return a partly loaded model"

CHECKPOINT_CASES: list[BadInputCase] = [
    BadInputCase(
        "checkpoint-truncated",
        "checkpoint",
        TAMPERINGS["truncated"][0],
        lambda: _load("truncated"),
        OSError,
        _UNREADABLE,
    ),
    BadInputCase(
        "checkpoint-empty-file",
        "checkpoint",
        TAMPERINGS["empty"][0],
        lambda: _load("empty"),
        OSError,
        _UNREADABLE + r"|header too small",
    ),
    BadInputCase(
        "checkpoint-corrupt-header",
        "checkpoint",
        TAMPERINGS["corrupt-header"][0],
        lambda: _load("corrupt-header"),
        OSError,
        r"cannot be read: .*invalid JSON in header",
    ),
    BadInputCase(
        "checkpoint-header-shape-edited",
        "checkpoint",
        TAMPERINGS["header-shape-edited"][0],
        lambda: _load("header-shape-edited"),
        OSError,
        r"cannot be read: .*invalid offset for tensor",
    ),
    BadInputCase(
        "checkpoint-missing-tensor",
        "checkpoint",
        TAMPERINGS["missing-tensor"][0],
        lambda: _load("missing-tensor"),
        OSError,
        _INCOMPLETE + r"[\s\S]*missing from the checkpoint: action\.b_noise",
    ),
    BadInputCase(
        "checkpoint-missing-tensor-auto-model",
        "checkpoint",
        TAMPERINGS["missing-tensor"][0] + ", loaded through AutoModelForCausalLM",
        lambda: _load("missing-tensor", auto=True),
        OSError,
        r"missing from the checkpoint: action\.b_noise",
    ),
    BadInputCase(
        "checkpoint-reshaped-tensor",
        "checkpoint",
        TAMPERINGS["reshaped-tensor"][0],
        lambda: _load("reshaped-tensor"),
        OSError,
        r"action\.b_noise has shape \(32,\) in the checkpoint but \(64,\) in the model",
    ),
    BadInputCase(
        "checkpoint-unexpected-tensor",
        "checkpoint",
        TAMPERINGS["unexpected-tensor"][0],
        lambda: _load("unexpected-tensor"),
        OSError,
        r"in the checkpoint but not in the model: action\.extra_head\.weight",
    ),
    BadInputCase(
        "checkpoint-integer-dtype",
        "checkpoint",
        TAMPERINGS["integer-dtype"][0],
        lambda: _load("integer-dtype"),
        OSError,
        r"action\.b_noise is stored as I32 in '.*model\.safetensors', but the model's tensor is floating-point",
    ),
    BadInputCase(
        "checkpoint-non-finite-value",
        "checkpoint",
        TAMPERINGS["non-finite-value"][0],
        lambda: _load("non-finite-value"),
        OSError,
        r"model\.numerical_embedding\.w_num holds NaN or ±inf values",
    ),
]


def intact_checkpoint_round_trip() -> bool:
    """The control for `CHECKPOINT_CASES`: the untouched checkpoint loads, and every tensor equals the saved one."""
    from causalqwen import CausalQwenForCausalLM

    with quiet_transformers():
        loaded = CausalQwenForCausalLM.from_pretrained(saved_checkpoint())
    saved = shared_tiny().model.state_dict()
    restored = loaded.state_dict()
    return saved.keys() == restored.keys() and all(torch.equal(saved[key], restored[key]) for key in saved)
