"""The compiled tile (`causalqwen.kernels.tiles.compiled`): equal to the literal tile, the fallback with one
warning, the switch.

Oracles: the literal function `tiles.tile_elementwise` run eagerly (the specification of the compiled code), and
float64 evaluation of the same kernel for the size of the rounding differences. The fused loss's own equality
tests against the literal head (tests/test_kernels_fused.py) run through the compiled tile, the default.
"""

import warnings

import pytest
import torch
from wall_clock import budget

from causalqwen.kernels import tiles
from causalqwen.kernels.fused import fused_ovr_classification_loss
from causalqwen.kernels.tiles import COMPILE_ENV, compile_enabled, compiled


def _tile(rows, classes, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    diff = (torch.randn(rows, classes, generator=generator, dtype=torch.float64) * 60).to(dtype)
    scale_raw = (torch.rand(rows, classes, generator=generator, dtype=torch.float64) * 30).to(dtype)
    scale_raw[0, :3] = 0.0  # below the floor: no gradient passes
    diff[1, :2] = 0.0  # the kernel's branch point
    return diff, scale_raw


@pytest.mark.parametrize("value,grads", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("shape", [(128, 1024), (37, 300), (2, 7)])
def test_compiled_tile_equals_the_literal_tile_to_a_few_ulp(shape, value, grads):
    diff, scale_raw = _tile(*shape)
    got = tiles.tile_elementwise_compiled(diff, scale_raw, 1e-6, value, grads)
    want = tiles.tile_elementwise(diff, scale_raw, 1e-6, value, grads)
    exact = tiles.tile_elementwise(diff.double(), scale_raw.double(), 1e-6, value, grads)  # float64 reference
    assert tiles.tile_elementwise_compiled.failure is None  # it did compile here
    for a, b, c in zip(got, want, exact):
        assert (a is None) == (b is None)
        if a is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        # the compiled code is no further from float64 than the literal float32 code, give or take a few ulp
        err_compiled = (a.double() - c).abs()
        err_literal = (b.double() - c).abs()
        ulp = torch.finfo(torch.float32).eps * c.abs().clamp_min(torch.finfo(torch.float32).tiny)
        assert bool((err_compiled <= err_literal + 4 * ulp * (c.shape[-1] if a.dim() == 1 else 1)).all())
    if grads:  # where the floor applied, the scale gradient is exactly zero in both
        assert bool((got[2][0, :3] == 0).all())


def test_the_fused_loss_is_the_same_compiled_or_not(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    n, C, V = 40, 16, 300
    loc_U = torch.randn(n, C, generator=generator, requires_grad=True)
    scale_U = (torch.rand(n, C, generator=generator) + 0.5).requires_grad_()
    weight = (torch.randn(V, C, generator=generator) * 0.2).requires_grad_()
    bias = torch.zeros(V, requires_grad=True)
    noise = torch.full((C,), 0.1, requires_grad=True)
    labels = torch.randint(0, V, (n,), generator=generator)
    labels[:3] = -100

    def run():
        for leaf in (loc_U, scale_U, weight, bias, noise):
            leaf.grad = None
        loss = fused_ovr_classification_loss(
            loc_U,
            scale_U,
            weight,
            bias,
            noise,
            10.0,
            labels=labels,
            reduction="sum",
            chunk_size=16,
            vocab_chunk_size=128,
        )
        loss.backward()
        return [loss.detach()] + [leaf.grad.clone() for leaf in (loc_U, scale_U, weight, bias, noise)]

    compiled_results = run()
    monkeypatch.setenv(COMPILE_ENV, "0")
    eager_results = run()
    for a, b in zip(compiled_results, eager_results):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("setting,enabled", [("0", False), ("off", False), ("False", False), ("1", True), ("", True)])
def test_the_switch(monkeypatch, setting, enabled):
    monkeypatch.setenv(COMPILE_ENV, setting)
    assert compile_enabled() is enabled


def test_a_kernel_that_cannot_compile_falls_back_with_one_warning():
    """Where compiling fails (here: the compiled callable raises as inductor does without a compiler), the call
    warns once, the literal function gives the answer, and it does so from then on without trying again."""
    calls = []

    def literal(x):
        calls.append(1)
        return x * 2

    kernel = compiled(literal)
    kernel._compiled = _raising
    with pytest.warns(RuntimeWarning, match="torch.compile of .*literal failed .*running the literal"):
        assert torch.equal(kernel(torch.ones(3)), torch.full((3,), 2.0))
    assert kernel.failure == "RuntimeError: no C++ compiler found"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call does not warn again
        assert torch.equal(kernel(torch.ones(3)), torch.full((3,), 2.0))
    assert len(calls) == 2


def test_under_a_tensor_mode_the_literal_function_runs_and_nothing_is_marked_failed():
    """A dispatch or function mode (a tracer, a sync counter) sees the literal operations; compiling beneath it is
    not attempted (in torch 2.13 it can fail after a compile under another mode) and not recorded as a failure.
    ``with torch.device(...)`` is a function mode too, and does not count."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Operators(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    ran = []
    kernel = compiled(lambda x: ran.append("literal") or x * 2)
    kernel._compiled = lambda x: ran.append("compiled") or x * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mode in (Operators, Functions, Operators):
            with mode():
                assert torch.equal(kernel(torch.ones(2)), torch.full((2,), 2.0))
        with torch.device("cpu"):
            kernel(torch.ones(2))
        kernel(torch.ones(2))
    assert ran == ["literal"] * 3 + ["compiled"] * 2 and kernel.failure is None

    # the real tile, in the order that made torch 2.13 fail: under a dispatch mode, then under a function mode
    tile = compiled(tiles.tile_elementwise)
    diff, scale = torch.randn(16, 32) * 50, torch.rand(16, 32) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for mode in (Operators, Functions):
            with mode():
                got = tile(diff, scale, 1e-6, True, True)
            for a, b in zip(got, tiles.tile_elementwise(diff, scale, 1e-6, True, True)):
                assert torch.equal(a, b)
    assert tile.failure is None


def _raising(*args, **kwargs):
    raise RuntimeError("no C++ compiler found\nmore detail")


SCRIPT = """
import warnings, torch, torch._inductor.config as config
config.cpp.cxx = ("/nonexistent/c++",)  # a machine without a C++ compiler
from causalqwen.kernels import tiles
diff, scale = torch.randn(8, 33) * 5, torch.rand(8, 33) + 0.1
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = tiles.tile_elementwise_compiled(diff, scale, 1e-6, True, True)
    again = tiles.tile_elementwise_compiled(diff, scale, 1e-6, True, True)
want = tiles.tile_elementwise(diff, scale, 1e-6, True, True)
assert all(torch.equal(a, b) for a, b in zip(got, want)) and all(torch.equal(a, b) for a, b in zip(again, want))
ours = [w for w in caught if "causalqwen: torch.compile" in str(w.message)]
print(len(ours), tiles.tile_elementwise_compiled.failure is not None)
"""


def test_without_a_compiler_the_tile_runs_eagerly_after_one_warning(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), CAUSALQWEN_COMPILE="1")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=budget(300)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1", "True"]
