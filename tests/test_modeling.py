"""CausalQwenForCausalLM against the real transformers Qwen2: initialization equivalence, loss wiring, I/O."""

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny_runs import tiny_model
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Model,
    pipeline,
)
from wall_clock import budget

from causalqwen import (
    CausalQwenConfig,
    CausalQwenForCausalLM,
    CausalQwenModel,
    NumericTokenizer,
    cauchy,
    generate,
)
from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm, save_tiny_base
from causalqwen.checks.doors import position_ids_from_mask
from causalqwen.integrations.pipelines import NumericTextGenerationPipeline
from causalqwen.losses import total_loss
from causalqwen.modeling import CausalQwenOutput

NUM_ID = 90  # <NUM> sits in the reserved rows: K = 90 used tokens, V = 96 embedding rows


def _qwen(seed=0, hidden=32, heads=4, kv_heads=2, layers=2, vocab=96, tied=True, dtype=torch.float32):
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tied,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).to(dtype).eval()


def _causal(base, seed=1, **overrides):
    torch.manual_seed(seed)
    overrides.setdefault("num_token_id", NUM_ID)
    return CausalQwenForCausalLM.from_qwen(base, **overrides).eval()


@st.composite
def qwen_shapes(draw):
    heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    kv_heads = draw(st.sampled_from([d for d in (1, 2, 4) if heads % d == 0]))
    return dict(
        hidden=heads * head_dim,
        heads=heads,
        kv_heads=kv_heads,
        layers=draw(st.integers(1, 2)),
        tied=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )


@settings(max_examples=20)
@given(shape=qwen_shapes(), length=st.integers(1, 9), gamma=st.sampled_from([None, 10.0, 0.5]))
def test_initialization_equivalence_with_qwen2(shape, length, gamma):
    """loc_S = Qwen2 logits, loc_U = z, scale_U = gamma, scale_S = (gamma + |b_noise|) ||W_k||_1, for from_qwen's
    default gamma (0.1, decision D14) and given ones (the drafts' 10)."""
    qwen = _qwen(**shape)
    model = _causal(qwen) if gamma is None else _causal(qwen, abduction_scale_init=gamma)
    gamma = 0.1 if gamma is None else gamma
    ids = torch.randint(0, NUM_ID, (2, length), generator=torch.Generator().manual_seed(shape["seed"]))
    with torch.no_grad():
        out = model(ids)
        reference = qwen(ids, output_hidden_states=True)
    logits, z = reference.logits, reference.hidden_states[-1]
    torch.testing.assert_close(out.loc_S, logits, rtol=1e-5, atol=1e-6)  # float32 rounding only
    torch.testing.assert_close(out.loc_U, z, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.scale_U, torch.full_like(z, gamma), rtol=1e-6, atol=0)
    l1 = qwen.lm_head.weight.detach().double().abs().sum(-1)  # ||W_k||_1, float64
    # a zero row (the padding row of a tied embedding) gives 0, clamped at scale_eps (D10)
    expected_scale_S = ((gamma + 0.1) * l1).clamp_min(1e-6)
    torch.testing.assert_close(out.scale_S.double(), expected_scale_S.expand_as(out.scale_S), rtol=2e-6, atol=0)
    assert not torch.equal(out.scale_S[0, 0], out.scale_S[0, 0, :1].expand(qwen.config.vocab_size))  # per-class scales


def test_init_loc_S_equals_logits_to_the_last_bit_in_float32():
    qwen = _qwen(seed=3)
    model = _causal(qwen)
    ids = torch.randint(0, NUM_ID, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        max_err = (model(ids).loc_S - qwen(ids).logits).abs().max().item()
    assert max_err <= 1e-6


def test_numbers_change_only_positions_from_the_first_num_on():
    qwen = _qwen(seed=4)
    model = _causal(qwen)
    ids = torch.randint(0, NUM_ID, (1, 10), generator=torch.Generator().manual_seed(1))
    ids[0, 4] = NUM_ID
    ids[0, 7] = NUM_ID
    values = torch.zeros(1, 10)
    values[0, 4] = 99.9
    values[0, 7] = -15.5
    with torch.no_grad():
        plain = model(ids, numeric_values=torch.zeros(1, 10))  # <NUM> tokens with value 0: phi = 0, identical to Qwen
        numeric = model(ids, numeric_values=values)
        logits = qwen(ids).logits
    torch.testing.assert_close(plain.loc_S, logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(numeric.loc_S[:, :4], logits[:, :4], rtol=0, atol=1e-6)  # causal: before the number
    changed = (numeric.loc_S - logits).abs().amax(-1)[0]  # [S]
    assert bool((changed[4:] > 1e-4).all()), changed


def test_forward_loss_applies_the_shift_and_pair_mask():
    """forward(labels) = total_loss on position i vs label i+1, with mask[i] & mask[i+1]."""
    qwen = _qwen(seed=5)
    model = _causal(qwen, ovr_threshold=1.0, gate_alpha=0.3)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, NUM_ID, (2, 8), generator=g)
    ids[:, 3] = NUM_ID
    ids[1, 6] = NUM_ID
    values = torch.zeros(2, 8)
    values[:, 3] = torch.tensor([12.5, -3.0])
    values[1, 6] = 1e4
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0  # left padding in row 1
    labels = ids.clone()
    labels[0, 5] = -100
    decisions = model(ids, numeric_values=values, attention_mask=mask)  # no labels: the [B, S, V] decisions
    parts = total_loss(
        decisions.loc_S[:, :-1],
        decisions.scale_S[:, :-1],
        decisions.loc_Y[:, :-1],
        decisions.scale_Y[:, :-1],
        labels[:, 1:],
        values[:, 1:],
        num_token_id=NUM_ID,
        threshold=1.0,
        gate_alpha=0.3,
        attention_mask=mask[:, :-1] * mask[:, 1:],
        detach_gate=False,
    )
    assert parts.n_cls.item() == 7 + (7 - 2) - 1 and parts.n_reg.item() == 3
    for return_decisions in (False, True):  # the fused path (the default with labels) and the literal one
        out = model(ids, numeric_values=values, attention_mask=mask, labels=labels, return_decisions=return_decisions)
        torch.testing.assert_close(out.loss, parts.total)
        torch.testing.assert_close(out.cls_loss, parts.cls_loss_mean)
        torch.testing.assert_close(out.reg_loss, parts.reg_loss_effective)
        torch.testing.assert_close(out.loc_Y, decisions.loc_Y)
        assert (out.loc_S is not None) == return_decisions


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(ovr_threshold_per_class=True, learnable_threshold=True, gate_alpha=0.4),
        dict(learnable_threshold=True, detach_gate=True, ovr_threshold=3.0),
    ],
)
def test_fused_and_literal_training_paths_agree_in_loss_and_every_gradient(overrides):
    """The default training forward (fused, no [B, S, V] tensor) equals the literal path, in float64."""
    qwen = _qwen(seed=8, dtype=torch.float64)
    model = _causal(qwen, **overrides).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, NUM_ID, (3, 9), generator=g)
    ids[:, 4] = NUM_ID
    values = torch.zeros(3, 9, dtype=torch.float64)
    values[:, 4] = torch.tensor([7.0, -250.0, 0.5], dtype=torch.float64)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[2, :3] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, 6] = -100
    results = []
    for return_decisions in (False, True):
        model.zero_grad(set_to_none=True)
        out = model(ids, numeric_values=values, attention_mask=mask, labels=labels, return_decisions=return_decisions)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (fused, fused_grads), (literal, literal_grads) = results
    torch.testing.assert_close(fused.loss, literal.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(fused.reg_loss, literal.reg_loss, rtol=1e-12, atol=0)
    assert fused_grads.keys() == literal_grads.keys() and "action.classification_head.weight" in fused_grads
    for name in literal_grads:
        torch.testing.assert_close(fused_grads[name], literal_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_bfloat16_model_trains_through_the_fused_path():
    """A bf16 model's default training forward works and matches its literal path to bf16 precision.

    Both paths form the ``<NUM>`` column in bf16 and score it in float32; the fused classification
    loss computes in float32 from the bf16 weights, the literal one from bf16 ``loc_S``/``scale_S``.
    """
    model = _causal(_qwen(seed=9, dtype=torch.bfloat16)).train()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, NUM_ID, (2, 7), generator=g)
    ids[:, 3] = NUM_ID
    values = torch.zeros(2, 7)
    values[:, 3] = torch.tensor([12.5, -3.0])
    losses = []
    for return_decisions in (False, True):
        model.zero_grad(set_to_none=True)
        out = model(ids, numeric_values=values, labels=ids, return_decisions=return_decisions)
        assert out.loss.dtype == torch.float32
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(grad.dtype == torch.bfloat16 and torch.isfinite(grad).all() for grad in grads)
        losses.append(out.loss.detach())
    torch.testing.assert_close(losses[0], losses[1], rtol=2e-2, atol=0)


def test_a_float32_model_under_bfloat16_autocast_trains_through_both_paths():
    """Mixed precision as training runs it (float32 weights, bfloat16 autocast): both loss paths give a float32 loss
    within bf16 precision of the float32 one, and float32 gradients pointing the same way."""
    model = _causal(_qwen(seed=9)).train()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, NUM_ID, (2, 7), generator=g)
    ids[:, 3] = NUM_ID
    values = torch.zeros(2, 7)
    values[:, 3] = torch.tensor([12.5, -3.0])
    results = {}
    for autocast in (False, True):
        for return_decisions in (False, True):  # fused, literal
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(ids, numeric_values=values, labels=ids, return_decisions=return_decisions)
            out.loss.backward()
            grad = model.action.classification_head.weight.grad
            assert grad.dtype == torch.float32 and torch.isfinite(grad).all()
            results[autocast, return_decisions] = (out.loss.detach(), grad.clone())
    full_loss, full_grad = results[False, False]
    for return_decisions in (False, True):
        loss, grad = results[True, return_decisions]
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss, full_loss, rtol=2e-2, atol=0)
        assert torch.nn.functional.cosine_similarity(grad.flatten(), full_grad.flatten(), dim=0) > 0.999


def test_return_decisions_false_without_labels_gives_the_law_of_U_alone():
    """Neither decisions nor a loss: the law of $U$ of `abduce`, nothing formed over the vocabulary."""
    model = _causal(_qwen(seed=14))
    ids = torch.randint(0, NUM_ID, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out, law = model(ids, return_decisions=False), model.abduce(ids)
    assert out.logits is None and out.loc_S is None and out.loss is None and out.targets is None
    torch.testing.assert_close(out.loc_U, law.loc_U, rtol=0, atol=0)
    torch.testing.assert_close(out.scale_U, law.scale_U, rtol=0, atol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_loss_unchanged_by_padding(side):
    qwen = _qwen(seed=6)
    model = _causal(qwen)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, NUM_ID, (1, 9), generator=g)
    ids[0, 4] = NUM_ID
    values = torch.zeros(1, 9)
    values[0, 4] = 42.0
    labels = ids.clone()
    with torch.no_grad():
        base = model(ids, numeric_values=values, labels=labels)
        pad = 3
        pad_ids = torch.zeros(1, pad, dtype=torch.long)
        join = (lambda a, b: torch.cat([b, a], 1)) if side == "left" else (lambda a, b: torch.cat([a, b], 1))
        padded = model(
            join(ids, pad_ids),
            numeric_values=join(values, torch.zeros(1, pad)),
            attention_mask=join(torch.ones(1, 9, dtype=torch.long), torch.zeros(1, pad, dtype=torch.long)),
            labels=join(labels, torch.full((1, pad), -100)),
        )
    torch.testing.assert_close(padded.loss, base.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.reg_loss, base.reg_loss, rtol=1e-5, atol=1e-5)


def test_padded_labels_that_are_not_ignore_index_are_still_not_scored():
    """D9: a padded target is never scored, even if its label is a valid class id."""
    model = _causal(_qwen(seed=7))
    ids = torch.randint(1, NUM_ID, (1, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        padded = model(ids, attention_mask=mask, labels=ids)  # labels at pads are real ids, not -100
        trimmed = model(ids[:, :4], labels=ids[:, :4])
    torch.testing.assert_close(padded.loss, trimmed.loss, rtol=1e-5, atol=1e-6)


def test_b_noise_learns_through_the_model_at_default_init_not_at_zero():
    ids = torch.randint(1, NUM_ID, (2, 6), generator=torch.Generator().manual_seed(5))
    for noise_init, zero in ((0.1, False), (0.0, True)):
        model = _causal(_qwen(seed=8), noise_init=noise_init, ovr_threshold=0.0)
        model(ids, labels=ids).loss.backward()
        grad = model.action.b_noise.grad
        assert bool((grad == 0).all()) == zero


def test_learnable_per_class_threshold_gets_a_gradient_and_round_trips(tmp_path):
    model = _causal(_qwen(seed=9), ovr_threshold_per_class=True, learnable_threshold=True, ovr_threshold=5.0)
    assert isinstance(model.ovr_threshold, torch.nn.Parameter) and model.ovr_threshold.shape == (96,)
    assert bool((model.ovr_threshold == 5.0).all())
    ids = torch.randint(1, NUM_ID, (2, 6), generator=torch.Generator().manual_seed(6))
    model(ids, labels=ids).loss.backward()
    assert model.ovr_threshold.grad.abs().sum() > 0
    with torch.no_grad():
        model.ovr_threshold[3] = -7.0
    model.save_pretrained(tmp_path)
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path)
    assert loaded.ovr_threshold[3].item() == -7.0


def test_save_load_round_trip_and_auto_classes(tmp_path):
    model = _causal(_qwen(seed=10), noise_init=0.2)
    with torch.no_grad():
        model.action.b_noise[0] = -0.5  # a trained-looking value, to check it is saved
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "causal_qwen"
    for loader in (CausalQwenForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        loaded = loader(tmp_path).eval()
        assert type(loaded) is CausalQwenForCausalLM
        for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
            assert torch.equal(a, b), name
    # AutoModel gives the base model (the law of U), as for every transformers causal LM
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(base) is CausalQwenModel and isinstance(base, Qwen2Model)
    ids = torch.randint(0, NUM_ID, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(base(ids).loc_U, model(ids).loc_U)


def test_a_checkpoint_of_the_unsplit_layout_still_loads(tmp_path):
    """causalqwen 0.1.0 saved numerical_embedding.*, abduction.* and ovr_threshold at the top level."""

    model = _causal(_qwen(seed=12), learnable_threshold=True)
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    renamed = {
        name.removeprefix("model.")
        if name.startswith(("model.numerical_embedding.", "model.abduction."))
        else name.removeprefix("action.")
        if name == "action.ovr_threshold"
        else name: tensor
        for name, tensor in state.items()
    }
    assert "abduction.W_loc" in renamed and "ovr_threshold" in renamed
    save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = CausalQwenForCausalLM.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_from_qwen_from_a_local_path_equals_from_the_instance(tmp_path):
    qwen = _qwen(seed=11, tied=False)
    qwen.save_pretrained(tmp_path)
    from_instance = _causal(qwen, seed=42)
    from_path = _causal(str(tmp_path), seed=42)
    for (name, a), (_, b) in zip(from_instance.state_dict().items(), from_path.state_dict().items()):
        assert torch.equal(a, b), name


def test_w_cls_is_its_own_copy_of_the_lm_head():
    qwen = _qwen(seed=12, tied=True)
    model = _causal(qwen)
    W = model.action.classification_head.weight
    assert torch.equal(W, qwen.lm_head.weight)
    assert W.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert W.data_ptr() != qwen.lm_head.weight.data_ptr()
    assert model.config.tie_word_embeddings is False


def test_num_token_at_vocab_size_grows_embedding_and_head_by_one_row():
    qwen = _qwen(seed=13, vocab=90)
    model = _causal(qwen, num_token_id=90)
    assert model.config.vocab_size == 91
    assert model.model.embed_tokens.weight.shape[0] == 91
    assert model.action.classification_head.weight.shape[0] == 91
    ids = torch.randint(0, 90, (1, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).loc_S[..., :90], qwen(ids).logits, rtol=1e-5, atol=1e-6)
    new_row = model.model.embed_tokens.weight[90]
    assert 0 < new_row.std().item() < 0.1  # initialised like the other rows (normal, std 0.02)


def test_from_qwen_keeps_the_base_dtype():
    model = _causal(_qwen(seed=14, dtype=torch.float64))
    assert model.dtype == torch.float64


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model():
    return _causal(_qwen(seed=15))


def test_bad_forward_inputs(small_model):
    ids = torch.randint(1, NUM_ID, (2, 5), generator=torch.Generator().manual_seed(8))
    ids[:, 2] = NUM_ID
    values = torch.zeros(2, 5)
    cases = [
        (
            dict(
                numeric_values=values.clone().index_put_(
                    (torch.tensor([0]), torch.tensor([2])), torch.tensor(float("nan"))
                )
            ),
            ValueError,
            "numeric_values must be finite",
        ),
        (
            dict(
                numeric_values=values.clone().index_put_(
                    (torch.tensor([1]), torch.tensor([2])), torch.tensor(float("inf"))
                )
            ),
            ValueError,
            "numeric_values must be finite",
        ),
        (
            dict(numeric_values=values.clone().index_put_((torch.tensor([0]), torch.tensor([1])), torch.tensor(3.0))),
            ValueError,
            r"numeric_values must be 0 wherever input_ids is not <NUM>.*\[0, 1\]",
        ),
        (dict(numeric_values=torch.zeros(2, 4)), ValueError, "numeric_values shape"),
        (dict(attention_mask=torch.ones(2, 4)), ValueError, "attention_mask shape"),
        (dict(attention_mask=torch.full((2, 5), 2)), ValueError, "attention_mask must contain only 0 and 1"),
        (dict(labels=ids[:, :4]), ValueError, "labels shape"),
        (dict(labels=torch.full((2, 5), 96)), ValueError, r"labels must lie in \[0, 96\)"),
        (dict(labels=ids, numeric_labels=torch.zeros(1, 5)), ValueError, "numeric_labels shape"),
        (
            dict(labels=ids, numeric_labels=torch.full((2, 5), float("nan"))),
            ValueError,
            "numeric_labels must be finite",
        ),
    ]
    for kwargs, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            small_model(ids, **({"numeric_values": values} | kwargs))
    with pytest.raises(TypeError, match="input_ids must be an integer"):
        small_model(ids.float())
    with pytest.raises(ValueError, match="input_ids must have shape"):
        small_model(ids[0])
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, vocab_size=96\)"):
        small_model(ids + 96)


def test_bad_construction():
    qwen = _qwen(seed=16)
    with pytest.raises(ValueError, match=r"causal_size \(16\) must equal hidden_size \(32\)"):
        CausalQwenForCausalLM.from_qwen(qwen, num_token_id=NUM_ID, causal_size=16)
    with pytest.raises(ValueError, match="needs num_token_id"):
        CausalQwenForCausalLM.from_qwen(qwen)
    with pytest.raises(ValueError, match="'noise_int' is not a CausalQwenConfig field"):  # a typo is not a new field
        CausalQwenForCausalLM.from_qwen(qwen, num_token_id=NUM_ID, noise_int=0.5)
    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(TypeError, match="base must be a transformers Qwen2ForCausalLM.*LlamaForCausalLM"):
        CausalQwenForCausalLM.from_qwen(llama, num_token_id=3)
    with pytest.raises(TypeError, match="base must be"):
        CausalQwenForCausalLM.from_qwen(qwen.model, num_token_id=3)
    with pytest.raises(ValueError, match=r"config field gate_alpha must be a number in \[0, 1\]"):
        CausalQwenConfig(hidden_size=32, num_attention_heads=4, gate_alpha=2.0)
    with pytest.raises(ValueError, match="num_token_id"):
        CausalQwenConfig(hidden_size=32, num_attention_heads=4, vocab_size=10, num_token_id=10)


def test_a_non_qwen2_checkpoint_path_is_rejected(tmp_path):
    llama = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    llama.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is a 'llama' model; CausalQwen needs a Qwen2 base"):
        CausalQwenForCausalLM.from_qwen(str(tmp_path), num_token_id=3)


# ---------------------------------------------------------------------------------------------
# End to end with the embedded tiny base and the numeric tokenizer
# ---------------------------------------------------------------------------------------------


def test_from_a_saved_tiny_base_path_reads_num_token_id_from_its_tokenizer(tmp_path):

    save_tiny_base(tmp_path)
    model = CausalQwenForCausalLM.from_qwen(str(tmp_path))
    tokenizer = NumericTokenizer.from_pretrained(tmp_path)
    assert model.config.num_token_id == tokenizer.num_token_id == len(tokenizer) - 1


def test_text_with_numbers_end_to_end_left_and_right_padding_agree():

    qwen, hf_tokenizer = build_tiny_base(seed=0)
    tokenizer = NumericTokenizer(hf_tokenizer)
    model = _causal(qwen, num_token_id=tokenizer.num_token_id)
    texts = ["The price is 99.9 yuan.", "温度-15.5度, 2020-2021 up 12.5%"]
    losses_by_side = {}
    for side in ("left", "right"):
        batch = tokenizer(texts, padding_side=side)
        with torch.no_grad():
            out = model(**batch, labels=batch["input_ids"])
        losses_by_side[side] = out.loss
        assert out.reg_loss > 0  # <NUM> targets are present and scored
    torch.testing.assert_close(losses_by_side["left"], losses_by_side["right"], rtol=1e-5, atol=1e-5)


def test_auto_classes_load_a_saved_model_in_a_process_that_never_imported_causalqwen(tmp_path):
    """config.json and tokenizer_config.json name the classes (auto_map, custom_pipelines) in the module
    save_pretrained writes beside them, so transformers' Auto classes and pipeline() load the directory in a fresh
    process, offline, with trust_remote_code=True (its consent to run that module, which imports the installed
    package); without that consent, transformers refuses the model and AutoTokenizer gives the wrapped tokenizer."""

    from causalqwen.app.tiny import build_tiny_causal_lm

    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    with torch.no_grad():  # every step predicts <NUM>: the pipeline's text must have the numbers written out
        model.action.classification_head.bias[model.config.num_token_id] = 1e4
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert "auto_map" not in model.config.__dict__  # the model in memory keeps its config
    batch = tokenizer(["The price is 99.9 yuan."])
    with torch.no_grad():
        expected = model.eval()(**batch).loc_Y
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer, pipeline_class=NumericTextGenerationPipeline)
    expected_text = pipe("The price is 99.90 yuan.", max_new_tokens=2)[0]["generated_text"]
    code = f"""
import sys, torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, pipeline
path = {str(tmp_path)!r}
import json
refused = False
try:  # first, before anything imported causalqwen: without consent transformers runs no module
    AutoModelForCausalLM.from_pretrained(path)
except ValueError as error:
    refused = "trust_remote_code" in str(error)
config = AutoConfig.from_pretrained(path, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
base = AutoModel.from_pretrained(path, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
wrapped = AutoTokenizer.from_pretrained(path)
pipe = pipeline("text-generation", model=path, trust_remote_code=True)
text = pipe("The price is 99.90 yuan.", max_new_tokens=2)[0]["generated_text"]
batch = {{k: torch.tensor(v) for k, v in {{"input_ids": {batch["input_ids"].tolist()},
          "numeric_values": {batch["numeric_values"].tolist()}}}.items()}}
with torch.no_grad():
    loc_Y = model(**batch).loc_Y
print("RESULT", json.dumps([type(config).__name__, type(model).__name__, type(base).__name__, loc_Y.tolist(), refused,
                  "causalqwen" in sys.modules, type(tokenizer).__name__, tokenizer(["99.9"]).numeric_values.tolist(),
                  type(wrapped).__name__, wrapped.num_token, type(pipe).__name__, text]))
"""
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=budget(300),
        stdin=subprocess.DEVNULL,
    )  # transformers asks on stdin before it refuses
    assert result.returncode == 0, result.stderr[-3000:]
    (
        config_name,
        model_name,
        base_name,
        loc_Y,
        refused,
        imported,
        tokenizer_name,
        values,
        wrapped_name,
        wrapped_num,
        pipe_name,
        text,
    ) = json.loads(result.stdout.split("RESULT ")[-1])
    assert [config_name, model_name, base_name] == ["CausalQwenConfig", "CausalQwenForCausalLM", "CausalQwenModel"]
    assert tokenizer_name == "NumericTokenizer" and values == [[pytest.approx(99.9)]]
    assert wrapped_name == "Qwen2Tokenizer" and wrapped_num == "<NUM>"  # no consent: transformers' own class
    assert pipe_name == "NumericTextGenerationPipeline"
    got_ids, got_values = tokenizer.encode(text)
    want_ids, want_values = tokenizer.encode(expected_text)  # the same numbers, to float32 rounding across processes
    assert got_ids == want_ids and got_values == pytest.approx(want_values, rel=1e-5)
    assert text.startswith("The price is 99.90 yuan.") and "<NUM>" not in text and len(text) > 26
    torch.testing.assert_close(torch.tensor(loc_Y), expected, rtol=1e-5, atol=1e-5)
    assert refused and imported  # no consent, no code run; with it, the module imported the installed package


# ----- one forward: the law of U, the decisions, the loss -----


@given(keep=st.integers(0, 7), labelled=st.booleans())
@settings(max_examples=12)
def test_logits_to_keep_limits_the_decisions_never_the_loss(small_model, keep, labelled):
    """``logits_to_keep`` = K > 0 gives the decisions of the last K positions, equal to the full forward's there;
    the law of $U$ and the loss are the full forward's."""
    model = small_model
    g = torch.Generator().manual_seed(keep)
    ids = torch.randint(0, NUM_ID, (2, 7), generator=g)
    labels = ids if labelled else None
    with torch.no_grad():
        full = model(ids, labels=labels, return_decisions=True)
        kept = model(ids, labels=labels, return_decisions=True, logits_to_keep=keep)
    assert isinstance(kept, CausalQwenOutput)
    positions = slice(-keep, None) if keep else slice(None)
    for name in ("loc_S", "scale_S", "logits"):
        torch.testing.assert_close(getattr(kept, name), getattr(full, name)[:, positions], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(kept.loc_U, full.loc_U, rtol=0, atol=0)
    if labelled:
        torch.testing.assert_close(kept.loss, full.loss, rtol=0, atol=0)


def test_a_forward_without_validation_skips_only_the_checks(small_model):
    """A forward under ``cauchy.validation(False)`` gives the same numbers on valid inputs, and no host
    synchronisation; the door checks again once the block is left."""
    from benchmarks.syncs import count

    model = small_model
    ids = torch.randint(0, NUM_ID, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = position_ids_from_mask(mask)
    with torch.no_grad():
        checked = model(ids, attention_mask=mask)
        with cauchy.validation(False):
            trusted = model(ids, attention_mask=mask, position_ids=positions)
            syncs = count(lambda: model.model(ids, position_ids=positions))
            labelled = count(lambda: model(ids, position_ids=positions, labels=ids, return_decisions=True))
    torch.testing.assert_close(trusted.loc_S[mask.bool()], checked.loc_S[mask.bool()], rtol=1e-6, atol=1e-6)
    assert syncs.total == 0, syncs.counts
    assert labelled.total <= 1, labelled.counts  # the fused loss's selection of the scored rows, not a check
    with pytest.raises(ValueError, match="input_ids must lie in"):
        model(ids + 1000)  # the door is open by default
    with pytest.raises(TypeError, match="check_inputs"):
        model(ids, check_inputs=False)  # the switch is the one way to skip the checks


@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=5), extra=st.integers(0, 3))
def test_the_positions_of_a_left_padded_batch_are_those_of_its_rows_alone(lengths, extra):
    """Position ids from the mask count real tokens only: a left-padded row's positions are 0, 1, ..., n - 1 at its
    n real tokens, whatever the padding before them."""
    width = max(lengths) + extra
    mask = torch.stack([torch.arange(width) >= width - n for n in lengths]).long()  # [B, S]
    positions = position_ids_from_mask(mask)
    for row, n in enumerate(lengths):
        assert positions[row, width - n :].tolist() == list(range(n))
        assert positions[row, : width - n].tolist() == [0] * (width - n)


def test_left_padding_leaves_the_law_of_U_of_the_real_tokens_unchanged(small_model):
    model = small_model
    ids = torch.randint(0, NUM_ID, (1, 5), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        alone, batch = model.abduce(ids), model.abduce(padded, attention_mask=mask)
    torch.testing.assert_close(batch.loc_U[:, 3:], alone.loc_U, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch.scale_U[:, 3:], alone.scale_U, rtol=1e-5, atol=1e-5)


def test_the_training_forward_takes_no_generation_keyword(small_model):
    ids = torch.randint(0, NUM_ID, (1, 4), generator=torch.Generator().manual_seed(3))
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'generation_state'"):
        small_model(ids, generation_state=object())
    with pytest.raises(TypeError, match="not both"):
        small_model(ids, cache=object(), past_key_values=object())


def test_a_padded_batch_gets_qwen2s_own_masks_without_a_host_read(small_model):
    """With padding, Qwen2 is handed its attention masks built by transformers' own functions: the features equal
    those of Qwen2's own path from the 2D mask, and the forward makes one host synchronisation (the door's), where
    Qwen2's forward makes its own check of the mask."""
    from transformers import Qwen2Model

    from benchmarks.syncs import count

    model = small_model
    ids = torch.randint(0, NUM_ID, (2, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = position_ids_from_mask(mask)
    with torch.no_grad():
        ours = model.model.law_of_U(ids, None, mask, position_ids=positions).last_hidden_state
        theirs = Qwen2Model.forward(
            model.model, inputs_embeds=model.model.embed_tokens(ids), attention_mask=mask, position_ids=positions
        ).last_hidden_state
        syncs, qwen_syncs = (
            count(lambda: model(ids, attention_mask=mask)),
            count(lambda: Qwen2Model.forward(model.model, input_ids=ids, attention_mask=mask, position_ids=positions)),
        )
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], rtol=0, atol=0)
    assert syncs.total == 1 and qwen_syncs.total >= 1, (syncs.counts, qwen_syncs.counts)


# Trust boundaries: what causalqwen reads is data, never code; a run deletes only what it wrote;
# resume is strict; the public doors refuse a misspelt keyword, a wrong type or a setting that would give
# a silently wrong answer, by name.


@pytest.mark.parametrize("return_decisions", [False, True])
@pytest.mark.parametrize(
    "settings",
    [
        dict(ovr_threshold=-1e30),
        dict(ovr_threshold=1e30),
        dict(noise_init=1e30),
        dict(abduction_scale_init=1e30),
        dict(scale_eps=1e-30),
        dict(scale_eps=1e30),
    ],
)
def test_settings_at_their_limits_keep_loss_and_gradients_finite(tokenizer, settings, return_decisions):
    model = tiny_model(**settings)
    batch = tokenizer(["The price is 12.5 yuan and 3 cups.", "A week has 7 days"])
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels, return_decisions=return_decisions)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or bool(torch.isfinite(parameter.grad).all()), name


@pytest.mark.parametrize(
    "keyword, hint",
    [
        ("numeric_value", "numeric_values"),
        ("attention_masks", "attention_mask"),
        ("label", "labels"),
        ("numeric_label", "numeric_labels"),
    ],
)
def test_misspelt_forward_keywords_are_refused_by_name(tokenizer, keyword, hint):
    model = tiny_model()
    batch = tokenizer(["The price is 12.5 yuan."])
    with pytest.raises(
        TypeError, match=rf"forward\(\) got unexpected keyword argument\(s\) '{keyword}' \(did you mean '{hint}'\?\)"
    ):
        model(batch["input_ids"], numeric_values=batch["numeric_values"], **{keyword: batch["input_ids"]})
    with pytest.raises(TypeError, match=rf"abduce\(\) got unexpected keyword argument\(s\) '{keyword}'"):
        model.abduce(batch["input_ids"], batch["numeric_values"], **{keyword: batch["input_ids"]})


def test_inputs_embeds_gets_a_short_clear_error(tokenizer):
    model = tiny_model()
    with pytest.raises(TypeError) as raised:
        model(torch.tensor([[1, 2]]), inputs_embeds=torch.zeros(1, 2, 64))
    assert "does not take inputs_embeds" in str(raised.value) and len(str(raised.value)) < 200
    assert model(torch.tensor([[1, 2]]), output_hidden_states=True).hidden_states is not None  # passed on


def test_a_num_without_its_value_is_an_error_not_zero(tokenizer):
    model = tiny_model()
    batch = tokenizer(["The price is 12.5 yuan."])
    with pytest.raises(ValueError, match=r"input_ids hold <NUM> .* at position \[0, \d+\] but numeric_values is None"):
        model(batch["input_ids"])
    with pytest.raises(ValueError, match=r"input_ids hold <NUM>"):
        generate(model, batch["input_ids"], max_new_tokens=1)
    words = tokenizer(["The price is yuan."])["input_ids"]
    labels = words.clone()
    labels[0, 2] = tokenizer.num_token_id
    with pytest.raises(ValueError, match="labels hold <NUM> targets but neither numeric_labels nor numeric_values"):
        model(words, labels=labels)


def test_forward_refuses_more_positions_than_the_model_has(tokenizer):
    model = tiny_model()
    limit = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"{limit + 1} positions, more than max_position_embeddings={limit}"):
        model(torch.ones(1, limit + 1, dtype=torch.long))
    left_padded = torch.ones(1, limit + 1, dtype=torch.long)
    mask = torch.ones_like(left_padded)
    mask[0, 0] = 0  # positions count real tokens: exactly the limit
    model(left_padded[:, :8], attention_mask=mask[:, :8])


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    return model.eval(), tokenizer


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (
            lambda b: {"input_ids": b["input_ids"].to(torch.uint8)},
            TypeError,
            r"input_ids must be an int64 or int32 tensor \(the index types of the embedding\), got torch.uint8",
        ),
        (lambda b: {"input_ids": b["input_ids"].to(torch.int16)}, TypeError, "got torch.int16"),
        (lambda b: {"input_ids": b["input_ids"].to("meta")}, ValueError, "input_ids is a meta tensor"),
        (lambda b: {"numeric_values": b["numeric_values"].to("meta")}, ValueError, "numeric_values is a meta tensor"),
        (lambda b: {"attention_mask": b["attention_mask"].to("meta")}, ValueError, "attention_mask is a meta tensor"),
        (
            lambda b: {"position_ids": torch.arange(7)[None] + 10**6},
            ValueError,
            r"position_ids must lie in \[0, max_position_embeddings=2048\); found 1000000 at position \[0, 0\]",
        ),
        (
            lambda b: {"position_ids": torch.arange(7)[None] - 2},
            ValueError,
            r"position_ids must lie in \[0, max_position_embeddings=2048\); found -2 at position \[0, 0\]",
        ),
        (
            lambda b: {"position_ids": torch.arange(7)[None] + 0.5},
            TypeError,
            "position_ids must be an integer tensor, got torch.float32",
        ),
        (lambda b: {"position_ids": torch.arange(7).to("meta")[None]}, ValueError, "position_ids is a meta tensor"),
    ],
)
def test_forward_refuses_ids_and_positions_it_cannot_use(tiny, change, error, pattern):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    arguments = dict(batch) | change(batch)
    with pytest.raises(error, match=pattern):
        model(**arguments)
    with pytest.raises(error, match=pattern):
        model.abduce(**arguments)


def test_forward_takes_positions_up_to_the_last_one(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    limit = model.config.max_position_embeddings
    last = torch.arange(limit - 7, limit)[None]
    with torch.no_grad():
        shifted = model(**batch, position_ids=last).loc_S
        as_int32 = model(batch["input_ids"].int(), batch["numeric_values"], position_ids=last.int()).loc_S
    assert torch.equal(shifted, as_int32) and not torch.equal(shifted, model(**batch).loc_S)


def test_a_num_label_over_a_word_needs_its_value(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])  # seven tokens of the tiny vocabulary, the last one <NUM>
    labels = batch["input_ids"].clone()
    labels[0, 2] = model.config.num_token_id  # a <NUM> target where the input is " is": no value beside it
    with pytest.raises(ValueError, match=r"labels put <NUM> at position \[0, 2\], where input_ids is not <NUM>"):
        model(**batch, labels=labels)
    numeric_labels = torch.zeros_like(batch["numeric_values"])
    numeric_labels[0, 2] = 12.5
    out = model(**batch, labels=labels, numeric_labels=numeric_labels)
    moved = model(**batch, labels=labels, numeric_labels=numeric_labels * 4)
    assert int(out.n_reg) == 2 and float(out.reg_loss) != float(moved.reg_loss)  # the value is the target, not 0
    assert float(model(**batch, labels=batch["input_ids"]).n_reg) == 1  # the <NUM> input carries its value


def test_a_numeric_label_beside_a_word_label_is_named(tiny):
    """A value in ``numeric_labels`` where the label is a word is never a target: an error naming its position, as
    the same mistake in ``numeric_values`` is (D4); where the label is ignored (a masked prompt) or padded, the
    value is not read and passes."""
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])  # the last token <NUM>
    labels = batch["input_ids"].clone()
    numeric_labels = batch["numeric_values"].clone()
    numeric_labels[0, 2] = 12.5  # beside the label " is"
    with pytest.raises(
        ValueError, match=r"numeric_labels must be 0 wherever labels is not <NUM> .*12\.5 at position \[0, 2\]"
    ):
        model(**batch, labels=labels, numeric_labels=numeric_labels)
    labels[0, 2] = model.config.ignore_index  # the same value where the label is ignored: not read
    ignored = model(**batch, labels=labels, numeric_labels=numeric_labels)
    assert float(ignored.n_reg) == 1
    padded = tokenizer(["The total is 5", "a"], padding_side="right")
    values = padded["numeric_values"].clone()
    values[1, -1] = 3.0  # a padded position: never scored
    model(**padded, labels=padded["input_ids"], numeric_labels=values)


@pytest.mark.parametrize("name", ["numeric_values", "numeric_labels"])
@pytest.mark.parametrize(
    "value, pattern",
    [
        (1e-50, r"{name} holds 1e-50 at position \[0, 6\], which underflows to 0 in float32"),
        (-1e-46, r"{name} holds -1e-46 at position \[0, 6\], which underflows to 0 in float32"),
        (1e300, r"{name} must be representable in float32 .*found 1e\+300 at position \[0, 6\]"),
    ],
)
def test_float64_values_that_float32_cannot_hold_are_refused(tiny, name, value, pattern):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    values = batch["numeric_values"].double()
    values[0, 6] = value
    arguments = dict(batch, labels=batch["input_ids"]) | {name: values}
    pattern = pattern.format(name=name)
    with pytest.raises(ValueError, match=pattern):
        model(**arguments)
    if name == "numeric_values":
        with pytest.raises(ValueError, match=pattern):
            model.generate(batch["input_ids"], numeric_values=values, max_new_tokens=1)
        with pytest.raises(ValueError, match=pattern):
            generate(model, batch["input_ids"], values, max_new_tokens=1)


def test_a_subnormal_float32_value_is_kept(tiny):
    model, tokenizer = tiny
    batch = tokenizer(["The total is 5"])
    values = batch["numeric_values"].double()
    values[0, 6] = 1e-40  # a subnormal float32, not 0
    with torch.no_grad():
        assert torch.equal(model(batch["input_ids"], values).loc_S, model(batch["input_ids"], values.float()).loc_S)
