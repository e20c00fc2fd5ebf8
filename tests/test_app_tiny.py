"""Executable specification of the embedded tiny Qwen2 base (causalqwen.app.tiny)."""

import time

import pytest
import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
from wall_clock import budget

from causalqwen import NumericTokenizer
from causalqwen.app.tiny import (
    TINY_CORPUS,
    build_tiny_base,
    build_tiny_causal_lm,
    build_tiny_qwen,
    build_tiny_tokenizer,
    save_tiny_base,
    tiny_vocab_size,
)

SAMPLES = ["The price is 99.9 yuan.", "温度-15.5度", "In 2020-2021 sales grew by 12.5%.", "hello"]


@pytest.fixture(scope="module")
def tiny_base():
    return build_tiny_base(seed=0)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


def test_tokenizer_is_a_qwen2_tokenizer_with_qwen2_special_tokens():
    tokenizer = build_tiny_tokenizer()
    assert isinstance(tokenizer, Qwen2Tokenizer)
    added = tokenizer.get_added_vocab()
    assert list(added) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    # the special tokens follow the BPE vocabulary, as in Qwen2 (151643, 151644, 151645)
    size = len(tokenizer)
    assert list(added.values()) == [size - 3, size - 2, size - 1]
    assert tokenizer.eos_token == tokenizer.pad_token == tokenizer.unk_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert all(tokenizer.added_tokens_decoder[i].special for i in added.values())
    assert 500 <= size <= 700


def test_tokenizer_is_deterministic():
    first, second = build_tiny_tokenizer(), build_tiny_tokenizer()
    assert first.get_vocab() == second.get_vocab()
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()


def test_tokenizer_builds_quickly():
    start = time.perf_counter()
    build_tiny_tokenizer()
    assert time.perf_counter() - start < budget(1.0)  # 16 ms on a quiet machine


def test_tokenizer_uses_qwen2_normalizer_and_pre_tokenizer():
    """Compare with the pipeline that Qwen2Tokenizer sets up on its own for an empty vocabulary."""
    tokenizer = build_tiny_tokenizer()
    reference = Qwen2Tokenizer()
    text = "The price is 99.9 yuan!  温度-15.5度\n\nit's 2020-2021, e\u0301"
    ours, theirs = tokenizer.backend_tokenizer, reference.backend_tokenizer
    assert ours.normalizer.normalize_str(text) == theirs.normalizer.normalize_str(text)
    assert ours.pre_tokenizer.pre_tokenize_str(text) == theirs.pre_tokenizer.pre_tokenize_str(text)
    # digits are always single tokens, as in Qwen2
    assert tokenizer.tokenize("2021") == ["2", "0", "2", "1"]


@pytest.mark.parametrize("text", TINY_CORPUS[:5] + TINY_CORPUS[-5:] + ["unseen ✓ ünïcödé 🙂 text", "a\tb\r\nc"])
def test_tokenizer_round_trips_any_text(text):
    tokenizer = build_tiny_tokenizer()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_tokenizer_learned_merges():
    tokenizer = build_tiny_tokenizer()
    # frequent words of the corpus are single tokens; 256 byte symbols alone would not be
    assert len(tokenizer.tokenize(" the")) == 1
    assert len(tokenizer.tokenize("价格")) < len("价格".encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def test_vocab_size_has_reserved_rows(tiny_base):
    model, tokenizer = tiny_base
    num_tokens = len(tokenizer)
    vocab_size = model.config.vocab_size
    assert vocab_size == tiny_vocab_size(num_tokens)
    assert vocab_size % 64 == 0
    assert vocab_size - num_tokens >= 64
    assert model.get_input_embeddings().weight.shape == (vocab_size, 64)
    assert model.get_output_embeddings().weight.shape == (vocab_size, 64)


@pytest.mark.parametrize("num_tokens, expected", [(1, 128), (64, 128), (65, 192), (603, 704), (151665, 151744)])
def test_tiny_vocab_size_table(num_tokens, expected):
    assert tiny_vocab_size(num_tokens) == expected


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_tiny_vocab_size_bad_input(bad):
    with pytest.raises(ValueError, match="num_tokens must be a positive int"):
        tiny_vocab_size(bad)


def test_config_matches_the_tokenizer(tiny_base):
    model, tokenizer = tiny_base
    config = model.config
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert config.pad_token_id == config.eos_token_id == config.bos_token_id == end_of_text
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.intermediate_size) == (4, 2, 128)
    assert config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert all(parameter.dtype == torch.float32 for parameter in model.parameters())


def test_model_is_deterministic_and_seeded():
    tokenizer = build_tiny_tokenizer()
    first = build_tiny_qwen(tokenizer, seed=0).state_dict()
    second = build_tiny_qwen(tokenizer, seed=0).state_dict()
    other = build_tiny_qwen(tokenizer, seed=1).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_model_leaves_the_global_rng_alone():
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    build_tiny_qwen(seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_model_respects_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = build_tiny_qwen(seed=0)
    finally:
        torch.set_default_dtype(previous)
    assert all(parameter.dtype == torch.float32 for parameter in model.parameters())
    reference = build_tiny_qwen(seed=0)
    assert torch.equal(model.model.embed_tokens.weight, reference.model.embed_tokens.weight)


def test_config_overrides():
    model = build_tiny_qwen(seed=0, max_position_embeddings=128, tie_word_embeddings=False, rms_norm_eps=1e-5)
    assert model.config.max_position_embeddings == 128
    assert model.config.rms_norm_eps == 1e-5
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(seed="0"), TypeError, "seed must be an int"),
        (dict(seed=-1), ValueError, "seed must be non-negative"),
        (dict(hidden_size=66), ValueError, "divisible by num_attention_heads"),
        (dict(num_key_value_heads=3), ValueError, "divisible by num_key_value_heads"),
        (dict(num_hidden_layers=0), ValueError, "num_hidden_layers must be a positive int"),
        (dict(vocab_size=10), ValueError, "vocab_size .* must be at least the tokenizer length"),
        (dict(tie_word_embeddings="yes"), TypeError, "tie_word_embeddings must be a bool"),
    ],
)
def test_build_tiny_qwen_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_tiny_qwen(**kwargs)


def test_forward_pass_on_numeric_tokens(tiny_base):
    model, tokenizer = tiny_base
    numeric = NumericTokenizer(build_tiny_tokenizer())
    batch = numeric(SAMPLES, padding_side="left")
    # the <NUM> id K has an embedding row, and so has every other id
    assert numeric.num_token_id == len(tokenizer) < model.config.vocab_size
    with torch.no_grad():
        output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert output.logits.shape == (*batch["input_ids"].shape, model.config.vocab_size)
    assert output.logits.dtype == torch.float32
    assert torch.isfinite(output.logits).all()


def test_save_and_reload(tmp_path, tiny_base):
    model, tokenizer = tiny_base
    path = save_tiny_base(tmp_path / "tiny", seed=0)
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    loaded_model = Qwen2ForCausalLM.from_pretrained(path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(path)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert loaded_model.config.vocab_size == model.config.vocab_size
    for text in SAMPLES:
        assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    batch = tokenizer(SAMPLES, padding=True, return_tensors="pt")
    loaded_model.eval()
    with torch.no_grad():
        expected = model(**batch).logits
        actual = loaded_model(**batch).logits
    assert torch.equal(actual, expected)


def test_save_tiny_base_rejects_a_file_path(tmp_path):
    file_path = tmp_path / "a_file"
    file_path.write_text("not a directory")
    with pytest.raises(ValueError, match="not a directory"):
        save_tiny_base(file_path)


# ---------------------------------------------------------------------------------------------
# The converted tiny model: one recipe
# ---------------------------------------------------------------------------------------------
def test_build_tiny_causal_lm_is_from_qwen_of_the_tiny_base():
    """The same weights as seeding torch and calling from_qwen on build_tiny_base by hand; the global
    random state is left as it was, and the model's <NUM> id is the tokenizer's."""
    from causalqwen import CausalQwenForCausalLM

    before = torch.random.get_rng_state()
    model, tokenizer, qwen = build_tiny_causal_lm(seed=2, init_seed=5, noise_init=0.3)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not model.training and model.config.noise_init == 0.3
    assert model.config.num_token_id == tokenizer.num_token_id == len(tokenizer) - 1
    assert torch.equal(qwen.model.embed_tokens.weight, build_tiny_qwen(seed=2).model.embed_tokens.weight)
    torch.manual_seed(5)
    by_hand = CausalQwenForCausalLM.from_qwen(
        build_tiny_base(seed=2)[0], num_token_id=tokenizer.num_token_id, noise_init=0.3
    )
    assert model.state_dict().keys() == by_hand.state_dict().keys()
    for name, tensor in by_hand.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_build_tiny_causal_lm_without_init_seed_draws_from_the_global_generator():
    torch.manual_seed(11)
    first = build_tiny_causal_lm().model.model.numerical_embedding.w_num.detach().clone()
    torch.manual_seed(11)
    second = build_tiny_causal_lm().model.model.numerical_embedding.w_num
    third = build_tiny_causal_lm().model.model.numerical_embedding.w_num  # the generator has moved on
    assert torch.equal(first, second) and not torch.equal(first, third)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"init_seed": 1.5}, TypeError, "init_seed must be an int or None, got float"),
        ({"init_seed": True}, TypeError, "init_seed must be an int or None, got bool"),
        ({"seed": -1}, ValueError, "seed must be non-negative"),
        ({"no_such_field": 1}, ValueError, "'no_such_field' is not a CausalQwenConfig field"),
    ],
)
def test_build_tiny_causal_lm_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_tiny_causal_lm(**kwargs)
