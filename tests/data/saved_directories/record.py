"""Write a saved directory with the causalqwen on ``PYTHONPATH``, and record what it gives at that version.

Run with a checkout of the version whose file format the directory keeps, each step in a fresh interpreter:

    PYTHONPATH=<checkout> python tests/data/saved_directories/record.py save <directory>
    PYTHONPATH=<checkout> python tests/data/saved_directories/record.py record <directory> <outputs.json> <commit>

``save`` converts the tiny base (`build_tiny_causal_lm` with seed 0 and init seed 0, that version's default
initialisation) and writes the model and its tokenizer with ``save_pretrained``. ``record`` loads the directory as a
user does (transformers' Auto classes and ``pipeline`` with ``trust_remote_code=True``) and writes, as JSON, the
config's head fields, the tokenizer's encoding of `TEXTS`, the forward pass's laws on the first text (a few values
and float64 sums of every float32 tensor), the loss with ``labels``, greedy ``generate`` and the pipeline's text
(as they come, and with every step a number); ``commit`` names the version that recorded them. It calls only what
every recorded version offers. ``tests/test_files_earlier_versions.py`` runs `outputs` with the code of today, on the
Auto classes (`load_with_auto`) and on causalqwen's own (`load_with_causalqwen`), and compares.
"""

import json
import sys
from pathlib import Path

TEXTS = ["The price is 12.5 yuan and a week has 7 days.", "In 2024 it fell by -3.75% to 1024 units, 0.001 of"]
PROMPT = "A box holds 12 eggs, so 3 boxes hold"
NEW_TOKENS = 6
NUM_BIAS = 100.0  # added by transformers' sequence_bias to <NUM>'s score: every generated token is a number


def save(directory: Path) -> None:
    try:
        from causalqwen.app.tiny import build_tiny_causal_lm
    except ImportError:  # the flat layout of the earlier versions
        from causalqwen.tiny import build_tiny_causal_lm

    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)


def load_with_auto(directory: Path) -> tuple:
    """``(config, tokenizer, model, generator)`` through transformers' Auto classes and ``pipeline``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, pipeline

    config = AutoConfig.from_pretrained(directory, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
    generator = pipeline("text-generation", model=str(directory), trust_remote_code=True)
    return config, tokenizer, model, generator


def load_with_causalqwen(directory: Path) -> tuple:
    """``(config, tokenizer, model, generator)`` through the classes of the top-level ``causalqwen`` namespace."""
    from transformers import pipeline

    import causalqwen

    config = causalqwen.CausalQwenConfig.from_pretrained(directory)
    tokenizer = causalqwen.NumericTokenizer.from_pretrained(directory)
    model = causalqwen.CausalQwenForCausalLM.from_pretrained(directory).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer,
                         pipeline_class=causalqwen.NumericTextGenerationPipeline)
    return config, tokenizer, model, generator


def summary(tensor) -> dict:
    """A float32 tensor as its shape, its first and last values and float64 sums."""
    values = tensor.detach().double()
    flat = values.reshape(-1)
    return {"shape": list(values.shape), "first": flat[:6].tolist(), "last": flat[-6:].tolist(),
            "sum": values.sum().item(), "abs_sum": values.abs().sum().item()}


def outputs(config, tokenizer, model, generator, commit: str) -> dict:
    import torch

    found = {
        "recorded_by": commit,
        "classes": {"config": type(config).__name__, "model": type(model).__name__,
                    "tokenizer": type(tokenizer).__name__, "pipeline": type(generator).__name__},
        "config": {"abduction_scale_init": config.abduction_scale_init, "ovr_threshold": config.ovr_threshold,
                   "ovr_threshold_init": getattr(config, "ovr_threshold_init", None),
                   "loss_algorithm": config.loss_algorithm, "num_token_id": config.num_token_id},
        "tokenizer": [],
    }
    for text in TEXTS:
        encoding = tokenizer([text])
        found["tokenizer"].append({"text": text, "input_ids": encoding["input_ids"][0].tolist(),
                                   "numeric_values": encoding["numeric_values"][0].double().tolist(),
                                   "attention_mask": encoding["attention_mask"][0].tolist()})
    encoding = tokenizer(TEXTS[:1])
    ids, values = encoding["input_ids"], encoding["numeric_values"]  # [1, S]
    with torch.no_grad():
        forward = model(input_ids=ids, numeric_values=values)
        loss = model(input_ids=ids, numeric_values=values, labels=ids).loss
    found["forward"] = {name: summary(getattr(forward, name))
                        for name in ("loc_U", "scale_U", "loc_S", "scale_S", "loc_Y", "scale_Y")}
    found["loc_Y"] = forward.loc_Y[0].double().tolist()  # [S]
    found["loss"] = loss.item()
    prompt = tokenizer([PROMPT])
    found["generate"] = {"prompt": PROMPT, "max_new_tokens": NEW_TOKENS}
    options_by_name = {"greedy": {}, "numbers": {"sequence_bias": {(config.num_token_id,): NUM_BIAS}}}
    for name, options in options_by_name.items():
        generated = model.generate(prompt["input_ids"], numeric_values=prompt["numeric_values"],
                                   attention_mask=prompt["attention_mask"], max_new_tokens=NEW_TOKENS,
                                   do_sample=False, return_dict_in_generate=True, **options)
        text = generator(PROMPT, max_new_tokens=NEW_TOKENS, **options)[0]["generated_text"]
        found["generate"][name] = {"sequences": generated.sequences[0].tolist(),
                                   "numeric_values": generated.numeric_values[0].double().tolist(),
                                   "pipeline_text": text}
    return found


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(Path(sys.argv[2]))
    else:
        directory, out, commit = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
        recorded = outputs(*load_with_auto(directory), commit)
        out.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")
