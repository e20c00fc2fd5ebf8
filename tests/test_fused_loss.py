"""The fused, chunked OvR head + loss equals the literal path: values and every gradient (float64)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from causalqwen.action import ActionNetwork
from causalqwen.losses import fused_ovr_classification_loss, ovr_classification_loss

N, C, V, EPS = 11, 6, 9, 1e-6


def _setup(seed, per_class, learnable):
    g = torch.Generator().manual_seed(seed)
    action = ActionNetwork(C, V, noise_init=0.3, scale_eps=EPS).double()
    with torch.no_grad():
        action.classification_head.weight.copy_(torch.randn(V, C, generator=g, dtype=torch.float64) * 2)
        action.classification_head.weight[2] = 0.0  # a class whose scale is all clamp
        action.classification_head.bias.copy_(torch.randn(V, generator=g, dtype=torch.float64))
        action.b_noise.copy_(torch.randn(C, generator=g, dtype=torch.float64))  # signs vary: |b_noise| path
    loc_U = (torch.randn(N, C, generator=g, dtype=torch.float64) * 20).requires_grad_()
    scale_U = (torch.rand(N, C, generator=g, dtype=torch.float64) * 3 + 0.01)
    scale_U[0] = 1e-9  # with a tiny noise this row's input scale is clamped
    scale_U.requires_grad_()
    shape = (V,) if per_class else ()
    threshold = torch.full(shape, 5.0, dtype=torch.float64) + (torch.randn(shape, generator=g, dtype=torch.float64) if per_class else 0)
    threshold.requires_grad_(learnable)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[[1, 4]] = -100
    labels[3] = 2
    return action, loc_U, scale_U, threshold, labels


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


@given(seed=st.integers(0, 1000), per_class=st.booleans(), chunk=st.sampled_from([1, 3, 4, 1000]))
def test_fused_equals_literal_values_and_gradients(seed, per_class, chunk):
    action, loc_U, scale_U, threshold, labels = _setup(seed, per_class, learnable=True)
    if seed % 2:
        with torch.no_grad():
            action.b_noise[:] = 1e-12  # the input-scale clamp is active in row 0
    weights = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    tensors = [loc_U, scale_U, action.classification_head.weight, action.classification_head.bias, action.b_noise, threshold]

    decision = action(loc_U, scale_U)
    literal = ovr_classification_loss(decision.loc_S, decision.scale_S, labels, threshold)
    literal_grads = _grads((literal * weights).sum(), tensors)

    fused = fused_ovr_classification_loss(loc_U, scale_U, action.classification_head.weight, action.classification_head.bias,
                                          action.noise_scale, threshold, labels, chunk_size=chunk, scale_eps=EPS)
    fused_grads = _grads((fused * weights).sum(), tensors)

    torch.testing.assert_close(fused, literal, rtol=1e-12, atol=1e-12)
    assert torch.all(fused[[1, 4]] == 0)
    for name, a, b in zip(["loc_U", "scale_U", "W", "b", "b_noise", "threshold"], fused_grads, literal_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_fused_float32_matches_float64_literal():
    action, loc_U, scale_U, threshold, labels = _setup(7, per_class=False, learnable=False)
    decision = action(loc_U, scale_U)
    reference = ovr_classification_loss(decision.loc_S, decision.scale_S, labels, threshold)
    f32 = action.float()
    fused = fused_ovr_classification_loss(loc_U.float(), scale_U.float(), f32.classification_head.weight,
                                          f32.classification_head.bias, f32.noise_scale, 5.0, labels, scale_eps=EPS)
    torch.testing.assert_close(fused.double(), reference, rtol=1e-5, atol=1e-5)


def test_fused_rejects_bad_input():
    action, loc_U, scale_U, threshold, labels = _setup(0, False, False)
    args = (action.classification_head.weight, action.classification_head.bias, action.noise_scale)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels, chunk_size=0)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 9\)"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, 5.0, labels.clamp_min(0) + 9)
    with pytest.raises(ValueError, match="a per-class threshold must have shape"):
        fused_ovr_classification_loss(loc_U, scale_U, *args, torch.zeros(3), labels)
    with pytest.raises(ValueError, match=r"loc_U and scale_U must both be \[N, C\]"):
        fused_ovr_classification_loss(loc_U[None], scale_U[None], *args, 5.0, labels)
