"""Decoding for `causalqwen.integrations.tokenizer.NumericTokenizer`: ids and values back to text.

`DecodingMixin` gives the tokenizer ``decode``, ``decode_continuation`` and ``batch_decode``, as transformers'
tokenizers have them, with the values beside the ids. The arguments are checked at the tokenizer's door
(`causalqwen.checks.tokenizer_door`); the pieces of a row and the spaces that keep every number reading as itself
are the section's (`causalqwen.tokenization.decoded_pieces`, `causalqwen.writing`); the runs of ordinary ids are
decoded by the wrapped tokenizer (`causalqwen.integrations.wrapped_tokenizer.decode_run`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..checks.tokenizer_door import (
    batch_rows,
    check_decode_arguments,
    check_number_text_count,
    check_prompt_length,
    checked_number_texts,
    is_batch,
    is_empty,
    kept_positions,
)
from ..tokenization import decoded_pieces
from ..writing import check_resolution, decoded_spaces, join_at_split, join_spaced
from .wrapped_tokenizer import decode_run

__all__ = ["DecodingMixin"]


class DecodingMixin:
    """``decode``, ``decode_continuation`` and ``batch_decode`` for a class with ``_hf_tokenizer`` (the wrapped
    tokenizer), ``_num_token``, ``_num_token_id`` and ``len()`` (its number of tokens)."""

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
            number_texts: the surface texts of the first ``<NUM>`` positions, a list of str; each must be one
                number of the grammar that reads as the value at its position (for a batch, one such list per
                row). Where the prompt's end is known (`decode_continuation`'s ``prompt_length``, `batch_decode` of
                an encoding or a generation output) they name exactly the prompt's ``<NUM>``, one text each.
            number_resolution: how a generated number is written (`causalqwen.writing`): None, its shortest
                float32 text (``2.5007427``); a power of ten, the value rounded to it in the text only (``0.01``:
                ``2.50``); ``"prompt"`` (decision D17), the finer of the ``number_texts``' finest resolution (the
                unit when they are empty) and two significant digits of the value, ``h = min(h_prompt,
                10 ** (floor(log10(|v|)) - 1))`` (`causalqwen.writing.resolution_for`: ``2.50`` after
                ``12.50``, ``2.5`` after ``7 days``). ``"prompt"`` needs ``number_texts`` where the row holds a
                ``<NUM>`` (``[]`` for a prompt without numbers): without them the prompt's own numbers would be
                rewritten at a resolution guessed from their values (``12.50`` as ``12``).

        Raises:
            TypeError: wrong element types.
            ValueError: the lengths differ, an id is negative or (with ``out_of_vocab="raise"``)
                at least ``len(self)``, a ``<NUM>`` value is NaN or infinite, ``number_texts`` has
                more texts than there are ``<NUM>`` (other than the prompt's ``<NUM>``, where its end is known)
                or a text that is not one number or does not read as its value, or
                ``number_resolution="prompt"`` comes without ``number_texts`` for a row that holds a ``<NUM>``.
        """
        if numeric_values is None and number_texts is not None:
            raise TypeError("number_texts needs numeric_values: pass the values beside the ids")
        if is_batch(input_ids):
            if numeric_values is not None and not is_batch(numeric_values):
                raise ValueError(
                    f"input_ids is a batch of {len(input_ids)} rows but numeric_values is not: pass one "
                    "row of values per row of ids (the same shape), or decode one row"
                )
            return self.batch_decode(
                input_ids,
                numeric_values,
                skip_special_tokens,
                out_of_vocab,
                number_texts=number_texts,
                number_resolution=number_resolution,
            )
        ids, values, surfaces = check_decode_arguments(
            input_ids, numeric_values, skip_special_tokens, out_of_vocab, number_texts, size=len(self)
        )
        self._check_prompt_texts(ids, numeric_values, number_texts, number_resolution)
        pieces, _ = self._pieces(
            ids,
            values if numeric_values is not None else None,
            surfaces,
            skip_special_tokens,
            split=len(ids),
            resolution=number_resolution,
        )
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
        ids, values, surfaces = check_decode_arguments(
            input_ids, numeric_values, skip_special_tokens, out_of_vocab, number_texts, size=len(self)
        )
        prompt_length = check_prompt_length(prompt_length, len(ids))
        self._check_prompt_texts(ids, numeric_values, number_texts, number_resolution)
        if number_texts is not None:  # they name exactly the prompt's <NUM>: too few would rewrite its later numbers
            check_number_text_count(len(surfaces), ids, self._num_token_id, prompt_length)
        pieces, split = self._pieces(
            ids, values, surfaces, skip_special_tokens, split=prompt_length, resolution=number_resolution
        )
        return join_at_split(pieces, split)

    def _check_prompt_texts(self, ids: list[int], numeric_values, number_texts, resolution) -> None:
        """``number_resolution="prompt"`` writes generated numbers at the resolution of the prompt's numbers as they
        were written: a ``ValueError`` where a row with a ``<NUM>`` comes without ``number_texts``, whose numbers
        would otherwise all be written as generated ones, the prompt's own rewritten (``12.50`` as ``12``)."""
        if resolution == "prompt" and number_texts is None and numeric_values is not None and self._num_token_id in ids:
            raise ValueError(
                'number_resolution="prompt" writes generated numbers at the resolution of the prompt\'s numbers as '
                "they were written, and keeps those as written: pass number_texts (the encoding's number_texts, "
                "[] for a prompt without numbers), or number_resolution=None (the shortest text of every value) or "
                "a power of ten"
            )

    def _pieces(
        self,
        ids: list[int],
        values: list[float] | None,
        surfaces: list[str],
        skip_special_tokens: bool,
        *,
        split: int,
        resolution,
    ) -> tuple[list[tuple[str, str]], int]:
        """The pieces of a checked row (`causalqwen.tokenization.decoded_pieces`), its runs of ordinary ids decoded
        by the wrapped tokenizer, its generated numbers written at ``resolution`` (checked here)."""
        resolution = check_resolution(resolution)

        def decode_text(run: list[int]) -> str:
            return decode_run(self._hf_tokenizer, run, skip_special_tokens)

        return decoded_pieces(
            ids,
            values,
            surfaces,
            num_token_id=self._num_token_id,
            num_token=self._num_token,
            size=len(self),
            decode_run=decode_text,
            split=split,
            resolution=resolution,
        )

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
            return [
                self.decode(
                    input_ids,
                    numeric_values,
                    skip_special_tokens,
                    out_of_vocab,
                    number_texts=number_texts,
                    number_resolution=number_resolution,
                )
            ]
        if isinstance(number_texts, (list, tuple)) and any(isinstance(texts, str) for texts in number_texts):
            raise TypeError(
                "number_texts of a batch holds one list of str per row (for one row: [['12.50', ...]]), "
                f"got a str in {number_texts!r:.80}"
            )
        texts = []
        for row, (ids, values, keep, surfaces, prompt_length) in enumerate(
            batch_rows(input_ids, numeric_values, number_texts)
        ):
            try:
                if surfaces is not None and prompt_length is not None:  # where the prompt ends is known: its texts
                    given = len(checked_number_texts(surfaces))  # name exactly its <NUM>
                    check_number_text_count(
                        given, ids, self._num_token_id, check_prompt_length(prompt_length, len(ids))
                    )
                if keep is not None:
                    ids, values = kept_positions(ids, values, keep)
                texts.append(
                    self.decode(
                        ids,
                        values,
                        skip_special_tokens,
                        out_of_vocab,
                        number_texts=surfaces,
                        number_resolution=number_resolution,
                    )
                )
            except ValueError as error:
                raise ValueError(f"row {row}: {error}") from None
        return texts
