"""The Cauchy toolkit against independent oracles: SciPy, mpmath at 50 digits, and Monte Carlo."""

import itertools
import math
import threading

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats
from wall_clock import budget

from causalqwen import cauchy

DTYPES = [torch.float32, torch.float64]
# Relative tolerance against a float64 oracle evaluated on the same (already rounded) inputs.
RTOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def _mp_log_sf(t: float) -> float:
    """log P(T > t) for a standard Cauchy T, by the textbook formula in 250-digit arithmetic.

    250 digits leave > 100 correct digits after the cancellation in 1/2 - atan(t)/pi for |t| < 1e140.
    """
    with mp.workdps(250):
        return float(mp.log(mp.mpf(1) / 2 - mp.atan(mp.mpf(t)) / mp.pi))


def _mp_log_sf_xls(x: float, loc: float, scale: float) -> float:
    with mp.workdps(250):
        return _mp_log_sf((mp.mpf(x) - mp.mpf(loc)) / mp.mpf(scale))


def _mp_log_pdf(x: float, loc: float, scale: float) -> float:
    with mp.workdps(60):
        z = (mp.mpf(x) - mp.mpf(loc)) / mp.mpf(scale)
        return float(-mp.log(mp.pi * mp.mpf(scale)) - mp.log(1 + z * z))


def _rel_err(value: float, reference: float, dtype) -> float:
    floor = torch.finfo(dtype).tiny  # below this a float has fewer significant bits (subnormal)
    return abs(value - reference) / max(abs(reference), floor)


# ---------------------------------------------------------------------------------------------
# Elementwise functions against SciPy
# ---------------------------------------------------------------------------------------------

params = st.tuples(
    st.floats(-1e6, 1e6),  # x
    st.floats(-1e6, 1e6),  # loc
    st.floats(-6, 6).map(lambda e: 10.0**e),  # scale, log-uniform
)


@pytest.mark.parametrize("dtype", DTYPES)
@given(values=st.lists(params, min_size=1, max_size=16))
def test_elementwise_functions_match_scipy(dtype, values):
    x, loc, scale = (torch.tensor(v, dtype=dtype) for v in zip(*values))
    xn, ln, sn = (t.double().numpy() for t in (x, loc, scale))  # the oracle sees the rounded inputs
    oracle = stats.cauchy(loc=ln, scale=sn)
    checks = {
        "log_prob": (cauchy.log_prob(x, loc, scale), oracle.logpdf(xn)),
        "nll": (cauchy.nll(x, loc, scale), -oracle.logpdf(xn)),
        "prob": (cauchy.prob(x, loc, scale), oracle.pdf(xn)),
        "cdf": (cauchy.cdf(x, loc, scale), oracle.cdf(xn)),
        "sf": (cauchy.sf(x, loc, scale), oracle.sf(xn)),
        "log_cdf": (cauchy.log_cdf(x, loc, scale), oracle.logcdf(xn)),
        "log_sf": (cauchy.log_sf(x, loc, scale), oracle.logsf(xn)),
    }
    for name, (ours, ref) in checks.items():
        assert ours.dtype == dtype, name
        # z = (x - loc)/scale is formed in the working precision: allow its rounding, scaled by |z|
        np.testing.assert_allclose(ours.double().numpy(), ref, rtol=RTOL[dtype], atol=0, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
@given(values=st.lists(params, min_size=1, max_size=16), p=st.floats(1e-6, 1 - 1e-6))
def test_icdf_matches_scipy_ppf(dtype, values, p):
    _, loc, scale = (torch.tensor(v, dtype=dtype) for v in zip(*values))
    p_t = torch.full_like(loc, p)
    ours = cauchy.icdf(p_t, loc, scale).double().numpy()
    ref = stats.cauchy.ppf(p_t.double().numpy(), loc=loc.double().numpy(), scale=scale.double().numpy())
    # error relative to the spread: loc + scale * tan(...) rounds at the size of |loc| + |scale z|
    z = np.abs(stats.cauchy.ppf(p))
    spread = np.abs(loc.double().numpy()) + scale.double().numpy() * max(z, 1.0)
    np.testing.assert_array_less(np.abs(ours - ref), 8 * torch.finfo(dtype).eps * spread + 1e-300)


def test_icdf_small_p_keeps_precision():
    """-cot(pi p) for small p: 0.5 - p would round p away in float32."""
    p = torch.tensor([1e-10, 1e-20, 1e-30], dtype=torch.float32)
    ours = cauchy.icdf(p, 0.0, 1.0).double().numpy()
    ref = stats.cauchy.ppf(p.double().numpy())
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    assert cauchy.icdf(torch.tensor(0.0), 0.0, 1.0).item() == -math.inf
    assert cauchy.icdf(torch.tensor(1.0), 0.0, 1.0).item() == math.inf
    assert cauchy.icdf(torch.tensor(0.5), 3.0, 2.0).item() == 3.0


@pytest.mark.parametrize(
    "dtype, p, scale, rtol",
    [
        (torch.float32, 1e-40, 1e-10, 1e-4),  # cot(pi p) = 3e39 is beyond float32; gamma cot(pi p) = 3e29 is not
        (torch.float64, 1e-310, 1e-300, 1e-12),
        (torch.float32, 1e-38, 1e-30, 1e-6),
    ],
)
def test_icdf_is_finite_where_the_quantile_is_although_cot_overflows(dtype, p, scale, rtol):
    r"""A subnormal p beside a small scale: $F^{-1}(p) = \mu - \gamma\cot(\pi p)$ is finite while $\cot(\pi p)$
    alone overflows; the quotient $-\gamma/\tan(\pi p)$ keeps it finite (oracle: mpmath at 400 digits, so
    that p survives p - 1/2, at the inputs as stored)."""
    p_t, scale_t = torch.tensor(p, dtype=dtype), torch.tensor(scale, dtype=dtype)
    with mp.workdps(400):
        expected = float(mp.mpf(scale_t.item()) * mp.tan(mp.pi * (mp.mpf(p_t.item()) - mp.mpf(1) / 2)))
    got = cauchy.icdf(p_t, torch.tensor(0.0, dtype=dtype), scale_t).item()
    assert math.isfinite(got) and got == pytest.approx(expected, rel=rtol)


# ---------------------------------------------------------------------------------------------
# Far tails against mpmath
# ---------------------------------------------------------------------------------------------

TAIL_T = [1.0, 10.0, 1e4, 1e8, 1e12, 1e20, 1e30, 3e38]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", TAIL_T + [-t for t in TAIL_T])
def test_log_sf_and_log_cdf_far_tail_relative_error(dtype, t):
    """The tail accuracy table: relative error <= 1e-5 in float32 for |t| up to 1e8 and far beyond."""
    x = torch.tensor(t, dtype=dtype)
    tv = x.item()
    for fn, ref in ((cauchy.log_sf, _mp_log_sf(tv)), (cauchy.log_cdf, _mp_log_sf(-tv))):
        err = _rel_err(fn(x, 0.0, 1.0).item(), ref, dtype)
        assert err <= (1e-5 if dtype == torch.float32 else 1e-13), (fn.__name__, t, err)


@pytest.mark.parametrize(
    "x, loc, scale",
    [
        (3e38, -3e38, 1e-30),  # x - loc overflows, z would be 6e68
        (-3e38, 3e38, 1.0),
        (1e30, 0.0, 1e-30),  # z overflows in float32
        (1e-30, 0.0, 1e30),  # z underflows
        (5.0, 5.0, 1e-38),  # exactly at the location
    ],
)
def test_extreme_inputs_are_exact_and_finite_in_float32(x, loc, scale):
    xt, lt, st_ = (torch.tensor(v, dtype=torch.float32) for v in (x, loc, scale))
    xv, lv, sv = xt.item(), lt.item(), st_.item()
    refs = {
        cauchy.log_sf: _mp_log_sf_xls(xv, lv, sv),
        cauchy.log_cdf: _mp_log_sf_xls(lv, xv, sv),
        cauchy.log_prob: _mp_log_pdf(xv, lv, sv),
    }
    for fn, ref in refs.items():
        value = fn(xt, lt, st_).item()
        assert math.isfinite(value)
        assert _rel_err(value, ref, torch.float32) <= 1e-5, (fn.__name__, value, ref)


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
positive32 = st.floats(1e-30, 1e30).map(lambda v: float(np.float32(v)))


def _mp_values_and_gradients(x: float, loc: float, scale: float) -> dict:
    r"""Each function's value and $(\partial_x, \partial_\mu, \partial_\gamma)$ at 60 digits, from the textbook
    formulas.

    The tail masses are $\arctan(1/|z|)/\pi$ beyond the location (the same numbers as $\tfrac12 \mp \arctan(z)/\pi$,
    without their cancellation), so 60 digits are exact for any float32 input; derivatives by hand:
    $\partial_x \log f = -2z/(\gamma(1+z^2))$, $\partial_\gamma \log f = (z^2 - 1)/(\gamma(1+z^2))$,
    $\partial_x \mathrm{sf} = -f$, $\partial_\gamma \mathrm{sf} = z f$."""
    with mp.workdps(60):
        x, loc, scale = mp.mpf(x), mp.mpf(loc), mp.mpf(scale)
        z = (x - loc) / scale
        density = 1 / (mp.pi * scale * (1 + z * z))

        def upper_mass(t):  # P(T > t) for a standard Cauchy T
            return mp.atan(1 / t) / mp.pi if t > 0 else mp.mpf(1) / 2 + mp.atan(-t) / mp.pi

        sf, cdf = upper_mass(z), upper_mass(-z)
        log_prob = (
            -mp.log(mp.pi * scale) - mp.log(1 + z * z),
            -2 * z / (scale * (1 + z * z)),
            (z * z - 1) / (scale * (1 + z * z)),
        )
        sf_ = (sf, -density, z * density)
        cdf_ = (cdf, density, -z * density)
        values = {
            "log_prob": log_prob,
            "nll": tuple(-v for v in log_prob),
            "sf": sf_,
            "cdf": cdf_,
            "log_sf": (mp.log(sf), sf_[1] / sf, sf_[2] / sf),
            "log_cdf": (mp.log(cdf), cdf_[1] / cdf, cdf_[2] / cdf),
        }
        # (value, d/dx, d/dloc, d/dscale), and the size of the terms that cancel in log_prob's value and d/dscale
        terms = abs(mp.log(mp.pi * scale)) + mp.log(1 + z * z)
        return {
            name: ([float(v), float(dx), float(-dx), float(ds)], float(terms), float(1 / scale))
            for name, (v, dx, ds) in values.items()
        }


@given(x=finite32, loc=finite32, scale=positive32)
def test_log_prob_nll_tails_and_their_gradients_match_mpmath_for_any_finite_float32(x, loc, scale):
    r"""Value and all three partial derivatives of each function, for any finite float32 input, within 1e-5 relative
    of the 60-digit textbook value (`_mp_values_and_gradients`); where the exact value sits below the smallest
    normal float32, within 1e-5 of it. ``log_prob``'s value is a difference $-\log(\pi\gamma) - \log(1 + z^2)$
    and its $\partial_\gamma$ one of $1/\gamma$-sized terms: there the error is measured against those terms."""
    inputs = [torch.tensor(v, dtype=torch.float32, requires_grad=True) for v in (x, loc, scale)]
    reference = _mp_values_and_gradients(*(t.item() for t in inputs))
    tiny = torch.finfo(torch.float32).tiny
    for name, (expected, terms, inverse_scale) in reference.items():
        value = getattr(cauchy, name)(*inputs)
        gradients = torch.autograd.grad(value, inputs)
        got = [value.item()] + [g.item() for g in gradients]
        sizes = [max(abs(e), tiny) for e in expected]
        if name in ("log_prob", "nll"):
            sizes[0], sizes[3] = max(sizes[0], terms), max(sizes[3], inverse_scale)
        for what, g, e, size in zip(("value", "d/dx", "d/dloc", "d/dscale"), got, expected, sizes):
            assert math.isfinite(g) and abs(g - e) <= 1e-5 * size, (name, what, g, e)


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------

GRAD_FUNCTIONS = [cauchy.log_prob, cauchy.nll, cauchy.prob, cauchy.cdf, cauchy.sf, cauchy.log_cdf, cauchy.log_sf]


@pytest.mark.parametrize("fn", GRAD_FUNCTIONS, ids=lambda f: f.__name__)
def test_gradcheck_float64_near_and_far(fn):
    g = torch.Generator().manual_seed(0)
    # a mix of positions close to the location (|z| < 1) and far from it (|z| up to ~1e6), both signs
    x = torch.cat([torch.randn(6, generator=g), torch.randn(6, generator=g) * 1e3]).double()
    loc = torch.randn(12, generator=g).double()
    scale = torch.rand(12, generator=g).double() * 2 + 0.01
    inputs = tuple(t.clone().requires_grad_() for t in (x, loc, scale))
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-4)


def test_gradients_broadcast_to_input_shapes():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    loc = torch.randn(3, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    cauchy.log_sf(x, loc, scale).sum().backward()
    assert loc.grad.shape == (3,) and scale.grad.shape == ()
    # d/dloc = -sum over the broadcast rows of d/dx
    torch.testing.assert_close(loc.grad, -x.grad.sum(0))


def test_far_tail_gradient_matches_float64_analytic():
    """d/dx log sf = -f/sf -> -1/(x - loc) in the upper tail; d/dscale log sf -> 1/scale."""
    x = torch.tensor([1e10, 1e20, 1e30], dtype=torch.float32, requires_grad=True)
    scale = torch.tensor([1.0, 1e-5, 3.0], dtype=torch.float32, requires_grad=True)
    cauchy.log_sf(x, 0.0, scale).sum().backward()
    with mp.workdps(50):
        for i in range(3):
            xv, sv = mp.mpf(x[i].item()), mp.mpf(scale[i].item())
            z = xv / sv
            sf_v = mp.atan(1 / z) / mp.pi
            pdf_z = 1 / (mp.pi * (1 + z * z))
            assert _rel_err(x.grad[i].item(), float(-pdf_z / sf_v / sv), torch.float32) < 1e-5
            assert _rel_err(scale.grad[i].item(), float(z * pdf_z / sf_v / sv), torch.float32) < 1e-5


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


@given(values=st.lists(params, min_size=1, max_size=8))
def test_symmetry_and_complement(values):
    x, loc, scale = (torch.tensor(v, dtype=torch.float64) for v in zip(*values))
    mirrored = 2 * loc - x
    torch.testing.assert_close(cauchy.sf(x, loc, scale), cauchy.cdf(mirrored, loc, scale), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(cauchy.cdf(x, loc, scale) + cauchy.sf(x, loc, scale), torch.ones_like(x))
    torch.testing.assert_close(
        cauchy.log_sf(x, loc, scale), cauchy.log_cdf(mirrored, loc, scale), rtol=1e-9, atol=1e-12
    )


@given(values=st.lists(params, min_size=1, max_size=8), shift=st.floats(1e-3, 1e3))
def test_cdf_monotone_in_x(values, shift):
    x, loc, scale = (torch.tensor(v, dtype=torch.float64) for v in zip(*values))
    assert bool((cauchy.cdf(x + shift, loc, scale) >= cauchy.cdf(x, loc, scale)).all())
    assert bool((cauchy.log_sf(x + shift, loc, scale) <= cauchy.log_sf(x, loc, scale)).all())


@given(values=st.lists(params, min_size=1, max_size=8))
def test_icdf_inverts_cdf(values):
    x, loc, scale = (torch.tensor(v, dtype=torch.float64) for v in zip(*values))
    p = cauchy.cdf(x, loc, scale)
    back = cauchy.icdf(p, loc, scale)
    # the round trip is limited by the conditioning of the cdf at x: |dx| ~ eps * p / f(x)
    tolerance = 64 * torch.finfo(torch.float64).eps * (x.abs() + loc.abs() + scale * (1 + ((x - loc) / scale) ** 2))
    assert bool(((back - x).abs() <= tolerance).all())


# ---------------------------------------------------------------------------------------------
# Sampling and linear closure (Monte Carlo with fixed seeds, KS tests)
# ---------------------------------------------------------------------------------------------


def test_rsample_equals_icdf_and_is_cauchy():
    g = torch.Generator().manual_seed(1)
    uniform = torch.rand(20_000, generator=g, dtype=torch.float64)
    loc, scale = torch.tensor(1.5, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)
    draws = cauchy.rsample(loc, scale, uniform)
    torch.testing.assert_close(draws, cauchy.icdf(uniform, loc, scale), rtol=0, atol=0)
    assert stats.kstest(draws.numpy(), stats.cauchy(loc=1.5, scale=0.7).cdf).pvalue > 1e-3


def test_rsample_is_reparameterized():
    """d draw / d loc = 1 and d draw / d scale = (draw - loc) / scale."""
    loc = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    uniform = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    draws = cauchy.rsample(loc, scale, uniform)
    draws.sum().backward()
    assert loc.grad.item() == pytest.approx(3.0)
    assert scale.grad.item() == pytest.approx(((draws - 0.3) / 2.0).sum().item())


def test_linear_exact_formula_against_float64_loops():
    g = torch.Generator().manual_seed(2)
    loc, scale = torch.randn(2, 3, 5, generator=g), torch.rand(2, 3, 5, generator=g) + 0.1
    weight, bias = torch.randn(4, 5, generator=g), torch.randn(4, generator=g)
    loc_out, scale_out = cauchy.linear(loc, scale, weight, bias)
    L, S, W, b = (t.double().numpy() for t in (loc, scale, weight, bias))
    for i in range(2):
        for j in range(3):
            for k in range(4):
                assert loc_out[i, j, k].item() == pytest.approx(
                    sum(W[k, c] * L[i, j, c] for c in range(5)) + b[k], rel=1e-5
                )
                assert scale_out[i, j, k].item() == pytest.approx(
                    sum(abs(W[k, c]) * S[i, j, c] for c in range(5)), rel=1e-5
                )


def test_linear_closure_monte_carlo_ks():
    rng = np.random.default_rng(3)
    loc = np.array([0.5, -1.0, 2.0])
    scale = np.array([0.3, 1.5, 0.8])
    weight = np.array([[1.0, -2.0, 0.5], [-0.3, 0.0, 4.0]])
    bias = np.array([0.25, -1.0])
    x = stats.cauchy.rvs(loc=loc, scale=scale, size=(20_000, 3), random_state=rng)
    y = x @ weight.T + bias
    loc_out, scale_out = cauchy.linear(torch.tensor(loc), torch.tensor(scale), torch.tensor(weight), torch.tensor(bias))
    for k in range(2):
        law = stats.cauchy(loc=loc_out[k].item(), scale=scale_out[k].item())
        assert stats.kstest(y[:, k], law.cdf).pvalue > 1e-3


def test_sum_of_independent_cauchys_is_cauchy_with_added_scales():
    """Noise infusion: U + eps with eps ~ Cauchy(0, |b|) is Cauchy(loc, scale + |b|)."""
    rng = np.random.default_rng(4)
    u = stats.cauchy.rvs(loc=1.0, scale=2.0, size=30_000, random_state=rng)
    noise = stats.cauchy.rvs(loc=0.0, scale=0.5, size=30_000, random_state=rng)
    assert stats.kstest(u + noise, stats.cauchy(loc=1.0, scale=2.5).cdf).pvalue > 1e-3
    # and the same through the toolkit: a [1, 1] identity "linear" of the pair is the sum
    loc_out, scale_out = cauchy.linear(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.5]), torch.tensor([[1.0, 1.0]]))
    assert loc_out.item() == 1.0 and scale_out.item() == 2.5


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", GRAD_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad_scale", [0.0, -1.0, math.nan])
def test_non_positive_scale_is_rejected(fn, bad_scale):
    with pytest.raises(ValueError, match="scale must be > 0"):
        fn(torch.tensor([0.0, 1.0]), 0.0, torch.tensor([1.0, bad_scale]))


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="p must lie in"):
        cauchy.icdf(torch.tensor([1.5]), 0.0, 1.0)
    with pytest.raises(ValueError, match="scale must be > 0"):
        cauchy.rsample(0.0, -2.0, torch.tensor([0.5]))
    with pytest.raises(ValueError, match="scale must be > 0"):
        cauchy.linear(torch.zeros(3), torch.tensor([1.0, 0.0, 1.0]), torch.ones(2, 3))
    with pytest.raises(ValueError, match="last dimension"):
        cauchy.linear(torch.zeros(3), torch.ones(3), torch.ones(2, 4))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        cauchy.log_prob("1.0", 0.0, 1.0)
    with pytest.raises(TypeError, match="weight must be"):
        cauchy.linear(torch.zeros(3), torch.ones(3), [[1.0, 2.0, 3.0]])


# ---------------------------------------------------------------------------------------------
# The OvR tail kernel: a(d, s) = -log P(X > d), X ~ Cauchy(0, s), and its derivatives
# ---------------------------------------------------------------------------------------------


@given(
    values=st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-4, 4).map(lambda e: 10.0**e)), min_size=1, max_size=16)
)
def test_tail_terms_value_and_derivatives_match_scipy(values):
    diff, scale = (torch.tensor(v, dtype=torch.float64) for v in zip(*values))
    terms = cauchy.tail_terms(diff, scale, grads=True)
    d, s = diff.numpy(), scale.numpy()
    np.testing.assert_allclose(terms.value.numpy(), -stats.cauchy.logsf(d, 0.0, s), rtol=1e-12, atol=1e-300)
    hazard = stats.cauchy.pdf(d, 0.0, s) / stats.cauchy.sf(d, 0.0, s)  # d a / d d = f / sf
    np.testing.assert_allclose(terms.d_diff.numpy(), hazard, rtol=1e-9)
    np.testing.assert_allclose(terms.d_scale.numpy(), -(d / s) * hazard, rtol=1e-9, atol=1e-300)  # d/ds = -t f / sf


def test_tail_terms_in_the_far_tails_against_mpmath():
    for d, s in [(1e30, 1e-6), (-1e30, 1e-6), (3e20, 1.0), (-7.5, 1e-30), (1e-20, 1.0)]:
        for dtype, rtol in ((torch.float64, 1e-13), (torch.float32, 2e-6)):
            d_, s_ = torch.tensor(d, dtype=dtype), torch.tensor(s, dtype=dtype)
            value = float(cauchy.tail_terms(d_, s_).value)
            with mp.workdps(120):  # 1/2 - atan(t)/pi cancels ~70 digits at t = 1e36
                exact = -mp.log(mp.mpf(1) / 2 - mp.atan(mp.mpf(float(d_)) / mp.mpf(float(s_))) / mp.pi)
            assert math.isfinite(value)
            assert value == pytest.approx(float(exact), rel=rtol, abs=1e-300), (d, s, dtype)


def test_tail_nll_gradients_and_second_derivatives_by_finite_differences():
    diff = torch.tensor([-30.0, -3.0, -0.2, 0.0, 0.4, 5.0, 40.0], dtype=torch.float64, requires_grad=True)
    scale = torch.tensor([0.7, 1.0, 2.0, 0.5, 1.0, 0.3, 2.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(cauchy.tail_nll, (diff, scale))
    # second derivatives (the literal path's Hessian) away from d = 0, where |d| and the branch switch are not smooth
    off_zero = diff.detach()[diff != 0].requires_grad_(), scale.detach()[diff != 0].requires_grad_()
    assert torch.autograd.gradgradcheck(cauchy.tail_nll, off_zero)


# ---------------------------------------------------------------------------------------------
# log_interval_prob on its whole domain: -inf <= a < b <= +inf, finite loc, 0 < scale < inf
# ---------------------------------------------------------------------------------------------


def _mp_log_interval(low, high, loc, scale, digits: int = 400) -> float:
    """log P(a < X <= b) at 400 digits (the floats exactly) from the tail masses T(d) = P(X - loc > d) =
    atan2(scale, d) / pi, which keep their relative precision however far out: T(a - loc) - T(b - loc) above the
    location, T(loc - b) - T(loc - a) below it, 1 - T(b - loc) - T(loc - a) across it. The ends may be floats or
    mpmath numbers (read exactly at ``digits``)."""
    with mp.workdps(digits):
        loc, scale = mp.mpf(loc), mp.mpf(scale)

        def tail(distance):
            return (
                mp.mpf(0)
                if distance == mp.inf
                else mp.mpf(1)
                if distance == -mp.inf
                else mp.atan2(scale, distance) / mp.pi
            )

        low, high = mp.mpf(low), mp.mpf(high)
        if low >= loc:
            probability = tail(low - loc) - tail(high - loc)
        elif high <= loc:
            probability = tail(loc - high) - tail(loc - low)
        else:
            probability = 1 - tail(high - loc) - tail(loc - low)
        return float(mp.log(probability))


D64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
INF = math.inf


@pytest.mark.parametrize(
    "low, high, loc, scale",
    [
        (-INF, 2.0, 0.0, 1.0),
        (2.0, INF, 0.0, 1.0),
        (-INF, -1e300, 0.0, 1.0),
        (1e300, INF, 0.0, 1e-300),
        (-INF, 0.0, 0.0, 1.0),
        (0.0, INF, 0.0, 1.0),
        (-INF, 5.0, 7.0, 1e-3),
        (-5.0, INF, 1e3, 10.0),
        (1.7e308, 1.79e308, 0.0, 1.0),
        (-1.79e308, -1.7e308, 0.0, 1.0),
        (1.7e308, 1.79e308, -1.7e308, 1e-300),
        (-1.7e308, 1.7e308, 1e308, 1e-300),
        (1.79e308, INF, -1.79e308, 1.0),
        (-1.79e308, 1.79e308, 0.0, 1e308),
        (5e-324, 1e-323, 0.0, 1.0),
        (0.0, 5e-324, 0.0, 1e-300),
    ],
)
def test_log_interval_prob_with_infinite_and_extreme_ends_against_mpmath(low, high, loc, scale):
    """Infinite ends give P(X <= b) and P(X > a); ends near float64's limits (where x - loc overflows) and
    subnormal ends give the finite answer."""
    value = cauchy.log_interval_prob(D64(low), D64(high), D64(loc), D64(scale)).item()
    assert math.isfinite(value)
    assert value == pytest.approx(_mp_log_interval(low, high, loc, scale), rel=1e-12, abs=1e-300)


@pytest.mark.parametrize(
    "low, high, loc, scale",
    [
        (-1e10, 1e10, 0.0, 1.0),
        (-1e300, 1e300, 3.0, 1.0),
        (-1.0, 1e200, 0.0, 1e-10),
        (-10.0, 10.0, 0.5, 1.0),
    ],
)
def test_an_interval_holding_nearly_all_the_mass_keeps_relative_precision(low, high, loc, scale):
    """log P is then about minus the tails (-2e-10 for (-1e10, 1e10)): computed as log1p(-tails), not log of a
    difference of arctangents that rounds to pi."""
    with mp.workdps(400):
        tails = (
            mp.atan(mp.mpf(scale) / (mp.mpf(loc) - mp.mpf(low))) + mp.atan(mp.mpf(scale) / (mp.mpf(high) - mp.mpf(loc)))
        ) / mp.pi
        expected = float(mp.log1p(-tails))
    value = cauchy.log_interval_prob(D64(low), D64(high), D64(loc), D64(scale)).item()
    assert value == pytest.approx(expected, rel=1e-12)


def test_log_interval_prob_takes_python_numbers_as_float64():
    """The result is float64, and so are Python numbers: 1.7e308 is not float32's inf."""
    value = cauchy.log_interval_prob(1.7e308, 1.79e308, 0.0, 1.0)
    assert value.dtype == torch.float64
    assert value.item() == pytest.approx(_mp_log_interval(1.7e308, 1.79e308, 0.0, 1.0), rel=1e-12)
    assert cauchy.log_interval_prob(-INF, 1, 0, 1).item() == pytest.approx(stats.cauchy.logcdf(1.0), rel=1e-12)


def test_log_interval_prob_of_the_whole_line_is_zero_and_of_a_half_line_is_log_half():
    assert cauchy.log_interval_prob(D64(-INF), D64(INF), D64(3.0), D64(2.0)).item() == 0.0
    assert cauchy.log_interval_prob(D64(-INF), D64(3.0), D64(3.0), D64(2.0)).item() == pytest.approx(-math.log(2))
    assert cauchy.log_interval_prob(D64(3.0), D64(INF), D64(3.0), D64(2.0)).item() == pytest.approx(-math.log(2))


@settings(max_examples=200)
@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.floats(1e-3, 1e3), st.booleans())
def test_log_interval_prob_with_one_infinite_end_is_scipys_log_cdf_or_log_sf(end, loc, scale, upper):
    """(-inf, b] is log F(b); (a, +inf) is log S(a): SciPy's logcdf and logsf."""
    if upper:
        value = cauchy.log_interval_prob(D64(end), D64(INF), D64(loc), D64(scale)).item()
        expected = stats.cauchy.logsf(end, loc, scale)
    else:
        value = cauchy.log_interval_prob(D64(-INF), D64(end), D64(loc), D64(scale)).item()
        expected = stats.cauchy.logcdf(end, loc, scale)
    assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "low, high, loc, scale, error, match",
    [
        (math.nan, 1.0, 0.0, 1.0, ValueError, "low must not be NaN"),
        (0.0, math.nan, 0.0, 1.0, ValueError, "high must not be NaN"),
        (0.0, 1.0, math.nan, 1.0, ValueError, "loc must not be NaN"),
        (0.0, 1.0, INF, 1.0, ValueError, "loc must be finite"),
        (0.0, 1.0, 0.0, math.nan, ValueError, "scale must be > 0"),
        (0.0, 1.0, 0.0, -1.0, ValueError, "scale must be > 0"),
        (0.0, 1.0, 0.0, 0.0, ValueError, "scale must be > 0"),
        (0.0, 1.0, 0.0, INF, ValueError, "scale must be finite"),
        (2.0, 1.0, 0.0, 1.0, ValueError, "low must be < high.*low = 2.0 and high = 1.0"),
        (INF, INF, 0.0, 1.0, ValueError, "low must be < high"),
        ("0", 1.0, 0.0, 1.0, TypeError, "low must be a torch.Tensor"),
    ],
)
def test_log_interval_prob_names_what_is_outside_its_domain(low, high, loc, scale, error, match):
    with pytest.raises(error, match=match):
        cauchy.log_interval_prob(low, high, loc, scale)


# ---------------------------------------------------------------------------------------------
# The validation switch: cauchy.validating / validation / set_validate_args
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def restore_validate_args_default():
    yield
    cauchy.set_validate_args(True)


def test_inputs_are_checked_by_default():
    assert cauchy.validating() is True
    with pytest.raises(ValueError, match="scale must be > 0"):
        cauchy.log_prob(0.0, 0.0, -1.0)


CHECKED_CALLS = [
    ("log_prob", lambda: cauchy.log_prob(torch.tensor([0.0, 1.0]), 0.0, torch.tensor([1.0, -1.0]))),
    ("nll", lambda: cauchy.nll(torch.tensor([0.0, 1.0]), 0.0, torch.tensor([1.0, 0.0]))),
    ("prob", lambda: cauchy.prob(0.0, 0.0, math.nan)),
    ("cdf", lambda: cauchy.cdf(0.0, 0.0, -2.0)),
    ("sf", lambda: cauchy.sf(0.0, 0.0, -2.0)),
    ("log_cdf", lambda: cauchy.log_cdf(0.0, 0.0, -2.0)),
    ("log_sf", lambda: cauchy.log_sf(0.0, 0.0, -2.0)),
    ("icdf", lambda: cauchy.icdf(torch.tensor([1.5]), 0.0, 1.0)),
    ("rsample", lambda: cauchy.rsample(0.0, 1.0, torch.tensor([-0.5]))),
    ("log_interval_prob", lambda: cauchy.log_interval_prob(2.0, 1.0, 0.0, 1.0)),
    ("linear", lambda: cauchy.linear(torch.zeros(3), torch.tensor([1.0, -1.0, 1.0]), torch.ones(2, 3))),
    ("kl_divergence", lambda: cauchy.kl_divergence(0.0, 1.0, math.inf, 1.0)),
]


@pytest.mark.parametrize("call", [call for _, call in CHECKED_CALLS], ids=[name for name, _ in CHECKED_CALLS])
def test_validation_false_skips_the_value_checks_of_every_formula(call):
    """Each formula refuses an input outside its domain while validating, and computes without looking under
    ``validation(False)`` (a caller that has checked): no exception, a tensor."""
    with pytest.raises(ValueError):
        call()
    with cauchy.validation(False):
        result = call()
    assert isinstance(result, (torch.Tensor, tuple))


@given(params)
def test_validation_false_gives_the_same_numbers_and_gradients_on_valid_inputs(values):
    """The switch changes only whether inputs are looked at: values and gradients are bit for bit the same."""
    x, loc, scale = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values)
    for name in ("log_prob", "nll", "prob", "cdf", "sf", "log_cdf", "log_sf"):
        function = getattr(cauchy, name)
        checked = function(x, loc, scale)
        checked_grads = torch.autograd.grad(checked, (x, loc, scale))
        with cauchy.validation(False):
            trusted = function(x, loc, scale)
            trusted_grads = torch.autograd.grad(trusted, (x, loc, scale))
        assert torch.equal(checked, trusted), name
        assert all(torch.equal(a, b) for a, b in zip(checked_grads, trusted_grads)), name
    p = torch.tensor(0.3, dtype=torch.float64)
    with cauchy.validation(False):
        assert torch.equal(cauchy.icdf(p, loc, scale), cauchy.icdf(p, loc, scale))
        kl_trusted = cauchy.kl_divergence(x, scale, loc, scale + 1.0)
        interval_trusted = cauchy.log_interval_prob(x, x + 1.0, loc, scale)
    assert torch.equal(kl_trusted, cauchy.kl_divergence(x, scale, loc, scale + 1.0))
    assert torch.equal(interval_trusted, cauchy.log_interval_prob(x, x + 1.0, loc, scale))


def test_validation_blocks_nest_and_restore_also_on_an_exception():
    with cauchy.validation(False):
        assert cauchy.validating() is False
        with cauchy.validation(True):
            assert cauchy.validating() is True
            with pytest.raises(ValueError, match="scale must be > 0"):
                cauchy.sf(0.0, 0.0, 0.0)
        assert cauchy.validating() is False
        with pytest.raises(RuntimeError, match="raised inside"), cauchy.validation(True):
            raise RuntimeError("raised inside")
        assert cauchy.validating() is False
    assert cauchy.validating() is True


def test_set_validate_args_sets_the_default_of_every_thread(restore_validate_args_default):
    """Like torch.distributions.Distribution.set_default_validate_args: a process default, seen by new threads;
    a `validation` block still overrides it."""
    cauchy.set_validate_args(False)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(cauchy.validating()))
    thread.start()
    thread.join()
    assert seen == [False] and cauchy.validating() is False
    assert cauchy.log_prob(0.0, 0.0, -1.0).isnan().item()  # not looked at: log of a negative scale
    with cauchy.validation(True), pytest.raises(ValueError, match="scale must be > 0"):
        cauchy.log_prob(0.0, 0.0, -1.0)
    cauchy.set_validate_args(True)
    assert cauchy.validating() is True


def test_a_validation_block_belongs_to_its_own_thread():
    """Turning checks off in one thread (a generation loop) leaves every other thread checking."""
    inside, release = threading.Event(), threading.Event()
    seen = []

    def trusted_caller():
        with cauchy.validation(False):
            seen.append(cauchy.validating())
            inside.set()
            release.wait(timeout=budget(30))

    thread = threading.Thread(target=trusted_caller)
    thread.start()
    assert inside.wait(timeout=budget(30))
    try:
        assert cauchy.validating() is True
        with pytest.raises(ValueError, match="scale must be > 0"):
            cauchy.prob(0.0, 0.0, -1.0)
    finally:
        release.set()
        thread.join()
    assert seen == [False]


@pytest.mark.parametrize("value", [0, 1, None, "False", torch.tensor(False), np.bool_(False)])
def test_the_switch_takes_only_true_or_false(value, restore_validate_args_default):
    with pytest.raises(TypeError, match=r"validation\(enabled\) must be True or False"), cauchy.validation(value):
        pass
    with pytest.raises(TypeError, match=r"set_validate_args\(value\) must be True or False"):
        cauchy.set_validate_args(value)
    assert cauchy.validating() is True


# `cauchy.kl_divergence` against independent oracles.
#
# The oracles: numerical integration of $\int p \log(p/q)$ (SciPy's ``quad`` in float64, mpmath's ``quad`` at
# 50 digits), Monte Carlo draws from $p$, the textbook closed form evaluated in 50-digit arithmetic (checked
# against ``mpmath.quad`` first), its derivatives by ``mpmath.diff`` and by hand. Every oracle sees the
# inputs already rounded to the working dtype.


EPS = {dtype: torch.finfo(dtype).eps for dtype in DTYPES}


TINY = {dtype: torch.finfo(dtype).tiny for dtype in DTYPES}  # below this a float has fewer significant bits


def _kl(lp, sp, lq, sq, dtype=torch.float64):
    """The function under test on plain numbers or lists, rounded to ``dtype`` first."""
    return cauchy.kl_divergence(*(torch.tensor(v, dtype=dtype) for v in (lp, sp, lq, sq)))


def _rounded(values, dtype):
    """The numbers the function really sees: ``values`` rounded to ``dtype``, back as Python floats."""
    return [float(v) for v in torch.tensor(values, dtype=dtype).double()]


def _relative_error(value: float, reference, dtype) -> float:
    return abs(value - float(reference)) / max(abs(float(reference)), TINY[dtype])


def _scipy_kl(lp, sp, lq, sq) -> float:
    """$\\int p \\log(p/q)\\,dx$ by ``scipy.integrate.quad`` over the real line, split at both laws' quartiles."""

    def integrand(x):
        log_p = stats.cauchy.logpdf(x, loc=lp, scale=sp)
        return math.exp(log_p) * (log_p - stats.cauchy.logpdf(x, loc=lq, scale=sq))

    cuts = sorted({lp - sp, lp, lp + sp, lq - sq, lq, lq + sq})
    pieces = [(-math.inf, cuts[0])] + list(itertools.pairwise(cuts)) + [(cuts[-1], math.inf)]
    return sum(integrate.quad(integrand, a, b, epsabs=1e-13, epsrel=1e-12, limit=200)[0] for a, b in pieces)


def _mp_kl_quad(lp, sp, lq, sq):
    """$\\int p \\log(p/q)$ by ``mpmath.quad`` at 50 digits, in the variable $x = \\mu_p + \\gamma_p \\tan\\theta$.

    Then $p(x)\\,dx = d\\theta/\\pi$ and
    $\\log(p/q) = \\log(\\gamma_q/\\gamma_p) + \\log(1 + z_q^2) + \\log\\cos^2\\theta$, bounded on
    $(-\\pi/2, \\pi/2)$; breakpoints at the images of $\\mu_q + c\\gamma_q$ and $\\mu_p + c\\gamma_p$ resolve a law
    much narrower or wider than the other.
    """
    with mp.workdps(50):
        lp, sp, lq, sq = (mp.mpf(v) for v in (lp, sp, lq, sq))

        def integrand(theta):
            z_q = (lp + sp * mp.tan(theta) - lq) / sq
            return (mp.log(sq / sp) + mp.log1p(z_q * z_q) + mp.log(mp.cos(theta) ** 2)) / mp.pi

        points = set()
        for c in (0, 1):
            for sign in (-1, 1):
                points.add(mp.atan((lq + sign * c * sq - lp) / sp))
                points.add(mp.atan(sign * c))
        return mp.quad(integrand, [-mp.pi / 2, *sorted(points), mp.pi / 2])


def _closed_form(lp, sp, lq, sq):
    """The textbook closed form $\\log\\frac{(\\gamma_p+\\gamma_q)^2 + (\\mu_p-\\mu_q)^2}{4\\gamma_p\\gamma_q}$
    in mpmath's current precision, written as
    $\\operatorname{log1p}\\big(((\\gamma_p-\\gamma_q)^2 + (\\mu_p-\\mu_q)^2)/(4\\gamma_p\\gamma_q)\\big)$ so
    that 50 digits are 50 significant digits even for a divergence of 1e-300."""
    return mp.log1p(((sp - sq) ** 2 + (lp - lq) ** 2) / (4 * sp * sq))


def _mp_kl_closed(lp, sp, lq, sq):
    """The closed form at 50 digits."""
    with mp.workdps(50):
        return _closed_form(*(mp.mpf(v) for v in (lp, sp, lq, sq)))


def _mp_gradient(lp, sp, lq, sq):
    """(d/dloc_p, d/dscale_p, d/dloc_q, d/dscale_q) of the closed form, by ``mpmath.diff`` at 50 digits.

    Steps are taken relative to each argument's natural size (scales multiplicatively, locations in units
    of $\\gamma_p + \\gamma_q + |\\mu_p - \\mu_q|$), so a tiny scale or a huge location is differentiated as well.
    """
    with mp.workdps(50):
        lp, sp, lq, sq = (mp.mpf(v) for v in (lp, sp, lq, sq))
        unit = sp + sq + abs(lp - lq)
        return (
            mp.diff(lambda t: _closed_form(lp + t * unit, sp, lq, sq), 0) / unit,
            mp.diff(lambda t: _closed_form(lp, sp * (1 + t), lq, sq), 0) / sp,
            mp.diff(lambda t: _closed_form(lp, sp, lq + t * unit, sq), 0) / unit,
            mp.diff(lambda t: _closed_form(lp, sp, lq, sq * (1 + t)), 0) / sq,
        )


def _analytic_gradient(lp, sp, lq, sq):
    """The same derivatives by hand, at 50 digits: $\\pm 2d/D$ and $(\\gamma_p^2 - \\gamma_q^2 - d^2)/(\\gamma_p D)$,
    its mirror.

    Finite differences lose the tiny terms when the arguments span hundreds of decades (random float64
    inputs); the hand formulas do not.
    """
    with mp.workdps(50):
        lp, sp, lq, sq = (mp.mpf(v) for v in (lp, sp, lq, sq))
        d = lp - lq
        big_d = (sp + sq) ** 2 + d**2
        return (
            2 * d / big_d,
            (sp**2 - sq**2 - d**2) / (sp * big_d),
            -2 * d / big_d,
            (sq**2 - sp**2 - d**2) / (sq * big_d),
        )


def _gradient_sizes(lp, sp, lq, sq):
    """The natural size of each partial derivative, for an error bound that allows the inherent cancellation.

    $\\partial_{\\gamma_p}\\mathrm{KL} = (\\gamma_p^2 - \\gamma_q^2 - d^2)/(\\gamma_p D)$ with
    $D = (\\gamma_p+\\gamma_q)^2 + d^2$ crosses zero; its size is taken as
    $(|\\gamma_p^2 - \\gamma_q^2| + d^2)/(\\gamma_p D)$. $\\partial_{\\mu}\\mathrm{KL} = \\pm 2d/D$ has no
    cancellation.
    """
    with mp.workdps(50):
        lp, sp, lq, sq = (mp.mpf(v) for v in (lp, sp, lq, sq))
        d2 = (lp - lq) ** 2
        big_d = (sp + sq) ** 2 + d2
        loc_size = 2 * abs(lp - lq) / big_d
        return (
            loc_size,
            (abs(sp**2 - sq**2) + d2) / (sp * big_d),
            loc_size,
            (abs(sq**2 - sp**2) + d2) / (sq * big_d),
        )


def _autograd(lp, sp, lq, sq, dtype):
    inputs = [torch.tensor(v, dtype=dtype, requires_grad=True) for v in (lp, sp, lq, sq)]
    value = cauchy.kl_divergence(*inputs)
    value.sum().backward()
    return value, [t.grad for t in inputs]


GRID = [(lp, sp, lq, sq) for lp, sp in [(0.0, 1.0), (-1.5, 0.3)] for lq in (0.0, 2.0, -7.0) for sq in (0.25, 1.0, 4.0)]


# Exactly representable in float32, so that one integral serves both dtypes.
QUAD_CASES = [
    (0.0, 1.0, 0.0, 2.0**-27),  # scale ratio 7e-9
    (0.0, 1.0, 3.0, 2.0**-27),
    (0.0, 2.0**-27, 1.0, 1.0),  # scale ratio 1.3e8
    (0.0, 1.0, 1e4, 2.0**-13),
    (0.0, 1.0, 0.0, 1.0 + 2.0**-19),  # KL = 9e-13
    (0.0, 1.0, 2.0**-20, 1.0),  # KL = 2e-13
    (5.0, 2.0, 5.0 + 2.0**-19, 2.0 + 2.0**-19),  # KL = 5e-13
]


@pytest.fixture(scope="module")
def quad_reference():
    """``mpmath.quad`` of each case (the imaginary part it may carry is quadrature noise, ~1e-50)."""
    assert all(_rounded(case, torch.float32) == list(case) for case in QUAD_CASES)
    return [(case, mp.re(_mp_kl_quad(*case))) for case in QUAD_CASES]


EXTREME = {
    torch.float32: [
        (0.0, 1e-30, 0.0, 1e30),  # (gamma_p + gamma_q)^2 and 4 gamma_p gamma_q overflow; min/max underflows to 0
        (-1e30, 1.0, 1e30, 1.0),  # mu_p - mu_q and its square overflow
        (3e38, 1e-38, -3e38, 3e38),
        (-3e38, 3e38, 3e38, 3.3e38),  # gamma_p + gamma_q overflows
        (-1e30, 1e-10, 1e30, 1e-10),  # |z| = 1e40: 1/|z| underflows
        (1e30, 1e30, 1e30, 1.000001e30),  # near-equal at a huge scale: the products overflow
        (1e30, 1e-30, 1e30 + 1e24, 1.000001e-30),  # near-equal at a tiny scale
        (0.0, 1.0, 2e-6, 1.0),  # KL = 1e-12
        (0.0, 1.0, 0.0, 7.9999995),  # scale ratio around 1/8, where the scale part switches form
        (0.0, 1.0, 0.0, 8.0),
        (0.0, 1.0, 0.0, 8.000001),
        (0.0, 1e-20, 0.0, 1e17),  # scale ratio around the smallest normal float
        (0.0, 1e-20, 0.0, 1e18),
        (0.0, 1.0, 2.0, 1.0),  # |z| = 1, where the location part switches form
        (0.0, 1.0, 2.0000002, 1.0),
    ],
    torch.float64: [
        (0.0, 1e-300, 0.0, 1e300),
        (-1e300, 1.0, 1e300, 1.0),
        (-1e300, 1e-10, 1e300, 1e-10),
        (-1.5e308, 1.5e308, 1.7e308, 1.7e308),
        (1e300, 1e-300, 1e300 + 1e285, 1e-300),
        (1e200, 1e200, 1e200, 1.000000001e200),
        (0.0, 1.0, 1e-9, 1.0),  # KL = 2.5e-19
        (0.0, 1.0, 0.0, 7.999999999999999),
        (0.0, 1.0, 0.0, 8.0),
        (0.0, 1.0, 0.0, 8.000000000000002),
        (0.0, 1e-200, 0.0, 1e107),
        (0.0, 1e-200, 0.0, 1e109),
        (0.0, 1.0, 2.0, 1.0),
        (0.0, 1.0, 2.0000000000000004, 1.0),
    ],
}


# Normal floats: a subnormal location loses a bit when the reduced form halves it (as in the whole module).
normal32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False)


scale32 = st.floats(1e-30, 1e30).map(lambda v: float(np.float32(v)))


finite64 = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False)


scale64 = st.floats(1e-300, 1e300)


ANY_INPUTS = {
    torch.float32: st.lists(st.tuples(normal32, scale32, normal32, scale32), min_size=1, max_size=4),
    torch.float64: st.lists(st.tuples(finite64, scale64, finite64, scale64), min_size=1, max_size=4),
}


law = st.tuples(st.floats(-1e6, 1e6), st.floats(-6, 6).map(lambda e: 10.0**e))  # location, log-uniform scale


pairs = st.lists(st.tuples(law, law), min_size=1, max_size=16)


def _columns(pair_list, dtype):
    lp, sp = zip(*[p for p, _ in pair_list])
    lq, sq = zip(*[q for _, q in pair_list])
    return [torch.tensor(v, dtype=dtype) for v in (lp, sp, lq, sq)]


GRADIENT_POINTS = {
    torch.float32: [
        (0.0, 1e-30, 0.0, 1e30),
        (-1e30, 1.0, 1e30, 1.0),
        (-1e30, 1e-10, 1e30, 1e-10),
        (-3e38, 3e38, 3e38, 3.3e38),
        (1e30, 1e30, 1e30, 1.000001e30),
        (0.0, 1.0, 1e-3, 1.00001),
        (0.0, 1.0, 0.0, 8.0),
        (0.0, 1.0, 0.0, 8.000001),
        (0.0, 1e-20, 0.0, 1e17),
        (0.0, 1e-20, 0.0, 1e18),
        (0.0, 1.0, 2.0, 1.0),
        (0.0, 1.0, 3e19, 1e4),
    ],
    torch.float64: [
        (0.0, 1e-300, 0.0, 1e300),
        (-1e300, 1.0, 1e300, 1.0),
        (-1.5e308, 1.5e308, 1.7e308, 1.7e308),
        (1e200, 1e200, 1e200, 1.000000001e200),
        (0.0, 1.0, 1e-6, 1.0000001),
        (0.0, 1.0, 0.0, 8.0),
        (0.0, 1e-100, 0.0, 1e207),  # the chain rule through log(min/max) would give 0 for d/dscale_q
        (0.0, 1e-200, 0.0, 1e107),
        (0.0, 1e-200, 0.0, 1e109),
        (0.0, 1.0, 1e154, 1e4),
    ],
}


def test_matches_scipy_quad_on_a_grid():
    ours = _kl(*zip(*GRID)).numpy()
    ref = np.array([_scipy_kl(*case) for case in GRID])
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_cases_match_mpmath_quad(dtype, quad_reference):
    """Scale ratios 1e-8..1e8 and near-equal laws (KL ~ 1e-12): full relative precision in both dtypes."""
    for case, exact in quad_reference:
        assert _relative_error(_kl(*case, dtype=dtype).item(), exact, dtype) < 4 * EPS[dtype], (case, dtype)


def test_closed_form_oracle_agrees_with_mpmath_quad(quad_reference):
    """The 50-digit closed form used as the oracle below is the integral itself."""
    for case, exact in quad_reference:
        closed = _mp_kl_closed(*case)
        assert abs(closed - exact) <= mp.mpf("1e-40") * abs(closed), case


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_prone_and_cancelling_cases_match_the_50_digit_closed_form(dtype):
    cases = [_rounded(case, dtype) for case in EXTREME[dtype]]
    ours = _kl(*zip(*cases), dtype=dtype)
    assert ours.dtype == dtype and bool(torch.isfinite(ours).all())
    for case, value in zip(cases, ours.tolist()):
        assert _relative_error(value, _mp_kl_closed(*case), dtype) < 8 * EPS[dtype], (case, value)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_any_finite_input_value_and_gradient_match_mpmath(dtype, data):
    """Locations anywhere in the dtype's range, scales over 60 (float32) or 600 (float64) decades."""
    cases = data.draw(ANY_INPUTS[dtype])
    columns = [_rounded(column, dtype) for column in zip(*cases)]
    value, grads = _autograd(*columns, dtype=dtype)
    for i, case in enumerate(zip(*columns)):
        assert _relative_error(value[i].item(), _mp_kl_closed(*case), dtype) < 8 * EPS[dtype], case
        for grad, exact, size in zip(grads, _analytic_gradient(*case), _gradient_sizes(*case)):
            assert math.isfinite(grad[i].item()), case
            assert abs(grad[i].item() - exact) <= 16 * EPS[dtype] * size + TINY[dtype], (case, grad[i].item(), exact)


@pytest.mark.parametrize("lp, sp, lq, sq", [(0.0, 1.0, 0.0, 3.0), (1.0, 0.5, -2.0, 2.0), (0.0, 2.0, 10.0, 0.1)])
def test_monte_carlo_mean_log_ratio(lp, sp, lq, sq):
    rng = np.random.default_rng(20240611)
    x = lp + sp * rng.standard_cauchy(200_000)
    log_ratio = stats.cauchy.logpdf(x, lp, sp) - stats.cauchy.logpdf(x, lq, sq)  # bounded, so the CLT applies
    mc, se = log_ratio.mean(), log_ratio.std(ddof=1) / math.sqrt(x.size)
    assert abs(mc - _kl(lp, sp, lq, sq).item()) < 5 * se


def test_independent_components_sum_to_the_joint_divergence():
    """For a vector with independent components, KL of the joint laws = the sum over components."""
    lp, sp = np.array([0.0, 1.0, -3.0]), np.array([1.0, 0.2, 5.0])
    lq, sq = np.array([0.5, -1.0, -3.0]), np.array([2.0, 0.2, 1.0])
    rng = np.random.default_rng(7)
    x = lp + sp * rng.standard_cauchy((200_000, 3))
    joint_log_ratio = (stats.cauchy.logpdf(x, lp, sp) - stats.cauchy.logpdf(x, lq, sq)).sum(axis=-1)
    mc, se = joint_log_ratio.mean(), joint_log_ratio.std(ddof=1) / math.sqrt(len(x))
    assert abs(mc - _kl(lp, sp, lq, sq).sum().item()) < 5 * se


@pytest.mark.parametrize("dtype", DTYPES)
@given(pair_list=pairs)
def test_symmetric_non_negative_and_zero_only_on_the_diagonal(dtype, pair_list):
    lp, sp, lq, sq = _columns(pair_list, dtype)
    forward = cauchy.kl_divergence(lp, sp, lq, sq)
    assert torch.equal(forward, cauchy.kl_divergence(lq, sq, lp, sp))  # bit for bit
    assert bool((forward >= 0).all()) and bool(torch.isfinite(forward).all())
    # Strictly positive where the laws differ by more than the square root of the smallest normal float
    # (below that the true divergence, of order (difference)^2, underflows).
    root_tiny = math.sqrt(torch.finfo(dtype).tiny)
    apart = ((lp - lq).abs() > 4 * root_tiny * (sp + sq)) | ((sp - sq).abs() > 4 * root_tiny * torch.maximum(sp, sq))
    assert bool((forward[apart] > 0).all())
    assert bool((cauchy.kl_divergence(lp, sp, lp, sp) == 0).all())
    assert bool((cauchy.kl_divergence(lq, sq, lq, sq) == 0).all())


@given(pair_list=pairs, shift=st.floats(-1e6, 1e6), factor=st.floats(-6, 6).map(lambda e: 10.0**e))
def test_invariant_under_common_shift_and_common_scaling(pair_list, shift, factor):
    """Up to the rounding of the transformed inputs: a relative error eps in $\\mu$ and $\\gamma$ moves the
    divergence by at most $2\\epsilon(|\\mu_p| + |\\mu_q| + 2|c|)/(\\gamma_p + \\gamma_q) + 2\\epsilon$ (plus its own
    rounding)."""
    lp, sp, lq, sq = _columns(pair_list, torch.float64)
    base = cauchy.kl_divergence(lp, sp, lq, sq)
    eps = EPS[torch.float64]
    spread = (lp.abs() + lq.abs()) / (sp + sq)
    shifted = cauchy.kl_divergence(lp + shift, sp, lq + shift, sq)
    bound = 4 * eps * (spread + 2 * abs(shift) / (sp + sq) + 2) + 8 * eps * base
    assert bool(((shifted - base).abs() <= bound).all())
    scaled = cauchy.kl_divergence(lp * factor, sp * factor, lq * factor, sq * factor)
    bound = 4 * eps * (spread + 2) + 8 * eps * base
    assert bool(((scaled - base).abs() <= bound).all())


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    lp, lq = torch.randn(8, generator=g, dtype=torch.float64) * 3, torch.randn(8, generator=g, dtype=torch.float64)
    sp, sq = (
        torch.rand(8, generator=g, dtype=torch.float64) * 4 + 0.2,
        torch.rand(8, generator=g, dtype=torch.float64) + 0.2,
    )
    lq[0], sq[0] = lp[0], sp[0]  # p == q: the minimum, gradient 0
    sq[1] = sp[1] * (1 + 1e-3)  # nearly equal
    inputs = [t.requires_grad_() for t in (lp, sp, lq, sq)]
    assert torch.autograd.gradcheck(cauchy.kl_divergence, inputs, eps=1e-6, atol=1e-8, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_matches_mpmath_diff_at_extreme_points(dtype):
    cases = [_rounded(case, dtype) for case in GRADIENT_POINTS[dtype]]
    _, grads = _autograd(*zip(*cases), dtype=dtype)
    for i, case in enumerate(cases):
        for name, grad, exact, size in zip(
            ("loc_p", "scale_p", "loc_q", "scale_q"), grads, _mp_gradient(*case), _gradient_sizes(*case)
        ):
            assert abs(grad[i].item() - exact) <= 16 * EPS[dtype] * size + TINY[dtype], (
                case,
                name,
                grad[i].item(),
                exact,
            )


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_is_zero_at_p_equals_q_and_finite_at_extreme_ratios(dtype):
    big = torch.finfo(dtype).max / 4
    least = float(torch.finfo(dtype).smallest_normal) * float(torch.finfo(dtype).eps)  # the smallest subnormal
    cases = [
        (0.0, 1.0, 0.0, 1.0),
        (1e30, 1e-30, 1e30, 1e-30),
        (-big, big, -big, big),
        (0.0, least, 0.0, least),  # half of it rounds to 0: (1 - r) / (1 + r) must not be formed from halves
        (0.0, 1e-30, 0.0, 1e30),
        (-big, 1.0, big, 1.0),
    ]
    value, grads = _autograd(*zip(*cases), dtype=dtype)
    assert bool(torch.isfinite(value).all())
    for grad in grads:
        assert bool(torch.isfinite(grad).all())
        assert bool((grad[:4] == 0).all())  # the minimum at p == q


def test_broadcasting_dtype_and_gradient_shapes():
    lp = torch.randn(2, 1, 3, dtype=torch.float64, requires_grad=True)
    sp = (torch.rand(4, 1, dtype=torch.float64) + 0.5).requires_grad_()
    lq = torch.randn(3, dtype=torch.float64, requires_grad=True)
    sq = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    kl = cauchy.kl_divergence(lp, sp, lq, sq)
    assert kl.shape == (2, 4, 3) and kl.dtype == torch.float64
    for i in range(2):
        for j in range(4):
            for k in range(3):
                case = (lp[i, 0, k].item(), sp[j, 0].item(), lq[k].item(), sq.item())
                assert kl[i, j, k].item() == pytest.approx(float(_mp_kl_closed(*case)), rel=1e-14)
    kl.sum().backward()
    assert [t.grad.shape for t in (lp, sp, lq, sq)] == [t.shape for t in (lp, sp, lq, sq)]
    assert cauchy.kl_divergence(0.0, 1, 1, 2).dtype == torch.get_default_dtype()  # numbers
    assert cauchy.kl_divergence(torch.zeros(2), 1.0, torch.zeros(2, dtype=torch.float64), 2.0).dtype == torch.float64


@pytest.mark.parametrize("argument", ["scale_p", "scale_q"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_scale_is_rejected(argument, bad):
    values = {"loc_p": 0.0, "scale_p": torch.tensor([1.0, 2.0]), "loc_q": 1.0, "scale_q": torch.tensor([1.0, 3.0])}
    values[argument] = torch.tensor([1.0, bad])
    with pytest.raises(ValueError, match=argument):
        cauchy.kl_divergence(**values)


@pytest.mark.parametrize("argument", ["loc_p", "loc_q"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_location_is_rejected(argument, bad):
    values = {"loc_p": 0.0, "scale_p": 1.0, "loc_q": 1.0, "scale_q": 2.0}
    values[argument] = torch.tensor([0.0, bad])
    with pytest.raises(ValueError, match=f"{argument} must be finite"):
        cauchy.kl_divergence(**values)


def test_other_bad_inputs_of_kl_divergence():
    with pytest.raises(ValueError, match="must broadcast together"):
        cauchy.kl_divergence(torch.zeros(3), 1.0, torch.zeros(4), 1.0)
    with pytest.raises(TypeError, match="scale_q must be a torch.Tensor"):
        cauchy.kl_divergence(0.0, 1.0, 0.0, True)
    with pytest.raises(TypeError, match="loc_p must be a torch.Tensor"):
        cauchy.kl_divergence("0", 1.0, 0.0, 1.0)
