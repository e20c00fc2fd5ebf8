r"""Which checkpoints a run has, and which of their files the run wrote.

`causalqwen.app.runs` writes a checkpoint ``checkpoint-{step}/`` under a temporary name and renames it; this
module finds them (`latest_checkpoint`: only the names the run writes, anything it would mistake for one is an
``OSError``), records every file a save wrote with its size and SHA-256 (`record_checkpoint_files`), and removes
old checkpoints file by file, only what that record lists (`remove_old_checkpoints`, `remove_checkpoint`): a
checkpoint holding anything else is kept with a warning naming it, so nothing the run did not write is deleted.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import stat

from .rundir import check_not_link, open_for_writing
from .training_state import TRAINING_JSON, read_training_record

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_RECORD",
    "checkpoint_step",
    "latest_checkpoint",
    "remove_old_checkpoints",
    "remove_checkpoint",
    "record_checkpoint_files",
    "remove_killed_save",
]

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"checkpoint-([1-9][0-9]*)", re.ASCII)  # exactly the names save_checkpoint writes
_STEP_LIKE_NAME = re.compile(
    r"checkpoint-(\d+)"
)  # any digits, Unicode ones included: what a person may mistake for one
# The files save_checkpoint wrote into a checkpoint, with their sizes and SHA-256: what remove_checkpoint may remove.
CHECKPOINT_RECORD = "checkpoint_files.json"
# What a checkpoint's save writes (shell patterns): a killed save's leftover ``checkpoint-N.partial`` holds no record
# yet, so these names are what may be removed from it.
_CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "causalqwen_auto.py",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "adapter_config.json",
    "adapter_model.safetensors",
    "README.md",
    "training_state.safetensors",
    "trainer_state.json",
    "history.json",
    "divergence_reference.safetensors",
    "divergence_bound.json",
    CHECKPOINT_RECORD,
)


# =============================================================================================
# Which checkpoints there are
# =============================================================================================


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory name as the run writes it (``checkpoint-{step}``: ASCII digits, no
    leading zero, step >= 1), or None for any other name."""
    match = CHECKPOINT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def latest_checkpoint(out_dir: str) -> str | None:
    """The complete ``checkpoint-{step}`` directory with the highest step (the path of that very entry), or None.

    Only the names the run itself writes count: ``checkpoint-`` and the step in ASCII digits without a leading
    zero (``checkpoint-5``). Anything the run would mistake for one is an ``OSError`` naming it, never skipped
    nor guessed at: a ``checkpoint-{digits}`` entry whose digits are not that canonical form
    (``checkpoint-0005``, ``checkpoint-0``, ``checkpoint-٣``: rename or remove it), a ``checkpoint-{step}``
    that is a symbolic link (a run's checkpoints are directories it wrote, inside it) or not a directory (a
    regular file). Other names (``checkpoint-5.partial``, a killed save's leftover) are not checkpoints and are
    ignored."""
    if not os.path.isdir(out_dir):
        return None
    found = {}
    for name in sorted(os.listdir(out_dir)):
        path = os.path.join(out_dir, name)
        step = checkpoint_step(name)
        if step is None:
            if _STEP_LIKE_NAME.fullmatch(name):
                raise OSError(
                    f"{path!r} is not a checkpoint name this run writes (checkpoint-<step>, the step in "
                    "ASCII digits without leading zeros, at least 1): rename or remove it"
                )
            continue
        check_not_link(path)
        if not os.path.isdir(path):
            raise OSError(f"{path!r} is not a directory: a checkpoint is a directory the run writes; remove it")
        found[step] = path
    return found[max(found)] if found else None


def remove_old_checkpoints(out_dir: str, keep: int | None) -> list[str]:
    """Remove all but the newest ``keep`` checkpoints the run in ``out_dir`` wrote (``keep`` None or 0: keep all, as
    transformers' ``save_total_limit``); return the paths removed, oldest first.

    A checkpoint of the run is an entry named as `save_checkpoint` names one (`CHECKPOINT_NAME`) that is a real
    directory, not a link, holding a ``trainer_state.json`` (a regular file) that records the step its name says.
    Anything else -- a link named ``checkpoint-7``, a file, a directory the run did not write -- is neither
    counted nor removed. An old checkpoint is removed by `remove_checkpoint`, file by file, only when it holds
    nothing but what its `CHECKPOINT_RECORD` lists; one that holds anything else (a user's notes, a
    subdirectory, a link, a file that replaced one of the run's) is kept whole, with a warning naming what the
    run did not write."""
    if not keep:
        return []
    ours = []
    for name in os.listdir(out_dir):
        path, step = os.path.join(out_dir, name), checkpoint_step(name)
        record_file = os.path.join(path, TRAINING_JSON)
        if step is None or os.path.islink(path) or not os.path.isdir(path) or os.path.islink(record_file):
            continue
        try:
            if read_training_record(path)["step"] == step:
                ours.append((step, name))
        except OSError:
            continue
    removed = []
    for _, name in sorted(ours)[:-keep]:
        path = os.path.join(out_dir, name)
        foreign = remove_checkpoint(path)
        if foreign:
            logger.warning(
                "save_total_limit: %s is kept: it holds %s, which this run did not write; causalqwen never "
                "deletes what it did not write (move those out, or remove the checkpoint yourself)",
                path,
                ", ".join(foreign),
            )
            continue
        removed.append(path)
    return removed


def _sha256(path: str) -> str:
    """SHA-256 of the regular file ``path``, opened without following a link."""
    no_link = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    with open(path, "rb", opener=lambda name, _flags: os.open(name, no_link)) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def record_checkpoint_files(directory: str, *, root: str | None = None) -> None:
    """Write `CHECKPOINT_RECORD` into the checkpoint ``directory`` (after everything else of it): the name, size and
    SHA-256 of every file in it, which is what `remove_checkpoint` may remove later. Every entry must be a regular
    file (``OSError`` naming it otherwise: a checkpoint being written holds nothing else)."""
    files = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(f"{path!r} is not a regular file; a checkpoint being written holds only the files it writes")
        files[name] = {"size": status.st_size, "sha256": _sha256(path)}
    with open_for_writing(os.path.join(directory, CHECKPOINT_RECORD), root=root) as handle:
        json.dump({"files": files}, handle, indent=1, sort_keys=True)


def _recorded_files(directory: str) -> dict | None:
    """``{name: {"size", "sha256"}}`` of the checkpoint's `CHECKPOINT_RECORD`; None when it has none that reads
    as one (missing, a link, not a regular file, not such a JSON object)."""
    path = os.path.join(directory, CHECKPOINT_RECORD)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, encoding="utf-8") as handle:
            files = json.load(handle).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, dict) or not all(
        isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
        for entry in files.values()
    ):
        return None
    return files


def _written_by_the_run(entry: os.DirEntry, recorded: dict) -> bool:
    """Whether ``entry`` of a checkpoint is a file the run recorded: a regular file (never a link, whatever it points
    to), with a recorded name, of the recorded size and SHA-256."""
    if entry.name not in recorded or not entry.is_file(follow_symlinks=False):
        return False
    wanted = recorded[entry.name]
    return entry.stat(follow_symlinks=False).st_size == wanted["size"] and _sha256(entry.path) == wanted["sha256"]


def remove_checkpoint(path: str) -> list[str]:
    """Remove the checkpoint directory ``path`` if it holds exactly what the run wrote into it, and return ``[]``;
    otherwise remove nothing and return the names of the entries the run did not write, sorted.

    What the run wrote is what its `CHECKPOINT_RECORD` lists (`record_checkpoint_files`): a regular file of
    that name, size and SHA-256. So a user's note, a subdirectory, a symbolic link (never followed: what it
    points to is not read) and a file that took the place of one of the run's (a user's own ``model.safetensors``)
    are not the run's, and the checkpoint stays whole. A checkpoint without a readable record (written by a
    causalqwen before the record existed) has nothing known to be the run's: every entry is returned. The files
    are removed one by one, then the record, then the directory, which the operating system removes only if it
    is then empty (an entry added meanwhile stays, with the directory: its name is returned). ``path`` itself
    must be a real directory (a link or a file is an ``OSError`` naming it, and stays)."""
    check_not_link(path)
    if not os.path.isdir(path):
        raise OSError(f"{path!r} is not a directory: a checkpoint is a directory the run writes")
    recorded = _recorded_files(path)
    if recorded is None:
        return sorted(os.listdir(path))
    ours, foreign = [], []
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name == CHECKPOINT_RECORD:
                continue
            (ours if _written_by_the_run(entry, recorded) else foreign).append(entry)
    if foreign:
        return sorted(entry.name for entry in foreign)
    for entry in ours:
        os.unlink(entry.path)
    os.unlink(os.path.join(path, CHECKPOINT_RECORD))
    try:
        os.rmdir(path)
    except OSError:  # an entry appeared since the scan: it stays, and so does the directory
        return sorted(os.listdir(path))
    return []


def remove_killed_save(partial_dir: str) -> None:
    """Remove ``checkpoint-N.partial``, the leftover of a save killed before its rename, if there is one. It has no
    `CHECKPOINT_RECORD` yet, so what may go is what a checkpoint's save writes (regular files named as in
    `_CHECKPOINT_FILES`); anything else in it is an ``OSError`` naming it, and nothing is removed."""
    if not os.path.isdir(partial_dir):
        return
    with os.scandir(partial_dir) as scan:
        entries = list(scan)
    foreign = sorted(
        entry.name
        for entry in entries
        if not entry.is_file(follow_symlinks=False)
        or not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in _CHECKPOINT_FILES)
    )
    if foreign:
        raise OSError(
            f"{partial_dir!r} holds {', '.join(foreign)}, which a checkpoint's save does not write; causalqwen "
            "never deletes what it did not write: move those out of it"
        )
    for entry in entries:
        os.unlink(entry.path)
    os.rmdir(partial_dir)
