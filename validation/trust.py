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
  surrogate, a config field of the wrong type, a missing tokenizer, a divergent learning rate.

A row either must raise exactly its exception with a message that names the file, line, field or
character (``error`` and ``message``), or must *succeed* with the right result (``error`` is None:
the trigger checks the result and raises `WrongResult` otherwise). A trigger that plants a pickle or a
file to be kept checks afterwards that the pickle never ran and the file is still there.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable

import torch

from .robustness import (
    CommandLineExit,
    _quiet_transformers,
    _scratch_dir,
    _tiny,
    run_cli,
)

__all__ = ["TrustCase", "TRUST_CASES", "GROUPS", "WrongResult", "run_trust_case", "READS_AND_REFUSALS"]

GROUPS = ("security", "silent", "clarity")


class WrongResult(Exception):
    """A case that must succeed gave a wrong result, or a guarded side effect happened (a pickle ran, a
    file was deleted)."""


@dataclass(frozen=True)
class TrustCase:
    """One input from outside and what the project must do with it.

    Attributes:
        id: a short stable name.
        group: ``"security"``, ``"silent"`` or ``"clarity"``.
        description: the input, in words.
        trigger: a zero-argument callable that gives the input (and checks the result or side effects).
        error: the exception type it must raise exactly, or None if it must succeed.
        message: a regular expression the message must contain (``re.search``); ignored when ``error`` is None.
    """

    id: str
    group: str
    description: str
    trigger: Callable[[], object]
    error: type[BaseException] | None
    message: str = ""


@dataclass
class TrustOutcome:
    case: TrustCase
    passed: bool
    actual: str


def run_trust_case(case: TrustCase) -> TrustOutcome:
    """Trigger ``case`` and judge it (transformers' warnings and progress bars silenced)."""
    try:
        with _quiet_transformers():
            case.trigger()
    except Exception as error:  # noqa: BLE001 -- judging the exception is the point
        message = str(error)
        passed = case.error is not None and type(error) is case.error and re.search(case.message, message) is not None
        return TrustOutcome(case, passed, f"{type(error).__name__}: {message}")
    if case.error is None:
        return TrustOutcome(case, True, "ran, with the right result")
    return TrustOutcome(case, False, "no error raised")


# =============================================================================================
# Helpers: a scratch directory per case, a tiny run, planted pickles
# =============================================================================================


def _fresh_dir(name: str) -> str:
    return tempfile.mkdtemp(prefix=name + "-", dir=_scratch_dir())


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


def _model(**overrides):
    from causalqwen.tiny import build_tiny_causal_lm

    return build_tiny_causal_lm(seed=0, init_seed=0, **overrides).model


def _dataset(n: int = 16, seed: int = 0):
    from causalqwen.data import TextDataset, synthetic_texts

    return TextDataset(synthetic_texts(n, seed=seed), _tiny()[1], max_length=24)


_RUN = dict(steps=2, batch_size=4, learning_rate=3e-3, warmup_steps=1, preset="all", eval_every=2, save_every=2,
            log_every=1, seed=0)


def _train(out: str | None, resume: bool = False, overwrite: bool = False, data=None, **changes):
    from causalqwen.training import TrainingConfig, train

    with torch.random.fork_rng(devices=[]):
        return train(_model(), data if data is not None else _dataset(), TrainingConfig(**_RUN | changes),
                     out_dir=out, resume=resume, overwrite=overwrite, progress=False)


def _saved_model() -> str:
    """A fresh copy of the tiny CausalQwen saved with save_pretrained (model and tokenizer)."""
    path = os.path.join(_fresh_dir("saved"), "model")
    _model().save_pretrained(path)
    _tiny()[1].save_pretrained(path)
    return path


def _edit_config(path: str, **fields) -> None:
    file = os.path.join(path, "config.json")
    with open(file, encoding="utf-8") as handle:
        config = json.load(handle)
    config.update(fields)
    with open(file, "w", encoding="utf-8") as handle:
        json.dump(config, handle)


def _load(path: str):
    from causalqwen import CausalQwenForCausalLM

    return CausalQwenForCausalLM.from_pretrained(path)


# =============================================================================================
# security
# =============================================================================================


def _planted_training_state():
    out = os.path.join(_fresh_dir("planted-state"), "run")
    _train(out)
    checkpoint = os.path.join(out, "checkpoint-2")
    for name in os.listdir(checkpoint):  # an old-format checkpoint: its training state is only the pickle
        if name not in ("config.json", "model.safetensors", "history.json"):
            os.remove(os.path.join(checkpoint, name))
    witness = os.path.join(out, "..", "pwned")
    _plant(os.path.join(checkpoint, "training_state.pt"), witness)
    with _guarded(witness):
        _train(out, resume=True)


def _pickled_model_only():
    path = _saved_model()
    os.remove(os.path.join(path, "model.safetensors"))
    witness = os.path.join(path, "..", "pwned")
    _plant(os.path.join(path, "pytorch_model.bin"), witness)
    with _guarded(witness):
        _load(path)


def _index_pointing(shard_name: Callable[[str], str]):
    def trigger():
        from safetensors.torch import load_file

        path = _saved_model()
        outside = os.path.join(os.path.dirname(path), "outside")
        os.makedirs(outside)
        os.replace(os.path.join(path, "model.safetensors"), os.path.join(outside, "model.safetensors"))
        names = list(load_file(os.path.join(outside, "model.safetensors")))
        shard = shard_name(outside)
        with open(os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8") as handle:
            json.dump({"metadata": {}, "weight_map": {name: shard for name in names}}, handle)
        _load(path)

    return trigger


def _huge_vocab():
    path = _saved_model()
    _edit_config(path, vocab_size=10**12)
    _load(path)


def _huge_line():
    from causalqwen.data import TextDataset

    text = "The price is 12.5 yuan. " * 850_000  # 20.4 million characters on one line
    item = TextDataset([text], _tiny()[1], max_length=32)[0]
    if len(item["input_ids"]) != 32:
        raise WrongResult(f"expected 32 tokens, got {len(item['input_ids'])}")


def _overwrite_foreign():
    foreign = _fresh_dir("foreign")
    notes, data = os.path.join(foreign, "notes.txt"), os.path.join(foreign, "train.jsonl")
    for path in (notes, data):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("the user's\n")
    with _guarded(kept=(notes, data)):
        _train(foreign, overwrite=True)


def _overwrite_run_keeps_data():
    out = os.path.join(_fresh_dir("run-with-data"), "run")
    _train(out)
    data = os.path.join(out, "train.jsonl")
    with open(data, "w", encoding="utf-8") as handle:
        handle.write('{"text": "the data file, kept beside the run"}\n')
    with _guarded(kept=(data,)):
        _train(out, overwrite=True)
    if not os.path.isdir(os.path.join(out, "checkpoint-2")):
        raise WrongResult("the overwritten run wrote no checkpoint")


def _demo_on_training_run():
    out = os.path.join(_fresh_dir("demo-on-run"), "run")
    _train(out)
    checkpoint = os.path.join(out, "checkpoint-2")
    with _guarded(kept=(checkpoint, os.path.join(out, "metrics.jsonl"))):
        run_cli(["demo", "--out", out, "--steps", "1"])


def _two_resumes():
    from causalqwen.rundir import RunDirectory

    out = os.path.join(_fresh_dir("two-resumes"), "run")
    _train(out)
    holder = RunDirectory.claim(out, "train", resume=True)  # the first --resume, still running
    try:
        _train(out, resume=True, steps=4)
    finally:
        holder.release()


# =============================================================================================
# silent
# =============================================================================================


def _forward_keyword(keyword: str):
    def trigger():
        tokenizer = _tiny()[1]
        batch = tokenizer(["The price is 12.5 yuan."])
        _tiny()[2](batch["input_ids"], numeric_values=batch["numeric_values"], **{keyword: batch["input_ids"]})

    return trigger


def _number_model():
    model = _model().eval()
    with torch.no_grad():
        model.action.classification_head.bias[_tiny()[1].num_token_id] = 1e4  # every step predicts <NUM>
        model.action.regression_head.weight.zero_()
        model.action.regression_head.bias.fill_(-100011.58)  # beyond float16, not an integer
    return model


def _generate_keeps(dtype):
    def trigger():
        from causalqwen import generate

        tokenizer = _tiny()[1]
        batch = tokenizer(["A cup of tea costs 2 dollars"], padding_side="left")
        out = generate(_number_model(), batch["input_ids"], batch["numeric_values"].to(dtype), batch["attention_mask"],
                       max_new_tokens=1)
        value = out.numeric_values[0, -1].item()
        if abs(value - -100011.58) > 0.01 or out.numeric_values.dtype != torch.float32:
            raise WrongResult(f"the predicted -100011.58 came back as {value!r} ({out.numeric_values.dtype})")

    return trigger


def _fused_double_backward():
    tokenizer, model = _tiny()[1], _model()
    batch = tokenizer(["A cup of tea costs 1.5 dollars."])
    loss = model(**batch, labels=batch["input_ids"]).loss
    (gradient,) = torch.autograd.grad(loss, model.action.b_noise, create_graph=True)
    torch.autograd.grad(gradient.sum(), model.action.b_noise)


def _num_labels_without_targets():
    tokenizer = _tiny()[1]
    words = tokenizer(["The price is yuan."])["input_ids"]
    labels = words.clone()
    labels[0, 2] = tokenizer.num_token_id
    _tiny()[2](words, labels=labels)


def _num_prompt_without_values():
    from causalqwen import generate

    batch = _tiny()[1](["The price is 12.5 yuan and"])
    generate(_tiny()[2], batch["input_ids"], max_new_tokens=2)


def _resume_changed(**changes):
    def trigger():
        out = os.path.join(_fresh_dir("resume-changed"), "run")
        _train(out, steps=4, save_every=2)
        shutil.rmtree(os.path.join(out, "checkpoint-4"))  # as if killed after step 2
        settings = dict(changes)  # the closure's dict is left as it is: a case can run twice
        data = _dataset(seed=settings.pop("data_seed")) if "data_seed" in settings else None
        _train(out, resume=True, data=data, steps=4, save_every=2, **settings)

    return trigger


def _resume_int32_b_noise():
    from safetensors.torch import load_file, save_file

    out = os.path.join(_fresh_dir("resume-int32"), "run")
    _train(out, steps=4, save_every=2)
    shutil.rmtree(os.path.join(out, "checkpoint-4"))  # as if killed after step 2
    weights = os.path.join(out, "checkpoint-2", "model.safetensors")
    state = load_file(weights)
    state["action.b_noise"] = torch.full_like(state["action.b_noise"], 10**9, dtype=torch.int32)
    save_file(state, weights)
    _train(out, resume=True, steps=4, save_every=2)


def _resume_without_run():
    out = os.path.join(_fresh_dir("resume-nothing"), "run")
    _train(out, resume=True)


def _config_field(**fields):
    def trigger():
        path = _saved_model()
        _edit_config(path, **fields)
        _load(path)

    return trigger


def _settings_extreme(**settings):
    def trigger():
        _model(**settings)

    return trigger


def _subnormal_text():
    tokenizer = _tiny()[1]
    text = "a tolerance of 8e-46 units"
    encoding = tokenizer([text])
    if encoding.number_texts != [[]] or tokenizer.batch_decode(encoding) != [text]:
        raise WrongResult(f"8e-46 became a number or did not come back: {encoding.number_texts}")


def _demo_zero_steps():
    run_cli(["demo", "--steps", "0", "--out", os.path.join(_fresh_dir("demo-zero"), "demo")])


def _empty_texts():
    from causalqwen.data import TextDataset

    _train(None, data=TextDataset([""] * 8, _tiny()[1]))


def _too_many_positions():
    model = _tiny()[2]
    model(torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long))


# =============================================================================================
# clarity
# =============================================================================================


def _invalid_utf8():
    from causalqwen.data import read_jsonl

    path = os.path.join(_fresh_dir("utf8"), "data.jsonl")
    with open(path, "wb") as handle:
        handle.write(b'{"text": "fine"}\n{"text": "caf\xe9 12"}\n')
    read_jsonl(path)


def _lone_surrogate():
    from causalqwen.data import TextDataset, read_jsonl

    path = os.path.join(_fresh_dir("surrogate"), "data.jsonl")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"text": "ok"}\n{"text": "ab\\ud800cd 5"}\n')
    texts, sources = read_jsonl(path)
    TextDataset(texts, _tiny()[1], 16, sources)


def _missing_tokenizer():
    path = _saved_model()
    for name in os.listdir(path):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "added_tokens")):
            os.remove(os.path.join(path, name))
    run_cli(["generate", "--model", path, "--prompt", "hi", "--max-new-tokens", "1"])


def _truncated_metrics_line():
    from causalqwen.training import latest_checkpoint

    out = os.path.join(_fresh_dir("metrics-cut"), "run")
    _train(out, steps=4, save_every=2)
    shutil.rmtree(os.path.join(out, "checkpoint-4"))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        lines = handle.readlines()
    with open(os.path.join(out, "metrics.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(lines[:3])
        handle.write(lines[3][:10])  # the line a kill -9 cut in half
    _train(out, resume=True, steps=4, save_every=2)
    if not latest_checkpoint(out).endswith("checkpoint-4"):
        raise WrongResult("the resumed run did not finish")


def _divergence():
    _train(None, steps=6, learning_rate=1e30, weight_decay=0.0)  # no decay: 1e30 * 0.01 >= 1 is refused up front


def _numpy_scalars():
    import numpy as np

    from causalqwen import generate

    batch = _tiny()[1](["A cup of tea costs"], padding_side="left")
    generate(_tiny()[2], batch["input_ids"], batch["numeric_values"], batch["attention_mask"], mode="traditional",
             max_new_tokens=np.int64(2), temperature=np.float32(0.7), top_k=torch.tensor(5), top_p=np.float64(0.9),
             generator=torch.Generator().manual_seed(0))


def _tiny_temperature():
    from causalqwen.inference import traditional_probabilities

    probs = traditional_probabilities(torch.tensor([[1.0, 3.0, 2.0]]), temperature=1e-45)
    if not torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0]])):
        raise WrongResult(f"expected the greedy distribution, got {probs.tolist()}")


def _inputs_embeds():
    _tiny()[2](torch.tensor([[1, 2]]), inputs_embeds=torch.zeros(1, 2, _tiny()[2].config.hidden_size))


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
              _huge_vocab, ValueError, r"config\.json says vocab_size=1000000000000, hidden_size=\d+, but model\.embed_tokens\.weight"),
    TrustCase("jsonl-20-mb-line", "security", "a 20 MB text for a 32-token training row (the Rust tokenizer aborts on 50 MB)",
              _huge_line, None),
    TrustCase("overwrite-foreign-directory", "security", "train --overwrite into a directory no run wrote (notes and data in it)",
              _overwrite_foreign, ValueError, r"exists and is not a causalqwen run .*never deletes files it did not write"),
    TrustCase("overwrite-keeps-the-data-file", "security", "train --overwrite of a run whose directory also holds the --data file",
              _overwrite_run_keeps_data, None),
    TrustCase("demo-on-a-training-run", "security", "demo --out pointed at a training run",
              _demo_on_training_run, CommandLineExit, r"exit status 2: .*holds a training run; a demo run never replaces it"),
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
              _config_field(detach_gate="false"), ValueError, r"config\.json: .*detach_gate must be true or false"),
    TrustCase("config-num-token-id-float", "silent", "config.json with num_token_id 1.5",
              _config_field(num_token_id=1.5), ValueError, r"config\.json: .*num_token_id must be an integer, got 1\.5"),
    TrustCase("config-threshold-overflows", "silent", "ovr_threshold = -3e38 (an infinite loss)",
              _settings_extreme(ovr_threshold=-3e38), ValueError, r"ovr_threshold must be a number in \[-1e\+30, 1e\+30\]"),
    TrustCase("config-noise-overflows", "silent", "noise_init = 3e38 (non-finite gradients)",
              _settings_extreme(noise_init=3e38), ValueError, r"noise_init must be a number in \[-1e\+30, 1e\+30\]"),
    TrustCase("text-subnormal-number", "silent", "the number 8e-46 in a text (became 1.4e-45; stays text now)",
              _subnormal_text, None, ""),
    TrustCase("demo-zero-steps", "silent", "demo --steps 0 (ran 1,500 steps)", _demo_zero_steps, CommandLineExit,
              "exit status 2: .*steps must be a positive int, got 0"),
    TrustCase("train-on-empty-texts", "silent", "training on texts that are all empty (loss 0 on nothing)",
              _empty_texts, ValueError, "none of the 8 training texts has two tokens"),
    TrustCase("forward-beyond-max-positions", "silent", "forward on more positions than max_position_embeddings",
              _too_many_positions, ValueError, r"\d+ positions, more than max_position_embeddings=\d+"),
    # ---- clarity
    TrustCase("jsonl-invalid-utf8", "clarity", "a JSONL line with a Latin-1 byte", _invalid_utf8, ValueError,
              r"data\.jsonl, line 2: invalid UTF-8 at byte 13 of the line"),
    TrustCase("jsonl-lone-surrogate", "clarity", 'a JSONL text holding "\\ud800"', _lone_surrogate, ValueError,
              r"data\.jsonl, line 2: character 2 of the text is '\\ud800', a lone surrogate"),
    TrustCase("config-field-wrong-type", "clarity", 'config.json with "ovr_threshold": "100" (was a comparison TypeError)',
              _config_field(ovr_threshold="100"), ValueError, r"config\.json: config field ovr_threshold must be a number, got '100'"),
    TrustCase("tokenizer-files-missing", "clarity", "generate --model on a directory without its tokenizer files",
              _missing_tokenizer, CommandLineExit, r"exit status 2: .*cannot load a tokenizer from '.*model'"),
    TrustCase("metrics-line-cut-short", "clarity", "resume after a kill cut the last line of metrics.jsonl in half",
              _truncated_metrics_line, None),
    TrustCase("learning-rate-1e30", "clarity", "training with learning rate 1e30 (surfaced as 'scale_U must be >= 0')",
              _divergence, WrongResult, r"training diverged .*lower the learning rate"),  # TrainingDiverged, set below
    TrustCase("generate-numpy-scalars", "clarity", "generate with NumPy and 0-d tensor scalars for its numbers",
              _numpy_scalars, None),
    TrustCase("temperature-1e-45", "clarity", "traditional sampling at temperature 1e-45 (a raw RuntimeError)",
              _tiny_temperature, None),
    TrustCase("forward-inputs-embeds", "clarity", "forward(inputs_embeds=...) (a 999-character error)",
              _inputs_embeds, TypeError, r"^forward\(\) does not take inputs_embeds: CausalQwen forms the embeddings itself"),
]


def _resolve_diverged() -> None:
    """The divergence row expects `causalqwen.training.TrainingDiverged` (looked up late, so that this table
    can also be run against a version of the package that does not have it: the row then fails)."""
    try:
        from causalqwen.training import TrainingDiverged
    except ImportError:
        return
    for index, case in enumerate(TRUST_CASES):
        if case.id == "learning-rate-1e30":
            TRUST_CASES[index] = TrustCase(case.id, case.group, case.description, case.trigger, TrainingDiverged,
                                           case.message)


_resolve_diverged()


READS_AND_REFUSALS = [
    ("model weights (`from_pretrained`, `from_qwen`, `generate --model`, `train --base`)",
     "`model.safetensors`, or the shards of `model.safetensors.index.json`",
     "pickles (`pytorch_model.bin`, `use_safetensors=False`); shard names that leave the directory (`..`, absolute); "
     "truncated or corrupt files; missing, extra, reshaped, integer-typed or non-finite tensors"),
    ("`config.json`", "JSON, every CausalQwen field type- and range-checked; sizes compared with the weights' headers",
     "a string for a boolean or a number, a float for an integer, settings beyond ±1e30, a vocabulary, width, depth "
     "or MLP size that the weights do not have (before anything is allocated)"),
    ("checkpoints (`--resume`)", "`model.safetensors`, `training_state.safetensors`, `trainer_state.json`, `history.json`",
     "`training_state.pt` (a pickle: never loaded); another model config, other settings or data (unless "
     "`--allow-changed-settings`); optimizer tensors that do not fit their parameters; a directory with no run"),
    ("tokenizers", "`AutoTokenizer.from_pretrained` files (`tokenizer.json`, ...)",
     "a missing path or corrupt files: one error naming the path"),
    ("data (`--data`, `--eval-data`)", "UTF-8 JSONL, one `{\"text\": ...}` per line; only as much of a long text as "
     "`--max-length` tokens need",
     "invalid UTF-8 (file, line, byte), lone surrogates (line, character), numbers beyond float32 or changed by "
     "a subnormal float32, datasets with nothing to score"),
    ("output directories (`--out`)", "new or empty directories, or a run of the same kind (marker `causalqwen-run.json`)",
     "directories no run wrote (even with `--overwrite`), a training run as a demo's output, a directory another "
     "run holds (`flock`); `--overwrite` removes only the files a run writes"),
]
