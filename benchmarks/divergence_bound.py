"""What the bound on forgetting costs: one training step with and without ``max_u_divergence``, per preset.

The step is the training loop's (`causalqwen.training.loss_and_gradients`, then AdamW and the bound's dual step).
The bound adds, per preset: ``causal`` / ``abduction`` -- the frozen copy of the starting abduction network on
the captured features (two ``[H, H]`` products per position) and the KL; ``all`` -- a forward pass of the frozen
starting model; ``lora`` -- a forward pass of the same model with its adapters disabled. After the step, the
bound's projection measures the step's batch again: one more pass of the abduction network (``abduction``) or of the
model (the others), and about 11 more on a step that leaves the bound (the learning rate here is tiny: none do).
Times are medians of interleaved repeats (`benchmarks.common.interleaved_medians`), with and without the bound side
by side.
"""

from __future__ import annotations

import argparse
import copy

import torch

from causalqwen import CausalQwenForCausalLM
from causalqwen.divergence import DivergenceBound
from causalqwen.integrations.lora import add_lora
from causalqwen.training import TrainingConfig, loss_and_gradients, parameter_groups, set_trainable

from .common import (
    SHAPES,
    build_qwen,
    interleaved_medians,
    machine,
    markdown_table,
    write_report,
)

PRESETS = ("causal", "abduction", "all", "lora")


def _batch(vocab: int, tokens: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab - 1, (1, tokens), generator=generator)
    return {
        "input_ids": input_ids,
        "numeric_values": torch.zeros(1, tokens),
        "attention_mask": torch.ones(1, tokens, dtype=torch.long),
        "labels": input_ids.clone(),
    }


def _steppers(model, preset: str, batch: dict):
    """Two closures, one optimisation step of the training loop on ``batch`` without and with the bound. They share
    the model and the optimizer (the learning rate is tiny, so the parameters barely move): one copy in memory."""
    if preset == "lora":
        model = add_lora(model, rank=8, alpha=16)
    set_trainable(model, preset)
    model.train()
    config = TrainingConfig(preset=preset)
    bound = DivergenceBound(model, 0.1, preset)
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=1e-9)

    def step(with_bound: bool):
        loss_and_gradients(model, model, batch, config, bound=bound if with_bound else None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if with_bound:
            bound.step()

    return (lambda: step(False)), (lambda: step(True))


def run(shape: str = "qwen2.5-0.5b", tokens: int = 256, repeats: int = 3, presets=PRESETS) -> str:
    base = build_qwen(shape)
    vocab = SHAPES[shape]["vocab_size"]
    torch.manual_seed(0)
    template = CausalQwenForCausalLM.from_qwen(base, num_token_id=vocab - 1)
    del base
    batch = _batch(vocab, tokens)
    rows = []
    for preset in presets:
        off, on = _steppers(copy.deepcopy(template), preset, batch)
        seconds = interleaved_medians({"off": off, "on": on}, repeats)
        del off, on
        rows.append([preset, f"{seconds['off']:.3f}", f"{seconds['on']:.3f}", f"{seconds['on'] / seconds['off']:.2f}"])
    return (
        "\n".join(
            [
                f"### The bound on forgetting: one training step (shape `{shape}`, 1 x {tokens} tokens)",
                "",
                f"Median of {repeats} interleaved steps each, after a warm-up; random float32 weights; {machine()}.",
                "",
                markdown_table(["preset", "s / step without the bound", "s / step with the bound", "ratio"], rows),
            ]
        )
        + "\n"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks divergence_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args(argv)
    report = run(args.shape, args.tokens, args.repeats)
    print(report)
    write_report(args.out, report)
    return 0
