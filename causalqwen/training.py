r"""The training step, written out: what is trained, the optimizer, and one step's loss and gradients.

One optimisation step (`loss_and_gradients`, then the optimizer):

1. ``loss = model(**batch).loss`` $= \bar L_{\mathrm{cls}} + \lambda L_{\mathrm{reg,eff}}$ (plus $\mu \bar D$ under the
   bound on how far $U$ moves, `causalqwen.divergence`);
2. backward, clip the global gradient norm at ``max_grad_norm``;
3. AdamW step, scheduler step (linear warm-up, then cosine decay to 0), the bound's dual-ascent step.

What is trained is a *preset* (`set_trainable`): ``causal`` (the default; numerical embedding, abduction, action with
$b_{\mathrm{noise}}$, learnable thresholds), ``abduction`` (the abduction network alone), ``lora`` (the LoRA
adapters of `causalqwen.integrations.lora.add_lora` on the Qwen2 stack plus the ``causal`` modules), ``all``
(everything, the Qwen2 backbone included -- needed for a randomly initialised base). Weight decay applies to
matrices only (``dim >= 2``), never to biases, norms, ``w_num`` or ``b_noise`` (`parameter_groups`).

The run around the steps -- batches in a fixed order per ``(seed, epoch)``, evaluation, checkpoints without pickle,
resume bit for bit, the output directory -- is `causalqwen.train` (`causalqwen.app.training_run`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch
import torch.distributed as dist

from .checks.values import TrainingDiverged
from .divergence import DivergenceBound
from .inference import as_number

__all__ = [
    "PRESETS",
    "DEFAULT_WARMUP_RATIO",
    "TrainingConfig",
    "TrainingState",
    "TrainingDiverged",
    "check_preset",
    "set_trainable",
    "parameter_groups",
    "warmup_cosine_factor",
    "warmup_cosine_schedule",
    "optimizer_and_schedule",
    "distributed_rank",
    "distributed_world_size",
    "globally_normalized_loss",
    "loss_and_gradients",
]

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
    max_u_divergence: float | None = (
        None  # epsilon of the bound on how far U moves from the base (causalqwen.divergence)
    )
    divergence_dual_lr: float = 1.0  # eta_mu, the dual-ascent step of the bound's Lagrange multiplier
    save_total_limit: int | None = None  # keep the newest N checkpoints of the run; None or 0: all (as transformers')
    warmup_ratio: float | None = None  # warm-up as a fraction of ``steps``, in [0, 1]; None: DEFAULT_WARMUP_RATIO

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        # NumPy scalars and 0-d tensors are taken as the Python numbers they hold (stored as such, so that
        # the settings compare and serialise as plain JSON); booleans and strings are refused by name.
        for name in (
            "steps",
            "batch_size",
            "eval_every",
            "save_every",
            "log_every",
            "warmup_steps",
            "seed",
            "save_total_limit",
        ):
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
                raise ValueError(
                    f"{name} must be a finite number within float32's range (at most {FLOAT32_MAX:.6g}), "
                    f"got {getattr(self, name)!r}"
                )
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
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(f"max_u_divergence must be a finite number > 0 or None, got {self.max_u_divergence!r}")
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
                raise ValueError(
                    f"warmup_steps ({self.warmup_steps!r}) and warmup_ratio ({ratio!r}) exclude each other: "
                    "give one (warmup_ratio applies when warmup_steps is not given)"
                )
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


def check_preset(model, preset: str) -> None:
    """``preset`` one of `PRESETS`, and ``lora`` exactly for the `peft.PeftModel` of
    `causalqwen.integrations.lora.add_lora`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if (preset == "lora") != hasattr(model, "peft_config"):  # a peft.PeftModel
        raise TypeError(
            "preset 'lora' trains the adapters of causalqwen.integrations.lora.add_lora(model), and only it does: "
            f"got a {type(model).__name__} for preset {preset!r}"
        )


def set_trainable(model, preset: str) -> list[str]:
    """Set ``requires_grad`` for ``preset`` (D13); return the names of the trainable parameters.

    ``lora`` needs the `peft.PeftModel` of `causalqwen.integrations.lora.add_lora`: its LoRA matrices and its trained
    copies of the causal preset's modules train, everything else (the base weights and the base copies) is frozen.
    """
    check_preset(model, preset)
    if preset == "lora":
        chosen = {
            id(parameter)
            for name, parameter in model.named_parameters()
            if ".lora_A." in name or ".lora_B." in name or ".modules_to_save." in name
        }
    else:
        modules = {
            "all": [model],
            "abduction": [model.model.abduction],  # causal: the head owns C_k
            "causal": [model.model.numerical_embedding, model.model.abduction, model.action],
        }[preset]
        chosen = {id(parameter) for module in modules for parameter in module.parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in chosen)
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def parameter_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: trainable matrices (``dim >= 2``) decay, everything else does not."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]


@dataclass
class TrainingState:
    """What the steps advance and a checkpoint holds (`causalqwen.app.runs.save_checkpoint`)."""

    model: torch.nn.Module  # trained in place (a peft.PeftModel for preset lora)
    config: TrainingConfig
    optimizer: torch.optim.Optimizer  # AdamW on `parameter_groups`
    scheduler: torch.optim.lr_scheduler.LRScheduler  # linear warm-up, then cosine decay to 0
    eval_generator: torch.Generator  # the causal draws of the eval metrics
    settings: dict  # `causalqwen.app.runs.run_settings`: what a checkpoint records and a resume compares
    bound: DivergenceBound | None = None  # the bound on how far U moves (max_u_divergence), or None
    autocast_dtype: torch.dtype | None = None  # the forward's dtype under torch.autocast (`float32_master_weights`)
    step: int = 0  # optimizer steps taken
    history: list[dict] = field(default_factory=list)  # one dict of metrics per logged step


def warmup_cosine_factor(step: int, *, warmup: int, steps: int) -> float:
    r"""The learning rate's factor after ``step`` scheduler steps: $t / w$ during the $w$ warm-up steps, then
    $\frac12 (1 + \cos(\pi (t - w) / (T - w)))$, down to 0 at $T$ = ``steps`` (and 0 after it). The closed form
    of transformers' ``get_cosine_schedule_with_warmup``, term by term."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, steps - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def warmup_cosine_schedule(
    optimizer: torch.optim.Optimizer, warmup: int, steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """``warmup`` steps of linear warm-up, then cosine decay to 0 at ``steps`` (`warmup_cosine_factor`), as a
    ``LambdaLR``. Its factor is a ``functools.partial``, as transformers' is, so that its ``state_dict`` is the one a
    checkpoint of transformers' schedule holds."""
    factor = functools.partial(warmup_cosine_factor, warmup=warmup, steps=steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_and_schedule(model, config: TrainingConfig):
    """AdamW on `parameter_groups` and its schedule: `TrainingConfig.num_warmup_steps` of linear warm-up, then
    cosine decay to 0 at ``steps`` (`warmup_cosine_schedule`)."""
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.learning_rate)
    return optimizer, warmup_cosine_schedule(optimizer, config.num_warmup_steps, config.steps)


def distributed_rank() -> int:
    """This process's rank under ``torchrun`` (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def distributed_world_size() -> int:
    """The number of processes under ``torchrun`` (1 without a process group)."""
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
    return distributed_world_size() * (out.cls_loss * shares[0] + config.regression_weight * out.reg_loss * shares[1])


def loss_and_gradients(
    trained,
    model,
    batch: dict,
    config: TrainingConfig,
    *,
    step: int = 0,
    first: bool = True,
    bound: DivergenceBound | None = None,
):
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
    loss = globally_normalized_loss(out, model.config) if distributed_world_size() > 1 else out.loss
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
