"""Benchmark (c): generation speed of CausalQwen against ``Qwen2ForCausalLM.generate`` on the same base.

Goals, printed with the measured ratios:

1. per-token decode time is flat in context length: context 512 vs 32, ratio <= 1.5 (the KV cache);
2. decode tokens/s >= 0.75x those of ``Qwen2ForCausalLM.generate(do_sample=False)`` in every mode;
3. ``traditional`` (softmax sampling, which needs the class locations alone) >= 0.95x.

Decode time per token is measured by differencing, ``(t(1 + n tokens) - t(1 token)) / n``, which
removes the prefill and the one-off set-up (for CausalQwen, forming |W_cls| once per call). Every
timing is the median of interleaved repeats. CausalQwen's standard mode needs two [V, C] matrix-vector
products per step (loc_S with W_cls and scale_S with |W_cls|) where Qwen needs one, so at the
Qwen2.5-0.5B shape, where decoding is bound by reading the weights, its floor is roughly
(weights + |W_cls|) / weights of Qwen's time per token. ``traditional`` needs loc_S alone: one [V, C]
product, as Qwen's lm_head, so its floor is Qwen's own speed. It samples (softmax, multinomial) where
the Qwen2 row decodes greedily, the cheaper of the two.
"""

from __future__ import annotations

import argparse

import torch

from causalqwen import CausalQwenForCausalLM, generate
from causalqwen.inference import MODES

from .common import (
    build_qwen,
    interleaved_medians,
    machine,
    markdown_table,
    write_report,
)

GOAL_CONTEXT_RATIO = 1.5
GOAL_SPEED_RATIO = 0.75
GOAL_TRADITIONAL_RATIO = 0.95


def _qwen_run(qwen, ids, new_tokens):
    return lambda: qwen.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens
    )


def _ours_run(model, ids, new_tokens, mode, use_cache=True):
    def run():
        generate(
            model,
            ids,
            mode=mode,
            max_new_tokens=new_tokens,
            eos_token_id=[],
            use_cache=use_cache,
            generator=torch.Generator().manual_seed(0),
        )

    return run


def per_token_seconds(variants_for, new_tokens: int, repeats: int) -> dict[str, float]:
    """Decode seconds per token of each variant, ``variants_for(n)`` giving the runs that make n tokens."""
    one = interleaved_medians(variants_for(1), repeats)
    many = interleaved_medians(variants_for(1 + new_tokens), repeats)
    return {name: (many[name] - one[name]) / new_tokens for name in one}


def _context_table(context: dict[str, float], short: int, long: int) -> tuple[str, bool]:
    """The table of per-token decode time against context length, and whether its goal was met."""
    ours_ratio = context[f"context {long}"] / context[f"context {short}"]
    qwen_ratio = context[f"Qwen2 context {long}"] / context[f"Qwen2 context {short}"]
    ok = ours_ratio <= GOAL_CONTEXT_RATIO
    table = markdown_table(
        ["model", f"ms / token at context {short}", f"ms / token at context {long}", "ratio", "goal", "met"],
        [
            [
                "causalqwen standard",
                f"{1000 * context[f'context {short}']:.1f}",
                f"{1000 * context[f'context {long}']:.1f}",
                f"{ours_ratio:.2f}",
                f"<= {GOAL_CONTEXT_RATIO}",
                "yes" if ok else "NO",
            ],
            [
                "Qwen2ForCausalLM.generate",
                f"{1000 * context[f'Qwen2 context {short}']:.1f}",
                f"{1000 * context[f'Qwen2 context {long}']:.1f}",
                f"{qwen_ratio:.2f}",
                "",
                "",
            ],
        ],
    )
    return table, ok


def run(
    shape: str = "qwen2.5-0.5b",
    new_tokens: int = 16,
    repeats: int = 3,
    short: int = 32,
    long: int = 512,
    modes: tuple[str, ...] = MODES,
) -> tuple[str, bool]:
    """Measure; return the markdown report and whether every goal was met."""
    qwen = build_qwen(shape)
    num_token_id = qwen.config.vocab_size - 1  # a reserved row stands in for <NUM>
    torch.manual_seed(0)
    model = CausalQwenForCausalLM.from_qwen(qwen, num_token_id=num_token_id).eval()
    g = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(1, num_token_id, (1, n), generator=g) for n in (short, long)}

    with torch.no_grad():
        speed = per_token_seconds(
            lambda n: (
                {"Qwen2ForCausalLM.generate": _qwen_run(qwen, prompts[short], n)}
                | {f"causalqwen {mode}": _ours_run(model, prompts[short], n, mode) for mode in modes}
            ),
            new_tokens,
            repeats,
        )
        context = per_token_seconds(
            lambda n: (
                {f"context {length}": _ours_run(model, prompts[length], n, "standard") for length in (short, long)}
                | {f"Qwen2 context {length}": _qwen_run(qwen, prompts[length], n) for length in (short, long)}
            ),
            new_tokens,
            repeats,
        )

    qwen_rate = 1 / speed["Qwen2ForCausalLM.generate"]
    rows, ok = [], True
    for name, seconds in speed.items():
        ratio = (1 / seconds) / qwen_rate
        wanted = GOAL_TRADITIONAL_RATIO if name == "causalqwen traditional" else GOAL_SPEED_RATIO
        goal = "" if name.startswith("Qwen2") else f">= {wanted}"
        met = "" if not goal else ("yes" if ratio >= wanted else "NO")
        if goal:
            ok &= ratio >= wanted
        rows.append([name, f"{1000 * seconds:.1f}", f"{1 / seconds:.1f}", f"{ratio:.2f}", goal, met])
    table_speed = markdown_table(["variant", "ms / token", "tokens / s", "vs Qwen2", "goal", "met"], rows)

    table_context, context_ok = _context_table(context, short, long)
    ok &= context_ok
    cfg = model.config
    report = "\n\n".join(
        [
            f"### Generation speed: CausalQwen vs Qwen2 (shape `{shape}`)",
            f"Random weights, float32, batch 1, {cfg.num_hidden_layers} layers, H = {cfg.hidden_size}, "
            f"V = {cfg.vocab_size}; decode time per token from {new_tokens} new tokens after a {short}-token prompt, "
            f"median of {repeats} interleaved repeats; {machine()}.",
            table_speed,
            "Per-token decode time against context length (the KV cache keeps it flat):",
            table_context,
        ]
    )
    return report, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks generation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--shape", default="qwen2.5-0.5b", help="base shape: tiny or qwen2.5-0.5b (default)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", type=int, default=512, help="the long context (default 512)")
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args(argv)
    report, ok = run(args.shape, args.new_tokens, args.repeats, long=args.long)
    print(report)
    write_report(args.out, report)
    print("\nall goals met" if ok else "\nSOME GOALS NOT MET")
    return 0 if ok else 1
