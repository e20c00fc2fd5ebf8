"""The numerical embedding (decision D4), `causalqwen.embedding`: phi(v) = sign(v) ln(1 + |v|) w_num, against NumPy
in float64 and as Hypothesis properties of the formula (odd, monotone, zero at zero)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from causalqwen.embedding import NumericalEmbedding, signed_log1p

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
