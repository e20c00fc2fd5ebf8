"""V17 (validation/v17_number_encoding.py): the number encodings trained by V16's protocol; unknown arms and settings
named, and the quick run end to end, its periodic arms really periodic."""

import json

import pytest

from validation.common import write_study
from validation.v16_lift_tuned import CAUSAL_ARMS, train_arm
from validation.v17_number_encoding import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the studies run with one thread


def test_unknown_arms_and_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['CausalQwen, sine'\]"):
        run(True, tmp_path, arms=("CausalQwen, sine",))
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['encoding'\]"):
        run(True, tmp_path, encoding="log_fourier")
    with pytest.raises(ValueError, match="arm must be one of"):
        train_arm("CausalQwen, sine", "cosine", "outliers", 1, 1e-3, 1)


def test_the_arms_differ_only_in_the_encoding():
    assert CAUSAL_ARMS["CausalQwen"] == {}
    assert {tuple(sorted(init)) for name, init in CAUSAL_ARMS.items() if name != "CausalQwen"} == {
        ("number_encoding",),
        ("number_encoding", "number_periods"),
    }


@pytest.mark.slow
def test_quick_run_writes_its_page_figure_and_raw_answers(tmp_path):
    result = run(True, tmp_path)
    page = write_study(result, [("mode", "quick")], tmp_path).read_text()
    assert "LIFT RAE, outliers" in page and "validation RAE at" in page and "best:" in page
    assert (tmp_path / "v17_number_encoding.png").stat().st_size > 0
    saved = json.loads((tmp_path / "v17_predictions.json").read_text())
    assert set(saved["arms"]) == set(CAUSAL_ARMS)
    for arm in CAUSAL_ARMS:
        answers = saved["arms"][arm]["cosine/outliers/1"]
        assert len(answers["predicted"]) == 100 and answers["steps"] == 20
    assert all(claim.passed for claim in result.claims), [c for c in result.claims if not c.passed]
