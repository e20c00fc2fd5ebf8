r"""The five inference modes (decision D11; docs: inference.md).

Four of the modes differ in one thing only: the *decision input* $U'$ that the linear action map
receives. Everything downstream is the same closed-form Cauchy algebra
(`ActionNetwork.decide`), followed by the OvR argmax (`predict`).

This module owns the rules of D11 once: the decision input of each mode (`decision_input`), the value beside a
token (`predicted_value`), the checked prediction (`predict`) and the traditional sampling distribution
(`traditional_probabilities`). The OvR argmax itself is `action.ovr_token`, where every OvR quantity is formed
(`causalqwen.kernels.tiles.ovr_argmax` is its tiled fast path for the standard decision, tested equal to it).
Each function has one name and checks its arguments while `causalqwen.cauchy.validating` (the package's one
switch); `DecisionHead` calls them under ``cauchy.validation(False)`` on inputs the model's door has checked, and
`predicted_value` checks nothing (its callers have).

| mode | decision input $U'$ | randomness |
|---|---|---|
| ``standard`` | $\mathrm{Cauchy}(\mathrm{loc}_U,\ \mathrm{scale}_U + \lvert b_{\mathrm{noise}}\rvert)$ | none |
| ``causal`` | $\mathrm{Cauchy}(u,\ \lvert b_{\mathrm{noise}}\rvert)$, $u = \mathrm{loc}_U + \mathrm{scale}_U \odot \tan(\pi(\varepsilon - \tfrac12))$ | $\varepsilon \sim U(0,1)^C$ fresh at every position and step |
| ``shared_individual`` | as ``causal`` | $\varepsilon$ drawn once per sequence, reused at every step |
| ``shared_noise`` | $\mathrm{Cauchy}(\mathrm{loc}_U + \lvert b_{\mathrm{noise}}\rvert \odot \varepsilon_n,\ \mathrm{scale}_U)$ | $\varepsilon_n \sim \mathrm{Cauchy}(0,1)^C$ once per sequence |
| ``traditional`` | -- ($\mathrm{softmax}(\mathrm{loc}_S / T)$ with top-k / top-p) | a categorical draw per step |

In ``causal`` mode the individual is sampled and only the exogenous noise stays a distribution, so
the class scales are $\mathrm{scale}_{S_k} = |W_{\mathrm{cls},k}| \cdot |b_{\mathrm{noise}}|$. In
``shared_noise`` mode the noise is a fixed *instance* that shifts the location, and the individual
stays uncertain. ``causal`` and ``shared_individual`` differ only in how often $\varepsilon$ is drawn,
which is the business of `causalqwen.generation`; here both take ``uniform`` or draw it.

Prediction in the first four modes: token $= \arg\max_k P_k$ with $P_k = P(S_k > C_k)$, and the value
$\mathrm{loc}_Y$ where that token is ``<NUM>``.
"""  # noqa: E501 -- the table rows above: a Markdown table row is one line

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import Tensor

from . import cauchy
from .action import check_law, check_threshold, noise_infused_scale, ovr_tail_nll, ovr_token
from .losses import at_least_float32

__all__ = [
    "DECISION_MODES",
    "MODES",
    "as_number",
    "check_law_of_U",
    "check_mode",
    "check_noise",
    "check_normalize",
    "check_sampling_args",
    "check_temperature",
    "check_uniform",
    "decision_input",
    "draw_standard_cauchy",
    "draw_uniform",
    "predict",
    "predicted_value",
    "sample_token",
    "tempered_scores",
    "traditional_probabilities",
]

DECISION_MODES = ("standard", "causal", "shared_individual", "shared_noise")
MODES = DECISION_MODES + ("traditional",)

# D10: a uniform used for reparameterized sampling is clamped to [UNIFORM_EPS, 1 - UNIFORM_EPS], in
# float64. The largest standard-Cauchy value it can give is 1 / (pi * 2**-53), about 2.9e15.
UNIFORM_EPS = 2.0**-53


def check_mode(mode, allowed: tuple[str, ...] = MODES) -> str:
    """Return ``mode`` if it is one of ``allowed``; otherwise raise a ``ValueError`` that lists them."""
    if not isinstance(mode, str) or mode not in allowed:
        raise ValueError(f"unknown inference mode {mode!r}; valid modes are: {', '.join(allowed)}")
    return mode


def draw_uniform(shape, *, generator: torch.Generator | None = None, device=None) -> Tensor:
    r"""$\varepsilon \sim U(0, 1)$ in float64, on the open grid $(2k + 1)\,2^{-53}$, $k = 0, \dots, 2^{52} - 1$.

    Every value lies strictly inside $(0, 1)$ and is exactly representable; the grid is symmetric about
    $\tfrac12$, so $\tan(\pi(\varepsilon - \tfrac12))$ is symmetric too.
    """
    k = torch.randint(0, 2**52, tuple(shape), generator=generator, device=device, dtype=torch.int64)
    return (2 * k + 1).to(torch.float64) * 2.0**-53


def draw_standard_cauchy(shape, *, generator: torch.Generator | None = None, device=None) -> Tensor:
    r"""$\varepsilon_n = F^{-1}(\varepsilon) = \tan(\pi(\varepsilon - \tfrac12))$, $\varepsilon$ from `draw_uniform`;
    float64."""
    uniform = draw_uniform(shape, generator=generator, device=device)  # in (0, 1) by construction
    with cauchy.validation(False):
        return cauchy.icdf(uniform, 0.0, 1.0)


def check_uniform(uniform: Tensor) -> Tensor:
    if not isinstance(uniform, Tensor) or not uniform.dtype.is_floating_point:
        raise TypeError(f"uniform must be a floating-point tensor, got {type(uniform).__name__}")
    if not bool(((uniform > 0) & (uniform < 1)).all()):
        raise ValueError("uniform must lie strictly inside (0, 1): it is the epsilon of the inverse-CDF sampling")
    return uniform


def check_noise(noise: Tensor) -> Tensor:
    if not isinstance(noise, Tensor) or not noise.dtype.is_floating_point:
        raise TypeError(f"noise must be a floating-point tensor, got {type(noise).__name__}")
    if not bool(torch.isfinite(noise).all()):
        raise ValueError("noise must be finite (standard-Cauchy draws): found NaN or ±inf")
    return noise


def check_law_of_U(loc_U, scale_U, noise_scale) -> None:
    r"""`decision_input`'s door for the law: ``loc_U``, ``scale_U`` of one shape ``[..., C]`` (`action.check_law`),
    and ``noise_scale`` a floating-point ``[C]`` tensor >= 0 (it is $|b_{\mathrm{noise}}|$)."""
    if not isinstance(noise_scale, Tensor) or not noise_scale.dtype.is_floating_point:
        raise TypeError(
            f"noise_scale must be a floating-point tensor, got "
            f"{getattr(noise_scale, 'dtype', type(noise_scale).__name__)}"
        )
    if isinstance(loc_U, Tensor) and isinstance(scale_U, Tensor) and (loc_U.dim() == 0 or scale_U.shape != loc_U.shape):
        raise ValueError(
            f"loc_U and scale_U must have one shape [..., C]; got {tuple(loc_U.shape)} and {tuple(scale_U.shape)}"
        )
    check_law(loc_U, scale_U, None, ("loc_U", "scale_U"))
    if noise_scale.shape != loc_U.shape[-1:]:
        raise ValueError(f"noise_scale must have shape [C] = {tuple(loc_U.shape[-1:])}, got {tuple(noise_scale.shape)}")
    if not bool((noise_scale >= 0).all()):
        raise ValueError("noise_scale must be >= 0 everywhere: it is |b_noise|, a Cauchy scale")


def decision_input(
    mode: str,
    loc_U: Tensor,
    scale_U: Tensor,
    noise_scale: Tensor,
    *,
    uniform: Tensor | None = None,
    noise: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Location and scale of the decision input $U'$ for ``mode`` (the table above, decision D11).

    - ``standard``: $(\mathrm{loc}_U,\ \mathrm{scale}_U + |b_{\mathrm{noise}}|)$ (`action.noise_infused_scale`);
    - ``causal``, ``shared_individual``:
      $(\mathrm{loc}_U + \mathrm{scale}_U \odot \tan(\pi(\varepsilon - \tfrac12)),\ |b_{\mathrm{noise}}|)$;
    - ``shared_noise``: $(\mathrm{loc}_U + |b_{\mathrm{noise}}| \odot \varepsilon_n,\ \mathrm{scale}_U)$.

    Args:
        loc_U: location of the law of $U$, ``[..., C]``.
        scale_U: its scale, ``[..., C]``, >= 0.
        noise_scale: $|b_{\mathrm{noise}}|$, ``[C]``.
        uniform: $\varepsilon$, values in $(0, 1)$ broadcastable to ``[..., C]``; drawn from ``generator`` if omitted.
        noise: $\varepsilon_n$, standard-Cauchy values broadcastable to ``[..., C]``; drawn if omitted.
        generator: the source of the draws when ``uniform`` / ``noise`` are omitted.

    Returns ``(loc, scale)``, both ``[..., C]`` in the dtype of ``loc_U``. The sampled modes form
    $\tan(\cdot)$ in float64. A zero $|b_{\mathrm{noise}}|$ is allowed: the action network clamps the
    resulting decision scales at ``scale_eps``. While `causalqwen.cauchy.validating`, every argument is checked
    first.
    """
    if cauchy.validating():
        check_mode(mode, DECISION_MODES)
        check_law_of_U(loc_U, scale_U, noise_scale)
        if uniform is not None:
            check_uniform(uniform)
        if noise is not None:
            check_noise(noise)
    if mode == "standard":
        return loc_U, noise_infused_scale(scale_U, noise_scale)  # [..., C]
    if mode in ("causal", "shared_individual"):
        if uniform is None:
            uniform = draw_uniform(loc_U.shape, generator=generator, device=loc_U.device)  # on the grid, in range
        uniform = uniform.to(torch.float64).clamp(UNIFORM_EPS, 1.0 - UNIFORM_EPS)  # D10
        with cauchy.validation(False):  # clamped into (0, 1) just above
            standard = cauchy.icdf(uniform, 0.0, 1.0)  # tan(pi (eps - 1/2)), float64
        u = (loc_U.double() + scale_U.double() * standard).to(loc_U.dtype)  # [..., C], the sampled individual
        return u, noise_scale.expand_as(u)
    # shared_noise
    if noise is None:
        noise = draw_standard_cauchy(loc_U.shape, generator=generator, device=loc_U.device)
    shifted = (loc_U.double() + noise_scale.double() * noise.double()).to(loc_U.dtype)  # [..., C]
    return shifted, scale_U


def predicted_value(token: Tensor, loc_Y: Tensor, num_token_id: int) -> Tensor:
    r"""The value beside a token, $\hat y = \mathrm{loc}_Y$ where it is ``<NUM>`` and 0.0 elsewhere; ``[...]`` each."""
    return torch.where(token == num_token_id, loc_Y, torch.zeros_like(loc_Y))  # [...]


def predict(loc_S: Tensor, scale_S: Tensor, loc_Y: Tensor, threshold, num_token_id: int) -> tuple[Tensor, Tensor]:
    r"""Token $\hat k = \arg\max_k P_k$ (`action.ovr_token`) and value $\hat y = \mathrm{loc}_Y$ at ``<NUM>``, 0.0
    elsewhere (`predicted_value`), after checking every argument while `causalqwen.cauchy.validating`.

    Shapes: ``loc_S``, ``scale_S`` ``[..., V]``, ``loc_Y`` ``[...]``; returns ``[...]`` (long) and ``[...]``.
    """
    if cauchy.validating():
        num_classes = loc_S.shape[-1]
        if (
            isinstance(num_token_id, bool)
            or not isinstance(num_token_id, numbers.Integral)
            or not 0 <= num_token_id < num_classes
        ):
            raise ValueError(f"num_token_id must be a class index in [0, {num_classes}), got {num_token_id!r}")
        if tuple(loc_Y.shape) != tuple(loc_S.shape[:-1]):
            raise ValueError(
                f"loc_Y shape {tuple(loc_Y.shape)} must equal loc_S shape without its last dim "
                f"{tuple(loc_S.shape[:-1])}"
            )
        check_threshold(threshold, num_classes, loc_S.dtype)
        cauchy.check_scale(scale_S)
    token_ids = ovr_token(loc_S, scale_S, threshold)  # [...]
    return token_ids, predicted_value(token_ids, loc_Y, num_token_id)


def as_number(value, integer: bool = False):
    """``value`` as a Python ``int`` (``integer``) or ``float`` if it is a real number: a Python number, a
    NumPy scalar or a 0-d real tensor; otherwise ``None``. Booleans are not numbers here."""
    if isinstance(value, Tensor):
        if value.dim() != 0 or value.dtype == torch.bool or value.is_complex():
            return None
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    if integer:
        return int(value) if isinstance(value, numbers.Integral) else None
    return float(value)


def check_temperature(temperature) -> float:
    """``temperature`` as a Python float if it is a finite number > 0, else a ``ValueError`` naming it. Any such
    temperature works, however small: `tempered_scores` divides so that a tiny one (even one that is 0 in the
    scores' dtype, as 1e-46 is in float32) gives the greedy distribution, never a NaN."""
    temperature_ = as_number(temperature)
    if temperature_ is None or not (math.isfinite(temperature_) and temperature_ > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return temperature_


def tempered_scores(scores: Tensor, temperature: float) -> Tensor:
    r"""$(s_k - \max_j s_j) / T$, the log-weights of a softmax at temperature $T$, for any $T > 0$.

    Shifting by the row maximum leaves the softmax unchanged and keeps every entry $\le 0$, so a tiny $T$ sends
    the other classes to $-\infty$ instead of the maximum to $+\infty$. The maxima (the entries whose shifted
    score is exactly 0) stay 0 whatever $T$ is: at a $T$ the scores' dtype holds as 0 (1e-46 in float32, 1e-8 in
    float16) the division would give $0/0$; the limit $T \to 0$, the greedy distribution (ties share the mass),
    is what the formula tends to and what is returned.
    """
    shifted = scores - scores.amax(dim=-1, keepdim=True)  # [..., V], <= 0
    return torch.where(shifted == 0, shifted, shifted / temperature)  # [..., V]


def check_sampling_args(temperature, top_k, top_p) -> tuple[float, int, float]:
    """Return ``(temperature, top_k, top_p)`` as Python numbers (NumPy scalars and 0-d tensors accepted);
    raise a ``ValueError`` naming the argument unless temperature > 0, top_k >= 0 and top_p in (0, 1]."""
    temperature_, top_k_, top_p_ = check_temperature(temperature), as_number(top_k, integer=True), as_number(top_p)
    if top_k_ is None or top_k_ < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 keeps every class), got {top_k!r}")
    if top_p_ is None or not 0 < top_p_ <= 1:
        raise ValueError(f"top_p must lie in (0, 1] (1 keeps every class), got {top_p!r}")
    return temperature_, top_k_, top_p_


def check_normalize(normalize) -> str:
    """``normalize`` if it is ``"softmax"`` or ``"ovr"``; otherwise a ``ValueError``."""
    if normalize not in ("softmax", "ovr"):
        raise ValueError(f'normalize must be "softmax" or "ovr", got {normalize!r}')
    return normalize


def traditional_probabilities(
    loc_S: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    *,
    scale_S: Tensor | None = None,
    threshold=None,
    normalize: str = "softmax",
) -> Tensor:
    r"""A categorical distribution over the $V$ classes for top-k / top-p sampling (decision D11).

    ``normalize="softmax"``: $p_k \propto \exp(\mathrm{loc}_{S_k} / T)$, the base model's sampling
    distribution (at initialization $\mathrm{loc}_S$ are Qwen's logits).
    ``normalize="ovr"``: $p_k \propto P_k^{1/T}$ with $P_k = P(S_k > C_k)$ (needs ``scale_S`` and
    ``threshold``); at $T = 1$ this is $P_k / \sum_j P_j$. Both are computed as a softmax of log-weights.

    Then, as in transformers' logits warpers, top-k keeps the ``top_k`` most probable classes (0: all),
    and top-p keeps the smallest set of most probable classes whose mass reaches ``top_p`` (always at
    least one), each followed by renormalization. Returns ``[..., V]``, zero outside the kept set,
    summing to 1. The division by ``temperature`` is `tempered_scores`: a tiny temperature puts all the mass on
    the most probable class (ties share it). While `causalqwen.cauchy.validating`, the arguments are checked first
    (and ``temperature``, ``top_k``, ``top_p`` may be NumPy scalars or 0-d tensors); otherwise they are taken to be
    the Python numbers `check_sampling_args` returns.
    """
    if cauchy.validating():
        temperature, top_k, top_p = check_sampling_args(temperature, top_k, top_p)
        check_normalize(normalize)
        if normalize == "ovr":
            if scale_S is None or threshold is None:
                raise ValueError('normalize="ovr" needs scale_S and threshold (the OvR probabilities P_k)')
            check_threshold(threshold, loc_S.shape[-1], loc_S.dtype)
            cauchy.check_scale(scale_S)
    if normalize == "softmax":
        scores = loc_S  # [..., V]
    else:
        scores = -ovr_tail_nll(loc_S, scale_S, threshold, off=False)[0]  # log P_k
    log_weights = tempered_scores(scores, temperature)  # [..., V], <= 0

    num_classes = log_weights.shape[-1]
    if 0 < top_k < num_classes:
        kth_largest = log_weights.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
        log_weights = log_weights.masked_fill(log_weights < kth_largest, -math.inf)
    probs = torch.softmax(log_weights, dim=-1)  # [..., V]
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # [..., V]
        sorted_probs = at_least_float32(sorted_probs)  # a float16 sum of 150k classes would drift
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more probable classes
        # The most probable class is always kept: compared in the tensor's type, a tiny top_p can round to 0
        # (1e-12 is 0 in float16, 1e-50 in float32), and 0 >= 0 would drop every class and give NaN.
        drop_sorted = (mass_before >= top_p) & (torch.arange(num_classes, device=probs.device) > 0)
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to class order
        probs = torch.softmax(log_weights.masked_fill(drop, -math.inf), dim=-1)
    return probs


def sample_token(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One categorical draw per row of ``probs`` ``[..., V]``; returns ``[...]`` (long)."""
    flat = probs.reshape(-1, probs.shape[-1])  # [N, V]
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
