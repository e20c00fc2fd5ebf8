"""float32 values and their decimal text, exactly: the float32 a literal stands for, and a value's text.

A number's value is float32. Rule V1 of the number grammar (`causalqwen.numbers`) reads a literal as a number
only when its float32 stays within float32's relative precision of it, and `format_number` refuses a value
float32 holds only further off: a value is never silently changed by more than float32's own rounding. Both
directions need exact computations that float64 cannot do:

* `nearest_float32`: the correctly rounded float32 of a decimal literal, half to even. Rounding first to
  float64 and then to float32 goes wrong when the float64 lands exactly on a midpoint between two float32
  values although the literal does not;
* `within_float32_precision`: ``|single - exact| <= 2**-24 * |exact|``, with every digit kept;
* `format_number`: the shortest text that rounds back to a float32 value; a subnormal with the fewest digits
  that stay within float32's precision (`subnormal_text`), so that every text written reads back.
"""

from __future__ import annotations

import math
import numbers
import struct
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

import numpy as np

__all__ = ["nearest_float32", "nearest_float32_many", "within_float32_precision", "subnormal_text", "format_number"]

_FLOAT32 = struct.Struct("<f")
_OVERFLOW_THRESHOLD = 2.0**128 - 2.0**103  # halfway between the largest float32 and 2**128
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 1.1754944e-38
TOGETHER = 32  # literals from which `nearest_float32_many` rounds them together
# format_number writes zero and values with _POSITIONAL_LOWER <= |v| < _POSITIONAL_UPPER
# positionally, all others in scientific notation (numpy's bounds for float64 scalars).
_POSITIONAL_LOWER = 1e-4
_POSITIONAL_UPPER = 1e16


# ---------------------------------------------------------------------------------------------
# A decimal literal's float32
# ---------------------------------------------------------------------------------------------


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
        if as_double == _OVERFLOW_THRESHOLD:
            return _round_at_float32_midpoint(magnitude, as_double)
        return math.inf
    if as_single == as_double or not (math.frexp(as_double)[0] * 2**25).is_integer():
        return as_single
    return _round_at_float32_midpoint(magnitude, as_double)


def nearest_float32_many(magnitudes: list[str]) -> list[float]:
    """`nearest_float32` of each literal: ``[nearest_float32(m) for m in magnitudes]``, from `TOGETHER` literals on
    computed together (below, numpy costs more than it saves).

    The same two roundings, vectorised: Python's ``float`` of each literal (correct to float64), numpy's cast
    of all of them to float32 (half to even, as the C cast), and the literal rounded the slow way wherever the
    float64 could sit on a float32 midpoint (at most 25 significant bits) or exactly on the overflow
    threshold. For texts dense in numbers.
    """
    if len(magnitudes) < TOGETHER:
        return [nearest_float32(magnitude) for magnitude in magnitudes]
    as_double = np.fromiter(map(float, magnitudes), dtype=np.float64, count=len(magnitudes))  # [N]
    with np.errstate(over="ignore"):
        as_single = as_double.astype(np.float32).astype(np.float64)  # [N], inf beyond float32
    scaled = np.frexp(as_double)[0] * 2**25  # [N]
    at_midpoint = (as_single != as_double) & (np.floor(scaled) == scaled)  # [N]
    slow = at_midpoint | (as_double == _OVERFLOW_THRESHOLD)  # [N]
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


# ---------------------------------------------------------------------------------------------
# A float32's text
# ---------------------------------------------------------------------------------------------


def subnormal_text(single) -> str:
    """The shortest scientific text (numpy's style: ``"1.4012985e-45"``) within float32's relative precision
    of the subnormal float32 ``single``: of each digit count, the two nearest decimals are tried, the nearer
    first."""
    value = float(single)
    exact = Decimal(abs(value))  # exact: a float is a binary fraction
    for count in range(1, 10):
        quantum = Decimal(1).scaleb(exact.adjusted() - count + 1)
        candidates = sorted(
            {exact.quantize(quantum, ROUND_FLOOR), exact.quantize(quantum, ROUND_CEILING)},
            key=lambda candidate: abs(candidate - exact),
        )
        for candidate in candidates:
            faithful = within_float32_precision(candidate, abs(value))
            if faithful and nearest_float32(str(candidate)) == abs(value):
                _, digits, exponent = candidate.normalize().as_tuple()
                mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
                return f"{'-' if value < 0 else ''}{mantissa}e{exponent + len(digits) - 1:+03d}"
    # 9 digits always are
    raise AssertionError(f"no decimal of at most 9 digits is within 2**-24 of {value!r}")


def format_number(value) -> str:
    """The shortest decimal text that rounds back to the float32 value of ``value``.

    ``value`` is first rounded to float32, giving v. When v is zero or ``1e-4 <= |v| < 1e16`` (compared
    exactly, in float64) it is written positionally, otherwise in scientific notation. The digits are numpy's
    shortest unique digits for float32 (the same decimal number as ``str(np.float32(v))``), and no trailing
    ``.0`` is kept. The bounds are numpy's for float64 scalars (numpy switches float32 scalars to scientific
    notation from 1e6 on, which this function does not)::

        99.9 -> "99.9"    5.0 -> "5"    -0.0 -> "-0"    1e30 -> "1e+30"    1e-5 -> "1e-05"

    Note that float32(1e-4) is slightly below 1e-4, so it is written ``"1e-04"``.

    Subnormal v (``0 < |v| < 1.1754944e-38``) are the exception. Their shortest unique text can be far from
    v (the smallest, 2**-149 = 1.4012985e-45, would be "1e-45", 29% off), and rule V1 reads such a literal as
    text. A subnormal is written with the fewest digits that stay within float32's relative precision 2**-24
    of v (``2**-149 -> "1.4012985e-45"``, ``2**-148 -> "2.802597e-45"``), which also round back to v.

    Every output is accepted by `causalqwen.numbers.parse_number` and gives back the same float32 value.

    Raises:
        TypeError: ``value`` is not a real number (bools are rejected too).
        ValueError: ``value`` is NaN or infinite, overflows float32, or is not zero but float32 cannot hold it
            to its relative precision: it rounds to 0 (``1e-50``) or to a subnormal further off than 2**-24
            (``3e-45`` would become 2.8025969e-45, 6.6% less). The message names the value.
    """
    real = isinstance(value, (numbers.Real, np.integer, np.floating))
    if isinstance(value, (bool, np.bool_)) or not real:
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    try:
        as_float = float(value)
    except OverflowError:  # a Python int beyond the float64 range
        raise ValueError(f"cannot format {value!r}: it overflows float32") from None
    if not math.isfinite(as_float):
        raise ValueError(f"cannot format {value!r}: the numeric grammar has no NaN or infinity")
    with np.errstate(over="ignore", under="ignore"):
        single = np.float32(value)
    if not np.isfinite(single):
        raise ValueError(f"cannot format {value!r}: it overflows float32")
    magnitude = abs(float(single))
    if magnitude <= _FLOAT32_TINY and not within_float32_precision(Decimal(as_float), float(single)):
        if magnitude == 0.0:
            raise ValueError(f"cannot format {value!r}: it is not zero but underflows float32 (it rounds to 0)")
        off = abs(float(single) - as_float) / abs(as_float)
        subnormal = "the subnormal " if magnitude < _FLOAT32_TINY else ""
        raise ValueError(
            f"cannot format {value!r}: float32 holds it only as {subnormal}{subnormal_text(single)}, off by "
            f"{off:.2g} of it, more than float32's relative precision 2**-24 (rule V1 of causalqwen.numbers)"
        )
    if 0.0 < magnitude < _FLOAT32_TINY:
        return subnormal_text(single)
    if magnitude == 0.0 or _POSITIONAL_LOWER <= magnitude < _POSITIONAL_UPPER:
        return np.format_float_positional(single, unique=True, trim="-")
    return np.format_float_scientific(single, unique=True, trim="-")
