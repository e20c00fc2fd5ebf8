"""Executable specification of the text-generation pipeline (causalqwen.integrations.pipelines).

The oracle: ``model.generate`` (itself equal to the reference loop `causalqwen.generate`) followed by
`NumericTokenizer.batch_decode` -- what the pipeline must give, with the prompt as the user wrote it.
"""

import copy

import pytest
import torch
from transformers import pipeline

from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.integrations.pipelines import NumericTextGenerationPipeline

PROMPT = "The price is 12.50 yuan, up 3% from"


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    numbers = copy.deepcopy(model)
    with torch.no_grad():  # a model that predicts <NUM> at every step, so every continuation is numbers
        numbers.action.classification_head.bias[numbers.config.num_token_id] = 1e4
    return model, numbers, tokenizer


def _pipe(model, tokenizer):
    return pipeline("text-generation", model=model, tokenizer=tokenizer, pipeline_class=NumericTextGenerationPipeline)


def _expected_text(model, tokenizer, prompt, **kwargs):
    batch = tokenizer([prompt])
    out = model.generate(batch["input_ids"], numeric_values=batch["numeric_values"], return_dict_in_generate=True,
                         **kwargs)
    text = tokenizer.batch_decode(out.sequences, out.numeric_values, out_of_vocab="mark",
                                  number_texts=batch.number_texts)[0]
    return text, out.numeric_values[0].tolist()


@pytest.mark.parametrize("mode", ["standard", "causal", "traditional", "shared_individual", "shared_noise"])
def test_generated_numbers_are_written_out_in_every_mode(tiny, mode):
    _, numbers, tokenizer = tiny
    record = _pipe(numbers, tokenizer)(PROMPT, max_new_tokens=3, mode=mode, generator=torch.Generator().manual_seed(1))
    text, values = _expected_text(numbers, tokenizer, PROMPT, max_new_tokens=3, mode=mode,
                                  generator=torch.Generator().manual_seed(1))
    assert record[0]["generated_text"] == text and record[0]["numeric_values"] == values
    assert text.startswith(PROMPT) and "<NUM>" not in text
    generated = tokenizer.encode(text[len(PROMPT):])[1]
    assert sum(value != 0 for value in generated) == 3  # three numbers written out, each read back as a number


def test_the_parents_options(tiny):
    """return_full_text=False, return_tensors=True, a prefix, a stop sequence and batching behave as in
    transformers' own pipeline; a batch of two gives what each prompt gives alone (left padding)."""
    model, numbers, tokenizer = tiny
    pipe = _pipe(numbers, tokenizer)
    full = pipe(PROMPT, max_new_tokens=2)[0]["generated_text"]
    assert PROMPT + pipe(PROMPT, max_new_tokens=2, return_full_text=False)[0]["generated_text"] == full
    ids = pipe(PROMPT, max_new_tokens=2, return_tensors=True)[0]["generated_token_ids"]
    assert ids[-2:] == [numbers.config.num_token_id] * 2
    prefixed = pipe("up 3% from", prefix="The price is 12.50 yuan, ", max_new_tokens=2)[0]["generated_text"]
    assert prefixed == "up 3% from" + full[len(PROMPT):]
    prompts = [PROMPT, "on day 3 we counted 41 birds and"]
    plain = _pipe(model, tokenizer)
    alone = [plain(prompt, max_new_tokens=4)[0]["generated_text"] for prompt in prompts]
    batched = [rows[0]["generated_text"] for rows in plain(prompts, max_new_tokens=4, batch_size=2)]
    assert batched == alone
    stopped = pipe(PROMPT, max_new_tokens=6, stop_sequence="<NUM>", return_tensors=True)[0]["generated_token_ids"]
    assert len(stopped) == len(ids) - 1  # transformers' stop strings match the token text: one number, then stop


def test_refusals(tiny):
    model, _, tokenizer = tiny
    with pytest.raises(TypeError, match="needs a causalqwen NumericTokenizer"):
        _pipe(model, tokenizer.hf_tokenizer)
    pipe = _pipe(model, tokenizer)
    with pytest.raises(TypeError, match="takes str prompts"):
        pipe([{"role": "user", "content": "hi"}], max_new_tokens=1)
    with pytest.raises(ValueError, match="does not support add_special_tokens"):
        pipe("hi", max_new_tokens=1, add_special_tokens=True)
