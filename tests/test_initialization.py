"""The initial scale and threshold of a conversion (`causalqwen.initialization`, `from_qwen`).

Oracles: NumPy for the medians and quantiles, SciPy's Cauchy survival function for the OvR probabilities,
the real Qwen2 forward (no cache) for the logits the calibration sampler records, and a directory saved by
the code before the threshold rule existed (``tests/data/saved_directories/main_41679d3``, written by main at 41679d3).
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from causalqwen import CausalQwenConfig, CausalQwenForCausalLM
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.initialization import (
    DRAFT_INIT,
    THRESHOLD_INITS,
    calibration_logits,
    initial_threshold,
    sample_calibration_batch,
    threshold_from_logits,
)

SAVED_WITH_DRAFTS = Path(__file__).parent / "data" / "saved_directories" / "main_41679d3"

finite = st.floats(-50, 50, allow_nan=False, width=32)


@given(st.integers(1, 6), st.integers(2, 9), st.data())
def test_rules_equal_numpy_median_and_quantile(n, v, data):
    logits = np.array(data.draw(st.lists(finite, min_size=n * v, max_size=n * v)), dtype=np.float32).reshape(n, v)
    q = data.draw(st.floats(0.01, 0.99))
    ordered = np.sort(logits.astype(np.float64), axis=1)
    midpoint = np.median((ordered[:, -1] + ordered[:, -2]) / 2)
    quantile = np.quantile(ordered[:, -1], q)  # linear interpolation, NumPy's default
    tensor = torch.from_numpy(logits)
    # torch.median takes the lower of the two middle values for an even count; NumPy averages them
    lower_median = np.sort((ordered[:, -1] + ordered[:, -2]) / 2)[(n - 1) // 2]
    assert threshold_from_logits(tensor, "top_two_midpoint") == pytest.approx(lower_median, abs=1e-9)
    assert (
        min(lower_median, midpoint) <= threshold_from_logits(tensor, "top_two_midpoint") <= max(lower_median, midpoint)
    )
    assert threshold_from_logits(tensor, "top_logit_quantile", q) == pytest.approx(quantile, rel=1e-9, abs=1e-9)


@given(st.lists(st.integers(-5000, 5000), min_size=2, max_size=12, unique=True), st.data())
def test_a_threshold_between_the_top_two_logits_makes_the_ovr_argmax_qwens_argmax(hundredths, data):
    """The reason for the midpoint rule: with l(2) < C < l(1), argmax_k P_k = argmax_k l_k for any scales."""
    logits = np.array(hundredths, dtype=np.float64) / 100
    scales = np.array(data.draw(st.lists(st.floats(1e-3, 1e3), min_size=logits.size, max_size=logits.size)))
    threshold = threshold_from_logits(torch.tensor(logits)[None], "top_two_midpoint")
    ordered = np.sort(logits)
    assert ordered[-2] < threshold < ordered[-1]
    probabilities = stats.cauchy.sf(threshold, loc=logits, scale=scales)  # P(S_k > C)
    assert np.argmax(probabilities) == np.argmax(logits)


def test_the_sampler_records_the_logits_of_a_full_qwen2_forward_and_leaves_the_global_generator_alone():
    base, _ = build_tiny_base(seed=0)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    ids, logits = sample_calibration_batch(base, sequences=3, length=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert ids.shape == (3, 6) and logits.shape == (15, base.config.vocab_size)
    assert (ids[:, 0] == base.config.bos_token_id).all()
    with torch.no_grad():
        full = base(input_ids=ids[:, :-1]).logits  # [3, 5, V], no cache
    torch.testing.assert_close(logits.view(5, 3, -1).transpose(0, 1), full, rtol=1e-5, atol=1e-5)
    again_ids, again_logits = sample_calibration_batch(base, sequences=3, length=5)
    assert torch.equal(again_ids, ids) and torch.equal(again_logits, logits)


def test_from_qwen_defaults_are_the_calibrated_ones_and_the_threshold_is_the_rule_on_the_bases_own_text():
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    config = tiny.model.config
    assert config.abduction_scale_init == CausalQwenConfig.abduction_scale_init == 0.1
    assert config.ovr_threshold_init == CausalQwenConfig.ovr_threshold_init == "top_two_midpoint"
    _, logits = sample_calibration_batch(tiny.qwen, vocab_limit=tiny.tokenizer.num_token_id)
    top = np.sort(logits.double().numpy(), axis=1)[:, -2:]
    middle = (top[:, 0] + top[:, 1]) / 2
    assert config.ovr_threshold == pytest.approx(np.sort(middle)[(len(middle) - 1) // 2], abs=1e-9)
    assert tiny.model.ovr_threshold == config.ovr_threshold
    with torch.no_grad():
        scale_U = tiny.model(input_ids=torch.tensor([[5, 17, 40]])).scale_U
    torch.testing.assert_close(scale_U, torch.full_like(scale_U, 0.1), rtol=1e-6, atol=0)


def test_drafts_values_stay_reachable_and_a_fixed_threshold_is_taken_as_given():
    base, tokenizer = build_tiny_base(seed=0)
    num = len(tokenizer)
    drafts = CausalQwenForCausalLM.from_qwen(base, num_token_id=num, **DRAFT_INIT)
    assert (drafts.config.abduction_scale_init, drafts.config.ovr_threshold, drafts.config.ovr_threshold_init) == (
        10.0,
        100.0,
        "fixed",
    )
    fixed = CausalQwenForCausalLM.from_qwen(base, num_token_id=num, ovr_threshold=7.5)
    assert (fixed.config.ovr_threshold, fixed.config.ovr_threshold_init, fixed.config.abduction_scale_init) == (
        7.5,
        "fixed",
        0.1,
    )
    assert set(THRESHOLD_INITS) == {"top_two_midpoint", "top_logit_quantile", "fixed"}


def test_a_calibration_batch_counts_text_positions_only():
    base, tokenizer = build_tiny_base(seed=1)
    num = len(tokenizer)
    ids = torch.tensor([[5, 9, num, 12, 0], [7, 8, 3, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        full = base(input_ids=ids, attention_mask=mask).logits
    text = mask.bool() & (ids != num)
    expected = full[text]
    torch.testing.assert_close(calibration_logits(base, {"input_ids": ids, "attention_mask": mask}, num), expected)
    batch = {"input_ids": ids, "attention_mask": mask}
    model = CausalQwenForCausalLM.from_qwen(
        base, num_token_id=num, calibration=batch, ovr_threshold_init="top_logit_quantile", ovr_threshold_quantile=0.25
    )
    top = expected.double().max(dim=-1).values.numpy()
    assert model.config.ovr_threshold == pytest.approx(np.quantile(top, 0.25), rel=1e-9)
    assert model.config.ovr_threshold_quantile == 0.25


@pytest.mark.parametrize(
    "overrides, calibration, message",
    [
        (dict(ovr_threshold_init="top_logit"), None, "ovr_threshold_init must be one of"),
        (dict(ovr_threshold_init=None), None, "ovr_threshold_init must be one of"),
        (dict(ovr_threshold_init="top_logit_quantile", ovr_threshold_quantile=1.0), None, "ovr_threshold_quantile"),
        (
            dict(ovr_threshold_init="top_logit_quantile", ovr_threshold_quantile=float("nan")),
            None,
            "ovr_threshold_quantile",
        ),
        (dict(abduction_scale_init=0.0), None, "abduction_scale_init"),
        (dict(abduction_scale_init=-0.1), None, "abduction_scale_init"),
        (dict(abduction_scale_init=float("inf")), None, "abduction_scale_init"),
        (dict(abduction_scale_init=float("nan")), None, "abduction_scale_init"),
        (dict(ovr_threshold=5.0, ovr_threshold_init="top_two_midpoint"), None, "pass one of them"),
        (dict(ovr_threshold=5.0), {"input_ids": torch.tensor([[1, 2]])}, "calibration is read by a threshold rule"),
        (dict(), {"input_ids": torch.tensor([[1, 2]]), "attention_mask": torch.tensor([[0, 0]])}, "no text positions"),
        (dict(), "some text", "calibration must be a mapping"),
        (dict(), {"input_ids": torch.tensor([[1.0, 2.0]])}, "integer tensor"),
        (dict(), {"input_ids": torch.tensor([[1, 10**6]])}, "must lie in"),
        (dict(), {"input_ids": torch.tensor([[1, 2]]), "mask": torch.tensor([[1, 1]])}, "unknown key"),
        (dict(), {"inputs_ids": torch.tensor([[1, 2]])}, "calibration has no input_ids .its keys: 'inputs_ids'"),
        (dict(ovr_threshold_init="fixed"), None, "pass ovr_threshold"),
        (dict(ovr_threshold_quantile=0.9), None, "ovr_threshold_quantile is read by the rule"),
        (dict(ovr_threshold=5.0, ovr_threshold_quantile=0.9), None, "ovr_threshold_quantile is read by the rule"),
    ],
)
def test_bad_initialization_settings_are_refused_by_name(overrides, calibration, message):
    base, tokenizer = build_tiny_base(seed=0)
    with pytest.raises((ValueError, TypeError), match=message):
        CausalQwenForCausalLM.from_qwen(base, num_token_id=len(tokenizer), calibration=calibration, **overrides)


def test_a_calibration_batch_of_numbers_only_is_refused():
    base, tokenizer = build_tiny_base(seed=0)
    num = len(tokenizer)
    with pytest.raises(ValueError, match="no text positions"):
        initial_threshold(
            base, "top_two_midpoint", calibration={"input_ids": torch.full((2, 3), num)}, num_token_id=num
        )


def test_the_calibrated_values_are_the_configs_alone_and_the_drafts_are_draft_init():
    """One set of defaults: `causalqwen.initialization` holds no table of config values but the drafts' (`DRAFT_INIT`,
    every value unlike the config's); the calibrated ones are `CausalQwenConfig`'s class defaults, which a conversion
    reads (a table repeating them, as ``DEFAULT_INIT`` did, is a second set)."""
    import causalqwen.initialization as initialization

    fields = set(CausalQwenConfig().to_dict())
    tables = {
        name: value
        for name, value in vars(initialization).items()
        if isinstance(value, dict) and value and set(value) <= fields
    }
    assert tables == {"DRAFT_INIT": DRAFT_INIT}
    assert all(value != getattr(CausalQwenConfig, name) for name, value in DRAFT_INIT.items())


def test_a_config_refuses_an_unknown_rule_and_starts_where_from_qwen_does():
    with pytest.raises(ValueError, match="ovr_threshold_init"):
        CausalQwenConfig(num_token_id=3, ovr_threshold_init="median")
    config = CausalQwenConfig(num_token_id=3)
    assert (config.abduction_scale_init, config.ovr_threshold_init, config.ovr_threshold) == (
        0.1,
        "top_two_midpoint",
        0.0,
    )


def test_a_directory_saved_with_the_drafts_values_loads_with_them():
    config_text = (SAVED_WITH_DRAFTS / "config.json").read_text()
    assert "ovr_threshold_init" not in config_text  # written before the field existed
    model = CausalQwenForCausalLM.from_pretrained(SAVED_WITH_DRAFTS).eval()
    assert (model.config.abduction_scale_init, model.config.ovr_threshold, model.config.ovr_threshold_init) == (
        10.0,
        100.0,
        "fixed",
    )
    ids = torch.tensor([[5, 17, 40, 2, 9]])
    with torch.no_grad():
        output = model(input_ids=ids)
        probabilities = model.action.probabilities(model.action(output.loc_U, output.scale_U))
    loc_S, scale_S = output.loc_S.double().numpy(), output.scale_S.double().numpy()
    np.testing.assert_allclose(
        probabilities.double().numpy(), stats.cauchy.sf(100.0, loc=loc_S, scale=scale_S), rtol=1e-5, atol=1e-7
    )
    torch.testing.assert_close(output.scale_U, torch.full_like(output.scale_U, 10.0), rtol=1e-6, atol=0)


def test_the_bases_own_text_holds_no_reserved_row_and_no_num_and_a_users_mask_is_left_alone():
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    num = tiny.tokenizer.num_token_id
    ids, logits = sample_calibration_batch(tiny.qwen, vocab_limit=num)
    assert int(ids[:, 1:].max()) < num and logits.shape[-1] == tiny.qwen.config.vocab_size  # the full rows
    batch = tiny.tokenizer(["The price is 12.5 yuan.", "A week has 7 days."])
    mask = batch["attention_mask"].bool()
    before = mask.clone()
    from_bool = CausalQwenForCausalLM.from_qwen(
        tiny.qwen, num_token_id=num, calibration={"input_ids": batch["input_ids"], "attention_mask": mask}
    )
    assert torch.equal(mask, before)
    from_long = CausalQwenForCausalLM.from_qwen(
        tiny.qwen, num_token_id=num, calibration={"input_ids": batch["input_ids"], "attention_mask": before.long()}
    )
    assert from_bool.config.ovr_threshold == from_long.config.ovr_threshold


@pytest.fixture
def transformers_progress_bars():
    """transformers' progress-bar switch, put back as it was after the test."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    yield transformers_logging
    if was_enabled:
        transformers_logging.enable_progress_bar()
    else:
        transformers_logging.disable_progress_bar()


def test_the_calibration_shows_a_progress_bar_on_stderr_that_follows_transformers_switch(
    transformers_progress_bars, capsys
):
    base, _ = build_tiny_base(seed=0)
    transformers_progress_bars.enable_progress_bar()
    shown = sample_calibration_batch(base, sequences=2, length=4)
    captured = capsys.readouterr()
    assert captured.out == "" and "calibration: 100%" in captured.err and "4/4" in captured.err
    silenced = sample_calibration_batch(base, sequences=2, length=4, progress=False)
    assert capsys.readouterr().err == ""
    transformers_progress_bars.disable_progress_bar()  # transformers' own switch turns it off ...
    quiet = sample_calibration_batch(base, sequences=2, length=4)
    assert capsys.readouterr().err == ""
    forced = sample_calibration_batch(base, sequences=2, length=4, progress=True)  # ... and progress=True on
    assert "calibration: 100%" in capsys.readouterr().err
    for ids, logits in (silenced, quiet, forced):  # the bar draws nothing from the sampler's generator
        assert torch.equal(ids, shown[0]) and torch.equal(logits, shown[1])
    for wrong in ("yes", 1, 0.0):
        with pytest.raises(TypeError, match=f"progress must be True, False or None, got {wrong!r}"):
            sample_calibration_batch(base, sequences=1, length=1, progress=wrong)


def test_from_qwen_and_convert_show_the_calibration_bar_unless_transformers_bars_are_off(
    transformers_progress_bars, qwen_dir, tmp_path, capsys
):
    from causalqwen.app import cli

    transformers_progress_bars.enable_progress_bar()
    assert cli.main(["convert", "--base", qwen_dir, "--out", str(tmp_path / "shown")]) == 0
    captured = capsys.readouterr()
    assert "calibration: 100%" in captured.err and "calibration" not in captured.out
    assert "conversion: 100%" in captured.err and "3/3" in captured.err  # building, casting, copying the weights
    base, hf_tokenizer = build_tiny_base(seed=0)
    CausalQwenForCausalLM.from_qwen(base, num_token_id=len(hf_tokenizer))
    err = capsys.readouterr().err
    assert "calibration: 100%" in err and "conversion: 100%" in err
    transformers_progress_bars.disable_progress_bar()
    assert cli.main(["convert", "--base", qwen_dir, "--out", str(tmp_path / "quiet")]) == 0
    CausalQwenForCausalLM.from_qwen(base, num_token_id=len(hf_tokenizer))
    err = capsys.readouterr().err
    assert "calibration" not in err and "conversion" not in err
