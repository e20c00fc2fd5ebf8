"""Benchmark (b): one full fine-tuning step, CausalQwen against plain ``Qwen2ForCausalLM``.

Both models have the Qwen2.5-0.5B shape (24 layers, H = 896, V = 151936) with random float32 weights.
A step is ``zero_grad``, forward with labels (CausalQwen: the fused OvR + gated regression loss;
Qwen2: its cross-entropy), backward, and ``AdamW.step`` over all parameters, on one sequence of
``--tokens`` tokens (5% of them ``<NUM>`` with values, for CausalQwen).

Two models of this size with their AdamW state do not fit together in 24 GiB, so each measurement
runs in a process of its own, alternating Qwen2 / CausalQwen ``--rounds`` times; each process builds
its model, takes one untimed warm-up step (which also creates the optimizer state), then times
``--steps`` steps. Peak memory is the process's peak resident set over the timed steps (``VmHWM``,
reset after the warm-up).

Goals (issue 5): step time <= 1.35x Qwen2's (the FLOP floor is about 1.28x: the OvR head needs two
matrix products per direction where Qwen2's needs one); peak memory <= 1.05x (Qwen2's peak + 16 bytes
x the parameters CausalQwen has beyond Qwen2: its own W_cls copy, the abduction network and the
small heads, each with weight, gradient and two AdamW moments).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from causalqwen import CausalQwenConfig, CausalQwenForCausalLM

from .common import SHAPES, machine, markdown_table, status_kib

MODELS = ("qwen2", "causalqwen")
GOAL_TIME_RATIO = 1.35
GOAL_MEMORY_RATIO = 1.05


def build(model: str, shape: str, seed: int = 0):
    """A randomly initialised model of the named shape, in training mode."""
    settings = dict(SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(seed)
    if model == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**settings)).train()
    if model == "causalqwen":
        settings["tie_word_embeddings"] = False  # W_cls is its own parameter (decision D7)
        return CausalQwenForCausalLM(CausalQwenConfig(**settings, num_token_id=settings["vocab_size"] - 1)).train()
    raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")


def make_batch(model: str, vocab: int, tokens: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    num_id = vocab - 1
    ids = torch.randint(0, num_id, (1, tokens), generator=g)
    is_num = torch.rand(1, tokens, generator=g) < 0.05
    ids[is_num] = num_id
    batch = {"input_ids": ids, "labels": ids.clone()}
    if model == "causalqwen":
        batch["numeric_values"] = torch.where(is_num, torch.randn(1, tokens, generator=g) * 100, 0.0)
    return batch


def child(model_name: str, shape: str, tokens: int, steps: int) -> dict:
    """Build, warm up, time ``steps`` steps; measured in this process."""
    model = build(model_name, shape)
    batch = make_batch(model_name, model.config.vocab_size, tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        optimizer.step()

    step()  # warm-up: also allocates the AdamW moments
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"seconds": times, "peak_bytes": status_kib("VmHWM") * 1024,
            "parameters": sum(p.numel() for p in model.parameters())}


def run_child(model: str, shape: str, tokens: int, steps: int) -> dict:
    command = [sys.executable, "-m", "benchmarks", "training_step", "--child", model, "--shape", shape,
               "--tokens", str(tokens), "--steps", str(steps)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(shape: str = "qwen2.5-0.5b", tokens: int = 1024, steps: int = 2, rounds: int = 2,
        own_process: bool = True) -> tuple[str, bool]:
    """Alternate the two models' processes; return the markdown report and whether both goals were met.
    ``own_process=False`` runs the measurements in this process (quick, for tests; memory not comparable)."""
    results: dict[str, list[dict]] = {name: [] for name in MODELS}
    for _ in range(rounds):
        for name in MODELS:
            results[name].append(run_child(name, shape, tokens, steps) if own_process else child(name, shape, tokens, steps))
    seconds = {name: statistics.median(t for r in results[name] for t in r["seconds"]) for name in MODELS}
    peak = {name: max(r["peak_bytes"] for r in results[name]) for name in MODELS}
    params = {name: results[name][0]["parameters"] for name in MODELS}
    extra = params["causalqwen"] - params["qwen2"]
    allowance = peak["qwen2"] + 16 * extra
    time_ratio = seconds["causalqwen"] / seconds["qwen2"]
    memory_ratio = peak["causalqwen"] / allowance
    time_ok, memory_ok = time_ratio <= GOAL_TIME_RATIO, memory_ratio <= GOAL_MEMORY_RATIO
    gib = 2**30
    rows = [
        ["Qwen2ForCausalLM", f"{params['qwen2'] / 1e6:.1f}", f"{seconds['qwen2']:.2f}", "1.00",
         f"{peak['qwen2'] / gib:.2f}", "", ""],
        ["CausalQwenForCausalLM", f"{params['causalqwen'] / 1e6:.1f}", f"{seconds['causalqwen']:.2f}",
         f"{time_ratio:.2f} (goal <= {GOAL_TIME_RATIO}: {'yes' if time_ok else 'no'})",
         f"{peak['causalqwen'] / gib:.2f}", f"{allowance / gib:.2f}",
         f"{memory_ratio:.3f} (goal <= {GOAL_MEMORY_RATIO}: {'yes' if memory_ok else 'no'})"],
    ]
    report = [
        f"### One fine-tuning step (shape `{shape}`, 1 x {tokens} tokens, AdamW on all parameters)",
        "",
        f"Random float32 weights; median of {rounds} processes x {steps} timed steps per model, alternating; "
        f"{machine()}. CausalQwen has {extra / 1e6:.1f} M parameters more than Qwen2 (its own W_cls "
        f"copy, the abduction network and the small heads); the memory allowance is Qwen2's peak plus "
        f"16 B x {extra / 1e6:.1f} M ({16 * extra / gib:.2f} GiB).",
        "",
        markdown_table(["model", "parameters (M)", "seconds / step", "time vs Qwen2", "peak RSS GiB",
                        "allowance GiB", "peak vs allowance"], rows),
    ]
    return "\n".join(report) + "\n", time_ok and memory_ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks training_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per model, alternating")
    parser.add_argument("--out", help="also write the markdown report to this file")
    parser.add_argument("--child", choices=MODELS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.shape, args.tokens, args.steps)))
        return 0
    report, ok = run(args.shape, args.tokens, args.steps, args.rounds)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    return 0 if ok else 1
