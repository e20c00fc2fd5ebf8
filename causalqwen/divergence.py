r"""Bounded-divergence fine-tuning: keep the law of $U$ near the base model's (the design's bound on forgetting).

The design asks to fine-tune the abduction network on a new domain *subject to*
$D(U, U_{\mathrm{base}}) \le \varepsilon$.
The divergence is the Kullback–Leibler divergence of the two Cauchy laws of $U$ at each scored position, summed
over the $C$ independent components (`causalqwen.cauchy.kl_divergence`), and averaged over the $N$ real
positions of the batch:

$$\bar D(\theta) = \frac1N \sum_{i} \sum_{c=1}^{C}
\mathrm{KL}\big(\mathrm{Cauchy}(\mathrm{loc}_{U,ic}, \mathrm{scale}_{U,ic}) \,\big\|\,
\mathrm{Cauchy}(\mathrm{loc}^{\mathrm{base}}_{U,ic}, \mathrm{scale}^{\mathrm{base}}_{U,ic})\big).$$

The constraint $\bar D \le \varepsilon$ is held with a Lagrange multiplier $\mu \ge 0$ (the Lagrangian
$L(\theta) + \mu(\bar D(\theta) - \varepsilon)$): the parameters take a gradient step on

$$L(\theta) + \mu\, \bar D(\theta)$$

($-\mu\varepsilon$ has no gradient), and after each step $\mu$ takes a projected dual-ascent step on the
measured violation,

$$\mu \leftarrow \max\big(0,\ \mu + \eta_\mu\, (\bar D - \varepsilon)\big),$$

so $\mu$ grows while the bound is exceeded and decays back to 0 once it holds with room to spare. A fixed
penalty is the special case $\eta_\mu = 0$ with a starting $\mu$.

The multiplier alone does not hold the bound at a small $\gamma$: Adam moves each weight by about its learning rate
whatever the size of the gradient, and at $\gamma = 0.1$ one such step of $\mathrm{loc}_U$ costs more than a small
$\varepsilon$ (the divergence of a move $\Delta$ is $\log(1 + \Delta^2/4\gamma^2)$ per component). So after each
optimizer step the bound also *projects*: when $\bar D$ of the step's batch, measured with the new parameters,
exceeds $\varepsilon$, the parameters that move $U$ are pulled back along the segment to their base values,

$$\theta \leftarrow \theta_{\mathrm{base}} + t\,(\theta - \theta_{\mathrm{base}}),$$

with the largest $t \in [0, 1]$ that keeps $\bar D \le \varepsilon$ ($\bar D = 0$ at $t = 0$), found by
`PROJECTION_HALVINGS` halvings of the interval below or above the first guess
$t_0 = \sqrt{\varepsilon / \bar D(1)}$. After every step the batch just trained on is within the bound.

Where the base law comes from depends on what is trained (`BaseLawOfU`):

* abduction network alone (preset ``abduction``): a frozen copy of the base abduction network applied to the
  *same* features $z$ as the fine-tuned one (captured from the forward pass, so it costs two small matrix
  products); with the rest frozen, these are the base's own features;
* numerical embedding and abduction (preset ``causal``): the model's own backbone run with the base values of
  those two modules (`torch.func.functional_call` with frozen copies of their parameters: one more forward pass,
  no second backbone held). The numerical embedding moves $z$ itself after a number, so the base features differ
  from the fine-tuned ones there, and the bound is on the whole law of $U$, as the design states it;
* backbone trained in full (preset ``all``): the base model's own pass, by a frozen copy of the base
  `CausalQwenModel`;
* LoRA (preset ``lora``): the same model with its adapters disabled (`adapters_disabled`, peft's
  ``disable_adapter``), which also switches to the base copies of the modules trained beside the adapters
  (numerical embedding, abduction, head), so no second model is held: the cost is one more forward pass.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .cauchy import kl_divergence, validation
from .losses import at_least_float32

__all__ = ["u_divergence", "BaseLawOfU", "DivergenceBound", "adapters_disabled", "dual_ascent", "PROJECTION_HALVINGS"]

PROJECTION_HALVINGS = 10  # halvings in the projection's search for t: within 1/1024 of its interval


def check_bound_setting(name: str, value, *, positive: bool) -> float:
    """``value`` as a float: a finite number, > 0 when ``positive``, else >= 0; a ValueError naming ``name``."""
    wanted = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number {wanted}, got {value!r}")
    if (positive and not value > 0) or value < 0:
        raise ValueError(f"{name} must be a finite number {wanted}, got {value!r}")
    return float(value)


def u_divergence(
    loc_U: Tensor, scale_U: Tensor, base_loc_U: Tensor, base_scale_U: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""$\sum_i \sum_c \mathrm{KL}$ over the positions where ``mask`` is true, and their number: ``(sum, count)``.

    ``[B, S, C]`` four times and a ``[B, S]`` mask (all positions when None). The mean $\bar D$ is
    ``sum / count``; the two are returned apart so that several processes can add them up first.
    `kl_divergence` checks the laws while `causalqwen.cauchy.validating`. The
    divergence is computed in at least float32 (the laws come in bfloat16 under autocast).
    """
    laws = (at_least_float32(t) for t in (loc_U, scale_U, base_loc_U, base_scale_U))  # bf16 under autocast
    per_position = kl_divergence(*laws).sum(-1)  # [B, S]
    if mask is None:
        return per_position.sum(), torch.tensor(per_position.numel(), device=per_position.device)
    mask = mask.bool()
    return torch.where(mask, per_position, 0.0).sum(), mask.sum()  # no boolean indexing: no host synchronisation


def dual_ascent(multiplier: float, divergence: float, max_divergence: float, dual_lr: float) -> float:
    r"""$\max(0, \mu + \eta_\mu(\bar D - \varepsilon))$."""
    return max(0.0, multiplier + dual_lr * (divergence - max_divergence))


def _causal_lm(model) -> nn.Module:
    """The `CausalQwenForCausalLM` inside ``model`` (itself, or the one a `peft.PeftModel` wraps)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def adapters_disabled(peft_model):
    r"""peft's ``peft_model.disable_adapter()``, with every parameter's ``requires_grad`` restored on exit.

    Inside peft's ``disable_adapter()`` (peft 0.21):

    - every LoRA layer computes $W x$ alone (the $BA$ term is skipped, not zeroed);
    - every ``ModulesToSaveWrapper`` runs its ``original_module``: its ``forward`` *and* every attribute read
      through it (``action.classification_head``, ``action.ovr_threshold``, ...) go to the base's copy, not to
      the trained one;
    - hence the whole forward pass is the base model's: base backbone, base numerical embedding, base abduction,
      base head. Its $(\mathrm{loc}_U, \mathrm{scale}_U)$ is the base model's law of $U$, equal bit for bit to the
      untouched model's, however long the adapter has been trained;
    - no parameter requires a gradient inside (peft sets ``requires_grad=False`` on the LoRA matrices and the trained
      copies, and the base weights are frozen), so the outputs carry no autograd graph: a reference for a divergence
      penalty needs no ``torch.no_grad`` and costs no activation memory for backward.

    On leaving the context peft sets ``requires_grad=True`` on *every* LoRA matrix and trained copy of the active
    adapter, whatever it was before: an adapter loaded for inference (``requires_grad=False``) becomes trainable
    after one ``disable_adapter()`` block. This function is that context with the flags put back as they were.
    """
    flags = [(parameter, parameter.requires_grad) for parameter in peft_model.parameters()]
    try:
        with peft_model.disable_adapter():
            yield peft_model
    finally:
        for parameter, requires_grad in flags:
            parameter.requires_grad_(requires_grad)


class BaseLawOfU:
    """The base model's law of $U$ on a batch, as the preset determines (see the module docstring).

    Made once, at the start of fine-tuning, from the model as it is then. ``kind`` is ``"abduction"`` (a
    frozen copy of the abduction network on the captured $z$), ``"embedding_and_abduction"`` (the model's own pass
    with frozen copies of its numerical embedding and abduction network), ``"backbone"`` (a frozen copy of the
    whole `CausalQwenModel`) or ``"adapters"`` (the `PeftModel` itself with its adapters disabled).
    """

    KINDS = ("abduction", "embedding_and_abduction", "backbone", "adapters")

    def __init__(self, model, kind: str):
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {', '.join(self.KINDS)}, got {kind!r}")
        if kind == "adapters" and not hasattr(model, "disable_adapter"):
            raise TypeError("the adapter-disabled base pass needs a peft model (causalqwen.integrations.lora.add_lora)")
        self.kind = kind
        self.model = model
        self.frozen = None
        if kind == "abduction":
            self.frozen = copy.deepcopy(_causal_lm(model).model.abduction)
        elif kind == "embedding_and_abduction":  # named as in CausalQwenModel, for functional_call
            inner = _causal_lm(model).model
            self.frozen = nn.ModuleDict(
                {
                    "numerical_embedding": copy.deepcopy(inner.numerical_embedding),
                    "abduction": copy.deepcopy(inner.abduction),
                }
            )
        elif kind == "backbone":
            self.frozen = copy.deepcopy(_causal_lm(model).model)
        if self.frozen is not None:
            self.frozen.requires_grad_(False).eval()
        self._z = None
        self._hook = None

    @contextlib.contextmanager
    def capturing_features(self):
        """While open, the features $z$ that the model's abduction network receives are kept (kind ``abduction``);
        `law` reads the last ones kept, until the next ``capturing_features`` starts afresh."""
        self._z = None
        if self.kind != "abduction":
            yield
            return

        def keep(module, inputs):
            self._z = inputs[0].detach()

        self._hook = _causal_lm(self.model).model.abduction.register_forward_pre_hook(keep)
        try:
            yield
        finally:
            self._hook.remove()
            self._hook = None

    def captured_features(self) -> Tensor | None:
        """The features $z$ kept by the last `capturing_features` (kind ``abduction``; None for the others)."""
        return self._z

    @torch.no_grad()
    def law(self, batch: dict) -> tuple[Tensor, Tensor]:
        """The base's ``(loc_U, scale_U)`` ``[B, S, C]`` on ``batch`` (after the fine-tuned forward, for
        ``abduction``)."""
        if self.kind == "abduction":
            if self._z is None:
                raise RuntimeError("no features captured: run the model's forward inside capturing_features() first")
            return self.frozen(self._z)
        inputs = {k: batch[k] for k in ("input_ids", "numeric_values", "attention_mask") if k in batch}
        if self.kind == "embedding_and_abduction":
            base_values = dict(self.frozen.named_parameters()) | dict(self.frozen.named_buffers())
            out = torch.func.functional_call(
                _causal_lm(self.model).model, base_values, args=(), kwargs=inputs, strict=False
            )
            return out.loc_U, out.scale_U
        if self.kind == "backbone":
            out = self.frozen(**inputs)
            return out.loc_U, out.scale_U
        with adapters_disabled(self.model):  # peft's disable_adapter, trainable flags kept
            out = _causal_lm(self.model).model(**inputs)
        return out.loc_U, out.scale_U

    def fine_tuned_law(self, batch: dict, features: Tensor | None) -> tuple[Tensor, Tensor]:
        """The model's own ``(loc_U, scale_U)`` ``[B, S, C]`` on ``batch`` as its parameters are now, without a graph:
        for ``abduction`` its abduction network on the ``features`` captured with ``batch``, else its forward pass."""
        with torch.no_grad():
            if self.kind == "abduction":
                return _causal_lm(self.model).model.abduction(features)
            inputs = {k: batch[k] for k in ("input_ids", "numeric_values", "attention_mask") if k in batch}
            out = _causal_lm(self.model).model(**inputs)
            return out.loc_U, out.scale_U

    def moving_parameters(self) -> list[tuple[Tensor, Tensor | None]]:
        """``(trained parameter, its base value)`` for every trainable parameter that moves $U$; None stands for a
        base value of zero (a LoRA ``B`` matrix: scaling it by $t$ scales the adapter's update $BA$ by $t$).

        ``abduction``: the abduction network; ``embedding_and_abduction``: the numerical embedding and the
        abduction network; ``backbone``: the whole `CausalQwenModel`; ``adapters``: every LoRA ``B`` and the trained
        copies of the numerical embedding and the abduction network (the head moves no $U$ and is left alone)."""
        if self.kind == "adapters":
            named = dict(self.model.named_parameters())
            pairs = []
            for name, parameter in named.items():
                if not parameter.requires_grad:
                    continue
                if ".lora_B." in name:
                    pairs.append((parameter, None))
                elif ".modules_to_save." in name and (".abduction." in name or ".numerical_embedding." in name):
                    original = name.replace(".modules_to_save.default.", ".original_module.")
                    pairs.append((parameter, named[original]))
            return pairs
        inner = _causal_lm(self.model).model
        live = {
            "abduction": inner.abduction,
            "embedding_and_abduction": nn.ModuleDict(
                {"numerical_embedding": inner.numerical_embedding, "abduction": inner.abduction}
            ),
            "backbone": inner,
        }[self.kind]
        frozen = dict(self.frozen.named_parameters())
        return [(parameter, frozen[name]) for name, parameter in live.named_parameters() if parameter.requires_grad]

    def state_dict(self) -> dict[str, Tensor]:
        """The frozen reference's tensors (empty for ``adapters``: the base lives in the model itself)."""
        return {} if self.frozen is None else {k: v.detach().cpu() for k, v in self.frozen.state_dict().items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load what `state_dict` gave (the checks of a file read back are `causalqwen.app.runs.load_bound`'s)."""
        if self.frozen is not None:
            self.frozen.load_state_dict(state, strict=True)


PRESET_REFERENCE = {
    "causal": "embedding_and_abduction",
    "abduction": "abduction",
    "all": "backbone",
    "lora": "adapters",
}


class DivergenceBound:
    r"""$\bar D(U, U_{\mathrm{base}}) \le \varepsilon$ during fine-tuning, by a Lagrange multiplier and a projection
    (module docstring).

    Use, per optimisation step::

        with bound.capturing_features():
            out = model(**batch)
        loss = out.loss + bound.penalty(out, batch)      # L + mu * D
        loss.backward(); optimizer.step()
        bound.step()                                      # project if D > eps; mu <- max(0, mu + eta (D - eps))

    ``max_divergence`` is $\varepsilon$ (nats, per position, summed over the $C$ components; > 0); ``dual_lr`` is
    $\eta_\mu$; ``multiplier`` the starting $\mu$. ``preset`` picks the base reference (`PRESET_REFERENCE`).
    """

    def __init__(self, model, max_divergence: float, preset: str, dual_lr: float = 1.0, multiplier: float = 0.0):
        self.max_divergence = check_bound_setting("max_divergence", max_divergence, positive=True)
        self.dual_lr = check_bound_setting("dual_lr", dual_lr, positive=False)
        self.multiplier = check_bound_setting("multiplier", multiplier, positive=False)
        if preset not in PRESET_REFERENCE:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESET_REFERENCE)}")
        self.base = BaseLawOfU(model, PRESET_REFERENCE[preset])
        self.last_divergence: float | None = None
        self.last_projection: float = 1.0  # the t of the last step's projection (1: the step was within the bound)
        self._pending: list[Tensor] = []  # the divergence of each batch since the last step (gradient accumulation)
        self._batches: list[tuple] = []  # each such batch, its captured features, its base law: for the projection

    def capturing_features(self):
        return self.base.capturing_features()

    def divergence(self, out, batch: dict) -> tuple[Tensor, Tensor]:
        """``(sum, count)`` of the per-position divergence over the real positions of ``batch`` (`u_divergence`)."""
        base_loc_U, base_scale_U = self.base.law(batch)
        return self._divergence_from(out.loc_U, out.scale_U, base_loc_U, base_scale_U, batch)

    @staticmethod
    def _divergence_from(loc_U, scale_U, base_loc_U, base_scale_U, batch) -> tuple[Tensor, Tensor]:
        # not checked: both laws come from abduction networks, whose scales are clamped at scale_eps > 0
        with validation(False):
            return u_divergence(loc_U, scale_U, base_loc_U, base_scale_U, batch.get("attention_mask"))

    def penalty(self, out, batch: dict) -> Tensor:
        r"""$\mu\, \bar D$ for the loss (differentiable in the fine-tuned law); $\bar D$ is kept for `step`.

        Under DDP ($W$ processes, $n^{(r)}$ positions here, $N$ in all) the mean is over the global batch: the
        sums are all-reduced and this process contributes $W \mu \sum^{(r)} / N$, so that DDP's average of the
        gradients is the one-process gradient (as `causalqwen.training.globally_normalized_loss` does for $L$).
        """
        base_loc_U, base_scale_U = self.base.law(batch)
        self._batches.append((batch, self.base.captured_features(), base_loc_U, base_scale_U))
        total, count = self._divergence_from(out.loc_U, out.scale_U, base_loc_U, base_scale_U, batch)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        global_total, global_count = _global_sums(total.detach(), count)
        self._pending.append(global_total / global_count)
        return self.multiplier * world * total / global_count.to(total.dtype)

    def current_divergence(self) -> float:
        r"""$\bar D$ of the batches `penalty` saw since the last step, with the parameters as they are now."""
        total, count = 0.0, 0
        for batch, features, base_loc_U, base_scale_U in self._batches:
            loc_U, scale_U = self.base.fine_tuned_law(batch, features)
            batch_total, batch_count = self._divergence_from(loc_U, scale_U, base_loc_U, base_scale_U, batch)
            total, count = total + batch_total.double(), count + batch_count
        global_total, global_count = _global_sums(total, count)
        return float(global_total / global_count)

    @torch.no_grad()
    def project(self) -> float:
        r"""After an optimizer step: when $\bar D$ of the step's batches exceeds $\varepsilon$, the parameters that
        move $U$ go back along the segment to their base values, $\theta_{\mathrm{base}} + t(\theta -
        \theta_{\mathrm{base}})$, with the largest $t$ that keeps $\bar D \le \varepsilon$: the first guess
        $\sqrt{\varepsilon / \bar D(1)}$, then `PROJECTION_HALVINGS` halvings of the interval below or above it;
        returns $t$ (1 when the step was within the bound)."""
        if not self._batches:
            raise RuntimeError("no divergence measured yet: call penalty() before project()")
        stepped = self.current_divergence()
        if stepped <= self.max_divergence:
            return 1.0
        pairs = self.base.moving_parameters()
        # First guess: a move of loc_U alone costs log(1 + t^2 a) >= t^2 log(1 + a) per component, so that
        # t = sqrt(eps / D(1)) is the most it allows; the search starts between 0 and there (or there and 1).
        guess = math.sqrt(self.max_divergence / stepped)
        _move_towards_base(pairs, guess)
        low, high, now = (
            (guess, 1.0, guess) if self.current_divergence() <= self.max_divergence else (0.0, guess, guess)
        )
        for _ in range(PROJECTION_HALVINGS):  # D(low) <= eps < D(high); the parameters sit at t = now
            middle = (low + high) / 2
            _move_towards_base(pairs, middle / now)
            now = middle
            if self.current_divergence() <= self.max_divergence:
                low = middle
            else:
                high = middle
        _move_towards_base(pairs, low / now)
        return low

    def step(self, divergence: float | None = None) -> float:
        """After the optimizer step: the projection (`project`, on the batches `penalty` saw since the last step),
        then the dual-ascent step on ``divergence``, by default the mean divergence that `penalty` measured on those
        batches (several with gradient accumulation); returns the new $\\mu$."""
        if divergence is None:
            if not self._pending:
                raise RuntimeError("no divergence measured yet: call penalty() before step()")
            divergence = float(torch.stack(self._pending).mean())
        self.last_projection = self.project() if self._batches else 1.0
        self._pending, self._batches = [], []
        self.last_divergence = divergence
        self.multiplier = dual_ascent(self.multiplier, divergence, self.max_divergence, self.dual_lr)
        return self.multiplier

    def metrics(self) -> dict[str, float]:
        """What the training loop logs: ``constraint/u_divergence``, ``constraint/multiplier``, the bound and
        ``constraint/projection`` (the last step's $t$; 1 when the step stayed within the bound)."""
        return {
            "constraint/u_divergence": self.last_divergence,
            "constraint/multiplier": self.multiplier,
            "constraint/max_u_divergence": self.max_divergence,
            "constraint/projection": self.last_projection,
        }


def _global_sums(total: Tensor, count) -> tuple[Tensor, Tensor]:
    """``(sum, count)`` added up over the DDP processes (as they are with one); the count at least 1."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        sums = torch.stack([total.double(), torch.as_tensor(count, device=total.device).double()])
        dist.all_reduce(sums)
        total, count = sums[0], sums[1]
    return total, torch.as_tensor(count, device=total.device).clamp_min(1)


def _move_towards_base(pairs: list[tuple[Tensor, Tensor | None]], factor: float) -> None:
    r"""$\theta \leftarrow \theta_{\mathrm{base}} + f\,(\theta - \theta_{\mathrm{base}})$ in place for each pair
    (base None: zero); $f = 0$ puts the base value itself."""
    for parameter, base in pairs:
        if base is None:
            parameter.mul_(factor)
        elif factor == 0.0:
            parameter.copy_(base)
        else:
            base = base.to(parameter.dtype)
            parameter.copy_(base + factor * (parameter - base))
