"""`NumericTokenizer`: numeric-aware tokenization (`causalqwen.tokenization`) behind transformers' tokenizer interface.

Decision D15 (transformers' tokenizer interface): `NumericTokenizer` wraps a transformers tokenizer and speaks
its interface itself, not as a ``PreTrainedTokenizerFast`` subclass, whose inherited entry points (``encode_plus``,
``pad``, ``prepare_for_model``, the Rust backend) would each return ids without values: a call the wrapper lacks
is an ``AttributeError``, never a silently lost number. Where transformers' defaults would lose values it differs,
and says so: tensors (``"pt"``) and padding for a list of texts, left padding, ``decode`` skipping special tokens,
``encode`` -> (ids, values). Where it loses nothing it follows transformers: one str gives its row as Python lists,
``decode`` of a batch one text per row, ``tokenize`` the token strings.

The encoding and decoding algorithms are the section's (`causalqwen.tokenization`). Around them: the checks of
every argument (`causalqwen.checks.tokenizer_door`), what is asked of the wrapped tokenizer
(`causalqwen.integrations.wrapped_tokenizer`), loading, saving and the attributes transformers reads
(`causalqwen.integrations.tokenizer_mixin`), and the batch it returns (`causalqwen.integrations.numeric_encoding`).
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from transformers import PreTrainedTokenizerBase

from ..checks.tokenizer_door import (batch_rows, check_call_arguments, check_decode_arguments, check_flags,
                                     check_length, check_max_length, check_prompt_length, check_text, is_batch,
                                     is_empty, kept_positions)
from ..numbers import NumberMatch, find_numbers, find_numbers_in
from ..tokenization import (CHUNK_CHARACTERS, RETURN_TENSORS, UNSAFE_CUT_MARGIN, EncodedRow, as_tensor_type,
                            bounded_prefix, chunks_of, decoded_pieces, encoded_row, first_tokens, padded_lists,
                            texts_to_encode)
from ..writing import check_resolution, decoded_spaces, join_at_split, join_spaced
from .numeric_encoding import TENSORS_FOR_A_BATCH, NumberTextsSeen, NumericEncoding
from .tokenizer_mixin import TokenizerMixin
from .wrapped_tokenizer import EncodingPlan, add_num_token, decode_run

__all__ = ["NumericTokenizer"]


class NumericTokenizer(TokenizerMixin):
    """Wrap a Hugging Face tokenizer so that every number becomes one ``<NUM>`` token and a value.

    Args:
        hf_tokenizer: a Hugging Face tokenizer (``PreTrainedTokenizerBase``), for example the Qwen2 tokenizer.
            Its encoding of a text must be the concatenation of the encodings of the pieces between numbers,
            which holds for byte-level BPE tokenizers without an added prefix space, such as Qwen2's.
        num_token: the text of the number token.
        padding_side: where batches are padded (`padding_side`), set on ``hf_tokenizer`` too: ``"left"`` by
            default, as batched generation needs (`causalqwen.files.data.collate` pads training batches on the
            right itself).

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
        hf_tokenizer.padding_side = padding_side
        self._number_texts_seen = NumberTextsSeen()

    def __getstate__(self) -> dict:
        """Pickled (``datasets`` hashes a mapped function with its tokenizer) without what the calls so far
        encoded: a copy starts with an empty `number_texts_seen`, so the same tokenizer hashes the same."""
        return self.__dict__ | {"_number_texts_seen": NumberTextsSeen()}

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

    @property
    def number_texts_seen(self) -> NumberTextsSeen:
        """How the numbers of the last texts this tokenizer encoded alone were written (`NumberTextsSeen`)."""
        return self._number_texts_seen

    def __len__(self) -> int:
        """The number of tokens, ``<NUM>`` included (K + 1 for a tokenizer of K tokens)."""
        return len(self._hf_tokenizer)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({type(self._hf_tokenizer).__name__}, num_token={self._num_token!r}, "
                f"num_token_id={self._num_token_id}, size={len(self)})")

    # -- encoding ----------------------------------------------------------------------------

    def encode(
        self, text: str, max_length: int | None = None, return_number_texts: bool = False, **unknown
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
            TypeError: ``text`` is not a str, or a keyword of transformers' ``encode`` (``add_special_tokens``), whose
                callers expect ids alone.
            ValueError: the text holds a lone surrogate (not valid Unicode: the message names the
                character), or it is longer than `MAX_TEXT_CHARS` and no ``max_length`` bounds it.
        """
        if unknown:  # transformers' encode(text, add_special_tokens=...) returns ids alone: its caller loses values
            raise TypeError(
                f"NumericTokenizer.encode() got unexpected keyword argument(s) {sorted(unknown)}: it returns "
                "(ids, values), not the ids alone that transformers' encode returns; a caller that passes ids only "
                "loses every number "
                "(lm-eval: use --model causalqwen, python -m causalqwen.app.lm_eval_adapter, not --model hf)"
            )
        check_text(text)
        max_length = check_max_length(max_length)
        check_length(text, max_length)
        row = self._encode_texts([text], max_length)[0]
        return tuple(row) if return_number_texts else (row.input_ids, row.numeric_values)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings, as transformers' ``tokenize`` gives them: the wrapped tokenizer's
        tokens of the text between numbers (``"Ġcosts"``), and ``num_token`` (``"<NUM>"``) for each number. The
        tokens of `encode` (`convert_ids_to_tokens` of its ids); the values are not in strings: `encode` gives them.

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: as `encode`.
        """
        return self.convert_ids_to_tokens(self.encode(text)[0])

    def _encode_texts(self, texts: list[str], max_length: int | None) -> list[EncodedRow]:
        """The rows of checked texts; with ``max_length``, of prefixes long enough for that many tokens
        (`causalqwen.tokenization.bounded_prefix`, grown while a prefix gives too few)."""
        if max_length is None:
            if sum(map(len, texts)) < CHUNK_CHARACTERS:  # a small batch: one call of the wrapped tokenizer
                return self._encode_whole(texts, find_numbers_in(texts))
            return self._encode_chunks(texts, None)
        budget = 16 * max_length + 64  # characters; most tokens are far shorter
        plans: list[tuple[int, list[NumberMatch], bool]] = []
        rows = self._encode_chunks(texts, budget, plans)
        for index, text in enumerate(texts):
            grown = budget
            end, _, exact = plans[index]
            while end < len(text) and len(rows[index].input_ids) <= max_length + (0 if exact else UNSAFE_CUT_MARGIN):
                grown *= 4
                end, found, exact = bounded_prefix(text, grown)
                rows[index] = self._encode_whole([text[:end]], [found])[0]
        return [first_tokens(row, max_length, self._num_token_id) for row in rows]

    def _encode_chunks(self, texts: list[str], budget: int | None, plans: list | None = None) -> list[EncodedRow]:
        """The rows of ``texts``, or of their prefixes of about ``budget`` characters (`texts_to_encode`).

        A batch of more than `CHUNK_CHARACTERS` characters goes in chunks of about that many (`chunks_of`), through
        two threads: while a second thread has the wrapped tokenizer encode chunk k (its Rust code releases the
        GIL and spreads the texts over every core), this one reads the numbers of chunk k + 1 and then puts
        the rows of chunk k - 1 together: where a core is free, the grammar's time (one core, the GIL held) overlaps
        the wrapped tokenizer's instead of adding to it. The distinct runs between numbers that earlier chunks
        encoded one by one are not encoded again (`EncodingPlan`). Each text's row is the one it has alone."""
        chunks = chunks_of(texts, CHUNK_CHARACTERS)
        if len(chunks) <= 1:
            return self._encode_whole(*texts_to_encode(texts, budget, plans))
        rows: list[EncodedRow] = []
        # Python's cyclic garbage collector is paused meanwhile (if it runs): the rows are hundreds of thousands of
        # lists and tuples, none in a cycle, that its passes would traverse again and again (a third of the time
        # of a 2 MB call); it resumes afterwards and then finds any cycle made in between.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="NumericTokenizer") as encoder:
                before = None  # the plan of the chunk before, its ids (a future) and its numbers
                ids_of_runs: dict[str, list[int] | None] = {}  # each distinct run between numbers encoded once
                for chunk in chunks:
                    encoded, found = texts_to_encode(chunk, budget, plans)
                    plan = EncodingPlan(self._hf_tokenizer, encoded, found, self._num_token, self._num_token_id,
                                        ids_of_runs=ids_of_runs)
                    ids = encoder.submit(plan.encode)
                    if before is not None:
                        rows.extend(self._rows(before[0].id_rows(before[1].result()), before[2]))
                    before = (plan, ids, found)
                rows.extend(self._rows(before[0].id_rows(before[1].result()), before[2]))
        finally:
            if collecting:
                gc.enable()
        return rows

    def _encode_whole(self, texts: list[str], found: list[list[NumberMatch]]) -> list[EncodedRow]:
        """Encode every text, given its numbers: the text between them by the wrapped tokenizer, in one call
        (`EncodingPlan`), and each number's value at its ``<NUM>`` (`causalqwen.tokenization.encoded_row`)."""
        plan = EncodingPlan(self._hf_tokenizer, texts, found, self._num_token, self._num_token_id)
        id_rows = plan.id_rows(plan.encode())
        return [encoded_row(ids, numbers_found, self._num_token_id, self._num_token)
                for ids, numbers_found in zip(id_rows, found)]

    def _rows(self, id_rows: list[list[int]], found: list[list[NumberMatch]]) -> list[EncodedRow]:
        """The row of each text from its ids and numbers (`causalqwen.tokenization.encoded_row`)."""
        return [encoded_row(ids, numbers_found, self._num_token_id, self._num_token)
                for ids, numbers_found in zip(id_rows, found)]

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
        padding_side = self._hf_tokenizer.padding_side if padding_side is None else padding_side
        texts, padding, truncation = check_call_arguments(texts, padding, max_length, padding_side, truncation)
        if return_tensors not in RETURN_TENSORS:
            raise ValueError(f'return_tensors must be "pt", "np" or None, got {return_tensors!r}')
        check_flags(self._hf_tokenizer, return_attention_mask, add_special_tokens)
        max_length = int(max_length) if max_length is not None else None
        rows = self._encode_texts(texts, max_length + 1 if max_length is not None else None)
        if max_length is not None:
            for index, row in enumerate(rows):
                if len(row.input_ids) > max_length and not truncation:
                    raise ValueError(
                        f"text {index} has more than max_length={max_length} tokens; pass truncation=True to cut it"
                    )
            rows = [first_tokens(row, max_length, self._num_token_id) for row in rows]
        encoding = self._pad(rows, padding, max_length, padding_side, return_tensors)
        if not return_attention_mask:
            del encoding["attention_mask"]
        if len(rows) == 1:  # a text encoded alone (a prompt): how its numbers were written, for a streamer
            self._number_texts_seen.remember(encoding["input_ids"][0], encoding["numeric_values"][0],
                                             encoding.number_texts[0])
        if one_text and return_tensors is None:  # one text as lists: its row, flat
            return NumericEncoding({key: rows[0] for key, rows in encoding.items()}, encoding.number_texts[0])
        return encoding

    def _pad(self, rows: list[EncodedRow], padding, max_length, padding_side: str, return_tensors) -> NumericEncoding:
        """The rows padded to the width ``padding`` gives (`padded_lists`), as ``return_tensors`` asks; the pad id
        is needed only when a row is shorter than that width."""
        lengths = [len(row.input_ids) for row in rows]
        if padding is False:
            if len(set(lengths)) > 1 and return_tensors is not None:
                raise ValueError(f"padding=False needs texts of equal token length, got lengths {lengths} (or pass "
                                 "return_tensors=None for lists of different lengths)")
            width = None
        elif padding == "max_length":
            width = max_length
        else:
            width = max(lengths)
        padded = width is not None and any(length < width for length in lengths)
        pad_token_id = self._hf_tokenizer.pad_token_id if padded else 0
        if pad_token_id is None:
            raise ValueError(
                "the wrapped tokenizer has no pad token; set tokenizer.pad_token (for example to tokenizer.eos_token) "
                "before padding a batch"
            )
        data = padded_lists([row.input_ids for row in rows], [row.numeric_values for row in rows], width,
                            pad_token_id, padding_side)
        return NumericEncoding(as_tensor_type(data, return_tensors), [row.number_texts for row in rows])

    # -- decoding ----------------------------------------------------------------------------

    def decode(
        self,
        input_ids,
        numeric_values=None,
        skip_special_tokens: bool = True,
        out_of_vocab: str = "raise",
        *,
        number_texts=None,
        number_resolution=None,
    ) -> str | list[str]:
        """Turn ``(input_ids, numeric_values)`` back into text; a batch ``[B, S]`` into one text per row, as
        transformers' ``decode`` does (`batch_decode`).

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
            input_ids: a list of ints or a 1-D integer tensor/array (one text); or a 2-D tensor/array or a list of
                rows (a batch: the list of the rows' texts, each row as `batch_decode` decodes it).
            numeric_values: a list of numbers or a 1-D tensor/array of the same length (for a batch, of the same
                shape); None (plain ids, as
                transformers' ``decode(ids)``) writes each ``<NUM>`` as the literal ``num_token`` (``"<NUM>"``),
                never as a number: the values are not in the ids. ``model.generate(...,
                return_dict_in_generate=True)`` returns them: ``decode(out.sequences[0], out.numeric_values[0])``.
            skip_special_tokens: drop special tokens other than ``<NUM>`` from the text.
            out_of_vocab: what to do with an id at or beyond ``len(self)`` -- one of the model's
                reserved rows, which an untrained model can predict: ``"raise"`` (default) or
                ``"mark"``, which writes it as ``<unk:ID>``.
            number_texts: the surface texts of the first ``<NUM>`` positions, a list of str; each must
                read as the value at its position (for a batch, one such list per row).
            number_resolution: how a generated number is written (`causalqwen.writing`): None, its shortest
                float32 text (``2.5007427``); a power of ten, the value rounded to it in the text only (``0.01``:
                ``2.50``); ``"prompt"``, the finest of the ``number_texts``' finest resolution, the unit and three
                significant digits of the value (`causalqwen.writing.resolution_for`: ``2.50``).

        Raises:
            TypeError: wrong element types.
            ValueError: the lengths differ, an id is negative or (with ``out_of_vocab="raise"``)
                at least ``len(self)``, a ``<NUM>`` value is NaN or infinite, or ``number_texts`` has
                more texts than there are ``<NUM>`` or a text that does not read as its value.
        """
        if numeric_values is None and number_texts is not None:
            raise TypeError("number_texts needs numeric_values: pass the values beside the ids")
        if is_batch(input_ids):
            if numeric_values is not None and not is_batch(numeric_values):
                raise ValueError(f"input_ids is a batch of {len(input_ids)} rows but numeric_values is not: pass one "
                                 "row of values per row of ids (the same shape), or decode one row")
            return self.batch_decode(input_ids, numeric_values, skip_special_tokens, out_of_vocab,
                                     number_texts=number_texts, number_resolution=number_resolution)
        ids, values, surfaces = check_decode_arguments(input_ids, numeric_values, skip_special_tokens, out_of_vocab,
                                                       number_texts, size=len(self))
        pieces, _ = self._pieces(ids, values if numeric_values is not None else None, surfaces, skip_special_tokens,
                                 split=len(ids), resolution=number_resolution)
        return join_spaced(pieces, decoded_spaces(pieces))[0]

    def decode_continuation(
        self,
        input_ids,
        numeric_values,
        prompt_length: int,
        skip_special_tokens: bool = True,
        out_of_vocab: str = "raise",
        *,
        number_texts=None,
        number_resolution=None,
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
        ids, values, surfaces = check_decode_arguments(input_ids, numeric_values, skip_special_tokens, out_of_vocab,
                                                       number_texts, size=len(self))
        prompt_length = check_prompt_length(prompt_length, len(ids))
        pieces, split = self._pieces(ids, values, surfaces, skip_special_tokens, split=prompt_length,
                                     resolution=number_resolution)
        return join_at_split(pieces, split)

    def _pieces(self, ids: list[int], values: list[float] | None, surfaces: list[str], skip_special_tokens: bool, *,
                split: int, resolution) -> tuple[list[tuple[str, str]], int]:
        """The pieces of a checked row (`causalqwen.tokenization.decoded_pieces`), its runs of ordinary ids decoded
        by the wrapped tokenizer, its generated numbers written at ``resolution`` (checked here)."""
        resolution = check_resolution(resolution)

        def decode_text(run: list[int]) -> str:
            return decode_run(self._hf_tokenizer, run, skip_special_tokens)

        return decoded_pieces(ids, values, surfaces, num_token_id=self._num_token_id, num_token=self._num_token,
                              size=len(self), decode_run=decode_text, split=split, resolution=resolution)

    def batch_decode(
        self,
        input_ids,
        numeric_values=None,
        skip_special_tokens: bool = True,
        out_of_vocab: str = "raise",
        *,
        number_texts=None,
        number_resolution=None,
    ) -> list[str]:
        """Decode each row with `decode`.

        Either the whole encoding, ``batch_decode(tokenizer(texts)) == texts``, or the output of
        `causalqwen.generate` (its ``attention_mask`` drops the padding, its prompts' numbers take
        their surface texts from ``number_texts=encoding.number_texts``), or ``input_ids`` [B, S] and
        ``numeric_values`` [B, S] as tensors, arrays or lists of rows. ``number_texts[b]`` lists the
        surface texts of the first ``<NUM>`` of row b (see `decode`). ``input_ids`` alone (plain ids, as a
        ``model.generate`` without ``return_dict_in_generate=True`` returns them) writes each ``<NUM>`` as the
        literal ``num_token``: the values are not in the ids (see `decode`). One row (a 1-D tensor, a list of ints,
        or the encoding of one text as lists, ``tokenizer("one text")``) gives a list of one text, as transformers'
        ``batch_decode`` gives it.
        """
        if isinstance(input_ids, Mapping) and numeric_values is None:
            key = "input_ids" if "input_ids" in input_ids else "sequences"
            if key in input_ids and not is_batch(input_ids[key]):  # the encoding of one text: its row, flat
                encoding = input_ids
                number_texts = getattr(encoding, "number_texts", None) if number_texts is None else number_texts
                input_ids = {name: [row] for name, row in encoding.items()}
                number_texts = None if number_texts is None else [number_texts]
        elif not isinstance(input_ids, Mapping) and not is_batch(input_ids) and not is_empty(input_ids):
            return [self.decode(input_ids, numeric_values, skip_special_tokens, out_of_vocab,
                                number_texts=number_texts, number_resolution=number_resolution)]
        if isinstance(number_texts, (list, tuple)) and any(isinstance(texts, str) for texts in number_texts):
            raise TypeError("number_texts of a batch holds one list of str per row (for one row: [['12.50', ...]]), "
                            f"got a str in {number_texts!r:.80}")
        texts = []
        for row, (ids, values, keep, surfaces) in enumerate(batch_rows(input_ids, numeric_values, number_texts)):
            try:
                if keep is not None:
                    ids, values = kept_positions(ids, values, keep)
                texts.append(self.decode(ids, values, skip_special_tokens, out_of_vocab, number_texts=surfaces,
                                         number_resolution=number_resolution))
            except ValueError as error:
                raise ValueError(f"row {row}: {error}") from None
        return texts
