r"""The decision head: the action network plus everything that turns the law of $U$ into decisions.

`DecisionHead` is the one owner of the decision state: $W_{\mathrm{cls}}$, $b_{\mathrm{cls}}$, $b_{\mathrm{noise}}$
and the
regression head (inherited from `ActionNetwork`), the OvR threshold $C_k$, ``scale_eps``, the ``<NUM>`` id,
``ignore_index`` and the loss weights, which the loss reads from it (`causalqwen.model.CausalLM` passes the head to
the loss function). Every decision downstream of $U$ goes through it:

| method | what it gives |
|---|---|
| ``forward`` / ``decide`` | the law of $S_k$ and $Y$ (decision D7) from the law of $U$ / from a decision input |
| ``probabilities``, ``log_probabilities`` | $P_k = P(S_k > C_k)$ and its logs (D8) |
| ``predict`` | $\arg\max_k P_k$ and $\mathrm{loc}_Y$ at ``<NUM>`` (D11) |
| ``standard_token`` | ``predict``'s token under standard inference, from the law of $U$ |
| ``decide_step`` | the decision in one of the four decision modes (D11) |
| ``choose`` | one generation step's (token, value) in any of the five modes (D11) |
| ``step_scores`` | one step's scores for transformers' generation loop |

The threshold is always a tensor: a ``[V]`` buffer (``ovr_threshold_per_class``) or a parameter
(``learnable_threshold``, ``[]`` or ``[V]``), saved with the weights; otherwise the config's number as a 0-d float64
tensor on the CPU, which torch uses as a scalar beside tensors of any device and dtype (so it is exact, moves with
no ``.to()`` and is not saved). A per-class or learnable threshold is cast with the weights, as every buffer and
parameter is: after ``model.to(torch.bfloat16)`` its $C_k$ are bfloat16 numbers (0.773585 becomes 0.773438), where the
shared one keeps the config's value.

The rules themselves have one owner each, which the head calls: the decision laws, the noise infusion and every
OvR quantity ($P_k$, its logs, the argmax, the ``<NUM>`` gate) `causalqwen.action`, the value at ``<NUM>`` and
every mode's decision input `causalqwen.inference`, the loss `causalqwen.losses` (and the implementations its
`LOSS_FUNCTIONS` name). They check their inputs while `causalqwen.cauchy.validating`; the model runs the head under
``cauchy.validation(False)`` once its door has checked.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from . import inference
from .action import ActionNetwork, ActionOutput, ovr_log_probability, ovr_probability, ovr_tail_nll, ovr_token
from .losses import NextTokenTargets, next_token_targets

__all__ = ["STANDARD_TOKEN_FUNCTIONS", "Choice", "DecisionHead", "standard_token_function"]


class Choice(NamedTuple):
    """One generation step: the chosen token and value per row, and the decision input $U'$ that led to it."""

    token: Tensor  # [B] long
    value: Tensor  # [B]: loc_Y where the token is <NUM>, 0.0 elsewhere
    loc: Tensor  # [B, C]
    scale: Tensor  # [B, C]


def literal_standard_token(head: DecisionHead, loc_U: Tensor, scale_U: Tensor) -> Tensor:
    r"""$\arg\max_k P_k$ of the standard decisions ``head(loc_U, scale_U)`` ``[..., V]``: `DecisionHead.predict`'s
    token."""
    return head.predict(head(loc_U, scale_U))[0]  # [...]


# ``standard_token``'s implementations by ``config.loss_algorithm``, each where it lives, imported on first use
STANDARD_TOKEN_FUNCTIONS = {
    "fused": "causalqwen.kernels.fused:fused_standard_token",
    "literal": "causalqwen.decision:literal_standard_token",
}


@functools.cache
def standard_token_function(name: str) -> Callable[..., Tensor]:
    """The implementation ``name`` of `STANDARD_TOKEN_FUNCTIONS`, imported on its first use."""
    module, function = STANDARD_TOKEN_FUNCTIONS[name].split(":")
    return getattr(importlib.import_module(module), function)


class DecisionHead(ActionNetwork):
    """`ActionNetwork` plus the threshold, the ``<NUM>`` id and the loss settings of a `CausalQwenConfig`."""

    def __init__(self, config):
        super().__init__(config.causal_size, config.vocab_size, config.noise_init, config.scale_eps)
        self.config = config  # the settings stay the config's: the head reads them, never copies them
        if config.ovr_threshold_per_class or config.learnable_threshold:
            threshold = torch.full((config.vocab_size,) if config.ovr_threshold_per_class else (), config.ovr_threshold)
            if config.learnable_threshold:
                self.ovr_threshold = nn.Parameter(threshold)  # [] or [V]
            else:
                self.register_buffer("ovr_threshold", threshold, persistent=True)  # [V]
        else:
            self.ovr_threshold = torch.tensor(config.ovr_threshold, dtype=torch.float64, device="cpu")  # [] a scalar

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Decision D7, and the threshold back at ``ovr_threshold``."""
        super().reset_parameters()
        if hasattr(self, "ovr_threshold"):  # not yet while ActionNetwork.__init__ runs
            nn.init.constant_(self.ovr_threshold, self.config.ovr_threshold)

    @torch.no_grad()
    def resize_thresholds(self, num_classes: int) -> None:
        """A per-class threshold ``[V]`` follows the number of classes (`causalqwen.integrations.vocabulary`): the
        classes kept keep theirs, new ones start at ``config.ovr_threshold``; a shared one is left as it is. A
        learnable one stays a parameter, on its device and in its dtype."""
        old = self.ovr_threshold
        if old.dim() == 0 or old.shape[0] == num_classes:
            return
        new = torch.full((num_classes,), self.config.ovr_threshold, dtype=old.dtype, device=old.device)  # [V']
        kept = min(num_classes, old.shape[0])
        new[:kept] = old[:kept]
        if isinstance(old, nn.Parameter):
            self.ovr_threshold = nn.Parameter(new, requires_grad=old.requires_grad)
        else:
            self.ovr_threshold = new  # a registered buffer stays one

    @property
    def num_token_id(self) -> int:
        return self.config.num_token_id

    @property
    def ignore_index(self) -> int:
        return self.config.ignore_index

    # ---- probabilities and prediction ----

    def log_probabilities(self, decision: ActionOutput) -> tuple[Tensor, Tensor]:
        r"""$(\log P_k, \log(1 - P_k))$, ``[..., V]`` each (`action.ovr_log_probability`)."""
        return ovr_log_probability(decision.loc_S, decision.scale_S, self.ovr_threshold)

    def probabilities(self, decision: ActionOutput) -> Tensor:
        r"""$P_k = P(S_k > C_k)$ (`action.ovr_probability`), ``[..., V]``, in the dtype of ``decision.loc_S``."""
        return ovr_probability(decision.loc_S, decision.scale_S, self.ovr_threshold.to(decision.loc_S))

    def predict(self, decision: ActionOutput) -> tuple[Tensor, Tensor]:
        r"""$\hat k = \arg\max_k P_k$ (`action.ovr_token`) and its value, $\mathrm{loc}_Y$ at ``<NUM>`` and 0.0
        elsewhere (`inference.predicted_value`); ``[...]`` each."""
        token = ovr_token(decision.loc_S, decision.scale_S, self.ovr_threshold)  # [...]
        return token, inference.predicted_value(token, decision.loc_Y, self.num_token_id)

    def standard_token(self, loc_U: Tensor, scale_U: Tensor) -> Tensor:
        r"""`predict`'s token under standard inference from the law of $U$ ``[N, C]``, by ``config.loss_algorithm``
        (`STANDARD_TOKEN_FUNCTIONS`): ``literal`` forms the ``[N, V]`` decisions, ``fused`` takes the argmax tile by
        tile (`causalqwen.kernels.tiles.ovr_argmax`), for the vocabulary sizes where they would not fit."""
        return standard_token_function(self.config.loss_algorithm)(self, loc_U, scale_U)  # [N]

    # ---- one step of generation, in a mode ----

    def decide_step(
        self,
        mode: str,
        loc_U: Tensor,
        scale_U: Tensor,
        *,
        abs_weight: Tensor | None = None,
        uniform=None,
        noise=None,
        generator=None,
    ) -> tuple[ActionOutput, Tensor, Tensor]:
        r"""The decision in one of the four decision modes for rows with law of $U$ ``[..., C]``: the mode's decision
        input $U'$ (`inference.decision_input`) and the class and value laws the action network maps it to
        (`decide`). Returns ``(decision, loc, scale)`` with $U'$ = ``(loc, scale)``."""
        loc, scale = inference.decision_input(
            mode, loc_U, scale_U, self.noise_scale, uniform=uniform, noise=noise, generator=generator
        )
        return self.decide(loc, scale, abs_weight=abs_weight), loc, scale  # [..., V] x2, [...] x2; U'

    def choose(
        self,
        mode: str,
        loc_U: Tensor,
        scale_U: Tensor,
        *,
        abs_weight: Tensor | None = None,
        uniform=None,
        noise=None,
        generator=None,
        sampling=None,
    ) -> Choice:
        r"""One step's (token, value) for rows with law of $U$ ``[B, C]``, in any of the five modes (decision D11).

        The four decision modes decide (`decide_step`) and take the OvR argmax (`predict`). ``traditional``
        samples the token from `inference.traditional_probabilities` with
        ``sampling = (temperature, top_k, top_p, normalize)`` on the standard decision input; with
        ``normalize="softmax"`` that needs the class locations alone (`locations`), so a step costs one
        $[V, C]$ product, as Qwen's lm_head does, instead of two.
        """
        if mode != "traditional":
            decision, loc, scale = self.decide_step(
                mode, loc_U, scale_U, abs_weight=abs_weight, uniform=uniform, noise=noise, generator=generator
            )
            return Choice(*self.predict(decision), loc, scale)  # [B] x2, [B, C] x2
        temperature, top_k, top_p, normalize = sampling
        loc, scale = inference.decision_input("standard", loc_U, scale_U, self.noise_scale)
        if normalize == "softmax":
            (loc_S, loc_Y), scale_S = self.locations(loc), None  # [B, V], [B]
        else:
            loc_S, scale_S, loc_Y, _ = self.decide(loc, scale, abs_weight=abs_weight)
        probs = inference.traditional_probabilities(
            loc_S, temperature, top_k, top_p, scale_S=scale_S, threshold=self.ovr_threshold, normalize=normalize
        )
        token = inference.sample_token(probs, generator)  # [B]
        return Choice(token, inference.predicted_value(token, loc_Y, self.num_token_id), loc, scale)

    def step_scores(
        self,
        mode: str,
        loc_U: Tensor,
        scale_U: Tensor,
        *,
        abs_weight: Tensor | None = None,
        uniform=None,
        noise=None,
        generator=None,
    ) -> tuple[Tensor, Tensor]:
        r"""The scores a transformers generation loop picks the next token from, ``[B, V]``, and $\mathrm{loc}_Y$
        ``[B]``,
        for rows with law of $U$ ``[B, C]``: $\log P_k$ of the mode's decision, whose argmax is the mode's
        choice, or for ``traditional`` the class locations $\mathrm{loc}_S$ of the standard input (`locations`,
        one $[V, C]$ product), which transformers' temperature, top-k, top-p and softmax sampling then use."""
        if mode == "traditional":
            return self.locations(loc_U)  # the standard input's location is loc_U
        decision, _, _ = self.decide_step(
            mode, loc_U, scale_U, abs_weight=abs_weight, uniform=uniform, noise=noise, generator=generator
        )
        neg_log_p, _ = ovr_tail_nll(decision.loc_S, decision.scale_S, self.ovr_threshold, off=False)
        return -neg_log_p, decision.loc_Y

    # ---- the scoring rule and the loss ----

    def next_token_targets(
        self, labels: Tensor, numeric_targets: Tensor | None, attention_mask: Tensor | None
    ) -> NextTokenTargets:
        """`next_token_targets` with this head's ``ignore_index`` and ``<NUM>`` id."""
        config = self.config
        return next_token_targets(labels, numeric_targets, attention_mask, config.ignore_index, config.num_token_id)
