"""The action network (decision D7), `causalqwen.action`: noise infusion and the linear Cauchy closure.

Oracles: the closed forms of D7 in float64 NumPy (also as a Hypothesis property over weights, laws and noise),
SciPy's Cauchy law (Monte Carlo KS of the sampled decisions, the survival function for the gate's P_<NUM>).
"""

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from causalqwen import cauchy
from causalqwen.action import (
    ActionNetwork,
    ActionOutput,
    check_law,
    noise_infused_scale,
    num_probability,
)
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.losses import ovr_classification_loss

# ---- the action network (D7) ----


def _action(C=6, V=9, noise_init=0.1, seed=0):
    torch.manual_seed(seed)
    net = ActionNetwork(C, V, noise_init=noise_init).double()
    with torch.no_grad():
        net.classification_head.weight.normal_()
        net.classification_head.bias.normal_()
    return net


def test_action_forward_is_noise_infusion_then_linear_closure():
    net = _action()
    g = torch.Generator().manual_seed(1)
    loc_U = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    scale_U = torch.rand(2, 3, 6, generator=g, dtype=torch.float64) + 0.1
    out = net(loc_U, scale_U)
    W, b = net.classification_head.weight.detach(), net.classification_head.bias.detach()
    w, c = net.regression_head.weight.detach()[0], net.regression_head.bias.detach()[0]
    fused = scale_U + net.b_noise.detach().abs()  # scale_U + |b_noise|
    # float64 einsum oracle of the closed forms in D7
    torch.testing.assert_close(out.loc_S, torch.einsum("bsc,vc->bsv", loc_U, W) + b)
    torch.testing.assert_close(out.scale_S, torch.einsum("bsc,vc->bsv", fused, W.abs()))
    torch.testing.assert_close(out.loc_Y, torch.einsum("bsc,c->bs", loc_U, w) + c)
    torch.testing.assert_close(out.scale_Y, torch.einsum("bsc,c->bs", fused, w.abs()))
    torch.testing.assert_close(net.noise_scale, torch.full((6,), 0.1, dtype=torch.float64), rtol=1e-7, atol=0)
    # decide() adds no noise
    direct = net.decide(loc_U, scale_U)
    torch.testing.assert_close(direct.scale_S, torch.einsum("bsc,vc->bsv", scale_U, W.abs()))


def test_locations_alone_equal_the_decisions_locations():
    """`locations` (what traditional sampling needs) is the float64 closed form, and bit-equal to `decide`'s."""
    net = _action()
    g = torch.Generator().manual_seed(4)
    loc = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    scale = torch.rand(2, 3, 6, generator=g, dtype=torch.float64)
    loc_S, loc_Y = net.locations(loc)
    W, b = net.classification_head.weight.detach(), net.classification_head.bias.detach()
    w, c = net.regression_head.weight.detach()[0], net.regression_head.bias.detach()[0]
    torch.testing.assert_close(loc_S, torch.einsum("bsc,vc->bsv", loc, W) + b)
    torch.testing.assert_close(loc_Y, torch.einsum("bsc,c->bs", loc, w) + c)
    decided = net.decide(loc, scale)
    assert torch.equal(loc_S, decided.loc_S) and torch.equal(loc_Y, decided.loc_Y)


def test_action_init_values():
    net = ActionNetwork(32, 50, noise_init=0.25)
    assert bool((net.b_noise == 0.25).all())
    assert bool((net.classification_head.bias == 0).all()) and bool((net.regression_head.bias == 0).all())
    bound = math.sqrt(6.0 / (32 + 1))  # Xavier-uniform bound for a [1, 32] weight
    w = net.regression_head.weight
    assert bool((w.abs() <= bound).all()) and w.abs().max().item() > 0.5 * bound


def test_noise_infused_decision_monte_carlo_ks():
    """Sample U and the exogenous noise, push through the linear heads, compare with the closed form."""
    net = _action(C=4, V=3, noise_init=0.7, seed=2)
    loc_U = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    scale_U = torch.tensor([0.3, 1.0, 0.2, 2.0], dtype=torch.float64)
    rng = np.random.default_rng(5)
    n = 20_000
    u = stats.cauchy.rvs(loc=loc_U.numpy(), scale=scale_U.numpy(), size=(n, 4), random_state=rng)
    eps = stats.cauchy.rvs(loc=0.0, scale=0.7, size=(n, 4), random_state=rng)
    W = net.classification_head.weight.detach().numpy()
    b = net.classification_head.bias.detach().numpy()
    scores = (u + eps) @ W.T + b  # [n, V]
    out = net(loc_U, scale_U)
    for k in range(3):
        law = stats.cauchy(loc=out.loc_S[k].item(), scale=out.scale_S[k].item())
        assert stats.kstest(scores[:, k], law.cdf).pvalue > 1e-3
    y = (u + eps) @ net.regression_head.weight.detach().numpy()[0] + net.regression_head.bias.item()
    assert stats.kstest(y, stats.cauchy(loc=out.loc_Y.item(), scale=out.scale_Y.item()).cdf).pvalue > 1e-3


def test_b_noise_gradient_nonzero_at_default_init_and_zero_at_zero_init():
    """The documented pitfall: d|b|/db = 0 at b = 0 in PyTorch, so a zero-initialised noise never learns."""
    loc_U = torch.randn(2, 3, 6, dtype=torch.float64)
    scale_U = torch.rand(2, 3, 6, dtype=torch.float64) + 0.1
    labels = torch.randint(0, 9, (2, 3))

    def loss(net):
        out = net(loc_U, scale_U)
        return ovr_classification_loss(out.loc_S, out.scale_S, labels, threshold=1.0).sum()

    for noise_init, expect_zero in ((0.1, False), (0.0, True)):
        net = _action(noise_init=noise_init)
        loss(net).backward()
        grad = net.b_noise.grad
        assert bool((grad == 0).all()) == expect_zero, (noise_init, grad)
        if not expect_zero:  # the gradient is the loss's slope: central differences in float64
            for j in range(6):
                step = torch.zeros(6, dtype=torch.float64)
                step[j] = 1e-6
                with torch.no_grad():
                    net.b_noise += step
                    up = loss(net)
                    net.b_noise -= 2 * step
                    down = loss(net)
                    net.b_noise += step
                assert float(grad[j]) == pytest.approx(float(up - down) / 2e-6, rel=1e-5, abs=1e-8)


def test_decision_scales_are_clamped_at_scale_eps():
    net = ActionNetwork(3, 4, noise_init=0.0, scale_eps=1e-4)
    with torch.no_grad():
        net.classification_head.weight.zero_()  # an all-zero row would give scale_S = 0
    out = net.decide(torch.zeros(3), torch.ones(3))
    assert bool((out.scale_S == 1e-4).all())
    # the floored law is a proper Cauchy law: its density at its location is 1 / (pi eps)
    expected = torch.full((4,), -math.log(math.pi * 1e-4))
    torch.testing.assert_close(cauchy.log_prob(torch.zeros(4), out.loc_S, out.scale_S), expected, rtol=1e-6, atol=0)


# ---- closure under the action map, as a property ----


@given(
    C=st.integers(1, 5),
    V=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    noise=st.floats(-3.0, 3.0),
    scale_eps=st.sampled_from([1e-6, 1e-2]),
)
def test_closure_law_of_S_and_Y_is_the_float64_closed_form(C, V, seed, noise, scale_eps):
    r"""S = W (U + eps) + b, U ~ Cauchy(loc_U, scale_U), eps ~ Cauchy(0, |b_noise|): loc_S = W loc_U + b and
    scale_S = max(|W| max(scale_U + |b_noise|, eps_s), eps_s), the same for Y (NumPy, float64, one class at a time)."""
    rng = np.random.default_rng(seed)
    net = ActionNetwork(C, V, noise_init=noise, scale_eps=scale_eps).double()
    W, b = rng.normal(size=(V, C)) * 3, rng.normal(size=V)
    w, c = rng.normal(size=C), rng.normal()
    with torch.no_grad():
        net.classification_head.weight.copy_(torch.from_numpy(W))
        net.classification_head.bias.copy_(torch.from_numpy(b))
        net.regression_head.weight.copy_(torch.from_numpy(w)[None])
        net.regression_head.bias.fill_(c)
    loc_U, scale_U = rng.normal(size=(3, C)) * 10, rng.exponential(size=(3, C))
    out = net(torch.from_numpy(loc_U), torch.from_numpy(scale_U))
    noise_scale = np.abs(net.b_noise.detach().numpy())  # |b_noise|: noise_init, as the float32 parameter holds it
    scale_in = np.maximum(scale_U + noise_scale, scale_eps)  # [3, C]
    for k in range(V):
        np.testing.assert_allclose(out.loc_S[:, k].detach().numpy(), loc_U @ W[k] + b[k], rtol=1e-12, atol=1e-12)
        expected = np.maximum(scale_in @ np.abs(W[k]), scale_eps)
        np.testing.assert_allclose(out.scale_S[:, k].detach().numpy(), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(out.loc_Y.detach().numpy(), loc_U @ w + c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.scale_Y.detach().numpy(), np.maximum(scale_in @ np.abs(w), scale_eps), rtol=1e-12)


# ---- the maps and their checks ----


def test_forward_is_decide_of_the_noise_infused_input():
    net = _action()
    g = torch.Generator().manual_seed(9)
    loc_U = torch.randn(4, 6, generator=g, dtype=torch.float64)
    scale_U = torch.rand(4, 6, generator=g, dtype=torch.float64)
    infused = noise_infused_scale(scale_U, net.noise_scale)
    torch.testing.assert_close(infused, scale_U + net.b_noise.detach().abs(), rtol=0, atol=0)
    with cauchy.validation(False):
        unchecked = net(loc_U, scale_U)
    for got, want, also in zip(net(loc_U, scale_U), net.decide(loc_U, infused), unchecked):
        assert torch.equal(got, want) and torch.equal(got, also)


def test_classes_keep_those_columns_in_that_order():
    net = _action()
    loc, scale = torch.randn(2, 6, dtype=torch.float64), torch.rand(2, 6, dtype=torch.float64)
    full = net.decide(loc, scale)
    some = net.decide(loc, scale, classes=[7, 2], abs_weight=net.classification_head.weight.abs())
    # a product over 2 classes need not round as one over 9 does: equal to float64 precision
    torch.testing.assert_close(some.loc_S, full.loc_S[:, [7, 2]], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(some.scale_S, full.scale_S[:, [7, 2]], rtol=1e-14, atol=1e-14)
    assert torch.equal(some.loc_Y, full.loc_Y) and torch.equal(some.scale_Y, full.scale_Y)


@pytest.mark.parametrize(
    "arguments,error,match",
    [
        ((torch.zeros(1, 5).tolist(), torch.ones(1, 5)), TypeError, "loc_U must be a torch.Tensor"),
        ((torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 5)), TypeError, "loc_U must be a floating-point tensor"),
        (
            (torch.zeros(1, 4), torch.ones(1, 4)),
            ValueError,
            r"loc_U must have last dimension C = 5, got shape \(1, 4\)",
        ),
        (
            (torch.zeros(1, 5), torch.ones(5, 1)),
            ValueError,
            r"scale_U must have last dimension C = 5, got shape \(5, 1\)",
        ),
        ((torch.zeros(()), torch.ones(())), ValueError, "loc_U must have last dimension C = 5"),
        (
            (torch.zeros(1, 5), torch.full((1, 5), -1.0)),
            ValueError,
            r"scale_U must be >= 0 everywhere \(a Cauchy scale\); found -1\.0",
        ),
        ((torch.zeros(1, 5), torch.full((1, 5), math.nan)), ValueError, "scale_U must be >= 0 everywhere"),
    ],
)
def test_the_doors_refuse_a_law_that_is_not_one(arguments, error, match):
    net = ActionNetwork(5, 3)
    with pytest.raises(error, match=match):
        net(*arguments)
    with pytest.raises(error, match=match.replace("_U", "")):
        net.decide(*arguments)
    with pytest.raises(error, match=match):
        check_law(*arguments, 5, ("loc_U", "scale_U"))


def test_check_law_takes_c_from_loc_when_not_given():
    check_law(torch.zeros(2, 3), torch.zeros(2, 3))  # a zero scale is a (degenerate) law: the floor handles it
    with pytest.raises(ValueError, match=r"scale must have last dimension C = 3, got shape \(2, 4\)"):
        check_law(torch.zeros(2, 3), torch.ones(2, 4))


@pytest.mark.parametrize(
    "threshold", [torch.tensor(2.5, dtype=torch.float64), torch.tensor(-1.0), torch.linspace(-3.0, 3.0, 7), 0.75]
)
def test_num_probability_is_the_cauchy_survival_function_at_the_num_threshold(threshold):
    g = torch.Generator().manual_seed(3)
    loc, scale = (
        torch.randn(4, 5, generator=g, dtype=torch.float64) * 4,
        torch.rand(4, 5, generator=g, dtype=torch.float64),
    )
    num = 4
    c = float(threshold[num]) if isinstance(threshold, torch.Tensor) and threshold.dim() else float(threshold)
    expected = stats.cauchy.sf(c, loc=loc.numpy(), scale=scale.numpy() + 0.1)
    got = num_probability(loc, scale + 0.1, threshold, num)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=0)


def test_a_negative_scale_is_refused_while_validating_and_not_looked_at_under_validation_false():
    """`forward` and `decide` check their law while `cauchy.validating()`; a caller that has checked (the model after
    its door) runs them under `cauchy.validation(False)`, where the same call is not examined."""
    net = _action()
    loc, bad = torch.zeros(2, 6, dtype=torch.float64), torch.full((2, 6), -0.05, dtype=torch.float64)
    with pytest.raises(ValueError, match="scale_U must be >= 0 everywhere"):
        net(loc, bad)  # -0.05 + |b_noise| = 0.05 would pass a check made after the noise
    with pytest.raises(ValueError, match="scale must be >= 0 everywhere"):
        net.decide(loc, bad)
    with pytest.raises(TypeError, match="loc_U must be a floating-point tensor"):
        net(loc.long(), bad)
    with cauchy.validation(False):
        out = net.decide(loc, bad)  # the floor at scale_eps is all that happens
    floored = net.decide(loc, torch.zeros_like(bad))  # a zero scale is a (degenerate) law: floored alike
    assert all(torch.equal(a, b) for a, b in zip(out, floored))


# ---- One-vs-Rest: every OvR quantity has one home ----

# The Cauchy functions that turn a class law and its threshold into P_k or one of its logs.
OVR_FORMULAS = {"sf", "cdf", "log_sf", "log_cdf", "tail_nll", "tail_terms"}


def _ovr_formula_calls() -> set[tuple[str, str]]:
    """(section, function) of every call ``cauchy.<formula>(...)`` of `OVR_FORMULAS` in the sections of the package
    (``causalqwen/*.py`` but ``cauchy`` itself)."""
    import ast
    from pathlib import Path

    import causalqwen

    calls = set()
    for path in sorted(Path(causalqwen.__file__).parent.glob("*.py")):
        if path.stem in ("__init__", "cauchy"):
            continue
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "cauchy"
                    and node.func.attr in OVR_FORMULAS
                ):
                    calls.add((path.stem, function.name))
    return calls - {("regression", "answer_figures")}  # the PIT of answers under the law of Y: no threshold


def test_every_ovr_quantity_is_formed_in_action_alone():
    """P_k (the Cauchy survival function at C_k), -log P_k and -log(1 - P_k) (the tail kernel at d = loc_S - C) are
    formed in two functions of `causalqwen.action`, and nowhere else among the sections: the losses, the decision
    head, inference, the regression's gate, the metrics and the likelihood call action's functions (the same objects,
    also where another module's name for them is public). The tiles of the fused path apply the same kernel tile by
    tile and are tested equal to these (tests/test_kernels_fused.py)."""
    from causalqwen import action, decision, inference, likelihood, losses, metrics, regression

    assert _ovr_formula_calls() == {("action", "ovr_probability"), ("action", "ovr_tail_nll")}
    assert losses.ovr_probability is metrics.ovr_probability is action.ovr_probability
    assert losses.ovr_log_probability is likelihood.ovr_log_probability is action.ovr_log_probability
    assert losses.ovr_tail_nll is inference.ovr_tail_nll is decision.ovr_tail_nll is action.ovr_tail_nll
    assert inference.ovr_token is decision.ovr_token is likelihood.ovr_token is action.ovr_token
    assert losses.num_probability is regression.num_probability is action.num_probability
    assert losses.check_threshold is inference.check_threshold is action.check_threshold


# A learnable per-class threshold $C_k$ is a reparameterisation of the bias $b_{\mathrm{cls},k}$.
#
# Every One-vs-Rest quantity reads the class score only through
#
# $$\mathrm{loc}_{S_k} - C_k = W_k \cdot \mathrm{loc}_{U'} + (b_{\mathrm{cls},k} - C_k),$$
#
# so a model whose thresholds are $C_0 + \delta_k$ and one whose thresholds are the shared $C_0$ with the offsets moved
# into the bias ($b_{\mathrm{cls},k} - \delta_k$) give the same probabilities $P_k$, the same gate
# $P_{\langle NUM\rangle}$, the same classification, regression and total losses under both loss algorithms, and
# the same
# gradient for every parameter they share (the threshold's own gradient is minus the bias's). What they do not share
# is $\mathrm{loc}_S$ itself: the softmax of the ``traditional`` mode moves with the offsets.
#
# The oracle is the second model, built with no threshold parameter at all; Hypothesis draws the offsets.


TEXTS = ["The price is 99.9 yuan and 3 cups.", "He ran 3 km in 12.5 minutes"]


@functools.cache
def _models():
    """``(with_threshold, with_bias, batch)``: the tiny CausalQwen in float64 twice, with the same weights, the first
    with a learnable ``[V]`` threshold, the second with the shared fixed ``C_0`` (a number, no parameter); and one
    padded batch. Built once: each example sets the threshold and the bias in place (`_pair`)."""
    with_threshold, tokenizer, _ = build_tiny_causal_lm(
        seed=0, init_seed=0, ovr_threshold_per_class=True, learnable_threshold=True
    )
    with_bias = build_tiny_causal_lm(seed=0, init_seed=0)[0].double()
    with_threshold = with_threshold.double()
    shared = {k: v for k, v in with_threshold.state_dict().items() if k != "action.ovr_threshold"}
    with_bias.load_state_dict(shared)
    assert with_bias.config.ovr_threshold == with_threshold.config.ovr_threshold
    assert "action.ovr_threshold" not in with_bias.state_dict()
    batch = dict(tokenizer(TEXTS, padding_side="left", return_tensors="pt"))
    return with_threshold, with_bias, batch


def _pair(offsets: torch.Tensor):
    """The two models of `_models` with thresholds ``C_0 + offsets`` in the first, and the shared ``C_0`` with the
    bias ``b_cls - offsets`` in the second (``b_cls`` the converted model's, 0)."""
    with_threshold, with_bias, _ = _models()
    start = with_threshold.config.ovr_threshold  # C_0, a float64 number (the parameter was made in float32)
    with torch.no_grad():
        bias = with_threshold.action.classification_head.bias  # [V], b_cls of both
        with_threshold.action.ovr_threshold.copy_(start + offsets)  # [V]
        with_bias.action.classification_head.bias.copy_(bias - offsets)  # [V]
    return with_threshold, with_bias


def _offsets(seed: int, spread: float, shift: float) -> torch.Tensor:
    vocab_size = _models()[0].config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab_size, generator=generator, dtype=torch.float64) * spread + shift  # [V]


def _decision(out) -> ActionOutput:
    return ActionOutput(out.loc_S, out.scale_S, out.loc_Y, out.scale_Y)


def _forward(model, algorithm: str):
    """The forward with labels and decisions, the loss's gradients, and the gate ``P_<NUM>`` ``[B, S]``."""
    _, _, batch = _models()
    model.config.loss_algorithm = algorithm
    model.zero_grad()
    out = model(**batch, labels=batch["input_ids"], return_decisions=True)
    out.loss.backward()
    num = model.config.num_token_id
    gate = num_probability(out.loc_S[..., num], out.scale_S[..., num], model.action.ovr_threshold, num)
    return out, gate.detach()


def _close(actual, expected, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-12, msg=lambda m: f"{what}: {m}")


# Each example runs the tiny model forward and backward four times: a quarter of the profile's examples (ci: 10 per
# loss algorithm, thorough: 250).
@settings(max_examples=max(1, settings.default.max_examples // 4))
@given(
    seed=st.integers(0, 2**31 - 1),
    spread=st.floats(1e-3, 30.0),
    shift=st.floats(-30.0, 30.0),
)
@pytest.mark.parametrize("algorithm", ["literal", "fused"])
def test_offsets_in_the_threshold_or_in_the_bias_give_the_same_ovr_model(algorithm, seed, spread, shift):
    offsets = _offsets(seed, spread, shift)
    with_threshold, with_bias = _pair(offsets)
    out_t, gate_t = _forward(with_threshold, algorithm)
    out_b, gate_b = _forward(with_bias, algorithm)

    head_t, head_b = with_threshold.action, with_bias.action
    with torch.no_grad():
        _close(head_t.probabilities(_decision(out_t)), head_b.probabilities(_decision(out_b)), "P_k")
        for log_t, log_b in zip(head_t.log_probabilities(_decision(out_t)), head_b.log_probabilities(_decision(out_b))):
            _close(log_t, log_b, "log P_k, log(1 - P_k)")
        _close(head_t.predict(_decision(out_t))[0], head_b.predict(_decision(out_b))[0], "argmax_k P_k")
    _close(gate_t, gate_b, "the gate P_<NUM>")
    for name in ("cls_loss", "reg_loss", "loss"):
        _close(getattr(out_t, name).detach(), getattr(out_b, name).detach(), name)

    parameters_t = dict(with_threshold.named_parameters())
    for name, parameter in with_bias.named_parameters():
        if name.startswith("action."):
            _close(parameters_t[name].grad, parameter.grad, f"the gradient of {name}")
        else:  # Qwen2's RMSNorm computes in float32 even in a float64 model: float32's rounding, once
            largest = parameter.grad.abs().max().item()
            torch.testing.assert_close(
                parameters_t[name].grad, parameter.grad, rtol=1e-5, atol=1e-6 * largest, msg=f"the gradient of {name}"
            )
    threshold_grad = with_threshold.action.ovr_threshold.grad  # [V]
    _close(threshold_grad, -with_bias.action.classification_head.bias.grad, "dL/dC_k = -dL/db_cls,k")


def test_what_the_offsets_do_change_is_the_softmax_over_the_class_locations():
    """The traditional mode's softmax(loc_S) reads loc_S without C: offsets that differ across classes change it
    (a shared shift does not), though every OvR quantity above stays the same."""
    varied = _offsets(seed=1, spread=1.0, shift=0.0)
    with_threshold, with_bias = _pair(varied)
    out_t, _ = _forward(with_threshold, "literal")
    out_b, _ = _forward(with_bias, "literal")
    softmax_t, softmax_b = out_t.loc_S.detach().softmax(-1), out_b.loc_S.detach().softmax(-1)
    assert (softmax_t - softmax_b).abs().max() > 1e-3
    _close(softmax_b, (out_t.loc_S.detach() - varied).softmax(-1), "softmax of loc_S - offsets")

    constant = torch.full_like(varied, 2.5)
    with_threshold, with_bias = _pair(constant)
    out_t, _ = _forward(with_threshold, "literal")
    out_b, _ = _forward(with_bias, "literal")
    _close(out_t.loc_S.detach().softmax(-1), out_b.loc_S.detach().softmax(-1), "softmax under a shared shift")


@pytest.mark.parametrize("per_class, learnable", [(True, False), (False, True), (True, True)])
def test_a_threshold_held_with_the_weights_is_cast_with_them_and_the_shared_one_keeps_its_value(per_class, learnable):
    """docs/losses.md: the shared threshold is a float64 scalar in a model of any dtype; a per-class or learnable one
    is a buffer or parameter and ``model.to(torch.bfloat16)`` rounds it to bfloat16, like the bias beside it."""
    held, _, _ = build_tiny_causal_lm(
        seed=0, init_seed=0, ovr_threshold_per_class=per_class, learnable_threshold=learnable
    )
    shared, _, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    value = shared.config.ovr_threshold
    held, shared = held.to(torch.bfloat16), shared.to(torch.bfloat16)
    assert shared.action.ovr_threshold.dtype == torch.float64 and shared.action.ovr_threshold.item() == value
    threshold = held.action.ovr_threshold
    assert threshold.dtype == torch.bfloat16
    assert bool((threshold == torch.tensor(value).to(torch.bfloat16)).all()) and threshold.flatten()[0].item() != value
