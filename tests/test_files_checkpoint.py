"""The values a loader reads (`causalqwen.files.checkpoint.value_problem`): floating point where a float
belongs, and finite in the dtype the tensor is loaded into -- a float64 1e300 is finite in the file and inf in a
float32 parameter. The error names the file and the tensor; non-finite parameters are never saved.
"""

import os

import pytest
import torch
from tiny_runs import TWO_STEP_RUN, tiny_data, tiny_model, with_tensor

from causalqwen import CausalQwenForCausalLM, load_abduction, save_abduction, train, training
from causalqwen.training import TrainingConfig


def _huge(tensor):
    return torch.full(tensor.shape, 1e300, dtype=torch.float64)


def test_from_pretrained_refuses_a_float64_beyond_float32(tiny, tmp_path):
    tiny[0].save_pretrained(tmp_path)
    with_tensor(tmp_path / "model.safetensors", "action.b_noise", _huge)
    with pytest.raises(OSError, match=r"action\.b_noise holds NaN or ±inf values"):  # inf once cast to float32
        CausalQwenForCausalLM.from_pretrained(tmp_path)


def test_load_abduction_refuses_a_float64_beyond_float32(tiny, tmp_path):
    path = save_abduction(tiny[0], tmp_path)
    with_tensor(path, "b_loc", _huge)
    target = tiny_model()
    before = target.model.abduction.b_loc.detach().clone()
    with pytest.raises(ValueError, match=rf"'{path}': tensor b_loc holds 1e\+300, beyond the range of float32"):
        load_abduction(target, tmp_path)
    assert torch.equal(target.model.abduction.b_loc, before)
    with_tensor(path, "b_loc", lambda t: torch.full(t.shape, 0.25, dtype=torch.float64))  # in range: loaded
    load_abduction(target, tmp_path)
    assert torch.equal(target.model.abduction.b_loc, torch.full_like(before, 0.25))


def test_value_problem_checks_the_range_of_the_dtype_a_tensor_is_loaded_into():
    from causalqwen.files.checkpoint import value_problem

    assert (
        value_problem("w", torch.tensor([1e300, -2.0], dtype=torch.float64), torch.float32)
        == "w holds 1e+300, beyond the range of float32 (largest 3.4e+38): it would become ±inf"
    )
    assert value_problem("w", torch.tensor([3e38]), torch.float32) is None  # float32 into float32: in range
    assert value_problem("w", torch.tensor([7e4]), torch.float16).startswith(
        "w holds 7e+04, beyond the range of float16"
    )
    assert value_problem("w", torch.tensor([7e4]), torch.bfloat16) is None
    assert value_problem("w", torch.tensor([1e-300], dtype=torch.float64), torch.float32) is None  # rounds, not refused
    assert (
        value_problem("w", torch.tensor([1, 2]), torch.float32)
        == "w is stored as torch.int64, not a floating-point tensor"
    )
    assert (
        value_problem("w", torch.tensor([True]), torch.float32)
        == "w is stored as torch.bool, not a floating-point tensor"
    )
    assert value_problem("w", torch.tensor([float("-inf")]), torch.float32) == "w holds NaN or ±inf values"
    assert value_problem("w", torch.empty(0, dtype=torch.float64), torch.float32) is None


def test_non_finite_parameters_are_never_saved(tiny, tmp_path, monkeypatch):
    original = torch.optim.AdamW.step

    def poisoned_step(self, *args, **kwargs):  # a step that leaves a NaN in a trained matrix, the loss still finite
        result = original(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("nan"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned_step)
    out = tmp_path / "run"
    config = TrainingConfig(**TWO_STEP_RUN | {"steps": 1, "save_every": 1})
    with pytest.raises(
        training.TrainingDiverged,
        match=r"training diverged by step 1: the parameter \S+ holds NaN or "
        r"±inf values, so neither a checkpoint nor the model is written",
    ):
        train(tiny_model(), tiny_data(tiny[1]), config, out_dir=str(out), progress=False)
    assert not any(name.startswith("checkpoint-") for name in os.listdir(out))
    with pytest.raises(training.TrainingDiverged, match="training diverged by step 1"):  # no out_dir: at the end
        train(tiny_model(), tiny_data(tiny[1]), config, progress=False)
