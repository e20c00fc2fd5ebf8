r"""The Cauchy toolkit (docs: cauchy.md; decision D10).

A random variable $X \sim \mathrm{Cauchy}(\mu, \gamma)$ with location $\mu$ and scale $\gamma > 0$ has

$$
f(x) = \frac{1}{\pi\gamma}\,\frac{1}{1 + z^2}, \qquad
F(x) = \frac12 + \frac1\pi \arctan z, \qquad z = \frac{x - \mu}{\gamma}.
$$

Two facts make it the distribution of CausalQwen:

* **Linear closure.** For independent $X_j \sim \mathrm{Cauchy}(\mu_j, \gamma_j)$,
  $\sum_j a_j X_j + b \sim \mathrm{Cauchy}\big(\sum_j a_j \mu_j + b,\ \sum_j |a_j| \gamma_j\big)$,
  so every layer after the abduction network is computed on parameters, with no sampling.
* **Reparameterization.** $X = \mu + \gamma \tan\big(\pi(\varepsilon - \tfrac12)\big)$ with
  $\varepsilon \sim \mathcal U(0, 1)$.

Numerics. The textbook formulas fail in floating point far from the location: $z$ itself can
overflow ($x - \mu$ of two large floats, or a tiny scale), $\log(1 + z^2)$ overflows once $|z|$
passes $\sqrt{\text{max float}}$, and $\tfrac12 - \arctan(z)/\pi$ cancels to zero long before the
true tail mass underflows. Every function here therefore works from a *reduced* form of $z$:

$$
h = \tfrac{x}{2} - \tfrac{\mu}{2} \;(\text{never overflows}),\qquad
r = \min(|z|, 1/|z|) \in [0, 1],\qquad \text{far} = |z| > 1,
$$

with $r = 2|h|/\gamma$ near the location and $r = \gamma / (2|h|)$ far from it, plus $\log r$ taken from
logarithms when $r$ underflows. The tail mass beyond $|z|$ is then $\arctan(r)/\pi$ when far, which
keeps full relative precision all the way out, and $\log(1 + z^2) = \log(1 + r^2) - 2\log r$ when far.
Where PyTorch's chain rule through these expressions would overflow (the derivative of $z$ with
respect to the scale is $-z/\gamma$), the log-density and the tail functions are
`torch.autograd.Function`s whose backward is the analytic derivative written in the same reduced form.
No ``eps`` is added anywhere.

One cohesive toolkit, kept in one module, in five sections (each opens with a banner comment below):

1. *Input handling*: the one validation switch of the package (`validating`, `validation`, `set_validate_args`,
   as ``validate_args`` in ``torch.distributions``) and the checks every function makes while it is on
   (`check_arguments`, `check_scale`);
2. *The reduced form of z*: $h$, $r$, $\log r$ and each standardized function's value and analytic derivatives;
3. *Public functions*: `prob`, `log_prob`, `nll`, `cdf`, `sf`, `log_cdf`, `log_sf`, `icdf`, `log_interval_prob`,
   `log_interval_prob_reduced`, `rsample`, `linear`;
4. *The tail kernel of the One-vs-Rest loss*: `tail_terms` and `tail_nll`, the $a(d, s)$ of `causalqwen.losses`;
5. *Divergence between two Cauchy laws*: `kl_divergence`, the elementwise term of `causalqwen.divergence`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Iterator
from functools import reduce
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "validating",
    "set_validate_args",
    "validation",
    "prob",
    "log_prob",
    "nll",
    "cdf",
    "sf",
    "log_cdf",
    "log_sf",
    "icdf",
    "log_interval_prob",
    "log_interval_prob_reduced",
    "rsample",
    "linear",
    "TailTerms",
    "tail_terms",
    "TailNLL",
    "tail_nll",
    "kl_divergence",
]

LOG_PI = math.log(math.pi)
LOG_2 = math.log(2.0)


# --------------------------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------------------------

# The one validation switch of the package, as torch.distributions' ``validate_args``: every public formula and
# every public door checks its inputs while `validating()` is True; a caller that has checked them runs its inner
# code under ``with validation(False):``. The context variable holds a local override (None: none), so the
# process default set by `set_validate_args` holds in every thread and task that has not overridden it.
_VALIDATE_ARGS: contextvars.ContextVar[bool | None] = contextvars.ContextVar("causalqwen_validate_args", default=None)
_validate_args_default = True


def validating() -> bool:
    """True while inputs are checked: the innermost `validation` block's value, else the process default
    (`set_validate_args`; True unless changed)."""
    enabled = _VALIDATE_ARGS.get()
    return _validate_args_default if enabled is None else enabled


def set_validate_args(value: bool) -> None:
    """Set the process default of `validating` (like ``torch.distributions.Distribution.set_default_validate_args``).
    A `validation` block still overrides it inside the block."""
    global _validate_args_default
    if not isinstance(value, bool):
        raise TypeError(f"set_validate_args(value) must be True or False, got {type(value).__name__} {value!r}")
    _validate_args_default = value


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Within the block, `validating()` is ``enabled``: ``with cauchy.validation(False): ...`` for a caller that has
    checked the inputs itself. Blocks nest; leaving one restores the value before it, also on an exception. The value
    belongs to the current thread or task (a context variable)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"validation(enabled) must be True or False, got {type(enabled).__name__} {enabled!r}")
    token = _VALIDATE_ARGS.set(enabled)
    try:
        yield
    finally:
        _VALIDATE_ARGS.reset(token)


def _as_float_tensors(*values, names: tuple[str, ...]) -> list[Tensor]:
    """Turn numbers and tensors into tensors of one common floating dtype (torch promotion rules)."""
    for value, name in zip(values, names):
        if not isinstance(value, (Tensor, numbers.Real)) or isinstance(value, bool):
            raise TypeError(f"{name} must be a torch.Tensor or a real number, got {type(value).__name__}")
    dtypes = [v.dtype for v in values if isinstance(v, Tensor)]
    dtype = reduce(torch.promote_types, dtypes) if dtypes else torch.get_default_dtype()
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    device = next((v.device for v in values if isinstance(v, Tensor)), None)
    return [torch.as_tensor(v if isinstance(v, Tensor) else float(v), dtype=dtype, device=device) for v in values]


def check_arguments(x, loc, scale, names=("x", "loc", "scale")) -> list[Tensor]:
    """The check of every function here: numbers or tensors of one floating dtype, shapes that broadcast,
    ``scale > 0``. Returns the three broadcast tensors; raises ``TypeError``/``ValueError`` naming the argument.
    It checks whenever it is called; the formulas call it while `validating`."""
    x, loc, scale = _as_float_tensors(x, loc, scale, names=names)
    try:
        torch.broadcast_shapes(x.shape, loc.shape, scale.shape)
    except RuntimeError:
        raise ValueError(
            f"{names[0]}, {names[1]} and {names[2]} must broadcast together; got shapes "
            f"{tuple(x.shape)}, {tuple(loc.shape)} and {tuple(scale.shape)}"
        ) from None
    check_scale(scale, names[2])
    return list(torch.broadcast_tensors(x, loc, scale))


def check_scale(scale: Tensor, name: str = "scale") -> None:
    """Raise ``ValueError`` unless every element of ``scale`` is a number $> 0$ (NaN fails too)."""
    if not bool((scale > 0).all()):
        bad = scale[~(scale > 0)]
        raise ValueError(
            f"{name} must be > 0 everywhere; found {bad.numel()} element(s) that are not, "
            f"e.g. {bad.flatten()[0].item()!r}"
        )


def _prepare(x, loc, scale, names=("x", "loc", "scale")) -> list[Tensor]:
    """Common dtype and broadcast shapes; while `validating`, `check_arguments` first."""
    if validating():
        return check_arguments(x, loc, scale, names)
    if not (
        isinstance(x, Tensor)
        and isinstance(loc, Tensor)
        and isinstance(scale, Tensor)
        and x.dtype == loc.dtype == scale.dtype
        and x.dtype.is_floating_point
    ):
        x, loc, scale = _as_float_tensors(x, loc, scale, names=names)  # numbers, or tensors of mixed dtypes
    return list(torch.broadcast_tensors(x, loc, scale))


# --------------------------------------------------------------------------------------------
# The reduced form of z = (x - loc) / scale
# --------------------------------------------------------------------------------------------


class _Reduced(NamedTuple):
    far: Tensor  # |z| > 1
    positive: Tensor  # z >= 0
    r: Tensor  # min(|z|, 1/|z|), in [0, 1]
    log_r: Tensor  # log r, exact where far even when r underflows (not meaningful where near)
    half_abs_diff: Tensor  # |h| = |x - loc| / 2


def _reduce(x: Tensor, loc: Tensor, scale: Tensor) -> _Reduced:
    r"""Reduced form of $z = (x - \mu)/\gamma$ that never overflows (see the module docstring)."""
    h = x * 0.5 - loc * 0.5  # half the difference: cannot overflow
    abs_h = h.abs()
    far = abs_h > scale * 0.5
    r_near = (abs_h / scale) * 2.0  # <= 1 where near
    r_far = (scale / abs_h) * 0.5  # < 1 where far; may underflow
    r = torch.where(far, r_far, r_near)
    tiny = torch.finfo(r.dtype).tiny
    log_r = torch.where(r >= tiny, torch.log(r), torch.log(scale) - torch.log(abs_h) - LOG_2)
    return _Reduced(far=far, positive=h >= 0, r=r, log_r=log_r, half_abs_diff=abs_h)


def _log_atan_r(q: _Reduced) -> Tensor:
    r"""$\log \arctan r$, exact also where $r$ underflows ($\arctan r = r$ there)."""
    tiny = torch.finfo(q.r.dtype).tiny
    return torch.where(q.r >= tiny, torch.log(torch.atan(q.r)), q.log_r)


# Each standardized function F(z) below comes with its value and its two derivatives
#   d/dx F((x - loc)/scale)      (d/dloc is its negative)
#   d/dscale F((x - loc)/scale)
# written in the reduced form, so that neither overflows where the true value is finite.
# Far from the location, 1/scale is replaced by r/scale = 1/(2|h|) wherever r multiplies it.


def _log1p_square_value(q: _Reduced, scale: Tensor) -> Tensor:
    r"""$\log(1 + z^2)$: $\log(1 + r^2)$ near, $\log(1 + r^2) - 2 \log r$ far."""
    base = torch.log1p(q.r * q.r)
    return torch.where(q.far, base - 2.0 * q.log_r, base)


def _log1p_square_grads(q: _Reduced, scale: Tensor) -> tuple[Tensor, Tensor]:
    r"""$\partial_x = 2z/((1+z^2)\gamma)$ and $\partial_\gamma = -2z^2/((1+z^2)\gamma)$."""
    sign = torch.where(q.positive, 1.0, -1.0).to(q.r.dtype)
    one_r2 = 1.0 + q.r * q.r
    d_dx_near = 2.0 * sign * q.r / (one_r2 * scale)
    d_dx_far = sign / (q.half_abs_diff * one_r2)
    d_dscale_near = -2.0 * q.r * q.r / (one_r2 * scale)
    d_dscale_far = -2.0 / (one_r2 * scale)
    return torch.where(q.far, d_dx_far, d_dx_near), torch.where(q.far, d_dscale_far, d_dscale_near)


def _sf_value(q: _Reduced, scale: Tensor) -> Tensor:
    r"""$P(X > x) = \tfrac12 - \arctan(z)/\pi$, from the tail mass $\arctan(r)/\pi$ when far."""
    atan_r = torch.atan(q.r) / math.pi
    near = torch.where(q.positive, 0.5 - atan_r, 0.5 + atan_r)
    far = torch.where(q.positive, atan_r, 1.0 - atan_r)
    return torch.where(q.far, far, near)


def _log_sf_value(q: _Reduced, scale: Tensor) -> Tensor:
    r"""$\log P(X > x)$: $\log\arctan r - \log\pi$ in the upper tail, $\log1p(-\arctan(r)/\pi)$ in the lower."""
    atan_r = torch.atan(q.r) / math.pi
    near = torch.where(q.positive, torch.log(0.5 - atan_r), torch.log(0.5 + atan_r))
    far = torch.where(q.positive, _log_atan_r(q) - LOG_PI, torch.log1p(-atan_r))
    return torch.where(q.far, far, near)


def _density_factors(q: _Reduced, scale: Tensor) -> tuple[Tensor, Tensor]:
    r"""$f_z(z)/\gamma$ and $z f_z(z)/\gamma$ with $f_z(z) = 1/(\pi(1+z^2))$ the standard density."""
    sign = torch.where(q.positive, 1.0, -1.0).to(q.r.dtype)
    pi_one_r2 = math.pi * (1.0 + q.r * q.r)
    r_over_scale_far = 0.5 / q.half_abs_diff  # = r / scale where far
    density_near = 1.0 / (pi_one_r2 * scale)
    density_far = q.r * r_over_scale_far / pi_one_r2  # r^2 / (pi (1 + r^2) scale)
    z_density_near = sign * q.r / (pi_one_r2 * scale)
    z_density_far = sign * r_over_scale_far / pi_one_r2  # (1/r) r^2 / (pi (1+r^2) scale)
    return torch.where(q.far, density_far, density_near), torch.where(q.far, z_density_far, z_density_near)


def _sf_grads(q: _Reduced, scale: Tensor) -> tuple[Tensor, Tensor]:
    r"""$\partial_x\,\mathrm{sf} = -f(x)$ and $\partial_\gamma\,\mathrm{sf} = z f(x)$."""
    density, z_density = _density_factors(q, scale)
    return -density, z_density


def _log_sf_grads(q: _Reduced, scale: Tensor) -> tuple[Tensor, Tensor]:
    r"""$\partial_x \log\mathrm{sf} = -f/\mathrm{sf}$, $\partial_\gamma \log\mathrm{sf} = z f/\mathrm{sf}$.

    In the far upper tail both the density and the survival function vanish; their ratio is
    formed from $\rho = r/\arctan r \in [1, 4/\pi]$ instead: $f/\mathrm{sf} = \rho\, r/((1 + r^2)\gamma)$.
    """
    density, z_density = _density_factors(q, scale)
    survival = _sf_value(q, scale)
    upper_far = q.far & q.positive
    tiny = torch.finfo(q.r.dtype).tiny
    rho = torch.where(q.r >= tiny, q.r / torch.atan(q.r), 1.0)  # r / atan(r) -> 1 as r -> 0
    one_r2 = 1.0 + q.r * q.r
    hazard_far = rho * (0.5 / q.half_abs_diff) / one_r2  # = rho r / ((1 + r^2) scale)
    z_hazard_far = rho / (one_r2 * scale)
    d_dx = torch.where(upper_far, -hazard_far, -density / survival)
    d_dscale = torch.where(upper_far, z_hazard_far, z_density / survival)
    return d_dx, d_dscale


def _prob_value(q: _Reduced, scale: Tensor) -> Tensor:
    r"""The density $f(x) = 1/(\pi\gamma(1 + z^2))$, formed from $r$ so that it keeps full precision."""
    density, _ = _density_factors(q, scale)
    return density


def _prob_grads(q: _Reduced, scale: Tensor) -> tuple[Tensor, Tensor]:
    r"""$\partial_x f = -f\,\partial_x\log(1+z^2)$ and
    $\partial_\gamma f = -f\,(1/\gamma + \partial_\gamma\log(1+z^2))$."""
    density, _ = _density_factors(q, scale)
    d_dx, d_dscale = _log1p_square_grads(q, scale)
    return -density * d_dx, -density * (1.0 / scale + d_dscale)


_KINDS = {
    "prob": (_prob_value, _prob_grads),
    "log1p_square": (_log1p_square_value, _log1p_square_grads),
    "sf": (_sf_value, _sf_grads),
    "log_sf": (_log_sf_value, _log_sf_grads),
}


class _StandardizedFunction(torch.autograd.Function):
    r"""$F\big((x - \mu)/\gamma\big)$ for $F \in \{f,\ \log(1+z^2),\ \mathrm{sf},\ \log\mathrm{sf}\}$.

    Forward and backward both use the reduced form; backward recomputes it from the saved inputs
    (three tensors of the input shape) and applies the analytic derivative.
    """

    @staticmethod
    def forward(ctx, x: Tensor, loc: Tensor, scale: Tensor, kind: str) -> Tensor:
        ctx.kind = kind
        ctx.save_for_backward(x, loc, scale)
        value_fn, _ = _KINDS[kind]
        return value_fn(_reduce(x, loc, scale), scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, loc, scale = ctx.saved_tensors
        _, grads_fn = _KINDS[ctx.kind]
        d_dx, d_dscale = grads_fn(_reduce(x, loc, scale), scale)
        grad_x = grad * d_dx if ctx.needs_input_grad[0] else None
        grad_loc = -grad * d_dx if ctx.needs_input_grad[1] else None
        grad_scale = grad * d_dscale if ctx.needs_input_grad[2] else None
        return grad_x, grad_loc, grad_scale, None


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def log_prob(x, loc, scale) -> Tensor:
    r"""Log density $\log f(x) = -\log(\pi\gamma) - \log(1 + z^2)$, $z = (x - \mu)/\gamma$.

    Finite for every finite input: $\log(1+z^2)$ is evaluated as $\log(1+r^2) - 2\log r$ far from
    the location, so neither $z$ nor $z^2$ is ever formed.
    """
    x, loc, scale = _prepare(x, loc, scale)
    return -LOG_PI - torch.log(scale) - _StandardizedFunction.apply(x, loc, scale, "log1p_square")


def nll(x, loc, scale) -> Tensor:
    r"""Negative log-likelihood $\log(\pi\gamma) + \log\big(1 + ((x-\mu)/\gamma)^2\big) = -\log f(x)$."""
    x, loc, scale = _prepare(x, loc, scale)
    return LOG_PI + torch.log(scale) + _StandardizedFunction.apply(x, loc, scale, "log1p_square")


def prob(x, loc, scale) -> Tensor:
    r"""Density $f(x) = \dfrac{1}{\pi\gamma\,(1 + z^2)}$; far from the location $r^2/(\pi\gamma(1 + r^2))$ with
    $r = 1/|z|$."""
    x, loc, scale = _prepare(x, loc, scale)
    return _StandardizedFunction.apply(x, loc, scale, "prob")


def sf(x, loc, scale) -> Tensor:
    r"""Survival function $P(X > x) = \tfrac12 - \tfrac1\pi\arctan z$.

    In the upper tail it is evaluated as $\arctan(1/z)/\pi$, which keeps full relative precision.
    """
    x, loc, scale = _prepare(x, loc, scale)
    return _StandardizedFunction.apply(x, loc, scale, "sf")


def cdf(x, loc, scale) -> Tensor:
    r"""Distribution function $P(X \le x) = \tfrac12 + \tfrac1\pi\arctan z$.

    By symmetry $F(x; \mu, \gamma) = \mathrm{sf}(\mu; x, \gamma)$, which is how it is computed.
    """
    x, loc, scale = _prepare(x, loc, scale)
    return _StandardizedFunction.apply(loc, x, scale, "sf")


def log_sf(x, loc, scale) -> Tensor:
    r"""$\log P(X > x)$, accurate to a few ulps for every finite input.

    Upper tail ($z > 1$): $\log\arctan(1/z) - \log\pi$; lower tail ($z < -1$):
    $\log\big(1 - \arctan(1/|z|)/\pi\big)$ via ``log1p``; in between the direct form.
    """
    x, loc, scale = _prepare(x, loc, scale)
    return _StandardizedFunction.apply(x, loc, scale, "log_sf")


def log_cdf(x, loc, scale) -> Tensor:
    r"""$\log P(X \le x) = \log \mathrm{sf}(\mu; x, \gamma)$ (the mirror image of `log_sf`)."""
    x, loc, scale = _prepare(x, loc, scale)
    return _StandardizedFunction.apply(loc, x, scale, "log_sf")


def icdf(p, loc, scale) -> Tensor:
    r"""Quantile function $F^{-1}(p) = \mu + \gamma \tan\big(\pi(p - \tfrac12)\big)$, $p \in [0, 1]$.

    Written as $-\gamma/\tan(\pi p)$ for $p < \tfrac14$ and $\gamma/\tan(\pi(1 - p))$ for $p > \tfrac34$, so
    that a small $p$ is not rounded away in $p - \tfrac12$, and as a quotient, so that $\cot(\pi p)$ does not
    overflow where $\gamma\cot(\pi p)$ is finite (a subnormal $p$ beside a small $\gamma$).
    $F^{-1}(0) = -\infty$, $F^{-1}(1) = +\infty$.
    """
    p, loc, scale = _prepare(p, loc, scale, names=("p", "loc", "scale"))
    if validating() and not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("p must lie in [0, 1] everywhere (it is a probability)")
    lower = -scale / torch.tan(math.pi * p)  # -gamma cot(pi p)
    upper = scale / torch.tan(math.pi * (1.0 - p))  # gamma cot(pi (1 - p))
    middle = scale * torch.tan(math.pi * (p - 0.5))
    return loc + torch.where(p < 0.25, lower, torch.where(p > 0.75, upper, middle))


def log_interval_prob(low, high, loc, scale) -> Tensor:
    r"""$\log P(a < X \le b)$ for $X \sim \mathrm{Cauchy}(\mu, \gamma)$, in float64, on the whole domain

    $$
    -\infty \le a < b \le +\infty, \qquad \mu \text{ finite}, \qquad 0 < \gamma < \infty:
    $$

    $a = -\infty$ gives $\log P(X \le b)$, $b = +\infty$ gives $\log P(X > a)$, both gives $\log 1 = 0$. The answer
    is finite everywhere on it, ends near float64's limits ($\pm 1.8 \times 10^{308}$) and tiny scales included.
    With $z = (x - \mu)/\gamma$, $P = (\arctan z_b - \arctan z_a)/\pi$, computed from the ends' signed distances to
    the location in logarithms ($\log|a - \mu|$, $\log|b - \mu|$, $\log(b - a)$, each from halves where the
    difference itself would overflow), as `log_interval_prob_reduced` states: one arctangent on one side of the
    location, so a narrow interval far in a tail keeps full relative precision where $F(b) - F(a)$ would cancel
    to zero; across it, $\log(1 - T)$ with $T$ the two tail masses, so an interval holding nearly all the mass
    keeps full relative precision too. An evaluation quantity: no gradient is defined.

    Raises:
        TypeError: an argument is not a tensor or a real number.
        ValueError: (naming the argument) ``low``, ``high`` or ``loc`` is NaN, ``loc`` is infinite, ``scale`` is
            not a finite number $> 0$; the shapes do not broadcast; or ``low < high`` fails somewhere. These
            checks run while `validating` (the module's switch).
    """
    # Python numbers are float64 here (the result is float64): 1.7e308 stays itself, not float32's inf
    low, high, loc, scale = (
        torch.tensor(value, dtype=torch.float64)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else value
        for value in (low, high, loc, scale)
    )
    low, loc, scale = _prepare(low, loc, scale, names=("low", "loc", "scale"))
    high, loc, scale = _prepare(high, loc, scale, names=("high", "loc", "scale"))
    low, high, loc, scale = (tensor.detach().double() for tensor in torch.broadcast_tensors(low, high, loc, scale))
    if validating():
        for name, tensor in (("low", low), ("high", high), ("loc", loc)):
            if bool(tensor.isnan().any()):
                raise ValueError(f"{name} must not be NaN; found {int(tensor.isnan().sum())} NaN element(s)")
        for name, tensor in (("loc", loc), ("scale", scale)):
            if not bool(tensor.isfinite().all()):
                raise ValueError(
                    f"{name} must be finite everywhere, got {tensor[~tensor.isfinite()].flatten()[0].item()!r}"
                )
        if not bool((low < high).all()):
            where = ~(low < high)
            raise ValueError(
                f"low must be < high everywhere (an interval of positive width); found low = "
                f"{low[where].flatten()[0].item()!r} and high = {high[where].flatten()[0].item()!r}"
            )
    sign_low, log_distance_low = _signed_log_distance(low, loc)
    sign_high, log_distance_high = _signed_log_distance(high, loc)
    width = high - low  # rounded once; never 0 for low < high
    log_width = torch.where(
        width.isinf() & low.isfinite() & high.isfinite(), torch.log(high * 0.5 - low * 0.5) + LOG_2, torch.log(width)
    )  # +inf at an infinite end
    return log_interval_prob_reduced(
        sign_low, log_distance_low, sign_high, log_distance_high, log_width, torch.log(scale)
    )


def _signed_log_distance(x: Tensor, loc: Tensor) -> tuple[Tensor, Tensor]:
    r"""The sign of $x - \mu$ and $\log|x - \mu|$: $+\infty$ at an infinite $x$, $-\infty$ at $x = \mu$, from the
    halves $x/2 - \mu/2$ (exact for normal numbers) where the difference overflows."""
    difference = x - loc
    overflow = difference.isinf() & x.isfinite()
    log_distance = torch.where(overflow, torch.log((x * 0.5 - loc * 0.5).abs()) + LOG_2, torch.log(difference.abs()))
    return torch.sign(torch.where(overflow, x * 0.5 - loc * 0.5, difference)), log_distance


def log_interval_prob_reduced(sign_low, log_distance_low, sign_high, log_distance_high, log_width, log_scale) -> Tensor:
    r"""$\log P(a < X \le b)$ from the ends' signed distances to the location, in logarithms (float64 tensors that
    broadcast): $s_a, s_b \in \{-1, 0, 1\}$ the signs of $d_a = a - \mu$ and $d_b = b - \mu$, $\ell_a = \log|d_a|$ and
    $\ell_b = \log|d_b|$ ($+\infty$ at an infinite end, $-\infty$ at an end on $\mu$), $\ell_w = \log(b - a)$ and
    $\ell_\gamma = \log\gamma$. For a caller that holds the ends more exactly than float64 can
    (`causalqwen.likelihood` forms them in exact decimal arithmetic); `log_interval_prob` from float ends. Not
    checked: $a < b$ and consistent arguments are the caller's.

    *On one side of the location* ($s_a \ge 0$ or $s_b \le 0$, so $z_a z_b \ge 0$):
    $\arctan z_b - \arctan z_a = \arctan t$, with

    $$
    \log t = \ell_w - \ell_\gamma - \operatorname{softplus}(\ell_a + \ell_b - 2\ell_\gamma)
    \quad\big(t = \tfrac{(b - a)/\gamma}{1 + z_a z_b}\big),
    \qquad \log t = \ell_\gamma - \ell_{\text{finite end}} \text{ when the other end is infinite}
    \quad\big(t = 1/|z|\big),
    $$

    and $\log P = \log\arctan t - \log\pi$, taken as $\log t$ once $t < e^{-20}$ (the error is $t^2/3$).

    *Across the location* ($s_a < 0 < s_b$): $P = 1 - T$ with the two tail masses
    $T = \big(\arctan(\gamma/|d_a|) + \arctan(\gamma/|d_b|)\big)/\pi$, $\gamma/|d| = e^{\ell_\gamma - \ell}$ (0 at an
    infinite end). While $T < \tfrac12$, $\log P = \operatorname{log1p}(-T)$, accurate when $P$ is near 1;
    otherwise $\log P = \log\big(\arctan|z_a| + \arctan|z_b|\big) - \log\pi$, a sum of two positive terms, added
    in logarithms ($\log\arctan|z| = \log|z|$ to within $z^2/3$ once $|z| < e^{-20}$): finite for an interval
    however narrow around the location.
    """
    # On one side: the tangent t of the arctangent difference, from logarithms
    log_t = torch.where(
        log_distance_high == math.inf,
        log_scale - log_distance_low,
        torch.where(
            log_distance_low == math.inf,
            log_scale - log_distance_high,
            log_width - log_scale - F.softplus(log_distance_low + log_distance_high - 2 * log_scale, threshold=40.0),
        ),
    )
    one_side = _log_atan_exp(log_t) - LOG_PI
    # Across: one minus the two tails, or the two arctangents added (in logarithms: each |z| may be below float64's
    # smallest number, an interval of width 10^-400 around the location)
    tails = (
        torch.atan(torch.exp(log_scale - log_distance_low)) + torch.atan(torch.exp(log_scale - log_distance_high))
    ) / math.pi
    across = torch.where(
        tails < 0.5,
        torch.log1p(-tails),
        torch.logaddexp(_log_atan_exp(log_distance_low - log_scale), _log_atan_exp(log_distance_high - log_scale))
        - LOG_PI,
    )
    sign_low, sign_high = torch.as_tensor(sign_low), torch.as_tensor(sign_high)
    return torch.where((sign_low < 0) & (sign_high > 0), across, one_side)


def _log_atan_exp(log_x: Tensor) -> Tensor:
    r"""$\log\arctan x$ from $\log x$, for any $x \ge 0$: $\log x$ itself once $x < e^{-20}$ (the error is $x^2/3$),
    so an $x$ below float64's smallest number keeps its logarithm; $\log(\pi/2)$ at $x = \infty$."""
    return torch.where(log_x < -20.0, log_x, torch.log(torch.atan(torch.exp(log_x))))


def rsample(loc, scale, uniform) -> Tensor:
    r"""Reparameterized draw $\mu + \gamma\tan\big(\pi(\varepsilon - \tfrac12)\big)$ for given $\varepsilon \in [0, 1]$.

    Identical to ``icdf(uniform, loc, scale)``; gradients flow to ``loc`` and ``scale``.
    """
    return icdf(uniform, loc, scale)


def linear(
    loc, scale, weight: Tensor, bias: Tensor | None = None, *, abs_weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""Law of $Y = W X + b$ for $X$ with independent $\mathrm{Cauchy}(\mu_j, \gamma_j)$ components.

    $$
    Y_k \sim \mathrm{Cauchy}\Big(\sum_j W_{kj}\mu_j + b_k,\ \sum_j |W_{kj}|\,\gamma_j\Big),
    $$

    i.e. ``(loc @ weight.T + bias, scale @ weight.abs().T)``. Shapes: loc, scale ``[..., C]``,
    weight ``[K, C]``, bias ``[K]``; result ``[..., K]`` twice.

    ``abs_weight`` is $|W|$ computed once by a caller that applies the same weight many times
    (generation: for a large head, forming $|W|$ costs several times the matrix product itself).
    """
    if not isinstance(weight, Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    loc, scale = _as_float_tensors(loc, scale, names=("loc", "scale"))
    if validating():
        if abs_weight is not None and (not isinstance(abs_weight, Tensor) or abs_weight.shape != weight.shape):
            raise ValueError(f"abs_weight must be a tensor of weight's shape {tuple(weight.shape)}")
        check_scale(scale)
        if loc.shape[-1:] != weight.shape[-1:] or scale.shape[-1:] != weight.shape[-1:]:
            raise ValueError(
                f"last dimension of loc {tuple(loc.shape)} and scale {tuple(scale.shape)} must equal "
                f"weight's input dimension {weight.shape[-1]}"
            )
    if abs_weight is None:
        abs_weight = weight.abs()
    loc_out = F.linear(loc, weight, bias)  # [..., K]
    scale_out = F.linear(scale, abs_weight)  # [..., K]
    return loc_out, scale_out


# --------------------------------------------------------------------------------------------
# The tail kernel of the One-vs-Rest loss
# --------------------------------------------------------------------------------------------


class TailTerms(NamedTuple):
    """`tail_terms` of a tile: the value $a$ and its two partial derivatives (each None unless asked for)."""

    value: Tensor | None  # a(d, s) = -log P(X > d)
    d_diff: Tensor | None  # da/dd
    d_scale: Tensor | None  # da/ds


def tail_terms(diff: Tensor, scale: Tensor, *, value: bool = True, grads: bool = False) -> TailTerms:
    r"""$a(d, s) = -\log P(X > d)$ for $X \sim \mathrm{Cauchy}(0, s)$, elementwise, with its derivatives.

    This is the one kernel both OvR paths use. With $d = \mathrm{loc}_{S_k} - C_k$ and $s = \mathrm{scale}_{S_k}$,
    $P(X > d) = F(-d/s) = 1 - P_k$, so $-\log(1 - P_k) = a(d, s)$ and $-\log P_k = a(-d, s)$.

    With $t = d/s$, everything is formed from $r = \min(|t|, 1/|t|) = \min(|d|, s)/\max(|d|, s) \in [0, 1]$ (so
    nothing overflows and nothing divides by 0, in the value or in any derivative) and the smaller tail mass
    $m = F(-|t|)$: $\arctan(r)/\pi$ beyond $|t| = 1$, else $\tfrac12 - \arctan(r)/\pi$. Then $a = -\log m$ for
    $d > 0$ and $a = -\operatorname{log1p}(-m)$ otherwise, and

    $$\frac{\partial a}{\partial d} = \frac{f(t)}{F(-t)\,s},\qquad
    \frac{\partial a}{\partial s} = -\frac{t\,f(t)}{F(-t)\,s},$$

    with $\pi f(t) = 1/(1 + r^2)$ for $|t| \le 1$, $r^2/(1 + r^2)$ beyond, and
    $\pi t f(t) = \mathrm{sign}(t)\,r/(1 + r^2)$ on both sides; the ratio $z = r / (\pi F(-t) (1 + r^2))$ stays
    bounded even where $F(-t)$ is tiny. In float32
    the value is finite while $|t| < 2^{149}$ (where $r$ underflows to 0) and $d$ itself is finite (the callers form
    $d = \mathrm{loc}_S - C$, which overflows only for $|\mathrm{loc}_S|, |C|$ near the largest float with opposite
    signs); inside the model neither happens, as $s \ge$ ``scale_eps`` and $|C| \le 10^{30}$. ``scale`` must be
    $> 0$; no check is made here (the callers clamp at ``scale_eps``). Second derivatives taken through `tail_nll`
    (the literal path's Hessian) are exact everywhere except exactly at $d = 0$ and $|d| = s$ (the branch points of
    this form: there autograd differentiates ``abs``, ``minimum`` and ``maximum`` at a tie and returns 0, not $a''$).
    """
    size = diff.abs()
    far = size > scale  # |t| > 1
    r = torch.minimum(size, scale) / torch.maximum(size, scale)  # min(|t|, 1/|t|); no division by 0, no overflow
    tail = torch.atan(r) / math.pi  # arctan(r) / pi, in [0, 1/4]
    m = torch.where(far, tail, 0.5 - tail)  # F(-|t|), in (0, 1/2]
    positive = diff > 0
    a = d_diff = d_scale = None
    if value:
        a = -torch.where(positive, torch.log(m), torch.log1p(-m))
    if grads:
        den = math.pi * torch.where(positive, m, 1.0 - m) * (1.0 + r * r)  # pi F(-t) (1 + r^2)
        z = r / den
        d_diff = torch.where(far, r * z, 1.0 / den) / scale  # f(t) / (F(-t) s)
        d_scale = -torch.where(positive, z, -z) / scale  # -t f(t) / (F(-t) s)
    return TailTerms(a, d_diff, d_scale)


class TailNLL(torch.autograd.Function):
    r"""$-\log P(X > d)$ for $X \sim \mathrm{Cauchy}(0, s)$ (`tail_terms`), differentiable in ``diff`` and ``scale``:
    backward applies the kernel's analytic derivatives (differentiable again). Called as `tail_nll`."""

    @staticmethod
    def forward(ctx, diff: Tensor, scale: Tensor) -> Tensor:
        ctx.save_for_backward(diff, scale)
        return tail_terms(diff, scale).value

    @staticmethod
    def backward(ctx, grad: Tensor):
        diff, scale = ctx.saved_tensors
        terms = tail_terms(diff, scale, value=False, grads=True)
        return grad * terms.d_diff, grad * terms.d_scale


tail_nll = TailNLL.apply
r"""``tail_nll(diff, scale)``: $-\log P(X > d)$ for $X \sim \mathrm{Cauchy}(0, s)$ (`TailNLL`), ``diff`` and ``scale``
of one shape."""


# --------------------------------------------------------------------------------------------
# Divergence between two Cauchy laws
# --------------------------------------------------------------------------------------------


def _scale_divergence_value(scale_p: Tensor, scale_q: Tensor) -> Tensor:
    r"""$\log\frac{(1 + r)^2}{4r}$, $r = \min/\max$ of the two scales: ``log1p`` near $r = 1$, logarithms below
    $r = 1/8$."""
    large = torch.maximum(scale_p, scale_q)
    small = torch.minimum(scale_p, scale_q)
    ratio = small / large  # in (0, 1]; may underflow
    delta = (large - small) / large  # = 1 - r, without the rounding of r
    close = torch.log1p(delta * delta / (4.0 * ratio))
    log_ratio = torch.where(
        ratio >= torch.finfo(ratio.dtype).tiny, torch.log(ratio), torch.log(small) - torch.log(large)
    )
    apart = 2.0 * torch.log1p(ratio) - 2.0 * LOG_2 - log_ratio
    return torch.where(ratio >= 0.125, close, apart)


class _ScaleDivergence(torch.autograd.Function):
    r"""The scale part $\log\frac{(\gamma_p + \gamma_q)^2}{4\gamma_p\gamma_q}$ of `kl_divergence`, with the
    analytic backward

    $$\partial_{\gamma_p} = \frac{t}{\gamma_p}, \qquad \partial_{\gamma_q} = -\frac{t}{\gamma_q}, \qquad
    t = \frac{\gamma_p - \gamma_q}{\gamma_p + \gamma_q} \in (-1, 1).$$

    The chain rule through $\log(\min/\max)$ would form $(r/\max) \cdot (1/r)$, which underflows or
    overflows for a large scale ratio although the product is ordinary.
    """

    @staticmethod
    def forward(ctx, scale_p: Tensor, scale_q: Tensor) -> Tensor:
        ctx.save_for_backward(scale_p, scale_q)
        return _scale_divergence_value(scale_p, scale_q)

    @staticmethod
    def backward(ctx, grad: Tensor):
        scale_p, scale_q = ctx.saved_tensors
        large = torch.maximum(scale_p, scale_q)
        delta = (large - torch.minimum(scale_p, scale_q)) / large  # 1 - r, which neither overflows nor is 0/0
        t = torch.where(scale_p >= scale_q, delta, -delta) / (2.0 - delta)  # (1 - r) / (1 + r), signed
        return grad * t / scale_p, -grad * t / scale_q


def kl_divergence(loc_p, scale_p, loc_q, scale_q) -> Tensor:
    r"""Kullback-Leibler divergence $\mathrm{KL}(p \,\|\, q)$ of $q = \mathrm{Cauchy}(\mu_q, \gamma_q)$ from
    $p = \mathrm{Cauchy}(\mu_p, \gamma_p)$, elementwise (the four arguments broadcast together):

    $$
    \mathrm{KL}(p \,\|\, q) = \int p \log\frac{p}{q}
    = \log\frac{(\gamma_p + \gamma_q)^2 + (\mu_p - \mu_q)^2}{4\gamma_p\gamma_q} .
    $$

    It is symmetric in $p$ and $q$, zero exactly when $p = q$, and invariant under a common shift of the
    locations and a common positive rescaling. For a vector with independent components (such as $U$) the
    divergence between the joint laws is the sum of these elementwise values over the components; the
    caller sums.

    Numerics. The divergence is the sum of two non-negative parts, one for the scales and one for the locations,

    $$
    \mathrm{KL} = \log\frac{(1 + r)^2}{4r} + \log\big(1 + z^2\big), \qquad
    r = \frac{\min(\gamma_p, \gamma_q)}{\max(\gamma_p, \gamma_q)} \in (0, 1], \qquad
    z = \frac{\mu_p - \mu_q}{\gamma_p + \gamma_q},
    $$

    so adding them loses nothing, and each is evaluated without cancellation or overflow:

    * scale part, for $r \ge 1/8$: $\operatorname{log1p}\big(\delta^2/(4r)\big)$ with
      $\delta = (\max - \min)/\max$, which keeps full relative precision as $r \to 1$ (the logarithm of the
      quotient would round a divergence of $10^{-12}$ to 0 or to noise); for $r < 1/8$:
      $2\operatorname{log1p}(r) - \log 4 - \log r$, with $\log r = \log\min - \log\max$ where $r$ underflows;
    * location part: $\log(1 + z^2)$ in the reduced form of this module (as in `log_prob`, with $\mu_p$, $\mu_q$
      and $\gamma_p + \gamma_q$ as point, location and scale), so $z$ is never formed and nothing overflows.

    Both parts have analytic backward passes (like `log_prob`), so the gradient is finite and accurate wherever
    the true one is representable, e.g. for $\gamma_p = 10^{-30}$, $\gamma_q = 10^{30}$ in float32, where the
    chain rule through the quotients would overflow. As elsewhere in this module, a location below the
    smallest normal float (a subnormal) loses a bit when it is halved. While `validating`, the inputs are
    checked first (finite locations, finite scales $> 0$, shapes that broadcast).
    """
    names = ("loc_p", "scale_p", "loc_q", "scale_q")
    loc_p, scale_p, loc_q, scale_q = _as_float_tensors(loc_p, scale_p, loc_q, scale_q, names=names)
    if validating():
        try:
            torch.broadcast_shapes(loc_p.shape, scale_p.shape, loc_q.shape, scale_q.shape)
        except RuntimeError:
            shapes = ", ".join(str(tuple(v.shape)) for v in (loc_p, scale_p, loc_q, scale_q))
            raise ValueError(
                f"loc_p, scale_p, loc_q and scale_q must broadcast together; got shapes {shapes}"
            ) from None
        for value, name in zip((loc_p, scale_p, loc_q, scale_q), names):
            if not bool(torch.isfinite(value).all()):
                bad = value[~torch.isfinite(value)]
                raise ValueError(
                    f"{name} must be finite everywhere; found {bad.numel()} element(s) that are not, "
                    f"e.g. {bad[0].item()!r}"
                )
        check_scale(scale_p, "scale_p")
        check_scale(scale_q, "scale_q")
    loc_p, scale_p, loc_q, scale_q = torch.broadcast_tensors(loc_p, scale_p, loc_q, scale_q)
    scale_part = _ScaleDivergence.apply(scale_p, scale_q)
    # z = (mu_p - mu_q) / (gamma_p + gamma_q) as (point, location, scale) of the reduced form; where the sum of
    # the scales overflows (both near the largest float) all three are halved, which leaves z unchanged.
    scale_sum = scale_p + scale_q
    halve = torch.isinf(scale_sum)
    location_part = _StandardizedFunction.apply(
        torch.where(halve, loc_p * 0.5, loc_p),
        torch.where(halve, loc_q * 0.5, loc_q),
        torch.where(halve, scale_p * 0.5 + scale_q * 0.5, scale_sum),
        "log1p_square",
    )
    return scale_part + location_part
