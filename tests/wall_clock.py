"""Wall-clock budgets of the tests: what a wait may take on a quiet machine, scaled to how busy this one is.

A budget is a hang guard (a subprocess, a thread, a page that should settle) or an order-of-magnitude claim
("fails at once", "reads headers only"), never a benchmark: each is set at ten times or more what the check takes
on a quiet 2-core machine, and `budget` multiplies it by `slowdown`, the machine's load per core when the wait
starts (at least 1). A machine that other jobs keep busy gives the check more time instead of failing a correct
build. ``CAUSALQWEN_TEST_SLOWDOWN=<factor>`` sets the factor by hand (a slow emulator, a sanitizer build).
"""

import os

SLOWDOWN_VARIABLE = "CAUSALQWEN_TEST_SLOWDOWN"


def slowdown() -> float:
    """``CAUSALQWEN_TEST_SLOWDOWN`` where it is set, else the one-minute load average per CPU, at least 1."""
    given = os.environ.get(SLOWDOWN_VARIABLE)
    if given is not None:
        factor = float(given)
        if not factor >= 1:
            raise ValueError(f"{SLOWDOWN_VARIABLE}={given!r}: expected a factor of at least 1")
        return factor
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def budget(quiet_seconds: float) -> float:
    """``quiet_seconds`` (the budget on a quiet machine) times `slowdown`."""
    return quiet_seconds * slowdown()
