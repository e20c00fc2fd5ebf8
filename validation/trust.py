r"""Trust boundaries: what causalqwen reads, what it refuses, and the cases that hold it to that (issue 14).

One table, `TRUST_CASES`, in three groups:

- **security** -- files from someone else: a planted pickle, weight shards outside their directory, a
  config that announces a model too large to allocate, a 20 MB line of text; and the files of the user:
  ``--overwrite`` on a directory no run wrote, a demo pointed at a training run, two runs on one
  directory.
- **silent** -- inputs that used to give a wrong answer without a word: misspelt keywords, a ``<NUM>``
  without its value, predictions cast into the prompt's integer dtype, a zero Hessian from the fused
  loss, a resume with other settings, a string where a boolean belongs, settings that overflow.
- **clarity** -- inputs that used to fail with a message that named nothing: invalid UTF-8, a lone
  surrogate, a config field of the wrong type, a missing tokenizer, a divergent learning rate (these
  rows and their triggers: `validation.trust_clarity`).

A row either must raise exactly its exception with a message that names the file, line, field or
character (``error`` and ``message``), or must *succeed* with the right result (``error`` is None:
the trigger checks the result and raises `WrongResult` otherwise; `TrustCase`, `WrongResult` and the judge,
`run_trust_case`, live in `validation.cases`). A trigger that plants a pickle or a
file to be kept checks afterwards that the pickle never ran and the file is still there.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
from typing import Callable

import torch

from .cases import (
    GROUPS,
    TrustCase,
    WrongResult,
    command_line_refusal,
    run_cli,
    run_trust_case,
)
from .fixtures import (
    fresh_dir,
    fresh_tiny_model,
    load_config_fields,
    saved_tiny_model,
    shared_tiny,
    tiny_dataset,
    train_tiny,
)
from .trust_clarity import CLARITY_CASES

__all__ = ["TrustCase", "TRUST_CASES", "GROUPS", "WrongResult", "run_trust_case"]


# =============================================================================================
# Helpers: planted pickles, guarded side effects
# =============================================================================================


class _Planted:
    """Unpickling this creates the file ``path``: proof that code from the file ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(target: str, witness: str) -> None:
    with open(target, "wb") as handle:
        pickle.dump(_Planted(witness), handle)


@contextlib.contextmanager
def _guarded(witness: str | None = None, kept: tuple[str, ...] = ()):
    """Afterwards (also after the expected error): the planted pickle must not have run, and every path in
    ``kept`` must still exist. A violation replaces whatever was raised with `WrongResult`."""
    try:
        yield
    finally:
        if witness is not None and os.path.exists(witness):
            raise WrongResult(f"the planted pickle ran: {witness} was created")
        missing = [path for path in kept if not os.path.exists(path)]
        if missing:
            raise WrongResult(f"deleted although no run wrote it: {', '.join(missing)}")


def _load(path: str):
    from causalqwen import CausalQwenForCausalLM

    return CausalQwenForCausalLM.from_pretrained(path)


# =============================================================================================
# security
# =============================================================================================


def _planted_training_state():
    out = os.path.join(fresh_dir("planted-state"), "run")
    train_tiny(out)
    checkpoint = os.path.join(out, "checkpoint-2")
    for name in os.listdir(checkpoint):  # an old-format checkpoint: its training state is only the pickle
        if name not in ("config.json", "model.safetensors", "history.json"):
            os.remove(os.path.join(checkpoint, name))
    witness = os.path.join(out, "..", "pwned")
    _plant(os.path.join(checkpoint, "training_state.pt"), witness)
    with _guarded(witness):
        train_tiny(out, resume=True)


def _pickled_model_only():
    path = saved_tiny_model()
    os.remove(os.path.join(path, "model.safetensors"))
    witness = os.path.join(path, "..", "pwned")
    _plant(os.path.join(path, "pytorch_model.bin"), witness)
    with _guarded(witness):
        _load(path)


def _index_pointing(shard_name: Callable[[str], str]):
    def trigger():
        from safetensors.torch import load_file

        path = saved_tiny_model()
        outside = os.path.join(os.path.dirname(path), "outside")
        os.makedirs(outside)
        os.replace(os.path.join(path, "model.safetensors"), os.path.join(outside, "model.safetensors"))
        names = list(load_file(os.path.join(outside, "model.safetensors")))
        shard = shard_name(outside)
        with open(os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
            json.dump({"metadata": {}, "weight_map": {name: shard for name in names}}, handle)
        _load(path)

    return trigger


def _huge_line():
    from causalqwen.files.data import TextDataset

    text = "The price is 12.5 yuan. " * 850_000  # 20.4 million characters on one line
    item = TextDataset([text], shared_tiny().tokenizer, max_length=32)[0]
    if len(item["input_ids"]) != 32:
        raise WrongResult(f"expected 32 tokens, got {len(item['input_ids'])}")


def _overwrite_foreign():
    foreign = fresh_dir("foreign")
    notes, data = os.path.join(foreign, "notes.txt"), os.path.join(foreign, "train.jsonl")
    for path in (notes, data):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("the user's\n")
    with _guarded(kept=(notes, data)):
        train_tiny(foreign, overwrite=True)


def _overwrite_run_keeps_data():
    out = os.path.join(fresh_dir("run-with-data"), "run")
    train_tiny(out)
    data = os.path.join(out, "train.jsonl")
    with open(data, "w", encoding="utf-8") as handle:
        handle.write('{"text": "the data file, kept beside the run"}\n')
    with _guarded(kept=(data,)):
        train_tiny(out, overwrite=True)
    if not os.path.isdir(os.path.join(out, "checkpoint-2")):
        raise WrongResult("the overwritten run wrote no checkpoint")


def _demo_on_training_run():
    out = os.path.join(fresh_dir("demo-on-run"), "run")
    train_tiny(out)
    checkpoint = os.path.join(out, "checkpoint-2")
    with _guarded(kept=(checkpoint, os.path.join(out, "metrics.jsonl"))):
        run_cli(["demo", "--out", out, "--steps", "1"])


def _two_resumes():
    from causalqwen.files.rundir import RunDirectory

    out = os.path.join(fresh_dir("two-resumes"), "run")
    train_tiny(out)
    holder = RunDirectory.claim(out, "train", resume=True)  # the first --resume, still running
    try:
        train_tiny(out, resume=True, steps=4)
    finally:
        holder.release()


# =============================================================================================
# silent
# =============================================================================================


def _forward_keyword(keyword: str):
    def trigger():
        tokenizer = shared_tiny().tokenizer
        batch = tokenizer(["The price is 12.5 yuan."])
        shared_tiny().model(batch["input_ids"], numeric_values=batch["numeric_values"], **{keyword: batch["input_ids"]})

    return trigger


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
        out = generate(_number_model(), batch["input_ids"], batch["numeric_values"].to(dtype), batch["attention_mask"],
                       max_new_tokens=1)
        value = out.numeric_values[0, -1].item()
        if abs(value - -100011.58) > 0.01 or out.numeric_values.dtype != torch.float32:
            raise WrongResult(f"the predicted -100011.58 came back as {value!r} ({out.numeric_values.dtype})")

    return trigger


def _fused_double_backward():
    tokenizer, model = shared_tiny().tokenizer, fresh_tiny_model()
    batch = tokenizer(["A cup of tea costs 1.5 dollars."])
    loss = model(**batch, labels=batch["input_ids"]).loss
    (gradient,) = torch.autograd.grad(loss, model.action.b_noise, create_graph=True)
    torch.autograd.grad(gradient.sum(), model.action.b_noise)


def _num_labels_without_targets():
    tokenizer = shared_tiny().tokenizer
    words = tokenizer(["The price is yuan."])["input_ids"]
    labels = words.clone()
    labels[0, 2] = tokenizer.num_token_id
    shared_tiny().model(words, labels=labels)


def _num_prompt_without_values():
    from causalqwen import generate

    batch = shared_tiny().tokenizer(["The price is 12.5 yuan and"])
    generate(shared_tiny().model, batch["input_ids"], max_new_tokens=2)


def _resume_changed(**changes):
    def trigger():
        out = os.path.join(fresh_dir("resume-changed"), "run")
        train_tiny(out, steps=4, save_every=2)
        shutil.rmtree(os.path.join(out, "checkpoint-4"))  # as if killed after step 2
        settings = dict(changes)  # the closure's dict is left as it is: a case can run twice
        data = tiny_dataset(seed=settings.pop("data_seed")) if "data_seed" in settings else None
        train_tiny(out, resume=True, data=data, steps=4, save_every=2, **settings)

    return trigger


def _resume_int32_b_noise():
    from safetensors.torch import load_file, save_file

    out = os.path.join(fresh_dir("resume-int32"), "run")
    train_tiny(out, steps=4, save_every=2)
    shutil.rmtree(os.path.join(out, "checkpoint-4"))  # as if killed after step 2
    weights = os.path.join(out, "checkpoint-2", "model.safetensors")
    state = load_file(weights)
    state["action.b_noise"] = torch.full_like(state["action.b_noise"], 10**9, dtype=torch.int32)
    save_file(state, weights)
    train_tiny(out, resume=True, steps=4, save_every=2)


def _resume_without_run():
    out = os.path.join(fresh_dir("resume-nothing"), "run")
    train_tiny(out, resume=True)


def _settings_extreme(**settings):
    def trigger():
        fresh_tiny_model(**settings)

    return trigger


def _subnormal_text():
    tokenizer = shared_tiny().tokenizer
    text = "a tolerance of 8e-46 units"
    encoding = tokenizer([text])
    if encoding.number_texts != [[]] or tokenizer.batch_decode(encoding) != [text]:
        raise WrongResult(f"8e-46 became a number or did not come back: {encoding.number_texts}")


def _demo_zero_steps():
    run_cli(["demo", "--steps", "0", "--out", os.path.join(fresh_dir("demo-zero"), "demo")])


def _empty_texts():
    from causalqwen.files.data import TextDataset

    train_tiny(None, data=TextDataset([""] * 8, shared_tiny().tokenizer))


def _too_many_positions():
    model = shared_tiny().model
    model(torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long))


TRUST_CASES = [
    # ---- security
    TrustCase("planted-training-state-pickle", "security",
              "resume from a checkpoint whose training state is a planted pickle (training_state.pt)",
              _planted_training_state, OSError, r"training_state\.pt' is a pickle .*never loaded"),
    TrustCase("pickled-model-only", "security", "from_pretrained on a directory holding only a planted pytorch_model.bin",
              _pickled_model_only, OSError, r"holds no model\.safetensors .*pytorch_model\.bin \(pickle\), which causalqwen never loads"),
    TrustCase("index-shard-parent-path", "security", "a safetensors index naming the shard ../outside/model.safetensors",
              _index_pointing(lambda outside: "../outside/model.safetensors"), OSError, "names the shard .* outside its directory"),
    TrustCase("index-shard-absolute-path", "security", "a safetensors index naming an absolute shard path",
              _index_pointing(lambda outside: os.path.join(outside, "model.safetensors")), OSError, "outside its directory"),
    TrustCase("config-huge-vocab", "security", "config.json announcing vocab_size = 10^12 beside the real weights",
              load_config_fields(vocab_size=10**12), ValueError, r"config\.json says vocab_size=1000000000000, hidden_size=\d+, but model\.embed_tokens\.weight"),
    TrustCase("jsonl-20-mb-line", "security", "a 20 MB text for a 32-token training row (the Rust tokenizer aborts on 50 MB)",
              _huge_line, None),
    TrustCase("overwrite-foreign-directory", "security", "train --overwrite into a directory no run wrote (notes and data in it)",
              _overwrite_foreign, ValueError, r"exists and is not a causalqwen run .*never deletes files it did not write"),
    TrustCase("overwrite-keeps-the-data-file", "security", "train --overwrite of a run whose directory also holds the --data file",
              _overwrite_run_keeps_data, None),
    command_line_refusal("demo-on-a-training-run", "security", "demo --out pointed at a training run",
                         _demo_on_training_run, r".*holds a training run; a demo run never replaces it"),
    TrustCase("two-resumes-at-once", "security", "a second --resume on a directory another run is using",
              _two_resumes, ValueError, r"is in use by another causalqwen run \(pid \d+\)"),
    # ---- silent
    TrustCase("forward-numeric-value", "silent", "forward(numeric_value=...) (misspelt: the numbers were dropped)",
              _forward_keyword("numeric_value"), TypeError, r"unexpected keyword argument\(s\) 'numeric_value' \(did you mean 'numeric_values'\?\)"),
    TrustCase("forward-attention-masks", "silent", "forward(attention_masks=...) (misspelt: the mask was dropped)",
              _forward_keyword("attention_masks"), TypeError, r"'attention_masks' \(did you mean 'attention_mask'\?\)"),
    TrustCase("forward-label", "silent", "forward(label=...) (misspelt: no loss, no error)",
              _forward_keyword("label"), TypeError, r"'label' \(did you mean 'labels'\?\)"),
    TrustCase("generate-int64-prompt-values", "silent", "generate with int64 prompt values: a predicted -100011.58 (was cast to an int)",
              _generate_keeps(torch.int64), None),
    TrustCase("generate-float16-prompt-values", "silent", "generate with float16 prompt values: a predicted -100011.58 (was -inf)",
              _generate_keeps(torch.float16), None),
    TrustCase("fused-loss-double-backward", "silent", "a Hessian through the fused loss (was exactly 0)",
              _fused_double_backward, RuntimeError, r"no second derivative .*return_decisions=True"),
    TrustCase("num-labels-without-targets", "silent", "labels holding <NUM> with no numeric targets (trained toward 0)",
              _num_labels_without_targets, ValueError, "labels hold <NUM> targets but neither numeric_labels nor numeric_values"),
    TrustCase("num-prompt-without-values", "silent", "a prompt holding <NUM> with numeric_values=None (ran as 0)",
              _num_prompt_without_values, ValueError, "input_ids hold <NUM> .* but numeric_values is None"),
    TrustCase("resume-other-learning-rate", "silent", "resume with another learning rate",
              _resume_changed(learning_rate=1e-3), ValueError, r"learning_rate is 0\.003 in the checkpoint, 0\.001 now"),
    TrustCase("resume-other-batch-size", "silent", "resume with another batch size",
              _resume_changed(batch_size=2), ValueError, "batch_size is 4 in the checkpoint, 2 now"),
    TrustCase("resume-other-seed", "silent", "resume with another seed", _resume_changed(seed=1), ValueError,
              "seed is 0 in the checkpoint, 1 now"),
    TrustCase("resume-other-data", "silent", "resume on other training data", _resume_changed(data_seed=7), ValueError,
              r"the training data differ \(sha256 \w+ in the checkpoint, \w+ now\)"),
    TrustCase("resume-int32-b-noise", "silent", "resume from a checkpoint whose b_noise is stored as int32 (loaded as 1e9)",
              _resume_int32_b_noise, OSError, r"action\.b_noise is stored as I32, but the model's tensor is floating-point"),
    TrustCase("resume-without-a-run", "silent", "resume into a directory with no run (started from scratch, exit 0)",
              _resume_without_run, ValueError, "nothing to resume: .* holds no causalqwen run"),
    TrustCase("config-detach-gate-string", "silent", 'config.json with "detach_gate": "false" (loaded as true)',
              load_config_fields(detach_gate="false"), ValueError, r"config\.json: .*detach_gate must be true or false"),
    TrustCase("config-num-token-id-float", "silent", "config.json with num_token_id 1.5",
              load_config_fields(num_token_id=1.5), ValueError, r"config\.json: .*num_token_id must be an integer, got 1\.5"),
    TrustCase("config-threshold-overflows", "silent", "ovr_threshold = -3e38 (an infinite loss)",
              _settings_extreme(ovr_threshold=-3e38), ValueError, r"ovr_threshold must be a number in \[-1e\+30, 1e\+30\]"),
    TrustCase("config-noise-overflows", "silent", "noise_init = 3e38 (non-finite gradients)",
              _settings_extreme(noise_init=3e38), ValueError, r"noise_init must be a number in \[-1e\+30, 1e\+30\]"),
    TrustCase("text-subnormal-number", "silent", "the number 8e-46 in a text (became 1.4e-45; stays text now)",
              _subnormal_text, None, ""),
    command_line_refusal("demo-zero-steps", "silent", "demo --steps 0 (ran 1,500 steps)",
                         _demo_zero_steps, r".*steps must be a positive int, got 0"),
    TrustCase("train-on-empty-texts", "silent", "training on texts that are all empty (loss 0 on nothing)",
              _empty_texts, ValueError, "none of the 8 training texts has two tokens"),
    TrustCase("forward-beyond-max-positions", "silent", "forward on more positions than max_position_embeddings",
              _too_many_positions, ValueError, r"\d+ positions, more than max_position_embeddings=\d+"),
    # ---- clarity: `validation.trust_clarity`
] + CLARITY_CASES
