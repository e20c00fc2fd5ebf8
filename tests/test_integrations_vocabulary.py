"""``model.resize_token_embeddings(n)``, as transformers users call it after adding tokens, resizes the decision
head's classes with the token embedding (`causalqwen.integrations.vocabulary`).

The oracles: the model's own decisions and thresholds before the resize (the classes kept must not move by one bit),
the old biases' mean in float64 (transformers' mean resizing), the Qwen2 initialisation of a linear layer (zero bias,
normal weights of std ``initializer_range``) and a save / load round trip through both loaders."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from causalqwen import CausalQwenForCausalLM
from causalqwen.app.tiny import build_tiny_causal_lm

TEXTS = ["The price is 12.50 dollars", "Add 37 and 5 to get 42."]
ADDED = 96


def _tiny(**overrides):
    tiny = build_tiny_causal_lm(seed=0, init_seed=0, **overrides)
    return tiny.model, tiny.tokenizer


@pytest.mark.parametrize("mean_resizing", [True, False])
def test_growing_keeps_every_old_class_bit_for_bit_and_adds_new_ones(mean_resizing):
    model, tokenizer = _tiny()
    encoding = tokenizer(TEXTS)
    old_size = model.config.vocab_size
    old_bias = model.action.classification_head.bias.detach().double().clone()  # [V]
    with torch.no_grad():
        before = model(**encoding, return_decisions=True)
    torch.manual_seed(0)
    embeddings = model.resize_token_embeddings(old_size + ADDED, mean_resizing=mean_resizing)
    with torch.no_grad():
        after = model(**encoding, return_decisions=True)
    new_size = old_size + ADDED
    assert embeddings is model.get_input_embeddings() and embeddings.weight.shape[0] == new_size
    assert model.config.vocab_size == new_size
    assert model.get_output_embeddings() is model.action.classification_head
    assert model.action.classification_head.weight.shape == (new_size, model.config.causal_size)
    assert after.loc_S.shape[-1] == after.scale_S.shape[-1] == new_size
    for name in ("loc_S", "scale_S"):  # the classes kept: exactly as before
        assert torch.equal(getattr(after, name)[..., :old_size], getattr(before, name))
    for name in ("loc_U", "scale_U", "loc_Y", "scale_Y"):
        assert torch.equal(getattr(after, name), getattr(before, name))
    new_bias = model.action.classification_head.bias.detach()[old_size:].double()  # [ADDED]
    new_rows = model.action.classification_head.weight.detach()[old_size:].double()  # [ADDED, C]
    if mean_resizing:  # transformers: every new bias is the old biases' mean
        np.testing.assert_allclose(new_bias.numpy(), np.full(ADDED, old_bias.mean().item()), rtol=1e-6, atol=1e-7)
    else:  # Qwen2's initialisation of a linear layer
        assert bool((new_bias == 0).all())
        std = model.config.initializer_range
        assert abs(new_rows.std().item() - std) < 0.1 * std and abs(new_rows.mean().item()) < 0.1 * std


def test_a_new_class_is_a_label_the_loss_scores_and_trains():
    model, tokenizer = _tiny()
    old_size = model.config.vocab_size
    model.resize_token_embeddings(old_size + ADDED)
    encoding = tokenizer(TEXTS[:1])
    ids = encoding["input_ids"].clone()
    ids[0, 2] = old_size + 50  # a new token, in the prompt and as the next token of position 1
    output = model(input_ids=ids, numeric_values=encoding["numeric_values"], labels=ids)
    output.loss.backward()
    row_gradient = model.action.classification_head.weight.grad[old_size + 50]  # [C]
    assert output.loss.isfinite() and row_gradient.abs().sum() > 0
    with pytest.raises(ValueError, match=rf"labels must lie in \[0, {old_size + ADDED}\)"):
        model(**encoding, labels=torch.full_like(ids, old_size + ADDED))


@pytest.mark.parametrize("learnable", [True, False])
def test_a_per_class_threshold_follows_the_classes(learnable):
    model, tokenizer = _tiny(ovr_threshold_per_class=True, learnable_threshold=learnable)
    old_size = model.config.vocab_size
    with torch.no_grad():
        model.action.ovr_threshold.copy_(torch.linspace(-3.0, 3.0, old_size))  # a threshold per class, all distinct
    before = model.action.ovr_threshold.detach().clone()  # [V]
    model.resize_token_embeddings(old_size + ADDED)
    threshold = model.action.ovr_threshold
    assert threshold.shape == (old_size + ADDED,)
    assert torch.equal(threshold[:old_size].detach(), before)
    assert bool((threshold[old_size:] == model.config.ovr_threshold).all())
    if learnable:
        assert isinstance(threshold, torch.nn.Parameter) and threshold.requires_grad
        assert any(p is threshold for p in model.parameters())
    else:
        assert not isinstance(threshold, torch.nn.Parameter)
        assert "action.ovr_threshold" in dict(model.named_buffers())
    model.resize_token_embeddings(old_size)  # and back: the first classes' thresholds as they were
    assert torch.equal(model.action.ovr_threshold.detach(), before)


def test_a_resized_model_saves_and_loads_through_both_loaders(tmp_path):
    model, tokenizer = _tiny()
    model.resize_token_embeddings(model.config.vocab_size + ADDED, pad_to_multiple_of=64)
    size = model.config.vocab_size
    assert size % 64 == 0 and size >= 704 + ADDED
    encoding = tokenizer(TEXTS)
    with torch.no_grad():
        expected = model(**encoding, return_decisions=True).loc_S  # [B, S, V']
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for loaded in (
        CausalQwenForCausalLM.from_pretrained(tmp_path),
        AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True),
    ):
        assert loaded.config.vocab_size == size
        with torch.no_grad():
            assert torch.equal(loaded(**encoding, return_decisions=True).loc_S, expected)
        prompt = tokenizer(TEXTS[:1])
        out = loaded.generate(**prompt, max_new_tokens=3, eos_token_id=None, return_dict_in_generate=True)
        assert out.sequences.shape == (1, prompt["input_ids"].shape[1] + 3)
        assert bool((out.sequences < size).all()) and out.numeric_values.shape == out.sequences.shape


def test_shrinking_keeps_the_first_classes_and_never_drops_the_number_token():
    model, tokenizer = _tiny()
    encoding = tokenizer(TEXTS)
    num = model.config.num_token_id
    with torch.no_grad():
        before = model(**encoding, return_decisions=True).loc_S  # [B, S, V]
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for bad in (num, num - 10, 0):
        with pytest.raises(ValueError, match=rf"would drop <NUM> \(id {num}\): keep at least {num + 1} tokens"):
            model.resize_token_embeddings(bad)
    with pytest.raises(TypeError, match="new_num_tokens must be an int or None, got str"):
        model.resize_token_embeddings("800")
    assert {name: tuple(p.shape) for name, p in model.named_parameters()} == shapes  # nothing changed
    model.resize_token_embeddings(num + 1)
    with torch.no_grad():
        after = model(**encoding, return_decisions=True).loc_S  # [B, S, num + 1]
    assert torch.equal(after, before[..., : num + 1])


def test_a_head_that_lora_wraps_is_not_resized_behind_its_copies_back():
    """add_lora trains a copy of the decision head (peft's modules_to_save); a resize would replace the wrapper's
    attribute and leave the copy the forward uses at the old size, with config.vocab_size admitting labels it has no
    class for. Refused before anything changes; after merge_and_unload the merged head resizes."""
    from causalqwen.integrations.lora import add_lora

    model, tokenizer = _tiny()
    old_size = model.config.vocab_size
    wrapped = add_lora(model)
    shapes = {name: tuple(p.shape) for name, p in wrapped.named_parameters()}
    with pytest.raises(ValueError, match="resize before add_lora, or after merge_and_unload"):
        wrapped.resize_token_embeddings(old_size + ADDED)
    assert {name: tuple(p.shape) for name, p in wrapped.named_parameters()} == shapes
    assert model.config.vocab_size == old_size
    merged = wrapped.merge_and_unload()
    merged.resize_token_embeddings(old_size + ADDED)
    encoding = tokenizer(TEXTS)
    with torch.no_grad():
        assert merged(**encoding, return_decisions=True).loc_S.shape[-1] == old_size + ADDED
