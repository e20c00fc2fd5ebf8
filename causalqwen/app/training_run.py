r"""A training run: the steps of `causalqwen.training` in a loop, with its data, evaluation, checkpoints and resume.

1. take the next batch: the order is a function of ``(seed, epoch)`` alone (a ``DistributedSampler``
   reshuffled with ``set_epoch``), so a resumed run sees exactly the batches it would have seen;
2. one step (`causalqwen.training.loss_and_gradients`, AdamW, the schedule, the bound's dual ascent);
3. every ``eval_every`` steps: the ``eval/*`` and ``dist/*`` metrics (`causalqwen.metrics`) on the
   held-out set; every ``save_every`` steps: a checkpoint.

A checkpoint ``checkpoint-{step}/`` holds the model, the optimizer, the scheduler, every RNG state, the run's
settings and data fingerprints and the history, without pickle, written atomically
(`causalqwen.app.runs.save_checkpoint`). ``resume=True`` continues from the newest one, after checking that the
model config, the settings and the data are the ones it was written with (`causalqwen.app.runs.check_checkpoint`),
and ends with exactly the parameters of an uninterrupted run (on CPU: bit for bit).
"""

from __future__ import annotations

import json
import logging
import os
import random
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm

from ..checks.values import TrainingDiverged, check_finite_parameters
from ..divergence import DivergenceBound
from ..files.data import TextDataset, collate
from ..files.rundir import RunDirectory
from ..files.training_state import load_training_state
from ..files.written_files import files_changed_since, files_state, record_checkpoint_files
from ..kernels.mixed_precision import autocast_in, check_trainable_dtypes, float32_master_weights
from ..metrics import evaluate_batch, evaluate_texts, training_metrics, with_log_prefixes
from ..training import (
    TrainingConfig,
    TrainingState,
    check_preset,
    distributed_rank,
    distributed_world_size,
    loss_and_gradients,
    optimizer_and_schedule,
    set_trainable,
)
from . import runs

__all__ = ["check_training_inputs", "train", "save_trained_model", "TrainingDiverged"]

logger = logging.getLogger(__name__)


def check_training_inputs(model, train_dataset: TextDataset, config: TrainingConfig) -> None:
    """Every check of `train`'s inputs that needs no output directory, so that a run refused for its inputs claims
    and writes nothing: ``config`` a `TrainingConfig`, a training text with two tokens, one full batch for each
    process, the preset fitting the model (`set_trainable`) and the package ``report_to`` names installed.
    ``causalqwen train`` calls it before it claims ``--out``."""
    if not isinstance(config, TrainingConfig):
        raise TypeError(f"config must be a TrainingConfig, got {type(config).__name__}")
    check_trainable_dtypes(model)
    scored = sum(int(len(train_dataset[i]["input_ids"]) >= 2) for i in range(len(train_dataset)))
    if scored == 0:
        raise ValueError(
            f"none of the {len(train_dataset)} training texts has two tokens: there is no next token to learn from"
        )
    _loader(
        train_dataset, config, distributed_rank(), distributed_world_size()
    )  # ValueError: too few texts for one batch
    check_preset(model, config.preset)
    runs.check_report_to(config.report_to)


def train(
    model,
    train_dataset: TextDataset,
    config: TrainingConfig,
    eval_batch: dict[str, torch.Tensor] | None = None,
    out_dir: str | os.PathLike | RunDirectory | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    allow_changed_settings: bool = False,
    print_eval: bool = False,
    eval_texts: tuple | None = None,
) -> list[dict]:
    """Train ``model`` in place; return the history (one dict of metrics per logged step).

    ``eval_batch`` is a collated held-out batch for the ``eval/*``/``dist/*`` metrics; ``eval_texts``, a pair
    ``(tokenizer, texts)`` of the held-out texts, adds ``eval/bits_per_byte`` beside them (`evaluate_texts`: each
    text scored whole, numbers as written). With
    ``out_dir`` the run writes ``metrics.jsonl`` and checkpoints there (rank 0 only); the directory is
    claimed first (`causalqwen.files.rundir`: a new or empty directory, or a previous run with ``resume``
    or ``overwrite``; locked while the run lasts), unless a claimed `RunDirectory` is passed.

    ``resume`` continues from the newest checkpoint and refuses one whose model config, training
    settings (all of `TrainingConfig` but the logging intervals and ``report_to``), parameter dtypes (a bfloat16 run
    resumed in float32) or data (SHA-256 of the tokenized texts) differ from this run's, naming each difference;
    ``allow_changed_settings`` continues anyway (the result is then no longer the uninterrupted run's). A resumed
    config that gives no warm-up takes the run's own (`causalqwen.app.runs.with_recorded_warmup`).
    ``print_eval`` prints a line of eval metrics each time they are computed (`causalqwen.app.runs.eval_line`).

    Under ``torchrun`` (an initialised process group) the model is wrapped in DDP, each process reads its
    shard of every global batch (``batch_size`` per process), and the loss is normalised over the
    global batch (`globally_normalized_loss`). Batches go to the device of the model's parameters.
    A non-finite loss or gradient stops the run with `TrainingDiverged` before the optimizer step.
    """
    rank = distributed_rank()
    check_training_inputs(model, train_dataset, config)  # before the directory is claimed: a refused run writes nothing
    run_dir, owned = None, False
    if isinstance(out_dir, RunDirectory):
        run_dir = out_dir
    elif out_dir is not None and rank == 0:
        run_dir, owned = RunDirectory.claim(out_dir, "train", resume=resume, overwrite=overwrite), True
    try:
        out_dir = os.fspath(out_dir) if out_dir is not None else None
        set_trainable(model, config.preset)
        dtypes = runs.parameter_dtypes(model)  # as given: a bfloat16 run's float32 master weights are its own
        with float32_master_weights(model) as autocast_dtype:
            state = _start(
                model,
                train_dataset,
                config,
                eval_batch,
                out_dir,
                dtypes=dtypes,
                writes=run_dir is not None,
                resume=resume,
                allow_changed_settings=allow_changed_settings,
            )
            state.autocast_dtype = autocast_dtype
            return _steps(state, train_dataset, eval_batch, out_dir, progress, print_eval, eval_texts=eval_texts)
    finally:
        if owned:
            run_dir.release()


def save_trained_model(out: str, model, tokenizer, *, lora: bool = False) -> list[tuple[str, str]]:
    """``model/`` (model and tokenizer) in the run directory ``out``; for a LoRA run first the adapters
    (``adapter/``), then the model with them merged in. Each directory ends with the record of the files this save
    wrote (`causalqwen.files.written_files`), all that a later ``overwrite`` may remove from it. Returns ``(what,
    path)`` of each directory written."""
    from ..integrations.lora import merge_lora, save_lora

    written = []
    directories = (("LoRA adapters", "adapter"),) if lora else ()
    for what, name in directories + (("trained model", "model"),):
        directory = os.path.join(out, name)
        before = files_state(directory)
        if name == "adapter":
            save_lora(model, directory)
            model = merge_lora(model)
        else:
            model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
        record_checkpoint_files(directory, root=out, written=files_changed_since(directory, before))
        written.append((what, directory))
    return written


def _start(
    model,
    train_dataset,
    config,
    eval_batch,
    out_dir,
    *,
    dtypes: list[str],
    writes: bool,
    resume: bool,
    allow_changed_settings: bool,
) -> TrainingState:
    """The state at the run's first step: seeds, trainable parameters, the bound, AdamW and its schedule, then
    (``resume``) the newest checkpoint's. ``dtypes``: the run's `causalqwen.app.runs.parameter_dtypes`, recorded
    with its settings; ``writes``: this process writes ``training_config.json``."""
    checkpoint = runs.latest_checkpoint(out_dir) if (resume and out_dir) else None
    if resume and out_dir:  # a warm-up not given is the run's own
        config = runs.with_recorded_warmup(config, out_dir, checkpoint)
    settings = runs.run_settings(config, train_dataset, eval_batch, dtypes)
    if writes and checkpoint is None:
        if resume and os.path.exists(os.path.join(out_dir, runs.CONFIG_FILE)):
            runs.check_config_file(out_dir, config, allow_changed_settings)
            logger.warning("%s has no complete checkpoint yet: the resumed run starts at step 0", out_dir)
        runs.write_config_file(out_dir, config)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)

    set_trainable(model, config.preset)
    bound = None
    if config.max_u_divergence is not None:  # the base law of U is the model's as it is now (or at step 0, resumed)
        bound = DivergenceBound(model, config.max_u_divergence, config.preset, dual_lr=config.divergence_dual_lr)
    model.train()
    optimizer, scheduler = optimizer_and_schedule(model, config)
    eval_generator = torch.Generator().manual_seed(config.seed)
    state = TrainingState(model, config, optimizer, scheduler, eval_generator, settings, bound)
    if checkpoint is not None:
        _resume(checkpoint, state, allow_changed_settings)
        logger.info("resumed from %s at step %d", checkpoint, state.step)
        if allow_changed_settings and writes:
            runs.write_config_file(out_dir, config)
    if writes:
        _check_checkpoint_names_free(out_dir, config, state.step)
    return state


def _check_checkpoint_names_free(out_dir: str, config: TrainingConfig, step: int) -> None:
    """A ``ValueError`` before the first step when a ``checkpoint-N`` the run will write is already there (a directory
    that ``--overwrite`` kept because the run had not recorded writing it): the run would fail at step N."""
    planned = [n for n in range(step + 1, config.steps + 1) if n % config.save_every == 0 or n == config.steps]
    taken = [f"checkpoint-{n}" for n in planned if os.path.lexists(os.path.join(out_dir, f"checkpoint-{n}"))]
    if taken:
        raise ValueError(
            f"{out_dir} already holds {', '.join(taken)}, which this run would write (kept: the run did not record "
            "writing what is there); move it away, or choose another --out"
        )


def _resume(path: str, state: TrainingState, allow_changed_settings: bool) -> None:
    """Restore the checkpoint ``path`` into ``state`` strictly: the model config, the run's settings and data
    (`causalqwen.app.runs.check_checkpoint`), then every tensor as it is loaded."""
    record, differences = runs.check_checkpoint(path, state.model, state.settings, allow_changed_settings)
    runs.load_model_weights(path, state.model)
    # The record's numbers must be those the run it names would have saved at its step: its own settings (this
    # run's, unless changed settings are allowed) give every optimizer and scheduler value but the moments.
    recorded = runs.recorded_config(record, path, state.config) if differences else state.config
    load_training_state(
        path,
        optimizer=state.optimizer,
        scheduler=state.scheduler,
        eval_generator=state.eval_generator,
        record=record,
        expected=_expected_training_state(state.model, recorded, record["step"]),
    )
    if differences:  # allowed: from here on the optimizer follows this run's settings
        current = _expected_training_state(state.model, state.config, record["step"])
        for group, wanted in zip(state.optimizer.param_groups, current["optimizer_param_groups"]):
            group.update({key: wanted[key] for key in ("lr", "initial_lr", "weight_decay")})
        state.scheduler.load_state_dict(
            state.scheduler.state_dict()
            | {"base_lrs": list(current["scheduler"]["base_lrs"]), "_last_lr": list(current["scheduler"]["_last_lr"])}
        )
    if state.bound is not None:
        runs.load_bound(path, state.bound)
    state.step, state.history = record["step"], runs.read_history(path)


def _expected_training_state(model, config: TrainingConfig, step: int) -> dict:
    """The parameter groups and scheduler state the run would save after ``step`` steps under ``config``, as
    JSON gives them back: the optimizer and schedule built as the run builds them, the learning rate that
    schedule gives at ``step``."""
    optimizer, scheduler = optimizer_and_schedule(model, config)
    rates = [schedule(step) * base for schedule, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    groups = [group | {"lr": rate} for group, rate in zip(optimizer.state_dict()["param_groups"], rates)]
    state = scheduler.state_dict() | {"last_epoch": step, "_step_count": step + 1, "_last_lr": rates}
    return json.loads(json.dumps({"optimizer_param_groups": groups, "scheduler": state}))


def _loader(train_dataset, config, rank: int, world: int) -> tuple[DistributedSampler, DataLoader]:
    """This process's shuffled share of the data in full batches (``config.seed`` fixes the order per epoch)."""
    sampler = DistributedSampler(
        train_dataset, num_replicas=world, rank=rank, shuffle=True, seed=config.seed, drop_last=True
    )
    loader = DataLoader(
        train_dataset,
        batch_size=config.batch_size,
        sampler=sampler,
        drop_last=True,
        collate_fn=partial(collate, pad_token_id=train_dataset.pad_token_id),
    )
    if len(loader) == 0:
        raise ValueError(
            f"the dataset has {len(train_dataset)} texts: too few for one batch of {config.batch_size} on "
            f"{world} process(es)"
        )
    return sampler, loader


def _optimisation_step(state: TrainingState, trained, batch, device, *, first: bool):
    """One optimisation step on ``batch``: the loss and its gradients (through ``trained``, the model or its DDP
    wrapper), the optimiser's and the schedule's step, the bound's projection; returns ``(output, gradient norm)``."""
    model, config = state.model, state.config
    batch = {key: value.to(device) for key, value in batch.items()}
    with autocast_in(state.autocast_dtype, device):
        out, grad_norm = loss_and_gradients(
            trained, model, batch, config, step=state.step, first=first, bound=state.bound
        )
    state.optimizer.step()
    state.scheduler.step()
    if state.bound is not None:  # the projection runs the model forward for presets other than abduction
        with autocast_in(state.autocast_dtype, device):
            state.bound.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return out, grad_norm


def _keep_record(state: TrainingState, record: dict, log, bar) -> None:
    """A step's record into the history, the metrics log (rank 0's) and the progress bar."""
    state.history.append(record)
    if log:
        log.log(state.step, {k: v for k, v in record.items() if k != "step"})
    if "train/total_loss" in record:  # an eval-only step keeps the last training figures on the bar
        bar.set_postfix(
            loss=f"{record['train/total_loss']:.3f}",
            acc=f"{record.get('train/accuracy', 0.0):.2f}",
            refresh=False,
        )


def _steps(
    state: TrainingState, train_dataset, eval_batch, out_dir, progress: bool, print_eval: bool, *, eval_texts=None
) -> list[dict]:
    """The optimisation steps from ``state.step`` on (the numbered list in the module docstring), then the model
    in eval mode; returns the history."""
    model, config = state.model, state.config
    rank, world = distributed_rank(), distributed_world_size()
    start_step = state.step
    trained = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    device = next(model.parameters()).device
    if eval_batch is not None:
        eval_batch = {key: value.to(device) for key, value in eval_batch.items()}
    sampler, loader = _loader(train_dataset, config, rank, world)
    log = runs.MetricsLog(out_dir, config.report_to, state.step, print_eval=print_eval) if rank == 0 else None
    bar = tqdm(total=config.steps, initial=state.step, disable=not progress or rank != 0, desc="training")

    while state.step < config.steps:
        epoch, offset = divmod(state.step, len(loader))
        sampler.set_epoch(epoch)
        for batch in loader:
            if offset:  # resuming mid-epoch: skip the batches already done
                offset -= 1
                continue
            out, grad_norm = _optimisation_step(state, trained, batch, device, first=state.step == start_step)

            evaluating = eval_batch is not None and (state.step % config.eval_every == 0 or state.step == config.steps)
            if evaluating:  # the held-out metrics take a while: the bar says so rather than stand still
                bar.set_description("evaluating", refresh=True)
            with autocast_in(state.autocast_dtype, device):
                record = _step_record(state, out, grad_norm, eval_batch if rank == 0 else None, eval_texts=eval_texts)
            if evaluating:
                bar.set_description("training", refresh=False)
            if record:
                _keep_record(state, record, log, bar)
            bar.update(1)
            if out_dir and rank == 0 and (state.step % config.save_every == 0 or state.step == config.steps):
                check_finite_parameters(model, state.step, config.learning_rate, config.weight_decay)
                runs.save_checkpoint(out_dir, state)
            if state.step >= config.steps:
                break
    bar.close()
    check_finite_parameters(
        model, state.step, config.learning_rate, config.weight_decay
    )  # what the caller saves as the trained model is finite
    model.eval()
    return state.history


def _step_record(state: TrainingState, out, grad_norm, eval_batch, *, eval_texts=None) -> dict:
    """The metrics logged after step ``state.step``: the ``train/*`` ones (and the bound's) every ``log_every``
    steps, the ``eval/*``/``dist/*`` ones on ``eval_batch`` every ``eval_every`` steps, both at the last step;
    ``{}`` when neither is due."""
    model, config, step = state.model, state.config, state.step
    record = {}
    if step % config.log_every == 0 or step == config.steps:
        record |= training_metrics(model, out) | {
            "train/grad_norm": float(grad_norm),
            "train/learning_rate": state.scheduler.get_last_lr()[0],
        }
        if state.bound is not None:
            record |= state.bound.metrics()
    if eval_batch is not None and (step % config.eval_every == 0 or step == config.steps):
        model.eval()
        metrics = evaluate_batch(model, eval_batch, generator=state.eval_generator)
        if eval_texts is not None:
            metrics |= evaluate_texts(model, *eval_texts)
        model.train()
        record |= with_log_prefixes(metrics)
    if record:
        record["step"] = step
    return record
