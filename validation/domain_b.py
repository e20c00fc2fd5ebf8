r"""Domain B: text with numbers partly predictable from the context, for the Qwen2-vs-CausalQwen comparison.

**Domain B** (`domain_b_records`, `domain_b_texts`): each text is one instance of one of three templates
(chosen uniformly; a few phrasings each):

| template | example | the number to be predicted (role ``"target"``) |
|---|---|---|
| ``price`` | ``At the market, a lamp costs 12.4 dollars.`` | the price: the item's mean $m_i$ times $e^{0.1\varepsilon}$, $\varepsilon \sim N(0, 1)$, one decimal |
| ``copy`` | ``The train to the city takes 37 minutes, and the train back also takes 37 minutes.`` | the second number repeats the first |
| ``scaled`` | ``One box holds 23 pens, so two boxes hold 46 pens.`` | the second number is twice the first |

The first number of ``copy`` and ``scaled`` (role ``"given"``) is a uniform draw the model cannot predict.
With ``value_range = (lo, hi)`` (default ``(1, 99)``): item means $m_i = lo\,(hi/lo)^{q_i}$ with fixed
$q_i \in [0.15, 0.85]$ (prices are clipped to $[lo, hi]$ and written with one decimal); ``copy`` draws an
integer in $[\lceil lo\rceil, \lfloor hi\rfloor]$, ``scaled`` an integer $x \in [\lceil lo\rceil, \lfloor hi/2\rfloor]$
(so $2x \le hi$). Every number is followed by a space and a unit word and preceded by a space, so the project's number
grammar (`causalqwen.numbers`) reads exactly the generated numbers, with exactly their values.

*Outliers* (``outlier_fraction = f``): each target number independently, with probability $f$, is replaced by
$v \cdot F$ with $F = \min(2/U,\ 10^4)$, $U \sim \mathrm{Uniform}(0, 1]$ — a Pareto factor with tail index 1
and minimum 2 ($P(F > t) = 2/t$ for $2 \le t < 10^4$: infinite mean), rounded to the template's format.
Outliers come from their own random stream, so the same seed with different $f$ gives the same texts except
at the replaced numbers. The record marks each replaced number (``outlier=True``, ``base_value`` = the value
before the factor).

*Extrapolation* (``extrapolate=True``): every number lies in ``extrapolation_range`` (default ``(200, 5000)``),
which must lie entirely above ``value_range``: ``copy`` draws $x \in [200, 5000]$, ``scaled`` $x \in [200, 2500]$
(so $2x \in [400, 5000]$), written as plain integers. The ``price`` template is left out of extrapolation
corpora: its value is a fixed function of the item word, so there is no relation to extrapolate.
"""  # noqa: E501

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

import regex

from causalqwen.numbers import parse_number

from .argument_checks import check_count, check_seed
from .domain_a import ANIMALS, PLACES

__all__ = [
    "ITEM_QUANTILES",
    "DEFAULT_VALUE_RANGE",
    "DEFAULT_EXTRAPOLATION_RANGE",
    "OUTLIER_FACTOR_MIN",
    "OUTLIER_FACTOR_CAP",
    "DomainBNumber",
    "DomainBRecord",
    "TEMPLATES",
    "domain_b_records",
    "domain_b_texts",
    "item_means",
]

_ARTICLE_END = regex.compile(r"\b([Aa]) $")

DEFAULT_VALUE_RANGE = (1, 99)
DEFAULT_EXTRAPOLATION_RANGE = (200, 5000)
OUTLIER_FACTOR_MIN = 2.0  # F = OUTLIER_FACTOR_MIN / U, U ~ Uniform(0, 1]: Pareto with tail index 1
OUTLIER_FACTOR_CAP = 1e4  # F is capped here (keeps every value a quantity of the grammar, < 1e7)
PRICE_NOISE = 0.1  # the price is mean * exp(PRICE_NOISE * N(0, 1))

# item -> q: its mean price is lo * (hi / lo) ** q (log-spaced over the value range)
ITEM_QUANTILES = {
    "apple": 0.15,
    "bread": 0.25,
    "book": 0.35,
    "shirt": 0.45,
    "lamp": 0.55,
    "chair": 0.65,
    "coat": 0.75,
    "bicycle": 0.85,
}
_PRICE_PHRASES = (
    "At the market, a {item} costs {p} dollars.",
    "The price of a {item} is {p} dollars.",
    "Today a {item} costs {p} dollars.",
)
_COPY_PHRASES = (
    "The train to the {place} takes {x} minutes, and the train back also takes {y} minutes.",
    "The {animal} walked {x} meters to the {place}, then walked {y} meters back.",
    "We paid {x} dollars for the room, and they paid the same {y} dollars.",
)
_SCALED_PHRASES = (
    "One box holds {x} pens, so two boxes hold {y} pens.",
    "One bag weighs {x} grams, so two bags weigh {y} grams.",
    "A trip takes {x} minutes, so two trips take {y} minutes.",
)
TEMPLATES = ("price", "copy", "scaled")


@dataclass(frozen=True)
class DomainBNumber:
    """One number of a domain-B text: its character span ``[start, end)`` in the text, its text, its value
    (the grammar's float32 value of the text), its role (``"given"`` or ``"target"``), whether it is an
    outlier, and the value before the outlier factor (= ``value`` when it is not an outlier)."""

    start: int
    end: int
    text: str
    value: float
    role: str
    outlier: bool = False
    base_value: float | None = None


@dataclass(frozen=True)
class DomainBRecord:
    """A domain-B text, the template it came from, and its numbers in order."""

    text: str
    template: str
    numbers: tuple[DomainBNumber, ...]


def item_means(value_range=DEFAULT_VALUE_RANGE) -> dict[str, float]:
    """The mean price of every item for ``value_range = (lo, hi)``: ``lo * (hi / lo) ** q_item``."""
    lo, hi = _check_range(value_range, "value_range")
    return {item: lo * (hi / lo) ** q for item, q in ITEM_QUANTILES.items()}


def _check_range(value_range, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair (lo, hi) of numbers, got {value_range!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo and hi >= 2 * lo and hi < 1e6):
        raise ValueError(f"{name} must satisfy 0 < lo, 2 lo <= hi < 1e6, got {value_range!r}")
    return lo, hi


def _fill(phrase: str, rng: random.Random, strings: dict) -> tuple[str, list[tuple[int, int, str]]]:
    """``phrase`` formatted with the number strings ``strings`` (keys ``x``, ``y``, ``p``) and random words;
    returns the text and the spans of the numbers, in order of appearance, with their keys."""
    words = {"place": rng.choice(sorted(PLACES)), "animal": rng.choice(sorted(ANIMALS)), **strings.pop("_words", {})}
    text, spans = "", []
    for literal, field, _, _ in string.Formatter().parse(phrase):  # the fields in order: exact spans
        text += literal
        if field is None:
            continue
        if field in strings:
            spans.append((len(text), len(text) + len(strings[field]), field))
            text += strings[field]
        else:
            if words[field][:1] in "aeiou":
                text = _ARTICLE_END.sub(r"\1n ", text)  # "a apple" -> "an apple"
            text += words[field]
    return text, spans


def _price_text(value: float) -> str:
    return f"{value:.1f}"


def _int_text(value: float) -> str:
    return str(round(value))


def _outlier(value: float, rng_out: random.Random, fraction: float) -> tuple[float, bool]:
    """One Bernoulli(fraction) draw and one factor draw, always both (so the stream does not depend on the
    outcome); returns the possibly replaced value and whether it was replaced."""
    hit = rng_out.random() < fraction
    factor = min(OUTLIER_FACTOR_MIN / (1.0 - rng_out.random()), OUTLIER_FACTOR_CAP)  # 1 - random() in (0, 1]
    return (value * factor, True) if hit else (value, False)


def _checked_ranges(value_range, outlier_fraction, extrapolate: bool, extrapolation_range) -> tuple:
    """The checked ``(lo, hi)`` of ``value_range``, the integer range ``(int_lo, int_hi)`` of the ``copy`` and
    ``scaled`` draws, and the templates of the corpus (no ``price`` when extrapolating)."""
    lo, hi = _check_range(value_range, "value_range")
    if (
        isinstance(outlier_fraction, bool)
        or not isinstance(outlier_fraction, (int, float))
        or not 0 <= outlier_fraction <= 1
    ):
        raise ValueError(f"outlier_fraction must be a number in [0, 1], got {outlier_fraction!r}")
    if not isinstance(extrapolate, bool):
        raise TypeError(f"extrapolate must be a bool, got {type(extrapolate).__name__}")
    if extrapolate:
        e_lo, e_hi = _check_range(extrapolation_range, "extrapolation_range")
        if e_lo <= hi:
            raise ValueError(f"extrapolation_range {extrapolation_range!r} must lie above value_range {value_range!r}")
        int_lo, int_hi = math.ceil(e_lo), math.floor(e_hi)
        templates = ("copy", "scaled")
    else:
        int_lo, int_hi = math.ceil(lo), math.floor(hi)
        templates = TEMPLATES
    if int_hi // 2 < int_lo:
        raise ValueError("the range holds no integer x with 2x inside it")
    return (lo, hi), (int_lo, int_hi), templates


def _record(template: str, phrase: str, rng: random.Random, strings: dict, roles: dict) -> DomainBRecord:
    """The record of ``phrase`` filled with the number strings ``strings`` (random words from ``rng``); ``roles``
    maps each number's key to ``(role, is_outlier, value before the outlier factor)``."""
    text, spans = _fill(phrase, rng, strings)
    numbers = []
    for start, end, key in spans:
        role, is_outlier, base = roles[key]
        written = text[start:end]
        numbers.append(
            DomainBNumber(
                start,
                end,
                written,
                parse_number(written),
                role,
                is_outlier,
                parse_number(_price_text(base) if template == "price" else _int_text(base)),
            )
        )
    return DomainBRecord(text, template, tuple(numbers))


def domain_b_records(
    n: int,
    seed: int,
    *,
    value_range=DEFAULT_VALUE_RANGE,
    outlier_fraction: float = 0.0,
    extrapolate: bool = False,
    extrapolation_range=DEFAULT_EXTRAPOLATION_RANGE,
) -> list[DomainBRecord]:
    """``n`` domain-B texts with their numbers (the templates, outliers and extrapolation of the module docstring).

    Drawn with ``random.Random("domain-B/{seed}")`` (templates, words, values) and a separate
    ``random.Random("domain-B-outliers/{seed}")`` (one Bernoulli and one factor per target number), so the
    texts are a function of the arguments alone.
    """
    check_count(n)
    check_seed(seed)
    (lo, hi), (int_lo, int_hi), templates = _checked_ranges(
        value_range, outlier_fraction, extrapolate, extrapolation_range
    )
    means = item_means((lo, hi))
    price_lo, price_hi = math.ceil(lo * 10) / 10, math.floor(hi * 10) / 10
    rng = random.Random(f"domain-B/{seed}")
    rng_out = random.Random(f"domain-B-outliers/{seed}")
    records = []
    for _ in range(n):
        template = rng.choice(templates)
        if template == "price":
            item = rng.choice(sorted(means))
            base = min(max(round(means[item] * math.exp(PRICE_NOISE * rng.gauss(0.0, 1.0)), 1), price_lo), price_hi)
            value, is_outlier = _outlier(base, rng_out, outlier_fraction)
            strings = {"p": _price_text(value), "_words": {"item": item}}
            roles = {"p": ("target", is_outlier, base)}
            phrase = rng.choice(_PRICE_PHRASES)
        elif template == "copy":
            x = rng.randint(int_lo, int_hi)
            value, is_outlier = _outlier(float(x), rng_out, outlier_fraction)
            strings = {"x": _int_text(x), "y": _int_text(value)}
            roles = {"x": ("given", False, float(x)), "y": ("target", is_outlier, float(x))}
            phrase = rng.choice(_COPY_PHRASES)
        else:  # scaled
            x = rng.randint(int_lo, int_hi // 2)
            value, is_outlier = _outlier(2.0 * x, rng_out, outlier_fraction)
            strings = {"x": _int_text(x), "y": _int_text(value)}
            roles = {"x": ("given", False, float(x)), "y": ("target", is_outlier, 2.0 * x)}
            phrase = rng.choice(_SCALED_PHRASES)
        records.append(_record(template, phrase, rng, strings, roles))
    return records


def domain_b_texts(n: int, seed: int, **options) -> list[str]:
    """The texts of `domain_b_records` (same arguments)."""
    return [record.text for record in domain_b_records(n, seed, **options)]
