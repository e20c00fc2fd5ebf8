r"""How a number is written: the resolution a literal states, and a value written at a resolution (issue 31).

A written number says more than its value: ``2.5`` says "to the nearest tenth", ``37`` "to the nearest unit",
``1.20e3`` "to the nearest ten". That *resolution* $h$ is ten to the power of the literal's last written
digit:

$$
h = 10^{\,e - d}, \qquad d = \text{digits after the decimal point},\ e = \text{the exponent (0 without one)},
$$

so ``2.5`` → 0.1, ``37`` → 1, ``1,000`` → 1, ``.05`` → 0.01, ``1.20e3`` → 10, ``-3`` → 1. The literal stands for
every real that rounds to it, the interval $[v - h/2,\ v + h/2]$ around its value $v$; `causalqwen.likelihood`
scores a number as the probability of that interval.

The other direction: the model carries a float32 value, and `causalqwen.numbers.format_number` writes its
shortest faithful text (``2.5007427``). A text that writes prices to the cent reads better with
``2.50``; `write_at_resolution` rounds the *text* to a resolution $h = 10^k$ (half to even, of the value's exact
decimal expansion) and never the value itself. `NumericTokenizer.decode` takes ``number_resolution``: a power of
ten, or ``"prompt"``, the finest resolution among the prompt's numbers (`prompt_resolution`).
"""

from __future__ import annotations

import math
import numbers
from decimal import ROUND_HALF_EVEN, Decimal

from .numbers import NUMBER_REGEX, find_numbers, format_number, parse_number

__all__ = ["literal_resolution", "check_resolution", "prompt_resolution", "write_at_resolution", "TEXT_PIECE",
           "WRITTEN_NUMBER", "GENERATED_NUMBER", "join_spaced", "number_spaces", "decoded_spaces", "join_at_split"]

_IDENTIFIER_DIGITS = 9  # the grammar's rule V2: a plain digit run with more significant digits is an identifier


def literal_resolution(literal: str) -> float:
    """The resolution $h = 10^{e - d}$ of a number literal of the grammar (``"2.5"`` → 0.1, ``"1.20e3"`` → 10).

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not exactly one number of the grammar (`causalqwen.numbers.parse_number`).
    """
    parse_number(literal)  # the door: exactly one number, or a ValueError naming it
    match = NUMBER_REGEX.fullmatch(literal)
    fraction = match.group("fraction") or match.group("fraction_only") or "."
    exponent = match.group("exponent")
    return 10.0 ** ((int(exponent[1:]) if exponent else 0) - (len(fraction) - 1))


def check_resolution(resolution) -> float | str | None:
    """A ``number_resolution``: None (the shortest text), ``"prompt"``, or a power of ten $10^k$, $-30 \\le k \\le 30$
    (a float or an int; ``0.1``, ``1``, ``100``). Anything else is a ``TypeError`` or ``ValueError`` naming it."""
    if resolution is None or resolution == "prompt":
        return resolution
    if isinstance(resolution, str):
        raise ValueError(f'number_resolution must be None, "prompt" or a power of ten such as 0.1, got {resolution!r}')
    if isinstance(resolution, bool) or not isinstance(resolution, numbers.Real):
        raise TypeError(f"number_resolution must be None, \"prompt\" or a number, got {type(resolution).__name__}")
    exponent = round(math.log10(resolution)) if math.isfinite(resolution) and resolution > 0 else None
    if exponent is None or not -30 <= exponent <= 30 or not math.isclose(resolution, 10.0**exponent, rel_tol=1e-9):
        raise ValueError(f"number_resolution must be a power of ten between 1e-30 and 1e30, got {resolution!r}")
    return 10.0**exponent


def prompt_resolution(prompt_number_texts: list[str]) -> float | None:
    """The finest resolution among a prompt's numbers (their surface texts), or None when it has none."""
    return min((literal_resolution(text) for text in prompt_number_texts), default=None)


def write_at_resolution(value, resolution: float | None) -> str:
    """``value`` written to the nearest multiple of ``resolution`` (a checked power of ten, `check_resolution`), half
    to even, with no exponent: ``(2.5007427, 0.01)`` → ``"2.50"``, ``(1234.5, 10)`` → ``"1230"``. The text always reads
    back as one number of the grammar, within ``resolution / 2`` of ``value``: where a digit run would be longer
    than the grammar's 9 significant digits (an identifier, rule V2), the integer part is written with group commas
    (``"1,234,567,890"``). A zero is written without a sign. None: `causalqwen.numbers.format_number` (the shortest
    text of the float32 value).

    Raises:
        ValueError: ``value`` is NaN or infinite, or not representable as float32 (as `format_number`).
    """
    shortest = format_number(value)  # the checks on the value, and its float32 text
    if resolution is None:
        return shortest
    exponent = round(math.log10(resolution))
    exact = Decimal(float(parse_number(shortest)))  # the float32 value, exactly
    rounded = exact.quantize(Decimal(1).scaleb(min(exponent, 0)), rounding=ROUND_HALF_EVEN)
    if exponent > 0:
        rounded = (rounded.scaleb(-exponent).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)).scaleb(exponent)
        rounded = rounded.quantize(Decimal(1))
    if rounded == 0:
        rounded = abs(rounded)
    text = format(rounded, "f")
    integer = text.lstrip("-").split(".")[0]
    if "." not in text and len(integer.rstrip("0")) > _IDENTIFIER_DIGITS:
        text = format(rounded, ",f")
    return text


# ---------------------------------------------------------------------------------------------
# The spaces around numbers in a decoded text (`NumericTokenizer.decode`)
# ---------------------------------------------------------------------------------------------

# The kinds of decoded pieces: a run of ordinary tokens, a number as it was written, a number the model generated.
TEXT_PIECE, WRITTEN_NUMBER, GENERATED_NUMBER = "text", "written", "generated"


def join_spaced(pieces: list[tuple[str, str]], spaced: set[int]) -> tuple[str, list[tuple[int, int]]]:
    """The pieces concatenated with a space before each piece whose index is in ``spaced`` (index ``len(pieces)``:
    one at the end); and the character span of every piece."""
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

    Concatenated, a number can run into its neighbours: "5" and the digits "77" read as 577, "0.88" and "-0.24"
    as 0.88 and a dash, "found" and "5" as the identifier "found5". A number that reads wrong gets a space on one
    side, and if that is not enough, on the other: between spaces, every output of `format_number` and every
    number as written reads as itself. A generated number takes the space before it first, a written one the
    space after it (what precedes it came from its own text). The pieces before ``split`` (the prompt) keep the
    slots they have in ``spaced``: one of their numbers that reads wrong opens slot ``split``, between the prompt
    and the rest -- and followed by a space, a prompt that reads right alone reads right (no match of the grammar
    spans a space, and a space and the end of the text look the same to its look-aheads); only should that not
    do, its own sides.
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
    pieces up to the last of them are the prompt (`number_spaces`), and what the model generated follows them."""
    written = [index for index, (_, kind) in enumerate(pieces) if kind == WRITTEN_NUMBER]
    return number_spaces(pieces, written[-1] + 1 if written else 0, set())


def join_at_split(pieces: list[tuple[str, str]], split: int) -> tuple[str, str]:
    """``(head, tail)``: the first ``split`` pieces as `decode` joins them alone, then the rest, spaced so that
    every number reads back as itself (`number_spaces`) and no space enters the head because of the tail."""
    head_spaces = decoded_spaces(pieces[:split]) - {split}  # a space at the very end changes no reading
    spaced = number_spaces(pieces, split, head_spaces)
    head = join_spaced(pieces[:split], {slot for slot in spaced if slot < split})[0]
    tail = join_spaced(pieces[split:], {slot - split for slot in spaced if slot >= split})[0]
    return head, tail


