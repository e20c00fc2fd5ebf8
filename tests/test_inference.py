"""The five inference modes (decision D11) against SciPy, float64 oracles and direct sort-based computations."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from causalqwen import cauchy
from causalqwen.action import ActionNetwork, ovr_token
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.inference import (
    DECISION_MODES,
    MODES,
    check_law_of_U,
    decision_input,
    draw_standard_cauchy,
    draw_uniform,
    predict,
    predicted_value,
    sample_token,
    traditional_probabilities,
)
from causalqwen.initialization import DRAFT_INIT, sample_calibration_batch

C, V = 8, 12


def _action(seed=0, noise=0.1, dtype=torch.float64):
    torch.manual_seed(seed)
    action = ActionNetwork(C, V, noise_init=noise).to(dtype)
    with torch.no_grad():
        action.classification_head.weight.normal_()
        action.classification_head.bias.normal_()
        action.b_noise.uniform_(0.05, 2.0)
    return action


def _law(shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    loc_U = torch.randn(*shape, C, generator=g, dtype=dtype) * 3
    scale_U = torch.rand(*shape, C, generator=g, dtype=dtype) * 5 + 0.1
    return loc_U, scale_U


# ---- decision inputs ----


def test_standard_decision_equals_the_noise_infused_forward():
    action = _action()
    loc_U, scale_U = _law((4, 3))
    loc, scale = decision_input("standard", loc_U, scale_U, action.noise_scale)
    torch.testing.assert_close(scale, scale_U + action.b_noise.abs(), rtol=0, atol=0)
    for got, want in zip(action.decide(loc, scale), action(loc_U, scale_U)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_causal_individual_is_standard_cauchy_around_loc_U():
    """(u - loc_U) / scale_U ~ Cauchy(0, 1): SciPy KS on 24,000 draws, and per component on 4,000 each."""
    loc_U, scale_U = _law((4000,), seed=3)
    generator = torch.Generator().manual_seed(12345)
    u, scale = decision_input("causal", loc_U, scale_U, torch.full((C,), 0.3, dtype=torch.float64), generator=generator)
    standardized = ((u - loc_U) / scale_U).numpy()  # [4000, C]
    assert stats.kstest(standardized[:, :6].ravel(), stats.cauchy.cdf).pvalue > 0.01
    for component in range(C):
        assert stats.kstest(standardized[:, component], stats.cauchy.cdf).pvalue > 0.001
    # the components are independent: no rank correlation between two of them
    assert abs(stats.spearmanr(standardized[:, 0], standardized[:, 1]).statistic) < 0.05
    torch.testing.assert_close(scale, torch.full_like(u, 0.3))


def test_causal_decision_scales_are_the_noise_alone():
    """scale_S = |W_cls| |b_noise| and scale_Y = |w_reg| . |b_noise| (float64 NumPy oracle)."""
    action = _action(seed=1)
    loc_U, scale_U = _law((5,), seed=1)
    loc, scale = decision_input(
        "causal", loc_U, scale_U, action.noise_scale, generator=torch.Generator().manual_seed(0)
    )
    decision = action.decide(loc, scale)
    W = action.classification_head.weight.detach().numpy()
    w = action.regression_head.weight.detach().numpy()[0]
    noise = np.abs(action.b_noise.detach().numpy())
    np.testing.assert_allclose(
        decision.scale_S.detach().numpy(), np.broadcast_to(np.abs(W) @ noise, (5, V)), rtol=1e-12
    )
    np.testing.assert_allclose(decision.scale_Y.detach().numpy(), np.full(5, np.abs(w) @ noise), rtol=1e-12)
    np.testing.assert_allclose(
        decision.loc_S.detach().numpy(),
        loc.numpy() @ W.T + action.classification_head.bias.detach().numpy(),
        rtol=1e-12,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_mode_with_zero_noise_gives_no_nan(dtype):
    action = _action(dtype=dtype)
    with torch.no_grad():
        action.b_noise.zero_()
    loc_U, scale_U = _law((6,), dtype=dtype)
    loc, scale = decision_input(
        "causal", loc_U, scale_U, action.noise_scale, generator=torch.Generator().manual_seed(0)
    )
    decision = action.decide(loc, scale)
    eps = torch.full((C,), action.scale_eps, dtype=dtype)  # the input scale, clamped (D10)
    expected_scale_S = (action.classification_head.weight.abs() @ eps).clamp_min(action.scale_eps)
    torch.testing.assert_close(decision.scale_S, expected_scale_S.expand(6, V))
    torch.testing.assert_close(
        decision.scale_Y, (action.regression_head.weight.abs() @ eps).clamp_min(action.scale_eps).expand(6)
    )
    tokens, values = predict(decision.loc_S, decision.scale_S, decision.loc_Y, 0.5, num_token_id=3)
    loc_S, scale_S = decision.loc_S.detach().double().numpy(), decision.scale_S.detach().double().numpy()
    log_p = stats.cauchy.logsf(0.5, loc=loc_S, scale=scale_S)  # P_k rounds to 0 or 1 at these tiny scales
    np.testing.assert_array_equal(tokens.numpy(), log_p.argmax(-1))
    expected = np.where(log_p.argmax(-1) == 3, decision.loc_Y.detach().double().numpy(), 0.0)
    np.testing.assert_allclose(values.detach().double().numpy(), expected, rtol=0, atol=0)


def test_given_uniform_is_the_inverse_cdf_of_scipy():
    loc_U, scale_U = _law((3,), seed=2)
    uniform = torch.tensor([1e-12, 0.01, 0.25, 0.5, 0.6, 0.75, 0.999, 1 - 1e-12], dtype=torch.float64).expand(3, C)
    u, _ = decision_input("shared_individual", loc_U, scale_U, torch.ones(C, dtype=torch.float64), uniform=uniform)
    expected = stats.cauchy.ppf(uniform.numpy(), loc=loc_U.numpy(), scale=scale_U.numpy())
    np.testing.assert_allclose(u.numpy(), expected, rtol=1e-13, atol=1e-13)


def test_shared_noise_shifts_the_location_and_keeps_the_scale():
    action = _action(seed=4)
    loc_U, scale_U = _law((7,), seed=4)
    noise = torch.tensor([-1e3, -2.0, -0.5, 0.0, 0.1, 1.0, 3.0, 1e6], dtype=torch.float64)
    loc, scale = decision_input("shared_noise", loc_U, scale_U, action.noise_scale, noise=noise)
    torch.testing.assert_close(loc - loc_U, (action.b_noise.abs() * noise).detach().expand(7, C), rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(scale, scale_U, rtol=0, atol=0)


def test_drawn_shared_noise_is_standard_cauchy():
    noise = draw_standard_cauchy((30000,), generator=torch.Generator().manual_seed(7))
    assert noise.dtype == torch.float64 and torch.isfinite(noise).all()
    assert stats.kstest(noise.numpy(), stats.cauchy.cdf).pvalue > 0.01


def test_drawn_uniform_is_uniform_strictly_inside_the_unit_interval():
    uniform = draw_uniform((30000,), generator=torch.Generator().manual_seed(8))
    assert bool(((uniform > 0) & (uniform < 1)).all())
    assert stats.kstest(uniform.numpy(), stats.uniform.cdf).pvalue > 0.01
    # the grid (2k + 1) 2^-53 is symmetric: 1 - u is on it too, and both ends map to finite values
    ends = torch.tensor([2.0**-53, 1 - 2.0**-53], dtype=torch.float64)
    u, _ = decision_input(
        "causal",
        torch.zeros(2, 1, dtype=torch.float64),
        torch.ones(2, 1, dtype=torch.float64),
        torch.ones(1),
        uniform=ends[:, None],
    )
    assert torch.isfinite(u).all() and u[0, 0] == -u[1, 0]


def test_same_generator_seed_gives_the_same_draws():
    loc_U, scale_U = _law((3,))
    for mode in ("causal", "shared_individual", "shared_noise"):
        a = decision_input(mode, loc_U, scale_U, torch.ones(C), generator=torch.Generator().manual_seed(5))
        b = decision_input(mode, loc_U, scale_U, torch.ones(C), generator=torch.Generator().manual_seed(5))
        c = decision_input(mode, loc_U, scale_U, torch.ones(C), generator=torch.Generator().manual_seed(6))
        assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_decision_input_rejects_bad_input():
    loc_U, scale_U = _law((2,))
    noise_scale = torch.ones(C, dtype=torch.float64)
    with pytest.raises(ValueError, match="unknown inference mode 'greedy'") as error:
        decision_input("greedy", loc_U, scale_U, noise_scale)
    assert all(mode in str(error.value) for mode in DECISION_MODES)
    with pytest.raises(ValueError, match="unknown inference mode 'traditional'"):
        decision_input("traditional", loc_U, scale_U, noise_scale)  # not a decision-input mode
    for bad in (0.0, 1.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"uniform must lie strictly inside \(0, 1\)"):
            decision_input("causal", loc_U, scale_U, noise_scale, uniform=torch.full((C,), bad, dtype=torch.float64))
    with pytest.raises(TypeError, match="uniform must be a floating-point tensor"):
        decision_input("causal", loc_U, scale_U, noise_scale, uniform=torch.ones(C, dtype=torch.long))
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="noise must be finite"):
            decision_input("shared_noise", loc_U, scale_U, noise_scale, noise=torch.full((C,), bad))


@pytest.mark.parametrize("mode", DECISION_MODES)
def test_decision_input_without_validation_gives_the_same_draws_and_numbers(mode):
    """`decision_input` under ``cauchy.validation(False)`` (a caller that has checked) skips only the checks."""
    loc_U, scale_U = _law((3,), seed=6)
    noise_scale = torch.full((C,), 0.4, dtype=torch.float64)
    checked = decision_input(mode, loc_U, scale_U, noise_scale, generator=torch.Generator().manual_seed(2))
    with cauchy.validation(False):
        trusted = decision_input(mode, loc_U, scale_U, noise_scale, generator=torch.Generator().manual_seed(2))
        decision_input(mode, loc_U, scale_U, -noise_scale)  # not looked at
    assert torch.equal(checked[0], trusted[0]) and torch.equal(checked[1], trusted[1])
    with pytest.raises(ValueError, match="noise_scale must be >= 0"):
        decision_input(mode, loc_U, scale_U, -noise_scale)


@pytest.mark.parametrize(
    "loc_U,scale_U,noise_scale,error,match",
    [
        (torch.zeros(2, 4), torch.ones(2, 4), [0.1] * 4, TypeError, "noise_scale must be a floating-point tensor"),
        (
            torch.zeros(2, 4),
            torch.ones(2, 3),
            torch.ones(4),
            ValueError,
            r"loc_U and scale_U must have one shape \[\.\.\., C\]",
        ),
        (torch.zeros(()), torch.ones(()), torch.ones(4), ValueError, "loc_U and scale_U must have one shape"),
        (
            torch.zeros(2, 4, dtype=torch.long),
            torch.ones(2, 4),
            torch.ones(4),
            TypeError,
            "loc_U must be a floating-point",
        ),
        (torch.zeros(2, 4), torch.full((2, 4), -1.0), torch.ones(4), ValueError, "scale_U must be >= 0 everywhere"),
        (
            torch.zeros(2, 4),
            torch.ones(2, 4),
            torch.ones(3),
            ValueError,
            r"noise_scale must have shape \[C\] = \(4,\), got \(3,\)",
        ),
        (
            torch.zeros(2, 4),
            torch.ones(2, 4),
            torch.full((4,), -0.5),
            ValueError,
            "noise_scale must be >= 0 everywhere",
        ),
    ],
)
def test_the_law_of_U_is_checked_at_the_door(loc_U, scale_U, noise_scale, error, match):
    with pytest.raises(error, match=match):
        check_law_of_U(loc_U, scale_U, noise_scale)
    with pytest.raises(error, match=match):
        decision_input("standard", loc_U, scale_U, noise_scale)


# ---- prediction ----


@given(seed=st.integers(0, 10_000), num_token_id=st.integers(0, V - 1))
def test_ovr_token_and_predicted_value_are_the_literal_argmax_and_loc_Y_at_num(seed, num_token_id):
    """The trusted pieces of `predict`, one row at a time: argmax_k P_k (SciPy), and loc_Y where it is <NUM>."""
    g = torch.Generator().manual_seed(seed)
    loc_S = torch.randn(9, V, generator=g, dtype=torch.float64) * 10
    loc_S[::3, num_token_id] += 60  # a third of the rows predict <NUM>
    scale_S = torch.rand(9, V, generator=g, dtype=torch.float64) * 20 + 1e-3
    loc_Y = torch.randn(9, generator=g, dtype=torch.float64)
    threshold = torch.linspace(-5, 5, V, dtype=torch.float64)
    probabilities = stats.cauchy.sf(threshold.numpy(), loc=loc_S.numpy(), scale=scale_S.numpy())
    top_two = np.sort(probabilities, axis=-1)[:, -2:]
    assume(np.all(top_two[:, 1] - top_two[:, 0] > 1e-12 * top_two[:, 1]))
    token = ovr_token(loc_S, scale_S, threshold)
    value = predicted_value(token, loc_Y, num_token_id)
    for row in range(9):
        best = int(np.argmax(probabilities[row]))
        assert int(token[row]) == best
        assert float(value[row]) == (float(loc_Y[row]) if best == num_token_id else 0.0)
    assert torch.equal(predict(loc_S, scale_S, loc_Y, threshold, num_token_id)[0], token)


@given(seed=st.integers(0, 10_000), threshold=st.sampled_from([-5.0, 0.0, 3.0, 100.0]))
def test_predict_is_the_argmax_of_scipy_ovr_probabilities(seed, threshold):
    g = torch.Generator().manual_seed(seed)
    loc_S = torch.randn(6, V, generator=g, dtype=torch.float64) * 10
    scale_S = torch.rand(6, V, generator=g, dtype=torch.float64) * 20 + 1e-3
    loc_Y = torch.randn(6, generator=g, dtype=torch.float64)
    probabilities = stats.cauchy.sf(threshold, loc=loc_S.numpy(), scale=scale_S.numpy())  # [6, V]
    top_two = np.sort(probabilities, axis=-1)[:, -2:]
    assume(np.all(top_two[:, 1] - top_two[:, 0] > 1e-12 * top_two[:, 1]))  # no near-ties
    tokens, values = predict(loc_S, scale_S, loc_Y, threshold, num_token_id=2)
    np.testing.assert_array_equal(tokens.numpy(), probabilities.argmax(-1))
    np.testing.assert_array_equal(values.numpy(), np.where(probabilities.argmax(-1) == 2, loc_Y.numpy(), 0.0))


def test_argmax_probability_can_differ_from_argmax_location():
    """A wide class with a lower location can clear the threshold more often than a narrow one."""
    loc_S = torch.tensor([[5.0, 4.0, -3.0]])
    scale_S = torch.tensor([[1.0, 100.0, 1.0]])
    tokens, _ = predict(loc_S, scale_S, torch.zeros(1), 10.0, num_token_id=0)
    p = stats.cauchy.sf(10.0, loc=loc_S.numpy(), scale=scale_S.numpy())
    assert p[0, 1] > p[0, 0] and tokens.item() == 1 and loc_S.argmax().item() == 0


def test_standard_prediction_differs_from_qwen_greedy_at_initialization():
    """The equivalence theorem covers loc_S = logits, not argmax P: scales differ per class. With the drafts'
    threshold C = 100, far above every logit, the decision drifts to the classes with large row norms."""
    model, numeric, qwen = build_tiny_causal_lm(seed=0, **DRAFT_INIT)
    batch = numeric(["the market grew by a third and the price of tea", "hello world"], padding_side="right")
    with torch.no_grad():
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        logits = qwen(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out.loc_S[real], logits[real], rtol=0, atol=0)
    tokens, _ = predict(out.loc_S, out.scale_S, out.loc_Y, model.ovr_threshold, model.config.num_token_id)
    assert (tokens != logits.argmax(-1))[real].any()


def test_at_the_calibrated_defaults_the_standard_prediction_is_mostly_qwens_greedy_token():
    """D14's threshold lies between the top two logits at a typical position of the base's own text, where
    argmax P is the greedy token; the drafts' C = 100 is far from that (V3 and V10 measure it on a trained base)."""
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    ids, _ = sample_calibration_batch(tiny.qwen, vocab_limit=tiny.tokenizer.num_token_id)  # the rule's text
    agreement = {}
    for name, threshold in (("calibrated", tiny.model.ovr_threshold), ("drafts", 100.0)):
        with torch.no_grad():  # a sampled id of the <NUM> row is the base's token there: value 0, as the base saw it
            out = tiny.model(ids, numeric_values=torch.zeros(ids.shape))
        tokens, _ = predict(out.loc_S, out.scale_S, out.loc_Y, threshold, tiny.model.config.num_token_id)
        agreement[name] = float((tokens == out.loc_S.argmax(-1)).double().mean())
    assert agreement["calibrated"] >= 0.9 and agreement["calibrated"] - agreement["drafts"] >= 0.3, agreement


# ---- traditional sampling ----


def _reference_filter(probs: list[float], top_k: int, top_p: float) -> list[float]:
    """Top-k, then top-p, by sorting Python floats, one class at a time."""
    order = sorted(range(len(probs)), key=lambda k: -probs[k])
    keep = set(order[:top_k] if top_k else order)
    probs = [p if k in keep else 0.0 for k, p in enumerate(probs)]
    total = sum(probs)
    probs = [p / total for p in probs]
    if top_p < 1:
        kept, mass = set(), 0.0
        for k in order:
            if k in keep and mass < top_p:
                kept.add(k)
                mass += probs[k]
        probs = [p if k in kept else 0.0 for k, p in enumerate(probs)]
        total = sum(probs)
        probs = [p / total for p in probs]
    return probs


@given(
    seed=st.integers(0, 10_000),
    temperature=st.sampled_from([0.3, 1.0, 2.5]),
    top_k=st.integers(0, V + 2),
    top_p=st.sampled_from([0.05, 0.3, 0.5, 0.9, 0.99, 1.0]),
)
def test_top_k_top_p_sets_match_a_sort_based_computation(seed, temperature, top_k, top_p):
    g = torch.Generator().manual_seed(seed)
    loc_S = torch.randn(V, generator=g, dtype=torch.float64) * 3
    softmax = torch.softmax(loc_S / temperature, dim=-1).tolist()
    if top_k:  # keep the boundary away from exact ties with the top-p threshold
        top = sorted(softmax, reverse=True)[:top_k]
        softmax_k = [p / sum(top) for p in top]
    else:
        softmax_k = sorted(softmax, reverse=True)
    cumulative = np.cumsum(softmax_k)
    assume(np.all(np.abs(cumulative - top_p) > 1e-9))
    probs = traditional_probabilities(loc_S, temperature, top_k, top_p)
    expected = _reference_filter(softmax, top_k, top_p)
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-10, atol=1e-15)
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-12)
    np.testing.assert_array_equal(probs.numpy() > 0, np.array(expected) > 0)


def test_ovr_normalization_is_probabilities_over_their_sum():
    g = torch.Generator().manual_seed(0)
    loc_S = torch.randn(3, V, generator=g, dtype=torch.float64) * 50
    scale_S = torch.rand(3, V, generator=g, dtype=torch.float64) * 10 + 0.1
    probs = traditional_probabilities(loc_S, scale_S=scale_S, threshold=20.0, normalize="ovr")
    p = stats.cauchy.sf(20.0, loc=loc_S.numpy(), scale=scale_S.numpy())
    np.testing.assert_allclose(probs.numpy(), p / p.sum(-1, keepdims=True), rtol=1e-12)
    sharper = traditional_probabilities(loc_S, temperature=0.5, scale_S=scale_S, threshold=20.0, normalize="ovr")
    np.testing.assert_allclose(sharper.numpy(), p**2 / (p**2).sum(-1, keepdims=True), rtol=1e-10)


def test_top_k_one_is_greedy_and_sums_to_one_in_float32():
    loc_S = torch.randn(4, 5, V)
    probs = traditional_probabilities(loc_S, top_k=1)
    assert torch.equal(probs.argmax(-1), loc_S.argmax(-1)) and torch.all(probs.max(-1).values == 1)
    full = traditional_probabilities(loc_S, temperature=0.7, top_p=0.8)
    torch.testing.assert_close(full.sum(-1), torch.ones(4, 5))


def test_sample_token_follows_the_probabilities():
    """Chi-square (SciPy) of 20,000 categorical draws against the probabilities."""
    probs = torch.tensor([0.5, 0.25, 0.125, 0.1, 0.025, 0.0])
    draws = sample_token(probs.expand(20000, 6), generator=torch.Generator().manual_seed(0))
    counts = np.bincount(draws.numpy(), minlength=6)
    assert counts[5] == 0
    assert stats.chisquare(counts[:5], 20000 * probs[:5].numpy()).pvalue > 0.001


def test_traditional_probabilities_reject_bad_input():
    loc_S = torch.randn(V)
    for temperature in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            traditional_probabilities(loc_S, temperature=temperature)
    for top_p in (0.0, -0.5, 1.01, math.nan):
        with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]"):
            traditional_probabilities(loc_S, top_p=top_p)
    for top_k in (-1, 2.5, True):
        with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
            traditional_probabilities(loc_S, top_k=top_k)
    with pytest.raises(ValueError, match='normalize="ovr" needs scale_S and threshold'):
        traditional_probabilities(loc_S, normalize="ovr")
    with pytest.raises(ValueError, match='normalize must be "softmax" or "ovr"'):
        traditional_probabilities(loc_S, normalize="sparsemax")


def test_traditional_probabilities_without_validation_gives_the_same_distribution():
    g = torch.Generator().manual_seed(3)
    loc_S, scale_S = torch.randn(4, V, generator=g) * 5, torch.rand(4, V, generator=g) + 0.1
    for normalize in ("softmax", "ovr"):
        checked = traditional_probabilities(loc_S, 0.7, 5, 0.8, scale_S=scale_S, threshold=1.0, normalize=normalize)
        with cauchy.validation(False):
            trusted = traditional_probabilities(loc_S, 0.7, 5, 0.8, scale_S=scale_S, threshold=1.0, normalize=normalize)
        assert torch.equal(checked, trusted)
    with cauchy.validation(False):
        traditional_probabilities(loc_S, 0.7, 5, 0.8, scale_S=-scale_S, threshold=1.0, normalize="ovr")
    with pytest.raises(ValueError, match="scale must be > 0"):
        traditional_probabilities(loc_S, 0.7, 5, 0.8, scale_S=-scale_S, threshold=1.0, normalize="ovr")
    with pytest.raises(TypeError):  # past top_p the arguments are keyword-only
        traditional_probabilities(loc_S, 1.0, 0, 1.0, scale_S)


def test_modes_are_the_five_of_the_spec():
    assert MODES == ("standard", "causal", "shared_individual", "shared_noise", "traditional")
