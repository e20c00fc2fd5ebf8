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

**Never through a link.** Every file causalqwen writes itself is opened by `open_for_writing`: with
``O_NOFOLLOW``, so a symbolic link planted under the file's name (``.causalqwen.lock``,
``metrics.jsonl``, ``history.json``, ...) is an ``OSError`` naming it instead of a write into whatever
it points to; a file with a second hard link, or that is not a regular file, is refused the same way
(truncating it would change the other name's content too). With ``root`` (the run directory), every
directory between ``root`` and the file must be a real directory, not a link: a symlinked
``checkpoint-*`` or ``model`` directory would carry the writes outside the run directory. Writers
that open files themselves (transformers' and peft's ``save_pretrained``, safetensors' ``save_file``)
are preceded by `check_write_targets`, which refuses the same things among the names they will
write. A refused link is left in place, and what it points to is not touched.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import logging
import os
import shutil
import stat

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected against each other there
    fcntl = None

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

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # 0 where the platform has none (Windows): the lstat checks remain
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a planted FIFO fails at once instead of waiting for a reader
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# =============================================================================================
# Writing without following links
# =============================================================================================


def _link_error(path: str) -> OSError:
    return OSError(
        f"{path!r} is a symbolic link; causalqwen never writes through a link (it may point outside the directory): "
        "remove the link or choose another directory"
    )


def check_not_link(path) -> None:
    """``OSError`` naming ``path`` if it is a symbolic link (a missing path is fine)."""
    if os.path.islink(path):
        raise _link_error(os.fspath(path))


def check_writable(path) -> None:
    """``OSError`` naming ``path`` unless causalqwen may write it: not a symbolic link and, if it exists, a regular
    file with no second hard link (what `open_for_writing` checks, for a file that is read before it is rewritten)."""
    path = os.fspath(path)
    check_not_link(path)
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return
    _check_existing_file(path, status)


def _check_directories(path: str, root) -> None:
    """Every directory from ``root`` (excluded) down to the one holding ``path``: a real directory, never a link."""
    if root is None:
        return
    root = os.path.abspath(os.fspath(root))
    parent = os.path.dirname(os.path.abspath(path))
    relative = os.path.relpath(parent, root)
    if relative == os.curdir:
        return
    if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
        raise OSError(f"{path!r} lies outside the run directory {root!r}; causalqwen writes only inside it")
    current = root
    for part in relative.split(os.sep):
        current = os.path.join(current, part)
        check_not_link(current)


def _check_existing_file(path: str, status: os.stat_result) -> None:
    """A file about to be overwritten: a regular file with no other name (``OSError`` naming it otherwise)."""
    if not stat.S_ISREG(status.st_mode):
        raise OSError(f"{path!r} exists and is not a regular file; causalqwen writes only regular files")
    if status.st_nlink > 1:
        raise OSError(
            f"{path!r} has {status.st_nlink} hard links; writing it would change the file under its other names too: "
            "remove it or choose another directory"
        )


def open_for_writing(path, mode: str = "w", *, root=None, encoding: str | None = "utf-8"):
    """Open ``path`` for writing (``mode`` ``"w"``, ``"a"``, ``"wb"`` or ``"ab"``) without ever following a link.

    The file is opened with ``O_NOFOLLOW`` (a symbolic link in its place is an ``OSError`` naming it), must be
    a regular file with a single name (a hard link shared with a file elsewhere is refused, since truncating it
    would change that file too), and is truncated (``"w"``) only after these checks. With ``root``, every
    directory between ``root`` and the file must be a real directory (`check_write_targets` explains why).
    Returns the file object, in text mode with ``encoding`` unless ``mode`` ends in ``"b"``.
    """
    path = os.fspath(path)
    if mode not in ("w", "a", "wb", "ab"):
        raise ValueError(f"mode must be 'w', 'a', 'wb' or 'ab', got {mode!r}")
    _check_directories(path, root)
    check_not_link(path)
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC | (os.O_APPEND if mode[0] == "a" else 0)
    return _open_checked(path, mode, flags, 0o666, encoding)


def _open_checked(path: str, mode: str, flags: int, permissions: int, encoding: str | None):
    """The built-in ``open`` of ``path`` in ``mode``, its descriptor made by ``os.open(path, flags, permissions)``
    (flags with ``O_NOFOLLOW`` and ``O_NONBLOCK``): a link in the path's place (planted, perhaps, between a check and
    the open) or a FIFO is an ``OSError`` naming it, an existing file must pass `_check_existing_file`, then it is
    truncated (``mode`` ``"w..."``) and put back in blocking mode.

    ``open`` owns the descriptor from the moment the opener returns it and closes it itself if building the file
    object fails; a Ctrl-C anywhere on the way is therefore a ``KeyboardInterrupt`` and the descriptor is closed
    exactly once (closing it again ourselves would be an ``EBADF`` ``OSError`` replacing the interrupt)."""

    def opener(name, _flags) -> int:
        try:
            descriptor = os.open(name, flags, permissions)
        except OSError as error:
            if error.errno == errno.ELOOP or os.path.islink(name):
                raise _link_error(name) from None
            if error.errno == errno.ENXIO:  # a FIFO without a reader
                raise OSError(
                    f"{name!r} exists and is not a regular file; causalqwen writes only regular files"
                ) from None
            raise
        try:
            _check_existing_file(name, os.fstat(descriptor))
            if mode[0] == "w":
                os.ftruncate(descriptor, 0)
            if _NONBLOCK and hasattr(os, "set_blocking"):
                os.set_blocking(descriptor, True)
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor

    if mode.endswith("b"):
        return open(path, mode, opener=opener)
    return open(path, mode, encoding=encoding, opener=opener)


def check_write_targets(directory, patterns=("*",), *, root=None) -> None:
    """Before a writer that opens its files itself (transformers', peft's, safetensors', matplotlib's): refuse
    with an ``OSError`` naming them a ``directory`` that is a symbolic link or not a directory, and any entry of
    it matching ``patterns`` (shell patterns: the names the writer will write) that is a symbolic link, not a
    regular file, or a file with a second hard link. Those writers follow links, so this is what keeps their
    files inside ``directory``. With ``root``, the directories between ``root`` and ``directory`` are checked
    too (`open_for_writing`)."""
    directory = os.fspath(directory)
    _check_directories(os.path.join(directory, "_"), root)
    check_not_link(directory)
    if not os.path.exists(directory):
        return
    if not os.path.isdir(directory):
        raise OSError(f"{directory!r} exists and is not a directory")
    links, others = [], []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in patterns):
                continue
            if entry.is_symlink():
                links.append(entry.path)
            elif not entry.is_dir(follow_symlinks=False):
                try:
                    _check_existing_file(entry.path, entry.stat(follow_symlinks=False))
                except OSError as error:
                    others.append(str(error))
    if links:
        raise OSError(
            f"{', '.join(repr(link) for link in sorted(links))}: symbolic link{'s' if len(links) > 1 else ''} where "
            "causalqwen is about to write; it never writes through a link (it may point outside the directory): "
            "remove the link or choose another directory"
        )
    if others:
        raise OSError("; ".join(sorted(others)))


def make_directory(path, *, root=None) -> str:
    """``path`` created if missing (with its parents), and checked to be a real directory, never a link (nor any
    directory between ``root`` and it); ``OSError`` naming it otherwise. Returns ``path`` as a string."""
    path = os.fspath(path)
    check_write_targets(path, (), root=root)
    os.makedirs(path, exist_ok=True)
    check_write_targets(path, (), root=root)
    return path


def remove_run_output(run_dir, name: str) -> None:
    """Remove the entry ``name`` of the run directory ``run_dir`` (a claimed one: it holds the `MARKER`), as the
    run that wrote it: ``name`` must be one of the outputs a run of the marker's kind writes (`RUN_OUTPUTS`), and
    the entry a real directory (removed with its contents, whose links are removed, never followed) or a regular
    file. Anything else -- a symbolic link (never followed nor removed), a FIFO, a name outside the run's
    outputs, a directory without the marker -- is an ``OSError`` naming it, and nothing is removed."""
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
    status = os.lstat(path)
    if stat.S_ISDIR(status.st_mode):
        shutil.rmtree(path)  # refuses a directory swapped for a link since the lstat
    elif stat.S_ISREG(status.st_mode):
        os.unlink(path)
    else:
        raise OSError(
            f"{path!r} is a symbolic link or a special file, not an output the run wrote; it is left in place"
        )


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
                logger.info("overwrite kept files that a %s run does not write: %s", kind, ", ".join(kept))
        return cls(path, kind, bool(resume), handle)

    @staticmethod
    def _lock(path: str):
        lock_path = os.path.join(path, LOCK)
        check_not_link(lock_path)
        # read and write, created if missing, never through a link (the module docstring)
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        handle = _open_checked(lock_path, "r+", flags, 0o644, "utf-8")
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
