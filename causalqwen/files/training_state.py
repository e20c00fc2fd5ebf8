r"""The optimizer, scheduler and RNG states of a training run, written and read without pickle.

A checkpoint of `causalqwen.training` holds, beside the model, the state that makes a resumed run continue bit
for bit: AdamW's moments and step counts, the learning-rate schedule, and every random state (torch's, NumPy's,
Python's and the evaluation generator's). Tensors go to ``training_state.safetensors``, numbers and lists to
``trainer_state.json`` (`save_training_state`); `read_training_record` and `load_training_state` read them back
after checking every tensor (name, shape, dtype, finite, AdamW's second moments >= 0) and every field of the JSON
(its structure against what this run would write and, given ``expected``, its values). Every failure is an
``OSError`` naming the file and the tensor or field. The value check of every tensor is the one of all loaders,
`causalqwen.files.checkpoint.value_problem`.
"""

from __future__ import annotations

import json
import math
import os
import random

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .checkpoint import check_readable, value_problem
from .rundir import check_write_targets, open_for_writing

__all__ = [
    "TRAINING_TENSORS",
    "TRAINING_JSON",
    "TRAINING_FORMAT",
    "save_training_state",
    "read_training_record",
    "load_training_state",
]

TRAINING_TENSORS = "training_state.safetensors"
TRAINING_JSON = "trainer_state.json"
TRAINING_FORMAT = 1
# The RNG states of a training state, with the dtypes they are saved in; optimizer states that must be >= 0.
_RNG_TENSORS = {"rng.torch": torch.uint8, "rng.eval": torch.uint8, "rng.numpy": torch.int64}
_NON_NEGATIVE_STATE = ("step", "exp_avg_sq", "max_exp_avg_sq")


def save_training_state(directory: str, *, step: int, optimizer, scheduler, eval_generator, settings: dict) -> None:
    r"""Write the optimizer, the scheduler and every RNG state of a run to ``directory``, without pickle.

    Tensors (AdamW's moments and step counts, the torch and numpy RNG states, the evaluation
    generator) go to ``training_state.safetensors``; numbers and lists (the parameter groups, the
    scheduler, Python's RNG, ``settings``) to ``trainer_state.json``.
    """
    optimizer_state = optimizer.state_dict()
    tensors = {}
    for index, state in optimizer_state["state"].items():
        for name, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {index}.{name} is a {type(value).__name__}, not a tensor")
            tensors[f"optimizer.{index}.{name}"] = value.detach().cpu().contiguous()
    np_state = np.random.get_state()
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    tensors["rng.eval"] = eval_generator.get_state()
    check_write_targets(directory, (TRAINING_TENSORS, TRAINING_JSON))  # save_file follows links: not here
    save_file(tensors, os.path.join(directory, TRAINING_TENSORS))
    record = {
        "format": TRAINING_FORMAT,
        "step": step,
        "settings": settings,
        "optimizer_param_groups": optimizer_state["param_groups"],
        "scheduler": scheduler.state_dict(),
        "rng_python": random.getstate(),
        "rng_numpy": [np_state[0], *np_state[2:]],  # name, position, has_gauss, cached_gaussian
    }
    with open_for_writing(os.path.join(directory, TRAINING_JSON)) as handle:
        json.dump(record, handle, allow_nan=False)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a training state may hold (only finite numbers)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond the range of a float (only finite numbers)")
    return value


def _kind_problems(saved, current, where: str) -> list[str]:
    """Where ``saved`` (read from JSON) differs in structure from ``current`` (what this run would write): each
    dict with the same keys, each list of the same length, each value of the same JSON kind (a number for a
    number, a bool for a bool, null for null). The values themselves may differ."""

    def kind(value):
        if value is None or isinstance(value, (bool, str)):
            return type(value).__name__
        if isinstance(value, (int, float)):
            return "number"
        if isinstance(value, (list, tuple)):
            return "list"
        return "object" if isinstance(value, dict) else type(value).__name__

    if kind(saved) != kind(current):
        return [f"{where} is a {kind(saved)}, this run's is a {kind(current)}"]
    if isinstance(current, dict):
        if set(saved) != set(current):
            return [f"{where} has the keys {sorted(saved)}, this run's has {sorted(current)}"]
        return [
            problem for key in sorted(current) for problem in _kind_problems(saved[key], current[key], f"{where}.{key}")
        ]
    if isinstance(current, (list, tuple)):
        if len(saved) != len(current):
            return [f"{where} has {len(saved)} entries, this run's has {len(current)}"]
        return [
            problem for i, (a, b) in enumerate(zip(saved, current)) for problem in _kind_problems(a, b, f"{where}[{i}]")
        ]
    return []


def read_training_record(directory: str) -> dict:
    """``trainer_state.json`` of a checkpoint, checked to be a record this version writes."""
    legacy = os.path.join(directory, "training_state.pt")
    path = os.path.join(directory, TRAINING_JSON)
    if not os.path.isfile(path):
        if os.path.exists(legacy):
            raise OSError(
                f"{legacy!r} is a pickle written by an older causalqwen; it is never loaded (a pickle can run code). "
                "Start a new run"
            )
        raise OSError(f"the checkpoint {directory!r} has no {TRAINING_JSON}")
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, UnicodeDecodeError) as error:
        raise OSError(f"{path!r} is not valid JSON: {error}") from error
    if not isinstance(record, dict) or record.get("format") != TRAINING_FORMAT:
        raise OSError(f"{path!r} is not a causalqwen training state of format {TRAINING_FORMAT}")
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise OSError(f"{path!r}: step must be an int >= 1, got {step!r}")
    return record


def _value_problems(saved, expected, where: str) -> list[str]:
    """Where ``saved`` (structure already checked by `_kind_problems`) holds other values than ``expected``: lists
    and ints exactly (a ``params`` list is the parameters' order), floats to 1e-12 relative."""
    if isinstance(expected, dict):
        return [
            problem
            for key in sorted(expected)
            if key in saved
            for problem in _value_problems(saved[key], expected[key], f"{where}.{key}")
        ]
    if isinstance(expected, list) and isinstance(saved, list):
        if where.endswith(".params") and saved != expected:
            return [f"{where} is {saved}, this run's optimizer has {expected}"]
        return [
            problem
            for i, (a, b) in enumerate(zip(saved, expected))
            for problem in _value_problems(a, b, f"{where}[{i}]")
        ]
    if isinstance(expected, float) and isinstance(saved, (int, float)) and not isinstance(saved, bool):
        same = math.isclose(saved, expected, rel_tol=1e-12, abs_tol=0.0)
    else:
        same = saved == expected and isinstance(saved, bool) == isinstance(expected, bool)
    if same:
        return []
    return [f"{where} is {saved!r}, the run's settings give {expected!r}"]


def load_training_state(
    directory: str, *, optimizer, scheduler, eval_generator, record: dict, expected: dict | None = None
) -> None:
    """Restore what `save_training_state` wrote, after checking every tensor. ``OSError`` naming the file and
    the tensor.

    - ``optimizer.<i>.<name>``: ``<i>`` one of the optimizer's parameters, the shape of that parameter (a
      scalar for ``step``), and `value_problem` against the dtype it takes once loaded (the parameter's; a
      ``step`` stays as stored, checked against float32): floating point and finite there. A ``step``
      and the second moments (``exp_avg_sq``, ``max_exp_avg_sq``) must be >= 0: AdamW takes their square
      root, so a negative one would turn the parameters into NaN at the next step.
    - ``rng.torch``, ``rng.eval``: the uint8 vectors ``torch.get_rng_state()`` gives (any other dtype would be
      cast into other bytes); ``rng.numpy``: 624 int64 values in $[0, 2^{32})$ (numpy's uint32 key).
    - nothing else: a tensor this version does not write is refused, not ignored.

    ``expected`` (``optimizer_param_groups`` and ``scheduler`` as the run's own code would have saved them at the
    record's step, from the settings the record names) makes the record's numbers checked too, not only their
    structure: every parameter-group entry (``params`` lists identical, ``lr``, ``initial_lr``,
    ``weight_decay``, ``betas``, ``maximize``, ...) and every scheduler entry (``base_lrs``, ``last_epoch``,
    ``_last_lr``, ...). A difference is an ``OSError`` naming the file, the field and both values.
    """
    file = os.path.join(directory, TRAINING_TENSORS)
    json_file = os.path.join(directory, TRAINING_JSON)
    check_readable(file)
    tensors = load_file(file)
    state, problems = _optimizer_state(tensors, optimizer)
    problems += _rng_problems(tensors, eval_generator)
    if problems:
        raise OSError(f"the training state {file!r} does not fit this run: " + "; ".join(problems))
    problems = _kind_problems(
        record.get("optimizer_param_groups"), optimizer.state_dict()["param_groups"], "optimizer_param_groups"
    ) + _kind_problems(record.get("scheduler"), scheduler.state_dict(), "scheduler")
    if problems:
        raise OSError(f"the training state {json_file!r} does not fit this run: " + "; ".join(problems))
    if expected is not None:
        problems = [
            problem
            for key in ("optimizer_param_groups", "scheduler")
            for problem in _value_problems(record[key], expected[key], key)
        ]
        if problems:
            raise OSError(
                f"the training state {json_file!r} contradicts its checkpoint (step {record['step']} "
                "and the settings it records): " + "; ".join(problems)
            )

    try:
        optimizer.load_state_dict({"state": state, "param_groups": record["optimizer_param_groups"]})
        scheduler.load_state_dict(record["scheduler"])
        version, internal, gauss = record["rng_python"]
        random.setstate((version, tuple(internal), gauss))
        np.random.set_state(
            (record["rng_numpy"][0], tensors["rng.numpy"].numpy().astype(np.uint32), *record["rng_numpy"][1:])
        )
        torch.set_rng_state(tensors["rng.torch"])
        eval_generator.set_state(tensors["rng.eval"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise OSError(f"the training state in {json_file!r} does not fit this run: {error}") from error


def _optimizer_state(tensors: dict, optimizer) -> tuple[dict, list[str]]:
    """The ``optimizer.<i>.<name>`` tensors of a training state as an optimizer ``state`` (``{i: {name: tensor}}``),
    and the problems of every tensor (`load_training_state` lists the rules): a tensor this version does not
    write, a parameter index or shape that does not fit, a value `value_problem` refuses, a negative second
    moment, a parameter whose AdamW state is incomplete."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state, problems = {}, []
    for key, tensor in tensors.items():
        if not key.startswith("optimizer."):
            if key not in _RNG_TENSORS:
                problems.append(f"{key} is not a tensor of a causalqwen training state")
            continue
        parts = key.split(".")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(params):
            count = f"{len(params)} parameter" + ("" if len(params) == 1 else "s")
            problems.append(f"{key} names no parameter of the optimizer (it has {count})")
            continue
        index, name = int(parts[1]), parts[2]
        wanted = () if name == "step" else tuple(params[index].shape)
        if tuple(tensor.shape) != wanted:
            problems.append(f"{key} has shape {tuple(tensor.shape)}, the parameter needs {wanted}")
        elif problem := value_problem(key, tensor, torch.float32 if name == "step" else params[index].dtype):
            problems.append(problem)
        elif name in _NON_NEGATIVE_STATE and bool((tensor < 0).any()):
            problems.append(f"{key} holds negative values (AdamW would turn them into NaN: it takes square roots)")
        state.setdefault(index, {})[name] = tensor
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):  # AdamW keeps these for every parameter it has seen
        wanted = {"step", "exp_avg", "exp_avg_sq"} | (
            {"max_exp_avg_sq"} if any(group.get("amsgrad") for group in optimizer.param_groups) else set()
        )
        problems += [
            f"optimizer.{index} holds {sorted(names)}, AdamW keeps {sorted(wanted)}"
            for index, names in sorted((i, set(s)) for i, s in state.items())
            if names != wanted
        ]
    return state, problems


def _rng_problems(tensors: dict, eval_generator) -> list[str]:
    """Problems of the RNG states of a training state: each present, of the size and dtype they are saved in."""
    problems = []
    for name, size in (
        ("rng.torch", torch.get_rng_state().numel()),
        ("rng.eval", eval_generator.get_state().numel()),
        ("rng.numpy", 624),
    ):
        if name not in tensors or tuple(tensors[name].shape) != (size,):
            problems.append(f"{name} is missing or not a vector of {size} values")
        elif tensors[name].dtype != _RNG_TENSORS[name]:
            problems.append(
                f"{name} is stored as {tensors[name].dtype}, not {_RNG_TENSORS[name]} (as the state is saved)"
            )
        elif name == "rng.numpy" and not bool(((tensors[name] >= 0) & (tensors[name] < 2**32)).all()):
            problems.append(f"{name} holds values outside [0, 2**32) (numpy's key is 32-bit)")
    return problems
