r"""CausalQwen on a series written as text, at its best: the next value trained as a completion of the whole history
the positions allow, and forecasts as paths sampled through the design's modes (V18).

A series is written as `validation.llmtime_series.causal_text` writes it (``0.259, 0.271, 0.300``), each value one
``<NUM>``. A training row is a prompt, the history up to a time (its last `max_context` values) followed by
``", "``, and its completion, the value that comes next (`training_rows`): both losses score the completion alone
(decision D25). A forecast of ``horizon`` steps extends the history one value at a time, the value read at the
prompt's last token (`causalqwen.regression.sampled_next_numbers`): in ``standard`` mode $\mathrm{loc}_Y$ (one path),
in ``causal`` mode with a fresh individual $\varepsilon$ at every step, and in ``shared_individual`` mode with one
$\varepsilon$ per path, drawn once (`sampled_paths`). One-step laws along the *true* history (`one_step_laws`) score
the intervals.
"""

from __future__ import annotations

import numpy as np
import torch

from causalqwen.files.data import PromptCompletion
from causalqwen.regression import next_number_law, sampled_next_numbers

from .llmtime_series import causal_text

__all__ = ["quantised", "training_rows", "sampled_paths", "one_step_laws", "Encoder"]

SEPARATOR = ", "


def quantised(values) -> np.ndarray:
    """``values`` as the texts write them (LLMTime's digits truncated at `PRECISION` decimals)."""
    text = causal_text(np.asarray(values, dtype=np.float64))
    return np.asarray([float(piece) for piece in text.split(SEPARATOR)], dtype=np.float64)


def training_rows(history, min_context: int, max_context: int) -> list[PromptCompletion]:
    """One row per time $t \\ge$ ``min_context``: the prompt holds the values before $t$ (the last ``max_context``
    of them) and ends with ``", "``; the completion is the value at $t$."""
    values = quantised(history)
    rows = []
    for t in range(min_context, len(values)):
        context = values[max(0, t - max_context) : t]
        rows.append(PromptCompletion(causal_text(context) + SEPARATOR, causal_text(values[t : t + 1])))
    return rows


class Encoder:
    """The ids of a history written as text, grown one value at a time without encoding the text again: a history
    of $n$ values is ``[<NUM>, separator...] * n`` (checked against the tokenizer once)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        ids, _ = tokenizer.encode("0.500" + SEPARATOR)
        num = tokenizer.num_token_id
        if ids.count(num) != 1 or ids[0] != num:
            raise ValueError(f"a value did not encode as one leading <NUM>: {ids}")
        self.unit = ids  # [<NUM>, separator ids]
        self.num = num

    def encode(self, values) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, numeric_values)`` ``[1, n * len(unit)]`` of the history ``values``, checked against the
        tokenizer's own encoding of its text."""
        values = quantised(values)
        ids, numbers = self.tokenizer.encode(causal_text(values) + SEPARATOR)
        expected = self.unit * len(values)
        if ids != expected:
            raise ValueError("the history did not encode as one <NUM> and the separator per value")
        return torch.tensor([ids]), torch.tensor([numbers], dtype=torch.float32)


@torch.no_grad()
def sampled_paths(
    model, encoder: Encoder, history, horizon: int, *, max_context: int, mode: str, paths: int, seed: int
):
    """``[paths, horizon]`` values: each path extends ``history`` by the value read under ``mode`` at every step
    (`causalqwen.regression.sampled_next_numbers`), quantised as the text writes it, the prompt the last
    ``max_context`` values. ``shared_individual`` draws each path's $\\varepsilon$ once, ``causal`` at every step."""
    generator = torch.Generator().manual_seed(seed)
    causal_size = model.config.causal_size
    shared = torch.rand(paths, causal_size, generator=generator, dtype=torch.float64)  # [P, C]
    rows = 1 if mode == "standard" else paths
    ids, numbers = encoder.encode(history[-max_context:])
    ids, numbers = ids.expand(rows, -1).clone(), numbers.expand(rows, -1).clone()  # [P, S]
    unit = len(encoder.unit)
    out = np.zeros((rows, horizon))
    for step in range(horizon):
        mask = torch.ones_like(ids)
        uniform = shared if mode == "shared_individual" else None
        value = sampled_next_numbers(model, ids, numbers, mask, mode, uniform=uniform, generator=generator)  # [P]
        written = torch.tensor(quantised(np.nan_to_num(value.double().numpy(), nan=0.0)))  # [P], as the text
        out[:, step] = written.numpy()
        new_ids = torch.tensor(encoder.unit).expand(rows, -1)  # [P, unit]
        new_numbers = torch.zeros(rows, unit)
        new_numbers[:, 0] = written.float()
        ids = torch.cat([ids, new_ids], dim=1)[:, -max_context * unit :]
        numbers = torch.cat([numbers, new_numbers], dim=1)[:, -max_context * unit :]
    return out


@torch.no_grad()
def one_step_laws(model, encoder: Encoder, series, start: int, max_context: int) -> tuple[np.ndarray, np.ndarray]:
    """``(loc, scale)`` of the law of each value of ``series[start:]`` given the true values before it (the last
    ``max_context``), read at the prompt's last token under standard inference."""
    locs, scales = [], []
    for t in range(start, len(series)):
        ids, numbers = encoder.encode(series[max(0, t - max_context) : t])
        law = next_number_law(model, ids, numbers, torch.ones_like(ids))
        locs.append(float(law.loc[0]))
        scales.append(float(law.scale[0]))
    return np.asarray(locs), np.asarray(scales)
