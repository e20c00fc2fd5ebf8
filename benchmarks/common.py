"""Shared pieces of the benchmarks: model shapes, interleaved timing, markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

# Shapes of the base models the benchmarks build with random weights (no download).
SHAPES = {
    # the embedded tiny base: per-step Python overhead dominates
    "tiny": dict(
        vocab_size=704,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    # Qwen2.5-0.5B: 24 layers, H = 896, V = 151936; memory bandwidth dominates decoding
    "qwen2.5-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
}


def build_qwen(shape: str, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised float32 ``Qwen2ForCausalLM`` of the named shape, in eval mode."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    config = Qwen2Config(
        **SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=4096, eos_token_id=0, pad_token_id=0
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).eval()


def interleaved_medians(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time (s) of each variant, running them in turn ``repeats`` times (A B C A B C ...),
    after one untimed warm-up each, so that drift in machine speed hits every variant alike."""
    for run in variants.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def machine() -> str:
    return (
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs visible"
    )


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(path: str | None, report: str) -> None:
    """Write a benchmark's markdown report to ``path`` (``--out``), ending in one newline; nothing when None."""
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(report.rstrip("\n") + "\n")


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_extra_memory(run: Callable[[], object], device: str = "cpu") -> int:
    """Bytes by which one call of ``run`` raises the peak memory above what is held before it.

    CUDA: ``max_memory_allocated``. CPU (Linux): the peak resident set ``VmHWM``, reset by writing 5 to
    ``/proc/self/clear_refs``, minus ``VmRSS`` before the call. Use a fresh process per measurement:
    memory freed earlier but kept by the allocator would otherwise be reused and not counted.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
    if status_kib("VmHWM") > before + 1024:
        raise RuntimeError("could not reset the peak resident set (/proc/self/clear_refs)")
    run()
    return (status_kib("VmHWM") - before) * 1024
