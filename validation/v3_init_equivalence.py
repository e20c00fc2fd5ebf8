r"""Initialization equivalence with Qwen2: the logits, not the argmax of $P$

**Claim.** `CausalQwenForCausalLM.from_qwen` initializes $W_{\mathrm{loc}} = I$, $b_{\mathrm{loc}} = 0$,
$W_{\mathrm{cls}}$ as a copy of the base lm_head and $b_{\mathrm{cls}} = 0$, so for inputs without numbers

$$
\mathrm{loc}_{S,i} = W_{\mathrm{cls}}\, z_i = \text{the Qwen2 logits at position } i
$$

up to float32 rounding (decision D6–D7). What is *not* equal is the decision: standard inference
predicts $\arg\max_k P_k$ with

$$
P_k = \frac12 + \frac1\pi\arctan\frac{\mathrm{loc}_{S_k} - C}{(\gamma + \lvert b_{\mathrm{noise}}\rvert)\,\lVert W_{\mathrm{cls},k}\rVert_1}
$$

(at init $\mathrm{scale}_U = \gamma$ and $b_{\mathrm{noise}}$ is constant), and the per-class scale
$\lVert W_{\mathrm{cls},k}\rVert_1$ reorders the classes: for $C \gg \mathrm{loc}_S$ the argmax drifts to the
class with the largest row norm, for $C \ll \mathrm{loc}_S$ to the smallest. So the agreement of
$\arg\max_k P_k$ with Qwen2's greedy token is expected to be well below 100% for most $(C, \gamma)$:
that is a finding about the design, not a failure. The traditional mode's softmax of
$\mathrm{loc}_S$ does reproduce the greedy token exactly.

**At D14's defaults** ($\gamma = 0.1$, $C$ from the base by ``top_two_midpoint``, decision D14): if
$\ell_{(2)} < C < \ell_{(1)}$ at a position, the top class is the only one with $P_k > \tfrac12$ and the decision is
Qwen's greedy token there, whatever the scales. The rule puts $C$ there at a typical position of text the base
writes itself. This is checked on the tiny base pretrained on domain A (`validation.domains.pretrained_base`, the
base of V9 and V10), on held-out domain-A texts (no numbers, so $\mathrm{loc}_S$ is Qwen's logits): the share of
positions where $\arg\max_k P_k$ is Qwen's greedy token, for D14's defaults and for the drafts' values.

**Method.** Several tiny random Qwen2 models (`causalqwen.app.tiny.build_tiny_qwen`, different sizes,
seeds and tied or untied heads), each converted by ``from_qwen`` for every $\gamma$
(``abduction_scale_init``) of the grid. On random token ids (no numbers) the real Qwen2 forward
gives the logits; the CausalQwen forward gives $\mathrm{loc}_S$, $\mathrm{scale}_S$. The prediction is
`causalqwen.inference.predict` with the threshold $C$ of the grid; the traditional argmax comes from
`inference.traditional_probabilities` with ``top_k=1``.
"""  # noqa: E501

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from causalqwen import CausalQwenForCausalLM
from causalqwen.app.tiny import build_tiny_qwen, build_tiny_tokenizer
from causalqwen.files.data import TextDataset, collate
from causalqwen.inference import predict, traditional_probabilities
from causalqwen.initialization import DRAFT_INIT

from .common import ExperimentResult, check, fmt, module_text, save_figure, table
from .domains import domain_a_texts, pretrained_base, pretrained_numeric_tokenizer

CONFIGS = [  # build_tiny_qwen arguments
    dict(seed=0),  # the embedded default: H = 64, 2 layers, 4 heads, 2 kv heads, tied
    dict(
        seed=1,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        tie_word_embeddings=False,
    ),
    dict(
        seed=2, hidden_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, intermediate_size=192
    ),
    dict(
        seed=3,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=256,
        tie_word_embeddings=False,
    ),
    dict(
        seed=4, hidden_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96
    ),
]
THRESHOLDS = [-100.0, -10.0, 0.0, 10.0, 100.0, 1000.0]
GAMMAS = [0.01, 0.1, 1.0, 10.0, 100.0]
DRAFTS = (DRAFT_INIT["ovr_threshold"], DRAFT_INIT["abduction_scale_init"])  # (C, gamma) of the design drafts
MAX_LOGIT_ERROR = 1e-4
INPUT_SEED = 7


def _describe(config: dict) -> str:
    merged = (
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            tie_word_embeddings=True,
        )
        | config
    )
    return (
        f"H={merged['hidden_size']}, L={merged['num_hidden_layers']}, heads={merged['num_attention_heads']}/"
        f"{merged['num_key_value_heads']}, {'tied' if merged['tie_word_embeddings'] else 'untied'}, "
        f"seed {merged['seed']}"
    )


@torch.no_grad()
def pretrained_agreement(n_texts: int) -> dict:
    r"""On the pretrained tiny base and ``n_texts`` held-out domain-A texts: for D14's defaults and the drafts'
    values, the threshold, the largest |loc_S - Qwen's logits| and the share of real positions where
    $\arg\max_k P_k$ is Qwen's greedy token."""
    base, _ = pretrained_base()
    tokenizer = pretrained_numeric_tokenizer()
    batch = collate(
        TextDataset(domain_a_texts(n_texts, INPUT_SEED), tokenizer, max_length=64).items, tokenizer.pad_token_id
    )
    real = batch["attention_mask"].bool()
    logits = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, S, V]
    greedy = logits.argmax(-1)
    result = {"positions": int(real.sum())}
    for name, init in (("calibrated", {}), ("drafts", DRAFT_INIT)):
        torch.manual_seed(0)
        model = CausalQwenForCausalLM.from_qwen(base, num_token_id=tokenizer.num_token_id, **init).eval()
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        tokens, _ = predict(out.loc_S, out.scale_S, out.loc_Y, model.ovr_threshold, model.config.num_token_id)
        result[name] = {
            "C": float(model.ovr_threshold),
            "gamma": model.config.abduction_scale_init,
            "max_error": float((out.loc_S - logits)[real].abs().max()),
            "agreement": float((tokens == greedy)[real].double().mean()),
        }
    return result


def _one_base(index: int, config: dict, tokenizer, shape: tuple[int, int]) -> dict:
    r"""One random tiny Qwen2 (``config``), converted by ``from_qwen`` for every γ of the grid: the agreement of
    $\arg\max_k P_k$ with the greedy token ``[γ, C]``, the largest differences of loc_S from the logits, the
    traditional argmax's agreement and (at the drafts' values) the share of the largest-norm class."""
    num_token_id = len(tokenizer)  # where NumericTokenizer puts <NUM>
    qwen = build_tiny_qwen(tokenizer, **config)
    ids = torch.randint(0, len(tokenizer), shape, generator=torch.Generator().manual_seed(INPUT_SEED + index))
    with torch.no_grad():
        logits = qwen(ids).logits  # [B, S, V]
    greedy = logits.argmax(-1)
    l1 = qwen.lm_head.weight.detach().abs().sum(-1)  # ||W_k||_1 [V]
    agreement = np.zeros((len(GAMMAS), len(THRESHOLDS)))
    result = {"vocab_size": qwen.config.vocab_size, "max_error": 0.0, "max_relative": 0.0, "traditional_min": 1.0}
    for g, gamma in enumerate(GAMMAS):
        torch.manual_seed(0)  # w_num and w_reg are random; they do not enter loc_S here
        model = CausalQwenForCausalLM.from_qwen(qwen, num_token_id=num_token_id, abduction_scale_init=gamma).eval()
        with torch.no_grad():
            out = model(ids)
        difference = (out.loc_S - logits).abs()
        result["max_error"] = max(result["max_error"], float(difference.max()))
        result["max_relative"] = max(result["max_relative"], float((difference / logits.abs().clamp_min(1e-30)).max()))
        traditional = traditional_probabilities(out.loc_S, top_k=1).argmax(-1)
        result["traditional"] = float((traditional == greedy).double().mean())  # the last γ's is the table's
        result["traditional_min"] = min(result["traditional_min"], result["traditional"])
        for j, threshold in enumerate(THRESHOLDS):
            tokens, _ = predict(out.loc_S, out.scale_S, out.loc_Y, threshold, num_token_id)
            agreement[g, j] = float((tokens == greedy).double().mean())
            if (threshold, gamma) == DRAFTS:
                result["largest_norm_share"] = float((tokens == l1.argmax()).double().mean())
    result["agreement"] = agreement
    return result


def _agreement_figure(pooled: np.ndarray, n_configs: int, out_dir: Path) -> str:
    r"""The agreement of $\arg\max_k P_k$ with the greedy token, mean over the models, as a [γ, C] heat map."""
    figure, axis = plt.subplots(figsize=(8, 4.6))
    image = axis.imshow(100 * pooled, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for g in range(len(GAMMAS)):
        for j in range(len(THRESHOLDS)):
            axis.text(
                j,
                g,
                f"{100 * pooled[g, j]:.0f}",
                ha="center",
                va="center",
                color="white" if pooled[g, j] < 0.6 else "black",
                fontsize=9,
            )
    axis.set_xticks(range(len(THRESHOLDS)), [fmt(t) for t in THRESHOLDS])
    axis.set_yticks(range(len(GAMMAS)), [fmt(g) for g in GAMMAS])
    axis.set(
        xlabel="OvR threshold C",
        ylabel="initial scale γ (abduction_scale_init)",
        title=f"argmax P = Qwen2 greedy token at init (% of positions, mean of {n_configs} models)",
    )
    figure.colorbar(image, label="agreement (%)")
    return save_figure(figure, out_dir, "v3_argmax_agreement.png")


def _body(text: str, config_rows: list[list], pooled: np.ndarray, gamma_spread: float, pretrained: dict) -> str:
    return "\n\n".join(
        [
            text,
            "**Results per model.** Maximum absolute and relative difference between $\\mathrm{loc}_S$ and the "
            "Qwen2 logits (over every $\\gamma$), agreement of the traditional argmax with greedy decoding, and "
            f"of standard inference's $\\arg\\max_k P_k$ at the drafts' $C = {fmt(DRAFTS[0])}$, "
            f"$\\gamma = {fmt(DRAFTS[1])}$; the share of positions where that argmax is the class with the largest "
            "$\\lVert W_{\\mathrm{cls},k}\\rVert_1$; and the range of the agreement over the whole grid.",
            table(
                [
                    "base model",
                    "V",
                    "max abs diff",
                    "max rel diff",
                    "traditional = greedy",
                    "argmax P = greedy (drafts)",
                    "argmax P = largest-norm class (drafts)",
                    "min over grid",
                    "max over grid",
                ],
                config_rows,
            ),
            f"**Agreement of $\\arg\\max_k P_k$ with the greedy token** (mean over the {len(config_rows)} models; rows "
            "$\\gamma$, columns $C$). At init every $t_k$ is divided by the same "
            "$\\gamma + \\lvert b_{\\mathrm{noise}}\\rvert$, "
            "so $\\gamma$ cannot change the argmax; only $C$ and the row norms do. Largest change of the agreement "
            f"across $\\gamma$ (any model, any $C$): {fmt(gamma_spread)}.",
            table(
                ["γ \\ C"] + [fmt(t) for t in THRESHOLDS],
                [
                    [fmt(gamma)] + [f"{100 * pooled[g, j]:.1f}%" for j in range(len(THRESHOLDS))]
                    for g, gamma in enumerate(GAMMAS)
                ],
            ),
            f"**The pretrained base, D14's defaults against the drafts'** ({pretrained['positions']} positions of "
            "held-out "
            "domain-A text):",
            table(
                ["initialization", "γ", "C", "max |loc_S − logits|", "argmax P = greedy"],
                [
                    [
                        label,
                        pretrained[key]["gamma"],
                        pretrained[key]["C"],
                        pretrained[key]["max_error"],
                        f"{100 * pretrained[key]['agreement']:.2f}%",
                    ]
                    for key, label in (
                        ("calibrated", "D14 defaults (`from_qwen`)"),
                        ("drafts", "the drafts' (`DRAFT_INIT`)"),
                    )
                ],
            ),
        ]
    )


def _claims(max_error_all: float, traditional_all: float, gamma_spread: float, pretrained: dict) -> list:
    return [
        check(
            "$\\max \\lvert \\mathrm{loc}_S - \\mathrm{logits}\\rvert$ over every model, $\\gamma$ and position",
            max_error_all,
            "<=",
            MAX_LOGIT_ERROR,
        ),
        check(
            "traditional argmax of $\\mathrm{softmax}(\\mathrm{loc}_S)$ = greedy token (minimum share of positions)",
            traditional_all,
            ">=",
            1.0,
        ),
        check(
            "at init $\\gamma$ does not change $\\arg\\max_k P_k$ (largest change of the agreement across $\\gamma$)",
            gamma_spread,
            "<=",
            0.01,
        ),
        check(
            "pretrained base, D14's defaults: $\\max \\lvert \\mathrm{loc}_S - \\mathrm{logits}\\rvert$",
            pretrained["calibrated"]["max_error"],
            "<=",
            MAX_LOGIT_ERROR,
        ),
        check(
            "pretrained base, D14's defaults: $\\arg\\max_k P_k$ = Qwen's greedy token (share of positions)",
            pretrained["calibrated"]["agreement"],
            ">=",
            0.99,
        ),
    ]


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    configs = CONFIGS[:2] if quick else CONFIGS
    batch, length = (4, 16) if quick else (8, 32)
    tokenizer = build_tiny_tokenizer()

    bases = [_one_base(c, config, tokenizer, (batch, length)) for c, config in enumerate(configs)]
    agreement = np.stack([base["agreement"] for base in bases])  # [model, γ, C]
    config_rows = [
        [
            _describe(config),
            base["vocab_size"],
            base["max_error"],
            base["max_relative"],
            base["traditional"],
            base["agreement"][GAMMAS.index(DRAFTS[1]), THRESHOLDS.index(DRAFTS[0])],
            base["largest_norm_share"],
            base["agreement"].min(),
            base["agreement"].max(),
        ]
        for config, base in zip(configs, bases)
    ]
    max_error_all = max([0.0] + [base["max_error"] for base in bases])
    traditional_all = min([1.0] + [base["traditional_min"] for base in bases])

    pretrained = pretrained_agreement(40 if quick else 200)
    pooled = agreement.mean(axis=0)  # [gamma, C]
    gamma_spread = float((agreement.max(axis=1) - agreement.min(axis=1)).max())  # over gamma, worst model and C
    figure_name = _agreement_figure(pooled, len(configs), out_dir)

    title, text = module_text(__name__)
    return ExperimentResult(
        name="V3",
        title=title,
        claims=_claims(max_error_all, traditional_all, gamma_spread, pretrained),
        body=_body(text, config_rows, pooled, gamma_spread, pretrained),
        figures=[figure_name],
        headline=(
            f"max |loc_S − logits| = {fmt(max_error_all, 3)}; pretrained base: argmax P = greedy at "
            f"{100 * pretrained['calibrated']['agreement']:.2f}% of positions at D14's defaults, "
            f"{100 * pretrained['drafts']['agreement']:.1f}% at the drafts'; random bases: "
            f"{100 * pooled.min():.1f}–{100 * pooled.max():.1f}% over the grid"
        ),
        settings=(
            f"{len(configs)} tiny Qwen2 models, random ids [{batch}, {length}] (seed {INPUT_SEED} + model index), "
            f"C ∈ {{{', '.join(fmt(t) for t in THRESHOLDS)}}}, γ ∈ {{{', '.join(fmt(g) for g in GAMMAS)}}}, "
            "noise_init 0.1, float32"
        ),
    )
