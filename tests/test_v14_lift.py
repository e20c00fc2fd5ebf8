"""V14 (validation/lift_data.py, lift_baselines.py, v14_lift.py, v14_report.py): LIFT's data recipe against LIFT's
shipped files, the RAE against hand computation, the robust baselines, CausalQwen's answer, bad input, and the quick
run end to end."""

import json
import math

import numpy as np
import pytest
import torch

from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.numbers import find_numbers
from validation.common import write_study
from validation.lift_baselines import fit_predict
from validation.lift_data import (
    FUNCTIONS,
    PUBLISHED,
    LiftData,
    finite,
    generate,
    lift_rae,
    prompt_text,
    rae,
    require,
    target,
    training_text,
)
from validation.v14_lift import causal_predictions, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the studies run with one thread


# The first three rows of LIFT's shipped test files, regression/accuracy/data_1/<function>_n_250_p_1_int_0_(-10.csv
# (UW-Madison-Lee-Lab/LanguageInterfacedFineTuning): (x, noiseless y).
LIFT_TEST_X = (-5.835034065221267, -1.1326459639757651, 4.3120255030860974)
LIFT_TEST_Y = {
    "linear": (-5.25153065869914, -1.0193813675781886, 3.880822952777488),
    "quadratic": (-2.871427942387328, -8.769080361652094, -5.653158490932316),
    "exponential": (-8.56335283247149, -7.357354190408572, -3.457563636300252),
    "cosine": (-8.699524331000015, -1.8616990228473551, 7.940451323295065),
    "l1norm": (1.5030613173982812, -6.961237264843622, -1.2383540944450242),
    "piecewise": (0.3711733532521495, 0.0, -3.7979426180562808),
}


# ---- the data recipe ----


@pytest.mark.parametrize("function", FUNCTIONS)
def test_test_set_is_lifts_shipped_test_set(function):
    data = generate(function, sim=1)
    assert data.x_test[:3] == pytest.approx(LIFT_TEST_X, abs=1e-12)
    assert data.y_test[:3] == pytest.approx(LIFT_TEST_Y[function], abs=1e-12)
    assert target(function, np.array(LIFT_TEST_X)) == pytest.approx(LIFT_TEST_Y[function], abs=1e-12)


def test_split_noise_and_simulations_follow_the_recipe():
    generator = np.random.RandomState(123)  # the recipe, recomputed here: 250 inputs, 100 test inputs, then noise
    inputs = generator.uniform(-10, 10, 250)
    generator.uniform(-10, 10, 100)
    noise = generator.normal(0, 0.1 * np.std(0.9 * inputs), 250)
    first, second = generate("linear", 1), generate("linear", 2)
    for data in (first, second):
        assert (len(data.x_train), len(data.x_valid), len(data.x_test)) == (200, 50, 100)
        assert sorted(np.concatenate([data.x_train, data.x_valid])) == sorted(inputs)
        index = {x: i for i, x in enumerate(inputs)}
        expected = [0.9 * inputs[index[x]] + noise[index[x]] for x in data.x_train]
        assert data.y_train == pytest.approx(expected, abs=1e-12)
    assert set(first.x_valid) != set(second.x_valid)  # the simulations differ by the split only
    assert np.array_equal(first.x_test, second.x_test)


def test_outliers_are_the_notebooks_four():
    generator = np.random.RandomState(123)
    x_out = generator.uniform(-10, 10, 4)
    y_out = np.abs(generator.normal(0, 20, 4))
    clean, dirty = generate("cosine", 3), generate("cosine", 3, "outliers")
    assert len(dirty.x_train) == 204
    assert np.array_equal(dirty.x_train[:200], clean.x_train) and np.array_equal(dirty.y_train[:200], clean.y_train)
    assert dirty.x_train[200:] == pytest.approx(x_out) and dirty.y_train[200:] == pytest.approx(y_out)
    assert np.array_equal(dirty.x_valid, clean.x_valid) and np.array_equal(dirty.y_test, clean.y_test)


def test_published_numbers_are_those_the_issue_quotes():
    clean, outliers = PUBLISHED["clean"], PUBLISHED["outliers"]
    assert (clean["linear"]["poly"], clean["linear"]["gp"]) == (0.0102, 0.0081)
    assert (clean["linear"]["gpt3"], clean["linear"]["gptj"]) == (0.0637, 0.0811)
    assert (clean["cosine"]["gp"], clean["cosine"]["gptj"]) == (0.0352, 0.3849)
    linear = outliers["linear"]
    assert (linear["poly"], linear["nn"], linear["gp"], linear["gpt3"], linear["gptj"]) == (
        0.1459,
        0.1016,
        0.8076,
        0.0683,
        0.0704,
    )
    assert outliers["l1norm"]["gptj"] == 0.1017


# ---- the text ----


def test_text_reads_as_input_and_answer_and_the_prompt_is_a_token_prefix():
    tokenizer = build_tiny_base(seed=0)[1]
    for x, y in ((-5.835034, -5.2515), (4.312, 3.8808), (0.5, 0.0), (9.9, 41.37)):
        text = training_text(x, y)
        assert text.startswith("When we have x1=") and text.endswith("@@@")
        found = find_numbers(text)
        assert [n.text for n in found] == [f"{x:.4f}", f"{y:.3f}"]  # "x1" is no number; the answer keeps its sign
        assert found[1].value == pytest.approx(float(f"{y:.3f}"), rel=1e-6)
        prompt_ids = tokenizer(prompt_text(x), add_special_tokens=False)["input_ids"]
        assert tokenizer(text, add_special_tokens=False)["input_ids"][: len(prompt_ids)] == prompt_ids


# ---- the metric ----


def test_rae_by_hand():
    truth = np.array([1.0, 2.0, 3.0, 6.0])  # mean 3: sum |mean - y| = 2 + 1 + 0 + 3 = 6
    assert rae([1.0, 2.0, 4.0, 4.0], truth) == pytest.approx(3 / 6)
    assert rae(np.full(4, 3.0), truth) == pytest.approx(1.0)


def test_lift_rae_drops_errors_beyond_three_rmse():
    truth = np.arange(10.0)  # sum |4.5 - y| = 25
    predicted = truth.copy()
    predicted[3] += 100.0  # RMSE sqrt(1000) = 31.6; 100 > 3 * 31.6: dropped
    predicted[5] += 1.0
    kept = np.delete(truth, 3)
    assert lift_rae(predicted, truth) == pytest.approx(1.0 / np.abs(kept.mean() - kept).sum())
    assert rae(predicted, truth) == pytest.approx(101.0 / 25.0)
    mild = truth + np.array([1.0, -1.0] * 5)  # nothing beyond 3 RMSE: the plain ratio
    assert lift_rae(mild, truth) == pytest.approx(rae(mild, truth)) == pytest.approx(10 / 25)


# ---- bad input ----


def test_non_finite_values_are_refused_by_name():
    with pytest.raises(ValueError, match="the predictions"):
        rae([math.nan, 1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="the input x"):
        prompt_text(math.inf)
    with pytest.raises(ValueError, match="the answer y"):
        training_text(1.0, math.nan)
    with pytest.raises(ValueError, match=r"linear/clean/sim 1: y_train holds a non-finite value"):
        finite("linear/clean/sim 1: y_train", [0.0, -math.inf])
    with pytest.raises(ValueError, match="unknown LIFT function"):
        generate("sine", 1)


def test_a_missing_package_is_named():
    with pytest.raises(ImportError, match="'no_such_package_for_v14'.*the classical baselines"):
        require("no_such_package_for_v14", "the classical baselines")


# ---- baselines ----


def _line_with_outliers() -> LiftData:
    x = np.linspace(-10, 10, 41)
    y = 2 * x + 1
    y[[5, 20, 33]] += (60.0, 45.0, 80.0)  # three gross outliers
    x_test = np.linspace(-9.5, 9.5, 7)
    return LiftData("linear", "outliers", 0, x, y, x[:5], 2 * x[:5] + 1, x_test, 2 * x_test + 1)


def test_polynomial_is_the_cubic_least_squares_fit():
    data = generate("exponential", 2)
    expected = np.polyval(np.polyfit(data.x_train, data.y_train, 3), data.x_test)
    assert fit_predict("poly", data) == pytest.approx(expected, abs=1e-8)


def test_robust_polynomials_ignore_gross_outliers():
    data = _line_with_outliers()
    for method in ("huber", "cauchy"):
        assert fit_predict(method, data) == pytest.approx(data.y_test, abs=0.05), method
    assert np.abs(fit_predict("poly", data) - data.y_test).max() > 1.0  # least squares is pulled away


# ---- CausalQwen's answer ----


def test_causal_answer_is_loc_y_before_the_answer_num():
    torch.manual_seed(0)
    tiny = build_tiny_causal_lm(seed=0, init_seed=0, gate_alpha=1.0)
    x_values = [-5.835, 7.25]
    answers = causal_predictions(tiny.model, tiny.tokenizer, x_values, batch_size=2)
    for x, answer in zip(x_values, answers):
        ids, values = tiny.tokenizer.encode(training_text(x, 3.5))  # another answer: positions before it unchanged
        numbers = [i for i, t in enumerate(ids) if t == tiny.tokenizer.num_token_id]
        assert len(numbers) == 2 and values[numbers[0]] == pytest.approx(x) and values[numbers[1]] == 3.5
        with torch.no_grad():
            loc_y = tiny.model(torch.tensor([ids]), torch.tensor([values])).loc_Y[0]
        assert answer == pytest.approx(float(loc_y[numbers[1] - 1]), rel=1e-5, abs=1e-6)
        assert abs(float(loc_y[numbers[1] - 2]) - answer) > 1e-5


# ---- end to end ----


def test_quick_run_end_to_end(tmp_path):
    result = run(quick=True, out_dir=tmp_path)
    assert result.name == "V14" and result.claims
    assert all(claim.passed for claim in result.claims), [c for c in result.claims if not c.passed]
    assert "Goal 1" in result.body and "Goal 2" in result.body and "Moonshot" in result.body
    for figure in result.figures:
        assert (tmp_path / figure).stat().st_size > 0
    page = write_study(result, [("quick", "yes")], tmp_path)
    assert page.name == "v14.md" and "LIFT" in page.read_text()
    saved = json.loads((tmp_path / "v14_predictions.json").read_text())
    key = "linear/outliers/1"
    assert len(saved["arms"]["CausalQwen"][key]["predicted"]) == 100 and saved["arms"]["CausalQwen"][key]["steps"] == 20
    assert saved["datasets"][key]["y_test"] == generate("linear", 1, "outliers").y_test.tolist()
    assert set(saved["baselines"]) >= {"poly", "huber"}


def test_functions_and_simulations_are_chosen_by_argument_and_checked(tmp_path):
    from validation.v14_lift import QUICK
    from validation.v14_report import chosen_settings

    assert chosen_settings(QUICK, {"functions": ("cosine",)})["functions"] == ("cosine",)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['function'\]"):
        run(True, tmp_path, function=("cosine",))
    with pytest.raises(ValueError, match="unknown function 'sine'"):
        run(True, tmp_path, functions=("sine",))
    with pytest.raises(ValueError, match="unknown condition 'noisy'"):
        chosen_settings({"functions": ("linear",), "conditions": ("clean",)}, {"conditions": ("noisy",)})
