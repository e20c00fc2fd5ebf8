"""Monitoring metrics (D13) against plain-Python and NumPy/SciPy computations; edge cases defined."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from causalqwen import train
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.inference import draw_uniform
from causalqwen.metrics import (
    TrainerMetrics,
    causal_ovr_sums,
    classification_metrics,
    distribution_stats,
    evaluate_batch,
    next_token_valid_mask,
    noise_statistics,
    ovr_prob_sum_median,
    ovr_prob_sums,
    regression_metrics,
    with_log_prefixes,
)
from causalqwen.training import TrainingConfig

NUM = 3


@given(
    predicted=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    data=st.data(),
)
def test_classification_metrics_match_a_python_count(predicted, data):
    n = len(predicted)
    targets = data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    valid = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    got = classification_metrics(torch.tensor(predicted), torch.tensor(targets), torch.tensor(valid), NUM)
    pairs = [(p, t) for p, t, v in zip(predicted, targets, valid) if v]
    tp = sum(p == NUM and t == NUM for p, t in pairs)
    n_pred = sum(p == NUM for p, _ in pairs)
    n_true = sum(t == NUM for _, t in pairs)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    assert got["accuracy"] == (sum(p == t for p, t in pairs) / len(pairs) if pairs else 0.0)
    assert got["num_precision"] == precision and got["num_recall"] == recall
    assert math.isclose(got["num_f1"], 2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    assert (got["num_predicted"], got["num_targets"], got["tokens"]) == (n_pred, n_true, len(pairs))


def test_classification_edge_cases_are_zero_with_counts():
    valid = torch.ones(4, dtype=torch.bool)
    nothing_predicted = classification_metrics(torch.tensor([0, 1, 2, 0]), torch.tensor([NUM, 1, 2, 0]), valid, NUM)
    assert nothing_predicted["num_precision"] == 0.0 and nothing_predicted["num_predicted"] == 0
    assert nothing_predicted["num_recall"] == 0.0 and nothing_predicted["num_f1"] == 0.0
    no_targets = classification_metrics(torch.tensor([NUM, 1, 2, 0]), torch.tensor([0, 1, 2, 0]), valid, NUM)
    assert no_targets["num_recall"] == 0.0 and no_targets["num_targets"] == 0 and no_targets["num_precision"] == 0.0
    empty = classification_metrics(torch.tensor([1]), torch.tensor([1]), torch.tensor([False]), NUM)
    assert empty["accuracy"] == 0.0 and empty["tokens"] == 0
    assert not any(math.isnan(v) for m in (nothing_predicted, no_targets, empty) for v in m.values())


def test_regression_metrics_against_numpy():
    predicted = torch.tensor([1.0, 2.0, 10.0, -4.0, 7.0])
    target = torch.tensor([1.5, 0.0, 0.0, 4.0, 8.0])
    mask = torch.tensor([True, True, False, True, True])
    errors = np.abs(predicted.numpy() - target.numpy())[mask.numpy()]
    got = regression_metrics(predicted, target, mask)
    assert got == {
        "reg_mae": pytest.approx(errors.mean()),
        "reg_mdae": pytest.approx(np.median(errors)),
        "reg_count": 4,
    }
    assert regression_metrics(predicted, target, torch.zeros(5, dtype=torch.bool)) == {
        "reg_mae": 0.0,
        "reg_mdae": 0.0,
        "reg_count": 0,
    }


def test_distribution_stats_against_numpy():
    values = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    chosen = values.numpy()[mask.numpy()].ravel()
    got = distribution_stats(values, mask, "U_loc")
    q25, q75 = np.percentile(chosen, [25, 75])
    assert got == pytest.approx(
        {
            "U_loc_mean": chosen.mean(),
            "U_loc_median": np.median(chosen),
            "U_loc_std": chosen.std(),
            "U_loc_iqr": q75 - q25,
        }
    )


def test_ovr_prob_sum_median_against_scipy():
    g = torch.Generator().manual_seed(1)
    loc_S = torch.randn(2, 3, 7, generator=g, dtype=torch.float64) * 50
    scale_S = torch.rand(2, 3, 7, generator=g, dtype=torch.float64) * 5 + 0.5
    mask = torch.tensor([[True, False, True], [True, True, False]])
    sums = stats.cauchy.sf(20.0, loc=loc_S.numpy(), scale=scale_S.numpy()).sum(-1)[mask.numpy()]
    assert ovr_prob_sum_median(loc_S, scale_S, 20.0, mask) == pytest.approx(np.median(sums), rel=1e-12)


def test_valid_mask_pairs_positions_with_their_targets():
    labels = torch.tensor([[5, 6, 7, -100], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    expected = torch.tensor([[True, True, False], [False, True, True]])
    assert torch.equal(next_token_valid_mask(labels, mask), expected)


def _reference_metrics(model, batch, generator, draws):
    """Every metric of D13 on one batch, one scored position at a time: the closed form of the standard and the
    causal decisions in float64 NumPy (``draws`` individuals per position, each draw's uniforms taken for all
    positions at once), P_k from SciPy, the prediction as argmax_k P_k, counts in Python."""
    with torch.no_grad():
        law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    head, config = model.action, model.config
    labels, values, mask = batch["labels"].tolist(), batch["numeric_values"].tolist(), batch["attention_mask"].tolist()
    positions = [
        (b, i)
        for b in range(len(labels))
        for i in range(len(labels[0]) - 1)
        if mask[b][i] and mask[b][i + 1] and labels[b][i + 1] != config.ignore_index
    ]
    W = head.classification_head.weight.detach().double().numpy()
    bias = head.classification_head.bias.detach().double().numpy()
    w, c = head.regression_head.weight.detach().double().numpy()[0], float(head.regression_head.bias)
    noise = head.noise_scale.detach().double().numpy()
    loc_U = np.stack([law.loc_U[b, i].double().numpy() for b, i in positions])  # [N, C]
    scale_U = np.stack([law.scale_U[b, i].double().numpy() for b, i in positions])
    threshold, eps = float(head.ovr_threshold), head.scale_eps  # scales floored at eps (D10): some rows of W are 0
    p_standard = stats.cauchy.sf(
        threshold, loc=loc_U @ W.T + bias, scale=np.maximum((scale_U + noise) @ np.abs(W).T, eps)
    )  # [N, V]
    causal_sums = []  # [D][N]
    for _ in range(draws):
        uniform = draw_uniform(loc_U.shape, generator=generator).numpy()
        u = loc_U + scale_U * np.tan(np.pi * (uniform - 0.5))  # one individual per position
        causal_sums.append(
            stats.cauchy.sf(threshold, loc=u @ W.T + bias, scale=np.maximum(np.abs(W) @ noise, eps)).sum(-1)
        )
    causal_sums = np.array(causal_sums)
    predicted = p_standard.argmax(-1)
    targets = [labels[b][i + 1] for b, i in positions]
    num = config.num_token_id
    tp = sum(p == num and t == num for p, t in zip(predicted, targets))
    n_pred, n_true = sum(p == num for p in predicted), sum(t == num for t in targets)
    errors = [abs(y - values[b][i + 1]) for y, t, (b, i) in zip(loc_U @ w + c, targets, positions) if t == num]
    return {
        "accuracy": sum(p == t for p, t in zip(predicted, targets)) / len(targets),
        "num_precision": tp / n_pred if n_pred else 0.0,
        "num_recall": tp / n_true,
        "num_predicted": n_pred,
        "num_targets": n_true,
        "tokens": len(targets),
        "reg_count": len(errors),
        "reg_mae": float(np.mean(errors)),
        "reg_mdae": float(np.median(errors)),
        "ovr_prob_sum_median": float(np.median(p_standard.sum(-1))),
        "ovr_prob_sum_median_causal": float(np.median(causal_sums.mean(0))),
        "ovr_prob_sum_causal_spread": float(np.median(causal_sums.std(0))),
        "ovr_prob_sum_causal_error": float(np.median(np.abs(causal_sums - 1).mean(0))),
        "ovr_causal_draws": draws,
    }


def test_evaluate_batch_is_the_reference_computation_position_by_position():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0)
    with torch.no_grad():  # a <NUM> row that some positions choose and others do not
        model.action.classification_head.weight[model.config.num_token_id] = torch.randn(
            model.config.causal_size, generator=torch.Generator().manual_seed(1)
        )
    batch = collate(TextDataset(synthetic_texts(12, seed=0), tokenizer).items, tokenizer.pad_token_id)
    metrics = evaluate_batch(model, batch, generator=torch.Generator().manual_seed(0), causal_draws=3)
    expected = _reference_metrics(model, batch, torch.Generator().manual_seed(0), draws=3)
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert 0 < metrics["num_predicted"] < metrics["tokens"] and metrics["num_targets"] > 0
    # at initialization scale_U = gamma (from_qwen's 0.1, decision D14) everywhere
    assert metrics["U_scale_median"] == pytest.approx(0.1) and metrics["U_scale_iqr"] == pytest.approx(0.0, abs=1e-6)
    assert {f"U_{w}_{s}" for w in ("loc", "scale") for s in ("mean", "median", "std", "iqr")} <= set(metrics)


@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_positions_outside_the_mask_never_change_the_ovr_sums(seed, data):
    """Mask semantics: whatever the decisions hold at unmasked-out positions, the sums at the masked-in ones stay."""
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=6, max_size=6)))
    g = torch.Generator().manual_seed(seed)
    loc_S, scale_S = torch.randn(6, 5, generator=g, dtype=torch.float64) * 9, torch.rand(6, 5, generator=g) + 0.1
    other_loc = torch.where(mask[:, None], loc_S, torch.randn(6, 5, generator=g, dtype=torch.float64) * 1e4)
    sums = ovr_prob_sums(loc_S, scale_S.double(), 2.0, mask)
    assert torch.equal(sums, ovr_prob_sums(other_loc, scale_S.double(), 2.0, mask))
    expected = stats.cauchy.sf(2.0, loc=loc_S.numpy(), scale=scale_S.double().numpy()).sum(-1)[mask.numpy()]
    np.testing.assert_allclose(sums.numpy(), expected, rtol=1e-12)


def test_evaluate_batch_in_chunks_of_rows_equals_one_pass():
    """A small decision budget (one row per chunk) gives the metrics of a single pass over the batch, the causal
    sums included: each draw is taken for all positions before they are split."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0)
    batch = collate(TextDataset(synthetic_texts(7, seed=3), tokenizer).items, tokenizer.pad_token_id)
    whole = evaluate_batch(model, batch, generator=torch.Generator().manual_seed(0))
    one_row = batch["input_ids"].shape[1] * model.config.vocab_size
    chunked = evaluate_batch(model, batch, generator=torch.Generator().manual_seed(0), max_decision_elements=one_row)
    assert whole.keys() == chunked.keys()
    for name in whole:
        assert chunked[name] == pytest.approx(whole[name], rel=1e-5, abs=1e-6), name
    with pytest.raises(ValueError, match="max_decision_elements must be an int >= 1"):
        evaluate_batch(model, batch, max_decision_elements=0)


# The exogenous noise in the metrics, and the causal OvR sums: against NumPy, SciPy and an independent Monte Carlo.


SIGNED_NOISE = [0.3, -0.05, 0.2, -0.7, 0.01, -0.4, 0.15, 0.6]  # |b_noise| cycles through these, signs mixed


def _model_with_signed_noise():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    with torch.no_grad():
        size = model.config.causal_size
        model.action.b_noise.copy_(torch.tensor(SIGNED_NOISE * (size // len(SIGNED_NOISE) + 1))[:size])
    return model.eval(), tokenizer


def _batch(tokenizer, n=6, seed=3):
    return collate(TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=32).items, tokenizer.pad_token_id)


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
