r"""The files and checkpoints boundary: the weights, checkpoints and saved networks causalqwen reads and writes.

A planted pickle where the training state or the weights belong, weight shards outside their directory, a
symbolic or hard link where ``save_pretrained`` writes, tensors stored as integers or holding values float32
cannot hold, a ``trainer_state.json`` that contradicts its checkpoint, a tokenizer saved onto a file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Callable

import torch

from ..cases import TrustCase
from ..fixtures import edit_json, finished_run, fresh_dir, fresh_tiny_model, saved_tiny_model, shared_tiny, train_tiny
from .planted import guarded, outside_file, plant_pickle, replace_tensor, untouched

__all__ = ["CASES"]


def _load(path: str):
    from causalqwen import CausalQwenForCausalLM

    return CausalQwenForCausalLM.from_pretrained(path)


# =============================================================================================
# security
# =============================================================================================


def _planted_training_state():
    out = os.path.join(fresh_dir("planted-state"), "run")
    train_tiny(out)
    checkpoint = os.path.join(out, "checkpoint-2")
    for name in os.listdir(checkpoint):  # an old-format checkpoint: its training state is only the pickle
        if name not in ("config.json", "model.safetensors", "history.json"):
            os.remove(os.path.join(checkpoint, name))
    witness = os.path.join(out, "..", "pwned")
    plant_pickle(os.path.join(checkpoint, "training_state.pt"), witness)
    with guarded(witness):
        train_tiny(out, resume=True)


def _pickled_model_only():
    path = saved_tiny_model()
    os.remove(os.path.join(path, "model.safetensors"))
    witness = os.path.join(path, "..", "pwned")
    plant_pickle(os.path.join(path, "pytorch_model.bin"), witness)
    with guarded(witness):
        _load(path)


def _index_pointing(shard_name: Callable[[str], str]):
    def trigger():
        from safetensors.torch import load_file

        path = saved_tiny_model()
        outside = os.path.join(os.path.dirname(path), "outside")
        os.makedirs(outside)
        os.replace(os.path.join(path, "model.safetensors"), os.path.join(outside, "model.safetensors"))
        names = list(load_file(os.path.join(outside, "model.safetensors")))
        shard = shard_name(outside)
        with open(os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
            json.dump({"metadata": {}, "weight_map": {name: shard for name in names}}, handle)
        _load(path)

    return trigger


def _planted_before_saving(name: str, link, save):
    """A directory where ``save(path)`` is about to write, holding ``name`` as a ``link`` (``os.symlink`` or
    ``os.link``) to a file outside."""

    def trigger():
        target = outside_file()
        path = os.path.join(fresh_dir("planted"), "saved")
        os.makedirs(path)
        link(target, os.path.join(path, name))
        with untouched(target):
            save(path)

    return trigger


def _save_model(path: str) -> None:
    fresh_tiny_model().save_pretrained(path)


def _save_tokenizer(path: str) -> None:
    shared_tiny().tokenizer.save_pretrained(path)


# =============================================================================================
# silent
# =============================================================================================


def _resume_int32_b_noise():
    from safetensors.torch import load_file, save_file

    out = os.path.join(fresh_dir("resume-int32"), "run")
    train_tiny(out, steps=4, save_every=2)
    shutil.rmtree(os.path.join(out, "checkpoint-4"))  # as if killed after step 2
    weights = os.path.join(out, "checkpoint-2", "model.safetensors")
    state = load_file(weights)
    state["action.b_noise"] = torch.full_like(state["action.b_noise"], 10**9, dtype=torch.int32)
    save_file(state, weights)
    train_tiny(out, resume=True, steps=4, save_every=2)


def _float64_beyond_float32_abduction():
    from causalqwen import load_abduction, save_abduction

    directory = fresh_dir("abduction")
    file = save_abduction(fresh_tiny_model(), directory)
    replace_tensor(file, "b_loc", torch.full_like(fresh_tiny_model().abduction.b_loc, 1e300, dtype=torch.float64))
    load_abduction(fresh_tiny_model(), directory)


def _float64_beyond_float32_resume():
    out = finished_run()
    file = os.path.join(out, "checkpoint-2", "model.safetensors")
    replace_tensor(
        file, "action.b_noise", torch.full_like(fresh_tiny_model().action.b_noise, 1e300, dtype=torch.float64)
    )
    train_tiny(out, resume=True, steps=4, save_every=2)


def _divergence_reference(value):
    def trigger():
        from safetensors.torch import load_file

        out = finished_run(preset="causal", max_u_divergence=1.0)
        file = os.path.join(out, "checkpoint-2", "divergence_reference.safetensors")
        name = next(key for key in sorted(load_file(file)) if key.endswith("W_loc"))
        original = load_file(file)[name]
        replace_tensor(file, name, value(original))
        train_tiny(out, resume=True, steps=4, save_every=2, preset="causal", max_u_divergence=1.0)

    return trigger


def _integers(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor * 1000).to(torch.int64)


def _with_nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[0] = math.nan
    return tensor


def _trainer_state_edit(edit):
    def trigger():
        out = finished_run()
        edit_json(os.path.join(out, "checkpoint-2", "trainer_state.json"), edit)
        train_tiny(out, resume=True, steps=4, save_every=2)

    return trigger


def _step_100(state: dict) -> None:
    state["step"] = 100


def _weight_decay_1e9(state: dict) -> None:
    state["optimizer_param_groups"][0]["weight_decay"] = 1e9


# =============================================================================================
# clarity
# =============================================================================================


def _tokenizer_saved_onto_a_file():
    path = os.path.join(fresh_dir("onto-file"), "taken")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("a file\n")
    shared_tiny().tokenizer.save_pretrained(path)


CASES = [
    # ---- security
    TrustCase(
        "planted-training-state-pickle",
        "security",
        "resume from a checkpoint whose training state is a planted pickle (training_state.pt)",
        _planted_training_state,
        OSError,
        r"training_state\.pt' is a pickle .*never loaded",
    ),
    TrustCase(
        "pickled-model-only",
        "security",
        "from_pretrained on a directory holding only a planted pytorch_model.bin",
        _pickled_model_only,
        OSError,
        r"holds no model\.safetensors .*pytorch_model\.bin \(pickle\), which causalqwen never loads",
    ),
    TrustCase(
        "index-shard-parent-path",
        "security",
        "a safetensors index naming the shard ../outside/model.safetensors",
        _index_pointing(lambda outside: "../outside/model.safetensors"),
        OSError,
        "names the shard .* outside its directory",
    ),
    TrustCase(
        "index-shard-absolute-path",
        "security",
        "a safetensors index naming an absolute shard path",
        _index_pointing(lambda outside: os.path.join(outside, "model.safetensors")),
        OSError,
        "outside its directory",
    ),
    TrustCase(
        "save-config-symlink",
        "security",
        "save_pretrained into a directory whose config.json is a symlink outside",
        _planted_before_saving("config.json", os.symlink, _save_model),
        OSError,
        r"config\.json'.*symbolic link",
    ),
    TrustCase(
        "save-weights-hard-link",
        "security",
        "save_pretrained over a model.safetensors hard-linked to a file outside",
        _planted_before_saving("model.safetensors", os.link, _save_model),
        OSError,
        r"model\.safetensors' has 2 hard links",
    ),
    TrustCase(
        "tokenizer-config-symlink",
        "security",
        "tokenizer save_pretrained over a symlinked tokenizer_config.json",
        _planted_before_saving("tokenizer_config.json", os.symlink, _save_tokenizer),
        OSError,
        r"tokenizer_config\.json'.*symbolic link",
    ),
    # ---- silent
    TrustCase(
        "resume-int32-b-noise",
        "silent",
        "resume from a checkpoint whose b_noise is stored as int32 (loaded as 1e9)",
        _resume_int32_b_noise,
        OSError,
        r"action\.b_noise is stored as I32, but the model's tensor is floating-point",
    ),
    TrustCase(
        "load-abduction-float64-1e300",
        "silent",
        "load_abduction of a float64 b_loc holding 1e300 (became inf)",
        _float64_beyond_float32_abduction,
        ValueError,
        r"abduction\.safetensors'.*b_loc holds 1e\+300, beyond the range of float32",
    ),
    TrustCase(
        "resume-float64-1e300",
        "silent",
        "resume from weights with a float64 b_noise of 1e300 (blamed the learning rate)",
        _float64_beyond_float32_resume,
        OSError,
        r"model\.safetensors' do not fit the model: action\.b_noise holds 1e\+300",
    ),
    TrustCase(
        "divergence-reference-integers",
        "silent",
        "resume with an integer tensor in divergence_reference.safetensors (exit 0, D ~ 2,276)",
        _divergence_reference(_integers),
        OSError,
        r"divergence_reference\.safetensors'.*W_loc is stored as torch\.int64, not a floating-point tensor",
    ),
    TrustCase(
        "divergence-reference-nan",
        "silent",
        "resume with a NaN in divergence_reference.safetensors (blamed the learning rate)",
        _divergence_reference(_with_nan),
        OSError,
        r"divergence_reference\.safetensors'.*W_loc holds NaN or ±inf",
    ),
    TrustCase(
        "trainer-state-step-edited",
        "silent",
        "resume from checkpoint-2 whose trainer_state.json says step 100 (finished at once)",
        _trainer_state_edit(_step_100),
        OSError,
        r"trainer_state\.json' records step 100, but its directory is checkpoint-2",
    ),
    TrustCase(
        "trainer-state-weight-decay-edited",
        "silent",
        "resume with weight_decay 1e9 in trainer_state.json (weights driven to 1.9e9)",
        _trainer_state_edit(_weight_decay_1e9),
        OSError,
        r"contradicts its checkpoint .*weight_decay is 1000000000\.0",
    ),
    # ---- clarity
    TrustCase(
        "tokenizer-saved-onto-a-file",
        "clarity",
        "NumericTokenizer.save_pretrained onto an existing file (TypeError: NoneType)",
        _tokenizer_saved_onto_a_file,
        OSError,
        r"taken' exists and is not a directory",
    ),
]
