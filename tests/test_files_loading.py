"""Loading a saved model (`causalqwen.files.loading`): what causalqwen reads is data, never code.

No pickle is ever loaded (a planted training-state pickle stays unread; a directory with only a pickled model is
refused); index shards outside the directory are refused; a config announcing huge sizes fails before allocating;
config fields are type- and range-checked by name.
"""

import json
import os
import pickle
import shutil
import time

import pytest
from safetensors.torch import load_file
from tiny_runs import FOUR_STEP_RUN, edit_config, run_until_first_checkpoint, saved_copy, tiny_data, tiny_model
from wall_clock import budget

from causalqwen import CausalQwenForCausalLM, train
from causalqwen.app.tiny import save_tiny_base
from causalqwen.configuration import CausalQwenConfig
from causalqwen.files.checkpoint import weight_files
from causalqwen.training import TrainingConfig


class _Planted:
    """A pickle that runs code when loaded: unpickling it creates the file ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant(target, witness):
    with open(target, "wb") as handle:
        pickle.dump(_Planted(witness), handle)


def test_a_planted_training_state_pickle_is_never_loaded(tokenizer, tmp_path, monkeypatch):
    out, witness = tmp_path / "run", tmp_path / "pwned"
    run_until_first_checkpoint(tokenizer, out, monkeypatch)
    checkpoint = out / "checkpoint-2"
    assert not [name for name in os.listdir(checkpoint) if name.endswith((".pt", ".bin", ".pkl"))]
    _plant(checkpoint / "training_state.pt", witness)  # beside the real state: ignored
    train(
        tiny_model(),
        tiny_data(tokenizer),
        TrainingConfig(**FOUR_STEP_RUN),
        out_dir=str(out),
        resume=True,
        progress=False,
    )
    assert not witness.exists()

    out2 = tmp_path / "run2"
    run_until_first_checkpoint(tokenizer, out2, monkeypatch)
    for name in ("trainer_state.json", "training_state.safetensors"):  # an old-format checkpoint: only the pickle
        os.remove(out2 / "checkpoint-2" / name)
    _plant(out2 / "checkpoint-2" / "training_state.pt", witness)
    with pytest.raises(OSError, match=r"training_state\.pt' is a pickle .* never loaded"):
        train(
            tiny_model(),
            tiny_data(tokenizer),
            TrainingConfig(**FOUR_STEP_RUN),
            out_dir=str(out2),
            resume=True,
            progress=False,
        )
    assert not witness.exists()


def test_a_directory_with_only_a_pickled_model_is_refused(saved, tmp_path):
    witness = tmp_path / "pwned"
    target = saved_copy(saved, tmp_path)
    os.remove(target / "model.safetensors")
    _plant(target / "pytorch_model.bin", witness)
    with pytest.raises(
        OSError, match=r"holds no model\.safetensors .*pytorch_model\.bin \(pickle\), which causalqwen never loads"
    ):
        CausalQwenForCausalLM.from_pretrained(target)
    with pytest.raises(ValueError, match="use_safetensors=False would unpickle"):
        CausalQwenForCausalLM.from_pretrained(saved, use_safetensors=False)
    qwen_dir = tmp_path / "qwen"
    save_tiny_base(qwen_dir)
    os.remove(qwen_dir / "model.safetensors")
    _plant(qwen_dir / "pytorch_model.bin", witness)
    with pytest.raises(OSError, match="never loads"):
        CausalQwenForCausalLM.from_qwen(str(qwen_dir))
    assert not witness.exists()


@pytest.mark.parametrize(
    "shard", ["../outside/model.safetensors", "/ABSOLUTE/model.safetensors", "sub/../../x.safetensors"]
)
def test_index_shards_outside_the_directory_are_refused(saved, tmp_path, shard):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(saved / "model.safetensors", outside / "model.safetensors")
    shard = shard.replace("/ABSOLUTE", str(outside))
    target = saved_copy(saved, tmp_path)
    os.remove(target / "model.safetensors")
    names = list(load_file(outside / "model.safetensors"))
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: shard for k in names}})
    )
    with pytest.raises(OSError, match="outside its directory"):
        CausalQwenForCausalLM.from_pretrained(target)


def test_a_shard_inside_the_directory_loads(saved, tmp_path):
    target = saved_copy(saved, tmp_path)
    (target / "shards").mkdir()
    os.replace(target / "model.safetensors", target / "shards" / "part.safetensors")
    names = list(load_file(target / "shards" / "part.safetensors"))
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: "shards/./part.safetensors" for k in names}})
    )
    assert weight_files(target) == [str(target / "shards" / "part.safetensors")]
    CausalQwenForCausalLM.from_pretrained(target)


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        (
            "vocab_size",
            10**12,
            r"config\.json says vocab_size=1000000000000, hidden_size=64, but model\.embed_tokens\.weight",
        ),
        ("num_hidden_layers", 10**6, r"num_hidden_layers=1000000, but .* holds 2 layers"),
        ("intermediate_size", 10**9, r"intermediate_size=1000000000, but model\.layers\.0\.mlp\.gate_proj\.weight"),
    ],
)
def test_a_config_announcing_huge_sizes_fails_before_allocating(saved, tmp_path, field, value, pattern):
    target = saved_copy(saved, tmp_path)
    edit_config(target, **{field: value}, **({"layer_types": None} if field == "num_hidden_layers" else {}))
    started = time.perf_counter()
    with pytest.raises(ValueError, match=pattern):  # an allocation would have been a MemoryError / RuntimeError
        CausalQwenForCausalLM.from_pretrained(target)
    assert time.perf_counter() - started < budget(30)  # generous: the check reads headers only (milliseconds)


def test_a_qwen_base_with_a_huge_vocabulary_fails_before_allocating(tmp_path):
    qwen_dir = tmp_path / "qwen"
    save_tiny_base(qwen_dir)
    edit_config(qwen_dir, vocab_size=10**12)
    with pytest.raises(ValueError, match="vocab_size=1000000000000"):
        CausalQwenForCausalLM.from_qwen(str(qwen_dir))


@pytest.mark.parametrize(
    "field, value, error, pattern",
    [
        ("detach_gate", "false", TypeError, r"detach_gate must be true or false \(a JSON boolean\), got 'false'"),
        ("learnable_threshold", 1, TypeError, "learnable_threshold must be true or false"),
        ("num_token_id", 1.5, TypeError, "num_token_id must be an integer, got 1.5"),
        ("ovr_threshold", "100", TypeError, "ovr_threshold must be a number, got '100'"),
        ("ignore_index", None, TypeError, "ignore_index must be an integer, got None"),
        ("ovr_threshold", -3e38, ValueError, r"ovr_threshold must be a number in \[-1e\+30, 1e\+30\], got -3e\+38"),
        ("noise_init", 3e38, ValueError, r"noise_init must be a number in \[-1e\+30, 1e\+30\]"),
        ("abduction_scale_init", 0.0, ValueError, r"abduction_scale_init must be a number in \(0, 1e\+30\]"),
        ("scale_eps", 1e-45, ValueError, r"scale_eps must be a number in \[1e-30, 1e\+30\]"),
        ("gate_alpha", float("nan"), ValueError, "gate_alpha must be finite"),
    ],
)
def test_config_fields_are_type_and_range_checked(saved, tmp_path, field, value, error, pattern):
    config = CausalQwenConfig.from_pretrained(saved).to_dict()
    with pytest.raises(error, match=pattern):
        CausalQwenConfig.from_dict(config | {field: value})
    target = saved_copy(saved, tmp_path)
    edit_config(target, **{field: value})
    with pytest.raises(ValueError, match=r"config\.json: .*" + pattern.split(" must")[0]):  # the file is named
        CausalQwenForCausalLM.from_pretrained(target)
