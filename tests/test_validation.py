"""The validation report (`python -m validation`): the quick run passes every claim, and the report helpers."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from wall_clock import budget

from validation.common import Claim, ExperimentResult, check, fmt, table, write_report

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = [*(f"V{i}" for i in range(1, 9)), "V13"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_validation(out_dir: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "validation", *args, "--out", str(out_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check_report(out_dir: Path) -> str:
    report = (out_dir / "index.md").read_text(encoding="utf-8")
    for name in EXPERIMENTS:
        section = re.search(rf"^## {name} · .*?$\n\n(.*?)(?=^## |\Z)", report, flags=re.S | re.M)
        assert section, f"section {name} missing from the report"
        text = section.group(1)
        assert text.startswith("**PASS** ·"), f"{name} does not pass: {text[:200]}"
        assert "**FAIL**" not in text
        assert "| claim | measured | threshold | verdict |" in text
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report)
    assert len(figures) >= len(EXPERIMENTS)
    for figure in figures:
        data = (out_dir / figure).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), f"{figure} is not a non-empty PNG"
    assert "## Robustness" in report
    assert "| mode | quick (`--quick`) |" in report or "| mode | full |" in report
    return report


def test_quick_run_passes_every_claim_and_writes_the_report(tmp_path):
    result = _run_validation(tmp_path, "--quick", timeout=budget(1200))  # 124 s on a quiet machine
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all claims hold" in result.stdout
    report = _check_report(tmp_path)
    assert "| mode | quick (`--quick`) |" in report


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("CAUSALQWEN_FULL_VALIDATION"),
    reason="the full run takes a few minutes; set CAUSALQWEN_FULL_VALIDATION=1 to run it",
)
def test_full_run_passes_every_claim(tmp_path):
    result = _run_validation(tmp_path, timeout=budget(6000))  # 582 s on a quiet machine
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _check_report(tmp_path)


# ---- the report helpers ----


def test_fmt_writes_numbers_plainly_or_in_e_notation():
    assert fmt(3) == "3"
    assert fmt(0.0) == "0"
    assert fmt(2.0) == "2"
    assert fmt(0.012345678) == "0.01235"
    assert fmt(1e-6) == "1e-06"
    assert fmt(1.5e-7) == "1.5e-07"
    assert fmt(123456.0) == "1.235e+05"
    assert fmt(float("nan")) == "nan"
    assert fmt(-math.inf) == "-inf"
    assert fmt(True) == "yes"


def test_table_formats_numbers_and_escapes_pipes():
    text = table(["a", "|x|"], [[1, 0.5], ["p|q", 1e-9]])
    assert text.splitlines() == [
        r"| a | \|x\| |",
        "|---|---|",
        "| 1 | 0.5 |",
        r"| p\|q | 1e-09 |",
    ]


@pytest.mark.parametrize(
    "measured, op, limit, passed",
    [
        (1e-6, "<=", 1e-5, True),
        (1e-4, "<=", 1e-5, False),
        (0.5, ">=", 0.5, True),
        (0.0, "==", 0.0, True),
        (1.0, ">", 1.0, False),
        (float("nan"), "<=", 1.0, False),
        (float("nan"), ">=", 0.0, False),
    ],
)
def test_check_applies_the_threshold_and_a_nan_never_passes(measured, op, limit, passed):
    claim = check("statement", measured, op, limit)
    assert claim.passed is passed
    assert claim.threshold.endswith(fmt(limit))


def test_an_experiment_passes_only_with_claims_that_all_pass():
    good, bad = Claim("a", 1.0, "≤ 2", True), Claim("b", 3.0, "≤ 2", False)
    assert ExperimentResult("V1", "t", [good], "").passed
    assert not ExperimentResult("V1", "t", [good, bad], "").passed
    assert not ExperimentResult("V1", "t", [], "").passed


def test_write_report_has_settings_summary_sections_figures_and_robustness(tmp_path):
    result = ExperimentResult(
        "V1",
        "A title",
        [Claim("the claim", 0.5, "≤ 1", True)],
        "Body text.",
        figures=["v1_figure.png"],
        headline="headline 0.5",
        settings="n = 3",
        seconds=1.25,
    )
    failed = ExperimentResult("V2", "Another", [Claim("other claim", 2.0, "≤ 1", False)], "More.")
    path = write_report([result, failed], [("mode", "quick")], tmp_path, "robustness body")
    report = path.read_text(encoding="utf-8")
    assert "| mode | quick |" in report
    assert "1 of 2 experiments pass all their claims." in report
    assert "## V1 · A title {#v1}" in report and "## V2 · Another {#v2}" in report
    assert "**PASS** · 1 of 1 claims · wall time 1.2 s" in report
    assert "| the claim | 0.5 | ≤ 1 | **PASS** |" in report
    assert "| other claim | 2 | ≤ 1 | **FAIL** |" in report
    assert "![V1: v1_figure.png](v1_figure.png)" in report
    assert report.rstrip().endswith("## Robustness\n\nrobustness body")


def test_robustness_section_says_so_when_the_module_does_not_exist(monkeypatch):
    import validation.__main__ as runner

    real_find_spec = runner.importlib.util.find_spec
    monkeypatch.setattr(
        runner.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "validation.robustness" else real_find_spec(name, *args),
    )
    text = runner.robustness_markdown()
    assert "does not exist" in text and "validation.robustness" in text


def test_a_crashing_experiment_is_a_failed_claim_and_a_nonzero_exit(tmp_path, monkeypatch, capsys):
    import types

    import torch

    import validation.__main__ as runner

    crashing = types.ModuleType("validation_test_crashing")
    crashing.__doc__ = "A crashing experiment\n\nIt raises."

    def run(quick, out_dir):
        raise RuntimeError("boom")

    crashing.run = run
    monkeypatch.setitem(sys.modules, "validation_test_crashing", crashing)
    monkeypatch.setitem(runner.EXPERIMENTS, "V1", "validation_test_crashing")
    threads = torch.get_num_threads()
    try:
        code = runner.main(["--quick", "--only", "V1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert code == 1
    assert "V1: the experiment ran to completion" in capsys.readouterr().out
    report = (tmp_path / "index.md").read_text(encoding="utf-8")
    assert "## V1 · A crashing experiment" in report
    assert "RuntimeError: boom" in report and "**FAIL**" in report


def test_a_study_writes_its_own_page_and_leaves_the_report_alone(tmp_path, monkeypatch, capsys):
    """A study (V10, V11) runs only when named and writes DIR/<name>.md; index.md and the figures of the
    report's experiments stay as they were."""
    import types

    import torch

    import validation.__main__ as runner
    from validation.common import ExperimentResult, check

    study = types.ModuleType("validation_test_study")
    study.__doc__ = "A study\n\nIt measures."

    def run(quick, out_dir):
        (out_dir / "v10_figure.png").write_bytes(b"png")
        return ExperimentResult(
            name="V10",
            title="A study",
            claims=[check("one", 1.0, ">=", 1.0)],
            body="body",
            figures=["v10_figure.png"],
            headline="headline",
        )

    study.run = run
    monkeypatch.setitem(sys.modules, "validation_test_study", study)
    monkeypatch.setitem(runner.STUDIES, "V10", "validation_test_study")
    (tmp_path / "index.md").write_text("the report", encoding="utf-8")
    (tmp_path / "v1_closure_qq.png").write_bytes(b"kept")
    threads = torch.get_num_threads()
    try:
        code = runner.main(["--quick", "--only", "v10", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0 and "wrote" in capsys.readouterr().out
    page = (tmp_path / "v10.md").read_text(encoding="utf-8")
    assert page.startswith("# V10 · A study") and "`python -m validation --quick --only V10`" in page
    assert "![V10: v10_figure.png](v10_figure.png)" in page and "**PASS**" in page
    assert (tmp_path / "index.md").read_text(encoding="utf-8") == "the report"
    assert (tmp_path / "v1_closure_qq.png").read_bytes() == b"kept"
    with pytest.raises(SystemExit):
        runner.main(["--only", "V99", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "choose from V1" in err and "V10, V11, V12, GATE, V14, V15" in err


def test_studies_are_not_part_of_the_default_run():
    import validation.__main__ as runner

    assert set(runner.STUDIES) == {"V10", "V11", "V12", "GATE", "V14", "V15", "V16", "V17", "V18"} and not set(
        runner.STUDIES
    ) & set(runner.EXPERIMENTS)


def test_v10_decision_statistics_equal_scipy_on_the_models_own_forward():
    """V10's per-arm statistics: agreement of argmax P with argmax loc_S, traditional accuracy and the median
    OvR sum, recomputed from the full forward with SciPy's Cauchy survival function in float64."""
    import numpy as np
    import torch
    from scipy import stats

    from causalqwen.app.tiny import build_tiny_causal_lm
    from causalqwen.files.data import synthetic_texts
    from validation.v10_defaults import decision_statistics

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    texts = synthetic_texts(6, seed=2)
    result = decision_statistics(model, tokenizer, texts)
    agree, correct, sums = [], [], []
    for text in texts:
        ids, values = tokenizer.encode(text)
        ids, values = ids + [tokenizer.eos_token_id], values + [0.0]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), numeric_values=torch.tensor([values]))
        loc, scale = out.loc_S[0].double().numpy(), out.scale_S[0].double().numpy()
        p = stats.cauchy.sf(float(model.ovr_threshold), loc=loc, scale=scale)  # [S, V]
        for i in range(len(ids) - 1):
            agree.append(p[i].argmax() == loc[i].argmax())
            sums.append(p[i].sum())
            if ids[i + 1] != tokenizer.num_token_id:
                correct.append(loc[i].argmax() == ids[i + 1])
    assert result["agreement"] == pytest.approx(np.mean(agree))
    assert result["traditional_accuracy"] == pytest.approx(np.mean(correct))
    # torch's median of an even count is the lower middle value
    assert result["median_sum_p"] == pytest.approx(np.sort(sums)[(len(sums) - 1) // 2], rel=1e-4)


def test_a_run_removes_only_the_figures_its_earlier_pages_reference(tmp_path, monkeypatch):
    """Before running V1, the runner removes the figures that the earlier report's V1 section shows (a figure the
    new run may not rewrite); a file of the user's with a similar name, another experiment's figure and a
    reference that leaves the directory are not touched."""
    import types

    import torch

    import validation.__main__ as runner
    from validation.common import ExperimentResult, check

    experiment = types.ModuleType("validation_test_figures")
    experiment.__doc__ = "An experiment\n\nIt draws."

    def run(quick, out_dir):
        (out_dir / "v1_new.png").write_bytes(b"png")
        return ExperimentResult(
            name="V1", title="An experiment", claims=[check("one", 1.0, ">=", 1.0)], body="", figures=["v1_new.png"]
        )

    experiment.run = run
    monkeypatch.setitem(sys.modules, "validation_test_figures", experiment)
    monkeypatch.setitem(runner.EXPERIMENTS, "V1", "validation_test_figures")
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"outside")
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.md").write_text(
        "![V1: v1_old.png](v1_old.png)\n![V2: v2_old.png](v2_old.png)\n![V1: ../outside.png](../outside.png)\n",
        encoding="utf-8",
    )
    for name in ("v1_old.png", "v2_old.png", "v1_mine.png"):
        (out / name).write_bytes(b"png")
    threads = torch.get_num_threads()
    try:
        assert runner.main(["--quick", "--only", "V1", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert sorted(path.name for path in out.glob("*.png")) == ["v1_mine.png", "v1_new.png", "v2_old.png"]
    assert outside.read_bytes() == b"outside"


def test_the_command_line_names_a_file_for_out_an_empty_name_and_runs_a_name_once(tmp_path, capsys, monkeypatch):
    import validation.__main__ as runner

    a_file = tmp_path / "report.md"
    a_file.write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["--only", "V1", "--out", str(a_file)])
    assert exit_info.value.code == 2 and "is a file; give a directory" in capsys.readouterr().err
    assert a_file.read_text() == "mine"
    with pytest.raises(SystemExit):
        runner.main(["--only", "V1,", "--out", str(tmp_path)])
    assert "'V1,' holds an empty name" in capsys.readouterr().err
    args, names = runner._chosen_names(["--only", "v1,V1, v3", "--out", str(tmp_path)])
    assert names == ["V1", "V3"]
    with pytest.raises(SystemExit):
        runner.main(["--only", "V1", "--out", str(a_file / "sub")])
    assert "is a file; give a directory" in capsys.readouterr().err
    report = runner.DEFAULT_OUT / "index.md"
    before = report.read_bytes()
    with pytest.raises(SystemExit):
        runner.main(["--quick", "--only", "V1"])  # the committed report is all nine experiments' or none's
    assert "would replace the report" in capsys.readouterr().err and report.read_bytes() == before
    assert runner._chosen_names(["--only", "V16"])[1] == ["V16"]  # a study writes its own page
