"""Executable specification of causalqwen.likelihood (decision D16) and of `cauchy.log_interval_prob`.

Oracles: mpmath at 120 digits and SciPy for the interval probability (at 200 digits or more for literals with more
digits than float64 holds, of any magnitude and resolution), a Monte Carlo draw (binomial bound) for it,
the real Qwen2 base for the ``softmax`` token term at initialization, SciPy's Cauchy survival function for the
``ovr`` token term, and the training loss's Cauchy NLL for the limit of a fine resolution.
"""

import math
import re
from decimal import Decimal

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from test_cauchy import _mp_log_interval as _mp_log_interval_at_digits

from causalqwen import cauchy
from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.likelihood import (
    bits_per_byte,
    keep_last,
    number_log_probability,
    score_continuation,
    score_text,
    split_context,
    token_log_probabilities,
)
from causalqwen.metrics import evaluate_texts, with_log_prefixes
from causalqwen.writing import literal_resolution

D = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731


def _mp_log_interval(low, high, loc, scale) -> float:
    with mpmath.workdps(120):
        low, high, loc, scale = (mpmath.mpf(float(v)) for v in (low, high, loc, scale))  # the floats, exactly
        return float(mpmath.log((mpmath.atan((high - loc) / scale) - mpmath.atan((low - loc) / scale)) / mpmath.pi))


@pytest.mark.parametrize(
    "low, high, loc, scale",
    [
        (2.45, 2.55, 2.5, 0.1),
        (1e8, 1e8 + 0.1, 0.0, 1.0),
        (-1e8 - 0.1, -1e8, 0.0, 1.0),
        (-1.0, 1.0, 0.0, 1.0),
        (36.5, 37.5, 73.0, 0.01),
        (1e30, 1e30 + 1e15, 0.0, 1e-30),
        (-0.5, 0.5, 1e20, 3.0),
        (0.0, 1.0, 0.0, 1.0),
        (-1.0, 0.0, 0.0, 1.0),
        (1e-300, 2e-300, 0.0, 1.0),
        (5.0, 6.0, 5.5, 1e-12),
        (1e15, 1e16, 0.0, 1e-3),
    ],
)
def test_log_interval_prob_against_mpmath(low, high, loc, scale):
    """Narrow intervals far out in a tail (where F(b) - F(a) cancels in float64), across the location, tiny scales."""
    value = cauchy.log_interval_prob(D(low), D(high), D(loc), D(scale)).item()
    expected = _mp_log_interval(low, high, loc, scale)
    assert value == pytest.approx(expected, rel=1e-12, abs=1e-13)


@settings(max_examples=200)
@given(st.floats(-50, 50), st.floats(0.1, 10), st.floats(-50, 50), st.floats(0.1, 10))
def test_log_interval_prob_against_scipy(low, width, loc, scale):
    """Where SciPy's own difference does not cancel: the survival functions above the location, the CDFs below."""
    high = low + width
    if low >= loc:
        expected = stats.cauchy.sf(low, loc, scale) - stats.cauchy.sf(high, loc, scale)
    else:
        expected = stats.cauchy.cdf(high, loc, scale) - stats.cauchy.cdf(low, loc, scale)
    value = cauchy.log_interval_prob(D(low), D(high), D(loc), D(scale)).item()
    assert value == pytest.approx(math.log(expected), rel=1e-9, abs=1e-10)


def test_log_interval_prob_against_monte_carlo():
    """200,000 draws: the fraction inside the interval is within 5 binomial standard deviations of exp(value)."""
    generator = torch.Generator().manual_seed(0)
    draws = cauchy.rsample(D(1.0), D(0.5), torch.rand(200_000, generator=generator, dtype=torch.float64))
    probability = cauchy.log_interval_prob(D(1.2), D(2.0), D(1.0), D(0.5)).exp().item()
    fraction = ((draws > 1.2) & (draws <= 2.0)).double().mean().item()
    assert abs(fraction - probability) <= 5 * math.sqrt(probability * (1 - probability) / 200_000)


def test_log_interval_prob_refuses_an_empty_interval():
    with pytest.raises(ValueError, match="low must be < high"):
        cauchy.log_interval_prob(D(1.0), D(1.0), D(0.0), D(1.0))
    with pytest.raises(ValueError, match="scale"):
        cauchy.log_interval_prob(D(0.0), D(1.0), D(0.0), D(0.0))


@pytest.mark.parametrize("loc, scale", [(3.3, 0.7), (-120.0, 15.0), (0.0, 1e-3)])
def test_the_numbers_written_at_one_resolution_add_up_to_one(loc, scale):
    """Every integer literal stands for its unit interval; the intervals tile the line, so the terms of all of them
    (here -N..N, plus the two tails from SciPy) add up to 1, and those of any subset to at most 1."""
    total = sum(number_log_probability(str(n), loc, scale).exp().item() for n in range(-400, 401))
    tails = stats.cauchy.cdf(-400.5, loc, scale) + stats.cauchy.sf(400.5, loc, scale)
    assert total + tails == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    "literal, value, resolution", [("2.50000", 2.5, 1e-5), ("-37.000000", -37.0, 1e-6), ("1.234567e2", 123.4567, 1e-4)]
)
def test_a_fine_resolution_gives_the_training_losss_density(literal, value, resolution):
    """log P(interval) - log h tends to log f_Y(v) = -nll, the regression term of the training loss, as h -> 0:
    the difference is of order (h / scale)^2, plus the float64 rounding of v -/+ h/2 (a few ulps of v over h)."""
    loc, scale = 2.0, 1.5
    term = number_log_probability(literal, loc, scale).item() - math.log(resolution)
    density = -cauchy.nll(D(value), D(loc), D(scale)).item()
    assert term == pytest.approx(density, abs=10 * (resolution / scale) ** 2 + 4 * math.ulp(value) / resolution)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_causal_lm(seed=0, init_seed=0)


def test_softmax_token_terms_at_initialization_are_qwens_log_likelihood(tiny):
    """At initialization loc_S is Qwen's logits, so a text without numbers scores as under the real Qwen2 base."""
    model, tokenizer, qwen = tiny
    ids, values, texts, start = split_context(tokenizer, "The cat sat on", " the mat and slept")
    score = score_continuation(model, ids, values, texts, start, "softmax")
    with torch.no_grad():
        logits = qwen(torch.tensor([ids])).logits[0].double()  # [S, V]
    log_probs = torch.log_softmax(logits[:, : model.config.vocab_size], -1)
    expected = sum(log_probs[i - 1, ids[i]].item() for i in range(start, len(ids)))
    assert score.log_likelihood == pytest.approx(expected, rel=1e-5)


def test_ovr_token_terms_against_scipy(tiny):
    """log q_k = log P_k - log sum_j P_j with P_k the Cauchy survival function at the threshold (SciPy, float64)."""
    model, tokenizer, _ = tiny
    ids, values, texts, start = split_context(tokenizer, "Prices rose", " again in March")
    score = score_continuation(model, ids, values, texts, start, "ovr")
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.tensor([values]), torch.ones(1, len(ids), dtype=torch.long))
    loc, scale = out.loc_S[0].double().numpy(), out.scale_S[0].double().numpy()
    log_p = stats.cauchy.logsf(float(model.ovr_threshold), loc, scale)
    log_q = log_p - np.logaddexp.reduce(log_p, axis=-1, keepdims=True)
    expected = [log_q[i - 1, ids[i]] for i in range(start, len(ids))]
    assert score.terms == pytest.approx(expected, rel=1e-9)
    assert token_log_probabilities(out.loc_S[0], out.scale_S[0], model.ovr_threshold).exp().sum(
        -1
    ).numpy() == pytest.approx(1.0, abs=1e-12)


def test_a_number_term_is_its_token_term_plus_its_interval(tiny):
    """At a <NUM>: log q_NUM + log P(v - h/2 < Y <= v + h/2) with loc_Y, scale_Y of the position before it; the
    interval part against a Monte Carlo draw of Y."""
    model, tokenizer, _ = tiny
    ids, values, texts, start = split_context(tokenizer, "A cup of coffee costs", " 2.5 dollars.")
    score = score_continuation(model, ids, values, texts, start)
    position = ids.index(tokenizer.num_token_id)
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.tensor([values]), torch.ones(1, len(ids), dtype=torch.long))
    log_q = token_log_probabilities(out.loc_S[0], out.scale_S[0], model.ovr_threshold)[position - 1]
    loc, scale = out.loc_Y[0, position - 1].double(), out.scale_Y[0, position - 1].double()
    interval = score.terms[position - start] - log_q[tokenizer.num_token_id].item()
    draws = cauchy.rsample(
        loc, scale, torch.rand(400_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    )
    fraction = ((draws > 2.45) & (draws <= 2.55)).double().mean().item()
    probability = math.exp(interval)
    assert abs(fraction - probability) <= 5 * math.sqrt(probability * (1 - probability) / 400_000) + 1e-6
    assert interval == pytest.approx(number_log_probability("2.5", loc, scale).item(), rel=1e-12)


def test_the_same_digits_in_another_order_score_differently(tiny):
    """ "37" and "73" are both one <NUM> after the same context: the same token term; their number terms differ by
    exactly the difference of their intervals' log-probabilities under the same law of Y."""
    model, tokenizer, _ = tiny
    first, second = (
        score_continuation(model, *split_context(tokenizer, "The code 37 repeated is", continuation))
        for continuation in (" 37.", " 73.")
    )
    ids, values, _, start = split_context(tokenizer, "The code 37 repeated is", " 37.")
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.tensor([values]), torch.ones(1, len(ids), dtype=torch.long))
    position = ids.index(tokenizer.num_token_id, start)  # " ", then <NUM>, then "."
    loc, scale = out.loc_Y[0, position - 1].double(), out.scale_Y[0, position - 1].double()
    expected = (number_log_probability("37", loc, scale) - number_log_probability("73", loc, scale)).item()
    index = position - start
    assert first.terms[index] - second.terms[index] == pytest.approx(expected, rel=1e-9)
    assert first.terms[:index] == second.terms[:index]
    assert first.log_likelihood != second.log_likelihood


def test_rolling_score_is_the_continuation_of_the_end_of_text_token(tiny):
    model, tokenizer, _ = tiny
    text = "The price is 2.5 dollars and 3 cents."
    whole = score_text(model, tokenizer, text)
    ids, values, texts, start = split_context(tokenizer, "", text)
    assert ids[0] == tokenizer.eos_token_id and start == 1
    assert whole == pytest.approx(score_continuation(model, ids, values, texts, start).log_likelihood, rel=1e-12)
    assert score_text(model, tokenizer, text, max_length=4) < 0  # windows of 4 tokens: scored, differently
    with pytest.raises(ValueError, match="non-empty"):
        score_text(model, tokenizer, "")


def test_greedy_continuations_are_flagged(tiny):
    """A continuation the standard mode decides token by token is greedy; another is not."""
    from causalqwen.generation import generate

    model, tokenizer, _ = tiny
    encoding = tokenizer("The cat", padding=False, return_tensors="pt")
    out = generate(
        model, encoding["input_ids"], encoding["numeric_values"], encoding["attention_mask"], max_new_tokens=3
    )
    ids, values = out.sequences[0].tolist(), out.numeric_values[0].tolist()
    texts = encoding.number_texts[0]
    assert tokenizer.num_token_id not in ids[2:]
    assert score_continuation(model, ids, values, texts, encoding["input_ids"].shape[1]).is_greedy
    other = ids[:-1] + [(ids[-1] + 1) % tokenizer.num_token_id]
    assert not score_continuation(model, other, values, texts, encoding["input_ids"].shape[1]).is_greedy


@pytest.mark.parametrize(
    "context, continuation, match",
    [
        ("It costs 2", ".5 dollars", "splits the number '2.5'"),
        ("It is 12", "-34-56", "reads its numbers differently alone"),
        ("x", "-5", "reads its numbers differently alone"),
        ("Nothing", "", "empty"),
    ],
)
def test_split_context_refuses_what_cannot_be_scored(tiny, context, continuation, match):
    with pytest.raises(ValueError, match=match):
        split_context(tiny.tokenizer, context, continuation)


def test_score_continuation_refuses_bad_input(tiny):
    model, tokenizer, _ = tiny
    ids, values, texts, start = split_context(tokenizer, "A cup costs", " 2.5 dollars.")
    nan_values = [float("nan") if token == tokenizer.num_token_id else value for token, value in zip(ids, values)]
    with pytest.raises(ValueError, match="has no value"):
        score_continuation(model, ids, nan_values, texts, start)
    with pytest.raises(ValueError, match="number texts"):
        score_continuation(model, ids, values, [], start)
    with pytest.raises(ValueError, match="token_probability"):
        score_continuation(model, ids, values, texts, start, "argmax")
    with pytest.raises(ValueError, match="start"):
        score_continuation(model, ids, values, texts, 0)


def test_keep_last_cuts_the_context_on_the_left_with_its_numbers(tiny):
    """A context longer than the model's positions loses its first tokens and their numbers' literals; the scored
    tokens are kept and score as they do after the same kept context."""
    model, tokenizer, _ = tiny
    ids, values, texts, start = split_context(tokenizer, "It was 1 then 2 then 3 and then", " 4.5 kg.")
    kept = keep_last(ids, values, texts, start, 9, tokenizer.num_token_id)
    assert kept[0] == ids[-9:] and kept[1] == values[-9:] and len(ids) - start == 9 - kept[3]
    assert kept[2] == texts[len(texts) - kept[0].count(tokenizer.num_token_id) :]
    score = score_continuation(model, *kept)
    assert len(score.terms) == len(ids) - start
    with pytest.raises(ValueError, match="does not fit"):
        keep_last(ids, values, texts, start, 3, tokenizer.num_token_id)


@pytest.mark.parametrize(
    "context, continuation",
    [
        ("这本书的", "价格是12.5元。"),
        ("这本书的", "价格是"),
        ("A cup of coffee co", "sts"),
        ("The dog", "gy"),
        ("I like ap", "ples"),
        ("The new car costs ", "25,000 dollars."),
        ("Hi", "\n1,250 dollars"),
    ],
)
def test_the_continuation_is_scored_as_its_own_tokens_across_any_boundary(tiny, context, continuation):
    """Where the tokenizer would merge characters across the boundary, the continuation is still scored as the
    tokens of its own text (whitespace moved from the context), never part of a context token, never merged away."""
    model, tokenizer, _ = tiny
    ids, values, texts, start = split_context(tokenizer, context, continuation)
    moved = context[len(context.rstrip()) :] + continuation
    expected_ids, expected_values, expected_texts = tokenizer.encode(moved, return_number_texts=True)
    assert (ids[start:], values[start:]) == (expected_ids, expected_values)
    assert texts[len(texts) - len(expected_texts) :] == expected_texts
    assert ids[:start] == tokenizer.encode(context.rstrip())[0]
    assert len(score_continuation(model, ids, values, texts, start).terms) == len(expected_ids)


@pytest.mark.parametrize("max_length", [0, 1, -3, 2.5, True, "8"])
def test_score_text_names_a_max_length_that_is_no_window(tiny, max_length):
    """``max_length`` is a window of at least one token of context and one scored: 0 is not the default, 1 would
    never move on, -3 and 2.5 are not windows; each is a ValueError naming ``max_length``, in ``bits_per_byte``
    too, before any text is scored."""
    model, tokenizer, _ = tiny
    with pytest.raises(
        ValueError, match=f"max_length must be None .* or an int >= 2 .*got {re.escape(repr(max_length))}"
    ):
        score_text(model, tokenizer, "The price is 5 yuan", max_length=max_length)
    with pytest.raises(ValueError, match="max_length must be None"):
        bits_per_byte(model, tokenizer, ["The price is 5 yuan"], max_length=max_length)
    assert math.isfinite(score_text(model, tokenizer, "The price is 5 yuan", max_length=2))


# The evaluation perplexity in bits per byte (`likelihood.bits_per_byte`, `metrics.evaluate_texts`).
#
# $\mathrm{bpb} = -\sum_t \log_2 P(\text{text}_t) / \sum_t \text{bytes}_t$, each text scored from its start (the first
# token conditioned on end-of-text). Oracles, each computed apart from the package's likelihood code: the OvR token
# distribution $q_k = P_k / \sum_j P_j$ from SciPy's Cauchy survival function in float64 on the model's decisions; the
# real Qwen2 base's softmax (at initialization ``token_probability="softmax"`` is Qwen's); a model whose classes are
# all alike (a uniform $q = 1/V$: $\log_2 V$ bits per token); and SciPy's Cauchy CDF for a number's interval.


TEXTS = ["The cat sat on the mat.", "温度很高，我们去游泳吧"]  # no numbers; the second 3 bytes a character


def _bytes(texts) -> int:
    return sum(len(text.encode("utf-8")) for text in texts)


def _decisions(model, tokenizer, text):
    """The ids scored (end-of-text first) and the model's decisions at each position, float64 NumPy."""
    ids, values = tokenizer.encode(text)
    ids, values = [tokenizer.eos_token_id, *ids], [0.0, *values]
    with torch.no_grad():
        out = model(torch.tensor([ids]), torch.tensor([values]), torch.ones(1, len(ids), dtype=torch.long))
    arrays = (out.loc_S[0], out.scale_S[0], out.loc_Y[0], out.scale_Y[0])
    return ids, [array.double().numpy() for array in arrays]


def _ovr_token_nats(model, ids, loc_S, scale_S) -> float:
    """sum_i log q_{ids[i]} at the position before, q_k = P_k / sum_j P_j, P_k by SciPy."""
    log_p = stats.cauchy.logsf(float(model.ovr_threshold), loc_S, scale_S)  # [S, V]
    log_q = log_p - np.logaddexp.reduce(log_p, axis=-1, keepdims=True)
    return float(sum(log_q[i - 1, ids[i]] for i in range(1, len(ids))))


def test_texts_without_numbers_against_scipy_in_float64(tiny):
    model, tokenizer, _ = tiny
    nats = 0.0
    for text in TEXTS:
        ids, (loc_S, scale_S, _, _) = _decisions(model, tokenizer, text)
        nats += _ovr_token_nats(model, ids, loc_S, scale_S)
    expected = -nats / math.log(2) / _bytes(TEXTS)
    assert bits_per_byte(model, tokenizer, TEXTS) == pytest.approx(expected, rel=1e-9)


def test_softmax_at_initialization_is_the_qwen_bases_bits_per_byte(tiny):
    model, tokenizer, qwen = tiny
    nats = 0.0
    for text in TEXTS:
        ids = [tokenizer.eos_token_id, *tokenizer.encode(text)[0]]
        with torch.no_grad():
            logits = qwen(torch.tensor([ids])).logits[0].double()  # [S, V]
        log_probs = torch.log_softmax(logits[:, : model.config.vocab_size], -1)
        nats += sum(log_probs[i - 1, ids[i]].item() for i in range(1, len(ids)))
    expected = -nats / math.log(2) / _bytes(TEXTS)
    assert bits_per_byte(model, tokenizer, TEXTS, token_probability="softmax") == pytest.approx(expected, rel=1e-5)


def test_a_model_whose_classes_are_alike_costs_log2_V_bits_per_token():
    """W_cls = 0 and b_cls = 0: every class has the same law, so q = 1/V at every position."""
    model, tokenizer, _ = build_tiny_causal_lm(seed=0, init_seed=0)
    with torch.no_grad():
        model.action.classification_head.weight.zero_()
        model.action.classification_head.bias.zero_()
    tokens = sum(len(tokenizer.encode(text)[0]) for text in TEXTS)  # each scored, the first after end-of-text
    expected = tokens * math.log2(model.config.vocab_size) / _bytes(TEXTS)
    assert bits_per_byte(model, tokenizer, TEXTS) == pytest.approx(expected, rel=1e-9)


def test_a_number_is_scored_as_written(tiny):
    """ "2.5" stands for (2.45, 2.55] and "12" for (11.5, 12.5]: their intervals' probabilities under the law of Y
    at the position before each <NUM> (SciPy's CDF), added to the token terms."""
    model, tokenizer, _ = tiny
    text = "A cup costs 2.5 yuan, and 12 cups cost more."
    ids, (loc_S, scale_S, loc_Y, scale_Y) = _decisions(model, tokenizer, text)
    numbers = [index for index, token in enumerate(ids) if token == tokenizer.num_token_id]
    assert len(numbers) == 2
    nats = _ovr_token_nats(model, ids, loc_S, scale_S)
    for index, (value, resolution) in zip(numbers, [(2.5, 0.1), (12.0, 1.0)]):
        law = stats.cauchy(loc_Y[index - 1], scale_Y[index - 1])
        nats += math.log(law.cdf(value + resolution / 2) - law.cdf(value - resolution / 2))
    expected = -nats / math.log(2) / len(text.encode("utf-8"))
    assert bits_per_byte(model, tokenizer, [text]) == pytest.approx(expected, rel=1e-6)


def test_the_eval_metric_is_logged_as_eval_bits_per_byte(tiny):
    model, tokenizer, _ = tiny
    logged = with_log_prefixes(evaluate_texts(model, tokenizer, TEXTS))
    assert logged["eval/bytes"] == 23 + 11 * 3
    assert logged["eval/bits_per_byte"] == pytest.approx(bits_per_byte(model, tokenizer, TEXTS), rel=1e-12)


@pytest.mark.parametrize(
    "texts, message",
    [
        ([], r"texts must be a non-empty list of str, got list"),
        ("The cat", r"texts must be a non-empty list of str, got str"),
        (None, r"texts must be a non-empty list of str, got NoneType"),
        (["fine", ""], r"texts\[1\] must be a non-empty str, got ''"),
        (["fine", 3], r"texts\[1\] must be a non-empty str, got 3"),
        (["a\ud800b"], r"texts\[0\] is not UTF-8 text: surrogates not allowed at character 1"),
    ],
)
def test_bad_texts_are_refused_by_name(tiny, texts, message):
    model, tokenizer, _ = tiny
    with pytest.raises(ValueError, match=message):
        bits_per_byte(model, tokenizer, texts)
    with pytest.raises(ValueError, match=message):
        evaluate_texts(model, tokenizer, texts)


def test_an_unknown_token_probability_is_refused_by_name(tiny):
    model, tokenizer, _ = tiny
    with pytest.raises(ValueError, match=r'token_probability must be "ovr" or "softmax", got \'logits\''):
        bits_per_byte(model, tokenizer, TEXTS, token_probability="logits")


def test_a_training_run_logs_eval_bits_per_byte_of_its_held_out_texts(tiny):
    """`train` with ``eval_texts``: the eval record holds ``eval/bits_per_byte``, that of the trained model."""
    import copy

    from causalqwen import train
    from causalqwen.files.data import TextDataset, collate, synthetic_texts
    from causalqwen.training import TrainingConfig

    _, tokenizer, _ = tiny
    model = copy.deepcopy(tiny[0])
    data = TextDataset(synthetic_texts(4, seed=0), tokenizer, max_length=32)
    held_out = synthetic_texts(2, seed=1)
    batch = collate(TextDataset(held_out, tokenizer, max_length=32).items, tokenizer.pad_token_id)
    config = TrainingConfig(steps=1, batch_size=4, learning_rate=1e-3, warmup_steps=0, eval_every=1, log_every=1)
    (record,) = train(model, data, config, batch, eval_texts=(tokenizer, held_out), progress=False)
    assert record["eval/bits_per_byte"] == pytest.approx(bits_per_byte(model, tokenizer, held_out), rel=1e-9)
    assert record["eval/bytes"] == _bytes(held_out)
    assert record["eval/bits_per_byte"] != pytest.approx(bits_per_byte(tiny[0], tokenizer, held_out), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# A literal with more digits than float64 holds: its interval scored as written, against mpmath
# ---------------------------------------------------------------------------------------------
# Oracle: mpmath at 200 digits or more (as many as the interval needs), from the tail masses of
# `test_cauchy._mp_log_interval`.


def _mp_number_log_probability(literal: str, loc: float, scale: float) -> float:
    """log P(v - h/2 < Y <= v + h/2) for Y ~ Cauchy(loc, scale), v and h read from the literal's digits by mpmath, at
    200 digits plus as many as the literal and its resolution span (so no end is rounded), from the tail masses
    atan2(scale, d) / pi, which keep their relative precision however far out."""
    unsigned = literal.lstrip("-\u2212").replace(",", "")
    mantissa, _, exponent = unsigned.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    k = (int(exponent) if exponent else 0) - decimals
    digits = 200 + len(unsigned) + abs(k) + 330
    with mpmath.workdps(digits):
        value = mpmath.mpf(unsigned) * (-1 if literal[0] in "-\u2212" else 1)
        half = mpmath.mpf(10) ** k / 2
        return _mp_log_interval_at_digits(value - half, value + half, loc, scale, digits=digits)


@pytest.mark.parametrize(
    "literal, loc, scale",
    [
        ("1234567.123456789012345", 1234567.0, 1.0),
        ("1234567.123456789012345", 1234567.123456789, 1e-9),
        ("0.1000000000000000055511151231257827", 0.1, 1e-3),
        ("0.1000000000000000055511151231257827", 0.1, 1e-17),
        ("-0.1000000000000000055511151231257827", 3.0, 2.0),
        ("1." + "0" * 400 + "1", 1.0, 1e-300),
        ("3.4028234e38", 0.0, 1.0),
        ("-1.17549435e-38", 0.0, 1e-40),
        ("1.4012985e-45", 0.0, 1e-45),
        ("0.1" + "0" * 400, 0.1, 1.0),
        ("123456789.5", 123456789.5, 1e-20),
        ("2.5", 1e300, 1e-300),
    ],
)
def test_a_literal_with_more_digits_than_float64_is_scored_as_written(literal, loc, scale):
    """The interval's ends and width come from the digits: no float64 rounding of v +- h/2."""
    value = number_log_probability(literal, loc, scale).item()
    expected = _mp_number_log_probability(literal, loc, scale)
    assert math.isfinite(value)
    assert value == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "literal, loc, scale",
    [
        ("0." + "0" * 400, 0.0, 1.0),
        ("0." + "0" * 400, 5e-324, 1.0),
        ("1." + "0" * 400, 1.0, 1.0),
        ("-2.5" + "0" * 500, -2.5, 1e-3),
        ("1." + "0" * 200, 1.0, 1e200),
        ("0." + "0" * 320, 0.0, 1e-10),
        ("123.456" + "0" * 350, 123.456, 1e-5),
    ],
)
def test_a_literal_finer_than_float64_at_its_location_is_scored_exactly(literal, loc, scale):
    """The location on (or within float64's reach of) a literal whose interval is narrower than float64's smallest
    number, beside the scale: both ends' distances to the location, over the scale, underflow float64 (the interval
    holds the location, so the mass is the two arctangents added), and the score is still finite and mpmath's."""
    value = number_log_probability(literal, loc, scale).item()
    assert math.isfinite(value)
    assert value == pytest.approx(_mp_number_log_probability(literal, loc, scale), rel=1e-12)


@st.composite
def scored_literals(draw):
    """``(literal, loc, scale)``: a literal of 1-400 digits whose value is a normal float32 magnitude, and a Cauchy law
    centred anywhere from on the literal to far from it, with a scale from 1e-12 to 1e12 of the value's size."""
    lead = draw(st.sampled_from("123456789"))
    fraction = draw(st.text("0123456789", min_size=0, max_size=399))
    exponent = draw(st.integers(-37, 37))
    sign = draw(st.sampled_from(["", "-"]))
    literal = f"{sign}{lead}{'.' + fraction if fraction else ''}e{exponent}"
    size = 10.0**exponent
    scale = size * 10.0 ** draw(st.floats(-12, 12))
    loc = float(Decimal(literal)) + draw(st.floats(-1e3, 1e3)) * draw(st.sampled_from([0.0, scale, size]))
    return literal, loc, scale


@settings(max_examples=150, deadline=None)
@given(scored_literals())
def test_the_likelihood_of_any_literal_is_mpmaths_at_200_digits(drawn):
    literal, loc, scale = drawn
    assert number_log_probability(literal, loc, scale).item() == pytest.approx(
        _mp_number_log_probability(literal, loc, scale), rel=1e-9
    )


def test_a_zero_of_any_resolution_is_scored_or_named():
    """'0e999999999' stands for (-h/2, h/2] with h = 10^999999999: all the mass but 4 scale / (pi h), log P = -0.0
    in float64. '0e-999999999' is an interval of width 10^-999999999 around 0: log P = log h + log f(0) to within
    h^2. Beyond 10^17 the exponent of the resolution is beyond exact decimal arithmetic: a ValueError naming it."""
    assert number_log_probability("0e999999999", 2.0, 3.0).item() == 0.0
    log_density = -math.log(math.pi * 3.0 * (1 + (2.0 / 3.0) ** 2))
    assert number_log_probability("0e-999999999", 2.0, 3.0).item() == pytest.approx(
        -999999999 * math.log(10) + log_density, rel=1e-15
    )
    assert number_log_probability("0e-999999999", 0.0, 3.0).item() == pytest.approx(  # on the location
        -999999999 * math.log(10) - math.log(math.pi * 3.0), rel=1e-15
    )
    with pytest.raises(ValueError, match="'0e99999999999999999999' states the resolution 10\\^99999999999999999999"):
        number_log_probability("0e99999999999999999999", 2.0, 3.0)
    with pytest.raises(
        ValueError,
        match=r"'0e99999999999999'...'999999999999' \(5002 characters\) states the "
        r"resolution 10\^k with \|k\| > 10\^40",
    ):
        number_log_probability("0e" + "9" * 5000, 2.0, 3.0)
    with pytest.raises(ValueError, match=r"10\^k with \|k\| > 10\^40 of the number '0e-9999999999999'"):
        literal_resolution("0e-" + "9" * 5000)


@pytest.mark.parametrize(
    "loc, scale, match",
    [
        (math.nan, 1.0, "loc_Y must be finite"),
        (math.inf, 1.0, "loc_Y must be finite"),
        (0.0, 0.0, "scale_Y must be a finite number > 0"),
        (0.0, math.nan, "scale_Y must be a finite number > 0"),
    ],
)
def test_the_likelihood_names_a_bad_law(loc, scale, match):
    with pytest.raises(ValueError, match=match):
        number_log_probability("2.5", loc, scale)


def test_the_likelihood_names_a_literal_that_is_not_a_number():
    with pytest.raises(ValueError, match="'1e999999999'.*overflows float32"):
        number_log_probability("1e999999999", 0.0, 1.0)
    with pytest.raises(ValueError, match="'abc' is not a single number"):
        number_log_probability("abc", 0.0, 1.0)


def test_the_likelihood_keeps_the_shape_of_the_law():
    loc = torch.tensor([[0.0, 2.5], [1e30, -3.0]], dtype=torch.float64)
    scale = torch.tensor([1.0, 0.5], dtype=torch.float64)
    terms = number_log_probability("2.5", loc, scale)
    assert terms.shape == (2, 2)
    for row in range(2):
        for column in range(2):
            assert terms[row, column].item() == pytest.approx(
                _mp_number_log_probability("2.5", loc[row, column].item(), scale[column].item()), rel=1e-12
            )
