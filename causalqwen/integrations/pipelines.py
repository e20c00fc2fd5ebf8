"""The ``"text-generation"`` pipeline of CausalQwen: transformers' own, with the numbers carried through.

transformers' `TextGenerationPipeline` tokenizes a prompt, calls ``model.generate(input_ids,
attention_mask)`` and decodes the ids. For CausalQwen three things must travel besides the ids: the
prompt's ``numeric_values`` (into ``generate``), the values ``generate`` gives the ``<NUM>`` tokens it
chose (``return_dict_in_generate=True``), and the surface text of the prompt's numbers (into
`NumericTokenizer.decode_continuation`, which tells the continuation from the prompt by token counts).
`NumericTextGenerationPipeline` overrides exactly those three steps, and refuses a tokenizer whose ``<NUM>``
is not the model's and an empty prompt; everything else (batching, ``return_full_text``,
``max_new_tokens``, ``stop_sequence``, CausalQwen's ``mode`` and ``generator`` passed on to ``generate``)
is the parent's. Generated numbers are written at ``number_resolution="prompt"`` unless the call says otherwise
(`causalqwen.writing`; None writes every float32 digit).

A saved CausalQwen names this class in ``config.json`` (``custom_pipelines``), so
``pipeline("text-generation", model=directory, trust_remote_code=True)`` builds it; for a model in
memory pass ``pipeline_class=NumericTextGenerationPipeline``.
"""

from __future__ import annotations

from transformers import TextGenerationPipeline
from transformers.pipelines.text_generation import ReturnType

from ..writing import check_resolution
from .tokenizer import NumericTokenizer

__all__ = ["NumericTextGenerationPipeline"]

# preprocess arguments of the parent that need a chat template or the wrapped tokenizer's own encoding
_UNSUPPORTED = ("handle_long_generation", "continue_final_message", "tokenizer_encode_kwargs", "tools", "documents")
# an empty prompt: the parent would call generate without ids, or fail to pad it into a batch
_EMPTY = "{which} is empty: the model continues a text of at least one token"
# how generated numbers are written when the call does not say (causalqwen.writing)
DEFAULT_NUMBER_RESOLUTION = "prompt"
# number_resolution not given to the call (None is a value: every float32 digit)
_NOT_GIVEN = object()


class NumericTextGenerationPipeline(TextGenerationPipeline):
    """`TextGenerationPipeline` for a CausalQwen model and its `NumericTokenizer`: each record's
    ``generated_text`` has every number written out -- the prompt's as they were written, the generated
    ones as their values (`NumericTokenizer.decode`) -- and ``numeric_values`` lists the value beside
    every token of the sequence."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.tokenizer, NumericTokenizer):
            raise TypeError(
                f"{type(self).__name__} needs a causalqwen NumericTokenizer as its tokenizer, got "
                f"{type(self.tokenizer).__name__}"
            )
        model_num = getattr(self.model.config, "num_token_id", None)
        if self.tokenizer.num_token_id != model_num:
            raise ValueError(
                f"the tokenizer's <NUM> id ({self.tokenizer.num_token_id}) differs from the model's num_token_id "
                f"({model_num}): its num_token {self.tokenizer.num_token!r} is not the model's number token, so the "
                "prompt's numbers would reach the model as another token and the generated ones would be lost; use "
                "the tokenizer saved with the model"
            )

    def __call__(self, text_inputs, **kwargs):
        """The parent's call, with an empty prompt refused by its index (the model needs a token to continue)."""
        if not kwargs.get("prefix"):
            if isinstance(text_inputs, str) and not text_inputs:
                raise ValueError(_EMPTY.format(which="the prompt"))
            if isinstance(text_inputs, (list, tuple)):
                for index, text in enumerate(text_inputs):
                    if isinstance(text, str) and not text:
                        raise ValueError(_EMPTY.format(which=f"prompt {index}"))
        return super().__call__(text_inputs, **kwargs)

    def _sanitize_parameters(self, prefix=None, stop_sequence=None, number_resolution=_NOT_GIVEN, **kwargs):
        preprocess_params, forward_params, postprocess_params = super()._sanitize_parameters(
            stop_sequence=stop_sequence, **kwargs
        )
        if number_resolution is not _NOT_GIVEN:  # how generated numbers are written (causalqwen.writing)
            postprocess_params["number_resolution"] = check_resolution(number_resolution)
        if prefix is not None:  # the parent measures the prefix with a transformers tokenizer call
            preprocess_params["prefix"] = prefix
            if prefix:
                forward_params["prefix_length"] = len(self.tokenizer.encode(prefix)[0])
        if stop_sequence is not None:  # transformers' stop-string matcher reads the wrapped tokenizer's vocabulary
            forward_params["tokenizer"] = self.tokenizer.hf_tokenizer
        return preprocess_params, forward_params, postprocess_params

    def preprocess(
        self,
        prompt_text,
        *,
        prefix="",
        add_special_tokens=None,
        truncation=None,
        padding=None,
        max_length=None,
        **generate_kwargs,
    ):
        if not isinstance(prompt_text, str):
            raise TypeError(f"{type(self).__name__} takes str prompts (no chats), got {type(prompt_text).__name__}")
        unsupported = [name for name in _UNSUPPORTED if generate_kwargs.get(name) is not None]
        if add_special_tokens:
            unsupported.append("add_special_tokens")
        if unsupported:
            raise ValueError(f"{type(self).__name__} does not support {', '.join(unsupported)}")
        encoding = self.tokenizer(
            prefix + prompt_text, max_length=max_length, truncation=bool(truncation), return_tensors="pt"
        )
        if encoding["input_ids"].shape[1] == 0:
            raise ValueError(_EMPTY.format(which="the prompt"))
        return {
            "input_ids": encoding["input_ids"],  # [1, S]
            "attention_mask": encoding["attention_mask"],  # [1, S]
            "numeric_values": encoding["numeric_values"],  # [1, S]
            "number_texts": encoding.number_texts[0],
            "prompt_text": prompt_text,
        }

    def _forward(self, model_inputs, **generate_kwargs):
        numeric_values = model_inputs.pop("numeric_values")  # [B, S]
        number_texts = model_inputs.pop("number_texts")
        generate_kwargs = {**generate_kwargs, "numeric_values": numeric_values, "return_dict_in_generate": True}
        model_outputs = super()._forward(model_inputs, **generate_kwargs)  # numeric_values: [B, n, S + T]
        model_outputs["number_texts"] = number_texts
        model_outputs["prompt_mask"] = model_inputs.get("attention_mask")  # [B, S]: 0 where a batch padded a prompt
        return model_outputs

    def postprocess(
        self,
        model_outputs,
        *,
        return_type=ReturnType.FULL_TEXT,
        clean_up_tokenization_spaces=None,
        continue_final_message=None,
        skip_special_tokens=None,
        tools=None,
        number_resolution=DEFAULT_NUMBER_RESOLUTION,
    ):
        """One record per generated sequence: the text (the prompt as given, then the continuation with its
        numbers written out at ``number_resolution``: ``"prompt"`` by default, a power of ten, or None for the
        shortest float32 text; `causalqwen.writing`) or, with ``return_tensors=True``, the ids; and the values
        beside the ids.

        The prompt and the continuation are told apart by their token counts (`NumericTokenizer.decode_continuation`):
        whatever space keeps a generated digit or number from running into the prompt's last number starts the
        continuation, and the prompt stays as given."""
        sequences = model_outputs["generated_sequence"][0].tolist()  # n rows of S + T ids
        values = model_outputs["numeric_values"][0].tolist()  # n rows of S + T values
        number_texts = model_outputs["number_texts"]
        input_ids = model_outputs["input_ids"]
        prompt_length = 0 if input_ids is None else input_ids.shape[-1]
        mask = model_outputs.get("prompt_mask")  # [1, S]
        if mask is not None and not bool(mask.all()):  # a prompt padded in a batch: its record drops the padding,
            real = mask[0].bool().tolist() + [True] * (len(sequences[0]) - prompt_length)  # as if it ran alone
            sequences = [[i for i, keep in zip(ids, real) if keep] for ids in sequences]
            values = [[v for v, keep in zip(row, real) if keep] for row in values]
            prompt_length = int(mask.sum())
        skip = True if skip_special_tokens is None else skip_special_tokens
        records = []
        for ids, row_values in zip(sequences, values):
            if return_type == ReturnType.TENSORS:
                records.append({"generated_token_ids": ids, "numeric_values": row_values})
                continue
            _, new_text = self.tokenizer.decode_continuation(
                ids,
                row_values,
                prompt_length,
                skip,
                out_of_vocab="mark",
                number_texts=number_texts,
                number_resolution=number_resolution,
            )
            text = model_outputs["prompt_text"] + new_text if return_type == ReturnType.FULL_TEXT else new_text
            records.append({"generated_text": text, "numeric_values": row_values})
        return records
