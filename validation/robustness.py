r"""The robustness suite: where the implementation must fail loudly, and where it must not fail at all.

Three parts, each data plus a runner, shared by the tests (``tests/test_robustness.py``) and by the
validation report (`summary_markdown`):

1. **Bad inputs** (`BAD_INPUT_CASES`): one row per kind of wrong input, across the tokenizer, the
   model, the losses, the inference modes, generation and the command line. Each row holds a
   zero-argument callable that commits the mistake, the exception type it must raise and a regular
   expression its message must contain, naming what is wrong. No row may end in a bare
   ``IndexError``, a shape error from deep inside torch, a silent NaN or a silently clamped value.
2. **Tampered checkpoints** (`CHECKPOINT_CASES`): a tiny model saved with ``save_pretrained``, then its
   ``model.safetensors`` truncated, its header corrupted, a tensor removed, reshaped, added, stored as
   integers or set to NaN. ``CausalQwenForCausalLM.from_pretrained`` must raise an ``OSError`` that names
   the file or the tensor; it must never hand back a half-loaded model.
3. **Extreme but finite inputs** (`ModelCase`, `LossCase`): numbers up to the largest float32
   ($3.4\cdot10^{38}$), denormals and zeros in ``numeric_values``; $|\mathrm{loc}_U|$ up to
   $10^{30}$ (the abduction map $W_{\mathrm{loc}}$ scaled up); every scale at ``scale_eps``;
   all-padding rows; all-ignored labels. Forward, loss and backward must leave no NaN or ±inf in the
   loss or in any gradient. The tests draw these cases with Hypothesis; the report draws a fixed-seed
   sample with `random.Random`.

4. **Trust boundaries** (`validation.trust`): files and inputs from outside -- planted pickles, shard paths
   that leave their directory, oversized configs, foreign output directories, changed settings on resume,
   misspelt keywords, wrong types -- with what the project reads and refuses (the report's security section).

Fixtures (the tiny base, the model, the saved checkpoint) are built on first use and cached, so that
importing this module costs nothing and the whole summary runs in a few seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import html
import io
import json
import math
import os
import random
import re
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .common import table, verdict

__all__ = [
    "BadInputCase",
    "BAD_INPUT_CASES",
    "CHECKPOINT_CASES",
    "COMPONENTS",
    "CommandLineExit",
    "CaseOutcome",
    "run_case",
    "run_cli",
    "intact_checkpoint_round_trip",
    "NUMBER_MAGNITUDES",
    "LOC_SCALES",
    "SCALE_SETTINGS",
    "NOISE_VALUES",
    "MASK_PATTERNS",
    "LABEL_PATTERNS",
    "LOSS_PATHS",
    "LOC_MAGNITUDES",
    "THRESHOLDS",
    "ModelCase",
    "LossCase",
    "FiniteCheck",
    "run_model_case",
    "run_loss_case",
    "random_model_case",
    "random_loss_case",
    "SuiteResult",
    "run_suite",
    "summary_markdown",
]

FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028234663852886e38
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)  # 1.1754943508222875e-38, the smallest normal
FLOAT32_DENORMAL = 1e-45  # rounds to the smallest float32 denormal, 1.4e-45

COMPONENTS = ("tokenizer", "model", "losses", "inference", "generation", "cli")


# =============================================================================================
# Fixtures, built on first use
# =============================================================================================


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' warnings and progress bars for the duration (restored afterwards)."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()


@functools.cache
def _scratch_dir() -> str:
    """A temporary directory for saved checkpoints, removed when the process exits."""
    path = tempfile.mkdtemp(prefix="causalqwen-robustness-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def _tiny():
    """``(qwen, tokenizer, model)``: the embedded tiny Qwen2 base, its `NumericTokenizer`, and CausalQwen
    converted from it (eval mode). The global torch random state is left as it was."""
    from causalqwen.tiny import build_tiny_causal_lm

    model, tokenizer, qwen = build_tiny_causal_lm(seed=0, init_seed=0)
    return qwen, tokenizer, model


def _tokenizer():
    return _tiny()[1]


def _model():
    return _tiny()[2]


def _num_id() -> int:
    return _tiny()[1].num_token_id


def _ids(*rows) -> torch.Tensor:
    """A ``[B, S]`` id tensor from rows of ids, where ``None`` stands for ``<NUM>``."""
    return torch.tensor([[_num_id() if i is None else i for i in row] for row in rows])


def _prompt():
    """``(input_ids, numeric_values)`` of one short prompt ``[1, 3]`` holding one ``<NUM>`` = 12.5."""
    return _ids([11, None, 23]), torch.tensor([[0.0, 12.5, 0.0]])


# =============================================================================================
# Part 1: the bad-input table
# =============================================================================================


@dataclass(frozen=True)
class BadInputCase:
    """One kind of wrong input and the clear error it must raise.

    Attributes:
        id: a short stable name (the test id).
        component: where the input goes: one of `COMPONENTS` (or ``"checkpoint"``).
        description: the mistake, in words.
        trigger: a zero-argument callable that makes the mistake.
        error: the exception type that must be raised, exactly (not a subclass).
        message: a regular expression that the message must contain (``re.search``); it names what is wrong.
    """

    id: str
    component: str
    description: str
    trigger: Callable[[], object]
    error: type[BaseException]
    message: str


class CommandLineExit(Exception):
    """The ``causalqwen`` command exited through argparse (``SystemExit``).

    Its message is ``"exit status N: LAST LINE OF STDERR"``, so a table row can match both.
    """


def run_cli(args: list[str]) -> int:
    """Run ``causalqwen ARGS`` in-process with stdout and stderr captured; return its exit status.

    An exit through ``SystemExit`` (argparse's ``parser.error``, status 2) becomes a `CommandLineExit`
    whose message is ``"exit status N: <the last line written to stderr>"``.
    """
    from causalqwen import cli

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _quiet_transformers():
            return cli.main(args)
    except SystemExit as exit_:
        lines = err.getvalue().strip().splitlines()
        raise CommandLineExit(f"exit status {exit_.code}: {lines[-1] if lines else '(nothing on stderr)'}") from None


# ---- triggers that need more than one line ----


def _forward(**kwargs):
    ids, values = _prompt()
    arguments = dict(input_ids=ids, numeric_values=values)
    arguments.update(kwargs)
    with torch.no_grad():
        return _model()(**arguments)


def _numeric_value_beyond_float32():
    ids, _ = _prompt()
    values = torch.tensor([[0.0, 1e300, 0.0]], dtype=torch.float64)  # finite in float64, inf in float32
    return _forward(input_ids=ids, numeric_values=values)


def _total_loss(**overrides):
    """`losses.total_loss` on a small valid problem (2 positions, 5 classes, ``<NUM>`` = class 3), with overrides."""
    from causalqwen.losses import total_loss

    arguments = dict(
        loc_S=torch.zeros(2, 5),
        scale_S=torch.ones(2, 5),
        loc_Y=torch.zeros(2),
        scale_Y=torch.ones(2),
        labels=torch.tensor([3, 1]),
        numeric_targets=torch.tensor([2.5, 0.0]),
        num_token_id=3,
    )
    arguments.update(overrides)
    return total_loss(**arguments)


def _fused_loss(**overrides):
    from causalqwen.action import ActionNetwork
    from causalqwen.losses import fused_ovr_classification_loss

    action = ActionNetwork(4, 6)
    arguments = dict(
        loc_U=torch.zeros(3, 4),
        scale_U=torch.ones(3, 4),
        weight=action.classification_head.weight,
        bias=action.classification_head.bias,
        noise_scale=action.noise_scale,
        threshold=0.0,
        labels=torch.tensor([0, 5, -100]),
    )
    arguments.update(overrides)
    return fused_ovr_classification_loss(**arguments)


def _decision_input(mode="standard", **overrides):
    from causalqwen.inference import decision_input

    arguments = dict(loc_U=torch.zeros(2, 4), scale_U=torch.ones(2, 4), noise_scale=torch.full((4,), 0.1))
    arguments.update(overrides)
    return decision_input(mode, **arguments, generator=torch.Generator().manual_seed(0))


def _config(**overrides):
    from causalqwen import CausalQwenConfig

    return CausalQwenConfig(hidden_size=8, num_attention_heads=2, **overrides)


def _predict(num_token_id):
    from causalqwen.inference import predict

    return predict(torch.zeros(2, 5), torch.ones(2, 5), torch.zeros(2), 0.0, num_token_id)


def _traditional(**kwargs):
    from causalqwen.inference import traditional_probabilities

    return traditional_probabilities(torch.zeros(2, 5), **kwargs)


def _generate(model=None, **kwargs):
    from causalqwen import generate

    ids, values = _prompt()
    arguments = dict(input_ids=ids, numeric_values=values, max_new_tokens=2)
    arguments.update(kwargs)
    return generate(model if model is not None else _model(), **arguments)


def _right_padded_prompts():
    ids = _ids([11, None, 23], [11, 5, 0])
    values = torch.tensor([[0.0, 12.5, 0.0], [0.0, 0.0, 0.0]])
    return _generate(input_ids=ids, numeric_values=values, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))


BAD_INPUT_CASES: list[BadInputCase] = [
    # ---- tokenizer ----
    BadInputCase(
        "tokenizer-literal-overflows-float32", "tokenizer",
        "parse_number of a literal beyond float32 (1e400; in a text it is simply text)",
        lambda: __import__("causalqwen.numbers").numbers.parse_number("1e400"),
        ValueError, r"number '1e400' overflows float32",
    ),
    BadInputCase(
        "tokenizer-literal-is-an-identifier", "tokenizer",
        "parse_number of a digit run float32 cannot hold (a phone number)",
        lambda: __import__("causalqwen.numbers").numbers.parse_number("13409860099"),
        ValueError, r"'13409860099' has more than 9 significant digits .*identifier",
    ),
    BadInputCase(
        "tokenizer-stale-number-text", "tokenizer",
        "decoding with a surface text that no longer reads as the value beside it",
        lambda: _tokenizer().decode([_num_id()], [50.0], number_texts=["43.60"]),
        ValueError, r"number_texts\[0\] = '43.60' reads as 43.6, but numeric_values\[0\] holds 50",
    ),
    BadInputCase(
        "tokenizer-number-texts-rows", "tokenizer",
        "batch_decode with number_texts for 2 rows of a 1-row batch",
        lambda: _tokenizer().batch_decode([[_num_id()]], [[5.0]], number_texts=[["5"], ["6"]]),
        ValueError, r"number_texts has 2 rows but input_ids has 1",
    ),
    BadInputCase(
        "tokenizer-not-text", "tokenizer",
        "an int where a text (or a list of texts) belongs",
        lambda: _tokenizer()(42),
        TypeError, r"texts must be a str or a list of str, got int",
    ),
    BadInputCase(
        "tokenizer-padding-side", "tokenizer",
        "padding_side='middle'",
        lambda: _tokenizer()(["a", "bb"], padding_side="middle"),
        ValueError, r"padding_side must be 'left' or 'right', got 'middle'",
    ),
    BadInputCase(
        "tokenizer-decode-nan-value", "tokenizer",
        "decoding a <NUM> whose value is NaN",
        lambda: _tokenizer().decode([_num_id()], [math.nan]),
        ValueError, r"numeric_values\[0\]: cannot format nan",
    ),
    BadInputCase(
        "tokenizer-decode-unknown-id", "tokenizer",
        "decoding an id the tokenizer does not have",
        lambda: _tokenizer().decode([10**6], [0.0]),
        ValueError, r"input_ids\[0\] = 1000000 is not a token id of this tokenizer",
    ),
    # ---- model ----
    BadInputCase(
        "model-numeric-value-nan", "model",
        "a NaN in numeric_values",
        lambda: _forward(numeric_values=torch.tensor([[0.0, math.nan, 0.0]])),
        ValueError, r"numeric_values must be finite: found NaN or ±inf",
    ),
    BadInputCase(
        "model-numeric-value-beyond-float32", "model",
        "a float64 numeric value of 1e300 (finite, but ±inf once the embedding casts it to float32)",
        _numeric_value_beyond_float32,
        ValueError, r"numeric_values must be representable in float32 .* found 1e\+300 at position \[0, 1\]",
    ),
    BadInputCase(
        "model-value-on-a-word", "model",
        "a non-zero value at a position that is not <NUM>",
        lambda: _forward(numeric_values=torch.tensor([[3.0, 12.5, 0.0]])),
        ValueError, r"numeric_values must be 0 wherever input_ids is not <NUM> .* at position \[0, 0\]",
    ),
    BadInputCase(
        "model-numeric-values-not-a-tensor", "model",
        "numeric_values given as a Python list",
        lambda: _forward(numeric_values=[[0.0, 12.5, 0.0]]),
        TypeError, r"numeric_values must be a torch\.Tensor of shape \[B, S\] like input_ids, got list",
    ),
    BadInputCase(
        "model-token-id-out-of-range", "model",
        "an input id beyond the vocabulary",
        lambda: _forward(input_ids=torch.tensor([[11, 10**6, 23]]), numeric_values=None),
        ValueError, r"input_ids must lie in \[0, vocab_size=\d+\)",
    ),
    BadInputCase(
        "model-empty-sequence", "model",
        "input_ids of shape [1, 0] (no token at all)",
        lambda: _forward(input_ids=torch.zeros(1, 0, dtype=torch.long), numeric_values=None),
        ValueError, r"input_ids must hold at least one row and one token, got shape \(1, 0\)",
    ),
    BadInputCase(
        "model-position-ids-shape", "model",
        "position_ids longer than input_ids",
        lambda: _forward(position_ids=torch.arange(5)[None]),
        ValueError, r"position_ids must be a tensor of shape \(1, 3\) to match input_ids, got \(1, 5\)",
    ),
    BadInputCase(
        "model-attention-mask-values", "model",
        "an attention_mask holding a 2",
        lambda: _forward(attention_mask=torch.tensor([[1, 2, 1]])),
        ValueError, r"attention_mask must contain only 0 and 1",
    ),
    BadInputCase(
        "model-label-out-of-range", "model",
        "a label beyond the vocabulary",
        lambda: _forward(labels=torch.tensor([[11, 12, 10**6]])),
        ValueError, r"labels must lie in \[0, \d+\) or equal ignore_index=-100; found 1000000",
    ),
    BadInputCase(
        "model-negative-regression-weight", "model",
        "CausalQwenConfig(regression_weight=-1.0): a loss that rewards bad regression",
        lambda: _config(regression_weight=-1.0),
        ValueError, r"config field regression_weight must be a number in \[0, 1e\+30\], got -1\.0",
    ),
    BadInputCase(
        "model-action-negative-scale", "model",
        "ActionNetwork.decide with a negative scale (it used to be clamped to scale_eps silently)",
        lambda: _model().action.decide(torch.zeros(1, 64), torch.full((1, 64), -1.0)),
        ValueError, r"scale must be >= 0 everywhere \(a Cauchy scale\); found -1\.0",
    ),
    BadInputCase(
        "model-action-wrong-width", "model",
        "ActionNetwork given loc_U with 63 components instead of C = 64",
        lambda: _model().action(torch.zeros(1, 63), torch.ones(1, 63)),
        ValueError, r"loc_U must have last dimension C = 64, got shape \(1, 63\)",
    ),
    # ---- losses ----
    BadInputCase(
        "losses-threshold-nan", "losses",
        "an OvR threshold of NaN (every P_k would be NaN)",
        lambda: _total_loss(threshold=math.nan),
        ValueError, r"threshold \(the OvR threshold C_k\) must be finite",
    ),
    BadInputCase(
        "losses-per-class-threshold-shape", "losses",
        "a per-class threshold with 4 entries for 5 classes",
        lambda: _total_loss(threshold=torch.zeros(4)),
        ValueError, r"a per-class threshold must have shape \(5,\) to match the 5 classes, got \(4,\)",
    ),
    BadInputCase(
        "losses-target-nan-at-unscored-position", "losses",
        "a NaN numeric target at a position that is not a <NUM> target (its gradient used to be NaN)",
        lambda: _total_loss(numeric_targets=torch.tensor([2.5, math.nan])),
        ValueError, r"numeric_targets must be finite: found nan at position \[1\]",
    ),
    BadInputCase(
        "losses-zero-scale", "losses",
        "a class scale of 0",
        lambda: _total_loss(scale_S=torch.zeros(2, 5)),
        ValueError, r"scale must be > 0 everywhere",
    ),
    BadInputCase(
        "losses-shapes-do-not-broadcast", "losses",
        "scale_S [2, 4] beside loc_S [2, 5]",
        lambda: _total_loss(scale_S=torch.ones(2, 4)),
        ValueError, r"x, loc and scale must broadcast together; got shapes \(\), \(2, 5\) and \(2, 4\)",
    ),
    BadInputCase(
        "losses-regression-weight-nan", "losses",
        "regression_weight=NaN",
        lambda: _total_loss(regression_weight=math.nan),
        ValueError, r"regression_weight \(lambda\) must be a finite number >= 0, got nan",
    ),
    BadInputCase(
        "losses-fused-chunk-size", "losses",
        "fused loss with chunk_size=0",
        lambda: _fused_loss(chunk_size=0),
        ValueError, r"chunk_size must be a positive int, got 0",
    ),
    # ---- inference ----
    BadInputCase(
        "inference-unknown-mode", "inference",
        "mode='greedy'",
        lambda: _decision_input("greedy"),
        ValueError, r"unknown inference mode 'greedy'; valid modes are: standard, causal",
    ),
    BadInputCase(
        "inference-negative-noise-scale", "inference",
        "a negative noise_scale (|b_noise| cannot be negative)",
        lambda: _decision_input("causal", noise_scale=torch.full((4,), -0.5)),
        ValueError, r"noise_scale must be >= 0 everywhere",
    ),
    BadInputCase(
        "inference-noise-scale-shape", "inference",
        "noise_scale with 3 components for C = 4",
        lambda: _decision_input("standard", noise_scale=torch.ones(3)),
        ValueError, r"noise_scale must have shape \[C\] = \(4,\), got \(3,\)",
    ),
    BadInputCase(
        "inference-uniform-outside-unit-interval", "inference",
        "a fixed uniform draw of exactly 1.0 (tan(pi/2) is infinite)",
        lambda: _decision_input("causal", uniform=torch.ones(4, dtype=torch.float64)),
        ValueError, r"uniform must lie strictly inside \(0, 1\)",
    ),
    BadInputCase(
        "inference-num-token-id-out-of-range", "inference",
        "predict with num_token_id=99 for 5 classes",
        lambda: _predict(num_token_id=99),
        ValueError, r"num_token_id must be a class index in \[0, 5\), got 99",
    ),
    BadInputCase(
        "inference-top-p", "inference",
        "traditional sampling with top_p=1.5",
        lambda: _traditional(top_p=1.5),
        ValueError, r"top_p must lie in \(0, 1\]",
    ),
    # ---- generation ----
    BadInputCase(
        "generation-plain-qwen2-model", "generation",
        "generate() given the Qwen2 base instead of a CausalQwen",
        lambda: _generate(model=_tiny()[0]),
        TypeError, r"model must be a CausalQwenForCausalLM .*got Qwen2ForCausalLM",
    ),
    BadInputCase(
        "generation-empty-prompt", "generation",
        "a prompt of zero tokens",
        lambda: _generate(input_ids=torch.zeros(1, 0, dtype=torch.long), numeric_values=None),
        ValueError, r"input_ids must hold at least one prompt of at least one token, got shape \(1, 0\)",
    ),
    BadInputCase(
        "generation-right-padding", "generation",
        "right-padded prompts",
        _right_padded_prompts,
        ValueError, r"generation needs left padding, but attention_mask row 1 has padding after a real token",
    ),
    BadInputCase(
        "generation-negative-max-new-tokens", "generation",
        "max_new_tokens=-1",
        lambda: _generate(max_new_tokens=-1),
        ValueError, r"max_new_tokens must be an integer >= 0, got -1",
    ),
    BadInputCase(
        "generation-pad-id-out-of-range", "generation",
        "pad_token_id beyond the vocabulary",
        lambda: _generate(pad_token_id=10**6),
        ValueError, r"pad_token_id must be a token id \(or a list of them\) in \[0, vocab_size=\d+\), got 1000000",
    ),
    BadInputCase(
        "generation-sampling-args-in-a-decision-mode", "generation",
        "top_k=5 with mode='causal', which does not sample from a categorical",
        lambda: _generate(mode="causal", top_k=5),
        ValueError, r"temperature, top_k, top_p and normalize apply to mode='traditional' only",
    ),
    # ---- command line ----
    BadInputCase(
        "cli-missing-model-directory", "cli",
        "generate --model /no/such/dir",
        lambda: run_cli(["generate", "--model", "/no/such/dir", "--prompt", "hi"]),
        CommandLineExit, r"exit status 2: causalqwen: error: model directory '/no/such/dir' does not exist",
    ),
    BadInputCase(
        "cli-unknown-mode", "cli",
        "generate --mode greedy",
        lambda: run_cli(["generate", "--prompt", "hi", "--mode", "greedy"]),
        CommandLineExit, r"exit status 2: .*argument --mode: invalid choice: 'greedy'",
    ),
    BadInputCase(
        "cli-negative-max-new-tokens", "cli",
        "generate --max-new-tokens -2",
        lambda: run_cli(["generate", "--prompt", "hi", "--max-new-tokens", "-2"]),
        CommandLineExit, r"exit status 2: causalqwen: error: max_new_tokens must be an integer >= 0, got -2",
    ),
    BadInputCase(
        "cli-missing-prompt", "cli",
        "generate without --prompt",
        lambda: run_cli(["generate"]),
        CommandLineExit, r"exit status 2: .*the following arguments are required: --prompt",
    ),
    BadInputCase(
        "cli-empty-prompt", "cli",
        "generate --prompt '' (it used to end in an IndexError traceback)",
        lambda: run_cli(["generate", "--prompt", "", "--max-new-tokens", "2"]),
        CommandLineExit, r"exit status 2: causalqwen: error: input_ids must hold at least one prompt of at least one token",
    ),
    BadInputCase(
        "cli-prompt-invalid-utf8", "cli",
        "generate --prompt holding a byte that is not UTF-8 (argv gives it as a lone surrogate)",
        lambda: run_cli(["generate", "--prompt", "costs \udcff", "--max-new-tokens", "2"]),
        CommandLineExit, r"exit status 2: causalqwen: error: text 0: character 6 of the text is '\\udcff', a lone surrogate",
    ),
    BadInputCase(
        "cli-walkthrough-invalid-utf8", "cli",
        "walkthrough --text holding a byte that is not UTF-8",
        lambda: run_cli(["walkthrough", "--text", "\udcff"]),
        CommandLineExit, r"exit status 2: causalqwen: error: text 0: character 0 of the text is '\\udcff', a lone surrogate",
    ),
    BadInputCase(
        "cli-truncated-checkpoint", "cli",
        "generate --model DIR whose model.safetensors is cut in half",
        lambda: run_cli(["generate", "--model", _tampered_checkpoint("truncated"), "--prompt", "hi"]),
        CommandLineExit, r"exit status 2: causalqwen: error: the safetensors file '.*model\.safetensors' cannot be read",
    ),
]


# =============================================================================================
# Part 2: tampered checkpoints
# =============================================================================================


@functools.cache
def _saved_checkpoint() -> str:
    """The tiny CausalQwen and its tokenizer, written by ``save_pretrained`` (cached; under the scratch dir)."""
    path = os.path.join(_scratch_dir(), "intact")
    with _quiet_transformers():
        _model().save_pretrained(path)
        _tokenizer().save_pretrained(path)
    return path


def _read_header(data: bytes) -> tuple[dict, bytes]:
    """Split a safetensors file into its JSON header and the tensor bytes."""
    length = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _write_header(header: dict, body: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(encoded)) + encoded + body


def _rewrite_tensors(edit: Callable[[dict], None]) -> Callable[[str], None]:
    """A tampering that loads the tensors, lets ``edit`` change the dict, and writes a valid file again."""

    def tamper(file: str) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(file)
        edit(tensors)
        save_file(tensors, file, metadata={"format": "pt"})

    return tamper


def _rewrite_bytes(edit: Callable[[bytes], bytes]) -> Callable[[str], None]:
    def tamper(file: str) -> None:
        with open(file, "rb") as handle:
            data = handle.read()
        with open(file, "wb") as handle:
            handle.write(edit(data))

    return tamper


def _halve_b_noise_in_header(data: bytes) -> bytes:
    """Edit only the header: ``action.b_noise`` claims half its shape (and half its bytes)."""
    header, body = _read_header(data)
    entry = header["action.b_noise"]
    start, end = entry["data_offsets"]
    entry["shape"] = [entry["shape"][0] // 2]
    entry["data_offsets"] = [start, start + (end - start) // 2]
    return _write_header(header, body)


def _set_nan(tensors: dict) -> None:
    tensors["model.numerical_embedding.w_num"] = tensors["model.numerical_embedding.w_num"].clone()
    tensors["model.numerical_embedding.w_num"][0] = math.nan


TAMPERINGS: dict[str, tuple[str, Callable[[str], None]]] = {
    "truncated": ("model.safetensors cut to half its bytes", _rewrite_bytes(lambda data: data[: len(data) // 2])),
    "empty": ("model.safetensors of zero bytes", _rewrite_bytes(lambda data: b"")),
    "corrupt-header": ("the JSON header overwritten with '#' bytes", _rewrite_bytes(lambda data: data[:8] + b"#" * 16 + data[24:])),
    "header-shape-edited": ("the header says action.b_noise has half its shape; the data is unchanged",
                            _rewrite_bytes(_halve_b_noise_in_header)),
    "missing-tensor": ("action.b_noise removed (a valid file otherwise)",
                       _rewrite_tensors(lambda tensors: tensors.pop("action.b_noise"))),
    "reshaped-tensor": ("action.b_noise saved with 32 components instead of 64",
                        _rewrite_tensors(lambda tensors: tensors.update({"action.b_noise": tensors["action.b_noise"][:32].clone()}))),
    "unexpected-tensor": ("an extra tensor action.extra_head.weight",
                          _rewrite_tensors(lambda tensors: tensors.update({"action.extra_head.weight": torch.zeros(3)}))),
    "integer-dtype": ("action.b_noise stored as int32 (its float bits reinterpreted)",
                      _rewrite_tensors(lambda tensors: tensors.update({"action.b_noise": tensors["action.b_noise"].view(torch.int32).clone()}))),
    "non-finite-value": ("a NaN in model.numerical_embedding.w_num", _rewrite_tensors(_set_nan)),
}


@functools.cache
def _tampered_checkpoint(kind: str) -> str:
    """A copy of the saved checkpoint (model and tokenizer) with ``TAMPERINGS[kind]`` applied to its weights."""
    path = os.path.join(_scratch_dir(), kind)
    shutil.copytree(_saved_checkpoint(), path)
    TAMPERINGS[kind][1](os.path.join(path, "model.safetensors"))
    return path


def _load(kind: str, auto: bool = False):
    from transformers import AutoModelForCausalLM

    from causalqwen import CausalQwenForCausalLM

    loader = AutoModelForCausalLM if auto else CausalQwenForCausalLM
    with _quiet_transformers():
        return loader.from_pretrained(_tampered_checkpoint(kind))


_UNREADABLE = r"the safetensors file '.*model\.safetensors' cannot be read: .*\(truncated or corrupt file\)"
_INCOMPLETE = r"does not hold a complete, valid CausalQwenForCausalLM; refusing to return a partly loaded model"

CHECKPOINT_CASES: list[BadInputCase] = [
    BadInputCase("checkpoint-truncated", "checkpoint", TAMPERINGS["truncated"][0],
                 lambda: _load("truncated"), OSError, _UNREADABLE),
    BadInputCase("checkpoint-empty-file", "checkpoint", TAMPERINGS["empty"][0],
                 lambda: _load("empty"), OSError, _UNREADABLE + r"|header too small"),
    BadInputCase("checkpoint-corrupt-header", "checkpoint", TAMPERINGS["corrupt-header"][0],
                 lambda: _load("corrupt-header"), OSError, r"cannot be read: .*invalid JSON in header"),
    BadInputCase("checkpoint-header-shape-edited", "checkpoint", TAMPERINGS["header-shape-edited"][0],
                 lambda: _load("header-shape-edited"), OSError, r"cannot be read: .*invalid offset for tensor"),
    BadInputCase("checkpoint-missing-tensor", "checkpoint", TAMPERINGS["missing-tensor"][0],
                 lambda: _load("missing-tensor"), OSError, _INCOMPLETE + r"[\s\S]*missing from the checkpoint: action\.b_noise"),
    BadInputCase("checkpoint-missing-tensor-auto-model", "checkpoint",
                 TAMPERINGS["missing-tensor"][0] + ", loaded through AutoModelForCausalLM",
                 lambda: _load("missing-tensor", auto=True), OSError, r"missing from the checkpoint: action\.b_noise"),
    BadInputCase("checkpoint-reshaped-tensor", "checkpoint", TAMPERINGS["reshaped-tensor"][0],
                 lambda: _load("reshaped-tensor"), OSError,
                 r"action\.b_noise has shape \(32,\) in the checkpoint but \(64,\) in the model"),
    BadInputCase("checkpoint-unexpected-tensor", "checkpoint", TAMPERINGS["unexpected-tensor"][0],
                 lambda: _load("unexpected-tensor"), OSError,
                 r"in the checkpoint but not in the model: action\.extra_head\.weight"),
    BadInputCase("checkpoint-integer-dtype", "checkpoint", TAMPERINGS["integer-dtype"][0],
                 lambda: _load("integer-dtype"), OSError,
                 r"action\.b_noise is stored as I32 in '.*model\.safetensors', but the model's tensor is floating-point"),
    BadInputCase("checkpoint-non-finite-value", "checkpoint", TAMPERINGS["non-finite-value"][0],
                 lambda: _load("non-finite-value"), OSError, r"model\.numerical_embedding\.w_num holds NaN or ±inf values"),
]


def intact_checkpoint_round_trip() -> bool:
    """The control for `CHECKPOINT_CASES`: the untouched checkpoint loads, and every tensor equals the saved one."""
    from causalqwen import CausalQwenForCausalLM

    with _quiet_transformers():
        loaded = CausalQwenForCausalLM.from_pretrained(_saved_checkpoint())
    saved = _model().state_dict()
    restored = loaded.state_dict()
    return saved.keys() == restored.keys() and all(torch.equal(saved[key], restored[key]) for key in saved)


# ---- running a case ----


@dataclass
class CaseOutcome:
    """What a `BadInputCase` did: ``passed`` when it raised exactly ``case.error`` with a matching message."""

    case: BadInputCase
    passed: bool
    actual: str  # "TypeName: message", or "no error raised"


def run_case(case: BadInputCase) -> CaseOutcome:
    """Trigger ``case`` and judge what it raised (warnings and progress bars of transformers silenced)."""
    try:
        with _quiet_transformers():
            case.trigger()
    except Exception as error:  # noqa: BLE001 -- judging the exception is the point
        message = str(error)
        passed = type(error) is case.error and re.search(case.message, message) is not None
        return CaseOutcome(case, passed, f"{type(error).__name__}: {message}")
    return CaseOutcome(case, False, "no error raised")


# =============================================================================================
# Part 3: extreme but finite inputs through forward, loss and backward
# =============================================================================================

# Magnitudes of the numbers at <NUM> positions (each drawn with a sign): zero, the smallest float32
# denormal and normal, ordinary, huge, and the largest float32.
NUMBER_MAGNITUDES = (0.0, FLOAT32_DENORMAL, FLOAT32_TINY, 1.0, 1e10, 1e30, 3e38, FLOAT32_MAX)
# Factors on the abduction map W_loc: the features z are O(1) after the final RMSNorm, so |loc_U| ~ factor.
LOC_SCALES = (1.0, 1e10, 1e20, 1e30)
# scale_U: "init" (gamma = 10), "scale_eps" (softplus(-1e4) = 0, clamped to scale_eps), "large" (~1e20).
SCALE_SETTINGS = ("init", "scale_eps", "large")
NOISE_VALUES = (0.1, 1e-6, 0.0)  # every component of b_noise; 0 makes the decision scale exactly scale_eps
MASK_PATTERNS = ("none", "full", "left_padded", "one_row_all_padding", "all_padding")
LABEL_PATTERNS = ("next_tokens", "some_ignored", "all_ignored", "extreme_numeric_labels")
LOSS_PATHS = ("fused", "literal")
# Loss-level inputs: |loc| (of loc_S, loc_Y or loc_U) up to 1e30, and OvR thresholds up to ±1e30.
LOC_MAGNITUDES = (0.0, 1e-30, 1.0, 1e6, 1e15, 1e30)
THRESHOLDS = (0.0, 100.0, -1e30, 1e30)

_B_SCALE = {"scale_eps": -1e4, "large": 1e20}  # "init" keeps softplus^-1(gamma)
_SEQUENCE = (11, None, 23, None, 37, None, 5)  # None: <NUM>; three number positions per row


@dataclass(frozen=True)
class ModelCase:
    r"""One extreme input for the whole model: a batch of 2 rows of `_SEQUENCE` (7 positions, 3 ``<NUM>``).

    Attributes:
        values: the 6 numbers at the ``<NUM>`` positions (3 per row), any finite float32.
        targets: 6 numeric labels used when ``labels == "extreme_numeric_labels"`` (else the values are the targets).
        loc_scale: factor on ``W_loc`` (so $|\mathrm{loc}_U|$ reaches about this value).
        scale_setting: one of `SCALE_SETTINGS`.
        noise: the value of every component of ``b_noise``.
        mask: one of `MASK_PATTERNS`.
        labels: one of `LABEL_PATTERNS`.
        path: ``"fused"`` (training's path) or ``"literal"`` (``return_decisions=True``).
    """

    values: tuple[float, ...]
    targets: tuple[float, ...]
    loc_scale: float
    scale_setting: str
    noise: float
    mask: str
    labels: str
    path: str


@dataclass(frozen=True)
class LossCase:
    r"""One extreme input for the losses alone (no backbone): tensors drawn from ``seed`` within the given magnitudes.

    Attributes:
        seed: seeds the elementwise draws (which magnitude, which sign, a factor in [0.5, 1]).
        loc_magnitudes: the magnitudes $|\mathrm{loc}|$ may take (a subset of `LOC_MAGNITUDES`).
        scale_at_eps: every scale at ``scale_eps`` (else a mix of scale_eps, 1 and 1e6).
        threshold: the OvR threshold.
        target_magnitudes: the magnitudes numeric targets may take (a subset of `NUMBER_MAGNITUDES`).
        labels: one of `LABEL_PATTERNS` except ``"extreme_numeric_labels"``.
        mask: one of `MASK_PATTERNS`.
    """

    seed: int
    loc_magnitudes: tuple[float, ...]
    scale_at_eps: bool
    threshold: float
    target_magnitudes: tuple[float, ...]
    labels: str
    mask: str


@dataclass
class FiniteCheck:
    """The result of one fuzz case: which of the loss and the gradients are not finite (must be none)."""

    non_finite: list[str]  # "loss", "cls_loss", ... or "grad of NAME"
    max_abs_loc: float  # the largest |loc_U| (model) or |loc| (losses) actually reached
    min_scale: float  # the smallest scale that entered the Cauchy algebra

    @property
    def ok(self) -> bool:
        return not self.non_finite


@functools.cache
def _fuzz_model():
    """``(model, pristine state)``: a CausalQwen in train mode whose parameters each case resets and then distorts."""
    from causalqwen.tiny import build_tiny_causal_lm

    model = build_tiny_causal_lm(seed=0, init_seed=1).model
    model.train()  # dropout is 0 in the tiny config; train mode as in training
    pristine = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    return model, pristine


def _model_inputs(case: ModelCase):
    num_id = _num_id()
    ids = _ids(_SEQUENCE, _SEQUENCE)  # [2, 7]
    values = torch.zeros(ids.shape)
    targets = torch.zeros(ids.shape)
    number_positions = (ids == num_id).nonzero()  # [6, 2], row-major
    for k, (b, s) in enumerate(number_positions.tolist()):
        values[b, s] = case.values[k]
        targets[b, s] = case.targets[k]
    masks = {
        "none": None,
        "full": torch.ones_like(ids),
        "left_padded": torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]]),
        "one_row_all_padding": torch.tensor([[0] * 7, [1] * 7]),
        "all_padding": torch.zeros_like(ids),
    }
    labels = ids.clone()
    if case.labels == "some_ignored":
        labels[:, ::2] = -100
    elif case.labels == "all_ignored":
        labels[:] = -100
    numeric_labels = targets if case.labels == "extreme_numeric_labels" else None
    return dict(input_ids=ids, numeric_values=values, attention_mask=masks[case.mask], labels=labels,
                numeric_labels=numeric_labels, return_decisions=case.path == "literal")


def run_model_case(case: ModelCase) -> FiniteCheck:
    """Forward with labels, then backward, on the distorted model; report every non-finite loss part or gradient."""
    model, pristine = _fuzz_model()
    model.load_state_dict(pristine)
    with torch.no_grad():
        model.abduction.W_loc.mul_(case.loc_scale)
        if case.scale_setting in _B_SCALE:
            model.abduction.b_scale.fill_(_B_SCALE[case.scale_setting])
        model.action.b_noise.fill_(case.noise)
    model.zero_grad(set_to_none=True)
    out = model(**_model_inputs(case))
    out.loss.backward()
    non_finite = [name for name in ("loss", "cls_loss", "reg_loss") if not bool(torch.isfinite(getattr(out, name)).all())]
    non_finite += [f"grad of {name}" for name, parameter in model.named_parameters()
                   if parameter.grad is not None and not bool(torch.isfinite(parameter.grad).all())]
    decision_scale = out.scale_U.detach() + model.action.noise_scale.detach()
    return FiniteCheck(non_finite, out.loc_U.detach().abs().max().item(),
                       decision_scale.clamp_min(model.config.scale_eps).min().item())


def _extreme_tensor(shape, magnitudes, generator: torch.Generator) -> torch.Tensor:
    r"""Elements $\pm m \cdot f$ with $m$ drawn from ``magnitudes`` and $f \in [0.5, 1]$ (so float32 max stays finite)."""
    choice = torch.randint(0, len(magnitudes), shape, generator=generator)
    magnitude = torch.tensor(magnitudes, dtype=torch.float64)[choice]
    sign = torch.where(torch.rand(shape, generator=generator) < 0.5, -1.0, 1.0).double()
    factor = 0.5 + 0.5 * torch.rand(shape, generator=generator).double()
    return (sign * magnitude * factor).float()


def run_loss_case(case: LossCase) -> FiniteCheck:
    """Three loss computations on one draw, each followed by backward:

    - `losses.total_loss` on directly given ``loc_S``, ``scale_S``, ``loc_Y``, ``scale_Y`` and a
      learnable per-class threshold;
    - the literal path ``ActionNetwork`` → `total_loss` from ``loc_U``, ``scale_U``;
    - the fused path `losses.fused_total_loss` from the same ``loc_U``, ``scale_U``.
    """
    from causalqwen.action import ActionNetwork
    from causalqwen.losses import fused_total_loss, total_loss

    generator = torch.Generator().manual_seed(case.seed)
    B, S, V, C, num_id, eps = 2, 5, 11, 6, 7, 1e-6
    labels = torch.randint(0, V, (B, S), generator=generator)
    labels[:, 1::2] = num_id  # regression targets on every other position
    if case.labels == "some_ignored":
        labels[:, ::3] = -100
    elif case.labels == "all_ignored":
        labels[:] = -100
    masks = {
        "none": None,
        "full": torch.ones(B, S, dtype=torch.long),
        "left_padded": torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
        "one_row_all_padding": torch.tensor([[0] * S, [1] * S]),
        "all_padding": torch.zeros(B, S, dtype=torch.long),
    }
    mask = masks[case.mask]
    targets = _extreme_tensor((B, S), case.target_magnitudes, generator)

    def scales(shape):
        if case.scale_at_eps:
            return torch.full(shape, eps)
        return torch.tensor([eps, 1.0, 1e6])[torch.randint(0, 3, shape, generator=generator)]

    settings = dict(num_token_id=num_id, attention_mask=mask)
    non_finite = []

    def judge(label, total, tensors):
        if not bool(torch.isfinite(total).all()):
            non_finite.append(f"{label}: loss")
        non_finite.extend(f"{label}: grad of {name}" for name, tensor in tensors
                          if tensor.grad is not None and not bool(torch.isfinite(tensor.grad).all()))

    # (1) total_loss on given decisions
    loc_S = _extreme_tensor((B, S, V), case.loc_magnitudes, generator).requires_grad_()
    scale_S = scales((B, S, V)).requires_grad_()
    loc_Y = _extreme_tensor((B, S), case.loc_magnitudes, generator).requires_grad_()
    scale_Y = scales((B, S)).requires_grad_()
    threshold = torch.full((V,), case.threshold).requires_grad_()
    parts = total_loss(loc_S, scale_S, loc_Y, scale_Y, labels, targets, threshold=threshold, **settings)
    parts.total.backward()
    judge("total_loss", parts.total, [("loc_S", loc_S), ("scale_S", scale_S), ("loc_Y", loc_Y),
                                      ("scale_Y", scale_Y), ("threshold", threshold)])

    # (2), (3) through an ActionNetwork with weights of magnitude <= 1 (|loc_S| <= C |loc_U|)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        action = ActionNetwork(C, V, noise_init=0.0 if case.scale_at_eps else 0.1, scale_eps=eps)
    with torch.no_grad():
        action.classification_head.weight.uniform_(-1.0, 1.0, generator=generator)
    loc_U = _extreme_tensor((B, S, C), case.loc_magnitudes, generator)
    scale_U = scales((B, S, C))
    for label in ("literal", "fused"):
        action.zero_grad(set_to_none=True)
        loc, scale = loc_U.clone().requires_grad_(), scale_U.clone().requires_grad_()
        if label == "literal":
            decision = action(loc, scale)
            parts = total_loss(*decision, labels, targets, threshold=case.threshold, **settings)
        else:
            parts, _ = fused_total_loss(loc, scale, action, labels, targets, threshold=case.threshold, **settings)
        parts.total.backward()
        judge(label, parts.total, [("loc_U", loc), ("scale_U", scale), *action.named_parameters()])

    max_abs_loc = max(loc_S.detach().abs().max().item(), loc_U.abs().max().item())
    min_scale = min(scale_S.detach().min().item(), scale_U.min().item())
    return FiniteCheck(non_finite, max_abs_loc, min_scale)


def _signed(rng: random.Random, magnitudes) -> float:
    return rng.choice(magnitudes) * rng.choice((-1.0, 1.0))


def random_model_case(rng: random.Random) -> ModelCase:
    """A `ModelCase` drawn uniformly from the choice lists above (the report's fixed-seed sample)."""
    return ModelCase(
        values=tuple(_signed(rng, NUMBER_MAGNITUDES) for _ in range(6)),
        targets=tuple(_signed(rng, NUMBER_MAGNITUDES) for _ in range(6)),
        loc_scale=rng.choice(LOC_SCALES),
        scale_setting=rng.choice(SCALE_SETTINGS),
        noise=rng.choice(NOISE_VALUES),
        mask=rng.choice(MASK_PATTERNS),
        labels=rng.choice(LABEL_PATTERNS),
        path=rng.choice(LOSS_PATHS),
    )


def random_loss_case(rng: random.Random) -> LossCase:
    """A `LossCase` drawn uniformly from the choice lists above."""
    return LossCase(
        seed=rng.randrange(2**31),
        loc_magnitudes=tuple(sorted(rng.sample(LOC_MAGNITUDES, rng.randint(1, len(LOC_MAGNITUDES))))),
        scale_at_eps=rng.random() < 0.5,
        threshold=rng.choice(THRESHOLDS),
        target_magnitudes=tuple(sorted(rng.sample(NUMBER_MAGNITUDES, rng.randint(1, len(NUMBER_MAGNITUDES))))),
        labels=rng.choice(LABEL_PATTERNS[:3]),
        mask=rng.choice(MASK_PATTERNS),
    )


# =============================================================================================
# The summary for the validation report
# =============================================================================================


@dataclass
class SuiteResult:
    """Everything `run_suite` measured; ``markdown`` is the report section's body."""

    bad_inputs: list[CaseOutcome]
    checkpoints: list[CaseOutcome]
    intact_round_trip: bool
    model_checks: list[FiniteCheck]
    loss_checks: list[FiniteCheck]
    seconds: float
    trust: list = dataclasses.field(default_factory=list)  # outcomes of TRUST_CASES + ROUND_THREE_CASES
    real_text: bool = True  # every row of validation.real_text holds
    markdown: str = ""

    @property
    def passed(self) -> bool:
        return (all(outcome.passed for outcome in self.bad_inputs + self.checkpoints + self.trust)
                and self.intact_round_trip and self.real_text
                and all(check.ok for check in self.model_checks + self.loss_checks))


def _code(text: str) -> str:
    """``text`` as an inline code span (a backtick inside would end it)."""
    return "`" + text.replace("`", "'") + "`"


def _shortened(outcome: CaseOutcome, limit: int = 170) -> str:
    """The raised message on one line, the scratch directory written ``DIR``; a long one keeps its start and
    its end (where the checkpoint errors list what is wrong), about ``limit`` characters in all."""
    line = " ".join(outcome.actual.split()).replace(_scratch_dir(), "DIR")
    if len(line) <= limit:
        return line
    head = limit // 3
    return f"{line[:head]} … {line[-(limit - head):]}"


def _outcome_rows(outcomes: list[CaseOutcome], with_component: bool) -> list[list[str]]:
    rows = []
    for outcome in outcomes:
        case = outcome.case
        row = [f"`{case.id}`"] + ([case.component] if with_component else [])
        row += [html.escape(case.description, quote=False), f"`{case.error.__name__}`", _code(_shortened(outcome)),
                verdict(outcome.passed)]
        rows.append(row)
    return rows


def run_suite(model_examples: int = 24, loss_examples: int = 60, seed: int = 0) -> SuiteResult:
    """Run the bad-input table, the checkpoint cases and a fixed-seed fuzz sample; build the markdown.

    ``model_examples`` cases go through the whole model (forward, loss, backward; about 0.1 s each on
    2 CPU cores), ``loss_examples`` through the losses alone (three loss computations each).
    """
    started = time.perf_counter()
    bad_inputs = [run_case(case) for case in BAD_INPUT_CASES]
    checkpoints = [run_case(case) for case in CHECKPOINT_CASES]
    round_trip = intact_checkpoint_round_trip()
    rng = random.Random(seed)
    model_cases = [random_model_case(rng) for _ in range(model_examples)]
    loss_cases = [random_loss_case(rng) for _ in range(loss_examples)]
    model_checks = [run_model_case(case) for case in model_cases]
    loss_checks = [run_loss_case(case) for case in loss_cases]
    from .trust import TRUST_CASES, run_trust_case
    from .trust_round_three import ROUND_THREE_CASES

    trust = [run_trust_case(case) for case in TRUST_CASES + ROUND_THREE_CASES]
    from .real_text import real_text_markdown

    real_text, real_text_ok = real_text_markdown()
    result = SuiteResult(bad_inputs, checkpoints, round_trip, model_checks, loss_checks, time.perf_counter() - started,
                         trust, real_text_ok)
    result.markdown = _markdown(result, model_cases, loss_cases, seed) + "\n" + real_text
    return result


def _markdown(result: SuiteResult, model_cases: list[ModelCase], loss_cases: list[LossCase], seed: int) -> str:
    bad_passed = sum(outcome.passed for outcome in result.bad_inputs)
    by_component = {c: sum(o.case.component == c for o in result.bad_inputs) for c in COMPONENTS}
    checkpoint_passed = sum(outcome.passed for outcome in result.checkpoints)
    model_failures = sum(not check.ok for check in result.model_checks)
    loss_failures = sum(not check.ok for check in result.loss_checks)
    failures = [name for check in result.model_checks + result.loss_checks for name in check.non_finite]

    fuzz_rows = [
        [
            "whole model: forward(labels) + backward",
            str(len(result.model_checks)),
            f"{max(c.max_abs_loc for c in result.model_checks):.3g}" if result.model_checks else "-",
            f"{min(c.min_scale for c in result.model_checks):.3g}" if result.model_checks else "-",
            ", ".join(f"{sum(case.path == p for case in model_cases)} {p}" for p in LOSS_PATHS)
            + f"; {sum(case.mask in ('one_row_all_padding', 'all_padding') for case in model_cases)} with all-padding rows"
            + f"; {sum(case.labels == 'all_ignored' for case in model_cases)} all-ignored"
            + f"; {sum(case.scale_setting == 'scale_eps' for case in model_cases)} at scale_eps",
            str(model_failures),
            verdict(model_failures == 0),
        ],
        [
            "losses alone: total_loss, ActionNetwork + total_loss, fused_total_loss",
            str(len(result.loss_checks)),
            f"{max(c.max_abs_loc for c in result.loss_checks):.3g}" if result.loss_checks else "-",
            f"{min(c.min_scale for c in result.loss_checks):.3g}" if result.loss_checks else "-",
            f"{sum(case.scale_at_eps for case in loss_cases)} with every scale at scale_eps"
            + f"; {sum(case.mask in ('one_row_all_padding', 'all_padding') for case in loss_cases)} with all-padding rows"
            + f"; {sum(case.labels == 'all_ignored' for case in loss_cases)} all-ignored",
            str(loss_failures),
            verdict(loss_failures == 0),
        ],
    ]
    largest_number = max(abs(v) for case in model_cases for v in case.values + case.targets) if model_cases else 0.0
    trust_passed = sum(outcome.passed for outcome in result.trust)
    parts = [
        f"{verdict(result.passed)} · {bad_passed} of {len(result.bad_inputs)} bad inputs give their clear error · "
        f"{trust_passed} of {len(result.trust)} trust-boundary cases hold · "
        f"{checkpoint_passed} of {len(result.checkpoints)} tampered checkpoints are refused · "
        f"{model_failures + loss_failures} of {len(result.model_checks) + len(result.loss_checks)} extreme inputs "
        f"left a NaN or ±inf · {result.seconds:.1f} s",
        "",
        "The same tables are the test suite `tests/test_robustness.py` (where Hypothesis draws the extreme inputs); "
        "`validation/robustness.py` holds them as data.",
        "",
        "### Bad inputs give a clear error",
        "",
        "Each row commits one mistake and must raise exactly the listed exception with a message that names what "
        "is wrong (the message shown is the one actually raised, shortened). Rows per component: "
        + ", ".join(f"{name} {count}" for name, count in by_component.items()) + ".",
        "",
        table(["case", "component", "bad input", "expected", "raised", "verdict"],
               _outcome_rows(result.bad_inputs, with_component=True)),
        "",
        "### Tampered checkpoints are refused, never half-loaded",
        "",
        "A tiny CausalQwen saved with `save_pretrained`, then its `model.safetensors` tampered with; "
        "`CausalQwenForCausalLM.from_pretrained` must raise an `OSError` naming the file or the tensor. "
        f"Control: the untouched checkpoint loads and every tensor equals the saved one: "
        f"{verdict(result.intact_round_trip)}.",
        "",
        table(["case", "tampering", "expected", "raised", "verdict"],
               _outcome_rows(result.checkpoints, with_component=False)),
        "",
        "### Extreme but finite inputs stay finite",
        "",
        f"A fixed-seed sample (`random.Random({seed})`) of extreme inputs: numbers at `<NUM>` positions up to "
        f"{largest_number:.4g} in magnitude (also denormals, zeros and negatives), `W_loc` scaled so that "
        "|loc_U| reaches about 1e30, scales at `scale_eps`, padding and ignored labels; each case runs forward, "
        "loss and backward and counts a failure if the loss or any gradient holds a NaN or ±inf.",
        "",
        table(["through", "cases", "max |loc| reached", "min scale reached", "coverage", "cases with NaN/inf",
                "verdict"], fuzz_rows),
        "",
    ]
    if failures:
        parts += ["Non-finite values found: " + ", ".join(sorted(set(failures))), ""]
    return "\n".join(parts + _trust_markdown(result.trust))


def _trust_markdown(outcomes) -> list[str]:
    """The security section: what the project reads and refuses, then the trust-boundary cases."""
    from .trust import GROUPS, READS_AND_REFUSALS

    if not outcomes:
        return []
    counts = ", ".join(f"{group} {sum(o.passed for o in outcomes if o.case.group == group)} of "
                       f"{sum(o.case.group == group for o in outcomes)}" for group in GROUPS)
    rows = [[f"`{o.case.id}`", o.case.group, html.escape(o.case.description, quote=False),
             f"`{o.case.error.__name__}`" if o.case.error is not None else "the right result",
             _code(_shortened(o)), verdict(o.passed)] for o in outcomes]
    return [
        "### Security: what the project reads, and what it refuses",
        "",
        "Nothing the project reads is unpickled, and nothing it did not write is deleted "
        "(`causalqwen.checkpoint`, `causalqwen.rundir`; the [trust boundaries](../security.md) page explains why).",
        "",
        table(["what", "read from", "refused"], [list(row) for row in READS_AND_REFUSALS]),
        "",
        "### Trust boundaries: files and inputs from outside",
        "",
        f"{verdict(all(o.passed for o in outcomes))} · {sum(o.passed for o in outcomes)} of {len(outcomes)} cases "
        f"({counts}). A row must raise exactly its exception with a message naming the file, line, field or "
        "character, or, where the expected outcome is *the right result*, run and give it. Rows that plant a "
        "pickle or keep a user's file also check that the pickle never ran and the file is still there, and rows "
        "that plant a link check that the file it points to is unchanged (`validation/trust.py`; the rows from "
        "`lock-symlink` on are the third hostile pass, issue 27: `validation/trust_round_three.py`).",
        "",
        table(["case", "group", "input", "expected", "outcome", "verdict"], rows),
        "",
    ]


def summary_markdown() -> str:
    """The body of the validation report's Robustness section (`run_suite` with its defaults)."""
    return run_suite().markdown
