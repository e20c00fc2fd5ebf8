"""Host synchronisations: how often CausalQwen makes the host wait for the device, against Qwen2.

On a GPU every read of a device value by Python (``bool(t)``, ``t.item()``, ``t.tolist()``, a copy to
the CPU) and every operation whose output shape depends on the data (``nonzero``, boolean-mask
indexing, ``masked_select``, ``unique``) stalls the host until the device has caught up, so the launch
queue runs dry. Counting them needs no GPU: `HostSyncCounter` sees the same calls on the CPU,

* at the operator level (a ``TorchDispatchMode``): ``aten._local_scalar_dense`` (what ``bool``, ``int``,
  ``float`` and ``item`` reduce to), the data-dependent-shape operators (boolean-mask indexing included)
  and copies from a device to the CPU;
* at the Python level (a ``TorchFunctionMode``): ``Tensor.tolist`` and ``Tensor.numpy`` of CPU tensors,
  which read memory without an operator where on a device they copy to the host.

On CUDA the same counts can be cross-checked with ``torch.cuda.set_sync_debug_mode("warn")``.

The report counts, for the same left-padded batch of real-looking text with numbers (the tiny base;
the counts do not depend on the model's size): one training forward with labels, its backward, one
forward without labels, and generation per new token (by differencing 1 and 9 new tokens) in every
mode, for `causalqwen.generate` and transformers' loop (`CausalQwenForCausalLM.generate`), each beside
``Qwen2ForCausalLM`` doing the same job, and where each of CausalQwen's synchronisations comes from.
The goal: per generated token, no more than Qwen2's ``generate`` on the same prompts, in both loops
and every mode. Both make one, the stop test: a step of transformers' loop runs the plain forward without its input
check (the prompt is checked once, at the door), and Qwen2 is handed its attention masks built, without its look at
whether the padding could be dropped (the door has looked). There were once 17-18 per training forward and 12-14
per generated token; ``tests/test_benchmarks.py`` and ``tests/test_integrations_generation_mixin.py`` keep them from
creeping back.
"""

from __future__ import annotations

import argparse
import collections
import traceback
from pathlib import Path
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import causalqwen
from causalqwen import generate
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.inference import MODES

from .common import machine, markdown_table, write_report

PROMPTS = ["the price of tea rose by 12.5 percent to 3.40 dollars and", "on day 3 we counted 41 birds", "hello"]

# operators that read a device value on the host or whose output shape depends on the data
SYNC_OPERATORS = frozenset(
    {
        "_local_scalar_dense",
        "is_nonzero",
        "equal",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "repeat_interleave",
        "_assert_async",
    }
)
SYNC_METHODS = frozenset({"tolist", "numpy"})


class HostSyncCounter:
    """Count host synchronisations inside a ``with`` block; ``counts`` maps a name to how often it occurred.

    ``sites`` counts them by the line that caused them: the innermost frame outside torch, as
    ``package/file.py:line (function)``.
    """

    def __init__(self):
        self.counts: collections.Counter[str] = collections.Counter()
        self.sites: collections.Counter[str] = collections.Counter()
        self._modes = (_FunctionLevel(self), _OperatorLevel(self))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, name: str) -> None:
        self.counts[name] += 1
        frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename and f.filename != __file__]
        innermost = frames[-1] if frames else None
        where = f"{_short_path(innermost.filename)}:{innermost.lineno} ({innermost.name})" if innermost else "?"
        self.sites[where] += 1

    def __enter__(self) -> "HostSyncCounter":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def _short_path(filename: str) -> str:
    """A file of this repository relative to its root (``causalqwen/kernels/fused.py``, ``tests/test_x.py``), whatever
    the folders above the root are called; another file by its last two parts."""
    path = Path(filename).resolve()
    for root in _ROOTS:
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return "/".join(path.parts[-2:])


# The folder that holds benchmarks/ and tests/, and the one that holds the installed causalqwen package.
_ROOTS = (Path(__file__).resolve().parent.parent, Path(causalqwen.__file__).resolve().parent.parent)


class _FunctionLevel(TorchFunctionMode):
    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNC_METHODS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu":
            self.counter.record(name)  # on a device the copy it makes is counted at the operator level
        return func(*args, **(kwargs or {}))


class _OperatorLevel(TorchDispatchMode):
    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        kwargs = kwargs or {}
        if name in SYNC_OPERATORS:
            self.counter.record(name)
        elif name in ("index", "index_put", "index_put_") and _boolean_index(args):
            self.counter.record(f"{name} with a boolean mask")
        elif name in ("_to_copy", "copy_") and _device_to_host(name, args, kwargs):
            self.counter.record("copy to host")
        return func(*args, **kwargs)


def _boolean_index(args) -> bool:
    """A boolean-mask index: the positions are found with a ``nonzero`` inside the operator."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _device_to_host(name: str, args, kwargs) -> bool:
    if name == "_to_copy":
        source, target = args[0], kwargs.get("device")
        return source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    target, source = args[0], args[1]
    return isinstance(source, torch.Tensor) and source.device.type != "cpu" and target.device.type == "cpu"


def count(run) -> HostSyncCounter:
    """The host synchronisations of one call of ``run()``."""
    with HostSyncCounter() as counter:
        run()
    return counter


class Job(NamedTuple):
    name: str
    ours: float  # CausalQwen's synchronisations (per call, or per generated token)
    qwen: float  # Qwen2's for the same job
    own_sites: dict  # CausalQwen's, by the line in causalqwen that caused them


def _own(sites: collections.Counter, scale: float = 1.0) -> dict:
    return {site: n / scale for site, n in sorted(sites.items()) if site.startswith("causalqwen/") and n > 0}


def measure() -> list[Job]:
    """CausalQwen's and Qwen2's synchronisations for every job of the report."""
    model, numeric, qwen = build_tiny_causal_lm(seed=0, init_seed=0)
    model.eval()
    batch = numeric(PROMPTS, padding_side="left")
    ids, values, mask = batch["input_ids"], batch["numeric_values"], batch["attention_mask"]
    labels = ids.masked_fill(mask == 0, -100)
    jobs = []

    def once(name, ours, theirs):
        counted = count(ours)
        jobs.append(Job(name, counted.total, count(theirs).total, _own(counted.sites)))

    def ours_forward():
        return model(input_ids=ids, numeric_values=values, attention_mask=mask, labels=labels)

    def qwen_forward():
        return qwen(input_ids=ids, attention_mask=mask, labels=labels)

    once("training forward (labels)", ours_forward, qwen_forward)
    once("its backward", ours_forward().loss.backward, qwen_forward().loss.backward)
    with torch.no_grad():
        once(
            "forward without labels",
            lambda: model(input_ids=ids, numeric_values=values, attention_mask=mask),
            lambda: qwen(input_ids=ids, attention_mask=mask),
        )

    def per_token(make_run) -> tuple[float, collections.Counter]:
        one, many = count(make_run(1)), count(make_run(9))
        return (many.total - one.total) / 8, many.sites - one.sites

    def qwen_generate(n):
        return lambda: qwen.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n)

    qwen_per_token, _ = per_token(qwen_generate)
    for mode in MODES:

        def ours(n, mode=mode):
            return lambda: generate(
                model,
                ids,
                values,
                mask,
                mode=mode,
                max_new_tokens=n,
                eos_token_id=[],
                generator=torch.Generator().manual_seed(0),
            )

        def hf(n, mode=mode):
            sampling = dict(do_sample=True) if mode == "traditional" else {}
            return lambda: model.generate(
                ids,
                numeric_values=values,
                attention_mask=mask,
                mode=mode,
                max_new_tokens=n,
                min_new_tokens=n,
                generator=torch.Generator().manual_seed(0),
                **sampling,
            )

        for loop, make_run in (("causalqwen.generate", ours), ("model.generate", hf)):
            syncs, sites = per_token(make_run)
            jobs.append(Job(f"{loop}, {mode}, per token", syncs, qwen_per_token, _own(sites, 8)))
    return jobs


def run() -> str:
    """Measure; return the markdown report."""
    rows = [
        [
            job.name,
            f"{job.ours:g}",
            f"{job.qwen:g}",
            f"{job.ours - job.qwen:+g}",
            ", ".join(f"`{site}`" + (f" x{n:g}" if n != 1 else "") for site, n in job.own_sites.items()) or "none",
        ]
        for job in measure()
    ]
    table = markdown_table(["job", "CausalQwen", "Qwen2", "difference", "CausalQwen's own, by line"], rows)
    report = "\n\n".join(
        [
            "### Host synchronisations per job: CausalQwen against Qwen2",
            f"The same left-padded batch of {len(PROMPTS)} texts with numbers, the tiny base (the counts do not depend "
            f"on the size); counted by `benchmarks.syncs.HostSyncCounter` (device reads, data-dependent shapes, copies "
            f"to the host); generation per token by differencing 9 and 1 new tokens; {machine()}. The rest of each "
            "count is transformers' own (its generation loop's stop test; for Qwen2, its look at a padded mask).",
            table,
        ]
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks syncs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args(argv)
    report = run()
    print(report)
    write_report(args.out, report)
    return 0
