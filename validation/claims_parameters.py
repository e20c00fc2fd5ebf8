r"""Ledger rows about the free parameters (V13): the exogenous noise $b_{\mathrm{noise}}$, the OvR threshold $C_k$ and
the regression gate, measured on the tiny model.

The OvR probabilities compared here are computed from the model's $(\mathrm{loc}_S, \mathrm{scale}_S)$ by SciPy's
``stats.cauchy.sf`` in float64, not by the package; the regression NLL by ``stats.cauchy.logpdf``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from scipy import stats

from causalqwen.app.tiny import build_tiny_causal_lm

from .claims_initialization import TinyStart
from .claims_ledger import DECISIONS, FORWARD, FOUNDATIONS, OVERVIEW, LedgerRow
from .common import fmt

__all__ = ["parameter_rows", "ovr_probabilities", "REGIME_THRESHOLDS", "LITERAL"]

REGIME_THRESHOLDS = (0.0, 10.0, 100.0)  # the drafts' three regimes of C_OvR
OFFSET_SEED = 3
# The literal loss (equal in value and gradient to the default fused one): the fused kernel compiles on first use,
# which costs more than every measurement here together.
LITERAL = {"loss_algorithm": "literal"}


def ovr_probabilities(loc_S: torch.Tensor, scale_S: torch.Tensor, threshold) -> np.ndarray:
    """$P_k = P(S_k > C_k)$ by ``scipy.stats.cauchy.sf`` in float64; ``threshold`` a number or a ``[V]`` array."""
    threshold = np.asarray(threshold, dtype=np.float64)
    return stats.cauchy.sf(threshold, loc_S.detach().double().numpy(), scale_S.detach().double().numpy())


def _outputs(model, batch: dict):
    """The model's decisions on ``batch`` (no labels: with labels the default fused loss forms no decisions)."""
    with torch.no_grad():
        return model(batch["input_ids"], numeric_values=batch["numeric_values"], attention_mask=batch["attention_mask"])


def _loss(model, batch: dict) -> torch.Tensor:
    """The model's loss on ``batch`` (with the graph, for a backward)."""
    return model(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
    ).loss


def noise_sign_row(batch: dict) -> LedgerRow:
    model = build_tiny_causal_lm(seed=0, init_seed=0, **LITERAL).model
    with torch.no_grad():  # a b_noise with components of both signs, so that a flip is not a global symmetry only
        model.action.b_noise.mul_(torch.linspace(-2.0, 2.0, model.action.b_noise.shape[0]))
    flipped = copy.deepcopy(model)
    with torch.no_grad():
        flipped.action.b_noise.neg_()
    first, second = _outputs(model, batch), _outputs(flipped, batch)
    names = ("loc_S", "scale_S", "loc_Y", "scale_Y")
    difference = max(float((getattr(first, name) - getattr(second, name)).abs().max()) for name in names)
    with torch.no_grad():
        difference = max(difference, abs(float(_loss(model, batch)) - float(_loss(flipped, batch))))
    return LedgerRow(
        where=f"{OVERVIEW} §2.4 (and the author's comment on b_noise); {FORWARD} §4.2; decision {DECISIONS['D18']}",
        statement="b_noise is a learnable parameter of the exogenous noise ε ~ Cauchy(0, |b_noise|).",
        method="the tiny model with b_noise of mixed signs, and a copy with every sign flipped: the largest "
        "difference of loc_S, scale_S, loc_Y, scale_Y and the loss on a batch.",
        figures=f"largest difference after flipping every sign: {fmt(difference)}",
        verdict="holds only under its magnitude: only |b_noise| enters, so its sign is unidentifiable (flipping it "
        "changes no output)"
        if difference == 0.0
        else "holds",
    )


def noise_kink_row(batch: dict) -> LedgerRow:
    model = build_tiny_causal_lm(seed=0, init_seed=0, noise_init=0.0, **LITERAL).model
    loss = _loss(model, batch)
    loss.backward()
    gradient = float(model.action.b_noise.grad.abs().max())
    step = 1e-3
    slopes = []
    for sign in (1.0, -1.0):  # one-sided slopes of the loss along one component of b_noise
        moved = copy.deepcopy(model)
        with torch.no_grad():
            moved.action.b_noise[0] = sign * step
        with torch.no_grad():
            slopes.append((float(_loss(moved, batch)) - float(loss)) / step)
    kink = slopes[0] != 0.0 and slopes[0] == slopes[1]
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 5; decision {DECISIONS['D18']}",
        statement="b_noise starts at 0, and the noise's influence is then learned during training.",
        method="the tiny model converted with noise_init = 0: autograd's gradient of the loss in b_noise, and the "
        f"one-sided slopes (L(±h) − L(0))/h, h = {fmt(step)}, along its first component (float32 forward).",
        figures=f"max |∂L/∂b_noise| at 0 = {fmt(gradient)}; one-sided slopes {fmt(slopes[0])} (+h), {fmt(slopes[1])} "
        "(−h): the loss rises on both sides of 0, a kink where the gradient is 0",
        verdict="fails" if gradient == 0.0 and kink else "holds",
    )


def threshold_reparameterisation_row(batch: dict) -> LedgerRow:
    settings = {"ovr_threshold_per_class": True, "learnable_threshold": True}
    threshold_model = build_tiny_causal_lm(seed=0, init_seed=0, **settings, **LITERAL).model
    bias_model = copy.deepcopy(threshold_model)
    vocab = threshold_model.config.vocab_size
    offsets = torch.randn(vocab, generator=torch.Generator().manual_seed(OFFSET_SEED))  # [V]
    with torch.no_grad():
        threshold_model.action.ovr_threshold.add_(offsets)  # C_k + δ_k
        bias_model.action.classification_head.bias.sub_(offsets)  # b_cls,k − δ_k, the thresholds left at C_k
    first, second = _outputs(threshold_model, batch), _outputs(bias_model, batch)
    p_first = ovr_probabilities(first.loc_S, first.scale_S, threshold_model.action.ovr_threshold.detach().numpy())
    p_second = ovr_probabilities(second.loc_S, second.scale_S, bias_model.action.ovr_threshold.detach().numpy())
    difference = float(np.abs(p_first - p_second).max())
    with torch.no_grad():
        loss_difference = abs(float(_loss(threshold_model, batch)) - float(_loss(bias_model, batch)))
    softmax_difference = float(
        (torch.softmax(first.loc_S.double(), -1) - torch.softmax(second.loc_S.double(), -1)).abs().max()
    )
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 6 (the author's comment, future extension); {FORWARD} §5.1 (design outlook); "
        f"decision {DECISIONS['D19']}",
        statement="A learnable per-class threshold C_k lets the model learn each token's activation difficulty "
        "(lower for frequent tokens), something it cannot do otherwise.",
        method=f"two tiny models: per-class thresholds raised by offsets δ_k ~ N(0, 1) (seed {OFFSET_SEED}), and "
        "the same offsets taken off b_cls instead; every P_k by scipy.stats.cauchy.sf, the loss, and softmax(loc_S).",
        figures=f"max |ΔP_k| = {fmt(difference)}, |Δloss| = {fmt(loss_difference)}; softmax(loc_S) differs by up to "
        f"{fmt(softmax_difference)}",
        verdict="fails" if difference <= 1e-6 and loss_difference <= 1e-5 else "holds",
    )


def threshold_start_row() -> LedgerRow:
    model = build_tiny_causal_lm(seed=0, init_seed=0, ovr_threshold_per_class=True).model
    threshold = model.action.ovr_threshold.detach().double()  # [V]
    spread = float(threshold.max() - threshold.min())
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 6 (vector form); decision {DECISIONS['D19']}",
        statement="Per-class thresholds start at C_k = C_OvR + ε_k with small random ε_k.",
        method="the per-class threshold vector of the tiny model converted with ovr_threshold_per_class.",
        figures=f"{len(threshold)} thresholds, max − min = {fmt(spread)} (all at C = {fmt(float(threshold[0]))})",
        verdict="holds"
        if spread > 0
        else "diverges from the draft: every C_k starts at the same value (no random ε_k)",
    )


def _regimes(start: TinyStart) -> list[float]:
    """Median over (position, class) of P_k at each of `REGIME_THRESHOLDS` (SciPy, float64)."""
    at = start.positions
    return [
        float(np.median(ovr_probabilities(start.out.loc_S[at], start.out.scale_S[at], c))) for c in REGIME_THRESHOLDS
    ]


def threshold_regime_row(start: TinyStart, drafts: TinyStart) -> LedgerRow:
    medians = {"defaults": _regimes(start), "drafts": _regimes(drafts)}

    def as_stated(values: list[float]) -> bool:  # near ½ at C = 0, sparse (≤ 0.1) at 10, extremely so (≤ 0.01) at 100
        return abs(values[0] - 0.5) <= 0.1 and values[1] <= 0.1 and values[2] <= 0.01

    stated = {name: as_stated(values) for name, values in medians.items()}
    verdict = "holds" if all(stated.values()) else "fails"
    if stated["defaults"] != stated["drafts"]:
        verdict = f"holds only under γ = {fmt(0.1 if stated['defaults'] else 10.0)}"
    largest = float(start.logits[start.positions].abs().max())
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 6 (mathematical effect)",
        statement="C_OvR = 0 gives initial probabilities near ½; C = 10 generally low, sparse ones; C ≥ 100 extremely "
        "sparse ones.",
        method="median P_k over every position and class of the tiny model at init (SciPy sf) for C = 0, 10, 100, at "
        "γ = 0.1 (package) and γ = 10 (drafts); read as stated: |median − ½| ≤ 0.1 at 0, ≤ 0.1 at 10, ≤ 0.01 at 100. "
        f"The tiny base's logits are small (largest |logit| {fmt(largest)}); the real Qwen's are not measured here.",
        figures="median P_k at C = 0 / 10 / 100: "
        f"γ = 0.1: {' / '.join(fmt(v) for v in medians['defaults'])}; "
        f"γ = 10: {' / '.join(fmt(v) for v in medians['drafts'])}",
        verdict=verdict,
    )


def gate_gradient_row(batch: dict) -> LedgerRow:
    model = build_tiny_causal_lm(seed=0, init_seed=0, **LITERAL).model
    out = _outputs(model, batch)
    num_id = model.config.num_token_id
    targets = batch["labels"][:, 1:]  # [B, S-1]: position i is scored against labels[i+1]
    at = (targets == num_id) & batch["attention_mask"][:, :-1].bool()  # [B, S-1] the <NUM> targets
    values = batch["numeric_values"][:, 1:][at].double().numpy()  # [N]
    loc_Y, scale_Y = out.loc_Y[:, :-1][at].double().numpy(), out.scale_Y[:, :-1][at].double().numpy()  # [N] each
    nll = -stats.cauchy.logpdf(values, loc_Y, scale_Y)  # [N]
    positive = float((nll > 0).mean())
    return LedgerRow(
        where=f"{FOUNDATIONS} §4.2 (theoretical advantage 3); {FORWARD} §5.2",
        statement="The gate P_<NUM> makes the model learn the classification first, then the regression precision.",
        method=f"at the {len(values)} <NUM> targets of a batch, the tiny model at init: the Cauchy NLL by "
        "scipy.stats.cauchy.logpdf. With gate α + (1 − α)P_<NUM>, ∂L_reg/∂loc_S,<NUM> = (1 − α)·nll·f(C) has the "
        "sign of the nll (V7 checks the package's gradient). The learning order itself is left to the gate study.",
        figures=f"nll > 0 at {fmt(100 * positive)}% of the <NUM> targets (median nll {fmt(float(np.median(nll)))})",
        verdict="holds"
        if positive == 0.0
        else "holds only under nll ≤ 0: where the regression NLL is positive, as at "
        f"{fmt(100 * positive)}% of the <NUM> targets at init, the gate's gradient (α < 1) lowers P_<NUM>, working "
        "against the classification",
    )


def parameter_rows(batch: dict, start: TinyStart, drafts: TinyStart) -> list[LedgerRow]:
    """The rows of this module, in ledger order; ``start`` and ``drafts``: the tiny model at the package's defaults
    and at the drafts' γ and C."""
    return [
        noise_sign_row(batch),
        noise_kink_row(batch),
        threshold_reparameterisation_row(batch),
        threshold_start_row(),
        threshold_regime_row(start, drafts),
        gate_gradient_row(batch),
    ]
