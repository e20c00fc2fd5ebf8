r"""transformers' `Trainer` with the bound on how far $U$ moves, $\bar D(U, U_{\mathrm{base}}) \le \varepsilon$.

`DivergenceBoundTrainer` holds a `causalqwen.divergence.DivergenceBound` (the Lagrange multiplier and the base law
of $U$) and adds its penalty $\mu \bar D$ to each training loss; a callback takes the multiplier's dual-ascent step
after each optimizer step, as `causalqwen.train` does.
"""

from __future__ import annotations

from transformers import Trainer, TrainerCallback

from ..divergence import DivergenceBound

__all__ = ["DivergenceBoundTrainer"]


class _DualAscentCallback(TrainerCallback):
    """After each optimizer step of `transformers.Trainer`: the bound's dual-ascent step."""

    def __init__(self, bound: DivergenceBound):
        self.bound = bound

    def on_step_end(self, args, state, control, **kwargs):
        self.bound.step()


class DivergenceBoundTrainer(Trainer):
    r"""`transformers.Trainer` with the bound $\bar D(U, U_{\mathrm{base}}) \le \varepsilon$ (`DivergenceBound`).

    The keyword arguments ``max_u_divergence`` ($\varepsilon$), ``preset`` (what is trained, which picks the base
    reference: ``"causal"``, ``"abduction"``, ``"all"`` or ``"lora"``) and ``divergence_dual_lr`` ($\eta_\mu$) are
    this class's; everything else goes to `Trainer`. The base law is the model's as it is when the trainer is made.
    Training losses include $\mu \bar D$; evaluation losses do not. The logs carry ``constraint/u_divergence``
    and ``constraint/multiplier``. With gradient accumulation, $\mu$ steps once per optimizer step, on the mean
    divergence of the accumulated batches.
    """

    def __init__(
        self, *args, max_u_divergence: float, preset: str = "causal", divergence_dual_lr: float = 1.0, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.divergence_bound = DivergenceBound(self.model, max_u_divergence, preset, dual_lr=divergence_dual_lr)
        self.add_callback(_DualAscentCallback(self.divergence_bound))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with self.divergence_bound.capturing_features():
            outputs = model(**inputs)
        loss = outputs.loss + self.divergence_bound.penalty(outputs, inputs)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs and self.divergence_bound.last_divergence is not None:
            logs = logs | self.divergence_bound.metrics()
        super().log(logs, *args, **kwargs)
