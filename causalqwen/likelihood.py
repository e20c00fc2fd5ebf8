r"""The probability of a text under CausalQwen, numbers scored as written (decision D16; docs: likelihood.md).

A continuation $x_{n..m}$ after a context $x_{<n}$ is scored term by term, teacher-forced, from the law the model
decides by in the ``standard`` mode (the noise-infused marginal over $U$):

$$
\log P(x_{n..m} \mid x_{<n}) = \sum_{i=n}^{m} \log q_{x_i}(i) \;+
\sum_{i:\ x_i = \langle NUM\rangle} \log P\big(v_i - \tfrac{h_i}{2} < Y_i \le v_i + \tfrac{h_i}{2}\big),
\qquad Y_i \sim \mathrm{Cauchy}(\mathrm{loc}_{Y}(i), \mathrm{scale}_{Y}(i)),
$$

where $q(i)$ is the token distribution at the position before $x_i$, $v_i$ the value of the number as written
and $h_i$ its resolution (`causalqwen.writing.literal_resolution`: ``2.5`` → 0.1). The number term is the
probability of every real that the literal stands for, so the probability of ``"2.5"`` and of ``"2.50"`` differ,
and over all literals at one resolution (disjoint intervals covering the line) the terms add up to at most
$q_{\langle NUM\rangle}$: a probability, unlike the density $f_Y(v)$, which has units and can exceed 1. As
$h \to 0$, $\log P(\cdot) - \log h \to \log f_Y(v)$, the negative of the training loss's regression term.

The token distribution $q$ (``token_probability``):

* ``"ovr"`` (default): $q_k = P_k / \sum_j P_j$, the One-vs-Rest probabilities $P_k = P(S_k > C_k)$ the model is
  trained on and decides by, normalised over the vocabulary; computed as $\log P_k - \operatorname{logsumexp}_j
  \log P_j$ from the stable tails (`causalqwen.losses.ovr_log_probability`).
* ``"softmax"``: $q = \mathrm{softmax}(\mathrm{loc}_S)$, the ``traditional`` mode's distribution. At
  initialization $\mathrm{loc}_S$ equals Qwen's logits, so on text without numbers this equals Qwen's own
  log-likelihood (the test against the real Qwen2); it ignores the scales, which are the model's uncertainty.

Both are distributions over the same vocabulary as Qwen's softmax, so sums of terms are log-probabilities of the
same text and compare with Qwen's in nats and in bits per byte.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import cauchy
from .losses import ovr_log_probability
from .numbers import find_numbers, parse_number
from .writing import literal_resolution

__all__ = ["TOKEN_PROBABILITIES", "SequenceScore", "token_log_probabilities", "number_log_probability",
           "score_continuation", "score_text", "split_context", "keep_last"]

TOKEN_PROBABILITIES = ("ovr", "softmax")


class SequenceScore(NamedTuple):
    """The score of a continuation: ``log_likelihood`` (nats, the sum of ``terms``), ``is_greedy`` (every token is
    the standard mode's decision, and every number's predicted value $\\mathrm{loc}_Y$ rounds to it as written),
    ``terms`` (one per continuation token, float64, the number term included at ``<NUM>``)."""

    log_likelihood: float
    is_greedy: bool
    terms: list[float]


def check_token_probability(token_probability) -> str:
    """``"ovr"`` or ``"softmax"``; anything else is a ``ValueError`` naming it."""
    if token_probability not in TOKEN_PROBABILITIES:
        raise ValueError(f'token_probability must be "ovr" or "softmax", got {token_probability!r}')
    return token_probability


def token_log_probabilities(loc_S: Tensor, scale_S: Tensor, threshold, token_probability: str = "ovr") -> Tensor:
    r"""$\log q_k$ for every class, ``[..., V]`` float64: $\log P_k - \operatorname{logsumexp}_j \log P_j$ (``"ovr"``)
    or $\log\mathrm{softmax}(\mathrm{loc}_S)$ (``"softmax"``)."""
    if check_token_probability(token_probability) == "softmax":
        return torch.log_softmax(loc_S.double(), dim=-1)
    log_p, _ = ovr_log_probability(loc_S.double(), scale_S.double(), threshold)  # [..., V]
    return log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)


def number_log_probability(literal: str, loc_Y, scale_Y) -> Tensor:
    r"""$\log P(v - h/2 < Y \le v + h/2)$ for the literal as written (value $v$, resolution $h$), float64, by
    `causalqwen.cauchy.log_interval_prob` (stable far out in the tails)."""
    value = float(_exact_value(literal))
    half = literal_resolution(literal) / 2
    loc_Y = torch.as_tensor(loc_Y, dtype=torch.float64)
    scale_Y = torch.as_tensor(scale_Y, dtype=torch.float64)
    return cauchy.log_interval_prob(torch.tensor(value - half, dtype=torch.float64),
                                    torch.tensor(value + half, dtype=torch.float64), loc_Y, scale_Y)


def _exact_value(literal: str) -> float:
    """The literal's value as written, to float64 (its float32 value is what the model reads; the interval is the
    written one)."""
    parse_number(literal)  # the door
    negative = literal[0] in "-\u2212"
    magnitude = float(literal.lstrip("-\u2212").replace(",", ""))
    return -magnitude if negative else magnitude


def split_context(tokenizer, context: str, continuation: str) -> tuple[list[int], list[float], list[str], int]:
    """Encode a context and its continuation: ``(input_ids, numeric_values, number_texts, start)``, the
    continuation's tokens from ``start`` on. Whitespace at the end of the context moves to the continuation (as
    lm-eval does); an empty context is the end-of-text token.

    The two are encoded separately and joined, so the continuation is scored as its own tokens even where the
    tokenizer would merge characters across the boundary (``"这本书的"`` + ``"价格是"``, ``"The dog"`` + ``"gy"``): no
    token is shared, none is cut. The numbers are the whole text's: each part must read the numbers the whole text
    reads in it.

    Raises:
        ValueError: the continuation is empty; a number of the whole text spans the boundary (the continuation
            splits it: ``"costs 2"`` + ``".5 dollars"``); or a part reads its numbers differently alone than within
            the whole text (``"It is 12"`` + ``"-34-56"``, a date; ``"x"`` + ``"-5"``, where ``-`` is no sign).
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
            raise ValueError(f"the continuation {continuation!r} splits the number {number.text!r} of "
                             f"{whole!r}: score the whole number in the continuation")
    for part, offset in ((context, 0), (continuation, len(context))):
        within = [(n.start - offset, n.text) for n in found if offset <= n.start < offset + len(part)]
        if within != [(n.start, n.text) for n in find_numbers(part)]:
            raise ValueError(f"{part!r} reads its numbers differently alone than in {whole!r}: the context and the "
                             "continuation must each read the numbers the whole text reads")
    context_ids, context_values, context_texts = (tokenizer.encode(context, return_number_texts=True) if context
                                                  else ([_prefix_id(tokenizer)], [0.0], []))
    ids, values, texts = tokenizer.encode(continuation, return_number_texts=True)
    return context_ids + ids, context_values + values, context_texts + texts, len(context_ids)


def keep_last(input_ids: list[int], numeric_values: list[float], number_texts: list[str], start: int,
              max_length: int, num_token_id: int) -> tuple[list[int], list[float], list[str], int]:
    """The last ``max_length`` tokens of an encoded text whose tokens ``start ..`` are scored: the context loses its
    first tokens (and their numbers' texts), as lm-eval's models cut a context on the left.

    Raises:
        ValueError: the scored tokens alone (with one token of context) are more than ``max_length``.
    """
    if len(input_ids) - start + 1 > max_length:
        raise ValueError(f"the continuation has {len(input_ids) - start} tokens: with one token of context it does "
                         f"not fit the model's {max_length} positions")
    cut = max(0, len(input_ids) - max_length)
    dropped = input_ids[:cut].count(num_token_id)
    return input_ids[cut:], numeric_values[cut:], number_texts[dropped:], start - cut


@torch.no_grad()
def score_continuation(model, input_ids: list[int], numeric_values: list[float], number_texts: list[str],
                       start: int, token_probability: str = "ovr") -> SequenceScore:
    """Score tokens ``start ..`` of one encoded text (``number_texts``: the literal of each ``<NUM>``, in order),
    each conditioned on all tokens before it. ``start >= 1``: the first token has no prediction.

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
        raise ValueError(f"{len(positions)} <NUM> tokens but {len(number_texts)} number texts: each <NUM> needs "
                         "the literal it stands for")
    for index in positions:
        if numeric_values[index] != numeric_values[index]:
            raise ValueError(f"the <NUM> at position {index} has no value (NaN): encode the text with the tokenizer")
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)  # [1, S]
    out = model(ids, torch.tensor([numeric_values], dtype=torch.float32, device=device), torch.ones_like(ids))
    log_q = token_log_probabilities(out.loc_S[0, :-1], out.scale_S[0, :-1], model.ovr_threshold,
                                    token_probability)  # [S-1, V]: position i predicts token i+1
    targets = ids[0, 1:]  # [S-1]
    terms = log_q.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [S-1]
    decided = _decisions(out, model, token_probability)  # [S-1]
    literal_of = dict(zip(positions, number_texts))
    greedy = bool((decided[start - 1:] == targets[start - 1:]).all())
    scored = terms[start - 1:].tolist()
    for index in positions:
        if index >= start:
            literal = literal_of[index]
            loc, scale = out.loc_Y[0, index - 1].double(), out.scale_Y[0, index - 1].double()
            scored[index - start] += number_log_probability(literal, loc, scale).item()
            greedy &= abs(loc.item() - _exact_value(literal)) <= literal_resolution(literal) / 2
    return SequenceScore(sum(scored), greedy, scored)


def _decisions(out, model, token_probability: str) -> Tensor:
    """The token each position decides, ``[S-1]``: the standard mode's OvR argmax, or the argmax of
    $\\mathrm{loc}_S$ for ``"softmax"``."""
    from .inference import predicted_token

    if token_probability == "softmax":
        return out.loc_S[0, :-1].argmax(-1)
    return predicted_token(out.loc_S[0, :-1], out.scale_S[0, :-1], model.ovr_threshold)


def score_text(model, tokenizer, text: str, token_probability: str = "ovr", max_length: int | None = None) -> float:
    """$\\log P(\\text{text})$: every token scored, the first conditioned on the end-of-text token (as lm-eval's
    rolling log-likelihood does), in windows of at most ``max_length`` tokens (default: the model's
    ``max_position_embeddings``), each window conditioned on as many tokens before it as fit."""
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty str")
    ids, values, texts = tokenizer.encode(text, return_number_texts=True)
    ids, values = [_prefix_id(tokenizer), *ids], [0.0, *values]
    max_length = max_length or model.config.max_position_embeddings
    total, scored_to = 0.0, 1
    while scored_to < len(ids):
        end = min(len(ids), scored_to + max_length - 1)
        begin = max(0, end - max_length)
        window_ids, window_values = ids[begin:end], values[begin:end]
        skipped = ids[:begin].count(tokenizer.num_token_id)
        count = window_ids.count(tokenizer.num_token_id)
        score = score_continuation(model, window_ids, window_values, texts[skipped:skipped + count],
                                   scored_to - begin, token_probability)
        total += score.log_likelihood
        scored_to = end
    return total


def _prefix_id(tokenizer) -> int:
    """The token that stands before a text scored from its start: end-of-text (or, without one, the pad token)."""
    prefix = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if prefix is None:
        raise ValueError("the tokenizer has neither an eos nor a pad token to stand before a text scored from its start")
    return prefix
