"""What a run wrote (`causalqwen.files.written_files`): old checkpoints are removed by their record.

Old checkpoints (``save_total_limit``) are removed file by file, only the files the checkpoint's record
(``checkpoint_files.json``) lists, by name, size and SHA-256; a checkpoint holding anything else -- a user's note,
a subdirectory, a symbolic link, a file that replaced one of the run's -- is kept whole, with a warning naming it.
Links are never followed.
"""

import json
import logging
import os
import shutil

import pytest
from tiny_runs import file_tree, run_copy, tiny_data, tiny_model

from causalqwen import train
from causalqwen.app import runs
from causalqwen.files.rundir import RunDirectory
from causalqwen.training import TrainingConfig

CONFIG = dict(
    steps=3,
    batch_size=4,
    learning_rate=3e-3,
    warmup_steps=1,
    preset="all",
    eval_every=100,
    save_every=1,
    log_every=1,
    seed=0,
)


NOTE = "my notes on this checkpoint\n"


@pytest.fixture(scope="module")
def three_checkpoints(tokenizer, tmp_path_factory):
    """A finished run with checkpoint-1, -2 and -3, every one kept (no limit)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    train(tiny_model(), tiny_data(tokenizer, n=16), TrainingConfig(**CONFIG), out_dir=str(out), progress=False)
    return out


def _checkpoints(run):
    return sorted(name for name in os.listdir(run) if name.startswith("checkpoint-"))


def test_the_record_lists_every_file_of_a_checkpoint_with_its_sha256(three_checkpoints):
    import hashlib

    checkpoint = three_checkpoints / "checkpoint-2"
    record = json.loads((checkpoint / runs.CHECKPOINT_RECORD).read_text())["files"]
    others = sorted(name for name in os.listdir(checkpoint) if name != runs.CHECKPOINT_RECORD)
    assert sorted(record) == others and "model.safetensors" in record
    for name, entry in record.items():
        content = (checkpoint / name).read_bytes()
        assert entry == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}, name


def test_a_run_with_a_limit_keeps_a_checkpoint_holding_a_users_note_and_removes_the_others(
    tokenizer, tmp_path, killed_after_first_save, caplog
):
    """A run killed after checkpoint-1; the user writes a note into it; the run resumes with a limit of 1."""
    out = tmp_path / "run"
    config = TrainingConfig(**CONFIG | {"steps": 4})
    with killed_after_first_save():
        train(tiny_model(), tiny_data(tokenizer, n=16), config, out_dir=str(out), progress=False)
    (out / "checkpoint-1" / "notes.txt").write_text(NOTE)
    kept = file_tree(out / "checkpoint-1")
    with caplog.at_level(logging.WARNING, logger="causalqwen.app.runs"):
        train(
            tiny_model(),
            tiny_data(tokenizer, n=16),
            TrainingConfig(**CONFIG | {"steps": 4, "save_total_limit": 1}),
            out_dir=str(out),
            resume=True,
            progress=False,
        )
    assert _checkpoints(out) == ["checkpoint-1", "checkpoint-4"]
    assert file_tree(out / "checkpoint-1") == kept  # whole: the run's files beside the note, the note as written
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings and all(os.path.join(str(out), "checkpoint-1") in line and "notes.txt" in line for line in warnings)
    assert "never deletes what it did not write" in warnings[0]


@pytest.mark.parametrize(
    "plant",
    [
        "note",
        "subdirectory",
        "link_to_a_file",
        "link_to_a_directory",
        "own_weights",
        "unrecorded_name",
        "record_missing",
    ],
)
def test_an_old_checkpoint_holding_what_the_run_did_not_write_is_kept_whole(three_checkpoints, tmp_path, plant, caplog):
    run = run_copy(three_checkpoints, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.txt").write_text(NOTE)
    old = run / "checkpoint-1"
    if plant == "note":
        (old / "notes.txt").write_text(NOTE)
        foreign = "notes.txt"
    elif plant == "subdirectory":
        (old / "eval").mkdir()
        (old / "eval" / "samples.jsonl").write_text(NOTE)
        foreign = "eval"
    elif plant == "link_to_a_file":
        (old / "precious.txt").symlink_to(outside / "precious.txt")
        foreign = "precious.txt"
    elif plant == "link_to_a_directory":
        (old / "elsewhere").symlink_to(outside, target_is_directory=True)
        foreign = "elsewhere"
    elif plant == "own_weights":  # the user's own model.safetensors in place of the run's: same name, same size
        shutil.copyfile(run / "checkpoint-3" / "model.safetensors", old / "model.safetensors")
        assert (old / "model.safetensors").stat().st_size == (run / "checkpoint-2" / "model.safetensors").stat().st_size
        foreign = "model.safetensors"
    elif plant == "unrecorded_name":  # a name a checkpoint may hold (with a bound), but this one never did
        (old / "divergence_bound.json").write_text("{}")
        foreign = "divergence_bound.json"
    else:  # a checkpoint whose record is gone (as one written by an older causalqwen): nothing is known to be ours
        (old / runs.CHECKPOINT_RECORD).unlink()
        foreign = "model.safetensors"
    before = file_tree(old)
    with caplog.at_level(logging.WARNING, logger="causalqwen.app.runs"):
        removed = runs.remove_old_checkpoints(str(run), 1)
    assert removed == [str(run / "checkpoint-2")]
    assert _checkpoints(run) == ["checkpoint-1", "checkpoint-3"]
    assert file_tree(old) == before
    assert (outside / "precious.txt").read_text() == NOTE and os.listdir(outside) == ["precious.txt"]
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert str(old) in warning and foreign in warning


def test_a_hard_link_the_user_made_to_a_checkpoint_file_keeps_its_content(three_checkpoints, tmp_path):
    """The run's own file is removed from the checkpoint; the user's second name for it stays, with its bytes."""
    run = run_copy(three_checkpoints, tmp_path)
    weights = (run / "checkpoint-1" / "model.safetensors").read_bytes()
    kept = tmp_path / "best.safetensors"
    os.link(run / "checkpoint-1" / "model.safetensors", kept)
    assert runs.remove_old_checkpoints(str(run), 2) == [str(run / "checkpoint-1")]
    assert kept.read_bytes() == weights and _checkpoints(run) == ["checkpoint-2", "checkpoint-3"]


def test_links_and_files_named_like_checkpoints_are_neither_counted_nor_followed(three_checkpoints, tmp_path):
    run = run_copy(three_checkpoints, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoint-1", outside / "checkpoint-copy")  # a complete checkpoint, record included
    (run / "checkpoint-9").symlink_to(outside / "checkpoint-copy", target_is_directory=True)
    (run / "checkpoint-8").write_text("a file named like a checkpoint")
    before = file_tree(outside)
    assert runs.remove_old_checkpoints(str(run), 1) == [str(run / "checkpoint-1"), str(run / "checkpoint-2")]
    assert _checkpoints(run) == ["checkpoint-3", "checkpoint-8", "checkpoint-9"]
    assert file_tree(outside) == before and (run / "checkpoint-8").read_text().startswith("a file")
    assert os.path.islink(run / "checkpoint-9")


def test_remove_checkpoint_never_follows_a_link_to_read_it(three_checkpoints, tmp_path):
    """A checkpoint file replaced by a link to a copy of its own bytes elsewhere: the link is not the run's file."""
    run = run_copy(three_checkpoints, tmp_path)
    copy = tmp_path / "history-copy.json"
    shutil.copyfile(run / "checkpoint-1" / "history.json", copy)
    (run / "checkpoint-1" / "history.json").unlink()
    (run / "checkpoint-1" / "history.json").symlink_to(copy)
    assert runs.remove_checkpoint(str(run / "checkpoint-1")) == ["history.json"]
    assert os.path.islink(run / "checkpoint-1" / "history.json") and copy.exists()
    assert runs.remove_checkpoint(str(run / "checkpoint-2")) == [] and not (run / "checkpoint-2").exists()


def test_remove_checkpoint_refuses_a_link_or_a_file_and_leaves_it(three_checkpoints, tmp_path):
    run = run_copy(three_checkpoints, tmp_path)
    (run / "checkpoint-8").write_text("a file named like a checkpoint")
    (run / "checkpoint-9").symlink_to(run / "checkpoint-1", target_is_directory=True)
    with pytest.raises(OSError, match="checkpoint-8' is not a directory"):
        runs.remove_checkpoint(str(run / "checkpoint-8"))
    with pytest.raises(OSError, match="checkpoint-9' is a symbolic link"):
        runs.remove_checkpoint(str(run / "checkpoint-9"))
    assert (run / "checkpoint-8").read_text().startswith("a file") and os.path.islink(run / "checkpoint-9")
    assert (run / "checkpoint-1" / "model.safetensors").is_file()


def test_a_directory_of_someone_else_at_a_step_to_be_saved_stops_the_run_before_its_first_step(tokenizer, tmp_path):
    run = tmp_path / "run"
    claimed = RunDirectory.claim(run, "train")
    (run / "checkpoint-2").mkdir()  # not written by the run: no record
    (run / "checkpoint-2" / "notes.txt").write_text(NOTE)
    try:
        with pytest.raises(ValueError, match=r"already holds checkpoint-2, which this run would write"):
            train(tiny_model(), tiny_data(tokenizer, n=16), TrainingConfig(**CONFIG), out_dir=claimed, progress=False)
    finally:
        claimed.release()
    assert (run / "checkpoint-2" / "notes.txt").read_text() == NOTE and _checkpoints(run) == ["checkpoint-2"]
    assert not (run / "checkpoint-2.partial").exists()


def test_a_killed_saves_leftover_is_removed_unless_it_holds_something_else(tokenizer, tmp_path, three_checkpoints):
    run = run_copy(three_checkpoints, tmp_path)
    leftover = run / "checkpoint-4.partial"
    shutil.copytree(run / "checkpoint-3", leftover)  # what a save killed before its rename leaves
    (leftover / runs.CHECKPOINT_RECORD).unlink()
    (leftover / "model.safetensors").write_bytes(b"cut short")
    (leftover / "notes.txt").write_text(NOTE)
    config = TrainingConfig(**CONFIG | {"steps": 4})
    with pytest.raises(
        OSError, match=r"checkpoint-4.partial' holds notes.txt, which a checkpoint's save does not write"
    ):
        train(
            tiny_model(),
            tiny_data(tokenizer, n=16),
            config,
            out_dir=str(run),
            resume=True,
            progress=False,
            allow_changed_settings=True,
        )
    assert (leftover / "notes.txt").read_text() == NOTE and (
        leftover / "model.safetensors"
    ).read_bytes() == b"cut short"
    (leftover / "notes.txt").unlink()
    train(
        tiny_model(),
        tiny_data(tokenizer, n=16),
        config,
        out_dir=str(run),
        resume=True,
        progress=False,
        allow_changed_settings=True,
    )
    assert not leftover.exists() and _checkpoints(run) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
    ]
    assert (run / "checkpoint-4" / runs.CHECKPOINT_RECORD).is_file()
