"""How many threads the command line's torch runs on (``--threads``): what a shared machine has free, not every core.

torch starts one intra-op thread per core, and its threads spin while they wait for each other. Beside another busy
process that is the slowest choice there is: on a 2-core machine under load, ``causalqwen train`` took 4.6 to 6.4 s
a step with torch's two threads and 0.28 s with one. So the default is what is free: the CPUs this process may run
on (``os.sched_getaffinity``) less the load already on the machine (the one-minute load average), at least one. An
``OMP_NUM_THREADS`` in the environment is the user's choice and wins over that default; ``--threads N`` wins over both.
"""

from __future__ import annotations

import math
import os

__all__ = ["available_cpus", "default_threads", "set_threads", "THREADS_HELP"]

THREADS_HELP = (
    "intra-op threads of torch, at least 1 (default: OMP_NUM_THREADS if set, else the CPUs this process may use "
    "less the machine's load, the one-minute load average, at least 1: torch's own default, one thread per core, "
    "ran 20x slower a step beside another busy process on 2 cores)"
)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is set to a positive integer (a ``ValueError`` naming it when set to anything
    else), else `available_cpus` less the one-minute load average rounded up, at least 1."""
    given = os.environ.get("OMP_NUM_THREADS")
    if given is not None and given.strip():
        if not given.strip().isdecimal() or int(given) < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a positive integer, got {given!r}")
        return int(given)
    cpus = available_cpus()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): every CPU is taken as free
        load = 0.0
    return max(1, min(cpus, cpus - math.ceil(load - 0.5)))


def set_threads(threads: int | None) -> int:
    """Run torch's intra-op work on ``threads`` threads (None: `default_threads`); return the number set."""
    import torch

    count = default_threads() if threads is None else threads
    torch.set_num_threads(count)
    return count
