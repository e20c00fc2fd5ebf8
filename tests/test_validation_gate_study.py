"""The gate study (`python -m validation --only GATE`): its order-of-learning measure on curves worked out by hand,
its comparison rule, and the quick run end to end (the page, the table, the verdict)."""

from __future__ import annotations

import math

import pytest

from validation import gate_study
from validation.__main__ import main


@pytest.mark.parametrize(
    "values, higher, expected",
    [
        ([0.1, 0.2, 0.5, 0.6], True, 2.0),  # gain 0.5, half 0.25: first reached at index 2 (0.5 - 0.1 = 0.4)
        ([0.0, 0.25, 0.5, 0.5], True, 1.0),  # 0.25 is exactly half the gain of 0.5
        ([40.0, 39.0, 30.0, 20.0], False, 2.0),  # drop 20, half 10: 40 - 30 at index 2
        ([0.5, 0.4, 0.3], True, math.nan),  # no gain: no step
        ([3.0, 3.0], False, math.nan),
    ],
)
def test_half_way_step_is_the_first_step_with_half_the_total_change(values, higher, expected):
    steps = [0, 10, 20, 30][: len(values)]
    got = gate_study.half_way_step(steps, values, higher)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == steps[int(expected)]


def test_compare_calls_a_difference_within_the_seeds_spread_a_tie():
    design = [
        dict(text_accuracy=0.50, num_f1=0.9, mdae=10.0, ece=0.05),
        dict(text_accuracy=0.52, num_f1=0.9, mdae=12.0, ece=0.05),
    ]
    override = [
        dict(text_accuracy=0.51, num_f1=0.5, mdae=30.0, ece=0.05),
        dict(text_accuracy=0.53, num_f1=0.5, mdae=31.0, ece=0.05),
    ]
    # accuracy: means 0.51 vs 0.52, sds 0.0141 each: a tie; F1 higher and MdAE lower for the design; ECE equal
    assert gate_study.compare(design, override) == {
        "text_accuracy": "tie",
        "num_f1": "design gate",
        "mdae": "design gate",
        "ece": "tie",
    }


def test_the_quick_study_writes_its_page_with_every_arm(tmp_path, capsys):
    assert main(["--quick", "--only", "GATE", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "gate.md").read_text(encoding="utf-8")
    assert page.startswith("# GATE · The regression gate, measured")
    for alpha, detach in gate_study.QUICK["arms"]:
        assert f"| α = {alpha:g}" + (", detached" if detach else "") + " | 0.1 |" in page
    assert "## The design's gate against α = 1" in page and "- λ = 0.1, α = 0 against α = 1: text_accuracy: " in page
    assert "Classification reached half its gain before regression in" in page
