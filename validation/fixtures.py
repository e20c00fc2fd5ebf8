"""The model and data several experiments start from: the embedded tiny base and synthetic sentences."""

from __future__ import annotations

import torch

from causalqwen import CausalQwenForCausalLM, NumericTokenizer
from causalqwen.data import TextDataset, collate, synthetic_texts
from causalqwen.tiny import build_tiny_base

__all__ = ["tiny_base", "tiny_model", "sentence_batch"]


def tiny_base(seed: int = 0):
    """``(qwen, tokenizer)``: the embedded tiny Qwen2 base and its `NumericTokenizer`."""
    qwen, hf_tokenizer = build_tiny_base(seed=seed)
    return qwen, NumericTokenizer(hf_tokenizer)


def tiny_model(qwen, tokenizer: NumericTokenizer, init_seed: int = 0, **overrides) -> CausalQwenForCausalLM:
    """``from_qwen`` of the tiny base in eval mode; ``init_seed`` fixes the random w_num and w_reg."""
    torch.manual_seed(init_seed)
    return CausalQwenForCausalLM.from_qwen(qwen, num_token_id=tokenizer.num_token_id, **overrides).eval()


def sentence_batch(tokenizer: NumericTokenizer, n: int, seed: int) -> dict[str, torch.Tensor]:
    """``n`` sentences of the synthetic corpus (`causalqwen.data`), collated (right padding, labels)."""
    return collate(TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=64).items, tokenizer.pad_token_id)
