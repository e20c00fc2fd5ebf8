"""LoRA on the backbone (`causalqwen.integrations.lora`): exact at creation, the trainable set, merging, saving and
loading without pickle, and the adapter-disabled pass as the untouched base model.

Every expectation comes from an independent source: the plain model's own outputs and shapes, an untouched deep
copy of the base, `causalqwen.training.set_trainable`'s causal preset, and the saved files on disk.
"""

import copy
import json
import os
import pathlib
import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import tiny_data, tiny_model, with_tensor
from torch import nn

from causalqwen import CausalQwenForCausalLM, train
from causalqwen.configuration import CausalQwenConfig
from causalqwen.decision import DecisionHead
from causalqwen.divergence import DivergenceBound
from causalqwen.files.data import TextDataset, collate, synthetic_texts
from causalqwen.generation import generate
from causalqwen.integrations.lora import (
    CAUSAL_MODULES,
    LORA_TARGET_MODULES,
    add_lora,
    base_reference,
    load_lora,
    merge_lora,
    save_lora,
    trainable_parameter_count,
)
from causalqwen.training import TrainingConfig, set_trainable

FIELDS = ("loss", "cls_loss", "reg_loss", "loc_U", "scale_U", "loc_S", "scale_S", "loc_Y", "scale_Y")
OWNER = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


@pytest.fixture(scope="module")
def tiny():
    """The tiny CausalQwen (never modified: tests work on deep copies) and a batch of 8 synthetic texts."""
    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    batch = collate(TextDataset(synthetic_texts(8, seed=0), tokenizer, max_length=32).items, tokenizer.pad_token_id)
    return model, batch


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    """An adapter trained a few steps and saved with `save_lora`: its directory, its outputs, its trainable names."""
    peft_model = _trained(tiny)
    path = tmp_path_factory.mktemp("adapter")
    assert save_lora(peft_model, path) == str(path)
    return path, _outputs(peft_model, tiny[1]), _trainable_names(peft_model)


def _copy_of(saved, tmp_path, name: str = "adapter") -> pathlib.Path:
    """A copy of the saved adapter directory, for a test that damages it."""
    return pathlib.Path(shutil.copytree(saved[0], tmp_path / name))


def _base(tiny) -> CausalQwenForCausalLM:
    return copy.deepcopy(tiny[0])


@torch.no_grad()
def _outputs(model, batch) -> dict[str, torch.Tensor]:
    """The loss (a pass with labels) and the decisions (a pass without)."""
    with_labels = model(**batch)
    inputs = {key: batch[key] for key in ("input_ids", "numeric_values", "attention_mask")}
    decisions = model(**inputs)
    return {
        "loss": with_labels.loss,
        "cls_loss": with_labels.cls_loss,
        "reg_loss": with_labels.reg_loss,
        "loc_U": with_labels.loc_U,
        "scale_U": with_labels.scale_U,
        "loc_S": decisions.loc_S,
        "scale_S": decisions.scale_S,
        "loc_Y": decisions.loc_Y,
        "scale_Y": decisions.scale_Y,
    }


def _assert_equal(got: dict, expected: dict) -> None:
    for name in FIELDS:
        assert torch.equal(got[name], expected[name]), f"{name} differs"


def _train(peft_model, batch, steps: int = 3, lr: float = 1e-2):
    """A few AdamW steps on the batch (B leaves 0), then eval mode."""
    peft_model.train()
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        loss = peft_model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peft_model.eval()
    return peft_model


def _trained(tiny):
    return _train(add_lora(_base(tiny)), tiny[1])


def _backbone_linears(model, targets=LORA_TARGET_MODULES) -> dict[str, nn.Linear]:
    """The plain model's targeted linear layers, found by walking the decoder layers (not by peft)."""
    return {
        f"model.layers.{index}.{OWNER[name]}.{name}": getattr(getattr(layer, OWNER[name]), name)
        for index, layer in enumerate(model.model.layers)
        for name in targets
    }


def _trainable_names(model) -> set[str]:
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def _saved_name(plain_name: str) -> str:
    """A causal-preset parameter's name in the PeftModel: the trained copy inside peft's wrapper."""
    for prefix in CAUSAL_MODULES:
        if plain_name.startswith(prefix + "."):
            return f"base_model.model.{prefix}.modules_to_save.default.{plain_name[len(prefix) + 1 :]}"
    raise AssertionError(f"{plain_name} is not in a causal module")


# =============================================================================================
# Creation
# =============================================================================================


def test_at_creation_the_outputs_are_the_plain_models_bit_for_bit(tiny):
    model, batch = tiny
    expected = _outputs(model, batch)
    peft_model = add_lora(_base(tiny), rank=4, alpha=32, dropout=0.1)
    _assert_equal(_outputs(peft_model.eval(), batch), expected)


def test_lora_layers_sit_on_the_backbone_linears_only(tiny):
    model = _base(tiny)
    expected = set(_backbone_linears(model))
    assert len(expected) == 7 * model.config.num_hidden_layers
    add_lora(model)
    adapted = {name for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert adapted == expected
    wrapped = {
        name
        for name, module in model.named_modules()
        if hasattr(module, "modules_to_save") and hasattr(module, "original_module")
    }
    assert wrapped == set(CAUSAL_MODULES)


def test_a_subset_of_targets_gets_adapters_in_every_layer(tiny):
    model = _base(tiny)
    expected = set(_backbone_linears(model, ("v_proj", "down_proj")))
    add_lora(model, target_modules=["down_proj", "v_proj"])
    assert {name for name, module in model.named_modules() if hasattr(module, "lora_A")} == expected


def test_the_trainable_set_is_lora_plus_the_causal_preset(tiny):
    plain = _base(tiny)
    causal = set_trainable(plain, "causal")  # the project's own definition of the preset
    targets = _backbone_linears(plain)
    expected = {f"base_model.model.{target}.lora_{matrix}.default.weight" for target in targets for matrix in "AB"}
    expected |= {_saved_name(name) for name in causal}
    peft_model = add_lora(_base(tiny))
    assert _trainable_names(peft_model) == expected
    frozen = {name for name, parameter in peft_model.named_parameters() if not parameter.requires_grad}
    assert "base_model.model.model.embed_tokens.weight" in frozen
    assert "base_model.model.model.norm.weight" in frozen
    assert {f"base_model.model.{target}.base_layer.weight" for target in targets} <= frozen
    base_copies = {
        name.replace(".modules_to_save.default.", ".original_module.")
        for name in expected
        if ".modules_to_save." in name
    }
    assert base_copies <= frozen


@pytest.mark.parametrize("rank, targets", [(8, LORA_TARGET_MODULES), (3, ("q_proj", "up_proj", "down_proj"))])
def test_the_parameter_count_is_the_lora_formula_plus_the_causal_preset(tiny, rank, targets):
    plain = _base(tiny)
    lora = sum(rank * (layer.in_features + layer.out_features) for layer in _backbone_linears(plain, targets).values())
    set_trainable(plain, "causal")
    causal = sum(parameter.numel() for parameter in plain.parameters() if parameter.requires_grad)
    peft_model = add_lora(_base(tiny), rank=rank, target_modules=targets)
    assert trainable_parameter_count(peft_model) == lora + causal
    lora_numel = sum(p.numel() for name, p in peft_model.named_parameters() if ".lora_" in name)
    assert lora_numel == lora


def test_gradients_reach_the_lora_matrices_and_the_causal_copies_only(tiny):
    _, batch = tiny
    peft_model = add_lora(_base(tiny)).train()
    peft_model(**batch).loss.backward()
    for name, parameter in peft_model.named_parameters():
        if not parameter.requires_grad:
            assert parameter.grad is None, name
        elif ".lora_B." in name or ".modules_to_save." in name:
            assert parameter.grad is not None and bool(parameter.grad.abs().sum() > 0), name
        else:  # lora_A: its gradient is B^T (...) with B = 0 at creation
            assert ".lora_A." in name and bool((parameter.grad == 0).all()), name
    _train(peft_model, batch, steps=1)
    peft_model.train()
    peft_model(**batch).loss.backward()
    for name, parameter in peft_model.named_parameters():
        if ".lora_A." in name:
            assert bool(parameter.grad.abs().sum() > 0), name


def test_the_trained_head_reads_the_models_config(tiny):
    model = _base(tiny)
    peft_model = add_lora(model)
    heads = [module for module in peft_model.modules() if isinstance(module, DecisionHead)]
    assert len(heads) == 2  # the base copy and the trained copy
    assert all(head.config is model.config for head in heads)


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        (dict(rank=0), ValueError, "rank"),
        (dict(rank=-2), ValueError, "rank"),
        (dict(rank=2.0), TypeError, "rank"),
        (dict(rank=True), TypeError, "rank"),
        (dict(rank="8"), TypeError, "rank"),
        (dict(alpha=0), ValueError, "alpha"),
        (dict(alpha=-1.0), ValueError, "alpha"),
        (dict(alpha=float("nan")), ValueError, "alpha"),
        (dict(alpha=float("inf")), ValueError, "alpha"),
        (dict(alpha="16"), TypeError, "alpha"),
        (dict(dropout=1.0), ValueError, "dropout"),
        (dict(dropout=-0.1), ValueError, "dropout"),
        (dict(dropout=float("nan")), ValueError, "dropout"),
        (dict(dropout=None), TypeError, "dropout"),
        (dict(target_modules="q_proj"), TypeError, "target_modules"),
        (dict(target_modules=()), ValueError, "empty"),
        (dict(target_modules=("q_proj", "classification_head")), ValueError, "classification_head"),
        (dict(target_modules=("lm_head",)), ValueError, "lm_head"),
    ],
)
def test_bad_arguments_are_refused_before_the_model_is_touched(tiny, arguments, error, match):
    model = _base(tiny)
    with pytest.raises(error, match=match):
        add_lora(model, **arguments)
    assert not any(hasattr(module, "lora_A") for module in model.modules())


def test_only_a_plain_causalqwen_model_is_accepted(tiny):
    from causalqwen.app.tiny import build_tiny_qwen

    with pytest.raises(TypeError, match="CausalQwenForCausalLM"):
        add_lora(build_tiny_qwen())
    peft_model = add_lora(_base(tiny))
    with pytest.raises(TypeError, match="already a PeftModel"):
        add_lora(peft_model)
    with pytest.raises(TypeError, match="already holds peft adapter"):
        add_lora(peft_model.get_base_model())
    with pytest.raises(TypeError, match="PeftModel"):
        merge_lora(_base(tiny))
    with pytest.raises(TypeError, match="PeftModel"):
        save_lora(_base(tiny), "unused")
    with pytest.raises(TypeError, match="Module"):
        trainable_parameter_count("model")


# =============================================================================================
# The adapter-disabled pass is the base model
# =============================================================================================


def test_disable_adapter_gives_the_untouched_base_even_after_training(tiny):
    model, batch = tiny
    base = _outputs(model, batch)
    peft_model = _trained(tiny)
    trained = _outputs(peft_model, batch)
    assert (trained["loc_U"] - base["loc_U"]).abs().max() > 1e-3  # the adapter did move the law of U
    assert (trained["scale_U"] - base["scale_U"]).abs().max() > 1e-3
    with peft_model.disable_adapter():
        _assert_equal(_outputs(peft_model, batch), base)
        reference = peft_model(**batch)  # with autograd on: nothing requires a gradient inside
        assert not reference.loc_U.requires_grad and not reference.scale_U.requires_grad
    _assert_equal(_outputs(peft_model, batch), trained)  # and back to the adapted model on exit


@pytest.mark.parametrize("trainable", [False, True])
def test_base_reference_restores_every_requires_grad_flag(tiny, saved, trainable):
    model, batch = tiny
    peft_model = load_lora(_base(tiny), saved[0], trainable=trainable)
    flags = {name: parameter.requires_grad for name, parameter in peft_model.named_parameters()}
    assert any(flags.values()) == trainable
    with base_reference(peft_model) as reference:
        _assert_equal(_outputs(reference, batch), _outputs(model, batch))
        assert not any(parameter.requires_grad for parameter in peft_model.parameters())
    assert {name: parameter.requires_grad for name, parameter in peft_model.named_parameters()} == flags


# =============================================================================================
# Merging
# =============================================================================================


def test_the_merged_model_computes_what_the_adapted_model_computed(tiny, tmp_path):
    model, batch = tiny
    base = _outputs(model, batch)
    peft_model = _trained(tiny)
    adapted = _outputs(peft_model, batch)
    trained_head = {
        name: tensor.clone()
        for name, tensor in peft_model.base_model.model.action.modules_to_save["default"].state_dict().items()
    }
    prompt = batch["input_ids"][:2, :6]
    adapted_generation = peft_model.generate(prompt, max_new_tokens=4)

    merged = merge_lora(peft_model)
    assert type(merged) is CausalQwenForCausalLM
    assert not any(hasattr(module, "lora_A") or hasattr(module, "original_module") for module in merged.modules())
    assert type(merged.action) is DecisionHead and merged.action.config is merged.config
    for name, tensor in merged.action.state_dict().items():
        assert torch.equal(tensor, trained_head[name]), name
    got = _outputs(merged, batch)
    for name in FIELDS:
        torch.testing.assert_close(got[name], adapted[name], rtol=1e-5, atol=1e-5, msg=name)
    assert (got["loc_U"] - base["loc_U"]).abs().max() > 1e-3
    assert torch.equal(merged.generate(prompt, max_new_tokens=4), adapted_generation)
    sequences = generate(merged, prompt, max_new_tokens=4).sequences  # the reference loop, up to EOS in every row
    assert sequences.shape[0] == 2 and 6 < sequences.shape[1] <= 10
    assert torch.equal(sequences, adapted_generation[:, : sequences.shape[1]])

    merged.save_pretrained(tmp_path)  # an ordinary CausalQwen checkpoint
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".bin", ".pt", ".pth", ".pkl"))]
    reloaded = CausalQwenForCausalLM.from_pretrained(tmp_path)
    _assert_equal(_outputs(reloaded, batch), got)


# =============================================================================================
# Saving and loading
# =============================================================================================


def _refuse_pickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was read")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)


def test_save_and_load_round_trip_through_safetensors_only(tiny, saved, monkeypatch):
    model, batch = tiny
    path, adapted, trainable_names = saved
    assert sorted(os.listdir(path)) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert sorted(config["modules_to_save"]) == sorted(CAUSAL_MODULES)

    _refuse_pickle(monkeypatch)
    loaded = load_lora(_base(tiny), path)
    _assert_equal(_outputs(loaded, batch), adapted)
    assert trainable_parameter_count(loaded) == 0
    with loaded.disable_adapter():
        _assert_equal(_outputs(loaded, batch), _outputs(model, batch))
    resumed = load_lora(_base(tiny), str(path), trainable=True)
    assert _trainable_names(resumed) == trainable_names
    _assert_equal(_outputs(resumed, batch), adapted)


def test_load_refuses_what_is_not_a_safetensors_lora_adapter(tiny, saved, tmp_path, monkeypatch):
    _refuse_pickle(monkeypatch)
    model = _base(tiny)
    with pytest.raises(OSError, match="does not exist"):
        load_lora(model, tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="not a directory"):
        load_lora(model, tmp_path / "file")
    with pytest.raises(OSError, match="adapter_config.json is missing"):
        load_lora(model, tmp_path)
    with pytest.raises(TypeError, match="path"):
        load_lora(model, 3)
    with pytest.raises(TypeError, match="trainable"):
        load_lora(model, tmp_path, trainable=1)

    pickled = _copy_of(saved, tmp_path, "pickled")
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    with pytest.raises(OSError, match=r"adapter_model\.bin \(pickle\), which causalqwen never loads"):
        load_lora(model, pickled)

    truncated = _copy_of(saved, tmp_path, "truncated")
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(OSError, match="cannot be read"):
        load_lora(model, truncated)
    assert not any(hasattr(module, "lora_A") for module in model.modules())  # refused before touching the model


def test_load_refuses_an_adapter_of_another_base(tiny, saved):
    settings = {key: value for key, value in tiny[0].config.to_dict().items() if key != "layer_types"}
    for change, message in [
        ({"intermediate_size": 96}, "has shape"),
        ({"num_hidden_layers": 1}, "in the checkpoint but not in the model"),
        ({"num_hidden_layers": 3}, "missing from the checkpoint"),
    ]:
        other = CausalQwenForCausalLM(CausalQwenConfig.from_dict({**settings, **change}))
        with pytest.raises(ValueError, match=message):
            load_lora(other, saved[0])
        assert not any(hasattr(module, "lora_A") for module in other.modules())


def test_load_refuses_non_finite_tensors_and_foreign_configs(tiny, saved, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy_of(saved, tmp_path)
    weights = path / "adapter_model.safetensors"
    state = load_file(weights)
    name = next(key for key in state if key.endswith("lora_B.weight"))
    state[name][0, 0] = float("nan")
    save_file(state, weights)
    with pytest.raises(ValueError, match="NaN"):
        load_lora(_base(tiny), path)

    config = json.loads((path / "adapter_config.json").read_text())
    config["modules_to_save"] = ["action"]
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not written by add_lora"):
        load_lora(_base(tiny), path)


# =============================================================================================
# The recorded base: portable across working directories, read back without the network
# =============================================================================================


def _adapter_on_a_saved_base(tiny, root: pathlib.Path, monkeypatch):
    """The tiny model saved to ``root/work/qwen-causal``, loaded from ``root/work`` by the relative name a user
    types, given trained adapters and saved to ``root/work/adapter`` (relative too); then the working directory
    becomes ``root/elsewhere``. Returns the adapter directory, the adapted outputs and the merged model's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (root / "work").mkdir()
    (root / "elsewhere").mkdir()
    tiny[0].save_pretrained(root / "work" / "qwen-causal")
    monkeypatch.chdir(root / "work")
    base = CausalQwenForCausalLM.from_pretrained("qwen-causal")
    assert base.name_or_path == str((root / "work" / "qwen-causal").resolve())  # not "qwen-causal" as typed
    peft_model = _train(add_lora(base), tiny[1])
    save_lora(peft_model, "adapter")
    adapted = _outputs(peft_model, tiny[1])
    merged = _outputs(merge_lora(peft_model), tiny[1])
    monkeypatch.chdir(root / "elsewhere")
    return root / "work" / "adapter", adapted, merged


def test_an_adapter_records_its_base_by_absolute_path_and_loads_from_another_directory(tiny, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM

    from causalqwen.app.commands import load_base

    adapter, adapted, merged = _adapter_on_a_saved_base(tiny, tmp_path, monkeypatch)
    recorded = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str((tmp_path / "work" / "qwen-causal").resolve())

    # peft's own loader: the adapter's auto_mapping names causalqwen.modeling, which peft imports only when allowed
    with pytest.raises(ValueError, match="import_allowlist"):
        AutoPeftModelForCausalLM.from_pretrained(str(adapter))
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(adapter), import_allowlist=["causalqwen"])
    _assert_equal(_outputs(loaded.get_base_model(), tiny[1]), adapted)
    _assert_equal(_outputs(loaded, tiny[1]), adapted)  # called as peft wraps it (peft passes inputs_embeds=None)
    unloaded = loaded.merge_and_unload()
    assert isinstance(unloaded, CausalQwenForCausalLM)
    assert torch.equal(_outputs(unloaded.eval(), tiny[1])["loc_S"], merged["loc_S"])

    # causalqwen's: the recorded base, then the checked adapter on it
    _assert_equal(_outputs(load_lora(load_base(adapter), adapter), tiny[1]), adapted)


def test_a_base_loaded_by_a_relative_path_is_recorded_whatever_the_working_directory_becomes(
    tiny, tmp_path, monkeypatch
):
    """The working directory changes between loading the base and adding the adapter, to one that holds another
    directory of the same name: the adapter records the base it was added to, and loads from a third directory."""
    from peft import AutoPeftModelForCausalLM

    from causalqwen.app.commands import load_base

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("work", "other", "elsewhere"):
        (tmp_path / name).mkdir()
    tiny[0].save_pretrained(tmp_path / "work" / "model")
    decoy = copy.deepcopy(tiny[0])
    with torch.no_grad():
        decoy.model.abduction.b_loc.add_(1.0)  # another model under the same relative name
    decoy.save_pretrained(tmp_path / "other" / "model")
    monkeypatch.chdir(tmp_path / "work")
    base = CausalQwenForCausalLM.from_pretrained("model")
    monkeypatch.chdir(tmp_path / "other")
    peft_model = _train(add_lora(base), tiny[1])
    save_lora(peft_model, "adapter")
    adapted = _outputs(peft_model, tiny[1])
    adapter = tmp_path / "other" / "adapter"
    recorded = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str((tmp_path / "work" / "model").resolve())

    monkeypatch.chdir(tmp_path / "elsewhere")
    _assert_equal(_outputs(load_lora(load_base(adapter), adapter), tiny[1]), adapted)
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(adapter), import_allowlist=["causalqwen"])
    _assert_equal(_outputs(loaded, tiny[1]), adapted)


def test_peft_s_own_get_peft_model_and_save_pretrained_record_the_absolute_base(tiny, tmp_path, monkeypatch):
    """The peft habit, without causalqwen's add_lora and save_lora: the base's name_or_path is what peft records."""
    from peft import AutoPeftModelForCausalLM, LoraConfig, get_peft_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    tiny[0].save_pretrained(tmp_path / "work" / "model")
    monkeypatch.chdir(tmp_path / "work")
    peft_model = get_peft_model(
        CausalQwenForCausalLM.from_pretrained("model"),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    peft_model.eval()
    peft_model.save_pretrained("adapter")
    adapted = _outputs(peft_model, tiny[1])
    adapter = tmp_path / "work" / "adapter"
    recorded = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str((tmp_path / "work" / "model").resolve())

    monkeypatch.chdir(tmp_path / "elsewhere")
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(adapter), import_allowlist=["causalqwen"])
    _assert_equal(_outputs(loaded, tiny[1]), adapted)
    assert not torch.equal(adapted["loc_S"], _outputs(tiny[0], tiny[1])["loc_S"])  # the adapter does change it


def test_a_recorded_base_that_cannot_be_found_offline_is_named(tiny, saved, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM

    from causalqwen.app.commands import load_base
    from causalqwen.integrations.lora_base import adapter_base, portable_base, record_base

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no directory Qwen/Qwen2.5-0.5B here: a hub id stays a hub id
    assert portable_base("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B" and portable_base(None) is None
    path = _copy_of(saved, tmp_path)
    with pytest.raises(ValueError, match="records no base model"):  # the tiny model was built in memory
        load_base(path)

    def record(base):
        config = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}))

    gone = str(tmp_path / "gone")
    record(gone)
    with pytest.raises(OSError, match=f"{gone!r} recorded by the adapter .* does not exist"):
        load_base(path)
    with pytest.raises(OSError, match=gone):
        AutoPeftModelForCausalLM.from_pretrained(str(path), import_allowlist=["causalqwen"])

    record("someone/not-in-the-cache")
    with pytest.raises(OSError, match="'someone/not-in-the-cache' .* not in the local Hugging Face cache"):
        load_base(path)

    record("qwen-causal")  # an adapter saved before the record was absolute: not guessed, the fix is named
    with pytest.raises(ValueError, match="relative path 'qwen-causal'.*record_base"):
        adapter_base(path)
    tiny[0].save_pretrained(tmp_path / "qwen-causal")
    assert record_base(path, tmp_path / "qwen-causal") == str((tmp_path / "qwen-causal").resolve())
    assert adapter_base(path) == str((tmp_path / "qwen-causal").resolve())
    _assert_equal(_outputs(load_lora(load_base(path), path), tiny[1]), saved[1])


# The ``lora`` preset in the training loop: adapters on the backbone plus the causal modules, the bound's
# adapter-disabled base pass, checkpoints of adapters and a bit-exact resume, and the merged result.
#
# Oracles: an untouched copy of the base model (the base law of U), the uninterrupted run, the unmerged model.


def _lora_model(rank=4, seed=0):
    """The tiny model with LoRA adapters whose random start (peft draws lora_A from the global generator) is fixed
    by ``seed``, whatever the global random state is: the runs a resume is compared with start alike."""
    model = tiny_model()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return add_lora(model, rank=rank)


def _data(tokenizer, n=40, seed=0):
    return tiny_data(tokenizer, n, seed)


CONFIG = dict(
    steps=6,
    batch_size=5,
    learning_rate=1e-2,
    warmup_steps=1,
    preset="lora",
    eval_every=100,
    save_every=3,
    log_every=1,
    seed=0,
)


def test_lora_preset_trains_adapters_and_causal_modules_only(tokenizer):
    base = tiny_model()
    before = copy.deepcopy(base.state_dict())
    peft_model = add_lora(tiny_model(), rank=4)
    names = set_trainable(peft_model, "lora")
    assert names and all(".lora_A." in n or ".lora_B." in n or ".modules_to_save." in n for n in names)
    assert sum(p.numel() for n, p in peft_model.named_parameters() if n in names) == trainable_parameter_count(
        peft_model
    )
    train(peft_model, _data(tokenizer), TrainingConfig(**CONFIG), progress=False)
    merged = merge_lora(peft_model)
    for name, tensor in merged.state_dict().items():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            assert not torch.equal(tensor, before[name]), name  # LoRA moved every target
        if name in ("model.embed_tokens.weight", "model.norm.weight") or "layernorm" in name or "proj.bias" in name:
            assert torch.equal(tensor, before[name]), name  # the rest of the backbone is frozen
    assert not torch.equal(merged.model.abduction.W_loc, before["model.abduction.W_loc"])


def test_presets_and_models_must_agree():
    with pytest.raises(TypeError, match="preset 'lora' trains the adapters"):
        set_trainable(tiny_model(), "lora")
    with pytest.raises(TypeError, match="preset 'causal'"):
        set_trainable(add_lora(tiny_model(), rank=2), "causal")


def test_the_adapter_disabled_base_law_is_the_untouched_models(tokenizer):
    untouched = tiny_model()
    peft_model = add_lora(tiny_model(), rank=4)
    bound = DivergenceBound(peft_model, 0.1, "lora")
    train(peft_model, _data(tokenizer), TrainingConfig(**CONFIG), progress=False)
    batch = collate(_data(tokenizer, 6, seed=5).items, tokenizer.pad_token_id)
    base_loc, base_scale = bound.base.law(batch)
    with torch.no_grad():
        expected = untouched.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    assert torch.equal(base_loc, expected.loc_U) and torch.equal(base_scale, expected.scale_U)
    flags = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    set_trainable(peft_model, "lora")
    assert flags == {n: p.requires_grad for n, p in peft_model.named_parameters()}  # the base pass kept them


def test_lora_with_the_bound_resumes_bit_exact_and_reloads(tokenizer, tmp_path, killed_after_first_save):
    config = TrainingConfig(**CONFIG | {"steps": 7, "max_u_divergence": 0.05, "divergence_dual_lr": 5.0})
    uninterrupted = _lora_model()
    full_history = train(uninterrupted, _data(tokenizer), config, None, str(tmp_path / "a"), progress=False)
    assert any(record["constraint/multiplier"] > 0 for record in full_history)
    with killed_after_first_save():
        train(_lora_model(), _data(tokenizer), config, None, str(tmp_path / "b"), progress=False)
    assert sorted(
        p.name for p in (tmp_path / "b" / "checkpoint-3").iterdir() if p.suffix in (".safetensors", ".json")
    ) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "checkpoint_files.json",
        "config.json",
        "divergence_bound.json",
        "divergence_reference.safetensors",
        "history.json",
        "trainer_state.json",
        "training_state.safetensors",
    ]
    resumed = _lora_model()
    history = train(resumed, _data(tokenizer), config, None, str(tmp_path / "b"), resume=True, progress=False)
    for (name, a), (_, b) in zip(uninterrupted.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert history == full_history
    reloaded = load_lora(tiny_model(), tmp_path / "b" / "checkpoint-7")
    batch = collate(_data(tokenizer, 4, seed=6).items, tokenizer.pad_token_id)
    with torch.no_grad():
        assert torch.equal(reloaded(**batch).loss, uninterrupted.eval()(**batch).loss)


def _huge(tensor):
    return torch.full(tensor.shape, 1e300, dtype=torch.float64)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    path = tmp_path_factory.mktemp("adapter")
    save_lora(add_lora(tiny_model(), rank=2), path)
    return path


def _adapter_copy(adapter, tmp_path):
    target = tmp_path / "adapter"
    shutil.copytree(adapter, target)
    return target


def _edit_adapter_config(path, **fields):
    file = path / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update(fields)
    file.write_text(json.dumps(config))
    return file


def test_load_lora_refuses_a_float64_beyond_float32(adapter, tmp_path):
    path = _adapter_copy(adapter, tmp_path)
    weights = path / "adapter_model.safetensors"
    name = next(key for key in load_file(weights) if key.endswith("lora_A.weight"))
    with_tensor(weights, name, _huge)
    model = tiny_model()
    with pytest.raises(
        ValueError, match=rf"the adapter '{weights}' .*{name} holds 1e\+300, beyond the range of float32"
    ):
        load_lora(model, path)
    assert not any(hasattr(module, "lora_A") for module in model.modules())


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("lora_alpha", float("nan"), ValueError, "field lora_alpha must be finite, got nan"),
        ("lora_alpha", -16.0, ValueError, r"field lora_alpha must be > 0, got -16\.0"),
        ("lora_alpha", 0, ValueError, "field lora_alpha must be > 0, got 0"),
        ("lora_alpha", "16", TypeError, "field lora_alpha must be a number, got '16'"),
        ("r", 0, ValueError, "field r must be a positive int, got 0"),
        ("r", 2.5, TypeError, r"field r must be a positive int, got 2\.5"),
        ("lora_dropout", 1.0, ValueError, r"field lora_dropout must lie in \[0, 1\), got 1\.0"),
        ("target_modules", "lm_head", ValueError, "field target_modules must be a pattern that add_lora writes"),
        ("init_lora_weights", "pissa", ValueError, "field init_lora_weights must be true or false, got 'pissa'"),
        ("init_lora_weights", "corda", ValueError, "field init_lora_weights must be true or false, got 'corda'"),
        ("init_lora_weights", "olora", ValueError, "field init_lora_weights must be true or false, got 'olora'"),
        ("init_lora_weights", "loftq", ValueError, "field init_lora_weights must be true or false, got 'loftq'"),
        ("init_lora_weights", {"x": 1}, ValueError, "field init_lora_weights must be true or false"),
        ("use_rslora", True, ValueError, "field use_rslora is True, add_lora makes False"),
        ("use_dora", True, ValueError, "field use_dora is True, add_lora makes False"),
        ("alpha_pattern", {"q_proj": float("nan")}, ValueError, "field alpha_pattern is"),
        ("task_type", "CAUSAL_LM", ValueError, "field task_type is 'CAUSAL_LM', add_lora makes None"),
    ],
)
def test_load_lora_refuses_what_add_lora_refuses(adapter, tmp_path, field, value, error, message):
    path = _adapter_copy(adapter, tmp_path)
    file = _edit_adapter_config(path, **{field: value})
    model = tiny_model()
    with pytest.raises(error, match=rf"'{file}'.*{message}"):
        load_lora(model, path)
    assert not any(hasattr(module, "lora_A") for module in model.modules())


def test_add_lora_and_load_lora_give_the_same_messages():
    for alpha, error, message in [
        (float("nan"), ValueError, "alpha must be finite, got nan"),
        (-16.0, ValueError, r"alpha must be > 0, got -16\.0"),
    ]:
        with pytest.raises(error, match=f"^{message}$"):
            add_lora(tiny_model(), alpha=alpha)


def test_a_plain_init_lora_weights_loads_the_same_adapter(adapter, tmp_path, tokenizer):
    batch = tokenizer(["The price is 12.5 yuan and 3 cups."])
    reference = load_lora(tiny_model(), adapter)(**batch).loc_U
    path = _adapter_copy(adapter, tmp_path)
    _edit_adapter_config(path, init_lora_weights=False, base_model_name_or_path="elsewhere", inference_mode=False)
    assert torch.equal(load_lora(tiny_model(), path)(**batch).loc_U, reference)
