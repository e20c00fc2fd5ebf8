"""Batches for a Qwen2 model in the Qwen2-vs-CausalQwen comparison, shared by the pretraining of the base
(`validation.domains`) and the Qwen-side fine-tuning (`validation.qwen_finetuning`): the batch order every
training loop of the comparison uses (`batch_order`), a plain tokenizer's rows with EOS (`encode_qwen_rows`),
right-padded batches with labels (`collate_rows`) and the next-token cross-entropy (`next_token_loss`)."""

from __future__ import annotations

import numpy as np
import torch

from .argument_checks import check_count, check_seed

__all__ = ["batch_order", "encode_qwen_rows", "collate_rows", "next_token_loss"]


def batch_order(n_items: int, batch_size: int, steps: int, seed: int) -> list[np.ndarray]:
    """The item indices of each of ``steps`` training batches: the same for every model of the comparison.

    Epoch ``e`` is ``np.random.default_rng([seed, e]).permutation(n_items)`` cut into consecutive batches of
    ``batch_size`` (the last, incomplete batch of an epoch is dropped); epochs follow each other until
    ``steps`` batches are made. So the order is a function of ``(n_items, batch_size, steps, seed)`` alone.
    """
    check_count(n_items, "n_items")
    check_count(batch_size, "batch_size")
    if batch_size > n_items:
        raise ValueError(f"batch_size ({batch_size}) exceeds the number of items ({n_items})")
    if check_seed(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    batches, epoch = [], 0
    while len(batches) < steps:
        order = np.random.default_rng([seed, epoch]).permutation(n_items)
        for start in range(0, n_items - batch_size + 1, batch_size):
            batches.append(order[start : start + batch_size])
            if len(batches) == steps:
                break
        epoch += 1
    return batches


def encode_qwen_rows(tokenizer, texts: list[str], add_eos: bool = True) -> list[list[int]]:
    """Token ids of each text with the plain (digit-token) tokenizer, no special tokens, EOS appended."""
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    return [list(ids) + eos for ids in encoded]


def collate_rows(
    rows: list[list[int]], pad_token_id: int, prompt_lengths: list[int] | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad rows into ``input_ids``, ``attention_mask`` and ``labels`` (= ids, -100 at padding and on the first
    ``prompt_lengths[i]`` tokens of row ``i``, its prompt)."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[index, : len(row)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    for index, length in enumerate(prompt_lengths or []):
        labels[index, :length] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of position i against labels[i+1] (ignoring -100), in float32."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
        reduction=reduction,
    )
