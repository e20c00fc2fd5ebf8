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

The encoding also keeps the *surface text* of every number (``"43.60"``, ``"−2"``, ``"1,000"``), as
`NumericEncoding.number_texts`, and decoding writes those back, so that
``tokenizer.batch_decode(tokenizer(texts)) == texts``. A number the model generated has no surface
text and is written in its shortest float32 form (`format_number`), with a space where it would
otherwise run into its neighbours and read back as something else.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer, BatchEncoding, PreTrainedTokenizerBase

from .auto import AUTO_MODULE, TOKENIZER_AUTO_MAP, TOKENIZER_FILES, update_json, write_auto_module
from .checkpoint import check_local_source
from .rundir import check_write_targets
from .numbers import (NUMBER_REGEX, NumberMatch, find_numbers, find_numbers_before, format_number, last_cut_place,
                      next_cut_place, parse_number, split_numbers)

__all__ = [
    "NUMBER_REGEX",
    "NumberMatch",
    "find_numbers",
    "split_numbers",
    "parse_number",
    "format_number",
    "NumericEncoding",
    "NumericTokenizer",
]

# The longest text `encode` takes whole. The Rust tokenizer needs about 100 bytes of memory per character
# and aborts the process when it cannot get them, so longer texts are refused before they reach it
# (or, with a token limit, only a prefix is encoded).
MAX_TEXT_CHARS = 10_000_000


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


def _check_length(text: str, max_length: int | None) -> None:
    """A ``ValueError`` for a text too long to encode whole when no ``max_length`` bounds it."""
    if max_length is None and len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"the text has {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} encoded whole (the Rust "
            "tokenizer needs about 100 bytes per character); pass max_length (with truncation) or split the text"
        )


def _runs(text: str, found: list[NumberMatch]) -> list[str]:
    """The text before, between and after the numbers: one more run than numbers (runs may be empty)."""
    runs, position = [], 0
    for number in found:
        runs.append(text[position : number.start])
        position = number.end
    runs.append(text[position:])
    return runs


def _encode_batch(backend, texts: list[str]) -> list[list[int]]:
    r"""The fast path: texts whose numbers are replaced by ``<NUM>`` (and that hold no other special token's
    text), encoded in one call of the Rust tokenizer. Its added-token matching splits each text at ``<NUM>``
    and encodes the pieces separately: the same ids as `NumericTokenizer._encode_by_runs`, at a fraction of
    the calls. Truncation and padding are off, as the wrapped tokenizer sets them for a call without either."""
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    previous_flag = backend.encode_special_tokens
    backend.encode_special_tokens = False
    try:
        encodings = backend.encode_batch(texts, add_special_tokens=False)
    finally:
        backend.encode_special_tokens = previous_flag
    return [encoding.ids for encoding in encodings]


# A prefix cut at a place that is neither a space nor the end of a number keeps this many tokens in reserve:
# the BPE merges of its last piece can differ from the whole text's.
_UNSAFE_CUT_MARGIN = 8


def _prefix(text: str, budget: int) -> tuple[int, list[NumberMatch], bool]:
    """``(end, numbers, exact)``: a prefix ``text[:end]`` to encode instead of the whole text, and its numbers,
    which are the whole text's numbers that start before ``end`` (none reaches past it).

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
    and are not used (`_UNSAFE_CUT_MARGIN`).
    """
    if len(text) <= budget:
        return len(text), find_numbers(text), True
    half = budget // 2
    end = text.rfind(" ", half + 1, budget + 1)
    while end > half and text[end - 1].isspace():
        end = text.rfind(" ", half + 1, end)
    exact = end > half
    if not exact:
        end = last_cut_place(text, half + 1, budget)
    if end is None:
        end, reach = budget, next_cut_place(text, budget)
    else:
        reach = end
    found = find_numbers_before(text, end, reach)
    if found and found[-1].end >= end:  # the prefix ends with a number: its tokens are the whole text's
        end, exact = found[-1].end, True
    return end, found, exact


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

    It is not a ``PreTrainedTokenizerBase``: its encodings carry values beside the ids, which transformers'
    tokenizer interface has no place for. It works where transformers takes a tokenizer and only saves or
    reads it (``Trainer(processing_class=...)``, ``AutoTokenizer`` with ``trust_remote_code=True``), and
    `causalqwen.pipelines.NumericTextGenerationPipeline` is the ``"text-generation"`` pipeline that uses it.
    """

    model_input_names = ["input_ids", "numeric_values", "attention_mask"]

    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase, num_token: str = "<NUM>"):
        if not isinstance(hf_tokenizer, PreTrainedTokenizerBase):
            raise TypeError(
                f"hf_tokenizer must be a transformers PreTrainedTokenizerBase, got {type(hf_tokenizer).__name__}"
            )
        if not isinstance(num_token, str):
            raise TypeError(f"num_token must be a str, got {type(num_token).__name__}")
        if num_token == "" or num_token.strip() != num_token:
            raise ValueError(f"num_token must be non-empty without surrounding whitespace, got {num_token!r}")
        if find_numbers(num_token):
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
    def from_pretrained(cls, path: str | os.PathLike, num_token: str | None = None, **kwargs) -> "NumericTokenizer":
        """Load the wrapped tokenizer with ``AutoTokenizer.from_pretrained(path, **kwargs)`` and wrap it.

        ``num_token`` defaults to the one `save_pretrained` recorded in ``tokenizer_config.json``, else
        ``"<NUM>"``. This is also what ``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` calls
        for a directory `save_pretrained` wrote. A local path that does not exist, or tokenizer files that
        are missing or corrupt, raise an ``OSError`` that names the path (and the loader's reason, on one line).
        """
        where = os.fspath(path) if isinstance(path, os.PathLike) else path
        if isinstance(path, (str, os.PathLike)):
            check_local_source(path, "tokenizer")  # a missing local path never falls through to the hub
        kwargs.pop("trust_remote_code", None)  # the wrapped tokenizer is transformers' own class: no remote code
        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)
        except Exception as error:  # noqa: BLE001 -- the loaders raise many types, the Rust one a bare Exception
            raise OSError(f"cannot load a tokenizer from {where!r}: {' '.join(str(error).split())}") from error
        if num_token is None:
            recorded = getattr(hf_tokenizer, "num_token", None)  # transformers keeps a *_token entry as a special token
            num_token = str(recorded) if recorded is not None else "<NUM>"
        return cls(hf_tokenizer, num_token=num_token)

    def save_pretrained(self, path: str | os.PathLike, **kwargs) -> tuple[str, ...]:
        """Save the wrapped tokenizer, ``<NUM>`` included, with its ``save_pretrained(path, **kwargs)``, and
        name this class in ``tokenizer_config.json``: ``num_token``, and ``auto_map`` so that
        ``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` gives a `NumericTokenizer` (see
        `causalqwen.auto`); without ``trust_remote_code`` it gives the wrapped tokenizer, which knows
        ``<NUM>`` as its special ``num_token``.

        ``path`` must be a directory or not exist yet (an existing file is an ``OSError`` naming it), and is
        never written through a link: ``path`` itself, or a name the save writes (``tokenizer_config.json``,
        ``tokenizer.json``, ...), being a symbolic link or a hard-linked file is an ``OSError`` naming it,
        raised before anything is written (`causalqwen.rundir.check_write_targets`)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        check_write_targets(path, TOKENIZER_FILES)  # OSError for a link, a file in place of the directory
        files = self._hf_tokenizer.save_pretrained(path, **kwargs)
        if files is None:  # transformers logs and returns None when it writes nothing
            raise OSError(f"the tokenizer could not be saved to {os.fspath(path)!r}")
        config_file = next((file for file in files if os.path.basename(file) == "tokenizer_config.json"), None)
        if config_file is None:
            raise RuntimeError(f"the wrapped tokenizer wrote no tokenizer_config.json to {os.fspath(path)!r}")
        update_json(config_file, {"num_token": self._num_token, "auto_map": dict(TOKENIZER_AUTO_MAP)})
        write_auto_module(path)
        return tuple(files) + (os.path.join(path, AUTO_MODULE + ".py"),)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoTokenizer") -> None:
        """What ``AutoTokenizer`` calls on a class it loaded from a directory's ``auto_map``. The directory
        already names this class (`save_pretrained`), so there is nothing to record."""

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

    @property
    def padding_side(self) -> str:
        """The wrapped tokenizer's ``padding_side``, where transformers' batching (``pipeline`` with
        ``batch_size``) pads; `__call__` takes its own ``padding_side`` argument."""
        return self._hf_tokenizer.padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f'padding_side must be "left" or "right", got {side!r}')
        self._hf_tokenizer.padding_side = side

    def __len__(self) -> int:
        """The number of tokens, ``<NUM>`` included (K + 1 for a tokenizer of K tokens)."""
        return len(self._hf_tokenizer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({type(self._hf_tokenizer).__name__}, num_token={self._num_token!r}, "
            f"num_token_id={self._num_token_id}, size={len(self)})"
        )

    # -- encoding ----------------------------------------------------------------------------

    def encode(
        self, text: str, max_length: int | None = None, return_number_texts: bool = False
    ) -> tuple[list[int], list[float]] | tuple[list[int], list[float], list[str]]:
        """Encode one text into ``(input_ids, numeric_values)`` of equal length.

        Each quantity (see `causalqwen.numbers`) becomes one ``<NUM>`` id, with its float32 value at
        the same position of ``numeric_values``; every other position holds 0.0. The text between
        numbers is encoded by the wrapped tokenizer, piece by piece, without special tokens. No
        spaces are added around numbers. With ``return_number_texts=True`` a third list holds the
        surface text of each ``<NUM>``, in order (what `decode` needs to give back ``text``).

        With ``max_length``, at most that many tokens are returned, and the wrapped tokenizer encodes only
        a prefix of the text, of about 16 characters per token, grown until it gives more than
        ``max_length`` tokens: so a 50 MB text costs what its first tokens cost, whatever it holds (a
        base64 blob, Chinese without spaces, one long digit run). The prefix ends at a space that follows
        a non-space character (where neither the number grammar nor a byte-level BPE pre-tokenizer joins
        across), else where no number reads across (a cut place of `causalqwen.numbers`), else anywhere.
        Its numbers are always the whole text's: where the grammar must look further to decide one (the
        "1" of "1a1a...1a_" is a number only because of the final "_"), it does, in time linear in the text.
        The tokens are those of the whole text: the first ``max_length`` of them.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: the text holds a lone surrogate (not valid Unicode: the message names the
                character), or it is longer than `MAX_TEXT_CHARS` and no ``max_length`` bounds it.
        """
        _check_text(text)
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
                raise ValueError(f"max_length must be a positive int, got {max_length!r}")
            max_length = int(max_length)
        _check_length(text, max_length)
        row = self._encode_texts([text], max_length)[0]
        return tuple(row) if return_number_texts else (row.input_ids, row.numeric_values)

    def _encode_texts(self, texts: list[str], max_length: int | None) -> list[_Row]:
        """The rows of checked texts; with ``max_length``, of prefixes long enough for that many tokens."""
        if max_length is None:
            return self._encode_whole(texts, [find_numbers(text) for text in texts])
        budget = 16 * max_length + 64  # characters; most tokens are far shorter
        plans = [_prefix(text, budget) for text in texts]
        rows = self._encode_whole([text[:end] for text, (end, _, _) in zip(texts, plans)],
                                  [found for _, found, _ in plans])
        for index, text in enumerate(texts):
            grown = budget
            end, _, exact = plans[index]
            while end < len(text) and len(rows[index].input_ids) <= max_length + (0 if exact else _UNSAFE_CUT_MARGIN):
                grown *= 4
                end, found, exact = _prefix(text, grown)
                rows[index] = self._encode_whole([text[:end]], [found])[0]
        return [self._cut(row, max_length) for row in rows]

    def _encode_whole(self, texts: list[str], found: list[list[NumberMatch]]) -> list[_Row]:
        """Encode every text, given its numbers: the text between them by the wrapped tokenizer."""
        fast = self._fast_backend()
        if fast is not None:
            specials = self._special_texts()
            plain = [not any(special in text for special in specials) for text in texts]
        else:
            plain = [False] * len(texts)
        id_rows: list[list[int] | None] = [None] * len(texts)
        quick = [index for index, ok in enumerate(plain) if ok]
        if quick:
            for index, ids in zip(quick, self._encode_plain(fast, [texts[i] for i in quick], [found[i] for i in quick])):
                id_rows[index] = ids
        slow = [index for index, ok in enumerate(plain) if not ok]
        if slow:
            for index, ids in zip(slow, self._encode_by_runs([texts[i] for i in slow], [found[i] for i in slow])):
                id_rows[index] = ids
        return [self._row(ids, numbers_found) for ids, numbers_found in zip(id_rows, found)]

    def _encode_plain(self, fast, texts: list[str], found: list[list[NumberMatch]]) -> list[list[int]]:
        """The ids of texts that hold no special token's text, by one of two equivalent ways (the Rust tokenizer
        encodes the text between two ``<NUM>`` on its own either way):

        * each text with its numbers replaced by ``<NUM>``, one Rust encoding per text (`_encode_batch`);
        * each *distinct* text run between numbers once, the rows put together from those, when at most
          half the runs are distinct: number-dense texts ("1-2-3-...", tables, a batch of similar lines),
          where the Rust tokenizer would otherwise spend most of its time on ``<NUM>`` after ``<NUM>``.
        """
        runs_per_text = [_runs(text, numbers_found) for text, numbers_found in zip(texts, found)]
        runs_count = sum(len(runs) for runs in runs_per_text)
        distinct = list(dict.fromkeys(run for runs in runs_per_text for run in runs if run))
        if 2 * len(distinct) > runs_count:
            return _encode_batch(fast, [self._num_token.join(runs) for runs in runs_per_text])
        ids_of = dict(zip(distinct, _encode_batch(fast, distinct)))
        num, rows = self._num_token_id, []
        for runs in runs_per_text:
            ids = list(ids_of[runs[0]]) if runs[0] else []
            for run in runs[1:]:
                ids.append(num)
                if run:
                    ids += ids_of[run]
            rows.append(ids)
        return rows

    def _fast_backend(self):
        """The Rust tokenizer behind the wrapped one, or None for a slow (Python) tokenizer."""
        return getattr(self._hf_tokenizer, "backend_tokenizer", None)

    def _special_texts(self) -> list[str]:
        """The text of every special added token (``<NUM>`` included): texts holding one take the slow path."""
        return [token.content for token in self._hf_tokenizer.added_tokens_decoder.values() if token.special]

    def _encode_by_runs(self, texts: list[str], found: list[list[NumberMatch]]) -> list[list[int]]:
        """The reference path: the text runs between numbers of every text encoded in one call, special-token
        matching off (a typed ``"<NUM>"`` or ``"<|endoftext|>"`` stays text), then ``<NUM>`` ids put between them."""
        runs_per_text = [_runs(text, numbers_found) for text, numbers_found in zip(texts, found)]
        flat = [run for runs in runs_per_text for run in runs if run]
        encoded = iter(self._encode_text_runs(flat))
        id_rows = []
        for runs in runs_per_text:
            ids: list[int] = []
            for index, run in enumerate(runs):
                if index:
                    ids.append(self._num_token_id)
                if run:
                    ids.extend(next(encoded))
            id_rows.append(ids)
        return id_rows

    def _encode_text_runs(self, runs: list[str]) -> list[list[int]]:
        """Token ids of each text run, with no special tokens added and none recognised in the text."""
        if not runs:
            return []
        backend = self._fast_backend()
        previous_flag = getattr(backend, "encode_special_tokens", None)
        try:
            encoded = self._hf_tokenizer(runs, add_special_tokens=False, split_special_tokens=True)
        finally:
            # The fast tokenizer leaves the flag set on its Rust backend; put it back as it was.
            if previous_flag is not None and backend.encode_special_tokens != previous_flag:
                backend.encode_special_tokens = previous_flag
        return [list(ids) for ids in encoded["input_ids"]]

    def _row(self, ids: list[int], found: list[NumberMatch]) -> _Row:
        """Put each number's value at its ``<NUM>`` position."""
        positions = [position for position, token_id in enumerate(ids) if token_id == self._num_token_id]
        if len(positions) != len(found):
            raise RuntimeError(
                f"the wrapped tokenizer gave {len(positions)} <NUM> ids for {len(found)} numbers; it must encode "
                f"{self._num_token!r} as its one added token"
            )
        values = [0.0] * len(ids)
        for position, number in zip(positions, found):
            values[position] = number.value
        return _Row(ids, values, [number.text for number in found])

    def _cut(self, row: _Row, length: int) -> _Row:
        """The first ``length`` tokens of a row, and the surface texts of the numbers among them."""
        kept = row.input_ids[:length]
        return _Row(kept, row.numeric_values[:length], row.number_texts[: kept.count(self._num_token_id)])

    def __call__(
        self,
        texts: str | list[str],
        padding: bool | str = True,
        max_length: int | None = None,
        padding_side: str = "right",
        truncation: bool = False,
    ) -> NumericEncoding:
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
            A `NumericEncoding`: ``input_ids`` (int64, [B, S]), ``numeric_values`` (float32, [B, S]) and
            ``attention_mask`` (int64, [B, S], 1 on real tokens and 0 on padding; padded positions hold
            the pad id and the value 0.0), and ``number_texts``, the surface text of each row's
            numbers, which `batch_decode` writes back.
        """
        texts = _check_call_arguments(texts, padding, max_length, padding_side, truncation)
        max_length = int(max_length) if max_length is not None else None
        for index, text in enumerate(texts):
            try:
                _check_text(text)
                _check_length(text, max_length)
            except ValueError as error:
                raise ValueError(f"text {index}: {error}") from None
        rows = self._encode_texts(texts, max_length + 1 if max_length is not None else None)
        if max_length is not None:
            for index, row in enumerate(rows):
                if len(row.input_ids) > max_length and not truncation:
                    raise ValueError(
                        f"text {index} has more than max_length={max_length} tokens; pass truncation=True to cut it"
                    )
            rows = [self._cut(row, max_length) for row in rows]
        return self._pad(rows, padding, max_length, padding_side)

    def _pad(self, rows: list[_Row], padding, max_length, padding_side: str) -> NumericEncoding:
        """The rows as ``[B, S]`` tensors; padded positions hold the pad id, the value 0.0 and mask 0."""
        lengths = [len(row.input_ids) for row in rows]
        if padding is False:
            if len(set(lengths)) > 1:
                raise ValueError(f"padding=False needs texts of equal token length, got lengths {lengths}")
            width = lengths[0]
        elif padding == "max_length":
            width = max_length
        else:
            width = max(lengths)

        pad_token_id = self.pad_token_id if any(length < width for length in lengths) else 0
        left = padding_side == "left"

        def padded(row: list, fill) -> list:
            return [fill] * (width - len(row)) + row if left else row + [fill] * (width - len(row))

        input_ids = torch.tensor([padded(row.input_ids, pad_token_id) for row in rows], dtype=torch.int64)  # [B, S]
        numeric_values = torch.tensor([padded(row.numeric_values, 0.0) for row in rows], dtype=torch.float32)  # [B, S]
        attention_mask = torch.tensor([padded([1] * length, 0) for length in lengths], dtype=torch.int64)  # [B, S]
        input_ids = input_ids.reshape(len(rows), width)  # [B, S], also when S = 0
        numeric_values = numeric_values.reshape(len(rows), width)
        attention_mask = attention_mask.reshape(len(rows), width)
        data = {"input_ids": input_ids, "numeric_values": numeric_values, "attention_mask": attention_mask}
        return NumericEncoding(data, [row.number_texts for row in rows])

    # -- decoding ----------------------------------------------------------------------------

    def decode(
        self,
        input_ids,
        numeric_values,
        skip_special_tokens: bool = True,
        out_of_vocab: str = "raise",
        *,
        number_texts=None,
    ) -> str:
        """Turn ``(input_ids, numeric_values)`` back into text.

        The k-th ``<NUM>`` is written as ``number_texts[k]`` when given (the surface text `encode`
        returns with ``return_number_texts=True``); every further ``<NUM>`` (one the model generated) is
        written as `format_number` of its value, with a space before it, or around it, wherever it
        would otherwise run into its neighbours and read back as a different number (two adjacent
        numbers, a letter or a ``-`` before it, ...). The numbers as written keep their place: where what
        follows the last of them would run into one (the digit tokens ``7 7`` after ``"The total is 5"``),
        the space goes right after that number (``"The total is 5 77"``); `decode_continuation` splits the
        text there. The runs of other ids are decoded by the wrapped tokenizer; ``skip_special_tokens``
        applies to those runs (pad, eos, ...). Values at positions that are not ``<NUM>`` are not used.

        Args:
            input_ids: a list of ints or a 1-D integer tensor/array.
            numeric_values: a list of numbers or a 1-D tensor/array of the same length.
            skip_special_tokens: drop special tokens other than ``<NUM>`` from the text.
            out_of_vocab: what to do with an id at or beyond ``len(self)`` -- one of the model's
                reserved rows, which an untrained model can predict: ``"raise"`` (default) or
                ``"mark"``, which writes it as ``<unk:ID>``.
            number_texts: the surface texts of the first ``<NUM>`` positions, a list of str; each must
                read as the value at its position.

        Raises:
            TypeError: wrong element types.
            ValueError: the lengths differ, an id is negative or (with ``out_of_vocab="raise"``)
                at least ``len(self)``, a ``<NUM>`` value is NaN or infinite, or ``number_texts`` has
                more texts than there are ``<NUM>`` or a text that does not read as its value.
        """
        ids, values, surfaces = self._decode_arguments(input_ids, numeric_values, skip_special_tokens, out_of_vocab,
                                                       number_texts)
        pieces, _ = self._pieces(ids, values, surfaces, skip_special_tokens, len(ids))
        return _joined(pieces, _decoded_spaces(pieces))[0]

    def decode_continuation(
        self,
        input_ids,
        numeric_values,
        prompt_length: int,
        skip_special_tokens: bool = True,
        out_of_vocab: str = "raise",
        *,
        number_texts=None,
    ) -> tuple[str, str]:
        """Decode a prompt and what was generated after it: ``(prompt, continuation)``.

        ``prompt`` is the text of the first ``prompt_length`` ids alone, exactly as `decode` writes them
        (with ``number_texts``, the prompt's numbers as they were written); ``continuation`` is the text of
        the rest. Wherever the continuation would run into the prompt -- a digit or a number right after the
        prompt's last number, or a ``-`` that would make its runs one identifier -- the separating space
        goes at the start of the continuation, never into the prompt; numbers of the continuation get their
        spaces as in `decode`. So ``prompt + continuation`` reads back every number as its value, and
        ``prompt_text + continuation`` continues the text a user gave.

        The arguments are those of `decode`, plus ``prompt_length`` (0 to ``len(input_ids)``).
        """
        ids, values, surfaces = self._decode_arguments(input_ids, numeric_values, skip_special_tokens, out_of_vocab,
                                                       number_texts)
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, numbers.Integral) \
                or not 0 <= prompt_length <= len(ids):
            raise ValueError(f"prompt_length must be an int from 0 to len(input_ids)={len(ids)}, got {prompt_length!r}")
        pieces, split = self._pieces(ids, values, surfaces, skip_special_tokens, int(prompt_length))
        return _join_pieces(pieces, split)

    def _decode_arguments(self, input_ids, numeric_values, skip_special_tokens, out_of_vocab, number_texts):
        """`decode`'s door: the ids, values and surface texts as lists, or an error naming the argument."""
        ids = _as_id_list(input_ids, "input_ids")
        values = _as_value_list(numeric_values, "numeric_values")
        if len(ids) != len(values):
            raise ValueError(
                f"input_ids has length {len(ids)} but numeric_values has length {len(values)}; they must match"
            )
        if out_of_vocab not in ("raise", "mark"):
            raise ValueError(f'out_of_vocab must be "raise" or "mark", got {out_of_vocab!r}')
        if not isinstance(skip_special_tokens, bool):
            raise TypeError(f"skip_special_tokens must be a bool, got {type(skip_special_tokens).__name__}")
        surfaces = _as_text_list(number_texts)
        size = len(self)
        for position, token_id in enumerate(ids):
            if token_id < 0:  # no model predicts a negative id: out_of_vocab="mark" cannot write it either
                raise ValueError(
                    f"input_ids[{position}] = {token_id} is not a token id of this tokenizer (0 to {size - 1}): a "
                    'negative id is never a model\'s prediction, so out_of_vocab="mark" does not apply to it (it marks '
                    f"only ids >= {size}, the model's reserved rows)"
                )
            if token_id >= size and out_of_vocab == "raise":
                raise ValueError(
                    f"input_ids[{position}] = {token_id} is not a token id of this tokenizer (0 to {size - 1}); "
                    'an untrained model can predict its reserved rows: pass out_of_vocab="mark" to write them as <unk:ID>'
                )
        return ids, values, surfaces

    def _pieces(self, ids, values, surfaces: list[str], skip_special_tokens: bool,
                split: int) -> tuple[list[tuple[str, str]], int]:
        """``(text, kind)`` pieces: decoded runs of ordinary ids (`_TEXT`), and each number as written (`_WRITTEN`,
        its surface text) or generated (`_GENERATED`, its shortest float32 text); and the number of pieces made of
        the first ``split`` ids (a run of ids that crosses ``split`` is decoded as two runs)."""
        pieces: list[tuple[str, str]] = []
        run: list[int] = []
        size, count, split_piece = len(self), 0, None
        for position, token_id in enumerate(ids):
            if position == split:
                if run:
                    pieces.append((self._decode_run(run, skip_special_tokens), _TEXT))
                    run = []
                split_piece = len(pieces)
            if token_id != self._num_token_id and token_id < size:
                run.append(token_id)
                continue
            if run:
                pieces.append((self._decode_run(run, skip_special_tokens), _TEXT))
                run = []
            if token_id >= size:
                pieces.append((f"<unk:{token_id}>", _TEXT))
                continue
            try:
                written = format_number(values[position])
            except ValueError as error:
                raise ValueError(f"numeric_values[{position}]: {error}") from None
            if count < len(surfaces):
                pieces.append((_surface_for(surfaces[count], values[position], count, position), _WRITTEN))
            else:
                pieces.append((written, _GENERATED))
            count += 1
        if run:
            pieces.append((self._decode_run(run, skip_special_tokens), _TEXT))
        if count < len(surfaces):
            raise ValueError(f"number_texts has {len(surfaces)} texts but the row has only {count} <NUM> tokens")
        return pieces, len(pieces) if split_piece is None else split_piece

    def _decode_run(self, ids: list[int], skip_special_tokens: bool) -> str:
        """Decode a run of ordinary ids exactly, without any clean-up of spaces."""
        return self._hf_tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def batch_decode(
        self,
        input_ids,
        numeric_values=None,
        skip_special_tokens: bool = True,
        out_of_vocab: str = "raise",
        *,
        number_texts=None,
    ) -> list[str]:
        """Decode each row with `decode`.

        Either the whole encoding, ``batch_decode(tokenizer(texts)) == texts``, or the output of
        `causalqwen.generate` (its ``attention_mask`` drops the padding, its prompts' numbers take
        their surface texts from ``number_texts=encoding.number_texts``), or ``input_ids`` [B, S] and
        ``numeric_values`` [B, S] as tensors, arrays or lists of rows. ``number_texts[b]`` lists the
        surface texts of the first ``<NUM>`` of row b (see `decode`).
        """
        mask = None
        if isinstance(input_ids, Mapping):
            if numeric_values is not None:
                raise TypeError("pass the encoding alone, or input_ids and numeric_values, not both")
            encoding = input_ids
            input_ids, numeric_values, mask = _unpack_encoding(encoding)
            number_texts = getattr(encoding, "number_texts", None) if number_texts is None else number_texts
        if numeric_values is None:
            raise TypeError("batch_decode needs numeric_values beside input_ids (or the whole encoding)")
        id_rows = _as_rows(input_ids, "input_ids")
        value_rows = _as_rows(numeric_values, "numeric_values")
        mask_rows = _as_rows(mask, "attention_mask") if mask is not None else [None] * len(id_rows)
        text_rows = _as_text_rows(number_texts, len(id_rows))
        if not len(id_rows) == len(value_rows) == len(mask_rows):
            raise ValueError(
                f"input_ids has {len(id_rows)} rows but numeric_values has {len(value_rows)}"
                + (f" and attention_mask {len(mask_rows)}" if mask is not None else "") + "; they must match"
            )
        texts = []
        for row, (ids, values, keep, surfaces) in enumerate(zip(id_rows, value_rows, mask_rows, text_rows)):
            try:
                if keep is not None:
                    ids, values = _kept(ids, values, keep)
                texts.append(self.decode(ids, values, skip_special_tokens, out_of_vocab, number_texts=surfaces))
            except ValueError as error:
                raise ValueError(f"row {row}: {error}") from None
        return texts


class _Row(NamedTuple):
    """One encoded text."""

    input_ids: list[int]
    numeric_values: list[float]
    number_texts: list[str]  # the surface text of each <NUM>, in order


class NumericEncoding(BatchEncoding):
    """What `NumericTokenizer.__call__` returns: a `transformers.BatchEncoding` with ``input_ids``,
    ``numeric_values`` and ``attention_mask`` (``[B, S]`` tensors; ``model(**encoding)`` works), plus the
    attribute ``number_texts``.

    ``number_texts[b][k]`` is the text of the k-th number of row b as it was written (``"43.60"``,
    ``"−2"``, ``"1,000"``). It is an attribute, not a key, so that it never reaches the model; pass the
    whole encoding to `NumericTokenizer.batch_decode` to get the texts back, or give
    ``number_texts=encoding.number_texts`` when decoding what `causalqwen.generate` made from it.
    """

    def __init__(self, data: dict, number_texts: list[list[str]]):
        super().__init__(data)
        self.number_texts = number_texts

    def __getstate__(self):
        return super().__getstate__() | {"number_texts": self.number_texts}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.number_texts = state.get("number_texts", [])


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
        except OverflowError:  # a Python int beyond the float64 range: decode then names it as infinite
            values.append(math.inf if value > 0 else -math.inf)
    return values


def _as_text_list(number_texts) -> list[str]:
    """``number_texts`` of one row: None (no surface texts) or a list/tuple of str."""
    if number_texts is None:
        return []
    if not isinstance(number_texts, (list, tuple)):
        raise TypeError(f"number_texts must be a list of str, got {type(number_texts).__name__}")
    for index, text in enumerate(number_texts):
        if not isinstance(text, str):
            raise TypeError(f"number_texts[{index}] must be a str, got {type(text).__name__}")
    return list(number_texts)


def _as_text_rows(number_texts, rows: int) -> list:
    """``number_texts`` of a batch: None, or one list of str per row."""
    if number_texts is None:
        return [None] * rows
    if not isinstance(number_texts, (list, tuple)):
        raise TypeError(f"number_texts must be a list with one list of str per row, got {type(number_texts).__name__}")
    if len(number_texts) != rows:
        raise ValueError(f"number_texts has {len(number_texts)} rows but input_ids has {rows}; they must match")
    return list(number_texts)


# The kinds of decoded pieces: a run of ordinary tokens, a number as it was written, a number the model generated.
_TEXT, _WRITTEN, _GENERATED = "text", "written", "generated"


def _joined(pieces: list[tuple[str, str]], spaced: set[int]) -> tuple[str, list[tuple[int, int]]]:
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


def _spaces(pieces: list[tuple[str, str]], split: int, spaced: set[int]) -> set[int]:
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
    numbers_at = [index for index, (_, kind) in enumerate(pieces) if kind != _TEXT]
    for _ in range(5):
        joined, spans = _joined(pieces, spaced)
        read = {(number.start, number.end) for number in find_numbers(joined)}
        wrong = [index for index in numbers_at if spans[index] not in read]
        if not wrong:
            return spaced
        before = set(spaced)  # neighbours that both read wrong share the slot between them
        for index in wrong:
            if index < split:  # then its own sides, should the space at the split not do
                choices = (split, index + 1, index)
            elif pieces[index][1] == _WRITTEN:
                choices = (index + 1, index)
            else:
                choices = (index, index + 1)
            spaced.add(next((slot for slot in choices if slot not in before), choices[0]))
    raise RuntimeError(f"a number does not read back even between spaces: {joined!r}")


def _decoded_spaces(pieces: list[tuple[str, str]]) -> set[int]:
    """`decode`'s spaces: the numbers as written came first, from a text that reads them as they are, so the
    pieces up to the last of them are the prompt (`_spaces`), and what the model generated follows them."""
    written = [index for index, (_, kind) in enumerate(pieces) if kind == _WRITTEN]
    return _spaces(pieces, written[-1] + 1 if written else 0, set())


def _join_pieces(pieces: list[tuple[str, str]], split: int) -> tuple[str, str]:
    """``(head, tail)``: the first ``split`` pieces as `decode` joins them alone, then the rest, spaced so that
    every number reads back as itself (`_spaces`) and no space enters the head because of the tail."""
    head_spaces = _decoded_spaces(pieces[:split]) - {split}  # a space at the very end changes no reading
    spaced = _spaces(pieces, split, head_spaces)
    head = _joined(pieces[:split], {slot for slot in spaced if slot < split})[0]
    tail = _joined(pieces[split:], {slot - split for slot in spaced if slot >= split})[0]
    return head, tail


def _surface_for(surface: str, value: float, index: int, position: int) -> str:
    """The surface text of the ``index``-th number, checked to read as the value at its position."""
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


def _unpack_encoding(encoding: Mapping):
    """``(input_ids, numeric_values, attention_mask or None)`` of an encoding or a generation output."""
    key = "input_ids" if "input_ids" in encoding else "sequences"
    missing = [name for name in (key, "numeric_values") if encoding.get(name) is None]
    if missing:
        raise ValueError(
            f"the encoding has no {' and no '.join(missing)} (keys: {', '.join(map(str, encoding.keys()))})"
        )
    return encoding[key], encoding["numeric_values"], encoding.get("attention_mask")


def _kept(ids, values, mask) -> tuple[list, list]:
    """The positions of one row where ``mask`` is not 0 (padding and what follows an EOS are dropped)."""
    flags = mask.tolist() if isinstance(mask, (torch.Tensor, np.ndarray)) else list(mask)
    if any(flag not in (0, 1) for flag in flags):  # bools compare equal to 0 and 1
        raise ValueError(f"attention_mask must hold only 0 and 1, got {sorted(set(flags) - {0, 1})[:3]}")
    keep = [bool(flag) for flag in flags]
    ids = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else list(ids)
    values = values.tolist() if isinstance(values, (torch.Tensor, np.ndarray)) else list(values)
    if not len(keep) == len(ids) == len(values):
        raise ValueError(f"attention_mask has length {len(keep)} but input_ids {len(ids)}; they must match")
    return [i for i, k in zip(ids, keep) if k], [v for v, k in zip(values, keep) if k]


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
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral)):
        raise TypeError(f"max_length must be an int or None, got {type(max_length).__name__}")
    if max_length is not None and max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if padding == "max_length" and max_length is None:
        raise ValueError("padding='max_length' needs max_length")
    if truncation and max_length is None:
        raise ValueError("truncation=True needs max_length")
    return texts
