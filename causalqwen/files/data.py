r"""Training data: a synthetic corpus whose numbers are learnable from context, and a JSONL reader.

**The synthetic corpus** (`synthetic_texts`) is what ``causalqwen demo`` trains on. Every sentence
comes from one of a few templates, and every number in it is either a free draw that the model cannot
predict (it only learns *that* a number comes, i.e. ``<NUM>``), or a *target* fixed by the context:

| template | example | rule for the target numbers |
|---|---|---|
| fixed price | ``A cup of tea costs 1.5 dollars.`` | the price is a fixed function of the drink (`DRINK_PRICES`) |
| copy | ``The price is 37 yuan. Again, the price is 37 yuan.`` | the second number repeats the first ($x \in [1, 99]$) |
| count | ``The team won 12 games, then 13 games, then 14 games.`` | each number is the previous plus 1 (start in $[1, 60]$) |
| double | ``One apple costs 6 yuan, so two apples cost 12 yuan.`` | the second number is twice the first ($p \in [1, 30]$) |
| bag | ``A bag of rice weighs 25 kilograms.`` | the weight is a fixed function of the good (`BAG_WEIGHTS`) |
| week | ``A week has 7 days, and a day has 24 hours.`` | constants |

So the positions before a target number must predict ``<NUM>`` (scored by ``num_precision``,
``num_recall``, ``num_f1``), and the value there is a deterministic function of the earlier text
(scored by ``reg_mae``, ``reg_mdae``). Sentences use words of the tiny tokenizer's training corpus, so
they tokenize into few pieces.

**Real data** (`read_jsonl`): one JSON object per line, either a text, ``{"text": ...}``, scored at every
token, or a prompt and its completion, ``{"prompt": ..., "completion": ...}`` (TRL's and transformers'
convention), scored on the completion alone (`PromptCompletion`). Both go through `NumericTokenizer`, and
`TextDataset` turns them into training rows.
"""  # noqa: E501 -- the table rows above: a Markdown table row is one line

from __future__ import annotations

import errno
import json
import os
import random
import sys
from typing import NamedTuple

import torch
from torch.utils.data import Dataset

from ..float32 import format_number
from ..numbers import find_numbers
from ..tokenization import pad_rows

__all__ = [
    "DRINK_PRICES",
    "PromptCompletion",
    "synthetic_texts",
    "read_jsonl",
    "check_answers_present",
    "prompt_completion_features",
    "TextDataset",
    "collate",
]

DRINK_PRICES = {"tea": 1.5, "coffee": 2.5, "juice": 4.0, "water": 1.0}
BAG_WEIGHTS = {"rice": 25.0, "flour": 10.0, "sugar": 5.0, "salt": 2.0}
ITEMS = ["apple", "orange", "book", "cup"]
GAMES = ["team", "class", "company"]


def _fixed_price(rng: random.Random) -> str:
    drink = rng.choice(sorted(DRINK_PRICES))
    return f"A cup of {drink} costs {format_number(DRINK_PRICES[drink])} dollars."


def _bag(rng: random.Random) -> str:
    good = rng.choice(sorted(BAG_WEIGHTS))
    return f"A bag of {good} weighs {format_number(BAG_WEIGHTS[good])} kilograms."


def _copy(rng: random.Random) -> str:
    x = rng.randint(1, 99)
    return f"The price is {x} yuan. Again, the price is {x} yuan."


def _count(rng: random.Random) -> str:
    start = rng.randint(1, 60)
    who = rng.choice(GAMES)
    return f"The {who} won {start} games, then {start + 1} games, then {start + 2} games."


def _double(rng: random.Random) -> str:
    p = rng.randint(1, 30)
    item = rng.choice(ITEMS)
    return f"One {item} costs {p} yuan, so two {item}s cost {2 * p} yuan."


def _week(rng: random.Random) -> str:
    return "A week has 7 days, and a day has 24 hours."


TEMPLATES = {"fixed_price": _fixed_price, "bag": _bag, "copy": _copy, "count": _count, "double": _double, "week": _week}
WEIGHTS = {"fixed_price": 3, "bag": 3, "copy": 2, "count": 2, "double": 2, "week": 2}


def synthetic_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences of the synthetic corpus (table above), drawn with ``random.Random(seed)``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rng = random.Random(seed)
    names = list(TEMPLATES)
    weights = [WEIGHTS[name] for name in names]
    return [TEMPLATES[rng.choices(names, weights)[0]](rng) for _ in range(n)]


_UTF_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def _lines(handle):
    r"""The lines of a binary file without their ends. A line ends in ``\n``, ``\r\n`` or a lone ``\r``, as in
    Python's universal newlines; JSON text never holds a raw CR or LF inside a string, so splitting there is
    safe. (Unicode's other line separators, such as U+2028, are not line ends: JSON strings may hold them.)"""
    for chunk in handle:  # split at b"\n" only
        if chunk.endswith(b"\n"):
            chunk = chunk[:-2] if chunk.endswith(b"\r\n") else chunk[:-1]
            yield from chunk.split(b"\r")
        else:  # the last line, with no LF after it
            pieces = chunk.split(b"\r")
            yield from pieces[:-1] if len(pieces) > 1 and not pieces[-1] else pieces


class _Unreadable(ValueError):
    """A JSON line that parses but holds what Python cannot take as it is (raised by the hooks below)."""


def _json_int(text: str) -> int:
    """``int(text)``, or `_Unreadable` for more digits than Python converts (``sys.get_int_max_str_digits``)."""
    limit = sys.get_int_max_str_digits()
    digits = len(text) - text.startswith("-")
    if limit and digits > limit:
        raise _Unreadable(f"an integer of {digits} digits, more than the {limit} Python converts")
    return int(text)


def _json_object(pairs: list) -> dict:
    """A JSON object as a dict, or `_Unreadable` when a key appears twice (a dict would keep only the last)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _Unreadable(f"the key {twice!r} appears twice in one object")
    return record


class PromptCompletion(NamedTuple):
    """One training row in the prompt–completion form: the model reads ``prompt`` and learns ``completion``.

    Both losses score the completion's tokens alone (and the EOS after it); the prompt's tokens, numbers
    included, are context. Prompt and completion are encoded separately and joined, so the first completion
    token is predicted at the prompt's last position, exactly where `causalqwen.regression.predict_number`
    reads the law of the next number for a prompt given alone."""

    prompt: str
    completion: str


# the keys of each form of a JSONL row
TEXT_KEYS = ("text",)
PROMPT_COMPLETION_KEYS = ("prompt", "completion")


def _row(record, where: str) -> str | PromptCompletion:
    """A parsed JSONL record as a text or a `PromptCompletion`, or a ``ValueError`` naming ``where`` and what is
    wrong: not an object, neither form, both forms, a missing or non-string field, an empty prompt or completion."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got a JSON {type(record).__name__}")
    has_text = "text" in record
    has_pair = [key for key in PROMPT_COMPLETION_KEYS if key in record]
    if has_text and has_pair:
        raise ValueError(f'{where}: an object with both "text" and {has_pair[0]!r}; give one form per row')
    if not has_text and not has_pair:
        raise ValueError(
            f'{where}: expected a JSON object with a string field "text", or "prompt" and "completion"; '
            f"got keys {sorted(record)}"
        )
    keys = TEXT_KEYS if has_text else PROMPT_COMPLETION_KEYS
    for key in keys:
        if key not in record:
            raise ValueError(f'{where}: "prompt" and "completion" go together; the field {key!r} is missing')
        if not isinstance(record[key], str):
            raise ValueError(f"{where}: the field {key!r} must be a string, got {type(record[key]).__name__}")
    if has_text:
        return record["text"]
    for key in PROMPT_COMPLETION_KEYS:
        if not record[key]:
            raise ValueError(
                f"{where}: the {key} is empty"
                + (" (nothing to learn)" if key == "completion" else " (no position predicts the completion)")
            )
    return PromptCompletion(record["prompt"], record["completion"])


def read_jsonl(path: str | os.PathLike) -> tuple[list[str] | list[PromptCompletion], list[str]]:
    r"""``(rows, sources)``: the rows of a JSONL file, one per non-blank line, and for each a ``"PATH, line N"``
    name that `TextDataset` uses in its errors.

    A row is a JSON object in one of two forms, the same for every line of a file:

    - ``{"text": "..."}``: a text, scored at every token; the row is the ``str``;
    - ``{"prompt": "...", "completion": "..."}``: scored on the completion alone; the row is a
      `PromptCompletion`. Neither string may be empty.

    Other fields of an object are ignored. The file must be UTF-8 (a byte-order mark at its start is skipped).
    Lines end in ``\n``, ``\r\n`` or a lone ``\r`` (files from old Mac tools), counted as an editor counts
    them; a blank line (spaces and tabs only) is skipped.

    Raises ``OSError`` naming the file when it cannot be read (missing, a directory), and ``ValueError``
    naming the file, and the line where there is one, for: a UTF-16 or UTF-32 file; a NUL byte (a binary
    file); invalid UTF-8 (with the byte); a line that is not JSON (with the column), that nests deeper than
    Python's reader goes, holds an integer of more digits than Python converts or an object with a key
    twice; an object of neither form or of both, a missing or non-string field, an empty prompt or
    completion; a row of the other form than the file's first (both lines named); and a file with no row.
    """
    texts, sources = [], []
    try:
        handle = open(path, "rb")
    except OSError as error:
        reason = {errno.ENOENT: "it does not exist", errno.EISDIR: "it is a directory"}.get(error.errno, error.strerror)
        raise OSError(f"cannot read the JSONL file {os.fspath(path)!r}: {reason}") from None
    with handle:
        start = handle.read(4)
        handle.seek(0)
        for bom, encoding in _UTF_BOMS:
            if start.startswith(bom):
                raise ValueError(
                    f"{path}: the file is {encoding} text (it starts with the byte-order mark {bom!r}); "
                    f"JSONL must be UTF-8: convert it (e.g. iconv -f {encoding} -t UTF-8)"
                )
        for number, raw in enumerate(_lines(handle), start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # the UTF-8 byte-order mark
            nul = raw.find(b"\x00")  # never in JSON text, where a control character must be escaped
            if nul >= 0:
                raise ValueError(
                    f"{path}, line {number}: a NUL byte at byte {nul} of the line (a binary file, or "
                    "UTF-16/UTF-32 text without a byte-order mark?); the file must be UTF-8 text"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: invalid UTF-8 at byte {error.start} of the line "
                    f"({raw[error.start : error.start + 4]!r}); the file must be UTF-8 text"
                ) from None
            if not line.strip(" \t"):
                continue
            try:
                record = json.loads(line, parse_int=_json_int, object_pairs_hook=_json_object)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid JSON ({error.msg} at column {error.colno})"
                ) from None
            except RecursionError:
                raise ValueError(f"{path}, line {number}: the JSON is nested too deeply to read") from None
            except _Unreadable as error:
                raise ValueError(f"{path}, line {number}: {error}") from None
            row = _row(record, f"{path}, line {number}")
            if texts and isinstance(row, str) != isinstance(texts[0], str):
                form, first = (
                    ("a text", "a prompt-completion") if isinstance(row, str) else ("a prompt-completion", "a text")
                )
                raise ValueError(
                    f"{path}, line {number}: {form} row after {first} row ({sources[0].rsplit(', ', 1)[1]}); "
                    "one file holds rows of one form"
                )
            texts.append(row)
            sources.append(f"{path}, line {number}")
    if not texts:
        raise ValueError(f"{path}: the dataset is empty (no line with a row)")
    return texts, sources


def check_answers_present(rows, sources) -> None:
    """An evaluation set of prompt–completion rows is a regression task when a completion holds a number (its answer,
    scored by the ``answer_*`` figures); then every completion must hold one, or the row's answer would be left out
    of the figures unseen. A ``ValueError`` names the first row without one; a set of text rows, or of completions
    that all are text, passes."""
    holds = [isinstance(row, PromptCompletion) and bool(find_numbers(row.completion)) for row in rows]
    if any(holds) and not all(holds):
        first = holds.index(False)
        raise ValueError(
            f"{sources[first]}: the completion {rows[first].completion!r} holds no number, while "
            f"{sum(holds)} of the {len(rows)} completions do: a regression set needs the answer of every row "
            "(its first number) to score"
        )


def prompt_completion_features(tokenizer, prompt: str, completion: str, max_length: int | None = None) -> dict:
    """The features of one prompt–completion row, for `TextDataset` and for a ``datasets`` map under
    `transformers.Trainer`: ``input_ids`` and ``numeric_values`` of the prompt, then of the completion, then EOS
    (when the tokenizer has one), and ``completion_mask`` (TRL's name), 0 on the prompt and 1 on the rest.
    `collate` and `causalqwen.integrations.collator.NumericDataCollator` turn it into ``labels`` with the prompt at
    ``ignore_index``, so both losses score the completion alone.

    The two strings are encoded separately (`PromptCompletion` says why). A ``ValueError`` when either is not a
    non-empty str, or when the row takes more than ``max_length`` tokens (a completion cut short would teach a
    wrong answer: raise ``max_length`` or shorten the prompt)."""
    for name, value in (("prompt", prompt), ("completion", completion)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if not value:
            raise ValueError(f"the {name} is empty")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
        raise ValueError(f"max_length must be an int >= 2 or None, got {max_length!r}")
    limit = None if max_length is None else max_length + 1  # one more token than allowed tells a row too long
    prompt_ids, prompt_values = tokenizer.encode(prompt, limit)
    completion_ids, completion_values = tokenizer.encode(completion, limit)
    num = tokenizer.num_token_id
    if prompt_ids and completion_ids and prompt_ids[-1] == num and completion_ids[0] == num:
        raise ValueError(
            f"the prompt ends with a number and the completion starts with one ({prompt[-12:]!r} + "
            f"{completion[:12]!r}): joined, they are one number in text but two <NUM> here; end the prompt with a "
            "space or a separator"
        )
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    ids = prompt_ids + completion_ids + eos
    if max_length is not None and len(ids) > max_length:
        raise ValueError(
            f"the prompt and completion take {len(ids)} or more tokens, more than max_length = {max_length}: "
            "raise max_length or shorten the prompt (a completion is never cut)"
        )
    return {
        "input_ids": ids,
        "numeric_values": prompt_values + completion_values + [0.0] * len(eos),
        "completion_mask": [0] * len(prompt_ids) + [1] * (len(completion_ids) + len(eos)),
    }


class TextDataset(Dataset):
    """Rows encoded with ``tokenizer`` (a `causalqwen.NumericTokenizer`), EOS appended: texts (``str``), each
    truncated to ``max_length`` tokens, or `PromptCompletion` rows (`prompt_completion_features`), which must fit.

    An item is a dict of 1-D tensors ``input_ids`` (long), ``numeric_values`` (float32), and for a prompt–completion
    row ``completion_mask`` (long). Encoding happens once, here, and reads only as much of a long text as
    ``max_length`` tokens need; a number that does not fit float32, a lone surrogate or a prompt–completion row
    longer than ``max_length`` raises a ``ValueError`` naming the row (``sources[i]``, e.g.
    ``"data.jsonl, line 7"``; by default ``"text i"``, counted from 1).
    """

    def __init__(self, texts: list, tokenizer, max_length: int = 64, sources: list[str] | None = None):
        if not texts:
            raise ValueError("the dataset is empty: no texts to train on")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
        self.pad_token_id = tokenizer.pad_token_id
        self.items = []
        for index, row in enumerate(texts):
            try:
                item = self._encoded(row, tokenizer, max_length)
            except (ValueError, TypeError) as error:
                name = sources[index] if sources is not None else f"text {index + 1}"
                raise type(error)(f"{name}: {error}") from None
            self.items.append(item)

    @staticmethod
    def _encoded(row, tokenizer, max_length: int) -> dict[str, torch.Tensor]:
        """One row's item (the class docstring)."""
        if isinstance(row, PromptCompletion):
            features = prompt_completion_features(tokenizer, row.prompt, row.completion, max_length)
            return {
                "input_ids": torch.tensor(features["input_ids"], dtype=torch.long),
                "numeric_values": torch.tensor(features["numeric_values"], dtype=torch.float32),
                "completion_mask": torch.tensor(features["completion_mask"], dtype=torch.long),
            }
        if not isinstance(row, str):
            raise TypeError(f"a row is a str or a PromptCompletion, got {type(row).__name__}")
        ids, values = tokenizer.encode(row, max_length)  # only a prefix of a long text is encoded
        eos = tokenizer.eos_token_id
        if eos is not None:
            ids, values = ids + [eos], values + [0.0]
        return {
            "input_ids": torch.tensor(ids[:max_length], dtype=torch.long),
            "numeric_values": torch.tensor(values[:max_length], dtype=torch.float32),
        }

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.items[index]


def collate(items: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of items into a batch with `causalqwen.tokenization.pad_rows`: ``input_ids``,
    ``numeric_values``, ``attention_mask``, ``labels`` (= ``input_ids``, -100 at padding and, in a prompt–completion
    row, on the prompt: its ``completion_mask`` is 0; the model shifts them inside) and ``numeric_labels``
    (= ``numeric_values``, what the model uses when none are given). Both label keys are there because
    `transformers.Trainer` takes every ``forward`` argument named ``*label*`` for a label, and computes an
    ``eval_loss`` only for batches that carry all of them."""
    length = max(len(item["input_ids"]) for item in items)
    batch = pad_rows(
        [item["input_ids"].tolist() for item in items],
        [item["numeric_values"].tolist() for item in items],
        length,
        pad_token_id,
    )  # [B, S] each
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for row, item in enumerate(items):
        if "completion_mask" in item:  # a prompt-completion row: its prompt is context, not a target
            prompt = item["completion_mask"] == 0  # [S_row]
            labels[row, : len(prompt)] = labels[row, : len(prompt)].masked_fill(prompt, -100)
    return {**batch, "labels": labels, "numeric_labels": batch["numeric_values"].clone()}
