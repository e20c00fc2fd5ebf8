"""The command line boundary: the ``causalqwen`` command's options, what it prints, and how it stops.

Options that ran without effect or ran far too long (``demo --steps 0``, ``--divergence-dual-lr`` alone), a
prompt printed with its numbers rewritten, a seed beyond 64 bits, messages that named a keyword instead of
the flag, a mistyped local path that went to the hub, Ctrl-C during ``train``.
"""

from __future__ import annotations

import os
import time

from ..cases import TrustCase, WrongResult, command_line_refusal, run_cli
from ..fixtures import fresh_dir, jsonl_file, shared_tiny, train_tiny

__all__ = ["CASES"]


# =============================================================================================
# silent
# =============================================================================================


def _demo_zero_steps():
    run_cli(["demo", "--steps", "0", "--out", os.path.join(fresh_dir("demo-zero"), "demo")])


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


def _dual_lr_without_bound():
    data = jsonl_file("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    run_cli(
        [
            "train",
            "--base",
            "tiny",
            "--data",
            data,
            "--out",
            os.path.join(fresh_dir("dual"), "run"),
            "--steps",
            "1",
            "--divergence-dual-lr",
            "5",
        ]
    )


# =============================================================================================
# clarity
# =============================================================================================


def _huge_seed():
    run_cli(["generate", "--prompt", "hi", "--max-new-tokens", "1", "--seed", "9" * 23])


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

    from causalqwen.app import cli, training_run

    data = jsonl_file("data.jsonl", b'{"text": "The price is 12.5 yuan."}\n' * 8)
    out = os.path.join(fresh_dir("interrupted"), "run")
    args = [
        "train",
        "--base",
        _saved_tiny_base(),
        "--data",
        data,
        "--out",
        out,
        "--steps",
        "6",
        "--batch-size",
        "2",
        "--save-every",
        "2",
    ]
    step = training_run.loss_and_gradients  # the step as the training run looks it up
    calls = []

    def interrupted_at_step_3(*arguments, **keywords):  # Ctrl-C arrives during the third step
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(*arguments, **keywords)

    err = io.StringIO()
    training_run.loss_and_gradients = interrupted_at_step_3
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            status = cli.main(args)
    finally:
        training_run.loss_and_gradients = step
    lines = err.getvalue().strip().splitlines()
    checkpoint = os.path.join(out, "checkpoint-2")
    expected = f"causalqwen train: interrupted; the last checkpoint is {checkpoint} (step 2 of 6)"
    if status != 130 or len(lines) < 2 or lines[-2] != expected or not lines[-1].endswith("--resume"):
        raise WrongResult(f"exit status {status}; the last lines were {lines[-2:]!r}")
    if "Traceback" in err.getvalue():
        raise WrongResult("a traceback was printed")


CASES = [
    # ---- silent
    command_line_refusal(
        "demo-zero-steps",
        "silent",
        "demo --steps 0 (ran 1,500 steps)",
        _demo_zero_steps,
        r".*steps must be a positive int, got 0",
    ),
    TrustCase(
        "command-prompt-as-written",
        "silent",
        "causalqwen generate printed 12.50 as 12.5 and 1,000 as 1000",
        _command_prompt_as_written,
        None,
    ),
    command_line_refusal(
        "dual-lr-without-bound",
        "silent",
        "train --divergence-dual-lr 5 without --max-u-divergence (ignored)",
        _dual_lr_without_bound,
        r".*--divergence-dual-lr applies to --max-u-divergence only",
    ),
    # ---- clarity
    command_line_refusal(
        "seed-beyond-64-bits",
        "clarity",
        "generate --seed 99999999999999999999999 (Overflow when unpacking long long)",
        _huge_seed,
        r".*--seed: must be an integer from 0 to 4294967295",
    ),
    command_line_refusal(
        "messages-name-the-flags",
        "clarity",
        "train into an earlier run without --resume (said 'pass resume')",
        _flag_names_in_messages,
        r".*pass --resume to continue it or --overwrite to replace it",
    ),
    command_line_refusal(
        "mistyped-local-path",
        "clarity",
        "generate --model model_nope (29 s of hub retries, then a network error)",
        _mistyped_local_path,
        r".*model directory 'model_nope' does not exist",
    ),
    TrustCase(
        "ctrl-c-during-training",
        "clarity",
        "Ctrl-C during causalqwen train (a 45-line traceback)",
        _interrupted_training,
        None,
    ),
]
