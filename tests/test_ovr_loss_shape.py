r"""The shape of the OvR loss in $t = (\mathrm{loc}_S - C)/\mathrm{scale}_S$, against mpmath at 50 digits.

The true class's term is $g(t) = -\log\big(\tfrac12 + \arctan(t)/\pi\big)$ and a wrong class's is $g(-t)$. Two
claims of the design documents are checked here as the docs now state them:

* *the gradient keeps flowing*, qualified: for a badly misclassified true class ($t \to -\infty$) the slope of
  $g$ decays like $1/|t|$ (0.099 at $t = -10$, 0.0100 at $t = -100$), where logistic BCE's
  $-\log\sigma(t)$ keeps a slope near 1; it never reaches 0 as the drafts' $\epsilon = 10^{-7}$ cap would make it;
* *the OvR loss is convex in* $\mathrm{loc}_S$: false. $g''$ is negative for $t$ below about $-0.43$ and positive
  above.

The library's own loss (``ovr_classification_loss``, the literal path, differentiable twice) is differentiated by
autograd in float64 and compared with mpmath's derivatives of the formula.
"""

import mpmath as mp
import pytest
import torch

from causalqwen.losses import ovr_classification_loss

mp.mp.dps = 50


def _g(t):
    """The true class's term, in mpmath."""
    return -mp.log(mp.mpf(1) / 2 + mp.atan(t) / mp.pi)


def _library_derivatives(t: float) -> tuple[float, float]:
    """$(g'(t), g''(t))$ by autograd through the library's OvR loss with one class, its label, scale 1, C = 0."""
    loc = torch.tensor([[t]], dtype=torch.float64, requires_grad=True)  # [1, V=1]
    loss = ovr_classification_loss(loc, torch.ones(1, 1, dtype=torch.float64), torch.tensor([0]), 0.0).sum()
    (first,) = torch.autograd.grad(loss, loc, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), loc)
    return first.item(), second.item()


@pytest.mark.parametrize("t,documented", [(-10.0, 0.099), (-100.0, 0.0100)])
def test_the_true_class_slope_decays_like_one_over_t(t, documented):
    slope = mp.diff(_g, t)
    assert float(-slope) == pytest.approx(documented, abs=0.0005 if t == -10.0 else 0.00005)
    assert float(-slope * abs(t)) == pytest.approx(1.0, abs=0.01)  # ~ 1/|t|
    logistic_slope = mp.diff(lambda x: -mp.log(1 / (1 + mp.exp(-x))), t)
    assert float(-logistic_slope) > 0.9999  # logistic BCE: a slope near 1 however wrong
    library_slope, _ = _library_derivatives(t)
    assert library_slope == pytest.approx(float(slope), rel=1e-12)


@pytest.mark.parametrize("t,documented", [(-10.0, -0.0098), (-1.0, -0.231), (0.0, 0.405)])
def test_the_ovr_loss_is_not_convex(t, documented):
    assert float(mp.diff(_g, t, 2)) == pytest.approx(documented, abs=0.0006)


@pytest.mark.parametrize("t", [-30.0, -10.0, -3.0, -0.999, -0.5, 0.25, 1.001, 4.0])
def test_the_library_curvature_is_the_formula_s(t):
    """Autograd's second derivative through the loss equals mpmath's. Not at the kernel's branch points $t = 0$ and
    $|t| = 1$ exactly, where the branchwise form (`cauchy.tail_terms`) gives 0 for the second derivative."""
    _, library_curvature = _library_derivatives(t)
    assert library_curvature == pytest.approx(float(mp.diff(_g, t, 2)), rel=1e-9, abs=1e-12)


def test_the_curvature_changes_sign_once_near_minus_0_43():
    root = mp.findroot(lambda x: mp.diff(_g, x, 2), -0.4)
    assert float(root) == pytest.approx(-0.43, abs=0.005)
    assert mp.diff(_g, root - mp.mpf("0.01"), 2) < 0 < mp.diff(_g, root + mp.mpf("0.01"), 2)
    grid = [mp.mpf(x) / 10 for x in range(-300, 301)]
    signs = [mp.sign(mp.diff(_g, x, 2)) for x in grid]
    assert sum(1 for a, b in zip(signs, signs[1:]) if a != b) == 1  # one sign change on [-30, 30]
    _, below = _library_derivatives(float(root) - 0.01)
    _, above = _library_derivatives(float(root) + 0.01)
    assert below < 0 < above
