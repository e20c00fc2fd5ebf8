"""The comparison's corpora, pretrained base, Qwen-side batches, fine-tuning and evaluators (validation/domain_a.py,
validation/domains.py, validation/qwen_batches.py, validation/qwen_finetuning.py, validation/comparison_eval.py),
each checked against an independent oracle."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from causalqwen import NumericTokenizer
from causalqwen.modeling import CausalQwenForCausalLM
from causalqwen.numbers import find_numbers
from validation import comparison_eval as E
from validation import domain_a as A
from validation import domains as D
from validation import qwen_batches as B
from validation import qwen_finetuning as Q

SMALL = dict(steps=4, n_texts=48, batch_size=8, warmup_steps=1, n_held_out=8)


@pytest.fixture(scope="module")
def small_base(tmp_path_factory):
    """A base pretrained for a few steps on a small corpus, in its own cache directory."""
    cache = tmp_path_factory.mktemp("cache")
    model, tokenizer = D.pretrained_base(cache_dir=cache, **SMALL)
    return model, tokenizer, cache


# ---------------------------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------------------------


def test_domain_a_is_deterministic_differs_across_seeds_and_has_no_numbers():
    first, again, other = A.domain_a_texts(300, 0), A.domain_a_texts(300, 0), A.domain_a_texts(300, 1)
    assert first == again
    assert first != other
    assert len(set(first)) > 150  # varied
    for text in first + other:
        assert not any(ch.isdigit() for ch in text)
        assert find_numbers(text) == []


def test_domain_a_facts_are_consistent():
    """Every stated habitat / food of an animal is the table's (the learnable regularity)."""
    texts = A.domain_a_texts(400, 3)
    lives = eats = 0
    for text in texts:
        for animal, place in re.findall(r"[Tt]he (\w+) lives in the (\w+)\.", text):
            assert A.ANIMALS[animal][0] == place
            lives += 1
        for animal, food in re.findall(r"[Tt]he (\w+) eats (\w+)\.", text):
            assert A.ANIMALS[animal][1] == food
            eats += 1
        assert " a owl" not in text and "A owl" not in text
    assert lives > 20 and eats > 20


def test_domain_b_is_deterministic_and_differs_across_seeds():
    assert D.domain_b_records(100, 0) == D.domain_b_records(100, 0)
    assert D.domain_b_texts(100, 0) == [r.text for r in D.domain_b_records(100, 0)]
    assert D.domain_b_texts(100, 0) != D.domain_b_texts(100, 1)
    assert {r.template for r in D.domain_b_records(100, 0)} == {"price", "copy", "scaled"}


@pytest.mark.parametrize("options", [{}, {"outlier_fraction": 0.3}, {"extrapolate": True}])
def test_grammar_and_numeric_tokenizer_find_exactly_the_generated_numbers(options):
    tokenizer = NumericTokenizer(_tiny_tokenizer())
    for record in D.domain_b_records(150, 5, **options):
        found = find_numbers(record.text)
        assert [(n.start, n.end, n.text) for n in found] == [(n.start, n.end, n.text) for n in record.numbers]
        assert [n.value for n in found] == [n.value for n in record.numbers]
        assert all(record.text[n.start : n.end] == n.text for n in record.numbers)
        assert all(float(np.float32(float(n.text))) == n.value for n in record.numbers)  # value = the written text
        ids, values = tokenizer.encode(record.text)
        assert ids.count(tokenizer.num_token_id) == len(record.numbers)
        assert [v for i, v in zip(ids, values) if i == tokenizer.num_token_id] == [n.value for n in record.numbers]


def test_domain_b_relations_hold_without_outliers():
    lo, hi = D.DEFAULT_VALUE_RANGE
    means = D.item_means()
    log_ratios = []
    for record in D.domain_b_records(600, 2):
        values = [n.value for n in record.numbers]
        assert all(lo <= v <= hi for v in values)
        assert not any(n.outlier for n in record.numbers)
        if record.template == "copy":
            assert [n.role for n in record.numbers] == ["given", "target"] and values[0] == values[1]
        elif record.template == "scaled":
            assert [n.role for n in record.numbers] == ["given", "target"] and values[1] == 2 * values[0]
        else:
            (number,) = record.numbers
            item = next(i for i in means if f" {i} " in record.text)
            log_ratios.append(math.log(number.value / means[item]))
    # price = mean * exp(0.1 N(0,1)), rounded: the log ratios have mean ~0 and sd ~0.1
    assert abs(np.mean(log_ratios)) < 0.03 and 0.07 < np.std(log_ratios) < 0.14


def test_outlier_fraction_is_realised_and_only_outliers_change():
    fraction = 0.2
    clean = D.domain_b_records(1500, 4)
    dirty = D.domain_b_records(1500, 4, outlier_fraction=fraction)
    targets = [n for r in dirty for n in r.numbers if n.role == "target"]
    hits = sum(n.outlier for n in targets)
    expected, sd = len(targets) * fraction, math.sqrt(len(targets) * fraction * (1 - fraction))
    assert abs(hits - expected) < 4 * sd
    assert not any(n.outlier for r in dirty for n in r.numbers if n.role == "given")
    for c, d in zip(clean, dirty):
        assert c.template == d.template
        if not any(n.outlier for n in d.numbers):
            assert c.text == d.text
        for cn, dn in zip(c.numbers, d.numbers):
            assert dn.base_value == cn.value
            if dn.outlier:  # v * F with 2 <= F <= 1e4, up to the rounding of the template's format
                assert 2 * cn.value - 0.51 <= dn.value <= 1e4 * cn.value + 0.51
            else:
                assert dn.value == cn.value
    factors = np.array([n.value / n.base_value for n in targets if n.outlier])
    assert np.median(factors) > 3  # Pareto(1) from 2: median 4


def test_extrapolation_values_lie_outside_the_training_range():
    lo, hi = 1, 99
    records = D.domain_b_records(400, 6, value_range=(lo, hi), extrapolate=True, extrapolation_range=(200, 5000))
    assert {r.template for r in records} == {"copy", "scaled"}
    values = [n.value for r in records for n in r.numbers]
    assert all(200 <= v <= 5000 and v > hi for v in values)
    with pytest.raises(ValueError):
        D.domain_b_records(5, 0, value_range=(1, 99), extrapolate=True, extrapolation_range=(50, 500))


def test_batch_order_is_a_function_of_its_arguments_and_covers_each_epoch():
    batches = B.batch_order(10, 3, 7, seed=2)
    assert [b.tolist() for b in batches] == [b.tolist() for b in B.batch_order(10, 3, 7, seed=2)]
    assert [b.tolist() for b in batches] != [b.tolist() for b in B.batch_order(10, 3, 7, seed=3)]
    assert len(batches) == 7 and all(len(b) == 3 for b in batches)
    epoch0 = np.concatenate(batches[:3])  # 3 full batches per epoch of 10 (one item dropped)
    assert len(set(epoch0.tolist())) == 9
    assert np.array_equal(epoch0, np.random.default_rng([2, 0]).permutation(10)[:9])


# ---------------------------------------------------------------------------------------------
# The pretrained base and its cache
# ---------------------------------------------------------------------------------------------


def _tiny_tokenizer():
    from causalqwen.app.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_cache_round_trip_is_bit_identical_and_does_not_retrain(tmp_path):
    before = dict(D.PRETRAIN_COUNTS)
    first, tokenizer = D.pretrained_base(cache_dir=tmp_path, **SMALL)
    assert D.PRETRAIN_COUNTS["trained"] == before.get("trained", 0) + 1
    path = D.pretrained_base_path(tmp_path, **SMALL)
    assert (path / "model.safetensors").is_file() and (path / "pretrain_record.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary directory left
    stamps = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}

    second, tokenizer2 = D.pretrained_base(cache_dir=tmp_path, **SMALL)
    assert D.PRETRAIN_COUNTS["trained"] == before.get("trained", 0) + 1  # loaded, not trained
    assert D.PRETRAIN_COUNTS["loaded"] == before.get("loaded", 0) + 1
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == stamps  # nothing rewritten
    assert second is not first
    one, two = first.state_dict(), second.state_dict()
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert tokenizer("The cow eats grass.")["input_ids"] == tokenizer2("The cow eats grass.")["input_ids"]
    with torch.no_grad():  # a fresh copy: changing one leaves the next call's untouched
        first.lm_head.weight.zero_()
    third, _ = D.pretrained_base(cache_dir=tmp_path, **SMALL)
    assert torch.equal(third.lm_head.weight, two["lm_head.weight"])
    assert third.config.tie_word_embeddings and third.lm_head.weight is third.model.embed_tokens.weight

    record = D.pretrain_record(tmp_path, **SMALL)
    assert record["settings"]["steps"] == SMALL["steps"]
    assert record["held_out_loss_after"] < record["held_out_loss_before"]
    assert D.pretrained_base_path(tmp_path, **{**SMALL, "seed": 1}) != path


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_a_first_call_under_an_evaluation_context_pretrains(tmp_path, small_base, context):
    """An empty cache whose first caller evaluates (V3 does, under no_grad) still pretrains, to the same weights."""
    model, _, _ = small_base
    with context():
        again, _ = D.pretrained_base(cache_dir=tmp_path, **SMALL)
    one, two = model.state_dict(), again.state_dict()
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_pretraining_is_deterministic_per_seed(tmp_path, small_base):
    model, _, _ = small_base
    again, _ = D.pretrained_base(cache_dir=tmp_path, **SMALL)  # trained anew in another directory
    one, two = model.state_dict(), again.state_dict()
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_starting_point_is_the_base_its_tokenizer_and_a_numeric_tokenizer_of_its_own(small_base):
    model, qwen_tokenizer, cache = small_base
    base, tokenizer, numeric = D.pretrained_starting_point(cache_dir=cache, **SMALL)
    one, two = model.state_dict(), base.state_dict()
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert tokenizer.get_vocab() == qwen_tokenizer.get_vocab()
    assert isinstance(numeric, NumericTokenizer)
    assert len(numeric.hf_tokenizer) == len(tokenizer) + 1  # its own copy gained <NUM>; the base's stays plain
    text = "The harvest was good this year"
    assert numeric.hf_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_pretrain_loss_a_is_the_token_mean_cross_entropy(small_base):
    model, tokenizer, _ = small_base
    texts = A.domain_a_texts(3, 9)
    total, count = 0.0, 0
    for text in texts:  # one text at a time, no padding: an independent computation
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].double()
        total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    assert D.pretrain_loss_a(model, tokenizer, texts, batch_size=2) == pytest.approx(total / count, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Qwen-side fine-tuning
# ---------------------------------------------------------------------------------------------


def _batch(tokenizer, texts):
    return B.collate_rows(B.encode_qwen_rows(tokenizer, texts), tokenizer.pad_token_id)


@pytest.mark.parametrize("variant", ["head", "adapter", "lora"])
def test_variants_start_at_the_base_logits_with_the_stated_parameter_count(small_base, variant):
    base, tokenizer, _ = small_base
    model, n_trainable = Q.finetune_qwen(
        base, tokenizer, ["x"], variant, steps=0, batch_size=1, learning_rate=1e-3, seed=0, lora_rank=4
    )
    vocab, hidden = base.lm_head.weight.shape
    adapter = 2 * hidden * hidden + 2 * hidden
    expected = {"head": vocab * hidden + vocab + adapter, "adapter": adapter}.get(variant)
    if variant == "lora":
        layers = {name: m for name, m in base.model.named_modules() if name.split(".")[-1] in Q.LORA_TARGETS}
        assert len(layers) == 7 * base.config.num_hidden_layers
        expected = vocab * hidden + vocab + adapter + sum(4 * (m.in_features + m.out_features) for m in layers.values())
    assert n_trainable == expected
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    batch = _batch(tokenizer, D.domain_b_texts(4, 0))
    with torch.no_grad():
        want = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(got, want)


def test_finetuning_trains_only_its_parameters_and_leaves_the_base_alone(small_base):
    base, tokenizer, _ = small_base
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    texts = D.domain_b_texts(32, 0)
    model, _ = Q.finetune_qwen(base, tokenizer, texts, "head", steps=12, batch_size=8, learning_rate=1e-2, seed=0)
    again, _ = Q.finetune_qwen(base, tokenizer, texts, "head", steps=12, batch_size=8, learning_rate=1e-2, seed=0)
    assert all(torch.equal(v, reference[k]) for k, v in base.state_dict().items())
    backbone = model.backbone.state_dict()
    assert all(torch.equal(backbone[k], reference["model." + k]) for k in backbone)  # frozen
    assert not torch.equal(model.lm_head.weight, reference["lm_head.weight"])
    assert len(model.train_losses) == 12 and model.train_losses[-1] < model.train_losses[0]
    assert model.train_losses == again.train_losses  # deterministic
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


# ---------------------------------------------------------------------------------------------
# Metric definitions
# ---------------------------------------------------------------------------------------------


def _ece_oracle(confidence, correct, bins=15):
    total, n = 0.0, len(confidence)
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = [i for i in range(n) if (lo <= confidence[i] < hi) or (b == bins - 1 and confidence[i] == 1.0)]
        if inside:
            accuracy = sum(correct[i] for i in inside) / len(inside)
            mean_confidence = sum(confidence[i] for i in inside) / len(inside)
            total += len(inside) / n * abs(accuracy - mean_confidence)
    return total


def test_calibration_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    for size in (1, 7, 500):
        confidence = rng.uniform(0, 1, size)
        confidence[: size // 3] = np.round(confidence[: size // 3] * 15) / 15  # values on bin edges
        confidence[0] = 1.0
        correct = (rng.uniform(0, 1, size) < confidence).astype(float)
        ece, brier = E.calibration(confidence, correct)
        assert ece == pytest.approx(_ece_oracle(list(confidence), list(correct)), abs=1e-12)
        assert brier == pytest.approx(float(np.mean((confidence - correct) ** 2)), abs=1e-12)
    assert E.calibration([0.9, 0.9], [1, 1]) == pytest.approx((0.1, 0.01))
    assert E.calibration([], []) == (0.0, 0.0)


def test_error_summary_matches_numpy():
    predicted = np.array([1.0, np.nan, 5.0, 10.0, np.nan])
    truth = np.array([2.0, 3.0, 5.5, 4.0, 1.0])
    summary = E.error_summary(predicted, truth)
    errors = np.array([1.0, 0.5, 6.0])
    assert summary["n"] == 5 and summary["unparseable"] == 2
    assert summary["mae"] == pytest.approx(errors.mean()) and summary["mdae"] == pytest.approx(np.median(errors))
    assert summary["mdae_strict"] == pytest.approx(np.median([1.0, 0.5, 6.0, np.inf, np.inf]))


class _OracleQwen(nn.Module):
    """Logit ``big`` for the token that follows the input prefix in one of the known rows, 0 elsewhere."""

    def __init__(self, rows, vocab, big=10.0):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(vocab_size=vocab)
        self.big = big
        self.next = {tuple(row[: i + 1]): row[i + 1] for row in rows for i in range(len(row) - 1)}

    def forward(self, input_ids, attention_mask=None, **_):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for b, row in enumerate(input_ids.tolist()):
            for i in range(len(row)):
                token = self.next.get(tuple(row[: i + 1]))
                if token is not None:
                    logits[b, i, token] = self.big
        return SimpleNamespace(logits=logits)


_TAGS = ["Kilo", "Lima", "Mike", "Oscar", "Papa", "Quebec", "Romeo", "Sierra", "Tango", "Uniform", "Victor", "Whiskey"]


def _tagged(records):
    """The records with a different first word each, so that no two texts share a prefix (the oracle's key)."""
    tagged = []
    for tag, record in zip(_TAGS, records):
        shift = len(tag) + 1
        numbers = tuple(dataclasses.replace(n, start=n.start + shift, end=n.end + shift) for n in record.numbers)
        tagged.append(dataclasses.replace(record, text=f"{tag} {record.text}", numbers=numbers))
    return tagged


def test_evaluate_qwen_on_a_model_that_knows_the_texts(small_base):
    _, tokenizer, _ = small_base
    records = _tagged(D.domain_b_records(12, 8))
    vocab = 704
    rows = B.encode_qwen_rows(tokenizer, [r.text for r in records])
    assert len({row[0] for row in rows}) == len(rows)
    perfect = _OracleQwen(rows, vocab)
    result = E.evaluate_qwen(perfect, tokenizer, records, batch_size=5)
    confidence = math.exp(10) / (math.exp(10) + vocab - 1)
    assert result["text_accuracy"] == 1.0 and result["number_onset_accuracy"] == 1.0
    assert result["ece"] == pytest.approx(1 - confidence, rel=1e-4)  # float32 softmax
    assert result["brier"] == pytest.approx((1 - confidence) ** 2, rel=1e-4)
    assert result["n_numbers"] == sum(len(r.numbers) for r in records)
    assert result["mae"] == 0.0 and result["unparseable"] == 0
    assert result["target_n"] == sum(n.role == "target" for r in records for n in r.numbers)

    # the same model told other targets: each text's last number replaced by a known guess
    guesses = [n.value + 3 if n.role == "target" else n.value for r in records for n in r.numbers]
    answers = []
    for r in records:  # the last number of every template is its target
        last = r.numbers[-1]
        guess = f"{last.value + 3:.1f}" if r.template == "price" else str(int(last.value) + 3)
        answers.append(r.text[: last.start] + guess + r.text[last.end :])
    told = _OracleQwen(B.encode_qwen_rows(tokenizer, answers), vocab)
    result = E.evaluate_qwen(told, tokenizer, records)
    truth = np.array([n.value for r in records for n in r.numbers])
    errors = np.abs(np.array(guesses, dtype=np.float32).astype(np.float64) - truth)
    assert result["mae"] == pytest.approx(errors.mean(), abs=1e-4)
    assert result["mdae"] == pytest.approx(np.median(errors), abs=1e-4)
    assert result["target_mae"] == pytest.approx(3.0, abs=1e-4)

    blank = _OracleQwen([], vocab)  # uniform softmax: argmax is id 0, "!"
    result = E.evaluate_qwen(blank, tokenizer, records)
    assert result["text_accuracy"] == 0.0 and result["number_onset_accuracy"] == 0.0
    assert result["ece"] == pytest.approx(1 / vocab) and result["brier"] == pytest.approx(1 / vocab**2)
    assert result["unparseable"] == result["n_numbers"] and math.isnan(result["mae"])
    assert result["mdae_strict"] == math.inf


def _rigged_causal(base, numeric_tokenizer, winner: int, value: float):
    """A CausalQwen whose every decision is ``winner`` with P ~ 1 and every loc_Y is ``value``."""
    model = CausalQwenForCausalLM.from_qwen(base, num_token_id=numeric_tokenizer.num_token_id).eval()
    head = model.action
    with torch.no_grad():
        head.classification_head.weight.zero_()
        head.classification_head.bias.zero_()
        head.classification_head.bias[winner] = 200.0  # loc_S = 200 > C = 100, scale_S = eps: P = 1 - tiny
        head.regression_head.weight.zero_()
        head.regression_head.bias.fill_(value)
    return model


def test_evaluate_causal_on_rigged_models(small_base):
    base, _, _ = small_base
    numeric = NumericTokenizer(_tiny_tokenizer())
    records = D.domain_b_records(15, 9)
    lengths = [len(numeric.encode(r.text)[0]) + 1 for r in records]  # + EOS
    text_targets = sum(lengths) - len(records) - sum(len(r.numbers) for r in records)

    model = _rigged_causal(base, numeric, numeric.num_token_id, 42.0)
    result = E.evaluate_causal(model, numeric, records, batch_size=4)
    truth = np.array([n.value for r in records for n in r.numbers])
    assert result["text_positions"] == text_targets and result["number_positions"] == len(truth)
    assert result["number_onset_accuracy"] == 1.0 and result["text_accuracy"] == 0.0
    assert result["ece"] == pytest.approx(1.0, abs=1e-6) and result["brier"] == pytest.approx(1.0, abs=1e-6)
    assert result["mae"] == pytest.approx(np.mean(np.abs(42.0 - truth)))
    assert result["mdae"] == pytest.approx(np.median(np.abs(42.0 - truth)))
    assert result["unparseable"] == 0

    model = _rigged_causal(base, numeric, numeric.eos_token_id, 0.0)  # right only where the target is EOS
    result = E.evaluate_causal(model, numeric, records, max_decision_elements=1000)
    assert result["text_accuracy"] == pytest.approx(len(records) / text_targets)
    assert result["number_onset_accuracy"] == 0.0


def test_evaluate_causal_agrees_with_the_model_forward(small_base):
    """On an untrained CausalQwen: the metrics equal those recomputed from ``model(**batch)`` decisions,
    and do not depend on batching or on the decision chunk size."""
    base, _, _ = small_base
    numeric = NumericTokenizer(_tiny_tokenizer())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CausalQwenForCausalLM.from_qwen(base, num_token_id=numeric.num_token_id).eval()
    records = D.domain_b_records(6, 10)
    result = E.evaluate_causal(model, numeric, records)
    chunked = E.evaluate_causal(model, numeric, records, batch_size=2, max_decision_elements=705 * 3)
    for key in ("text_accuracy", "ece", "brier", "mae", "mdae", "number_onset_accuracy"):
        assert chunked[key] == pytest.approx(result[key], rel=1e-5, abs=1e-6)

    correct, confidence, values = [], [], []
    for record in records:  # one text at a time through the full forward
        ids, vals = numeric.encode(record.text)
        ids, vals = torch.tensor([ids + [numeric.eos_token_id]]), torch.tensor([vals + [0.0]])
        with torch.no_grad():
            out = model(input_ids=ids, numeric_values=vals)
        loc, scale = out.loc_S[0].double(), out.scale_S[0].double()
        threshold = float(model.ovr_threshold)  # from_qwen's, computed from the base (decision D14)
        p = 0.5 - torch.atan((threshold - loc) / scale) / math.pi  # P(S_k > C), Cauchy survival, float64
        for i in range(ids.shape[1] - 1):
            target = int(ids[0, i + 1])
            k = int(p[i].argmax())
            if target == numeric.num_token_id:
                values.append(float(out.loc_Y[0, i]))
            else:
                correct.append(k == target)
                confidence.append(float(p[i, k]))
    truth = np.array([n.value for r in records for n in r.numbers])
    assert result["text_accuracy"] == pytest.approx(np.mean(correct))
    ece, brier = E.calibration(confidence, correct)
    assert result["ece"] == pytest.approx(ece, abs=1e-4) and result["brier"] == pytest.approx(brier, abs=1e-4)
    assert result["mae"] == pytest.approx(np.mean(np.abs(np.array(values) - truth)), rel=1e-5)


def test_both_evaluators_score_the_same_text_targets(small_base):
    """Qwen's tokens outside number spans = CausalQwen's non-<NUM> tokens, text by text."""
    _, tokenizer, _ = small_base
    numeric = NumericTokenizer(_tiny_tokenizer())
    for record in D.domain_b_records(60, 11) + D.domain_b_records(20, 11, extrapolate=True):
        encoded = tokenizer(record.text, add_special_tokens=False, return_offsets_mapping=True)
        spans = [(n.start, n.end) for n in record.numbers]
        qwen_text = [
            i
            for i, (s, e) in zip(encoded["input_ids"], encoded["offset_mapping"])
            if not any(s < b and e > a for a, b in spans)
        ]
        causal_text = [i for i in numeric.encode(record.text)[0] if i != numeric.num_token_id]
        assert qwen_text == causal_text


def test_evaluators_run_on_the_real_models(small_base):
    base, tokenizer, _ = small_base
    records = D.domain_b_records(10, 12)
    qwen = E.evaluate_qwen(base, tokenizer, records)
    numeric = NumericTokenizer(_tiny_tokenizer())
    causal = E.evaluate_causal(
        CausalQwenForCausalLM.from_qwen(base, num_token_id=numeric.num_token_id), numeric, records
    )
    for key in ("text_positions", "n_numbers", "target_n"):
        assert qwen[key] == causal[key]
    assert set(qwen["by_group"]) == set(causal["by_group"])
    assert 0 <= qwen["text_accuracy"] <= 1 and 0 <= causal["text_accuracy"] <= 1
