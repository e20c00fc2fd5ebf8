"""The Hugging Face tokenizer inside `causalqwen.integrations.tokenizer.NumericTokenizer`: all that is asked of it.

`NumericTokenizer` leaves the text between numbers to a transformers tokenizer (Qwen2's). It asks three
things of it: to hold ``<NUM>`` as a special added token (`add_num_token`), to encode the runs of text
between numbers with its special-token matching off (`encode_text_runs`), and to decode a run of ordinary ids
(`decode_run`).

Special-token matching is a flag of the Rust backend (``encode_special_tokens``), shared by every wrapper of one
transformers tokenizer and every thread that encodes with it: each call here sets it and encodes under
`special_token_matching`, one lock for all, so one thread's flag never decides another's encoding.
`causalqwen.integrations.tokenizer.EncodingPlan` sets the flag under the same lock, and takes the reference encoding
(`causalqwen.integrations.tokenizer.encode_by_runs`: every run encoded here, ``<NUM>`` put between) for a text that
holds a special token's text.
"""

from __future__ import annotations

import contextlib
import threading

from tokenizers import AddedToken
from transformers import PreTrainedTokenizerBase

from ..checks.tokenizer_door import check_num_token

__all__ = ["add_num_token", "encode_text_runs", "decode_run", "special_token_matching", "SPECIAL_TOKEN_FLAG_LOCK"]

# held while a Rust backend's encode_special_tokens flag is set and used (re-entrant: a holder may call again)
SPECIAL_TOKEN_FLAG_LOCK = threading.RLock()


@contextlib.contextmanager
def special_token_matching(backend, matching: bool):
    """Encode with ``backend`` (a Rust ``tokenizers.Tokenizer``, or None for a slow tokenizer) inside this block with
    its special-token matching on or off (``encode_special_tokens = not matching``), the flag put back afterwards.
    The block holds one lock shared by all backends: another thread's block cannot change the flag meanwhile."""
    with SPECIAL_TOKEN_FLAG_LOCK:
        previous = getattr(backend, "encode_special_tokens", None)
        if previous is not None:
            backend.encode_special_tokens = not matching
        try:
            yield
        finally:
            if previous is not None and backend.encode_special_tokens != previous:
                backend.encode_special_tokens = previous


def add_num_token(hf_tokenizer: PreTrainedTokenizerBase, num_token: str) -> int:
    """The id of ``num_token`` in ``hf_tokenizer``, added **in place** as a special token (id K = the size before)
    unless the tokenizer already holds it as a special added token with no other role (a ``<NUM>`` added
    before); a ``ValueError`` naming the clash if it is another of its tokens
    (`causalqwen.checks.tokenizer_door.num_token_clash`: end of text, padding, a chat template's special token,
    an ordinary token), and nothing is added."""
    check_num_token(hf_tokenizer, num_token)
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


def encode_text_runs(hf_tokenizer: PreTrainedTokenizerBase, runs: list[str]) -> list[list[int]]:
    """Token ids of each text run, in one call, with no special tokens added and none recognised in the text (a typed
    ``"<NUM>"`` or ``"<|endoftext|>"`` stays text)."""
    if not runs:
        return []
    # The fast tokenizer sets the flag on its Rust backend for split_special_tokens and leaves it set: the block puts
    # it back, and no other thread encodes with that backend meanwhile.
    with special_token_matching(getattr(hf_tokenizer, "backend_tokenizer", None), matching=False):
        encoded = hf_tokenizer(runs, add_special_tokens=False, split_special_tokens=True)
    return [list(ids) for ids in encoded["input_ids"]]


def decode_run(hf_tokenizer: PreTrainedTokenizerBase, ids: list[int], skip_special_tokens: bool) -> str:
    """Decode a run of ordinary ids exactly, without any clean-up of spaces."""
    return hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
