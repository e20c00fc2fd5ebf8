"""The abduction network (decision D6), `causalqwen.abduction`, and its weights on disk
(`causalqwen.files.abduction_weights`).

Oracles: mpmath for the inverse softplus, the formulas of D6 and of the MLP variant evaluated independently in
float64 NumPy/SciPy, the real Qwen2 (initialization equivalence) and the linear D6 network (bit-for-bit equality at
initialization).
"""

import json
import math
import os

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from scipy.special import erf

from causalqwen import CausalQwenConfig, CausalQwenForCausalLM, load_abduction, save_abduction
from causalqwen.abduction import (
    AbductionNetwork,
    MLPAbductionNetwork,
    build_abduction,
    inverse_softplus,
)
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.files import abduction_weights

# ---- the linear network (D6) ----


@pytest.mark.parametrize("gamma", [1e-6, 0.1, 1.0, 10.0, 50.0, 1e4])
def test_inverse_softplus_against_mpmath(gamma):
    with mp.workdps(40):
        expected = float(mp.log(mp.expm1(mp.mpf(gamma))))
    assert inverse_softplus(gamma) == pytest.approx(expected, rel=1e-14, abs=1e-300)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_inverse_softplus_rejects_values_outside_softplus_range(bad):
    with pytest.raises(ValueError, match="softplus only takes values > 0"):
        inverse_softplus(bad)


def test_abduction_init_is_identity_location_and_constant_scale():
    net = AbductionNetwork(16, 16, scale_init=10.0)
    z = torch.randn(2, 5, 16) * 100
    loc_U, scale_U = net(z)
    torch.testing.assert_close(loc_U, z, rtol=0, atol=0)
    torch.testing.assert_close(scale_U, torch.full_like(z, 10.0), rtol=1e-6, atol=0)


def test_abduction_scale_is_clamped_at_scale_eps():
    net = AbductionNetwork(4, 4, scale_init=1.0, scale_eps=1e-3)
    with torch.no_grad():
        net.b_scale.fill_(-200.0)  # softplus(-200) underflows to 0 in float32
    _, scale_U = net(torch.zeros(1, 1, 4))
    assert bool((scale_U == 1e-3).all())


def test_abduction_requires_causal_size_equal_hidden_size():
    with pytest.raises(ValueError, match=r"causal_size \(8\) must equal hidden_size \(16\)"):
        AbductionNetwork(16, 8, scale_init=0.1)


def _softplus64_of(x):
    return np.logaddexp(0.0, x)


@given(seed=st.integers(0, 10_000), scale_eps=st.sampled_from([1e-6, 1e-3, 0.5]))
def test_linear_abduction_matches_d6_in_float64_and_floors_the_scale(seed, scale_eps):
    """loc_U = W_loc z + b_loc and scale_U = max(softplus(W_scale z + b_scale), eps), for random weights."""
    torch.manual_seed(seed)
    net = AbductionNetwork(6, 6, scale_init=1.0, scale_eps=scale_eps).double()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 2.0)
    z = torch.randn(2, 3, 6, dtype=torch.float64) * 3
    loc_U, scale_U = net(z)
    p = {name: value.detach().numpy() for name, value in net.named_parameters()}
    expected_loc = z.numpy() @ p["W_loc"].T + p["b_loc"]
    expected_scale = np.maximum(_softplus64_of(z.numpy() @ p["W_scale"].T + p["b_scale"]), scale_eps)
    np.testing.assert_allclose(loc_U.detach().numpy(), expected_loc, rtol=1e-12, atol=1e-12)
    # torch's softplus returns x itself above x = 20, off by log1p(e^-x) < 2.1e-9, i.e. < 1.1e-10 relative
    np.testing.assert_allclose(scale_U.detach().numpy(), expected_scale, rtol=2e-10, atol=0)


@pytest.mark.parametrize("abduction_type,network", [("linear", AbductionNetwork), ("mlp", MLPAbductionNetwork)])
def test_build_abduction_builds_what_the_config_names(abduction_type, network):
    config = CausalQwenConfig(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        abduction_type=abduction_type,
        abduction_scale_init=3.0,
    )
    net = build_abduction(config)
    assert type(net) is network and net.scale_init == 3.0 and net.W_loc.shape == (16, 16)
    if abduction_type == "mlp":
        assert net.mlp_size == 16  # default: hidden_size


# ---- the MLP variant and the models that hold it ----


FIELDS = ("loc_U", "scale_U", "loc_S", "scale_S", "loc_Y", "scale_Y")


def _ids(seed=0, shape=(2, 9), high=600):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("abduction_type,mlp_size", [("linear", None), ("mlp", None), ("mlp", 24)])
def test_every_abduction_type_starts_at_qwen_logits_bit_for_bit(abduction_type, mlp_size):
    linear, _, qwen = build_tiny_causal_lm(seed=0)
    model, _, _ = build_tiny_causal_lm(seed=0, abduction_type=abduction_type, abduction_mlp_size=mlp_size)
    model.action.load_state_dict(linear.action.state_dict())  # the regression head is drawn at random: share it
    model.model.numerical_embedding.load_state_dict(linear.model.numerical_embedding.state_dict())
    ids = _ids()
    with torch.no_grad():
        out, reference = model(ids), linear(ids)
        logits = qwen(ids).logits
    for name in FIELDS:
        assert torch.equal(getattr(out, name), getattr(reference, name)), name
    assert torch.equal(out.loc_S[..., : logits.shape[-1]], logits)  # D7 holds exactly for every variant
    labels = ids.clone()
    with torch.no_grad():
        assert torch.equal(model(ids, labels=labels).loss, linear(ids, labels=labels).loss)


def _gelu64(x):
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _softplus64(x):
    return np.logaddexp(0.0, x)


def test_mlp_abduction_matches_its_formula_in_float64():
    torch.manual_seed(0)
    net = MLPAbductionNetwork(8, 8, scale_init=2.0, mlp_size=5).double()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 0.7)
    z = torch.randn(3, 4, 8, dtype=torch.float64)
    loc_U, scale_U = net(z)
    p = {name: value.detach().numpy() for name, value in net.named_parameters()}
    zn = z.numpy()
    h = _gelu64(zn @ p["W_in"].T + p["b_in"])
    expected_loc = zn @ p["W_loc"].T + p["b_loc"] + h @ p["W_loc_h"].T
    expected_scale = _softplus64(zn @ p["W_scale"].T + p["b_scale"] + h @ p["W_scale_h"].T)
    np.testing.assert_allclose(loc_U.detach().numpy(), expected_loc, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scale_U.detach().numpy(), expected_scale, rtol=1e-12, atol=1e-300)


def test_mlp_residual_weights_learn_from_the_first_step():
    """At initialization the residual output weights are zero but receive a gradient (W_in is random)."""
    model, _, _ = build_tiny_causal_lm(seed=0, abduction_type="mlp")
    ids = _ids(1)
    model(ids, labels=ids).loss.backward()
    net = model.abduction
    assert float(net.W_loc_h.grad.abs().sum()) > 0
    assert float(net.W_scale_h.grad.abs().sum()) > 0
    assert float(net.W_in.grad.abs().sum()) == 0.0  # its only path goes through the zero residual weights
    assert net.W_in.std().item() == pytest.approx(64**-0.5, rel=0.1)


def test_parameter_count_of_each_architecture():
    H, M = 64, 24
    linear, _, _ = build_tiny_causal_lm(seed=0)
    mlp, _, _ = build_tiny_causal_lm(seed=0, abduction_type="mlp", abduction_mlp_size=M)
    assert sum(p.numel() for p in linear.abduction.parameters()) == 2 * H * (H + 1)
    assert sum(p.numel() for p in mlp.abduction.parameters()) == 2 * H * (H + 1) + M * (H + 1) + 2 * H * M


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (dict(abduction_type="transformer"), ValueError, "abduction_type must be one of linear, mlp"),
        (dict(abduction_type=1), ValueError, "abduction_type must be one of"),
        (dict(abduction_mlp_size=8), ValueError, "abduction_mlp_size is the width"),
        (dict(abduction_type="mlp", abduction_mlp_size=0), ValueError, "abduction_mlp_size must be a positive int"),
        (dict(abduction_type="mlp", abduction_mlp_size=2.5), TypeError, "abduction_mlp_size must be an integer"),
    ],
)
def test_config_refuses_bad_abduction_settings(overrides, error, match):
    with pytest.raises(error, match=match):
        CausalQwenConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, **overrides)


def test_mlp_model_round_trips_through_save_pretrained(tmp_path):
    model, _, _ = build_tiny_causal_lm(seed=0, abduction_type="mlp", abduction_mlp_size=16)
    with torch.no_grad():
        model.abduction.W_loc_h.normal_()
    model.save_pretrained(tmp_path)
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.abduction_type == "mlp" and loaded.config.abduction_mlp_size == 16
    ids = _ids(2)
    with torch.no_grad():
        assert torch.equal(loaded(ids).loc_U, model(ids).loc_U)


# ---- abduction weights on disk (causalqwen.files.abduction_weights) ----


def _trained_abduction(abduction_type="linear"):
    model, _, _ = build_tiny_causal_lm(seed=0, abduction_type=abduction_type)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.abduction.parameters():
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=generator))
    return model


@pytest.mark.parametrize("abduction_type", ["linear", "mlp"])
def test_abduction_moves_to_another_model_of_the_same_base(tmp_path, abduction_type):
    source = _trained_abduction(abduction_type)
    path = save_abduction(source, tmp_path / "domain-b")
    assert os.path.basename(path) == "abduction.safetensors"
    target, _, _ = build_tiny_causal_lm(seed=0, abduction_type=abduction_type)
    with torch.no_grad():  # the target's own head differs: only the abduction network travels
        target.action.b_noise.fill_(0.3)
    ids = _ids(3)
    with torch.no_grad():
        before = target(ids).loc_U
        load_abduction(target, tmp_path / "domain-b")
        after = target(ids)
    assert not torch.equal(before, after.loc_U)
    assert torch.equal(after.loc_U, source(ids).loc_U)
    assert torch.equal(after.scale_U, source(ids).scale_U)
    assert torch.equal(target.action.b_noise, torch.full_like(target.action.b_noise, 0.3))


def test_load_abduction_refuses_another_architecture_naming_the_difference(tmp_path):
    save_abduction(_trained_abduction("mlp"), tmp_path)
    target, _, _ = build_tiny_causal_lm(seed=0)
    with pytest.raises(ValueError, match="abduction_type: file 'mlp', model 'linear'"):
        load_abduction(target, tmp_path)
    other_width, _, _ = build_tiny_causal_lm(seed=0, abduction_type="mlp", abduction_mlp_size=8)
    with pytest.raises(ValueError, match="abduction_mlp_size: file '64', model '8'"):
        load_abduction(other_width, tmp_path)


def test_load_abduction_refuses_missing_and_tampered_files(tmp_path):
    target, _, _ = build_tiny_causal_lm(seed=0)
    with pytest.raises(FileNotFoundError, match="no abduction network"):
        load_abduction(target, tmp_path / "nowhere")
    path = save_abduction(_trained_abduction(), tmp_path / "good")
    with safe_open(path, framework="pt") as handle:
        metadata, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}

    def write(name, new_tensors, new_metadata=metadata):
        os.makedirs(tmp_path / name)
        save_file(new_tensors, str(tmp_path / name / "abduction.safetensors"), metadata=new_metadata)
        return tmp_path / name

    state = {k: p.clone() for k, p in target.abduction.named_parameters()}
    cases = [
        (write("missing", {k: v for k, v in tensors.items() if k != "b_loc"}), "holds tensors"),
        (write("shape", tensors | {"W_loc": torch.zeros(3, 3)}), "tensor W_loc has shape"),
        (write("nan", tensors | {"b_scale": torch.full((64,), float("nan"))}), "non-finite"),
        (write("int", tensors | {"b_loc": torch.zeros(64, dtype=torch.int64)}), "floating point"),
        (write("nometa", tensors, {"format": "pt"}), "not written by save_abduction"),
    ]
    for directory, match in cases:
        with pytest.raises(ValueError, match=match):
            load_abduction(target, directory)
    os.makedirs(tmp_path / "garbage")
    (tmp_path / "garbage" / "abduction.safetensors").write_bytes(b"\x80\x04not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_abduction(target, tmp_path / "garbage")
    for name, parameter in target.abduction.named_parameters():  # a refused file changes nothing
        assert torch.equal(parameter, state[name]), name
    saved = json.loads(metadata["causalqwen_abduction"])
    assert saved["abduction_type"] == "linear" and saved["hidden_size"] == "64"


def test_the_file_is_the_one_name_abduction_weights_writes(tmp_path):
    path = save_abduction(_trained_abduction(), tmp_path)
    assert os.path.basename(path) == abduction_weights.ABDUCTION_FILE == "abduction.safetensors"
    assert abduction_weights.save_abduction is save_abduction and abduction_weights.load_abduction is load_abduction
