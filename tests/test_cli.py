"""The ``causalqwen`` command line."""

import subprocess
import sys

import pytest

from causalqwen import cli


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "walkthrough" in capsys.readouterr().out


def test_console_module_runs_help():
    result = subprocess.run([sys.executable, "-m", "causalqwen.cli", "--help"], capture_output=True, text=True, check=True)
    assert "usage: causalqwen" in result.stdout


def test_walkthrough_runs_the_forward_pass_and_checks_equivalence(capsys):
    assert cli.main(["walkthrough", "--text", "价格是99.9元"]) == 0
    out = capsys.readouterr().out
    assert "<NUM>=99.9" in out
    assert "max |loc_S - Qwen2 logits| = 0.00e+00" in out
    assert "OK: the forward pass reproduces Qwen2 at initialization." in out


def test_unknown_subcommand_is_an_error():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["no-such-command"])
    assert exit_info.value.code == 2


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A CausalQwen converted from the tiny base and saved with save_pretrained, tokenizer beside it."""
    import torch

    from causalqwen import CausalQwenForCausalLM, NumericTokenizer
    from causalqwen.tiny import build_tiny_base

    path = tmp_path_factory.mktemp("causal_tiny")
    qwen, hf_tokenizer = build_tiny_base(seed=3)
    tokenizer = NumericTokenizer(hf_tokenizer)
    torch.manual_seed(3)
    CausalQwenForCausalLM.from_qwen(qwen, num_token_id=tokenizer.num_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_generate_from_a_saved_model_prints_prompt_and_continuation(saved_model, capsys):
    args = ["generate", "--model", str(saved_model), "--prompt", "the price is 12.5 and", "--prompt", "hello",
            "--mode", "causal", "--seed", "1", "--max-new-tokens", "6"]
    assert cli.main(args) == 0
    first = capsys.readouterr().out.splitlines()
    assert len(first) == 2 and first[0].startswith("the price is 12.5 and") and first[1].startswith("hello")
    assert first[0] != "the price is 12.5 and"
    assert cli.main(args) == 0
    assert capsys.readouterr().out.splitlines() == first  # the same seed gives the same text
    assert cli.main(args[:-3] + ["2", "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.splitlines() != first


def test_generate_text_matches_the_library_generate(saved_model):
    """The command is a thin layer: the same ids as causalqwen.generate on the loaded model."""
    import torch

    from causalqwen import generate

    model, tokenizer = cli.load_model_and_tokenizer(str(saved_model))
    batch = tokenizer(["a day of 30 hours"], padding_side="left")
    out = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], mode="shared_noise",
                   max_new_tokens=5, generator=torch.Generator().manual_seed(4))
    expected = tokenizer.batch_decode(out.sequences, out.numeric_values, out_of_vocab="mark")
    assert cli.generate_text(["a day of 30 hours"], str(saved_model), "shared_noise", seed=4, max_new_tokens=5) == expected


@pytest.mark.parametrize("mode", ["standard", "shared_individual", "traditional"])
def test_generate_on_the_embedded_tiny_base(mode, capsys):
    assert cli.main(["generate", "--prompt", "It is 3 degrees", "--mode", mode, "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("It is 3 degrees")


def test_generate_runs_as_a_console_command(saved_model):
    result = subprocess.run(
        [sys.executable, "-m", "causalqwen.cli", "generate", "--model", str(saved_model), "--prompt", "x 1",
         "--mode", "traditional", "--top-k", "5", "--seed", "1", "--max-new-tokens", "3"],
        capture_output=True, text=True, check=True,
    )
    assert result.stdout.startswith("x 1")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode", "greedy"], "invalid choice: 'greedy'"),
        (["--mode", "causal", "--top-k", "3"], "apply to --mode traditional only"),
        (["--mode", "traditional", "--temperature", "0"], "temperature must be a finite number > 0"),
        (["--max-new-tokens", "-2"], "max_new_tokens must be an integer >= 0"),
        (["--model", "/no/such/dir"], "model directory '/no/such/dir' does not exist"),
    ],
)
def test_generate_reports_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--prompt", "hi", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
