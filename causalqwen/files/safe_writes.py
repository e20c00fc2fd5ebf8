r"""Writing files of a run without ever following a link.

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
import os
import stat

__all__ = [
    "open_for_writing",
    "open_lock_file",
    "check_write_targets",
    "check_not_link",
    "check_writable",
    "make_directory",
]

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


def open_lock_file(path):
    """``path`` opened for reading and writing (created if missing, permissions 0o644), never through a link nor a
    FIFO, with the checks of `open_for_writing` (a regular file with one name); for a run directory's lock."""
    flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    return _open_checked(os.fspath(path), "r+", flags, 0o644, "utf-8")
