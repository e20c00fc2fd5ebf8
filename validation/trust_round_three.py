r"""Trust boundaries, round three (issue 27): the surfaces added since the first two passes.

The same kind of table as `validation.trust` (and judged by `validation.cases.run_trust_case`), one row per class of
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

The clarity rows and their triggers live in `validation.trust_round_three_clarity`. After the issue's
list, `SECOND_LOOK_CASES` (`validation.trust_second_look`): what a fresh-eyes pass from outside then
found on a clean clone (optimisation settings that wreck the weights and exit 0, nonsense backbone
fields, a generation mode lost on reload, a ``trainer_state.json`` that contradicts its checkpoint, a
stray checkpoint name, options of transformers' ``generate`` that would lose the values).

Rows that must succeed check their result and raise `WrongResult` otherwise; rows that plant a link check
afterwards that the file it points to is unchanged. The two rows about crafted texts give a generous
deadline (seconds where the old code took minutes): they tell linear from quadratic, and
``python -m benchmarks tokenizer`` holds the speed goal itself.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time

import torch

from .cases import TrustCase, WrongResult
from .fixtures import (
    edit_json,
    encoded_batch,
    finished_run,
    fresh_dir,
    fresh_tiny_model,
    load_edited_config,
    numeric_pipeline,
    shared_tiny,
    train_tiny,
)
from .trust_round_three_clarity import ROUND_THREE_CLARITY_CASES
from .trust_second_look import SECOND_LOOK_CASES

__all__ = ["ROUND_THREE_CASES"]  # the list, then the second look (SECOND_LOOK_CASES)

_OUTSIDE_TEXT = "a file outside the run directory\n"


# =============================================================================================
# Helpers
# =============================================================================================


def _outside_file() -> str:
    """A file outside every run directory, which no planted link may change."""
    path = os.path.join(fresh_dir("outside"), "precious.txt")
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


# =============================================================================================
# security
# =============================================================================================


def _lock_link():
    target = _outside_file()
    out = os.path.join(fresh_dir("lock-link"), "run")
    os.makedirs(out)
    os.symlink(target, os.path.join(out, ".causalqwen.lock"))
    with _untouched(target):
        train_tiny(out)


def _metrics_link_on_resume():
    out = finished_run()
    target = _outside_file()
    os.remove(os.path.join(out, "metrics.jsonl"))
    os.symlink(target, os.path.join(out, "metrics.jsonl"))
    with _untouched(target):
        train_tiny(out, resume=True, steps=4, save_every=2)


def _checkpoint_directory_link():
    out = finished_run()
    elsewhere = fresh_dir("elsewhere")
    os.symlink(elsewhere, os.path.join(out, "checkpoint-4"))
    try:
        train_tiny(out, resume=True, steps=4, save_every=2)
    finally:
        if os.listdir(elsewhere):
            raise WrongResult(f"a checkpoint was written through the link into {elsewhere}: {os.listdir(elsewhere)}")


def _planted_before_saving(name: str, link, save):
    """A directory where ``save(path)`` is about to write, holding ``name`` as a ``link`` (``os.symlink`` or
    ``os.link``) to a file outside."""

    def trigger():
        target = _outside_file()
        path = os.path.join(fresh_dir("planted"), "saved")
        os.makedirs(path)
        link(target, os.path.join(path, name))
        with _untouched(target):
            save(path)

    return trigger


def _save_model(path: str) -> None:
    fresh_tiny_model().save_pretrained(path)


def _save_tokenizer(path: str) -> None:
    shared_tiny().tokenizer.save_pretrained(path)


def _crafted_chain(unit: str):
    def trigger():
        tokenizer = shared_tiny().tokenizer
        text = unit * (100_000 // len(unit)) + "1a"  # 100 kB; the old grammar took minutes
        _deadline(15.0, f"tokenizing {unit!r} * n + '1a' (100 kB)", lambda: tokenizer([text]))

    return trigger


def _blob_prefix():
    import base64
    import random

    tokenizer = shared_tiny().tokenizer
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

    directory = fresh_dir("abduction")
    file = save_abduction(fresh_tiny_model(), directory)
    _replace_tensor(file, "b_loc", torch.full_like(fresh_tiny_model().abduction.b_loc, 1e300, dtype=torch.float64))
    load_abduction(fresh_tiny_model(), directory)


def _saved_lora() -> str:
    from causalqwen.integrations.lora import add_lora, save_lora

    path = os.path.join(fresh_dir("lora"), "adapter")
    save_lora(add_lora(fresh_tiny_model(), rank=2), path)
    return path


def _float64_beyond_float32_lora():
    from safetensors.torch import load_file

    from causalqwen.integrations.lora import load_lora

    path = _saved_lora()
    file = os.path.join(path, "adapter_model.safetensors")
    name = sorted(load_file(file))[0]
    _replace_tensor(file, name, torch.full_like(load_file(file)[name], 1e300, dtype=torch.float64))
    load_lora(fresh_tiny_model(), path)


def _lora_field(**fields):
    def trigger():
        from causalqwen.integrations.lora import load_lora

        path = _saved_lora()
        edit_json(os.path.join(path, "adapter_config.json"), lambda config: config.update(fields))
        load_lora(fresh_tiny_model(), path)

    return trigger


def _float64_beyond_float32_resume():
    out = finished_run()
    file = os.path.join(out, "checkpoint-2", "model.safetensors")
    _replace_tensor(file, "action.b_noise", torch.full_like(fresh_tiny_model().action.b_noise, 1e300, dtype=torch.float64))
    train_tiny(out, resume=True, steps=4, save_every=2)


def _divergence_reference(value):
    def trigger():
        from safetensors.torch import load_file

        out = finished_run(preset="causal", max_u_divergence=1.0)
        file = os.path.join(out, "checkpoint-2", "divergence_reference.safetensors")
        name = next(key for key in sorted(load_file(file)) if key.endswith("W_loc"))
        original = load_file(file)[name]
        _replace_tensor(file, name, value(original))
        train_tiny(out, resume=True, steps=4, save_every=2, preset="causal", max_u_divergence=1.0)

    return trigger


def _integers(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor * 1000).to(torch.int64)


def _with_nan(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[0] = math.nan
    return tensor


def _pipeline_other_num_token():
    from causalqwen import NumericTokenizer

    other = NumericTokenizer(copy.deepcopy(shared_tiny().tokenizer.hf_tokenizer), num_token="<QTY>")
    numeric_pipeline(tokenizer=other)


def _positions(shift: int, dtype=torch.int64):
    def trigger():
        _, batch = encoded_batch()
        length = batch["input_ids"].shape[1]
        positions = (torch.arange(length)[None] + shift).to(dtype)
        shared_tiny().model(**batch, position_ids=positions)

    return trigger


def _num_label_over_a_word():
    tokenizer, batch = encoded_batch()
    labels = batch["input_ids"].clone()
    labels[0, 2] = tokenizer.num_token_id
    shared_tiny().model(**batch, labels=labels)


def _float64_underflow_value():
    _, batch = encoded_batch()
    values = batch["numeric_values"].double()
    values[0, -1] = 1e-50
    shared_tiny().model(batch["input_ids"], numeric_values=values, attention_mask=batch["attention_mask"])


def _subnormal_literal():
    tokenizer = shared_tiny().tokenizer
    text = "a drift of 3e-45 m"  # float32 holds it as 2.8e-45, 6.6% off
    encoding = tokenizer([text])
    if encoding.number_texts != [[]] or tokenizer.batch_decode(encoding) != [text]:
        raise WrongResult(f"3e-45 became a number (read {encoding['numeric_values'].tolist()})")


def _decode_underflow():
    tokenizer = shared_tiny().tokenizer
    ids = torch.tensor([tokenizer.num_token_id])
    tokenizer.decode(ids, torch.tensor([1e-50], dtype=torch.float64))


def _command_prompt_as_written():
    import io
    from contextlib import redirect_stdout

    from causalqwen.app import cli

    prompt = "Paid 12.50 for 1,000 at 3.14159265358979"
    out = io.StringIO()
    with redirect_stdout(out):
        status = cli.main(["generate", "--prompt", prompt, "--max-new-tokens", "2", "--mode", "standard"])
    lines = [line for line in out.getvalue().splitlines() if prompt[:4] in line]
    if status != 0 or not lines or prompt not in lines[-1]:
        raise WrongResult(f"the prompt was not printed as written: {out.getvalue()[-300:]!r}")


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
              load_edited_config(lambda config: config.pop("num_token_id")), ValueError, r"config\.json: config field num_token_id missing"),
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
    # ---- clarity: `validation.trust_round_three_clarity`
] + ROUND_THREE_CLARITY_CASES + SECOND_LOOK_CASES
