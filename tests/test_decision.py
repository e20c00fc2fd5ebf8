"""The decision head (decisions D7-D11), `causalqwen.decision`: every decision against SciPy and the literal formulas.

Oracles: $P_k = P(S_k > C_k)$ from ``scipy.stats.cauchy.sf`` (and ``logsf`` / ``logcdf`` for the logs) on the closed
form of the decision laws in float64 NumPy; the prediction as the argmax of those probabilities and $\\mathrm{loc}_Y$ at
``<NUM>``; every mode's decision input written out from its formula; the scoring rule (D9) by an explicit loop over
positions. Hypothesis checks the laws: OvR monotonicity in $C$ and $\\mathrm{loc}_S$, mask semantics of the rule.
"""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from causalqwen import CausalQwenConfig, cauchy
from causalqwen.action import ActionOutput
from causalqwen.decision import DecisionHead
from causalqwen.inference import draw_uniform, traditional_probabilities
from causalqwen.losses import next_token_targets

C, V, NUM, IGNORE = 8, 12, 5, -100
DECISION_MODES = ("standard", "causal", "shared_individual", "shared_noise")


def _head(per_class=False, seed=0):
    config = CausalQwenConfig(
        hidden_size=C,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=V,
        num_token_id=NUM,
        ovr_threshold=1.5,
        ovr_threshold_per_class=per_class,
    )
    head = DecisionHead(config).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.classification_head.weight.copy_(torch.randn(V, C, generator=g, dtype=torch.float64))
        head.classification_head.bias.copy_(torch.randn(V, generator=g, dtype=torch.float64))
        head.regression_head.weight.copy_(torch.randn(1, C, generator=g, dtype=torch.float64))
        head.regression_head.bias.fill_(0.7)
        head.b_noise.copy_(torch.rand(C, generator=g, dtype=torch.float64) * 2 + 0.05)
        if per_class:
            head.ovr_threshold.copy_(torch.linspace(-2.0, 4.0, V, dtype=torch.float64))
    return head


def _law(rows=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    loc_U = torch.randn(rows, C, generator=g, dtype=torch.float64) * 3
    scale_U = torch.rand(rows, C, generator=g, dtype=torch.float64) * 2 + 0.05
    return loc_U, scale_U


def _numpy(head):
    """W, b, w, c, |b_noise| and the thresholds C_k ``[V]`` of ``head`` as float64 NumPy arrays."""

    def array(t):
        return t.detach().double().numpy()

    threshold = head.ovr_threshold
    thresholds = array(threshold) if isinstance(threshold, torch.Tensor) else np.full(V, float(threshold))
    return (
        array(head.classification_head.weight),
        array(head.classification_head.bias),
        array(head.regression_head.weight)[0],
        head.regression_head.bias.item(),
        array(head.b_noise.abs()),
        np.broadcast_to(thresholds, (V,)),
    )


def _literal_decision(head, loc, scale):
    """The closed form of D7 for the decision input ``(loc, scale)`` [N, C] (NumPy), and P_k from SciPy."""
    W, b, w, c, _, thresholds = _numpy(head)
    eps = head.scale_eps
    scale = np.maximum(scale, eps)
    loc_S, scale_S = loc @ W.T + b, np.maximum(scale @ np.abs(W).T, eps)  # [N, V]
    loc_Y, scale_Y = loc @ w + c, np.maximum(scale @ np.abs(w), eps)  # [N]
    probabilities = stats.cauchy.sf(thresholds, loc=loc_S, scale=scale_S)  # [N, V]
    return loc_S, scale_S, loc_Y, scale_Y, probabilities


def _literal_prediction(probabilities, loc_Y):
    """argmax_k P_k per row, and loc_Y where that token is <NUM>, 0.0 elsewhere (one row at a time)."""
    tokens = [int(np.argmax(row)) for row in probabilities]
    return np.array(tokens), np.array([y if token == NUM else 0.0 for token, y in zip(tokens, loc_Y)])


def _no_near_ties(probabilities):
    top_two = np.sort(probabilities, axis=-1)[:, -2:]
    return bool(np.all(top_two[:, 1] - top_two[:, 0] > 1e-9 * top_two[:, 1]))


# ---- probabilities ----


@pytest.mark.parametrize("per_class", [False, True])
def test_probabilities_and_their_logs_are_scipy_at_the_threshold(per_class):
    head = _head(per_class)
    loc_U, scale_U = _law()
    decision = head(loc_U, scale_U)
    thresholds = _numpy(head)[-1]  # C_k [V]
    loc_S, scale_S = decision.loc_S.detach().numpy(), decision.scale_S.detach().numpy()
    np.testing.assert_allclose(
        head.probabilities(decision).detach().numpy(),
        stats.cauchy.sf(thresholds, loc=loc_S, scale=scale_S),
        rtol=1e-12,
        atol=0,
    )
    log_p, log_not_p = head.log_probabilities(decision)
    np.testing.assert_allclose(
        log_p.detach().numpy(), stats.cauchy.logsf(thresholds, loc=loc_S, scale=scale_S), rtol=1e-10, atol=1e-14
    )
    np.testing.assert_allclose(
        log_not_p.detach().numpy(), stats.cauchy.logcdf(thresholds, loc=loc_S, scale=scale_S), rtol=1e-10, atol=1e-14
    )


@given(
    seed=st.integers(0, 2**31 - 1),
    threshold=st.floats(-50, 50),
    raise_by=st.floats(0, 100),
    loc_shift=st.floats(0, 100),
)
def test_ovr_probability_falls_with_the_threshold_and_rises_with_the_location(seed, threshold, raise_by, loc_shift):
    """P_k = P(S_k > C_k) is non-increasing in C_k and non-decreasing in loc_{S_k}; log P_k too."""
    rng = np.random.default_rng(seed)
    loc_S = torch.from_numpy(rng.normal(size=(3, V)) * 20)
    scale_S = torch.from_numpy(rng.exponential(size=(3, V)) * 5 + 1e-6)
    decision = ActionOutput(loc_S, scale_S, torch.zeros(3), torch.ones(3))
    shifted = ActionOutput(loc_S + loc_shift, scale_S, torch.zeros(3), torch.ones(3))
    low, high = _head(), _head()
    low.ovr_threshold = torch.tensor(threshold, dtype=torch.float64)
    high.ovr_threshold = torch.tensor(threshold + raise_by, dtype=torch.float64)
    assert bool((low.probabilities(decision) >= high.probabilities(decision)).all())
    assert bool((low.log_probabilities(decision)[0] >= high.log_probabilities(decision)[0]).all())
    assert bool((low.probabilities(shifted) >= low.probabilities(decision)).all())
    assert bool((low.log_probabilities(shifted)[0] >= low.log_probabilities(decision)[0]).all())
    assert bool((low.log_probabilities(shifted)[1] <= low.log_probabilities(decision)[1]).all())


# ---- prediction ----


@given(seed=st.integers(0, 2**31 - 1), per_class=st.booleans())
def test_predict_is_the_argmax_of_scipy_probabilities_and_loc_Y_at_num(seed, per_class):
    head = _head(per_class)
    rng = np.random.default_rng(seed)
    loc_S = rng.normal(size=(8, V)) * 10
    loc_S[::2, NUM] += 40  # every other row predicts <NUM>
    scale_S, loc_Y = rng.exponential(size=(8, V)) * 10 + 1e-3, rng.normal(size=8) * 100
    probabilities = stats.cauchy.sf(_numpy(head)[-1], loc=loc_S, scale=scale_S)
    assume(_no_near_ties(probabilities))
    decision = ActionOutput(*(torch.from_numpy(a) for a in (loc_S, scale_S, loc_Y, np.ones(8))))
    token, value = head.predict(decision)
    expected_token, expected_value = _literal_prediction(probabilities, loc_Y)
    np.testing.assert_array_equal(token.numpy(), expected_token)
    np.testing.assert_array_equal(value.numpy(), expected_value)


@pytest.mark.parametrize("algorithm", ["fused", "literal"])
def test_standard_token_is_predict_of_the_standard_decision_under_either_algorithm(algorithm):
    head = _head(per_class=True).float()
    head.config.loss_algorithm = algorithm
    loc_U, scale_U = (t.float() for t in _law(40, seed=4))
    with torch.no_grad():
        tokens, _ = head.predict(head(loc_U, scale_U))
        assert torch.equal(head.standard_token(loc_U, scale_U), tokens)


# ---- one step in each mode ----


def _mode_input(head, mode, loc_U, scale_U, uniform, noise):
    """The decision input U' of ``mode`` from its formula (D11), in float64 NumPy."""
    noise_scale = _numpy(head)[4]
    if mode == "standard":
        return loc_U, scale_U + noise_scale
    if mode in ("causal", "shared_individual"):
        return loc_U + scale_U * np.tan(np.pi * (uniform - 0.5)), np.broadcast_to(noise_scale, loc_U.shape)
    return loc_U + noise_scale * noise, scale_U


@pytest.mark.parametrize("mode", DECISION_MODES)
@pytest.mark.parametrize("per_class", [False, True])
def test_choose_in_a_decision_mode_is_the_argmax_of_that_modes_decision(mode, per_class):
    head = _head(per_class)
    loc_U, scale_U = _law(16, seed=7)
    with torch.no_grad():
        head.classification_head.bias[NUM] += 8.0  # so that some rows choose <NUM>
    g = torch.Generator().manual_seed(2)
    uniform = draw_uniform((16, C), generator=g)
    noise = torch.from_numpy(stats.cauchy.rvs(size=(16, C), random_state=np.random.default_rng(3)))
    with torch.no_grad():
        choice = head.choose(mode, loc_U, scale_U, uniform=uniform, noise=noise)
        scores, scores_loc_Y = head.step_scores(mode, loc_U, scale_U, uniform=uniform, noise=noise)
    loc, scale = _mode_input(head, mode, loc_U.numpy(), scale_U.numpy(), uniform.numpy(), noise.numpy())
    np.testing.assert_allclose(choice.loc.numpy(), loc, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(choice.scale.numpy(), scale, rtol=1e-12, atol=0)
    loc_S, scale_S, loc_Y, _, probabilities = _literal_decision(head, loc, scale)
    assert _no_near_ties(probabilities)
    token, value = _literal_prediction(probabilities, loc_Y)
    np.testing.assert_array_equal(choice.token.numpy(), token)
    np.testing.assert_allclose(choice.value.numpy(), value, rtol=1e-12, atol=1e-12)
    assert 0 < int((choice.token == NUM).sum()) < 16, "both kinds of rows are checked"
    log_p = stats.cauchy.logsf(_numpy(head)[-1], loc=loc_S, scale=scale_S)  # the step's scores: log P_k
    np.testing.assert_allclose(scores.numpy(), log_p, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(scores_loc_Y.numpy(), loc_Y, rtol=1e-12, atol=1e-12)


def test_the_sampled_modes_draw_their_uniform_from_the_generator():
    head = _head()
    loc_U, scale_U = _law(5)
    with torch.no_grad():
        drawn = head.choose("causal", loc_U, scale_U, generator=torch.Generator().manual_seed(11))
        given_draw = head.choose(
            "causal", loc_U, scale_U, uniform=draw_uniform((5, C), generator=torch.Generator().manual_seed(11))
        )
    for got, want in zip(drawn, given_draw):
        assert torch.equal(got, want)


@pytest.mark.parametrize("normalize", ["softmax", "ovr"])
def test_choose_traditional_samples_the_traditional_probabilities_of_the_standard_decision(normalize):
    head = _head()
    loc_U, scale_U = _law(64, seed=5)
    with torch.no_grad():
        head.classification_head.bias[NUM] += 3.0
        choice = head.choose(
            "traditional", loc_U, scale_U, generator=torch.Generator().manual_seed(6), sampling=(0.8, 6, 0.9, normalize)
        )
        scores, scores_loc_Y = head.step_scores("traditional", loc_U, scale_U)
    loc_S, scale_S, loc_Y, _, _ = _literal_decision(head, loc_U.numpy(), scale_U.numpy() + _numpy(head)[4])
    probs = traditional_probabilities(
        torch.from_numpy(loc_S),
        0.8,
        6,
        0.9,
        scale_S=torch.from_numpy(scale_S),
        threshold=head.ovr_threshold,
        normalize=normalize,
    )
    token = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(6))[:, 0]
    assert torch.equal(choice.token, token) and 0 < int((token == NUM).sum()) < 64
    np.testing.assert_allclose(choice.value.numpy(), np.where(token.numpy() == NUM, loc_Y, 0.0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scores.numpy(), loc_S, rtol=1e-12, atol=1e-12)  # loc_S of the standard input
    np.testing.assert_allclose(scores_loc_Y.numpy(), loc_Y, rtol=1e-12, atol=1e-12)


# ---- the scoring rule (D9) ----


def _literal_targets(labels, values, mask, num_token_id):
    """Position i is scored against i+1 when both are real and labels[i+1] is not ignored: one position at a time."""
    rows, length = len(labels), len(labels[0])
    scored = [[False] * length for _ in range(rows)]
    next_labels = [[IGNORE] * length for _ in range(rows)]
    next_values = [[0.0] * length for _ in range(rows)]
    is_num = [[False] * length for _ in range(rows)]
    for b in range(rows):
        for i in range(length - 1):
            next_values[b][i] = values[b][i + 1]
            if mask[b][i] and mask[b][i + 1] and labels[b][i + 1] != IGNORE:
                scored[b][i] = True
                next_labels[b][i] = labels[b][i + 1]
                is_num[b][i] = num_token_id is not None and labels[b][i + 1] == num_token_id
    return scored, next_labels, next_values, is_num


rules = st.integers(1, 4).flatmap(
    lambda rows: st.integers(1, 7).flatmap(
        lambda length: st.tuples(
            st.lists(
                st.lists(st.sampled_from([IGNORE, 0, 1, NUM, V - 1]), min_size=length, max_size=length),
                min_size=rows,
                max_size=rows,
            ),
            st.lists(
                st.lists(st.floats(-1e6, 1e6, width=32), min_size=length, max_size=length), min_size=rows, max_size=rows
            ),
            st.lists(st.lists(st.booleans(), min_size=length, max_size=length), min_size=rows, max_size=rows),
        )
    )
)


@given(case=rules, num_token_id=st.sampled_from([NUM, None]))
def test_next_token_targets_is_the_scoring_rule_position_by_position(case, num_token_id):
    labels, values, mask = case
    got = next_token_targets(
        torch.tensor(labels), torch.tensor(values), torch.tensor(mask, dtype=torch.long), IGNORE, num_token_id
    )
    scored, next_labels, next_values, is_num = _literal_targets(labels, values, mask, num_token_id)
    assert got.scored.tolist() == scored and got.labels.tolist() == next_labels and got.is_num.tolist() == is_num
    assert got.values.dtype == torch.float32 and got.values.tolist() == next_values
    unmasked = next_token_targets(torch.tensor(labels), None, None, IGNORE, num_token_id)
    everywhere = [[True] * len(labels[0]) for _ in labels]
    assert unmasked.scored.tolist() == _literal_targets(labels, values, everywhere, num_token_id)[0]
    assert not bool(unmasked.values.any()) and unmasked.values.dtype == torch.float32


@given(case=rules, seed=st.integers(0, 2**31 - 1))
def test_what_lies_under_the_mask_never_changes_the_scored_positions(case, seed):
    """Mask semantics: any labels and values at padded positions leave every scored target as it was."""
    labels, values, mask = (torch.tensor(part) for part in case)
    g = torch.Generator().manual_seed(seed)
    padded = ~mask
    other_labels = torch.where(padded, torch.randint(0, V, labels.shape, generator=g), labels)
    other_values = torch.where(padded, torch.randn(values.shape, generator=g) * 1e3, values)
    head = _head()
    before = head.next_token_targets(labels, values, mask.long())
    after = head.next_token_targets(other_labels, other_values, mask.long())
    assert torch.equal(before.scored, after.scored)
    scored = before.scored
    for name in ("labels", "values", "is_num"):
        assert torch.equal(getattr(before, name)[scored], getattr(after, name)[scored]), name
    assert torch.equal(before.labels[~scored], torch.full_like(before.labels[~scored], IGNORE))


def test_half_precision_numeric_targets_are_widened_to_float32():
    labels = torch.tensor([[1, NUM, 2]])
    targets = next_token_targets(labels, torch.tensor([[0.0, 1.5, 0.0]], dtype=torch.float16), None, IGNORE, NUM)
    assert targets.values.dtype == torch.float32 and targets.values.tolist() == [[1.5, 0.0, 0.0]]
    assert targets.is_num.tolist() == [[True, False, False]]


# ---- the threshold ----


@pytest.mark.parametrize(
    "per_class,learnable,kind",
    [(False, False, torch.Tensor), (True, False, torch.Tensor), (False, True, torch.nn.Parameter)],
)
def test_the_threshold_is_a_tensor_the_config_asks_for_and_resets_to_it(per_class, learnable, kind):
    config = CausalQwenConfig(
        hidden_size=C,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=V,
        num_token_id=NUM,
        ovr_threshold=2.5,
        ovr_threshold_per_class=per_class,
        learnable_threshold=learnable,
    )
    head = DecisionHead(config)
    assert isinstance(head.ovr_threshold, kind)
    assert tuple(head.ovr_threshold.shape) == ((V,) if per_class else ())
    with torch.no_grad():
        head.ovr_threshold.fill_(-7.0)
    head.reset_parameters()
    assert bool((head.ovr_threshold == 2.5).all())
    if per_class or learnable:
        assert torch.equal(head.state_dict()["ovr_threshold"], head.ovr_threshold.detach())  # saved with the model
    else:
        assert "ovr_threshold" not in head.state_dict()  # the config's number: saved files do not change


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_a_shared_threshold_scores_as_the_config_number_itself_in_every_dtype(dtype):
    """The shared C = 0.1 is no bfloat16 number: cast with the head it would move to 0.10009765625. It stays the
    config's float64 value (a CPU scalar, which torch combines with tensors of any dtype as it does a number), and
    every decision function gives bit for bit what the Python number gives."""
    config = CausalQwenConfig(
        hidden_size=C, num_attention_heads=2, num_key_value_heads=1, vocab_size=V, num_token_id=NUM, ovr_threshold=0.1
    )
    head = DecisionHead(config).to(dtype)
    assert head.ovr_threshold.dtype == torch.float64 and head.ovr_threshold.device.type == "cpu"
    assert head.ovr_threshold.item() == 0.1
    g = torch.Generator().manual_seed(3)
    loc_U, scale_U = torch.randn(5, C, generator=g).to(dtype), torch.rand(5, C, generator=g).to(dtype)
    decision = head(loc_U, scale_U)
    diff = decision.loc_S - 0.1  # the number, as torch combines it with a tensor of this dtype
    log_p, _ = head.log_probabilities(decision)
    assert torch.equal(log_p, -cauchy.tail_nll(-diff, decision.scale_S))
    assert torch.equal(head.probabilities(decision), cauchy.sf(0.1, decision.loc_S, decision.scale_S))
    assert torch.equal(head.predict(decision)[0], log_p.argmax(-1))


@pytest.mark.parametrize("per_class,learnable", [(True, False), (False, True), (True, True)])
def test_the_forward_refuses_a_threshold_held_with_the_weights_once_it_is_nan(per_class, learnable):
    """A per-class or learnable threshold lives with the weights (a file or training can make it NaN): the model's
    door names it. The shared one is the config's number, which the config checks."""
    import math

    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(
        seed=0, init_seed=0, ovr_threshold_per_class=per_class, learnable_threshold=learnable
    )
    enc = tokenizer(["He ran 3 km"])
    model(**enc, labels=enc["input_ids"])  # finite: no error
    with torch.no_grad():
        model.action.ovr_threshold.fill_(math.nan)
    with pytest.raises(ValueError, match=r"threshold \(the OvR threshold C_k\) must be finite: found NaN"):
        model(**enc, labels=enc["input_ids"])
