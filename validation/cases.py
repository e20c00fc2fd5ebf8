"""How a robustness row and a trust-boundary row are written, run and judged.

A row of the bad-input and checkpoint tables (`BadInputCase`) holds a zero-argument callable that
commits one mistake, the exception type it must raise exactly and a regular expression its message must
contain; `run_case` triggers it and judges what it raised (`CaseOutcome`). A row of the trust-boundary
tables (`TrustCase`, judged by `run_trust_case`) may instead have to *succeed*: its trigger checks the
result and raises `WrongResult` otherwise. The command line runs in-process (`run_cli`), an exit through
argparse surfacing as a `CommandLineExit` whose message a row can match.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from typing import Callable

from .fixtures import quiet_transformers

__all__ = [
    "COMPONENTS",
    "BadInputCase",
    "CaseOutcome",
    "run_case",
    "CommandLineExit",
    "run_cli",
    "KINDS",
    "WrongResult",
    "TrustCase",
    "TrustOutcome",
    "command_line_refusal",
    "run_trust_case",
]

COMPONENTS = ("tokenizer", "model", "losses", "inference", "generation", "cli")
# The kinds of finding a trust case holds the project to: an input from someone else that could run code or touch
# the user's files; an input that gave a wrong answer without a word; an input that failed with a message naming
# nothing.
KINDS = ("security", "silent", "clarity")


# =============================================================================================
# Bad inputs and tampered checkpoints: the exact error and a message naming what is wrong
# =============================================================================================


@dataclass(frozen=True)
class BadInputCase:
    """One kind of wrong input and the clear error it must raise.

    Attributes:
        id: a short stable name (the test id).
        component: where the input goes: one of `COMPONENTS` (or ``"checkpoint"``).
        description: the mistake, in words.
        trigger: a zero-argument callable that makes the mistake.
        error: the exception type that must be raised, exactly (not a subclass).
        message: a regular expression that the message must contain (``re.search``); it names what is wrong.
    """

    id: str
    component: str
    description: str
    trigger: Callable[[], object]
    error: type[BaseException]
    message: str


@dataclass
class CaseOutcome:
    """What a `BadInputCase` did: ``passed`` when it raised exactly ``case.error`` with a matching message."""

    case: BadInputCase
    passed: bool
    actual: str  # "TypeName: message", or "no error raised"


def _raised(trigger: Callable[[], object]) -> Exception | None:
    """Call ``trigger`` (warnings and progress bars of transformers silenced); the exception it raised, or None."""
    try:
        with quiet_transformers():
            trigger()
    except Exception as error:  # noqa: BLE001 -- judging the exception is the point
        return error
    return None


def run_case(case: BadInputCase) -> CaseOutcome:
    """Trigger ``case`` and judge what it raised (warnings and progress bars of transformers silenced)."""
    error = _raised(case.trigger)
    if error is None:
        return CaseOutcome(case, False, "no error raised")
    message = str(error)
    passed = type(error) is case.error and re.search(case.message, message) is not None
    return CaseOutcome(case, passed, f"{type(error).__name__}: {message}")


class CommandLineExit(Exception):
    """The ``causalqwen`` command exited through argparse (``SystemExit``).

    Its message is ``"exit status N: LAST LINE OF STDERR"``, so a table row can match both.
    """


def run_cli(args: list[str]) -> int:
    """Run ``causalqwen ARGS`` in-process with stdout and stderr captured; return its exit status.

    An exit through ``SystemExit`` (argparse's ``parser.error``, status 2) becomes a `CommandLineExit`
    whose message is ``"exit status N: <the last line written to stderr>"``.
    """
    from causalqwen.app import cli

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), quiet_transformers():
            return cli.main(args)
    except SystemExit as exit_:
        lines = err.getvalue().strip().splitlines()
        raise CommandLineExit(f"exit status {exit_.code}: {lines[-1] if lines else '(nothing on stderr)'}") from None


# =============================================================================================
# Trust boundaries: the exact error, or the right result
# =============================================================================================


class WrongResult(Exception):
    """A case that must succeed gave a wrong result, or a guarded side effect happened (a pickle ran, a
    file was deleted)."""


@dataclass(frozen=True)
class TrustCase:
    """One input from outside and what the project must do with it.

    Attributes:
        id: a short stable name.
        kind: the kind of finding, one of `KINDS`: ``"security"`` (code run or the user's files touched),
            ``"silent"`` (a wrong result without a word) or ``"clarity"`` (an error that named nothing).
        description: the input, in words.
        trigger: a zero-argument callable that gives the input (and checks the result or side effects).
        error: the exception type it must raise exactly, or None if it must succeed.
        message: a regular expression the message must contain (``re.search``); ignored when ``error`` is None.
    """

    id: str
    kind: str
    description: str
    trigger: Callable[[], object]
    error: type[BaseException] | None
    message: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"trust case {self.id!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")


def command_line_refusal(
    case_id: str, kind: str, description: str, trigger: Callable[[], object], message: str
) -> TrustCase:
    """A `TrustCase` whose trigger runs the ``causalqwen`` command (`run_cli`), which must exit through argparse with
    status 2 (a usage or data error) and a last line of stderr matching ``message``."""
    return TrustCase(case_id, kind, description, trigger, CommandLineExit, "exit status 2: " + message)


@dataclass
class TrustOutcome:
    """What a `TrustCase` did: ``passed`` when it raised as listed, or succeeded where it must."""

    case: TrustCase
    passed: bool
    actual: str


def run_trust_case(case: TrustCase) -> TrustOutcome:
    """Trigger ``case`` and judge it (transformers' warnings and progress bars silenced)."""
    error = _raised(case.trigger)
    if error is None:
        must_succeed = case.error is None
        return TrustOutcome(case, must_succeed, "ran, with the right result" if must_succeed else "no error raised")
    message = str(error)
    passed = case.error is not None and type(error) is case.error and re.search(case.message, message) is not None
    return TrustOutcome(case, passed, f"{type(error).__name__}: {message}")
