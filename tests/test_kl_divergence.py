"""`cauchy.kl_divergence` against independent oracles.

The oracles: numerical integration of $\\int p \\log(p/q)$ (SciPy's ``quad`` in float64, mpmath's ``quad`` at
50 digits), Monte Carlo draws from $p$, the textbook closed form evaluated in 50-digit arithmetic (checked
against ``mpmath.quad`` first), its derivatives by ``mpmath.diff`` and by hand. Every oracle sees the
inputs already rounded to the working dtype.
"""

import itertools
import math

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate, stats

from causalqwen import cauchy

DTYPES = [torch.float32, torch.float64]
EPS = {dtype: torch.finfo(dtype).eps for dtype in DTYPES}
TINY = {dtype: torch.finfo(dtype).tiny for dtype in DTYPES}  # below this a float has fewer significant bits


def _kl(lp, sp, lq, sq, dtype=torch.float64):
    """The function under test on plain numbers or lists, rounded to ``dtype`` first."""
    return cauchy.kl_divergence(*(torch.tensor(v, dtype=dtype) for v in (lp, sp, lq, sq)))


def _rounded(values, dtype):
    """The numbers the function really sees: ``values`` rounded to ``dtype``, back as Python floats."""
    return [float(v) for v in torch.tensor(values, dtype=dtype).double()]


def _rel_err(value: float, reference, dtype) -> float:
    return abs(value - float(reference)) / max(abs(float(reference)), TINY[dtype])


# ---------------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------------


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


# Gradients are compared as |autograd - exact| <= 16 eps * size + tiny: a true derivative below the smallest
# normal float (e.g. d/dloc when both scales are near the largest float) may come back as 0.


def _autograd(lp, sp, lq, sq, dtype):
    inputs = [torch.tensor(v, dtype=dtype, requires_grad=True) for v in (lp, sp, lq, sq)]
    value = cauchy.kl_divergence(*inputs)
    value.sum().backward()
    return value, [t.grad for t in inputs]


# ---------------------------------------------------------------------------------------------
# Values against numerical integration
# ---------------------------------------------------------------------------------------------

GRID = [(lp, sp, lq, sq) for lp, sp in [(0.0, 1.0), (-1.5, 0.3)] for lq in (0.0, 2.0, -7.0) for sq in (0.25, 1.0, 4.0)]


def test_matches_scipy_quad_on_a_grid():
    ours = _kl(*zip(*GRID)).numpy()
    ref = np.array([_scipy_kl(*case) for case in GRID])
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_cases_match_mpmath_quad(dtype, quad_reference):
    """Scale ratios 1e-8..1e8 and near-equal laws (KL ~ 1e-12): full relative precision in both dtypes."""
    for case, exact in quad_reference:
        assert _rel_err(_kl(*case, dtype=dtype).item(), exact, dtype) < 4 * EPS[dtype], (case, dtype)


def test_closed_form_oracle_agrees_with_mpmath_quad(quad_reference):
    """The 50-digit closed form used as the oracle below is the integral itself."""
    for case, exact in quad_reference:
        closed = _mp_kl_closed(*case)
        assert abs(closed - exact) <= mp.mpf("1e-40") * abs(closed), case


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_prone_and_cancelling_cases_match_the_50_digit_closed_form(dtype):
    cases = [_rounded(case, dtype) for case in EXTREME[dtype]]
    ours = _kl(*zip(*cases), dtype=dtype)
    assert ours.dtype == dtype and bool(torch.isfinite(ours).all())
    for case, value in zip(cases, ours.tolist()):
        assert _rel_err(value, _mp_kl_closed(*case), dtype) < 8 * EPS[dtype], (case, value)


# Normal floats: a subnormal location loses a bit when the reduced form halves it (as in the whole module).
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=False)
scale32 = st.floats(1e-30, 1e30).map(lambda v: float(np.float32(v)))
finite64 = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False)
scale64 = st.floats(1e-300, 1e300)
ANY_INPUTS = {
    torch.float32: st.lists(st.tuples(finite32, scale32, finite32, scale32), min_size=1, max_size=4),
    torch.float64: st.lists(st.tuples(finite64, scale64, finite64, scale64), min_size=1, max_size=4),
}


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_any_finite_input_value_and_gradient_match_mpmath(dtype, data):
    """Locations anywhere in the dtype's range, scales over 60 (float32) or 600 (float64) decades."""
    cases = data.draw(ANY_INPUTS[dtype])
    columns = [_rounded(column, dtype) for column in zip(*cases)]
    value, grads = _autograd(*columns, dtype=dtype)
    for i, case in enumerate(zip(*columns)):
        assert _rel_err(value[i].item(), _mp_kl_closed(*case), dtype) < 8 * EPS[dtype], case
        for grad, exact, size in zip(grads, _analytic_gradient(*case), _gradient_sizes(*case)):
            assert math.isfinite(grad[i].item()), case
            assert abs(grad[i].item() - exact) <= 16 * EPS[dtype] * size + TINY[dtype], (case, grad[i].item(), exact)


# ---------------------------------------------------------------------------------------------
# Monte Carlo
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

law = st.tuples(st.floats(-1e6, 1e6), st.floats(-6, 6).map(lambda e: 10.0**e))  # location, log-uniform scale
pairs = st.lists(st.tuples(law, law), min_size=1, max_size=16)


def _columns(pair_list, dtype):
    lp, sp = zip(*[p for p, _ in pair_list])
    lq, sq = zip(*[q for _, q in pair_list])
    return [torch.tensor(v, dtype=dtype) for v in (lp, sp, lq, sq)]


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


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Shapes, dtypes and bad input
# ---------------------------------------------------------------------------------------------


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


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="must broadcast together"):
        cauchy.kl_divergence(torch.zeros(3), 1.0, torch.zeros(4), 1.0)
    with pytest.raises(TypeError, match="scale_q must be a torch.Tensor"):
        cauchy.kl_divergence(0.0, 1.0, 0.0, True)
    with pytest.raises(TypeError, match="loc_p must be a torch.Tensor"):
        cauchy.kl_divergence("0", 1.0, 0.0, 1.0)
