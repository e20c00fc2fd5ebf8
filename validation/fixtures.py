"""The data several experiments start from: sentences of the synthetic corpus, collated.

The model they start from is `causalqwen.tiny.build_tiny_causal_lm` (the embedded tiny base,
converted); ``init_seed`` fixes its random w_num and w_reg.
"""

from __future__ import annotations

import torch

from causalqwen import NumericTokenizer
from causalqwen.data import TextDataset, collate, synthetic_texts

__all__ = ["sentence_batch"]


def sentence_batch(tokenizer: NumericTokenizer, n: int, seed: int) -> dict[str, torch.Tensor]:
    """``n`` sentences of the synthetic corpus (`causalqwen.data`), collated (right padding, labels)."""
    return collate(TextDataset(synthetic_texts(n, seed=seed), tokenizer, max_length=64).items, tokenizer.pad_token_id)
