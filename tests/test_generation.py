"""Generation (decision D12): the KV cache, left padding, numbers fed back, the shared-randomness invariants.

The oracles: the model's own forward (its decisions at the last position), the loop without the cache, and Qwen2.
"""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from causalqwen import generate
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.float32 import format_number
from causalqwen.generation import mode_draws, widened_values
from causalqwen.inference import MODES, traditional_probabilities

SAMPLING_MODES = ("causal", "shared_individual", "shared_noise", "traditional")
PROMPTS = ["the price of tea rose by 12.5 percent and", "hello", "on day 3 we counted 41 birds"]


@pytest.fixture(scope="module")
def tiny():
    model, numeric, qwen = build_tiny_causal_lm(seed=0, init_seed=0)
    return qwen, model, numeric


def _batch(numeric, prompts=PROMPTS):
    return numeric(prompts, padding_side="left")


def _run(model, batch, mode="standard", seed=0, **kwargs):
    return generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode=mode,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )


@pytest.mark.parametrize("mode", MODES)
def test_cache_and_no_cache_give_identical_sequences(tiny, mode):
    _, model, numeric = tiny
    batch = _batch(numeric)
    cached = _run(model, batch, mode, max_new_tokens=10, eos_token_id=[])
    uncached = _run(model, batch, mode, max_new_tokens=10, eos_token_id=[], use_cache=False)
    assert cached.sequences.shape == (3, batch["input_ids"].shape[1] + 10)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.numeric_values, uncached.numeric_values)


@pytest.mark.parametrize("mode", ["standard", "shared_individual", "shared_noise"])
def test_left_padded_batch_equals_row_by_row_generation(tiny, mode):
    _, model, numeric = tiny
    batch = _batch(numeric)
    draws = torch.Generator().manual_seed(11)
    fixed = {}
    if mode == "shared_individual":
        fixed["uniform"] = torch.rand(3, model.config.causal_size, generator=draws, dtype=torch.float64) * 0.98 + 0.01
    if mode == "shared_noise":
        fixed["noise"] = torch.randn(3, model.config.causal_size, generator=draws, dtype=torch.float64)
    together = _run(model, batch, mode, max_new_tokens=8, eos_token_id=[], **fixed)
    width = batch["input_ids"].shape[1]
    for row, prompt in enumerate(PROMPTS):
        alone = _batch(numeric, [prompt])
        row_fixed = {name: value[row : row + 1] for name, value in fixed.items()}
        single = _run(model, alone, mode, max_new_tokens=8, eos_token_id=[], **row_fixed)
        assert torch.equal(together.sequences[row, width:], single.sequences[0, alone["input_ids"].shape[1] :])
        torch.testing.assert_close(
            together.numeric_values[row, width:], single.numeric_values[0, alone["input_ids"].shape[1] :]
        )


def test_traditional_top_k_one_equals_qwen_greedy_generation(tiny):
    qwen, model, numeric = tiny
    batch = _batch(numeric, ["the weather today is", "a", "we went to the market and bought"])
    ours = _run(model, batch, "traditional", top_k=1, max_new_tokens=12)
    theirs = qwen.generate(
        batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False, max_new_tokens=12
    )
    assert torch.equal(ours.sequences, theirs)


@pytest.mark.parametrize("normalize", ["softmax", "ovr"])
def test_a_traditional_step_samples_from_the_full_standard_decision(tiny, normalize):
    """`choose` computes only loc_S for softmax sampling; its draw equals one from the full standard decision."""
    _, model, _ = tiny
    head = model.action
    g = torch.Generator().manual_seed(5)
    loc_U = 3 * torch.randn(4, model.config.causal_size, generator=g)
    scale_U = torch.rand(4, model.config.causal_size, generator=g) + 0.05
    sampling = (0.8, 40, 0.9, normalize)
    with torch.no_grad():
        choice = head.choose(
            "traditional", loc_U, scale_U, generator=torch.Generator().manual_seed(6), sampling=sampling
        )
        full = head(loc_U, scale_U)  # [4, V] x2, [4] x2
        probs = traditional_probabilities(
            full.loc_S, 0.8, 40, 0.9, scale_S=full.scale_S, threshold=head.ovr_threshold, normalize=normalize
        )
    token = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(6))[:, 0]
    assert torch.equal(choice.token, token)
    value = torch.where(token == model.config.num_token_id, full.loc_Y, 0.0)
    assert torch.equal(choice.value, value)
    assert torch.equal(choice.loc, loc_U) and torch.equal(choice.scale, scale_U + head.noise_scale)


def test_a_predicted_number_is_fed_back_through_the_numerical_embedding(tiny):
    _, base_model, numeric = tiny
    model = copy.deepcopy(base_model)
    num = model.config.num_token_id
    with torch.no_grad():
        model.action.classification_head.bias[num] = 1e4  # P(<NUM>) -> 1: the first step predicts a number
    batch = _batch(numeric, ["we counted the birds and found"])
    out = _run(model, batch, "standard", max_new_tokens=2, output_decision_inputs=True)
    prompt = batch["input_ids"].shape[1]
    assert out.sequences[0, prompt].item() == num
    with torch.no_grad():
        expected_value = model(batch["input_ids"]).loc_Y[0, -1]
    value = out.numeric_values[0, prompt]
    assert value != 0 and torch.isclose(value, expected_value, rtol=1e-5, atol=1e-6)
    # the next step sees the value: its U equals a fresh forward with the value, not one with 0.0
    ids = out.sequences[:, : prompt + 1]
    with torch.no_grad():
        with_value = model.abduce(ids, out.numeric_values[:, : prompt + 1]).loc_U[0, -1]
        without_value = model.abduce(ids, torch.zeros(ids.shape)).loc_U[0, -1]
    torch.testing.assert_close(out.loc_U[0, 1], with_value, rtol=1e-5, atol=1e-5)
    assert (with_value - without_value).abs().max() > 1e-3
    text = numeric.decode(out.sequences[0], out.numeric_values[0], out_of_vocab="mark")
    # "found5" would read back as text: the generated number gets a space before it
    assert text.startswith("we counted the birds and found " + format_number(value.item()))
    # the prompt's own numbers come back as written, the generated ones in shortest form
    prompts = numeric(["on day 03 we counted 41.50 birds and found"], padding_side="left")
    out = _run(model, prompts, "standard", max_new_tokens=1)
    decoded = numeric.batch_decode(out, number_texts=prompts.number_texts, out_of_vocab="mark")
    assert decoded == ["on day 03 we counted 41.50 birds and found " + format_number(out.numeric_values[0, -1].item())]


@pytest.mark.parametrize("mode", SAMPLING_MODES)
def test_same_seed_same_output_different_seed_different_output(tiny, mode):
    _, model, numeric = tiny
    # with the default noise_init = 0.1 against scale_U = 10, a fixed noise instance barely moves
    # shared_noise at initialization; a larger exogenous noise makes every sampling mode visibly random
    noisy = build_tiny_causal_lm(seed=0, noise_init=5.0).model
    batch = _batch(numeric)
    first = _run(noisy.eval(), batch, mode, seed=1, max_new_tokens=12, eos_token_id=[])
    again = _run(noisy, batch, mode, seed=1, max_new_tokens=12, eos_token_id=[])
    other = _run(noisy, batch, mode, seed=2, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(first.sequences, again.sequences)
    assert not torch.equal(first.sequences, other.sequences)


def test_shared_individual_keeps_one_epsilon_per_sequence(tiny):
    """(u_t - loc_U,t) / scale_U,t is the same vector at every step of a row, and differs across rows."""
    _, model, numeric = tiny
    out = _run(
        model, _batch(numeric), "shared_individual", max_new_tokens=6, eos_token_id=[], output_decision_inputs=True
    )
    standardized = (out.decision_loc.double() - out.loc_U.double()) / out.scale_U.double()  # [B, T, C]
    torch.testing.assert_close(standardized, standardized[:, :1].expand_as(standardized), rtol=1e-4, atol=1e-5)
    assert (standardized[0, 0] - standardized[1, 0]).abs().max() > 0.1
    torch.testing.assert_close(out.decision_scale, model.action.noise_scale.expand_as(out.decision_scale))
    causal = _run(model, _batch(numeric), "causal", max_new_tokens=6, eos_token_id=[], output_decision_inputs=True)
    fresh = (causal.decision_loc.double() - causal.loc_U.double()) / causal.scale_U.double()
    assert (fresh[:, 0] - fresh[:, 1]).abs().max() > 0.1  # causal draws anew at every step


def test_shared_noise_keeps_one_noise_instance_per_sequence(tiny):
    """loc' - loc_U = |b_noise| * eps_n is constant over the steps of a row; scale' = scale_U."""
    _, model, numeric = tiny
    out = _run(model, _batch(numeric), "shared_noise", max_new_tokens=6, eos_token_id=[], output_decision_inputs=True)
    shift = out.decision_loc.double() - out.loc_U.double()  # [B, T, C]
    torch.testing.assert_close(shift, shift[:, :1].expand_as(shift), rtol=1e-4, atol=2e-6)
    assert (shift[0, 0] - shift[1, 0]).abs().max() > 1e-3
    assert torch.equal(out.decision_scale, out.scale_U)


def test_rows_stop_at_their_own_eos(tiny):
    _, model, numeric = tiny
    batch = _batch(numeric)
    free = _run(model, batch, "traditional", seed=3, max_new_tokens=8, eos_token_id=[])
    width = batch["input_ids"].shape[1]
    eos = free.sequences[0, width + 2].item()  # row 0 makes this token at its third step
    stopped = _run(model, batch, "traditional", seed=3, max_new_tokens=8, eos_token_id=eos, pad_token_id=0)
    for row in range(3):
        generated = free.sequences[row, width:].tolist()
        end = generated.index(eos) + 1 if eos in generated else len(generated)
        got = stopped.sequences[row, width:]
        assert got[:end].tolist() == generated[:end]
        assert torch.all(got[end:] == 0) and torch.all(stopped.attention_mask[row, width + end :] == 0)
        assert torch.all(stopped.attention_mask[row, width : width + end] == 1)
    assert stopped.sequences.shape[1] <= free.sequences.shape[1]


def test_zero_new_tokens_returns_the_prompt(tiny):
    _, model, numeric = tiny
    batch = _batch(numeric)
    out = _run(model, batch, max_new_tokens=0)
    assert torch.equal(out.sequences, batch["input_ids"]) and torch.equal(out.attention_mask, batch["attention_mask"])


def test_model_generate_method_and_float64(tiny):
    _, model, numeric = tiny
    batch = _batch(numeric)
    as_method = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=4,
        return_dict_in_generate=True,
    )
    assert torch.equal(as_method.sequences, _run(model, batch, max_new_tokens=4).sequences)
    wide = build_tiny_causal_lm(seed=0).model.double()
    out = _run(wide.eval(), batch, "causal", max_new_tokens=4, eos_token_id=[])
    assert out.sequences.shape[1] == batch["input_ids"].shape[1] + 4


def test_the_output_reads_as_transformers_model_output_reads(tiny):
    """`GenerationOutput` (torch alone) is read as a ``ModelOutput`` of the same fields is: by attribute, as a mapping
    of the fields that are set, in order, by position among them, and decoded whole by ``batch_decode``."""
    from collections.abc import Mapping
    from dataclasses import field, fields, make_dataclass

    from transformers.utils import ModelOutput

    from causalqwen.generation import GenerationOutput

    names = [f.name for f in fields(GenerationOutput)]
    reference = make_dataclass("Reference", [(n, object, field(default=None)) for n in names], bases=(ModelOutput,))
    _, model, numeric = tiny
    batch = _batch(numeric)
    for trace in (False, True):
        out = _run(model, batch, max_new_tokens=3, output_decision_inputs=trace)
        theirs = reference(**{name: getattr(out, name) for name in names})
        assert isinstance(out, Mapping) and list(out) == list(theirs.keys()) and len(out) == len(theirs)
        assert all(out[key] is theirs[key] for key in theirs.keys())
        assert all(a is b for a, b in zip(out.to_tuple(), theirs.to_tuple(), strict=True))
        assert out[0] is theirs[0] and out[1:3] == theirs[1:3] and out[-1] == theirs[-1]
        assert ("loc_U" in out) == ("loc_U" in theirs) == trace
    with pytest.raises(KeyError):
        out = _run(model, batch, max_new_tokens=1)
        out["loc_U"]  # not set: as a ModelOutput, a KeyError
    texts = numeric.batch_decode(out, number_texts=batch.number_texts)
    assert texts == numeric.batch_decode(out.sequences, out.numeric_values, number_texts=batch.number_texts)


def test_generation_rejects_bad_input(tiny):
    _, model, numeric = tiny
    batch = _batch(numeric)
    ids, values, mask = batch["input_ids"], batch["numeric_values"], batch["attention_mask"]
    with pytest.raises(ValueError, match="unknown inference mode 'beam'") as error:
        generate(model, ids, values, mask, mode="beam")
    assert all(mode in str(error.value) for mode in MODES)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        generate(model, ids, values, mask, mode="traditional", temperature=0.0)
    for top_p in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]"):
            generate(model, ids, values, mask, mode="traditional", top_p=top_p)
    with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
        generate(model, ids, values, mask, mode="traditional", top_k=-1)
    with pytest.raises(ValueError, match="apply to mode='traditional' only"):
        generate(model, ids, values, mask, mode="causal", top_k=5)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        generate(model, ids, values, mask, max_new_tokens=-1)
    right = numeric(PROMPTS, padding_side="right")
    with pytest.raises(ValueError, match="generation needs left padding.*padding_side='left'"):
        generate(model, right["input_ids"], right["numeric_values"], right["attention_mask"])
    with pytest.raises(ValueError, match="row 0 has no real token"):
        generate(model, ids, values, torch.zeros_like(mask))
    short = build_tiny_causal_lm(seed=0, max_position_embeddings=8).model
    with pytest.raises(ValueError, match="more than max_position_embeddings=8"):
        generate(short, ids, values, mask)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=8; lower max_new_tokens"):
        generate(short, ids[:, -5:], values[:, -5:], mask[:, -5:], max_new_tokens=4)
    C = model.config.causal_size
    with pytest.raises(ValueError, match=r"uniform must lie strictly inside \(0, 1\)"):
        generate(model, ids, values, mask, mode="shared_individual", uniform=torch.full((C,), 1.0))
    with pytest.raises(ValueError, match="uniform fixes the per-sequence draw of mode 'shared_individual'"):
        generate(model, ids, values, mask, mode="causal", uniform=torch.full((C,), 0.5))
    with pytest.raises(ValueError, match=r"noise must have shape \[3, 64\] or \[64\]"):
        generate(model, ids, values, mask, mode="shared_noise", noise=torch.zeros(2, C))
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        generate(model, ids, values, mask, generator=0)
    with pytest.raises(ValueError, match="eos_token_id must be a non-negative int"):
        generate(model, ids, values, mask, eos_token_id=-3)


# ----- laws of the loop, against the model's own forward -----


@given(rows=st.lists(st.integers(1, 8), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1))
def test_standard_generation_is_the_argmax_of_the_forward_decisions(tiny, rows, seed):
    """One step of the standard mode chooses $\\arg\\max_k P_k$ of the decision the model's forward gives at each
    prompt's last token (`action.ovr_token`), and its value is $\\mathrm{loc}_Y$ there when that is
    ``<NUM>``, else 0; the same token whatever the row's left padding."""
    from causalqwen.action import ovr_token

    _, model, _ = tiny
    g = torch.Generator().manual_seed(seed)
    width = max(rows)
    ids = torch.randint(0, model.config.num_token_id, (len(rows), width), generator=g)
    mask = torch.stack([torch.arange(width) >= width - n for n in rows]).long()  # left padding
    ids = ids.masked_fill(mask == 0, 0)
    out = generate(model, ids, None, mask, max_new_tokens=1, eos_token_id=[])
    for row, n in enumerate(rows):
        with torch.no_grad():
            alone = model(ids[row : row + 1, width - n :])  # the row without its padding
        expected = ovr_token(alone.loc_S[0, -1], alone.scale_S[0, -1], model.ovr_threshold)
        assert int(out.sequences[row, -1]) == int(expected)
        value = float(alone.loc_Y[0, -1]) if int(expected) == model.config.num_token_id else 0.0
        assert float(out.numeric_values[row, -1]) == pytest.approx(value, rel=1e-5, abs=1e-6)


def test_the_shared_draws_are_fixed_once_per_row_and_checked(tiny):
    _, model, _ = tiny
    ids = torch.zeros(2, 3, dtype=torch.long)
    causal_size = model.config.causal_size
    drawn = mode_draws(model, ids, "shared_individual", generator=torch.Generator().manual_seed(0))
    again = mode_draws(model, ids, "shared_individual", generator=torch.Generator().manual_seed(0))
    assert drawn["uniform"].shape == (2, causal_size) and torch.equal(drawn["uniform"], again["uniform"])
    assert ((drawn["uniform"] > 0) & (drawn["uniform"] < 1)).all() and drawn["noise"] is None
    given_noise = torch.linspace(-3, 3, causal_size)
    fixed = mode_draws(model, ids, "shared_noise", noise=given_noise)
    assert torch.equal(fixed["noise"], given_noise.expand(2, causal_size))
    with pytest.raises(ValueError, match="noise fixes the per-sequence draw of mode 'shared_noise'"):
        mode_draws(model, ids, "causal", noise=given_noise)


@pytest.mark.parametrize(
    "dtype, widened",
    [
        (torch.int64, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_the_values_column_is_never_narrower_than_float32(dtype, widened):
    ids = torch.zeros(1, 3, dtype=torch.long)
    values = torch.tensor([[0, 11, 0]]).to(dtype)
    column = widened_values(values, ids)
    assert column.dtype == widened and column.tolist() == [[0.0, 11.0, 0.0]]
    assert widened_values(None, ids).tolist() == [[0.0, 0.0, 0.0]]
