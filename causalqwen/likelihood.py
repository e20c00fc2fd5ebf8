r"""The probability of a text under CausalQwen, numbers scored as written (decision D16; docs: likelihood.md).

A continuation $x_{n..m}$ after a context $x_{<n}$ is scored term by term, teacher-forced, from the law the
model decides by in the ``standard`` mode (the noise-infused marginal over $U$):

$$
\log P(x_{n..m} \mid x_{<n}) = \sum_{i=n}^{m} \log q_{x_i}(i) \;+
\sum_{i:\ x_i = \langle NUM\rangle} \log P\big(v_i - \tfrac{h_i}{2} < Y_i \le v_i + \tfrac{h_i}{2}\big),
\qquad Y_i \sim \mathrm{Cauchy}(\mathrm{loc}_{Y}(i), \mathrm{scale}_{Y}(i)),
$$

where $q(i)$ is the token distribution at the position before $x_i$, $v_i$ the value of the number as written
and $h_i = 10^{k_i}$ its resolution (`causalqwen.writing.resolution_exponent`: ``2.5`` → $k = -1$). The number
term is the probability of every real that the literal stands for, so the probability of ``"2.5"`` and of
``"2.50"`` differ, and over all literals at one resolution (disjoint intervals covering the line) the terms
add up to at most $q_{\langle NUM\rangle}$: a probability, unlike the density $f_Y(v)$, which has units and
can exceed 1. As $h \to 0$, $\log P(\cdot) - \log h \to \log f_Y(v)$, the negative of the training loss's
regression term.

The token distribution $q$ (``token_probability``):

* ``"ovr"`` (default): $q_k = P_k / \sum_j P_j$, the One-vs-Rest probabilities $P_k = P(S_k > C_k)$ the model
  is trained on and decides by, normalised over the vocabulary; computed as $\log P_k -
  \operatorname{logsumexp}_j \log P_j$ from the stable tails (`causalqwen.action.ovr_log_probability`).
* ``"softmax"``: $q = \mathrm{softmax}(\mathrm{loc}_S)$, the ``traditional`` mode's distribution. At
  initialization $\mathrm{loc}_S$ equals Qwen's logits, so on text without numbers this equals Qwen's own
  log-likelihood (the test against the real Qwen2); it ignores the scales, which are the model's uncertainty.

Both are distributions over the same vocabulary as Qwen's softmax, so sums of terms are log-probabilities of
the same text and compare with Qwen's in nats and in bits per byte.

The evaluation perplexity in bits per byte (`bits_per_byte`) of texts $x^{(1)}, \dots, x^{(n)}$ is

$$
\mathrm{bpb} = \frac{-\sum_t \log_2 P(x^{(t)})}{\sum_t \lvert x^{(t)} \rvert_{\mathrm{UTF\text{-}8}}},
$$

each text scored whole by `score_text` and measured in UTF-8 bytes: a unit that does not depend on the tokenizer,
so CausalQwen (a number is one ``<NUM>`` and its interval) and Qwen (a number is digit tokens) compare on the same
texts.
"""

from __future__ import annotations

import math
import numbers
from decimal import MAX_EMAX, MIN_EMIN, Decimal, localcontext
from typing import NamedTuple

import torch
from torch import Tensor

from . import cauchy
from .action import ovr_log_probability, ovr_token
from .numbers import find_numbers, shown_literal
from .writing import resolution_exponent

__all__ = [
    "TOKEN_PROBABILITIES",
    "SequenceScore",
    "bits_per_byte",
    "token_log_probabilities",
    "number_log_probability",
    "score_continuation",
    "score_text",
    "split_context",
    "keep_last",
]

TOKEN_PROBABILITIES = ("ovr", "softmax")


class SequenceScore(NamedTuple):
    """The score of a continuation: ``log_likelihood`` (nats, the sum of ``terms``), ``is_greedy`` (every
    token is the standard mode's decision, and every number's predicted value $\\mathrm{loc}_Y$ rounds to it
    as written), ``terms`` (one per continuation token, float64, the number term included at ``<NUM>``)."""

    log_likelihood: float
    is_greedy: bool
    terms: list[float]


def check_token_probability(token_probability) -> str:
    """``"ovr"`` or ``"softmax"``; anything else is a ``ValueError`` naming it."""
    if token_probability not in TOKEN_PROBABILITIES:
        raise ValueError(f'token_probability must be "ovr" or "softmax", got {token_probability!r}')
    return token_probability


def token_log_probabilities(loc_S: Tensor, scale_S: Tensor, threshold, token_probability: str = "ovr") -> Tensor:
    r"""$\log q_k$ for every class, ``[..., V]`` float64: $\log P_k - \operatorname{logsumexp}_j \log P_j$
    (``"ovr"``) or $\log\mathrm{softmax}(\mathrm{loc}_S)$ (``"softmax"``)."""
    if check_token_probability(token_probability) == "softmax":
        return torch.log_softmax(loc_S.double(), dim=-1)
    log_p, _ = ovr_log_probability(loc_S.double(), scale_S.double(), threshold)  # [..., V]
    return log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)


def number_log_probability(literal: str, loc_Y, scale_Y) -> Tensor:
    r"""$\log P(v - h/2 < Y \le v + h/2)$ for the literal as written (value $v$, resolution $h = 10^k$),
    float64, of the shape of ``loc_Y`` and ``scale_Y`` broadcast.

    The ends are never rounded: a literal may hold more digits than float64 (``"1234567.123456789012345"``,
    whose $v \pm h/2$ are one float64) and state any resolution (``"0.1"`` and 400 zeros: $10^{-401}$). Exact
    decimal arithmetic forms the ends' distances to the location, $d_{a,b} = (v - \mu) \mp h/2$ (the first
    difference with every digit, the second rounded once to 40 digits), and
    `causalqwen.cauchy.log_interval_prob_reduced` takes their signs and logarithms with $\log h = k \ln 10$:
    one arctangent on one side of the location, stable far in the tails and for an $h$ tiny beside $v$.

    Raises:
        TypeError: ``literal`` is not a str.
        ValueError: ``literal`` is not one number of the grammar; its resolution is beyond exact decimal
            arithmetic ($|k| > 10^{17}$, only a zero such as ``"0e999999999999999999"``); ``loc_Y`` is NaN or
            infinite or ``scale_Y`` is not a finite number $> 0$. Each message names the input.
    """
    value, exponent = _value_and_exponent(literal)
    loc_Y = torch.as_tensor(loc_Y, dtype=torch.float64).detach().cpu()
    scale_Y = torch.as_tensor(scale_Y, dtype=torch.float64).detach().cpu()
    if not bool(loc_Y.isfinite().all()):
        raise ValueError(
            f"loc_Y must be finite everywhere to score the number {literal!r}, got "
            f"{loc_Y[~loc_Y.isfinite()].flatten()[0].item()!r}"
        )
    if not bool((scale_Y.isfinite() & (scale_Y > 0)).all()):
        bad = scale_Y[~(scale_Y.isfinite() & (scale_Y > 0))].flatten()[0].item()
        raise ValueError(f"scale_Y must be a finite number > 0 everywhere to score the number {literal!r}, got {bad!r}")
    loc_Y, scale_Y = torch.broadcast_tensors(loc_Y, scale_Y)
    ends = [_end_distances(value, exponent, loc) for loc in loc_Y.flatten().tolist()]
    sign_low, log_low, sign_high, log_high = (
        torch.tensor([end[i] for end in ends], dtype=torch.float64).reshape(loc_Y.shape) for i in range(4)
    )
    log_width = torch.full(loc_Y.shape, exponent * _LOG_10, dtype=torch.float64)
    log_scale = torch.log(scale_Y)
    return cauchy.log_interval_prob_reduced(sign_low, log_low, sign_high, log_high, log_width, log_scale)


_LOG_10 = math.log(10.0)
# |k| of a resolution 10^k that decimal arithmetic holds (its exponents stop near 10^18)
_EXPONENT_LIMIT = 10**17
_ROUNDED_DIGITS = 40  # the distances d = (v - mu) -/+ h/2, rounded once: far more than float64's 17


def _value_and_exponent(literal: str) -> tuple[Decimal, int]:
    """The literal's exact value as written (a decimal with no trailing zeros) and the exponent k of its
    resolution.

    Raises:
        ValueError: not one number of the grammar, or ``|k| > 10^17`` (named)."""
    exponent = resolution_exponent(literal)  # the door: one number of the grammar
    if abs(exponent) > _EXPONENT_LIMIT:
        # str() of an int stops at 4300 digits
        shown = f"10^{exponent}" if abs(exponent) < 10**40 else "10^k with |k| > 10^40"
        raise ValueError(
            f"the number {shown_literal(literal)} states the resolution {shown}, beyond exact "
            "decimal arithmetic (|k| <= 10^17): it cannot be scored"
        )
    negative = literal[0] in "-\u2212"  # a number of the grammar: a sign is its first character
    magnitude = Decimal(literal.lstrip("-\u2212").replace(",", ""))  # exact: the constructor does not round
    if magnitude == 0:
        return Decimal(0), exponent
    with localcontext() as context:
        context.prec = len(magnitude.as_tuple().digits)  # every digit: no rounding
        context.Emax, context.Emin = MAX_EMAX, MIN_EMIN
        magnitude = magnitude.normalize()  # trailing zeros dropped, so the exponent is that of the last digit
    return (-magnitude if negative else magnitude), exponent


def _end_distances(value: Decimal, exponent: int, loc: float) -> tuple[float, float, float, float]:
    r"""``(sign, log|d|)`` of $d_a = (v - \mu) - h/2$ and of $d_b = (v - \mu) + h/2$, $h = 10^k$: $v - \mu$
    with every digit (a float64 is a binary fraction, so $\mu$ is an exact decimal), then each end rounded
    once."""
    mu = Decimal(loc)
    with localcontext() as context:
        context.Emax, context.Emin = MAX_EMAX, MIN_EMIN
        highest = max(value.adjusted(), mu.adjusted())
        lowest = min(value.as_tuple().exponent, mu.as_tuple().exponent)
        context.prec = highest - lowest + 2
        offset = value - mu  # exact
        context.prec = _ROUNDED_DIGITS
        half = Decimal(5).scaleb(exponent - 1)
        ends = (offset - half, offset + half)
        result = []
        for distance in ends:
            if distance == 0:
                result += [0.0, -math.inf]
                continue
            leading = distance.adjusted()
            mantissa = float(abs(distance).scaleb(-leading))  # in [1, 10)
            result += [1.0 if distance > 0 else -1.0, math.log(mantissa) + leading * _LOG_10]
    return tuple(result)


def split_context(tokenizer, context: str, continuation: str) -> tuple[list[int], list[float], list[str], int]:
    """Encode a context and its continuation: ``(input_ids, numeric_values, number_texts, start)``, the
    continuation's tokens from ``start`` on. Whitespace at the end of the context moves to the continuation
    (as lm-eval does); an empty context is the end-of-text token.

    The two are encoded separately and joined, so the continuation is scored as its own tokens even
    where the tokenizer would merge characters across the boundary (``"这本书的"`` + ``"价格是"``,
    ``"The dog"`` + ``"gy"``): no token is shared, none is cut. The numbers are the whole text's: each
    part must read the numbers the whole text reads in it.

    Raises:
        ValueError: the continuation is empty; a number of the whole text spans the boundary (the continuation
            splits it: ``"costs 2"`` + ``".5 dollars"``); or a part reads its numbers differently alone than
            within the whole text (``"It is 12"`` + ``"-34-56"``, a date; ``"x"`` + ``"-5"``, where ``-`` is
            no sign).
    """
    if not isinstance(context, str) or not isinstance(continuation, str):
        raise TypeError("context and continuation must be str")
    trailing = len(context) - len(context.rstrip())
    if trailing:
        context, continuation = context[:-trailing], context[-trailing:] + continuation
    if not continuation:
        raise ValueError("the continuation is empty: there is nothing to score")
    whole = context + continuation
    found = find_numbers(whole)
    for number in found:
        if number.start < len(context) < number.end:
            raise ValueError(
                f"the continuation {continuation!r} splits the number {number.text!r} of "
                f"{whole!r}: score the whole number in the continuation"
            )
    for part, offset in ((context, 0), (continuation, len(context))):
        within = [(n.start - offset, n.text) for n in found if offset <= n.start < offset + len(part)]
        if within != [(n.start, n.text) for n in find_numbers(part)]:
            raise ValueError(
                f"{part!r} reads its numbers differently alone than in {whole!r}: the context "
                "and the continuation must each read the numbers the whole text reads"
            )
    if context:
        context_ids, context_values, context_texts = tokenizer.encode(context, return_number_texts=True)
    else:
        context_ids, context_values, context_texts = [_prefix_id(tokenizer)], [0.0], []
    ids, values, texts = tokenizer.encode(continuation, return_number_texts=True)
    return context_ids + ids, context_values + values, context_texts + texts, len(context_ids)


def keep_last(
    input_ids: list[int],
    numeric_values: list[float],
    number_texts: list[str],
    start: int,
    max_length: int,
    num_token_id: int,
) -> tuple[list[int], list[float], list[str], int]:
    """The last ``max_length`` tokens of an encoded text whose tokens ``start ..`` are scored: the context
    loses its first tokens (and their numbers' texts), as lm-eval's models cut a context on the left.

    Raises:
        ValueError: the scored tokens alone (with one token of context) are more than ``max_length``.
    """
    if len(input_ids) - start + 1 > max_length:
        raise ValueError(
            f"the continuation has {len(input_ids) - start} tokens: with one token of context "
            f"it does not fit the model's {max_length} positions"
        )
    cut = max(0, len(input_ids) - max_length)
    dropped = input_ids[:cut].count(num_token_id)
    return input_ids[cut:], numeric_values[cut:], number_texts[dropped:], start - cut


@torch.no_grad()
def score_continuation(
    model,
    input_ids: list[int],
    numeric_values: list[float],
    number_texts: list[str],
    start: int,
    token_probability: str = "ovr",
) -> SequenceScore:
    """Score tokens ``start ..`` of one encoded text (``number_texts``: the literal of each ``<NUM>``, in
    order), each conditioned on all tokens before it. ``start >= 1``: the first token has no prediction.

    Raises:
        ValueError: ``start`` is out of range; a ``<NUM>`` has no value (NaN) or no literal; an unknown
            ``token_probability``.
    """
    check_token_probability(token_probability)
    if not 1 <= start < len(input_ids):
        raise ValueError(f"start must be in [1, {len(input_ids) - 1}] (the first token has no prediction), got {start}")
    num = model.config.num_token_id
    positions = [index for index, token in enumerate(input_ids) if token == num]
    if len(number_texts) != len(positions):
        raise ValueError(
            f"{len(positions)} <NUM> tokens but {len(number_texts)} number texts: each <NUM> "
            "needs the literal it stands for"
        )
    for index in positions:
        if numeric_values[index] != numeric_values[index]:
            raise ValueError(f"the <NUM> at position {index} has no value (NaN): encode the text with the tokenizer")
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)  # [1, S]
    out = model(ids, torch.tensor([numeric_values], dtype=torch.float32, device=device), torch.ones_like(ids))
    log_q = token_log_probabilities(
        out.loc_S[0, :-1], out.scale_S[0, :-1], model.ovr_threshold, token_probability
    )  # [S-1, V]: position i predicts token i+1
    targets = ids[0, 1:]  # [S-1]
    terms = log_q.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [S-1]
    decided = _decisions(out, model, token_probability)  # [S-1]
    literal_of = dict(zip(positions, number_texts))
    greedy = bool((decided[start - 1 :] == targets[start - 1 :]).all())
    scored = terms[start - 1 :].tolist()
    for index in positions:
        if index >= start:
            literal = literal_of[index]
            loc, scale = out.loc_Y[0, index - 1].double(), out.scale_Y[0, index - 1].double()
            scored[index - start] += number_log_probability(literal, loc, scale).item()
            sign_low, _, sign_high, _ = _end_distances(*_value_and_exponent(literal), loc.item())
            greedy &= sign_low <= 0 <= sign_high  # a <= loc_Y <= b: the predicted value rounds to the literal
    return SequenceScore(sum(scored), greedy, scored)


def _decisions(out, model, token_probability: str) -> Tensor:
    """The token each position decides, ``[S-1]``: the standard mode's OvR argmax, or the argmax of
    $\\mathrm{loc}_S$ for ``"softmax"``."""
    if token_probability == "softmax":
        return out.loc_S[0, :-1].argmax(-1)
    return ovr_token(out.loc_S[0, :-1], out.scale_S[0, :-1], model.ovr_threshold)


def score_text(model, tokenizer, text: str, token_probability: str = "ovr", max_length: int | None = None) -> float:
    """$\\log P(\\text{text})$: every token scored, the first conditioned on the end-of-text token (as
    lm-eval's rolling log-likelihood does), in windows of at most ``max_length`` tokens (default: the model's
    ``max_position_embeddings``), each window conditioned on as many tokens before it as fit.

    Raises:
        ValueError: ``text`` is not a non-empty str; ``max_length`` is not None or an int >= 2 (a window holds one
            token of context and one scored).
    """
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty str")
    max_length = _check_window(max_length, model)
    ids, values, texts = tokenizer.encode(text, return_number_texts=True)
    ids, values = [_prefix_id(tokenizer), *ids], [0.0, *values]
    total, scored_to = 0.0, 1
    while scored_to < len(ids):
        end = min(len(ids), scored_to + max_length - 1)
        begin = max(0, end - max_length)
        window_ids, window_values = ids[begin:end], values[begin:end]
        skipped = ids[:begin].count(tokenizer.num_token_id)
        count = window_ids.count(tokenizer.num_token_id)
        score = score_continuation(
            model, window_ids, window_values, texts[skipped : skipped + count], scored_to - begin, token_probability
        )
        total += score.log_likelihood
        scored_to = end
    return total


def _check_window(max_length, model) -> int:
    """``max_length`` of `score_text` and `bits_per_byte`: None (the model's ``max_position_embeddings``) or an int
    >= 2; anything else a ``ValueError`` naming it."""
    if max_length is None:
        return model.config.max_position_embeddings
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 2:
        raise ValueError(
            f"max_length must be None (the model's max_position_embeddings) or an int >= 2 (one token of context and "
            f"one scored per window), got {max_length!r}"
        )
    return int(max_length)


def _prefix_id(tokenizer) -> int:
    """The token that stands before a text scored from its start: end-of-text (or, without one, the pad
    token)."""
    prefix = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if prefix is None:
        raise ValueError(
            "the tokenizer has neither an eos nor a pad token to stand before a text scored from its start"
        )
    return prefix


def bits_per_byte(model, tokenizer, texts, token_probability: str = "ovr", max_length: int | None = None) -> float:
    r"""$-\sum_t \log_2 P(\text{texts}_t)$ over the number of UTF-8 bytes of the texts: each text scored whole by
    `score_text` (the first token conditioned on end-of-text, numbers as written), in windows of ``max_length``.

    Raises:
        ValueError: ``texts`` is not a non-empty list or tuple of non-empty strings, a text is not UTF-8 (a lone
            surrogate), an unknown ``token_probability``, or ``max_length`` as `score_text` refuses it.
    """
    check_token_probability(token_probability)
    _check_window(max_length, model)
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError(f"texts must be a non-empty list of str, got {type(texts).__name__}")
    total_bytes = 0
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise ValueError(f"texts[{index}] must be a non-empty str, got {text!r}")
        try:
            total_bytes += len(text.encode("utf-8"))
        except UnicodeEncodeError as error:
            raise ValueError(f"texts[{index}] is not UTF-8 text: {error.reason} at character {error.start}") from None
    log_likelihood = sum(score_text(model, tokenizer, text, token_probability, max_length) for text in texts)  # nats
    return -log_likelihood / math.log(2) / total_bytes
