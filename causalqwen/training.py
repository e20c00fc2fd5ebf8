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
adapters of `causalqwen.integrations.lora.add_lora` on the Qwen2 stack plus the ``causal`` modules), ``all``
(everything, the Qwen2 backbone included -- needed for a randomly initialised base). With
``max_u_divergence`` the loss gains $\mu \bar D$, the bound on how far the law of $U$ moves from the starting
model's (`causalqwen.divergence`), and $\mu$ takes a dual-ascent step after each optimizer step. Weight decay
applies to matrices only (``dim >= 2``), never to biases, norms, ``w_num`` or ``b_noise``.

A checkpoint ``checkpoint-{step}/`` holds the model, the optimizer, the scheduler, every RNG state, the run's
settings and data fingerprints and the history, without pickle, written atomically
(`causalqwen.files.runs.save_checkpoint`). ``resume=True`` continues from the newest one, after checking that the
model config, the settings and the data are the ones it was written with (`causalqwen.files.runs.check_checkpoint`),
and ends with exactly the parameters of an uninterrupted run (on CPU: bit for bit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from .divergence import DivergenceBound
from .files import runs
from .files.data import TextDataset, collate
from .files.rundir import RunDirectory
from .files.training_state import load_training_state
from .inference import as_number
from .integrations.lora import is_peft_model
from .kernels.mixed_precision import autocast_in, check_trainable_dtypes, float32_master_weights
from .checks.values import TrainingDiverged, check_finite_parameters
from .metrics import evaluate_batch, training_metrics, with_log_prefixes

__all__ = [
    "PRESETS", "DEFAULT_WARMUP_RATIO", "TrainingConfig", "TrainingState", "TrainingDiverged", "set_trainable",
    "check_trainable_dtypes", "float32_master_weights", "parameter_groups",
    "optimizer_and_schedule", "globally_normalized_loss", "loss_and_gradients", "training_metrics",
    "check_training_inputs", "train",
]

logger = logging.getLogger(__name__)

PRESETS = ("causal", "abduction", "all", "lora")
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # the largest learning_rate, weight_decay, max_grad_norm
SEED_MAX = 2**32 - 1  # the largest seed: NumPy seeds with 32 bits, and one seed drives torch, NumPy and Python
DEFAULT_WARMUP_RATIO = 0.1  # the warm-up of a run that gives neither warmup_steps nor warmup_ratio


@dataclass
class TrainingConfig:
    """Hyper-parameters of `train`. ``batch_size`` is per process."""

    steps: int = 1000
    batch_size: int = 16
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int | None = None  # linear warm-up steps; None: ceil(warmup_ratio * steps) (`num_warmup_steps`)
    max_grad_norm: float = 1.0
    preset: str = "causal"
    eval_every: int = 100
    save_every: int = 500
    log_every: int = 10
    seed: int = 0
    report_to: str | None = None  # "tensorboard" or "wandb", if installed
    max_u_divergence: float | None = None  # epsilon of the bound on how far U moves from the base (causalqwen.divergence)
    divergence_dual_lr: float = 1.0  # eta_mu, the dual-ascent step of the bound's Lagrange multiplier
    save_total_limit: int | None = None  # keep the newest N checkpoints of the run; None or 0: all (as transformers')
    warmup_ratio: float | None = None  # warm-up as a fraction of ``steps``, in [0, 1]; None: DEFAULT_WARMUP_RATIO

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        # NumPy scalars and 0-d tensors are taken as the Python numbers they hold (stored as such, so that
        # the settings compare and serialise as plain JSON); booleans and strings are refused by name.
        for name in ("steps", "batch_size", "eval_every", "save_every", "log_every", "warmup_steps", "seed",
                     "save_total_limit"):
            if name in ("warmup_steps", "save_total_limit") and getattr(self, name) is None:
                continue
            value = as_number(getattr(self, name), integer=True)
            lowest = 0 if name in ("warmup_steps", "seed", "save_total_limit") else 1
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
        if self.report_to not in (None, "tensorboard", "wandb"):
            raise ValueError(f'report_to must be "tensorboard", "wandb" or None, got {self.report_to!r}')
        self._check_optional_numbers()

    def _check_optional_numbers(self) -> None:
        """The bound's settings and the warm-up ratio (which excludes ``warmup_steps``), stored as Python floats."""
        if self.max_u_divergence is not None:
            value = as_number(self.max_u_divergence)
            if value is None or not math.isfinite(value) or value < 0:
                raise ValueError(f"max_u_divergence must be a finite number >= 0 or None, got {self.max_u_divergence!r}")
            self.max_u_divergence = value
        value = as_number(self.divergence_dual_lr)
        if value is None or not math.isfinite(value) or value < 0:
            raise ValueError(f"divergence_dual_lr must be a finite number >= 0, got {self.divergence_dual_lr!r}")
        self.divergence_dual_lr = value
        if self.warmup_ratio is not None:
            ratio = as_number(self.warmup_ratio)
            if ratio is None or not 0 <= ratio <= 1:
                raise ValueError(f"warmup_ratio must be a number from 0 to 1 or None, got {self.warmup_ratio!r}")
            if self.warmup_steps is not None:
                raise ValueError(f"warmup_steps ({self.warmup_steps!r}) and warmup_ratio ({ratio!r}) exclude each other: "
                                 "give one (warmup_ratio applies when warmup_steps is not given)")
            self.warmup_ratio = ratio

    @property
    def num_warmup_steps(self) -> int:
        """The schedule's warm-up steps: ``warmup_steps`` if given, else ``ceil(warmup_ratio * steps)``
        (`DEFAULT_WARMUP_RATIO` when neither is given), the rule of transformers'
        ``TrainingArguments.get_warmup_steps``, computed exactly on the ratio as written: its shortest decimal
        (``repr``, what ``--warmup-ratio 0.07`` typed) times ``steps`` as a fraction. 0.07 x 100 is 7 steps, where
        the float product 7.000000000000001 would give 8."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        ratio = DEFAULT_WARMUP_RATIO if self.warmup_ratio is None else self.warmup_ratio
        return math.ceil(Fraction(repr(ratio)) * self.steps)


def _check_preset(model, preset: str) -> None:
    """``preset`` one of `PRESETS`, and ``lora`` exactly for the `peft.PeftModel` of
    `causalqwen.integrations.lora.add_lora`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if (preset == "lora") != is_peft_model(model):
        raise TypeError("preset 'lora' trains the adapters of causalqwen.integrations.lora.add_lora(model), and only it does: "
                        f"got a {type(model).__name__} for preset {preset!r}")


def set_trainable(model, preset: str) -> list[str]:
    """Set ``requires_grad`` for ``preset`` (D13); return the names of the trainable parameters.

    ``lora`` needs the `peft.PeftModel` of `causalqwen.integrations.lora.add_lora`: its LoRA matrices and its trained copies of
    the causal preset's modules train, everything else (the base weights and the base copies) is frozen.
    """
    _check_preset(model, preset)
    if preset == "lora":
        chosen = {id(parameter) for name, parameter in model.named_parameters()
                  if ".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name}
    else:
        modules = {"all": [model], "abduction": [model.model.abduction],  # causal: the head owns C_k
                   "causal": [model.model.numerical_embedding, model.model.abduction, model.action]}[preset]
        chosen = {id(parameter) for module in modules for parameter in module.parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in chosen)
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def parameter_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: trainable matrices (``dim >= 2``) decay, everything else does not."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]


@dataclass
class TrainingState:
    """What the steps advance and a checkpoint holds (`causalqwen.files.runs.save_checkpoint`)."""

    model: torch.nn.Module  # trained in place (a peft.PeftModel for preset lora)
    config: TrainingConfig
    optimizer: torch.optim.Optimizer  # AdamW on `parameter_groups`
    scheduler: torch.optim.lr_scheduler.LRScheduler  # linear warm-up, then cosine decay to 0
    eval_generator: torch.Generator  # the causal draws of the eval metrics
    settings: dict  # `causalqwen.files.runs.run_settings`: what a checkpoint records and a resume compares
    bound: DivergenceBound | None = None  # the bound on how far U moves (max_u_divergence), or None
    autocast_dtype: torch.dtype | None = None  # the forward's dtype under torch.autocast (`float32_master_weights`)
    step: int = 0  # optimizer steps taken
    history: list[dict] = field(default_factory=list)  # one dict of metrics per logged step


def optimizer_and_schedule(model, config: TrainingConfig):
    """AdamW on `parameter_groups` and its schedule: `TrainingConfig.num_warmup_steps` of linear warm-up, then
    cosine decay to 0 at ``steps``."""
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.learning_rate)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, config.num_warmup_steps, config.steps)


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
        raise ValueError(f"none of the {len(train_dataset)} training texts has two tokens: there is no next token "
                         "to learn from")
    _loader(train_dataset, config, _rank(), _world_size())  # ValueError: too few texts for one batch
    _check_preset(model, config.preset)
    runs.check_report_to(config.report_to)


def train(model, train_dataset: TextDataset, config: TrainingConfig, eval_batch: dict[str, torch.Tensor] | None = None,
          out_dir: str | os.PathLike | RunDirectory | None = None, *, resume: bool = False, overwrite: bool = False,
          progress: bool = True, allow_changed_settings: bool = False, print_eval: bool = False) -> list[dict]:
    """Train ``model`` in place; return the history (one dict of metrics per logged step).

    ``eval_batch`` is a collated held-out batch for the ``eval/*``/``dist/*`` metrics. With
    ``out_dir`` the run writes ``metrics.jsonl`` and checkpoints there (rank 0 only); the directory is
    claimed first (`causalqwen.files.rundir`: a new or empty directory, or a previous run with ``resume``
    or ``overwrite``; locked while the run lasts), unless a claimed `RunDirectory` is passed.

    ``resume`` continues from the newest checkpoint and refuses one whose model config, training
    settings (all of `TrainingConfig` but the logging intervals and ``report_to``) or data
    (SHA-256 of the tokenized texts) differ from this run's, naming each difference;
    ``allow_changed_settings`` continues anyway (the result is then no longer the uninterrupted run's). A resumed
    config that gives no warm-up takes the run's own (`causalqwen.files.runs.with_recorded_warmup`).
    ``print_eval`` prints a line of eval metrics each time they are computed (`causalqwen.files.runs.eval_line`).

    Under ``torchrun`` (an initialised process group) the model is wrapped in DDP, each process reads its
    shard of every global batch (``batch_size`` per process), and the loss is normalised over the
    global batch (`globally_normalized_loss`). Batches go to the device of the model's parameters.
    A non-finite loss or gradient stops the run with `TrainingDiverged` before the optimizer step.
    """
    rank = _rank()
    check_training_inputs(model, train_dataset, config)  # before the directory is claimed: a refused run writes nothing
    run_dir, owned = None, False
    if isinstance(out_dir, RunDirectory):
        run_dir = out_dir
    elif out_dir is not None and rank == 0:
        run_dir, owned = RunDirectory.claim(out_dir, "train", resume=resume, overwrite=overwrite), True
    try:
        out_dir = os.fspath(out_dir) if out_dir is not None else None
        set_trainable(model, config.preset)
        with float32_master_weights(model) as autocast_dtype:
            state = _start(model, train_dataset, config, eval_batch, out_dir, writes=run_dir is not None,
                           resume=resume, allow_changed_settings=allow_changed_settings)
            state.autocast_dtype = autocast_dtype
            return _steps(state, train_dataset, eval_batch, out_dir, progress, print_eval)
    finally:
        if owned:
            run_dir.release()


def _start(model, train_dataset, config, eval_batch, out_dir, *, writes: bool, resume: bool,
           allow_changed_settings: bool) -> TrainingState:
    """The state at the run's first step: seeds, trainable parameters, the bound, AdamW and its schedule, then
    (``resume``) the newest checkpoint's. ``writes``: this process writes ``training_config.json``."""
    checkpoint = runs.latest_checkpoint(out_dir) if (resume and out_dir) else None
    if resume and out_dir:  # a warm-up not given is the run's own
        config = runs.with_recorded_warmup(config, out_dir, checkpoint)
    settings = runs.run_settings(config, train_dataset, eval_batch)
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
    return state


def _resume(path: str, state: TrainingState, allow_changed_settings: bool) -> None:
    """Restore the checkpoint ``path`` into ``state`` strictly: the model config, the run's settings and data
    (`causalqwen.files.runs.check_checkpoint`), then every tensor as it is loaded."""
    record, differences = runs.check_checkpoint(path, state.model, state.settings, allow_changed_settings)
    runs.load_model_weights(path, state.model)
    # The record's numbers must be those the run it names would have saved at its step: its own settings (this
    # run's, unless changed settings are allowed) give every optimizer and scheduler value but the moments.
    recorded = runs.recorded_config(record, path, state.config) if differences else state.config
    load_training_state(path, optimizer=state.optimizer, scheduler=state.scheduler,
                        eval_generator=state.eval_generator, record=record,
                        expected=_expected_training_state(state.model, recorded, record["step"]))
    if differences:  # allowed: from here on the optimizer follows this run's settings
        current = _expected_training_state(state.model, state.config, record["step"])
        for group, wanted in zip(state.optimizer.param_groups, current["optimizer_param_groups"]):
            group.update({key: wanted[key] for key in ("lr", "initial_lr", "weight_decay")})
        state.scheduler.load_state_dict(state.scheduler.state_dict() | {
            "base_lrs": list(current["scheduler"]["base_lrs"]), "_last_lr": list(current["scheduler"]["_last_lr"])})
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


def loss_and_gradients(trained, model, batch: dict, config: TrainingConfig, *, step: int = 0, first: bool = True,
                       bound: DivergenceBound | None = None):
    """``(out, grad_norm)``: the forward output of ``batch``, the loss (plus the bound's $\\mu \\bar D$)
    differentiated, and the norm of the gradients of ``model``'s trainable parameters before they are clipped
    at ``max_grad_norm``. `TrainingDiverged` (before any update) when the loss or the gradients are not finite,
    or when the forward pass fails after step 0 of this call (``first``: the error is raised as it is).

    ``trained`` is ``model`` or its DDP wrapper; ``step`` is the number of steps already taken (for messages)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
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
        raise ValueError(f"the dataset has {len(train_dataset)} texts: too few for one batch of {config.batch_size} on "
                         f"{world} process(es)")
    return sampler, loader


def _steps(state: TrainingState, train_dataset, eval_batch, out_dir, progress: bool, print_eval: bool) -> list[dict]:
    """The optimisation steps from ``state.step`` on (the numbered list in the module docstring), then the model
    in eval mode; returns the history."""
    model, config = state.model, state.config
    rank, world = _rank(), _world_size()
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
            batch = {key: value.to(device) for key, value in batch.items()}
            with autocast_in(state.autocast_dtype, device):
                out, grad_norm = loss_and_gradients(trained, model, batch, config, step=state.step,
                                                    first=state.step == start_step, bound=state.bound)
            state.optimizer.step()
            state.scheduler.step()
            if state.bound is not None:
                state.bound.step()
            state.optimizer.zero_grad(set_to_none=True)
            state.step += 1

            with autocast_in(state.autocast_dtype, device):
                record = _step_record(state, out, grad_norm, eval_batch if rank == 0 else None)
            if record:
                state.history.append(record)
                if log:
                    log.log(state.step, {k: v for k, v in record.items() if k != "step"})
                if "train/total_loss" in record:  # an eval-only step keeps the last training figures on the bar
                    bar.set_postfix(loss=f"{record['train/total_loss']:.3f}",
                                    acc=f"{record.get('train/accuracy', 0.0):.2f}", refresh=False)
            bar.update(1)
            if out_dir and rank == 0 and (state.step % config.save_every == 0 or state.step == config.steps):
                check_finite_parameters(model, state.step, config.learning_rate, config.weight_decay)
                runs.save_checkpoint(out_dir, state)
            if state.step >= config.steps:
                break
    bar.close()
    check_finite_parameters(model, state.step, config.learning_rate, config.weight_decay)  # what the caller saves as the trained model is finite
    model.eval()
    return state.history


def _step_record(state: TrainingState, out, grad_norm, eval_batch) -> dict:
    """The metrics logged after step ``state.step``: the ``train/*`` ones (and the bound's) every ``log_every``
    steps, the ``eval/*``/``dist/*`` ones on ``eval_batch`` every ``eval_every`` steps, both at the last step;
    ``{}`` when neither is due."""
    model, config, step = state.model, state.config, state.step
    record = {}
    if step % config.log_every == 0 or step == config.steps:
        record |= training_metrics(model, out) | {"train/grad_norm": float(grad_norm),
                                                   "train/learning_rate": state.scheduler.get_last_lr()[0]}
        if state.bound is not None:
            record |= state.bound.metrics()
    if eval_batch is not None and (step % config.eval_every == 0 or step == config.steps):
        model.eval()
        metrics = evaluate_batch(model, eval_batch, generator=state.eval_generator)
        model.train()
        record |= with_log_prefixes(metrics)
    if record:
        record["step"] = step
    return record
