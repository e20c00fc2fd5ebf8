"""Numeric-aware tokenization: every quantity in a text becomes one ``<NUM>`` token plus a value.

CausalQwen reads numbers as values rather than as strings of digit tokens. Encoding a text
produces two aligned sequences of the same length:

* ``input_ids``: ordinary token ids for the text between numbers, and the id of the special
  token ``<NUM>`` at the place of each number;
* ``numeric_values``: the float32 value of the number at each ``<NUM>`` position, 0.0 elsewhere.

For example ``"价格是99.9元"`` encodes to the tokens of ``"价格是"``, one ``<NUM>``, and the
tokens of ``"元"``; the values are ``[0.0, ..., 0.0, 99.9, 0.0, ...]`` with 99.9 (rounded to
float32) exactly at the ``<NUM>`` position. Which spans are quantities is the grammar of
`causalqwen.numbers` (decision D3).

Encoding a batch of texts, step by step:

1. cut every text at its numbers, in one pass over the batch: its runs of text before, between and after the
   numbers, and each number's value and text as written (`causalqwen.numbers.split_texts`; with a token limit,
   a prefix of it, `bounded_prefixes`);
2. encode the runs with the wrapped tokenizer (Qwen2's), the ``<NUM>`` id between every two runs, and put each
   number's value at its ``<NUM>`` position: one `EncodedRow` per text;
3. make the rows one batch: cut at ``max_length``, padded, as tensors (`batch_of_rows`).

Steps 1 and 3 are this section's; step 2 is the transformers-facing tokenizer's
(`causalqwen.integrations.tokenizer.NumericTokenizer`, decision D15), since only it knows the wrapped tokenizer. So this
section is plain Python, numpy and torch, and `causalqwen.checks.tokenizer_door` checks every argument before step 1.

The encoding keeps the *surface text* of every number (``"43.60"``, ``"−2"``, ``"1,000"``), and decoding
writes those back (`decoded_pieces`, then the spacing rules of `causalqwen.writing`), so that
``tokenizer.batch_decode(tokenizer(texts)) == texts``. A number the model generated has no surface text and
is written in its shortest float32 form (`causalqwen.float32.format_number`), with a space where it would
otherwise run into its neighbours and read back as something else.

A large batch is encoded in chunks (`chunks_of`); rows of different lengths are padded by `pad_rows`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from .float32 import format_number
from .numbers import TextPieces, last_cut_place, next_cut_place, parse_number, split_texts
from .writing import (
    GENERATED_NUMBER,
    TEXT_PIECE,
    WRITTEN_NUMBER,
    prompt_exponent,
    resolution_for,
    write_at_resolution,
)

__all__ = [
    "check_number_text_count",
    "EncodedRow",
    "first_tokens",
    "batch_of_rows",
    "UNSAFE_CUT_MARGIN",
    "bounded_prefixes",
    "CHUNK_CHARACTERS",
    "chunks_of",
    "RETURN_TENSORS",
    "FLOAT_KEYS",
    "padded_lists",
    "as_tensor_type",
    "pad_rows",
    "checked_number_text",
    "decoded_pieces",
]


# ---------------------------------------------------------------------------------------------
# Encoding: rows of (input_ids, numeric_values) -> one batch
# ---------------------------------------------------------------------------------------------


class EncodedRow(NamedTuple):
    """One encoded text."""

    input_ids: list[int]  # [S]
    numeric_values: list[float]  # [S]: the number's value at each <NUM>, 0.0 elsewhere
    number_texts: list[str]  # [number of <NUM>]: the surface text of each <NUM>, in order


def first_tokens(row: EncodedRow, length: int, num_token_id: int) -> EncodedRow:
    """The first ``length`` tokens of a row, and the surface texts of the numbers among them."""
    kept = row.input_ids[:length]
    return EncodedRow(kept, row.numeric_values[:length], row.number_texts[: kept.count(num_token_id)])


def batch_of_rows(
    rows: list[EncodedRow],
    *,
    num_token_id: int,
    max_length: int | None,
    truncation: bool,
    padding: bool | str,
    padding_side: str,
    return_tensors: str | None,
    pad_token_id: Callable[[], int | None],
) -> tuple[dict, list[list[str]]]:
    """The rows of checked texts as one batch, and the number texts of each row.

    With ``max_length``, each row keeps its first ``max_length`` tokens; a longer row is a ``ValueError`` unless
    ``truncation``. ``padding`` ``True`` or ``"longest"`` pads to the longest row, ``"max_length"`` to ``max_length``,
    ``False`` not at all (rows of different lengths are then an error unless ``return_tensors`` is None), on
    ``padding_side`` with ``pad_token_id()``, the wrapped tokenizer's pad id, asked for only when a row is padded.
    ``input_ids``, ``numeric_values`` and ``attention_mask`` as ``return_tensors`` says (`as_tensor_type`)."""
    if max_length is not None:
        for index, row in enumerate(rows):
            if len(row.input_ids) > max_length and not truncation:
                raise ValueError(
                    f"text {index} has more than max_length={max_length} tokens; pass truncation=True to cut it"
                )
        rows = [first_tokens(row, max_length, num_token_id) for row in rows]
    lengths = [len(row.input_ids) for row in rows]
    if padding is False:
        if len(set(lengths)) > 1 and return_tensors is not None:
            raise ValueError(
                f"padding=False needs texts of equal token length, got lengths {lengths} (or pass "
                "return_tensors=None for lists of different lengths)"
            )
        width = None
    else:
        width = max_length if padding == "max_length" else max(lengths)
    # the pad id is needed only when a row is shorter than the width
    pad_id = pad_token_id() if width is not None and any(length < width for length in lengths) else 0
    if pad_id is None:
        raise ValueError(
            "the wrapped tokenizer has no pad token; set tokenizer.pad_token (for example to tokenizer.eos_token) "
            "before padding a batch"
        )
    data = padded_lists(
        [row.input_ids for row in rows], [row.numeric_values for row in rows], width, pad_id, padding_side
    )
    return as_tensor_type(data, return_tensors), [row.number_texts for row in rows]


# ---------------------------------------------------------------------------------------------
# Long texts and large batches
# ---------------------------------------------------------------------------------------------

# A prefix cut at a place that is neither a space nor the end of a number keeps this many tokens in reserve:
# the BPE merges of its last piece can differ from the whole text's.
UNSAFE_CUT_MARGIN = 8


def bounded_prefixes(texts: list[str], budget: int, cuts: list[tuple[int, bool]]) -> list[TextPieces]:
    """The pieces (`causalqwen.numbers.split_texts`) of a prefix of each text to encode instead of the whole text, all
    read in one pass; ``(end, exact)`` of each prefix ``text[:end]`` is appended to ``cuts``. Its numbers are the
    whole text's numbers that start before ``end`` (none reaches past it).

    ``end`` is at most ``budget``, or the end of a number that ``budget`` falls inside (the number becomes one
    ``<NUM>``, however long it is written); ``len(text)`` when the text is within the budget. Where to cut, in
    order of preference, in the budget's second half:

    * just before a space that follows a non-space: neither the number grammar nor a byte-level BPE
      pre-tokenizer joins across it, so the prefix's tokens are the whole text's (``exact``);
    * the last cut place of the number grammar (`causalqwen.numbers`: a character no number reads
      through, as "+" after a letter in base64, or a CJK punctuation mark);
    * ``budget`` itself, in a run that holds no cut place (a long digit run, "1a1a1a..."); the numbers
      are then read up to the next cut place after it, however far, so they are still the whole text's:
      that costs time linear in the run, in the number grammar only, never in the wrapped tokenizer.

    Except at a space or a number's end, the prefix's last text tokens may differ from the whole text's
    and are not used (`UNSAFE_CUT_MARGIN`).
    """
    bounds, exact = [], []
    for text in texts:
        if len(text) <= budget:
            end, reach, at_space = len(text), len(text), True
        else:
            half = budget // 2
            end = text.rfind(" ", half + 1, budget + 1)
            while end > half and text[end - 1].isspace():
                end = text.rfind(" ", half + 1, end)
            at_space = end > half
            if not at_space:
                end = last_cut_place(text, half + 1, budget)
            if end is None:
                end, reach = budget, next_cut_place(text, budget)
            else:
                reach = end
        bounds.append((end, reach))
        exact.append(at_space)
    split = split_texts(texts, bounds)
    for pieces, (end, _), at_space in zip(split, bounds, exact):
        # a prefix that ends with a number: its tokens are the whole text's
        ends_with_a_number = bool(pieces.numbers) and pieces.numbers[-1].end >= end
        cuts.append((len(pieces.text), at_space or ends_with_a_number))
    return split


CHUNK_CHARACTERS = 1 << 15  # characters per chunk of a large batch (`chunks_of`)


def chunks_of(texts: list[str], characters: int) -> list[list[str]]:
    """``texts`` in consecutive chunks of at least ``characters`` characters each, the last one included when it
    holds fewer (then it is joined to the one before); one chunk when all of them hold fewer."""
    chunks, start, size = [], 0, 0
    for index, text in enumerate(texts):
        size += len(text)
        if size >= characters:
            chunks.append(texts[start : index + 1])
            start, size = index + 1, 0
    if start < len(texts):
        if chunks:
            chunks[-1] = chunks[-1] + texts[start:]
        else:
            chunks.append(texts[start:])
    return chunks


# ---------------------------------------------------------------------------------------------
# Padding: rows of different lengths -> [B, S]
# ---------------------------------------------------------------------------------------------

# What ``return_tensors`` may be: torch tensors, numpy arrays, or Python lists (None).
RETURN_TENSORS = ("pt", "np", None)
# The keys that hold values (float32); every other key holds ids or flags (int64).
FLOAT_KEYS = ("numeric_values", "numeric_labels")


def padded_lists(
    input_ids: list[list[int]],
    numeric_values: list[list[float]],
    width: int | None,
    pad_token_id: int | None,
    padding_side: str = "right",
) -> dict[str, list]:
    """Rows of ids and values as lists, each padded on ``padding_side`` to ``width`` (None: not padded): padded
    positions hold ``pad_token_id``, the value 0.0 and ``attention_mask`` 0 (1 on real tokens)."""
    values = [[float(value) for value in row] for row in numeric_values]
    if width is None:
        return {
            "input_ids": [list(row) for row in input_ids],
            "numeric_values": values,
            "attention_mask": [[1] * len(row) for row in input_ids],
        }
    if padding_side == "left":
        return {
            "input_ids": [[pad_token_id] * (width - len(row)) + list(row) for row in input_ids],
            "numeric_values": [[0.0] * (width - len(row)) + row for row in values],
            "attention_mask": [[0] * (width - len(row)) + [1] * len(row) for row in input_ids],
        }
    return {
        "input_ids": [list(row) + [pad_token_id] * (width - len(row)) for row in input_ids],
        "numeric_values": [row + [0.0] * (width - len(row)) for row in values],
        "attention_mask": [[1] * len(row) + [0] * (width - len(row)) for row in input_ids],
    }


def as_tensor_type(data: dict[str, list], return_tensors: str | None) -> dict:
    """Rows of equal length (``[B, S]``, also S = 0) as torch tensors (``"pt"``) or numpy arrays (``"np"``):
    ``numeric_values`` and ``numeric_labels`` float32, the others (ids, mask, labels) int64; ``None`` leaves the
    lists as they are."""
    if return_tensors is None:
        return data
    converted = {}
    for key, rows in data.items():
        shape = (len(rows), len(rows[0]) if rows else 0)
        array = np.asarray(rows, dtype=np.float32 if key in FLOAT_KEYS else np.int64).reshape(shape)  # [B, S]
        # numpy reads lists 3x faster than torch.tensor
        converted[key] = torch.from_numpy(array) if return_tensors == "pt" else array
    return converted


def pad_rows(
    input_ids: list[list[int]],
    numeric_values: list[list[float]],
    width: int,
    pad_token_id: int,
    padding_side: str = "right",
) -> dict[str, torch.Tensor]:
    """Rows of ids and values as ``[B, width]`` tensors, each padded on ``padding_side`` to ``width``: padded
    positions hold ``pad_token_id``, the value 0.0 and ``attention_mask`` 0 (1 on real tokens). The one padding
    of the package: `batch_of_rows` and `causalqwen.files.data.collate` both pad with it."""
    return as_tensor_type(padded_lists(input_ids, numeric_values, width, pad_token_id, padding_side), "pt")


# ---------------------------------------------------------------------------------------------
# Decoding: (input_ids, numeric_values) -> text
# ---------------------------------------------------------------------------------------------


def checked_number_text(surface: str, value: float, index: int, position: int) -> str:
    """The surface text of the ``index``-th number, which must read as the float32 value at its position."""
    try:
        read = parse_number(surface)
    except ValueError:
        raise ValueError(f"number_texts[{index}] = {surface!r} is not a number of the grammar") from None
    if read != float(np.float32(value)):
        raise ValueError(
            f"number_texts[{index}] = {surface!r} reads as {format_number(read)}, but numeric_values[{position}] "
            f"holds {format_number(value)}; leave number_texts out to write the values"
        )
    return surface


def check_number_text_count(given: int, ids, num_token_id: int, prompt_length: int | None) -> None:
    """``number_texts`` name the prompt's ``<NUM>`` tokens, one text each: ``given`` must equal the count of
    ``<NUM>`` among the first ``prompt_length`` of ``ids``. Fewer would write the prompt's later numbers as generated
    ones (``3%`` as ``3.00%``), more would take generated numbers for the prompt's. With ``prompt_length`` None
    (`decode` of a row, whose prompt end it is not told) no more texts than the row's ``<NUM>``."""
    ids = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else list(ids)
    if prompt_length is None:
        held = ids.count(num_token_id)
        if given > held:
            raise ValueError(f"number_texts holds {given} texts but the row holds only {held} <NUM> tokens")
        return
    needed = ids[:prompt_length].count(num_token_id)
    if given != needed:
        raise ValueError(
            f"number_texts holds {given} texts but the prompt (its first {prompt_length} ids) holds {needed} <NUM> "
            "tokens: they name exactly the prompt's numbers as written; pass the number_texts of the encoding the "
            "prompt came from"
        )


def decoded_pieces(
    ids: list[int],
    values: list[float] | None,
    number_texts: list[str],
    *,
    num_token_id: int,
    num_token: str,
    size: int,
    decode_run: Callable[[list[int]], str],
    split: int,
    resolution,
) -> tuple[list[tuple[str, str]], int]:
    """The ``(text, kind)`` pieces of a row, and the number of pieces made of its first ``split`` ids.

    Every run of ordinary ids becomes one piece, ``decode_run(run)`` (`TEXT_PIECE`; a run that crosses ``split``
    is decoded as two runs); an id at or beyond ``size`` (a model's reserved row) is written ``<unk:ID>``. The
    k-th ``<NUM>`` is ``number_texts[k]`` while there are texts (`WRITTEN_NUMBER`, checked to read as its value; their
    count is checked by `check_number_text_count`),
    then the value written at ``resolution`` (`GENERATED_NUMBER`: None, its shortest float32 text; a power of
    ten; ``"prompt"``, the resolution `causalqwen.writing.resolution_for` gives after the ``number_texts``);
    with ``values`` None (plain ids) every ``<NUM>`` is the text ``num_token``.

    ``causalqwen.writing`` joins the pieces with the spaces that keep every number reading as itself.
    """
    finest_in_prompt = prompt_exponent(number_texts) if resolution == "prompt" else None
    pieces: list[tuple[str, str]] = []
    run: list[int] = []
    count, split_piece = 0, None
    for position, token_id in enumerate(ids):
        if position == split:
            if run:
                pieces.append((decode_run(run), TEXT_PIECE))
                run = []
            split_piece = len(pieces)
        if token_id != num_token_id and token_id < size:
            run.append(token_id)
            continue
        if run:
            pieces.append((decode_run(run), TEXT_PIECE))
            run = []
        if token_id >= size:
            pieces.append((f"<unk:{token_id}>", TEXT_PIECE))
            continue
        if values is None:  # plain ids: the value is not known, so the number token is written as it is
            pieces.append((num_token, TEXT_PIECE))
            continue
        try:
            at = resolution_for(values[position], finest_in_prompt) if resolution == "prompt" else resolution
            written = write_at_resolution(values[position], at)
        except ValueError as error:
            raise ValueError(f"numeric_values[{position}]: {error}") from None
        if count < len(number_texts):
            pieces.append((checked_number_text(number_texts[count], values[position], count, position), WRITTEN_NUMBER))
        else:
            pieces.append((written, GENERATED_NUMBER))
        count += 1
    if run:
        pieces.append((decode_run(run), TEXT_PIECE))
    check_number_text_count(len(number_texts), ids, num_token_id, prompt_length=None)
    return pieces, len(pieces) if split_piece is None else split_piece


def __getattr__(name: str):
    """``NumericTokenizer`` and ``NumericEncoding``, which left this section for the transformers wing
    (`causalqwen.integrations.tokenizer`) and which directories saved by earlier versions import from here: read
    there when asked, with a warning (`causalqwen.files.earlier_versions.moved_name`, loaded then)."""
    if name not in ("NumericTokenizer", "NumericEncoding"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return importlib.import_module("causalqwen.files.earlier_versions").moved_name(__name__, name)
