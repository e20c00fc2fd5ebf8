r"""Ledger rows measured on the tiny model at initialization (V13): what the conversion from Qwen2 starts from.

Every row converts the embedded tiny Qwen2 base (`causalqwen.app.tiny.build_tiny_causal_lm`, 64 hidden units, 704
classes) and compares the converted model with the base itself (transformers' ``Qwen2ForCausalLM``, the real
library), with SciPy or float64 closed forms, or with NumPy draws from a fixed seed. The real Qwen2.5's figures are
not measured here: nothing is downloaded offline.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.inference import predict, traditional_probabilities
from causalqwen.metrics import next_token_valid_mask

from .claims_ledger import DECISIONS, FORWARD, FOUNDATIONS, OVERVIEW, LedgerRow
from .common import check, fmt

__all__ = ["TinyStart", "initialization_rows", "softmax_path_difference", "DRAFT_SETTINGS"]

DRAFT_SETTINGS = {"abduction_scale_init": 10.0, "ovr_threshold": 100.0}  # the drafts' γ and C
MC_SEED = 7
KS_P_FLOOR = 1e-3


class TinyStart:
    """The tiny model converted at the package's defaults, its base, and one batch of synthetic sentences run
    through both (numbers zeroed for the comparison with the base, which cannot read them)."""

    def __init__(self, batch: dict, **overrides):
        self.model, self.tokenizer, self.qwen = build_tiny_causal_lm(seed=0, init_seed=0, **overrides)
        self.batch = batch
        self.valid = next_token_valid_mask(batch["labels"], batch["attention_mask"])  # [B, S-1]
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            self.out = self.model(ids, numeric_values=torch.zeros(ids.shape), attention_mask=mask)
            base = self.qwen(ids, attention_mask=mask, output_hidden_states=True)
        self.logits = base.logits  # [B, S, V]
        self.hidden = base.hidden_states[-1]  # [B, S, H], after the final norm
        self.positions = mask.bool()  # [B, S]


def logits_row(start: TinyStart) -> LedgerRow:
    at = start.positions
    error = float((start.out.loc_S[at] - start.logits[at]).abs().max())
    largest = float(start.logits[at].abs().max())
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 3; {FOUNDATIONS} §6 step 3",
        statement="At initialization the class locations are Qwen's logits: loc_S,k = W_Qwen,k · z.",
        method="loc_S of the converted tiny model against the base's own logits (transformers' Qwen2ForCausalLM) at "
        f"every position of {start.batch['input_ids'].shape[0]} sentences, numbers set to 0.",
        figures=f"max |loc_S − logits| = {fmt(error)} (largest |logit| {fmt(largest)})",
        verdict="holds" if error <= 1e-5 * max(largest, 1.0) else "fails",
    )


def abduction_row(start: TinyStart) -> LedgerRow:
    at = start.positions
    error = float((start.out.loc_U[at] - start.hidden[at]).abs().max())
    gamma = start.model.config.abduction_scale_init
    scale_error = float((start.out.scale_U[at] - gamma).abs().max()) / gamma
    return LedgerRow(
        where=f"{OVERVIEW} §2.3, §4 step 2; {FORWARD} §3",
        statement="The abduction network starts as the identity: loc_U = z and scale_U = γ everywhere.",
        method="loc_U against the base's last hidden state (transformers, after the final norm); scale_U against γ.",
        figures=f"max |loc_U − z| = {fmt(error)}; max |scale_U − γ|/γ = {fmt(scale_error)} at γ = {fmt(gamma)}",
        verdict="holds" if error <= 1e-5 and scale_error <= 1e-6 else "fails",
    )


def greedy_agreement_row(start: TinyStart, drafts: TinyStart) -> LedgerRow:
    agreement = {}
    for name, model_start in (("defaults", start), ("drafts", drafts)):
        out = model_start.out
        model = model_start.model
        tokens, _ = predict(out.loc_S, out.scale_S, out.loc_Y, model.ovr_threshold, model.config.num_token_id)
        greedy = model_start.logits.argmax(-1)
        agreement[name] = float((tokens == greedy)[model_start.positions].double().mean())
    threshold = float(start.model.ovr_threshold)
    verdict = "holds" if min(agreement.values()) >= 0.99 else "fails"
    if verdict == "fails" and agreement["defaults"] >= 0.5 > agreement["drafts"]:
        verdict = (
            "holds only under a threshold between the two largest logits (the package's top-two midpoint C = "
            f"{fmt(threshold)}), not at the drafts' C = 100"
        )
    return LedgerRow(
        where=f"{OVERVIEW} §4 (design principle); {FOUNDATIONS} §6 step 3",
        statement="At the start CausalQwen behaves exactly like Qwen: its decision argmax_k P_k is Qwen's greedy "
        "token.",
        method="argmax_k P_k (`inference.predict`) against argmax of the base's logits at every position, at the "
        "package's defaults (γ = 0.1, C from the base) and at the drafts' (γ = 10, C = 100).",
        figures=f"agreement {fmt(agreement['defaults'])} at the defaults (C = {fmt(threshold)}), "
        f"{fmt(agreement['drafts'])} at the drafts'",
        verdict=verdict,
    )


def drafts_start_rows(start: TinyStart, drafts: TinyStart) -> list[LedgerRow]:
    """The drafts' initial scale γ = 10 and threshold C = 100, against what the package starts from."""
    scale_U = float(start.out.scale_U[start.positions].median())
    out, model = drafts.out, drafts.model
    tokens, _ = predict(out.loc_S, out.scale_S, out.loc_Y, model.ovr_threshold, model.config.num_token_id)
    greedy = drafts.logits.argmax(-1)
    agreement = float((tokens == greedy)[drafts.positions].double().mean())
    largest_norm = model.action.classification_head.weight.detach().abs().sum(-1).argmax()  # the largest ‖W_k‖₁
    largest_share = float((tokens == largest_norm)[drafts.positions].double().mean())
    return [
        LedgerRow(
            where=f"{OVERVIEW} §4 step 2; {FOUNDATIONS} §6 step 2; decision {DECISIONS['D14']}",
            statement="scale_U starts at a large constant γ (such as 10): a wide, know-nothing prior over individuals.",
            method="the median scale_U of the tiny model converted at the package's defaults.",
            figures=f"median scale_U = {fmt(scale_U)} (abduction_scale_init = "
            f"{fmt(start.model.config.abduction_scale_init)})",
            verdict="holds"
            if scale_U >= 10.0
            else f"diverges from the draft: γ = {fmt(scale_U)} by default (decision D14, measured in V10); the drafts' "
            "γ = 10 stays available by configuration",
        ),
        LedgerRow(
            where=f"{OVERVIEW} §4 step 6 (recommended setting); {FOUNDATIONS} §6 step 5; decision {DECISIONS['D14']}",
            statement="The recommended C_OvR = 100 gives a good, sparse and stable starting point.",
            method="the tiny model converted at the drafts' γ = 10, C = 100: how often argmax_k P_k is the base's "
            "greedy token, and how often it is the class with the largest ‖W_k‖₁ (`inference.predict`).",
            figures=f"agreement with Qwen's greedy token {fmt(agreement)}; the largest-norm class wins at "
            f"{fmt(largest_share)} of the positions",
            verdict="holds" if agreement >= 0.5 else "fails",
        ),
    ]


def softmax_path_difference(start: TinyStart) -> float:
    """The largest difference between the softmax path (`inference.traditional_probabilities` on loc_S) and
    torch's softmax of the base's logits, over every position (float64)."""
    at = start.positions
    package = traditional_probabilities(start.out.loc_S[at].double())
    qwen = torch.softmax(start.logits[at].double(), dim=-1)
    return float((package - qwen).abs().max())


def embedding_row(start: TinyStart) -> LedgerRow:
    values = torch.tensor([[0.0, 99.9, 1e6]])
    with torch.no_grad():
        encoded = start.model.numerical_embedding(values)[0]  # [3, H]
    norms = encoded.norm(dim=-1).double().numpy()
    oracle = np.array([math.log1p(abs(v)) for v in values[0].tolist()])
    rows = start.qwen.get_input_embeddings().weight.detach()[: len(start.tokenizer)]  # the tokenizer's rows [K, H]
    row_norm = float(rows.norm(dim=-1).median())
    largest_quiet = math.expm1(row_norm)  # |v| with ln(1 + |v|) equal to the median row norm
    relative = float(np.max(np.abs(norms - oracle) / np.maximum(oracle, 1.0)))
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 1; {FOUNDATIONS} §6 step 1",
        statement="The numerical encoding φ(v) = sign(v)·ln(1+|v|)·w_num barely disturbs the token embedding.",
        method="‖φ(v)‖ from the package's numerical embedding against ln(1+|v|) (math.log1p), beside the median "
        "row norm of the tiny base's token embedding (the real Qwen's is not measured offline).",
        figures=f"‖φ(99.9)‖ = {fmt(float(norms[1]))}, ‖φ(10⁶)‖ = {fmt(float(norms[2]))}, "
        f"‖φ(0)‖ = {fmt(float(norms[0]))}; "
        f"median embedding row norm {fmt(row_norm)}: φ(99.9) is {fmt(float(norms[1]) / row_norm)} row norms",
        verdict="holds"
        if norms[2] <= row_norm
        else f"holds only under |v| < {fmt(largest_quiet)} (where ln(1+|v|) stays below the median row norm); "
        "a price of 99.9 moves the embedding by many row norms",
        claims=[check("the package's ‖φ(v)‖ equals ln(1+|v|) at v = 0, 99.9, 10⁶", relative, "<=", 1e-6)],
    )


def natural_degeneration_row(start: TinyStart) -> LedgerRow:
    """Positions before the first number of a sentence, with the numbers in place: causal attention means they see
    no φ(v), so their loc_U must be the base's hidden state exactly if φ(0) = 0."""
    batch = start.batch
    with torch.no_grad():
        out = start.model(
            batch["input_ids"], numeric_values=batch["numeric_values"], attention_mask=batch["attention_mask"]
        )
        zero = start.model.numerical_embedding(torch.zeros(1, 1))  # [1, 1, H]
    has_number = batch["numeric_values"] != 0  # [B, S]
    before_first = (has_number.cumsum(-1) == 0) & start.positions  # [B, S] no number at or before the position
    error = float((out.loc_U[before_first] - start.hidden[before_first]).abs().max())
    return LedgerRow(
        where=f"{OVERVIEW} §2.1 (key insight 1); {FORWARD} §1.3",
        statement="φ(0) = 0, so a position without a number keeps its plain token embedding: the model degrades "
        "naturally to the base.",
        method="φ(0) from the package's numerical embedding; loc_U, with the numbers in place, at the "
        f"{int(before_first.sum())} positions before the first number of their sentence against the base's hidden "
        "state (causal attention: they see no number).",
        figures=f"max |φ(0)| = {fmt(float(zero.abs().max()))}; max |loc_U − z| before the first number {fmt(error)}",
        verdict="holds" if float(zero.abs().max()) == 0.0 and error <= 1e-5 else "fails",
    )


def unit_direction_row() -> LedgerRow:
    norms = []
    for init_seed in range(5):
        model = build_tiny_causal_lm(seed=0, init_seed=init_seed).model
        norms.append(float(model.numerical_embedding.w_num.detach().double().norm()))
    size = model.config.hidden_size
    low, high = np.sqrt(stats.chi2.ppf([0.05, 0.95], size) / size)  # 90% range of ‖N(0, I/H)‖ = sqrt(χ²_H / H)
    return LedgerRow(
        where=f"{OVERVIEW} §4 step 1 (the author's comment); {FORWARD} §1.3; decision {DECISIONS['D22']}",
        statement="The author asks for a plain initialization of w_num (a random vector scaled by 1/√H) instead "
        "of a normalised unit vector.",
        method="‖w_num‖ of the converted tiny model for 5 initialization seeds.",
        figures=f"‖w_num‖ = {', '.join(f'{n:.6f}' for n in norms)}; a plain N(0, I/H) draw (H = {size}) has a norm "
        f"between {fmt(float(low))} and {fmt(float(high))} 90% of the time (scipy χ²)",
        verdict="diverges from the draft: w_num starts as an exact unit vector (a normalised Gaussian draw), as the "
        "drafts' code does, not the plain initialization the author's comment asks for",
    )


def value_prior_row(start: TinyStart, drafts: TinyStart) -> LedgerRow:
    ratios = {}
    for name, model_start in (("defaults", start), ("drafts", drafts)):
        at = model_start.positions
        ratio = model_start.out.loc_Y[at].abs() / model_start.out.scale_Y[at]  # [N]
        ratios[name] = (float(ratio.median()), float(model_start.out.scale_Y[at].median()))
    wide = {name: value[0] <= 1.0 for name, value in ratios.items()}
    verdict = "holds" if all(wide.values()) else "fails"
    if not wide["defaults"] and wide["drafts"]:
        verdict = "holds only under the drafts' γ = 10; at the package's γ = 0.1 the prior is narrow and off-centre"
    return LedgerRow(
        where=f"{OVERVIEW} §2.4, §4 step 4; {FOUNDATIONS} §6 step 4",
        statement="At initialization the value prior Y ~ Cauchy(loc_Y, scale_Y) is wide and centred near 0.",
        method="median over positions of |loc_Y|/scale_Y (≤ 1: 0 lies within one scale of the centre) and of "
        "scale_Y, at the package's defaults and at the drafts' γ = 10.",
        figures=f"median |loc_Y|/scale_Y = {fmt(ratios['defaults'][0])} (defaults), {fmt(ratios['drafts'][0])} "
        f"(drafts); median scale_Y = {fmt(ratios['defaults'][1])}, {fmt(ratios['drafts'][1])}",
        verdict=verdict,
    )


def unclamped_scale_row(batch: dict) -> LedgerRow:
    gamma = 1e20
    start = TinyStart(batch, abduction_scale_init=gamma)
    weight = start.model.action.classification_head.weight.detach().double()  # [V, C]
    noise = start.model.action.noise_scale.detach().double()  # [C]
    oracle = (gamma + noise).abs() @ weight.abs().T  # [V]: (γ + |b_noise|) · |W_k|, float64
    measured = start.out.scale_S[0, 0].double()  # [V]
    used = oracle > 0  # the base's unused rows are 0 and meet the lower clamp instead
    relative = float(((measured - oracle).abs() / oracle)[used].max())
    return LedgerRow(
        where=f"{FOUNDATIONS} §4.4; decision {DECISIONS['D20']}",
        statement="Scales are clipped to [ε, max_scale] to prevent exploding gradients.",
        method=f"the tiny model converted with γ = {fmt(gamma)}: scale_S against the float64 closed form "
        "(γ + |b_noise|)·‖W_k‖₁ with no upper clip.",
        figures=f"largest scale_S {fmt(float(measured.max()))}; relative difference from the unclipped closed form "
        f"{fmt(relative)}; lower clamp scale_eps = {fmt(start.model.config.scale_eps)}",
        verdict="diverges from the draft: scales are clamped below at scale_eps only; there is no max_scale (a "
        f"scale of {fmt(float(measured.max()))} passes through)",
        claims=[
            check(
                "the package's scale_S at γ = 1e20 equals the closed form (γ + |b_noise|)·‖W_k‖₁", relative, "<=", 1e-5
            )
        ],
    )


def noise_infusion_row(start: TinyStart, samples: int) -> LedgerRow:
    """Monte Carlo of S_k = W_k·(U + ε) + b_k at one position, against the package's (loc_S, scale_S)."""
    action = start.model.action
    loc_U = start.out.loc_U[0, 1].double().numpy()  # [C]
    scale_U = start.out.scale_U[0, 1].double().numpy()  # [C]
    noise = action.noise_scale.detach().double().numpy()  # [C]
    weight = action.classification_head.weight.detach().double().numpy()  # [V, C]
    bias = action.classification_head.bias.detach().double().numpy()  # [V]
    generator = np.random.default_rng(MC_SEED)
    u = stats.cauchy.rvs(loc_U, scale_U, size=(samples, len(loc_U)), random_state=generator)  # [N, C]
    eps = stats.cauchy.rvs(0.0, noise, size=(samples, len(loc_U)), random_state=generator)  # [N, C]
    classes = [0, 1, int(start.out.loc_S[0, 1].argmax())]
    p_values = []
    for k in classes:
        scores = (u + eps) @ weight[k] + bias[k]  # [N]
        law = stats.cauchy(float(start.out.loc_S[0, 1, k]), float(start.out.scale_S[0, 1, k]))
        p_values.append(stats.kstest(scores, law.cdf).pvalue)
    return LedgerRow(
        where=f"{OVERVIEW} §2.4; {FORWARD} §4.2",
        statement="The action network is one linear map of [U, ε]: with ε ~ Cauchy(0, |b_noise|), the class score is "
        "Cauchy(W_k·loc_U + b_k, |W_k|·(scale_U + |b_noise|)), computed without sampling.",
        method=f"{samples} NumPy draws (seed {MC_SEED}) of U and ε at one position of the tiny model, "
        "W_k·(U + ε) + b_k for 3 classes; Kolmogorov-Smirnov test against the package's (loc_S,k, scale_S,k).",
        figures=f"KS p-values {', '.join(fmt(p) for p in p_values)}",
        verdict="holds" if min(p_values) > KS_P_FLOOR else "fails",
    )


def initialization_rows(start: TinyStart, drafts: TinyStart, quick: bool) -> list[LedgerRow]:
    """The rows of this module, in ledger order; ``start`` and ``drafts``: the tiny model at the package's defaults
    and at the drafts' γ and C (`DRAFT_SETTINGS`)."""
    return [
        logits_row(start),
        abduction_row(start),
        greedy_agreement_row(start, drafts),
        embedding_row(start),
        natural_degeneration_row(start),
        unit_direction_row(),
        value_prior_row(start, drafts),
        unclamped_scale_row(start.batch),
        noise_infusion_row(start, 5_000 if quick else 50_000),
        *drafts_start_rows(start, drafts),
    ]
