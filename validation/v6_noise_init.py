r"""The zero-init pitfall of the exogenous noise $b_{\mathrm{noise}}$

**Claim.** The noise enters only through its magnitude, $\mathrm{scale}_{U'} = \mathrm{scale}_U + \lvert b_{\mathrm{noise}}\rvert$,
so by the chain rule

$$
\frac{\partial L}{\partial b_{\mathrm{noise},j}} = \frac{\partial L}{\partial \lvert b_{\mathrm{noise},j}\rvert}\cdot\operatorname{sign}(b_{\mathrm{noise},j}),
$$

and PyTorch's derivative of $\lvert x\rvert$ at $x = 0$ is $\operatorname{sign}(0) = 0$. The drafts' zero
initialization therefore gives $b_{\mathrm{noise}}$ an exactly zero gradient, and AdamW never moves it:
the noise can never be learned. Any nonzero start, however small, gets the full gradient
$\lvert\partial L/\partial \lvert b\rvert\rvert$. This is why decision D7 initializes every component at 0.1.

**Method.** The embedded tiny base converted with ``from_qwen`` at several ``noise_init`` values;
the total loss of a batch of synthetic sentences through the model's forward, both on the fused
training path (the default with ``labels``) and on the literal path (``return_decisions=True``);
the gradient of $b_{\mathrm{noise}}$ after ``backward``. Then a few steps of the real training loop
(`causalqwen.train`, preset ``causal``) from 0 and from 0.1.
"""  # noqa: E501

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import torch

from causalqwen import train
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.training import TrainingConfig

from .common import ExperimentResult, check, fmt, module_text, save_figure, table
from .fixtures import sentence_batch

NOISE_INITS = [0.0, 1e-6, 1e-3, 0.1, 1.0, -0.1]
DATA_SEED = 21
TRAIN_SEED = 0


def _b_noise_gradient(model, batch, literal: bool) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    out = model(**batch, return_decisions=literal)
    out.loss.backward()
    return model.action.b_noise.grad.detach().clone()


def _torch_abs_gradient() -> float:
    """PyTorch's derivative of |x| at x = 0."""
    abs_at_zero = torch.zeros((), requires_grad=True)
    abs_at_zero.abs().backward()
    return float(abs_at_zero.grad)


def _gradient_rows(batch: dict) -> tuple[list[list], dict[float, float]]:
    """Per ``noise_init``: the gradient of b_noise at init on the fused and the literal path; and the fused norms."""
    rows, fused_norms = [], {}
    for noise_init in NOISE_INITS:
        model = build_tiny_causal_lm(init_seed=0, noise_init=noise_init).model
        fused = _b_noise_gradient(model, batch, literal=False)
        literal = _b_noise_gradient(model, batch, literal=True)
        fused_norms[noise_init] = float(fused.norm())
        rows.append(
            [
                noise_init,
                float(fused.norm()),
                float(literal.norm()),
                int((fused == 0).sum()),
                fused.numel(),
                float((fused - literal).abs().max()),
            ]
        )
    return rows, fused_norms


def _training_moves(tokenizer, config: TrainingConfig) -> dict[float, tuple[float, float]]:
    """From noise_init 0 and 0.1: how far the training loop moves b_noise, and its largest magnitude after."""
    train_set = TextDataset(synthetic_texts(64, seed=DATA_SEED + 1), tokenizer, max_length=64)
    moved = {}
    for noise_init in (0.0, 0.1):
        model = build_tiny_causal_lm(init_seed=0, noise_init=noise_init).model
        start = model.action.b_noise.detach().clone()
        train(model, train_set, config, progress=False)
        moved[noise_init] = (
            float((model.action.b_noise.detach() - start).abs().max()),
            float(model.action.b_noise.detach().abs().max()),
        )
    return moved


def _gradient_figure(fused_norms: dict[float, float], out_dir: Path) -> str:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    labels = [fmt(v) for v in NOISE_INITS]
    heights = [fused_norms[v] for v in NOISE_INITS]
    bars = axis.bar(labels, heights, color=["C3" if v == 0 else "C0" for v in NOISE_INITS])
    for bar, height in zip(bars, heights):
        axis.annotate(
            fmt(height, 3),
            (bar.get_x() + bar.get_width() / 2, height),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=8,
        )
    axis.set(
        xlabel="noise_init (every component of b_noise)",
        ylabel="‖∂L/∂b_noise‖₂ at init (fused path)",
        title="gradient of the exogenous noise: exactly 0 at a zero init",
    )
    return save_figure(figure, out_dir, "v6_noise_gradient.png")


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    sentences = 8 if quick else 32
    train_steps = 5 if quick else 20
    tokenizer = build_tiny_causal_lm().tokenizer
    batch = sentence_batch(tokenizer, sentences, DATA_SEED)
    torch_abs_grad = _torch_abs_gradient()
    rows, fused_norms = _gradient_rows(batch)
    config = TrainingConfig(
        steps=train_steps,
        batch_size=8,
        learning_rate=3e-3,
        warmup_steps=0,
        preset="causal",
        eval_every=train_steps,
        save_every=train_steps,
        log_every=train_steps,
        seed=TRAIN_SEED,
    )
    moved = _training_moves(tokenizer, config)
    figure_name = _gradient_figure(fused_norms, out_dir)

    title, text = module_text(__name__)
    nonzero_min = min(fused_norms[v] for v in NOISE_INITS if v != 0)
    body = "\n\n".join(
        [
            text,
            f"PyTorch's $\\partial\\lvert x\\rvert/\\partial x$ at $x = 0$: {fmt(torch_abs_grad)}.",
            f"**Gradient at initialization** ({sentences} sentences, total loss):",
            table(
                [
                    "noise_init",
                    "‖grad‖₂ (fused path)",
                    "‖grad‖₂ (literal path)",
                    "zero components",
                    "components",
                    "max abs(fused − literal)",
                ],
                rows,
            ),
            f"**{train_steps} steps of the training loop** (preset ``causal``, AdamW, lr {fmt(config.learning_rate)}):",
            table(
                ["noise_init", "max abs change of b_noise", "max abs(b_noise) after"],
                [[v, moved[v][0], moved[v][1]] for v in (0.0, 0.1)],
            ),
        ]
    )
    claims = [
        check(
            "at noise_init = 0 the gradient of $b_{\\mathrm{noise}}$ is exactly 0 (‖grad‖₂, fused and literal)",
            max(rows[0][1], rows[0][2]),
            "==",
            0.0,
        ),
        check("every nonzero init gets a nonzero gradient (smallest ‖grad‖₂)", nonzero_min, ">", 0.0),
        check(
            f"after {train_steps} training steps from 0, $b_{{\\mathrm{{noise}}}}$ is still exactly 0 (max abs value)",
            moved[0.0][1],
            "==",
            0.0,
        ),
        check(
            f"after {train_steps} training steps from 0.1, $b_{{\\mathrm{{noise}}}}$ has moved (max abs change)",
            moved[0.1][0],
            ">=",
            1e-4,
        ),
    ]
    return ExperimentResult(
        name="V6",
        title=title,
        claims=claims,
        body=body,
        figures=[figure_name],
        headline=(
            f"‖∂L/∂b_noise‖ = {fmt(fused_norms[0.0])} at init 0 vs {fmt(fused_norms[0.1], 3)} at 0.1; "
            f"after {train_steps} steps b_noise moved {fmt(moved[0.0][0])} vs {fmt(moved[0.1][0], 3)}"
        ),
        settings=(
            f"noise_init ∈ {{{', '.join(fmt(v) for v in NOISE_INITS)}}}; {sentences} sentences (seed {DATA_SEED}); "
            f"training: {train_steps} steps, "
            f"batch 8 of 64 sentences (seed {DATA_SEED + 1}), training seed {TRAIN_SEED}; embedded tiny base"
        ),
    )
