"""The types of the command line's options (argparse ``type=``): bounded integers, seeds, paths and the resolution of
written numbers; each refuses a bad value with a one-line ``argparse.ArgumentTypeError`` that argparse reports with
the option's name and exit status 2."""

from __future__ import annotations

import argparse
import re

from ..training import SEED_MAX

__all__ = ["INT64_MAX", "integer", "SEED", "COUNT", "path_text", "input_text", "number_resolution"]

# Integer options. A count goes into torch and C code as a 64-bit integer; a seed seeds torch, Python and numpy,
# whose seeds are 32-bit. Values beyond these are refused by argparse, naming the option and the range. The
# lower bounds of counts are left to the settings' own checks (TrainingConfig, generate, TextDataset), which
# name the setting, except where noted.
INT64_MAX = 2**63 - 1
_BOUND_NAMES = {INT64_MAX: "2**63 - 1", SEED_MAX: "2**32 - 1"}


def _shown(text: str) -> str:
    """``text`` as an error message shows it: whole if short, else its start and its length."""
    return text if len(text) < 40 else f"{text[:12]}... ({len(text)} {'digits' if text.isdecimal() else 'characters'})"


def integer(low: int | None = None, high: int = INT64_MAX):
    """An argparse ``type``: a decimal integer at most ``high`` and, when ``low`` is given, at least ``low``.

    Anything else is an ``argparse.ArgumentTypeError``, which argparse reports as ``argument --OPTION:
    must be an integer from LOW to HIGH, got VALUE`` with exit status 2. An integer of more digits than
    Python converts (``sys.get_int_max_str_digits``) is out of range the same way, never a ``ValueError``.
    """
    bound = f"{high} ({_BOUND_NAMES[high]})" if high in _BOUND_NAMES else str(high)
    wanted = (
        f"must be an integer from {low} to {bound}" if low is not None else f"must be an integer no larger than {bound}"
    )

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            if re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):  # more digits than int() converts: out of range
                raise argparse.ArgumentTypeError(f"{wanted}, got {_shown(text)}") from None
            raise argparse.ArgumentTypeError(f"expected an integer, got {_shown(text)!r}") from None
        if value > high or (low is not None and value < low):
            raise argparse.ArgumentTypeError(f"{wanted}, got {_shown(text)}")
        return value

    return parse


SEED = integer(0, SEED_MAX)
COUNT = integer()


def path_text(text: str) -> str:
    """An argparse ``type`` for a file, directory or hub id: anything but an empty (or blank) string."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file, directory or hub id, got {text!r}")
    return text


def input_text(text: str) -> str:
    """An argparse ``type`` for a text the model reads (``walkthrough --text``): anything but an empty string, which
    has no token (a blank one has: spaces are tokens)."""
    if not text:
        raise argparse.ArgumentTypeError("must hold at least one character (an empty text has no token to read)")
    return text


def number_resolution(text: str):
    """``--number-resolution``: "prompt", "none" (None: the shortest float32 text) or a power of ten
    (`causalqwen.writing.check_resolution`)."""
    from ..writing import check_resolution

    if text == "none":
        return None
    try:
        value = text if text == "prompt" else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'a power of ten, "prompt" or "none", got {text!r}') from None
    try:
        return check_resolution(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
