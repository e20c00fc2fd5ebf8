"""``python -m benchmarks [NAME ...]``: run the named benchmarks (default: all) and print their reports."""

import sys

from . import (
    contention,
    divergence_bound,
    generation,
    head,
    syncs,
    tokenizer,
    training_step,
)

BENCHMARKS = {
    "head": head.main,
    "training_step": training_step.main,
    "generation": generation.main,
    "tokenizer": tokenizer.main,
    "divergence_bound": divergence_bound.main,
    "contention": contention.main,
    "syncs": syncs.main,
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("benchmarks:", ", ".join(BENCHMARKS), "-- `python -m benchmarks NAME --help` for the options of one")
        return 0
    if argv and argv[0] in BENCHMARKS:
        return BENCHMARKS[argv[0]](argv[1:])
    if argv:
        print(f"unknown benchmark {argv[0]!r}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    return max(run([]) for run in BENCHMARKS.values())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
