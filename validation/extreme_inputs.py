r"""Part 3 of the robustness suite: extreme but finite inputs stay finite through forward, loss and backward.

Numbers up to the largest float32 ($3.4\cdot10^{38}$), denormals and zeros in ``numeric_values``;
$|\mathrm{loc}_U|$ up to $10^{30}$ (the abduction map $W_{\mathrm{loc}}$ scaled up); every scale at
``scale_eps``; all-padding rows; all-ignored labels. A `ModelCase` goes through the whole model
(`run_model_case`), a `LossCase` through the losses alone (`run_loss_case`); forward, loss and backward
must leave no NaN or ±inf in the loss or in any gradient (`FiniteCheck`). The tests draw these cases
with Hypothesis; the report draws a fixed-seed sample with `random.Random` (`random_model_case`,
`random_loss_case`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from .fixtures import ids_with_num, shared_tiny

__all__ = [
    "FLOAT32_MAX",
    "FLOAT32_TINY",
    "FLOAT32_DENORMAL",
    "NUMBER_MAGNITUDES",
    "LOC_SCALES",
    "SCALE_SETTINGS",
    "NOISE_VALUES",
    "MASK_PATTERNS",
    "LABEL_PATTERNS",
    "LOSS_PATHS",
    "LOC_MAGNITUDES",
    "THRESHOLDS",
    "MODEL_CASE_CHOICES",
    "ModelCase",
    "LossCase",
    "FiniteCheck",
    "fuzz_model",
    "run_model_case",
    "run_loss_case",
    "random_model_case",
    "random_loss_case",
]

FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028234663852886e38
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)  # 1.1754943508222875e-38, the smallest normal
FLOAT32_DENORMAL = 1e-45  # rounds to the smallest float32 denormal, 1.4e-45

# Magnitudes of the numbers at <NUM> positions (each drawn with a sign): zero, the smallest float32
# denormal and normal, ordinary, huge, and the largest float32.
NUMBER_MAGNITUDES = (0.0, FLOAT32_DENORMAL, FLOAT32_TINY, 1.0, 1e10, 1e30, 3e38, FLOAT32_MAX)
# Factors on the abduction map W_loc: the features z are O(1) after the final RMSNorm, so |loc_U| ~ factor.
LOC_SCALES = (1.0, 1e10, 1e20, 1e30)
# scale_U: "init" (gamma = 10), "scale_eps" (softplus(-1e4) = 0, clamped to scale_eps), "large" (~1e20).
SCALE_SETTINGS = ("init", "scale_eps", "large")
NOISE_VALUES = (0.1, 1e-6, 0.0)  # every component of b_noise; 0 makes the decision scale exactly scale_eps
MASK_PATTERNS = ("none", "full", "left_padded", "one_row_all_padding", "all_padding")
LABEL_PATTERNS = ("next_tokens", "some_ignored", "all_ignored", "extreme_numeric_labels")
LOSS_PATHS = ("fused", "literal")
# Loss-level inputs: |loc| (of loc_S, loc_Y or loc_U) up to 1e30, and OvR thresholds up to ±1e30.
LOC_MAGNITUDES = (0.0, 1e-30, 1.0, 1e6, 1e15, 1e30)
THRESHOLDS = (0.0, 100.0, -1e30, 1e30)

# The choice list of every `ModelCase` field but the numbers: the tests draw from it with Hypothesis,
# the report with `random.Random` (`random_model_case`).
MODEL_CASE_CHOICES = {
    "loc_scale": LOC_SCALES,
    "scale_setting": SCALE_SETTINGS,
    "noise": NOISE_VALUES,
    "mask": MASK_PATTERNS,
    "labels": LABEL_PATTERNS,
    "path": LOSS_PATHS,
}

_B_SCALE = {"scale_eps": -1e4, "large": 1e20}  # "init" keeps softplus^-1(gamma)
_SEQUENCE = (11, None, 23, None, 37, None, 5)  # None: <NUM>; three number positions per row


@dataclass(frozen=True)
class ModelCase:
    r"""One extreme input for the whole model: a batch of 2 rows of `_SEQUENCE` (7 positions, 3 ``<NUM>``).

    Attributes:
        values: the 6 numbers at the ``<NUM>`` positions (3 per row), any finite float32.
        targets: 6 numeric labels used when ``labels == "extreme_numeric_labels"`` (else the values are the targets).
        loc_scale: factor on ``W_loc`` (so $|\mathrm{loc}_U|$ reaches about this value).
        scale_setting: one of `SCALE_SETTINGS`.
        noise: the value of every component of ``b_noise``.
        mask: one of `MASK_PATTERNS`.
        labels: one of `LABEL_PATTERNS`.
        path: ``"fused"`` (training's path) or ``"literal"`` (``return_decisions=True``).
    """

    values: tuple[float, ...]
    targets: tuple[float, ...]
    loc_scale: float
    scale_setting: str
    noise: float
    mask: str
    labels: str
    path: str


@dataclass(frozen=True)
class LossCase:
    r"""One extreme input for the losses alone (no backbone): tensors drawn from ``seed`` within the given magnitudes.

    Attributes:
        seed: seeds the elementwise draws (which magnitude, which sign, a factor in [0.5, 1]).
        loc_magnitudes: the magnitudes $|\mathrm{loc}|$ may take (a subset of `LOC_MAGNITUDES`).
        scale_at_eps: every scale at ``scale_eps`` (else a mix of scale_eps, 1 and 1e6).
        threshold: the OvR threshold.
        target_magnitudes: the magnitudes numeric targets may take (a subset of `NUMBER_MAGNITUDES`).
        labels: one of `LABEL_PATTERNS` except ``"extreme_numeric_labels"``.
        mask: one of `MASK_PATTERNS`.
    """

    seed: int
    loc_magnitudes: tuple[float, ...]
    scale_at_eps: bool
    threshold: float
    target_magnitudes: tuple[float, ...]
    labels: str
    mask: str


@dataclass
class FiniteCheck:
    """The result of one fuzz case: which of the loss and the gradients are not finite (must be none)."""

    non_finite: list[str]  # "loss", "cls_loss", ... or "grad of NAME"
    max_abs_loc: float  # the largest |loc_U| (model) or |loc| (losses) actually reached
    min_scale: float  # the smallest scale that entered the Cauchy algebra

    @property
    def ok(self) -> bool:
        return not self.non_finite


@functools.cache
def fuzz_model():
    """``(model, pristine state)``: a CausalQwen in train mode whose parameters each case resets and then distorts."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    model = build_tiny_causal_lm(seed=0, init_seed=1).model
    model.train()  # dropout is 0 in the tiny config; train mode as in training
    pristine = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    return model, pristine


def _model_inputs(case: ModelCase):
    num_id = shared_tiny().tokenizer.num_token_id
    ids = ids_with_num(_SEQUENCE, _SEQUENCE)  # [2, 7]
    values = torch.zeros(ids.shape)
    targets = torch.zeros(ids.shape)
    number_positions = (ids == num_id).nonzero()  # [6, 2], row-major
    for k, (b, s) in enumerate(number_positions.tolist()):
        values[b, s] = case.values[k]
        targets[b, s] = case.targets[k]
    masks = {
        "none": None,
        "full": torch.ones_like(ids),
        "left_padded": torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]),
        "one_row_all_padding": torch.tensor([[0] * 7, [1] * 7]),
        "all_padding": torch.zeros_like(ids),
    }
    labels = ids.clone()
    if case.labels == "some_ignored":
        labels[:, ::2] = -100
    elif case.labels == "all_ignored":
        labels[:] = -100
    numeric_labels = targets if case.labels == "extreme_numeric_labels" else None
    return dict(
        input_ids=ids,
        numeric_values=values,
        attention_mask=masks[case.mask],
        labels=labels,
        numeric_labels=numeric_labels,
        return_decisions=case.path == "literal",
    )


def run_model_case(case: ModelCase) -> FiniteCheck:
    """Forward with labels, then backward, on the distorted model; report every non-finite loss part or gradient."""
    model, pristine = fuzz_model()
    model.load_state_dict(pristine)
    with torch.no_grad():
        model.abduction.W_loc.mul_(case.loc_scale)
        if case.scale_setting in _B_SCALE:
            model.abduction.b_scale.fill_(_B_SCALE[case.scale_setting])
        model.action.b_noise.fill_(case.noise)
    model.zero_grad(set_to_none=True)
    out = model(**_model_inputs(case))
    out.loss.backward()
    non_finite = [
        name for name in ("loss", "cls_loss", "reg_loss") if not bool(torch.isfinite(getattr(out, name)).all())
    ]
    non_finite += [
        f"grad of {name}"
        for name, parameter in model.named_parameters()
        if parameter.grad is not None and not bool(torch.isfinite(parameter.grad).all())
    ]
    decision_scale = out.scale_U.detach() + model.action.noise_scale.detach()
    return FiniteCheck(
        non_finite, out.loc_U.detach().abs().max().item(), decision_scale.clamp_min(model.config.scale_eps).min().item()
    )


def _extreme_tensor(shape, magnitudes, generator: torch.Generator) -> torch.Tensor:
    r"""Elements $\pm m \cdot f$ with $m$ drawn from ``magnitudes`` and $f \in [0.5, 1]$ (so float32 max stays
    finite)."""
    choice = torch.randint(0, len(magnitudes), shape, generator=generator)
    magnitude = torch.tensor(magnitudes, dtype=torch.float64)[choice]
    sign = torch.where(torch.rand(shape, generator=generator) < 0.5, -1.0, 1.0).double()
    factor = 0.5 + 0.5 * torch.rand(shape, generator=generator).double()
    return (sign * magnitude * factor).float()


# The losses-alone problem: B rows of S positions, V classes, C causal components, <NUM> = class 7.
_LOSS_B, _LOSS_S, _LOSS_V, _LOSS_C, _LOSS_NUM_ID, _LOSS_EPS = 2, 5, 11, 6, 7, 1e-6


@dataclass
class _LossDraw:
    """One `LossCase` drawn: labels, mask and numeric targets, the generator every further tensor is drawn
    from, and the non-finite values found so far."""

    case: LossCase
    generator: torch.Generator
    labels: torch.Tensor  # [B, S]
    mask: torch.Tensor | None  # [B, S]
    targets: torch.Tensor  # [B, S]
    non_finite: list[str]

    @property
    def settings(self) -> dict:
        return dict(num_token_id=_LOSS_NUM_ID, attention_mask=self.mask, detach_gate=False)

    def extreme(self, shape) -> torch.Tensor:
        return _extreme_tensor(shape, self.case.loc_magnitudes, self.generator)

    def scales(self, shape) -> torch.Tensor:
        if self.case.scale_at_eps:
            return torch.full(shape, _LOSS_EPS)
        return torch.tensor([_LOSS_EPS, 1.0, 1e6])[torch.randint(0, 3, shape, generator=self.generator)]

    def judge(self, label: str, total: torch.Tensor, tensors) -> None:
        """Record a non-finite ``total`` and every non-finite gradient among the named ``tensors``."""
        if not bool(torch.isfinite(total).all()):
            self.non_finite.append(f"{label}: loss")
        self.non_finite.extend(
            f"{label}: grad of {name}"
            for name, tensor in tensors
            if tensor.grad is not None and not bool(torch.isfinite(tensor.grad).all())
        )


def _draw_loss_problem(case: LossCase) -> _LossDraw:
    """Labels (``<NUM>`` on every other position, some or all ignored), the mask and the numeric targets."""
    B, S = _LOSS_B, _LOSS_S
    generator = torch.Generator().manual_seed(case.seed)
    labels = torch.randint(0, _LOSS_V, (B, S), generator=generator)
    labels[:, 1::2] = _LOSS_NUM_ID  # regression targets on every other position
    if case.labels == "some_ignored":
        labels[:, ::3] = -100
    elif case.labels == "all_ignored":
        labels[:] = -100
    masks = {
        "none": None,
        "full": torch.ones(B, S, dtype=torch.long),
        "left_padded": torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
        "one_row_all_padding": torch.tensor([[0] * S, [1] * S]),
        "all_padding": torch.zeros(B, S, dtype=torch.long),
    }
    targets = _extreme_tensor((B, S), case.target_magnitudes, generator)
    return _LossDraw(case, generator, labels, masks[case.mask], targets, [])


def _given_decisions_loss(draw: _LossDraw) -> tuple[torch.Tensor, torch.Tensor]:
    """(1) `total_loss` on directly given decisions and a learnable per-class threshold; ``(loc_S, scale_S)``."""
    from causalqwen.losses import total_loss

    B, S, V = _LOSS_B, _LOSS_S, _LOSS_V
    loc_S = draw.extreme((B, S, V)).requires_grad_()
    scale_S = draw.scales((B, S, V)).requires_grad_()
    loc_Y = draw.extreme((B, S)).requires_grad_()
    scale_Y = draw.scales((B, S)).requires_grad_()
    threshold = torch.full((V,), draw.case.threshold).requires_grad_()
    parts = total_loss(loc_S, scale_S, loc_Y, scale_Y, draw.labels, draw.targets, threshold=threshold, **draw.settings)
    parts.total.backward()
    draw.judge(
        "total_loss",
        parts.total,
        [("loc_S", loc_S), ("scale_S", scale_S), ("loc_Y", loc_Y), ("scale_Y", scale_Y), ("threshold", threshold)],
    )
    return loc_S, scale_S


def _action_network_losses(draw: _LossDraw) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(2), (3) the literal and the fused path through an ActionNetwork with weights of magnitude <= 1
    (so $|\mathrm{loc}_S| \le C |\mathrm{loc}_U|$); ``(loc_U, scale_U)``."""
    from causalqwen.action import ActionNetwork
    from causalqwen.kernels.fused import fused_loss
    from causalqwen.losses import total_loss

    case = draw.case
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        action = ActionNetwork(_LOSS_C, _LOSS_V, noise_init=0.0 if case.scale_at_eps else 0.1, scale_eps=_LOSS_EPS)
    with torch.no_grad():
        action.classification_head.weight.uniform_(-1.0, 1.0, generator=draw.generator)
    loc_U = draw.extreme((_LOSS_B, _LOSS_S, _LOSS_C))
    scale_U = draw.scales((_LOSS_B, _LOSS_S, _LOSS_C))
    for label in ("literal", "fused"):
        action.zero_grad(set_to_none=True)
        loc, scale = loc_U.clone().requires_grad_(), scale_U.clone().requires_grad_()
        if label == "literal":
            decision = action(loc, scale)
            parts = total_loss(*decision, draw.labels, draw.targets, threshold=case.threshold, **draw.settings)
        else:
            parts, _ = fused_loss(
                action, loc, scale, draw.labels, draw.targets, threshold=case.threshold, **draw.settings
            )
        parts.total.backward()
        draw.judge(label, parts.total, [("loc_U", loc), ("scale_U", scale), *action.named_parameters()])
    return loc_U, scale_U


def run_loss_case(case: LossCase) -> FiniteCheck:
    """Three loss computations on one draw, each followed by backward:

    - `losses.total_loss` on directly given ``loc_S``, ``scale_S``, ``loc_Y``, ``scale_Y`` and a
      learnable per-class threshold;
    - the literal path ``ActionNetwork`` → `total_loss` from ``loc_U``, ``scale_U``;
    - the fused path `kernels.fused.fused_loss` from the same ``loc_U``, ``scale_U``.
    """
    draw = _draw_loss_problem(case)
    loc_S, scale_S = _given_decisions_loss(draw)
    loc_U, scale_U = _action_network_losses(draw)
    max_abs_loc = max(loc_S.detach().abs().max().item(), loc_U.abs().max().item())
    min_scale = min(scale_S.detach().min().item(), scale_U.min().item())
    return FiniteCheck(draw.non_finite, max_abs_loc, min_scale)


def _signed(rng: random.Random, magnitudes) -> float:
    return rng.choice(magnitudes) * rng.choice((-1.0, 1.0))


def random_model_case(rng: random.Random) -> ModelCase:
    """A `ModelCase` drawn uniformly from the choice lists above (the report's fixed-seed sample)."""
    return ModelCase(
        values=tuple(_signed(rng, NUMBER_MAGNITUDES) for _ in range(6)),
        targets=tuple(_signed(rng, NUMBER_MAGNITUDES) for _ in range(6)),
        **{field: rng.choice(choices) for field, choices in MODEL_CASE_CHOICES.items()},
    )


def random_loss_case(rng: random.Random) -> LossCase:
    """A `LossCase` drawn uniformly from the choice lists above."""
    return LossCase(
        seed=rng.randrange(2**31),
        loc_magnitudes=tuple(sorted(rng.sample(LOC_MAGNITUDES, rng.randint(1, len(LOC_MAGNITUDES))))),
        scale_at_eps=rng.random() < 0.5,
        threshold=rng.choice(THRESHOLDS),
        target_magnitudes=tuple(sorted(rng.sample(NUMBER_MAGNITUDES, rng.randint(1, len(NUMBER_MAGNITUDES))))),
        labels=rng.choice(LABEL_PATTERNS[:3]),
        mask=rng.choice(MASK_PATTERNS),
    )
