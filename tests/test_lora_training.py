"""The ``lora`` preset in the training loop: adapters on the backbone plus the causal modules, the bound's
adapter-disabled base pass, checkpoints of adapters and a bit-exact resume, and the merged result.

Oracles: an untouched copy of the base model (the base law of U), the uninterrupted run, the unmerged model.
"""

import copy

import pytest
import torch
from test_training import synthetic_data, tiny_model

from causalqwen import train
from causalqwen.divergence import DivergenceBound
from causalqwen.files.data import collate
from causalqwen.integrations.lora import (
    add_lora,
    load_lora,
    merge_lora,
    trainable_parameter_count,
)
from causalqwen.training import TrainingConfig, set_trainable


def _lora_model(rank=4, seed=0):
    """The tiny model with LoRA adapters whose random start (peft draws lora_A from the global generator) is fixed
    by ``seed``, whatever the global random state is: the runs a resume is compared with start alike."""
    model = tiny_model()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return add_lora(model, rank=rank)


def _data(tokenizer, n=40, seed=0):
    return synthetic_data(tokenizer, n, seed)


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
