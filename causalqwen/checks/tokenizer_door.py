"""The tokenizer's door: every check of `NumericTokenizer`'s ``encode``, ``__call__``, ``decode`` and ``batch_decode``.

Texts must be Unicode text (a str without lone surrogates) and not longer than `MAX_TEXT_CHARS` unless a
``max_length`` bounds what is read of them: then only a prefix reaches the wrapped tokenizer, however long the
text (`causalqwen.tokenization.bounded_prefixes`), and it reads the same numbers and first tokens as the whole text.
The batch arguments must be among the values documented. What is decoded may come as lists, tensors or arrays,
as an encoding, or as a generation output (``sequences``); it is turned into lists here (`is_batch` tells one
row from a batch, as transformers does), and every error names the argument, the row and the position.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np
import torch

from ..numbers import parse_number
from ..tokenization import RETURN_TENSORS, check_number_text_count

__all__ = [
    "MAX_TEXT_CHARS",
    "NUM_TOKEN_FIX",
    "num_token_clash",
    "check_text",
    "check_max_length",
    "check_call_arguments",
    "check_decode_arguments",
    "check_prompt_length",
    "checked_number_texts",
    "check_number_text_count",
    "is_batch",
    "is_empty",
    "batch_rows",
    "kept_positions",
]

# The longest text `encode` takes whole. The Rust tokenizer needs about 100 bytes of memory per character
# and aborts the process when it cannot get them, so longer texts are refused before they reach it
# (or, with a token limit, only a prefix is encoded).
MAX_TEXT_CHARS = 10_000_000


def num_token_clash(hf_tokenizer, num_token: str) -> str | None:
    """What ``num_token`` already is in the wrapped ``hf_tokenizer``, worded to follow "is" (``"the wrapped
    tokenizer's eos_token and pad_token (id 600)"``), or None when it may be the number token: a token the
    tokenizer does not have yet (it is added), or a special added token with no other role -- the ``<NUM>`` a
    `NumericTokenizer` added before, in place or in a directory its ``save_pretrained`` wrote. A named special
    token (end of text, padding, ...; ``num_token``'s own entry aside), one of the extra special tokens (those
    of a chat template) and an ordinary token are each another token: numbers would encode as it."""
    vocab_id = hf_tokenizer.get_vocab().get(num_token)
    id_text = f" (id {vocab_id})" if vocab_id is not None else ""
    roles = [
        role for role, token in hf_tokenizer.special_tokens_map.items() if role != "num_token" and token == num_token
    ]
    if roles:
        named = roles[0] if len(roles) == 1 else ", ".join(roles[:-1]) + " and " + roles[-1]
        return f"the wrapped tokenizer's {named}{id_text}"
    extra = [str(token) for token in getattr(hf_tokenizer, "extra_special_tokens", None) or []]
    if num_token in extra:
        return f"one of the wrapped tokenizer's extra special tokens{id_text}"
    if vocab_id is None:
        return None
    added = hf_tokenizer.added_tokens_decoder.get(vocab_id)
    # An id below vocab_size is the tokenizer model's own (BPE) token, even where the loader made it special
    # (transformers does so for any *_token a tokenizer_config.json names).
    if vocab_id < hf_tokenizer.vocab_size or added is None or not added.special:
        return f"an ordinary token of the wrapped tokenizer{id_text}, which ordinary text also produces"
    return None


NUM_TOKEN_FIX = (
    "choose a token the tokenizer does not have; NumericTokenizer adds it as a special token (the default '<NUM>')"
)


def check_num_token(hf_tokenizer, num_token: str, where: str = "") -> None:
    """The one check of a number token against the tokenizer that is to hold it, for `NumericTokenizer` and for
    ``from_qwen``, which reads the ``<NUM>`` id from a base's tokenizer: a ``ValueError`` naming the clash
    (`num_token_clash`) and, where given, ``where`` the tokenizer came from."""
    clash = num_token_clash(hf_tokenizer, num_token)
    if clash is not None:
        source = f" (the tokenizer of {where!r})" if where else ""
        raise ValueError(
            f"num_token {num_token!r} is {clash}{source}: numbers would encode as that token; {NUM_TOKEN_FIX}"
        )


def check_text(text, max_length: int | None = None) -> None:
    """A ``TypeError`` unless ``text`` is a str; a ``ValueError`` naming the character if it holds a lone
    surrogate (a str that is not Unicode text: it has no UTF-8 encoding, and the tokenizer would fail), or if it
    is longer than `MAX_TEXT_CHARS`, too long to encode whole, and no ``max_length`` bounds it."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"character {error.start} of the text is {text[error.start]!r}, a lone surrogate: not valid Unicode "
            "(decode bytes with errors='strict', or replace it)"
        ) from None
    if max_length is None and len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"the text has {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} encoded whole (the Rust "
            "tokenizer needs about 100 bytes per character); pass max_length (with truncation) or split the text"
        )


def check_max_length(max_length) -> int | None:
    """``encode``'s ``max_length``: None or a positive int."""
    if max_length is None:
        return None
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    return int(max_length)


def check_call_arguments(
    texts,
    padding,
    max_length,
    padding_side,
    truncation,
    *,
    return_tensors,
    return_attention_mask,
    add_special_tokens,
    hf_tokenizer,
) -> tuple[list[str], bool | str, bool]:
    """The argument checks of ``NumericTokenizer.__call__``, then of each text (named by its index), then of
    ``return_tensors``, ``return_attention_mask`` and ``add_special_tokens``; the texts as a list,
    ``padding`` (``"do_not_pad"`` read as False) and ``truncation`` as a bool (transformers' names
    ``"longest_first"`` and ``"do_not_truncate"`` read as True and False).

    ``return_attention_mask`` must be a bool; ``add_special_tokens`` None, False, or True where the wrapped
    ``hf_tokenizer`` adds none (Qwen2's): a ``NumericTokenizer`` never adds them, so True would be a promise broken
    for a tokenizer that adds a BOS or an EOS."""
    if isinstance(texts, str):
        texts = [texts]
    elif isinstance(texts, (list, tuple)):
        texts = list(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{index}] must be a str, got {type(text).__name__}")
    else:
        raise TypeError(f"texts must be a str or a list of str, got {type(texts).__name__}")
    if not texts:
        raise ValueError("texts is an empty list; give at least one text")
    padding = False if isinstance(padding, str) and padding == "do_not_pad" else padding
    if not (padding is True or padding is False or (isinstance(padding, str) and padding in PADDING_NAMES)):
        pair = TEXT_PAIR_HINT if isinstance(padding, (str, list)) else ""
        raise ValueError(
            f"padding must be one of True, False, 'longest', 'max_length', 'do_not_pad'; got {padding!r}{pair}"
        )
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if isinstance(truncation, str) and truncation in ("longest_first", "do_not_truncate"):
        truncation = truncation == "longest_first"  # transformers' names
    if not isinstance(truncation, bool):
        raise TypeError(f"truncation must be a bool, 'longest_first' or 'do_not_truncate', got {truncation!r}")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral)):
        raise TypeError(f"max_length must be an int or None, got {type(max_length).__name__}")
    if max_length is not None and max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if padding == "max_length" and max_length is None:
        raise ValueError("padding='max_length' needs max_length")
    if truncation and max_length is None:
        raise ValueError("truncation=True needs max_length")
    try:  # every text valid Unicode and short enough to encode whole, looked at once; the culprit named if not
        "".join(texts).encode("utf-8")
        fine = max_length is not None or max(map(len, texts)) <= MAX_TEXT_CHARS
    except UnicodeEncodeError:
        fine = False
    if not fine:
        _check_each_text(texts, max_length)
    if return_tensors not in RETURN_TENSORS:
        raise ValueError(f'return_tensors must be "pt", "np" or None, got {return_tensors!r}')
    if not isinstance(return_attention_mask, bool):
        raise TypeError(f"return_attention_mask must be a bool, got {type(return_attention_mask).__name__}")
    if add_special_tokens is not None:
        _check_add_special_tokens(add_special_tokens, hf_tokenizer)
    return texts, padding, truncation


def _check_each_text(texts: list[str], max_length: int | None) -> None:
    """`check_text` of each text, the first that fails named by its index."""
    for index, text in enumerate(texts):
        try:
            check_text(text, max_length)
        except ValueError as error:
            raise ValueError(f"text {index}: {error}") from None


def _check_add_special_tokens(add_special_tokens, hf_tokenizer) -> None:
    """``add_special_tokens`` given: a bool, and True only where the wrapped tokenizer adds no special token."""
    if not isinstance(add_special_tokens, bool):
        raise TypeError(f"add_special_tokens must be a bool, got {type(add_special_tokens).__name__}")
    if add_special_tokens and list(hf_tokenizer("a", add_special_tokens=True)["input_ids"]) != list(
        hf_tokenizer("a", add_special_tokens=False)["input_ids"]
    ):
        raise ValueError(
            "add_special_tokens=True: the wrapped tokenizer adds special tokens, which a NumericTokenizer never does; "
            "pass add_special_tokens=False and put them in as ids"
        )


PADDING_NAMES = ("longest", "max_length")
TEXT_PAIR_HINT = (
    " (the second positional argument is padding: text pairs, transformers' text_pair, are not supported; join the "
    "two texts or encode each alone)"
)


def check_decode_arguments(
    input_ids, numeric_values, skip_special_tokens, out_of_vocab, number_texts, *, size: int
) -> tuple[list[int], list[float], list[str]]:
    """``decode``'s door: the ids, values and surface texts as lists, or an error naming the argument; ``size``
    is the tokenizer's number of tokens (an id at or beyond it is one of a model's reserved rows)."""
    if isinstance(input_ids, numbers.Integral) and not isinstance(input_ids, bool):  # one id, as transformers takes
        input_ids = [input_ids]
        numeric_values = (
            numeric_values
            if numeric_values is None or not isinstance(numeric_values, numbers.Real)
            else [numeric_values]
        )
    ids = _as_id_list(input_ids, "input_ids")
    values = [0.0] * len(ids) if numeric_values is None else _as_value_list(numeric_values, "numeric_values")
    if len(ids) != len(values):
        raise ValueError(
            f"input_ids has length {len(ids)} but numeric_values has length {len(values)}; they must match"
        )
    if out_of_vocab not in ("raise", "mark"):
        raise ValueError(f'out_of_vocab must be "raise" or "mark", got {out_of_vocab!r}')
    if not isinstance(skip_special_tokens, bool):
        raise TypeError(f"skip_special_tokens must be a bool, got {type(skip_special_tokens).__name__}")
    surfaces = [] if number_texts is None else checked_number_texts(number_texts)
    for position, token_id in enumerate(ids):
        if token_id < 0:  # no model predicts a negative id: out_of_vocab="mark" cannot write it either
            raise ValueError(
                f"input_ids[{position}] = {token_id} is not a token id of this tokenizer (0 to {size - 1}): a "
                'negative id is never a model\'s prediction, so out_of_vocab="mark" does not apply to it (it marks '
                f"only ids >= {size}, the model's reserved rows)"
            )
        if token_id >= size and out_of_vocab == "raise":
            raise ValueError(
                f"input_ids[{position}] = {token_id} is not a token id of this tokenizer (0 to {size - 1}); "
                'an untrained model can predict its reserved rows: pass out_of_vocab="mark" to write them as <unk:ID>'
            )
    return ids, values, surfaces


def check_prompt_length(prompt_length, length: int) -> int:
    """``decode_continuation``'s ``prompt_length``: an int from 0 to ``length``."""
    if (
        isinstance(prompt_length, bool)
        or not isinstance(prompt_length, numbers.Integral)
        or not 0 <= prompt_length <= length
    ):
        raise ValueError(f"prompt_length must be an int from 0 to len(input_ids)={length}, got {prompt_length!r}")
    return int(prompt_length)


def is_batch(input_ids) -> bool:
    """Whether ``input_ids`` holds rows: a 2-D (or more) tensor or array, or a non-empty list whose first element
    is a sequence, as transformers' ``decode`` tells a batch from one sequence."""
    if isinstance(input_ids, (torch.Tensor, np.ndarray)):
        return input_ids.ndim >= 2
    if not isinstance(input_ids, (list, tuple)) or len(input_ids) == 0:
        return False
    first = input_ids[0]
    return isinstance(first, (list, tuple)) or (isinstance(first, (torch.Tensor, np.ndarray)) and first.ndim >= 1)


def is_empty(input_ids) -> bool:
    """An empty sequence of ids (an empty list, or a tensor without elements): a batch of no rows."""
    if isinstance(input_ids, (torch.Tensor, np.ndarray)):
        return input_ids.size == 0 if isinstance(input_ids, np.ndarray) else input_ids.numel() == 0
    return isinstance(input_ids, (list, tuple)) and len(input_ids) == 0


def batch_rows(input_ids, numeric_values, number_texts) -> list[tuple]:
    """``batch_decode``'s door: one ``(ids, values, mask or None, number_texts or None, prompt_length or None)`` per
    row, from an encoding or a generation output (``input_ids`` alone, its ``number_texts`` attribute used unless
    given), or from ``input_ids`` and ``numeric_values`` [B, S] as tensors, arrays or lists of rows.
    ``prompt_length``: how many of the row's first ids are the prompt -- the whole row of an encoding, a generation
    output's ``prompt_length``, None for bare ids and values (where the prompt ends is not said)."""
    mask, prompt_length, whole_prompt = None, None, False
    if isinstance(input_ids, Mapping):
        if numeric_values is not None:
            raise TypeError("pass the encoding alone, or input_ids and numeric_values, not both")
        encoding = input_ids
        input_ids, numeric_values, mask = _unpack_encoding(encoding)
        number_texts = getattr(encoding, "number_texts", None) if number_texts is None else number_texts
        prompt_length = encoding.get("prompt_length")  # a generation output's prompt width S
        whole_prompt = "input_ids" in encoding and hasattr(encoding, "number_texts")  # the tokenizer's: all prompt
    id_rows = _as_rows(input_ids, "input_ids")
    # plain ids (no values): each <NUM> is written as the number token itself
    value_rows = [None] * len(id_rows) if numeric_values is None else _as_rows(numeric_values, "numeric_values")
    mask_rows = _as_rows(mask, "attention_mask") if mask is not None else [None] * len(id_rows)
    text_rows = _as_text_rows(number_texts, len(id_rows))
    if not len(id_rows) == len(value_rows) == len(mask_rows):
        raise ValueError(
            f"input_ids has {len(id_rows)} rows but numeric_values has {len(value_rows)}"
            + (f" and attention_mask {len(mask_rows)}" if mask is not None else "")
            + "; they must match"
        )
    prompt_lengths = [len(ids) if whole_prompt else prompt_length for ids in id_rows]
    return list(zip(id_rows, value_rows, mask_rows, text_rows, prompt_lengths))


def kept_positions(ids, values, mask) -> tuple[list, list | None]:
    """The positions of one row where ``mask`` is not 0 (padding and what follows an EOS are dropped); ``values``
    None (plain ids) stays None."""
    flags = mask.tolist() if isinstance(mask, (torch.Tensor, np.ndarray)) else list(mask)
    if any(flag not in (0, 1) for flag in flags):  # bools compare equal to 0 and 1
        raise ValueError(f"attention_mask must hold only 0 and 1, got {sorted(set(flags) - {0, 1})[:3]}")
    keep = [bool(flag) for flag in flags]
    ids = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else list(ids)
    if values is not None:
        values = values.tolist() if isinstance(values, (torch.Tensor, np.ndarray)) else list(values)
    if not len(keep) == len(ids) == (len(values) if values is not None else len(ids)):
        raise ValueError(f"attention_mask has length {len(keep)} but input_ids {len(ids)}; they must match")
    kept_values = None if values is None else [v for v, k in zip(values, keep) if k]  # None: plain ids, no values
    return [i for i, k in zip(ids, keep) if k], kept_values


def _unpack_encoding(encoding: Mapping):
    """``(input_ids, numeric_values, attention_mask or None)`` of an encoding or a generation output."""
    key = "input_ids" if "input_ids" in encoding else "sequences"
    missing = [name for name in (key, "numeric_values") if encoding.get(name) is None]
    if missing:
        raise ValueError(
            f"the encoding has no {' and no '.join(missing)} (keys: {', '.join(map(str, encoding.keys()))})"
        )
    return encoding[key], encoding["numeric_values"], encoding.get("attention_mask")


def _as_rows(data, name: str) -> list:
    """Split a 2-D tensor/array or a list of sequences into a list of rows."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 2:
            raise ValueError(f"{name} must be 2-D [batch, sequence], got shape {tuple(data.shape)}")
        return list(data)
    if isinstance(data, (list, tuple)):
        return list(data)
    raise TypeError(f"{name} must be a 2-D tensor, array or a list of rows, got {type(data).__name__}")


def _as_id_list(data, name: str) -> list[int]:
    """Convert a 1-D integer tensor/array or a sequence of ints into a list of ints."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(data.shape)}")
        is_integer = (
            not data.dtype.is_floating_point and not data.dtype.is_complex and data.dtype != torch.bool
            if isinstance(data, torch.Tensor)
            else np.issubdtype(data.dtype, np.integer)
        )
        if not is_integer:
            raise TypeError(f"{name} must hold integers, got dtype {data.dtype}")
        return [int(token_id) for token_id in data.tolist()]
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"{name} must be a list of ints or a 1-D tensor, got {type(data).__name__}")
    for position, token_id in enumerate(data):
        if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"{name}[{position}] must be an int, got {type(token_id).__name__}")
    return [int(token_id) for token_id in data]


def _as_value_list(data, name: str) -> list[float]:
    """Convert a 1-D tensor/array or a sequence of real numbers into a list of floats."""
    if isinstance(data, (torch.Tensor, np.ndarray)):
        if data.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(data.shape)}")
        if isinstance(data, torch.Tensor) and (data.dtype.is_complex or data.dtype == torch.bool):
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        if isinstance(data, np.ndarray) and not (
            np.issubdtype(data.dtype, np.floating) or np.issubdtype(data.dtype, np.integer)
        ):
            raise TypeError(f"{name} must hold real numbers, got dtype {data.dtype}")
        return [float(value) for value in data.tolist()]
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"{name} must be a list of numbers or a 1-D tensor, got {type(data).__name__}")
    values = []
    for position, value in enumerate(data):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
            raise TypeError(f"{name}[{position}] must be a real number, got {type(value).__name__}")
        try:
            values.append(float(value))
        except OverflowError:  # a Python int beyond the float64 range: decode then names it as infinite
            values.append(math.inf if value > 0 else -math.inf)
    return values


def checked_number_texts(number_texts, name: str = "number_texts") -> list[str]:
    """The texts of one prompt's numbers as written (an encoding's ``number_texts[b]``): a list or tuple of str, each
    one that the numeric grammar reads as exactly one number (`causalqwen.numbers.parse_number`, the rule the
    tokenizer found it by), else a ``TypeError`` or ``ValueError`` naming ``name``, the index and the value. The one
    check of ``number_texts`` wherever they enter: ``decode``, ``generate`` and `NumericTextStreamer`."""
    if not isinstance(number_texts, (list, tuple)):
        raise TypeError(f"{name} must be a list of str, the prompt's numbers as written, got {number_texts!r:.80}")
    for index, text in enumerate(number_texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] must be a str, got {type(text).__name__} {text!r:.80}")
        try:
            parse_number(text)
        except ValueError as error:
            raise ValueError(
                f"{name}[{index}] = {text!r:.80} is not a number text: each is one number of the prompt as written "
                f"({error})"
            ) from None
    return list(number_texts)


def _as_text_rows(number_texts, rows: int) -> list:
    """``number_texts`` of a batch: None, or one list of str per row."""
    if number_texts is None:
        return [None] * rows
    if not isinstance(number_texts, (list, tuple)):
        raise TypeError(f"number_texts must be a list with one list of str per row, got {type(number_texts).__name__}")
    if len(number_texts) != rows:
        raise ValueError(f"number_texts has {len(number_texts)} rows but input_ids has {rows}; they must match")
    return list(number_texts)
