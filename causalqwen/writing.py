r"""How a number is written: the resolution a literal states, and a value written at a resolution.

A written number says more than its value: ``2.5`` says "to the nearest tenth", ``37`` "to the nearest unit",
``1.20e3`` "to the nearest ten". That *resolution* $h$ is ten to the power of the literal's last written
digit:

$$
h = 10^{\,k}, \qquad k = e - d, \qquad d = \text{digits after the decimal point},
\ e = \text{the exponent (0 without one)},
$$

so ``2.5`` → 0.1, ``37`` → 1, ``1,000`` → 1, ``.05`` → 0.01, ``1.20e3`` → 10, ``-3`` → 1. The literal stands
for every real that rounds to it, the interval $[v - h/2,\ v + h/2]$ around its value $v$;
`causalqwen.likelihood` scores a number as the probability of that interval. A literal may state any
resolution (``"0.1000…0"`` with 400 decimals: $10^{-401}$), so $k$ is an integer (`resolution_exponent`) and
$h$ a float only where float64 holds it (`literal_resolution`).

The other direction: the model carries a float32 value, and `causalqwen.float32.format_number` writes its
shortest faithful text (``2.4996202``). `write_at_resolution` rounds the *text* to a resolution $h = 10^k$
(half to even, of the float32 value's exact decimal expansion, in exact decimal arithmetic) and never the
value itself. `NumericTokenizer.decode` takes ``number_resolution``: None (the shortest text), a power of ten,
or ``"prompt"``, which writes a generated value $v$ at
([decision D17](../decisions.md#d17-how-generated-numbers-are-written))

$$
h = \min\big(h_{\text{prompt}},\ 10^{\lfloor \log_{10}|v| \rfloor - 1}\big)
\qquad (v = 0:\ h_{\text{prompt}}),
$$

the prompt's finest resolution (the unit when the prompt has no number), refined where it would leave fewer
than two significant digits of $v$ (`resolution_for`): a generated 2.4996202 is ``2.50`` after ``12.50`` and
``2.5`` after ``7 days`` or no number at all, a year 2026.3 is ``2026``, and after ``3e5 m`` a 2.5 is ``2.5``,
never ``0``.
"""

from __future__ import annotations

import math
import numbers
from decimal import MAX_EMAX, MIN_EMIN, ROUND_HALF_EVEN, Decimal, localcontext

import numpy as np

from .float32 import format_number
from .numbers import NUMBER_REGEX, find_numbers, parse_number, shown_literal

__all__ = [
    "resolution_exponent",
    "literal_resolution",
    "check_resolution",
    "prompt_exponent",
    "resolution_for",
    "write_at_resolution",
    "TEXT_PIECE",
    "WRITTEN_NUMBER",
    "GENERATED_NUMBER",
    "join_spaced",
    "number_spaces",
    "decoded_spaces",
    "join_at_split",
]

# the grammar's rule V2: a plain digit run with more significant digits is an identifier
_IDENTIFIER_DIGITS = 9
# The range of an explicit number_resolution: 10^-45 is the order of the smallest float32 magnitude, 2**-149,
# and 10^38 that of the largest, 3.4e38.
_FINEST_ALLOWED, _COARSEST_ALLOWED = -45, 38
# Every float32 value is m * 2**j with j >= -149, whose exact decimal expansion ends at or above 10^-149: a
# resolution finer than that would only add zeros.
_FINEST_DIGIT = -149
_COARSEST_DIGIT = 38  # float32's largest order of magnitude (3.4e38)
# Where float64 holds 10^k as a normal number (literal_resolution).
_FLOAT64_EXPONENTS = range(-307, 309)


def resolution_exponent(literal: str) -> int:
    """The exponent $k = e - d$ of a number literal's resolution $h = 10^k$ (``"2.5"`` → -1, ``"1.20e3"`` →
    1), exact for any literal of the grammar (``"0e-999999999"`` → -999999999).

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not exactly one number of the grammar (`causalqwen.numbers.parse_number`).
    """
    parse_number(literal)  # the door: exactly one number, or a ValueError naming it
    match = NUMBER_REGEX.fullmatch(literal)
    fraction = match.group("fraction") or match.group("fraction_only") or "."
    exponent = match.group("exponent")
    # int() of a Decimal: an exponent of any number of digits (int() of a str stops at 4300)
    return (int(Decimal(exponent[1:])) if exponent else 0) - (len(fraction) - 1)


def literal_resolution(literal: str) -> float:
    """The resolution $h = 10^{e - d}$ of a number literal of the grammar (``"2.5"`` → 0.1, ``"1.20e3"`` →
    10), as a float64.

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not exactly one number of the grammar (`causalqwen.numbers.parse_number`),
            or its resolution is outside float64's normal range, $10^{-307}$ to $10^{308}$ (``"0.1"`` and 400
            zeros states $10^{-401}$): `resolution_exponent` gives its exponent exactly.
    """
    exponent = resolution_exponent(literal)
    if exponent not in _FLOAT64_EXPONENTS:
        # str() of an int stops at 4300 digits
        shown = f"10^{exponent}" if abs(exponent) < 10**40 else "10^k with |k| > 10^40"
        raise ValueError(
            f"the resolution {shown} of the number {shown_literal(literal)} is outside "
            "float64's normal range (10^-307 to 10^308): resolution_exponent gives its exponent "
            "exactly"
        )
    return 10.0**exponent


def check_resolution(resolution) -> float | str | None:
    """A ``number_resolution``: None (the shortest text), ``"prompt"``, or a power of ten $10^k$,
    $-45 \\le k \\le 38$ (a float or an int; ``0.1``, ``1``, ``100``): the orders of float32's smallest and
    largest magnitudes. Anything else is a ``TypeError`` or ``ValueError`` naming it."""
    if resolution is None or resolution == "prompt":
        return resolution
    if isinstance(resolution, str):
        raise ValueError(f'number_resolution must be None, "prompt" or a power of ten such as 0.1, got {resolution!r}')
    if isinstance(resolution, bool) or not isinstance(resolution, numbers.Real):
        raise TypeError(f'number_resolution must be None, "prompt" or a number, got {type(resolution).__name__}')
    exponent = _power_of_ten_exponent(resolution)
    if exponent is None or not _FINEST_ALLOWED <= exponent <= _COARSEST_ALLOWED:
        raise ValueError(
            f"number_resolution must be a power of ten between 1e{_FINEST_ALLOWED} and "
            f"1e{_COARSEST_ALLOWED}, got {resolution!r}"
        )
    return 10.0**exponent


def prompt_exponent(prompt_number_texts: list[str]) -> int | None:
    """The exponent $k$ of the finest resolution $10^k$ among a prompt's numbers (their surface texts), or
    None when it has none (`resolution_exponent`)."""
    return min((resolution_exponent(text) for text in prompt_number_texts), default=None)


def resolution_for(value, prompt_exponent: int | None) -> float:
    r"""The resolution at which ``number_resolution="prompt"`` writes a generated value $v$ (its float32): the
    prompt's finest resolution (the unit when the prompt holds no number), refined where it would leave fewer
    than two significant digits of $v$,

    $$
    h = \max\Big(\min\big(10^{k_{\text{prompt}}},\ 10^{\lfloor \log_{10}|v| \rfloor - 1}\big),
    \ 10^{-149}\Big),
    $$

    with $k_{\text{prompt}} = 0$ when ``prompt_exponent`` is None and the second term left out for $v = 0$
    (then at most $10^{38}$, float32's largest order: a zero is ``0`` at any coarser power too). So after "7
    days" a generated 24.01 is ``24``, after "12.50" a 2.4996 is ``2.50``, and after "3e5 m" (resolution
    $10^5$) a 2.5 is ``2.5``, never ``0``. $\lfloor \log_{10}|v| \rfloor$ is exact (the decimal exponent of
    v's leading digit), so float32 noise below the written digits never changes the text (2.4996202 and
    2.4996204 both give 2.5). $10^{-149}$ is where the exact decimal expansion of every float32 ends: finer
    would only add zeros.

    Raises:
        TypeError: ``value`` is not a real number, or ``prompt_exponent`` is neither None nor an int.
        ValueError: ``value`` is NaN or infinite, or not representable as float32 (as `format_number`).
    """
    format_number(value)  # the door: a finite value float32 holds
    an_int = isinstance(prompt_exponent, int) and not isinstance(prompt_exponent, bool)
    if prompt_exponent is not None and not an_int:
        raise TypeError(f"prompt_exponent must be None or an int, got {type(prompt_exponent).__name__}")
    exact = _exact_float32(value)
    exponents = [0 if prompt_exponent is None else prompt_exponent]
    if exact != 0:
        # adjusted(): the exponent of the leading digit, floor(log10 |v|)
        exponents.append(exact.adjusted() - 1)
    # a zero after a prompt stating 10^(10^5000) is "0" at 10^38 as at any coarser power: float32 ends there
    return 10.0 ** max(min(exponents + [_COARSEST_DIGIT]), _FINEST_DIGIT)


def write_at_resolution(value, resolution: float | None) -> str:
    """``value`` written to the nearest multiple of ``resolution`` (a power of ten $10^k$ from $10^{-149}$ to
    $10^{38}$, as `check_resolution` or `resolution_for` give), half to even, with no exponent: ``(2.5007427,
    0.01)`` → ``"2.50"``, ``(1234.5, 10)`` → ``"1230"``. A zero is written without a sign. None:
    `causalqwen.float32.format_number` (the shortest text of the float32 value).

    The text always reads back as one number of the grammar, within ``resolution / 2`` of the float32 value
    (exactly, in decimal):

    - where a digit run would be longer than the grammar's 9 significant digits (an identifier, rule V2), the
      integer part is written with group commas (``"1,234,567,890"``);
    - where the rounded text is one the grammar reads as text (rule V1: a subnormal such as 1.4012985e-45 at
      $10^{-45}$ would read ``"0.000…001"``, 1e-45, which float32 holds only 29% off; the largest float32 at
      $10^{35}$ would round up past float32's range), the value is written at the next finer power of ten
      that reads back, which is closer still.

    The arithmetic is exact whatever the magnitudes (a local decimal context holds every digit).

    Raises:
        ValueError: ``value`` is NaN or infinite, or not representable as float32 (as `format_number`).
    """
    shortest = format_number(value)  # the checks on the value, and its float32 text
    if resolution is None:
        return shortest
    exponent = _power_of_ten_exponent(resolution)
    if exponent is None or not _FINEST_DIGIT <= exponent <= _COARSEST_ALLOWED:
        raise ValueError(
            f"resolution must be a power of ten between 1e{_FINEST_DIGIT} and 1e{_COARSEST_ALLOWED}, got {resolution!r}"
        )
    exact = _exact_float32(value)
    while True:  # ends: at the last digit of the exact expansion the text is the float32 value itself
        text = _rounded_text(exact, exponent)
        if _reads_as_one_number(text):
            return text
        exponent -= 1


def _exact_float32(value) -> Decimal:
    """The float32 value of ``value``, as an exact decimal (a float is a binary fraction)."""
    with np.errstate(over="ignore", under="ignore"):
        return Decimal(float(np.float32(value)))


def _rounded_text(exact: Decimal, exponent: int) -> str:
    """``exact`` rounded to a multiple of $10^{exponent}$, half to even, written without an exponent; a plain
    integer run of more than 9 significant digits grouped with commas."""
    with localcontext() as context:  # every digit of the result: no rounding but the quantization's own
        context.prec = max(exact.adjusted() - exponent + 2, 1)
        context.Emax, context.Emin = MAX_EMAX, MIN_EMIN
        rounded = exact.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_EVEN)
        if rounded == 0:
            rounded = abs(rounded)
        text = format(rounded, "f")
        integer = text.lstrip("-").split(".")[0]
        if "." not in text and len(integer.rstrip("0")) > _IDENTIFIER_DIGITS:
            text = format(rounded, ",f")
    return text


def _reads_as_one_number(text: str) -> bool:
    """Whether the grammar reads the whole of ``text`` as one number."""
    found = find_numbers(text)
    return len(found) == 1 and (found[0].start, found[0].end) == (0, len(text))


def _power_of_ten_exponent(resolution) -> int | None:
    """The k of a real ``resolution`` within 1e-9 relative of $10^k$ (a float64 is never exactly one below 1),
    or None."""
    try:
        as_float = float(resolution)
    except OverflowError:
        return None
    if not (math.isfinite(as_float) and as_float > 0):
        return None
    exponent = round(math.log10(as_float))
    return exponent if math.isclose(as_float, 10.0**exponent, rel_tol=1e-9) else None


# ---------------------------------------------------------------------------------------------
# The spaces around numbers in a decoded text (`NumericTokenizer.decode`)
# ---------------------------------------------------------------------------------------------

# The kinds of decoded pieces: a run of ordinary tokens, a number as it was written, a number the model
# generated.
TEXT_PIECE, WRITTEN_NUMBER, GENERATED_NUMBER = "text", "written", "generated"


def join_spaced(pieces: list[tuple[str, str]], spaced: set[int]) -> tuple[str, list[tuple[int, int]]]:
    """The pieces concatenated with a space before each piece whose index is in ``spaced`` (index
    ``len(pieces)``: one at the end); and the character span of every piece."""
    parts, spans, length = [], [], 0
    for index, (text, _) in enumerate(pieces):
        if index in spaced:
            parts.append(" ")
            length += 1
        spans.append((length, length + len(text)))
        parts.append(text)
        length += len(text)
    if len(pieces) in spaced:
        parts.append(" ")
    return "".join(parts), spans


def number_spaces(pieces: list[tuple[str, str]], split: int, spaced: set[int]) -> set[int]:
    r"""The places of the spaces (slot i: before piece i) that make every number piece read back as itself.

    Concatenated, a number can run into its neighbours: "5" and the digits "77" read as 577, "0.88" and
    "-0.24" as 0.88 and a dash, "found" and "5" as the identifier "found5". A number that reads wrong gets a
    space on one side, and if that is not enough, on the other: between spaces, every output of
    `format_number` and every number as written reads as itself. A generated number takes the space before it
    first, a written one the space after it (what precedes it came from its own text). The pieces before
    ``split`` (the prompt) keep the slots they have in ``spaced``: one of their numbers that reads wrong opens
    slot ``split``, between the prompt and the rest -- and followed by a space, a prompt that reads right
    alone reads right (no match of the grammar spans a space, and a space and the end of the text look the
    same to its look-aheads); only should that not do, its own sides.
    """
    spaced = set(spaced)
    numbers_at = [index for index, (_, kind) in enumerate(pieces) if kind != TEXT_PIECE]
    for _ in range(5):
        joined, spans = join_spaced(pieces, spaced)
        read = {(number.start, number.end) for number in find_numbers(joined)}
        wrong = [index for index in numbers_at if spans[index] not in read]
        if not wrong:
            return spaced
        before = set(spaced)  # neighbours that both read wrong share the slot between them
        for index in wrong:
            if index < split:  # then its own sides, should the space at the split not do
                choices = (split, index + 1, index)
            elif pieces[index][1] == WRITTEN_NUMBER:
                choices = (index + 1, index)
            else:
                choices = (index, index + 1)
            spaced.add(next((slot for slot in choices if slot not in before), choices[0]))
    raise RuntimeError(f"a number does not read back even between spaces: {joined!r}")


def decoded_spaces(pieces: list[tuple[str, str]]) -> set[int]:
    """`decode`'s spaces: the numbers as written came first, from a text that reads them as they are, so the
    pieces up to the last of them are the prompt (`number_spaces`), and what the model generated follows
    them."""
    written = [index for index, (_, kind) in enumerate(pieces) if kind == WRITTEN_NUMBER]
    return number_spaces(pieces, written[-1] + 1 if written else 0, set())


def join_at_split(pieces: list[tuple[str, str]], split: int) -> tuple[str, str]:
    """``(head, tail)``: the first ``split`` pieces as `decode` joins them alone, then the rest, spaced so
    that every number reads back as itself (`number_spaces`) and no space enters the head because of the
    tail."""
    head_spaces = decoded_spaces(pieces[:split]) - {split}  # a space at the very end changes no reading
    spaced = number_spaces(pieces, split, head_spaces)
    head = join_spaced(pieces[:split], {slot for slot in spaced if slot < split})[0]
    tail = join_spaced(pieces[split:], {slot - split for slot in spaced if slot >= split})[0]
    return head, tail
