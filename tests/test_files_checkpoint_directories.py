"""A run's checkpoint directories (`causalqwen.files.checkpoint_directories`): only the names a run
writes (``checkpoint-<step>``, a directory, not a link) are checkpoints; ``latest_checkpoint`` returns the entry it
found and ignores every other name; a name the run never writes is refused by name.
"""

import os
import re
import shutil

import pytest

from causalqwen import train
from causalqwen.app import runs
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files.data import TextDataset, synthetic_texts
from causalqwen.training import TrainingConfig


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


def test_a_checkpoint_directory_that_is_a_link_is_not_resumed_from(tiny, finished_run, tmp_path):
    out = _run_copy(finished_run, tmp_path)
    elsewhere = tmp_path / "elsewhere-checkpoint"
    os.rename(out / "checkpoint-2", elsewhere)
    os.symlink(elsewhere, out / "checkpoint-2")
    with pytest.raises(OSError, match=rf"'{out / 'checkpoint-2'}' is a symbolic link"):
        _resume(tiny[1], out)


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
