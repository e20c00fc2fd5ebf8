"""The ``causalqwen`` command line: the argument table and dispatch (`causalqwen.app.cli`) and the commands
(`causalqwen.app.commands`)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch
from tiny_runs import edit_config, file_tree, saved_copy
from wall_clock import budget

from causalqwen import CausalQwenForCausalLM, NumericTokenizer, generate
from causalqwen.app import cli, commands, runs, training_run
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.files.data import read_jsonl, synthetic_texts
from causalqwen.files.rundir import RunDirectory


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "walkthrough" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["causalqwen.app.cli", "causalqwen.cli"])
def test_console_module_runs_help(module):
    """Both module paths run the command line: its home and the path the API contract names."""
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True)
    assert "usage: causalqwen" in result.stdout


def test_the_lm_eval_adapter_answers_by_the_contracts_path_too():
    from causalqwen.app import lm_eval_adapter
    from causalqwen.integrations import lm_eval_adapter as contract_path

    assert contract_path.CausalQwenLM is lm_eval_adapter.CausalQwenLM and contract_path.main is lm_eval_adapter.main


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
    from causalqwen.app.tiny import build_tiny_causal_lm

    path = tmp_path_factory.mktemp("causal_tiny")
    model, tokenizer, _ = build_tiny_causal_lm(seed=3, init_seed=3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_generate_from_a_saved_model_prints_prompt_and_continuation(saved_model, capsys):
    args = [
        "generate",
        "--model",
        str(saved_model),
        "--prompt",
        "the price is 12.5 and",
        "--prompt",
        "hello",
        "--mode",
        "causal",
        "--seed",
        "1",
        "--max-new-tokens",
        "6",
    ]
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

    model, tokenizer = commands.load_model_and_tokenizer(str(saved_model))
    batch = tokenizer(["a day of 30 hours"], padding_side="left")
    out = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode="shared_noise",
        max_new_tokens=5,
        generator=torch.Generator().manual_seed(4),
    )
    expected = tokenizer.batch_decode(
        out.sequences,
        out.numeric_values,
        out_of_vocab="mark",
        number_texts=batch.number_texts,
        number_resolution="prompt",
    )
    assert (
        commands.generate_text(["a day of 30 hours"], str(saved_model), "shared_noise", seed=4, max_new_tokens=5)
        == expected
    )


@pytest.mark.parametrize("mode", ["standard", "shared_individual", "traditional"])
def test_generate_on_the_embedded_tiny_base(mode, capsys):
    assert cli.main(["generate", "--prompt", "It is 3 degrees", "--mode", mode, "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("It is 3 degrees")


def test_generate_writes_numbers_at_the_resolution_asked_for(monkeypatch, capsys):
    """--number-resolution reaches the decoding: a generated value 2.5007427 after a prompt with "1.25" is written
    2.50 with "prompt" (the default) and 2.5 with 0.1, every float32 digit with "none" (the model is replaced by one
    that writes that value, the tokenizer is real)."""
    from causalqwen.app import commands

    def one_number(model, input_ids, numeric_values, attention_mask, **kwargs):
        from causalqwen.generation import GenerationOutput

        num = commands.load_model_and_tokenizer()[1].num_token_id
        return GenerationOutput(
            sequences=torch.cat([input_ids, torch.tensor([[num]])], 1),
            numeric_values=torch.cat([numeric_values, torch.tensor([[2.5007427]])], 1),
            attention_mask=torch.cat([attention_mask, torch.ones(1, 1, dtype=attention_mask.dtype)], 1),
        )

    monkeypatch.setattr("causalqwen.generation.generate", one_number)
    for resolution, written in (("prompt", "is 2.50"), ("0.1", "is 2.5"), ("none", "is 2.5007427"), (None, "is 2.50")):
        extra = [] if resolution is None else ["--number-resolution", resolution]
        assert cli.main(["generate", "--prompt", "It was 1.25, now it is", "--max-new-tokens", "1", *extra]) == 0
        assert capsys.readouterr().out.strip().endswith(written)


def test_generate_runs_as_a_console_command(saved_model):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "causalqwen.app.cli",
            "generate",
            "--model",
            str(saved_model),
            "--prompt",
            "x 1",
            "--mode",
            "traditional",
            "--top-k",
            "5",
            "--seed",
            "1",
            "--max-new-tokens",
            "3",
        ],
        capture_output=True,
        text=True,
        check=True,
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
        (["--number-resolution", "0.3"], "must be a power of ten"),
        (["--number-resolution", "coarse"], 'a power of ten, "prompt" or "none", got \'coarse\''),
    ],
)
def test_generate_reports_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--prompt", "hi", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# ---- demo, train, convert ----


@pytest.mark.slow
def test_demo_learns_the_synthetic_task(tmp_path, capsys):
    """The main job at its default length: it must learn (num_f1 >= 0.9, reg_mdae <= 0.5x init) and exit 0."""
    assert cli.main(["demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "OK: the demo model learned the synthetic task." in out
    for mode in ("standard", "causal", "shared_individual", "shared_noise", "traditional"):
        assert f"  {mode} " in out
    for name in ("loss.png", "metrics.png", "metrics.jsonl", "model/model.safetensors", "model/tokenizer.json"):
        assert (tmp_path / "demo" / name).exists(), name


def test_a_short_demo_reports_failure_to_learn_and_reruns_in_place(tmp_path, capsys):
    out_dir = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out_dir), "--steps", "3"]) == 1
    assert "FAILED: the demo model did not learn enough." in capsys.readouterr().out
    assert cli.main(["demo", "--out", str(out_dir), "--steps", "2"]) == 1  # a previous demo run is replaced
    assert (out_dir / "checkpoint-2").exists() and not (out_dir / "checkpoint-3").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(SystemExit):
        cli.main(["demo", "--out", str(foreign), "--steps", "2"])
    assert "is not a causalqwen run" in capsys.readouterr().err


def test_convert_then_train_then_generate(qwen_dir, tmp_path, capsys):
    from causalqwen import CausalQwenForCausalLM

    converted = tmp_path / "converted"
    assert cli.main(["convert", "--base", qwen_dir, "--out", str(converted)]) == 0
    model = CausalQwenForCausalLM.from_pretrained(converted)
    assert model.config.num_token_id == 603 and (converted / "tokenizer.json").exists()
    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(40, seed=0))
    held_out = _jsonl(tmp_path / "eval.jsonl", synthetic_texts(8, seed=1))
    run = tmp_path / "run"
    args = [
        "train",
        "--base",
        str(converted),
        "--data",
        data,
        "--eval-data",
        held_out,
        "--out",
        str(run),
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--eval-every",
        "2",
        "--save-every",
        "2",
        "--learning-rate",
        "1e-3",
    ]
    assert cli.main(args) == 0
    assert (run / "model" / "model.safetensors").exists() and (run / "checkpoint-4").exists()
    trained = CausalQwenForCausalLM.from_pretrained(run / "model")
    assert not torch.equal(trained.abduction.W_loc, model.abduction.W_loc)  # preset causal trained abduction
    assert torch.equal(trained.model.embed_tokens.weight, model.model.embed_tokens.weight)  # ... and not the backbone
    assert (
        cli.main(
            [
                "train",
                "--base",
                str(converted),
                "--data",
                data,
                "--out",
                str(run),
                "--steps",
                "6",
                "--batch-size",
                "4",
                "--save-every",
                "2",
                "--resume",
                "--allow-changed-settings",
            ]
        )
        == 0
    )
    assert (run / "checkpoint-6").exists()
    capsys.readouterr()
    assert (
        cli.main(["generate", "--model", str(run / "model"), "--prompt", "A cup of tea costs", "--max-new-tokens", "3"])
        == 0
    )
    assert capsys.readouterr().out.startswith("A cup of tea costs")
    # straight from the Qwen2 directory: converted on load
    assert (
        cli.main(
            [
                "train",
                "--base",
                qwen_dir,
                "--data",
                data,
                "--out",
                str(tmp_path / "run2"),
                "--steps",
                "1",
                "--batch-size",
                "4",
            ]
        )
        == 0
    )


def test_train_and_convert_report_bad_input(qwen_dir, tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    data = _jsonl(tmp_path / "train.jsonl", ["a 1", "b 2", "c 3", "d 4"])
    llama = tmp_path / "llama"
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(llama)
    from causalqwen.app.tiny import build_tiny_tokenizer

    build_tiny_tokenizer().save_pretrained(llama)
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    huge = tmp_path / "huge.jsonl"  # a text that is not valid Unicode (a JSON-escaped lone surrogate)
    huge.write_text('{"text": "fine"}\n{"text": "bad \\ud800"}\n')
    huge = str(huge)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    cases = [
        (["train", "--base", qwen_dir, "--data", str(bad_line), "--out", str(tmp_path / "r1")], "bad.jsonl, line 2"),
        (["train", "--base", qwen_dir, "--data", huge, "--out", str(tmp_path / "r2")], "huge.jsonl, line 2"),
        (["train", "--base", qwen_dir, "--data", str(empty), "--out", str(tmp_path / "r3")], "the dataset is empty"),
        (
            ["train", "--base", str(llama), "--data", data, "--out", str(tmp_path / "r4")],
            "CausalQwen needs a Qwen2 base",
        ),
        (
            ["train", "--base", qwen_dir, "--data", data, "--out", str(tmp_path / "r5"), "--preset", "most"],
            "unknown preset 'most'",
        ),
        (
            ["train", "--base", qwen_dir, "--data", data, "--out", str(foreign), "--batch-size", "4"],
            "is not a causalqwen run",
        ),
        (["convert", "--base", qwen_dir, "--out", str(foreign)], "exists and is not empty; pass --overwrite"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, args
    for name in ("r1", "r2", "r3", "r4", "r5"):
        assert not (tmp_path / name).exists(), name  # nothing half-written


def test_demo_plots_show_the_trend_and_the_model_before_training(tmp_path):
    from causalqwen.app.demo import _plots, _smoothed

    assert _smoothed([4.0, 2.0, 0.0, -2.0], window=2) == [4.0, 3.0, 1.0, -1.0]  # trailing means, by hand
    history = [
        {
            "step": 0,
            "eval/accuracy": 0.0,
            "eval/num_f1": 0.0,
            "dist/ovr_prob_sum_median": 23.0,
            "dist/ovr_prob_sum_median_causal": 0.2,
            "eval/reg_mae": 30.0,
            "eval/reg_mdae": 20.0,
        }
    ]
    history += [
        {
            "step": s,
            "train/total_loss": 30.0 / s,
            "train/cls_loss_mean": 20.0 / s,
            "train/reg_loss_effective": -0.5 + 5.0 / s,
        }
        for s in range(1, 40)
    ]
    paths = _plots(history, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["loss.png", "metrics.png"]
    assert all(os.path.getsize(p) > 10_000 for p in paths)


def test_train_lora_with_a_divergence_bound(qwen_dir, tmp_path, capsys):
    """--preset lora writes the adapters and the merged model; --max-u-divergence logs the bound's figures."""
    import json

    from causalqwen import CausalQwenForCausalLM
    from causalqwen.integrations.lora import load_lora

    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(24, seed=0))
    run = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--base",
                qwen_dir,
                "--data",
                data,
                "--out",
                str(run),
                "--steps",
                "3",
                "--batch-size",
                "4",
                "--learning-rate",
                "1e-2",
                "--preset",
                "lora",
                "--lora-rank",
                "2",
                "--max-u-divergence",
                "0.01",
                "--log-every",
                "1",
                "--save-every",
                "3",
            ]
        )
        == 0
    )
    assert "LoRA adapters written to" in capsys.readouterr().out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["constraint/max_u_divergence"] for r in records] == [0.01] * 3
    assert all(r["constraint/u_divergence"] >= 0 for r in records)
    merged = CausalQwenForCausalLM.from_pretrained(run / "model").eval()
    base = CausalQwenForCausalLM.from_qwen(qwen_dir).eval()
    adapted = load_lora(CausalQwenForCausalLM.from_qwen(qwen_dir), run / "adapter")
    ids = torch.randint(0, 600, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).loc_S, adapted(ids).loc_S, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(merged(ids).loc_S, base(ids).loc_S)
    # --overwrite by a run of another preset removes the adapters with the other run outputs
    assert (
        cli.main(
            [
                "train",
                "--base",
                qwen_dir,
                "--data",
                data,
                "--out",
                str(run),
                "--steps",
                "1",
                "--batch-size",
                "4",
                "--overwrite",
            ]
        )
        == 0
    )
    assert not (run / "adapter").exists() and (run / "model").exists()
    with pytest.raises(SystemExit):
        cli.main(
            ["train", "--base", qwen_dir, "--data", data, "--out", str(tmp_path / "r"), "--max-u-divergence", "-1"]
        )
    assert "max_u_divergence must be a finite number > 0" in capsys.readouterr().err


def test_convert_initialization_options(qwen_dir, tmp_path, capsys):
    """The calibrated values by default and by --init calibrated (gamma 0.1, C by the rule), the drafts' values by
    --init drafts, a fixed C, and the options refused where they cannot apply (a saved CausalQwen keeps its own
    initialization; --init takes the names of what it does)."""
    from causalqwen import CausalQwenForCausalLM
    from causalqwen.initialization import DRAFT_INIT

    def convert(name, *options):
        assert cli.main(["convert", "--base", qwen_dir, "--out", str(tmp_path / name), *options]) == 0
        return CausalQwenForCausalLM.from_pretrained(tmp_path / name).config

    calibrated = convert("calibrated")
    assert (calibrated.abduction_scale_init, calibrated.ovr_threshold_init) == (0.1, "top_two_midpoint")
    assert f"C = {calibrated.ovr_threshold:.6g} (top_two_midpoint)" in capsys.readouterr().out
    named = convert("named", "--init", "calibrated")
    assert {k: getattr(named, k) for k in DRAFT_INIT} == {k: getattr(calibrated, k) for k in DRAFT_INIT}
    drafts = convert("drafts", "--init", "drafts")
    assert {k: getattr(drafts, k) for k in DRAFT_INIT} == DRAFT_INIT
    fixed = convert("fixed", "--ovr-threshold", "7.5", "--abduction-scale-init", "0.5")
    assert (fixed.ovr_threshold, fixed.ovr_threshold_init, fixed.abduction_scale_init) == (7.5, "fixed", 0.5)
    quantile = convert(
        "quantile", "--init", "drafts", "--threshold-init", "top_logit_quantile", "--threshold-quantile", "0.9"
    )
    assert (quantile.abduction_scale_init, quantile.ovr_threshold_init, quantile.ovr_threshold_quantile) == (
        10.0,
        "top_logit_quantile",
        0.9,
    )
    capsys.readouterr()
    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(8, seed=0))
    cases = [
        (
            ["convert", "--base", qwen_dir, "--out", str(tmp_path / "bad1"), "--abduction-scale-init", "0"],
            "abduction_scale_init must be a number in (0",
        ),
        (
            ["convert", "--base", qwen_dir, "--out", str(tmp_path / "bad2"), "--abduction-scale-init", "nan"],
            "abduction_scale_init must be finite",
        ),
        (
            [
                "convert",
                "--base",
                qwen_dir,
                "--out",
                str(tmp_path / "bad3"),
                "--ovr-threshold",
                "5",
                "--threshold-init",
                "top_two_midpoint",
            ],
            "pass one of them",
        ),
        (
            [
                "train",
                "--base",
                str(tmp_path / "calibrated"),
                "--data",
                data,
                "--out",
                str(tmp_path / "run"),
                "--init",
                "drafts",
            ],
            "is a saved CausalQwen, which keeps the initialization it was converted with",
        ),
        (
            ["convert", "--base", str(tmp_path / "drafts"), "--out", str(tmp_path / "bad5"), "--init", "calibrated"],
            "is a saved CausalQwen, which keeps the initialization it was converted with",
        ),
        (
            ["convert", "--base", qwen_dir, "--out", str(tmp_path / "bad6"), "--threshold-quantile", "0.3"],
            "--threshold-quantile applies to --threshold-init top_logit_quantile only",
        ),
        (
            [
                "convert",
                "--base",
                qwen_dir,
                "--out",
                str(tmp_path / "bad7"),
                "--threshold-init",
                "top_logit_quantile",
                "--threshold-quantile",
                "1.5",
            ],
            "ovr_threshold_quantile must be a number in (0, 1)",
        ),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, args
    with pytest.raises(SystemExit):
        cli.main(["convert", "--base", qwen_dir, "--out", str(tmp_path / "bad4"), "--threshold-init", "median"])
    assert "invalid choice: 'median'" in capsys.readouterr().err
    for old_name in ("d14", "D14", "default", ""):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["convert", "--base", qwen_dir, "--out", str(tmp_path / "bad8"), "--init", old_name])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert (
            err.strip()
            .splitlines()[-1]
            .endswith(f"error: argument --init: invalid choice: '{old_name}' (choose from 'calibrated', 'drafts')")
        ), err
        assert not (tmp_path / "bad8").exists()


def test_resuming_a_run_converted_another_way_says_how_to_convert_it_again(qwen_dir, tmp_path, capsys):

    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(8, seed=0))
    run = tmp_path / "run"
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(run), "--batch-size", "4", "--save-every", "2"]
    assert cli.main([*args, "--steps", "2", "--init", "drafts"]) == 0
    with pytest.raises(SystemExit):
        cli.main([*args, "--steps", "4", "--resume", "--allow-changed-settings"])
    err = capsys.readouterr().err
    assert "differs in abduction_scale_init, ovr_threshold, ovr_threshold_init" in err and "--init drafts" in err
    assert cli.main([*args, "--steps", "4", "--resume", "--allow-changed-settings", "--init", "drafts"]) == 0
    assert (run / "checkpoint-4").exists()


def _subcommand_parsers():
    """Each subcommand's parser, by name, from the argument table."""
    import argparse

    parser = cli.build_parser()
    (subparsers,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return subparsers.choices


def test_every_option_of_every_subcommand_has_help_that_shows_its_default(capsys):
    parsers = _subcommand_parsers()
    assert set(parsers) == set(cli.COMMANDS)
    checked = 0
    for name, parser in parsers.items():
        for action in parser._actions:
            if action.dest == "help":
                continue
            option = f"causalqwen {name} {action.option_strings[0]}"
            assert action.help, f"{option} has no help text"
            shown = action.help % dict(vars(action), prog=parser.prog)  # as argparse expands it
            if action.required:
                assert "(required)" in shown, option
                continue
            assert "(default: " in shown, f"{option}: its help does not show its default: {shown!r}"
            if action.default not in (None, False):  # a value: the help shows that very value
                assert f"(default: {action.default})" in shown or f"(default: {action.default!r})" in shown, option
            checked += 1
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])  # every help text renders
        assert "(default: " in capsys.readouterr().out
    assert checked == 55  # walkthrough 2, generate 11, demo 4, train 30, convert 8 options that are not required


def test_a_short_train_run_reaches_its_learning_rate_keeps_the_newest_checkpoints_and_prints_each_eval(
    qwen_dir, tmp_path, capsys
):
    import json
    import math

    from causalqwen.app import runs

    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(40, seed=0))
    held_out = _jsonl(tmp_path / "eval.jsonl", synthetic_texts(8, seed=1))
    run = tmp_path / "run"
    assert (
        cli.main(
            [
                "train",
                "--base",
                qwen_dir,
                "--data",
                data,
                "--eval-data",
                held_out,
                "--out",
                str(run),
                "--steps",
                "4",
                "--batch-size",
                "4",
                "--learning-rate",
                "1e-3",
                "--log-every",
                "1",
                "--eval-every",
                "2",
                "--save-every",
                "1",
                "--save-total-limit",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    # warm-up: ceil(0.1 * 4) = 1 step, then cosine decay to 0 at step 4; the rate after step s:
    expected = [1e-3 * 0.5 * (1 + math.cos(math.pi * (step - 1) / 3)) for step in (1, 2, 3, 4)]
    assert [r["train/learning_rate"] for r in records] == pytest.approx(expected, rel=1e-12, abs=1e-20)
    assert max(r["train/learning_rate"] for r in records) == 1e-3

    assert sorted(name for name in os.listdir(run) if name.startswith("checkpoint-")) == [
        "checkpoint-3",
        "checkpoint-4",
    ]

    evals = [r for r in records if any(key.startswith("eval/") for key in r)]
    assert [r["step"] for r in evals] == [2, 4]
    printed = [line for line in out.splitlines() if line.startswith("eval step ")]
    assert len(printed) == 2
    for line, record in zip(printed, evals):
        head, _, body = line.partition(": ")
        assert head == f"eval step {record['step']}"
        values = dict(item.split("=", 1) for item in body.split(" "))
        assert set(values) == {key for key in record if key.startswith(("eval/", "dist/"))}
        for key, text in values.items():  # each printed value is metrics.jsonl's, to 6 significant digits
            assert text == format(record[key], ".6g"), key
            assert float(text) == pytest.approx(record[key], rel=5e-6) or math.isnan(record[key]), key
    assert printed == [runs.eval_line(record["step"], record) for record in evals]


def test_train_on_prompt_completion_rows_reports_the_answers_own_figures(qwen_dir, tokenizer, tmp_path, capsys):
    """A run on {"prompt", "completion"} rows: the loss counts the completions alone (n_cls and n_reg match the
    completions' tokens and numbers), and each eval line carries the answer's figures apart from the prompt's."""
    import json

    rows = [
        {"prompt": f"The price is {x} yuan. Again, the price is ", "completion": f"{x} yuan."} for x in range(1, 41)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(row) + "\n" for row in rows[:6]))
    run = tmp_path / "run"
    arguments = ["train", "--base", qwen_dir, "--data", str(data), "--eval-data", str(held_out), "--out", str(run)]
    assert cli.main(arguments + ["--steps", "2", "--batch-size", "4", "--eval-every", "2", "--log-every", "1"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval step ")]
    assert len(printed) == 1
    values = dict(item.split("=", 1) for item in printed[0].partition(": ")[2].split(" "))
    assert values["eval/answer_count"] == "6" and values["eval/reg_count"] == "6"  # the prompts' numbers are context
    assert 0 <= float(values["eval/answer_coverage_50"]) <= float(values["eval/answer_coverage_90"]) <= 1
    scored = sum(len(tokenizer.encode(row["completion"])[0]) + 1 for row in rows[:6])  # completion and EOS
    assert values["eval/tokens"] == str(scored)


def test_an_eval_set_whose_completion_lacks_the_answer_is_named_before_anything_is_written(qwen_dir, tmp_path, capsys):
    import json

    rows = [{"prompt": f"The price is {x} yuan. Again, the price is ", "completion": f"{x} yuan."} for x in range(8)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(
        "".join(json.dumps(row) + "\n" for row in rows[:3] + [{"prompt": "The price is ", "completion": "unknown"}])
    )
    run = tmp_path / "run"
    arguments = ["train", "--base", qwen_dir, "--data", str(data), "--eval-data", str(held_out), "--out", str(run)]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(arguments + ["--steps", "1"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"{held_out}, line 4: the completion 'unknown' holds no number, while 3 of the 4 completions do" in error
    assert not run.exists()


@pytest.mark.parametrize("command", ["train", "demo", "convert", "generate"])
def test_every_command_that_computes_says_how_threads_are_set(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--threads N intra-op threads of torch, at least 1 (default:" in help_text
    if command != "demo":
        assert "OMP_NUM_THREADS if set, else the CPUs this process may use less the machine's load" in help_text


def test_the_default_thread_count_leaves_a_busy_machine_s_cores_to_their_load(monkeypatch):
    """torch's default (a thread per core) beside another busy process on 2 cores ran 4.6 to 6.4 s a step, one
    thread 0.28 s: the default is the CPUs this process may use less the load already on them, at least 1, and an
    OMP_NUM_THREADS in the environment wins."""
    from causalqwen.app import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    for load, expected in ((0.0, 2), (0.4, 2), (1.0, 1), (2.0, 1), (7.5, 1)):
        monkeypatch.setattr(threads.os, "getloadavg", lambda load=load: (load, load, load))
        assert threads.default_threads() == expected, load
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.default_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS must be a positive integer, got 'two'"):
        threads.default_threads()


def test_threads_sets_torch_s_thread_count_and_refuses_zero(capsys):
    before = torch.get_num_threads()
    try:
        assert cli.main(["generate", "--prompt", "x", "--max-new-tokens", "1", "--threads", "2"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SystemExit) as exited:
        cli.main(["generate", "--prompt", "x", "--threads", "0"])
    assert exited.value.code == 2 and "argument --threads: must be an integer from 1 to" in capsys.readouterr().err


def test_the_demos_samples_write_numbers_as_generate_does(capsys):
    """Each sample line is the prompt as given, then numbers at its resolution (D17), as ``causalqwen generate``
    writes them, not every float32 digit (an untrained model's values have seven or more)."""
    import ast

    from causalqwen.app import demo
    from causalqwen.app.tiny import build_tiny_causal_lm
    from causalqwen.numbers import find_numbers

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    with torch.no_grad():  # every mode's next token is <NUM>: the samples are numbers, whatever the model's values
        model.action.classification_head.bias[tokenizer.num_token_id] += 1e4
    demo._print_samples(model, tokenizer)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert len(lines) == 5
    for line in lines:
        text = ast.literal_eval(line.split(None, 1)[1])
        assert text.startswith(demo.PROMPTS[0])
        continuation = text[len(demo.PROMPTS[0]) :]
        assert len(find_numbers(continuation)) >= 6, line
        for number in find_numbers(continuation):
            digits = continuation[number.start : number.end].lstrip("-").replace(".", "").lstrip("0")
            assert len(digits) <= 3, (line, continuation[number.start : number.end])


# Trust boundaries of the command line: every option and every file the ``causalqwen`` command
# reads fails with exit status 2 and one line naming the option, or the file and line, that is wrong; a
# Ctrl-C during ``train`` names the last checkpoint and the command that continues the run (exit 130).


BIG = "99999999999999999999999"  # beyond 64 bits: "Overflow when unpacking long long" before the fix


HUGE = "9" * 5000  # beyond Python's 4300-digit limit on int(str)


def _fails(capsys, args):
    """Run ``causalqwen ARGS``; assert exit status 2 and one error line without a traceback; return that line."""
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2, err
    assert err and not any("Traceback" in line for line in err), err
    return err[-1]


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


@pytest.fixture
def data(tmp_path):
    return _jsonl(tmp_path / "train.jsonl", ["a 1", "b 2", "c 3", "d 4"])


SEED_RANGE = "must be an integer from 0 to 4294967295"


WIDTH = "must be an integer no larger than 9223372036854775807"


def _interrupt_after_checkpoint(monkeypatch, step):
    save = runs.save_checkpoint

    def save_then_interrupt(out_dir, state):
        path = save(out_dir, state)
        if state.step == step:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(runs, "save_checkpoint", save_then_interrupt)


@pytest.mark.parametrize(
    "command",
    [
        ["walkthrough"],
        ["generate", "--prompt", "x"],
        ["demo", "--out", "{tmp}/d"],
        ["train", "--base", "tiny", "--data", "{data}", "--out", "{tmp}/r"],
    ],
)
@pytest.mark.parametrize("value", [BIG, "-1", str(2**32), str(2**64), HUGE])
def test_every_seed_option_names_its_range(command, value, tmp_path, data, capsys):
    args = [a.format(tmp=tmp_path, data=data) for a in command] + ["--seed", value]
    line = _fails(capsys, args)
    shown = value if len(value) < 40 else f"{value[:12]}... ({len(value)} digits)"
    assert line.endswith(f"argument --seed: {SEED_RANGE} (2**32 - 1), got {shown}"), line
    assert len(line) < 200
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == ["train.jsonl"]  # nothing written


@pytest.mark.parametrize(
    "option",
    [
        "--steps",
        "--batch-size",
        "--warmup-steps",
        "--max-length",
        "--eval-every",
        "--save-every",
        "--save-total-limit",
        "--log-every",
        "--lora-rank",
    ],
)
@pytest.mark.parametrize("value", [BIG, str(2**63), HUGE])
def test_every_train_count_option_is_bounded_by_64_bits(option, value, tmp_path, data, capsys):
    line = _fails(capsys, ["train", "--base", "tiny", "--data", data, "--out", str(tmp_path / "r"), option, value])
    expected = "must be an integer from 1 to 9223372036854775807" if option == "--lora-rank" else WIDTH
    assert f"argument {option}: {expected} (2**63 - 1), got " in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--steps", BIG], f"argument --steps: {WIDTH}"),
        (["generate", "--prompt", "x", "--max-new-tokens", BIG], f"argument --max-new-tokens: {WIDTH}"),
        (["generate", "--prompt", "x", "--mode", "traditional", "--top-k", str(2**64)], f"argument --top-k: {WIDTH}"),
        (["generate", "--prompt", "x", "--seed", "1.5"], "argument --seed: expected an integer, got '1.5'"),
        (
            ["generate", "--prompt", "x", "--max-new-tokens", "ten"],
            "argument --max-new-tokens: expected an integer, got 'ten'",
        ),
    ],
)
def test_other_integer_options_name_the_option(args, message, capsys):
    assert message in _fails(capsys, args)


@pytest.mark.parametrize(
    "option, value, message",
    [  # below range: the library's check names the setting
        ("--steps", "0", "steps must be a positive int, got 0"),
        ("--batch-size", "-1", "batch_size must be a positive int, got -1"),
        ("--warmup-steps", "-1", "warmup_steps must be an int >= 0, got -1"),
        ("--eval-every", "0", "eval_every must be a positive int, got 0"),
        ("--save-every", "-3", "save_every must be a positive int, got -3"),
        ("--log-every", "0", "log_every must be a positive int, got 0"),
        ("--save-total-limit", "-1", "save_total_limit must be an int >= 0, got -1"),
        ("--warmup-ratio", "1.5", "warmup_ratio must be a number from 0 to 1 or None, got 1.5"),
        ("--max-length", "1", "max_length must be an int >= 2, got 1"),
        ("--lora-rank", "0", "argument --lora-rank: must be an integer from 1 to 9223372036854775807"),
    ],
)
def test_negative_and_zero_counts_are_refused_by_name(option, value, message, qwen_dir, tmp_path, data, capsys):
    extra = ["--preset", "lora"] if option == "--lora-rank" else []
    line = _fails(
        capsys, ["train", "--base", qwen_dir, "--data", data, "--out", str(tmp_path / "r"), option, value, *extra]
    )
    assert message in line, line
    assert not (tmp_path / "r").exists()


def test_warmup_steps_and_warmup_ratio_together_are_refused_naming_both(tmp_path, data, capsys):
    line = _fails(
        capsys,
        [
            "train",
            "--base",
            "tiny",
            "--data",
            data,
            "--out",
            str(tmp_path / "r"),
            "--warmup-steps",
            "5",
            "--warmup-ratio",
            "0.2",
        ],
    )
    assert "argument --warmup-ratio: not allowed with argument --warmup-steps" in line, line
    assert not (tmp_path / "r").exists()


def test_a_lora_rank_beyond_the_hidden_size_is_refused_before_allocating(qwen_dir, tmp_path, data, capsys):
    started = time.perf_counter()
    line = _fails(
        capsys,
        [
            "train",
            "--base",
            qwen_dir,
            "--data",
            data,
            "--out",
            str(tmp_path / "r"),
            "--preset",
            "lora",
            "--lora-rank",
            str(2**40),
        ],
    )
    assert "--lora-rank 1099511627776 exceeds the base's hidden size 64" in line, line
    assert time.perf_counter() - started < budget(30) and not (tmp_path / "r").exists()


def test_seeds_at_the_ends_of_the_range_work(capsys):
    for seed in ("0", str(2**32 - 1)):
        assert cli.main(["generate", "--prompt", "It is 3 degrees", "--max-new-tokens", "2", "--seed", seed]) == 0
        assert capsys.readouterr().out.startswith("It is 3 degrees")


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_every_line_ending_reads_the_same_lines(tmp_path, ending):
    path = tmp_path / "data.jsonl"
    path.write_bytes(ending.join(['{"text": "a 1"}', "", '{"text": "b 2"}', '{"text": "c\\r\\nd 3"}']).encode() + b"\r")
    texts, sources = read_jsonl(path)
    assert texts == ["a 1", "b 2", "c\r\nd 3"]
    assert sources == [f"{path}, line 1", f"{path}, line 3", f"{path}, line 4"]


def test_mixed_line_endings_count_lines_as_an_editor_does(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r{"text": "c"}\n\r\n{"text": 7}\r')
    with pytest.raises(ValueError, match=r"data\.jsonl, line 5: the field 'text' must be a string, got int"):
        read_jsonl(path)


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a 1"}\r\n{"text": "\xef\xbb\xbfb"}\r\n')
    assert read_jsonl(path)[0] == ["a 1", "\ufeffb"]  # only the file's first bytes are a mark; a text keeps its own


@pytest.mark.parametrize(
    "content, message",
    [
        (
            b'{"text": "ok"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n",
            r"bad\.jsonl, line 2: the JSON is nested too deeply to read",
        ),
        (
            b'{"text": "ok"}\n{"text": "x", "id": ' + HUGE.encode() + b"}\n",
            r"bad\.jsonl, line 2: an integer of 5000 digits, more than the 4300 Python converts",
        ),
        (
            b'{"text": "ok"}\n{"text": "x", "id": -' + HUGE.encode() + b"}\n",
            r"bad\.jsonl, line 2: an integer of 5000 digits",
        ),
        (
            '{"text": "a 1"}\n'.encode("utf-16"),
            (
                r"bad\.jsonl: the file is UTF-16 text \(it starts with the byte-order mark "
                r"b'\\xff\\xfe'\); JSONL must be UTF-8"
            ),
        ),
        ('{"text": "a 1"}\n'.encode("utf-16-be"), r"bad\.jsonl, line 1: a NUL byte at byte 0 of the line"),
        ('{"text": "a 1"}\n'.encode("utf-32"), r"bad\.jsonl: the file is UTF-32 text"),
        (bytes(range(256)) * 4, r"bad\.jsonl, line 1: a NUL byte at byte 0 of the line \(a binary file"),
        (b"\x89PNG\r\n\x1a\n", r"bad\.jsonl, line 1: invalid UTF-8 at byte 0 of the line"),
        (b'{"text": "a", "text": "b"}\n', r"bad\.jsonl, line 1: the key 'text' appears twice in one object"),
        (b'{"text": "ok"}\n\x0c\n', r"bad\.jsonl, line 2: not valid JSON \(Expecting value at column 1\)"),
        (b'{"text": "ok"} {"text": "two"}\n', r"bad\.jsonl, line 1: not valid JSON \(Extra data at column 16\)"),
        (b"", r"bad\.jsonl: the dataset is empty \(no line with a row\)"),
        (b"\r\r\n\n", r"bad\.jsonl: the dataset is empty"),
    ],
)
def test_bad_jsonl_files_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_jsonl(path)


def test_a_path_that_is_no_file_is_named(tmp_path):
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(OSError, match=r"cannot read the JSONL file '.*folder\.jsonl': it is a directory"):
        read_jsonl(tmp_path / "folder.jsonl")
    with pytest.raises(OSError, match=r"cannot read the JSONL file '.*missing\.jsonl': it does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_the_command_reads_the_data_before_loading_the_model(tmp_path, capsys, monkeypatch):
    """Bad data fails at once (exit 2, file and line), before a possibly large model is loaded."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"text": "ok"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes(b'{"text": "a 1"}\r{"text": "b 2"}\r{"oops": 1}\r')
    (tmp_path / "dir.jsonl").mkdir()
    loaded = []
    monkeypatch.setattr(commands, "load_model_and_tokenizer", lambda *a, **k: loaded.append(a))
    base = ["train", "--base", "tiny", "--out", str(tmp_path / "r")]
    assert "deep.jsonl, line 2: the JSON is nested too deeply to read" in _fails(capsys, base + ["--data", str(deep)])
    assert "cr.jsonl, line 3: expected a JSON object" in _fails(capsys, base + ["--data", str(cr)])
    assert "dir.jsonl': it is a directory" in _fails(capsys, base + ["--data", str(tmp_path / "dir.jsonl")])
    good = _jsonl(tmp_path / "good.jsonl", ["a 1"])
    line = _fails(capsys, base + ["--data", good, "--eval-data", str(deep)])
    assert "deep.jsonl, line 2: the JSON is nested too deeply to read" in line
    assert loaded == [] and not (tmp_path / "r").exists()


def test_a_cr_only_file_trains(qwen_dir, tmp_path, capsys):
    data = tmp_path / "mac.jsonl"
    data.write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\r" for t in ["a 1", "b 2", "c 3", "d 4"]))
    assert (
        cli.main(
            [
                "train",
                "--base",
                qwen_dir,
                "--data",
                str(data),
                "--out",
                str(tmp_path / "r"),
                "--steps",
                "1",
                "--batch-size",
                "4",
            ]
        )
        == 0
    )
    assert (tmp_path / "r" / "model" / "model.safetensors").exists()


@pytest.mark.parametrize(
    "name, content, reason",
    [
        (
            "tokenizer.json",
            b'{"version": "1.0", "model": {"type": "BPE", "vo',
            r"is not valid JSON \(Unterminated string starting at: line 1, column 45\)",
        ),
        ("tokenizer.json", b"\xff\xfe{}", r"is not UTF-8 text \(invalid byte 0xff at offset 0\)"),
        (
            "tokenizer_config.json",
            b"{",
            r"is not valid JSON \(Expecting property name enclosed in double quotes: line 1, column 2\)",
        ),
        ("config.json", b'{"a": 1}\n[[[', r"is not valid JSON \(Extra data: line 2, column 1\)"),
        ("tokenizer.json", b"[" * 100_000, r"cannot be read: the JSON is nested too deeply"),
    ],
)
def test_a_corrupt_json_file_of_a_model_directory_is_named(qwen_dir, tmp_path, capsys, name, content, reason):
    import re
    import shutil

    target = tmp_path / "model"
    shutil.copytree(qwen_dir, target)
    (target / name).write_bytes(content)
    pattern = re.escape(repr(str(target / name))) + " " + reason
    line = _fails(capsys, ["generate", "--model", str(target), "--prompt", "x"])
    assert re.search(pattern, line), line
    with pytest.raises(OSError, match=pattern):  # the library's doors name it too
        NumericTokenizer.from_pretrained(target)


def test_a_model_directory_without_a_tokenizer_is_named(qwen_dir, tmp_path, capsys):
    import shutil

    target = tmp_path / "model"
    shutil.copytree(qwen_dir, target)
    for name in os.listdir(target):
        if name.startswith("tokenizer"):
            os.remove(target / name)
    line = _fails(capsys, ["generate", "--model", str(target), "--prompt", "x"])
    assert (
        f"cannot load a tokenizer from {str(target)!r}: the directory holds no tokenizer file (tokenizer.json, "
        "vocab.json or tokenizer.model)"
    ) in line, line
    # the library's door says the same: transformers would build a tokenizer of one token from the config alone,
    # and from_qwen would have taken its length, 1, for the <NUM> id (an ordinary token of the base)
    from causalqwen import CausalQwenForCausalLM

    with pytest.raises(ValueError, match=r"holds no tokenizer file .*from_qwen reads the <NUM> id"):
        CausalQwenForCausalLM.from_qwen(target)


def test_ctrl_c_names_the_last_checkpoint_and_the_resume_command(qwen_dir, tmp_path, data, capsys, monkeypatch):
    run = tmp_path / "my run"
    args = [
        "train",
        "--base",
        qwen_dir,
        "--data",
        data,
        "--out",
        str(run),
        "--steps",
        "6",
        "--batch-size",
        "2",
        "--save-every",
        "2",
        "--log-every",
        "1",
        "--overwrite",
    ]
    _interrupt_after_checkpoint(monkeypatch, 4)
    assert cli.main(args) == 130
    err = capsys.readouterr().err.split("\n")[-3:]  # the progress bar ended its line: the message has its own lines
    assert err[-1] == ""
    err = err[:-1]
    assert err[-2] == f"causalqwen train: interrupted; the last checkpoint is {run / 'checkpoint-4'} (step 4 of 6)"
    resume = shlex.join(["causalqwen", *args[:-1], "--resume"])  # --overwrite would start over: dropped
    assert err[-1] == f"continue with: {resume}"
    monkeypatch.undo()
    assert cli.main(shlex.split(err[-1].removeprefix("continue with: "))[1:]) == 0  # the printed command works
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoint-6").exists() and (run / "model" / "model.safetensors").exists()


def test_ctrl_c_before_the_first_checkpoint_says_so(qwen_dir, tmp_path, data, capsys, monkeypatch):
    run = tmp_path / "run"
    forward = training_run.loss_and_gradients  # the step as the training run looks it up
    calls = []

    def interrupt_at_step_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    monkeypatch.setattr(training_run, "loss_and_gradients", interrupt_at_step_2)
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(run), "--steps", "4", "--batch-size", "2"]
    assert cli.main(args) == 130
    err = capsys.readouterr().err.split("\n")[-3:-1]
    assert err[-2] == "causalqwen train: interrupted before the first checkpoint (--save-every 500): no step is saved"
    assert err[-1] == f"start again with: {shlex.join(['causalqwen', *args, '--resume'])}"
    monkeypatch.undo()
    assert cli.main(args + ["--resume"]) == 0 and (run / "checkpoint-4").exists()


def test_ctrl_c_elsewhere_exits_130_without_a_traceback(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "generate_text", interrupted)
    assert cli.main(["generate", "--prompt", "x"]) == 130
    assert capsys.readouterr().err.strip() == "causalqwen generate: interrupted"


@pytest.mark.slow
def test_a_real_sigint_during_training(qwen_dir, tmp_path, data):
    run = tmp_path / "run"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # A shell without job control starts background jobs with SIGINT ignored, and Python keeps an ignored
    # SIGINT; the child restores the interactive default, so the test does not depend on how the suite was started.
    launch = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('causalqwen.app.cli', run_name='__main__', alter_sys=True)"
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            launch,
            "train",
            "--base",
            qwen_dir,
            "--data",
            data,
            "--out",
            str(run),
            "--steps",
            "100000",
            "--batch-size",
            "2",
            "--save-every",
            "1",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + budget(120)

        def saved_steps():  # the oldest are removed as the run goes (--save-total-limit 3)
            return [step for name in (os.listdir(run) if run.is_dir() else []) if (step := runs.checkpoint_step(name))]

        while max(saved_steps(), default=0) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        assert max(saved_steps(), default=0) >= 2
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=budget(60))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert lines[-2].startswith(f"causalqwen train: interrupted; the last checkpoint is {run}{os.sep}checkpoint-")
    assert lines[-1].startswith("continue with: causalqwen train --base") and lines[-1].endswith(" --resume")


def test_messages_name_the_command_line_flags(qwen_dir, tmp_path, data, capsys):
    run = tmp_path / "run"
    RunDirectory.claim(run, "train").release()
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(run), "--steps", "1", "--batch-size", "2"]
    assert "holds a previous train run; pass --resume to continue it or --overwrite to replace it" in _fails(
        capsys, args
    )
    assert "argument --overwrite: not allowed with argument --resume" in _fails(
        capsys, args + ["--resume", "--overwrite"]
    )
    assert "--allow-changed-settings applies to --resume only" in _fails(capsys, args + ["--allow-changed-settings"])
    with pytest.raises(ValueError, match="pass resume to continue it or overwrite to replace it"):
        RunDirectory.claim(run, "train")  # the library keeps its keyword names
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        RunDirectory.claim(run, "train", resume=True, overwrite=True)


def test_a_resume_in_another_dtype_is_a_changed_setting(tmp_path, data, capsys, caplog):
    """A bfloat16 run resumed with --dtype float32 trains on in another precision (it ended 7.5e-3 from the
    uninterrupted run, silently): refused like any other changed setting, and named when allowed."""
    run = tmp_path / "run"
    args = ["train", "--base", "tiny", "--data", data, "--out", str(run), "--steps", "2", "--batch-size", "2"]
    assert cli.main(args + ["--dtype", "bfloat16", "--save-every", "1"]) == 0
    message = "the parameters' dtype (--dtype) is bfloat16 in the checkpoint, float32 now"
    assert message in _fails(capsys, args + ["--resume", "--dtype", "float32"])
    with caplog.at_level("WARNING"):
        assert cli.main(args + ["--resume", "--dtype", "float32", "--allow-changed-settings"]) == 0
    assert any(message in record.getMessage() for record in caplog.records)
    assert cli.main(args + ["--resume", "--dtype", "bfloat16"]) == 0  # the run's own dtype resumes as before


@pytest.mark.parametrize(
    "command, option",
    [
        (["generate", "--prompt", "x"], "--model"),
        (["convert", "--out", "{tmp}/c"], "--base"),
        (["train", "--data", "{data}", "--out", "{tmp}/r"], "--base"),
    ],
)
def test_a_name_that_is_neither_a_directory_nor_a_hub_id_fails_at_once(
    command, option, tmp_path, data, capsys, monkeypatch
):
    import huggingface_hub.constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a safety net: no test reaches the network
    started = time.perf_counter()
    args = [a.format(tmp=tmp_path, data=data) for a in command] + [option, "model_nope"]
    line = _fails(capsys, args)
    assert time.perf_counter() - started < budget(5)
    assert line.endswith(
        "error: model directory 'model_nope' does not exist (a hub id has the form owner/name, e.g. Qwen/Qwen2.5-0.5B)"
    ), line
    with pytest.raises(OSError, match=r"tokenizer directory 'model_nope' does not exist \(a hub id has the form"):
        NumericTokenizer.from_pretrained("model_nope")


def test_a_hub_id_not_in_the_cache_fails_at_once_when_offline(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    started = time.perf_counter()
    line = _fails(capsys, ["generate", "--model", "someone/not-cached", "--prompt", "x"])
    assert line.endswith(
        "error: model 'someone/not-cached' is no local directory and, with HF_HUB_OFFLINE=1, "
        "not in the local Hugging Face cache either"
    ), line
    assert time.perf_counter() - started < budget(5)


def test_a_file_given_as_a_model_directory_is_named_without_a_hub_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").write_text("x")
    line = _fails(capsys, ["generate", "--model", "weights", "--prompt", "x"])
    assert line.endswith("error: model directory 'weights' exists but is not a directory"), line


@pytest.mark.parametrize(
    "command, option",
    [
        (["generate", "--prompt", "x"], "--model"),
        (["demo"], "--out"),
        (["convert", "--out", "c"], "--base"),
        (["convert", "--base", "tiny"], "--out"),
        (["train", "--data", "d", "--out", "o"], "--base"),
        (["train", "--base", "tiny", "--out", "o"], "--data"),
        (["train", "--base", "tiny", "--data", "d", "--out", "o"], "--eval-data"),
        (["train", "--base", "tiny", "--data", "d"], "--out"),
    ],
)
def test_an_empty_path_is_refused_by_option(command, option, capsys):
    line = _fails(capsys, command + [option, ""])
    assert line.endswith(f"argument {option}: must name a file, directory or hub id, got ''"), line


@pytest.mark.parametrize(
    "option, value, message",
    [
        (
            "--weight-decay",
            "1e300",
            "weight_decay must be a finite number within float32's range (at most 3.40282e+38), got 1e+300",
        ),
        (
            "--learning-rate",
            "1e39",
            "learning_rate must be a finite number within float32's range (at most 3.40282e+38), got 1e+39",
        ),
        ("--learning-rate", "1e300", "learning_rate must be a finite number within float32's range"),
        ("--max-grad-norm", "1e39", "max_grad_norm must be a finite number within float32's range"),
        (
            "--weight-decay",
            "1e4",
            "learning_rate * weight_decay must be < 1 (AdamW multiplies the weights by "
            "1 - learning_rate * weight_decay each step), got learning_rate=0.0001 * "
            "weight_decay=10000.0 = 1",
        ),
    ],
)
def test_settings_that_would_overflow_or_flip_the_weights_are_refused(
    qwen_dir, tmp_path, data, capsys, option, value, message
):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        qwen_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        option,
        value,
    ]
    assert message in _fails(capsys, args)
    assert not out.exists()  # refused at the door: nothing written


def test_divergence_dual_lr_without_the_bound_is_refused(qwen_dir, tmp_path, data, capsys):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        qwen_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--divergence-dual-lr",
        "5",
    ]
    assert "--divergence-dual-lr applies to --max-u-divergence only" in _fails(capsys, args)
    assert not out.exists()


@pytest.mark.parametrize(
    "options, named",
    [
        (["--lora-rank", "4"], "--lora-rank apply"),
        (["--lora-alpha", "0"], "--lora-alpha apply"),
        (["--lora-rank", "8", "--lora-alpha", "16"], "--lora-rank and --lora-alpha apply"),
    ],
)
def test_lora_options_with_another_preset_are_refused_not_ignored(qwen_dir, tmp_path, data, capsys, options, named):
    out = tmp_path / "run"
    args = ["train", "--base", qwen_dir, "--data", data, "--out", str(out), "--steps", "1", "--preset", "causal"]
    line = _fails(capsys, args + options)
    assert f"{named} to --preset lora only (the preset is 'causal')" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, start",
    [
        (["convert", "--base", "no_such_base_dir", "--out", "out"], "causalqwen convert: error: model directory"),
        (
            ["generate", "--prompt", "hi", "--number-resolution", "junk"],
            "causalqwen generate: error: argument --number",
        ),
        (["train", "--bogus"], "causalqwen train: error: the following arguments are required"),
        (["generate", "--prompt", "hi", "--top-k", "3"], "causalqwen generate: error: --temperature, --top-k"),
        (["bogus"], "causalqwen: error: argument COMMAND: invalid choice: 'bogus'"),
    ],
)
def test_every_command_line_error_is_one_line_that_names_the_command(tmp_path, monkeypatch, capsys, argv, start):
    """A usage error (argparse's) and a data error alike: one line on stderr, ``causalqwen COMMAND: error: ...``, exit
    status 2, no usage block, nothing written."""
    from causalqwen.app import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(start), captured.err
    assert list(tmp_path.iterdir()) == []


def test_walkthrough_refuses_an_empty_text_before_it_prints_anything(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["walkthrough", "--text", ""])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert (
        captured.err.strip()
        .splitlines()[-1]
        .endswith("argument --text: must hold at least one character (an empty text has no token to read)")
    )


def test_cli_errors_are_one_line_with_exit_status_2(saved, tmp_path, capsys):
    target = saved_copy(saved, tmp_path)
    edit_config(target, vocab_size=10**12)
    NumericTokenizer(build_tiny_base(seed=0)[1]).save_pretrained(target)
    cases = [
        (["demo", "--steps", "0", "--out", str(tmp_path / "d")], "steps must be a positive int, got 0"),
        (["generate", "--model", str(target), "--prompt", "x"], "vocab_size=1000000000000"),
        (["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"], "does not exist"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and message in err[-1], (args, err)
        assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("kind", ["pathlike", "absolute", "dot", "nested", "under_existing_dir"])
def test_a_missing_local_path_is_named_not_looked_up_on_the_hub(tmp_path, monkeypatch, capsys, kind):
    from causalqwen import NumericTokenizer
    from causalqwen.app.cli import main as cli_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    source = {
        "pathlike": tmp_path / "missing",
        "absolute": str(tmp_path / "missing"),
        "dot": "./missing",
        "nested": "a/b/missing",
        "under_existing_dir": "runs/missing",
    }[kind]
    started = time.perf_counter()
    for load, what in [
        (CausalQwenForCausalLM.from_pretrained, "model"),
        (CausalQwenForCausalLM.from_qwen, "base model"),
        (NumericTokenizer.from_pretrained, "tokenizer"),
    ]:
        with pytest.raises(OSError, match=f"{what} directory '{re.escape(str(source))}' does not exist"):
            load(source)
    with pytest.raises(SystemExit) as exited:
        cli_main(["generate", "--model", str(source), "--prompt", "x"])
    assert exited.value.code == 2 and f"model directory '{source}' does not exist" in capsys.readouterr().err
    assert time.perf_counter() - started < budget(5)  # no network retries


def _fails_after_loading(capsys, args):
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    # transformers' own progress bar of loading the base may come first (it is on unless a caller turned it off)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("Loading weights:")]
    assert exited.value.code == 2, err
    assert err[-1].startswith(f"causalqwen {args[0]}: error: ") and not any("Traceback" in line for line in err), err
    assert len(err) == 1, err  # one line
    return err[-1]


BAD_OPTIONS = [
    (["--report-to", "tensorboard"], "report_to='tensorboard' needs the tensorboard package"),
    (["--report-to", "wandb"], "report_to='wandb' needs the wandb package"),
    (["--batch-size", "64"], "the dataset has 4 texts: too few for one batch of 64 on 1 process(es)"),
]


@pytest.fixture
def without_sinks(monkeypatch):
    """tensorboard and wandb not importable, as on a machine without them (what a None in sys.modules does)."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    """The tiny CausalQwen saved with its tokenizer (a --base that loads without a conversion)."""
    tiny = build_tiny_causal_lm(seed=0, init_seed=0)
    directory = tmp_path_factory.mktemp("causal_tiny")
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)
    return str(directory)


def test_a_refused_option_leaves_no_output_directory_and_the_command_then_runs(
    causal_dir, tmp_path, data, capsys, without_sinks
):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        causal_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "1",
        "--batch-size",
        "2",
    ]
    for bad, message in BAD_OPTIONS:
        assert message in _fails_after_loading(capsys, args + bad)
        assert not out.exists(), bad
    assert cli.main(args) == 0
    assert (out / "model" / "config.json").is_file()


def test_a_refused_option_leaves_a_previous_run_untouched(causal_dir, tmp_path, data, capsys, without_sinks):
    out = tmp_path / "run"
    args = [
        "train",
        "--base",
        causal_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--save-every",
        "1",
    ]
    assert cli.main(args) == 0
    capsys.readouterr()
    before = file_tree(out)
    for again in ("--resume", "--overwrite"):
        for bad, message in BAD_OPTIONS:
            assert message in _fails_after_loading(capsys, args + [again] + bad)
            # the lock, the marker, the config, the checkpoints, the model
            assert file_tree(out) == before, (again, bad)
    assert cli.main(args + ["--overwrite"]) == 0


def test_texts_without_a_next_token_are_refused_before_the_claim(causal_dir, tmp_path, capsys):
    out = tmp_path / "run"
    data = _jsonl(tmp_path / "train.jsonl", ["", ""])
    args = [
        "train",
        "--base",
        causal_dir,
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        "1",
        "--batch-size",
        "2",
    ]
    assert "none of the 2 training texts has two tokens" in _fails_after_loading(capsys, args)
    assert not out.exists()
