r"""The design's free parameters: the initial scale γ, the threshold C, and the defaults they lead to (D14)

**Question.** V9 found CausalQwen learning domain-B text at a third of Qwen's accuracy from the drafts'
initialization ($\gamma$ = ``abduction_scale_init`` = 10, $C$ = ``ovr_threshold`` = 100). Is that the design, or two
of its free numbers? This study varies them, and the other settings a user could blame, on V9's own harness:
the same pretrained base, data, batches, steps, learning rate and evaluation (`validation.v9_comparison`,
`validation.comparison_eval`), CausalQwen ``causal`` preset (backbone frozen).

**Why the start decides.** At initialization $\mathrm{loc}_{S_k} = \ell_k$, Qwen's logit, and
$\sigma_k = \mathrm{scale}_{S_k} = (\gamma + \beta)\lVert W_{\mathrm{cls},k}\rVert_1$ ($\beta$ = ``noise_init``), so

$$
P_k = \tfrac12 + \tfrac1\pi \arctan\frac{\ell_k - C}{\sigma_k}.
$$

*The decision.* A common factor $\gamma + \beta$ cannot reorder the classes, so $\gamma$ leaves
$\arg\max_k P_k$ unchanged; $C$ does not. If $\ell_{(2)} < C < \ell_{(1)}$ only Qwen's top class has
$P_k > \tfrac12$ and the decision is Qwen's. If $C$ is far above every logit, $P_k \approx \sigma_k / (\pi (C - \ell_k))$
and the ratio of two classes tends to the ratio of their row norms: the decision becomes the class with the
largest $\lVert W_{\mathrm{cls},k}\rVert_1$, whatever the context.

*The loss.* A class below its threshold by $d$ has $P_k \approx \sigma_k/(\pi d)$: a Cauchy tail falls like $1/d$,
not like $e^{-d}$, so with a wide start ($\gamma = 10$, $\sigma_k$ in the tens) hundreds of wrong classes start
with sizeable probability and their $-\log(1 - P_k)$ terms dominate the OvR loss. The cheapest way down for
gradient descent is to shrink the scales of the wrong classes, not to move the right class's location across
$C$; the classes end up told apart by scale, and text is learned slowly. A narrow start with $C$ at the top
of the base's logit range leaves a small loss from the wrong classes and a right class near its threshold.

**The rule for C** (`causalqwen.initialization`). A fixed $C$ fits one base; logit ranges differ between
models. ``top_two_midpoint`` takes the median over positions of $\tfrac12(\ell_{(1)} + \ell_{(2)})$ on text the
base samples itself, which puts $C$ between the top two logits at a typical position. It is compared with a
quantile of the top logit and with fixed values, on the pretrained tiny base and on a random base of the
Qwen2.5-0.5B shape.

**Arms.** Every arm trains CausalQwen ``causal`` from the pretrained base with V9's settings and changes one
thing from D14's defaults (γ = 0.1, ``top_two_midpoint``, ``noise_init`` = 0.1, linear abduction, learning rate
and steps of V9). Per arm: the share of domain-A positions where $\arg\max_k P_k$ at initialization is Qwen's
greedy token (at initialization $\mathrm{loc}_S$ is Qwen's logits, V3); domain-B held-out text accuracy under the
standard decision ($\arg\max_k P_k$) and the traditional one ($\arg\max_k \mathrm{loc}_{S_k}$); ECE of the
standard decision; the MdAE of the predictable numbers; domain-A text accuracy after training (forgetting);
the median $\sum_k P_k$ over domain-B positions before and after training. The finalists run with 3 seeds,
and also on the corpus with 10% heavy-tailed outliers (MdAE on clean held-out numbers).
"""  # noqa: E501

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from causalqwen import CausalQwenConfig, CausalQwenForCausalLM
from causalqwen.files.data import TextDataset, collate
from causalqwen.inference import predict
from causalqwen.initialization import (
    DRAFT_INIT,
    initial_threshold,
    sample_calibration_batch,
)

from .common import ExperimentResult, fmt, module_text
from .comparison_eval import evaluate_causal, evaluate_qwen
from .domain_a import domain_a_texts
from .domain_b import domain_b_records
from .domains import pretrained_starting_point
from .qwen_finetuning import finetune_qwen
from .v9_comparison import BATCH, FULL, OVERRIDES, QUICK, SEED, causal_model, fine_tune
from .v10_report import arm_summary, defaults_figure, report_body, report_claims, verdict_lines

QWEN25_05B_SHAPE = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
)
BIG_BASE_INPUT = (4, 32)  # random ids the 0.5B-shape base is evaluated on
# D14's initialization, the config's class defaults (as the report names them)
D14_INIT = {name: getattr(CausalQwenConfig, name) for name in ("abduction_scale_init", "ovr_threshold_init")}


@dataclass
class Arm:
    """One training run: a label, the group it belongs to, and what it changes from D14's defaults."""

    label: str
    group: str
    init: dict = field(default_factory=dict)  # from_qwen keywords on top of V9's OVERRIDES (D14 if empty)
    learning_rate: float | None = None  # None: V9's
    steps: int | None = None  # None: V9's
    seed: int = SEED
    outliers: bool = False  # also train on the outlier corpus


def _arms(quick: bool) -> list[Arm]:
    final = [
        Arm("D14 defaults", "finalists", outliers=True),
        Arm("drafts (γ = 10, C = 100)", "finalists", dict(DRAFT_INIT), outliers=True),
    ]
    if quick:
        return final + [
            Arm("γ = 1", "γ", {"abduction_scale_init": 1.0}),
            Arm("C = 10 fixed", "C", {"ovr_threshold": 10.0}),
        ]
    arms = list(final)
    arms += [Arm("mlp abduction", "finalists", {"abduction_type": "mlp"}, outliers=True)]
    arms += [Arm(f"γ = {fmt(g)}", "γ", {"abduction_scale_init": g}) for g in (10.0, 1.0, 0.3, 0.03, 0.01)]
    arms += [Arm(f"C = {fmt(c)} fixed", "C", {"ovr_threshold": c}) for c in (0.0, 5.0, 10.0, 20.0, 100.0)]
    arms += [
        Arm(
            f"C = top-logit quantile {q}",
            "C",
            {"ovr_threshold_init": "top_logit_quantile", "ovr_threshold_quantile": q},
        )
        for q in (0.1, 0.5)
    ]
    arms += [
        Arm("C per class", "C learnable / per class", {"ovr_threshold_per_class": True}),
        Arm("C learnable", "C learnable / per class", {"learnable_threshold": True}),
        Arm(
            "C per class, learnable",
            "C learnable / per class",
            {"ovr_threshold_per_class": True, "learnable_threshold": True},
        ),
        Arm("drafts, C learnable", "C learnable / per class", {**DRAFT_INIT, "learnable_threshold": True}),
    ]
    arms += [Arm(f"noise_init = {fmt(n)}", "noise", {"noise_init": n}) for n in (0.01, 1.0)]
    arms += [Arm(f"lr = {fmt(lr)}", "learning rate", learning_rate=lr) for lr in (3e-3, 3e-2)]
    arms += [Arm("1500 steps", "steps", steps=1500), Arm("drafts, 1500 steps", "steps", dict(DRAFT_INIT), steps=1500)]
    for seed in (SEED + 1, SEED + 2):
        arms += [
            Arm("D14 defaults", "finalists", seed=seed, outliers=True),
            Arm("drafts (γ = 10, C = 100)", "finalists", dict(DRAFT_INIT), seed=seed, outliers=True),
            Arm("mlp abduction", "finalists", {"abduction_type": "mlp"}, seed=seed, outliers=True),
        ]
    return arms


@torch.no_grad()
def decision_statistics(model, tokenizer, texts: list[str]) -> dict:
    """Over the scored positions of ``texts``: ``agreement`` (share where the standard decision
    $\\arg\\max_k P_k$ is $\\arg\\max_k \\mathrm{loc}_{S_k}$), ``traditional_accuracy`` (the traditional decision
    against the text targets, ``<NUM>`` targets left out, as `evaluate_causal` does) and ``median_sum_p``."""
    head = model.action
    batch = collate(TextDataset(texts, tokenizer, max_length=64).items, tokenizer.pad_token_id)
    law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    targets = head.next_token_targets(batch["labels"], batch["numeric_values"], batch["attention_mask"])
    decision = head(law.loc_U[targets.scored], law.scale_U[targets.scored])  # [N, V]
    labels = targets.labels[targets.scored]  # [N]
    standard = head.predict(decision)[0]
    traditional = decision.loc_S.argmax(dim=-1)
    text = labels != head.num_token_id
    return {
        "agreement": float((standard == traditional).double().mean()),
        "traditional_accuracy": float((traditional == labels)[text].double().mean()),
        "median_sum_p": float(head.probabilities(decision).sum(dim=-1).median()),
    }


def _train(model, tokenizer, texts, arm: Arm, settings: dict):
    """``(model, trainable)``: ``model`` trained with the ``causal`` preset and the arm's seed, rate and steps."""
    model, trainable, _ = fine_tune(
        model, tokenizer, texts, "causal", settings, seed=arm.seed, learning_rate=arm.learning_rate, steps=arm.steps
    )
    return model, trainable


def _run_arm(base, tokenizer, arm: Arm, data: dict, settings: dict) -> dict:
    model = causal_model(base, tokenizer, arm.seed, **arm.init)
    before_a = decision_statistics(model, tokenizer, data["domain_a"])
    before_b = decision_statistics(model, tokenizer, data["held_out_texts"])
    threshold = model.ovr_threshold
    threshold = float(threshold.detach().mean()) if isinstance(threshold, torch.Tensor) else float(threshold)
    model, trainable = _train(model, tokenizer, data["train_clean"], arm, settings)
    clean = evaluate_causal(model, tokenizer, data["held_out"])
    after_b = decision_statistics(model, tokenizer, data["held_out_texts"])
    learned = model.ovr_threshold
    row = dict(
        arm=arm,
        trainable=trainable,
        C=threshold,
        C_after=float(learned.detach().mean()) if isinstance(learned, torch.Tensor) else threshold,
        agreement=before_a["agreement"],
        accuracy=clean["text_accuracy"],
        traditional=after_b["traditional_accuracy"],
        ece=clean["ece"],
        mdae=clean["target_mdae_strict"],
        a_after=evaluate_causal(model, tokenizer, data["domain_a"])["text_accuracy"],
        sum_p_before=before_b["median_sum_p"],
        sum_p_after=after_b["median_sum_p"],
        outlier_mdae=math.nan,
    )
    if arm.outliers:
        outlier_model, _ = _train(
            causal_model(base, tokenizer, arm.seed, **arm.init), tokenizer, data["train_outliers"], arm, settings
        )
        row["outlier_mdae"] = evaluate_causal(outlier_model, tokenizer, data["held_out"])["target_mdae_strict"]
    return row


@torch.no_grad()
def big_base_agreement(quick: bool) -> dict:
    """A random Qwen2 of the Qwen2.5-0.5B shape (2 of its 24 layers in the quick run): the rule's C, and the
    agreement of $\\arg\\max_k P_k$ with the greedy token on random ids for the rule's C, C = 10 and C = 100."""
    shape = dict(QWEN25_05B_SHAPE, num_hidden_layers=2 if quick else QWEN25_05B_SHAPE["num_hidden_layers"])
    rope_theta = shape.pop("rope_theta")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        base = Qwen2ForCausalLM(
            Qwen2Config(**shape, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
        ).eval()
        ids = torch.randint(0, shape["vocab_size"], BIG_BASE_INPUT)
    num_token_id = shape["vocab_size"] - 1  # as if the tokenizer's <NUM> took the last row
    _, calibration = sample_calibration_batch(base, vocab_limit=num_token_id)
    rule_threshold = initial_threshold(base, CausalQwenConfig.ovr_threshold_init, num_token_id=num_token_id)
    logits = base(input_ids=ids).logits.float()  # [B, S, V]: loc_S of the conversion (V3)
    norms = base.get_output_embeddings().weight.detach().abs().sum(dim=-1).float()  # ||W_k||_1 [V]
    result = {
        "layers": shape["num_hidden_layers"],
        "rule_C": rule_threshold,
        "top_logit_median": float(calibration.max(dim=-1).values.median()),
    }
    gamma, beta = CausalQwenConfig.abduction_scale_init, OVERRIDES.get("noise_init", CausalQwenConfig.noise_init)
    scale = (gamma + beta) * norms  # [V]
    greedy = logits.argmax(dim=-1)
    for name, threshold in (("rule", rule_threshold), ("C = 10", 10.0), ("C = 100", 100.0)):
        tokens, _ = predict(logits, scale.expand_as(logits), logits[..., 0], threshold, num_token_id)
        result[name] = float((tokens == greedy).double().mean())
    # the conversion itself, once, at D14's defaults: its threshold must be the rule's
    model = CausalQwenForCausalLM.from_qwen(base, num_token_id=num_token_id)
    result["converted_C"] = float(model.config.ovr_threshold)
    result["max_logit_error"] = float((model(input_ids=ids).loc_S - logits).abs().max())
    return result


def _corpora(settings: dict) -> dict:
    """V9's corpora: domain-B training texts (clean and with 10% outliers), held-out records and texts, domain A."""
    n_train, n_eval = settings["train_texts"], settings["eval_texts"]
    held_out = domain_b_records(n_eval, SEED + 1)
    return dict(
        train_clean=[r.text for r in domain_b_records(n_train, SEED)],
        train_outliers=[r.text for r in domain_b_records(n_train, SEED, outlier_fraction=0.1)],
        held_out=held_out,
        held_out_texts=[r.text for r in held_out],
        domain_a=domain_a_texts(n_eval, SEED + 3),
    )


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    settings = QUICK if quick else FULL
    started = time.perf_counter()
    base, qwen_tokenizer, tokenizer = pretrained_starting_point()
    data = _corpora(settings)
    qwen, qwen_trainable = finetune_qwen(
        base,
        qwen_tokenizer,
        data["train_clean"],
        "head",
        steps=settings["steps"],
        batch_size=BATCH,
        learning_rate=settings["lr"],
        seed=SEED,
    )
    qwen_metrics = evaluate_qwen(qwen, qwen_tokenizer, data["held_out"])
    rows = [_run_arm(base, tokenizer, arm, data, settings) for arm in _arms(quick)]
    big = big_base_agreement(quick)
    elapsed = time.perf_counter() - started

    summary = arm_summary(rows)
    by_label = {s["label"]: s for s in summary}
    default, drafts = by_label["D14 defaults"], by_label["drafts (γ = 10, C = 100)"]
    figure_name = defaults_figure(summary, by_label, qwen_metrics, out_dir)
    verdict = verdict_lines(by_label, qwen_metrics, qwen_trainable, big)
    title, text = module_text(__name__)
    return ExperimentResult(
        name="V10",
        title=title,
        claims=report_claims(summary, by_label, big, quick),
        body=report_body(text, summary, verdict, (qwen_trainable, qwen_metrics), elapsed),
        figures=[figure_name],
        headline=(
            f"text acc. D14 {fmt(default['accuracy'], 3)} vs drafts {fmt(drafts['accuracy'], 3)} vs Qwen "
            f"{fmt(qwen_metrics['text_accuracy'], 3)}; argmax P = greedy at init {fmt(100 * default['agreement'], 4)}%"
        ),
        settings=(
            f"V9's harness: {settings['steps']} steps (unless the arm says otherwise), batch {BATCH}, learning rate "
            f"{fmt(settings['lr'])}, {settings['train_texts']} domain-B training texts, {settings['eval_texts']} "
            "held-out domain-B and domain-A "
            f"texts, CausalQwen `causal` with "
            + ", ".join(f"{k} = {fmt(v)}" for k, v in OVERRIDES.items())
            + f"; D14 = {D14_INIT}; drafts = {DRAFT_INIT}; finalist seeds "
            + ("0" if quick else f"{SEED}, {SEED + 1}, {SEED + 2}")
        ),
    )
