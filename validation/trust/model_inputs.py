r"""The model inputs boundary: what ``forward`` takes (ids, values, masks, positions, labels) and its loss.

Misspelt keywords, labels holding ``<NUM>`` without a value or over a word, a float64 value float32 cannot
hold, positions beyond the model's table or of the wrong type, a Hessian through the fused loss, ids of the
wrong dtype or device, ``inputs_embeds``.
"""

from __future__ import annotations

import torch

from ..cases import TrustCase
from ..fixtures import encoded_batch, fresh_tiny_model, shared_tiny

__all__ = ["CASES"]


# =============================================================================================
# silent
# =============================================================================================


def _forward_keyword(keyword: str):
    def trigger():
        tokenizer = shared_tiny().tokenizer
        batch = tokenizer(["The price is 12.5 yuan."])
        shared_tiny().model(batch["input_ids"], numeric_values=batch["numeric_values"], **{keyword: batch["input_ids"]})

    return trigger


def _fused_double_backward():
    tokenizer, model = shared_tiny().tokenizer, fresh_tiny_model()
    batch = tokenizer(["A cup of tea costs 1.5 dollars."])
    loss = model(**batch, labels=batch["input_ids"]).loss
    (gradient,) = torch.autograd.grad(loss, model.action.b_noise, create_graph=True)
    torch.autograd.grad(gradient.sum(), model.action.b_noise)


def _num_labels_without_targets():
    tokenizer = shared_tiny().tokenizer
    words = tokenizer(["The price is yuan."])["input_ids"]
    labels = words.clone()
    labels[0, 2] = tokenizer.num_token_id
    shared_tiny().model(words, labels=labels)


def _too_many_positions():
    model = shared_tiny().model
    model(torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long))


def _positions(shift: int, dtype=torch.int64):
    def trigger():
        _, batch = encoded_batch()
        length = batch["input_ids"].shape[1]
        positions = (torch.arange(length)[None] + shift).to(dtype)
        shared_tiny().model(**batch, position_ids=positions)

    return trigger


def _num_label_over_a_word():
    tokenizer, batch = encoded_batch()
    labels = batch["input_ids"].clone()
    labels[0, 2] = tokenizer.num_token_id
    shared_tiny().model(**batch, labels=labels)


def _float64_underflow_value():
    _, batch = encoded_batch()
    values = batch["numeric_values"].double()
    values[0, -1] = 1e-50
    shared_tiny().model(batch["input_ids"], numeric_values=values, attention_mask=batch["attention_mask"])


# =============================================================================================
# clarity
# =============================================================================================


def _inputs_embeds():
    shared_tiny().model(torch.tensor([[1, 2]]), inputs_embeds=torch.zeros(1, 2, shared_tiny().model.config.hidden_size))


def _uint8_ids():
    _, batch = encoded_batch()
    shared_tiny().model(batch["input_ids"].to(torch.uint8), numeric_values=batch["numeric_values"])


def _meta_ids():
    _, batch = encoded_batch()
    shared_tiny().model(batch["input_ids"].to("meta"), numeric_values=batch["numeric_values"])


CASES = [
    # ---- silent
    TrustCase(
        "forward-numeric-value",
        "silent",
        "forward(numeric_value=...) (misspelt: the numbers were dropped)",
        _forward_keyword("numeric_value"),
        TypeError,
        r"unexpected keyword argument\(s\) 'numeric_value' \(did you mean 'numeric_values'\?\)",
    ),
    TrustCase(
        "forward-attention-masks",
        "silent",
        "forward(attention_masks=...) (misspelt: the mask was dropped)",
        _forward_keyword("attention_masks"),
        TypeError,
        r"'attention_masks' \(did you mean 'attention_mask'\?\)",
    ),
    TrustCase(
        "forward-label",
        "silent",
        "forward(label=...) (misspelt: no loss, no error)",
        _forward_keyword("label"),
        TypeError,
        r"'label' \(did you mean 'labels'\?\)",
    ),
    TrustCase(
        "fused-loss-double-backward",
        "silent",
        "a Hessian through the fused loss (was exactly 0)",
        _fused_double_backward,
        RuntimeError,
        r"no second derivative .*return_decisions=True",
    ),
    TrustCase(
        "num-labels-without-targets",
        "silent",
        "labels holding <NUM> with no numeric targets (trained toward 0)",
        _num_labels_without_targets,
        ValueError,
        "labels hold <NUM> targets but neither numeric_labels nor numeric_values",
    ),
    TrustCase(
        "forward-beyond-max-positions",
        "silent",
        "forward on more positions than max_position_embeddings",
        _too_many_positions,
        ValueError,
        r"\d+ positions, more than max_position_embeddings=\d+",
    ),
    TrustCase(
        "position-ids-beyond-limit",
        "silent",
        "forward with position_ids beyond max_position_embeddings",
        _positions(2048),
        ValueError,
        r"position_ids must lie in \[0, max_position_embeddings=2048\); found 2048",
    ),
    TrustCase(
        "position-ids-negative",
        "silent",
        "forward with negative position_ids",
        _positions(-1),
        ValueError,
        r"position_ids must lie in \[0, max_position_embeddings=\d+\); found -1",
    ),
    TrustCase(
        "position-ids-fractional",
        "silent",
        "forward with float position_ids",
        _positions(0, torch.float32),
        TypeError,
        r"position_ids must be an integer tensor, got torch\.float32",
    ),
    TrustCase(
        "num-label-over-a-word",
        "silent",
        "a <NUM> label where the input is a word (regressed toward 0)",
        _num_label_over_a_word,
        ValueError,
        r"labels put <NUM> at position \[0, 2\], where input_ids is not <NUM>",
    ),
    TrustCase(
        "float64-value-underflows",
        "silent",
        "a float64 numeric value of 1e-50 (became 0 in float32)",
        _float64_underflow_value,
        ValueError,
        r"numeric_values holds 1e-50 at position \[0, \d+\], which underflows to 0 in float32",
    ),
    # ---- clarity
    TrustCase(
        "forward-inputs-embeds",
        "clarity",
        "forward(inputs_embeds=...) (a 999-character error)",
        _inputs_embeds,
        TypeError,
        r"^forward\(\) does not take inputs_embeds: CausalQwen forms the embeddings itself",
    ),
    TrustCase(
        "forward-uint8-ids",
        "clarity",
        "forward with uint8 input_ids (a raw torch error)",
        _uint8_ids,
        TypeError,
        r"input_ids must be an int64 or int32 tensor .*got torch\.uint8",
    ),
    TrustCase(
        "forward-meta-ids",
        "clarity",
        "forward with input_ids on the meta device (a raw torch error)",
        _meta_ids,
        ValueError,
        r"input_ids is a meta tensor",
    ),
]
