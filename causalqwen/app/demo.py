r"""``causalqwen demo``: the main job. Train CausalQwen from the embedded tiny base and show that it learns.

1. Build the tiny random Qwen2 base and its tokenizer, and convert with ``from_qwen``.
2. Train on the synthetic corpus (`causalqwen.files.data`) with preset ``all`` (the base is random, so the
   backbone must learn too), evaluating on held-out sentences drawn with another seed.
3. Print the before/after table, the regression error per template, and one generated sample per
   inference mode; write ``loss.png`` and ``metrics.png``, the run (``metrics.jsonl``, checkpoint) and
   the trained model with its tokenizer (``model/``) to the output directory.
4. Exit 1 unless it learned: held-out ``num_f1 >= 0.9`` and ``reg_mdae <= 0.5 x`` its value at init.

The loss is the config's: the design's gate $P_{\langle NUM\rangle}\cdot\mathrm{nll}$ ($\alpha = 0$), its
$P_{\langle NUM\rangle}$ detached, and $\lambda = 1$ (decision D24: the gate study measured it against the plain NLL
the demo used to train with, $\alpha = 1$ and $\lambda = 0.1$, and found no loss; undetached, the gate's own gradient
closes it, validation V7).
"""

from __future__ import annotations

import os
import random
import time

import torch

from ..files.data import TEMPLATES, TextDataset, collate, synthetic_texts
from ..files.rundir import MARKER, RunDirectory, open_for_writing
from ..inference import MODES
from ..metrics import evaluate_batch, regression_metrics, with_log_prefixes
from ..training import TrainingConfig
from .training_run import save_trained_model, train

__all__ = ["DEMO_STEPS", "DEMO_THREADS", "run_demo"]

DEMO_STEPS = 1500
# One intra-op thread: the tiny model's kernels are too small for a second thread to pay off (1.07 s against 1.27 s
# for 60 steps on an idle 2-core machine), and beside another busy process two spinning threads collapse
# (3.46 s against 1.22 s with one); `python -m benchmarks contention` measures both.
DEMO_THREADS = 1
DEMO_OVERRIDES: dict = {}  # the config's defaults (decision D24)
PROMPTS = ["A cup of coffee costs", "The team won 12 games, then", "One book costs 7 yuan, so two books cost"]
TABLE_ROWS = [
    ("eval/accuracy", "accuracy"),
    ("eval/num_f1", "num_f1"),
    ("eval/reg_mae", "reg_mae"),
    ("eval/reg_mdae", "reg_mdae"),
    ("dist/ovr_prob_sum_median", "OvR sum median (standard)"),
    ("dist/ovr_prob_sum_median_causal", "OvR sum median (causal)"),
]


def _per_template_mdae(model, tokenizer, seed: int) -> dict[str, float]:
    """Held-out MdAE of loc_Y at <NUM> targets, template by template (100 sentences each)."""
    result = {}
    for name, template in TEMPLATES.items():
        rng = random.Random(seed)
        batch = collate(TextDataset([template(rng) for _ in range(100)], tokenizer, 64).items, tokenizer.pad_token_id)
        with torch.no_grad():
            out = model(
                batch["input_ids"],
                numeric_values=batch["numeric_values"],
                attention_mask=batch["attention_mask"],
                labels=batch["labels"],
            )  # out.targets: what each position is scored against
        result[name] = regression_metrics(out.loc_Y, out.targets.values, out.targets.is_num)["reg_mdae"]
    return result


def _smoothed(values: list[float], window: int = 10) -> list[float]:
    """The trailing mean over up to ``window`` values: the trend of a noisy per-batch loss."""
    return [sum(values[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window)) for i in range(len(values))]


def _plots(history: list[dict], out_dir: str) -> list[str]:
    """``loss.png`` (each loss part per batch, faint, and its trailing mean; symmetric-log axis, since the
    first steps' loss is tens of times the final one and the gated regression loss can be negative) and
    ``metrics.png`` (held-out metrics from step 0, the model before training, on three panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key):
        points = [(r["step"], r[key]) for r in history if key in r]
        return [p[0] for p in points], [p[1] for p in points]

    def written(figure, name: str) -> str:
        """Lay out ``figure``, write it as ``out_dir/name`` and close it (never through a planted link,
        causalqwen.files.rundir)."""
        figure.tight_layout()
        path = os.path.join(out_dir, name)
        with open_for_writing(path, "wb") as handle:
            figure.savefig(handle, format="png", dpi=120)
        plt.close(figure)
        return path

    figure, axis = plt.subplots(figsize=(7, 4))
    for key, color in (("train/total_loss", "C0"), ("train/cls_loss_mean", "C1"), ("train/reg_loss_effective", "C2")):
        steps, values = series(key)
        axis.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
        axis.plot(steps, _smoothed(values), color=color, linewidth=2, label=f"{key.split('/')[1]} (mean of 10 logs)")
    axis.set_yscale("symlog", linthresh=1.0)
    axis.set(xlabel="step", ylabel="loss (symmetric log scale)", title="CausalQwen demo: loss parts (training batches)")
    axis.legend()
    loss_png = written(figure, "loss.png")

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    for key, style in (("eval/accuracy", "o-"), ("eval/num_f1", "s--")):
        left.plot(*series(key), style, label=key.split("/")[1])
    left.set(xlabel="step", ylim=(-0.05, 1.05), title="held-out classification (step 0: before training)")
    left.legend()
    for key, style in (("dist/ovr_prob_sum_median", "o-"), ("dist/ovr_prob_sum_median_causal", "s--")):
        middle.plot(*series(key), style, label=key.split("/")[1])
    middle.axhline(1.0, color="grey", linewidth=0.8, linestyle=":", label="calibrated (1)")
    middle.set(xlabel="step", yscale="log", title="median of the OvR probability sum")
    middle.legend()
    for key, style in (("eval/reg_mae", "o-"), ("eval/reg_mdae", "s--")):
        right.plot(*series(key), style, label=key.split("/")[1])
    right.set(xlabel="step", ylabel="absolute error", yscale="log", title="held-out regression at <NUM> targets")
    right.legend()
    return [loss_png, written(figure, "metrics.png")]


def run_demo(
    out_dir: str = "artifacts/demo",
    steps: int = DEMO_STEPS,
    seed: int = 0,
    progress: bool = True,
    *,
    threads: int = DEMO_THREADS,
) -> int:
    """Run the demo; return the process exit code (0: it learned, 1: it did not).

    ``out_dir`` must be new, empty, or an earlier demo's directory, which is replaced (only the files a
    demo writes are removed, `causalqwen.files.rundir`); any other directory, a training run's above all, is
    refused with a ``ValueError`` before anything is written. torch runs on ``threads`` intra-op threads (`DEMO_THREADS`
    by default), its setting restored at the end.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # no "Writing model shards" bars in the demo's output
    started = time.perf_counter()
    previous_demo = os.path.isfile(os.path.join(out_dir, MARKER))  # claim() checks that it is a demo's
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with RunDirectory.claim(out_dir, "demo", overwrite=previous_demo) as run_dir:
            return _run_demo(run_dir, steps, seed, progress, started)
    finally:
        torch.set_num_threads(previous_threads)


def _print_samples(model, tokenizer) -> None:
    """One generated sample of the first prompt per inference mode (seed 1), written as ``causalqwen generate`` writes
    it (the prompt as given, the generated numbers at its resolution)."""
    from ..generation import generate
    from .commands import written_texts

    print("\nOne sample per inference mode (seed 1):")
    batch = tokenizer(PROMPTS[:1], padding_side="left")
    for mode in MODES:
        out = generate(
            model,
            batch["input_ids"],
            batch["numeric_values"],
            batch["attention_mask"],
            mode=mode,
            max_new_tokens=12,
            generator=torch.Generator().manual_seed(1),
        )
        print(f"  {mode:<18} {written_texts(tokenizer, PROMPTS[:1], batch, out)[0]!r}")


def _print_comparison(sentences: int, before: dict, after: dict, before_templates: dict, after_templates: dict) -> None:
    """The held-out metrics at initialization and after training, then the regression MdAE by template."""
    print(f"\nHeld-out synthetic data ({sentences} sentences, standard inference):")
    print(f"  {'metric':<28}{'init':>12}{'trained':>12}")
    for key, label in TABLE_ROWS:
        print(f"  {label:<28}{before[key]:>12.4f}{after[key]:>12.4f}")
    print("\nRegression MdAE by template (first numbers of copy/count/double are free draws, not predictable):")
    for name in TEMPLATES:
        print(f"  {name:<28}{before_templates[name]:>12.3f}{after_templates[name]:>12.3f}")


def _run_demo(run_dir: RunDirectory, steps: int, seed: int, progress: bool, started: float) -> int:
    from .tiny import build_tiny_causal_lm

    out_dir = run_dir.path
    torch.manual_seed(seed)
    model, tokenizer, _ = build_tiny_causal_lm(seed=seed, **DEMO_OVERRIDES)
    train_set = TextDataset(synthetic_texts(4000, seed=seed), tokenizer, max_length=64)
    eval_batch = collate(
        TextDataset(synthetic_texts(400, seed=seed + 1), tokenizer, max_length=64).items, tokenizer.pad_token_id
    )
    config = TrainingConfig(
        steps=steps,
        batch_size=16,
        learning_rate=3e-3,
        weight_decay=0.01,
        warmup_steps=50,
        preset="all",
        eval_every=max(1, steps // 10),
        save_every=steps,
        log_every=10,
        seed=seed,
    )
    print(
        f"CausalQwen demo: tiny Qwen2 base (H = {model.config.hidden_size}, {model.config.num_hidden_layers} layers, "
        f"V = {model.config.vocab_size}), {len(train_set)} training sentences, preset 'all', {steps} steps, "
        f"batch {config.batch_size}; gate_alpha = {model.config.gate_alpha:g}, detach_gate = "
        f"{model.config.detach_gate}, regression_weight = {model.config.regression_weight:g}"
    )

    model.eval()
    before = with_log_prefixes(evaluate_batch(model, eval_batch, generator=torch.Generator().manual_seed(seed)))
    before_templates = _per_template_mdae(model, tokenizer, seed + 2)
    history = train(model, train_set, config, eval_batch=eval_batch, out_dir=run_dir, progress=progress)
    after = with_log_prefixes(evaluate_batch(model, eval_batch, generator=torch.Generator().manual_seed(seed)))
    after_templates = _per_template_mdae(model, tokenizer, seed + 2)

    _print_comparison(eval_batch["input_ids"].shape[0], before, after, before_templates, after_templates)
    _print_samples(model, tokenizer)

    [(_, model_dir)] = save_trained_model(out_dir, model, tokenizer)
    plots = _plots([{"step": 0, **before}] + history, out_dir)
    print(f"\nWrote {', '.join(plots)}, {os.path.join(out_dir, 'metrics.jsonl')} and the trained model to {model_dir}")

    learned_f1 = after["eval/num_f1"] >= 0.9
    learned_reg = after["eval/reg_mdae"] <= 0.5 * before["eval/reg_mdae"]
    print(
        f"\nnum_f1 = {after['eval/num_f1']:.3f} (goal >= 0.9): {'yes' if learned_f1 else 'NO'}; "
        f"reg_mdae = {after['eval/reg_mdae']:.3f} = {after['eval/reg_mdae'] / before['eval/reg_mdae']:.3f} x init "
        f"(goal <= 0.5): {'yes' if learned_reg else 'NO'}; wall time {time.perf_counter() - started:.0f} s"
    )
    if learned_f1 and learned_reg:
        print("OK: the demo model learned the synthetic task.")
        return 0
    print("FAILED: the demo model did not learn enough.")
    return 1
