r"""The training loop (decision D13), written out step by step.

One optimisation step:

1. take the next batch: the order is a function of ``(seed, epoch)`` alone (a ``DistributedSampler``
   reshuffled with ``set_epoch``), so a resumed run sees exactly the batches it would have seen;
2. ``loss = model(**batch).loss`` $= \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg,eff}}$ (D8-D9);
3. backward, clip the global gradient norm at ``max_grad_norm``, AdamW step, scheduler step
   (linear warm-up, then cosine decay to 0);
4. every ``eval_every`` steps: the ``eval/*`` and ``dist/*`` metrics (`causalqwen.metrics`) on the
   held-out set; every ``save_every`` steps: a checkpoint.

What is trained is a *preset*: ``causal`` (the default; numerical embedding, abduction, action with
$b_{\mathrm{noise}}$, learnable thresholds), ``abduction`` (the abduction network alone), ``lora`` (the LoRA
adapters of `causalqwen.lora.add_lora` on the Qwen2 stack plus the ``causal`` modules), ``all``
(everything, the Qwen2 backbone included -- needed for a randomly initialised base). With
``max_u_divergence`` the loss gains $\mu \bar D$, the bound on how far the law of $U$ moves from the starting
model's (`causalqwen.divergence`), and $\mu$ takes a dual-ascent step after each optimizer step. Weight decay
applies to matrices only (``dim >= 2``), never to biases, norms, ``w_num`` or ``b_noise``.

A checkpoint ``checkpoint-{step}/`` holds the model (``save_pretrained``: safetensors), the optimizer's
tensors and every RNG state (``training_state.safetensors``), the scheduler, the optimizer's groups and
the run's settings and data fingerprints (``trainer_state.json``), and the history; nothing in it is a
pickle (`causalqwen.checkpoint`). It is written under a temporary name, fsynced and renamed, so a
directory with that name is always complete. ``resume=True`` continues from the newest one, after
checking that the model config, the settings and the data are the ones it was written with, and ends
with exactly the parameters of an uninterrupted run (on CPU: bit for bit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
from dataclasses import dataclass
from functools import partial

import numpy as np
import safetensors
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from .auto import SAVED_ONLY_FIELDS
from .checkpoint import (
    fsync_directory,
    fsync_tree,
    load_training_state,
    load_weights_strictly,
    read_training_record,
    save_training_state,
)
from .data import TextDataset, collate
from .divergence import DivergenceBound
from .inference import as_number
from .lora import is_peft_model, restore_lora, save_lora
from .metrics import evaluate_batch, with_log_prefixes
from .rundir import RunDirectory, check_not_link, check_writable, check_write_targets, make_directory, open_for_writing

__all__ = [
    "PRESETS",
    "TrainingConfig",
    "set_trainable",
    "parameter_groups",
    "globally_normalized_loss",
    "train",
    "latest_checkpoint",
    "fingerprint",
    "run_settings",
    "TrainingDiverged",
    "training_metrics",
]

logger = logging.getLogger(__name__)

PRESETS = ("causal", "abduction", "all", "lora")
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # the largest learning_rate, weight_decay, max_grad_norm
SEED_MAX = 2**32 - 1  # the largest seed: NumPy seeds with 32 bits, and one seed drives torch, NumPy and Python


@dataclass
class TrainingConfig:
    """Hyper-parameters of `train`. ``batch_size`` is per process."""

    steps: int = 1000
    batch_size: int = 16
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    max_grad_norm: float = 1.0
    preset: str = "causal"
    eval_every: int = 100
    save_every: int = 500
    log_every: int = 10
    seed: int = 0
    report_to: str | None = None  # "tensorboard" or "wandb", if installed
    max_u_divergence: float | None = None  # epsilon of the bound on how far U moves from the base (causalqwen.divergence)
    divergence_dual_lr: float = 1.0  # eta_mu, the dual-ascent step of the bound's Lagrange multiplier

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        # NumPy scalars and 0-d tensors are taken as the Python numbers they hold (stored as such, so that
        # the settings compare and serialise as plain JSON); booleans and strings are refused by name.
        for name in ("steps", "batch_size", "eval_every", "save_every", "log_every", "warmup_steps", "seed"):
            value = as_number(getattr(self, name), integer=True)
            lowest = 0 if name in ("warmup_steps", "seed") else 1
            if value is None or value < lowest:
                kind = "a positive int" if lowest else "an int >= 0"
                raise ValueError(f"{name} must be {kind}, got {getattr(self, name)!r}")
            setattr(self, name, value)
        if self.seed > SEED_MAX:
            raise ValueError(f"seed must be an int from 0 to {SEED_MAX} (2**32 - 1), got {self.seed!r}")
        # The optimizer computes in the parameters' float32: a setting beyond float32's range overflows there
        # (inf weights, or torch's "cannot be converted to type float without overflow" mid-run).
        for name in ("learning_rate", "weight_decay", "max_grad_norm"):
            value = as_number(getattr(self, name))
            if value is None or not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                raise ValueError(f"{name} must be a finite number within float32's range (at most {FLOAT32_MAX:.6g}), "
                                 f"got {getattr(self, name)!r}")
            setattr(self, name, value)
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        if not (self.max_grad_norm > 0 and self.weight_decay >= 0):
            raise ValueError("max_grad_norm must be > 0 and weight_decay >= 0")
        # AdamW's decoupled decay multiplies each decayed weight by 1 - learning_rate * weight_decay per step: at
        # 1 or more that factor is <= 0 (weights zeroed, or sign-flipped and growing without bound).
        if self.learning_rate * self.weight_decay >= 1:
            raise ValueError(
                f"learning_rate * weight_decay must be < 1 (AdamW multiplies the weights by 1 - learning_rate * "
                f"weight_decay each step), got learning_rate={self.learning_rate!r} * weight_decay="
                f"{self.weight_decay!r} = {self.learning_rate * self.weight_decay:g}"
            )
        if self.max_u_divergence is not None:
            value = as_number(self.max_u_divergence)
            if value is None or not math.isfinite(value) or value < 0:
                raise ValueError(f"max_u_divergence must be a finite number >= 0 or None, got {self.max_u_divergence!r}")
            self.max_u_divergence = value
        value = as_number(self.divergence_dual_lr)
        if value is None or not math.isfinite(value) or value < 0:
            raise ValueError(f"divergence_dual_lr must be a finite number >= 0, got {self.divergence_dual_lr!r}")
        self.divergence_dual_lr = value
        if self.report_to not in (None, "tensorboard", "wandb"):
            raise ValueError(f'report_to must be "tensorboard", "wandb" or None, got {self.report_to!r}')


def set_trainable(model, preset: str) -> list[str]:
    """Set ``requires_grad`` for ``preset`` (D13); return the names of the trainable parameters.

    ``lora`` needs the `peft.PeftModel` of `causalqwen.lora.add_lora`: its LoRA matrices and its trained copies of
    the causal preset's modules train, everything else (the base weights and the base copies) is frozen.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if (preset == "lora") != is_peft_model(model):
        raise TypeError("preset 'lora' trains the adapters of causalqwen.lora.add_lora(model), and only it does: "
                        f"got a {type(model).__name__} for preset {preset!r}")
    if preset == "lora":
        names = []
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name)
            if parameter.requires_grad:
                names.append(name)
        return names
    modules = {
        "all": [model],
        "causal": [model.model.numerical_embedding, model.model.abduction, model.action],  # the head owns C_k
        "abduction": [model.model.abduction],
    }[preset]
    chosen = {id(parameter) for module in modules for parameter in module.parameters()}
    names = []
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(id(parameter) in chosen)
        if parameter.requires_grad:
            names.append(name)
    return names


def parameter_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: trainable matrices (``dim >= 2``) decay, everything else does not."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]


CHECKPOINT_NAME = re.compile(r"checkpoint-([1-9][0-9]*)", re.ASCII)  # exactly the names _save_checkpoint writes
_STEP_LIKE_NAME = re.compile(r"checkpoint-(\d+)")  # any digits, Unicode ones included: what a person may mistake for one


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory name as the run writes it (``checkpoint-{step}``: ASCII digits, no
    leading zero, step >= 1), or None for any other name."""
    match = CHECKPOINT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def latest_checkpoint(out_dir: str) -> str | None:
    """The complete ``checkpoint-{step}`` directory with the highest step (the path of that very entry), or None.

    Only the names the run itself writes count: ``checkpoint-`` and the step in ASCII digits without a leading
    zero (``checkpoint-5``). Anything the run would mistake for one is an ``OSError`` naming it, never skipped
    nor guessed at: a ``checkpoint-{digits}`` entry whose digits are not that canonical form
    (``checkpoint-0005``, ``checkpoint-0``, ``checkpoint-٣``: rename or remove it), a ``checkpoint-{step}``
    that is a symbolic link (a run's checkpoints are directories it wrote, inside it) or not a directory (a
    regular file). Other names (``checkpoint-5.partial``, a killed save's leftover) are not checkpoints and are
    ignored."""
    if not os.path.isdir(out_dir):
        return None
    found = {}
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        step = checkpoint_step(name)
        if step is None:
            if _STEP_LIKE_NAME.fullmatch(name):
                raise OSError(f"{path!r} is not a checkpoint name this run writes (checkpoint-<step>, the step in "
                              "ASCII digits without leading zeros, at least 1): rename or remove it")
            continue
        check_not_link(path)
        if not os.path.isdir(path):
            raise OSError(f"{path!r} is not a directory: a checkpoint is a directory the run writes; remove it")
        found[step] = path
    return found[max(found)] if found else None


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def globally_normalized_loss(out, config) -> torch.Tensor:
    r"""This process's share of the loss of the *global* batch, for DDP (which averages gradients).

    The model's loss is a mean over this process's $n^{(r)}_{\mathrm{cls}}$ scored positions and
    $n^{(r)}_{\mathrm{reg}}$ ``<NUM>`` targets. Over $W$ processes with totals $N_{\mathrm{cls}}$,
    $N_{\mathrm{reg}}$, the global loss is recovered by

    $$L^{(r)} = W\Big(\bar L^{(r)}_{\mathrm{cls}}\,\frac{n^{(r)}_{\mathrm{cls}}}{N_{\mathrm{cls}}}
    + \lambda\, L^{(r)}_{\mathrm{reg,eff}}\,\frac{n^{(r)}_{\mathrm{reg}}}{N_{\mathrm{reg}}}\Big),$$

    so that the DDP average $\frac1W\sum_r \nabla L^{(r)}$ is the gradient of one process holding the
    whole batch, whatever the padding and the number of numbers in each shard.
    """
    counts = torch.stack([out.n_cls, out.n_reg]).double()
    totals = counts.clone()
    dist.all_reduce(totals)  # [N_cls, N_reg]
    shares = (counts / totals.clamp_min(1)).to(out.cls_loss.dtype)
    return _world_size() * (out.cls_loss * shares[0] + config.regression_weight * out.reg_loss * shares[1])


# Settings that change only what is logged or saved, not the trajectory of the parameters: a resumed run may
# change them freely. Every other field of TrainingConfig must match the checkpoint's.
LOGGING_SETTINGS = ("eval_every", "save_every", "log_every", "report_to")


class TrainingDiverged(ValueError):
    """Training produced a non-finite loss or gradient (or parameters that break the forward pass)."""


def fingerprint(items) -> str:
    """SHA-256 of a dataset (an indexable of dicts of tensors) or of a batch (a dict of tensors): the
    resumed run must see the same data, token for token and value for value."""
    digest = hashlib.sha256()
    rows = [items] if isinstance(items, dict) else (items[index] for index in range(len(items)))
    for row in rows:
        for key in sorted(row):
            tensor = row[key].detach().cpu().contiguous()
            digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def run_settings(config: TrainingConfig, train_dataset, eval_batch) -> dict:
    """What a checkpoint records of its run and a resume compares: the optimisation settings and the data."""
    return {
        "training": {k: v for k, v in dataclasses.asdict(config).items() if k not in LOGGING_SETTINGS},
        "train_data_sha256": fingerprint(train_dataset),
        "eval_data_sha256": fingerprint(eval_batch) if eval_batch is not None else None,
    }


def settings_differences(saved: dict, current: dict) -> list[str]:
    """One line per setting that differs between a checkpoint's `run_settings` and this run's."""
    differences = []
    saved_fields, current_fields = saved.get("training", {}), current["training"]
    for name in sorted(set(saved_fields) | set(current_fields)):
        if saved_fields.get(name) != current_fields.get(name):
            differences.append(f"{name} is {saved_fields.get(name)!r} in the checkpoint, {current_fields.get(name)!r} now")
    for key, what in (("train_data_sha256", "the training data"), ("eval_data_sha256", "the evaluation data")):
        if saved.get(key) != current[key]:
            differences.append(f"{what} differ (sha256 {str(saved.get(key))[:12]} in the checkpoint, {str(current[key])[:12]} now)")
    return differences


@torch.no_grad()
def training_metrics(model, out, batch: dict) -> dict[str, float]:
    """The ``train/*`` losses and accuracy of a step, from its forward output: the predictions are taken tile by
    tile (`DecisionHead.predict_tiled`), never from the ``[B, S, V]`` decisions the fused loss exists to avoid."""
    targets = model.action.next_token_targets(batch["labels"], batch["numeric_values"], batch["attention_mask"])
    scored = targets.scored  # [B, S]
    predicted = model.action.predict_tiled(out.loc_U[scored], out.scale_U[scored])  # [N]
    correct, total = (predicted == targets.labels[scored]).sum(), scored.sum()
    return {
        "train/total_loss": out.loss.item(),
        "train/cls_loss_mean": out.cls_loss.item(),
        "train/reg_loss_effective": out.reg_loss.item(),
        "train/accuracy": float(correct) / float(total) if int(total) > 0 else 0.0,
    }


def _save_checkpoint(out_dir, step, model, optimizer, scheduler, history, eval_generator, settings, bound=None) -> str:
    """Write ``checkpoint-{step}`` under a temporary name, fsync it, and rename it into place."""
    final = os.path.join(out_dir, f"checkpoint-{step}")
    partial_dir = final + ".partial"
    for directory in (partial_dir, final):  # a link is never followed, emptied nor replaced: it is not ours
        check_write_targets(directory, (), root=out_dir)
    shutil.rmtree(partial_dir, ignore_errors=True)  # our own leftover from a killed save
    os.makedirs(partial_dir)
    if is_peft_model(model):  # the adapters and the trained causal modules, beside the base model's config
        save_lora(model, partial_dir)
        check_write_targets(partial_dir, ("config.json",), root=out_dir)
        model.get_base_model().config.save_pretrained(partial_dir)
    else:
        model.save_pretrained(partial_dir)  # config.json + model.safetensors
    save_training_state(partial_dir, step=step, optimizer=optimizer, scheduler=scheduler,
                        eval_generator=eval_generator, settings=settings)
    with open_for_writing(os.path.join(partial_dir, "history.json"), root=out_dir) as handle:
        json.dump(history, handle)
    if bound is not None:  # the base law of U (frozen at the run's start) and the multiplier
        check_write_targets(partial_dir, (BOUND_TENSORS,), root=out_dir)
        save_file(bound.base.state_dict(), os.path.join(partial_dir, BOUND_TENSORS))
        with open_for_writing(os.path.join(partial_dir, BOUND_JSON), root=out_dir) as handle:
            json.dump({"multiplier": bound.multiplier, "last_divergence": bound.last_divergence}, handle, allow_nan=False)
    fsync_tree(partial_dir)
    check_write_targets(final, (), root=out_dir)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial_dir, final)  # atomic: a checkpoint-{step} directory is always complete
    fsync_directory(out_dir)
    return final


def _expected_training_state(model, config: TrainingConfig, step: int) -> dict:
    """The parameter groups and scheduler state `_train` would save after ``step`` steps under ``config``, as
    JSON gives them back: the optimizer and schedule built as the run builds them, the learning rate that
    schedule gives at ``step``."""
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.learning_rate)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.warmup_steps, config.steps)
    rates = [schedule(step) * base for schedule, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    groups = [group | {"lr": rate} for group, rate in zip(optimizer.state_dict()["param_groups"], rates)]
    state = scheduler.state_dict() | {"last_epoch": step, "_step_count": step + 1, "_last_lr": rates}
    return json.loads(json.dumps({"optimizer_param_groups": groups, "scheduler": state}))


def _recorded_config(record: dict, json_file: str, config: TrainingConfig) -> TrainingConfig:
    """This run's config with the optimisation settings a checkpoint records (those its trainer state follows)."""
    recorded = (record.get("settings") or {}).get("training")
    names = ("learning_rate", "weight_decay", "warmup_steps", "steps")
    if not isinstance(recorded, dict) or any(name not in recorded for name in names):
        raise OSError(f"{json_file!r}: settings.training must record {', '.join(names)}, got {recorded!r}")
    try:
        return dataclasses.replace(config, **{name: recorded[name] for name in names})
    except (TypeError, ValueError) as error:
        raise OSError(f"{json_file!r}: settings.training is not a valid training config: {error}") from error


def _load_checkpoint(path, model, optimizer, scheduler, eval_generator, settings, allow_changed_settings,
                     bound=None, config=None) -> tuple[int, list]:
    """Restore a checkpoint strictly: the model config, the run's settings and data, every tensor."""
    saved = type(model.config).from_pretrained(path).to_dict()
    current = model.config.to_dict()
    differing = sorted(k for k in set(saved) | set(current)
                       if k not in ("transformers_version", "architectures", "_name_or_path", "dtype")
                       and k not in SAVED_ONLY_FIELDS
                       and saved.get(k) != current.get(k))
    if differing:
        hint = ""
        if set(differing) & {"abduction_scale_init", "ovr_threshold", "ovr_threshold_init", "ovr_threshold_quantile"}:
            hint = ("; the run was converted with another initial scale or threshold: convert the same way again "
                    "(the command line's --init, --abduction-scale-init, --ovr-threshold, --threshold-init as the "
                    "run began; a run begun before decision D14 used what is now --init drafts)")
        raise ValueError(f"cannot resume from {path}: its model config differs in {', '.join(differing)}{hint}")
    record = read_training_record(path)
    json_file = os.path.join(path, "trainer_state.json")
    named_step = checkpoint_step(os.path.basename(os.path.normpath(path)))
    if named_step is not None and record["step"] != named_step:
        raise OSError(f"cannot resume from {path}: {json_file!r} records step {record['step']}, but its directory "
                      f"is checkpoint-{named_step}")
    differences = settings_differences(record.get("settings") or {}, settings)
    if differences and not allow_changed_settings:
        raise ValueError(
            f"cannot resume from {path}: {'; '.join(differences)}. Resume with the same settings and data, or pass "
            "allow_changed_settings (--allow-changed-settings) to continue anyway (no longer bit-exact)"
        )
    if differences:
        logger.warning("resuming from %s with changed settings: %s", path, "; ".join(differences))
    try:
        if is_peft_model(model):
            restore_lora(model, path)
        else:
            load_weights_strictly(model, os.path.join(path, "model.safetensors"))
    except (OSError, ValueError) as error:
        raise OSError(f"cannot resume from {path}: {error}") from error
    # The record's numbers must be those the run it names would have saved at its step: its own settings (this
    # run's, unless changed settings are allowed) give every optimizer and scheduler value but the moments.
    recorded = _recorded_config(record, json_file, config) if differences else config
    load_training_state(path, optimizer=optimizer, scheduler=scheduler, eval_generator=eval_generator, record=record,
                        expected=_expected_training_state(model, recorded, record["step"]))
    if differences:  # allowed: from here on the optimizer follows this run's settings
        current = _expected_training_state(model, config, record["step"])
        for group, wanted in zip(optimizer.param_groups, current["optimizer_param_groups"]):
            group.update({key: wanted[key] for key in ("lr", "initial_lr", "weight_decay")})
        scheduler.base_lrs = list(current["scheduler"]["base_lrs"])
        scheduler._last_lr = list(current["scheduler"]["_last_lr"])
    if bound is not None:
        _load_bound(path, bound)
    history_file = os.path.join(path, "history.json")
    history = _read_json(history_file, f"cannot resume from {path}")
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise OSError(f"cannot resume from {path}: {history_file} is not a list of records")
    return record["step"], history


BOUND_TENSORS = "divergence_reference.safetensors"
BOUND_JSON = "divergence_bound.json"


def _load_bound(path: str, bound) -> None:
    """The bound's base reference and multiplier from a checkpoint (`_save_checkpoint`)."""
    tensors_file = os.path.join(path, BOUND_TENSORS)
    if not os.path.isfile(tensors_file):
        raise OSError(f"cannot resume from {path}: it has no {BOUND_TENSORS} (was it written with max_u_divergence?)")
    try:  # every tensor checked by name: shape, floating point, finite in the reference's dtype
        bound.base.load_state_dict(load_file(tensors_file))
    except (ValueError, safetensors.SafetensorError) as error:
        raise OSError(f"cannot resume from {path}: {tensors_file!r}: {error}") from error
    state = _read_json(os.path.join(path, BOUND_JSON), f"cannot resume from {path}")
    multiplier = state.get("multiplier") if isinstance(state, dict) else None
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not math.isfinite(multiplier) or multiplier < 0:
        raise OSError(f"cannot resume from {path}: {BOUND_JSON} holds no multiplier >= 0")
    last = state.get("last_divergence")
    if last is not None and (isinstance(last, bool) or not isinstance(last, (int, float)) or not math.isfinite(last)):
        raise OSError(f"cannot resume from {path}: {BOUND_JSON} holds last_divergence {last!r}, not a finite number "
                      "or null")
    bound.multiplier = float(multiplier)
    bound.last_divergence = None if last is None else float(last)


def _read_json(file: str, context: str):
    """The JSON in ``file``; an ``OSError`` that starts with ``context`` and names the file otherwise."""
    try:
        with open(file, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise OSError(f"{context}: {file} cannot be read: {error}") from error


def _check_config_file(run_dir: str, config: TrainingConfig, allow_changed_settings: bool) -> None:
    """A resumed run that has no checkpoint yet compares its settings with the run's ``training_config.json``."""
    stored = _read_json(os.path.join(run_dir, "training_config.json"), f"cannot resume in {run_dir}")
    if not isinstance(stored, dict):
        raise OSError(f"cannot resume in {run_dir}: training_config.json is not a JSON object")
    current = {k: v for k, v in dataclasses.asdict(config).items() if k not in LOGGING_SETTINGS}
    differences = settings_differences({"training": {k: v for k, v in stored.items() if k in current}},
                                       {"training": current, "train_data_sha256": None, "eval_data_sha256": None})
    if differences and not allow_changed_settings:
        raise ValueError(f"cannot resume in {run_dir}: {'; '.join(differences)}; pass allow_changed_settings to continue")


class _Reporter:
    """The JSONL log plus an optional tensorboard / wandb sink (rank 0 only)."""

    def __init__(self, out_dir: str | None, report_to: str | None, resumed_step: int):
        self.path = os.path.join(out_dir, "metrics.jsonl") if out_dir else None
        self.sink = None
        if self.path:
            check_writable(self.path)  # never read nor rewritten through a link (causalqwen.rundir)
        if self.path and os.path.exists(self.path):  # drop what a resumed run will redo
            with open(self.path, encoding="utf-8") as handle:
                lines = handle.readlines()
            kept = []
            for number, line in enumerate(lines, start=1):
                if number == len(lines) and not line.endswith("\n"):
                    break  # the last line of a killed run, cut short while being written: it will be redone
                try:
                    if json.loads(line)["step"] <= resumed_step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{self.path}, line {number}: not a metrics record") from None
            with open_for_writing(self.path) as handle:
                handle.writelines(kept)
        if report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise ValueError("report_to='tensorboard' needs the tensorboard package (pip install tensorboard)") from error
            self.sink = SummaryWriter(log_dir=make_directory(os.path.join(out_dir or ".", "tensorboard"), root=out_dir))
        elif report_to == "wandb":
            try:
                import wandb
            except ImportError as error:
                raise ValueError("report_to='wandb' needs the wandb package (pip install wandb)") from error
            if out_dir:
                make_directory(os.path.join(out_dir, "wandb"), root=out_dir)  # where wandb writes, never a link
            self.sink = wandb.init(project="causalqwen", dir=out_dir)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step} | metrics
        if self.path:
            with open_for_writing(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        if self.sink is not None and hasattr(self.sink, "add_scalar"):
            for key, value in metrics.items():
                self.sink.add_scalar(key, value, step)
        elif self.sink is not None:
            self.sink.log(metrics, step=step)


def train(
    model,
    train_dataset: TextDataset,
    config: TrainingConfig,
    eval_batch: dict[str, torch.Tensor] | None = None,
    out_dir: str | os.PathLike | RunDirectory | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    allow_changed_settings: bool = False,
) -> list[dict]:
    """Train ``model`` in place; return the history (one dict of metrics per logged step).

    ``eval_batch`` is a collated held-out batch for the ``eval/*``/``dist/*`` metrics. With
    ``out_dir`` the run writes ``metrics.jsonl`` and checkpoints there (rank 0 only); the directory is
    claimed first (`causalqwen.rundir`: a new or empty directory, or a previous run with ``resume``
    or ``overwrite``; locked while the run lasts), unless a claimed `RunDirectory` is passed.

    ``resume`` continues from the newest checkpoint and refuses one whose model config, training
    settings (all of `TrainingConfig` but the logging intervals and ``report_to``) or data
    (SHA-256 of the tokenized texts) differ from this run's, naming each difference;
    ``allow_changed_settings`` continues anyway (the result is then no longer the uninterrupted run's).

    Under ``torchrun`` (an initialised process group) the model is wrapped in DDP, each process reads its
    shard of every global batch (``batch_size`` per process), and the loss is normalised over the
    global batch (`globally_normalized_loss`). Batches go to the device of the model's parameters.
    A non-finite loss or gradient stops the run with `TrainingDiverged` before the optimizer step.
    """
    rank = _rank()
    if not isinstance(config, TrainingConfig):
        raise TypeError(f"config must be a TrainingConfig, got {type(config).__name__}")
    scored = sum(int(len(train_dataset[i]["input_ids"]) >= 2) for i in range(len(train_dataset)))
    if scored == 0:
        raise ValueError(
            f"none of the {len(train_dataset)} training texts has two tokens: there is no next token to learn from"
        )
    run_dir, owned = None, False
    if isinstance(out_dir, RunDirectory):
        run_dir = out_dir
    elif out_dir is not None and rank == 0:
        run_dir, owned = RunDirectory.claim(out_dir, "train", resume=resume, overwrite=overwrite), True
    try:
        return _train(model, train_dataset, config, eval_batch, run_dir, os.fspath(out_dir) if out_dir is not None else None,
                      resume, progress, allow_changed_settings)
    finally:
        if owned:
            run_dir.release()


def _train(model, train_dataset, config, eval_batch, run_dir, out_dir, resume, progress, allow_changed_settings):
    settings = run_settings(config, train_dataset, eval_batch)
    checkpoint = latest_checkpoint(out_dir) if (resume and out_dir) else None
    if run_dir is not None and checkpoint is None:
        config_file = os.path.join(out_dir, "training_config.json")
        if resume and os.path.exists(config_file):
            _check_config_file(out_dir, config, allow_changed_settings)
            logger.warning("%s has no complete checkpoint yet: the resumed run starts at step 0", out_dir)
        with open_for_writing(config_file, root=out_dir) as handle:
            json.dump(dataclasses.asdict(config), handle, indent=2)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)

    set_trainable(model, config.preset)
    bound = None
    if config.max_u_divergence is not None:  # the base law of U is the model's as it is now (or at step 0, resumed)
        bound = DivergenceBound(model, config.max_u_divergence, config.preset, dual_lr=config.divergence_dual_lr)
    model.train()
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.learning_rate)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.warmup_steps, config.steps)
    eval_generator = torch.Generator().manual_seed(config.seed)  # the causal draws of the eval metrics
    step, history = 0, []
    if checkpoint is not None:
        step, history = _load_checkpoint(checkpoint, model, optimizer, scheduler, eval_generator, settings,
                                         allow_changed_settings, bound, config)
        logger.info("resumed from %s at step %d", checkpoint, step)
        if allow_changed_settings and run_dir is not None:
            with open_for_writing(os.path.join(out_dir, "training_config.json"), root=out_dir) as handle:
                json.dump(dataclasses.asdict(config), handle, indent=2)
    return _steps(model, train_dataset, config, eval_batch, out_dir, progress, optimizer, scheduler, eval_generator,
                  settings, step, history, bound)


def _forward_backward(trained, model, batch, trainable, config, step: int, first: bool, bound=None):
    """Loss (plus the bound's $\\mu \\bar D$) and gradients of one batch, clipped; `TrainingDiverged` (before any
    update) when they are not finite."""
    try:
        with bound.capturing_features() if bound is not None else contextlib.nullcontext():
            out = trained(**batch)
    except ValueError as error:
        if first:
            raise
        largest = max(float(p.detach().abs().max()) for p in trainable)
        raise TrainingDiverged(
            f"training diverged before step {step + 1}: the forward pass failed ({error}) after the parameters "
            f"grew to max |p| = {largest:.3g}; lower the learning rate (now {config.learning_rate:g})"
        ) from error
    loss = globally_normalized_loss(out, model.config) if _world_size() > 1 else out.loss
    if bound is not None:
        loss = loss + bound.penalty(out, batch)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
    if not bool(torch.isfinite(loss.detach()) & torch.isfinite(grad_norm)):  # one sync, before the update
        raise TrainingDiverged(
            f"training diverged at step {step + 1}: loss = {loss.item():g}, gradient norm = {float(grad_norm):g}; "
            f"lower the learning rate (now {config.learning_rate:g}); the parameters are those after step {step}"
        )
    return out, grad_norm


def _loader(train_dataset, config, rank: int, world: int) -> tuple[DistributedSampler, DataLoader]:
    """This process's shuffled share of the data in full batches (``config.seed`` fixes the order per epoch)."""
    sampler = DistributedSampler(train_dataset, num_replicas=world, rank=rank, shuffle=True, seed=config.seed, drop_last=True)
    loader = DataLoader(train_dataset, batch_size=config.batch_size, sampler=sampler, drop_last=True,
                        collate_fn=partial(collate, pad_token_id=train_dataset.pad_token_id))
    if len(loader) == 0:
        raise ValueError(
            f"the dataset has {len(train_dataset)} texts: too few for one batch of {config.batch_size} on {world} process(es)"
        )
    return sampler, loader


def _steps(model, train_dataset, config, eval_batch, out_dir, progress, optimizer, scheduler, eval_generator, settings,
           step: int, history: list, bound=None) -> list[dict]:
    """The optimisation steps from ``step`` on (the numbered list in the module docstring), then the model in eval mode."""
    rank, world = _rank(), _world_size()
    start_step = step
    trained = model
    if world > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    device = next(model.parameters()).device
    if eval_batch is not None:
        eval_batch = {key: value.to(device) for key, value in eval_batch.items()}
    sampler, loader = _loader(train_dataset, config, rank, world)
    batches_per_epoch = len(loader)
    trainable = [p for p in model.parameters() if p.requires_grad]
    reporter = _Reporter(out_dir, config.report_to, step) if rank == 0 else None
    bar = tqdm(total=config.steps, initial=step, disable=not progress or rank != 0, desc="training")

    while step < config.steps:
        epoch, offset = divmod(step, batches_per_epoch)
        sampler.set_epoch(epoch)
        for batch in loader:
            if offset:  # resuming mid-epoch: skip the batches already done
                offset -= 1
                continue
            batch = {key: value.to(device) for key, value in batch.items()}
            out, grad_norm = _forward_backward(trained, model, batch, trainable, config, step, step == start_step, bound)
            optimizer.step()
            scheduler.step()
            if bound is not None:
                bound.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            record = {}
            if step % config.log_every == 0 or step == config.steps:
                record |= training_metrics(model, out, batch) | {
                    "train/grad_norm": float(grad_norm),
                    "train/learning_rate": scheduler.get_last_lr()[0],
                }
                if bound is not None:
                    record |= bound.metrics()
            if eval_batch is not None and (step % config.eval_every == 0 or step == config.steps) and rank == 0:
                model.eval()
                metrics = evaluate_batch(model, eval_batch, generator=eval_generator)
                model.train()
                record |= with_log_prefixes(metrics)
            if record:
                record["step"] = step
                history.append(record)
                if reporter:
                    reporter.log(step, {k: v for k, v in record.items() if k != "step"})
                if "train/total_loss" in record:  # an eval-only step keeps the last training figures on the bar
                    bar.set_postfix(loss=f"{record['train/total_loss']:.3f}",
                                    acc=f"{record.get('train/accuracy', 0.0):.2f}", refresh=False)
            bar.update(1)
            if out_dir and rank == 0 and (step % config.save_every == 0 or step == config.steps):
                _check_finite_parameters(model, step, config)
                _save_checkpoint(out_dir, step, model, optimizer, scheduler, history, eval_generator, settings, bound)
            if step >= config.steps:
                break
    bar.close()
    _check_finite_parameters(model, step, config)  # what the caller saves as the trained model is finite
    model.eval()
    return history


def _check_finite_parameters(model, step: int, config) -> None:
    """`TrainingDiverged` naming the step and the first trainable parameter holding NaN or ±inf: run before a
    checkpoint is written and once when training ends (a model that `from_pretrained` refuses is never saved)."""
    named = [(name, p.detach()) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        return
    finite = torch.stack([torch.isfinite(p).all().to(named[0][1].device) for _, p in named])
    if bool(finite.all()):  # one sync
        return
    for (name, _), ok in zip(named, finite.tolist()):
        if not ok:
            raise TrainingDiverged(
                f"training diverged by step {step}: the parameter {name} holds NaN or ±inf values, so neither a "
                f"checkpoint nor the model is written; lower the learning rate (now {config.learning_rate:g}) or "
                f"the weight decay (now {config.weight_decay:g})"
            )
