r"""The model's door: every check of a ``forward`` (or ``abduce``, or a generation prompt) in one place.

Shape and type checks cost nothing and run at once (a meta tensor, which has no values, is refused among
them). Checks of the *data* (token ids in range, values finite and representable in float32 -- neither
beyond it nor so small that float32 makes them 0 --, a value only beside ``<NUM>``, a 0/1 mask, positions
in ``[0, max_position_embeddings)``, labels in range, a value for every ``<NUM>`` target, a finite
threshold) each need a value from the device; they are collected (`Required`) and brought to the host
in one transfer, together with whether the mask is all ones (then Qwen2 gets no mask; otherwise its masks are
built without its own look at the padding, `causalqwen.modeling.Qwen2Backbone`: either way Qwen2
makes no host synchronisation of its own). Only when that transfer reports a failure is the culprit looked up,
so an error still names the position and the value.

`open_door` is the preamble of every forward (`CausalQwenModel.forward`, `CausalQwenForCausalLM.forward`): the
checks, then the positions Qwen2 gets (`position_ids_from_mask`, also the reference generation loop's). The checks
run while `causalqwen.cauchy.validating` (the package's one switch, on by default): a caller that has checked the
inputs itself (``generate``, after the prompt's door) runs the forward under ``cauchy.validation(False)``.
"""

from __future__ import annotations

import difflib
from typing import Callable

import torch
from torch import Tensor

from ..cauchy import validating
from .values import first_index

__all__ = ["check_keywords", "refuse_meta", "open_door", "position_ids_from_mask", "PASSED_TO_QWEN2"]

# Keywords that forward/abduce hand on to Qwen2Model; everything else is refused by name.
PASSED_TO_QWEN2 = ("output_attentions", "output_hidden_states")


# A check of the data: a bool tensor that must be all True, and the error (which may look up the culprit) raised
# when it is not. A forward's checks are gathered in a list and settled with one device-to-host transfer.
Required = list[tuple[Tensor, Callable[[], Exception]]]


def check_keywords(method: str, kwargs: dict, own: tuple[str, ...]) -> None:
    """Only transformers' output switches pass through to Qwen2Model; any other keyword is a ``TypeError``.

    Qwen2Model silently drops keywords it does not know, so a misspelt ``numeric_value=`` or
    ``attention_masks=`` would lose the numbers or the mask without a word.
    """
    unknown = sorted(set(kwargs) - set(PASSED_TO_QWEN2))
    if not unknown:
        return
    if "inputs_embeds" in unknown:
        raise TypeError(
            f"{method}() does not take inputs_embeds: CausalQwen forms the embeddings itself, "
            "embed(input_ids) + phi(numeric_values)"
        )
    known = own + PASSED_TO_QWEN2
    hints = [
        f"{name!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(name, known, 1)) else repr(name)
        for name in unknown
    ]
    raise TypeError(f"{method}() got unexpected keyword argument(s) {', '.join(hints)}")


def refuse_meta(**tensors) -> None:
    """A ``ValueError`` naming the first of ``tensors`` that is a meta tensor (a shape without values)."""
    for name, tensor in tensors.items():
        if isinstance(tensor, Tensor) and tensor.is_meta:
            raise ValueError(f"{name} is a meta tensor: it has a shape but no values to compute with")


def _like_input_ids(name: str, tensor, input_ids: Tensor, required: Required | None = None) -> None:
    r"""``tensor`` must be a tensor of input_ids' shape; with ``required``, real numbers that float32 holds
    (checks added to ``required``).

    The values enter $\phi$ in float32 (decision D3: a number beyond float32 is an error, never clamped), so
    a float64 value beyond $\pm 3.4\cdot10^{38}$ is rejected rather than turning into ±inf.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [B, S] like input_ids, got {type(tensor).__name__}")
    if tuple(tensor.shape) != tuple(input_ids.shape):
        raise ValueError(f"{name} shape {tuple(tensor.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
    if required is None:
        return
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"{name} must hold real numbers (a float or integer tensor), got {tensor.dtype}")
    finite = torch.isfinite(tensor)
    required.append((finite, lambda: ValueError(f"{name} must be finite: found NaN or ±inf")))
    in_float32 = torch.isfinite(tensor.float())  # finite here, but beyond float32 once cast

    def too_large():
        b, s = first_index(~in_float32)
        return ValueError(
            f"{name} must be representable in float32 (|v| <= {torch.finfo(torch.float32).max:.8g}); "
            f"found {tensor[b, s].item()!r} at position [{b}, {s}]"
        )

    required.append((in_float32, too_large))
    if tensor.dtype == torch.float64:  # the one type wider than float32: a tiny value can become 0 when cast
        underflow = (tensor != 0) & (tensor.float() == 0)

        def to_zero():
            b, s = first_index(underflow)
            return ValueError(
                f"{name} holds {tensor[b, s].item()!r} at position [{b}, {s}], which underflows to 0 in "
                "float32 (the smallest non-zero float32 is 1.4e-45); scale the values, or give 0 where 0 "
                "is meant"
            )

        required.append((~underflow, to_zero))


def _check_values(config, input_ids, numeric_values, required: Required) -> None:
    num = config.num_token_id
    if numeric_values is None:
        is_num = input_ids == num

        def unvalued():
            b, s = first_index(is_num)
            return ValueError(
                f"input_ids hold <NUM> (id {num}) at position [{b}, {s}] but numeric_values is None: pass "
                "the values the tokenizer returned (a <NUM> never stands for 0 by default)"
            )

        required.append((~is_num, unvalued))
        return
    _like_input_ids("numeric_values", numeric_values, input_ids, required)
    stray = (numeric_values != 0) & (input_ids != num)

    def stray_value():
        b, s = first_index(stray)
        return ValueError(
            f"numeric_values must be 0 wherever input_ids is not <NUM> (id {num}); found "
            f"{numeric_values[b, s].item()} at position [{b}, {s}] holding token {input_ids[b, s].item()}"
        )

    required.append((~stray, stray_value))


def _check_mask_and_positions(config, input_ids, attention_mask, past_length, position_ids, required: Required) -> None:
    limit = config.max_position_embeddings

    def too_long(longest):
        return ValueError(f"the sequence has {longest} positions, more than max_position_embeddings={limit}")

    if attention_mask is None:
        if past_length + input_ids.shape[1] > limit:
            raise too_long(past_length + input_ids.shape[1])
    else:
        if not isinstance(attention_mask, Tensor):
            raise TypeError(f"attention_mask must be a torch.Tensor of 0s and 1s, got {type(attention_mask).__name__}")
        expected = (input_ids.shape[0], past_length + input_ids.shape[1])
        if tuple(attention_mask.shape) != expected:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must be {expected} ([B, cached + new tokens])"
            )
        required.append(
            (
                (attention_mask == 0) | (attention_mask == 1),
                lambda: ValueError("attention_mask must contain only 0 and 1"),
            )
        )
        longest = attention_mask.sum(-1).max()  # positions count real tokens only
        required.append((longest <= limit, lambda: too_long(int(longest))))
    if position_ids is not None:
        allowed = [tuple(input_ids.shape)] + ([(1, input_ids.shape[1])] if input_ids.shape[0] != 1 else [])
        if not isinstance(position_ids, Tensor) or tuple(position_ids.shape) not in allowed:
            got = tuple(position_ids.shape) if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise ValueError(
                f"position_ids must be a tensor of shape {' or '.join(map(str, allowed))} to match input_ids, got {got}"
            )
        if position_ids.dtype.is_floating_point or position_ids.is_complex() or position_ids.dtype == torch.bool:
            raise TypeError(f"position_ids must be an integer tensor, got {position_ids.dtype}")
        outside = (position_ids < 0) | (position_ids >= limit)

        def out_of_range():
            b, s = first_index(outside)
            return ValueError(
                f"position_ids must lie in [0, max_position_embeddings={limit}); found "
                f"{position_ids[b, s].item()} at position [{b}, {s}]"
            )

        required.append((~outside, out_of_range))


def _require_values_on_num_labels(config, input_ids, labels, numeric_labels, attention_mask, required: Required):
    num = config.num_token_id
    stray = (numeric_labels != 0) & (labels != num) & (labels != config.ignore_index)
    if attention_mask is not None:  # a padded target is never scored
        stray = stray & attention_mask[:, -input_ids.shape[1] :].bool()

    def stray_label():
        b, s = first_index(stray)
        return ValueError(
            f"numeric_labels must be 0 wherever labels is not <NUM> (id {num}) or ignore_index; found "
            f"{numeric_labels[b, s].item()} at position [{b}, {s}] whose label is {labels[b, s].item()}: the value "
            "would be ignored (put the value where the label is <NUM>)"
        )

    required.append((~stray, stray_label))


def _require_a_value_for_every_num_target(
    config, input_ids, scored, numeric_values, attention_mask, required: Required
):
    num = config.num_token_id
    unvalued = scored & (input_ids[:, 1:] != num)
    if attention_mask is not None:  # only what the loss scores: both positions real tokens
        real = attention_mask[:, -input_ids.shape[1] :].bool()
        unvalued = unvalued & real[:, :-1] & real[:, 1:]

    def no_value():
        b, s = first_index(unvalued)
        if numeric_values is None:
            return ValueError(
                f"labels hold <NUM> targets but neither numeric_labels nor numeric_values is given "
                f"(the first at position [{b}, {s + 1}]): the regression would be trained toward 0; "
                "pass the values beside the labels"
            )
        return ValueError(
            f"labels put <NUM> at position [{b}, {s + 1}], where input_ids is not <NUM>: "
            "numeric_values holds no value there, so the regression would be trained toward 0; "
            "pass numeric_labels with the target values"
        )

    required.append((~unvalued, no_value))


def _check_labels(
    config, input_ids, labels, numeric_labels, *, numeric_values, attention_mask, threshold, required: Required
) -> None:
    if labels.dtype == torch.bool or labels.dtype.is_floating_point:
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
    next_labels = labels[:, 1:]
    scored = next_labels != config.ignore_index
    out_of_range = scored & ((next_labels < 0) | (next_labels >= config.vocab_size))
    required.append(
        (
            ~out_of_range,
            lambda: ValueError(
                f"labels must lie in [0, {config.vocab_size}) or equal ignore_index={config.ignore_index}; "
                f"found {next_labels[out_of_range][0].item()}"
            ),
        )
    )
    if numeric_labels is not None:  # a value is the target of a <NUM> label only, as a value is a <NUM> token's (D4)
        _require_values_on_num_labels(config, input_ids, labels, numeric_labels, attention_mask, required)
    if numeric_labels is None:  # a <NUM> target takes its value from numeric_values at the same position
        num_targets = scored & (next_labels == config.num_token_id)
        _require_a_value_for_every_num_target(config, input_ids, num_targets, numeric_values, attention_mask, required)
    # a learnable or per-class threshold (held with the weights) that training or a file sent to NaN; a shared one
    # is the config's number (a CPU scalar beside tensors of any device), checked with the config
    if isinstance(threshold, torch.nn.Parameter) or (isinstance(threshold, Tensor) and threshold.dim() > 0):
        required.append(
            (
                torch.isfinite(threshold),
                lambda: ValueError("threshold (the OvR threshold C_k) must be finite: found NaN or ±inf"),
            )
        )


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    r"""The position of every token counting real tokens only, ``[B, S]`` from the mask ``[B, S]``:
    $p_{b,s} = \max(0, \sum_{s' \le s} m_{b,s'} - 1)$, so that left padding does not shift a row's positions
    (a padding slot gets 0; the mask hides it)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)  # [B, S]


def _check_input_ids(config, input_ids, required: Required) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise TypeError("input_ids must be an integer torch.Tensor of shape [B, S]")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"input_ids must be an int64 or int32 tensor (the index types of the embedding), got {input_ids.dtype}"
        )
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [B, S], got {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError(f"input_ids must hold at least one row and one token, got shape {tuple(input_ids.shape)}")
    vocab_size = config.vocab_size
    in_vocabulary = (input_ids >= 0) & (input_ids < vocab_size)
    required.append((in_vocabulary, lambda: ValueError(f"input_ids must lie in [0, vocab_size={vocab_size})")))


def open_door(
    config,
    input_ids,
    numeric_values=None,
    attention_mask=None,
    *,
    position_ids=None,
    cache=None,
    labels=None,
    numeric_labels=None,
    threshold=None,
) -> tuple[Tensor | None, Tensor | None]:
    """A forward's preamble: check every input with at most one host synchronisation, then form the positions of the
    new tokens from the mask when none are given. Returns ``(mask for Qwen2, position_ids)``: the mask is None when it
    is all ones (which Qwen2 would otherwise check itself), the positions None when Qwen2 may count them itself (no
    mask). While `causalqwen.cauchy.validating` is False (inputs a caller has checked already) the checks and their
    synchronisation are skipped and the mask is kept as given."""
    mask = attention_mask
    if validating():
        refuse_meta(
            input_ids=input_ids,
            numeric_values=numeric_values,
            attention_mask=attention_mask,
            position_ids=position_ids,
            labels=labels,
            numeric_labels=numeric_labels,
        )
        required: Required = []
        if labels is not None and isinstance(input_ids, Tensor):  # in the order the checks were always made
            _like_input_ids("labels", labels, input_ids)
            if numeric_labels is not None:
                _like_input_ids("numeric_labels", numeric_labels, input_ids, required)
        _check_input_ids(config, input_ids, required)
        _check_values(config, input_ids, numeric_values, required)
        past_length = cache.get_seq_length() if cache is not None else 0
        _check_mask_and_positions(config, input_ids, attention_mask, past_length, position_ids, required)
        if labels is not None:
            _check_labels(
                config,
                input_ids,
                labels,
                numeric_labels,
                numeric_values=numeric_values,
                attention_mask=attention_mask,
                threshold=threshold,
                required=required,
            )
        all_ones = [(attention_mask == 1).all()] if attention_mask is not None else []
        flags = torch.stack([ok.all() for ok, _ in required] + all_ones).tolist()  # the one host synchronisation
        for flag, (_, error) in zip(flags, required):
            if not flag:
                raise error()  # the first failed check, in the order they were required
        mask = None if attention_mask is None or flags[-1] else attention_mask
    if position_ids is None and mask is not None:
        position_ids = position_ids_from_mask(mask)[:, -input_ids.shape[1] :]  # [B, S]
    return mask, position_ids
