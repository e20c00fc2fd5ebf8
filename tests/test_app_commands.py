"""How the generation surfaces write a generated number: ``causalqwen generate`` at the prompt's resolution by
default (decision D17), every float32 digit with ``--number-resolution none``.

The oracle: the float32 values the same command writes with every digit (``none``), written again by Python's own
formatting at the resolution h = min(h_prompt, 10^(floor(log10|v|) - 1)) (h_prompt the unit without a prompt
number) the rule states, as decimals max(d_prompt, 0, 2 - floor(log10|v|)) where h_prompt = 10^-d_prompt (no
d_prompt when the prompt has no number).
"""

import math
import re

import numpy as np
import pytest
import torch

from causalqwen import generate
from causalqwen.app import cli, commands
from causalqwen.app.tiny import build_tiny_causal_lm

# the numbers of a generated continuation: signed decimals (the marks of reserved rows, <unk:ID>, are not numbers)
NUMBER = re.compile(r"(?<![\w:.])-?\d+(?:\.\d+)?(?![\w>])")


@pytest.fixture(scope="module")
def numbers_model(tmp_path_factory):
    """The tiny CausalQwen that says <NUM> at every step, saved with its tokenizer."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    with torch.no_grad():
        model.action.classification_head.bias[model.config.num_token_id] = 1e4
    path = tmp_path_factory.mktemp("numbers_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def written_at_the_rule(value: float, prompt_decimals: int | None) -> str:
    """``value`` as the rule writes it, by Python's formatting of the float32 value (half to even, exact)."""
    decimals = [0 if prompt_decimals is None else prompt_decimals]  # the unit without a prompt number
    if value != 0:
        decimals.append(1 - math.floor(math.log10(abs(value))))  # two significant digits at least
    assert max(decimals) >= 0, "the values generated here are below 10"
    return f"{value:.{max(decimals)}f}"


def _generated(capsys, model: str, prompt: str, *extra: str) -> list[str]:
    assert (
        cli.main(
            [
                "generate",
                "--model",
                model,
                "--prompt",
                prompt,
                "--max-new-tokens",
                "4",
                "--seed",
                "2",
                "--mode",
                "causal",
                *extra,
            ]
        )
        == 0
    )
    text = capsys.readouterr().out.rstrip("\n")
    assert text.startswith(prompt)
    return NUMBER.findall(text[len(prompt) :])


@pytest.mark.parametrize(
    "prompt, prompt_decimals",
    [
        ("The price is 12.50 yuan, up 3% from", 2),  # the prompt's cents
        ("It took 1.20e3 seconds, then", -1),  # tens in the prompt: refined to two significant digits
        ("The price rose again and again to", None),  # no number in the prompt: the unit, two significant digits
    ],
)
def test_generate_writes_generated_numbers_at_the_prompts_resolution_by_default(
    numbers_model, capsys, prompt, prompt_decimals
):
    every_digit = _generated(capsys, numbers_model, prompt, "--number-resolution", "none")
    values = [float(np.float32(text)) for text in every_digit]
    assert len(values) == 4 and all(
        text == np.format_float_positional(np.float32(value), unique=True, trim="-")
        for text, value in zip(every_digit, values)
    )  # every float32 digit
    by_default = _generated(capsys, numbers_model, prompt)
    assert by_default == [written_at_the_rule(value, prompt_decimals) for value in values]
    assert _generated(capsys, numbers_model, prompt, "--number-resolution", "prompt") == by_default


def test_generate_text_takes_none_for_every_digit(numbers_model):
    """The Python entry point: ``number_resolution=None`` writes the shortest float32 text, the default the rule."""
    from causalqwen.app.commands import generate_text

    prompt = "The price is 12.50 yuan, up 3% from"
    every_digit = NUMBER.findall(
        generate_text([prompt], numbers_model, "causal", seed=2, max_new_tokens=4, number_resolution=None)[0][
            len(prompt) :
        ]
    )
    by_default = NUMBER.findall(
        generate_text([prompt], numbers_model, "causal", seed=2, max_new_tokens=4)[0][len(prompt) :]
    )
    assert by_default == [written_at_the_rule(float(np.float32(text)), 2) for text in every_digit]


@pytest.mark.parametrize(
    "given, message",
    [
        ("None", 'a power of ten, "prompt" or "none", got \'None\''),
        ("", 'a power of ten, "prompt" or "none", got \'\''),
        ("0.25", "must be a power of ten"),
    ],
)
def test_a_bad_number_resolution_is_one_line_and_exit_2(given, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--prompt", "hi 1", "--number-resolution", given])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model.eval(), tokenizer


def test_the_command_prints_the_prompt_as_written(capsys):
    prompt = "Paid 12.50 for 1,000 items at 3.14159265358979 each"
    assert cli.main(["generate", "--prompt", prompt, "--prompt", "hi", "--max-new-tokens", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    model, tokenizer = commands.load_model_and_tokenizer("tiny", seed=0)
    batch = tokenizer([prompt, "hi"], padding_side="left")
    out = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
    )
    expected = []
    for row, text in enumerate([prompt, "hi"]):
        keep = out.attention_mask[row].bool()
        length = int(batch["attention_mask"][row].sum())
        head, tail = tokenizer.decode_continuation(
            out.sequences[row][keep],
            out.numeric_values[row][keep],
            length,
            out_of_vocab="mark",
            number_texts=batch.number_texts[row],
        )
        assert head == text
        expected.append(text + tail)
    assert lines == expected and lines[0].startswith(prompt) and lines[0] != prompt
