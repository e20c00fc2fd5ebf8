"""What running the core model (`causalqwen.model`) on transformers' Qwen2 takes besides the model: the KV cache under
either of its names, the keywords other callers add (transformers' generation loop, peft), and Qwen2's attention
masks for a padded batch built without a host synchronisation. `causalqwen.modeling` calls these only when there is
something to sort: a plain ``model(**encoding, labels=ids)`` enters none of them.
"""

from __future__ import annotations

import inspect

from transformers.cache_utils import Cache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from ..checks.doors import check_keywords

__all__ = ["ABDUCE_ARGS", "FORWARD_ARGS", "MASKS_WITHOUT_A_LOOK", "forward_keywords", "one_cache", "padded_masks"]

# The parameters of CausalQwenModel.forward (and abduce), and those CausalQwenForCausalLM.forward adds: the names an
# unknown keyword is compared with, to suggest the one meant.
ABDUCE_ARGS = ("input_ids", "numeric_values", "attention_mask", "position_ids", "cache", "past_key_values", "use_cache")
FORWARD_ARGS = ABDUCE_ARGS + ("labels", "numeric_labels", "return_decisions", "logits_to_keep")
# What transformers' generation loop passes besides (cache_position before transformers 5.24): positions come from
# position_ids, and the output always is a dict.
GENERATION_LOOP_ARGS = ("cache_position", "return_dict")

# Whether transformers lets a caller build Qwen2's attention masks without its look at whether they could be dropped
# (``allow_is_causal_skip``, with the cache named ``cache``: transformers 5.24 on); without it Qwen2 gets the 2D mask.
MASKS_WITHOUT_A_LOOK = {"allow_is_causal_skip", "cache"} <= set(inspect.signature(create_causal_mask).parameters)


def one_cache(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """The KV cache by either name (``cache=`` from transformers 5.24, ``past_key_values=`` before); not both."""
    if cache is not None and past_key_values is not None:
        raise TypeError("pass the KV cache as cache= or as past_key_values=, not both")
    return cache if cache is not None else past_key_values


def forward_keywords(kwargs: dict) -> dict:
    """The keywords of ``CausalQwenForCausalLM.forward`` beyond its own that pass on to Qwen2: transformers' output
    switches. What the generation loop adds is dropped, and so is peft's ``inputs_embeds=None`` (its ``PeftModel``
    always passes it); any other keyword is a ``TypeError`` naming it (`causalqwen.checks.doors.check_keywords`)."""
    kwargs = {name: value for name, value in kwargs.items() if name not in GENERATION_LOOP_ARGS}
    if "inputs_embeds" in kwargs and kwargs["inputs_embeds"] is None:
        del kwargs["inputs_embeds"]
    check_keywords("forward", kwargs, FORWARD_ARGS)
    return kwargs


def padded_masks(model, inputs_embeds, attention_mask, cache, position_ids) -> dict:
    """Qwen2's attention masks (``{"full_attention": ...}``, and ``"sliding_attention"`` with sliding layers) for a
    batch with padding, built by transformers' own functions but without their look at whether the mask holds any
    padding (a host synchronisation per forward): the door has looked already, and hands a mask on only when it
    does (`causalqwen.checks.doors.open_door`), as generation does only for padded prompts."""
    arguments = dict(
        config=model.config,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        cache=cache,
        position_ids=position_ids,
        allow_is_causal_skip=False,
    )
    masks = {"full_attention": create_causal_mask(**arguments)}
    if model.has_sliding_layers:
        masks["sliding_attention"] = create_sliding_window_causal_mask(**arguments)
    return masks
