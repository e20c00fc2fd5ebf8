"""The house rules of pyproject.toml's ``[tool.ruff]``, kept by the formatter: every Python file of the package,
validation/, benchmarks/, tests/ and docs_hooks/ is as ``ruff format`` writes it and passes ``ruff check``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["causalqwen", "validation", "benchmarks", "tests", "docs_hooks"]


def ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it is a dev dependency (pip install -e '.[dev]')")
    return [found]


def test_the_code_is_formatted_as_ruff_format_writes_it():
    run = subprocess.run([*ruff(), "format", "--check", *TARGETS], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_code_passes_the_lint_rules():
    run = subprocess.run(
        [*ruff(), "check", "--output-format", "concise", *TARGETS], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
