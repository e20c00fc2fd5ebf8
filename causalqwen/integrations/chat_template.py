"""``apply_chat_template`` for `causalqwen.integrations.tokenizer.NumericTokenizer`: the wrapped tokenizer's
template, numbers as ``<NUM>`` and values.

The wrapped tokenizer renders the conversation with its own chat template (``<|im_start|>user ...<|im_end|>``
for Qwen2). The rendered text is then cut at the special tokens' texts the template wrote, which become their
special ids (as in transformers, where a template's text is encoded with special-token matching on), and the
text between them is encoded by the `NumericTokenizer`: every number of a message becomes ``<NUM>`` with its
value. ``<NUM>`` itself is never matched in the text (a typed ``"<NUM>"`` has no value): it stays characters.
"""

from __future__ import annotations

import re

from ..tokenization import RETURN_TENSORS, as_tensor_type, padded_lists

__all__ = ["apply_chat_template", "encode_with_special_texts"]


def encode_with_special_texts(tokenizer, text: str) -> tuple[list[int], list[float], list[str]]:
    """``(input_ids, numeric_values, number_texts)`` of a rendered template: the texts of the wrapped tokenizer's
    special tokens (``<NUM>`` excepted) become their ids with the value 0.0; the text between them is encoded
    by ``tokenizer.encode`` (numbers as ``<NUM>`` and values)."""
    hf = tokenizer.hf_tokenizer
    specials = {
        token.content: token_id
        for token_id, token in hf.added_tokens_decoder.items()
        if token.special and token.content != tokenizer.num_token
    }
    ids, values, number_texts, position = [], [], [], 0
    if specials:
        pattern = re.compile("|".join(re.escape(content) for content in sorted(specials, key=len, reverse=True)))
        matches = list(pattern.finditer(text))
    else:
        matches = []
    for match in [*matches, None]:
        end = match.start() if match is not None else len(text)
        if end > position:
            piece_ids, piece_values, piece_texts = tokenizer.encode(text[position:end], return_number_texts=True)
            ids += piece_ids
            values += piece_values
            number_texts += piece_texts
        if match is not None:
            ids.append(specials[match.group()])
            values.append(0.0)
            position = match.end()
    return ids, values, number_texts


def apply_chat_template(
    tokenizer,
    conversation,
    add_generation_prompt: bool = False,
    tokenize: bool = True,
    *,
    return_tensors: str | None = "pt",
    padding_side: str | None = None,
    return_dict: bool = True,
    **template_kwargs,
):
    """The conversation (a list of ``{"role": ..., "content": ...}``, or a list of them: a batch) rendered by the
    wrapped tokenizer's chat template (``add_generation_prompt`` and ``template_kwargs`` go to it); with
    ``tokenize=False`` the text, else a `causalqwen.NumericEncoding` (padded on ``padding_side``, default the
    tokenizer's) whose numbers are ``<NUM>`` and values and whose template special tokens are their special ids."""
    if return_tensors not in RETURN_TENSORS:
        raise ValueError(f'return_tensors must be "pt", "np" or None, got {return_tensors!r}')
    if return_dict is not True and tokenize:
        raise ValueError(
            "return_dict=False would give the ids without the numbers' values; a NumericTokenizer "
            "returns the whole encoding (input_ids, numeric_values, attention_mask)"
        )
    rendered = tokenizer.hf_tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    if not tokenize:
        return rendered
    texts = [rendered] if isinstance(rendered, str) else list(rendered)
    rows = [encode_with_special_texts(tokenizer, text) for text in texts]
    lengths = [len(ids) for ids, _, _ in rows]
    width = max(lengths)
    pad_token_id = tokenizer.pad_token_id if any(length < width for length in lengths) else 0
    if pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before a batch of conversations")
    side = tokenizer.padding_side if padding_side is None else padding_side
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    data = padded_lists([ids for ids, _, _ in rows], [values for _, values, _ in rows], width, pad_token_id, side)
    return tokenizer.encoding_class(as_tensor_type(data, return_tensors), [texts for _, _, texts in rows])
