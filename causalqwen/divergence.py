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

__all__ = ["u_divergence", "BaseLawOfU", "DivergenceBound", "adapters_disabled", "dual_ascent"]


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
    r"""$\bar D(U, U_{\mathrm{base}}) \le \varepsilon$ during fine-tuning, by a Lagrange multiplier (module docstring).

    Use, per optimisation step::

        with bound.capturing_features():
            out = model(**batch)
        loss = out.loss + bound.penalty(out, batch)      # L + mu * D
        loss.backward(); optimizer.step()
        bound.step()                                      # mu <- max(0, mu + eta (D - eps))

    ``max_divergence`` is $\varepsilon$ (nats, per position, summed over the $C$ components); ``dual_lr`` is
    $\eta_\mu$; ``multiplier`` the starting $\mu$. ``preset`` picks the base reference (`PRESET_REFERENCE`).
    """

    def __init__(self, model, max_divergence: float, preset: str, dual_lr: float = 1.0, multiplier: float = 0.0):
        for name, value in (("max_divergence", max_divergence), ("dual_lr", dual_lr), ("multiplier", multiplier)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if preset not in PRESET_REFERENCE:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESET_REFERENCE)}")
        self.max_divergence = float(max_divergence)
        self.dual_lr = float(dual_lr)
        self.multiplier = float(multiplier)
        self.base = BaseLawOfU(model, PRESET_REFERENCE[preset])
        self.last_divergence: float | None = None
        self._pending: list[Tensor] = []  # the divergence of each batch since the last step (gradient accumulation)

    def capturing_features(self):
        return self.base.capturing_features()

    def divergence(self, out, batch: dict) -> tuple[Tensor, Tensor]:
        """``(sum, count)`` of the per-position divergence over the real positions of ``batch`` (`u_divergence`)."""
        base_loc_U, base_scale_U = self.base.law(batch)
        # not checked: both laws come from abduction networks, whose scales are clamped at scale_eps > 0
        with validation(False):
            return u_divergence(out.loc_U, out.scale_U, base_loc_U, base_scale_U, batch.get("attention_mask"))

    def penalty(self, out, batch: dict) -> Tensor:
        r"""$\mu\, \bar D$ for the loss (differentiable in the fine-tuned law); $\bar D$ is kept for `step`.

        Under DDP ($W$ processes, $n^{(r)}$ positions here, $N$ in all) the mean is over the global batch: the
        sums are all-reduced and this process contributes $W \mu \sum^{(r)} / N$, so that DDP's average of the
        gradients is the one-process gradient (as `causalqwen.training.globally_normalized_loss` does for $L$).
        """
        total, count = self.divergence(out, batch)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        global_total, global_count = total.detach(), count
        if world > 1:
            sums = torch.stack([total.detach().double(), count.double()])
            dist.all_reduce(sums)
            global_total, global_count = sums[0], sums[1]
        global_count = global_count.clamp_min(1)
        self._pending.append(global_total / global_count)
        return self.multiplier * world * total / global_count.to(total.dtype)

    def step(self, divergence: float | None = None) -> float:
        """The dual-ascent step on ``divergence``, by default the mean divergence of the batches that `penalty` saw
        since the last step (several with gradient accumulation); returns the new $\\mu$."""
        if divergence is None:
            if not self._pending:
                raise RuntimeError("no divergence measured yet: call penalty() before step()")
            divergence = float(torch.stack(self._pending).mean())
        self._pending = []
        self.last_divergence = divergence
        self.multiplier = dual_ascent(self.multiplier, divergence, self.max_divergence, self.dual_lr)
        return self.multiplier

    def metrics(self) -> dict[str, float]:
        """What the training loop logs: ``constraint/u_divergence``, ``constraint/multiplier`` and the bound."""
        return {
            "constraint/u_divergence": self.last_divergence,
            "constraint/multiplier": self.multiplier,
            "constraint/max_u_divergence": self.max_divergence,
        }
