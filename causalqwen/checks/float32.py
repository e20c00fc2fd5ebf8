"""float32's precision, exactly: the nearest float32 of a decimal literal and whether a float32 is faithful to it.

Rule V1 of the number grammar (`causalqwen.numbers`, decision D3) reads a literal as a number only when its
float32 stays within float32's relative precision of it, and `causalqwen.numbers.format_number` refuses a
value float32 holds only further off: a value is never silently changed by more than float32's own rounding.
Both need two exact computations, which float64 cannot do:

* `nearest_float32`: the correctly rounded float32 of a decimal literal, half to even. Rounding first to
  float64 and then to float32 goes wrong when the float64 lands exactly on a midpoint between two float32
  values although the literal does not;
* `within_float32_precision`: ``|single - exact| <= 2**-24 * |exact|``, with every digit kept.
"""

from __future__ import annotations

import math
import struct
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

import numpy as np

__all__ = ["nearest_float32", "nearest_float32_many", "subnormal_text", "within_float32_precision"]

_FLOAT32 = struct.Struct("<f")
_OVERFLOW_THRESHOLD = 2.0**128 - 2.0**103  # halfway between the largest float32 and 2**128


def nearest_float32(magnitude: str) -> float:
    """Round a non-negative decimal literal (digits, optional fraction and exponent) to float32.

    The result is the correctly rounded float32 value (round half to even), returned as a Python
    float; it is ``inf`` when the literal is too large for float32.

    Python's ``float`` rounds the literal correctly to float64, and the C cast to float (``struct``'s
    ``"f"`` format) rounds that float64 to float32, half to even. Rounding twice can only go wrong when
    the float64 lands exactly on the midpoint between two neighbouring float32 values although the
    literal itself is not on it. A midpoint has at most 25 significant bits, so only such a float64 is
    settled the slow way (`_round_at_float32_midpoint`).
    """
    as_double = float(magnitude)
    try:
        (as_single,) = _FLOAT32.unpack(_FLOAT32.pack(as_double))
    except OverflowError:  # rounds beyond the largest float32, unless it sits exactly on the threshold
        return _round_at_float32_midpoint(magnitude, as_double) if as_double == _OVERFLOW_THRESHOLD else math.inf
    if as_single == as_double or not (math.frexp(as_double)[0] * 2**25).is_integer():
        return as_single
    return _round_at_float32_midpoint(magnitude, as_double)


def nearest_float32_many(magnitudes: list[str]) -> list[float]:
    """`nearest_float32` of each literal, computed together: ``[nearest_float32(m) for m in magnitudes]``.

    The same two roundings, vectorised: Python's ``float`` of each literal (correct to float64), numpy's cast of
    all of them to float32 (half to even, as the C cast), and the literal rounded the slow way wherever the
    float64 could sit on a float32 midpoint (at most 25 significant bits) or exactly on the overflow
    threshold. For texts dense in numbers; `tests/test_float32.py` checks it equal to the one-by-one form.
    """
    as_double = np.fromiter(map(float, magnitudes), dtype=np.float64, count=len(magnitudes))  # [N]
    with np.errstate(over="ignore"):
        as_single = as_double.astype(np.float32).astype(np.float64)  # [N], inf beyond float32
    scaled = np.frexp(as_double)[0] * 2**25
    slow = ((as_single != as_double) & (np.floor(scaled) == scaled)) | (as_double == _OVERFLOW_THRESHOLD)
    singles = as_single.tolist()
    for index in np.flatnonzero(slow).tolist():
        singles[index] = nearest_float32(magnitudes[index])
    return singles


def _round_at_float32_midpoint(magnitude: str, as_double: float) -> float:
    """The float32 nearest to the literal when its float64 may sit exactly between two float32 values:
    the exact decimal value is compared with that midpoint."""
    with np.errstate(over="ignore"):
        as_single = np.float32(as_double)
        # The two float32 values around as_double; an infinite upper neighbour stands for 2**128,
        # where the next float32 would be if the exponent range went on.
        if float(as_single) > as_double:
            upper, lower = as_single, np.nextafter(as_single, np.float32(0))
        else:
            lower, upper = as_single, np.nextafter(as_single, np.float32(np.inf))
    upper_value = float(upper) if np.isfinite(upper) else 2.0**128
    midpoint = (float(lower) + upper_value) / 2  # exact: both are float32 values
    if as_double != midpoint:
        return float(as_single)
    exact = Decimal(magnitude)
    if exact < Decimal(midpoint):
        return float(lower)
    if exact > Decimal(midpoint):
        return float(upper)
    return float(as_single)  # a true tie: numpy already rounded half to even


def within_float32_precision(exact: Decimal, single: float) -> bool:
    """Whether ``single`` is within float32's relative precision of the decimal ``exact``:
    ``|single - exact| <= 2**-24 * |exact|``, computed without rounding (rule V1).

    The context holds every digit of both numbers and of the difference times 2**24, so no step rounds;
    a literal of a million digits costs time in proportion (``Fraction`` would be quadratic)."""
    as_decimal = Decimal(single)  # exact: a float is a binary fraction
    lowest = min(exact.as_tuple().exponent, as_decimal.as_tuple().exponent)
    highest = max(exact.adjusted(), as_decimal.adjusted()) + 9  # 2**24 has 8 digits
    with localcontext() as context:
        context.prec = max(highest - lowest + 2, 28)
        context.Emin, context.Emax = MIN_EMIN, MAX_EMAX
        return abs(as_decimal - exact) * 2**24 <= abs(exact)


def subnormal_text(single) -> str:
    """The shortest scientific text (numpy's style: ``"1.4012985e-45"``) within float32's relative precision of
    the subnormal float32 ``single``: of each digit count, the two nearest decimals are tried, the nearer first."""
    value = float(single)
    exact = Decimal(abs(value))  # exact: a float is a binary fraction
    for count in range(1, 10):
        quantum = Decimal(1).scaleb(exact.adjusted() - count + 1)
        candidates = sorted({exact.quantize(quantum, ROUND_FLOOR), exact.quantize(quantum, ROUND_CEILING)},
                            key=lambda candidate: abs(candidate - exact))
        for candidate in candidates:
            if within_float32_precision(candidate, abs(value)) and nearest_float32(str(candidate)) == abs(value):
                _, digits, exponent = candidate.normalize().as_tuple()
                mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
                return f"{'-' if value < 0 else ''}{mantissa}e{exponent + len(digits) - 1:+03d}"
    raise AssertionError(f"no decimal of at most 9 digits is within 2**-24 of {value!r}")  # 9 digits always are
