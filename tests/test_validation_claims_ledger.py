"""V13, the claims ledger: its quick run writes its own page with at least 15 claims, each with an allowed verdict,
and the verdicts that follow from a hand derivation are the ones the run computed."""

import math
import re

import numpy as np
import pytest
from scipy import optimize

from validation.claims_ledger import is_allowed_verdict

ROW = re.compile(r"^\| C(\d+) \| (.*) \|$")
CELL_SPLIT = re.compile(r"(?<!\\)\|")  # a cell boundary: a pipe not escaped by `common.table`


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    """The quick run of V13 (in this process): its result and the ledger rows of its page, as
    ``{number: (where, claim, method, figures, verdict)}``."""
    import torch

    from validation.v13_claims import run

    out_dir = tmp_path_factory.mktemp("v13")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as `python -m validation` runs it: the tiny model only loses from a second thread
    try:
        result = run(True, out_dir)
    finally:
        torch.set_num_threads(threads)
    page = (out_dir / "v13.md").read_text(encoding="utf-8")
    rows = {}
    for line in page.splitlines():
        match = ROW.match(line)
        if match:
            cells = [cell.strip().replace("\\|", "|") for cell in CELL_SPLIT.split(match.group(2))]
            assert len(cells) == 5, line
            rows[int(match.group(1))] = (*cells[:4], cells[4].strip("*"))
    return result, rows, page, out_dir


def _row(rows: dict, where_part: str, claim_part: str) -> tuple[str, ...]:
    found = [row for row in rows.values() if where_part in row[0] and claim_part in row[1]]
    assert len(found) == 1, f"expected one row at {where_part!r} about {claim_part!r}, found {len(found)}"
    return found[0]


def _number_after(text: str, label: str) -> float:
    match = re.search(re.escape(label) + r"\s*(-?[0-9.]+(?:e[-+]?[0-9]+)?)", text)
    assert match, f"{label!r} not in {text!r}"
    return float(match.group(1))


def test_quick_ledger_passes_and_lists_at_least_15_claims_with_allowed_verdicts(ledger):
    result, rows, page, out_dir = ledger
    assert result.passed, [claim for claim in result.claims if not claim.passed]
    assert len(rows) >= 15
    assert sorted(rows) == list(range(1, len(rows) + 1))
    for number, (where, claim, method, figures, verdict) in rows.items():
        assert is_allowed_verdict(verdict), f"C{number}: {verdict!r}"
        assert where and claim and method and figures, f"C{number} has an empty cell"
    assert "(v13.md)" in result.body and result.figures == ["v13_ovr_loss_shape.png"]
    assert (out_dir / "v13_ovr_loss_shape.png").read_bytes().startswith(b"\x89PNG")
    assert "| mode | quick (`--quick`) |" in page


def test_convexity_fails_with_the_sign_change_near_minus_0_43(ledger):
    _, rows, _, _ = ledger
    _, _, _, figures, verdict = _row(rows, "math_foundations_v1 §4.1", "convex")
    assert verdict == "fails"

    def second_derivative(t: float) -> float:  # g = -log P, P = 1/2 + arctan(t)/pi, derived by hand
        p = 0.5 + math.atan(t) / math.pi
        p1 = 1.0 / (math.pi * (1.0 + t * t))
        p2 = -2.0 * t / (math.pi * (1.0 + t * t) ** 2)
        return (p1 * p1 - p2 * p) / (p * p)

    root = optimize.brentq(second_derivative, -1.0, 0.0, xtol=1e-12)
    assert abs(_number_after(figures, "changes sign at t =") - root) <= 0.01
    assert second_derivative(-10.0) < 0 < second_derivative(0.0)


def test_anti_saturation_reports_the_1_over_t_decay(ledger):
    _, rows, _, _ = ledger
    _, _, _, figures, verdict = _row(rows, "math_foundations_v1 §4.1", "Anti-saturation")
    assert verdict.startswith("holds only under ")
    for t in (-10.0, -100.0):  # |d(-log P)/dt| = P'(t) / P(t)
        expected = 1.0 / (math.pi * (1.0 + t * t)) / (0.5 + math.atan(t) / math.pi)
        label = "|d(−log P)/dt| =" if t == -10.0 else "at t = −10,"
        assert _number_after(figures, label) == pytest.approx(expected, rel=1e-3)


def test_divergences_threshold_and_noise_verdicts(ledger):
    _, rows, _, _ = ledger
    assert _row(rows, "inference §3.3", "Top-p")[4].startswith("diverges from the draft")
    assert _row(rows, "math_foundations_v1 §4.4", "clipped")[4].startswith("diverges from the draft")
    assert _row(rows, "forward_pass §1.3", "w_num")[4].startswith("diverges from the draft")
    # every P_k depends on loc_S - C_k = W_k u + (b_cls,k - C_k): a learnable C_k adds nothing b_cls cannot
    assert _row(rows, "§4 step 6 (the author's comment", "learnable per-class threshold")[4] == "fails"
    # only |b_noise| enters the model, and d|b|/db = 0 at b = 0
    assert _row(rows, "forward_pass §4.2", "b_noise is a learnable")[4].startswith("holds only under ")
    assert _row(rows, "§4 step 5", "b_noise starts at 0")[4] == "fails"


def test_embedding_row_reports_log1p_norms(ledger):
    _, rows, _, _ = ledger
    _, _, _, figures, _ = _row(rows, "§4 step 1; math_foundations_v1", "barely disturbs")
    assert _number_after(figures, "‖φ(99.9)‖ =") == pytest.approx(np.log1p(99.9), rel=1e-3)
    assert _number_after(figures, "‖φ(10⁶)‖ =") == pytest.approx(np.log1p(1e6), rel=1e-3)


def test_ledger_runs_by_default():
    import validation.__main__ as runner

    assert runner.EXPERIMENTS["V13"] == "validation.v13_claims" and "V13" not in runner.STUDIES


@pytest.mark.parametrize(
    "verdict, allowed",
    [
        ("holds", True),
        ("fails", True),
        ("holds only under γ = 10", True),
        ("diverges from the draft: no clamp", True),
        ("holds only under ", False),
        ("fails (mostly)", False),
        ("unclear", False),
    ],
)
def test_allowed_verdicts(verdict, allowed):
    assert is_allowed_verdict(verdict) is allowed


# ---- the intervals' row, on answers whose law is known ----


def _write_answers(directory, spread: float, seed: int = 0):
    """Studies' files whose answers are drawn from Cauchy(loc, spread * scale): calibrated when ``spread`` is 1."""
    import json

    rng = np.random.default_rng(seed)
    loc, scale = rng.normal(size=8000), rng.uniform(0.5, 2.0, size=8000)
    values = loc + spread * scale * rng.standard_cauchy(size=8000)
    lift = {
        "datasets": {"f/c/1": {"y_valid": values[:4000].tolist()}},
        "arms": {"CausalQwen": {"f/c/1": {"valid": loc[:4000].tolist(), "valid_scale": scale[:4000].tolist()}}},
    }
    series = {
        "S": {"test": values[4000:].tolist(), "one_step": {"loc": loc[4000:].tolist(), "scale": scale[4000:].tolist()}}
    }
    (directory / "v17_predictions.json").write_text(json.dumps(lift))
    (directory / "v18_predictions.json").write_text(json.dumps(series))


def test_the_interval_row_holds_on_calibrated_answers_and_fails_on_answers_three_times_wider(tmp_path):
    from validation.claims_intervals import interval_rows

    _write_answers(tmp_path, spread=1.0)
    (row,) = interval_rows(tmp_path)
    assert row.verdict == "holds", row.figures
    assert all(claim.passed for claim in row.claims)
    _write_answers(tmp_path, spread=3.0)
    (row,) = interval_rows(tmp_path)
    assert row.verdict == "fails" and "50% → " in row.figures


def test_the_interval_row_names_a_missing_file_and_its_study(tmp_path):
    from validation.claims_intervals import interval_rows

    with pytest.raises(
        FileNotFoundError, match=r"v17_predictions.json is missing: run python -m validation --only V17"
    ):
        interval_rows(tmp_path)
