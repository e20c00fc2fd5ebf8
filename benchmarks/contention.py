"""Shared cores: the demo's training steps and the fused head, alone and beside a competing busy loop.

A machine that is doing other work is the common case for a new user. Each workload runs in a fresh process,
once on an idle machine and once while ``busy`` processes spin on the CPU (one per core but one by default:
"a busy loop on the other core"), with 1 and with the default number of torch threads. The report gives the
wall time of each and the slowdown under load (goal: <= 2x for the demo's steps with the demo's own thread
count, `causalqwen.app.demo.DEMO_THREADS`).

Workloads: ``demo`` -- training steps of `causalqwen demo` (the tiny base, preset ``all``, batch 16, the fused
loss); ``head`` -- one forward + backward of the fused loss with ``reduction="sum"`` at the Qwen2.5-0.5B head
(H = 896, V = 151936), N = 256 positions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

import torch

from causalqwen.app.demo import DEMO_THREADS

from .common import machine, markdown_table, write_report

WORKLOADS = ("demo", "head")
GOAL_SLOWDOWN = 2.0


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def demo_steps(steps: int = 60) -> float:
    """Wall seconds of ``steps`` training steps of the demo set-up (after one untimed step)."""
    from causalqwen import train
    from causalqwen.app.demo import DEMO_OVERRIDES
    from causalqwen.app.tiny import build_tiny_causal_lm
    from causalqwen.files.data import TextDataset, synthetic_texts
    from causalqwen.training import TrainingConfig

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, **DEMO_OVERRIDES)
    data = TextDataset(synthetic_texts(2000, seed=0), tokenizer, max_length=64)
    config = TrainingConfig(steps=10, batch_size=16, preset="all", log_every=10**9, eval_every=10**9, save_every=10**9)
    train(model, data, config, progress=False)  # warm-up: compiles the tile for the shapes the steps meet
    config.steps = steps
    start = time.perf_counter()
    train(model, data, config, progress=False)
    return time.perf_counter() - start


def head_step(n: int = 256, hidden: int = 896, vocab: int = 151936, repeats: int = 2) -> float:
    """Median wall seconds of one forward + backward of the fused loss (``sum``) at the Qwen2.5-0.5B head."""
    from .head import make_inputs, variant_run

    run = variant_run("fused_sum", make_inputs(n, hidden, vocab))
    run()  # warm-up (compiles the tile)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def child(workload: str, threads: int, busy: int) -> float:
    """Time ``workload`` in this process with ``threads`` torch threads while ``busy`` spinning processes run."""
    torch.set_num_threads(threads)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    try:
        return demo_steps() if workload == "demo" else head_step()
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()


def run_child(workload: str, threads: int, busy: int) -> float:
    command = [
        sys.executable,
        "-m",
        "benchmarks",
        "contention",
        "--child",
        workload,
        "--threads",
        str(threads),
        "--busy",
        str(busy),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds"]


def run(workloads=WORKLOADS, busy: int | None = None) -> tuple[str, bool]:
    cores = os.cpu_count() or 1
    busy = max(1, cores - 1) if busy is None else busy
    rows, ok = [], True
    for workload in workloads:
        for threads in sorted({1, DEMO_THREADS, torch.get_num_threads()}):
            alone = run_child(workload, threads, 0)
            loaded = run_child(workload, threads, busy)
            slowdown = loaded / alone
            goal = f"<= {GOAL_SLOWDOWN}x" if workload == "demo" and threads == DEMO_THREADS else ""
            met = ("yes" if slowdown <= GOAL_SLOWDOWN else "no") if goal else ""
            ok &= met != "no"
            rows.append([workload, threads, f"{alone:.2f}", f"{loaded:.2f}", f"{slowdown:.2f}", goal, met])
    report = [
        f"### Shared cores: alone and beside {busy} busy loop(s)",
        "",
        f"Each cell is a fresh process; {machine()}. `demo`: 60 training steps of the demo set-up; `head`: one "
        "forward + backward of the fused loss at H = 896, V = 151936, N = 256 (median of 2).",
        "",
        markdown_table(
            ["workload", "torch threads", "seconds alone", "seconds under load", "slowdown", "goal", "met"], rows
        ),
    ]
    return "\n".join(report) + "\n", ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks contention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--busy", type=int, default=None, help="busy processes (default: cores - 1)")
    parser.add_argument("--out", help="also write the markdown report to this file")
    parser.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps({"seconds": child(args.child, args.threads, args.busy or 0)}))
        return 0
    report, ok = run(tuple(args.workload), args.busy)
    print(report)
    write_report(args.out, report)
    return 0 if ok else 1
