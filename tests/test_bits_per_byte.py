r"""The evaluation perplexity in bits per byte (`likelihood.bits_per_byte`, `metrics.evaluate_texts`).

$\mathrm{bpb} = -\sum_t \log_2 P(\text{text}_t) / \sum_t \text{bytes}_t$, each text scored from its start (the first
token conditioned on end-of-text). Oracles, each computed apart from the package's likelihood code: the OvR token
distribution $q_k = P_k / \sum_j P_j$ from SciPy's Cauchy survival function in float64 on the model's decisions; the
real Qwen2 base's softmax (at initialization ``token_probability="softmax"`` is Qwen's); a model whose classes are
all alike (a uniform $q = 1/V$: $\log_2 V$ bits per token); and SciPy's Cauchy CDF for a number's interval.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from causalqwen.app.tiny import build_tiny_causal_lm
from causalqwen.likelihood import bits_per_byte
from causalqwen.metrics import evaluate_texts, with_log_prefixes

TEXTS = ["The cat sat on the mat.", "温度很高，我们去游泳吧"]  # no numbers; the second 3 bytes a character


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_causal_lm(seed=0, init_seed=0)


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
