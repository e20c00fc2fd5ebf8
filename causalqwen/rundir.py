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

``overwrite`` never removes a file that a run does not write: a data file, notes or anything else
a user put in the directory stays where it is. The demo replaces an earlier *demo* on its own
(that is its job), but never a training run.

**The lock.** The claim takes an exclusive ``flock`` on ``.causalqwen.lock`` (and writes its pid
there) before it removes or writes anything; a second run on the same directory is refused while
the first holds it. The operating system releases the lock when the process ends, also by
``kill -9``, so a crashed run never leaves the directory blocked.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected against each other there
    fcntl = None

__all__ = ["MARKER", "LOCK", "RUN_KINDS", "RUN_OUTPUTS", "RunDirectory"]

logger = logging.getLogger(__name__)

MARKER = "causalqwen-run.json"
LOCK = ".causalqwen.lock"
RUN_KINDS = ("train", "demo")
# What a run of each kind writes into its directory (shell patterns); `overwrite` removes these and nothing else.
_TRAIN_OUTPUTS = ("training_config.json", "metrics.jsonl", "checkpoint-*", "model", "adapter", "tensorboard", "wandb")
RUN_OUTPUTS = {"train": _TRAIN_OUTPUTS, "demo": _TRAIN_OUTPUTS + ("loss.png", "metrics.png")}


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
    def claim(cls, path, kind: str, *, resume: bool = False, overwrite: bool = False) -> "RunDirectory":
        """Claim ``path`` for a run of ``kind``; raise ``ValueError`` naming the directory and the rule otherwise."""
        if kind not in RUN_KINDS:
            raise ValueError(f"kind must be one of {', '.join(RUN_KINDS)}, got {kind!r}")
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other: continue the run, or replace it")
        path = os.fspath(path)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"output directory {path!r} is a file, not a directory")
        entries = [name for name in os.listdir(path) if name != LOCK] if os.path.isdir(path) else []
        if not entries:
            if resume:
                raise ValueError(f"nothing to resume: {path!r} holds no causalqwen run")
            os.makedirs(path, exist_ok=True)
            handle = cls._lock(path)
            with open(os.path.join(path, MARKER), "w", encoding="utf-8") as marker:
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
            raise ValueError(f"output directory {path!r} holds {what}; a {kind} run never replaces it: choose another directory")
        if not (resume or overwrite):
            hint = "pass resume to continue it or overwrite to replace it" if kind == "train" else "pass overwrite to replace it"
            raise ValueError(f"output directory {path!r} holds a previous {kind} run; {hint}")
        handle = cls._lock(path)
        if overwrite:
            kept = cls._remove_outputs(path, kind)
            if kept:
                logger.info("overwrite kept files that a %s run does not write: %s", kind, ", ".join(kept))
        return cls(path, kind, bool(resume), handle)

    @staticmethod
    def _lock(path: str):
        lock_path = os.path.join(path, LOCK)
        handle = open(lock_path, "a+", encoding="utf-8")
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
        """Remove the entries of ``path`` that a run of ``kind`` writes; return the names of the others."""
        kept = []
        for name in sorted(os.listdir(path)):
            if name in (MARKER, LOCK):
                continue
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_OUTPUTS[kind]):
                kept.append(name)
                continue
            full = os.path.join(path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)  # a file, or a link (never what it points to)
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
