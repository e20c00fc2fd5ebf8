"""The generation boundary: ``causalqwen.generate``, ``model.generate`` and the text-generation pipeline.

Prompt values of an integer or a half dtype, a ``<NUM>`` prompt without its values, a pipeline whose
tokenizer has another ``<NUM>``, a generation mode lost on reload; NumPy scalars, a tiny temperature or
``top_p``, the model's own output back in the pipeline, an empty prompt, arguments of the wrong type or shape,
a long ``max_new_tokens``, options of transformers' ``generate`` that would lose the values.
"""

from __future__ import annotations

import copy
import os

import torch

from ..cases import TrustCase, WrongResult
from ..fixtures import encoded_batch, fresh_dir, fresh_tiny_model, model_generate_trigger, numeric_pipeline, shared_tiny

__all__ = ["CASES"]


# =============================================================================================
# silent
# =============================================================================================


def _number_model():
    model = fresh_tiny_model().eval()
    with torch.no_grad():
        model.action.classification_head.bias[shared_tiny().tokenizer.num_token_id] = 1e4  # every step predicts <NUM>
        model.action.regression_head.weight.zero_()
        model.action.regression_head.bias.fill_(-100011.58)  # beyond float16, not an integer
    return model


def _generate_keeps(dtype):
    def trigger():
        from causalqwen import generate

        tokenizer = shared_tiny().tokenizer
        batch = tokenizer(["A cup of tea costs 2 dollars"], padding_side="left")
        out = generate(
            _number_model(),
            batch["input_ids"],
            batch["numeric_values"].to(dtype),
            batch["attention_mask"],
            max_new_tokens=1,
        )
        value = out.numeric_values[0, -1].item()
        if abs(value - -100011.58) > 0.01 or out.numeric_values.dtype != torch.float32:
            raise WrongResult(f"the predicted -100011.58 came back as {value!r} ({out.numeric_values.dtype})")

    return trigger


def _num_prompt_without_values():
    from causalqwen import generate

    batch = shared_tiny().tokenizer(["The price is 12.5 yuan and"])
    generate(shared_tiny().model, batch["input_ids"], max_new_tokens=2)


def _pipeline_other_num_token():
    from causalqwen import NumericTokenizer

    other = NumericTokenizer(copy.deepcopy(shared_tiny().tokenizer.hf_tokenizer), num_token="<QTY>")
    numeric_pipeline(tokenizer=other)


def _saved_generation_mode():
    from causalqwen import CausalQwenForCausalLM

    model = fresh_tiny_model()
    model.generation_config.mode = "causal"
    path = os.path.join(fresh_dir("mode"), "model")
    model.save_pretrained(path)
    mode = getattr(CausalQwenForCausalLM.from_pretrained(path).generation_config, "mode", None)
    if mode != "causal":
        raise WrongResult(f"the saved mode 'causal' came back as {mode!r}")


# =============================================================================================
# clarity
# =============================================================================================


def _numpy_scalars():
    import numpy as np

    from causalqwen import generate

    batch = shared_tiny().tokenizer(["A cup of tea costs"], padding_side="left")
    generate(
        shared_tiny().model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode="traditional",
        max_new_tokens=np.int64(2),
        temperature=np.float32(0.7),
        top_k=torch.tensor(5),
        top_p=np.float64(0.9),
        generator=torch.Generator().manual_seed(0),
    )


def _tiny_temperature():
    from causalqwen.inference import traditional_probabilities

    probs = traditional_probabilities(torch.tensor([[1.0, 3.0, 2.0]]), temperature=1e-45)
    if not torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0]])):
        raise WrongResult(f"expected the greedy distribution, got {probs.tolist()}")


def _digit_after_the_prompts_number():
    model = copy.deepcopy(shared_tiny().model)
    seven = shared_tiny().tokenizer.hf_tokenizer.convert_tokens_to_ids("7")
    with torch.no_grad():
        model.action.classification_head.bias[seven] = 1e4  # every step writes the digit 7
    text = numeric_pipeline(model=model)("The total is 5", max_new_tokens=2, mode="standard")[0]["generated_text"]
    if not text.startswith("The total is 5") or text.count("7") != 2 or "57" in text:
        raise WrongResult(f"the prompt's 5 and the generated digits ran together: {text!r}")


def _empty_prompt_in_a_batch():
    numeric_pipeline()(["hi", ""], batch_size=2, max_new_tokens=1)


def _tiny_top_p():
    from causalqwen import generate

    _, batch = encoded_batch()
    arguments = dict(mode="traditional", max_new_tokens=3, generator=torch.Generator().manual_seed(0))
    model = copy.deepcopy(shared_tiny().model).half()
    nucleus = generate(
        model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], top_p=1e-12, **arguments
    )
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], top_k=1, **arguments)
    if not torch.equal(nucleus.sequences, greedy.sequences):
        raise WrongResult(f"top_p=1e-12 gave {nucleus.sequences.tolist()}, greedy {greedy.sequences.tolist()}")


def _tiny_temperature_both_paths():
    from causalqwen import generate

    _, batch = encoded_batch()
    model = shared_tiny().model
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], mode="traditional", top_k=1, max_new_tokens=2)
    sampled = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        mode="traditional",
        do_sample=True,
        temperature=1e-46,
        max_new_tokens=2,
        return_dict_in_generate=True,
    )
    if not torch.equal(sampled.sequences, greedy.sequences):
        raise WrongResult(f"temperature 1e-46 gave {sampled.sequences.tolist()}, greedy {greedy.sequences.tolist()}")


CASES = [
    # ---- silent
    TrustCase(
        "generate-int64-prompt-values",
        "silent",
        "generate with int64 prompt values: a predicted -100011.58 (was cast to an int)",
        _generate_keeps(torch.int64),
        None,
    ),
    TrustCase(
        "generate-float16-prompt-values",
        "silent",
        "generate with float16 prompt values: a predicted -100011.58 (was -inf)",
        _generate_keeps(torch.float16),
        None,
    ),
    TrustCase(
        "num-prompt-without-values",
        "silent",
        "a prompt holding <NUM> with numeric_values=None (ran as 0)",
        _num_prompt_without_values,
        ValueError,
        "input_ids hold <NUM> .* but numeric_values is None",
    ),
    TrustCase(
        "pipeline-other-num-token",
        "silent",
        "the text-generation pipeline with a tokenizer whose <NUM> is not the model's (numbers vanished)",
        _pipeline_other_num_token,
        ValueError,
        r"tokenizer's <NUM> id \(\d+\) differs from the model's num_token_id \(\d+\)",
    ),
    TrustCase(
        "generation-mode-survives-reload",
        "silent",
        "a saved generation_config.mode (dropped on reload: standard ran)",
        _saved_generation_mode,
        None,
    ),
    # ---- clarity
    TrustCase(
        "generate-numpy-scalars",
        "clarity",
        "generate with NumPy and 0-d tensor scalars for its numbers",
        _numpy_scalars,
        None,
    ),
    TrustCase(
        "temperature-1e-45",
        "clarity",
        "traditional sampling at temperature 1e-45 (a raw RuntimeError)",
        _tiny_temperature,
        None,
    ),
    TrustCase(
        "pipeline-digit-after-number",
        "clarity",
        "the pipeline when a digit token follows the prompt's number (RuntimeError)",
        _digit_after_the_prompts_number,
        None,
    ),
    TrustCase(
        "pipeline-empty-prompt-in-batch",
        "clarity",
        "an empty prompt in a pipeline batch of two (a raw RuntimeError)",
        _empty_prompt_in_a_batch,
        ValueError,
        r"prompt 1 is empty",
    ),
    TrustCase(
        "generate-values-wrong-shape",
        "clarity",
        "model.generate with numeric_values of another shape (IndexError)",
        model_generate_trigger(numeric_values=lambda batch: batch["numeric_values"][:, :1]),
        ValueError,
        r"numeric_values shape \(1, 1\) must equal input_ids shape \(1, \d+\)",
    ),
    TrustCase(
        "generate-values-list",
        "clarity",
        "model.generate with numeric_values as a list (AttributeError)",
        model_generate_trigger(numeric_values=lambda batch: batch["numeric_values"].tolist()),
        TypeError,
        r"numeric_values must be a torch\.Tensor",
    ),
    TrustCase(
        "generate-labels",
        "clarity",
        "model.generate(labels=...) (silently ignored)",
        model_generate_trigger(labels=lambda batch: batch["input_ids"]),
        TypeError,
        r"generate\(\) does not take labels",
    ),
    TrustCase(
        "generate-max-new-tokens-1e9",
        "clarity",
        "model.generate(max_new_tokens=10**9) (45 s, then the output lost)",
        model_generate_trigger(max_new_tokens=10**9),
        ValueError,
        r"max_new_tokens \(1000000000\) exceeds max_position_embeddings=\d+",
    ),
    TrustCase(
        "generate-mask-list",
        "clarity",
        "model.generate with attention_mask as a list (AttributeError)",
        model_generate_trigger(attention_mask=lambda batch: batch["attention_mask"].tolist()),
        TypeError,
        r"attention_mask must be a torch\.Tensor",
    ),
    TrustCase(
        "top-p-1e-12",
        "clarity",
        "traditional sampling with top_p=1e-12 in float16 (probability tensor contains inf, nan)",
        _tiny_top_p,
        None,
    ),
    TrustCase(
        "temperature-0-in-float32",
        "clarity",
        "model.generate(do_sample=True, temperature=1e-46) (probability tensor contains nan)",
        _tiny_temperature_both_paths,
        None,
    ),
    TrustCase(
        "generate-prompt-lookup",
        "clarity",
        "model.generate(prompt_lookup_num_tokens=2) (AttributeError from inside)",
        model_generate_trigger(prompt_lookup_num_tokens=2),
        ValueError,
        r"prompt_lookup_num_tokens is not supported",
    ),
    TrustCase(
        "generate-generator-int",
        "clarity",
        "model.generate(mode='causal', generator=123) (a raw torch TypeError)",
        model_generate_trigger(mode="causal", generator=123),
        TypeError,
        r"generator must be a torch\.Generator, got int",
    ),
]
