r"""Output directories of runs: write only where allowed, delete only what a run wrote, one run at a time.

A run (``causalqwen train`` or ``causalqwen demo``) *claims* its output directory before it writes
anything. A claimed directory holds the marker ``causalqwen-run.json`` (``{"kind": "train"}`` or
``{"kind": "demo"}``), written by the claim itself, and the lock file ``.causalqwen.lock``.

| the directory | ``resume`` | ``overwrite`` | neither |
|---|---|---|---|
| missing or empty | refused (nothing to resume) | claimed | claimed |
| a run of the same kind | continued | its run outputs (`RUN_OUTPUTS`) removed, then claimed | refused |
| a run of the other kind | refused | refused | refused |
| anything else (no marker) | refused | refused | refused |

``overwrite`` never removes a file that a run did not write: a data file, notes or anything else a user put in
the directory stays where it is, and so does a directory among the run outputs (``checkpoint-*``, ``model``,
``adapter``, ``tensorboard``, ``wandb``) unless it holds exactly the files the record of its save lists
(`causalqwen.files.written_files`): a ``notes.txt`` in ``model/`` keeps ``model/`` whole, a ``checkpoint-best/``
no save recorded stays, and a directory written by a third party's writer (tensorboard's, wandb's) has no
record and stays. A warning names everything kept. The demo replaces an earlier *demo* on its own (that is its
job), but never a training run.

**The lock.** The claim takes an exclusive ``flock`` on ``.causalqwen.lock`` (and writes its pid
there) before it removes or writes anything; a second run on the same directory is refused while
the first holds it. The operating system releases the lock when the process ends, also by
``kill -9``, so a crashed run never leaves the directory blocked.

**Never through a link.** Every file causalqwen writes itself is opened without following a link
(`causalqwen.files.safe_writes`, whose names this module re-exports).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import stat

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected against each other there
    fcntl = None

from .safe_writes import (
    check_not_link,
    check_writable,
    check_write_targets,
    make_directory,
    open_for_writing,
    open_lock_file,
)
from .written_files import remove_checkpoint, remove_killed_save

__all__ = [
    "MARKER",
    "LOCK",
    "RUN_KINDS",
    "RUN_OUTPUTS",
    "RunDirectory",
    "open_for_writing",
    "check_write_targets",
    "check_not_link",
    "check_writable",
    "make_directory",
    "remove_run_output",
]

logger = logging.getLogger(__name__)

MARKER = "causalqwen-run.json"
LOCK = ".causalqwen.lock"
RUN_KINDS = ("train", "demo")
# What a run of each kind writes into its directory (shell patterns); `overwrite` removes these and nothing else.
_TRAIN_OUTPUTS = ("training_config.json", "metrics.jsonl", "checkpoint-*", "model", "adapter", "tensorboard", "wandb")
RUN_OUTPUTS = {"train": _TRAIN_OUTPUTS, "demo": _TRAIN_OUTPUTS + ("loss.png", "metrics.png")}


def remove_run_output(run_dir, name: str) -> None:
    """Remove the entry ``name`` of the run directory ``run_dir`` (a claimed one: it holds the `MARKER`), as the
    run that wrote it (`_remove_output`): ``name`` must be one of the outputs a run of the marker's kind writes
    (`RUN_OUTPUTS`). Whatever `_remove_output` keeps -- a symbolic link (never followed nor removed), a FIFO, a
    directory holding what its save did not record -- and a name outside the run's outputs or a directory without
    the marker is an ``OSError`` naming it."""
    run_dir = os.fspath(run_dir)
    if not isinstance(name, str) or os.sep in name or (os.altsep and os.altsep in name) or name in ("", ".", ".."):
        raise ValueError(f"name must be the name of an entry of the run directory, got {name!r}")
    try:
        kind = _read_marker(run_dir)["kind"]
    except ValueError as error:
        raise OSError(f"{run_dir!r} is not a claimed causalqwen run directory: {error}") from None
    path = os.path.join(run_dir, name)
    if name in (MARKER, LOCK) or not any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_OUTPUTS[kind]):
        raise OSError(f"{path!r} is not an output a {kind} run writes; causalqwen never removes it")
    kept = _remove_output(run_dir, name)
    if kept:
        raise OSError(f"{kept}; it is left in place")


def _remove_output(run_dir: str, name: str) -> str | None:
    """Remove the run output ``name`` of ``run_dir`` as far as the run wrote it; None when it is gone, else what
    stays and why. A regular file goes (the run writes these names whole); a directory goes only if it holds
    exactly what the record of its save lists (`causalqwen.files.written_files.remove_checkpoint`), a killed
    save's ``checkpoint-N.partial`` only if it holds nothing but a checkpoint's files; a symbolic link (never
    followed nor removed) or a special file stays."""
    path = os.path.join(run_dir, name)
    status = os.lstat(path)
    if stat.S_ISREG(status.st_mode):
        os.unlink(path)
        return None
    if not stat.S_ISDIR(status.st_mode):
        return f"{path!r} is a symbolic link or a special file, not an output the run wrote"
    if name.startswith("checkpoint-") and name.endswith(".partial"):
        try:
            remove_killed_save(path)
        except OSError as error:
            return str(error)
        return None
    foreign = remove_checkpoint(path)
    if foreign:
        return f"{path!r} holds {', '.join(foreign)}, which no save of the run recorded writing"
    return None


def _read_marker(path: str) -> dict:
    marker = os.path.join(path, MARKER)
    try:
        with open(marker, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(f"{marker}: not a readable causalqwen run marker ({error})") from None
    if not isinstance(record, dict) or record.get("kind") not in RUN_KINDS:
        raise ValueError(f"{marker}: not a causalqwen run marker (expected a kind of {', '.join(RUN_KINDS)})")
    return record


class RunDirectory:
    """An output directory claimed by one run (see the module docstring for the rules).

    Use `claim`; the lock is held until `release` (or the end of a ``with`` block, or of the process).

    Attributes:
        path: the directory.
        kind: ``"train"`` or ``"demo"``.
        resumed: whether the directory already held a run of this kind that is being continued.
    """

    def __init__(self, path: str, kind: str, resumed: bool, lock_handle):
        self.path = path
        self.kind = kind
        self.resumed = resumed
        self._lock_handle = lock_handle

    @classmethod
    def claim(
        cls,
        path,
        kind: str,
        *,
        resume: bool = False,
        overwrite: bool = False,
        option_names: dict[str, str] | None = None,
    ) -> "RunDirectory":
        """Claim ``path`` for a run of ``kind``; raise ``ValueError`` naming the directory and the rule otherwise.

        ``option_names`` is what the messages call ``resume`` and ``overwrite`` (the command line passes
        ``{"resume": "--resume", "overwrite": "--overwrite"}``); by default these keywords themselves."""
        names = {"resume": "resume", "overwrite": "overwrite"} | (option_names or {})
        resume_name, overwrite_name = names["resume"], names["overwrite"]
        if kind not in RUN_KINDS:
            raise ValueError(f"kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
        if resume and overwrite:
            raise ValueError(f"{resume_name} and {overwrite_name} exclude each other: continue the run, or replace it")
        path = os.fspath(path)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"output directory {path!r} is a file, not a directory")
        entries = [name for name in os.listdir(path) if name != LOCK] if os.path.isdir(path) else []
        if not entries:
            if resume:
                raise ValueError(f"nothing to resume: {path!r} holds no causalqwen run")
            os.makedirs(path, exist_ok=True)
            handle = cls._lock(path)
            with open_for_writing(os.path.join(path, MARKER)) as marker:
                json.dump({"kind": kind}, marker)
            return cls(path, kind, False, handle)

        if MARKER not in entries:
            raise ValueError(
                f"output directory {path!r} exists and is not a causalqwen run (it has no {MARKER}); "
                "a run writes only into a new or empty directory or one of its own runs, and never deletes "
                "files it did not write: choose another directory"
            )
        found = _read_marker(path)["kind"]
        if found != kind:
            what = "a training run" if found == "train" else "a demo run"
            raise ValueError(
                f"output directory {path!r} holds {what}; a {kind} run never replaces it: choose another directory"
            )
        if not (resume or overwrite):
            hint = (
                f"pass {resume_name} to continue it or {overwrite_name} to replace it"
                if kind == "train"
                else f"pass {overwrite_name} to replace it"
            )
            raise ValueError(f"output directory {path!r} holds a previous {kind} run; {hint}")
        handle = cls._lock(path)
        if overwrite:
            kept = cls._remove_outputs(path, kind)
            if kept:
                logger.warning(
                    "%s kept what no %s run wrote (causalqwen never deletes it; move or remove it yourself): %s",
                    overwrite_name,
                    kind,
                    "; ".join(kept),
                )
        return cls(path, kind, bool(resume), handle)

    @staticmethod
    def _lock(path: str):
        lock_path = os.path.join(path, LOCK)
        check_not_link(lock_path)
        handle = open_lock_file(lock_path)  # read and write, created if missing, never through a link
        if fcntl is None:
            return handle
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ValueError(f"output directory {path!r} is in use by another causalqwen run (pid {holder})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return handle

    @staticmethod
    def _remove_outputs(path: str, kind: str) -> list[str]:
        """Remove what a run of ``kind`` wrote in ``path`` (`_remove_output`, entry by entry); return what stays:
        each entry that is not a run's output, and each run output that holds what the run did not write."""
        kept = []
        for name in sorted(os.listdir(path)):
            if name in (MARKER, LOCK):
                continue
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_OUTPUTS[kind]):
                kept.append(f"{os.path.join(path, name)!r}, which a {kind} run does not write")
            elif (reason := _remove_output(path, name)) is not None:
                kept.append(reason)
        return kept

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._lock_handle is not None:
            self._lock_handle.close()  # closing the descriptor drops the flock
            self._lock_handle = None

    def __enter__(self) -> "RunDirectory":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"RunDirectory({self.path!r}, kind={self.kind!r}, resumed={self.resumed})"
