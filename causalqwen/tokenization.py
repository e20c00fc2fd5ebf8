"""Numeric-aware tokenization: every number in a text becomes one ``<NUM>`` token plus a value.

CausalQwen reads numbers as values rather than as strings of digit tokens. Encoding a text
produces two aligned sequences of the same length:

* ``input_ids``: ordinary token ids for the text between numbers, and the id of the special
  token ``<NUM>`` at the place of each number;
* ``numeric_values``: the float32 value of the number at each ``<NUM>`` position, 0.0 elsewhere.

For example ``"价格是99.9元"`` encodes to the tokens of ``"价格是"``, one ``<NUM>``, and the
tokens of ``"元"``; the values are ``[0.0, ..., 0.0, 99.9, 0.0, ...]`` with 99.9 (rounded to
float32) exactly at the ``<NUM>`` position.

Decoding writes each ``<NUM>`` back as the shortest decimal text that rounds to the same float32
value (`format_number`), so ``decode(encode(t)) == t`` whenever every number in ``t`` is
already written in that canonical form.

The number grammar is defined once, in `NUMBER_REGEX`, and documented next to it.
"""

from __future__ import annotations

import math
import numbers
import os
from decimal import Decimal
from typing import NamedTuple

import numpy as np
import regex
import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = [
    "NUMBER_REGEX",
    "NumberMatch",
    "find_numbers",
    "split_numbers",
    "parse_number",
    "format_number",
    "NumericTokenizer",
]

# ---------------------------------------------------------------------------------------------
# The number grammar
# ---------------------------------------------------------------------------------------------
#
# A number is, in this order:
#
#   sign      optional. An ASCII hyphen-minus "-" counts as a sign only when the character right
#             before it is NOT an ASCII digit and NOT a cased letter (Unicode categories Lu, Ll,
#             Lt: Latin, Greek, Cyrillic, ...). After anything else (start of text, a space,
#             punctuation, a CJK character, ...) it is a sign. "+" is never a sign: it stays text,
#             so that decoding gives back the original characters. Other dashes (such as U+2212
#             "−") are always text.
#   integer   required. ASCII digits only. Either
#               - 1 to 3 digits followed by one or more groups of "," and exactly 3 digits, where
#                 the last group is not followed by another digit ("1,000,000", "12,345"), or
#               - a plain run of digits ("0", "2020", "007").
#             Any other comma is text.
#   fraction  optional. "." followed by at least one digit. A dot with no digit after it is text.
#   exponent  optional. "e" or "E", an optional "+" or "-", then at least one digit. Without
#             digits the letter is text.
#
# Examples (| separates the pieces, numbers are shown as their values):
#
#   "温度-15.5度"     ->  温度 | -15.5 | 度          (a "-" after a CJK character is a sign)
#   "-3"              ->  -3                          (a "-" at the start is a sign)
#   "(-5)"            ->  ( | -5 | )                 (a "-" after punctuation is a sign)
#   "2020-2021"       ->  2020 | - | 2021            (a "-" after a digit is text)
#   "x-5"             ->  x | - | 5                  (a "-" after a cased letter is text)
#   "+5"              ->  + | 5                      ("+" is never a sign)
#   "1.5e3", "2E-2"   ->  1500.0, 0.02
#   "1e+30"           ->  1e30
#   "3eggs"           ->  3 | eggs                   (no digit after "e": no exponent)
#   "5."              ->  5 | .                      (no digit after ".": no fraction)
#   ".5"              ->  . | 5                      (a number starts with a digit or a sign)
#   "1,000,000"       ->  1000000.0
#   "1,234.5"         ->  1234.5
#   "1,00"            ->  1 | , | 00 (value 0.0)    (a group must be exactly 3 digits)
#   "1,0000"          ->  1 | , | 0000 (value 0.0)  (a group must not run on into more digits)
#   "1,000,0000"      ->  1,000 (value 1000.0) | , | 0000
#   "12,34"           ->  12 | , | 34
#
# Digits other than ASCII 0-9 (full-width "１", Arabic-Indic "٣", superscripts, ...) are text.
#
# The value of a number is its exact decimal value rounded to the nearest float32 (half to even).
# A number too large for float32 ("1e39"), a non-zero number that rounds to 0.0 ("1e-50"), or one that
# rounds to a subnormal float32 that changes it beyond float32's usual precision ("8e-46", which would
# become 1.4e-45) is an error, never clamped or rounded away. The shortest text of a subnormal float32
# ("1e-45", as decode writes it) is accepted. Decoding writes the canonical form, so "1,000", "007" or "1.50" come back
# as "1000", "7" and "1.5".
NUMBER_REGEX = regex.compile(
    r"""
    (?P<sign> (?<! [0-9\p{Lu}\p{Ll}\p{Lt}] ) - )?
    (?P<integer> [0-9]{1,3} (?: ,[0-9]{3} )+ (?! [0-9] ) | [0-9]+ )
    (?P<fraction> \. [0-9]+ )?
    (?P<exponent> [eE] [+-]? [0-9]+ )?
    """,
    regex.VERBOSE,
)

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 1.1754944e-38
# The longest text `encode` takes whole. The Rust tokenizer needs about 100 bytes of memory per character
# and aborts the process when it cannot get them, so longer texts are refused before they reach it
# (or, with a token limit, only a prefix is encoded).
MAX_TEXT_CHARS = 10_000_000
# format_number writes zero and values with _POSITIONAL_LOWER <= |v| < _POSITIONAL_UPPER
# positionally, all others in scientific notation (numpy's bounds for float64 scalars).
_POSITIONAL_LOWER = 1e-4
_POSITIONAL_UPPER = 1e16


class NumberMatch(NamedTuple):
    """One number found in a text: its character span ``[start, end)``, its text and value."""

    start: int
    end: int
    text: str
    value: float


class _NumberError(ValueError):
    """A literal that matches the grammar but has no finite, faithful float32 value."""


def _round_decimal_to_float32(magnitude: str) -> float:
    """Round a non-negative decimal literal (digits, optional fraction and exponent) to float32.

    The result is the correctly rounded float32 value (round half to even), returned as a Python
    float; it is ``inf`` when the literal is too large for float32.

    Python's ``float`` rounds the literal correctly to float64, and numpy rounds that float64 to
    float32. Rounding twice can only go wrong when the float64 lands exactly on the midpoint
    between two neighbouring float32 values although the literal itself is not on it; that case
    is settled by comparing the exact decimal value with the midpoint.
    """
    as_double = float(magnitude)
    with np.errstate(over="ignore"):
        as_single = np.float32(as_double)
        if float(as_single) == as_double:
            return float(as_single)
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


def _value_of_match(match: regex.Match) -> float:
    """Return the float32 value (as a Python float) of a match of `NUMBER_REGEX`.

    Raises:
        _NumberError: the value overflows float32, or a non-zero literal rounds to zero.
    """
    integer = match.group("integer").replace(",", "")
    fraction = match.group("fraction") or ""
    exponent = match.group("exponent") or ""
    magnitude = _round_decimal_to_float32(integer + fraction + exponent)
    if math.isinf(magnitude):
        raise _NumberError(f"overflows float32 (the largest finite float32 is {_FLOAT32_MAX:.8g})")
    if magnitude == 0.0 and any(digit in "123456789" for digit in integer + fraction):
        raise _NumberError("is not zero but rounds to 0.0 in float32 (underflow)")
    if 0.0 < magnitude < _FLOAT32_TINY:
        # A subnormal float32 keeps fewer than 24 bits. The literal is taken only if float32 holds it as
        # closely as a normal number would, or if it is the shortest text of its float32 (what decode writes).
        exact = Decimal(integer + fraction + exponent)
        faithful = abs(Decimal(magnitude) - exact) <= exact * Decimal(2) ** -24
        if not (faithful or Decimal(format_number(magnitude)) == exact):
            raise _NumberError(
                f"underflows float32's normal range (|v| < {_FLOAT32_TINY:.8g}): the nearest float32 is the "
                f"subnormal {format_number(magnitude)}, which would silently change it"
            )
    return -magnitude if match.group("sign") else magnitude


def find_numbers(text: str) -> list[NumberMatch]:
    """Return every number in ``text``, left to right, following the grammar of `NUMBER_REGEX`.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: a number overflows float32 or underflows to zero; the message names the
            number and its character offsets.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    found = []
    for match in NUMBER_REGEX.finditer(text):
        try:
            value = _value_of_match(match)
        except _NumberError as error:
            raise ValueError(
                f"number {match.group()!r} at characters {match.start()}:{match.end()} of the text {error}"
            ) from None
        found.append(NumberMatch(match.start(), match.end(), match.group(), value))
    return found


def split_numbers(text: str) -> list[tuple[str, str | float]]:
    """Split ``text`` into pieces ``("text", str)`` and ``("number", value)``, in order.

    Text pieces are never empty, and joining the text pieces with the original number literals
    gives back ``text``. Raises like `find_numbers`.
    """
    pieces: list[tuple[str, str | float]] = []
    position = 0
    for number in find_numbers(text):
        if number.start > position:
            pieces.append(("text", text[position : number.start]))
        pieces.append(("number", number.value))
        position = number.end
    if position < len(text):
        pieces.append(("text", text[position:]))
    return pieces


def parse_number(literal: str) -> float:
    """Return the float32 value (as a Python float) of a single number literal.

    The whole of ``literal`` must be one number of the grammar of `NUMBER_REGEX`, for
    example ``"-15.5"``, ``"1,000,000"``, ``"2E-2"`` or ``"1e+30"``.

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not exactly one number, or its value overflows float32, or a
            non-zero literal underflows to zero.
    """
    if not isinstance(literal, str):
        raise TypeError(f"literal must be a str, got {type(literal).__name__}")
    match = NUMBER_REGEX.fullmatch(literal)
    if match is None:
        raise ValueError(f"{literal!r} is not a single number of the numeric grammar")
    try:
        return _value_of_match(match)
    except _NumberError as error:
        raise ValueError(f"number {literal!r} {error}") from None


def format_number(value) -> str:
    """Return the shortest decimal text that rounds back to the float32 value of ``value``.

    ``value`` is first rounded to float32, giving v. When v is zero or ``1e-4 <= |v| < 1e16``
    (compared exactly, in float64) it is written positionally, otherwise in scientific notation.
    The digits are numpy's shortest unique digits for float32 (so they are the same decimal
    number as ``str(np.float32(v))``), and no trailing ``.0`` is kept. The bounds are the ones
    numpy uses for float64 scalars; numpy itself switches float32 scalars to scientific notation
    from 1e6 on, which this function does not::

        99.9 -> "99.9"    5.0 -> "5"    -0.0 -> "-0"    1e30 -> "1e+30"    1e-5 -> "1e-05"

    Note that float32(1e-4) is slightly below 1e-4, so it is written ``"1e-04"``.

    Every output is accepted by the number grammar and parses back to the same float32 value.

    Raises:
        TypeError: ``value`` is not a real number (bools are rejected too).
        ValueError: ``value`` is NaN or infinite, or overflows float32.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    try:
        as_float = float(value)
    except OverflowError:  # a Python int beyond the float64 range
        raise ValueError(f"cannot format {value!r}: it overflows float32") from None
    if not math.isfinite(as_float):
        raise ValueError(f"cannot format {value!r}: the numeric grammar has no NaN or infinity")
    with np.errstate(over="ignore"):
        single = np.float32(value)
    if not np.isfinite(single):
        raise ValueError(f"cannot format {value!r}: it overflows float32")
    magnitude = abs(float(single))
    if magnitude == 0.0 or _POSITIONAL_LOWER <= magnitude < _POSITIONAL_UPPER:
        return np.format_float_positional(single, unique=True, trim="-")
    return np.format_float_scientific(single, unique=True, trim="-")


# ---------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------

def _check_text(text) -> None:
    """A ``TypeError`` unless ``text`` is a str; a ``ValueError`` naming the character if it holds a lone
    surrogate (a str that is not Unicode text: it has no UTF-8 encoding, and the tokenizer would fail)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"character {error.start} of the text is {text[error.start]!r}, a lone surrogate: not valid Unicode "
            "(decode bytes with errors='strict', or replace it)"
        ) from None


def _safe_cut(text: str, budget: int) -> int:
    """An end index <= ``budget`` at which a prefix tokenizes as the start of the whole text: just before a
    space that follows a non-space. ``len(text)`` if the text is within the budget; ``budget`` if no such
    space exists in its second half (then only the last few tokens of the prefix can differ)."""
    if len(text) <= budget:
        return len(text)
    for cut in range(budget, budget // 2, -1):
        if text[cut] == " " and not text[cut - 1].isspace():
            return cut
    return budget


class NumericTokenizer:
    """Wrap a Hugging Face tokenizer so that every number becomes one ``<NUM>`` token and a value.

    Args:
        hf_tokenizer: a Hugging Face tokenizer (``PreTrainedTokenizerBase``), for example the
            Qwen2 tokenizer. Its encoding of a text must be the concatenation of the encodings of
            the pieces between numbers, which holds for byte-level BPE tokenizers without an added
            prefix space, such as Qwen2's.
        num_token: the text of the number token.

    ``num_token`` is added to ``hf_tokenizer`` **in place** as a special token, so its id is
    K = ``len(hf_tokenizer)`` before the call and the wrapped tokenizer has K + 1 tokens
    afterwards. A tokenizer that already holds ``num_token`` as a special added token (for
    example one written by `save_pretrained`) is used as it is.

    Text between numbers is encoded with the special-token matching of the wrapped tokenizer
    switched off (``split_special_tokens=True``): a literal ``"<NUM>"``, ``"<|endoftext|>"`` or
    ``"<|im_start|>"`` typed in the text is encoded as ordinary characters and never becomes a
    special token. Special tokens are meant to be inserted as ids, not as text.
    """

    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase, num_token: str = "<NUM>"):
        if not isinstance(hf_tokenizer, PreTrainedTokenizerBase):
            raise TypeError(
                f"hf_tokenizer must be a transformers PreTrainedTokenizerBase, got {type(hf_tokenizer).__name__}"
            )
        if not isinstance(num_token, str):
            raise TypeError(f"num_token must be a str, got {type(num_token).__name__}")
        if num_token == "" or num_token.strip() != num_token:
            raise ValueError(f"num_token must be non-empty without surrounding whitespace, got {num_token!r}")
        if NUMBER_REGEX.search(num_token):
            raise ValueError(f"num_token {num_token!r} must not contain a number")

        vocab = hf_tokenizer.get_vocab()
        if num_token in vocab:
            num_token_id = vocab[num_token]
            added = hf_tokenizer.added_tokens_decoder.get(num_token_id)
            if added is None or not added.special:
                raise ValueError(
                    f"the tokenizer already has {num_token!r} (id {num_token_id}) but not as a special added "
                    "token, so it could be produced from ordinary text; choose another num_token"
                )
        else:
            size_before = len(hf_tokenizer)
            hf_tokenizer.add_tokens(
                [AddedToken(num_token, special=True, normalized=False, lstrip=False, rstrip=False)],
                special_tokens=True,
            )
            num_token_id = hf_tokenizer.convert_tokens_to_ids(num_token)
            if num_token_id != size_before or len(hf_tokenizer) != size_before + 1:
                raise RuntimeError(
                    f"adding {num_token!r} gave it id {num_token_id} and the tokenizer {len(hf_tokenizer)} "
                    f"tokens; expected id {size_before} and {size_before + 1} tokens"
                )

        self._hf_tokenizer = hf_tokenizer
        self._num_token = num_token
        self._num_token_id = num_token_id

    # -- loading and saving ------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, num_token: str = "<NUM>", **kwargs) -> "NumericTokenizer":
        """Load the wrapped tokenizer with ``AutoTokenizer.from_pretrained(path, **kwargs)`` and wrap it.

        A local path that does not exist, or tokenizer files that are missing or corrupt, raise an
        ``OSError`` that names the path (and the loader's reason, on one line).
        """
        where = os.fspath(path) if isinstance(path, os.PathLike) else path
        if isinstance(where, str) and (os.path.isabs(where) or where.startswith((".", "~"))):  # a local path, not a hub id
            if not os.path.exists(os.path.expanduser(where)):
                raise OSError(f"tokenizer directory {where!r} does not exist")
        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        except Exception as error:  # noqa: BLE001 -- the loaders raise many types, the Rust one a bare Exception
            raise OSError(f"cannot load a tokenizer from {where!r}: {' '.join(str(error).split())}") from error
        return cls(hf_tokenizer, num_token=num_token)

    def save_pretrained(self, path: str | os.PathLike):
        """Save the wrapped tokenizer, ``<NUM>`` included, with its ``save_pretrained``.

        A custom ``num_token`` is not recorded: pass it again to `from_pretrained`.
        """
        return self._hf_tokenizer.save_pretrained(path)

    # -- properties --------------------------------------------------------------------------

    @property
    def hf_tokenizer(self) -> PreTrainedTokenizerBase:
        """The wrapped Hugging Face tokenizer (it contains ``<NUM>``)."""
        return self._hf_tokenizer

    @property
    def num_token(self) -> str:
        """The text of the number token, ``"<NUM>"`` by default."""
        return self._num_token

    @property
    def num_token_id(self) -> int:
        """The id of the number token."""
        return self._num_token_id

    @property
    def pad_token_id(self) -> int:
        """The id used at padded positions; a ValueError if the wrapped tokenizer has no pad token."""
        pad_token_id = self._hf_tokenizer.pad_token_id
        if pad_token_id is None:
            raise ValueError(
                "the wrapped tokenizer has no pad token; set hf_tokenizer.pad_token before padding a batch"
            )
        return pad_token_id

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id of the wrapped tokenizer (None if it has none)."""
        return self._hf_tokenizer.eos_token_id

    def __len__(self) -> int:
        """The number of tokens, ``<NUM>`` included (K + 1 for a tokenizer of K tokens)."""
        return len(self._hf_tokenizer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({type(self._hf_tokenizer).__name__}, num_token={self._num_token!r}, "
            f"num_token_id={self._num_token_id}, size={len(self)})"
        )

    # -- encoding ----------------------------------------------------------------------------

    def _encode_text_runs(self, runs: list[str]) -> list[list[int]]:
        """Token ids of each text run, with no special tokens added and none recognised in the text."""
        if not runs:
            return []
        backend = getattr(self._hf_tokenizer, "backend_tokenizer", None)
        previous_flag = getattr(backend, "encode_special_tokens", None)
        try:
            encoded = self._hf_tokenizer(runs, add_special_tokens=False, split_special_tokens=True)
        finally:
            # The fast tokenizer leaves the flag set on its Rust backend; put it back as it was.
            if previous_flag is not None and backend.encode_special_tokens != previous_flag:
                backend.encode_special_tokens = previous_flag
        return [list(ids) for ids in encoded["input_ids"]]

    def encode(self, text: str, max_length: int | None = None) -> tuple[list[int], list[float]]:
        """Encode one text into ``(input_ids, numeric_values)`` of equal length.

        Each number (see `NUMBER_REGEX`) becomes one ``<NUM>`` id, with its float32 value at
        the same position of ``numeric_values``; every other position holds 0.0. The text between
        numbers is encoded by the wrapped tokenizer, run by run, without special tokens. No
        spaces are added around numbers.

        With ``max_length``, at most that many tokens are returned, and only a prefix of the text is
        encoded: the text is cut at a space that follows a non-space character (where neither the
        number grammar nor a byte-level BPE pre-tokenizer joins across), growing the prefix until it
        gives more than ``max_length`` tokens. So a 50 MB text costs what its first tokens cost.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: a number overflows float32 or underflows its normal range (the message names
                the number and its character offsets); the text holds a lone surrogate (not valid
                Unicode: the message names the character); or the text is longer than
                `MAX_TEXT_CHARS` and no ``max_length`` bounds it.
        """
        _check_text(text)
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
                raise ValueError(f"max_length must be a positive int, got {max_length!r}")
            return self._encode_prefix(text, int(max_length))
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(
                f"the text has {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} encoded whole (the Rust "
                "tokenizer needs about 100 bytes per character); pass max_length (with truncation) or split the text"
            )
        return self._encode_whole(text)

    def _encode_prefix(self, text: str, max_length: int) -> tuple[list[int], list[float]]:
        budget = 16 * max_length + 64  # characters; most tokens are far shorter
        while True:
            cut = _safe_cut(text, budget)
            ids, values = self._encode_whole(text[:cut])
            if cut == len(text) or len(ids) > max_length:
                return ids[:max_length], values[:max_length]
            budget *= 4

    def _encode_whole(self, text: str) -> tuple[list[int], list[float]]:
        pieces = split_numbers(text)
        runs = [content for kind, content in pieces if kind == "text"]
        run_ids = iter(self._encode_text_runs(runs))

        input_ids: list[int] = []
        numeric_values: list[float] = []
        for kind, content in pieces:
            if kind == "number":
                input_ids.append(self._num_token_id)
                numeric_values.append(content)
            else:
                ids = next(run_ids)
                input_ids.extend(ids)
                numeric_values.extend([0.0] * len(ids))
        return input_ids, numeric_values

    def __call__(
        self,
        texts: str | list[str],
        padding: bool | str = True,
        max_length: int | None = None,
        padding_side: str = "right",
        truncation: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Encode a batch of texts into padded tensors.

        Args:
            texts: one str (a batch of one) or a non-empty list of str.
            padding: ``True`` or ``"longest"`` pads to the longest row; ``"max_length"`` pads to
                ``max_length``; ``False`` pads nothing, so all rows must have the same length.
            max_length: the longest allowed row (a positive int), or None for no limit.
            padding_side: ``"right"`` or ``"left"``.
            truncation: if True, rows longer than ``max_length`` keep their first ``max_length``
                tokens; if False, such a row is an error.

        Returns:
            A dict with ``input_ids`` (int64, [B, S]), ``numeric_values`` (float32, [B, S]) and
            ``attention_mask`` (int64, [B, S], 1 on real tokens and 0 on padding). Padded
            positions hold the pad id and the value 0.0.
        """
        texts = _check_call_arguments(texts, padding, max_length, padding_side, truncation)
        rows = self._encode_rows(texts, max_length, truncation)
        return self._pad(rows, padding, max_length, padding_side)

    def _encode_rows(self, texts: list[str], max_length: int | None, truncation: bool) -> list[tuple[list, list]]:
        """``(ids, values)`` per text, cut to ``max_length`` where ``truncation`` allows it."""
        rows = []
        for index, text in enumerate(texts):
            try:
                rows.append(self.encode(text, max_length + 1 if max_length is not None else None))
            except ValueError as error:
                raise ValueError(f"text {index}: {error}") from None
        if max_length is None:
            return rows
        for index, (ids, _) in enumerate(rows):
            if len(ids) > max_length and not truncation:
                raise ValueError(
                    f"text {index} has more than max_length={max_length} tokens; pass truncation=True to cut it"
                )
        return [(ids[:max_length], values[:max_length]) for ids, values in rows]

    def _pad(self, rows: list[tuple[list, list]], padding, max_length, padding_side: str) -> dict[str, torch.Tensor]:
        """The rows as ``[B, S]`` tensors; padded positions hold the pad id, the value 0.0 and mask 0."""
        lengths = [len(ids) for ids, _ in rows]
        if padding is False:
            if len(set(lengths)) > 1:
                raise ValueError(f"padding=False needs texts of equal token length, got lengths {lengths}")
            width = lengths[0]
        elif padding == "max_length":
            width = max_length
        else:
            width = max(lengths)

        pad_token_id = self.pad_token_id if any(length < width for length in lengths) else 0
        input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.int64)  # [B, S]
        numeric_values = torch.zeros((len(rows), width), dtype=torch.float32)  # [B, S]
        attention_mask = torch.zeros((len(rows), width), dtype=torch.int64)  # [B, S]
        for row, (ids, values) in enumerate(rows):
            start = width - len(ids) if padding_side == "left" else 0
            end = start + len(ids)
            input_ids[row, start:end] = torch.tensor(ids, dtype=torch.int64)
            numeric_values[row, start:end] = torch.tensor(values, dtype=torch.float32)
            attention_mask[row, start:end] = 1
        return {"input_ids": input_ids, "numeric_values": numeric_values, "attention_mask": attention_mask}

    # -- decoding ----------------------------------------------------------------------------

    def decode(
        self, input_ids, numeric_values, skip_special_tokens: bool = True, out_of_vocab: str = "raise"
    ) -> str:
        """Turn ``(input_ids, numeric_values)`` back into text.

        Each ``<NUM>`` position is written as `format_number` of its value. The runs of
        other ids between them are decoded by the wrapped tokenizer; ``skip_special_tokens``
        applies to those runs (pad, eos, ...). Values at positions that are not ``<NUM>`` are not
        used.

        Args:
            input_ids: a list of ints or a 1-D integer tensor/array.
            numeric_values: a list of numbers or a 1-D tensor/array of the same length.
            skip_special_tokens: drop special tokens other than ``<NUM>`` from the text.
            out_of_vocab: what to do with an id at or beyond ``len(self)`` -- one of the model's
                reserved rows, which an untrained model can predict: ``"raise"`` (default) or
                ``"mark"``, which writes it as ``<unk:ID>``.

        Raises:
            TypeError: wrong element types.
            ValueError: the lengths differ, an id is negative or (with ``out_of_vocab="raise"``)
                at least ``len(self)``, or a ``<NUM>`` value is NaN or infinite.
        """
        ids = _as_id_list(input_ids, "input_ids")
        values = _as_value_list(numeric_values, "numeric_values")
        if len(ids) != len(values):
            raise ValueError(
                f"input_ids has length {len(ids)} but numeric_values has length {len(values)}; they must match"
            )
        if out_of_vocab not in ("raise", "mark"):
            raise ValueError(f'out_of_vocab must be "raise" or "mark", got {out_of_vocab!r}')
        size = len(self)
        for position, token_id in enumerate(ids):
            if token_id < 0 or (token_id >= size and out_of_vocab == "raise"):
                raise ValueError(
                    f"input_ids[{position}] = {token_id} is not a token id of this tokenizer (0 to {size - 1})"
                )

        parts: list[str] = []
        run: list[int] = []
        for position, token_id in enumerate(ids):
            if token_id != self._num_token_id and token_id < size:
                run.append(token_id)
                continue
            if run:
                parts.append(self._decode_run(run, skip_special_tokens))
                run = []
            if token_id >= size:
                parts.append(f"<unk:{token_id}>")
                continue
            try:
                parts.append(format_number(values[position]))
            except ValueError as error:
                raise ValueError(f"numeric_values[{position}]: {error}") from None
        if run:
            parts.append(self._decode_run(run, skip_special_tokens))
        return "".join(parts)

    def _decode_run(self, ids: list[int], skip_special_tokens: bool) -> str:
        """Decode a run of ordinary ids exactly, without any clean-up of spaces."""
        return self._hf_tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def batch_decode(
        self, input_ids, numeric_values, skip_special_tokens: bool = True, out_of_vocab: str = "raise"
    ) -> list[str]:
        """Decode each row of ``input_ids`` [B, S] and ``numeric_values`` [B, S] with `decode`.

        Rows may be tensors/arrays of two dimensions or lists of lists; the number of rows must
        match, and within each row the lengths must match.
        """
        id_rows = _as_rows(input_ids, "input_ids")
        value_rows = _as_rows(numeric_values, "numeric_values")
        if len(id_rows) != len(value_rows):
            raise ValueError(
                f"input_ids has {len(id_rows)} rows but numeric_values has {len(value_rows)}; they must match"
            )
        texts = []
        for row, (ids, values) in enumerate(zip(id_rows, value_rows)):
            try:
                texts.append(self.decode(ids, values, skip_special_tokens, out_of_vocab))
            except ValueError as error:
                raise ValueError(f"row {row}: {error}") from None
        return texts


def _as_rows(data, name: str) -> list:
    """Split a 2-D tensor/array or a list of sequences into a list of rows."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 2:
            raise ValueError(f"{name} must be 2-D [batch, sequence], got shape {tuple(data.shape)}")
        return list(data)
    if isinstance(data, (list, tuple)):
        return list(data)
    raise TypeError(f"{name} must be a 2-D tensor, array or a list of rows, got {type(data).__name__}")


def _as_id_list(data, name: str) -> list[int]:
    """Convert a 1-D integer tensor/array or a sequence of ints into a list of ints."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(data.shape)}")
        is_integer = (
            not data.dtype.is_floating_point and not data.dtype.is_complex and data.dtype != torch.bool
            if isinstance(data, torch.Tensor)
            else np.issubdtype(data.dtype, np.integer)
        )
        if not is_integer:
            raise TypeError(f"{name} must hold integers, got dtype {data.dtype}")
        return [int(token_id) for token_id in data.tolist()]
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints or a 1-D tensor, got {type(data).__name__}")
    for position, token_id in enumerate(data):
        if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"{name}[{position}] must be an int, got {type(token_id).__name__}")
    return [int(token_id) for token_id in data]


def _as_value_list(data, name: str) -> list[float]:
    """Convert a 1-D tensor/array or a sequence of real numbers into a list of floats."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(data.shape)}")
        if isinstance(data, torch.Tensor) and (data.dtype.is_complex or data.dtype == torch.bool):
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        if isinstance(data, np.ndarray) and not (
            np.issubdtype(data.dtype, np.floating) or np.issubdtype(data.dtype, np.integer)
        ):
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        return [float(value) for value in data.tolist()]
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"{name} must be a list of numbers or a 1-D tensor, got {type(data).__name__}")
    values = []
    for position, value in enumerate(data):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
            raise TypeError(f"{name}[{position}] must be a real number, got {type(value).__name__}")
        try:
            values.append(float(value))
        except OverflowError:  # a Python int beyond the float64 range
            values.append(math.copysign(math.inf, value))
    return values


def _check_call_arguments(texts, padding, max_length, padding_side, truncation) -> list[str]:
    """The argument checks of `NumericTokenizer.__call__` (its public door); the texts as a list."""
    if isinstance(texts, str):
        texts = [texts]
    elif isinstance(texts, (list, tuple)):
        texts = list(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{index}] must be a str, got {type(text).__name__}")
    else:
        raise TypeError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    if not texts:
        raise ValueError("texts is an empty list; give at least one text")
    padding_is_valid = padding is True or padding is False or (
        isinstance(padding, str) and padding in ("longest", "max_length")
    )
    if not padding_is_valid:
        raise ValueError(f"padding must be one of True, False, 'longest', 'max_length'; got {padding!r}")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if not isinstance(truncation, bool):
        raise TypeError(f"truncation must be a bool, got {type(truncation).__name__}")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)):
        raise TypeError(f"max_length must be an int or None, got {type(max_length).__name__}")
    if max_length is not None and max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if padding == "max_length" and max_length is None:
        raise ValueError("padding='max_length' needs max_length")
    if truncation and max_length is None:
        raise ValueError("truncation=True needs max_length")
    return texts
