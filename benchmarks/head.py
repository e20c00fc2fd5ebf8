"""Benchmark (a): the OvR head + loss, forward and backward, at the Qwen2.5-0.5B head (H = 896, V = 151936).

Variants, all on the same inputs (N positions, every one scored):

* ``floor``: the six [N, H] x [H, V]-sized matrix products any implementation needs (loc_S and scale_S
  forward; d loc_U, d scale_U, d W through W and through |W| backward), on ready-made operands and into
  ready-made outputs, except the fresh [V, H] gradient of W every variant returns (an earlier floor
  allocated every output per call; on this machine that made the floor about 1.47x slower than the products
  and every ratio below look better than it was);
* ``literal``: ``ActionNetwork.forward`` then ``ovr_classification_loss`` (the readable reference);
* ``fused``: ``fused_ovr_classification_loss(reduction="none")``: saves its inputs only and recomputes
  every tile in backward (eight products);
* ``fused_sum``: ``reduction="sum"``, the training path of ``forward(labels=...)``: gradients formed
  during the forward pass (six products);
* ``fused_eager``, ``fused_sum_eager``: the same with ``CAUSALQWEN_COMPILE=0``, each tile's elementwise math
  as separate eager kernels (`causalqwen.kernels.tiles.compiled`; the compiled tile is the default).

Times are medians of interleaved repeats in one process. Extra memory is measured for each variant in
a process of its own: the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) during
one forward + backward, minus the resident set once the inputs exist. It includes the [V, H]
gradient of W, which every variant must produce.

Goals: fused (compiled) time <= 1.3x the floor for ``none`` and <= 1.15x for ``sum`` (tightened from
<= 1.5x) and <= the literal path; fused extra memory <= 0.35x the literal path's, and flat in N (N = 1024 vs
512: <= 1.25x).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys

import torch

from causalqwen.action import ActionNetwork
from causalqwen.kernels.fused import fused_ovr_classification_loss
from causalqwen.kernels.tiles import COMPILE_ENV
from causalqwen.losses import ovr_classification_loss

from .common import (
    interleaved_medians,
    machine,
    markdown_table,
    peak_extra_memory,
    write_report,
)

VARIANTS = ("floor", "literal", "fused", "fused_sum", "fused_eager", "fused_sum_eager")
GOAL_FLOOR_RATIO = {"fused": 1.3, "fused_sum": 1.15}  # the compiled tiles; the eager ones are shown beside them
GOAL_MEMORY_RATIO = 0.35
GOAL_FLAT_RATIO = 1.25
THRESHOLD = 100.0


def make_inputs(n: int, hidden: int, vocab: int, seed: int = 0) -> dict:
    """Inputs as at initialization: loc_U ~ N(0, 1), scale_U = 10, W ~ N(0, 0.02^2), |b_noise| = 0.1, C = 100."""
    g = torch.Generator().manual_seed(seed)
    action = ActionNetwork(hidden, vocab, noise_init=0.1)
    with torch.no_grad():
        action.classification_head.weight.normal_(0.0, 0.02, generator=g)
    return dict(
        action=action,
        loc_U=torch.randn(n, hidden, generator=g).requires_grad_(),
        scale_U=torch.full((n, hidden), 10.0).requires_grad_(),
        labels=torch.randint(0, vocab, (n,), generator=g),
    )


def variant_run(name: str, inputs: dict, chunk_size: int | None = None, vocab_chunk_size: int | None = None):
    """A function doing one forward + backward of the named variant (gradients reset first)."""
    action, loc_U, scale_U, labels = inputs["action"], inputs["loc_U"], inputs["scale_U"], inputs["labels"]
    head = action.classification_head
    leaves = [loc_U, scale_U, head.weight, head.bias, action.b_noise]

    if name == "floor":
        x = loc_U.detach()
        weight, abs_weight = head.weight.detach(), head.weight.detach().abs()
        grad = torch.randn(x.shape[0], weight.shape[0])  # stands in for d loss / d loc_S and d scale_S
        # Written into outputs that exist already, except the one [V, C] gradient of W that every variant returns
        # fresh: fresh [N, V] results would add page faults worth about half the products' time on the CPU, and
        # the floor would no longer be one.
        loc_S, scale_S = torch.empty(x.shape[0], weight.shape[0]), torch.empty(x.shape[0], weight.shape[0])
        d_loc, d_scale, d_abs_weight = torch.empty_like(x), torch.empty_like(x), torch.empty_like(weight)

        def run():
            torch.mm(x, weight.t(), out=loc_S), torch.mm(x, abs_weight.t(), out=scale_S)  # forward
            torch.mm(grad, weight, out=d_loc), torch.mm(grad, abs_weight, out=d_scale)  # backward: d loc_U, d scale_U
            torch.mm(grad.t(), x), torch.mm(grad.t(), x, out=d_abs_weight)  # d W through W (fresh) and |W|

        return run

    def run():
        for leaf in leaves:
            leaf.grad = None
        if name.endswith("_eager"):
            with _compile_off():
                return variant_run(name.removesuffix("_eager"), inputs, chunk_size, vocab_chunk_size)()
        if name == "literal":
            decision = action(loc_U, scale_U)
            loss = ovr_classification_loss(decision.loc_S, decision.scale_S, labels, THRESHOLD).sum()
        elif name in ("fused", "fused_sum"):
            loss = fused_ovr_classification_loss(
                loc_U,
                scale_U,
                head.weight,
                head.bias,
                action.noise_scale,
                THRESHOLD,
                labels=labels,
                chunk_size=chunk_size,
                vocab_chunk_size=vocab_chunk_size,
                reduction="none" if name == "fused" else "sum",
            ).sum()
        else:
            raise ValueError(f"unknown variant {name!r}; choose one of {', '.join(VARIANTS)}")
        loss.backward()

    return run


@contextlib.contextmanager
def _compile_off():
    previous = os.environ.get(COMPILE_ENV)
    os.environ[COMPILE_ENV] = "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[COMPILE_ENV]
        else:
            os.environ[COMPILE_ENV] = previous


def child_memory(variant: str, n: int, hidden: int, vocab: int) -> int:
    """Extra peak memory (bytes) of one forward + backward, measured in this process."""
    run = variant_run(variant, make_inputs(n, hidden, vocab))
    return peak_extra_memory(run)


def memory_in_own_process(variant: str, n: int, hidden: int, vocab: int) -> int:
    command = [
        sys.executable,
        "-m",
        "benchmarks",
        "head",
        "--child",
        variant,
        "--n",
        str(n),
        "--hidden",
        str(hidden),
        "--vocab",
        str(vocab),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["extra_bytes"]


def run(
    ns=(512, 1024), hidden: int = 896, vocab: int = 151936, repeats: int = 3, own_process: bool = True
) -> tuple[str, bool]:
    """Measure every variant at every N; return the markdown report and whether every goal was met.
    ``own_process=False`` measures memory in this process (quick, for tests; not comparable)."""
    rows, ok = [], True
    memory: dict[tuple[str, int], int] = {}
    for n in ns:
        inputs = make_inputs(n, hidden, vocab)
        times = interleaved_medians({name: variant_run(name, inputs) for name in VARIANTS}, repeats)
        del inputs
        for name in VARIANTS:
            measure = memory_in_own_process if own_process else child_memory
            memory[name, n] = measure(name, n, hidden, vocab) if name != "floor" else 0
        for name in VARIANTS:
            ratio = times[name] / times["floor"]
            goals, met = "", ""
            if name in GOAL_FLOOR_RATIO:
                mem_ratio = memory[name, n] / max(memory["literal", n], 1)
                goal = GOAL_FLOOR_RATIO[name]
                checks = [ratio <= goal, times[name] <= times["literal"], mem_ratio <= GOAL_MEMORY_RATIO]
                goals = f"<= {goal}x floor, <= literal; memory <= {GOAL_MEMORY_RATIO}x literal ({mem_ratio:.2f})"
                met = "yes" if all(checks) else "no"
                ok &= all(checks)
            mem = f"{memory[name, n] / 2**30:.2f}" if name != "floor" else "—"
            rows.append([n, name, f"{times[name]:.2f}", f"{ratio:.2f}", mem, goals, met])
    flat_rows = []
    if len(ns) >= 2:
        small, large = ns[0], ns[-1]
        for name in ("literal", "fused", "fused_sum"):
            ratio = memory[name, large] / max(memory[name, small], 1)
            goal = f"<= {GOAL_FLAT_RATIO}" if name.startswith("fused") else ""
            met = ("yes" if ratio <= GOAL_FLAT_RATIO else "no") if goal else ""
            ok &= met != "no"
            flat_rows.append(
                [
                    name,
                    f"{memory[name, small] / 2**30:.2f}",
                    f"{memory[name, large] / 2**30:.2f}",
                    f"{ratio:.2f}",
                    goal,
                    met,
                ]
            )
    report = [
        f"### OvR head + loss, forward + backward (H = {hidden}, V = {vocab})",
        "",
        f"float32, every position scored; median of {repeats} interleaved repeats; {machine()}.",
        "Extra memory: peak resident set of one forward + backward in a fresh process, minus the inputs "
        f"(includes the {vocab * hidden * 4 / 2**30:.2f} GiB gradient of W).",
        "",
        markdown_table(["N", "variant", "seconds", "vs floor", "extra GiB", "goal", "met"], rows),
    ]
    if flat_rows:
        report += [
            "",
            f"Extra memory against N (N = {ns[-1]} vs {ns[0]}):",
            "",
            markdown_table(
                ["variant", f"GiB at N = {ns[0]}", f"GiB at N = {ns[-1]}", "ratio", "goal", "met"], flat_rows
            ),
        ]
    return "\n".join(report) + "\n", ok


def tune(n: int, hidden: int, vocab: int, repeats: int, grid) -> str:
    """Time both fused variants for each (chunk_size, vocab_chunk_size): how the defaults were chosen."""
    inputs = make_inputs(n, hidden, vocab)
    variants = {"floor": variant_run("floor", inputs)}
    for rows, cols in grid:
        for name in ("fused", "fused_sum"):
            variants[f"{name} {rows}x{cols}"] = variant_run(name, inputs, rows, cols)
    times = interleaved_medians(variants, repeats)
    table = [[key, f"{value:.2f}", f"{value / times['floor']:.2f}"] for key, value in times.items()]
    return (
        f"### Tile sizes at N = {n}\n\n"
        + markdown_table(["variant rows x classes", "seconds", "vs floor"], table)
        + "\n"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks head", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 1024], help="numbers of positions")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the markdown report to this file")
    parser.add_argument("--tune", action="store_true", help="time tile sizes for the fused variants instead")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)  # memory of one variant, in this process
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps({"extra_bytes": child_memory(args.child, args.n[0], args.hidden, args.vocab)}))
        return 0
    if args.tune:
        grid = [(128, 1024), (256, 1024), (512, 1024), (512, 2048), (1024, 1024), (256, 4096)]
        report, ok = tune(args.n[0], args.hidden, args.vocab, args.repeats, grid), True
    else:
        report, ok = run(tuple(args.n), args.hidden, args.vocab, args.repeats)
    print(report)
    write_report(args.out, report)
    return 0 if ok else 1
