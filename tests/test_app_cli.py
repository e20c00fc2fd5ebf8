"""The ``causalqwen`` command line: the argument table and dispatch (`causalqwen.app.cli`) and the commands
(`causalqwen.app.commands`)."""

import os
import subprocess
import sys

import pytest
import torch

from causalqwen.app import cli, commands


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

    from causalqwen import generate

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


def _jsonl(path, texts):
    import json

    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_convert_then_train_then_generate(qwen_dir, tmp_path, capsys):
    from causalqwen import CausalQwenForCausalLM
    from causalqwen.files.data import synthetic_texts

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
    from causalqwen.files.data import synthetic_texts
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
    from causalqwen.files.data import synthetic_texts
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
    from causalqwen.files.data import synthetic_texts

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
    from causalqwen.files.data import synthetic_texts

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
