"""The package as it is distributed: a wheel built from the repository with ``python -m build`` (causalqwen is
not on the Python package index), checked from the outside.

- the wheel holds every file of ``causalqwen/`` (every sub-package with it) and nothing else of the repository:
  no tests, validation, benchmarks or docs;
- installed into a fresh virtual environment, it is the package that a saved directory's ``causalqwen_auto.py``
  imports: ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)``, run from a directory outside
  the repository, gives the same next-token locations as the model that saved the directory;
- ``make test`` builds the docs site and installs chromium only where the run selects the docs browser test.

The fresh environment gets the dependencies (torch, transformers, ...) from the environment running the tests,
through a ``.pth`` line naming its site-packages: a plain path line, so that environment's own ``.pth`` files,
the editable install of this checkout among them, are not run there, and ``causalqwen`` can only come from the
wheel (the test checks ``causalqwen.__file__``). Nothing reaches the network: the build runs without isolation
(``--no-isolation``, with the setuptools installed here) and pip installs the wheel with ``--no-index --no-deps``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
from wall_clock import budget

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("kernels", "files", "integrations", "checks", "app")

pytestmark = pytest.mark.slow


def source_files() -> set[str]:
    """The files of ``causalqwen/`` in the checkout, as wheel member names (compiled caches left out)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "causalqwen").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``python -m build --wheel`` makes of a copy of the checkout (the build writes ``build/`` and
    ``*.egg-info`` beside its sources, so it never runs in the checkout itself)."""
    work = tmp_path_factory.mktemp("packaging")
    sources = work / "sources"
    sources.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, sources / name)
    shutil.copytree(ROOT / "causalqwen", sources / "causalqwen", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(work / "dist"), str(sources)],
        capture_output=True,
        text=True,
        timeout=budget(300),
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    wheels = sorted((work / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_holds_the_package_and_nothing_else_of_the_repository(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(
            archive.read(name).decode() for name in names if name.endswith(".dist-info/entry_points.txt")
        )
    package = {name for name in names if name.startswith("causalqwen/")}
    metadata = {name.split("/")[0] for name in names} - {"causalqwen"}
    assert package == source_files()
    assert {f"causalqwen/{sub}/__init__.py" for sub in SUBPACKAGES} <= package
    assert len(metadata) == 1 and metadata.pop().endswith(".dist-info")  # nothing else at the top of the wheel
    assert not [name for name in names if name.split("/")[0] in ("tests", "validation", "benchmarks", "docs")]
    assert "causalqwen = causalqwen.app.cli:main" in entry_points
    for page in ("README.md", "docs/index.md"):  # the install instructions name the wheel that the build makes
        assert f"pip install dist/{wheel.name}" in (ROOT / page).read_text(encoding="utf-8"), page


def fresh_environment(directory: Path, wheel: Path | None) -> Path:
    """A virtual environment in ``directory`` with this environment's site-packages on its path (a plain ``.pth``
    line) and the wheel, if one is given, installed; returns its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=budget(300))
    python = directory / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=budget(60),
    ).stdout.strip()
    Path(purelib, "dependencies_of_the_test_run.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )
    if wheel is None:
        return python
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=budget(300),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return python


LOAD = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, text = sys.argv[1], sys.argv[2]
imported_before = "causalqwen" in sys.modules
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
batch = tokenizer([text])
with torch.no_grad():
    loc_S = model(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"]).loc_S
import causalqwen
print("RESULT", json.dumps({"file": causalqwen.__file__, "imported_before": imported_before,
                            "model": type(model).__name__, "ids": batch["input_ids"].tolist(),
                            "values": batch["numeric_values"].tolist(), "loc_S": loc_S.tolist()}))
"""


def run_outside(python: Path, tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    """``python -c LOAD arguments`` from a directory outside the repository, offline, with no PYTHONPATH."""
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    return subprocess.run(
        [str(python), "-c", LOAD, *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=outside,
        timeout=budget(300),
        stdin=subprocess.DEVNULL,
    )


def test_a_wheel_installed_in_a_fresh_environment_loads_a_saved_directory(wheel, tmp_path):
    from causalqwen.app.tiny import build_tiny_causal_lm

    assert not tmp_path.resolve().is_relative_to(ROOT)  # the loading process runs outside the repository
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    text = "The price is 99.9 yuan, down from 120."
    batch = tokenizer([text])
    with torch.no_grad():
        expected = model.eval()(input_ids=batch["input_ids"], numeric_values=batch["numeric_values"]).loc_S

    result = run_outside(fresh_environment(tmp_path / "env", wheel), tmp_path, str(saved), text)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.split("RESULT ")[-1])
    assert Path(got["file"]).resolve().is_relative_to((tmp_path / "env").resolve())  # the wheel's copy, not the repo's
    assert not got["imported_before"] and got["model"] == "CausalQwenForCausalLM"
    assert got["ids"] == batch["input_ids"].tolist()
    torch.testing.assert_close(torch.tensor(got["values"]), batch["numeric_values"], equal_nan=True)
    torch.testing.assert_close(torch.tensor(got["loc_S"]), expected, rtol=1e-5, atol=1e-5)


def test_without_the_package_the_saved_directory_says_how_to_install_it(tmp_path):
    """Where causalqwen is missing, transformers refuses the directory with its own advice, ``pip install
    causalqwen``, which cannot work (the package is not on the index); the saved module says how it is installed."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    model.save_pretrained(tmp_path / "saved")
    result = run_outside(fresh_environment(tmp_path / "env", None), tmp_path, str(tmp_path / "saved"), "1")
    assert result.returncode != 0 and "ImportError" in result.stderr
    assert "requires the following packages that were not found in your environment: causalqwen" in result.stderr
    module = (tmp_path / "saved" / "causalqwen_auto.py").read_text(encoding="utf-8")
    assert "not on the Python package index" in module and "from a clone of its repository" in module
    assert "python -m build --wheel" in module


@pytest.mark.parametrize(
    ("selection", "sets_up"),
    [('-m "not docs" tests/test_app_tiny.py tests/test_docs_site.py', False), ("tests/test_docs_site.py", True)],
)
def test_make_test_sets_up_the_docs_browser_test_only_where_the_run_selects_it(selection, sets_up):
    """``make test PYTEST_ARGS='-m "not docs"'`` neither builds the site nor installs chromium; a run that selects the
    browser test does both first (``make -n``: the commands make would run, the selection asked of pytest)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    outer_make = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")  # when the suite itself runs under make test
    env = {key: value for key, value in os.environ.items() if key not in outer_make}
    run = subprocess.run(
        ["make", "-n", "test", f"BIN={os.path.dirname(sys.executable)}", f"PYTEST_ARGS={selection}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=budget(120),
    )
    assert run.returncode == 0, run.stderr
    planned = run.stdout
    assert ("mkdocs build" in planned) is sets_up and ("apt-get install" in planned) is sets_up, planned
    assert ("npm ci" in planned) <= sets_up, planned
    said = [
        line for line in planned.splitlines() if line.startswith("make test: the docs browser test is not selected")
    ]
    assert bool(said) is not sets_up, planned
    assert f"-m pytest -n 2 {selection}" in planned.splitlines()[-1], planned
