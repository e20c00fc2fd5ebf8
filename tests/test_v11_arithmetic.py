"""V11 (validation/v11_arithmetic.py, validation/arithmetic_problems.py): the shipped data, the Number Token Loss
term, CausalQwen's answer."""

import math

import pytest
import torch

from causalqwen.app.tiny import build_tiny_base, build_tiny_causal_lm
from causalqwen.numbers import find_numbers
from validation.arithmetic_problems import (
    Problem,
    exact_causal,
    exact_qwen,
    load_problems,
    select,
)
from validation.make_arithmetic_data import COUNTS, answer_is_one_number
from validation.v11_arithmetic import NumberTokenLossTerm, causal_answers

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the studies run with one thread


@pytest.fixture(scope="module")
def data():
    return load_problems()


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return build_tiny_base(seed=0)[1]


# ---- the shipped data ----


def test_data_counts_match_the_generator(data):
    header, problems = data
    for (split, module), wanted in COUNTS.items():
        assert sum(p.split == split and p.module == module for p in problems) == wanted
        assert header["counts"][f"{split}/{module}"]["kept"] == wanted
    assert header["source"] == "mathematics-dataset==1.0.1"


def test_every_answer_is_one_number_of_the_grammar(data):
    for problem in data[1]:
        assert answer_is_one_number(problem.answer), problem
        assert math.isfinite(problem.value32)
        # the answer's value as the grammar reads it is the float32 nearest the exact decimal
        assert problem.value32 == float(torch.tensor(problem.value, dtype=torch.float32))
        assert len(find_numbers(problem.question)) == 2, problem
        # in the full text: the two operands, then the answer, the last number, spanning to the end
        found = find_numbers(problem.text)
        assert len(found) == 3 and found[-1].end == len(problem.text) and found[-1].text == problem.answer


def test_evaluation_questions_are_not_in_training(data):
    problems = data[1]
    training = {p.question for p in select(problems, "train")}
    for split in ("interpolate", "extrapolate"):
        held_out = select(problems, split)
        assert held_out and not training & {p.question for p in held_out}


def test_the_tiny_tokenizer_encodes_every_text(data, tiny_tokenizer):
    texts = [p.text for p in data[1]]
    encoded = tiny_tokenizer(texts, add_special_tokens=False)["input_ids"]
    unknown = tiny_tokenizer.unk_token_id
    for text, ids in zip(texts, encoded):
        assert unknown not in ids
        assert tiny_tokenizer.decode(ids) == text
    for digit in "0123456789":  # one token per digit: what the digit-level NTL scores
        assert tiny_tokenizer.convert_tokens_to_ids(digit) != unknown


# ---- the Number Token Loss term (ntloss, the authors' package) ----


def _digit_ids(tokenizer):
    return torch.tensor([tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])


def _expected_ntl(logits, labels, digit_ids):
    """The Wasserstein NTL computed here from its definition (position i against labels[i+1]): at a digit target
    d*, W1 = sum_i q_i |i - d*| with q the softmax over the ten digit logits, reweighed by the digit mass m as
    m * W1 + 1.01 * 9 * (1 - m); the mean over the digit targets."""
    digit_value = {int(t): v for v, t in enumerate(digit_ids.tolist())}
    terms = []
    for b in range(labels.shape[0]):
        for i in range(labels.shape[1] - 1):
            target = int(labels[b, i + 1])
            if target not in digit_value:
                continue
            q = torch.softmax(logits[b, i, digit_ids].double(), dim=0)
            w1 = sum(float(q[k]) * abs(k - digit_value[target]) for k in range(10))
            m = float(torch.softmax(logits[b, i].double(), dim=0)[digit_ids].sum())
            terms.append(m * w1 + 1.01 * 9 * (1 - m))
    return sum(terms) / len(terms)


def test_ntl_term_matches_its_definition_and_is_differentiable(tiny_tokenizer):
    vocab = 64 + len(tiny_tokenizer)  # the model may have more rows than the tokenizer
    term = NumberTokenLossTerm(tiny_tokenizer, vocab, weight=0.3)
    digits = _digit_ids(tiny_tokenizer)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, vocab, generator=generator, requires_grad=True)
    labels = torch.tensor(
        [
            [5, int(digits[3]), int(digits[7]), 8, int(digits[0]), -100],
            [int(digits[9]), 4, int(digits[1]), -100, -100, -100],
        ]
    )
    value = term(logits, labels)
    assert value.ndim == 0 and torch.isfinite(value)
    assert float(value.detach()) == pytest.approx(0.3 * _expected_ntl(logits.detach(), labels, digits), rel=1e-5)
    assert term.values[-1] == pytest.approx(float(value.detach()) / 0.3, rel=1e-6)
    value.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    assert logits.grad[:, -1].abs().sum() == 0  # the last position predicts nothing


def test_ntl_term_is_zero_with_all_mass_on_the_right_digit_and_grows_with_distance(tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    term = NumberTokenLossTerm(tiny_tokenizer, vocab, weight=1.0)
    digits = _digit_ids(tiny_tokenizer)
    labels = torch.tensor([[0, int(digits[4])]])

    def loss_when_predicting(digit: int) -> float:
        logits = torch.full((1, 2, vocab), -30.0)
        logits[0, 0, digits[digit]] = 30.0
        return float(term(logits, labels))

    assert loss_when_predicting(4) == pytest.approx(0.0, abs=1e-6)
    assert loss_when_predicting(5) == pytest.approx(1.0, abs=1e-5)  # |5 - 4|: unlike cross-entropy, 3 is closer than 9
    assert loss_when_predicting(9) == pytest.approx(5.0, abs=1e-5)
    no_digit = torch.full((1, 2, vocab), -30.0)
    no_digit[0, 0, 7] = 30.0  # all mass on a text token: worse than any digit (1.01 * 9)
    assert float(term(no_digit, labels)) == pytest.approx(1.01 * 9, rel=1e-4)


# ---- CausalQwen's answer ----


def test_causal_answer_is_loc_y_before_the_answer_num():
    torch.manual_seed(0)
    tiny = build_tiny_causal_lm(seed=0, init_seed=0, gate_alpha=1.0)
    problems = [
        Problem("interpolate", "mul", "What is 3 times -2.5?", "-7.5"),
        Problem("extrapolate", "add_or_sub_big", "Work out 123456 - -0.25 and more words here.", "123456.25"),
    ]
    answers = causal_answers(tiny.model, tiny.tokenizer, problems, batch_size=2)  # padded together
    num_id = tiny.tokenizer.num_token_id
    for problem, answer in zip(problems, answers):
        ids, values = tiny.tokenizer.encode(problem.text)
        answer_at = max(i for i, t in enumerate(ids) if t == num_id)  # found independently: the value is the answer's
        assert values[answer_at] == pytest.approx(problem.value32)
        with torch.no_grad():
            loc_y = tiny.model(torch.tensor([ids]), torch.tensor([values])).loc_Y[0]  # [S], one text, no padding
        assert answer == pytest.approx(float(loc_y[answer_at - 1]), rel=1e-5, abs=1e-6)
        assert abs(float(loc_y[answer_at - 2]) - answer) > 1e-4  # the neighbour differs: the position matters


def test_exact_match_rules():
    problem = Problem("interpolate", "mul", "What is 2 times 2.5?", "5.0")
    assert exact_causal(5.04, problem) and not exact_causal(5.06, problem)
    assert exact_qwen(5.0, problem) and not exact_qwen(float("nan"), problem)
    integer = Problem("interpolate", "add_or_sub", "What is 2 + 3?", "5")
    assert exact_causal(4.6, integer) and not exact_causal(4.4, integer)
