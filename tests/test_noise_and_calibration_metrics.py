"""The exogenous noise in the metrics, and the causal OvR sums: against NumPy, SciPy and an independent Monte Carlo."""

import numpy as np
import pytest
import torch
from scipy import stats

from causalqwen import train
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.metrics import (
    TrainerMetrics,
    causal_ovr_sums,
    evaluate_batch,
    noise_statistics,
    with_log_prefixes,
)
from causalqwen.training import TrainingConfig

SIGNED_NOISE = [0.3, -0.05, 0.2, -0.7, 0.01, -0.4, 0.15, 0.6]  # |b_noise| cycles through these, signs mixed


def _model_with_signed_noise():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    with torch.no_grad():
        size = model.config.causal_size
        model.action.b_noise.copy_(torch.tensor(SIGNED_NOISE * (size // len(SIGNED_NOISE) + 1))[:size])
    return model.eval(), tokenizer


def _batch(tokenizer, n=6, seed=3):
    return collate(TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=32).items, tokenizer.pad_token_id)


def test_noise_statistics_are_the_absolute_noise_against_numpy():
    noise = torch.tensor([-0.3, 0.1, 0.25, -0.05, 0.6])
    scale_U = torch.rand(4, 7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.01
    absolute = np.abs(noise.double().numpy())
    assert noise_statistics(noise.abs(), scale_U) == {
        "noise_scale_mean": pytest.approx(absolute.mean(), rel=1e-7),
        "noise_scale_median": pytest.approx(0.25, rel=1e-7),
        "noise_scale_over_U_scale": pytest.approx(0.25 / np.median(scale_U.numpy()), rel=1e-7),
    }
    empty = noise_statistics(noise.abs(), torch.empty(0, 5))  # no row: the ratio is undefined, reported as 0
    assert empty["noise_scale_over_U_scale"] == 0.0 and empty["noise_scale_median"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"noise_scale must be >= 0 everywhere \(it is \|b_noise\|\), found -0.3"):
        noise_statistics(noise, scale_U)


def test_evaluate_batch_reports_the_noise_against_the_scale_of_U_at_real_tokens():
    model, tokenizer = _model_with_signed_noise()
    batch = _batch(tokenizer)
    metrics = evaluate_batch(model, batch, causal_draws=1)
    with torch.no_grad():
        law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    real = batch["attention_mask"].numpy().astype(bool)  # [B, S]
    scales = law.scale_U.double().numpy()[real]  # [N, C]
    noise = np.abs(model.action.b_noise.detach().double().numpy())
    assert metrics["noise_scale_mean"] == pytest.approx(noise.mean(), rel=1e-7)
    assert metrics["noise_scale_median"] == pytest.approx(np.median(noise), rel=1e-7)
    assert metrics["noise_scale_over_U_scale"] == pytest.approx(np.median(noise) / np.median(scales), rel=1e-7)
    logged = with_log_prefixes(metrics)
    assert {"dist/noise_scale_mean", "dist/noise_scale_over_U_scale", "dist/ovr_prob_sum_causal_error"} <= set(logged)
    assert "dist/ovr_causal_draws" in logged and logged["dist/ovr_causal_draws"] == 1


def _monte_carlo_oracle(model, loc_U, scale_U, draws, seed):
    """``[D, N]`` sums of P_k for individuals u ~ Cauchy(loc_U, scale_U) drawn by NumPy, in float64 with SciPy."""
    head = model.action
    W = head.classification_head.weight.detach().double().numpy()  # [V, C]
    bias = head.classification_head.bias.detach().double().numpy()  # [V]
    noise = np.abs(head.b_noise.detach().double().numpy())  # [C]
    threshold = float(head.ovr_threshold)
    scale_S = np.maximum(np.abs(W) @ noise, head.scale_eps)  # [V]: only the noise stays a distribution
    u = loc_U + scale_U * np.random.default_rng(seed).standard_cauchy((draws, *loc_U.shape))  # [D, N, C]
    return stats.cauchy.sf(threshold, loc=u @ W.T + bias, scale=scale_S).sum(-1)  # [D, N]


def test_causal_sums_against_an_independent_monte_carlo_and_their_mean_against_the_standard_sum():
    """The package's draws and NumPy's give the same mean, spread and distance from 1 per position (within 5
    standard errors, 15% for the spread); the mean is the standard sum of the closed form (SciPy): averaging the
    causal decision over u gives the standard law back."""
    model, tokenizer = _model_with_signed_noise()
    batch = _batch(tokenizer, n=2)
    with torch.no_grad():
        law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    loc_U, scale_U = law.loc_U[0, :5], law.scale_U[0, :5]  # [5, C], float32 as the head
    with torch.no_grad():
        standard = model.action.probabilities(model.action(loc_U, scale_U)).double().sum(-1).numpy()  # [5]
    draws = 1000
    package = causal_ovr_sums(model.action, loc_U, scale_U, draws, torch.Generator().manual_seed(0)).numpy()
    oracle = _monte_carlo_oracle(model, loc_U.double().numpy(), scale_U.double().numpy(), draws, seed=1)
    assert package.shape == oracle.shape == (draws, 5)
    for name, summary in (("sum", lambda x: x), ("distance from 1", lambda x: np.abs(x - 1))):
        a, b = summary(package), summary(oracle)
        error = np.sqrt(a.var(0) / draws + b.var(0) / draws)  # [5]
        assert np.all(np.abs(a.mean(0) - b.mean(0)) < 5 * error), name
    np.testing.assert_allclose(package.std(0), oracle.std(0), rtol=0.15)
    assert np.all(np.abs(package.mean(0) - standard) < 5 * package.std(0) / np.sqrt(draws))
    assert np.all(package.std(0) > 0.01 * standard)  # the individuals differ: the spread is a measurement


def test_the_causal_sums_are_reproducible_by_default_and_follow_the_seed():
    model, tokenizer = _model_with_signed_noise()
    batch = _batch(tokenizer)
    first, second = evaluate_batch(model, batch), evaluate_batch(model, batch)
    assert first == second and first["ovr_causal_draws"] == 8
    seeded = evaluate_batch(model, batch, seed=5, causal_draws=2)
    assert seeded == evaluate_batch(model, batch, generator=torch.Generator().manual_seed(5), causal_draws=2)
    other = evaluate_batch(model, batch, seed=6, causal_draws=2)
    assert other["ovr_prob_sum_median_causal"] != seeded["ovr_prob_sum_median_causal"]
    assert other["ovr_prob_sum_median"] == seeded["ovr_prob_sum_median"]  # the standard sum draws nothing


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"causal_draws": 0}, "causal_draws must be an int >= 1, got 0"),
        ({"causal_draws": True}, "causal_draws must be an int >= 1, got True"),
        ({"causal_draws": 2.0}, "causal_draws must be an int >= 1, got 2.0"),
        ({"seed": -1}, "seed must be an int from 0 to 2\\*\\*63 - 1, got -1"),
        ({"seed": 2**63}, "seed must be an int from 0 to 2\\*\\*63 - 1, got 9223372036854775808"),
        ({"seed": "0"}, "seed must be an int from 0 to 2\\*\\*63 - 1, got '0'"),
    ],
)
def test_bad_draw_settings_are_refused_by_name(settings, message):
    model, tokenizer = _model_with_signed_noise()
    with pytest.raises(ValueError, match=message):
        evaluate_batch(model, _batch(tokenizer, n=2), **settings)
    with pytest.raises(ValueError, match=message):
        TrainerMetrics(model, **settings)


@pytest.mark.parametrize(("draws", "rows", "name"), [(0, None, "draws"), (2, 0, "rows"), (2, 1.5, "rows")])
def test_causal_ovr_sums_refuses_empty_draws_or_chunks(draws, rows, name):
    model, _ = _model_with_signed_noise()
    loc_U, scale_U = torch.zeros(3, model.config.causal_size), torch.ones(3, model.config.causal_size)
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1"):
        causal_ovr_sums(model.action, loc_U, scale_U, draws, rows=rows)


def test_a_noise_component_at_exactly_zero_stays_zero_in_training_and_the_sign_is_unidentifiable():
    """d|b|/db = 0 at b = 0 in torch, so AdamW never moves a component at exactly 0 (no weight decay on b_noise);
    the other components move. b_noise and -b_noise give the same model: only |b_noise| enters."""
    model, tokenizer = _model_with_signed_noise()
    batch = _batch(tokenizer, n=4)
    with torch.no_grad():
        before = model(**batch)
        model.action.b_noise.neg_()
        flipped = model(**batch)
        model.action.b_noise[0] = 0.0
    assert torch.equal(before.loss, flipped.loss) and torch.equal(before.scale_U, flipped.scale_U)
    start = model.action.b_noise.detach().clone()
    data = TextDataset(synthetic_texts(16, seed=0), tokenizer, max_length=32)
    config = TrainingConfig(steps=3, batch_size=4, learning_rate=1e-2, preset="causal", log_every=1, seed=0)
    history = train(model, data, config, progress=False)
    trained = model.action.b_noise.detach()
    assert float(trained[0]) == 0.0 and bool((trained[1:] != start[1:]).all())
    assert all(record["train/noise_scale_median"] > 0 for record in history)
