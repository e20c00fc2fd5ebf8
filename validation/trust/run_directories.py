"""The run directories boundary: the directory a training or demo run writes, and the run it resumes.

``--overwrite`` on a directory no run wrote, a demo pointed at a training run, two runs on one directory, a
planted link where a run writes its lock, its metrics or a checkpoint, a resume with other settings or data,
a resume with no run, a metrics line cut short by a kill, a stray checkpoint name.
"""

from __future__ import annotations

import os
import shutil

from ..cases import TrustCase, WrongResult, command_line_refusal, run_cli
from ..fixtures import finished_run, fresh_dir, tiny_dataset, train_tiny
from .planted import guarded, outside_file, untouched

__all__ = ["CASES"]


# =============================================================================================
# security
# =============================================================================================


def _overwrite_foreign():
    foreign = fresh_dir("foreign")
    notes, data = os.path.join(foreign, "notes.txt"), os.path.join(foreign, "train.jsonl")
    for path in (notes, data):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("the user's\n")
    with guarded(kept=(notes, data)):
        train_tiny(foreign, overwrite=True)


def _overwrite_run_keeps_data():
    out = os.path.join(fresh_dir("run-with-data"), "run")
    train_tiny(out)
    data = os.path.join(out, "train.jsonl")
    with open(data, "w", encoding="utf-8") as handle:
        handle.write('{"text": "the data file, kept beside the run"}\n')
    with guarded(kept=(data,)):
        train_tiny(out, overwrite=True)
    if not os.path.isdir(os.path.join(out, "checkpoint-2")):
        raise WrongResult("the overwritten run wrote no checkpoint")


def _demo_on_training_run():
    out = os.path.join(fresh_dir("demo-on-run"), "run")
    train_tiny(out)
    checkpoint = os.path.join(out, "checkpoint-2")
    with guarded(kept=(checkpoint, os.path.join(out, "metrics.jsonl"))):
        run_cli(["demo", "--out", out, "--steps", "1"])


def _two_resumes():
    from causalqwen.files.rundir import RunDirectory

    out = os.path.join(fresh_dir("two-resumes"), "run")
    train_tiny(out)
    holder = RunDirectory.claim(out, "train", resume=True)  # the first --resume, still running
    try:
        train_tiny(out, resume=True, steps=4)
    finally:
        holder.release()


def _lock_link():
    target = outside_file()
    out = os.path.join(fresh_dir("lock-link"), "run")
    os.makedirs(out)
    os.symlink(target, os.path.join(out, ".causalqwen.lock"))
    with untouched(target):
        train_tiny(out)


def _metrics_link_on_resume():
    out = finished_run()
    target = outside_file()
    os.remove(os.path.join(out, "metrics.jsonl"))
    os.symlink(target, os.path.join(out, "metrics.jsonl"))
    with untouched(target):
        train_tiny(out, resume=True, steps=4, save_every=2)


def _checkpoint_directory_link():
    out = finished_run()
    elsewhere = fresh_dir("elsewhere")
    os.symlink(elsewhere, os.path.join(out, "checkpoint-4"))
    try:
        train_tiny(out, resume=True, steps=4, save_every=2)
    finally:
        if os.listdir(elsewhere):
            raise WrongResult(f"a checkpoint was written through the link into {elsewhere}: {os.listdir(elsewhere)}")


# =============================================================================================
# silent
# =============================================================================================


def _resume_changed(**changes):
    def trigger():
        out = os.path.join(fresh_dir("resume-changed"), "run")
        train_tiny(out, steps=4, save_every=2)
        shutil.rmtree(os.path.join(out, "checkpoint-4"))  # as if killed after step 2
        settings = dict(changes)  # the closure's dict is left as it is: a case can run twice
        data = tiny_dataset(seed=settings.pop("data_seed")) if "data_seed" in settings else None
        train_tiny(out, resume=True, data=data, steps=4, save_every=2, **settings)

    return trigger


def _resume_without_run():
    out = os.path.join(fresh_dir("resume-nothing"), "run")
    train_tiny(out, resume=True)


# =============================================================================================
# clarity
# =============================================================================================


def _truncated_metrics_line():
    from causalqwen.app.runs import latest_checkpoint

    out = os.path.join(fresh_dir("metrics-cut"), "run")
    train_tiny(out, steps=4, save_every=2)
    shutil.rmtree(os.path.join(out, "checkpoint-4"))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        lines = handle.readlines()
    with open(os.path.join(out, "metrics.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(lines[:3])
        handle.write(lines[3][:10])  # the line a kill -9 cut in half
    train_tiny(out, resume=True, steps=4, save_every=2)
    if not latest_checkpoint(out).endswith("checkpoint-4"):
        raise WrongResult("the resumed run did not finish")


def _stray_checkpoint_name():
    out = finished_run()
    os.makedirs(os.path.join(out, "checkpoint-0005"))
    train_tiny(out, resume=True, steps=4, save_every=2)


CASES = [
    # ---- security
    TrustCase(
        "overwrite-foreign-directory",
        "security",
        "train --overwrite into a directory no run wrote (notes and data in it)",
        _overwrite_foreign,
        ValueError,
        r"exists and is not a causalqwen run .*never deletes files it did not write",
    ),
    TrustCase(
        "overwrite-keeps-the-data-file",
        "security",
        "train --overwrite of a run whose directory also holds the --data file",
        _overwrite_run_keeps_data,
        None,
    ),
    command_line_refusal(
        "demo-on-a-training-run",
        "security",
        "demo --out pointed at a training run",
        _demo_on_training_run,
        r".*holds a training run; a demo run never replaces it",
    ),
    TrustCase(
        "two-resumes-at-once",
        "security",
        "a second --resume on a directory another run is using",
        _two_resumes,
        ValueError,
        r"is in use by another causalqwen run \(pid \d+\)",
    ),
    TrustCase(
        "lock-symlink",
        "security",
        "a planted .causalqwen.lock symlink to a file outside the run directory",
        _lock_link,
        OSError,
        r"\.causalqwen\.lock' is a symbolic link; causalqwen never writes through a link",
    ),
    TrustCase(
        "metrics-symlink-on-resume",
        "security",
        "resume a run whose metrics.jsonl became a symlink outside",
        _metrics_link_on_resume,
        OSError,
        r"metrics\.jsonl' is a symbolic link",
    ),
    TrustCase(
        "checkpoint-directory-symlink",
        "security",
        "resume a run with checkpoint-4 planted as a link to a directory outside",
        _checkpoint_directory_link,
        OSError,
        r"checkpoint-4' is a symbolic link",
    ),
    # ---- silent
    TrustCase(
        "resume-other-learning-rate",
        "silent",
        "resume with another learning rate",
        _resume_changed(learning_rate=1e-3),
        ValueError,
        r"learning_rate is 0\.003 in the checkpoint, 0\.001 now",
    ),
    TrustCase(
        "resume-other-batch-size",
        "silent",
        "resume with another batch size",
        _resume_changed(batch_size=2),
        ValueError,
        "batch_size is 4 in the checkpoint, 2 now",
    ),
    TrustCase(
        "resume-other-seed",
        "silent",
        "resume with another seed",
        _resume_changed(seed=1),
        ValueError,
        "seed is 0 in the checkpoint, 1 now",
    ),
    TrustCase(
        "resume-other-data",
        "silent",
        "resume on other training data",
        _resume_changed(data_seed=7),
        ValueError,
        r"the training data differ \(sha256 \w+ in the checkpoint, \w+ now\)",
    ),
    TrustCase(
        "resume-without-a-run",
        "silent",
        "resume into a directory with no run (started from scratch, exit 0)",
        _resume_without_run,
        ValueError,
        "nothing to resume: .* holds no causalqwen run",
    ),
    # ---- clarity
    TrustCase(
        "metrics-line-cut-short",
        "clarity",
        "resume after a kill cut the last line of metrics.jsonl in half",
        _truncated_metrics_line,
        None,
    ),
    TrustCase(
        "stray-checkpoint-name",
        "clarity",
        "resume with a stray checkpoint-0005 directory (went to the hub)",
        _stray_checkpoint_name,
        OSError,
        r"checkpoint-0005' is not a checkpoint name this run writes",
    ),
]
