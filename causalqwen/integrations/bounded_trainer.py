r"""transformers' `Trainer` with the bound on how far $U$ moves, $\bar D(U, U_{\mathrm{base}}) \le \varepsilon$.

`DivergenceBoundTrainer` holds a `causalqwen.divergence.DivergenceBound` (the Lagrange multiplier and the base law
of $U$) and adds its penalty $\mu \bar D$ to each training loss; a callback takes the bound's projection and the
multiplier's dual-ascent step after each optimizer step, as `causalqwen.train` does.
"""

from __future__ import annotations

from transformers import Trainer, TrainerCallback

from ..divergence import DivergenceBound, check_bound_setting

__all__ = ["DivergenceBoundTrainer"]


class _DualAscentCallback(TrainerCallback):
    """After each optimizer step of `transformers.Trainer`: the bound's projection and dual-ascent step, under the
    trainer's autocast (the projection runs the model forward for presets other than ``abduction``)."""

    def __init__(self, trainer: DivergenceBoundTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        with self.trainer.compute_loss_context_manager():
            self.trainer.divergence_bound.step()


class DivergenceBoundTrainer(Trainer):
    r"""`transformers.Trainer` with the bound $\bar D(U, U_{\mathrm{base}}) \le \varepsilon$ (`DivergenceBound`).

    The keyword arguments ``max_u_divergence`` ($\varepsilon$), ``preset`` (what is trained, which picks the base
    reference: ``"causal"``, ``"abduction"``, ``"all"`` or ``"lora"``) and ``divergence_dual_lr`` ($\eta_\mu$) are
    this class's; everything else goes to `Trainer`. The base law is the model's as it is when the trainer is made.
    Training losses include $\mu \bar D$; evaluation losses do not. After each optimizer step the parameters that
    move $U$ are projected back within the bound on the step's batches (`DivergenceBound.project`). The logs carry
    ``constraint/u_divergence``, ``constraint/multiplier`` and ``constraint/projection``. With gradient
    accumulation, $\mu$ steps once per optimizer step, on the mean divergence of the accumulated batches. A bad
    ``max_u_divergence`` (not a finite number > 0) or ``divergence_dual_lr`` is a ``ValueError`` naming it.
    """

    def __init__(
        self, *args, max_u_divergence: float, preset: str = "causal", divergence_dual_lr: float = 1.0, **kwargs
    ):
        check_bound_setting("max_u_divergence", max_u_divergence, positive=True)  # before Trainer sets anything up
        check_bound_setting("divergence_dual_lr", divergence_dual_lr, positive=False)
        super().__init__(*args, **kwargs)
        self.divergence_bound = DivergenceBound(self.model, max_u_divergence, preset, dual_lr=divergence_dual_lr)
        self.add_callback(_DualAscentCallback(self))

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
