r"""Qwen2 vs CausalQwen on domain B: one set of metric definitions for both.

Both models start from the same pretrained base (`validation.domains.pretrained_base`); the Qwen side is
fine-tuned by `validation.qwen_finetuning`, CausalQwen by its own training loop (`validation.v9_comparison`).

**The metrics** (`evaluate_qwen`, `evaluate_causal`), identical in definition for both models, all
teacher-forced on the same texts (EOS appended):

* *Text positions.* A target token is a *text* target unless it belongs to a number. For Qwen a number is a
  run of digit tokens: a target is excluded when its character span (the tokenizer's offsets) overlaps the
  span of a number that the project's grammar (`causalqwen.numbers.find_numbers`) finds in the text. For
  CausalQwen a number is one ``<NUM>`` token (found by the same grammar): targets equal to ``<NUM>`` are
  excluded. Qwen2's pre-tokenizer never joins a digit to anything else, and in these corpora every number is
  preceded and followed by a space, so the text between numbers is tokenized the same way by both: the
  text targets are the same tokens, in the same order, after the same text (``text_positions`` agree).
  Only the context differs: after a number, Qwen has read its digits, CausalQwen one ``<NUM>`` and its value.
* ``text_accuracy``: greedy top-1 = the target, over text targets. ``ece`` (15 equal-width bins;
  `calibration`) and ``brier`` = mean (confidence − correct)² of that top-1 decision, where the confidence is
  Qwen's softmax maximum, and for CausalQwen the standard-mode OvR probability $P_k = P(S_k > C_k)$ of its
  argmax class $k$ (OvR probabilities do not sum to 1; this is the probability the model gives its decision).
* ``number_onset_accuracy``: at the position right before a number, Qwen's top-1 token begins with a digit,
  CausalQwen's argmax is ``<NUM>``. ``number_positions``: the targets left out of the text metrics (Qwen:
  every digit-span token; CausalQwen: one ``<NUM>`` per number).
* Numbers, each predicted from the true text before it. Qwen: the prefix ``text[:start]`` (``start`` = the
  number's first character, from the grammar) is encoded alone and greedily continued by up to
  ``max_new_tokens`` tokens, stopping after the first token holding a character that cannot continue a
  number (anything but ``0-9 . , e E + - −``); the continuation is read by the grammar, and a number that
  starts at its first character is the prediction, otherwise it is *unparseable*. CausalQwen: $\mathrm{loc}_Y$
  (standard mode) at the position whose next token is that ``<NUM>``. ``mae`` and ``mdae`` (median) of
  $|\hat y - y|$ over the numbers with a prediction, ``unparseable`` (always 0 for CausalQwen), and
  ``mdae_strict``, the median with an unparseable prediction counted as an infinite error. A number at the
  very start of a text has no prefix and is skipped by both (``numbers_skipped``; none in these corpora).
* With `validation.domains.DomainBRecord` inputs: the same per group ``"template/role"`` (``/outlier`` added
  for a replaced number) in ``by_group``, and ``target_*`` over the predictable numbers (role ``"target"``,
  not outliers). The record's numbers are checked against the grammar's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from causalqwen.files.data import collate
from causalqwen.numbers import find_numbers

from .domains import DomainBRecord
from .qwen_batches import collate_rows

__all__ = [
    "calibration",
    "greedy_numbers",
    "token_texts_of",
    "error_summary",
    "evaluate_qwen",
    "evaluate_causal",
    "ECE_BINS",
    "NUMBER_CHARS",
]

ECE_BINS = 15
NUMBER_CHARS = frozenset("0123456789.,eE+-\u2212")  # characters that can continue a number


# ---------------------------------------------------------------------------------------------
# Metric definitions shared by both models
# ---------------------------------------------------------------------------------------------


def calibration(confidence, correct, n_bins: int = ECE_BINS) -> tuple[float, float]:
    r"""``(ece, brier)`` of top-1 decisions with ``confidence`` in [0, 1] and ``correct`` (0/1).

    Bin $b$ holds the confidences $c$ with $\min(\lfloor n_{\mathrm{bins}} c\rfloor, n_{\mathrm{bins}} - 1) = b$ (equal
    widths on [0, 1], the last bin closed). $\mathrm{ECE} = \sum_b \frac{n_b}{N}\,|\bar a_b - \bar c_b|$
    (accuracy and mean confidence in the bin); $\mathrm{Brier} = \frac1N \sum_i (c_i - a_i)^2$. Both 0 for N = 0.
    """
    confidence = np.asarray(confidence, dtype=np.float64).ravel()
    correct = np.asarray(correct, dtype=np.float64).ravel()
    if confidence.shape != correct.shape:
        raise ValueError(f"confidence and correct differ in size: {confidence.size} and {correct.size}")
    if confidence.size == 0:
        return 0.0, 0.0
    bins = np.minimum(np.floor(confidence * n_bins).astype(np.int64), n_bins - 1)
    gap = np.bincount(bins, weights=correct - confidence, minlength=n_bins)  # n_b (a_b - c_b)
    ece = float(np.abs(gap).sum() / confidence.size)
    brier = float(np.mean((confidence - correct) ** 2))
    return ece, brier


def error_summary(predicted, truth) -> dict:
    """``n``, ``mae``, ``mdae`` over the numbers with a prediction (NaN = none: ``unparseable``), and
    ``mdae_strict`` with those counted as infinite errors (inf when they are at least half)."""
    predicted = np.asarray(predicted, dtype=np.float64).ravel()
    truth = np.asarray(truth, dtype=np.float64).ravel()
    parsed = ~np.isnan(predicted)
    errors = np.abs(predicted[parsed] - truth[parsed])
    strict = np.where(parsed, np.abs(predicted - truth), np.inf)
    return {
        "n": int(truth.size),
        "mae": float(errors.mean()) if errors.size else float("nan"),
        "mdae": float(np.median(errors)) if errors.size else float("nan"),
        "mdae_strict": float(np.median(strict)) if strict.size else float("nan"),
        "unparseable": int((~parsed).sum()),
    }


@dataclass
class _Item:
    text: str
    numbers: list  # the grammar's NumberMatch of every number with a prefix (start > 0)
    groups: list  # per number: "template/role[/outlier]" or "all"
    predictable: list  # per number: role "target" and not an outlier
    skipped: int  # numbers at the very start of the text


def _items(texts) -> list[_Item]:
    """Strings or `DomainBRecord` s as evaluation items; a record's numbers must be the grammar's."""
    if isinstance(texts, (str, DomainBRecord)):
        texts = [texts]
    items = []
    for index, entry in enumerate(texts):
        text = entry.text if isinstance(entry, DomainBRecord) else entry
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] must be a str or a DomainBRecord, got {type(entry).__name__}")
        found = find_numbers(text)
        if isinstance(entry, DomainBRecord):
            if [(n.start, n.end) for n in found] != [(n.start, n.end) for n in entry.numbers]:
                raise ValueError(
                    f"texts[{index}]: the grammar finds {[n.text for n in found]}, the record lists "
                    f"{[n.text for n in entry.numbers]}"
                )
            groups = [f"{entry.template}/{n.role}" + ("/outlier" if n.outlier else "") for n in entry.numbers]
            predictable = [n.role == "target" and not n.outlier for n in entry.numbers]
        else:
            groups, predictable = ["all"] * len(found), [False] * len(found)
        keep = [k for k, n in enumerate(found) if n.start > 0]
        items.append(
            _Item(
                text,
                [found[k] for k in keep],
                [groups[k] for k in keep],
                [predictable[k] for k in keep],
                len(found) - len(keep),
            )
        )
    if not items:
        raise ValueError("texts is empty")
    return items


def _summary(
    items: list[_Item], text_correct, text_confidence, onset_correct, predicted, number_positions: int
) -> dict:
    """The metric dict from per-position and per-number arrays (numbers in the order of ``items``)."""
    text_correct = np.asarray(text_correct, dtype=np.float64)
    ece, brier = calibration(text_confidence, text_correct)
    truth = np.array([n.value for item in items for n in item.numbers], dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    groups = np.array([g for item in items for g in item.groups], dtype=object)
    predictable = np.array([p for item in items for p in item.predictable], dtype=bool)
    overall = error_summary(predicted, truth)
    target = error_summary(predicted[predictable], truth[predictable])
    by_group = {
        str(group): error_summary(predicted[groups == group], truth[groups == group])
        for group in sorted(set(groups.tolist()))
    }
    return {
        "text_accuracy": float(text_correct.mean()) if text_correct.size else float("nan"),
        "text_positions": int(text_correct.size),
        "ece": ece,
        "brier": brier,
        "number_positions": int(number_positions),
        "number_onset_accuracy": float(np.mean(onset_correct)) if len(onset_correct) else float("nan"),
        "n_numbers": overall["n"],
        "numbers_skipped": int(sum(item.skipped for item in items)),
        "mae": overall["mae"],
        "mdae": overall["mdae"],
        "mdae_strict": overall["mdae_strict"],
        "unparseable": overall["unparseable"],
        "target_n": target["n"],
        "target_mae": target["mae"],
        "target_mdae": target["mdae"],
        "target_mdae_strict": target["mdae_strict"],
        "target_unparseable": target["unparseable"],
        "by_group": by_group,
    }


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# ---------------------------------------------------------------------------------------------
# Qwen2 (softmax head, digit tokens)
# ---------------------------------------------------------------------------------------------


def token_texts_of(tokenizer, size: int) -> list[str | None]:
    """The text of every id below ``size`` (None for the model's reserved rows beyond the tokenizer)."""
    known = len(tokenizer)
    return [
        tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) if i < known else None
        for i in range(size)
    ]


@torch.no_grad()
def greedy_numbers(
    model, tokenizer, prefixes: list[str], max_new_tokens: int, batch_size: int, token_texts: list
) -> list[float]:
    """The number each prefix is greedily continued with (NaN: unparseable). See the module docstring."""
    device = _device(model)
    continues = [text is not None and text != "" and all(ch in NUMBER_CHARS for ch in text) for text in token_texts]
    encoded = tokenizer(prefixes, add_special_tokens=False)["input_ids"] if prefixes else []
    values = []
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start : start + batch_size]
        n = len(rows)
        lengths = torch.tensor([len(row) for row in rows])
        buffer = torch.full((n, int(lengths.max()) + max_new_tokens), tokenizer.pad_token_id, dtype=torch.long)
        for r, row in enumerate(rows):
            buffer[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        generated: list[list[int]] = [[] for _ in range(n)]
        active = list(range(n))
        for _ in range(max_new_tokens):
            index = torch.tensor(active)
            width = int(lengths[index].max())
            ids = buffer[index, :width].to(device)
            mask = (torch.arange(width)[None, :] < lengths[index][:, None]).long().to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits  # [n_active, width, V]
            chosen = logits[torch.arange(len(active)), (lengths[index] - 1).to(device)].argmax(-1).cpu()
            still = []
            for row, token in zip(active, chosen.tolist()):
                generated[row].append(token)
                buffer[row, lengths[row]] = token
                lengths[row] += 1
                if continues[token]:
                    still.append(row)
            active = still
            if not active:
                break
        for tokens in generated:
            text = "".join(token_texts[t] if token_texts[t] is not None else "\x00" for t in tokens)
            found = find_numbers(text)
            values.append(found[0].value if found and found[0].start == 0 else float("nan"))
    return values


@torch.no_grad()
def evaluate_qwen(model, tokenizer, texts, *, batch_size: int = 64, max_new_tokens: int = 12) -> dict:
    """The metrics of the module docstring for a Qwen-style model (a ``Qwen2ForCausalLM`` or an `AdaptedQwen`)
    with its plain tokenizer (numbers as digit tokens). ``texts``: strings or `DomainBRecord` s.

    Text targets are the positions whose target token's character span (tokenizer offsets) overlaps no number
    span of the grammar; the EOS appended to each text is a text target. The number predictions use the prefix
    ending right before each number's first character (`greedy_numbers`).
    """
    items = _items(texts)
    was_training = model.training
    model.eval()
    try:
        device = _device(model)
        vocab = model.config.vocab_size
        token_texts = token_texts_of(tokenizer, vocab)
        digit_start = torch.tensor([t is not None and t[:1].isascii() and t[:1].isdigit() for t in token_texts])
        encoded = tokenizer([item.text for item in items], add_special_tokens=False, return_offsets_mapping=True)
        eos = tokenizer.eos_token_id
        rows, is_number, onset_targets = [], [], []
        for item, ids, offsets in zip(items, encoded["input_ids"], encoded["offset_mapping"]):
            spans = [(n.start, n.end) for n in item.numbers]
            flags = [any(s < e_n and e > s_n for s_n, e_n in spans) and e > s for s, e in offsets]
            first = []
            for s_n, e_n in spans:  # the first token of each number (the onset target); never token 0 here
                j = next(j for j, (s, e) in enumerate(offsets) if s < e_n and e > s_n and e > s)
                if j >= 1:  # a first token that also holds the text before the number has no onset position
                    first.append(j)
            rows.append(list(ids) + ([eos] if eos is not None else []))
            is_number.append(flags + ([False] if eos is not None else []))
            onset_targets.append(first)
        text_correct, text_confidence, onset_correct = [], [], []
        number_positions = 0
        for start in range(0, len(rows), batch_size):
            batch = collate_rows(rows[start : start + batch_size], tokenizer.pad_token_id)
            logits = (
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
                .logits.float()
                .cpu()
            )  # [B, S, V]
            probabilities = torch.softmax(logits, dim=-1)
            confidence, predicted = probabilities.max(dim=-1)  # [B, S]
            for r in range(len(batch["input_ids"])):
                row, flags = rows[start + r], is_number[start + r]
                targets = torch.tensor(row[1:])
                text = ~torch.tensor(flags[1:], dtype=torch.bool)
                number_positions += int((~text).sum())
                hits = (predicted[r, : len(row) - 1] == targets)[text]
                text_correct += hits.tolist()
                text_confidence += confidence[r, : len(row) - 1][text].tolist()
                onset_correct += [bool(digit_start[predicted[r, j - 1]]) for j in onset_targets[start + r]]
        prefixes = [item.text[: n.start] for item in items for n in item.numbers]
        predicted_values = greedy_numbers(model, tokenizer, prefixes, max_new_tokens, batch_size, token_texts)
    finally:
        model.train(was_training)
    return _summary(items, text_correct, text_confidence, onset_correct, predicted_values, number_positions)


# ---------------------------------------------------------------------------------------------
# CausalQwen (OvR head, <NUM> + value)
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_causal(
    model, numeric_tokenizer, texts, *, batch_size: int = 64, max_decision_elements: int = 2**22
) -> dict:
    """The metrics of the module docstring for a `causalqwen.CausalQwenForCausalLM` with its
    `causalqwen.NumericTokenizer`, under standard inference. ``texts``: strings or `DomainBRecord` s.

    Each text is encoded by the numeric tokenizer (EOS appended, as `causalqwen.files.data.TextDataset` does) and
    scored by the model's own rule (`DecisionHead.next_token_targets`): text targets are scored targets other
    than ``<NUM>``; the prediction is $\\arg\\max_k P_k$, its confidence $P_k$; the value of a number is
    $\\mathrm{loc}_Y$ at the position before its ``<NUM>``. The decisions are formed for at most
    ``max_decision_elements`` ``[positions, V]`` values at a time.
    """
    items = _items(texts)
    head = model.action
    num_id = head.num_token_id
    was_training = model.training
    model.eval()
    try:
        device = _device(model)
        eos = numeric_tokenizer.eos_token_id
        encoded = []
        for index, item in enumerate(items):
            ids, values = numeric_tokenizer.encode(item.text)
            expected = len(item.numbers) + item.skipped
            if ids.count(num_id) != expected:
                raise ValueError(f"texts[{index}]: {ids.count(num_id)} <NUM> tokens for {expected} numbers")
            if eos is not None:
                ids, values = ids + [eos], values + [0.0]
            encoded.append(
                {
                    "input_ids": torch.tensor(ids, dtype=torch.long),
                    "numeric_values": torch.tensor(values, dtype=torch.float32),
                }
            )
        text_correct, text_confidence, onset_correct, predicted_values = [], [], [], []
        number_positions = 0
        chunk = max(1, max_decision_elements // model.config.vocab_size)
        for start in range(0, len(encoded), batch_size):
            batch = {
                k: v.to(device)
                for k, v in collate(encoded[start : start + batch_size], numeric_tokenizer.pad_token_id).items()
            }
            law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
            targets = head.next_token_targets(batch["labels"], batch["numeric_values"], batch["attention_mask"])
            loc_U, scale_U = law.loc_U[targets.scored], law.scale_U[targets.scored]  # [N, C], row-major order
            labels = targets.labels[targets.scored]  # [N]
            predicted, confidence, loc_Y = [], [], []
            for c in range(0, loc_U.shape[0], chunk):
                decision = head(loc_U[c : c + chunk], scale_U[c : c + chunk])  # [n, V] x2, [n] x2
                token = head.predict(decision)[0]  # argmax_k P_k
                predicted.append(token)
                confidence.append(head.probabilities(decision).gather(-1, token[:, None]).squeeze(-1))
                loc_Y.append(decision.loc_Y)
            if not predicted:  # no scored position in this batch
                continue
            predicted, labels = torch.cat(predicted).cpu(), labels.cpu()
            confidence, loc_Y = torch.cat(confidence).double().cpu(), torch.cat(loc_Y).double().cpu()
            text = labels != num_id
            number_positions += int((~text).sum())
            text_correct += (predicted[text] == labels[text]).tolist()
            text_confidence += confidence[text].tolist()
            onset_correct += (predicted[~text] == num_id).tolist()
            predicted_values += loc_Y[~text].tolist()  # the <NUM> targets in row-major order = the numbers in order
        if len(predicted_values) != sum(len(item.numbers) for item in items):
            raise RuntimeError("the <NUM> targets do not match the numbers with a prefix")
    finally:
        model.train(was_training)
    return _summary(items, text_correct, text_confidence, onset_correct, predicted_values, number_positions)
