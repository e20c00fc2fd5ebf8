r"""Head to head with Qwen: the same base, the same data, the same steps, a matched budget

**Question.** Does CausalQwen do anything better, or worse, than the Qwen2 it starts from? The design asks
for this comparison (the reviewed overview's notes on §2.2–2.3): fine-tune the abduction network first under
a bound on how far $U$ moves from the base's, the backbone only late and with LoRA, and compare with Qwen
fairly.

**Method.** The embedded tiny Qwen2 is first pretrained on a *domain A* corpus (plain English about animals,
seasons and places, no numbers; plain cross-entropy; `validation.domains.pretrained_base`, cached on disk).
From that one base, every model is fine-tuned on the same *domain B* corpus (prices that depend on the item,
a number copied later in the sentence, a number doubled; `validation.domains.domain_b_records`) for the same
number of steps with the same batch size and learning rate, and evaluated on the same held-out texts with one
set of metric definitions (`validation.comparison_eval`):

| model | what trains | counterpart |
|---|---|---|
| Qwen `head` | untied lm_head + bias + a residual MLP adapter on $z$ (backbone frozen) | CausalQwen `causal` |
| Qwen `adapter` | the residual MLP adapter only | CausalQwen `abduction` |
| Qwen `lora` | LoRA rank 8 on the backbone + the `head` parameters | CausalQwen `lora` |
| CausalQwen `causal` | $\vec w_{\mathrm{num}}$, abduction, head (backbone frozen) | |
| CausalQwen `abduction` | the abduction network only | |
| CausalQwen `lora` | LoRA rank 8 on the backbone + the `causal` modules | |

CausalQwen `causal`, `abduction` and `lora` also run with the bound $\bar D(U, U_{\mathrm{base}}) \le \varepsilon$
(`causalqwen.divergence`). Qwen reads numbers as digit tokens and writes them greedily; CausalQwen reads a
`<NUM>` token with its value and predicts $\mathrm{loc}_Y$. Reported: next-token accuracy on the text
tokens, the expected calibration error (ECE) and Brier score of the top-1 decision there, the number MAE and
median error (MdAE, and MdAE counting an unparseable Qwen number as an infinite error), the share of
unparseable numbers; the same after training on a corpus where 10% of the numbers are heavy-tailed outliers
(Pareto factor, tail index 1), and on numbers outside the training range (copy and doubling, 200–5000);
forgetting: domain-A text accuracy before and after, and, for CausalQwen `abduction`, a sweep over $\varepsilon$.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from transformers import Qwen2Tokenizer

from causalqwen import CausalQwenForCausalLM, NumericTokenizer
from causalqwen.data import TextDataset, collate
from causalqwen.divergence import u_divergence
from causalqwen.lora import add_lora, merge_lora, trainable_parameter_count
from causalqwen.training import TrainingConfig, set_trainable, train

from .common import ExperimentResult, check, fmt, module_text, save_figure, table
from .comparison_eval import evaluate_causal, evaluate_qwen, finetune_qwen
from .domains import domain_a_texts, domain_b_records, pretrain_loss_a, pretrained_base, pretrained_base_path

SEED = 0
QUICK = dict(steps=60, train_texts=600, eval_texts=80, epsilons=(1.0, 0.1), lr=1e-2, bound=0.3, dual_lr=20.0)
FULL = dict(steps=500, train_texts=4000, eval_texts=300, epsilons=(3.0, 1.0, 0.3, 0.1, 0.03), lr=1e-2, bound=0.3,
            dual_lr=20.0)
BATCH = 16
LORA_RANK = 8
OVERRIDES = {"gate_alpha": 1.0, "regression_weight": 0.1}  # as the demo: the gate needs alpha > 0 (V7)


def _numeric_tokenizer() -> NumericTokenizer:
    """A NumericTokenizer on its own copy of the base's tokenizer (adding <NUM> changes the one it wraps)."""
    return NumericTokenizer(Qwen2Tokenizer.from_pretrained(pretrained_base_path(), local_files_only=True))


def _causal_model(base, tokenizer: NumericTokenizer) -> CausalQwenForCausalLM:
    torch.manual_seed(SEED)
    return CausalQwenForCausalLM.from_qwen(base, num_token_id=tokenizer.num_token_id, **OVERRIDES).eval()


def _train_causal(base, tokenizer, texts, preset, settings, bound=None):
    """CausalQwen from ``base``, trained with ``preset`` (and the bound ``bound``); ``(model, trainable, history)``."""
    model = _causal_model(base, tokenizer)
    if preset == "lora":
        model = add_lora(model, rank=LORA_RANK, alpha=2 * LORA_RANK)
    set_trainable(model, preset)
    n_trainable = trainable_parameter_count(model)
    config = TrainingConfig(steps=settings["steps"], batch_size=BATCH, learning_rate=settings["lr"],
                            warmup_steps=max(1, settings["steps"] // 10), preset=preset, log_every=10,
                            eval_every=10**9, save_every=10**9, seed=SEED, max_u_divergence=bound,
                            divergence_dual_lr=settings["dual_lr"])
    history = train(model, TextDataset(texts, tokenizer, max_length=64), config, progress=False)
    if preset == "lora":
        model = merge_lora(model)
    return model.eval(), n_trainable, history


def _held_out_divergence(model, base_model, tokenizer, texts) -> float:
    """Mean over held-out positions of sum_c KL(U || U_base), each model on its own pass."""
    batch = collate(TextDataset(texts, tokenizer, max_length=64).items, tokenizer.pad_token_id)
    inputs = (batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    with torch.no_grad():
        law, base_law = model.abduce(*inputs), base_model.abduce(*inputs)
        total, count = u_divergence(law.loc_U, law.scale_U, base_law.loc_U, base_law.scale_U, batch["attention_mask"])
    return float(total) / int(count)


def _row(name, kind, trainable, clean, outliers, extrapolation, a_accuracy, divergence=math.nan):
    return dict(name=name, kind=kind, trainable=trainable, clean=clean, outliers=outliers, extrapolation=extrapolation,
                a_accuracy=a_accuracy, divergence=divergence)


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    settings = QUICK if quick else FULL
    started = time.perf_counter()
    qwen_base, qwen_tokenizer = pretrained_base()
    tokenizer = _numeric_tokenizer()
    n_train, n_eval = settings["train_texts"], settings["eval_texts"]
    train_clean = [r.text for r in domain_b_records(n_train, SEED)]
    train_outliers = [r.text for r in domain_b_records(n_train, SEED, outlier_fraction=0.1)]
    held_out = domain_b_records(n_eval, SEED + 1)
    extrapolation = domain_b_records(n_eval, SEED + 2, extrapolate=True)
    domain_a = domain_a_texts(n_eval, SEED + 3)
    base_causal = _causal_model(qwen_base, tokenizer)

    before_qwen = evaluate_qwen(qwen_base, qwen_tokenizer, domain_a)["text_accuracy"]
    before_causal = evaluate_causal(base_causal, tokenizer, domain_a)["text_accuracy"]
    base_a_loss = pretrain_loss_a(qwen_base, qwen_tokenizer, domain_a)

    rows = []
    for variant in ("head", "adapter", "lora"):
        trained = {}
        for corpus, texts in (("clean", train_clean), ("outliers", train_outliers)):
            if corpus == "outliers" and variant == "adapter":
                continue
            trained[corpus], n_trainable = finetune_qwen(qwen_base, qwen_tokenizer, texts, variant, settings["steps"],
                                                         BATCH, settings["lr"], SEED, lora_rank=LORA_RANK)
        model = trained["clean"]
        rows.append(_row(f"Qwen `{variant}`", "qwen", n_trainable, evaluate_qwen(model, qwen_tokenizer, held_out),
                         evaluate_qwen(trained["outliers"], qwen_tokenizer, held_out) if "outliers" in trained else None,
                         evaluate_qwen(model, qwen_tokenizer, extrapolation),
                         evaluate_qwen(model, qwen_tokenizer, domain_a)["text_accuracy"]))

    causal_runs = [("causal", None), ("causal", settings["bound"]), ("abduction", None),
                   ("abduction", settings["bound"]), ("lora", None), ("lora", settings["bound"])]
    histories = {}
    for preset, bound in causal_runs:
        model, n_trainable, history = _train_causal(qwen_base, tokenizer, train_clean, preset, settings, bound)
        outliers = None
        if preset != "abduction":
            outlier_model, _, _ = _train_causal(qwen_base, tokenizer, train_outliers, preset, settings, bound)
            outliers = evaluate_causal(outlier_model, tokenizer, held_out)
        name = f"CausalQwen `{preset}`" + (f", bound ε = {fmt(bound)}" if bound is not None else "")
        histories[name] = history
        rows.append(_row(name, "causal", n_trainable, evaluate_causal(model, tokenizer, held_out), outliers,
                         evaluate_causal(model, tokenizer, extrapolation),
                         evaluate_causal(model, tokenizer, domain_a)["text_accuracy"],
                         _held_out_divergence(model, base_causal, tokenizer, [r.text for r in held_out])))

    sweep = []  # CausalQwen `abduction` (the design's first step) over epsilon: forgetting against domain-B quality
    for epsilon in (None,) + tuple(settings["epsilons"]):
        model, _, _ = _train_causal(qwen_base, tokenizer, train_clean, "abduction", settings, epsilon)
        clean = evaluate_causal(model, tokenizer, held_out)
        a_metrics = evaluate_causal(model, tokenizer, domain_a)
        sweep.append(dict(epsilon=epsilon, divergence=_held_out_divergence(model, base_causal, tokenizer,
                                                                           [r.text for r in held_out]),
                          a_accuracy=a_metrics["text_accuracy"], b_accuracy=clean["text_accuracy"],
                          b_mdae=clean["target_mdae"]))
    elapsed = time.perf_counter() - started

    # ---- tables ----
    def metric(result, key):
        return math.nan if result is None else result[key]

    main_rows = [[r["name"], r["trainable"], metric(r["clean"], "text_accuracy"), metric(r["clean"], "ece"),
                  metric(r["clean"], "brier"), metric(r["clean"], "mae"), metric(r["clean"], "mdae"),
                  metric(r["clean"], "mdae_strict"), metric(r["clean"], "unparseable"),
                  metric(r["clean"], "n_numbers")] for r in rows]
    group_rows = []
    for r in rows:
        groups = r["clean"]["by_group"]
        group_rows.append([r["name"]] + [groups.get(g, {}).get("mdae", math.nan)
                                         for g in ("price/target", "copy/target", "scaled/target")]
                          + [r["clean"]["target_mdae_strict"]])
    robust_rows = [[r["name"], metric(r["outliers"], "text_accuracy"), metric(r["outliers"], "target_mdae"),
                    metric(r["outliers"], "target_mdae_strict"), metric(r["outliers"], "unparseable"),
                    metric(r["extrapolation"], "text_accuracy"), metric(r["extrapolation"], "target_mdae"),
                    metric(r["extrapolation"], "target_mdae_strict"), metric(r["extrapolation"], "unparseable")]
                   for r in rows]
    forget_rows = [[r["name"], before_qwen if r["kind"] == "qwen" else before_causal, r["a_accuracy"],
                    r["divergence"]] for r in rows]
    sweep_rows = [["none" if s["epsilon"] is None else s["epsilon"], s["divergence"], s["a_accuracy"],
                   s["b_accuracy"], s["b_mdae"]] for s in sweep]

    # ---- figure ----
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    names = [r["name"].replace("`", "") for r in rows]
    colors = ["tab:blue" if r["kind"] == "qwen" else "tab:orange" for r in rows]
    left.barh(names, [r["clean"]["text_accuracy"] for r in rows], color=colors)
    left.set(xlabel="held-out text accuracy (domain B)", xlim=(0, 1))
    left.invert_yaxis()
    left.tick_params(axis="y", labelsize=7)
    mdae = [r["clean"]["target_mdae_strict"] for r in rows]
    middle.barh(names, [m if math.isfinite(m) else 0 for m in mdae], color=colors)
    for index, value in enumerate(mdae):
        if not math.isfinite(value):
            middle.text(0, index, " unparseable for half or more", va="center", fontsize=7)
    middle.set(xlabel="held-out MdAE of predictable numbers (strict)", xscale="symlog")
    middle.invert_yaxis()
    middle.set_yticklabels([])
    xs = [s["a_accuracy"] for s in sweep]
    ys = [s["b_accuracy"] for s in sweep]
    right.plot(xs, ys, "o-", color="tab:orange")
    for s, x, y in zip(sweep, xs, ys):
        right.annotate("ε=none" if s["epsilon"] is None else f"ε={fmt(s['epsilon'])}", (x, y), fontsize=7,
                       textcoords="offset points", xytext=(4, 4))
    right.axvline(before_causal, color="gray", ls="--", lw=1, label="domain A before fine-tuning")
    right.set(xlabel="domain-A text accuracy after fine-tuning (forgetting →  left)",
              ylabel="domain-B text accuracy", title="CausalQwen `abduction`: bound ε sweep")
    right.legend(fontsize=8)
    figure_name = save_figure(figure, out_dir, "v9_comparison.png")

    # ---- verdict ----
    by_name = {r["name"]: r for r in rows}
    qwen_head, causal = by_name["Qwen `head`"], by_name["CausalQwen `causal`"]
    qwen_lora, causal_lora = by_name["Qwen `lora`"], by_name["CausalQwen `lora`"]
    bounded = by_name[f"CausalQwen `causal`, bound ε = {fmt(settings['bound'])}"]
    abduction = by_name["CausalQwen `abduction`"]
    abduction_bounded = by_name[f"CausalQwen `abduction`, bound ε = {fmt(settings['bound'])}"]

    def better(a, b, lower=True):
        return "CausalQwen" if (a < b if lower else a > b) else "Qwen"

    verdict = [
        f"- **Text** (frozen backbone): Qwen `head` {fmt(qwen_head['clean']['text_accuracy'], 3)} vs CausalQwen "
        f"`causal` {fmt(causal['clean']['text_accuracy'], 3)}; with LoRA {fmt(qwen_lora['clean']['text_accuracy'], 3)} vs "
        f"{fmt(causal_lora['clean']['text_accuracy'], 3)}: "
        f"{better(causal['clean']['text_accuracy'], qwen_head['clean']['text_accuracy'], lower=False)} is ahead with a "
        "frozen backbone.",
        f"- **Calibration** (ECE, frozen backbone): Qwen {fmt(qwen_head['clean']['ece'], 3)}, CausalQwen "
        f"{fmt(causal['clean']['ece'], 3)}.",
        f"- **Numbers** (MdAE of the predictable numbers, unparseable counted as infinite): Qwen `head` "
        f"{fmt(qwen_head['clean']['target_mdae_strict'], 3)}, CausalQwen `causal` "
        f"{fmt(causal['clean']['target_mdae_strict'], 3)}; Qwen `lora` {fmt(qwen_lora['clean']['target_mdae_strict'], 3)}, "
        f"CausalQwen `lora` {fmt(causal_lora['clean']['target_mdae_strict'], 3)}.",
        f"- **Outliers in training** (target MdAE): Qwen `head` {fmt(metric(qwen_head['outliers'], 'target_mdae_strict'), 3)}, "
        f"CausalQwen `causal` {fmt(metric(causal['outliers'], 'target_mdae_strict'), 3)}.",
        f"- **Extrapolation** (target MdAE, 200–5000): Qwen `head` "
        f"{fmt(qwen_head['extrapolation']['target_mdae_strict'], 3)}, Qwen `lora` "
        f"{fmt(qwen_lora['extrapolation']['target_mdae_strict'], 3)}, CausalQwen `causal` "
        f"{fmt(causal['extrapolation']['target_mdae_strict'], 3)}, CausalQwen `lora` "
        f"{fmt(causal_lora['extrapolation']['target_mdae_strict'], 3)}.",
        f"- **Forgetting** (domain-A text accuracy, before → after): Qwen `head` {fmt(before_qwen, 3)} → "
        f"{fmt(qwen_head['a_accuracy'], 3)}, Qwen `adapter` → {fmt(by_name['Qwen `adapter`']['a_accuracy'], 3)}; "
        f"CausalQwen `abduction` {fmt(before_causal, 3)} → {fmt(abduction['a_accuracy'], 3)}, with the bound "
        f"ε = {fmt(settings['bound'])} → {fmt(abduction_bounded['a_accuracy'], 3)}; CausalQwen `causal` → "
        f"{fmt(causal['a_accuracy'], 3)}, with the bound → {fmt(bounded['a_accuracy'], 3)}. The bound is on $U$ only: "
        "with `abduction` the head is frozen and the bound on $U$ bounds how far the decisions move; with `causal` "
        "the head trains too, and a bound on $U$ does not hold its decisions on domain A in place.",
    ]

    title, text = module_text(__name__)
    body = "\n\n".join([
        text,
        f"Base: the tiny Qwen2 pretrained on domain A (held-out domain-A cross-entropy {fmt(base_a_loss, 3)} nats per "
        f"token). Domain-A text accuracy of the base: Qwen {fmt(before_qwen, 3)}, CausalQwen at initialization "
        f"{fmt(before_causal, 3)} (its standard decision is the OvR argmax, which at $C_k = 100$ is not Qwen's argmax; "
        "see V3).",
        "**Held-out domain B** (clean training data):",
        table(["model", "trainable", "text acc.", "ECE", "Brier", "number MAE", "MdAE", "MdAE strict",
               "unparseable", "numbers"], main_rows),
        "**Median absolute error by template** (predictable numbers; strict = unparseable counted as infinite):",
        table(["model", "price", "copy", "doubled", "all, strict"], group_rows),
        "**Robustness**: trained with 10% outliers, evaluated on clean held-out data; and extrapolation to "
        "numbers outside the training range (copy and doubling, 200–5000):",
        table(["model", "outliers: text acc.", "target MdAE", "strict", "unparseable", "extrapolation: text acc.",
               "target MdAE", "strict", "unparseable"], robust_rows),
        "**Forgetting**: domain-A text accuracy before and after fine-tuning on domain B, and (CausalQwen) the "
        "held-out divergence of $U$ from the starting model's ($\\bar D$, nats per position):",
        table(["model", "domain A before", "domain A after", "held-out D(U, U_base)"], forget_rows),
        "**The bound ε sweep** (CausalQwen `abduction`, the abduction network alone, as the design fine-tunes first):",
        table(["ε", "held-out D(U, U_base)", "domain-A text acc.", "domain-B text acc.", "domain-B target MdAE"],
              sweep_rows),
        "**What it says.**",
        "\n".join(verdict),
        f"The whole experiment took {fmt(elapsed, 3)} s.",
    ])
    bound_run = abduction_bounded["divergence"]
    free_run = abduction["divergence"]
    claims = [
        check("every model was evaluated on the same number of text positions (Qwen `head` − CausalQwen `causal`)",
              qwen_head["clean"]["text_positions"] - causal["clean"]["text_positions"], "==", 0),
        check("matched budget: CausalQwen `causal` trainable / Qwen `head` trainable",
              causal["trainable"] / qwen_head["trainable"], "<=", 1.02),
        check("matched budget: CausalQwen `abduction` trainable / Qwen `adapter` trainable",
              by_name["CausalQwen `abduction`"]["trainable"] / by_name["Qwen `adapter`"]["trainable"], "==", 1.0),
        check(f"the bound holds on held-out text (`abduction`): D(U, U_base) with ε = {fmt(settings['bound'])}, "
              "as a multiple of ε", bound_run / settings["bound"], "<=", 1.5),
        check("the bound holds on held-out text (`causal`), as a multiple of ε",
              bounded["divergence"] / settings["bound"], "<=", 1.5),
        check("the bound binds (`abduction`): held-out D(U, U_base) without it / with it",
              free_run / max(bound_run, 1e-12), ">=", 2.0),
        check("with the bound, the abduction network forgets less: domain-A accuracy (bounded − unbounded)",
              abduction_bounded["a_accuracy"] - abduction["a_accuracy"], ">=", 0.0),
    ]
    return ExperimentResult(
        name="V9",
        title=title,
        claims=claims,
        body=body,
        figures=[figure_name],
        headline=(f"text acc. Qwen {fmt(qwen_head['clean']['text_accuracy'], 3)} vs CausalQwen "
                  f"{fmt(causal['clean']['text_accuracy'], 3)}; number MdAE {fmt(qwen_head['clean']['target_mdae_strict'], 3)} "
                  f"vs {fmt(causal['clean']['target_mdae_strict'], 3)} (frozen backbone)"),
        settings=(f"{settings['steps']} steps for every model, batch {BATCH}, learning rate {fmt(settings['lr'])}, "
                  f"{n_train} domain-B training texts (seed {SEED}), {n_eval} held-out, extrapolation and domain-A "
                  f"texts (seeds {SEED + 1}–{SEED + 3}), LoRA rank {LORA_RANK} (alpha {2 * LORA_RANK}), bound "
                  f"ε = {fmt(settings['bound'])} with dual step {fmt(settings['dual_lr'])}, ε sweep "
                  f"{', '.join(fmt(e) for e in settings['epsilons'])}, CausalQwen "
                  + ", ".join(f"{k} = {fmt(v)}" for k, v in OVERRIDES.items())),
    )
