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
import hashlib
import json
import logging
import math
import os

import safetensors
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..files.checkpoint import fsync_directory, fsync_tree, load_weights_strictly, value_problem
from ..files.checkpoint_directories import (
    CHECKPOINT_NAME,
    CHECKPOINT_RECORD,
    checkpoint_step,
    latest_checkpoint,
    record_checkpoint_files,
    remove_checkpoint,
    remove_killed_save,
    remove_old_checkpoints,
)
from ..files.rundir import (
    check_writable,
    check_write_targets,
    make_directory,
    open_for_writing,
)
from ..files.training_state import TRAINING_JSON, read_training_record, save_training_state
from ..integrations.auto import SAVED_ONLY_FIELDS
from ..integrations.lora import is_peft_model, restore_lora, save_lora

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
    "parameter_dtypes",
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

CONFIG_FILE = "training_config.json"
# Settings that change only what is logged or saved, not the trajectory of the parameters: a resumed run may
# change them freely. Every other field of TrainingConfig must match the checkpoint's.
LOGGING_SETTINGS = ("eval_every", "save_every", "log_every", "report_to", "save_total_limit")
BOUND_TENSORS = "divergence_reference.safetensors"
BOUND_JSON = "divergence_bound.json"
# Config fields that say where a model was saved from, not what it computes: a resume does not compare them.
_UNCOMPARED_CONFIG_FIELDS = ("transformers_version", "architectures", "_name_or_path", "dtype", *SAVED_ONLY_FIELDS)
_INIT_FIELDS = {"abduction_scale_init", "ovr_threshold", "ovr_threshold_init", "ovr_threshold_quantile"}


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


def parameter_dtypes(model) -> list[str]:
    """The dtypes of ``model``'s floating parameters as the run was given them (``["bfloat16"]`` for a bfloat16 run,
    whose float32 master weights are the run's own), sorted names: what `run_settings` records of the precision."""
    return sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})


def run_settings(config, train_dataset, eval_batch, dtypes: list[str] | None = None) -> dict:
    """What a checkpoint records of its run (``config``: its `causalqwen.training.TrainingConfig`) and a resume
    compares: the optimisation settings, the data and ``dtypes``, the `parameter_dtypes` it trains in."""
    return {
        "training": {k: v for k, v in dataclasses.asdict(config).items() if k not in LOGGING_SETTINGS},
        "train_data_sha256": fingerprint(train_dataset),
        "eval_data_sha256": fingerprint(eval_batch) if eval_batch is not None else None,
        "parameter_dtypes": dtypes,
    }


def settings_differences(saved: dict, current: dict) -> list[str]:
    """One line per setting that differs between a checkpoint's `run_settings` and this run's."""
    differences = []
    saved_fields, current_fields = saved.get("training", {}), current["training"]
    for name in sorted(set(saved_fields) | set(current_fields)):
        if saved_fields.get(name) != current_fields.get(name):
            differences.append(
                f"{name} is {saved_fields.get(name)!r} in the checkpoint, {current_fields.get(name)!r} now"
            )
    for key, what in (("train_data_sha256", "the training data"), ("eval_data_sha256", "the evaluation data")):
        if saved.get(key) != current[key]:
            differences.append(
                f"{what} differ (sha256 {str(saved.get(key))[:12]} in the checkpoint, {str(current[key])[:12]} now)"
            )
    saved_dtypes, dtypes = saved.get("parameter_dtypes"), current.get("parameter_dtypes")
    if saved_dtypes is not None and dtypes is not None and saved_dtypes != dtypes:  # a record before it had none
        differences.append(
            f"the parameters' dtype (--dtype) is {', '.join(saved_dtypes)} in the checkpoint, {', '.join(dtypes)} now"
        )
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
    differences = settings_differences(
        {"training": {k: v for k, v in stored.items() if k in current}},
        {"training": current, "train_data_sha256": None, "eval_data_sha256": None},
    )
    if differences and not allow_changed_settings:
        raise ValueError(
            f"cannot resume in {run_dir}: {'; '.join(differences)}; pass allow_changed_settings to continue"
        )


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
    if os.path.isdir(
        final
    ):  # this run's checkpoint of the same step is replaced; a directory someone else filled is not
        foreign = remove_checkpoint(final)
        if foreign:
            raise OSError(
                f"{final!r} holds {', '.join(foreign)}, which this run did not write; causalqwen never "
                f"deletes what it did not write, so the checkpoint of step {state.step} cannot be written: "
                "move that directory away and resume"
            )
    remove_killed_save(partial_dir)
    os.makedirs(partial_dir)
    if is_peft_model(state.model):  # the adapters and the trained causal modules, beside the base model's config
        save_lora(state.model, partial_dir)
        check_write_targets(partial_dir, ("config.json",), root=out_dir)
        state.model.get_base_model().config.save_pretrained(partial_dir)
    else:
        state.model.save_pretrained(partial_dir)  # config.json + model.safetensors
    save_training_state(
        partial_dir,
        step=state.step,
        optimizer=state.optimizer,
        scheduler=state.scheduler,
        eval_generator=state.eval_generator,
        settings=state.settings,
    )
    with open_for_writing(os.path.join(partial_dir, "history.json"), root=out_dir) as handle:
        json.dump(state.history, handle)
    if state.bound is not None:  # the base law of U (frozen at the run's start) and the multiplier
        check_write_targets(partial_dir, (BOUND_TENSORS,), root=out_dir)
        save_file(state.bound.base.state_dict(), os.path.join(partial_dir, BOUND_TENSORS))
        with open_for_writing(os.path.join(partial_dir, BOUND_JSON), root=out_dir) as handle:
            json.dump(
                {"multiplier": state.bound.multiplier, "last_divergence": state.bound.last_divergence},
                handle,
                allow_nan=False,
            )
    record_checkpoint_files(partial_dir, root=out_dir)  # last: what a later remove_checkpoint may remove
    fsync_tree(partial_dir)
    check_write_targets(final, (), root=out_dir)
    os.replace(partial_dir, final)  # atomic: a checkpoint-{step} directory is always complete
    fsync_directory(out_dir)
    remove_old_checkpoints(out_dir, state.config.save_total_limit)  # after the new one is complete
    return final


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
    differing = sorted(
        k for k in set(saved) | set(current) if k not in _UNCOMPARED_CONFIG_FIELDS and saved.get(k) != current.get(k)
    )
    if differing:
        hint = ""
        if set(differing) & _INIT_FIELDS:
            hint = (
                "; the run was converted with another initial scale or threshold: convert the same way again "
                "(the command line's --init, --abduction-scale-init, --ovr-threshold, --threshold-init as the "
                "run began; a run begun before decision D14 used what is now --init drafts)"
            )
        raise ValueError(f"cannot resume from {path}: its model config differs in {', '.join(differing)}{hint}")
    record = read_training_record(path)
    named_step = checkpoint_step(os.path.basename(os.path.normpath(path)))
    if named_step is not None and record["step"] != named_step:
        raise OSError(
            f"cannot resume from {path}: {os.path.join(path, TRAINING_JSON)!r} records step "
            f"{record['step']}, but its directory is checkpoint-{named_step}"
        )
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
        return dataclasses.replace(
            config, warmup_ratio=recorded.get("warmup_ratio"), **{name: recorded[name] for name in names}
        )
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
        logger.info(
            "no warm-up given: the resumed run keeps its own (%s)", ", ".join(f"{k}={v!r}" for k, v in warmup.items())
        )
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


def check_base_reference(reference, state: dict) -> None:
    """The tensors of a bound's base reference read back from a file, checked against ``reference`` (a
    `causalqwen.divergence.BaseLawOfU`): the same names and shapes, and `causalqwen.files.checkpoint.value_problem` for
    each (floating point, finite in the reference's own dtype: an integer tensor is never cast, a float64 1e300 never
    becomes inf); ``ValueError`` naming every tensor at fault, before anything is copied."""
    if reference.frozen is None:
        if state:
            raise ValueError(f"the adapter-disabled base holds no tensors; got {sorted(state)[:3]}...")
        return
    expected = reference.frozen.state_dict()
    if set(state) != set(expected):
        raise ValueError(
            f"the base reference holds {len(expected)} tensors {sorted(expected)[:3]}...; "
            f"got {len(state)} {sorted(state)[:3]}..."
        )
    problems = []
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            problems.append(
                f"{name} has shape {tuple(tensor.shape)}, the reference needs {tuple(expected[name].shape)}"
            )
        elif expected[name].dtype.is_floating_point:
            if (problem := value_problem(name, tensor, expected[name].dtype)) is not None:
                problems.append(problem)
        elif tensor.dtype != expected[name].dtype:
            problems.append(f"{name} is stored as {tensor.dtype}, the reference holds {expected[name].dtype}")
    if problems:
        raise ValueError("base reference tensors: " + "; ".join(problems))


def load_bound(path: str, bound) -> None:
    """The bound's base reference and multiplier from a checkpoint (`save_checkpoint`)."""
    tensors_file = os.path.join(path, BOUND_TENSORS)
    if not os.path.isfile(tensors_file):
        raise OSError(f"cannot resume from {path}: it has no {BOUND_TENSORS} (was it written with max_u_divergence?)")
    try:  # every tensor checked by name: shape, floating point, finite in the reference's dtype
        state = load_file(tensors_file)
        check_base_reference(bound.base, state)
        bound.base.load_state_dict(state)
    except (ValueError, safetensors.SafetensorError) as error:
        raise OSError(f"cannot resume from {path}: {tensors_file!r}: {error}") from error
    state = _read_json(os.path.join(path, BOUND_JSON), f"cannot resume from {path}")
    multiplier = state.get("multiplier") if isinstance(state, dict) else None
    if (
        isinstance(multiplier, bool)
        or not isinstance(multiplier, (int, float))
        or not math.isfinite(multiplier)
        or multiplier < 0
    ):
        raise OSError(f"cannot resume from {path}: {BOUND_JSON} holds no multiplier >= 0")
    last = state.get("last_divergence")
    if last is not None and (isinstance(last, bool) or not isinstance(last, (int, float)) or not math.isfinite(last)):
        raise OSError(
            f"cannot resume from {path}: {BOUND_JSON} holds last_divergence {last!r}, not a finite number or null"
        )
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
    ``None``: none) can be imported. Nothing is created: `causalqwen.train` and ``causalqwen train``
    call it before they claim the output directory."""
    try:
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401 -- imports tensorboard
        elif report_to == "wandb":
            import wandb  # noqa: F401
    except ImportError as error:
        raise ValueError(
            f"report_to={report_to!r} needs the {report_to} package (pip install {report_to}): {error}"
        ) from error


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
    shown = " ".join(
        f"{key}={format(value, '.6g') if isinstance(value, (int, float)) else value}"
        for key, value in metrics.items()
        if key.startswith(EVAL_PREFIXES)
    )
    return f"eval step {step}: {shown}"
