"""The run directory (`causalqwen.files.rundir`): its lock, its marker and what ``overwrite`` removes.

A run directory is locked while a run uses it and released when the process dies; the lock is never written
through a planted symbolic link (the link is an ``OSError`` naming it, and what it points to keeps its content).
``overwrite`` removes only what the run recorded, names what it keeps, and never a directory the project did not
write; the demo never replaces a training run.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from tiny_runs import FOUR_STEP_RUN, SECRET, TWO_STEP_RUN, outside_file, tiny_data, tiny_model

from causalqwen import CausalQwenForCausalLM, train
from causalqwen.app import cli, runs
from causalqwen.files.data import synthetic_texts
from causalqwen.files.rundir import (
    LOCK,
    MARKER,
    RunDirectory,
)
from causalqwen.training import TrainingConfig


def test_a_planted_lock_link_is_refused_and_its_target_keeps_its_content(tiny, tmp_path):
    out, secret = tmp_path / "run", outside_file(tmp_path)
    out.mkdir()
    os.symlink(secret, out / LOCK)  # the directory counts as empty: only the lock is there
    with pytest.raises(OSError, match=rf"'{out / LOCK}' is a symbolic link; causalqwen never writes through a link"):
        RunDirectory.claim(out, "train")
    with pytest.raises(OSError, match=r"\.causalqwen\.lock' is a symbolic link"):
        train(tiny_model(), tiny_data(tiny[1]), TrainingConfig(**TWO_STEP_RUN), out_dir=str(out), progress=False)
    assert secret.read_text() == SECRET
    assert os.listdir(out) == [LOCK] and os.path.islink(out / LOCK)  # the link is left as it was, nothing written


def test_the_train_command_refuses_a_planted_lock_link(tiny, tmp_path, capsys):
    from causalqwen.app import cli

    base, data, out, secret = tmp_path / "base", tmp_path / "train.jsonl", tmp_path / "out", outside_file(tmp_path)
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


def test_overwrite_removes_only_run_outputs_and_never_a_foreign_directory(tokenizer, tmp_path):
    config = TrainingConfig(**FOUR_STEP_RUN | {"steps": 2})
    data_file = tmp_path / "run" / "train.jsonl"
    train(
        tiny_model(),
        tiny_data(tokenizer),
        config,
        out_dir=str(tmp_path / "run"),
        progress=False,
    )
    data_file.write_text('{"text": "mine"}\n')
    (tmp_path / "run" / "notes.txt").write_text("mine")
    train(
        tiny_model(),
        tiny_data(tokenizer),
        config,
        out_dir=str(tmp_path / "run"),
        overwrite=True,
        progress=False,
    )
    assert data_file.read_text() == '{"text": "mine"}\n' and (tmp_path / "run" / "notes.txt").exists()

    for marker in (None, "training_config.json"):  # an old run's file is not a marker
        foreign = tmp_path / f"foreign-{marker}"
        foreign.mkdir()
        (foreign / "keep.txt").write_text("x")
        if marker:
            (foreign / marker).write_text("{}")
        before = sorted(os.listdir(foreign))
        with pytest.raises(ValueError, match="is not a causalqwen run"):
            RunDirectory.claim(foreign, "train", overwrite=True)
        with pytest.raises(ValueError, match="is not a causalqwen run"):
            RunDirectory.claim(foreign, "demo")
        assert sorted(os.listdir(foreign)) == before


def test_the_demo_never_replaces_a_training_run(tokenizer, tmp_path, capsys):
    run = tmp_path / "run"
    train(
        tiny_model(),
        tiny_data(tokenizer),
        TrainingConfig(**FOUR_STEP_RUN | {"steps": 2}),
        out_dir=str(run),
        progress=False,
    )
    before = sorted(os.listdir(run))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--out", str(run), "--steps", "1"])
    assert exit_info.value.code == 2
    assert "holds a training run; a demo run never replaces it" in capsys.readouterr().err
    assert sorted(os.listdir(run)) == before
    with pytest.raises(ValueError, match="holds a demo run; a train run never replaces it"):
        demo_dir = tmp_path / "demo"
        RunDirectory.claim(demo_dir, "demo").release()
        RunDirectory.claim(demo_dir, "train", overwrite=True)


def test_a_run_directory_is_locked_while_in_use_and_released_by_a_killed_process(tmp_path):
    out = tmp_path / "run"
    first = RunDirectory.claim(out, "train")
    with pytest.raises(ValueError, match=rf"is in use by another causalqwen run \(pid {os.getpid()}\)"):
        RunDirectory.claim(out, "train", resume=True)
    first.release()
    RunDirectory.claim(out, "train", resume=True).release()

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from causalqwen.files.rundir import RunDirectory; "
            f"held = RunDirectory.claim({str(out)!r}, 'train', resume=True); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by another causalqwen run \(pid {holder.pid}\)"):
            RunDirectory.claim(out, "train", resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunDirectory.claim(out, "train", resume=True).release()  # kill -9 released the lock
    assert {MARKER, LOCK} <= set(os.listdir(out))
