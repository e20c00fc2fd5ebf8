r"""Which files a save wrote, and removing exactly those.

A save that writes a directory of files (a checkpoint, the final ``model/`` and ``adapter/`` of a run) ends by
writing `CHECKPOINT_RECORD` into it: the name, size and SHA-256 of every file it wrote
(`record_checkpoint_files`). Removing such a directory (an old checkpoint beyond ``save_total_limit``, a run
replaced by ``overwrite``) removes only what its record lists, and only when nothing else is there
(`remove_checkpoint`): a user's notes, a subdirectory, a link or a file that took the place of one of the run's
keeps the directory whole, and its name is returned for a warning. A killed save's leftover
(``checkpoint-N.partial``, which has no record yet) may lose only the names a checkpoint's save writes
(`remove_killed_save`). Nothing the project did not write is ever deleted.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat

from .safe_writes import check_not_link, open_for_writing

__all__ = [
    "CHECKPOINT_RECORD",
    "record_checkpoint_files",
    "files_state",
    "files_changed_since",
    "remove_checkpoint",
    "remove_killed_save",
]

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


def _sha256(path: str) -> str:
    """SHA-256 of the regular file ``path``, opened without following a link."""
    no_link = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    with open(path, "rb", opener=lambda name, _flags: os.open(name, no_link)) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def record_checkpoint_files(directory: str, *, root: str | None = None, written=None) -> None:
    """Write `CHECKPOINT_RECORD` into ``directory`` (after everything else of it): the name, size and SHA-256 of
    every file the save wrote, which is what `remove_checkpoint` may remove later.

    ``written`` None: every entry of ``directory``, each of which must be a regular file (``OSError`` naming it
    otherwise: a checkpoint being written under its temporary name holds nothing else). Else the names of the
    files a save wrote into a directory that may hold others (`files_changed_since`), added to those of the
    directory's earlier record that are still there unchanged; nothing else is recorded, so a user's file beside
    them is never the run's."""
    if written is None:
        files = {}
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            status = os.lstat(path)
            if not stat.S_ISREG(status.st_mode):
                raise OSError(
                    f"{path!r} is not a regular file; a checkpoint being written holds only the files it writes"
                )
            files[name] = {"size": status.st_size, "sha256": _sha256(path)}
    else:
        earlier, files = _recorded_files(directory) or {}, {}
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name in written and entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    files[entry.name] = {"size": size, "sha256": _sha256(entry.path)}
                elif entry.name != CHECKPOINT_RECORD and _written_by_the_run(entry, earlier):
                    files[entry.name] = earlier[entry.name]
    with open_for_writing(os.path.join(directory, CHECKPOINT_RECORD), root=root) as handle:
        json.dump({"files": files}, handle, indent=1, sort_keys=True)


def files_state(directory: str) -> dict:
    """``{name: (inode, size, mtime_ns)}`` of the regular files in ``directory`` ({} if it does not exist): what
    `files_changed_since` compares after a writer that does not say what it wrote (``save_pretrained``)."""
    if not os.path.isdir(directory):
        return {}
    with os.scandir(directory) as entries:
        return {
            entry.name: (status.st_ino, status.st_size, status.st_mtime_ns)
            for entry in entries
            if entry.is_file(follow_symlinks=False) and (status := entry.stat(follow_symlinks=False))
        }


def files_changed_since(directory: str, before: dict) -> set[str]:
    """The names of the regular files of ``directory`` that are new or rewritten since `files_state` gave
    ``before``."""
    return {name for name, state in files_state(directory).items() if before.get(name) != state}


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
