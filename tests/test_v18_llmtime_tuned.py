"""V18 (validation/v18_llmtime_tuned.py, llmtime_paths.py, v18_report.py): the rows and the encoding of a history,
the modes' paths, bad settings named, and the quick run end to end."""

import json

import numpy as np
import pytest

from validation.common import write_study
from validation.llmtime_paths import Encoder, sampled_paths, training_rows
from validation.v18_llmtime_tuned import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the studies run with one thread


def test_each_row_is_the_history_before_a_time_and_the_value_at_it():
    rows = training_rows([0.1, 0.25, 1.5, -2.0, 3.0], min_context=2, max_context=2)
    assert [(r.prompt, r.completion) for r in rows] == [
        ("0.100, 0.250, ", "1.500"),
        ("0.250, 1.500, ", "-2.000"),
        ("1.500, -2.000, ", "3.000"),
    ]


def test_a_history_grown_a_value_at_a_time_is_what_the_tokenizer_writes():
    from causalqwen.app.tiny import build_tiny_causal_lm

    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    encoder = Encoder(tiny.tokenizer)
    ids, numbers = encoder.encode([0.5, 1.25, -3.0])
    assert ids[0].tolist().count(tiny.tokenizer.num_token_id) == 3
    assert numbers[0][ids[0] == tiny.tokenizer.num_token_id].tolist() == [0.5, 1.25, -3.0]
    paths = {
        m: sampled_paths(tiny.model, encoder, [0.5, 1.25, -3.0], 4, max_context=8, mode=m, paths=6, seed=0)
        for m in ("standard", "causal", "shared_individual")
    }
    assert paths["standard"].shape == (1, 4) and paths["causal"].shape == (6, 4)
    assert len({tuple(p) for p in paths["causal"]}) == 6  # each path its own draws
    assert np.isfinite(paths["shared_individual"]).all()


def test_unknown_settings_series_and_values_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['serie'\]"):
        run(True, tmp_path, serie=("Wine",))
    with pytest.raises(ValueError, match="unknown series 'Nile'"):
        run(True, tmp_path, series=("Nile",))
    with pytest.raises(ValueError, match="unknown values 'log'"):
        run(True, tmp_path, values=("log",))
    with pytest.raises(ValueError, match="paths must be at least 2"):
        run(True, tmp_path, paths=1)


@pytest.mark.slow
def test_quick_run_writes_its_page_figure_and_raw_forecasts(tmp_path):
    result = run(True, tmp_path)
    page = write_study(result, [("mode", "quick")], tmp_path).read_text()
    assert "Scaled MAE of the test part" in page and "One-step intervals" in page and "Who wins" in page
    assert (tmp_path / "v18_forecasts.png").stat().st_size > 0
    saved = json.loads((tmp_path / "v18_predictions.json").read_text())
    series = saved["AusBeer"]
    assert len(series["quantiles"]["causal"]["0.5"]) == len(series["test"])
    assert set(series["quantiles"]) == {"standard", "causal", "shared_individual"}
    assert all(claim.passed for claim in result.claims), [c for c in result.claims if not c.passed]
