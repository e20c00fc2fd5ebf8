r"""Part 1 of the robustness suite: bad inputs give a clear error, never a crash from deep inside.

`BAD_INPUT_CASES` holds one row per kind of wrong input, across the tokenizer, the model, the losses,
the inference modes, generation and the command line (run in-process by `validation.cases.run_cli`).
Each row holds a zero-argument callable that commits the mistake, the exception type it must raise and
a regular expression its message must contain, naming what is wrong. No row may end in a bare
``IndexError``, a shape error from deep inside torch, a silent NaN or a silently clamped value.
"""

from __future__ import annotations

import math

import torch

from .cases import BadInputCase, CommandLineExit, run_cli
from .fixtures import ids_with_num, shared_tiny, short_prompt
from .tampered_checkpoints import tampered_checkpoint

__all__ = ["BAD_INPUT_CASES"]


def _tokenizer():
    return shared_tiny().tokenizer


def _num_id() -> int:
    return shared_tiny().tokenizer.num_token_id


def _forward(**kwargs):
    ids, values = short_prompt()
    arguments = dict(input_ids=ids, numeric_values=values)
    arguments.update(kwargs)
    with torch.no_grad():
        return shared_tiny().model(**arguments)


def _numeric_value_beyond_float32():
    ids, _ = short_prompt()
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
        threshold=100.0,
        detach_gate=False,
    )
    arguments.update(overrides)
    return total_loss(**arguments)


def _fused_loss(**overrides):
    from causalqwen.action import ActionNetwork
    from causalqwen.kernels.fused import fused_ovr_classification_loss

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

    ids, values = short_prompt()
    arguments = dict(input_ids=ids, numeric_values=values, max_new_tokens=2)
    arguments.update(kwargs)
    return generate(model if model is not None else shared_tiny().model, **arguments)


def _right_padded_prompts():
    ids = ids_with_num([11, None, 23], [11, 5, 0])
    values = torch.tensor([[0.0, 12.5, 0.0], [0.0, 0.0, 0.0]])
    return _generate(input_ids=ids, numeric_values=values, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))


def _command_line_case(case_id: str, description: str, args: list[str], message: str) -> BadInputCase:
    """A command-line row: ``causalqwen ARGS`` (`run_cli`) must exit through argparse with status 2 and a last
    line of stderr matching ``message``."""
    return BadInputCase(
        case_id, "cli", description, lambda: run_cli(args), CommandLineExit, "exit status 2: " + message
    )


BAD_INPUT_CASES: list[BadInputCase] = [
    # ---- tokenizer ----
    BadInputCase(
        "tokenizer-literal-overflows-float32",
        "tokenizer",
        "parse_number of a literal beyond float32 (1e400; in a text it is simply text)",
        lambda: __import__("causalqwen.numbers").numbers.parse_number("1e400"),
        ValueError,
        r"number '1e400' overflows float32",
    ),
    BadInputCase(
        "tokenizer-literal-is-an-identifier",
        "tokenizer",
        "parse_number of a digit run float32 cannot hold (a phone number)",
        lambda: __import__("causalqwen.numbers").numbers.parse_number("13409860099"),
        ValueError,
        r"'13409860099' has more than 9 significant digits .*identifier",
    ),
    BadInputCase(
        "tokenizer-stale-number-text",
        "tokenizer",
        "decoding with a surface text that no longer reads as the value beside it",
        lambda: _tokenizer().decode([_num_id()], [50.0], number_texts=["43.60"]),
        ValueError,
        r"number_texts\[0\] = '43.60' reads as 43.6, but numeric_values\[0\] holds 50",
    ),
    BadInputCase(
        "tokenizer-number-texts-rows",
        "tokenizer",
        "batch_decode with number_texts for 2 rows of a 1-row batch",
        lambda: _tokenizer().batch_decode([[_num_id()]], [[5.0]], number_texts=[["5"], ["6"]]),
        ValueError,
        r"number_texts has 2 rows but input_ids has 1",
    ),
    BadInputCase(
        "tokenizer-not-text",
        "tokenizer",
        "an int where a text (or a list of texts) belongs",
        lambda: _tokenizer()(42),
        TypeError,
        r"texts must be a str or a list of str, got int",
    ),
    BadInputCase(
        "tokenizer-padding-side",
        "tokenizer",
        "padding_side='middle'",
        lambda: _tokenizer()(["a", "bb"], padding_side="middle"),
        ValueError,
        r"padding_side must be 'left' or 'right', got 'middle'",
    ),
    BadInputCase(
        "tokenizer-decode-nan-value",
        "tokenizer",
        "decoding a <NUM> whose value is NaN",
        lambda: _tokenizer().decode([_num_id()], [math.nan]),
        ValueError,
        r"numeric_values\[0\]: cannot format nan",
    ),
    BadInputCase(
        "tokenizer-decode-unknown-id",
        "tokenizer",
        "decoding an id the tokenizer does not have",
        lambda: _tokenizer().decode([10**6], [0.0]),
        ValueError,
        r"input_ids\[0\] = 1000000 is not a token id of this tokenizer",
    ),
    # ---- model ----
    BadInputCase(
        "model-numeric-value-nan",
        "model",
        "a NaN in numeric_values",
        lambda: _forward(numeric_values=torch.tensor([[0.0, math.nan, 0.0]])),
        ValueError,
        r"numeric_values must be finite: found NaN or ±inf",
    ),
    BadInputCase(
        "model-numeric-value-beyond-float32",
        "model",
        "a float64 numeric value of 1e300 (finite, but ±inf once the embedding casts it to float32)",
        _numeric_value_beyond_float32,
        ValueError,
        r"numeric_values must be representable in float32 .* found 1e\+300 at position \[0, 1\]",
    ),
    BadInputCase(
        "model-value-on-a-word",
        "model",
        "a non-zero value at a position that is not <NUM>",
        lambda: _forward(numeric_values=torch.tensor([[3.0, 12.5, 0.0]])),
        ValueError,
        r"numeric_values must be 0 wherever input_ids is not <NUM> .* at position \[0, 0\]",
    ),
    BadInputCase(
        "model-numeric-values-not-a-tensor",
        "model",
        "numeric_values given as a Python list",
        lambda: _forward(numeric_values=[[0.0, 12.5, 0.0]]),
        TypeError,
        r"numeric_values must be a torch\.Tensor of shape \[B, S\] like input_ids, got list",
    ),
    BadInputCase(
        "model-token-id-out-of-range",
        "model",
        "an input id beyond the vocabulary",
        lambda: _forward(input_ids=torch.tensor([[11, 10**6, 23]]), numeric_values=None),
        ValueError,
        r"input_ids must lie in \[0, vocab_size=\d+\)",
    ),
    BadInputCase(
        "model-empty-sequence",
        "model",
        "input_ids of shape [1, 0] (no token at all)",
        lambda: _forward(input_ids=torch.zeros(1, 0, dtype=torch.long), numeric_values=None),
        ValueError,
        r"input_ids must hold at least one row and one token, got shape \(1, 0\)",
    ),
    BadInputCase(
        "model-position-ids-shape",
        "model",
        "position_ids longer than input_ids",
        lambda: _forward(position_ids=torch.arange(5)[None]),
        ValueError,
        r"position_ids must be a tensor of shape \(1, 3\) to match input_ids, got \(1, 5\)",
    ),
    BadInputCase(
        "model-attention-mask-values",
        "model",
        "an attention_mask holding a 2",
        lambda: _forward(attention_mask=torch.tensor([[1, 2, 1]])),
        ValueError,
        r"attention_mask must contain only 0 and 1",
    ),
    BadInputCase(
        "model-label-out-of-range",
        "model",
        "a label beyond the vocabulary",
        lambda: _forward(labels=torch.tensor([[11, 12, 10**6]])),
        ValueError,
        r"labels must lie in \[0, \d+\) or equal ignore_index=-100; found 1000000",
    ),
    BadInputCase(
        "model-negative-regression-weight",
        "model",
        "CausalQwenConfig(regression_weight=-1.0): a loss that rewards bad regression",
        lambda: _config(regression_weight=-1.0),
        ValueError,
        r"config field regression_weight must be a number in \[0, 1e\+30\], got -1\.0",
    ),
    BadInputCase(
        "model-action-negative-scale",
        "model",
        "ActionNetwork.decide with a negative scale (it used to be clamped to scale_eps silently)",
        lambda: shared_tiny().model.action.decide(torch.zeros(1, 64), torch.full((1, 64), -1.0)),
        ValueError,
        r"scale must be >= 0 everywhere \(a Cauchy scale\); found -1\.0",
    ),
    BadInputCase(
        "model-action-wrong-width",
        "model",
        "ActionNetwork given loc_U with 63 components instead of C = 64",
        lambda: shared_tiny().model.action(torch.zeros(1, 63), torch.ones(1, 63)),
        ValueError,
        r"loc_U must have last dimension C = 64, got shape \(1, 63\)",
    ),
    # ---- losses ----
    BadInputCase(
        "losses-threshold-nan",
        "losses",
        "an OvR threshold of NaN (every P_k would be NaN)",
        lambda: _total_loss(threshold=math.nan),
        ValueError,
        r"threshold \(the OvR threshold C_k\) must be finite",
    ),
    BadInputCase(
        "losses-per-class-threshold-shape",
        "losses",
        "a per-class threshold with 4 entries for 5 classes",
        lambda: _total_loss(threshold=torch.zeros(4)),
        ValueError,
        r"a per-class threshold must have shape \(5,\) to match the 5 classes, got \(4,\)",
    ),
    BadInputCase(
        "losses-target-nan-at-unscored-position",
        "losses",
        "a NaN numeric target at a position that is not a <NUM> target (its gradient used to be NaN)",
        lambda: _total_loss(numeric_targets=torch.tensor([2.5, math.nan])),
        ValueError,
        r"numeric_targets must be finite: found nan at position \[1\]",
    ),
    BadInputCase(
        "losses-zero-scale",
        "losses",
        "a class scale of 0",
        lambda: _total_loss(scale_S=torch.zeros(2, 5)),
        ValueError,
        r"scale must be > 0 everywhere",
    ),
    BadInputCase(
        "losses-shapes-do-not-broadcast",
        "losses",
        "scale_S [2, 4] beside loc_S [2, 5]",
        lambda: _total_loss(scale_S=torch.ones(2, 4)),
        ValueError,
        r"x, loc and scale must broadcast together; got shapes \(\), \(2, 5\) and \(2, 4\)",
    ),
    BadInputCase(
        "losses-regression-weight-nan",
        "losses",
        "regression_weight=NaN",
        lambda: _total_loss(regression_weight=math.nan),
        ValueError,
        r"regression_weight \(lambda\) must be a finite number >= 0, got nan",
    ),
    BadInputCase(
        "losses-fused-chunk-size",
        "losses",
        "fused loss with chunk_size=0",
        lambda: _fused_loss(chunk_size=0),
        ValueError,
        r"chunk_size must be a positive int, got 0",
    ),
    # ---- inference ----
    BadInputCase(
        "inference-unknown-mode",
        "inference",
        "mode='greedy'",
        lambda: _decision_input("greedy"),
        ValueError,
        r"unknown inference mode 'greedy'; valid modes are: standard, causal",
    ),
    BadInputCase(
        "inference-negative-noise-scale",
        "inference",
        "a negative noise_scale (|b_noise| cannot be negative)",
        lambda: _decision_input("causal", noise_scale=torch.full((4,), -0.5)),
        ValueError,
        r"noise_scale must be >= 0 everywhere",
    ),
    BadInputCase(
        "inference-noise-scale-shape",
        "inference",
        "noise_scale with 3 components for C = 4",
        lambda: _decision_input("standard", noise_scale=torch.ones(3)),
        ValueError,
        r"noise_scale must have shape \[C\] = \(4,\), got \(3,\)",
    ),
    BadInputCase(
        "inference-uniform-outside-unit-interval",
        "inference",
        "a fixed uniform draw of exactly 1.0 (tan(pi/2) is infinite)",
        lambda: _decision_input("causal", uniform=torch.ones(4, dtype=torch.float64)),
        ValueError,
        r"uniform must lie strictly inside \(0, 1\)",
    ),
    BadInputCase(
        "inference-num-token-id-out-of-range",
        "inference",
        "predict with num_token_id=99 for 5 classes",
        lambda: _predict(num_token_id=99),
        ValueError,
        r"num_token_id must be a class index in \[0, 5\), got 99",
    ),
    BadInputCase(
        "inference-top-p",
        "inference",
        "traditional sampling with top_p=1.5",
        lambda: _traditional(top_p=1.5),
        ValueError,
        r"top_p must lie in \(0, 1\]",
    ),
    # ---- generation ----
    BadInputCase(
        "generation-plain-qwen2-model",
        "generation",
        "generate() given the Qwen2 base instead of a CausalQwen",
        lambda: _generate(model=shared_tiny().qwen),
        TypeError,
        r"model must be a CausalQwenForCausalLM .*got Qwen2ForCausalLM",
    ),
    BadInputCase(
        "generation-empty-prompt",
        "generation",
        "a prompt of zero tokens",
        lambda: _generate(input_ids=torch.zeros(1, 0, dtype=torch.long), numeric_values=None),
        ValueError,
        r"input_ids must hold at least one prompt of at least one token, got shape \(1, 0\)",
    ),
    BadInputCase(
        "generation-right-padding",
        "generation",
        "right-padded prompts",
        _right_padded_prompts,
        ValueError,
        r"generation needs left padding, but attention_mask row 1 has padding after a real token",
    ),
    BadInputCase(
        "generation-negative-max-new-tokens",
        "generation",
        "max_new_tokens=-1",
        lambda: _generate(max_new_tokens=-1),
        ValueError,
        r"max_new_tokens must be an integer >= 0, got -1",
    ),
    BadInputCase(
        "generation-pad-id-out-of-range",
        "generation",
        "pad_token_id beyond the vocabulary",
        lambda: _generate(pad_token_id=10**6),
        ValueError,
        r"pad_token_id must be a token id \(or a list of them\) in \[0, vocab_size=\d+\), got 1000000",
    ),
    BadInputCase(
        "generation-sampling-args-in-a-decision-mode",
        "generation",
        "top_k=5 with mode='causal', which does not sample from a categorical",
        lambda: _generate(mode="causal", top_k=5),
        ValueError,
        r"temperature, top_k, top_p and normalize apply to mode='traditional' only",
    ),
    # ---- command line: each exits with status 2 and the message ----
    _command_line_case(
        "cli-missing-model-directory",
        "generate --model /no/such/dir",
        ["generate", "--model", "/no/such/dir", "--prompt", "hi"],
        r"causalqwen generate: error: model directory '/no/such/dir' does not exist",
    ),
    _command_line_case(
        "cli-unknown-mode",
        "generate --mode greedy",
        ["generate", "--prompt", "hi", "--mode", "greedy"],
        r".*argument --mode: invalid choice: 'greedy'",
    ),
    _command_line_case(
        "cli-negative-max-new-tokens",
        "generate --max-new-tokens -2",
        ["generate", "--prompt", "hi", "--max-new-tokens", "-2"],
        r"causalqwen generate: error: max_new_tokens must be an integer >= 0, got -2",
    ),
    _command_line_case(
        "cli-missing-prompt",
        "generate without --prompt",
        ["generate"],
        r".*the following arguments are required: --prompt",
    ),
    _command_line_case(
        "cli-empty-prompt",
        "generate --prompt '' (it used to end in an IndexError traceback)",
        ["generate", "--prompt", "", "--max-new-tokens", "2"],
        r"causalqwen generate: error: input_ids must hold at least one prompt of at least one token",
    ),
    _command_line_case(
        "cli-prompt-invalid-utf8",
        "generate --prompt holding a byte that is not UTF-8 (argv gives it as a lone surrogate)",
        ["generate", "--prompt", "costs \udcff", "--max-new-tokens", "2"],
        r"causalqwen generate: error: text 0: character 6 of the text is '\\udcff', a lone surrogate",
    ),
    _command_line_case(
        "cli-walkthrough-invalid-utf8",
        "walkthrough --text holding a byte that is not UTF-8",
        ["walkthrough", "--text", "\udcff"],
        r"causalqwen walkthrough: error: text 0: character 0 of the text is '\\udcff', a lone surrogate",
    ),
    BadInputCase(
        "cli-truncated-checkpoint",
        "cli",
        "generate --model DIR whose model.safetensors is cut in half",
        lambda: run_cli(["generate", "--model", tampered_checkpoint("truncated"), "--prompt", "hi"]),
        CommandLineExit,
        r"exit status 2: causalqwen generate: error: the safetensors file '.*model\.safetensors' cannot be read",
    ),
]
