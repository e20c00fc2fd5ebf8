"""Generation (decision D12): the KV cache, left padding, numbers fed back, the shared-randomness invariants.

The oracles: the model's own forward (its decisions at the last position), the loop without the cache, and Qwen2.
"""

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from tiny_runs import tiny_model
from transformers import pipeline

from causalqwen import generate
from causalqwen.app import cli
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.float32 import format_number
from causalqwen.generation import mode_draws, widened_values
from causalqwen.inference import MODES, traditional_probabilities
from causalqwen.integrations.pipelines import NumericTextGenerationPipeline

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


@pytest.fixture(scope="module")
def number_model(tokenizer):
    """A model whose every step predicts <NUM> with value loc_Y = -12345.67 (beyond float16's precision)."""
    model = copy.deepcopy(tiny_model()).eval()
    with torch.no_grad():
        model.action.classification_head.bias[tokenizer.num_token_id] = 1e4
        model.action.regression_head.weight.zero_()
        model.action.regression_head.bias.fill_(-12345.67)
    return model


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (torch.int64, torch.float32),
        (torch.uint8, torch.float32),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_generated_values_are_never_cast_into_a_narrower_type(tokenizer, number_model, dtype, expected):
    batch = tokenizer(["A cup of tea costs 2 dollars"], padding_side="left")
    out = generate(
        number_model, batch["input_ids"], batch["numeric_values"].to(dtype), batch["attention_mask"], max_new_tokens=2
    )
    assert out.numeric_values.dtype == expected
    assert out.numeric_values[0, -1].item() == pytest.approx(-12345.67, rel=1e-6)
    assert out.numeric_values[0, batch["input_ids"].shape[1] - 2].item() == 2.0  # the prompt's number kept


def test_numpy_and_tensor_scalars_work_where_numbers_do(tokenizer, number_model):
    batch = tokenizer(["A cup of tea costs"], padding_side="left")
    args = (number_model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    plain = generate(
        *args,
        mode="traditional",
        max_new_tokens=3,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        generator=torch.Generator().manual_seed(0),
    )
    scalars = generate(
        *args,
        mode="traditional",
        max_new_tokens=np.int64(3),
        temperature=np.float32(0.7),
        top_k=torch.tensor(5),
        top_p=np.float64(0.9),
        eos_token_id=np.int64(0),
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(plain.sequences, scalars.sequences)
    for bad in (True, np.bool_(True), torch.tensor([3]), "3"):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
            generate(*args, max_new_tokens=bad)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_tokens'"):
        generate(*args, max_tokens=3)


def test_a_tiny_temperature_is_greedy_not_an_error():
    loc_S = torch.tensor([[1.0, 3.0, 2.0], [1e30, -1e30, 0.0]])
    for temperature in (1e-45, 1e-30, 1e-6):
        probs = traditional_probabilities(loc_S, temperature=temperature)
        assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    ovr = traditional_probabilities(loc_S, temperature=1e-45, scale_S=torch.ones(2, 3), threshold=0.0, normalize="ovr")
    assert torch.equal(ovr.argmax(-1), torch.tensor([1, 0])) and bool(torch.isfinite(ovr).all())


# Trust boundaries of generation: the pipeline and ``generate`` accept anything the model itself can
# generate, and every bad input is refused once, at its door, by name.
#
# The oracles: the reference loop `causalqwen.generate` (ids and values), the prompt exactly as the user wrote it,
# and texts written out by hand.


def _pipe(model, tokenizer):
    return pipeline("text-generation", model=model, tokenizer=tokenizer, pipeline_class=NumericTextGenerationPipeline)


@pytest.fixture(scope="module")
def pipes(tiny_in_eval, models):
    return {name: _pipe(model, tiny_in_eval[1]) for name, model in models.items()}


_PRICE = "The price is 12.50 yuan, up 3% from"  # two numbers: 12.50 and 3


# Token ids the model can produce: ordinary text, digits, special tokens, <NUM> with any float32 value, and the
# reserved rows of the head beyond the tokenizer.
_FLOAT32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def generated_rows(draw, tokenizer, vocab_size):
    num = tokenizer.num_token_id
    digits = [tokenizer.hf_tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    specials = list(tokenizer.hf_tokenizer.all_special_ids)
    kinds = st.sampled_from(["text", "digit", "number", "special", "reserved"])
    ids, values = [], []
    for kind in draw(st.lists(kinds, min_size=1, max_size=10)):
        if kind == "number":
            ids.append(num)
            values.append(draw(_FLOAT32))
            continue
        if kind == "text":
            token = draw(st.integers(0, len(tokenizer) - 1).filter(lambda i: i != num and i not in specials))
        elif kind == "digit":
            token = draw(st.sampled_from(digits))
        elif kind == "special":
            token = draw(st.sampled_from(specials))
        else:
            token = draw(st.integers(len(tokenizer), vocab_size - 1))
        ids.append(token)
        values.append(0.0)
    return ids, values


def _is_subsequence(needles, haystack):
    it = iter(haystack)
    return all(any(value == other for other in it) for value in needles)


def test_a_prompt_ending_in_a_date_like_run_keeps_its_numbers_as_written(tiny_in_eval):
    """2020-2021 read as two numbers; a generated "-2022" would make the three runs one identifier: the space goes
    between the prompt and what was generated, never inside the prompt."""
    _, tokenizer = tiny_in_eval
    ids, values, texts = tokenizer.encode("from 2020-2021", return_number_texts=True)
    dash = tokenizer.hf_tokenizer.encode("-", add_special_tokens=False)
    tail = tokenizer.hf_tokenizer.encode("2022", add_special_tokens=False)
    whole = ids + dash + tail
    assert tokenizer.decode_continuation(
        whole, values + [0.0] * (len(dash) + len(tail)), len(ids), number_texts=texts
    ) == ("from 2020-2021", " -2022")


def test_number_texts_name_exactly_the_prompts_numbers_at_every_door(tiny_in_eval, models):
    """Too few texts would write the prompt's later numbers as generated ones (12.50 as 12, 3% as 3.00%), too many
    would take a generated number for the prompt's: both are refused wherever the prompt's end is known, naming the
    row, the count given and the count needed; the streamer refuses them as the prompt arrives, before any step."""
    _, tokenizer = tiny_in_eval
    model = models["numbers"]
    from causalqwen import NumericTextStreamer

    enc = tokenizer([_PRICE], return_tensors="pt")
    width = enc["input_ids"].shape[1]
    out = model.generate(**enc, max_new_tokens=3, return_dict_in_generate=True)
    loop = generate(model, enc["input_ids"], enc["numeric_values"], enc["attention_mask"], max_new_tokens=3)
    first_generated = format_number(float(out.numeric_values[0, width]))  # reads as the first generated value
    assert tokenizer.batch_decode(out, number_texts=enc.number_texts, number_resolution="prompt")[0].startswith(
        "The price is 12.50 yuan, up 3% from "
    )
    steps = []
    hook = model.register_forward_hook(lambda *_: steps.append(1))
    for texts in ([], ["12.50"], ["12.50", "3", first_generated]):
        needed = rf"holds {len(texts)} texts but the prompt \(its first {width} ids\) holds 2 <NUM>"
        for output in (out, loop):
            with pytest.raises(ValueError, match="row 0: number_texts " + needed):
                tokenizer.batch_decode(output, number_texts=[texts], number_resolution="prompt")
        with pytest.raises(ValueError, match="number_texts " + needed):
            tokenizer.decode_continuation(
                out.sequences[0], out.numeric_values[0], width, number_texts=texts, number_resolution="prompt"
            )
        with pytest.raises(ValueError, match="row 0: number_texts " + needed):
            model.generate(**enc, number_texts=[texts], max_new_tokens=1)
        for skip_prompt in (False, True):
            with pytest.raises(ValueError, match="row 0: number_texts " + needed):
                model.generate(**enc, streamer=NumericTextStreamer(tokenizer, skip_prompt, number_texts=texts))
    hook.remove()
    assert steps == []  # every refusal came before the model's first step


@pytest.mark.parametrize(
    "texts, error, pattern",
    [
        (["abc", "3"], ValueError, r"number_texts\[0\] = 'abc' is not a number text"),
        (["12.50", "3 4"], ValueError, r"number_texts\[1\] = '3 4' is not a number text"),
        (["12.50", "12345678901"], ValueError, r"number_texts\[1\] = '12345678901' is not a number text"),
        (["12.50", 3], TypeError, r"number_texts\[1\] must be a str, got int 3"),
        ("12.50", TypeError, r"number_texts must be a list of str.*got '12.50'"),
    ],
)
def test_a_number_text_is_one_number_of_the_grammar_at_every_door(tiny_in_eval, texts, error, pattern):
    """One check wherever number_texts enter: the streamer when it is built, generate before it starts, decode."""
    model, tokenizer = tiny_in_eval
    from causalqwen import NumericTextStreamer

    enc = tokenizer([_PRICE], return_tensors="pt")
    with pytest.raises(error, match=pattern):
        NumericTextStreamer(tokenizer, number_texts=texts)
    with pytest.raises(error, match=pattern.replace("number_texts", r"number_texts\[0\]", 1)):
        model.generate(**enc, number_texts=[texts], max_new_tokens=1)
    with pytest.raises(error, match=pattern):
        tokenizer.decode(enc["input_ids"][0], enc["numeric_values"][0], number_texts=texts)


@given(data=st.data())
def test_whatever_the_model_generates_decodes_and_works_as_a_prompt(tiny_in_eval, models, pipes, data):
    """Random output of the model -- words, digits right after numbers, special tokens, <NUM> with any float32 value,
    reserved rows -- decodes (every generated number reads back as its value), works as a prompt of the pipeline
    (kept exactly as given, the continuation that of the reference loop) and, as ids, of model.generate."""
    model, tokenizer = tiny_in_eval
    ids, values = data.draw(generated_rows(tokenizer, model.config.vocab_size))
    chooser = data.draw(st.sampled_from(sorted(models)))
    text = tokenizer.decode(ids, values, out_of_vocab="mark")
    written = [float(np.float32(v)) for i, v in zip(ids, values) if i == tokenizer.num_token_id]
    read_back = [v for i, v in zip(*tokenizer.encode(text)) if i == tokenizer.num_token_id]
    assert _is_subsequence(written, read_back)

    # as a prompt of the pipeline
    assume(text != "")
    record = pipes[chooser](text, max_new_tokens=2)[0]
    batch = tokenizer([text])
    reference = generate(models[chooser], batch["input_ids"], batch["numeric_values"], max_new_tokens=2)
    assert record["numeric_values"] == reference.numeric_values[0].tolist()
    prompt, continuation = tokenizer.decode_continuation(
        reference.sequences[0],
        reference.numeric_values[0],
        batch["input_ids"].shape[1],
        out_of_vocab="mark",
        number_texts=batch.number_texts[0],
        number_resolution="prompt",
    )  # the pipeline's default
    assert prompt == text and record["generated_text"] == text + continuation

    # as ids of model.generate
    input_ids, numeric_values = torch.tensor([ids]), torch.tensor([values])
    out = models[chooser].generate(
        input_ids, numeric_values=numeric_values, max_new_tokens=2, return_dict_in_generate=True
    )
    reference = generate(models[chooser], input_ids, numeric_values, max_new_tokens=2)
    assert torch.equal(out.sequences, reference.sequences)
    assert torch.equal(out.numeric_values, reference.numeric_values)
    head, _ = tokenizer.decode_continuation(out.sequences[0], out.numeric_values[0], len(ids), out_of_vocab="mark")
    assert head == tokenizer.decode(ids, values, out_of_vocab="mark")


def test_an_empty_prompt_is_named_at_every_door(tiny_in_eval, pipes, capsys):
    model, tokenizer = tiny_in_eval
    pipe = pipes["plain"]
    with pytest.raises(ValueError, match="the prompt is empty"):
        pipe("", max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        pipe(["hi", ""], max_new_tokens=2, batch_size=2)
    alone, pair = tokenizer([""]), tokenizer(["hi", ""], padding_side="left")
    for batch, pattern in ((alone, "prompt 0 is empty"), (pair, "prompt 1 is empty")):
        with pytest.raises(ValueError, match=pattern):
            generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], max_new_tokens=2)
        with pytest.raises(ValueError, match=pattern):
            model.generate(
                batch["input_ids"],
                numeric_values=batch["numeric_values"],
                attention_mask=batch["attention_mask"],
                max_new_tokens=2,
            )
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--prompt", "hi", "--prompt", "", "--max-new-tokens", "2"])
    assert exit_info.value.code == 2 and "prompt 1 is empty" in capsys.readouterr().err


def test_the_reference_loop_refuses_a_list_mask_like_model_generate(tiny_in_eval):
    model, tokenizer = tiny_in_eval
    batch = tokenizer(["The total is 5"])
    with pytest.raises(TypeError, match="attention_mask must be a torch.Tensor of 0s and 1s, got list"):
        generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"].tolist())


@pytest.mark.parametrize("top_p", [1e-12, 1e-50, 5e-324])
def test_a_tiny_top_p_keeps_the_most_probable_token(tiny_in_eval, top_p):
    """In a float16 model 1e-12 is 0: the nucleus must still keep its first class, so a tiny top_p is greedy."""
    model, tokenizer = tiny_in_eval
    half = copy.deepcopy(model).to(torch.float16)
    batch = tokenizer(["The total is 5", "hi"], padding_side="left")
    args = (half, batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    for normalize in ("softmax", "ovr"):
        greedy = generate(*args, mode="traditional", top_k=1, normalize=normalize, max_new_tokens=4)
        nucleus = generate(
            *args,
            mode="traditional",
            top_p=top_p,
            normalize=normalize,
            max_new_tokens=4,
            generator=torch.Generator().manual_seed(0),
        )
        assert torch.equal(nucleus.sequences, greedy.sequences)
    sampled = half.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        mode="traditional",
        do_sample=True,
        top_p=top_p,
        max_new_tokens=4,
    )
    assert torch.equal(sampled, generate(*args, mode="traditional", top_k=1, max_new_tokens=4).sequences)


def test_a_temperature_float32_holds_as_0_is_greedy_at_every_door(tiny_in_eval, capsys):
    """1e-46 is 0 in float32: the reference loop, model.generate and the command all give the greedy tokens
    (the maxima of the shifted scores stay 0), never a NaN inside torch's sampler."""
    model, tokenizer = tiny_in_eval
    batch = tokenizer(["The total is 5"])
    greedy = generate(model, batch["input_ids"], batch["numeric_values"], mode="traditional", top_k=1, max_new_tokens=2)
    cold = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        mode="traditional",
        temperature=1e-46,
        max_new_tokens=2,
        generator=torch.Generator().manual_seed(0),
    )
    sampled = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        mode="traditional",
        do_sample=True,
        temperature=1e-46,
        max_new_tokens=2,
        return_dict_in_generate=True,
    )
    assert torch.equal(cold.sequences, greedy.sequences) and torch.equal(sampled.sequences, greedy.sequences)
    assert (
        cli.main(
            ["generate", "--prompt", "a 1", "--mode", "traditional", "--temperature", "1e-46", "--max-new-tokens", "2"]
        )
        == 0
    )
    assert "a 1" in capsys.readouterr().out


def test_tempered_scores_is_the_softmax_limit_at_any_temperature():
    from causalqwen.inference import tempered_scores

    scores = torch.tensor([[1.0, 3.0, 3.0, -math.inf], [0.5, -2.0, 0.25, 0.0]])
    for temperature in (1e-300, 1e-46, 1e-40):
        probs = torch.softmax(tempered_scores(scores, temperature), dim=-1)
        assert torch.equal(probs, torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    for dtype in (torch.float16, torch.bfloat16):  # 1e-8 is 0 in float16
        probs = torch.softmax(tempered_scores(scores.to(dtype), 1e-8).float(), dim=-1)
        assert torch.equal(probs, torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    expected = torch.softmax(torch.tensor([[1.0, 3.0, 3.0, -math.inf]], dtype=torch.float64) / 0.7, dim=-1)
    got = torch.softmax(tempered_scores(torch.tensor([[1.0, 3.0, 3.0, -math.inf]], dtype=torch.float64), 0.7), -1)
    assert torch.allclose(got, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("which", ["plain", "numbers"])
@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1.1754944e-38, 1e-37, 1e-30])
def test_a_tiny_accepted_temperature_is_greedy_on_both_paths(tiny_in_eval, models, which, temperature):
    """The smallest accepted temperatures act as greedy in the reference loop and in model.generate alike: the
    scores are shifted by their row maximum before transformers divides them (unshifted, a score above
    ~4 * temperature * 1e38 overflows to inf and the softmax gives NaN)."""
    model, tokenizer = models[which], tiny_in_eval[1]
    batch = tokenizer(["The total is 5", "hi"], padding_side="left")
    args = (model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
    greedy = generate(*args, mode="traditional", top_k=1, max_new_tokens=4)
    cold = generate(
        *args, mode="traditional", temperature=temperature, max_new_tokens=4, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(cold.sequences, greedy.sequences)
    sampled = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        mode="traditional",
        do_sample=True,
        temperature=temperature,
        max_new_tokens=4,
        return_dict_in_generate=True,
    )
    assert torch.equal(sampled.sequences, greedy.sequences)
    assert torch.equal(sampled.numeric_values, greedy.numeric_values)


def test_decoding_a_negative_id_says_mark_does_not_apply(tiny_in_eval):
    _, tokenizer = tiny_in_eval
    size = len(tokenizer)
    for out_of_vocab in ("mark", "raise"):
        with pytest.raises(ValueError) as info:
            tokenizer.decode([5, -3], [0.0, 0.0], out_of_vocab=out_of_vocab)
        message = str(info.value)
        assert message.startswith(
            f"input_ids[1] = -3 is not a token id of this tokenizer (0 to {size - 1}): a "
            'negative id is never a model\'s prediction, so out_of_vocab="mark" does not apply'
        )
        assert 'pass out_of_vocab="mark"' not in message
    assert tokenizer.decode([size + 2], [0.0], out_of_vocab="mark") == f"<unk:{size + 2}>"


@pytest.mark.parametrize("loop", ["model.generate", "causalqwen.generate"])
def test_a_generated_value_that_overflows_is_an_error_not_the_next_steps_input(tiny_in_eval, models, loop):
    """A regression head whose loc_Y overflows float32 (3e38 + 1e37-scaled weights): the value beside the generated
    <NUM> is inf, which no forward would take as input, so neither loop returns it as if it were a number."""
    _, tokenizer = tiny_in_eval
    model = copy.deepcopy(models["numbers"])
    with torch.no_grad():
        model.action.regression_head.bias.fill_(3e38)
        model.action.regression_head.weight.mul_(1e37)
    prompt = tokenizer(["The population is 1,400,000 and"])
    arguments = dict(mode="causal", max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    message = (
        r"generation made a value that is not finite \((-?inf|nan)\) at row 0, new token \d: loc_Y overflowed the "
        r"model's float32 \(largest finite value 3\.40282e\+38\), and the later steps read it as input"
    )
    with pytest.raises(ValueError, match=message):
        if loop == "model.generate":
            model.generate(**prompt, **arguments)
        else:
            generate(model, prompt["input_ids"], prompt["numeric_values"], prompt["attention_mask"], **arguments)
