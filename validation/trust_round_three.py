r"""Trust boundaries, round three (issue 27): the surfaces added since the first two passes.

The same kind of table as `validation.trust` (and judged by its `run_trust_case`), one row per class of
input that a hostile pass from outside found:

- **security** -- a planted symbolic link or hard link where a run writes (the lock, ``metrics.jsonl``, a
  checkpoint directory, a saved model's files), and texts crafted to make tokenization quadratic or to
  make a prefix cost the whole text;
- **silent** -- values float32 cannot hold that a loader used to cast into ``inf`` or ``0``, adapter
  settings that ``add_lora`` refuses, a reference law of integers, a pipeline with another ``<NUM>``, a
  ``<NUM>`` target without a value, positions the model has no embedding for, a prompt printed with its
  numbers rewritten;
- **clarity** -- raw errors from deep inside: the pipeline on the model's own output, empty prompts,
  arguments of the wrong type or shape, a long ``max_new_tokens``, a tiny ``top_p``, a seed beyond 64 bits,
  old Mac line endings, deep or huge JSON, a corrupt ``tokenizer.json``, Ctrl-C, a mistyped local path.

After the issue's list, `SECOND_LOOK_CASES`: what a fresh-eyes pass from outside then found on a clean clone
(optimisation settings that wreck the weights and exit 0, nonsense backbone fields, a generation mode lost on
reload, a ``trainer_state.json`` that contradicts its checkpoint, a stray checkpoint name, options of
transformers' ``generate`` that would lose the values).

Rows that must succeed check their result and raise `WrongResult` otherwise; rows that plant a link check
afterwards that the file it points to is unchanged. The two rows about crafted texts give a generous
deadline (seconds where the old code took minutes): they tell linear from quadratic, and
``python -m benchmarks tokenizer`` holds the speed goal itself.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import time

import torch

from .robustness import CommandLineExit, _tiny, run_cli
from .trust import TrustCase, WrongResult, _fresh_dir, _model, _saved_model, _train

__all__ = ["ROUND_THREE_CASES"]  # the list, then the second look (SECOND_LOOK_CASES)

_OUTSIDE_TEXT = "a file outside the run directory\n"


# =============================================================================================
# Helpers
# =============================================================================================


def _outside_file() -> str:
    """A file outside every run directory, which no planted link may change."""
    path = os.path.join(_fresh_dir("outside"), "precious.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(_OUTSIDE_TEXT)
    return path


@contextlib.contextmanager
def _untouched(path: str):
    """Afterwards (also after the expected error): ``path`` still holds what it held."""
    try:
        yield
    finally:
        with open(path, encoding="utf-8") as handle:
            if handle.read() != _OUTSIDE_TEXT:
                raise WrongResult(f"{path} was written through a planted link")


def _finished_run(steps: int = 4, **changes) -> str:
    """A training run of ``steps`` steps saved every 2 steps, its last checkpoint removed (as if killed)."""
    out = os.path.join(_fresh_dir("run"), "run")
    _train(out, steps=steps, save_every=2, **changes)
    shutil.rmtree(os.path.join(out, f"checkpoint-{steps}"))
    return out


def _replace_tensor(file: str, name: str, value: torch.Tensor) -> None:
    """``file`` with its tensor ``name`` replaced by ``value`` (the file's metadata kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(file, framework="pt") as handle:
        metadata = handle.metadata()
    state = load_file(file)
    if name not in state:
        raise WrongResult(f"{file} holds no tensor {name} (holds {sorted(state)[:5]} ...)")
    state[name] = value
    save_file(state, file, metadata=metadata)


def _deadline(seconds: float, what: str, action) -> None:
    """Run ``action``; `WrongResult` if it took longer than ``seconds`` (linear work takes a small fraction)."""
    started = time.perf_counter()
    action()
    took = time.perf_counter() - started
    if took > seconds:
        raise WrongResult(f"{what} took {took:.1f} s (deadline {seconds:g} s): not linear in the text's length")


def _encoded_batch(text: str = "The total is 5"):
    tokenizer = _tiny()[1]
    return tokenizer, tokenizer([text], padding_side="left")


def _jsonl(name: str, content: bytes) -> str:
    path = os.path.join(_fresh_dir("jsonl"), name)
    with open(path, "wb") as handle:
        handle.write(content)
    return path


def _saved_tiny_base() -> str:
    """The embedded tiny Qwen2 base and its tokenizer, saved: a ``--base`` for the command line."""
    path = os.path.join(_fresh_dir("base"), "base")
    qwen, tokenizer, _ = _tiny()
    qwen.save_pretrained(path)
    tokenizer.hf_tokenizer.save_pretrained(path)
    return path


# =============================================================================================
# security
# =============================================================================================


def _lock_link():
    target = _outside_file()
    out = os.path.join(_fresh_dir("lock-link"), "run")
    os.makedirs(out)
    os.symlink(target, os.path.join(out, ".causalqwen.lock"))
    with _untouched(target):
        _train(out)


def _metrics_link_on_resume():
    out = _finished_run()
    target = _outside_file()
    os.remove(os.path.join(out, "metrics.jsonl"))
    os.symlink(target, os.path.join(out, "metrics.jsonl"))
    with _untouched(target):
        _train(out, resume=True, steps=4, save_every=2)


def _checkpoint_directory_link():
    out = _finished_run()
    elsewhere = _fresh_dir("elsewhere")
    os.symlink(elsewhere, os.path.join(out, "checkpoint-4"))
    try:
        _train(out, resume=True, steps=4, save_every=2)
    finally:
        if os.listdir(elsewhere):
            raise WrongResult(f"a checkpoint was written through the link into {elsewhere}: {os.listdir(elsewhere)}")


def _planted_before_saving(name: str, link, save):
    """A directory where ``save(path)`` is about to write, holding ``name`` as a ``link`` (``os.symlink`` or
    ``os.link``) to a file outside."""

    def trigger():
        target = _outside_file()
        path = os.path.join(_fresh_dir("planted"), "saved")
        os.makedirs(path)
        link(target, os.path.join(path, name))
        with _untouched(target):
            save(path)

    return trigger


def _save_model(path: str) -> None:
    _model().save_pretrained(path)


def _save_tokenizer(path: str) -> None:
    _tiny()[1].save_pretrained(path)


def _crafted_chain(unit: str):
    def trigger():
        tokenizer = _tiny()[1]
        text = unit * (100_000 // len(unit)) + "1a"  # 100 kB; the old grammar took minutes
        _deadline(15.0, f"tokenizing {unit!r} * n + '1a' (100 kB)", lambda: tokenizer([text]))

    return trigger


def _blob_prefix():
    import base64
    import random

    tokenizer = _tiny()[1]
    blob = base64.b64encode(random.Random(0).randbytes(3_000_000)).decode()  # 4 MB without a space
    result = []
    _deadline(5.0, "8 tokens of a 4 MB spaceless blob", lambda: result.append(tokenizer.encode(blob, max_length=8)))
    ids, _ = result[0]
    whole_prefix, _ = tokenizer.encode(blob[:4096])
    if ids != whole_prefix[:8]:
        raise WrongResult(f"the 8 tokens {ids} differ from the text's first 8 tokens {whole_prefix[:8]}")


# =============================================================================================
# silent
# =============================================================================================


def _float64_beyond_float32_abduction():
    from causalqwen.abduction import load_abduction, save_abduction

    directory = _fresh_dir("abduction")
    file = save_abduction(_model(), directory)
    _replace_tensor(file, "b_loc", torch.full_like(_model().abduction.b_loc, 1e300, dtype=torch.float64))
    load_abduction(_model(), directory)


def _saved_lora() -> str:
    from causalqwen.lora import add_lora, save_lora

    path = os.path.join(_fresh_dir("lora"), "adapter")
    save_lora(add_lora(_model(), rank=2), path)
    return path


def _float64_beyond_float32_lora():
    from safetensors.torch import load_file

    from causalqwen.lora import load_lora

    path = _saved_lora()
    file = os.path.join(path, "adapter_model.safetensors")
    name = sorted(load_file(file))[0]
    _replace_tensor(file, name, torch.full_like(load_file(file)[name], 1e300, dtype=torch.float64))
    load_lora(_model(), path)


def _lora_field(**fields):
    def trigger():
        from causalqwen.lora import load_lora

        path = _saved_lora()
        file = os.path.join(path, "adapter_config.json")
        with open(file, encoding="utf-8") as handle:
            config = json.load(handle)
        config.update(fields)
        with open(file, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        load_lora(_model(), path)

    return trigger


def _float64_beyond_float32_resume():
    out = _finished_run()
    file = os.path.join(out, "checkpoint-2", "model.safetensors")
    _replace_tensor(file, "action.b_noise", torch.full_like(_model().action.b_noise, 1e300, dtype=torch.float64))
    _train(out, resume=True, steps=4, save_every=2)


def _divergence_reference(value):
    def trigger():
        from safetensors.torch import load_file

        out = _finished_run(preset="causal", max_u_divergence=1.0)
        file = os.path.join(out, "checkpoint-2", "divergence_reference.safetensors")
        name = next(key for key in sorted(load_file(file)) if key.endswith("W_loc"))
        original = load_file(file)[name]
        _replace_tensor(file, name, value(original))
        _train(out, resume=True, steps=4, save_every=2, preset="causal", max_u_divergence=1.0)

    return trigger


def _integers(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor * 1000).to(torch.int64)


def _with_nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[0] = math.nan
    return tensor


def _config_without_num_token_id():
    from causalqwen import CausalQwenForCausalLM

    path = _saved_model()
    file = os.path.join(path, "config.json")
    with open(file, encoding="utf-8") as handle:
        config = json.load(handle)
    del config["num_token_id"]
    with open(file, "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    CausalQwenForCausalLM.from_pretrained(path)


def _pipeline(model=None, tokenizer=None):
    from transformers import pipeline

    from causalqwen.pipelines import NumericTextGenerationPipeline

    return pipeline("text-generation", model=model if model is not None else _tiny()[2],
                    tokenizer=tokenizer if tokenizer is not None else _tiny()[1],
                    pipeline_class=NumericTextGenerationPipeline)


def _pipeline_other_num_token():
    from causalqwen import NumericTokenizer

    other = NumericTokenizer(copy.deepcopy(_tiny()[1].hf_tokenizer), num_token="<|im_end|>")
    _pipeline(tokenizer=other)


def _positions(shift: int, dtype=torch.int64):
    def trigger():
        _, batch = _encoded_batch()
        length = batch["input_ids"].shape[1]
        positions = (torch.arange(length)[None] + shift).to(dtype)
        _tiny()[2](**batch, position_ids=positions)

    return trigger


def _num_label_over_a_word():
    tokenizer, batch = _encoded_batch()
    labels = batch["input_ids"].clone()
    labels[0, 2] = tokenizer.num_token_id
    _tiny()[2](**batch, labels=labels)


def _float64_underflow_value():
    _, batch = _encoded_batch()
    values = batch["numeric_values"].double()
    values[0, -1] = 1e-50
    _tiny()[2](batch["input_ids"], numeric_values=values, attention_mask=batch["attention_mask"])


def _subnormal_literal():
    tokenizer = _tiny()[1]
    text = "a drift of 3e-45 m"  # float32 holds it as 2.8e-45, 6.6% off
    encoding = tokenizer([text])
    if encoding.number_texts != [[]] or tokenizer.batch_decode(encoding) != [text]:
        raise WrongResult(f"3e-45 became a number (read {encoding['numeric_values'].tolist()})")


def _decode_underflow():
    tokenizer = _tiny()[1]
    ids = torch.tensor([tokenizer.num_token_id])
    tokenizer.decode(ids, torch.tensor([1e-50], dtype=torch.float64))


def _command_prompt_as_written():
    import io
    from contextlib import redirect_stdout

    from causalqwen import cli

    prompt = "Paid 12.50 for 1,000 at 3.14159265358979"
    out = io.StringIO()
    with redirect_stdout(out):
        status = cli.main(["generate", "--prompt", prompt, "--max-new-tokens", "2", "--mode", "standard"])
    lines = [line for line in out.getvalue().splitlines() if prompt[:4] in line]
    if status != 0 or not lines or prompt not in lines[-1]:
        raise WrongResult(f"the prompt was not printed as written: {out.getvalue()[-300:]!r}")


# =============================================================================================
# clarity
# =============================================================================================


def _digit_after_the_prompts_number():
    model = copy.deepcopy(_tiny()[2])
    seven = _tiny()[1].hf_tokenizer.convert_tokens_to_ids("7")
    with torch.no_grad():
        model.action.classification_head.bias[seven] = 1e4  # every step writes the digit 7
    text = _pipeline(model=model)("The total is 5", max_new_tokens=2, mode="standard")[0]["generated_text"]
    if not text.startswith("The total is 5") or text.count("7") != 2 or "57" in text:
        raise WrongResult(f"the prompt's 5 and the generated digits ran together: {text!r}")


def _empty_prompt_in_a_batch():
    _pipeline()(["hi", ""], batch_size=2, max_new_tokens=1)


def _generate(**arguments):
    def trigger():
        _, batch = _encoded_batch()
        call = dict(numeric_values=batch["numeric_values"], attention_mask=batch["attention_mask"], max_new_tokens=1)
        call.update({key: value(batch) if callable(value) else value for key, value in arguments.items()})
        _tiny()[2].generate(batch["input_ids"], **call)

    return trigger


def _tiny_top_p():
    from causalqwen import generate

    _, batch = _encoded_batch()
    arguments = dict(mode="traditional", max_new_tokens=3, generator=torch.Generator().manual_seed(0))
    model = copy.deepcopy(_tiny()[2]).half()
    nucleus = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], top_p=1e-12,
                       **arguments)
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], top_k=1, **arguments)
    if not torch.equal(nucleus.sequences, greedy.sequences):
        raise WrongResult(f"top_p=1e-12 gave {nucleus.sequences.tolist()}, greedy {greedy.sequences.tolist()}")


def _uint8_ids():
    _, batch = _encoded_batch()
    _tiny()[2](batch["input_ids"].to(torch.uint8), numeric_values=batch["numeric_values"])


def _meta_ids():
    _, batch = _encoded_batch()
    _tiny()[2](batch["input_ids"].to("meta"), numeric_values=batch["numeric_values"])


def _huge_seed():
    run_cli(["generate", "--prompt", "hi", "--max-new-tokens", "1", "--seed", "9" * 23])


def _cr_line_endings():
    from causalqwen.data import read_jsonl

    path = _jsonl("cr.jsonl", b'{"text": "a 1"}\r{"text": "b 2"}\r{"text": "c 3"}\r')
    texts, _ = read_jsonl(path)
    if texts != ["a 1", "b 2", "c 3"]:
        raise WrongResult(f"CR-only lines read as {texts!r}")


def _data_file_command(content: bytes):
    def trigger():
        data = _jsonl("data.jsonl", content)
        run_cli(["train", "--base", "tiny", "--data", data, "--out", os.path.join(_fresh_dir("cli-run"), "run"),
                 "--steps", "1"])

    return trigger


def _corrupt_tokenizer_json():
    path = _saved_model()
    file = os.path.join(path, "tokenizer.json")
    with open(file, "rb") as handle:
        start = handle.read(300)
    with open(file, "wb") as handle:
        handle.write(start)
    run_cli(["generate", "--model", path, "--prompt", "hi", "--max-new-tokens", "1"])


def _flag_names_in_messages():
    out = os.path.join(_fresh_dir("flags"), "run")
    _train(out)
    data = _jsonl("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    run_cli(["train", "--base", "tiny", "--data", data, "--out", out, "--steps", "1"])


def _mistyped_local_path():
    started = time.perf_counter()
    try:
        run_cli(["generate", "--model", "model_nope", "--prompt", "hi"])
    finally:
        if time.perf_counter() - started > 5:
            raise WrongResult(f"a missing local path took {time.perf_counter() - started:.0f} s (hub retries)")


def _tokenizer_saved_onto_a_file():
    path = os.path.join(_fresh_dir("onto-file"), "taken")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("a file\n")
    _tiny()[1].save_pretrained(path)


def _interrupted_training():
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from causalqwen import cli, training

    data = _jsonl("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    out = os.path.join(_fresh_dir("interrupted"), "run")
    args = ["train", "--base", _saved_tiny_base(), "--data", data, "--out", out, "--steps", "6", "--batch-size", "2",
            "--save-every", "2"]
    step = training._forward_backward
    calls = []

    def interrupted_at_step_3(*arguments, **keywords):  # Ctrl-C arrives during the third step
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(*arguments, **keywords)

    err = io.StringIO()
    training._forward_backward = interrupted_at_step_3
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            status = cli.main(args)
    finally:
        training._forward_backward = step
    lines = err.getvalue().strip().splitlines()
    expected = f"causalqwen train: interrupted; the last checkpoint is {os.path.join(out, 'checkpoint-2')} (step 2 of 6)"
    if status != 130 or len(lines) < 2 or lines[-2] != expected or not lines[-1].endswith("--resume"):
        raise WrongResult(f"exit status {status}; the last lines were {lines[-2:]!r}")
    if "Traceback" in err.getvalue():
        raise WrongResult("a traceback was printed")


ROUND_THREE_CASES = [
    # ---- security
    TrustCase("lock-symlink", "security", "a planted .causalqwen.lock symlink to a file outside the run directory",
              _lock_link, OSError, r"\.causalqwen\.lock' is a symbolic link; causalqwen never writes through a link"),
    TrustCase("metrics-symlink-on-resume", "security", "resume a run whose metrics.jsonl became a symlink outside",
              _metrics_link_on_resume, OSError, r"metrics\.jsonl' is a symbolic link"),
    TrustCase("checkpoint-directory-symlink", "security", "resume a run with checkpoint-4 planted as a link to a directory outside",
              _checkpoint_directory_link, OSError, r"checkpoint-4' is a symbolic link"),
    TrustCase("save-config-symlink", "security", "save_pretrained into a directory whose config.json is a symlink outside",
              _planted_before_saving("config.json", os.symlink, _save_model), OSError, r"config\.json'.*symbolic link"),
    TrustCase("save-weights-hard-link", "security", "save_pretrained over a model.safetensors hard-linked to a file outside",
              _planted_before_saving("model.safetensors", os.link, _save_model), OSError, r"model\.safetensors' has 2 hard links"),
    TrustCase("tokenizer-config-symlink", "security", "tokenizer save_pretrained over a symlinked tokenizer_config.json",
              _planted_before_saving("tokenizer_config.json", os.symlink, _save_tokenizer), OSError, r"tokenizer_config\.json'.*symbolic link"),
    TrustCase("crafted-dash-chain", "security", 'tokenize "1-" * 50,000 + "1a" (100 kB; 10 kB took 3.4-5.4 s)',
              _crafted_chain("1-"), None),
    TrustCase("crafted-slash-chain", "security", 'tokenize "1/" * 50,000 + "1a" (100 kB)', _crafted_chain("1/"), None),
    TrustCase("crafted-colon-chain", "security", 'tokenize "12:" * 33,333 + "1a" (100 kB)', _crafted_chain("12:"), None),
    TrustCase("spaceless-blob-prefix", "security", "8 tokens of a 4 MB base64 blob (was encoded whole: 12 s, +1 GB)",
              _blob_prefix, None),
    # ---- silent
    TrustCase("load-abduction-float64-1e300", "silent", "load_abduction of a float64 b_loc holding 1e300 (became inf)",
              _float64_beyond_float32_abduction, ValueError, r"abduction\.safetensors'.*b_loc holds 1e\+300, beyond the range of float32"),
    TrustCase("load-lora-float64-1e300", "silent", "load_lora of a float64 adapter tensor holding 1e300 (became inf)",
              _float64_beyond_float32_lora, ValueError, r"adapter_model\.safetensors'.*holds 1e\+300, beyond the range of float32"),
    TrustCase("resume-float64-1e300", "silent", "resume from weights with a float64 b_noise of 1e300 (blamed the learning rate)",
              _float64_beyond_float32_resume, OSError, r"model\.safetensors' do not fit the model: action\.b_noise holds 1e\+300"),
    TrustCase("load-lora-alpha-nan", "silent", "load_lora of an adapter_config.json with lora_alpha NaN (every output NaN)",
              _lora_field(lora_alpha=math.nan), ValueError, r"adapter_config\.json': field lora_alpha must be finite, got nan"),
    TrustCase("load-lora-alpha-negative", "silent", "load_lora with lora_alpha -16 (the update reversed)",
              _lora_field(lora_alpha=-16), ValueError, r"field lora_alpha must be > 0, got -16"),
    TrustCase("load-lora-init-pissa", "silent", 'load_lora with init_lora_weights "pissa" (a raw peft error, no file)',
              _lora_field(init_lora_weights="pissa"), ValueError, r"adapter_config\.json'.*init_lora_weights must be true or false, got 'pissa'"),
    TrustCase("divergence-reference-integers", "silent", "resume with an integer tensor in divergence_reference.safetensors (exit 0, D ~ 2,276)",
              _divergence_reference(_integers), OSError, r"divergence_reference\.safetensors'.*W_loc is stored as torch\.int64, not a floating-point tensor"),
    TrustCase("divergence-reference-nan", "silent", "resume with a NaN in divergence_reference.safetensors (blamed the learning rate)",
              _divergence_reference(_with_nan), OSError, r"divergence_reference\.safetensors'.*W_loc holds NaN or ±inf"),
    TrustCase("config-without-num-token-id", "silent", "from_pretrained of a config.json without num_token_id (loaded)",
              _config_without_num_token_id, ValueError, r"config\.json: config field num_token_id missing"),
    TrustCase("pipeline-other-num-token", "silent", "the text-generation pipeline with a tokenizer whose <NUM> is not the model's (numbers vanished)",
              _pipeline_other_num_token, ValueError, r"tokenizer's <NUM> id \(\d+\) differs from the model's num_token_id \(\d+\)"),
    TrustCase("position-ids-beyond-limit", "silent", "forward with position_ids beyond max_position_embeddings",
              _positions(2048), ValueError, r"position_ids must lie in \[0, max_position_embeddings=2048\); found 2048"),
    TrustCase("position-ids-negative", "silent", "forward with negative position_ids", _positions(-1), ValueError,
              r"position_ids must lie in \[0, max_position_embeddings=\d+\); found -1"),
    TrustCase("position-ids-fractional", "silent", "forward with float position_ids", _positions(0, torch.float32),
              TypeError, r"position_ids must be an integer tensor, got torch\.float32"),
    TrustCase("num-label-over-a-word", "silent", "a <NUM> label where the input is a word (regressed toward 0)",
              _num_label_over_a_word, ValueError, r"labels put <NUM> at position \[0, 2\], where input_ids is not <NUM>"),
    TrustCase("float64-value-underflows", "silent", "a float64 numeric value of 1e-50 (became 0 in float32)",
              _float64_underflow_value, ValueError, r"numeric_values holds 1e-50 at position \[0, \d+\], which underflows to 0 in float32"),
    TrustCase("text-subnormal-3e-45", "silent", "the literal 3e-45 in a text (read 6.6% off as 2.8e-45; stays text now)",
              _subnormal_literal, None),
    TrustCase("decode-value-underflows", "silent", "decoding a generated value of 1e-50 (wrote 0)", _decode_underflow,
              ValueError, r"1e-50.*underflows"),
    TrustCase("command-prompt-as-written", "silent", "causalqwen generate printed 12.50 as 12.5 and 1,000 as 1000",
              _command_prompt_as_written, None),
    # ---- clarity
    TrustCase("pipeline-digit-after-number", "clarity", "the pipeline when a digit token follows the prompt's number (RuntimeError)",
              _digit_after_the_prompts_number, None),
    TrustCase("pipeline-empty-prompt-in-batch", "clarity", "an empty prompt in a pipeline batch of two (a raw RuntimeError)",
              _empty_prompt_in_a_batch, ValueError, r"prompt 1 is empty"),
    TrustCase("generate-values-wrong-shape", "clarity", "model.generate with numeric_values of another shape (IndexError)",
              _generate(numeric_values=lambda batch: batch["numeric_values"][:, :1]), ValueError,
              r"numeric_values shape \(1, 1\) must equal input_ids shape \(1, \d+\)"),
    TrustCase("generate-values-list", "clarity", "model.generate with numeric_values as a list (AttributeError)",
              _generate(numeric_values=lambda batch: batch["numeric_values"].tolist()), TypeError,
              r"numeric_values must be a torch\.Tensor"),
    TrustCase("generate-labels", "clarity", "model.generate(labels=...) (silently ignored)",
              _generate(labels=lambda batch: batch["input_ids"]), TypeError, r"generate\(\) does not take labels"),
    TrustCase("generate-max-new-tokens-1e9", "clarity", "model.generate(max_new_tokens=10**9) (45 s, then the output lost)",
              _generate(max_new_tokens=10**9), ValueError, r"max_new_tokens \(1000000000\) exceeds max_position_embeddings=\d+"),
    TrustCase("generate-mask-list", "clarity", "model.generate with attention_mask as a list (AttributeError)",
              _generate(attention_mask=lambda batch: batch["attention_mask"].tolist()), TypeError,
              r"attention_mask must be a torch\.Tensor"),
    TrustCase("top-p-1e-12", "clarity", "traditional sampling with top_p=1e-12 in float16 (probability tensor contains inf, nan)",
              _tiny_top_p, None),
    TrustCase("forward-uint8-ids", "clarity", "forward with uint8 input_ids (a raw torch error)", _uint8_ids, TypeError,
              r"input_ids must be an int64 or int32 tensor .*got torch\.uint8"),
    TrustCase("forward-meta-ids", "clarity", "forward with input_ids on the meta device (a raw torch error)", _meta_ids,
              ValueError, r"input_ids is a meta tensor"),
    TrustCase("seed-beyond-64-bits", "clarity", "generate --seed 99999999999999999999999 (Overflow when unpacking long long)",
              _huge_seed, CommandLineExit, r"exit status 2: .*--seed: must be an integer from 0 to 4294967295"),
    TrustCase("jsonl-cr-line-endings", "clarity", "a JSONL file with old Mac line endings (CR alone)", _cr_line_endings, None),
    TrustCase("jsonl-deeply-nested", "clarity", "a JSONL line nested 100,000 deep (exit 1, RecursionError)",
              _data_file_command(b'{"text": "x"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n"), CommandLineExit,
              r"exit status 2: .*data\.jsonl, line 2: the JSON is nested too deeply to read"),
    TrustCase("jsonl-5000-digit-integer", "clarity", "a JSONL line with a 5,000-digit integer (no line named)",
              _data_file_command(b'{"text": "x"}\n{"text": "y", "n": ' + b"9" * 5000 + b"}\n"), CommandLineExit,
              r"exit status 2: .*data\.jsonl, line 2: an integer of 5000 digits"),
    TrustCase("corrupt-tokenizer-json", "clarity", "generate --model with a tokenizer.json cut short (file not named)",
              _corrupt_tokenizer_json, CommandLineExit, r"exit status 2: .*tokenizer\.json' is not valid JSON"),
    TrustCase("messages-name-the-flags", "clarity", "train into an earlier run without --resume (said 'pass resume')",
              _flag_names_in_messages, CommandLineExit, r"exit status 2: .*pass --resume to continue it or --overwrite to replace it"),
    TrustCase("mistyped-local-path", "clarity", "generate --model model_nope (29 s of hub retries, then a network error)",
              _mistyped_local_path, CommandLineExit, r"exit status 2: .*model directory 'model_nope' does not exist"),
    TrustCase("ctrl-c-during-training", "clarity", "Ctrl-C during causalqwen train (a 45-line traceback)",
              _interrupted_training, None),
    TrustCase("tokenizer-saved-onto-a-file", "clarity", "NumericTokenizer.save_pretrained onto an existing file (TypeError: NoneType)",
              _tokenizer_saved_onto_a_file, OSError, r"taken' exists and is not a directory"),
]


# =============================================================================================
# The second look: a fresh-eyes pass from outside, beyond the list
# =============================================================================================


def _training_settings(**settings):
    def trigger():
        from causalqwen.training import TrainingConfig

        TrainingConfig(**settings)

    return trigger


def _config_edit(edit):
    def trigger():
        from causalqwen import CausalQwenForCausalLM

        path = _saved_model()
        file = os.path.join(path, "config.json")
        with open(file, encoding="utf-8") as handle:
            config = json.load(handle)
        edit(config)
        with open(file, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        CausalQwenForCausalLM.from_pretrained(path)

    return trigger


def _rope_theta_zero(config: dict) -> None:
    config["rope_parameters"]["rope_theta"] = 0


def _saved_generation_mode():
    from causalqwen import CausalQwenForCausalLM

    model = _model()
    model.generation_config.mode = "causal"
    path = os.path.join(_fresh_dir("mode"), "model")
    model.save_pretrained(path)
    mode = getattr(CausalQwenForCausalLM.from_pretrained(path).generation_config, "mode", None)
    if mode != "causal":
        raise WrongResult(f"the saved mode 'causal' came back as {mode!r}")


def _trainer_state_edit(edit):
    def trigger():
        out = _finished_run()
        file = os.path.join(out, "checkpoint-2", "trainer_state.json")
        with open(file, encoding="utf-8") as handle:
            state = json.load(handle)
        edit(state)
        with open(file, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        _train(out, resume=True, steps=4, save_every=2)

    return trigger


def _step_100(state: dict) -> None:
    state["step"] = 100


def _weight_decay_1e9(state: dict) -> None:
    state["optimizer_param_groups"][0]["weight_decay"] = 1e9


def _stray_checkpoint_name():
    out = _finished_run()
    os.makedirs(os.path.join(out, "checkpoint-0005"))
    _train(out, resume=True, steps=4, save_every=2)


def _tiny_temperature_both_paths():
    from causalqwen import generate

    _, batch = _encoded_batch()
    model = _tiny()[2]
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], mode="traditional", top_k=1, max_new_tokens=2)
    sampled = model.generate(batch["input_ids"], numeric_values=batch["numeric_values"], mode="traditional",
                             do_sample=True, temperature=1e-46, max_new_tokens=2, return_dict_in_generate=True)
    if not torch.equal(sampled.sequences, greedy.sequences):
        raise WrongResult(f"temperature 1e-46 gave {sampled.sequences.tolist()}, greedy {greedy.sequences.tolist()}")


def _dual_lr_without_bound():
    data = _jsonl("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    run_cli(["train", "--base", "tiny", "--data", data, "--out", os.path.join(_fresh_dir("dual"), "run"),
             "--steps", "1", "--divergence-dual-lr", "5"])


SECOND_LOOK_CASES = [
    TrustCase("weight-decay-1e300", "silent", "train --weight-decay 1e300 (exit 0, a model of inf and NaN written)",
              _training_settings(weight_decay=1e300), ValueError, r"weight_decay must be a finite number within float32's range"),
    TrustCase("decay-factor-below-0", "silent", "learning_rate 0.5 with weight_decay 2 (AdamW flips the weights' sign)",
              _training_settings(learning_rate=0.5, weight_decay=2.0), ValueError, r"learning_rate \* weight_decay must be < 1"),
    TrustCase("config-rms-norm-eps-negative", "silent", "config.json with rms_norm_eps -1.0 (every loc_S NaN, exit 0)",
              _config_edit(lambda config: config.update(rms_norm_eps=-1.0)), ValueError,
              r"config\.json: .*rms_norm_eps must be a number in \(0, 1e\+30\]"),
    TrustCase("config-rope-theta-zero", "silent", "config.json with rope_theta 0 (loc_S silently changed)",
              _config_edit(_rope_theta_zero), ValueError, r"config\.json: .*rope_theta must be a finite number in \(0"),
    TrustCase("generation-mode-survives-reload", "silent", "a saved generation_config.mode (dropped on reload: standard ran)",
              _saved_generation_mode, None),
    TrustCase("trainer-state-step-edited", "silent", "resume from checkpoint-2 whose trainer_state.json says step 100 (finished at once)",
              _trainer_state_edit(_step_100), OSError, r"trainer_state\.json' records step 100, but its directory is checkpoint-2"),
    TrustCase("trainer-state-weight-decay-edited", "silent", "resume with weight_decay 1e9 in trainer_state.json (weights driven to 1.9e9)",
              _trainer_state_edit(_weight_decay_1e9), OSError, r"contradicts its checkpoint .*weight_decay is 1000000000\.0"),
    TrustCase("dual-lr-without-bound", "silent", "train --divergence-dual-lr 5 without --max-u-divergence (ignored)",
              _dual_lr_without_bound, CommandLineExit, r"exit status 2: .*--divergence-dual-lr applies to --max-u-divergence only"),
    TrustCase("config-hidden-act-unknown", "clarity", 'config.json with hidden_act "bogus" (KeyError)',
              _config_edit(lambda config: config.update(hidden_act="bogus")), ValueError,
              r"config\.json: .*hidden_act must be one of .*got 'bogus'"),
    TrustCase("config-pad-token-beyond-vocab", "clarity", "config.json with pad_token_id 99999 (AssertionError)",
              _config_edit(lambda config: config.update(pad_token_id=99999)), ValueError,
              r"config\.json: .*pad_token_id must be null or an id in \[0, vocab_size=\d+\), got 99999"),
    TrustCase("stray-checkpoint-name", "clarity", "resume with a stray checkpoint-0005 directory (went to the hub)",
              _stray_checkpoint_name, OSError, r"checkpoint-0005' is not a checkpoint name this run writes"),
    TrustCase("temperature-0-in-float32", "clarity", "model.generate(do_sample=True, temperature=1e-46) (probability tensor contains nan)",
              _tiny_temperature_both_paths, None),
    TrustCase("generate-prompt-lookup", "clarity", "model.generate(prompt_lookup_num_tokens=2) (AttributeError from inside)",
              _generate(prompt_lookup_num_tokens=2), ValueError, r"prompt_lookup_num_tokens is not supported"),
    TrustCase("generate-generator-int", "clarity", "model.generate(mode='causal', generator=123) (a raw torch TypeError)",
              _generate(mode="causal", generator=123), TypeError, r"generator must be a torch\.Generator, got int"),
]

ROUND_THREE_CASES += SECOND_LOOK_CASES
