r"""Which checkpoints a run has, and which of their files the run wrote.

`causalqwen.app.runs` writes a checkpoint ``checkpoint-{step}/`` under a temporary name and renames it; this
module finds them (`latest_checkpoint`: only the names the run writes, anything it would mistake for one is an
``OSError``) and removes old checkpoints file by file, only what the record of the files their save wrote lists
(`remove_old_checkpoints`; the record is `causalqwen.files.written_files`'): a checkpoint holding anything else is
kept with a warning naming it, so nothing the run did not write is deleted.
"""

from __future__ import annotations

import logging
import os
import re

from .safe_writes import check_not_link
from .training_state import TRAINING_JSON, read_training_record
from .written_files import CHECKPOINT_RECORD, record_checkpoint_files, remove_checkpoint, remove_killed_save

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
