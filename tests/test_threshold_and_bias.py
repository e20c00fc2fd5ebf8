r"""A learnable per-class threshold $C_k$ is a reparameterisation of the bias $b_{\mathrm{cls},k}$.

Every One-vs-Rest quantity reads the class score only through

$$\mathrm{loc}_{S_k} - C_k = W_k \cdot \mathrm{loc}_{U'} + (b_{\mathrm{cls},k} - C_k),$$

so a model whose thresholds are $C_0 + \delta_k$ and one whose thresholds are the shared $C_0$ with the offsets moved
into the bias ($b_{\mathrm{cls},k} - \delta_k$) give the same probabilities $P_k$, the same gate
$P_{\langle NUM\rangle}$, the same classification, regression and total losses under both loss algorithms, and the same
gradient for every parameter they share (the threshold's own gradient is minus the bias's). What they do not share
is $\mathrm{loc}_S$ itself: the softmax of the ``traditional`` mode moves with the offsets.

The oracle is the second model, built with no threshold parameter at all; Hypothesis draws the offsets.
"""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causalqwen.action import ActionOutput, num_probability
from causalqwen.app.tiny import build_tiny_causal_lm

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
