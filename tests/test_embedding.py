"""The numerical embedding (decision D4), `causalqwen.embedding`: phi(v) = sign(v) ln(1 + |v|) w_num, against NumPy
in float64 and as Hypothesis properties of the formula (odd, monotone, zero at zero)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from causalqwen.embedding import NumericalEmbedding, fourier_features, signed_log1p

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@given(values=st.lists(finite32, min_size=1, max_size=12))
def test_phi_is_signed_log1p_times_w_num(values):
    torch.manual_seed(0)
    emb = NumericalEmbedding(8)
    v = torch.tensor(values, dtype=torch.float32).unsqueeze(0)  # [1, S]
    phi = emb(v)  # [1, S, 8]
    w = emb.w_num.detach().double().numpy()
    vd = v.double().numpy()[0]
    expected = (np.sign(vd) * np.log1p(np.abs(vd)))[:, None] * w[None, :]
    np.testing.assert_allclose(phi[0].detach().double().numpy(), expected, rtol=1e-5, atol=1e-7)


@given(a=finite32, b=finite32)
def test_signed_log1p_is_odd_monotone_and_bounded_by_log_of_float32_max(a, b):
    x = torch.tensor([a, b, -a], dtype=torch.float32)
    fa, fb, f_minus_a = signed_log1p(x).tolist()
    assert f_minus_a == -fa  # odd, exactly
    if a <= b:
        assert fa <= fb  # monotone
    assert abs(fa) <= math.log1p(float(np.finfo(np.float32).max)) + 1e-4
    assert fa == pytest.approx(math.copysign(math.log1p(abs(a)), a), rel=1e-6, abs=1e-38)  # float32 subnormals


def test_phi_of_zero_is_zero_and_w_num_is_a_learnable_unit_vector():
    emb = NumericalEmbedding(64)
    assert emb.w_num.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert emb.w_num.requires_grad
    assert bool((emb(torch.zeros(2, 3)) == 0).all())
    emb(torch.tensor([[99.9]])).sum().backward()
    # d/dw sum_h phi_h = ln(1 + 99.9) for every component
    torch.testing.assert_close(emb.w_num.grad, torch.full((64,), math.log1p(99.9)), rtol=1e-6, atol=0)


def test_phi_is_computed_in_float32_and_returned_in_the_model_dtype():
    """A bfloat16 model: ln(1 + |v|) is formed in float32 (v = 1e30 rounds in bf16 but its log does not overflow)."""
    emb = NumericalEmbedding(4).to(torch.bfloat16)
    values = torch.tensor([[1e30, -3.0, 0.0]], dtype=torch.float32)
    phi = emb(values)  # [1, 3, 4]
    assert phi.dtype == torch.bfloat16
    expected = torch.tensor([math.log1p(1e30), -math.log1p(3.0), 0.0]).to(torch.bfloat16)[:, None] * emb.w_num
    assert torch.equal(phi[0], expected)


# ---- the opt-in periodic features (config ``number_encoding="log_fourier"``) ----

mpmath = pytest.importorskip("mpmath")


def mp_features(value: float, period: float) -> tuple[float, float]:
    """sin(2 pi v / T) and 1 - cos(2 pi v / T) at 60 digits, for the exact float32 v and the exact float64 T."""
    with mpmath.workdps(60):
        angle = 2 * mpmath.pi * mpmath.mpf(value) / mpmath.mpf(period)
        return float(mpmath.sin(angle)), float(1 - mpmath.cos(angle))


@pytest.mark.parametrize("value", [0.0, 1.0, -0.001, 3.25, -7.5, 123456.789, 2.0**40, -9.99e6])
@pytest.mark.parametrize("period", [0.01, 0.1, 1.0, 4.0, 10.0, 1000.0, 2.0**-3])
def test_fourier_features_match_mpmath(value, period):
    v = torch.tensor([[value]], dtype=torch.float32)
    features = fourier_features(v, (period,))  # [1, 1, 2]
    exact32 = float(np.float32(value))
    sine, versine = mp_features(exact32, period)
    assert features.dtype == torch.float64
    assert features[0, 0, 0].item() == pytest.approx(sine, abs=1e-12)
    assert features[0, 0, 1].item() == pytest.approx(versine, abs=1e-12)


@given(values=st.lists(finite32, min_size=1, max_size=12))
def test_fourier_features_vanish_at_zero_are_bounded_and_have_the_parity_of_sine_and_cosine(values):
    periods = (0.01, 0.3, 1.0, 10.0, 1e4)
    v = torch.tensor(values, dtype=torch.float32).unsqueeze(0)  # [1, S]
    features = fourier_features(v, periods)  # [1, S, 10]
    negated = fourier_features(-v, periods)
    assert features.isfinite().all()
    sines, versines = features[..., 0::2], features[..., 1::2]
    assert (sines.abs() <= 1).all() and (versines >= 0).all() and (versines <= 2).all()
    assert torch.equal(negated[..., 0::2], -sines) and torch.equal(negated[..., 1::2], versines)
    assert torch.equal(fourier_features(torch.zeros(1, 3), periods), torch.zeros(1, 3, 10, dtype=torch.float64))


def test_the_periodic_weights_start_at_zero_so_phi_starts_as_the_designs():
    torch.manual_seed(3)
    design = NumericalEmbedding(8)
    torch.manual_seed(3)
    periodic = NumericalEmbedding(8, periods=(0.1, 1.0, 10.0))
    assert periodic.w_fourier.shape == (6, 8) and bool((periodic.w_fourier == 0).all())
    v = torch.tensor([[0.0, 2.5, -1e6, 3e38]])
    assert torch.equal(design.w_num, periodic.w_num)
    assert torch.equal(design(v), periodic(v))


def test_the_periodic_weights_learn_from_the_features():
    """d/dW sum_h phi_h: each feature summed over positions, for every component."""
    emb = NumericalEmbedding(4, periods=(1.0, 4.0))
    v = torch.tensor([[0.5, 3.0]])
    emb(v).sum().backward()
    per_feature = fourier_features(v, (1.0, 4.0)).sum(dim=(0, 1)).float()  # [4]
    torch.testing.assert_close(emb.w_fourier.grad, per_feature[:, None].expand(4, 4), rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        emb.w_fourier.fill_(0.5)
    expected = signed_log1p(v)[..., None] * emb.w_num + 0.5 * fourier_features(v, (1.0, 4.0)).float().sum(-1)[..., None]
    torch.testing.assert_close(emb(v), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "periods, message",
    [
        ((), "periods must hold at least one period"),
        ((1.0, -2.0), "periods[1] must be a positive finite number, got -2.0"),
        ((1.0, float("inf")), "periods[1] must be a positive finite number, got inf"),
        ((0.0,), "periods[0] must be a positive finite number, got 0.0"),
        ((1.0, 1.0), "periods must be distinct, got 1.0 twice"),
        (("1",), "periods[0] must be a positive finite number, got '1'"),
        ((True,), "periods[0] must be a positive finite number, got True"),
    ],
)
def test_bad_periods_are_named(periods, message):
    with pytest.raises((ValueError, TypeError)) as error:
        NumericalEmbedding(4, periods=periods)
    assert message in str(error.value)


# ---- the encoding as a config field: chosen by name, checked, saved, and the design's phi by default ----

from causalqwen import CausalQwenConfig, CausalQwenForCausalLM  # noqa: E402
from causalqwen.app.tiny import build_tiny_causal_lm  # noqa: E402

SMALL = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=1)


def test_the_designs_phi_is_the_default_and_log_fourier_takes_the_decimal_periods_unless_given():
    assert CausalQwenConfig(**SMALL).number_encoding == "log"
    assert CausalQwenConfig(**SMALL).number_periods is None
    config = CausalQwenConfig(**SMALL, number_encoding="log_fourier")
    assert config.number_periods == [10.0**j for j in range(-2, 5)]
    assert CausalQwenConfig(**SMALL, number_encoding="log_fourier", number_periods=[4, 0.5]).number_periods == [
        4.0,
        0.5,
    ]


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (
            dict(number_encoding="fone"),
            ValueError,
            "config field number_encoding must be one of log, log_fourier, got 'fone'",
        ),
        (
            dict(number_encoding=None),
            ValueError,
            "config field number_encoding must be one of log, log_fourier, got None",
        ),
        (dict(number_periods=[1.0]), ValueError, 'number_periods are the periods of "log_fourier"'),
        (dict(number_encoding="log_fourier", number_periods=[]), ValueError, "number_periods must hold at least one"),
        (dict(number_encoding="log_fourier", number_periods=[1.0, -1.0]), ValueError, "number_periods[1] must be"),
        (dict(number_encoding="log_fourier", number_periods=[2.0, 2.0]), ValueError, "number_periods must be distinct"),
        (dict(number_encoding="log_fourier", number_periods="10"), TypeError, "number_periods must be a list"),
        (dict(number_encoding="log_fourier", number_periods=[1e31]), ValueError, "number_periods[0] must be"),
    ],
)
def test_a_bad_encoding_or_period_is_named(overrides, error, message):
    with pytest.raises(error) as raised:
        CausalQwenConfig(**SMALL, **overrides)
    assert message in str(raised.value)


def test_a_log_fourier_model_starts_exactly_where_the_designs_does_and_round_trips(tmp_path):
    design, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=1)
    periodic, _, _ = build_tiny_causal_lm(seed=0, init_seed=1, number_encoding="log_fourier")
    encoding = tokenizer(
        ["It costs 3.5 dollars, 12 cost 42.", "Pi is 3.14159 and -2e5 is small."], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        a = design(**encoding, labels=encoding["input_ids"])
        b = periodic(**encoding, labels=encoding["input_ids"])
    assert torch.equal(a.loss, b.loss) and torch.equal(a.loc_U, b.loc_U)
    with torch.no_grad():
        periodic.numerical_embedding.w_fourier.normal_()
        moved = periodic(**encoding, labels=encoding["input_ids"])
    assert not torch.equal(moved.loc_U, a.loc_U)  # the periodic features now reach the features z
    periodic.save_pretrained(tmp_path)
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path).eval()
    assert (
        loaded.config.number_encoding == "log_fourier"
        and loaded.config.number_periods == periodic.config.number_periods
    )
    with torch.no_grad():
        assert torch.equal(loaded(**encoding, labels=encoding["input_ids"]).loss, moved.loss)


def test_a_checkpoint_whose_config_names_another_encoding_is_refused(tmp_path):
    periodic, _, _ = build_tiny_causal_lm(seed=0, init_seed=1, number_encoding="log_fourier")
    periodic.save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(
        config.read_text().replace('"log_fourier"', '"log"').replace('"number_periods": [', '"_periods": [')
    )
    with pytest.raises(OSError, match="w_fourier"):
        CausalQwenForCausalLM.from_pretrained(tmp_path)
