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
$b_{\mathrm{noise}}$, learnable thresholds), ``abduction`` (the abduction network alone), ``all``
(everything, the Qwen2 backbone included -- needed for a randomly initialised base). Weight decay
applies to matrices only (``dim >= 2``), never to biases, norms, ``w_num`` or ``b_noise``.

A checkpoint ``checkpoint-{step}/`` holds the model (``save_pretrained``: safetensors), the optimizer,
the scheduler and every RNG state; it is written under a temporary name and renamed, so a directory
with that name is always complete. ``resume=True`` continues from the newest one and ends with
exactly the parameters of an uninterrupted run (on CPU: bit for bit).
"""

from __future__ import annotations

import dataclasses
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
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from .data import TextDataset, collate
from .metrics import classification_metrics, evaluate_batch, next_token_valid_mask, with_log_prefixes
from .inference import predict

__all__ = [
    "PRESETS",
    "TrainingConfig",
    "set_trainable",
    "parameter_groups",
    "globally_normalized_loss",
    "train",
    "latest_checkpoint",
]

logger = logging.getLogger(__name__)

PRESETS = ("causal", "abduction", "all")
RUN_MARKER = "training_config.json"  # marks a directory as a causalqwen training run


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

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        for name in ("steps", "batch_size", "eval_every", "save_every", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        if not (self.max_grad_norm > 0 and self.weight_decay >= 0):
            raise ValueError("max_grad_norm must be > 0 and weight_decay >= 0")
        if self.report_to not in (None, "tensorboard", "wandb"):
            raise ValueError(f'report_to must be "tensorboard", "wandb" or None, got {self.report_to!r}')


def set_trainable(model, preset: str) -> list[str]:
    """Set ``requires_grad`` for ``preset`` (D13); return the names of the trainable parameters."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    prefixes = {
        "all": ("",),
        "causal": ("numerical_embedding.", "abduction.", "action.", "ovr_threshold"),
        "abduction": ("abduction.",),
    }[preset]
    names = []
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(prefixes))
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


def latest_checkpoint(out_dir: str) -> str | None:
    """The complete ``checkpoint-{step}`` directory with the highest step, or None."""
    if not os.path.isdir(out_dir):
        return None
    steps = [int(m.group(1)) for name in os.listdir(out_dir) if (m := re.fullmatch(r"checkpoint-(\d+)", name))]
    return os.path.join(out_dir, f"checkpoint-{max(steps)}") if steps else None


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def globally_normalized_loss(out, batch: dict, config) -> torch.Tensor:
    r"""This process's share of the loss of the *global* batch, for DDP (which averages gradients).

    The model's loss is a mean over this process's $n^{(r)}_{\mathrm{cls}}$ scored positions and
    $n^{(r)}_{\mathrm{reg}}$ ``<NUM>`` targets. Over $W$ processes with totals $N_{\mathrm{cls}}$,
    $N_{\mathrm{reg}}$, the global loss is recovered by

    $$L^{(r)} = W\Big(\bar L^{(r)}_{\mathrm{cls}}\,\frac{n^{(r)}_{\mathrm{cls}}}{N_{\mathrm{cls}}}
    + \lambda\, L^{(r)}_{\mathrm{reg,eff}}\,\frac{n^{(r)}_{\mathrm{reg}}}{N_{\mathrm{reg}}}\Big),$$

    so that the DDP average $\frac1W\sum_r \nabla L^{(r)}$ is the gradient of one process holding the
    whole batch, whatever the padding and the number of numbers in each shard.
    """
    valid = next_token_valid_mask(batch["labels"], batch["attention_mask"], config.ignore_index)
    counts = torch.stack([valid.sum(), (valid & (batch["labels"][:, 1:] == config.num_token_id)).sum()]).double()
    totals = counts.clone()
    dist.all_reduce(totals)  # [N_cls, N_reg]
    shares = (counts / totals.clamp_min(1)).to(out.cls_loss.dtype)
    return _world_size() * (out.cls_loss * shares[0] + config.regression_weight * out.reg_loss * shares[1])


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def _save_checkpoint(out_dir, step, model, optimizer, scheduler, history, eval_generator) -> str:
    final = os.path.join(out_dir, f"checkpoint-{step}")
    partial_dir = final + ".partial"
    shutil.rmtree(partial_dir, ignore_errors=True)
    os.makedirs(partial_dir)
    model.save_pretrained(partial_dir)  # config.json + model.safetensors
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state() | {"eval": eval_generator.get_state()},
            "step": step,
        },
        os.path.join(partial_dir, "training_state.pt"),
    )
    with open(os.path.join(partial_dir, "history.json"), "w", encoding="utf-8") as handle:
        json.dump(history, handle)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial_dir, final)  # atomic: a checkpoint-{step} directory is always complete
    return final


def _load_checkpoint(path, model, optimizer, scheduler, eval_generator) -> tuple[int, list]:
    saved = type(model.config).from_pretrained(path).to_dict()
    current = model.config.to_dict()
    differing = sorted(k for k in set(saved) | set(current)
                       if k not in ("transformers_version", "architectures", "_name_or_path", "dtype")
                       and saved.get(k) != current.get(k))
    if differing:
        raise ValueError(f"cannot resume from {path}: its model config differs in {', '.join(differing)}")
    weights = os.path.join(path, "model.safetensors")
    try:
        state = load_file(weights)
    except SafetensorError as error:
        raise OSError(f"cannot resume from {path}: {weights} cannot be read: {error} (truncated or corrupt file)") from error
    model.load_state_dict(state, strict=True)
    training_state = torch.load(os.path.join(path, "training_state.pt"), weights_only=False)
    optimizer.load_state_dict(training_state["optimizer"])
    scheduler.load_state_dict(training_state["scheduler"])
    _set_rng_state(training_state["rng"])
    eval_generator.set_state(training_state["rng"]["eval"])
    with open(os.path.join(path, "history.json"), encoding="utf-8") as handle:
        history = json.load(handle)
    return training_state["step"], history


def prepare_output_dir(out_dir: str, config: TrainingConfig, resume: bool, overwrite: bool) -> None:
    """Refuse an existing directory that is not a previous run, unless ``overwrite``; write the marker."""
    marker = os.path.join(out_dir, RUN_MARKER)
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        if not os.path.exists(marker):
            raise ValueError(f"output directory {out_dir!r} exists and is not a causalqwen run; pass overwrite to use it")
        if not resume:
            raise ValueError(f"output directory {out_dir!r} holds a previous run; pass resume to continue it or overwrite")
    if overwrite and not resume:
        shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(marker, "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(config), handle, indent=2)


class _Reporter:
    """The JSONL log plus an optional tensorboard / wandb sink (rank 0 only)."""

    def __init__(self, out_dir: str | None, report_to: str | None, resumed_step: int):
        self.path = os.path.join(out_dir, "metrics.jsonl") if out_dir else None
        self.sink = None
        if self.path and os.path.exists(self.path):  # drop what a resumed run will redo
            with open(self.path, encoding="utf-8") as handle:
                kept = [line for line in handle if json.loads(line)["step"] <= resumed_step]
            with open(self.path, "w", encoding="utf-8") as handle:
                handle.writelines(kept)
        if report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise ValueError("report_to='tensorboard' needs the tensorboard package (pip install tensorboard)") from error
            self.sink = SummaryWriter(log_dir=os.path.join(out_dir or ".", "tensorboard"))
        elif report_to == "wandb":
            try:
                import wandb
            except ImportError as error:
                raise ValueError("report_to='wandb' needs the wandb package (pip install wandb)") from error
            self.sink = wandb.init(project="causalqwen", dir=out_dir)

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step} | metrics
        if self.path:
            with open(self.path, "a", encoding="utf-8") as handle:
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
    out_dir: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> list[dict]:
    """Train ``model`` in place; return the history (one dict of metrics per logged step).

    ``eval_batch`` is a collated held-out batch for the ``eval/*``/``dist/*`` metrics. With
    ``out_dir`` the run writes ``metrics.jsonl`` and checkpoints there (rank 0 only). Under
    ``torchrun`` (an initialised process group) the model is wrapped in DDP, each process reads its
    shard of every global batch (``batch_size`` per process), and the loss is normalised over the
    global batch (`globally_normalized_loss`). Batches go to the device of the model's parameters.
    """
    rank, world = _rank(), _world_size()
    if out_dir and rank == 0:
        prepare_output_dir(out_dir, config, resume, overwrite)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    np.random.seed(config.seed)

    set_trainable(model, config.preset)
    model.train()
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.learning_rate)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.warmup_steps, config.steps)
    eval_generator = torch.Generator().manual_seed(config.seed)  # the causal draws of the eval metrics
    step, history = 0, []
    if resume and out_dir and (checkpoint := latest_checkpoint(out_dir)):
        step, history = _load_checkpoint(checkpoint, model, optimizer, scheduler, eval_generator)
        logger.info("resumed from %s at step %d", checkpoint, step)

    trained = model
    if world > 1:
        trained = torch.nn.parallel.DistributedDataParallel(model)
    device = next(model.parameters()).device
    if eval_batch is not None:
        eval_batch = {key: value.to(device) for key, value in eval_batch.items()}
    sampler = DistributedSampler(train_dataset, num_replicas=world, rank=rank, shuffle=True, seed=config.seed, drop_last=True)
    loader = DataLoader(train_dataset, batch_size=config.batch_size, sampler=sampler, drop_last=True,
                        collate_fn=partial(collate, pad_token_id=train_dataset.pad_token_id))
    batches_per_epoch = len(loader)
    if batches_per_epoch == 0:
        raise ValueError(
            f"the dataset has {len(train_dataset)} texts: too few for one batch of {config.batch_size} on {world} process(es)"
        )
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
            out = trained(**batch)
            loss = globally_normalized_loss(out, batch, model.config) if world > 1 else out.loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            record = {}
            if step % config.log_every == 0 or step == config.steps:
                with torch.no_grad():  # the training forward formed no [B, S, V] decisions: form them once here
                    decision = model.action(out.loc_U[:, :-1], out.scale_U[:, :-1])
                    predicted, _ = predict(decision.loc_S, decision.scale_S, decision.loc_Y,
                                           model.ovr_threshold, model.config.num_token_id)
                    valid = next_token_valid_mask(batch["labels"], batch["attention_mask"], model.config.ignore_index)
                    accuracy = classification_metrics(predicted, batch["labels"][:, 1:], valid, model.config.num_token_id)["accuracy"]
                record |= {
                    "train/total_loss": out.loss.item(),
                    "train/cls_loss_mean": out.cls_loss.item(),
                    "train/reg_loss_effective": out.reg_loss.item(),
                    "train/accuracy": accuracy,
                    "train/grad_norm": float(grad_norm),
                    "train/learning_rate": scheduler.get_last_lr()[0],
                }
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
                bar.set_postfix(loss=f"{record.get('train/total_loss', float('nan')):.3f}",
                                acc=f"{record.get('train/accuracy', 0.0):.2f}", refresh=False)
            bar.update(1)
            if out_dir and rank == 0 and (step % config.save_every == 0 or step == config.steps):
                _save_checkpoint(out_dir, step, model, optimizer, scheduler, history, eval_generator)
            if step >= config.steps:
                break
    bar.close()
    model.eval()
    return history
