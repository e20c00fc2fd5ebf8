"""The fused, tiled OvR head + loss equals the literal path: values and every gradient.

The oracle is the literal path (``ActionNetwork.forward`` then ``ovr_classification_loss``), itself
tested against SciPy in ``test_losses.py``; ``gradcheck`` checks the analytic gradients against
finite differences directly.
"""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_runs import tiny_model

from causalqwen.action import ActionNetwork
from causalqwen.kernels.fused import fused_ovr_classification_loss
from causalqwen.losses import ovr_classification_loss

EPS = 1e-6
NAMES = ["loc_U", "scale_U", "W", "b", "b_noise", "threshold"]


def _setup(
    seed,
    n,
    c,
    v,
    threshold_kind="scalar",
    learnable=True,
    dtype=torch.float64,
    ignored=(),
    clamp_row=True,
    zero_class=True,
):
    g = torch.Generator().manual_seed(seed)
    action = ActionNetwork(c, v, noise_init=0.3, scale_eps=EPS).to(dtype)
    with torch.no_grad():
        action.classification_head.weight.copy_(torch.randn(v, c, generator=g, dtype=dtype) * 2)
        if zero_class:
            action.classification_head.weight[min(2, v - 1)] = 0.0  # a class whose scale is all clamp
        action.classification_head.bias.copy_(torch.randn(v, generator=g, dtype=dtype))
        action.b_noise.copy_(torch.randn(c, generator=g, dtype=dtype))  # signs vary: the |b_noise| path
    loc_U = (torch.randn(n, c, generator=g, dtype=dtype) * 20).requires_grad_()
    scale_U = torch.rand(n, c, generator=g, dtype=dtype) * 3 + 0.01
    if clamp_row:
        scale_U[0] = 1e-9  # with a tiny noise this row's input scale is clamped
    scale_U.requires_grad_()
    if threshold_kind == "per_class":
        threshold = torch.full((v,), 5.0, dtype=dtype) + torch.randn(v, generator=g, dtype=dtype)
    else:
        threshold = torch.tensor(5.0, dtype=dtype)
    if threshold_kind == "number":
        threshold = 5.0
    else:
        threshold.requires_grad_(learnable)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[list(ignored)] = -100
    if n > 3 and 3 not in ignored:
        labels[3] = min(2, v - 1)  # a label on the all-clamp class
    return action, loc_U, scale_U, threshold, labels


def _inputs(action, loc_U, scale_U, threshold):
    head = action.classification_head
    tensors = [loc_U, scale_U, head.weight, head.bias, action.b_noise]
    if isinstance(threshold, torch.Tensor) and threshold.requires_grad:
        tensors.append(threshold)
    return tensors


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)


def _literal(action, loc_U, scale_U, threshold, labels):
    decision = action(loc_U, scale_U)
    return ovr_classification_loss(decision.loc_S, decision.scale_S, labels, threshold)


def _fused(action, loc_U, scale_U, threshold, labels, **kwargs):
    head = action.classification_head
    return fused_ovr_classification_loss(
        loc_U, scale_U, head.weight, head.bias, action.noise_scale, threshold, labels=labels, scale_eps=EPS, **kwargs
    )


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 9),
    c=st.integers(1, 5),
    v=st.integers(1, 12),
    chunk=st.sampled_from([1, 2, 3, 1000]),
    vocab_chunk=st.sampled_from([1, 2, 5, 1000]),
    threshold_kind=st.sampled_from(["number", "scalar", "per_class"]),
    learnable=st.booleans(),
    ignore_pattern=st.sampled_from(["none", "some", "all"]),
    tiny_noise=st.booleans(),
)
def test_fused_equals_literal_in_values_and_every_gradient(
    seed, n, c, v, chunk, vocab_chunk, threshold_kind, learnable, ignore_pattern, tiny_noise
):
    ignored = {"none": (), "some": tuple(range(0, n, 2))[1:], "all": tuple(range(n))}[ignore_pattern]
    action, loc_U, scale_U, threshold, labels = _setup(seed, n, c, v, threshold_kind, learnable, ignored=ignored)
    if tiny_noise:
        with torch.no_grad():
            action.b_noise[:] = 1e-12  # the input-scale clamp is active in row 0
    tensors = _inputs(action, loc_U, scale_U, threshold)
    weights = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))

    literal = _literal(action, loc_U, scale_U, threshold, labels)
    fused = _fused(action, loc_U, scale_U, threshold, labels, chunk_size=chunk, vocab_chunk_size=vocab_chunk)
    torch.testing.assert_close(fused, literal, rtol=1e-12, atol=1e-12)
    assert torch.all(fused[list(ignored)] == 0)
    for name, a, b in zip(NAMES, _grads((fused * weights).sum(), tensors), _grads((literal * weights).sum(), tensors)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)

    # reduction="sum": the gradients are formed in the forward pass; scale them by a non-unit factor
    total = _fused(
        action, loc_U, scale_U, threshold, labels, chunk_size=chunk, vocab_chunk_size=vocab_chunk, reduction="sum"
    )
    torch.testing.assert_close(total, literal.sum(), rtol=1e-12, atol=1e-12)
    for name, a, b in zip(NAMES, _grads(2.5 * total, tensors), _grads(2.5 * literal.sum(), tensors)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("threshold_kind", ["scalar", "per_class"])
def test_fused_gradcheck(reduction, threshold_kind):
    action, loc_U, scale_U, threshold, labels = _setup(
        3, 5, 3, 7, threshold_kind, clamp_row=False, zero_class=False, ignored=(1,)
    )
    head = action.classification_head  # no zero weight, no clamp: |.| and the clamps are smooth here

    def f(loc_U, scale_U, weight, bias, b_noise, threshold):
        return fused_ovr_classification_loss(
            loc_U,
            scale_U,
            weight,
            bias,
            b_noise.abs(),
            threshold,
            labels=labels,
            chunk_size=2,
            vocab_chunk_size=3,
            scale_eps=EPS,
            reduction=reduction,
        )

    inputs = (loc_U, scale_U, head.weight, head.bias, action.b_noise, threshold)
    # a second backward through the graph recomputes what the first handed over from the forward pass ("sum"): the
    # same formulas, compiled for another set of outputs, may round a few ulp apart (tests/test_kernels_tiles.py)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, nondet_tol=1e-12)


def test_fused_float32_matches_float64_literal():
    action, loc_U, scale_U, threshold, labels = _setup(7, 11, 6, 9, learnable=False)
    reference = _literal(action, loc_U, scale_U, threshold, labels)
    action32 = action.float()
    for reduction in ("none", "sum"):
        fused = _fused(action32, loc_U.float(), scale_U.float(), 5.0, labels, reduction=reduction)
        expected = reference if reduction == "none" else reference.sum()
        torch.testing.assert_close(fused.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_fused_is_finite_for_extreme_finite_float32_inputs(reduction):
    """|loc| up to 1e30 and every scale at scale_eps: the loss is huge but finite, and so is every gradient."""
    n, c, v = 6, 4, 10
    g = torch.Generator().manual_seed(0)
    action = ActionNetwork(c, v, noise_init=0.0, scale_eps=EPS)
    with torch.no_grad():
        action.classification_head.weight.copy_(torch.randn(v, c, generator=g))
        action.b_noise.fill_(1e-30)  # |b_noise| adds nothing; input scales sit at the clamp
    signs = torch.where(torch.rand(n, c, generator=g) > 0.5, 1.0, -1.0)
    loc_U = (signs * 1e30).requires_grad_()
    loc_U.data[0] = 0.0  # one ordinary row
    scale_U = torch.full((n, c), EPS).requires_grad_()
    labels = torch.randint(0, v, (n,), generator=g)
    head = action.classification_head
    tensors = [loc_U, scale_U, head.weight, head.bias, action.b_noise]
    loss = fused_ovr_classification_loss(
        loc_U,
        scale_U,
        head.weight,
        head.bias,
        action.noise_scale,
        100.0,
        labels=labels,
        scale_eps=EPS,
        reduction=reduction,
    )
    assert torch.isfinite(loss).all()
    assert loss.sum() > 1e3  # the far-wrong rows cost many nats: the test is not vacuous
    for name, grad in zip(NAMES, _grads(loss.sum(), tensors)):
        assert torch.isfinite(grad).all(), name
    literal = _literal(action, loc_U, scale_U, 100.0, labels)
    torch.testing.assert_close(
        loss.sum() if reduction == "sum" else loss,
        literal.sum() if reduction == "sum" else literal,
        rtol=1e-5,
        atol=1e-3,
    )


def test_fused_only_computes_the_gradients_asked_for():
    action, loc_U, scale_U, threshold, labels = _setup(1, 6, 4, 8, learnable=False)
    action.classification_head.weight.requires_grad_(False)  # a frozen head (the "abduction" preset)
    literal = _literal(action, loc_U, scale_U, threshold, labels).sum()
    fused = _fused(action, loc_U, scale_U, threshold, labels, reduction="sum")
    tensors = [loc_U, scale_U, action.classification_head.bias, action.b_noise]
    for a, b in zip(_grads(fused, tensors), _grads(literal, tensors)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # no gradient is formed or kept under no_grad
        torch.testing.assert_close(_fused(action, loc_U, scale_U, threshold, labels, reduction="sum"), literal)


def test_fused_bfloat16_weights_compute_in_float32():
    """bfloat16 weights and law of U: the loss and the weight's gradient come back in bfloat16, equal to the float32
    literal path's up to the rounding of the bfloat16 inputs (a few 1e-3 relative)."""
    action, loc_U, scale_U, threshold, labels = _setup(2, 8, 6, 9, learnable=False, dtype=torch.float32)
    low = copy.deepcopy(action).to(torch.bfloat16)
    # the oracle sees the same rounded inputs: the float32 literal path on the bfloat16 values
    action32 = copy.deepcopy(low).float()
    loc32, scale32 = loc_U.detach().bfloat16().float(), scale_U.detach().bfloat16().float()
    reference = _literal(action32, loc32, scale32, 5.0, labels)
    (reference_grad,) = torch.autograd.grad(reference.sum(), action32.classification_head.weight)
    fused = _fused(low, loc_U.bfloat16(), scale_U.bfloat16(), 5.0, labels)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), reference, rtol=8e-3, atol=1e-5)  # the result's bfloat16 rounding
    fused.float().sum().backward()
    grad = low.classification_head.weight.grad
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), reference_grad, rtol=8e-3, atol=8e-3 * reference_grad.abs().max().item())


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_under_bfloat16_autocast_the_products_run_in_bfloat16_and_as_accurately_as_the_literal_path(reduction):
    """Autocast runs the literal path's products in bfloat16; the fused path runs its tile products there too
    (their rounding shows in the gradients) but adds the threshold and scores in float32. Against the float64
    literal loss, its loss is at least as close as the literal path's under the same autocast, and every gradient
    within 1.5x of the literal path's error (bfloat16 rounding of different sums: 2e-4 to 7e-3 relative here)."""
    action, loc_U, scale_U, threshold, labels = _setup(3, 48, 32, 900, learnable=False)
    with torch.no_grad():
        loc_U.mul_(0.2)
    exact = _literal(action, loc_U, scale_U, threshold, labels)
    exact_grads = _grads(exact.sum(), _inputs(action, loc_U, scale_U, threshold))
    action32 = copy.deepcopy(action).float()
    loc32, scale32 = loc_U.detach().float().requires_grad_(), scale_U.detach().float().requires_grad_()
    tensors = _inputs(action32, loc32, scale32, 5.0)

    def errors(run, autocast):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = run()
        total = loss.float().sum()
        grads = _grads(total, tensors)
        loss_error = abs(total.double() - exact.sum()).item() / abs(exact.sum()).item()
        return loss, loss_error, [((g.double() - e).norm() / e.norm()).item() for g, e in zip(grads, exact_grads)]

    literal, literal_loss_error, literal_errors = errors(lambda: _literal(action32, loc32, scale32, 5.0, labels), True)
    fused, fused_loss_error, fused_errors = errors(
        lambda: _fused(action32, loc32, scale32, 5.0, labels, reduction=reduction), True
    )
    _, _, float32_errors = errors(lambda: _fused(action32, loc32, scale32, 5.0, labels, reduction=reduction), False)
    assert fused.dtype == torch.float32 and literal.dtype == torch.bfloat16
    assert fused_loss_error <= literal_loss_error
    for name, ours, theirs, full in zip(NAMES, fused_errors, literal_errors, float32_errors):
        assert ours <= 1.5 * theirs, (name, ours, theirs)
        if name in ("loc_U", "W"):  # the bfloat16 products are really used: their rounding is visible
            assert ours > 20 * full, (name, ours, full)


def test_fused_rejects_bad_input():
    action, loc_U, scale_U, threshold, labels = _setup(0, 11, 6, 9, learnable=False)
    head = action.classification_head
    args = (head.weight, head.bias, action.noise_scale)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels=labels, chunk_size=0)
    with pytest.raises(ValueError, match="vocab_chunk_size must be a positive int"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels=labels, vocab_chunk_size=2.0)
    with pytest.raises(ValueError, match="reduction must be"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels=labels, reduction="mean")
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 9\)"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels=labels.clamp_min(0) + 9)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels=labels.double())
    with pytest.raises(ValueError, match="a per-class threshold must have shape"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, torch.zeros(3), labels=labels)
    with pytest.raises(ValueError, match=r"weight must be \[V, C\]"):
        fused_ovr_classification_loss(
            loc_U, scale_U, head.weight[:, :3], head.bias, action.noise_scale, 5.0, labels=labels
        )
    with pytest.raises(ValueError, match=r"bias must be \[V\] and noise_scale \[C\]"):
        fused_ovr_classification_loss(
            loc_U, scale_U, head.weight, head.bias[:3], action.noise_scale, 5.0, labels=labels
        )
    with pytest.raises(ValueError, match=r"loc_U and scale_U must both be \[N, C\]"):
        fused_ovr_classification_loss(loc_U[None], scale_U[None], *args, 5.0, labels=labels)
    with pytest.raises(ValueError, match=r"labels shape \(10,\) must be \[N\]"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels=labels[:10])


@given(
    seed=st.integers(0, 10_000),
    rows=st.sampled_from([1, 2, 1000]),
    classes=st.sampled_from([1, 3, 1000]),
    per_class=st.booleans(),
)
def test_the_tiled_argmax_equals_the_literal_prediction(seed, rows, classes, per_class):
    """`fused.ovr_argmax` (the log step's prediction) is the OvR argmax of the literal decisions, whatever the tiles."""
    from causalqwen.inference import predict
    from causalqwen.kernels.tiles import HeadInputs, Tiling, ovr_argmax

    action, loc_U, scale_U, threshold, _ = _setup(
        seed, 7, 4, 11, "per_class" if per_class else "scalar", learnable=False
    )
    decision = action(loc_U.detach(), scale_U.detach())
    literal, _ = predict(decision.loc_S, decision.scale_S, decision.loc_Y, threshold, 0)
    head = action.classification_head
    inputs = HeadInputs(None, None, head.weight.detach(), head.bias.detach(), action.noise_scale.detach(), threshold)
    assert torch.equal(ovr_argmax(loc_U.detach(), scale_U.detach(), inputs, Tiling(rows, classes, EPS)), literal)


def test_the_default_tiles_depend_on_the_device_and_explicit_sizes_win():
    from causalqwen.kernels import tiles

    cpu = tiles.default_tiling(torch.device("cpu"), EPS)
    assert (cpu.rows, cpu.classes) == (tiles.FUSED_CHUNK_SIZE, tiles.FUSED_VOCAB_CHUNK_SIZE)
    cuda = tiles.default_tiling(torch.device("cuda", 0), EPS)  # a device object needs no GPU
    assert (cuda.rows, cuda.classes) == (tiles.FUSED_CUDA_CHUNK_SIZE, tiles.FUSED_CUDA_VOCAB_CHUNK_SIZE)
    assert tiles.default_tiling("cuda", EPS, chunk_size=3, vocab_chunk_size=5)[:2] == (3, 5)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_size"):
            tiles.default_tiling("cpu", EPS, chunk_size=bad)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_no_scored_row_gives_zero_loss_and_zero_gradients(reduction):
    """With every label ignored no tile runs: the loss and every gradient are exact zeros, never uninitialised
    memory."""
    action, loc_U, scale_U, threshold, labels = _setup(
        4, 5, 3, 7, learnable=True, dtype=torch.float32, ignored=range(5)
    )
    for _ in range(2):  # the second call would see whatever memory the first one freed
        loss = _fused(action, loc_U, scale_U, threshold, labels, reduction=reduction)
        assert bool((loss == 0).all())
        for name, grad in zip(NAMES, _grads(loss.sum(), _inputs(action, loc_U, scale_U, threshold))):
            assert grad is None or bool((grad == 0).all()), name


def test_the_fused_loss_refuses_a_second_derivative(tokenizer):
    torch.manual_seed(0)
    model = tiny_model()
    batch = tokenizer(["A cup of tea costs 1.5 dollars."])
    out = model(**batch, labels=batch["input_ids"])
    with pytest.raises(RuntimeError, match=r"no second derivative .* loss_algorithm='literal'"):
        torch.autograd.grad(out.loss, model.action.b_noise, create_graph=True)
    model.config.loss_algorithm = "literal"  # an explicit choice, not an output flag
    literal = model(**batch, labels=batch["input_ids"])
    (gradient,) = torch.autograd.grad(literal.loss, model.action.b_noise, create_graph=True)
    (second,) = torch.autograd.grad(gradient.sum(), model.action.b_noise)
    assert second.abs().max() > 0  # the literal path has a real Hessian
    U = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    loss = fused_ovr_classification_loss(
        U,
        torch.rand(3, 4, dtype=torch.float64) + 0.5,
        torch.randn(5, 4, dtype=torch.float64),
        torch.zeros(5, dtype=torch.float64),
        torch.full((4,), 0.1, dtype=torch.float64),
        0.0,
        labels=torch.tensor([0, 1, 2]),
    )
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(loss.sum(), U, create_graph=True)
