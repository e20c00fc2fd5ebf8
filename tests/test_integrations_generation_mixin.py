"""Executable specification of transformers-native generation (causalqwen.integrations.generation_mixin).

The oracles: the reference loop `causalqwen.generate` (equal sequences and values in every mode) and Qwen2's
own `generate` (``traditional`` with top-k 1 is its greedy decoding).
"""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import StoppingCriteria, StoppingCriteriaList, pipeline

from causalqwen import generate
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.integrations.generation_mixin import CausalQwenGenerateOutput

PROMPTS = ["the price of tea rose by 12.5 percent and", "hello", "on day 3 we counted 41 birds"]


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, qwen = build_tiny_causal_lm(seed=0, init_seed=0)
    return model, tokenizer, qwen.eval()


def _hf(model, batch, **kwargs):
    return model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        return_dict_in_generate=True,
        **kwargs,
    )


@pytest.mark.parametrize("mode", ["standard", "causal", "shared_individual", "shared_noise"])
def test_model_generate_equals_the_reference_loop(tiny, mode):
    model, tokenizer, _ = tiny
    batch = tokenizer(PROMPTS, padding_side="left")
    out = _hf(model, batch, mode=mode, max_new_tokens=6, generator=torch.Generator().manual_seed(3))
    ref = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode=mode,
        max_new_tokens=6,
        generator=torch.Generator().manual_seed(3),
    )
    assert isinstance(out, CausalQwenGenerateOutput)
    assert torch.equal(out.sequences, ref.sequences) and torch.equal(out.numeric_values, ref.numeric_values)


@given(
    mode=st.sampled_from(["standard", "causal", "shared_individual", "shared_noise"]),
    seed=st.integers(0, 2**31 - 1),
    rows=st.lists(st.sampled_from(PROMPTS), min_size=1, max_size=3),
    tokens=st.integers(1, 5),
    use_cache=st.booleans(),
)
@settings(max_examples=15)
def test_model_generate_is_the_reference_loop_for_any_prompts_and_seed(tiny, mode, seed, rows, tokens, use_cache):
    model, tokenizer, _ = tiny
    batch = tokenizer(rows, padding_side="left")
    out = _hf(
        model,
        batch,
        mode=mode,
        max_new_tokens=tokens,
        use_cache=use_cache,
        generator=torch.Generator().manual_seed(seed),
    )
    ref = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode=mode,
        max_new_tokens=tokens,
        use_cache=use_cache,
        generator=torch.Generator().manual_seed(seed),
    )
    assert torch.equal(out.sequences, ref.sequences) and torch.equal(out.numeric_values, ref.numeric_values)


def test_a_predicted_number_carries_its_value_into_the_next_step(tiny):
    model, tokenizer, _ = tiny
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.action.classification_head.bias[model.config.num_token_id] = 1e4  # every step predicts <NUM>
    batch = tokenizer(PROMPTS, padding_side="left")
    out = _hf(model, batch, max_new_tokens=3)
    ref = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], max_new_tokens=3)
    new = out.sequences[:, batch["input_ids"].shape[1] :]
    assert (new == model.config.num_token_id).all() and (out.numeric_values[:, -3:] != 0).all()
    torch.testing.assert_close(out.numeric_values, ref.numeric_values)  # each step saw the previous values


def test_traditional_with_top_k_1_is_qwens_greedy_decoding(tiny):
    model, tokenizer, qwen = tiny
    batch = tokenizer(PROMPTS, padding_side="left")
    out = _hf(model, batch, mode="traditional", do_sample=True, top_k=1, max_new_tokens=6)
    greedy = qwen.generate(
        batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6, do_sample=False
    )
    assert torch.equal(out.sequences, greedy)


def test_transformers_arguments_work(tiny):
    model, tokenizer, _ = tiny
    batch = tokenizer(PROMPTS, padding_side="left")
    start = batch["input_ids"].shape[1]

    class AfterTwo(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= start + 2, dtype=torch.bool)

    ids = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=9,
        stopping_criteria=StoppingCriteriaList([AfterTwo()]),
    )
    assert isinstance(ids, torch.Tensor) and ids.shape == (3, start + 2)  # without return_dict: the ids, as always
    torch.manual_seed(0)
    sampled = _hf(
        model,
        batch,
        mode="traditional",
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        max_new_tokens=3,
        output_scores=True,
    )
    assert len(sampled.scores) == 3 and sampled.scores[0].shape == (3, model.config.vocab_size)


def test_the_mode_can_live_on_the_generation_config(tiny):
    model, tokenizer, _ = tiny
    model = copy.deepcopy(model)
    model.generation_config.mode = "causal"
    batch = tokenizer(PROMPTS, padding_side="left")
    out = _hf(model, batch, max_new_tokens=4, generator=torch.Generator().manual_seed(5))
    ref = generate(
        model,
        batch["input_ids"],
        batch["numeric_values"],
        batch["attention_mask"],
        mode="causal",
        max_new_tokens=4,
        generator=torch.Generator().manual_seed(5),
    )
    assert torch.equal(out.sequences, ref.sequences)


def test_the_logits_field(tiny):
    """logits: loc_S in a plain forward (at initialization Qwen's own logits); in generation, log P_k."""
    model, tokenizer, qwen = tiny
    batch = tokenizer(["hello world"])
    with torch.no_grad():
        out = model(**batch)
        expected = qwen(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(out.logits[..., : expected.shape[-1]], expected, rtol=1e-4, atol=1e-4)
    scored = _hf(model, tokenizer(PROMPTS, padding_side="left"), max_new_tokens=1, output_scores=True)
    assert (scored.scores[0] <= 0).all()  # log-probabilities


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"mode": "causal", "do_sample": True}, ValueError, "do_sample applies to mode='traditional'"),
        ({"mode": "standard", "temperature": 0.5}, ValueError, r"^temperature apply to mode='traditional' only"),
        ({"mode": "causal", "top_k": 3, "top_p": 0.5}, ValueError, r"^top_k, top_p apply to mode='traditional' only"),
        ({"mode": "shared_noise", "min_p": 0.1}, ValueError, r"^min_p apply to mode='traditional' only"),
        ({"mode": "greedy"}, ValueError, "mode must be one of"),
        ({"numeric_values": None}, ValueError, r"input_ids hold <NUM> \(id \d+\) but no numeric_values"),
        ({"num_beams": 2}, ValueError, "num_beams > 1 is not supported"),
        (
            {"mode": "traditional", "do_sample": True, "num_return_sequences": 2},
            ValueError,
            "num_return_sequences > 1 is not supported",
        ),
    ],
)
def test_generate_refuses_bad_arguments(tiny, kwargs, error, match):
    model, tokenizer, _ = tiny
    batch = tokenizer(["a price of 5 yuan"])
    arguments = {"numeric_values": batch["numeric_values"], "max_new_tokens": 2} | kwargs
    with pytest.raises(error, match=match):
        model.generate(batch["input_ids"], **arguments)


def test_sampling_arguments_at_their_neutral_values_change_nothing_in_the_other_modes(tiny):
    """As the reference loop, a mode that draws inside the model takes the sampling arguments at the values that
    change nothing (temperature 1, top_k 0, top_p 1), and gives what it gives without them."""
    model, tokenizer, _ = tiny
    batch = tokenizer(["a price of 5 yuan"])
    arguments = {"numeric_values": batch["numeric_values"], "max_new_tokens": 3, "mode": "standard"}
    expected = model.generate(batch["input_ids"], **arguments)
    neutral = model.generate(batch["input_ids"], **arguments, temperature=1.0, top_k=0, top_p=1.0)
    assert torch.equal(neutral, expected)


def test_the_stock_text_generation_pipeline_runs_the_decision_modes(tiny):
    """transformers' own TextGenerationPipeline with the wrapped tokenizer (prompts without numbers): the model's
    generation config sets do_sample=False, so the pipeline's sampling default does not apply and its plain call
    runs the standard mode; do_sample=True with a mode that draws inside the model is refused clearly."""
    from transformers import TextGenerationPipeline

    model, tokenizer, _ = tiny
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer.hf_tokenizer)
    assert type(pipe) is TextGenerationPipeline
    batch = tokenizer(["The price is"])
    expected = model.generate(batch["input_ids"], numeric_values=batch["numeric_values"], max_new_tokens=3)
    plain = pipe("The price is", max_new_tokens=3, return_tensors=True)[0]["generated_token_ids"]
    assert plain == expected[0].tolist()
    with pytest.raises(ValueError, match="do_sample applies to mode='traditional'"):
        pipe("The price is", max_new_tokens=2, do_sample=True, mode="causal")
    for mode in ("standard", "causal"):
        text = pipe("The price is", max_new_tokens=3, mode=mode)[0]["generated_text"]
        assert text.startswith("The price is")


# ----- one forward per job, and its host synchronisations -----


def _per_token_syncs(make_run) -> float:
    """Host synchronisations per generated token (`benchmarks.syncs.HostSyncCounter`), by differencing 1 and 9 new
    tokens: the door's checks and the prefill happen once per call."""
    from benchmarks.syncs import count

    return (count(make_run(9)).total - count(make_run(1)).total) / 8


@pytest.mark.parametrize("padded", [False, True])
def test_generation_synchronises_per_token_no_more_than_qwen2(tiny, padded):
    """Both loops, every mode: no more host synchronisations per token than ``Qwen2ForCausalLM.generate`` on the
    same prompts (one without padding, the stop test; two with it, its mask check besides): one, the stop test."""
    model, tokenizer, qwen = tiny
    batch = tokenizer(PROMPTS if padded else PROMPTS[:1], padding_side="left")
    ids, values, mask = batch["input_ids"], batch["numeric_values"], batch["attention_mask"]
    assert bool(mask.all()) is not padded
    qwen_syncs = _per_token_syncs(
        lambda n: lambda: qwen.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    )
    for mode in ("standard", "causal", "shared_noise", "traditional"):
        sampling = {"do_sample": True} if mode == "traditional" else {}
        reference = _per_token_syncs(
            lambda n, mode=mode: (
                lambda: generate(
                    model,
                    ids,
                    values,
                    mask,
                    mode=mode,
                    max_new_tokens=n,
                    eos_token_id=[],
                    generator=torch.Generator().manual_seed(0),
                )
            )
        )
        native = _per_token_syncs(
            lambda n, mode=mode, sampling=sampling: (
                lambda: model.generate(
                    ids,
                    numeric_values=values,
                    attention_mask=mask,
                    mode=mode,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    generator=torch.Generator().manual_seed(0),
                    **sampling,
                )
            )
        )
        assert reference <= qwen_syncs and native <= qwen_syncs, (mode, reference, native, qwen_syncs)
        # one: the stop test; a step checks no input, and Qwen2 is handed its masks built (no look at the padding)
        assert reference == native == 1, (mode, reference, native)


def test_a_generation_step_is_the_plain_forward(tiny):
    """transformers' loop runs ``forward`` itself, for the law of $U$; the step's logits are the mode's scores formed
    from it: for ``standard``, $\\log P_k$ of the decision the plain forward gives at the prompt's last position.
    forward takes no generation keyword."""
    from causalqwen.losses import ovr_tail_nll

    model, tokenizer, _ = tiny
    batch = tokenizer(PROMPTS, padding_side="left")
    out = _hf(model, batch, max_new_tokens=1, output_logits=True, output_scores=True)
    with torch.no_grad():
        full = model(**batch)
        law = model(**batch, return_decisions=False)
    neg_log_p, _ = ovr_tail_nll(full.loc_S[:, -1], full.scale_S[:, -1], model.ovr_threshold, off=False)
    torch.testing.assert_close(out.logits[0], -neg_log_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.scores[0], out.logits[0], rtol=0, atol=0)  # no processor of its own
    assert law.logits is None and law.loc_S is None and law.loss is None
    torch.testing.assert_close(law.loc_U, full.loc_U, rtol=0, atol=0)
    with pytest.raises(TypeError, match="generation_state"):
        model(**batch, generation_state=None)


@pytest.mark.parametrize(
    "change, error, pattern",
    [
        (
            lambda b: {"numeric_values": b["numeric_values"][:, :1]},
            ValueError,
            r"numeric_values shape \(1, 1\) must equal input_ids shape \(1, 7\)",
        ),
        (
            lambda b: {"numeric_values": b["numeric_values"].tolist()},
            TypeError,
            "numeric_values must be a torch.Tensor",
        ),
        (lambda b: {"numeric_values": b["numeric_values"].bool()}, TypeError, "numeric_values must hold real numbers"),
        (lambda b: {"labels": b["input_ids"]}, TypeError, "generate.. does not take labels"),
        (
            lambda b: {"max_new_tokens": 10**9},
            ValueError,
            r"prompt \(7 tokens\) \+ max_new_tokens \(1000000000\) exceeds max_position_embeddings=2048",
        ),
        (lambda b: {"max_new_tokens": None, "max_length": 4000}, ValueError, "exceeds max_position_embeddings=2048"),
        (
            lambda b: {"attention_mask": b["attention_mask"].tolist()},
            TypeError,
            "attention_mask must be a torch.Tensor of 0s and 1s, got list",
        ),
    ],
)
def test_model_generate_refuses_bad_arguments_by_name(tiny_in_eval, change, error, pattern):
    model, tokenizer = tiny_in_eval
    batch = tokenizer(["The total is 5"])
    arguments = {"numeric_values": batch["numeric_values"], "max_new_tokens": 2} | change(batch)
    with pytest.raises(error, match=pattern):
        model.generate(batch["input_ids"], **{k: v for k, v in arguments.items() if v is not None})


def test_the_shifted_temperature_warper_keeps_the_distribution():
    """model.generate's temperature warper subtracts the row maximum first: the same softmax as transformers' own."""
    from transformers.generation.logits_process import TemperatureLogitsWarper

    from causalqwen.integrations.generation_mixin import _ShiftedTemperatureWarper

    scores = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 5
    for temperature in (0.3, 0.7, 2.5):
        shifted = _ShiftedTemperatureWarper(temperature)(None, scores)
        plain = TemperatureLogitsWarper(temperature)(None, scores)
        assert torch.allclose(shifted.softmax(-1), plain.softmax(-1), atol=1e-6)
        assert bool((shifted.amax(-1) == 0).all())


@pytest.mark.parametrize(
    "options, error, pattern",
    [
        (
            {"prompt_lookup_num_tokens": 2},
            ValueError,
            (
                "prompt_lookup_num_tokens is not supported: assisted / speculative decoding and prompt lookup run "
                "the model on candidate tokens it did not choose, which carry no <NUM> values"
            ),
        ),
        ({"assistant_model": "model"}, ValueError, "assistant_model is not supported: assisted / speculative decoding"),
        ({"assistant_early_exit": 1}, ValueError, "assistant_early_exit is not supported"),
        (
            {"stop_strings": ["x"], "tokenizer": "tokenizer"},
            TypeError,
            (
                r"stop_strings need tokenizer to be a transformers PreTrainedTokenizerBase \(transformers reads its "
                r"vocabulary\), got NumericTokenizer: pass tokenizer=tok.hf_tokenizer"
            ),
        ),
        ({"stop_strings": ["x"], "tokenizer": 3}, TypeError, "got int: pass tokenizer=a transformers tokenizer"),
        ({"mode": "causal", "generator": 123}, TypeError, "^generator must be a torch.Generator, got int$"),
        ({"mode": "shared_noise", "generator": "seed"}, TypeError, "^generator must be a torch.Generator, got str$"),
    ],
)
def test_model_generate_refuses_options_that_would_lose_the_values(tiny_in_eval, options, error, pattern):
    model, tokenizer = tiny_in_eval
    batch = tokenizer(["The total is 5"])
    named = {"model": model, "tokenizer": tokenizer}
    options = {k: named.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(error, match=pattern):
        model.generate(batch["input_ids"], numeric_values=batch["numeric_values"], max_new_tokens=2, **options)
    if "generator" in options:  # the reference loop says the same
        with pytest.raises(error, match=pattern):
            generate(model, batch["input_ids"], batch["numeric_values"], max_new_tokens=2, **options)


def test_stop_strings_work_with_the_wrapped_tokenizer(tiny_in_eval, models):
    """With tokenizer=tok.hf_tokenizer transformers' stop strings match the generated tokens' text: the model that
    writes 7 at every step stops after "77", with the reference loop's first two steps."""
    model, tokenizer = models["digits"], tiny_in_eval[1]
    batch = tokenizer(["The total is 5", "hi"], padding_side="left")
    out = model.generate(
        batch["input_ids"],
        numeric_values=batch["numeric_values"],
        attention_mask=batch["attention_mask"],
        stop_strings=["77"],
        tokenizer=tokenizer.hf_tokenizer,
        max_new_tokens=6,
    )
    reference = generate(model, batch["input_ids"], batch["numeric_values"], batch["attention_mask"], max_new_tokens=6)
    width = batch["input_ids"].shape[1]
    assert out.shape[1] == width + 2 and torch.equal(out, reference.sequences[:, : width + 2])
