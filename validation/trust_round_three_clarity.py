"""Trust boundaries, round three (issue 27), the clarity rows: raw errors from deep inside, made clear.

The pipeline on the model's own output, empty prompts, arguments of the wrong type or shape, a long
``max_new_tokens``, a tiny ``top_p``, a seed beyond 64 bits, old Mac line endings, deep or huge JSON, a
corrupt ``tokenizer.json``, Ctrl-C, a mistyped local path. `ROUND_THREE_CLARITY_CASES` is the clarity
group of `validation.trust_round_three.ROUND_THREE_CASES` (judged by `validation.cases.run_trust_case`).
"""

from __future__ import annotations

import copy
import os
import time

import torch

from .cases import TrustCase, WrongResult, command_line_refusal, run_cli
from .fixtures import (
    encoded_batch,
    fresh_dir,
    jsonl_file,
    model_generate_trigger,
    numeric_pipeline,
    saved_tiny_model,
    shared_tiny,
    train_tiny,
)

__all__ = ["ROUND_THREE_CLARITY_CASES"]


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
    nucleus = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], top_p=1e-12,
                       **arguments)
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], top_k=1, **arguments)
    if not torch.equal(nucleus.sequences, greedy.sequences):
        raise WrongResult(f"top_p=1e-12 gave {nucleus.sequences.tolist()}, greedy {greedy.sequences.tolist()}")


def _uint8_ids():
    _, batch = encoded_batch()
    shared_tiny().model(batch["input_ids"].to(torch.uint8), numeric_values=batch["numeric_values"])


def _meta_ids():
    _, batch = encoded_batch()
    shared_tiny().model(batch["input_ids"].to("meta"), numeric_values=batch["numeric_values"])


def _huge_seed():
    run_cli(["generate", "--prompt", "hi", "--max-new-tokens", "1", "--seed", "9" * 23])


def _cr_line_endings():
    from causalqwen.files.data import read_jsonl

    path = jsonl_file("cr.jsonl", b'{"text": "a 1"}\r{"text": "b 2"}\r{"text": "c 3"}\r')
    texts, _ = read_jsonl(path)
    if texts != ["a 1", "b 2", "c 3"]:
        raise WrongResult(f"CR-only lines read as {texts!r}")


def _data_file_command(content: bytes):
    def trigger():
        data = jsonl_file("data.jsonl", content)
        run_cli(["train", "--base", "tiny", "--data", data, "--out", os.path.join(fresh_dir("cli-run"), "run"),
                 "--steps", "1"])

    return trigger


def _corrupt_tokenizer_json():
    path = saved_tiny_model()
    file = os.path.join(path, "tokenizer.json")
    with open(file, "rb") as handle:
        start = handle.read(300)
    with open(file, "wb") as handle:
        handle.write(start)
    run_cli(["generate", "--model", path, "--prompt", "hi", "--max-new-tokens", "1"])


def _flag_names_in_messages():
    out = os.path.join(fresh_dir("flags"), "run")
    train_tiny(out)
    data = jsonl_file("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    run_cli(["train", "--base", "tiny", "--data", data, "--out", out, "--steps", "1"])


def _mistyped_local_path():
    started = time.perf_counter()
    try:
        run_cli(["generate", "--model", "model_nope", "--prompt", "hi"])
    finally:
        if time.perf_counter() - started > 5:
            raise WrongResult(f"a missing local path took {time.perf_counter() - started:.0f} s (hub retries)")


def _tokenizer_saved_onto_a_file():
    path = os.path.join(fresh_dir("onto-file"), "taken")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("a file\n")
    shared_tiny().tokenizer.save_pretrained(path)


def _saved_tiny_base() -> str:
    """The embedded tiny Qwen2 base and its tokenizer, saved: a ``--base`` for the command line."""
    path = os.path.join(fresh_dir("base"), "base")
    qwen, tokenizer, _ = shared_tiny()
    qwen.save_pretrained(path)
    tokenizer.hf_tokenizer.save_pretrained(path)
    return path


def _interrupted_training():
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from causalqwen import training
    from causalqwen.app import cli

    data = jsonl_file("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    out = os.path.join(fresh_dir("interrupted"), "run")
    args = ["train", "--base", _saved_tiny_base(), "--data", data, "--out", out, "--steps", "6", "--batch-size", "2",
            "--save-every", "2"]
    step = training.loss_and_gradients
    calls = []

    def interrupted_at_step_3(*arguments, **keywords):  # Ctrl-C arrives during the third step
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(*arguments, **keywords)

    err = io.StringIO()
    training.loss_and_gradients = interrupted_at_step_3
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            status = cli.main(args)
    finally:
        training.loss_and_gradients = step
    lines = err.getvalue().strip().splitlines()
    expected = f"causalqwen train: interrupted; the last checkpoint is {os.path.join(out, 'checkpoint-2')} (step 2 of 6)"
    if status != 130 or len(lines) < 2 or lines[-2] != expected or not lines[-1].endswith("--resume"):
        raise WrongResult(f"exit status {status}; the last lines were {lines[-2:]!r}")
    if "Traceback" in err.getvalue():
        raise WrongResult("a traceback was printed")


ROUND_THREE_CLARITY_CASES = [
    TrustCase("pipeline-digit-after-number", "clarity", "the pipeline when a digit token follows the prompt's number (RuntimeError)",
              _digit_after_the_prompts_number, None),
    TrustCase("pipeline-empty-prompt-in-batch", "clarity", "an empty prompt in a pipeline batch of two (a raw RuntimeError)",
              _empty_prompt_in_a_batch, ValueError, r"prompt 1 is empty"),
    TrustCase("generate-values-wrong-shape", "clarity", "model.generate with numeric_values of another shape (IndexError)",
              model_generate_trigger(numeric_values=lambda batch: batch["numeric_values"][:, :1]), ValueError,
              r"numeric_values shape \(1, 1\) must equal input_ids shape \(1, \d+\)"),
    TrustCase("generate-values-list", "clarity", "model.generate with numeric_values as a list (AttributeError)",
              model_generate_trigger(numeric_values=lambda batch: batch["numeric_values"].tolist()), TypeError,
              r"numeric_values must be a torch\.Tensor"),
    TrustCase("generate-labels", "clarity", "model.generate(labels=...) (silently ignored)",
              model_generate_trigger(labels=lambda batch: batch["input_ids"]), TypeError, r"generate\(\) does not take labels"),
    TrustCase("generate-max-new-tokens-1e9", "clarity", "model.generate(max_new_tokens=10**9) (45 s, then the output lost)",
              model_generate_trigger(max_new_tokens=10**9), ValueError, r"max_new_tokens \(1000000000\) exceeds max_position_embeddings=\d+"),
    TrustCase("generate-mask-list", "clarity", "model.generate with attention_mask as a list (AttributeError)",
              model_generate_trigger(attention_mask=lambda batch: batch["attention_mask"].tolist()), TypeError,
              r"attention_mask must be a torch\.Tensor"),
    TrustCase("top-p-1e-12", "clarity", "traditional sampling with top_p=1e-12 in float16 (probability tensor contains inf, nan)",
              _tiny_top_p, None),
    TrustCase("forward-uint8-ids", "clarity", "forward with uint8 input_ids (a raw torch error)", _uint8_ids, TypeError,
              r"input_ids must be an int64 or int32 tensor .*got torch\.uint8"),
    TrustCase("forward-meta-ids", "clarity", "forward with input_ids on the meta device (a raw torch error)", _meta_ids,
              ValueError, r"input_ids is a meta tensor"),
    command_line_refusal("seed-beyond-64-bits", "clarity", "generate --seed 99999999999999999999999 (Overflow when unpacking long long)",
                         _huge_seed, r".*--seed: must be an integer from 0 to 4294967295"),
    TrustCase("jsonl-cr-line-endings", "clarity", "a JSONL file with old Mac line endings (CR alone)", _cr_line_endings, None),
    command_line_refusal("jsonl-deeply-nested", "clarity", "a JSONL line nested 100,000 deep (exit 1, RecursionError)",
                         _data_file_command(b'{"text": "x"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
                         r".*data\.jsonl, line 2: the JSON is nested too deeply to read"),
    command_line_refusal("jsonl-5000-digit-integer", "clarity", "a JSONL line with a 5,000-digit integer (no line named)",
                         _data_file_command(b'{"text": "x"}\n{"text": "y", "n": ' + b"9" * 5000 + b"}\n"),
                         r".*data\.jsonl, line 2: an integer of 5000 digits"),
    command_line_refusal("corrupt-tokenizer-json", "clarity", "generate --model with a tokenizer.json cut short (file not named)",
                         _corrupt_tokenizer_json, r".*tokenizer\.json' is not valid JSON"),
    command_line_refusal("messages-name-the-flags", "clarity", "train into an earlier run without --resume (said 'pass resume')",
                         _flag_names_in_messages, r".*pass --resume to continue it or --overwrite to replace it"),
    command_line_refusal("mistyped-local-path", "clarity", "generate --model model_nope (29 s of hub retries, then a network error)",
                         _mistyped_local_path, r".*model directory 'model_nope' does not exist"),
    TrustCase("ctrl-c-during-training", "clarity", "Ctrl-C during causalqwen train (a 45-line traceback)",
              _interrupted_training, None),
    TrustCase("tokenizer-saved-onto-a-file", "clarity", "NumericTokenizer.save_pretrained onto an existing file (TypeError: NoneType)",
              _tokenizer_saved_onto_a_file, OSError, r"taken' exists and is not a directory"),
]
