"""A run's checkpoint directories (`causalqwen.files.checkpoint_directories`): only the names a run
writes (``checkpoint-<step>``, a directory, not a link) are checkpoints; ``latest_checkpoint`` returns the entry it
found and ignores every other name; a name the run never writes is refused by name.
"""

import os
import re
import shutil

import pytest
from tiny_runs import resume, run_copy

from causalqwen.app import runs


def test_a_checkpoint_directory_that_is_a_link_is_not_resumed_from(tiny, finished_run, tmp_path):
    out = run_copy(finished_run, tmp_path)
    elsewhere = tmp_path / "elsewhere-checkpoint"
    os.rename(out / "checkpoint-2", elsewhere)
    os.symlink(elsewhere, out / "checkpoint-2")
    with pytest.raises(OSError, match=rf"'{out / 'checkpoint-2'}' is a symbolic link"):
        resume(tiny[1], out)


@pytest.mark.parametrize(
    "stray", ["checkpoint-0005", "checkpoint-007", "checkpoint-٣", "checkpoint-0", "checkpoint-05"]
)
def test_a_checkpoint_name_the_run_never_writes_is_refused_by_name(finished_run, tmp_path, stray):
    out = run_copy(finished_run, tmp_path)
    (out / stray).mkdir()
    with pytest.raises(
        OSError,
        match=rf"'{re.escape(str(out / stray))}' is not a checkpoint name this run writes "
        r"\(checkpoint-<step>, the step in ASCII digits without leading zeros",
    ):
        runs.latest_checkpoint(str(out))


def test_a_checkpoint_name_that_is_a_file_is_refused(tiny, finished_run, tmp_path):
    out = run_copy(finished_run, tmp_path)
    (out / "checkpoint-9").write_text("not a checkpoint")
    with pytest.raises(OSError, match=rf"'{re.escape(str(out / 'checkpoint-9'))}' is not a directory"):
        runs.latest_checkpoint(str(out))
    with pytest.raises(OSError, match="is not a directory"):
        resume(tiny[1], out)


def test_latest_checkpoint_returns_the_entry_it_found_and_ignores_other_names(finished_run, tmp_path):
    out = run_copy(finished_run, tmp_path)
    for name in ("checkpoint-10.partial", "checkpoint-x", "checkpoints", "checkpoint-"):
        (out / name).mkdir()
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-10")
    assert runs.latest_checkpoint(str(out)) == str(out / "checkpoint-10")  # numeric order, not by name
    assert runs.checkpoint_step("checkpoint-10") == 10
    assert [runs.checkpoint_step(n) for n in ("checkpoint-010", "checkpoint-٣", "checkpoint-0", "x-1")] == [None] * 4
    assert runs.latest_checkpoint(str(tmp_path / "missing")) is None
