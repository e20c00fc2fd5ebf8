r"""Regression from text: the Cauchy law of the number that follows a prompt, and how well answers fit their laws.

At every position $i$ the decision head gives the law of the value of the next token, *should that token be*
``<NUM>``: $Y_i \sim \mathrm{Cauchy}(\mathrm{loc}_{Y_i}, \mathrm{scale}_{Y_i})$ under standard inference (the
exogenous noise infused), and $P_{\langle NUM\rangle, i} = P(S_{\langle NUM\rangle, i} > C)$, the OvR probability
that ``<NUM>`` comes next (the gate of the regression loss).

**The rule of which position is read.** The number that follows a prompt is read at the prompt's last real token
(the last position whose ``attention_mask`` is 1, whatever the padding side). It is the position that scores the
first completion token of a prompt–completion row in training (`causalqwen.files.data.PromptCompletion`), so what
is trained is what is read.

**Central intervals.** At level $q \in (0, 1)$ the central interval is
$[F^{-1}(\tfrac{1-q}2), F^{-1}(\tfrac{1+q}2)] = \mathrm{loc} \mp \mathrm{scale}\,\tan(\tfrac{\pi q}2)$
(`causalqwen.cauchy.icdf`): it holds the value with probability $q$ under the predicted law. Its width ratio
between two levels is fixed by the law (90% against 50%: $\tan(0.45\pi)/\tan(0.25\pi) = 6.31$); `answer_figures`
measures whether real answers agree, and `conformal_factors`, beyond the design, mends their widths on a held-out
split.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from . import cauchy
from .action import num_probability
from .inference import check_mode, decision_input

__all__ = [
    "NumberLaw",
    "answer_figures",
    "answer_positions",
    "check_answers",
    "check_levels",
    "central_intervals",
    "conformal_factors",
    "last_real_positions",
    "next_number_law",
    "predict_number",
    "sampled_next_numbers",
    "PIT_BINS",
    "SAMPLED_MODES",
]

PIT_BINS = 10  # the PIT histogram's bins of equal width on [0, 1]


def check_levels(levels) -> tuple[float, ...]:
    """``levels`` as a tuple of floats, each in the open interval (0, 1), or a ``ValueError`` / ``TypeError`` naming
    the value. A level is any real number (a Python, NumPy or 0-d torch number); ``levels`` a sequence of them, or a
    1-D array or tensor."""
    if isinstance(levels, (Tensor, np.ndarray)) and levels.ndim == 1:
        levels = levels.tolist()
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence):
        raise TypeError(f"levels must be a sequence of numbers in (0, 1), e.g. (0.5, 0.9), got {levels!r}")
    if not levels:
        raise ValueError("levels is empty: ask for at least one level, e.g. (0.5, 0.9)")
    checked = []
    for level in levels:
        if isinstance(level, Tensor) and level.ndim == 0 and level.is_floating_point():
            level = level.item()
        if isinstance(level, (bool, np.bool_)) or not isinstance(level, numbers.Real):
            raise TypeError(f"each level must be a number in (0, 1), got {level!r}")
        if not 0.0 < float(level) < 1.0:  # NaN fails too
            raise ValueError(f"each level must lie in the open interval (0, 1), got {level!r}")
        checked.append(float(level))
    return tuple(checked)


def central_intervals(loc: Tensor, scale: Tensor, levels: tuple[float, ...]) -> tuple[Tensor, Tensor]:
    r"""``(low, high)``, ``[..., L]`` each, in float64: the central interval of
    $\mathrm{Cauchy}(\mathrm{loc}, \mathrm{scale})$ ``[...]`` at each of the ``L`` checked ``levels``. The level and
    the quantile are computed in float64 whatever the law's dtype: rounded to bfloat16, 0.99 is 0.9883, and rounded
    to float32, $(1 + q)/2$ is 1 for $q = 1 - 10^{-8}$."""
    loc, scale = loc.double().unsqueeze(-1), scale.double().unsqueeze(-1)  # [..., 1]
    q = torch.tensor(levels, dtype=torch.float64, device=loc.device)  # [L]
    return cauchy.icdf((1 - q) / 2, loc, scale), cauchy.icdf((1 + q) / 2, loc, scale)  # [..., L] each


def check_answers(values: Tensor, loc: Tensor, scale: Tensor) -> None:
    """``values``, ``loc``, ``scale``: tensors of one shape ``[N]``, the answers and locations finite, the scales
    positive and finite; else a ``TypeError`` / ``ValueError`` naming the argument."""
    for name, tensor in (("values", values), ("loc", loc), ("scale", scale)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [N], got {type(tensor).__name__}")
        if tensor.shape != values.shape or tensor.ndim != 1:
            raise ValueError(
                f"values, loc and scale must share one shape [N]; got {[tuple(t.shape) for t in (values, loc, scale)]}"
            )
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name} holds a NaN or an infinity")
    if not bool((scale > 0).all()):
        raise ValueError("scale must be > 0 everywhere: it is a Cauchy scale")


def last_real_positions(attention_mask: Tensor) -> Tensor:
    """The index of each row's last real token, ``[B]``: the last position where ``attention_mask`` ``[B, S]`` is 1."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # [S]
    return torch.where(attention_mask.bool(), positions, -1).amax(dim=1)  # [B]


@dataclass
class NumberLaw:
    r"""The law of the number that follows each of ``B`` prompts.

    Attributes:
        loc, scale: ``[B]`` each, the law $Y \sim \mathrm{Cauchy}(\mathrm{loc}_Y, \mathrm{scale}_Y)$.
        p_num: $P_{\langle NUM\rangle}$ ``[B]``, the OvR probability that the next token is ``<NUM>``.
        levels: the ``L`` levels of the central intervals.
        low, high: the central intervals ``[B, L]``, column $j$ at ``levels[j]``.
    """

    loc: Tensor
    scale: Tensor
    p_num: Tensor
    levels: tuple[float, ...]
    low: Tensor
    high: Tensor

    def interval(self, level: float) -> tuple[Tensor, Tensor]:
        """``(low, high)`` ``[B]`` at one of the ``levels`` asked."""
        if level not in self.levels:
            raise ValueError(f"level {level!r} was not asked for; the levels are {self.levels}")
        j = self.levels.index(level)
        return self.low[:, j], self.high[:, j]


@torch.no_grad()
def next_number_law(
    model,
    input_ids: Tensor,
    numeric_values: Tensor | None = None,
    attention_mask: Tensor | None = None,
    levels=(0.5, 0.9),
) -> NumberLaw:
    """The `NumberLaw` of the number that follows each prompt of an encoded batch ``[B, S]`` (either padding side),
    read at its last real token (the module's rule), under standard inference."""
    levels = check_levels(levels)
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a [B, S] tensor of prompts, got {shape}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must be a tensor of the shape of input_ids [B, S]")
    if not bool(attention_mask.bool().any(dim=1).all()):
        raise ValueError("every prompt needs at least one real token (a row of attention_mask is all 0)")
    law = model.abduce(input_ids, numeric_values, attention_mask)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)  # [B]
    last = last_real_positions(attention_mask)  # [B]
    head = model.action
    decision = head(law.loc_U[rows, last], law.scale_U[rows, last])  # [B, V] x2, [B] x2
    num = head.num_token_id
    p_num = num_probability(decision.loc_S[:, num], decision.scale_S[:, num], head.ovr_threshold, num)  # [B]
    low, high = central_intervals(decision.loc_Y, decision.scale_Y, levels)
    return NumberLaw(decision.loc_Y, decision.scale_Y, p_num, levels, low, high)


SAMPLED_MODES = ("standard", "causal", "shared_individual")  # the modes whose value is loc_Y of their decision input


@torch.no_grad()
def sampled_next_numbers(
    model, input_ids: Tensor, numeric_values: Tensor, attention_mask: Tensor, mode: str, *, uniform=None, generator=None
) -> Tensor:
    r"""The value of the number that follows each prompt under the inference ``mode`` (decision D11), read at the
    prompt's last real token: ``[B]``.

    In ``causal`` and ``shared_individual`` the individual is drawn, $u = \mathrm{loc}_U + \mathrm{scale}_U \odot
    \tan(\pi(\varepsilon - \tfrac12))$, and the value is $\mathrm{loc}_Y(u) = \vec w_{\mathrm{reg}} \cdot u +
    b_{\mathrm{reg}}$, the median of $Y$ for that individual (the exogenous noise stays a law), so over
    $\varepsilon$ it is distributed $\mathrm{Cauchy}(\vec w_{\mathrm{reg}} \cdot \mathrm{loc}_U + b_{\mathrm{reg}},\
    |\vec w_{\mathrm{reg}}| \cdot \mathrm{scale}_U)$ (the closure, tested by Monte Carlo). One call is one step:
    the two modes differ in the ``uniform`` $\varepsilon$ ``[B, C]`` a caller passes along a path, a fresh draw at
    every step (``causal``; omitted, it is drawn from ``generator``) or one draw for every step of the path
    (``shared_individual``). ``standard`` gives $\mathrm{loc}_Y$ of the standard law (`next_number_law`)."""
    mode = check_mode(mode, SAMPLED_MODES)
    if mode == "shared_individual" and uniform is None:
        raise ValueError("shared_individual needs its one draw: pass uniform=, the [B, C] epsilon reused at every step")
    law = model.abduce(input_ids, numeric_values, attention_mask)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)  # [B]
    last = last_real_positions(attention_mask)  # [B]
    loc_U, scale_U = law.loc_U[rows, last], law.scale_U[rows, last]  # [B, C] each
    head = model.action
    loc, _ = decision_input(mode, loc_U, scale_U, head.noise_scale, uniform=uniform, generator=generator)  # [B, C]
    return head.locations(loc)[1]  # [B]


def predict_number(model, tokenizer, prompts: Sequence[str], levels=(0.5, 0.9)) -> NumberLaw:
    """Regression from text in one call: the `NumberLaw` of the number that follows each of ``prompts``
    (a list of str), encoded by ``tokenizer`` (a `causalqwen.NumericTokenizer`) and read by ``model`` at each
    prompt's last token. ``levels``: the central intervals asked, each in (0, 1)."""
    levels = check_levels(levels)
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of str, got {type(prompts).__name__}")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"prompts[{index}] must be a non-empty str, got {prompt!r}")
    if tokenizer.num_token_id != model.config.num_token_id:
        raise ValueError(
            f"the tokenizer's <NUM> id {tokenizer.num_token_id} is not the model's {model.config.num_token_id}: "
            "pass the tokenizer saved with the model"
        )
    device = next(model.parameters()).device
    encoding = tokenizer(list(prompts), padding=True, return_tensors="pt")
    return next_number_law(
        model,
        encoding["input_ids"].to(device),
        encoding["numeric_values"].to(device),
        encoding["attention_mask"].to(device),
        levels,
    )


def answer_positions(labels: Tensor, attention_mask: Tensor, num_token_id: int, ignore_index: int = -100) -> Tensor:
    """The position of each row's *answer*, ``[B]`` (-1 where a row has none): the first ``<NUM>`` its ``labels``
    score, in a row whose first real token is not scored (a prompt–completion row, whose prompt is at
    ``ignore_index``). Its law is read one position earlier (the next-token rule)."""
    real = attention_mask.bool()  # [B, S]
    first_real = torch.where(real, torch.arange(labels.shape[1], device=labels.device), labels.shape[1]).amin(dim=1)
    rows = torch.arange(labels.shape[0], device=labels.device)
    has_prompt = labels[rows, first_real.clamp(max=labels.shape[1] - 1)] == ignore_index  # [B]
    is_answer = real & (labels == num_token_id)  # [B, S]
    is_answer[:, 0] = False  # the first token has no position before it
    positions = torch.arange(labels.shape[1], device=labels.device)
    first = torch.where(is_answer, positions, labels.shape[1]).amin(dim=1)  # [B]
    return torch.where(has_prompt & (first < labels.shape[1]), first, -1)


def answer_figures(values: Tensor, loc: Tensor, scale: Tensor, levels=(0.5, 0.9)) -> dict[str, float]:
    r"""How ``N`` answers ``values`` ``[N]`` fit their predicted laws $\mathrm{Cauchy}(\mathrm{loc}, \mathrm{scale})$:

    | name | definition |
    |---|---|
    | ``answer_count`` | $N$ |
    | ``answer_mae``, ``answer_mdae`` | mean, median $\lvert \mathrm{loc} - y\rvert$ |
    | ``answer_coverage_{q}`` | the share of answers inside the central interval at level $q$ (ideal: $q$) |
    | ``answer_pit_{k}`` | the share of PIT values $F(y)$ in bin $[k/10, (k+1)/10)$ (ideal: 0.1 each) |
    | ``answer_pit_ks`` | the Kolmogorov–Smirnov distance of the PIT values from the uniform law (ideal: 0) |

    ``q`` is written as a percentage (``answer_coverage_50``). No answers: ``{"answer_count": 0}``."""
    levels = check_levels(levels)
    check_answers(values, loc, scale)
    count = values.numel()
    if count == 0:
        return {"answer_count": 0}
    values, loc, scale = values.double(), loc.double(), scale.double()
    errors = (loc - values).abs()
    figures = {"answer_count": count, "answer_mae": float(errors.mean()), "answer_mdae": float(errors.quantile(0.5))}
    low, high = central_intervals(loc, scale, levels)  # [N, L]
    inside = ((low <= values.unsqueeze(-1)) & (values.unsqueeze(-1) <= high)).double().mean(0)  # [L]
    for level, share in zip(levels, inside.tolist()):
        figures[f"answer_coverage_{100 * level:g}"] = share
    pit = cauchy.cdf(values, loc, scale)  # [N]
    bins = torch.clamp((pit * PIT_BINS).floor().long(), 0, PIT_BINS - 1)
    for k, share in enumerate((torch.bincount(bins, minlength=PIT_BINS).double() / count).tolist()):
        figures[f"answer_pit_{k}"] = share
    ranked = pit.sort().values
    grid = torch.arange(count + 1, dtype=torch.float64) / count
    figures["answer_pit_ks"] = float(torch.maximum(grid[1:] - ranked, ranked - grid[:-1]).max())
    return figures


# ---- beyond the design: split-conformal widths ----


def conformal_factors(values: Tensor, loc: Tensor, scale: Tensor, levels=(0.5, 0.9)) -> dict[float, float]:
    r"""Post-hoc calibration on a held-out split, **beyond the design**: for each level $q$ the factor $f_q$ by which
    to widen (or narrow) the central Cauchy interval, so that $\mathrm{loc} \mp f_q\,\mathrm{scale}\,\tan(\pi q/2)$
    covers a new answer with probability at least $q$ (split conformal prediction, exchangeable answers).

    With the $n$ standardized residuals $r_i = \lvert y_i - \mathrm{loc}_i\rvert / \mathrm{scale}_i$ of the
    calibration split ``values``, ``loc``, ``scale`` ``[n]``, $f_q = r_{(k)} / \tan(\pi q/2)$ with $r_{(k)}$ the
    $k$-th smallest and $k = \lceil (n + 1) q\rceil$. A ``ValueError`` for an empty split, or one too small for a
    level ($k > n$: at least $q/(1-q)$ answers are needed)."""
    levels = check_levels(levels)
    check_answers(values, loc, scale)
    count = values.numel()
    if count == 0:
        raise ValueError("the calibration split is empty: conformal factors need held-out answers")
    residuals = ((values.double() - loc.double()).abs() / scale.double()).sort().values  # [n]
    factors = {}
    for level in levels:
        k = math.ceil((count + 1) * level)
        if k > count:
            needed = count + 1
            while math.ceil((needed + 1) * level) > needed:  # the smallest split with k <= n
                needed += 1
            raise ValueError(
                f"a calibration split of {count} answers is too small for level {level}: it needs at least {needed}"
            )
        factors[level] = float(residuals[k - 1]) / math.tan(math.pi * level / 2)
    return factors
