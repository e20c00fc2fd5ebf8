r"""A training run on disk: its checkpoints, the checks of a resume, its metrics log.

The loop of `causalqwen.training` writes, in its output directory (claimed by `causalqwen.files.rundir`):

- ``training_config.json``: the `TrainingConfig` of the run (`write_config_file`);
- ``metrics.jsonl``: one JSON record per logged step, plus an optional tensorboard / wandb sink (`MetricsLog`);
- ``checkpoint-{step}/`` (`save_checkpoint`; with ``save_total_limit`` only the newest ones are kept,
  `remove_old_checkpoints`): the model (``save_pretrained``: safetensors; for a LoRA run the
  adapters and the base's config), the optimizer's tensors and every RNG state (``training_state.safetensors``,
  `causalqwen.files.training_state`), the scheduler, the optimizer's groups and the run's settings and data
  fingerprints (``trainer_state.json``, `run_settings`), the history (``history.json``) and, with a bound on
  how far $U$ moves, the bound's base law of $U$ and multiplier. Nothing in it is a pickle. It is written under
  a temporary name, fsynced and renamed, so a directory with that name is always complete.

A resume reads the newest one (`latest_checkpoint`) after checking that the model config, the settings and the
data are the ones it was written with (`check_checkpoint`); every tensor is checked as it is loaded
(`load_model_weights`, `load_bound`, `causalqwen.files.training_state.load_training_state`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import math
import os
import re
import stat

import safetensors
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..integrations.auto import SAVED_ONLY_FIELDS
from ..integrations.lora import is_peft_model, restore_lora, save_lora
from .checkpoint import fsync_directory, fsync_tree, load_weights_strictly
from .rundir import (
    check_not_link,
    check_writable,
    check_write_targets,
    make_directory,
    open_for_writing,
)
from .training_state import TRAINING_JSON, read_training_record, save_training_state

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_RECORD",
    "CONFIG_FILE",
    "LOGGING_SETTINGS",
    "BOUND_TENSORS",
    "BOUND_JSON",
    "checkpoint_step",
    "latest_checkpoint",
    "remove_old_checkpoints",
    "remove_checkpoint",
    "record_checkpoint_files",
    "fingerprint",
    "run_settings",
    "settings_differences",
    "write_config_file",
    "check_config_file",
    "save_checkpoint",
    "check_checkpoint",
    "recorded_config",
    "with_recorded_warmup",
    "load_model_weights",
    "load_bound",
    "read_history",
    "check_report_to",
    "MetricsLog",
    "eval_line",
]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"checkpoint-([1-9][0-9]*)", re.ASCII)  # exactly the names save_checkpoint writes
_STEP_LIKE_NAME = re.compile(r"checkpoint-(\d+)")  # any digits, Unicode ones included: what a person may mistake for one
CONFIG_FILE = "training_config.json"
# The files save_checkpoint wrote into a checkpoint, with their sizes and SHA-256: what remove_checkpoint may remove.
CHECKPOINT_RECORD = "checkpoint_files.json"
# What a checkpoint's save writes (shell patterns): a killed save's leftover ``checkpoint-N.partial`` holds no record
# yet, so these names are what may be removed from it.
_CHECKPOINT_FILES = ("config.json", "generation_config.json", "causalqwen_auto.py", "model.safetensors",
                     "model-*.safetensors", "model.safetensors.index.json", "adapter_config.json",
                     "adapter_model.safetensors", "README.md", "training_state.safetensors", "trainer_state.json",
                     "history.json", "divergence_reference.safetensors", "divergence_bound.json", CHECKPOINT_RECORD)
# Settings that change only what is logged or saved, not the trajectory of the parameters: a resumed run may
# change them freely. Every other field of TrainingConfig must match the checkpoint's.
LOGGING_SETTINGS = ("eval_every", "save_every", "log_every", "report_to", "save_total_limit")
BOUND_TENSORS = "divergence_reference.safetensors"
BOUND_JSON = "divergence_bound.json"
# Config fields that say where a model was saved from, not what it computes: a resume does not compare them.
_UNCOMPARED_CONFIG_FIELDS = ("transformers_version", "architectures", "_name_or_path", "dtype", *SAVED_ONLY_FIELDS)
_INIT_FIELDS = {"abduction_scale_init", "ovr_threshold", "ovr_threshold_init", "ovr_threshold_quantile"}


# =============================================================================================
# Which checkpoints there are
# =============================================================================================


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


def remove_old_checkpoints(out_dir: str, keep: int | None) -> list[str]:
    """Remove all but the newest ``keep`` checkpoints the run in ``out_dir`` wrote (``keep`` None or 0: keep all, as
    transformers' ``save_total_limit``); return the paths removed, oldest first.

    A checkpoint of the run is an entry named as `save_checkpoint` names one (`CHECKPOINT_NAME`) that is a real
    directory, not a link, holding a ``trainer_state.json`` (a regular file) that records the step its name says.
    Anything else -- a link named ``checkpoint-7``, a file, a directory the run did not write -- is neither
    counted nor removed. An old checkpoint is removed by `remove_checkpoint`, file by file, only when it holds
    nothing but what its `CHECKPOINT_RECORD` lists; one that holds anything else (a user's notes, a
    subdirectory, a link, a file that replaced one of the run's) is kept whole, with a warning naming what the
    run did not write."""
    if not keep:
        return []
    ours = []
    for name in os.listdir(out_dir):
        path, step = os.path.join(out_dir, name), checkpoint_step(name)
        record_file = os.path.join(path, TRAINING_JSON)
        if step is None or os.path.islink(path) or not os.path.isdir(path) or os.path.islink(record_file):
            continue
        try:
            if read_training_record(path)["step"] == step:
                ours.append((step, name))
        except OSError:
            continue
    removed = []
    for _, name in sorted(ours)[:-keep]:
        path = os.path.join(out_dir, name)
        foreign = remove_checkpoint(path)
        if foreign:
            logger.warning("save_total_limit: %s is kept: it holds %s, which this run did not write; causalqwen never "
                           "deletes what it did not write (move those out, or remove the checkpoint yourself)",
                           path, ", ".join(foreign))
            continue
        removed.append(path)
    return removed


def _sha256(path: str) -> str:
    """SHA-256 of the regular file ``path``, opened without following a link."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(descriptor, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def record_checkpoint_files(directory: str, *, root: str | None = None) -> None:
    """Write `CHECKPOINT_RECORD` into the checkpoint ``directory`` (after everything else of it): the name, size and
    SHA-256 of every file in it, which is what `remove_checkpoint` may remove later. Every entry must be a regular
    file (``OSError`` naming it otherwise: a checkpoint being written holds nothing else)."""
    files = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(f"{path!r} is not a regular file; a checkpoint being written holds only the files it writes")
        files[name] = {"size": status.st_size, "sha256": _sha256(path)}
    with open_for_writing(os.path.join(directory, CHECKPOINT_RECORD), root=root) as handle:
        json.dump({"files": files}, handle, indent=1, sort_keys=True)


def _recorded_files(directory: str) -> dict | None:
    """``{name: {"size", "sha256"}}`` of the checkpoint's `CHECKPOINT_RECORD`; None when it has none that reads
    as one (missing, a link, not a regular file, not such a JSON object)."""
    path = os.path.join(directory, CHECKPOINT_RECORD)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, encoding="utf-8") as handle:
            files = json.load(handle).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
            for entry in files.values()):
        return None
    return files


def _written_by_the_run(entry: os.DirEntry, recorded: dict) -> bool:
    """Whether ``entry`` of a checkpoint is a file the run recorded: a regular file (never a link, whatever it points
    to), with a recorded name, of the recorded size and SHA-256."""
    if entry.name not in recorded or not entry.is_file(follow_symlinks=False):
        return False
    wanted = recorded[entry.name]
    return entry.stat(follow_symlinks=False).st_size == wanted["size"] and _sha256(entry.path) == wanted["sha256"]


def remove_checkpoint(path: str) -> list[str]:
    """Remove the checkpoint directory ``path`` if it holds exactly what the run wrote into it, and return ``[]``;
    otherwise remove nothing and return the names of the entries the run did not write, sorted.

    What the run wrote is what its `CHECKPOINT_RECORD` lists (`record_checkpoint_files`): a regular file of
    that name, size and SHA-256. So a user's note, a subdirectory, a symbolic link (never followed: what it
    points to is not read) and a file that took the place of one of the run's (a user's own ``model.safetensors``)
    are not the run's, and the checkpoint stays whole. A checkpoint without a readable record (written by a
    causalqwen before the record existed) has nothing known to be the run's: every entry is returned. The files
    are removed one by one, then the record, then the directory, which the operating system removes only if it
    is then empty (an entry added meanwhile stays, with the directory: its name is returned). ``path`` itself
    must be a real directory (a link or a file is an ``OSError`` naming it, and stays)."""
    check_not_link(path)
    if not os.path.isdir(path):
        raise OSError(f"{path!r} is not a directory: a checkpoint is a directory the run writes")
    recorded = _recorded_files(path)
    if recorded is None:
        return sorted(os.listdir(path))
    ours, foreign = [], []
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name == CHECKPOINT_RECORD:
                continue
            (ours if _written_by_the_run(entry, recorded) else foreign).append(entry)
    if foreign:
        return sorted(entry.name for entry in foreign)
    for entry in ours:
        os.unlink(entry.path)
    os.unlink(os.path.join(path, CHECKPOINT_RECORD))
    try:
        os.rmdir(path)
    except OSError:  # an entry appeared since the scan: it stays, and so does the directory
        return sorted(os.listdir(path))
    return []


# =============================================================================================
# What a run records of itself: settings and data
# =============================================================================================


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


def run_settings(config, train_dataset, eval_batch) -> dict:
    """What a checkpoint records of its run (``config``: its `causalqwen.training.TrainingConfig`) and a resume
    compares: the optimisation settings and the data."""
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


def write_config_file(out_dir: str, config) -> None:
    """``training_config.json``: every field of the run's `causalqwen.training.TrainingConfig`."""
    with open_for_writing(os.path.join(out_dir, CONFIG_FILE), root=out_dir) as handle:
        json.dump(dataclasses.asdict(config), handle, indent=2)


def check_config_file(run_dir: str, config, allow_changed_settings: bool) -> None:
    """A resumed run that has no checkpoint yet compares its settings with the run's ``training_config.json``."""
    stored = _read_json(os.path.join(run_dir, CONFIG_FILE), f"cannot resume in {run_dir}")
    if not isinstance(stored, dict):
        raise OSError(f"cannot resume in {run_dir}: training_config.json is not a JSON object")
    current = {k: v for k, v in dataclasses.asdict(config).items() if k not in LOGGING_SETTINGS}
    differences = settings_differences({"training": {k: v for k, v in stored.items() if k in current}},
                                       {"training": current, "train_data_sha256": None, "eval_data_sha256": None})
    if differences and not allow_changed_settings:
        raise ValueError(f"cannot resume in {run_dir}: {'; '.join(differences)}; pass allow_changed_settings to continue")


def _read_json(file: str, context: str):
    """The JSON in ``file``; an ``OSError`` that starts with ``context`` and names the file otherwise."""
    try:
        with open(file, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise OSError(f"{context}: {file} cannot be read: {error}") from error


# =============================================================================================
# Writing a checkpoint
# =============================================================================================


def save_checkpoint(out_dir: str, state) -> str:
    """Write ``checkpoint-{state.step}`` under a temporary name, fsync it, and rename it into place; return its path.
    Then only the newest ``state.config.save_total_limit`` checkpoints of the run are kept (`remove_old_checkpoints`).

    ``state`` is the loop's `causalqwen.training.TrainingState`: the model, the optimizer, the scheduler, the
    generator of the eval metrics, the run's settings, the bound (or None) and the history."""
    final = os.path.join(out_dir, f"checkpoint-{state.step}")
    partial_dir = final + ".partial"
    for directory in (partial_dir, final):  # a link is never followed, emptied nor replaced: it is not ours
        check_write_targets(directory, (), root=out_dir)
    if os.path.isdir(final):  # this run's checkpoint of the same step is replaced; a directory someone else filled is not
        foreign = remove_checkpoint(final)
        if foreign:
            raise OSError(f"{final!r} holds {', '.join(foreign)}, which this run did not write; causalqwen never "
                          f"deletes what it did not write, so the checkpoint of step {state.step} cannot be written: "
                          "move that directory away and resume")
    _remove_killed_save(partial_dir)
    os.makedirs(partial_dir)
    if is_peft_model(state.model):  # the adapters and the trained causal modules, beside the base model's config
        save_lora(state.model, partial_dir)
        check_write_targets(partial_dir, ("config.json",), root=out_dir)
        state.model.get_base_model().config.save_pretrained(partial_dir)
    else:
        state.model.save_pretrained(partial_dir)  # config.json + model.safetensors
    save_training_state(partial_dir, step=state.step, optimizer=state.optimizer, scheduler=state.scheduler,
                        eval_generator=state.eval_generator, settings=state.settings)
    with open_for_writing(os.path.join(partial_dir, "history.json"), root=out_dir) as handle:
        json.dump(state.history, handle)
    if state.bound is not None:  # the base law of U (frozen at the run's start) and the multiplier
        check_write_targets(partial_dir, (BOUND_TENSORS,), root=out_dir)
        save_file(state.bound.base.state_dict(), os.path.join(partial_dir, BOUND_TENSORS))
        with open_for_writing(os.path.join(partial_dir, BOUND_JSON), root=out_dir) as handle:
            json.dump({"multiplier": state.bound.multiplier, "last_divergence": state.bound.last_divergence}, handle,
                      allow_nan=False)
    record_checkpoint_files(partial_dir, root=out_dir)  # last: what a later remove_checkpoint may remove
    fsync_tree(partial_dir)
    check_write_targets(final, (), root=out_dir)
    os.replace(partial_dir, final)  # atomic: a checkpoint-{step} directory is always complete
    fsync_directory(out_dir)
    remove_old_checkpoints(out_dir, state.config.save_total_limit)  # after the new one is complete
    return final


def _remove_killed_save(partial_dir: str) -> None:
    """Remove ``checkpoint-N.partial``, the leftover of a save killed before its rename, if there is one. It has no
    `CHECKPOINT_RECORD` yet, so what may go is what a checkpoint's save writes (regular files named as in
    `_CHECKPOINT_FILES`); anything else in it is an ``OSError`` naming it, and nothing is removed."""
    if not os.path.isdir(partial_dir):
        return
    with os.scandir(partial_dir) as scan:
        entries = list(scan)
    foreign = sorted(entry.name for entry in entries if not entry.is_file(follow_symlinks=False)
                     or not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in _CHECKPOINT_FILES))
    if foreign:
        raise OSError(f"{partial_dir!r} holds {', '.join(foreign)}, which a checkpoint's save does not write; causalqwen "
                      "never deletes what it did not write: move those out of it")
    for entry in entries:
        os.unlink(entry.path)
    os.rmdir(partial_dir)


# =============================================================================================
# Reading one back (the resume)
# =============================================================================================


def check_checkpoint(path: str, model, settings: dict, allow_changed_settings: bool) -> tuple[dict, list[str]]:
    """The ``trainer_state.json`` record of the checkpoint ``path`` and the settings in which it differs from this
    run's (`settings_differences`), after checking that the model config is ``model``'s (``ValueError``), that
    the record is one this version writes, for the step its directory names (``OSError``), and that the settings
    and data are this run's (``ValueError``, unless ``allow_changed_settings``: then a warning)."""
    saved = type(model.config).from_pretrained(path).to_dict()
    current = model.config.to_dict()
    differing = sorted(k for k in set(saved) | set(current)
                       if k not in _UNCOMPARED_CONFIG_FIELDS and saved.get(k) != current.get(k))
    if differing:
        hint = ""
        if set(differing) & _INIT_FIELDS:
            hint = ("; the run was converted with another initial scale or threshold: convert the same way again "
                    "(the command line's --init, --abduction-scale-init, --ovr-threshold, --threshold-init as the "
                    "run began; a run begun before decision D14 used what is now --init drafts)")
        raise ValueError(f"cannot resume from {path}: its model config differs in {', '.join(differing)}{hint}")
    record = read_training_record(path)
    named_step = checkpoint_step(os.path.basename(os.path.normpath(path)))
    if named_step is not None and record["step"] != named_step:
        raise OSError(f"cannot resume from {path}: {os.path.join(path, TRAINING_JSON)!r} records step "
                      f"{record['step']}, but its directory is checkpoint-{named_step}")
    differences = settings_differences(record.get("settings") or {}, settings)
    if differences and not allow_changed_settings:
        raise ValueError(
            f"cannot resume from {path}: {'; '.join(differences)}. Resume with the same settings and data, or pass "
            "allow_changed_settings (--allow-changed-settings) to continue anyway (no longer bit-exact)"
        )
    if differences:
        logger.warning("resuming from %s with changed settings: %s", path, "; ".join(differences))
    return record, differences


def recorded_config(record: dict, path: str, config):
    """This run's config with the optimisation settings the checkpoint ``path`` records (those its trainer state
    follows)."""
    json_file = os.path.join(path, TRAINING_JSON)
    recorded = (record.get("settings") or {}).get("training")
    names = ("learning_rate", "weight_decay", "warmup_steps", "steps")
    if not isinstance(recorded, dict) or any(name not in recorded for name in names):
        raise OSError(f"{json_file!r}: settings.training must record {', '.join(names)}, got {recorded!r}")
    try:  # a record written before warmup_ratio existed has none: its warmup_steps is the warm-up
        return dataclasses.replace(config, warmup_ratio=recorded.get("warmup_ratio"),
                                   **{name: recorded[name] for name in names})
    except (TypeError, ValueError) as error:
        raise OSError(f"{json_file!r}: settings.training is not a valid training config: {error}") from error


def with_recorded_warmup(config, run_dir: str, checkpoint: str | None):
    """``config`` for a resumed run: when it gives neither ``warmup_steps`` nor ``warmup_ratio`` (a
    `causalqwen.training.TrainingConfig`), the warm-up the run recorded -- its newest ``checkpoint``'s settings,
    else its ``training_config.json`` -- so that a run continues with its own warm-up (one begun before
    ``warmup_ratio`` existed has ``warmup_steps``, e.g. the command line's old default 50, and no ratio)."""
    if config.warmup_steps is not None or config.warmup_ratio is not None:
        return config
    if checkpoint is not None:
        file = os.path.join(checkpoint, TRAINING_JSON)
        recorded = (read_training_record(checkpoint).get("settings") or {}).get("training")
    else:
        file = os.path.join(run_dir, CONFIG_FILE)
        recorded = _read_json(file, f"cannot resume in {run_dir}") if os.path.isfile(file) else None
    if not isinstance(recorded, dict):
        return config  # nothing recorded: the comparison of the settings names what is missing
    warmup = {name: recorded.get(name) for name in ("warmup_steps", "warmup_ratio")}
    try:
        adopted = dataclasses.replace(config, **warmup)
    except (TypeError, ValueError) as error:
        raise OSError(f"cannot resume: {file!r} records a warm-up that is not a valid setting: {error}") from error
    if adopted != config:
        logger.info("no warm-up given: the resumed run keeps its own (%s)", ", ".join(f"{k}={v!r}" for k, v in warmup.items()))
    return adopted


def load_model_weights(path: str, model) -> None:
    """The checkpoint's weights into ``model`` in place, strictly (a LoRA run's adapters: `restore_lora`)."""
    try:
        if is_peft_model(model):
            restore_lora(model, path)
        else:
            load_weights_strictly(model, os.path.join(path, "model.safetensors"))
    except (OSError, ValueError) as error:
        raise OSError(f"cannot resume from {path}: {error}") from error


def load_bound(path: str, bound) -> None:
    """The bound's base reference and multiplier from a checkpoint (`save_checkpoint`)."""
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


def read_history(path: str) -> list[dict]:
    """The history (one dict of metrics per logged step) a checkpoint holds."""
    history_file = os.path.join(path, "history.json")
    history = _read_json(history_file, f"cannot resume from {path}")
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise OSError(f"cannot resume from {path}: {history_file} is not a list of records")
    return history


# =============================================================================================
# The metrics log
# =============================================================================================


def check_report_to(report_to: str | None) -> None:
    """A ``ValueError`` naming the package unless the sink ``report_to`` names (``"tensorboard"``, ``"wandb"``;
    ``None``: none) can be imported. Nothing is created: `causalqwen.training.train` and ``causalqwen train``
    call it before they claim the output directory."""
    try:
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401 -- imports tensorboard
        elif report_to == "wandb":
            import wandb  # noqa: F401
    except ImportError as error:
        raise ValueError(f"report_to={report_to!r} needs the {report_to} package (pip install {report_to}): "
                         f"{error}") from error


class MetricsLog:
    """The JSONL log plus an optional tensorboard / wandb sink (rank 0 only).

    A resumed run first drops the records after ``resumed_step`` (it redoes those steps), and the last line of a
    killed run if it was cut short while being written. With ``print_eval`` each record holding eval metrics is
    also printed, one line (`eval_line`), above the progress bar."""

    def __init__(self, out_dir: str | None, report_to: str | None, resumed_step: int, *, print_eval: bool = False):
        self.path = os.path.join(out_dir, "metrics.jsonl") if out_dir else None
        self.sink = None
        self.print_eval = print_eval
        if self.path:
            check_writable(self.path)  # never read nor rewritten through a link (causalqwen.files.rundir)
        if self.path and os.path.exists(self.path):  # drop what a resumed run will redo
            self._keep_records_until(resumed_step)
        check_report_to(report_to)
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.sink = SummaryWriter(log_dir=make_directory(os.path.join(out_dir or ".", "tensorboard"), root=out_dir))
        elif report_to == "wandb":
            import wandb

            if out_dir:
                make_directory(os.path.join(out_dir, "wandb"), root=out_dir)  # where wandb writes, never a link
            self.sink = wandb.init(project="causalqwen", dir=out_dir)

    def _keep_records_until(self, resumed_step: int) -> None:
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
        if self.print_eval and any(key.startswith(EVAL_PREFIXES) for key in metrics):
            tqdm.write(eval_line(step, metrics))


EVAL_PREFIXES = ("eval/", "dist/")  # the metrics of the held-out set (`causalqwen.metrics.with_log_prefixes`)


def eval_line(step: int, metrics: dict) -> str:
    """The line that shows the eval metrics of a logged record: ``eval step 40: eval/loss=2.31547 ...``, each
    ``eval/*`` and ``dist/*`` value as in ``metrics.jsonl``, to 6 significant digits (``format(value, ".6g")``)."""
    shown = " ".join(f"{key}={format(value, '.6g') if isinstance(value, (int, float)) else value}"
                     for key, value in metrics.items() if key.startswith(EVAL_PREFIXES))
    return f"eval step {step}: {shown}"
