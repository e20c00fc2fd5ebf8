"""`NumericTokenizer`: numeric-aware tokenization (`causalqwen.tokenization`) behind transformers' tokenizer interface.

Decision D15 (transformers' tokenizer interface): `NumericTokenizer` wraps a transformers tokenizer and speaks
its interface itself, not as a ``PreTrainedTokenizerFast`` subclass, whose inherited entry points (``encode_plus``,
``pad``, ``prepare_for_model``, the Rust backend) would each return ids without values: a call the wrapper lacks
is an ``AttributeError``, never a silently lost number. Where transformers' defaults would lose values it differs,
and says so: tensors (``"pt"``) and padding for a list of texts, left padding, ``decode`` skipping special tokens,
``encode`` -> (ids, values). Where it loses nothing it follows transformers: one str gives its row as Python lists,
``decode`` of a batch one text per row, ``tokenize`` the token strings.

A call reads its texts in one pass: the door checks every argument (`causalqwen.checks.tokenizer_door`), the section
cuts every text at its numbers (`causalqwen.numbers.split_texts`), `EncodingPlan` has the wrapped tokenizer encode the
runs between them and puts each row together, ids and values, and the section makes the rows one batch
(`causalqwen.tokenization.batch_of_rows`). Around it: what is asked of the wrapped tokenizer
(`causalqwen.integrations.wrapped_tokenizer`), decoding (`causalqwen.integrations.tokenizer_decoding`), loading,
saving and the attributes transformers reads (`causalqwen.integrations.tokenizer_mixin`), and the batch it returns
(`NumericEncoding`).
"""

from __future__ import annotations

import functools
import gc
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from transformers import BatchEncoding, PreTrainedTokenizerBase

from ..checks.tokenizer_door import check_call_arguments
from ..numbers import TextPieces, find_numbers, split_texts
from ..tokenization import CHUNK_CHARACTERS, UNSAFE_CUT_MARGIN, EncodedRow, batch_of_rows, bounded_prefixes, chunks_of
from .tokenizer_decoding import DecodingMixin
from .tokenizer_mixin import TokenizerMixin
from .wrapped_tokenizer import SPECIAL_TOKEN_FLAG_LOCK, add_num_token, encode_text_runs

__all__ = ["NumericTokenizer", "NumericEncoding", "TENSORS_FOR_A_BATCH", "EncodingPlan", "encode_by_runs"]


class _TensorsForABatch:
    """The default of ``NumericTokenizer.__call__``'s ``return_tensors``: ``"pt"`` for a list of texts, None (Python
    lists) for one str, as transformers returns one text."""

    def __repr__(self) -> str:
        return "TENSORS_FOR_A_BATCH"


TENSORS_FOR_A_BATCH = _TensorsForABatch()


class NumericEncoding(BatchEncoding):
    """What `NumericTokenizer.__call__` returns: a `transformers.BatchEncoding` with ``input_ids``,
    ``numeric_values`` and ``attention_mask`` (``[B, S]`` tensors by default; ``model(**encoding)`` works), plus the
    attribute ``number_texts``.

    ``number_texts[b][k]`` is the text of the k-th number of row b as it was written (``"43.60"``,
    ``"−2"``, ``"1,000"``). It is an attribute, not a key, so that it never reaches the model; pass the
    whole encoding to `NumericTokenizer.batch_decode` to get the texts back, or give
    ``number_texts=encoding.number_texts`` when decoding what `causalqwen.generate` made from it. The encoding of
    one text as lists (``tokenizer("one text")``) holds flat rows, and ``number_texts[k]`` is its k-th number.

    ``NumericEncoding(mapping)`` builds one from a plain mapping, as transformers' ``Trainer`` rebuilds every
    mapping it moves to the device (``type(batch)({...})``): the keys are kept, and ``number_texts`` is None
    (not known; decoding then writes the values).
    """

    def __init__(self, data: Mapping | None = None, number_texts: list | None = None):
        super().__init__(data)
        self.number_texts = number_texts

    def __getstate__(self):
        return super().__getstate__() | {"number_texts": self.number_texts}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.number_texts = state.get("number_texts")


class NumericTokenizer(DecodingMixin, TokenizerMixin):
    """Wrap a Hugging Face tokenizer so that every number becomes one ``<NUM>`` token and a value.

    Args:
        hf_tokenizer: a Hugging Face tokenizer (``PreTrainedTokenizerBase``), for example the Qwen2 tokenizer.
            Its encoding of a text must be the concatenation of the encodings of the pieces between numbers,
            which holds for byte-level BPE tokenizers without an added prefix space, such as Qwen2's.
        num_token: the text of the number token.
        padding_side: where batches are padded (`padding_side`): ``"left"`` by default, as batched generation
            needs (`causalqwen.files.data.collate` pads training batches on the right itself). It is this wrapper's
            own setting: ``hf_tokenizer``'s is left as it is, and so is every other wrapper of it.

    ``num_token`` is added to ``hf_tokenizer`` **in place** as a special token, so its id is K =
    ``len(hf_tokenizer)`` before the call and the wrapped tokenizer has K + 1 tokens afterwards. A tokenizer
    that already holds ``num_token`` as a special added token (for example one written by `save_pretrained`)
    is used as it is.

    Text between numbers is encoded with the special-token matching of the wrapped tokenizer switched off
    (``split_special_tokens=True``): a literal ``"<NUM>"``, ``"<|endoftext|>"`` or ``"<|im_start|>"`` typed in
    the text is encoded as ordinary characters and never becomes a special token. Special tokens are meant to
    be inserted as ids, not as text.

    It is not a ``PreTrainedTokenizerBase`` (decision D15 above) but speaks its interface (``return_tensors``,
    special tokens, ``convert_ids_to_tokens``, ``decode`` of plain ids, ...). It works where transformers takes a
    tokenizer and saves or reads it (``Trainer(processing_class=...)``, ``AutoTokenizer`` with
    ``trust_remote_code``), and `causalqwen.integrations.pipelines.NumericTextGenerationPipeline` is the
    ``"text-generation"`` pipeline that uses it.
    """

    encoding_class = NumericEncoding  # what a call returns (the mixins build theirs through it)

    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase, num_token: str = "<NUM>", padding_side: str = "left"):
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
        if padding_side not in ("left", "right"):
            raise ValueError(f'padding_side must be "left" or "right", got {padding_side!r}')
        self._hf_tokenizer = hf_tokenizer
        self._num_token = num_token
        self._num_token_id = add_num_token(hf_tokenizer, num_token)
        self._padding_side = padding_side

    # -- properties (loading, saving and the attributes transformers reads: `TokenizerMixin`) --

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

    def __len__(self) -> int:
        """The number of tokens, ``<NUM>`` included (K + 1 for a tokenizer of K tokens)."""
        return len(self._hf_tokenizer)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({type(self._hf_tokenizer).__name__}, num_token={self._num_token!r}, "
            f"num_token_id={self._num_token_id}, size={len(self)})"
        )

    # -- encoding ----------------------------------------------------------------------------

    def _encode_texts(self, texts: list[str], max_length: int | None) -> list[EncodedRow]:
        """The rows of checked texts; with ``max_length``, of prefixes long enough for at least the first ``max_length``
        tokens of the whole text (`causalqwen.tokenization.bounded_prefixes`, grown while a prefix gives too few),
        which the caller keeps (`causalqwen.tokenization.first_tokens`).

        Python's cyclic garbage collector is paused meanwhile (if it runs): the rows are up to hundreds of thousands
        of lists and tuples, none in a cycle, that its passes would traverse again and again (a third of the time of a
        2 MB call); it resumes afterwards and then finds any cycle made in between."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            if max_length is None:
                if sum(map(len, texts)) < CHUNK_CHARACTERS:  # a small batch: one call of the wrapped tokenizer
                    plan = EncodingPlan(self._hf_tokenizer, split_texts(texts), self._num_token, self._num_token_id)
                    return plan.rows(plan.encode())
                return self._encode_chunks(texts, None)
            budget = 16 * max_length + 64  # characters; most tokens are far shorter
            cuts: list[tuple[int, bool]] = []  # (end, exact) of each text's prefix
            rows = self._encode_chunks(texts, budget, cuts)
            for index, text in enumerate(texts):
                grown = budget
                end, exact = cuts[index]
                while end < len(text) and len(rows[index].input_ids) <= max_length + (
                    0 if exact else UNSAFE_CUT_MARGIN
                ):
                    grown *= 4
                    grown_cuts: list[tuple[int, bool]] = []
                    pieces = bounded_prefixes([text], grown, grown_cuts)
                    (end, exact) = grown_cuts[0]
                    plan = EncodingPlan(self._hf_tokenizer, pieces, self._num_token, self._num_token_id)
                    rows[index] = plan.rows(plan.encode())[0]
            return rows
        finally:
            if collecting:
                gc.enable()

    def _encode_chunks(self, texts: list[str], budget: int | None, cuts: list | None = None) -> list[EncodedRow]:
        """The rows of ``texts`` (``budget`` None), or of their prefixes of about ``budget`` characters
        (`causalqwen.tokenization.bounded_prefixes`, which appends to ``cuts``).

        A batch of more than `CHUNK_CHARACTERS` characters goes in chunks of about that many (`chunks_of`), through
        two threads: while a second thread has the wrapped tokenizer encode chunk k (its Rust code releases the
        GIL and spreads the texts over every core), this one reads the numbers of chunk k + 1 and then puts
        the rows of chunk k - 1 together: where a core is free, the grammar's time (one core, the GIL held) overlaps
        the wrapped tokenizer's instead of adding to it. The distinct runs between numbers that earlier chunks
        encoded one by one are not encoded again (`EncodingPlan`). Each text's row is the one it has alone."""
        chunks = chunks_of(texts, CHUNK_CHARACTERS) if sum(map(len, texts)) >= CHUNK_CHARACTERS else [texts]
        if len(chunks) <= 1:
            pieces = split_texts(texts) if budget is None else bounded_prefixes(texts, budget, cuts)
            plan = EncodingPlan(self._hf_tokenizer, pieces, self._num_token, self._num_token_id)
            return plan.rows(plan.encode())
        rows: list[EncodedRow] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="NumericTokenizer") as encoder:
            before = None  # the plan of the chunk before and its ids (a future)
            ids_of_runs: dict[str, list[int] | None] = {}  # each distinct run between numbers encoded once
            for chunk in chunks:
                pieces = split_texts(chunk) if budget is None else bounded_prefixes(chunk, budget, cuts)
                plan = EncodingPlan(
                    self._hf_tokenizer, pieces, self._num_token, self._num_token_id, ids_of_runs=ids_of_runs
                )
                ids = encoder.submit(plan.encode)
                if before is not None:
                    rows.extend(before[0].rows(before[1].result()))
                before = (plan, ids)
            rows.extend(before[0].rows(before[1].result()))
        return rows

    def __call__(
        self,
        texts: str | list[str],
        padding: bool | str = True,
        max_length: int | None = None,
        padding_side: str | None = None,
        truncation: bool | str = False,
        *,
        return_tensors=TENSORS_FOR_A_BATCH,
        return_attention_mask: bool = True,
        add_special_tokens: bool | None = None,
    ) -> NumericEncoding:
        """Encode a batch of texts, as transformers' tokenizers do, with the values beside the ids.

        Args:
            texts: a non-empty list of str (a batch), or one str (one text: Python lists unless ``return_tensors``
                asks for tensors, as transformers' tokenizers return it).
            padding: ``True`` or ``"longest"`` pads to the longest row; ``"max_length"`` pads to
                ``max_length``; ``False`` (or ``"do_not_pad"``) pads nothing: then the rows must have the
                same length, unless ``return_tensors=None`` (lists of different lengths, as transformers').
            max_length: the longest allowed row (a positive int), or None for no limit.
            padding_side: ``"right"`` or ``"left"``; None (default) takes the tokenizer's `padding_side`
                (``"left"`` unless set otherwise, what batched generation needs).
            truncation: if True (or ``"longest_first"``), rows longer than ``max_length`` keep their first
                ``max_length`` tokens; if False (or ``"do_not_truncate"``), such a row is an error.
            return_tensors: ``"pt"`` for torch tensors (the default for a list of texts: the model takes
                tensors), ``"np"`` for numpy arrays, None for Python lists (the values as Python floats; the default
                for one str, as transformers': flat lists, ``input_ids`` a list of ints).
            return_attention_mask: leave ``attention_mask`` out when False.
            add_special_tokens: no special token is ever added; True is refused where the wrapped tokenizer would.

        Returns:
            A `NumericEncoding`: ``input_ids`` (int64, [B, S]), ``numeric_values`` (float32, [B, S]) and
            ``attention_mask`` (int64, [B, S], 1 on real tokens and 0 on padding; padded positions hold
            the pad id and the value 0.0), and ``number_texts``, the surface text of each row's
            numbers, which `batch_decode` writes back. For one str with lists, the rows are flat (``input_ids``
            [S], ``numeric_values`` [S], ``attention_mask`` [S], ``number_texts`` the list of its numbers' texts),
            as ``datasets.map(tokenizer)`` and transformers' collators take a row. Any other keyword is a
            ``TypeError`` naming it.
        """
        one_text = isinstance(texts, str)
        if return_tensors is TENSORS_FOR_A_BATCH:
            return_tensors = None if one_text else "pt"
        padding_side = self._padding_side if padding_side is None else padding_side
        texts, padding, truncation = check_call_arguments(
            texts,
            padding,
            max_length,
            padding_side,
            truncation,
            return_tensors=return_tensors,
            return_attention_mask=return_attention_mask,
            add_special_tokens=add_special_tokens,
            hf_tokenizer=self._hf_tokenizer,
        )
        max_length = int(max_length) if max_length is not None else None
        rows = self._encode_texts(texts, max_length + 1 if max_length is not None else None)
        data, number_texts = batch_of_rows(
            rows,
            num_token_id=self._num_token_id,
            max_length=max_length,
            truncation=truncation,
            padding=padding,
            padding_side=padding_side,
            return_tensors=return_tensors,
            pad_token_id=functools.partial(getattr, self._hf_tokenizer, "pad_token_id"),  # read only to pad
        )
        encoding = NumericEncoding(data, number_texts)
        if not return_attention_mask:
            del encoding["attention_mask"]
        if one_text and return_tensors is None:  # one text as lists: its row, flat
            return NumericEncoding({key: rows[0] for key, rows in encoding.items()}, encoding.number_texts[0])
        return encoding


class EncodingPlan:
    """How the ids of texts are made, given their numbers, in three steps: this plan (the runs between numbers, and
    what the wrapped tokenizer is given), `encode` (every call of the wrapped tokenizer, and nothing else: a second
    thread may run it while this one reads the numbers of other texts), and `rows` (the rows put together).

    A text that holds a special token's text (a typed ``"<|endoftext|>"``) takes the reference path
    (`encode_by_runs`). The others, with a Rust tokenizer, take one of two
    equivalent ways (the Rust tokenizer encodes the text between two ``<NUM>`` on its own either way):

    * each text with its numbers replaced by ``<NUM>``, one Rust encoding per text;
    * each *distinct* text run between numbers once, the rows put together from those, when at most
      half the runs are distinct: number-dense texts ("1-2-3-...", tables, a batch of similar lines),
      where the Rust tokenizer would otherwise spend most of its time on ``<NUM>`` after ``<NUM>``.
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        pieces: list[TextPieces],
        num_token: str,
        num_token_id: int,
        *,
        ids_of_runs: dict[str, list[int] | None] | None = None,
    ):
        self.hf_tokenizer, self.pieces, self.num_token, self.num_token_id = (
            hf_tokenizer,
            pieces,
            num_token,
            num_token_id,
        )
        self.ids_of_runs = {} if ids_of_runs is None else ids_of_runs
        self.backend = getattr(hf_tokenizer, "backend_tokenizer", None)  # None for a slow (Python) tokenizer
        if self.backend is not None:
            special_text = _any_of(
                tuple(token.content for token in hf_tokenizer.added_tokens_decoder.values() if token.special)
            )
            plain = [special_text.search(text_pieces.text) is None for text_pieces in pieces]
        else:
            plain = [False] * len(pieces)
        self.quick = [index for index, ok in enumerate(plain) if ok]
        self.slow = [index for index, ok in enumerate(plain) if not ok]
        quick_runs = [pieces[index].runs for index in self.quick]
        runs_count = sum(len(runs) for runs in quick_runs)
        new_runs = [
            run
            for run in dict.fromkeys(run for runs in quick_runs for run in runs if run)
            if run not in self.ids_of_runs
        ]
        self.by_runs = 2 * len(new_runs) <= runs_count
        if self.by_runs:
            self.rust_texts = new_runs
            self.ids_of_runs.update(dict.fromkeys(new_runs))  # their ids come in rows
        else:
            self.rust_texts = [num_token.join(runs) for runs in quick_runs]

    def encode(self) -> tuple[list[list[int]], list[list[int]]]:
        """Every call of the wrapped tokenizer: the ids of `rust_texts`, and the rows of the texts that take the
        reference path (`encode_by_runs`).

        The `rust_texts` go in one call of the Rust tokenizer, whose added-token matching splits each text at
        ``<NUM>`` and encodes the pieces separately: the ids of `encode_by_runs` at a fraction of the calls.
        Truncation and padding are off, as the wrapped tokenizer sets them for a call without either."""
        rust_ids = []
        if self.rust_texts:
            backend = self.backend
            with SPECIAL_TOKEN_FLAG_LOCK:  # special_token_matching's lock, taken here without a call: no other thread
                previous = backend.encode_special_tokens  # flips the flag while <NUM> is matched
                backend.encode_special_tokens = False
                try:
                    if backend.truncation is not None:
                        backend.no_truncation()
                    if backend.padding is not None:
                        backend.no_padding()
                    if len(self.rust_texts) <= ONE_BY_ONE:  # waking the Rust thread pool costs more than a few texts
                        encodings = [backend.encode(text, add_special_tokens=False) for text in self.rust_texts]
                    else:
                        encodings = backend.encode_batch(self.rust_texts, add_special_tokens=False)
                finally:
                    backend.encode_special_tokens = previous
            rust_ids = [encoding.ids for encoding in encodings]
        slow_ids = (
            encode_by_runs(self.hf_tokenizer, [self.pieces[index].runs for index in self.slow], self.num_token_id)
            if self.slow
            else []
        )
        return rust_ids, slow_ids

    def rows(self, encoded: tuple[list[list[int]], list[list[int]]]) -> list[EncodedRow]:
        """The row of every text, from what `encode` gave: its ids (when the runs were encoded one by one, put
        together with the ids of runs that plans before this one encoded: their `rows` must come first), and each
        number's value at its ``<NUM>``, 0.0 elsewhere, with the number texts as written."""
        rust_ids, slow_ids = encoded
        num_token_id = self.num_token_id
        id_rows: list[list[int] | None] = [None] * len(self.pieces)
        if self.by_runs:
            ids_of = self.ids_of_runs
            ids_of.update(zip(self.rust_texts, rust_ids))
            rust_ids = [
                ids_between_numbers(runs, [ids_of[run] for run in runs if run], num_token_id)
                for runs in (self.pieces[index].runs for index in self.quick)
            ]
        for index, ids in zip(self.quick, rust_ids):
            id_rows[index] = ids
        for index, ids in zip(self.slow, slow_ids):
            id_rows[index] = ids
        rows = []
        for ids, pieces in zip(id_rows, self.pieces):
            count = ids.count(num_token_id)
            if count != len(pieces.numbers):
                raise RuntimeError(
                    f"the wrapped tokenizer gave {count} <NUM> ids for {len(pieces.numbers)} numbers; it must encode "
                    f"{self.num_token!r} as its one added token"
                )
            values = [0.0] * len(ids)  # [S]
            position = -1
            for number in pieces.numbers:
                position = ids.index(num_token_id, position + 1)
                values[position] = number.value
            rows.append(EncodedRow(ids, values, [number.text for number in pieces.numbers]))
        return rows


def ids_between_numbers(runs: list[str], encoded_runs: list[list[int]], num_token_id: int) -> list[int]:
    """The ids of a text: the ids of its non-empty ``runs`` (``encoded_runs``, in order), with ``num_token_id``
    between every two runs, where a number was."""
    encoded = iter(encoded_runs)
    ids: list[int] = []
    for index, run in enumerate(runs):
        if index:
            ids.append(num_token_id)
        if run:
            ids.extend(next(encoded))
    return ids


def encode_by_runs(
    hf_tokenizer: PreTrainedTokenizerBase, runs_per_text: list[list[str]], num_token_id: int
) -> list[list[int]]:
    """The reference path: the text runs between numbers of every text encoded in one call, special-token
    matching off (a typed ``"<NUM>"`` or ``"<|endoftext|>"`` stays text,
    `causalqwen.integrations.wrapped_tokenizer.encode_text_runs`), then ``<NUM>`` ids put between them."""
    encoded = iter(encode_text_runs(hf_tokenizer, [run for runs in runs_per_text for run in runs if run]))
    return [ids_between_numbers(runs, [next(encoded) for run in runs if run], num_token_id) for runs in runs_per_text]


@functools.lru_cache(maxsize=64)
def _any_of(texts: tuple[str, ...]) -> re.Pattern:
    """A compiled pattern that finds any of ``texts`` (none if empty)."""
    return re.compile("|".join(map(re.escape, texts)) or "(?!)")


ONE_BY_ONE = 4  # `EncodingPlan.encode` encodes at most this many texts one by one, more in a batch
