r"""What every experiment shares: claims with verdicts, markdown tables, figures, the report writer.

An experiment is a module ``validation.vN_*`` with a function ``run(quick, out_dir) -> ExperimentResult``.
Its module docstring is the report's text for it: the first line is the section title, the rest says
what is claimed and how it is measured (markdown, math as ``$...$`` and ``$$`` blocks, which the docs
site renders with arithmatex + KaTeX). ``run`` adds what it computed: the tables of numbers, the
claims (each a measured value, a threshold and a verdict) and the figures. Nothing in the report is
typed by hand: every number comes from a `Claim`, a `table` or the run settings.
"""

from __future__ import annotations

import importlib
import math
import operator
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: figures go to PNG files only

import matplotlib.pyplot as plt  # noqa: E402

__all__ = [
    "Claim",
    "ExperimentResult",
    "check",
    "fmt",
    "table",
    "save_figure",
    "verdict",
    "module_text",
    "write_report",
    "write_study",
]

_OPERATORS = {
    "<=": (operator.le, "≤"),
    ">=": (operator.ge, "≥"),
    "<": (operator.lt, "<"),
    ">": (operator.gt, ">"),
    "==": (operator.eq, "="),
}


@dataclass
class Claim:
    """One checked statement: the measured value, the threshold it is held to, and the verdict."""

    statement: str  # markdown, one line
    measured: float
    threshold: str  # e.g. "≤ 1e-05"
    passed: bool


def check(statement: str, measured, op: str, limit) -> Claim:
    """A `Claim` that passes when ``measured op limit`` holds (``op`` one of ``<= >= < > ==``).

    A NaN measurement never passes.
    """
    compare, symbol = _OPERATORS[op]
    measured_value = float(measured)
    passed = not math.isnan(measured_value) and bool(compare(measured_value, limit))
    return Claim(statement=statement, measured=measured_value, threshold=f"{symbol} {fmt(limit)}", passed=passed)


@dataclass
class ExperimentResult:
    """What an experiment hands to the report writer."""

    name: str  # "V1"
    title: str  # the section title (the first line of the module docstring)
    claims: list[Claim]
    body: str  # markdown: what is claimed, how it is measured, tables of computed numbers
    figures: list[str] = field(default_factory=list)  # PNG file names in the output directory
    headline: str = ""  # one line for the summary table
    settings: str = ""  # sample sizes, seeds, configurations of this run
    seconds: float = 0.0  # wall time, filled in by the runner

    @property
    def passed(self) -> bool:
        return bool(self.claims) and all(claim.passed for claim in self.claims)


def fmt(value, digits: int = 4) -> str:
    """A number for a table: integers as they are, floats with ``digits`` significant digits.

    Magnitudes in $[10^{-3}, 10^{5})$ are written plainly (``0.01234``), others in e-notation
    (``1.234e-07``); NaN and infinities as ``nan``, ``inf``, ``-inf``.
    """
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e5:
        return str(int(value))
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; cells that are numbers go through `fmt`, everything else through ``str``."""

    def cell(value) -> str:
        text = fmt(value) if isinstance(value, (int, float)) else str(value)
        # a pipe splits a cell except inside a code span (odd pieces), where a backslash would show
        pieces = text.replace("\n", " ").split("`")
        return "`".join(piece if i % 2 else piece.replace("|", r"\|") for i, piece in enumerate(pieces))

    lines = ["| " + " | ".join(cell(header) for header in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(figure, out_dir: Path, name: str) -> str:
    """Write ``figure`` to ``out_dir / name`` (PNG), close it, return ``name``."""
    figure.tight_layout()
    figure.savefig(Path(out_dir) / name, dpi=110)
    plt.close(figure)
    return name


def verdict(passed: bool) -> str:
    return "**PASS**" if passed else "**FAIL**"


def module_text(module_name: str) -> tuple[str, str]:
    """``(title, text)`` from the docstring of ``module_name``: its first line, and the rest dedented."""
    module = importlib.import_module(module_name)
    doc = textwrap.dedent(module.__doc__ or "").strip()
    title, _, rest = doc.partition("\n")
    return title.strip(), textwrap.dedent(rest).strip()


def _claims_table(claims: list[Claim]) -> str:
    return table(
        ["claim", "measured", "threshold", "verdict"],
        [[claim.statement, claim.measured, claim.threshold, verdict(claim.passed)] for claim in claims],
    )


def _section(result: ExperimentResult, heading: str) -> list[str]:
    """One experiment's section: verdict line, settings, body, claims table, figures."""
    parts = [
        heading,
        "",
        f"{verdict(result.passed)} · {sum(c.passed for c in result.claims)} of {len(result.claims)} "
        f"claims · wall time {result.seconds:.1f} s",
        "",
    ]
    if result.settings:
        parts += [f"*Settings:* {result.settings}", ""]
    parts += [
        result.body.strip(),
        "",
        "**Verdicts** (the claims that must hold; who wins is said above)",
        "",
        _claims_table(result.claims),
        "",
    ]
    for figure in result.figures:
        parts += [f"![{result.name}: {figure}]({figure})", ""]
    return parts


def write_study(result: ExperimentResult, settings: list[tuple[str, str]], out_dir: Path) -> Path:
    """Write ``out_dir / <name>.md`` (``v10.md``): a study's page, with the run settings."""
    parts = [
        f"# {result.name} · {result.title}",
        "",
        f"A study run by `python -m validation --only {result.name}` (this page is its output; `--quick` runs the "
        "same code with fewer arms and steps). Every number on this page was computed by the run that wrote it.",
        "",
        "## Run settings",
        "",
        table(["setting", "value"], [[name, value] for name, value in settings]),
        "",
        *_section(result, "## Results"),
    ]
    path = Path(out_dir) / f"{result.name.lower()}.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_report(
    results: list[ExperimentResult], settings: list[tuple[str, str]], out_dir: Path, robustness: str | None
) -> Path:
    """Write ``out_dir / index.md``: settings, a summary, one section per experiment, robustness."""
    passed = sum(result.passed for result in results)
    parts = [
        "# Validation report",
        "",
        "Every quantitative claim of the specification, reproduced with numbers and figures by "
        "`python -m validation` (this page is its output; `--quick` runs the same code with smaller "
        "samples). Each section states the claim and the method, shows the computed numbers, and gives "
        "a verdict per claim: the command exits non-zero if any claim fails. Every number on this page "
        "was computed by the run that wrote it.",
        "",
        "## Run settings",
        "",
        table(["setting", "value"], [[name, value] for name, value in settings]),
        "",
        "## Summary",
        "",
        f"{passed} of {len(results)} experiments pass all their claims.",
        "",
        table(
            ["experiment", "headline", "claims passed", "verdict", "wall time (s)"],
            [
                [
                    f"[{result.name}](#{result.name.lower()})",
                    result.headline,
                    f"{sum(c.passed for c in result.claims)} / {len(result.claims)}",
                    verdict(result.passed),
                    f"{result.seconds:.1f}",
                ]
                for result in results
            ],
        ),
        "",
    ]
    for result in results:
        parts += _section(result, f"## {result.name} · {result.title} {{#{result.name.lower()}}}")
    if robustness is not None:
        parts += ["## Robustness", "", robustness, ""]
    path = Path(out_dir) / "index.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
