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
