"""A bfloat16 base, converted and trained: the small new parameters move as they do in float32.

A bfloat16 weight w moves only when an update exceeds half its spacing, 2**(floor(log2|w|) - 8) (8 significant
bits). AdamW's first updates are about the learning rate, so at the command line's 1e-4 the diagonal of W_loc (1.0:
half spacing 2**-9 below 1), b_scale (-2.25: 2**-7) and b_noise (0.1: 2**-12 = 2.4e-4) never move when AdamW runs
on bfloat16 weights. The oracle of every run here is the same steps run on the float32 model (the bfloat16 weights
upcast, which is exact)."""

import json

import pytest
import torch
from safetensors import safe_open

from causalqwen import CausalQwenForCausalLM, NumericTokenizer, train
from causalqwen.app import cli
from causalqwen.app.tiny import build_tiny_base
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.training import TrainingConfig

SMALL = ("action.b_noise", "model.abduction.b_scale", "model.abduction.W_loc")  # W_loc: its diagonal
STEPS, BATCH = 6, 4
# The bfloat16 runs: each update (at most about the learning rate) is below half a spacing of b_scale, 2**-7, and
# the cosine schedule's updates add up to more than one spacing, 2**-6.
BF16_STEPS, BF16_RATE = 10, 5e-3


def _small_parameters(model) -> dict[str, torch.Tensor]:
    """b_noise, b_scale and diag(W_loc), as float32 copies."""
    named = dict(model.named_parameters())
    small = {name: named[name].detach().float().clone() for name in SMALL}
    small["model.abduction.W_loc"] = small["model.abduction.W_loc"].diagonal().clone()
    return small


def _bf16_spacing(values: torch.Tensor) -> torch.Tensor:
    """The distance from each value to the next bfloat16 away from zero: 2**(floor(log2|v|) - 7)."""
    return torch.exp2(torch.floor(torch.log2(values.abs())) - 7)


def _dtypes_in(file) -> set[str]:
    with safe_open(str(file), "pt") as handle:
        return {handle.get_slice(name).get_dtype() for name in handle.keys()}


def _jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return str(path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A bfloat16 Qwen2 base (the tiny one, cast) saved to a directory, and its ``causalqwen convert`` output."""
    root = tmp_path_factory.mktemp("bf16")
    base, hf_tokenizer = build_tiny_base(seed=0)
    base.to(torch.bfloat16).save_pretrained(root / "base")
    hf_tokenizer.save_pretrained(root / "base")
    assert cli.main(["convert", "--base", str(root / "base"), "--out", str(root / "converted")]) == 0
    return root


def _float32_run(directory, texts, steps, learning_rate):
    """The float32 oracle: the saved model upcast (exact) and trained the CLI's way with the same settings."""
    model = CausalQwenForCausalLM.from_pretrained(directory).float()
    tokenizer = NumericTokenizer.from_pretrained(directory)
    config = TrainingConfig(steps=steps, batch_size=BATCH, learning_rate=learning_rate, weight_decay=0.01, seed=0)
    train(model, TextDataset(texts, tokenizer, 512), config, progress=False)
    return model


def _check_as_float32_rounded(trained: dict, oracle: dict, start: dict) -> None:
    r"""Each trained bfloat16 value is the float32 run's within half a spacing (the rounding to bfloat16) plus 1%
    of how far float32 moved it: the bfloat16 forward changes each gradient by about 2**-8 of itself, and AdamW's
    update m / sqrt(v) does not depend on the gradients' scale, so the float32 master weights follow the float32
    run closely (0.07% of the movement, measured). Where float32 moved a value by more than a spacing, it moved."""
    for name, value in trained.items():
        moved = (oracle[name] - start[name]).abs()
        assert ((value - oracle[name]).abs() <= _bf16_spacing(value) / 2 + moved / 100).all(), name
        far = moved > _bf16_spacing(start[name])
        assert far.any(), f"{name}: the settings move nothing by a spacing"
        assert (value[far] != start[name][far]).all(), f"{name} did not move where float32 moved it"


def test_convert_keeps_the_bases_bfloat16_by_default_and_casts_to_the_dtype_asked(converted, tmp_path, capsys):
    assert json.loads((converted / "converted" / "config.json").read_text())["dtype"] == "bfloat16"
    assert _dtypes_in(converted / "converted" / "model.safetensors") == {"BF16"}
    assert (
        cli.main(["convert", "--base", str(converted / "base"), "--out", str(tmp_path / "f32"), "--dtype", "float32"])
        == 0
    )
    assert "float32) written to" in capsys.readouterr().out
    assert _dtypes_in(tmp_path / "f32" / "model.safetensors") == {"F32"}
    bf16 = CausalQwenForCausalLM.from_pretrained(converted / "converted")
    f32 = CausalQwenForCausalLM.from_pretrained(tmp_path / "f32")
    assert bf16.dtype == torch.bfloat16 and f32.dtype == torch.float32
    assert f32.config.ovr_threshold == bf16.config.ovr_threshold  # one conversion, stored in another dtype
    for (name, a), (_, b) in zip(bf16.state_dict().items(), f32.state_dict().items()):
        assert torch.equal(a.float(), b), name  # bfloat16 -> float32 is exact


def test_cli_training_of_a_bfloat16_checkpoint_moves_the_small_parameters_as_float32_does(converted, tmp_path):
    """The command line's defaults (--dtype float32, --learning-rate 1e-4): every update is below half a bfloat16
    spacing of these parameters, and model/ holds the float32 run's parameters bit for bit (the same arithmetic)."""
    texts = synthetic_texts(24, seed=0)
    data = _jsonl(tmp_path / "train.jsonl", texts)
    start = _small_parameters(CausalQwenForCausalLM.from_pretrained(converted / "converted"))
    assert (
        cli.main(
            [
                "train",
                "--base",
                str(converted / "converted"),
                "--data",
                data,
                "--out",
                str(tmp_path / "run"),
                "--steps",
                str(STEPS),
                "--batch-size",
                str(BATCH),
            ]
        )
        == 0
    )
    assert _dtypes_in(tmp_path / "run" / "model" / "model.safetensors") == {"F32"}
    trained = CausalQwenForCausalLM.from_pretrained(tmp_path / "run" / "model")
    oracle = _float32_run(converted / "converted", texts, STEPS, 1e-4)
    for name, value in _small_parameters(trained).items():
        assert (value != start[name]).all(), f"{name} did not move"
        assert 1e-4 < _bf16_spacing(start[name]).min() / 2  # an update of about 1e-4 rounds away in bfloat16
        assert torch.equal(value, _small_parameters(oracle)[name]), name


def test_cli_training_in_bfloat16_keeps_float32_master_weights_and_writes_bfloat16(converted, tmp_path, caplog):
    """--dtype bfloat16 at a learning rate whose updates are below half a spacing of b_scale (-2.25: 2**-7) but add
    up to more than one: model/ is bfloat16 and holds the float32 run's values rounded to bfloat16."""
    texts = synthetic_texts(24, seed=0)
    data = _jsonl(tmp_path / "train.jsonl", texts)
    start = _small_parameters(CausalQwenForCausalLM.from_pretrained(converted / "converted"))
    with caplog.at_level("WARNING", logger="causalqwen.training"):
        assert (
            cli.main(
                [
                    "train",
                    "--base",
                    str(converted / "converted"),
                    "--data",
                    data,
                    "--out",
                    str(tmp_path / "run"),
                    "--steps",
                    str(BF16_STEPS),
                    "--batch-size",
                    str(BATCH),
                    "--learning-rate",
                    str(BF16_RATE),
                    "--dtype",
                    "bfloat16",
                ]
            )
            == 0
        )
    assert "in float32 (master weights" in caplog.text
    assert _dtypes_in(tmp_path / "run" / "model" / "model.safetensors") == {"BF16"}
    trained = _small_parameters(CausalQwenForCausalLM.from_pretrained(tmp_path / "run" / "model"))
    _check_as_float32_rounded(
        trained, _small_parameters(_float32_run(converted / "converted", texts, BF16_STEPS, BF16_RATE)), start
    )


def test_a_bfloat16_run_whose_rounding_erases_the_training_names_the_parameters(converted, tmp_path, caplog):
    """At the command line's learning rate (1e-4) for 4 steps, b_noise, b_scale and diag(W_loc) move in float32 by
    less than half their bfloat16 spacing: model/ holds them at their start, and a warning names them."""
    data = _jsonl(tmp_path / "train.jsonl", synthetic_texts(24, seed=0))
    start = _small_parameters(CausalQwenForCausalLM.from_pretrained(converted / "converted"))
    with caplog.at_level("WARNING", logger="causalqwen.training"):
        assert (
            cli.main(
                [
                    "train",
                    "--base",
                    str(converted / "converted"),
                    "--data",
                    data,
                    "--out",
                    str(tmp_path / "run"),
                    "--steps",
                    "4",
                    "--batch-size",
                    str(BATCH),
                    "--dtype",
                    "bfloat16",
                    "--warmup-steps",
                    "0",
                ]
            )
            == 0
        )
    trained = _small_parameters(CausalQwenForCausalLM.from_pretrained(tmp_path / "run" / "model"))
    assert all(torch.equal(trained[name], start[name]) for name in ("action.b_noise", "model.abduction.b_scale"))
    erased = [record.getMessage() for record in caplog.records if "erased all the training" in record.getMessage()]
    assert len(erased) == 1 and "action.b_noise" in erased[0] and "model.abduction.b_scale" in erased[0]
    assert "--dtype float32" in erased[0]


def test_python_training_of_a_bfloat16_model_uses_float32_master_weights_and_keeps_its_dtype(converted, caplog):
    texts = synthetic_texts(24, seed=0)
    model = CausalQwenForCausalLM.from_pretrained(converted / "converted")
    tokenizer = NumericTokenizer.from_pretrained(converted / "converted")
    start = _small_parameters(model)
    config = TrainingConfig(steps=BF16_STEPS, batch_size=BATCH, learning_rate=BF16_RATE, weight_decay=0.01, seed=0)
    with caplog.at_level("WARNING", logger="causalqwen.training"):
        train(model, TextDataset(texts, tokenizer, 512), config, progress=False)
    assert "trainable bfloat16 parameters" in caplog.text and "model.float()" in caplog.text
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    _check_as_float32_rounded(
        _small_parameters(model),
        _small_parameters(_float32_run(converted / "converted", texts, BF16_STEPS, BF16_RATE)),
        start,
    )


def test_a_bfloat16_run_resumes_bit_exactly_and_an_interrupted_one_keeps_its_dtype(
    converted, tmp_path, killed_after_first_save
):
    texts = synthetic_texts(24, seed=0)
    tokenizer = NumericTokenizer.from_pretrained(converted / "converted")
    config = TrainingConfig(steps=4, batch_size=BATCH, learning_rate=5e-3, save_every=2, seed=0)

    def model():
        return CausalQwenForCausalLM.from_pretrained(converted / "converted")

    uninterrupted = model()
    train(uninterrupted, TextDataset(texts, tokenizer, 512), config, out_dir=str(tmp_path / "a"), progress=False)
    interrupted = model()
    with killed_after_first_save():
        train(interrupted, TextDataset(texts, tokenizer, 512), config, out_dir=str(tmp_path / "b"), progress=False)
    assert {parameter.dtype for parameter in interrupted.parameters()} == {torch.bfloat16}
    # the checkpoint holds the float32 master weights of the trained parameters
    assert _dtypes_in(tmp_path / "b" / "checkpoint-2" / "model.safetensors") == {"BF16", "F32"}
    resumed = model()
    train(resumed, TextDataset(texts, tokenizer, 512), config, out_dir=str(tmp_path / "b"), resume=True, progress=False)
    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), name


def test_float16_is_refused_by_name_before_anything_is_written(converted, tmp_path, capsys):
    texts = synthetic_texts(8, seed=0)
    data = _jsonl(tmp_path / "train.jsonl", texts)
    for argv, message in [
        (["--dtype", "float16"], "--dtype float16 cannot train: float16 gradients need loss scaling"),
    ]:
        with pytest.raises(SystemExit) as exited:
            cli.main(
                ["train", "--base", str(converted / "converted"), "--data", data, "--out", str(tmp_path / "run"), *argv]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and message in err[-1], err
        assert not (tmp_path / "run").exists()
    assert (
        cli.main(["convert", "--base", str(converted / "base"), "--out", str(tmp_path / "f16"), "--dtype", "float16"])
        == 0
    )
    assert _dtypes_in(tmp_path / "f16" / "model.safetensors") == {"F16"}
    with pytest.raises(SystemExit) as exited:  # --dtype auto: the checkpoint's float16
        cli.main(
            [
                "train",
                "--base",
                str(tmp_path / "f16"),
                "--data",
                data,
                "--out",
                str(tmp_path / "run"),
                "--dtype",
                "auto",
                "--batch-size",
                "4",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and "float16 parameters (model.embed_tokens.weight" in err[-1], err
    assert "--dtype float32" in err[-1] and not (tmp_path / "run").exists()

    half = CausalQwenForCausalLM.from_pretrained(tmp_path / "f16")
    before = {name: value.clone() for name, value in half.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=r"float16 parameters \(model\.embed_tokens\.weight, .* and \d+ more\).*"
        r"model\.float\(\)",
    ):
        train(
            half,
            TextDataset(texts, NumericTokenizer.from_pretrained(tmp_path / "f16"), 512),
            TrainingConfig(steps=1, batch_size=4),
            out_dir=str(tmp_path / "run"),
            progress=False,
        )
    assert not (tmp_path / "run").exists()
    assert all(torch.equal(value, before[name]) for name, value in half.state_dict().items())


def test_the_dtype_option_names_its_choices(tmp_path, capsys):
    for command in (
        ["convert", "--base", "tiny", "--out", str(tmp_path / "c")],
        ["train", "--base", "tiny", "--data", "d.jsonl", "--out", str(tmp_path / "t")],
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main([*command, "--dtype", "float64"])
        err = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and "argument --dtype: invalid choice: 'float64'" in err[-1]
        assert "float32" in err[-1] and "bfloat16" in err[-1] and "auto" in err[-1]
    assert not (tmp_path / "c").exists() and not (tmp_path / "t").exists()


def test_the_loader_refuses_a_dtype_it_does_not_know_by_name():
    from causalqwen.app.commands import load_model_and_tokenizer

    for wrong in ("float64", "bf16", torch.bfloat16, None):
        with pytest.raises(ValueError, match=r"dtype must be one of float32, bfloat16, float16, auto, got "):
            load_model_and_tokenizer("tiny", dtype=wrong)
    model, _ = load_model_and_tokenizer("tiny", dtype="bfloat16")
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
