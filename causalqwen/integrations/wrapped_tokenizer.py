"""The Hugging Face tokenizer inside `causalqwen.integrations.tokenizer.NumericTokenizer`: all that is asked of it.

`NumericTokenizer` leaves the text between numbers to a transformers tokenizer (Qwen2's). It asks three
things of it: to hold ``<NUM>`` as a special added token (`add_num_token`), to encode the runs of text
between numbers with its special-token matching off (`EncodingPlan`), and to decode a run of
ordinary ids (`decode_run`). Encoding has a reference path and two fast ones that give the same ids:

* `encode_by_runs`, the reference: every run between numbers encoded on its own, ``<NUM>`` put between;
* `encode_batch`: each text with its numbers replaced by ``<NUM>``, one call of the Rust tokenizer, whose
  added-token matching splits the text at ``<NUM>`` and encodes the pieces separately;
* each *distinct* run encoded once and the rows put together from those (number-dense texts).

`EncodingPlan` chooses between them and keeps every call of the wrapped tokenizer in one step (`EncodingPlan.encode`),
which `NumericTokenizer` runs in a second thread for a large batch, chunk by chunk
(`causalqwen.tokenization.chunks_of`), while it reads the numbers of the next chunk. The runs between numbers and
the ids put together from theirs are the section's (`causalqwen.tokenization.runs_between`, `ids_between_numbers`).
"""

from __future__ import annotations

import functools
import re

from tokenizers import AddedToken
from transformers import PreTrainedTokenizerBase

from ..checks.tokenizer_door import NUM_TOKEN_FIX, num_token_clash
from ..numbers import NumberMatch
from ..tokenization import ids_between_numbers, runs_between

__all__ = ["add_num_token", "EncodingPlan", "encode_batch", "encode_by_runs", "decode_run"]


def add_num_token(hf_tokenizer: PreTrainedTokenizerBase, num_token: str) -> int:
    """The id of ``num_token`` in ``hf_tokenizer``, added **in place** as a special token (id K = the size before)
    unless the tokenizer already holds it as a special added token with no other role (a ``<NUM>`` added
    before); a ``ValueError`` naming the clash if it is another of its tokens
    (`causalqwen.checks.tokenizer_door.num_token_clash`: end of text, padding, a chat template's special token,
    an ordinary token), and nothing is added."""
    clash = num_token_clash(hf_tokenizer, num_token)
    if clash is not None:
        raise ValueError(f"num_token {num_token!r} is {clash}: numbers would encode as that token; {NUM_TOKEN_FIX}")
    vocab = hf_tokenizer.get_vocab()
    if num_token in vocab:
        return vocab[num_token]
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
    return num_token_id


class EncodingPlan:
    """How the ids of texts are made, given their numbers, in three steps: this plan (the runs between numbers, and
    what the wrapped tokenizer is given), `encode` (every call of the wrapped tokenizer, and nothing else: a second
    thread may run it while this one reads the numbers of other texts), and `id_rows` (the rows put together).

    A text that holds a special token's text (a typed ``"<|endoftext|>"``) takes the reference path
    (`encode_by_runs`). The others, with a Rust tokenizer, take one of two equivalent ways (the Rust tokenizer
    encodes the text between two ``<NUM>`` on its own either way):

    * each text with its numbers replaced by ``<NUM>``, one Rust encoding per text (`encode_batch`);
    * each *distinct* text run between numbers once, the rows put together from those, when at most
      half the runs are distinct: number-dense texts ("1-2-3-...", tables, a batch of similar lines),
      where the Rust tokenizer would otherwise spend most of its time on ``<NUM>`` after ``<NUM>``.
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        texts: list[str],
        found: list[list[NumberMatch]],
        num_token: str,
        num_token_id: int,
        *,
        ids_of_runs: dict[str, list[int] | None] | None = None,
    ):
        self.hf_tokenizer, self.num_token_id = hf_tokenizer, num_token_id
        self.ids_of_runs = {} if ids_of_runs is None else ids_of_runs
        self.runs_per_text = [runs_between(text, numbers_found) for text, numbers_found in zip(texts, found)]
        self.backend = getattr(hf_tokenizer, "backend_tokenizer", None)  # None for a slow (Python) tokenizer
        if self.backend is not None:
            special_text = _any_of(
                tuple(token.content for token in hf_tokenizer.added_tokens_decoder.values() if token.special)
            )
            plain = [special_text.search(text) is None for text in texts]
        else:
            plain = [False] * len(texts)
        self.quick = [index for index, ok in enumerate(plain) if ok]
        self.slow = [index for index, ok in enumerate(plain) if not ok]
        quick_runs = [self.runs_per_text[index] for index in self.quick]
        runs_count = sum(len(runs) for runs in quick_runs)
        new_runs = [
            run
            for run in dict.fromkeys(run for runs in quick_runs for run in runs if run)
            if run not in self.ids_of_runs
        ]
        self.by_runs = 2 * len(new_runs) <= runs_count
        if self.by_runs:
            self.rust_texts = new_runs
            self.ids_of_runs.update(dict.fromkeys(new_runs))  # their ids come in id_rows
        else:
            self.rust_texts = [num_token.join(runs) for runs in quick_runs]

    def encode(self) -> tuple[list[list[int]], list[list[int]]]:
        """The ids of `rust_texts` (`encode_batch`) and the rows of the texts that take the reference path."""
        rust_ids = encode_batch(self.backend, self.rust_texts) if self.rust_texts else []
        slow_ids = (
            encode_by_runs(self.hf_tokenizer, [self.runs_per_text[index] for index in self.slow], self.num_token_id)
            if self.slow
            else []
        )
        return rust_ids, slow_ids

    def id_rows(self, encoded: tuple[list[list[int]], list[list[int]]]) -> list[list[int]]:
        """The ids of every text, from what `encode` gave (and, when the runs were encoded one by one, the ids of the
        runs that plans before this one encoded: their `id_rows` must come first)."""
        rust_ids, slow_ids = encoded
        id_rows: list[list[int] | None] = [None] * len(self.runs_per_text)
        if self.by_runs:
            ids_of = self.ids_of_runs
            ids_of.update(zip(self.rust_texts, rust_ids))
            rust_ids = [
                ids_between_numbers(runs, [ids_of[run] for run in runs if run], self.num_token_id)
                for runs in (self.runs_per_text[index] for index in self.quick)
            ]
        for index, ids in zip(self.quick, rust_ids):
            id_rows[index] = ids
        for index, ids in zip(self.slow, slow_ids):
            id_rows[index] = ids
        return id_rows


@functools.lru_cache(maxsize=64)
def _any_of(texts: tuple[str, ...]) -> re.Pattern:
    """A compiled pattern that finds any of ``texts`` (none if empty)."""
    return re.compile("|".join(map(re.escape, texts)) or "(?!)")


def encode_batch(backend, texts: list[str]) -> list[list[int]]:
    r"""The fast path: texts whose numbers are replaced by ``<NUM>`` (and that hold no other special token's
    text), encoded in one call of the Rust tokenizer. Its added-token matching splits each text at ``<NUM>``
    and encodes the pieces separately: the same ids as `encode_by_runs`, at a fraction of the calls.
    Truncation and padding are off, as the wrapped tokenizer sets them for a call without either."""
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    previous_flag = backend.encode_special_tokens
    backend.encode_special_tokens = False
    try:
        if len(texts) <= _ONE_BY_ONE:  # waking the Rust thread pool costs more than these few texts
            encodings = [backend.encode(text, add_special_tokens=False) for text in texts]
        else:
            encodings = backend.encode_batch(texts, add_special_tokens=False)
    finally:
        backend.encode_special_tokens = previous_flag
    return [encoding.ids for encoding in encodings]


_ONE_BY_ONE = 4  # encode_batch encodes at most this many texts one by one


def encode_by_runs(
    hf_tokenizer: PreTrainedTokenizerBase, runs_per_text: list[list[str]], num_token_id: int
) -> list[list[int]]:
    """The reference path: the text runs between numbers of every text encoded in one call, special-token
    matching off (a typed ``"<NUM>"`` or ``"<|endoftext|>"`` stays text), then ``<NUM>`` ids put between them."""
    flat = [run for runs in runs_per_text for run in runs if run]
    encoded = iter(_encode_text_runs(hf_tokenizer, flat))
    return [ids_between_numbers(runs, [next(encoded) for run in runs if run], num_token_id) for runs in runs_per_text]


def _encode_text_runs(hf_tokenizer: PreTrainedTokenizerBase, runs: list[str]) -> list[list[int]]:
    """Token ids of each text run, with no special tokens added and none recognised in the text."""
    if not runs:
        return []
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    previous_flag = getattr(backend, "encode_special_tokens", None)
    try:
        encoded = hf_tokenizer(runs, add_special_tokens=False, split_special_tokens=True)
    finally:
        # The fast tokenizer leaves the flag set on its Rust backend; put it back as it was.
        if previous_flag is not None and backend.encode_special_tokens != previous_flag:
            backend.encode_special_tokens = previous_flag
    return [list(ids) for ids in encoded["input_ids"]]


def decode_run(hf_tokenizer: PreTrainedTokenizerBase, ids: list[int], skip_special_tokens: bool) -> str:
    """Decode a run of ordinary ids exactly, without any clean-up of spaces."""
    return hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
