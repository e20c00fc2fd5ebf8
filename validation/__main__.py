r"""``python -m validation [--quick] [--out DIR] [--only V1,V3]``: run the experiments, write the report.

The report (``index.md``) and its figures go to ``DIR`` (default: ``docs/validation/`` under the
repository root, where the docs site renders it). The exit status is 0 when every claim holds and 1
otherwise; the failing claims are printed. ``--quick`` (for CI, under two minutes) runs the same code
with smaller samples, fewer configurations and fewer training steps. V13, the ledger of the design documents'
claims with a computed verdict each, runs by default and also writes its own page, ``DIR/v13.md``.

The studies (`STUDIES`: V10, the design's free parameters; V11, an outside arithmetic benchmark; V12, lm-eval
with Qwen beside CausalQwen; GATE, the regression gate measured; V14, LIFT's regression from text, clean and with
outliers; V15, LLMTime's series forecast as text; V16, LIFT with every language model at its tuned best; V17, the
number encodings on LIFT; V18, LLMTime at CausalQwen's best) take longer than the report's time budget or need an
optional extra, so they run only when named (``--only V10``) and each writes its own page, ``DIR/v10.md``,
``DIR/v11.md``, ..., next to the report.

All experiments run with one torch thread: the models are tiny, so a second thread only adds
contention on a shared machine, and one thread keeps every number reproducible bit for bit on a
given machine.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import platform
import re
import sys
import time
import traceback
from pathlib import Path

EXPERIMENTS = {
    "V1": "validation.v1_closure",
    "V2": "validation.v2_ovr_precision",
    "V3": "validation.v3_init_equivalence",
    "V4": "validation.v4_ovr_sum",
    "V5": "validation.v5_sampling",
    "V6": "validation.v6_noise_init",
    "V7": "validation.v7_gate",
    "V8": "validation.v8_learning",
    "V9": "validation.v9_comparison",
    "V13": "validation.v13_claims",
}

STUDIES = {
    "V10": "validation.v10_defaults",
    "V11": "validation.v11_arithmetic",
    "V12": "validation.v12_lm_eval",
    "GATE": "validation.gate_study",
    "V14": "validation.v14_lift",
    "V15": "validation.v15_llmtime",
    "V16": "validation.v16_lift_tuned",
    "V17": "validation.v17_number_encoding",
    "V18": "validation.v18_llmtime_tuned",
}

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "validation"


def _failed_run(name: str, module_name: str, error: BaseException):
    """The result of an experiment that raised: one failed claim and the traceback."""
    from .common import Claim, ExperimentResult, module_text

    try:
        title, _ = module_text(module_name)
    except Exception:  # the module itself may not import
        title = module_name
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return ExperimentResult(
        name=name,
        title=title,
        claims=[Claim("the experiment ran to completion", float("nan"), "no exception", False)],
        body=f"The experiment raised an exception:\n\n```text\n{trace}\n```",
        headline=f"error: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}",
    )


def robustness_markdown() -> str:
    """The body of the report's Robustness section.

    It comes from ``validation.robustness.summary_markdown()`` (the robustness suite's summary table;
    the section heading is written by the report writer, so that function returns the body only). When
    that module does not exist, the section says so; nothing is made up in its place.
    """
    if importlib.util.find_spec("validation.robustness") is None:
        return (
            "The robustness summary is not available in this checkout: the module `validation.robustness` "
            "(which provides `summary_markdown()`) does not exist."
        )
    module = importlib.import_module("validation.robustness")
    return module.summary_markdown().strip()


def _chosen_names(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed arguments and the experiments to run, each once, in the order given (names in any letter case; an
    unknown or empty name, an ``--out`` that is or lies under a file, or a partial report in place of the committed
    one, is a usage error). Studies alone (``--only V16``) write their own pages beside the report."""
    parser = argparse.ArgumentParser(prog="python -m validation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller samples and fewer steps (CI, under two minutes)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")
    parser.add_argument("--only", default=None, help="comma-separated experiments to run, e.g. V1,V3 (default: all)")
    args = parser.parse_args(argv)
    existing = next(path for path in (args.out, *args.out.absolute().parents) if path.exists())
    if not existing.is_dir():
        parser.error(
            f"--out {str(args.out)!r}: {str(existing)!r} is a file; give a directory (it is created if missing)"
        )
    names = list(EXPERIMENTS) if args.only is None else [name.strip().upper() for name in args.only.split(",")]
    if "" in names:
        parser.error(f"--only {args.only!r} holds an empty name: separate the names by single commas, e.g. V1,V3")
    names = list(dict.fromkeys(names))  # a name given twice (v1,V1) runs once
    unknown = [name for name in names if name not in EXPERIMENTS and name not in STUDIES]
    if unknown:
        parser.error(f"unknown experiment(s) {', '.join(unknown)}; choose from {', '.join([*EXPERIMENTS, *STUDIES])}")
    partial = [name for name in names if name in EXPERIMENTS]
    if partial and set(partial) != set(EXPERIMENTS) and args.out.absolute() == DEFAULT_OUT.absolute():
        parser.error(
            f"--only {','.join(partial)} would replace the report {DEFAULT_OUT / 'index.md'} (all of "
            f"{', '.join(EXPERIMENTS)}) with {len(partial)} experiment(s): give --out DIR for a partial report"
        )
    return args, names


def _import_once() -> None:
    """One torch thread; the libraries, transformers and causalqwen imported (transformers silenced) before
    any experiment is timed."""
    import matplotlib  # noqa: F401
    import numpy  # noqa: F401
    import scipy  # noqa: F401
    import torch

    torch.set_num_threads(1)
    from transformers.utils import logging as transformers_logging

    import causalqwen  # noqa: F401  (imported here, so that no experiment's wall time includes transformers)

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def _figures_shown_before(out_dir: Path, names: list[str]) -> list[Path]:
    """The figures that the pages of an earlier run in ``out_dir`` show for the experiments ``names``: the files
    of the report's (``index.md``) and each study's page (``v10.md``, ...) image links written as
    ``![V1: v1_closure_qq.png](v1_closure_qq.png)``, regular files directly in ``out_dir``. Only these are removed
    before the run; nothing else in the directory is touched (a file of the user's, another experiment's figure, a
    link, a name that leads out of the directory)."""
    shown = set()
    for page in [out_dir / "index.md", *(out_dir / f"{name.lower()}.md" for name in names)]:
        if not page.is_file() or page.is_symlink():
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        for name in names:
            shown.update(re.findall(rf"!\[{re.escape(name)}: [^\]]*\]\(([\w.-]+\.png)\)", text))
    paths = [out_dir / figure for figure in sorted(shown)]
    return [path for path in paths if path.is_file() and not path.is_symlink()]


def _run_experiments(names: list[str], quick: bool, out_dir: Path) -> list:
    """Run each named experiment (a crash is a failed experiment, reported like one), timing each."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in _figures_shown_before(out_dir, names):  # figures of an earlier run that this run may not rewrite
        old.unlink()
    results = []
    for name in names:
        module_name = EXPERIMENTS.get(name) or STUDIES[name]
        print(f"{name}: running {module_name} ...", flush=True)
        begin = time.perf_counter()
        try:
            result = importlib.import_module(module_name).run(quick, out_dir)
        except Exception as error:  # a crash is a failed experiment, reported like one
            result = _failed_run(name, module_name, error)
        result.seconds = time.perf_counter() - begin
        status = "PASS" if result.passed else "FAIL"
        print(f"{name}: {status} in {result.seconds:.1f} s -- {result.headline}", flush=True)
        results.append(result)
    return results


def _command(args: argparse.Namespace, only: str | None) -> str:
    return "`python -m validation" + (" --quick" if args.quick else "") + (f" --only {only}" if only else "") + "`"


def _machine() -> list[tuple[str, str]]:
    """The settings rows that describe the machine and the library versions."""
    import matplotlib
    import numpy
    import scipy
    import torch

    return [
        ("torch threads", str(torch.get_num_threads())),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("numpy / scipy / matplotlib", f"{numpy.__version__} / {scipy.__version__} / {matplotlib.__version__}"),
        ("machine", f"{platform.machine()}, {platform.system()}"),
    ]


def _report_settings(
    args: argparse.Namespace, results: list, robustness_seconds: float | None, started: float
) -> list[tuple[str, str]]:
    """The report's run-settings table (``robustness_seconds`` None: the robustness section was not run)."""
    settings = [
        _mode(args),
        ("command", _command(args, None if args.only is None else ",".join(r.name for r in results))),
        ("experiments", ", ".join(r.name for r in results)),
        ("seeds", "fixed per experiment (listed in each section's settings)"),
        *_machine(),
        ("wall time per experiment (s)", ", ".join(f"{r.name} {r.seconds:.1f}" for r in results)),
    ]
    if robustness_seconds is not None:
        settings.append(("robustness summary (s)", f"{robustness_seconds:.1f}"))
    settings.append(("total wall time (s)", f"{time.perf_counter() - started:.1f} (imports included)"))
    return settings


def _mode(args: argparse.Namespace) -> tuple[str, str]:
    return ("mode", "quick (`--quick`)" if args.quick else "full")


def _failed_claims(results: list) -> int:
    """Print the failing claims and return the exit status: 1 if any claim failed, else 0."""
    failed = [(result.name, claim) for result in results for claim in result.claims if not claim.passed]
    if failed:
        print("FAILED claims:")
        for name, claim in failed:
            print(f"  {name}: {claim.statement} -- measured {claim.measured!r}, needs {claim.threshold}")
        return 1
    print("all claims hold")
    return 0


def main(argv: list[str] | None = None) -> int:
    args, names = _chosen_names(argv)
    started = time.perf_counter()
    _import_once()
    from .common import write_report, write_study

    results = _run_experiments(names, args.quick, args.out)
    studies = [result for result in results if result.name in STUDIES]
    results = [result for result in results if result.name not in STUDIES]
    begin = time.perf_counter()
    robustness = robustness_markdown() if args.only is None else None
    robustness_seconds = time.perf_counter() - begin if robustness is not None else None
    settings = _report_settings(args, results, robustness_seconds, started)
    if results:
        path = write_report(results, settings, args.out, robustness)
        print(f"wrote {path} ({len(results)} experiments, {time.perf_counter() - started:.1f} s)")
    for study in studies:
        path = write_study(
            study,
            [
                _mode(args),
                ("command", _command(args, study.name)),
                *_machine(),
                ("wall time (s)", f"{study.seconds:.1f}"),
            ],
            args.out,
        )
        print(f"wrote {path} ({study.name}, {study.seconds:.1f} s)")
    return _failed_claims(results + studies)


if __name__ == "__main__":
    sys.exit(main())
