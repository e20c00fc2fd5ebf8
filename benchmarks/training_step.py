"""Benchmark (b): one full fine-tuning step, CausalQwen against plain ``Qwen2ForCausalLM``.

Both models have the Qwen2.5-0.5B shape (24 layers, H = 896, V = 151936) with random float32 weights.
A step is ``zero_grad``, forward with labels (CausalQwen: the fused OvR + gated regression loss;
Qwen2: its cross-entropy), backward, and ``AdamW.step`` over all parameters, on one sequence of
``--tokens`` tokens (5% of them ``<NUM>`` with values, for CausalQwen).

Two models of this size with their AdamW state do not fit together in 24 GiB, so each measurement
runs in a process of its own, alternating Qwen2 / CausalQwen ``--rounds`` times; each process builds
its model, takes one untimed warm-up step (which also creates the optimizer state), then times
``--steps`` steps. Peak memory is the process's peak over the timed steps: on the CPU its resident set
(``VmHWM``, reset after the warm-up), on CUDA ``torch.cuda.max_memory_allocated``.

``--device cuda`` runs on a GPU (each step synchronised before the clock is read); ``--dtype bfloat16``
runs forward and loss under ``torch.autocast`` in bfloat16 with float32 weights and optimizer, as
mixed-precision fine-tuning does; ``--batch`` sets the rows (the GPU setting: ``--batch 8
--tokens 2048``). Where ``liger-kernel`` is installed, ``--liger`` adds Qwen2 with Liger's fused linear
cross-entropy (its other kernels off, so that only the head and loss differ), the memory-saving
alternative a practitioner would pick for a large vocabulary.

Goals: step time <= 1.35x Qwen2's on the CPU (the FLOP floor is about 1.28x: the OvR head
needs two matrix products per direction where Qwen2's needs one) and <= 1.3x on CUDA; peak
memory <= 1.05x an allowance of Qwen2's peak + 16 bytes x the parameters CausalQwen has beyond Qwen2
(its own W_cls copy, the abduction network and the small heads, each with weight, gradient and two
AdamW moments).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from causalqwen import CausalQwenConfig, CausalQwenForCausalLM

from .common import SHAPES, machine, markdown_table, status_kib, write_report

MODELS = ("qwen2", "causalqwen")
LIGER = "qwen2+liger"
GOAL_TIME_RATIO = {"cpu": 1.35, "cuda": 1.3}
GOAL_MEMORY_RATIO = 1.05
DTYPES = ("float32", "bfloat16")


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def build(model: str, shape: str, seed: int = 0):
    """A randomly initialised model of the named shape, in training mode."""
    settings = dict(SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(seed)
    if model == LIGER:  # patches Qwen2ForCausalLM.forward in this (child) process only
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2

        apply_liger_kernel_to_qwen2(
            rope=False, rms_norm=False, swiglu=False, cross_entropy=False, fused_linear_cross_entropy=True
        )
    if model in ("qwen2", LIGER):
        return Qwen2ForCausalLM(Qwen2Config(**settings)).train()
    if model == "causalqwen":
        settings["tie_word_embeddings"] = False  # W_cls is its own parameter (decision D7)
        return CausalQwenForCausalLM(CausalQwenConfig(**settings, num_token_id=settings["vocab_size"] - 1)).train()
    raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS + (LIGER,))}")


def make_batch(model: str, vocab: int, tokens: int, seed: int = 0, rows: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    num_id = vocab - 1
    ids = torch.randint(0, num_id, (rows, tokens), generator=g)
    is_num = torch.rand(rows, tokens, generator=g) < 0.05
    ids[is_num] = num_id
    batch = {"input_ids": ids, "labels": ids.clone()}
    if model == "causalqwen":
        batch["numeric_values"] = torch.where(is_num, torch.randn(rows, tokens, generator=g) * 100, 0.0)
    return batch


class Setting(NamedTuple):
    """What one measurement runs: the shape, the batch, the device and the compute dtype."""

    shape: str = "qwen2.5-0.5b"
    tokens: int = 1024
    rows: int = 1
    device: str = "cpu"
    dtype: str = "float32"

    def arguments(self) -> list[str]:
        return [
            "--shape",
            self.shape,
            "--tokens",
            str(self.tokens),
            "--batch",
            str(self.rows),
            "--device",
            self.device,
            "--dtype",
            self.dtype,
        ]


def child(model_name: str, setting: Setting, steps: int) -> dict:
    """Build, warm up, time ``steps`` steps; measured in this process."""
    device = torch.device(setting.device)
    model = build(model_name, setting.shape).to(device)
    batch = {
        key: value.to(device)
        for key, value in make_batch(model_name, model.config.vocab_size, setting.tokens, rows=setting.rows).items()
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if setting.dtype == "bfloat16" else contextlib.nullcontext()
    )
    cuda = device.type == "cuda"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize(device)

    step()  # warm-up: also allocates the AdamW moments
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if cuda else status_kib("VmHWM") * 1024
    return {"seconds": times, "peak_bytes": peak, "parameters": sum(p.numel() for p in model.parameters())}


def run_child(model: str, setting: Setting, steps: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks",
        "training_step",
        "--child",
        model,
        *setting.arguments(),
        "--steps",
        str(steps),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the {model} measurement failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measurements(models: tuple[str, ...], setting: Setting, steps: int, rounds: int, own_process: bool) -> dict:
    """``{model: [one process's measurement, ...]}``: ``rounds`` processes per model, the models alternating."""
    results: dict[str, list[dict]] = {name: [] for name in models}
    for _ in range(rounds):
        for name in models:
            results[name].append(run_child(name, setting, steps) if own_process else child(name, setting, steps))
    return results


def run(
    setting: Setting = Setting(), steps: int = 2, rounds: int = 2, own_process: bool = True, liger: bool = False
) -> tuple[str, bool]:
    """Alternate the models' processes; return the markdown report and whether both goals were met.
    ``own_process=False`` runs the measurements in this process (quick, for tests; memory not comparable).
    ``liger`` adds Qwen2 with Liger's fused linear cross-entropy where ``liger-kernel`` is installed."""
    models = MODELS + ((LIGER,) if liger and liger_available() else ())
    results = measurements(models, setting, steps, rounds, own_process)
    seconds = {name: statistics.median(t for r in results[name] for t in r["seconds"]) for name in models}
    peak = {name: max(r["peak_bytes"] for r in results[name]) for name in models}
    params = {name: results[name][0]["parameters"] for name in models}
    extra = params["causalqwen"] - params["qwen2"]
    allowance = peak["qwen2"] + 16 * extra
    time_ratio = seconds["causalqwen"] / seconds["qwen2"]
    memory_ratio = peak["causalqwen"] / allowance
    goal_time = GOAL_TIME_RATIO["cuda" if setting.device.startswith("cuda") else "cpu"]
    time_ok, memory_ok = time_ratio <= goal_time, memory_ratio <= GOAL_MEMORY_RATIO
    gib = 2**30
    names = {
        "qwen2": "Qwen2ForCausalLM",
        LIGER: "Qwen2ForCausalLM + Liger fused linear CE",
        "causalqwen": "CausalQwenForCausalLM",
    }
    rows = []
    for name in models:
        row = [
            names[name],
            f"{params[name] / 1e6:.1f}",
            f"{seconds[name]:.3f}",
            f"{seconds[name] / seconds['qwen2']:.2f}",
            f"{peak[name] / gib:.2f}",
            "",
            "",
        ]
        if LIGER in models:
            row.insert(4, f"{seconds[name] / seconds[LIGER]:.2f}")
        if name == "causalqwen":
            row[3] += f" (goal <= {goal_time}: {'yes' if time_ok else 'no'})"
            row[-2:] = [
                f"{allowance / gib:.2f}",
                f"{memory_ratio:.3f} (goal <= {GOAL_MEMORY_RATIO}: {'yes' if memory_ok else 'no'})",
            ]
        rows.append(row)
    header = [
        "model",
        "parameters (M)",
        "seconds / step",
        "time vs Qwen2",
        "peak GiB",
        "allowance GiB",
        "peak vs allowance",
    ]
    if LIGER in models:
        header.insert(4, "time vs Qwen2 + Liger")
    peak_kind = (
        "peak allocated (`torch.cuda.max_memory_allocated`)"
        if setting.device.startswith("cuda")
        else "peak resident set (`VmHWM`)"
    )
    weights = "float32 weights, bfloat16 autocast" if setting.dtype == "bfloat16" else "float32 weights and compute"
    liger_note = ""
    if liger and not liger_available():
        liger_note = " Qwen2 + Liger was asked for but `liger-kernel` is not installed here."
    device_name = torch.cuda.get_device_name(setting.device) if setting.device.startswith("cuda") else "CPU"
    report = [
        f"### One fine-tuning step (shape `{setting.shape}`, {setting.rows} x {setting.tokens} tokens, "
        f"AdamW on all parameters, {device_name})",
        "",
        f"Random weights, {weights}; median of {rounds} processes x {steps} timed steps per model, alternating; "
        f"{machine()}. Memory is the {peak_kind}. CausalQwen has {extra / 1e6:.1f} M parameters more than Qwen2 "
        f"(its own W_cls copy, the abduction network and the small heads); the memory allowance is Qwen2's peak "
        f"plus 16 B x {extra / 1e6:.1f} M ({16 * extra / gib:.2f} GiB).{liger_note}",
        "",
        markdown_table(header, rows),
    ]
    return "\n".join(report) + "\n", time_ok and memory_ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks training_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per row")
    parser.add_argument("--batch", type=int, default=1, help="rows per step")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda / cuda:N")
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="float32, or bfloat16 autocast with float32 weights"
    )
    parser.add_argument(
        "--liger",
        action="store_true",
        help="also time Qwen2 with Liger's fused linear cross-entropy (needs liger-kernel)",
    )
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per model, alternating")
    parser.add_argument("--out", help="also write the markdown report to this file")
    parser.add_argument("--child", choices=MODELS + (LIGER,), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is available here")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    setting = Setting(args.shape, args.tokens, args.batch, args.device, args.dtype)
    if args.child:
        print(json.dumps(child(args.child, setting, args.steps)))
        return 0
    report, ok = run(setting, args.steps, args.rounds, liger=args.liger)
    print(report)
    write_report(args.out, report)
    return 0 if ok else 1
