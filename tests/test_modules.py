"""The numerical embedding, the abduction network and the action network, each on its own."""

import math

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from causalqwen import cauchy
from causalqwen.abduction import AbductionNetwork, inverse_softplus
from causalqwen.action import ActionNetwork
from causalqwen.embedding import NumericalEmbedding

# ---------------------------------------------------------------------------------------------
# Numerical embedding (D4)
# ---------------------------------------------------------------------------------------------


@given(values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=12))
def test_phi_is_signed_log1p_times_w_num(values):
    torch.manual_seed(0)
    emb = NumericalEmbedding(8)
    v = torch.tensor(values, dtype=torch.float32).unsqueeze(0)  # [1, S]
    phi = emb(v)  # [1, S, 8]
    w = emb.w_num.detach().double().numpy()
    vd = v.double().numpy()[0]
    expected = (np.sign(vd) * np.log1p(np.abs(vd)))[:, None] * w[None, :]
    np.testing.assert_allclose(phi[0].detach().double().numpy(), expected, rtol=1e-5, atol=1e-7)
    assert bool(torch.isfinite(phi).all())


def test_phi_of_zero_is_zero_and_w_num_is_a_learnable_unit_vector():
    emb = NumericalEmbedding(64)
    assert emb.w_num.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert emb.w_num.requires_grad
    assert bool((emb(torch.zeros(2, 3)) == 0).all())
    emb(torch.tensor([[99.9]])).sum().backward()
    # d/dw sum_h phi_h = ln(1 + 99.9) for every component
    torch.testing.assert_close(emb.w_num.grad, torch.full((64,), math.log1p(99.9)), rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------
# Abduction network (D6)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1e-6, 0.1, 1.0, 10.0, 50.0, 1e4])
def test_inverse_softplus_against_mpmath(gamma):
    with mp.workdps(40):
        expected = float(mp.log(mp.expm1(mp.mpf(gamma))))
    assert inverse_softplus(gamma) == pytest.approx(expected, rel=1e-14, abs=1e-300)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_inverse_softplus_rejects_values_outside_softplus_range(bad):
    with pytest.raises(ValueError, match="softplus only takes values > 0"):
        inverse_softplus(bad)


def test_abduction_init_is_identity_location_and_constant_scale():
    net = AbductionNetwork(16, 16, scale_init=10.0)
    z = torch.randn(2, 5, 16) * 100
    loc_U, scale_U = net(z)
    torch.testing.assert_close(loc_U, z, rtol=0, atol=0)
    torch.testing.assert_close(scale_U, torch.full_like(z, 10.0), rtol=1e-6, atol=0)


def test_abduction_scale_is_clamped_at_scale_eps():
    net = AbductionNetwork(4, 4, scale_init=1.0, scale_eps=1e-3)
    with torch.no_grad():
        net.b_scale.fill_(-200.0)  # softplus(-200) underflows to 0 in float32
    _, scale_U = net(torch.zeros(1, 1, 4))
    assert bool((scale_U == 1e-3).all())


def test_abduction_requires_causal_size_equal_hidden_size():
    with pytest.raises(ValueError, match=r"causal_size \(8\) must equal hidden_size \(16\)"):
        AbductionNetwork(16, 8)


# ---------------------------------------------------------------------------------------------
# Action network (D7)
# ---------------------------------------------------------------------------------------------


def _action(C=6, V=9, noise_init=0.1, seed=0):
    torch.manual_seed(seed)
    net = ActionNetwork(C, V, noise_init=noise_init).double()
    with torch.no_grad():
        net.classification_head.weight.normal_()
        net.classification_head.bias.normal_()
    return net


def test_action_forward_is_noise_infusion_then_linear_closure():
    net = _action()
    g = torch.Generator().manual_seed(1)
    loc_U = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    scale_U = torch.rand(2, 3, 6, generator=g, dtype=torch.float64) + 0.1
    out = net(loc_U, scale_U)
    W, b = net.classification_head.weight.detach(), net.classification_head.bias.detach()
    w, c = net.regression_head.weight.detach()[0], net.regression_head.bias.detach()[0]
    fused = scale_U + net.b_noise.detach().abs()  # scale_U + |b_noise|
    # float64 einsum oracle of the closed forms in D7
    torch.testing.assert_close(out.loc_S, torch.einsum("bsc,vc->bsv", loc_U, W) + b)
    torch.testing.assert_close(out.scale_S, torch.einsum("bsc,vc->bsv", fused, W.abs()))
    torch.testing.assert_close(out.loc_Y, torch.einsum("bsc,c->bs", loc_U, w) + c)
    torch.testing.assert_close(out.scale_Y, torch.einsum("bsc,c->bs", fused, w.abs()))
    torch.testing.assert_close(net.noise_scale, torch.full((6,), 0.1, dtype=torch.float64), rtol=1e-7, atol=0)
    # decide() adds no noise
    direct = net.decide(loc_U, scale_U)
    torch.testing.assert_close(direct.scale_S, torch.einsum("bsc,vc->bsv", scale_U, W.abs()))


def test_locations_alone_equal_the_decisions_locations():
    """`locations` (what traditional sampling needs) is the float64 closed form, and bit-equal to `decide`'s."""
    net = _action()
    g = torch.Generator().manual_seed(4)
    loc = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    scale = torch.rand(2, 3, 6, generator=g, dtype=torch.float64)
    loc_S, loc_Y = net.locations(loc)
    W, b = net.classification_head.weight.detach(), net.classification_head.bias.detach()
    w, c = net.regression_head.weight.detach()[0], net.regression_head.bias.detach()[0]
    torch.testing.assert_close(loc_S, torch.einsum("bsc,vc->bsv", loc, W) + b)
    torch.testing.assert_close(loc_Y, torch.einsum("bsc,c->bs", loc, w) + c)
    decided = net.decide(loc, scale)
    assert torch.equal(loc_S, decided.loc_S) and torch.equal(loc_Y, decided.loc_Y)


def test_action_init_values():
    net = ActionNetwork(32, 50, noise_init=0.25)
    assert bool((net.b_noise == 0.25).all())
    assert bool((net.classification_head.bias == 0).all()) and bool((net.regression_head.bias == 0).all())
    bound = math.sqrt(6.0 / (32 + 1))  # Xavier-uniform bound for a [1, 32] weight
    w = net.regression_head.weight
    assert bool((w.abs() <= bound).all()) and w.abs().max().item() > 0.5 * bound


def test_noise_infused_decision_monte_carlo_ks():
    """Sample U and the exogenous noise, push through the linear heads, compare with the closed form."""
    net = _action(C=4, V=3, noise_init=0.7, seed=2)
    loc_U = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    scale_U = torch.tensor([0.3, 1.0, 0.2, 2.0], dtype=torch.float64)
    rng = np.random.default_rng(5)
    n = 20_000
    u = stats.cauchy.rvs(loc=loc_U.numpy(), scale=scale_U.numpy(), size=(n, 4), random_state=rng)
    eps = stats.cauchy.rvs(loc=0.0, scale=0.7, size=(n, 4), random_state=rng)
    W = net.classification_head.weight.detach().numpy()
    b = net.classification_head.bias.detach().numpy()
    scores = (u + eps) @ W.T + b  # [n, V]
    out = net(loc_U, scale_U)
    for k in range(3):
        law = stats.cauchy(loc=out.loc_S[k].item(), scale=out.scale_S[k].item())
        assert stats.kstest(scores[:, k], law.cdf).pvalue > 1e-3
    y = (u + eps) @ net.regression_head.weight.detach().numpy()[0] + net.regression_head.bias.item()
    assert stats.kstest(y, stats.cauchy(loc=out.loc_Y.item(), scale=out.scale_Y.item()).cdf).pvalue > 1e-3


def test_b_noise_gradient_nonzero_at_default_init_and_zero_at_zero_init():
    """The documented pitfall: d|b|/db = 0 at b = 0 in PyTorch, so a zero-initialised noise never learns."""
    loc_U = torch.randn(2, 3, 6, dtype=torch.float64)
    scale_U = torch.rand(2, 3, 6, dtype=torch.float64) + 0.1
    labels = torch.randint(0, 9, (2, 3))
    for noise_init, expect_zero in ((0.1, False), (0.0, True)):
        net = _action(noise_init=noise_init)
        out = net(loc_U, scale_U)
        from causalqwen.losses import ovr_classification_loss

        ovr_classification_loss(out.loc_S, out.scale_S, labels, threshold=1.0).sum().backward()
        grad = net.b_noise.grad
        assert bool(torch.isfinite(grad).all())
        assert bool((grad == 0).all()) == expect_zero, (noise_init, grad)


def test_decision_scales_are_clamped_at_scale_eps():
    net = ActionNetwork(3, 4, noise_init=0.0, scale_eps=1e-4)
    with torch.no_grad():
        net.classification_head.weight.zero_()  # an all-zero row would give scale_S = 0
    out = net.decide(torch.zeros(3), torch.ones(3))
    assert bool((out.scale_S == 1e-4).all())
    assert cauchy.log_prob(torch.zeros(4), out.loc_S, out.scale_S).isfinite().all()
