"""Executable specification of the text-generation pipeline (causalqwen.integrations.pipelines).

The oracle: ``model.generate`` (itself equal to the reference loop `causalqwen.generate`) followed by
`NumericTokenizer.batch_decode` -- what the pipeline must give, with the prompt as the user wrote it; and Python's own
formatting of each generated float32 value at the resolution ``number_resolution="prompt"`` states (decision D17).
"""

import copy
import json
import math
import re

import numpy as np
import pytest
import torch
from transformers import pipeline

from causalqwen import NumericTokenizer, generate
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.float32 import format_number
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


def _expected_text(model, tokenizer, prompt, number_resolution, **kwargs):
    batch = tokenizer([prompt])
    out = model.generate(
        batch["input_ids"], numeric_values=batch["numeric_values"], return_dict_in_generate=True, **kwargs
    )
    text = tokenizer.batch_decode(
        out.sequences,
        out.numeric_values,
        out_of_vocab="mark",
        number_texts=batch.number_texts,
        number_resolution=number_resolution,
    )[0]
    return text, out.numeric_values[0].tolist()


def written_by_the_prompt_rule(value: float, prompt_decimals: int) -> str:
    """A generated value as ``number_resolution="prompt"`` writes it: at h = min(h_prompt, 10^(floor(log10|v|) - 1))
    with h_prompt = 10^-prompt_decimals, by Python's formatting of the float32 value (half to even, exact)."""
    decimals = prompt_decimals if value == 0 else max(prompt_decimals, 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


@pytest.mark.parametrize("mode", ["standard", "causal", "traditional", "shared_individual", "shared_noise"])
def test_generated_numbers_are_written_out_in_every_mode(tiny, mode):
    """By default at the prompt's resolution (its "12.50": at least to the cent); ``number_resolution=None``, every
    float32 digit, as ``decode`` writes them by default."""
    _, numbers, tokenizer = tiny
    pipe = _pipe(numbers, tokenizer)
    record = pipe(PROMPT, max_new_tokens=3, mode=mode, generator=torch.Generator().manual_seed(1))
    text, values = _expected_text(
        numbers, tokenizer, PROMPT, "prompt", max_new_tokens=3, mode=mode, generator=torch.Generator().manual_seed(1)
    )
    assert record[0]["generated_text"] == text and record[0]["numeric_values"] == values
    assert text.startswith(PROMPT) and "<NUM>" not in text
    generated = [value for value in tokenizer.encode(text[len(PROMPT) :])[1] if value != 0]
    assert len(generated) == 3  # three numbers written out, each read back as a number
    assert re.findall(r"-?\d+\.\d+", text[len(PROMPT) :]) == [written_by_the_prompt_rule(v, 2) for v in values[-3:]]
    every_digit = pipe(
        PROMPT, max_new_tokens=3, mode=mode, generator=torch.Generator().manual_seed(1), number_resolution=None
    )
    text, _ = _expected_text(
        numbers, tokenizer, PROMPT, None, max_new_tokens=3, mode=mode, generator=torch.Generator().manual_seed(1)
    )
    assert every_digit[0]["generated_text"] == text
    every = [float(np.float32(number)) for number in re.findall(r"-?\d+\.\d+", text[len(PROMPT) :])]
    assert every == values[-3:]  # each reads back as its float32 value


def test_generated_numbers_are_written_alike_alone_and_in_a_padded_batch(tiny):
    """A batch pads the shorter prompts, and the float32 values then differ in their last digits; written at the
    prompt's resolution (the default) the texts are those of each prompt alone."""
    _, numbers, tokenizer = tiny
    pipe = _pipe(numbers, tokenizer)
    prompts = [PROMPT, "It was 2.50 dollars and", "Costs: 1.25 and 3.75 and 9.99 and 7.10 and"]
    alone = [pipe(prompt, max_new_tokens=3)[0]["generated_text"] for prompt in prompts]
    batched = [rows[0]["generated_text"] for rows in pipe(prompts, max_new_tokens=3, batch_size=3)]
    assert batched == alone
    for text, prompt in zip(alone, prompts):
        assert text.startswith(prompt) and sum(value != 0 for value in tokenizer.encode(text[len(prompt) :])[1]) == 3


def test_a_record_is_its_prompts_own_whatever_the_batch_size(tiny):
    """A batch left-pads the shorter prompts for generation; each record keeps its own tokens only: the ids and the
    values of the prompt alone, then the new ones (the values to float32 rounding, which the padding moves)."""
    model, numbers, tokenizer = tiny
    prompts = ["The price is 12.50 dollars and", "x 1", "Costs: 1.25 and 3.75 and 9.99 and"]
    for chosen in (model, numbers):
        pipe = _pipe(chosen, tokenizer)
        alone = [pipe(prompt, max_new_tokens=4, return_tensors=True)[0] for prompt in prompts]
        batched = [rows[0] for rows in pipe(prompts, max_new_tokens=4, batch_size=3, return_tensors=True)]
        texts = [rows[0]["generated_text"] for rows in pipe(prompts, max_new_tokens=4, batch_size=3)]
        for prompt, one, row, text in zip(prompts, alone, batched, texts):
            prompt_ids, prompt_values = tokenizer.encode(prompt)
            assert row["generated_token_ids"] == one["generated_token_ids"]
            assert row["generated_token_ids"][: len(prompt_ids)] == prompt_ids
            assert len(row["numeric_values"]) == len(prompt_ids) + 4
            assert row["numeric_values"][: len(prompt_ids)] == prompt_values
            np.testing.assert_allclose(row["numeric_values"], one["numeric_values"], rtol=1e-5)
            assert text.startswith(prompt)


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
    assert prefixed == "up 3% from" + full[len(PROMPT) :]
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


@pytest.fixture(scope="module")
def pipes(tiny_in_eval, models):
    return {name: _pipe(model, tiny_in_eval[1]) for name, model in models.items()}


def test_a_digit_after_the_prompts_number_stays_a_separate_token(tiny_in_eval, pipes):
    _, tokenizer = tiny_in_eval
    pipe = pipes["digits"]
    assert pipe("The total is 5", max_new_tokens=2)[0]["generated_text"] == "The total is 5 77"
    assert pipe("The total is 5", max_new_tokens=2, return_full_text=False)[0]["generated_text"] == " 77"
    ids, values, texts = tokenizer.encode("The total is 5", return_number_texts=True)
    seven = tokenizer.hf_tokenizer.convert_tokens_to_ids("7")
    assert tokenizer.decode(ids + [seven, seven], values + [0.0, 0.0], number_texts=texts) == "The total is 5 77"
    assert tokenizer.decode_continuation(ids + [seven], values + [0.0], len(ids), number_texts=texts) == (
        "The total is 5",
        " 7",
    )


def test_a_generated_number_after_the_prompts_number(tiny_in_eval, models, pipes):
    """Each generated number is written with one space before it; the prompt's "5" stays where it was."""
    _, tokenizer = tiny_in_eval
    prompt = "The total is 5"
    record = pipes["numbers"](prompt, max_new_tokens=3, number_resolution=None)[0]  # every float32 digit
    batch = tokenizer([prompt])
    reference = generate(models["numbers"], batch["input_ids"], batch["numeric_values"], max_new_tokens=3)
    assert record["numeric_values"] == reference.numeric_values[0].tolist()
    generated = reference.numeric_values[0, -3:].tolist()
    assert record["generated_text"] == prompt + "".join(" " + format_number(value) for value in generated)


def test_the_pipeline_refuses_a_tokenizer_with_another_num_token(tiny_in_eval, tmp_path):
    model, tokenizer = tiny_in_eval
    other = NumericTokenizer(copy.deepcopy(tokenizer.hf_tokenizer), num_token="<QTY>")  # added beside <NUM>: id 604
    with pytest.raises(ValueError, match=r"<NUM> id \(604\) differs from the model's num_token_id \(603\)"):
        _pipe(model, other)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"num_token": "<QTY>"}))
    with pytest.raises(ValueError, match=r"differs from the model's num_token_id \(603\)"):
        pipeline("text-generation", model=str(tmp_path), trust_remote_code=True)
