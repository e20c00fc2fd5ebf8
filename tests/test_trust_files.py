"""Trust boundaries of files: the files causalqwen writes and the files it reads back.

- **Links.** Nothing is written through a symbolic link (nor into a hard-linked file): the lock, the marker,
  the run's logs and checkpoints, ``save_pretrained``'s files, the tokenizer's, the adapter's, the abduction
  network's, the demo's plots. A planted link is an ``OSError`` naming it, and what it points to keeps its
  content.
- **Values.** Every loader applies one check (`causalqwen.files.checkpoint.value_problem`): floating point where a
  float belongs, and finite in the dtype the tensor is loaded into -- a float64 1e300 is finite in the file and
  inf in a float32 parameter. The error names the file and the tensor.
- **Settings.** A saved LoRA config passes the checks `add_lora` makes (one function); a saved model config
  names its ``<NUM>`` id and sizes.
"""

import codecs
import json
import math
import os
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from causalqwen import CausalQwenForCausalLM, NumericTokenizer, load_abduction, save_abduction, train, training
from causalqwen.app import cli, runs
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.configuration import CausalQwenConfig
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.files.rundir import (
    LOCK,
    MARKER,
    RunDirectory,
    check_write_targets,
    open_for_writing,
)
from causalqwen.integrations.lora import add_lora, load_lora, save_lora
from causalqwen.training import TrainingConfig

SECRET = "a file outside the run directory\n"


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model, tokenizer


def _model():
    return build_tiny_causal_lm(seed=0, init_seed=0).model


def _data(tokenizer, n=24):
    return TextDataset(synthetic_texts(n, seed=0), tokenizer, max_length=32)


CONFIG = dict(
    steps=2,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=1,
    preset="all",
    eval_every=2,
    save_every=2,
    log_every=1,
    seed=0,
)


def _outside(tmp_path, name="secret.txt"):
    """A file outside every directory the tests write into, with known content."""
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir(exist_ok=True)
    target.write_text(SECRET)
    return target


@pytest.fixture(scope="module")
def finished_run(tiny, tmp_path_factory):
    """A two-step training run (preset all, with the divergence bound) with its checkpoint-2."""
    out = tmp_path_factory.mktemp("runs") / "run"
    train(
        _model(), _data(tiny[1]), TrainingConfig(**CONFIG | {"max_u_divergence": 1.0}), out_dir=str(out), progress=False
    )
    assert sorted(os.listdir(out / "checkpoint-2")) == [
        "causalqwen_auto.py",
        "checkpoint_files.json",
        "config.json",
        "divergence_bound.json",
        "divergence_reference.safetensors",
        "generation_config.json",
        "history.json",
        "model.safetensors",
        "trainer_state.json",
        "training_state.safetensors",
    ]
    return out


def _run_copy(finished_run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(finished_run, target, symlinks=True)
    return target


def _resume(tokenizer, out, **overrides):
    config = TrainingConfig(**CONFIG | {"max_u_divergence": 1.0, "steps": 4} | overrides)
    return train(
        _model(), _data(tokenizer), config, out_dir=str(out), resume=True, progress=False, allow_changed_settings=True
    )


# =============================================================================================
# Links: the run directory
# =============================================================================================


def test_a_planted_lock_link_is_refused_and_its_target_keeps_its_content(tiny, tmp_path):
    out, secret = tmp_path / "run", _outside(tmp_path)
    out.mkdir()
    os.symlink(secret, out / LOCK)  # the directory counts as empty: only the lock is there
    with pytest.raises(OSError, match=rf"'{out / LOCK}' is a symbolic link; causalqwen never writes through a link"):
        RunDirectory.claim(out, "train")
    with pytest.raises(OSError, match=r"\.causalqwen\.lock' is a symbolic link"):
        train(_model(), _data(tiny[1]), TrainingConfig(**CONFIG), out_dir=str(out), progress=False)
    assert secret.read_text() == SECRET
    assert os.listdir(out) == [LOCK] and os.path.islink(out / LOCK)  # the link is left as it was, nothing written


def test_the_train_command_refuses_a_planted_lock_link(tiny, tmp_path, capsys):
    from causalqwen.app import cli

    base, data, out, secret = tmp_path / "base", tmp_path / "train.jsonl", tmp_path / "out", _outside(tmp_path)
    tiny[0].save_pretrained(base)
    tiny[1].save_pretrained(base)
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in synthetic_texts(8, seed=0)))
    out.mkdir()
    os.symlink(secret, out / LOCK)
    with pytest.raises(SystemExit) as exited:
        cli.main(
            ["train", "--base", str(base), "--data", str(data), "--out", str(out), "--steps", "1", "--batch-size", "2"]
        )
    assert exited.value.code == 2
    assert f"'{out / LOCK}' is a symbolic link" in capsys.readouterr().err.strip().splitlines()[-1]
    assert secret.read_text() == SECRET


@pytest.mark.parametrize("name", ["metrics.jsonl", "training_config.json", "checkpoint-4", "checkpoint-4.partial"])
def test_a_resumed_run_never_writes_through_a_planted_link(tiny, finished_run, tmp_path, name):
    out = _run_copy(finished_run, tmp_path)
    secret = _outside(tmp_path)
    if name.startswith("checkpoint"):
        secret = secret.parent / "dir"  # a directory outside, with a file in it
        secret.mkdir()
        (secret / "keep.txt").write_text(SECRET)
    if (out / name).exists():
        os.remove(out / name)
    os.symlink(secret, out / name)
    with pytest.raises(OSError, match=rf"'{out / name}' is a symbolic link"):
        _resume(tiny[1], out)
    if name.startswith("checkpoint"):
        assert os.listdir(secret) == ["keep.txt"] and (secret / "keep.txt").read_text() == SECRET
    else:
        assert secret.read_text() == SECRET
    assert os.path.islink(out / name)


def test_a_checkpoint_directory_that_is_a_link_is_not_resumed_from(tiny, finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    elsewhere = tmp_path / "elsewhere-checkpoint"
    os.rename(out / "checkpoint-2", elsewhere)
    os.symlink(elsewhere, out / "checkpoint-2")
    with pytest.raises(OSError, match=rf"'{out / 'checkpoint-2'}' is a symbolic link"):
        _resume(tiny[1], out)


def test_a_hard_linked_metrics_file_is_refused(tiny, finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    secret = _outside(tmp_path)
    os.remove(out / "metrics.jsonl")
    os.link(secret, out / "metrics.jsonl")
    with pytest.raises(OSError, match=r"metrics\.jsonl' has 2 hard links"):
        _resume(tiny[1], out)
    assert secret.read_text() == SECRET


def test_overwrite_removes_only_what_the_run_recorded_and_names_what_it_keeps(tmp_path, caplog):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"item {i} costs {i}.5"}) + "\n" for i in range(4)))
    out = tmp_path / "run"
    args = ["train", "--base", "tiny", "--data", str(data), "--out", str(out), "--batch-size", "2", "--save-every", "1"]
    assert cli.main(args + ["--steps", "3", "--save-total-limit", "0"]) == 0
    (out / "model" / "notes.txt").write_text("mine")
    (out / "checkpoint-best").mkdir()
    (out / "checkpoint-best" / "model.safetensors").write_text("my own best model")
    (out / "checkpoint-2" / "notes.txt").write_text("mine")
    kept_checkpoint = sorted(os.listdir(out / "checkpoint-2"))
    with caplog.at_level("WARNING"):
        assert cli.main(args + ["--steps", "1", "--overwrite"]) == 0
    assert (out / "model" / "notes.txt").read_text() == "mine"
    assert (out / "checkpoint-best" / "model.safetensors").read_text() == "my own best model"
    assert sorted(os.listdir(out / "checkpoint-2")) == kept_checkpoint  # kept whole, as save_total_limit keeps it
    assert not (out / "checkpoint-3").exists()  # the run's own files only: removed
    assert json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["step"] == 1
    CausalQwenForCausalLM.from_pretrained(out / "model")  # the new run's model, beside the user's notes
    warning = " ".join(record.getMessage() for record in caplog.records if record.levelname == "WARNING")
    for kept in ("model'", "notes.txt", "checkpoint-best'", "checkpoint-2'", "--overwrite kept"):
        assert kept in warning, kept
    recorded = json.loads((out / "model" / runs.CHECKPOINT_RECORD).read_text())["files"]
    assert "notes.txt" not in recorded and "model.safetensors" in recorded  # a later overwrite keeps the notes too


def test_open_for_writing_refuses_links_and_stays_inside_its_root(tmp_path):
    secret = _outside(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(secret, root / MARKER)
    for mode in ("w", "a", "wb", "ab"):
        with pytest.raises(OSError, match=rf"'{root / MARKER}' is a symbolic link"):
            open_for_writing(root / MARKER, mode)
    os.symlink(secret.parent, root / "model")  # a linked directory between the root and the file
    with pytest.raises(OSError, match=rf"'{root / 'model'}' is a symbolic link"):
        open_for_writing(root / "model" / "config.json", root=root)
    with pytest.raises(OSError, match="lies outside the run directory"):
        open_for_writing(tmp_path / "x.json", root=root)
    os.mkfifo(root / "fifo")
    with pytest.raises(OSError, match=r"fifo' exists and is not a regular file"):
        open_for_writing(root / "fifo")
    assert secret.read_text() == SECRET and sorted(os.listdir(secret.parent)) == ["secret.txt"]
    with open_for_writing(root / "plain.txt") as handle:  # an ordinary file: written, then truncated on rewrite
        handle.write("first, longer")
    with open_for_writing(root / "plain.txt") as handle:
        handle.write("second")
    with open_for_writing(root / "plain.txt", "a") as handle:
        handle.write("!")
    assert (root / "plain.txt").read_text() == "second!"


class _Interrupted(codecs.IncrementalEncoder):
    """An encoder whose construction is a Ctrl-C: the moment inside ``open`` after the descriptor has an owner."""

    def __init__(self, errors="strict"):
        raise KeyboardInterrupt


def _interrupting_codec(name):
    return codecs.CodecInfo(codecs.utf_8_encode, codecs.utf_8_decode, incrementalencoder=_Interrupted, name=name)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_ctrl_c_while_a_file_is_being_opened_stays_a_ctrl_c_and_closes_the_file_once(tmp_path):
    # A Ctrl-C that lands while the text layer is built used to close the descriptor twice: the second
    # close was an OSError (EBADF) that replaced the KeyboardInterrupt, and `causalqwen train` exited 2, not 130.
    codecs.register(_interrupting_codec)
    try:
        before = _open_descriptors()
        for mode in ("w", "a"):
            with pytest.raises(KeyboardInterrupt):
                open_for_writing(tmp_path / "metrics.jsonl", mode, encoding="interrupting_codec")
        assert _open_descriptors() == before
    finally:
        codecs.unregister(_interrupting_codec)


def test_the_demo_plots_are_never_written_through_a_link(tmp_path):
    pytest.importorskip("matplotlib")
    from causalqwen.app.demo import _plots

    secret = _outside(tmp_path, "plot.png")
    os.symlink(secret, tmp_path / "loss.png")
    history = [{"step": step, "train/total_loss": 1.0 / step, "eval/accuracy": 0.5} for step in (1, 2)]
    with pytest.raises(OSError, match=r"loss\.png' is a symbolic link"):
        _plots(history, str(tmp_path))
    assert secret.read_text() == SECRET
    os.remove(tmp_path / "loss.png")
    assert _plots(history, str(tmp_path)) == [str(tmp_path / "loss.png"), str(tmp_path / "metrics.png")]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# =============================================================================================
# Links: save_pretrained and the other savers
# =============================================================================================


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "generation_config.json", "causalqwen_auto.py"])
def test_model_save_pretrained_refuses_a_planted_link(tiny, tmp_path, name):
    target, secret = tmp_path / "model", _outside(tmp_path)
    target.mkdir()
    os.symlink(secret, target / name)
    with pytest.raises(OSError, match=rf"'{target / name}': symbolic link where causalqwen is about to write"):
        tiny[0].save_pretrained(target)
    assert secret.read_text() == SECRET and os.listdir(target) == [name]


def test_save_directories_that_are_links_are_refused(tiny, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "model")
    peft_model = add_lora(build_tiny_causal_lm(seed=0, init_seed=0).model, rank=2)
    for save in (
        tiny[0].save_pretrained,
        tiny[1].save_pretrained,
        lambda path: save_lora(peft_model, path),
        lambda path: save_abduction(tiny[0], path),
    ):
        with pytest.raises(OSError, match=rf"'{tmp_path / 'model'}' is a symbolic link"):
            save(tmp_path / "model")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize(
    "saver, name",
    [
        ("tokenizer", "tokenizer_config.json"),
        ("tokenizer", "tokenizer.json"),
        ("lora", "adapter_model.safetensors"),
        ("lora", "adapter_config.json"),
        ("lora", "README.md"),
        ("abduction", "abduction.safetensors"),
        ("abduction", "abduction.safetensors.tmp"),
    ],
)
def test_the_other_savers_refuse_a_planted_link(tiny, tmp_path, saver, name):
    target, secret = tmp_path / "out", _outside(tmp_path)
    target.mkdir()
    os.symlink(secret, target / name)
    save = {
        "tokenizer": tiny[1].save_pretrained,
        "lora": lambda path: save_lora(add_lora(_model(), rank=2), path),
        "abduction": lambda path: save_abduction(tiny[0], path),
    }[saver]
    with pytest.raises(OSError, match=rf"'{target / name}': symbolic link where causalqwen is about to write"):
        save(target)
    assert secret.read_text() == SECRET and os.listdir(target) == [name]


def test_a_hard_linked_weight_file_is_refused_before_saving(tiny, tmp_path):
    target, secret = tmp_path / "model", _outside(tmp_path)
    target.mkdir()
    os.link(secret, target / "model.safetensors")
    with pytest.raises(OSError, match=r"model\.safetensors' has 2 hard links"):
        tiny[0].save_pretrained(target)
    assert secret.read_text() == SECRET


def test_tokenizer_save_pretrained_onto_a_file_names_the_path(tiny, tmp_path):
    file = tmp_path / "tokenizer"
    file.write_text(SECRET)
    with pytest.raises(OSError, match=rf"'{file}' exists and is not a directory"):
        tiny[1].save_pretrained(file)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        tiny[1].save_pretrained(3)
    assert file.read_text() == SECRET
    saved = tiny[1].save_pretrained(tmp_path / "fine")  # an ordinary directory still works
    assert sorted(os.path.basename(name) for name in saved) == [
        "causalqwen_auto.py",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert NumericTokenizer.from_pretrained(tmp_path / "fine").num_token_id == tiny[1].num_token_id


def test_check_write_targets_only_looks_at_the_names_it_is_given(tmp_path):
    secret = _outside(tmp_path)
    os.symlink(secret, tmp_path / "data.jsonl")  # a user's link beside the outputs: not a name that is written
    check_write_targets(tmp_path, ("config.json", "model*.safetensors"))
    os.symlink(secret, tmp_path / "model-00001-of-00002.safetensors")
    with pytest.raises(OSError, match=r"model-00001-of-00002\.safetensors'"):
        check_write_targets(tmp_path, ("config.json", "model*.safetensors"))


# =============================================================================================
# Values: one check in every loader (floating point, finite in the loaded dtype)
# =============================================================================================


def _with_tensor(file, name, value):
    """Rewrite one tensor of the safetensors ``file`` (its metadata kept)."""
    from safetensors import safe_open

    with safe_open(file, framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(file)
    tensors[name] = value(tensors[name])
    save_file(tensors, file, metadata=metadata)


def _huge(tensor):
    return torch.full(tensor.shape, 1e300, dtype=torch.float64)


def test_from_pretrained_refuses_a_float64_beyond_float32(tiny, tmp_path):
    tiny[0].save_pretrained(tmp_path)
    _with_tensor(tmp_path / "model.safetensors", "action.b_noise", _huge)
    with pytest.raises(OSError, match=r"action\.b_noise holds NaN or ±inf values"):  # inf once cast to float32
        CausalQwenForCausalLM.from_pretrained(tmp_path)


def test_load_abduction_refuses_a_float64_beyond_float32(tiny, tmp_path):
    path = save_abduction(tiny[0], tmp_path)
    _with_tensor(path, "b_loc", _huge)
    target = _model()
    before = target.model.abduction.b_loc.detach().clone()
    with pytest.raises(ValueError, match=rf"'{path}': tensor b_loc holds 1e\+300, beyond the range of float32"):
        load_abduction(target, tmp_path)
    assert torch.equal(target.model.abduction.b_loc, before)
    _with_tensor(path, "b_loc", lambda t: torch.full(t.shape, 0.25, dtype=torch.float64))  # in range: loaded
    load_abduction(target, tmp_path)
    assert torch.equal(target.model.abduction.b_loc, torch.full_like(before, 0.25))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    path = tmp_path_factory.mktemp("adapter")
    save_lora(add_lora(_model(), rank=2), path)
    return path


def _adapter_copy(adapter, tmp_path):
    target = tmp_path / "adapter"
    shutil.copytree(adapter, target)
    return target


def test_load_lora_refuses_a_float64_beyond_float32(adapter, tmp_path):
    path = _adapter_copy(adapter, tmp_path)
    weights = path / "adapter_model.safetensors"
    name = next(key for key in load_file(weights) if key.endswith("lora_A.weight"))
    _with_tensor(weights, name, _huge)
    model = _model()
    with pytest.raises(
        ValueError, match=rf"the adapter '{weights}' .*{name} holds 1e\+300, beyond the range of float32"
    ):
        load_lora(model, path)
    assert not any(hasattr(module, "lora_A") for module in model.modules())


@pytest.mark.parametrize(
    "file, tensor, value, message",
    [
        ("model.safetensors", "action.b_noise", _huge, r"action\.b_noise holds 1e\+300, beyond the range of float32"),
        (
            "training_state.safetensors",
            "optimizer.0.exp_avg",
            _huge,
            r"optimizer\.0\.exp_avg holds 1e\+300, beyond the range of float32",
        ),
        (
            "training_state.safetensors",
            "optimizer.0.exp_avg",
            lambda t: t.long(),
            r"optimizer\.0\.exp_avg is stored as torch\.int64, not a floating-point tensor",
        ),
        (
            "training_state.safetensors",
            "optimizer.0.exp_avg_sq",
            lambda t: -torch.ones_like(t),
            r"optimizer\.0\.exp_avg_sq holds negative values",
        ),
        (
            "training_state.safetensors",
            "optimizer.0.step",
            lambda t: torch.tensor(-3.0),
            r"optimizer\.0\.step holds negative values",
        ),
        (
            "training_state.safetensors",
            "rng.torch",
            lambda t: t.double(),
            r"rng\.torch is stored as torch\.float64, not torch\.uint8",
        ),
        (
            "training_state.safetensors",
            "rng.numpy",
            lambda t: t - 2**40,
            r"rng\.numpy holds values outside \[0, 2\*\*32\)",
        ),
        (
            "divergence_reference.safetensors",
            "abduction.W_loc",
            lambda t: t.long(),
            r"abduction\.W_loc is stored as torch\.int64, not a floating-point tensor",
        ),
        (
            "divergence_reference.safetensors",
            "abduction.b_scale",
            lambda t: torch.full_like(t, float("nan")),
            r"abduction\.b_scale holds NaN or ±inf values",
        ),
        (
            "divergence_reference.safetensors",
            "abduction.b_loc",
            _huge,
            r"abduction\.b_loc holds 1e\+300, beyond the range of float32",
        ),
    ],
)
def test_resume_checks_every_tensor_it_reads_and_names_the_file(
    tiny, finished_run, tmp_path, file, tensor, value, message
):
    out = _run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / file
    _with_tensor(path, tensor, value)
    with pytest.raises(
        OSError, match=rf"{re.escape(str(path))}'?(: | do(es)? not fit (this run|the model): ).*{message}"
    ):
        _resume(tiny[1], out)


def test_resume_refuses_a_tensor_the_training_state_does_not_hold(tiny, finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / "training_state.safetensors"
    tensors = load_file(path)
    save_file(tensors | {"rng.extra": torch.zeros(3)}, path)
    with pytest.raises(OSError, match=rf"'{path}' does not fit this run: rng\.extra is not a tensor of a causalqwen"):
        _resume(tiny[1], out)
    save_file({key: value for key, value in tensors.items() if key != "optimizer.1.exp_avg_sq"}, path)
    with pytest.raises(
        OSError, match=r"optimizer\.1 holds \['exp_avg', 'step'\], AdamW keeps \['exp_avg', 'exp_avg_sq', 'step'\]"
    ):
        _resume(tiny[1], out)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda record: record["optimizer_param_groups"][0].update(lr=float("nan")), "NaN is not a number"),
        (
            lambda record: record["optimizer_param_groups"][0].update(lr="0.1"),
            r"optimizer_param_groups\[0\]\.lr is a str, this run's is a number",
        ),
        (lambda record: record["scheduler"].update(base_lrs=[1e400, 1e400]), "1e400 is beyond the range of a float"),
    ],
)
def test_resume_refuses_non_finite_or_mistyped_numbers_in_the_trainer_state(
    tiny, finished_run, tmp_path, edit, message
):
    out = _run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / "trainer_state.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record).replace("1e+400", "1e400").replace("Infinity", "1e400"))
    with pytest.raises(OSError, match=rf"'{path}'.*{message}"):
        _resume(tiny[1], out)


@pytest.mark.parametrize(
    "field, value", [("last_divergence", "x"), ("last_divergence", float("nan")), ("multiplier", float("inf"))]
)
def test_resume_refuses_a_bound_state_that_is_not_a_number(tiny, finished_run, tmp_path, field, value):
    out = _run_copy(finished_run, tmp_path)
    path = out / "checkpoint-2" / "divergence_bound.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {field: value}))
    with pytest.raises(OSError, match=rf"divergence_bound\.json holds (no multiplier >= 0|last_divergence {value!r})"):
        _resume(tiny[1], out)


def test_value_problem_checks_the_range_of_the_dtype_a_tensor_is_loaded_into():
    from causalqwen.files.checkpoint import value_problem

    assert (
        value_problem("w", torch.tensor([1e300, -2.0], dtype=torch.float64), torch.float32)
        == "w holds 1e+300, beyond the range of float32 (largest 3.4e+38): it would become ±inf"
    )
    assert value_problem("w", torch.tensor([3e38]), torch.float32) is None  # float32 into float32: in range
    assert value_problem("w", torch.tensor([7e4]), torch.float16).startswith(
        "w holds 7e+04, beyond the range of float16"
    )
    assert value_problem("w", torch.tensor([7e4]), torch.bfloat16) is None
    assert value_problem("w", torch.tensor([1e-300], dtype=torch.float64), torch.float32) is None  # rounds, not refused
    assert (
        value_problem("w", torch.tensor([1, 2]), torch.float32)
        == "w is stored as torch.int64, not a floating-point tensor"
    )
    assert (
        value_problem("w", torch.tensor([True]), torch.float32)
        == "w is stored as torch.bool, not a floating-point tensor"
    )
    assert value_problem("w", torch.tensor([float("-inf")]), torch.float32) == "w holds NaN or ±inf values"
    assert value_problem("w", torch.empty(0, dtype=torch.float64), torch.float32) is None


def test_an_untouched_run_still_resumes_to_the_end(tiny, finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    history = _resume(tiny[1], out)
    assert history[-1]["step"] == 4 and (out / "checkpoint-4" / "model.safetensors").is_file()
    assert sorted(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()) == [1, 2, 3, 4]


# =============================================================================================
# A saved LoRA config passes exactly the checks of add_lora
# =============================================================================================


def _edit_adapter_config(path, **fields):
    file = path / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update(fields)
    file.write_text(json.dumps(config))
    return file


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("lora_alpha", float("nan"), ValueError, "field lora_alpha must be finite, got nan"),
        ("lora_alpha", -16.0, ValueError, r"field lora_alpha must be > 0, got -16\.0"),
        ("lora_alpha", 0, ValueError, "field lora_alpha must be > 0, got 0"),
        ("lora_alpha", "16", TypeError, "field lora_alpha must be a number, got '16'"),
        ("r", 0, ValueError, "field r must be a positive int, got 0"),
        ("r", 2.5, TypeError, r"field r must be a positive int, got 2\.5"),
        ("lora_dropout", 1.0, ValueError, r"field lora_dropout must lie in \[0, 1\), got 1\.0"),
        ("target_modules", "lm_head", ValueError, "field target_modules must be a pattern that add_lora writes"),
        ("init_lora_weights", "pissa", ValueError, "field init_lora_weights must be true or false, got 'pissa'"),
        ("init_lora_weights", "corda", ValueError, "field init_lora_weights must be true or false, got 'corda'"),
        ("init_lora_weights", "olora", ValueError, "field init_lora_weights must be true or false, got 'olora'"),
        ("init_lora_weights", "loftq", ValueError, "field init_lora_weights must be true or false, got 'loftq'"),
        ("init_lora_weights", {"x": 1}, ValueError, "field init_lora_weights must be true or false"),
        ("use_rslora", True, ValueError, "field use_rslora is True, add_lora makes False"),
        ("use_dora", True, ValueError, "field use_dora is True, add_lora makes False"),
        ("alpha_pattern", {"q_proj": float("nan")}, ValueError, "field alpha_pattern is"),
        ("task_type", "CAUSAL_LM", ValueError, "field task_type is 'CAUSAL_LM', add_lora makes None"),
    ],
)
def test_load_lora_refuses_what_add_lora_refuses(adapter, tmp_path, field, value, error, message):
    path = _adapter_copy(adapter, tmp_path)
    file = _edit_adapter_config(path, **{field: value})
    model = _model()
    with pytest.raises(error, match=rf"'{file}'.*{message}"):
        load_lora(model, path)
    assert not any(hasattr(module, "lora_A") for module in model.modules())


def test_add_lora_and_load_lora_give_the_same_messages(tiny):
    for alpha, error, message in [
        (float("nan"), ValueError, "alpha must be finite, got nan"),
        (-16.0, ValueError, r"alpha must be > 0, got -16\.0"),
    ]:
        with pytest.raises(error, match=f"^{message}$"):
            add_lora(_model(), alpha=alpha)


def test_a_plain_init_lora_weights_loads_the_same_adapter(adapter, tmp_path, tiny):
    batch = tiny[1](["The price is 12.5 yuan and 3 cups."])
    reference = load_lora(_model(), adapter)(**batch).loc_U
    path = _adapter_copy(adapter, tmp_path)
    _edit_adapter_config(path, init_lora_weights=False, base_model_name_or_path="elsewhere", inference_mode=False)
    assert torch.equal(load_lora(_model(), path)(**batch).loc_U, reference)


# =============================================================================================
# A saved model config names its <NUM> id and its sizes
# =============================================================================================


@pytest.fixture(scope="module")
def saved_model(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny[0].save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "removed",
    ["num_token_id", "hidden_size", "vocab_size", "num_hidden_layers", "num_key_value_heads", "rope_parameters"],
)
def test_a_config_without_a_required_field_is_refused_naming_file_and_field(saved_model, tmp_path, removed):
    from transformers import AutoConfig

    target = tmp_path / "model"
    shutil.copytree(saved_model, target)
    config = json.loads((target / "config.json").read_text())
    del config[removed]
    (target / "config.json").write_text(json.dumps(config))
    field = "rope_parameters or rope_theta" if removed == "rope_parameters" else removed
    file = str(target / "config.json")
    for load in (
        CausalQwenConfig.from_pretrained,
        CausalQwenForCausalLM.from_pretrained,
        lambda path: CausalQwenConfig.from_json_file(path / "config.json"),
    ):
        with pytest.raises(ValueError, match=rf"^{file}: config field {field} missing \(or null\)"):
            load(target)
    with pytest.raises(
        ValueError, match=rf"^config field {field} missing"
    ):  # AutoConfig never tells the class the file
        AutoConfig.from_pretrained(target)


def test_a_null_num_token_id_is_refused_and_a_keyword_may_supply_it(saved_model, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(saved_model, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"num_token_id": None}))
    with pytest.raises(ValueError, match=r"config\.json: config field num_token_id missing \(or null\)"):
        CausalQwenConfig.from_pretrained(target)
    assert (
        CausalQwenConfig.from_pretrained(target, num_token_id=config["num_token_id"]).num_token_id
        == config["num_token_id"]
    )
    legacy = {k: v for k, v in config.items() if k != "rope_parameters"} | {"rope_theta": 5e5}
    (target / "config.json").write_text(json.dumps(legacy))  # the older spelling of the rotary base
    assert math.isclose(CausalQwenConfig.from_pretrained(target).rope_parameters["rope_theta"], 5e5)
    assert (
        CausalQwenConfig.from_pretrained(saved_model).to_dict()
        == CausalQwenConfig.from_dict(json.loads((saved_model / "config.json").read_text())).to_dict()
    )
    np.testing.assert_equal(CausalQwenConfig.from_pretrained(saved_model).num_token_id, config["num_token_id"])


# =============================================================================================
# Optimisation settings within float32, parameters finite before any save
# =============================================================================================


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"weight_decay": 1e300},
            r"weight_decay must be a finite number within float32's range \(at most 3\.40282e\+38\), "
            r"got 1e\+300",
        ),
        ({"learning_rate": 1e39}, r"learning_rate must be a finite number within float32's range .*got 1e\+39"),
        ({"learning_rate": 1e300}, r"learning_rate must be a finite number within float32's range .*got 1e\+300"),
        ({"max_grad_norm": 1e39}, r"max_grad_norm must be a finite number within float32's range .*got 1e\+39"),
        (
            {"learning_rate": 0.5, "weight_decay": 2.0},
            r"learning_rate \* weight_decay must be < 1 .* got learning_rate=0\.5 \* weight_decay=2\.0 = 1",
        ),
        ({"learning_rate": 1e-3, "weight_decay": 1e5}, r"learning_rate=0\.001 \* weight_decay=100000\.0 = 100"),
    ],
)
def test_optimisation_settings_beyond_float32_or_a_decay_factor_outside_0_1_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainingConfig(**CONFIG | overrides)


def test_settings_at_the_edges_are_accepted():
    TrainingConfig(**CONFIG | {"learning_rate": 0.5, "weight_decay": 1.999})  # decay factor 0.0005 > 0
    TrainingConfig(**CONFIG | {"learning_rate": 1e38, "weight_decay": 0.0, "max_grad_norm": 3e38})


def test_non_finite_parameters_are_never_saved(tiny, tmp_path, monkeypatch):
    original = torch.optim.AdamW.step

    def poisoned_step(self, *args, **kwargs):  # a step that leaves a NaN in a trained matrix, the loss still finite
        result = original(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("nan"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned_step)
    out = tmp_path / "run"
    config = TrainingConfig(**CONFIG | {"steps": 1, "save_every": 1})
    with pytest.raises(
        training.TrainingDiverged,
        match=r"training diverged by step 1: the parameter \S+ holds NaN or "
        r"±inf values, so neither a checkpoint nor the model is written",
    ):
        train(_model(), _data(tiny[1]), config, out_dir=str(out), progress=False)
    assert not any(name.startswith("checkpoint-") for name in os.listdir(out))
    with pytest.raises(training.TrainingDiverged, match="training diverged by step 1"):  # no out_dir: at the end
        train(_model(), _data(tiny[1]), config, progress=False)


# =============================================================================================
# Checkpoint names
# =============================================================================================


@pytest.mark.parametrize(
    "stray", ["checkpoint-0005", "checkpoint-007", "checkpoint-٣", "checkpoint-0", "checkpoint-05"]
)
def test_a_checkpoint_name_the_run_never_writes_is_refused_by_name(finished_run, tmp_path, stray):
    out = _run_copy(finished_run, tmp_path)
    (out / stray).mkdir()
    with pytest.raises(
        OSError,
        match=rf"'{re.escape(str(out / stray))}' is not a checkpoint name this run writes "
        r"\(checkpoint-<step>, the step in ASCII digits without leading zeros",
    ):
        runs.latest_checkpoint(str(out))


def test_a_checkpoint_name_that_is_a_file_is_refused(tiny, finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    (out / "checkpoint-9").write_text("not a checkpoint")
    with pytest.raises(OSError, match=rf"'{re.escape(str(out / 'checkpoint-9'))}' is not a directory"):
        runs.latest_checkpoint(str(out))
    with pytest.raises(OSError, match="is not a directory"):
        _resume(tiny[1], out)


def test_latest_checkpoint_returns_the_entry_it_found_and_ignores_other_names(finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    for name in ("checkpoint-10.partial", "checkpoint-x", "checkpoints", "checkpoint-"):
        (out / name).mkdir()
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-10")
    assert runs.latest_checkpoint(str(out)) == str(out / "checkpoint-10")  # numeric order, not by name
    assert runs.checkpoint_step("checkpoint-10") == 10
    assert [runs.checkpoint_step(n) for n in ("checkpoint-010", "checkpoint-٣", "checkpoint-0", "x-1")] == [None] * 4
    assert runs.latest_checkpoint(str(tmp_path / "missing")) is None


# =============================================================================================
# A trainer_state that contradicts its own checkpoint
# =============================================================================================


def _edit_state(out, edit):
    path = out / "checkpoint-2" / "trainer_state.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda r: r["optimizer_param_groups"][0].update(weight_decay=1e9),
            r"optimizer_param_groups\[0\]\.weight_decay is 1000000000\.0, the run's settings give 0\.01",
        ),
        (
            lambda r: r["optimizer_param_groups"][0].update(lr=1e10),
            r"optimizer_param_groups\[0\]\.lr is 10000000000\.0, the run's settings give 0\.0(;|$)",
        ),
        (
            lambda r: r["optimizer_param_groups"][1].update(maximize=True),
            r"optimizer_param_groups\[1\]\.maximize is True, the run's settings give False",
        ),
        (
            lambda r: r["optimizer_param_groups"][0].update(initial_lr=1.0),
            r"optimizer_param_groups\[0\]\.initial_lr is 1\.0, the run's settings give 0\.003",
        ),
        (
            lambda r: r["optimizer_param_groups"][0].update(params=r["optimizer_param_groups"][0]["params"][::-1]),
            r"optimizer_param_groups\[0\]\.params is \[\d+, .*\], this run's optimizer has \[0, 1, ",
        ),
        (
            lambda r: r["scheduler"].update(base_lrs=[0.1, 0.1]),
            r"scheduler\.base_lrs\[0\] is 0\.1, the run's settings give 0\.003",
        ),
        (lambda r: r["scheduler"].update(last_epoch=7), r"scheduler\.last_epoch is 7, the run's settings give 2"),
    ],
)
@pytest.mark.parametrize("allow", [True, False])
def test_resume_refuses_trainer_state_numbers_that_contradict_the_checkpoint(
    tiny, finished_run, tmp_path, edit, message, allow
):
    out = _run_copy(finished_run, tmp_path)
    path = _edit_state(out, edit)
    config = TrainingConfig(**CONFIG | {"max_u_divergence": 1.0} | ({"steps": 4} if allow else {}))
    with pytest.raises(
        OSError,
        match=rf"the training state '{re.escape(str(path))}' contradicts its checkpoint "
        rf"\(step 2 and the settings it records\): .*{message}",
    ):
        train(
            _model(),
            _data(tiny[1]),
            config,
            out_dir=str(out),
            resume=True,
            progress=False,
            allow_changed_settings=allow,
        )


@pytest.mark.parametrize("step", [100, 3, 1])
def test_resume_refuses_a_recorded_step_that_is_not_the_directory_s(tiny, finished_run, tmp_path, step):
    out = _run_copy(finished_run, tmp_path)
    path = _edit_state(out, lambda r: r.update(step=step))
    with pytest.raises(
        OSError, match=rf"'{re.escape(str(path))}' records step {step}, but its directory is checkpoint-2"
    ):
        _resume(tiny[1], out)


def test_an_allowed_new_learning_rate_and_weight_decay_apply_and_the_result_resumes_again(tiny, finished_run, tmp_path):
    from transformers import get_cosine_schedule_with_warmup

    out = _run_copy(finished_run, tmp_path)
    history = _resume(tiny[1], out, learning_rate=1e-3, weight_decay=0.05)
    parameter = torch.nn.Parameter(torch.zeros(1))
    schedule = get_cosine_schedule_with_warmup(torch.optim.SGD([parameter], lr=1e-3), 1, 4)
    expected = 1e-3 * schedule.lr_lambdas[0](3)
    assert [r["train/learning_rate"] for r in history if r["step"] == 3] == [pytest.approx(expected, rel=1e-12)]
    record = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert record["scheduler"]["base_lrs"] == [1e-3, 1e-3]
    assert [g["weight_decay"] for g in record["optimizer_param_groups"]] == [0.05, 0.0]
    # the checkpoint this wrote agrees with the settings it records: it resumes (here: nothing left to do)
    _resume(tiny[1], out, learning_rate=1e-3, weight_decay=0.05)


def test_an_optimizer_tensor_beyond_the_parameters_is_named_with_their_count_in_words():
    import torch

    from causalqwen.files.training_state import _optimizer_state

    one = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    _, problems = _optimizer_state({"optimizer.3.exp_avg": torch.zeros(2)}, one)
    assert problems == ["optimizer.3.exp_avg names no parameter of the optimizer (it has 1 parameter)"]
    two = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))])
    _, problems = _optimizer_state({"optimizer.3.exp_avg": torch.zeros(2)}, two)
    assert problems == ["optimizer.3.exp_avg names no parameter of the optimizer (it has 2 parameters)"]


def test_an_overwrite_whose_run_would_write_a_kept_checkpoint_stops_before_its_first_step(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"item {i} costs {i}.5"}) + "\n" for i in range(4)))
    out = tmp_path / "run"
    args = ["train", "--base", "tiny", "--data", str(data), "--out", str(out), "--batch-size", "2", "--save-every", "1"]
    assert cli.main(args + ["--steps", "2", "--save-total-limit", "0"]) == 0
    (out / "checkpoint-2" / "notes.txt").write_text("mine")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args + ["--steps", "2", "--overwrite"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "already holds checkpoint-2, which this run would write" in err
    assert (out / "checkpoint-2" / "notes.txt").read_text() == "mine"
    assert not (out / "checkpoint-1").exists() and not (out / "metrics.jsonl").exists()  # no step was taken
