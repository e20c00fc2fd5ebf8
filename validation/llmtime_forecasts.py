r"""V15's forecasters: the two language-model rollouts (CausalQwen's $\mathrm{loc}_Y$, Qwen's sampled digits),
ARIMA chosen on a validation tail, and the naive baselines.

Both language models forecast the whole test part from the end of the training part, one step at a time,
each step conditioned on the last ``window`` values of its own path (the training texts are windows of
``window + 1`` values, so the context at every step has the length the models were trained on):

* `causal_rollout`: the context written by `validation.llmtime_series.causal_text` with a placeholder value
  after it; $\mathrm{loc}_Y$ and $\mathrm{scale}_Y$ read at the position whose next token is that placeholder's
  ``<NUM>`` (causal attention: the placeholder cannot influence them). The next value is $\mathrm{loc}_Y$ (the
  median of the predicted Cauchy law), quantised as the text writes it, and appended.
* `qwen_rollout`: ``samples`` independent paths; at each step each path's context is written by
  `validation.llmtime_series.digits_text` and continued by sampling (temperature 1.0, top-p 0.9, only the ten
  digits and ``,`` allowed: LLMTime's LLaMA arm) until ``,`` or ``MAX_VALUE_TOKENS`` tokens, then read by
  `validation.llmtime_series.parse_digits`. A value with no digit (the first token ``,``) is a parse failure:
  the path repeats its last value (LLMTime pads a too-short continuation with its last value); failures are
  counted. The forecast is the per-step median over the paths.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import torch

from causalqwen.files.data import collate

from .llmtime_series import PRECISION, TIME_SEP, causal_text, digits_text, parse_digits, scaled_mae

__all__ = [
    "MAX_VALUE_TOKENS",
    "TOP_P",
    "TEMPERATURE",
    "ARIMA_GRID",
    "causal_rollout",
    "qwen_rollout",
    "arima_forecast",
    "naive_forecast",
    "seasonal_naive_forecast",
    "interval_coverage",
    "window_texts",
]

MAX_VALUE_TOKENS = 8  # digits of one value (the scaled values stay below 10: at most 5 digits) and a comma
TOP_P = 0.9  # LLMTime's llama completion: top_p=0.9
TEMPERATURE = 1.0  # LLMTime's llama_hypers: temp=1.0
ARIMA_GRID = {"p": (1, 2, 4, 12), "d": (1, 2), "q": (0, 1)}


def window_texts(scaled_train: np.ndarray, window: int, writer) -> list[str]:
    """The training texts: every run of ``window + 1`` consecutive values of ``scaled_train``, written by
    ``writer`` (`digits_text` or `causal_text`)."""
    if len(scaled_train) <= window:
        raise ValueError(f"a training part of {len(scaled_train)} values has no window of {window + 1}")
    return [writer(scaled_train[i : i + window + 1]) for i in range(len(scaled_train) - window)]


def _quantised(value: float) -> float:
    """``value`` as the texts write it (LLMTime's truncated digits at `PRECISION`)."""
    return float(causal_text([value]))


@torch.no_grad()
def causal_rollout(model, numeric_tokenizer, context: np.ndarray, horizon: int, window: int) -> dict:
    r"""CausalQwen's rolled-out forecast (scaled units): ``{"loc": [horizon], "scale": [horizon]}``, the
    one-step predicted Cauchy law at each step of its own path."""
    path = [_quantised(v) for v in context[-window:]]
    num_id = numeric_tokenizer.num_token_id
    locs, scales = [], []
    model.eval()
    for _ in range(horizon):
        ids, values = numeric_tokenizer.encode(causal_text(path[-window:]) + ", 0.000")
        if ids.count(num_id) != window + 1 or ids[-1] != num_id:
            raise ValueError(f"the context of {window} values did not encode as {window + 1} <NUM> tokens")
        batch = collate(
            [{"input_ids": torch.tensor(ids), "numeric_values": torch.tensor(values, dtype=torch.float32)}],
            numeric_tokenizer.pad_token_id,
        )
        law = model.abduce(batch["input_ids"], batch["numeric_values"], batch["attention_mask"])
        decision = model.action(law.loc_U[0, len(ids) - 2], law.scale_U[0, len(ids) - 2])
        loc, scale = float(decision.loc_Y), float(decision.scale_Y)
        locs.append(loc)
        scales.append(scale)
        path.append(_quantised(loc) if math.isfinite(loc) else path[-1])
    return {"loc": np.array(locs), "scale": np.array(scales)}


def _allowed_ids(tokenizer) -> dict[str, int]:
    """The token id of each digit and of ``,`` (each must be one token of its own)."""
    ids = {}
    for character in "0123456789" + TIME_SEP:
        encoded = tokenizer(character, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            raise ValueError(f"the tokenizer writes {character!r} as {len(encoded)} tokens, not one")
        ids[character] = encoded[0]
    return ids


def _top_p_sample(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row from softmax(logits / TEMPERATURE) restricted to its top-p nucleus."""
    probabilities = torch.softmax(logits.double() / TEMPERATURE, dim=-1)
    ordered, order = probabilities.sort(dim=-1, descending=True)
    keep = (ordered.cumsum(-1) - ordered) < TOP_P  # the smallest prefix whose mass reaches TOP_P
    ordered = ordered * keep
    choice = torch.multinomial(ordered / ordered.sum(-1, keepdim=True), 1, generator=generator)
    return order.gather(-1, choice).squeeze(-1)


def _sample_values(model, prompts: list[list[int]], allowed: dict[str, int], generator) -> list[str]:
    """One sampled value (its text, up to the comma) continuing each prompt."""
    characters = list(allowed)
    allowed_ids = torch.tensor([allowed[c] for c in characters])
    lengths = torch.tensor([len(p) for p in prompts])
    buffer = torch.zeros((len(prompts), int(lengths.max()) + MAX_VALUE_TOKENS), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = torch.tensor(prompt)
    texts = [""] * len(prompts)
    active = list(range(len(prompts)))
    for _ in range(MAX_VALUE_TOKENS):
        index = torch.tensor(active)
        width = int(lengths[index].max())
        mask = (torch.arange(width)[None, :] < lengths[index][:, None]).long()
        logits = model(input_ids=buffer[index, :width], attention_mask=mask).logits
        last = logits[torch.arange(len(active)), lengths[index] - 1][:, allowed_ids]  # [n_active, 11]
        drawn = _top_p_sample(last, generator).tolist()
        still = []
        for row, k in zip(active, drawn):
            texts[row] += characters[k]
            buffer[row, lengths[row]] = allowed_ids[k]
            lengths[row] += 1
            if characters[k] != TIME_SEP:
                still.append(row)
        active = still
        if not active:
            break
    return texts


@torch.no_grad()
def qwen_rollout(model, tokenizer, context: np.ndarray, horizon: int, window: int, *, samples: int, seed: int) -> dict:
    """Qwen's sampled paths (scaled units): ``{"paths": [samples, horizon], "median": [horizon],
    "failures": int}`` (see the module docstring)."""
    allowed = _allowed_ids(tokenizer)
    generator = torch.Generator().manual_seed(seed)
    start = parse_digits(digits_text(context[-window:]))
    paths = [list(start) for _ in range(samples)]
    failures = 0
    model.eval()
    for _ in range(horizon):
        prompts = [[allowed[c] for c in digits_text(path[-window:], PRECISION)] for path in paths]
        for path, text in zip(paths, _sample_values(model, prompts, allowed, generator)):
            read = parse_digits(text) if text.strip(TIME_SEP) else []
            failures += not read
            path.append(read[0] if read else path[-1])
    forecast = np.array([path[window:] for path in paths])
    return {"paths": forecast, "median": np.median(forecast, axis=0), "failures": failures}


def naive_forecast(train: np.ndarray, horizon: int) -> np.ndarray:
    """The last training value, repeated."""
    return np.full(horizon, float(train[-1]))


def seasonal_naive_forecast(train: np.ndarray, horizon: int, season: int) -> np.ndarray:
    """The training part's last season, repeated: step h gets ``train[len - season + (h mod season)]``."""
    if season > len(train):
        raise ValueError(f"season {season} is longer than the training part ({len(train)})")
    return np.array([train[len(train) - season + h % season] for h in range(horizon)], dtype=np.float64)


def _arima_fit_forecast(train: np.ndarray, horizon: int, order: tuple[int, int, int]) -> np.ndarray:
    """One statsmodels ARIMA fit (its warnings silenced, BLAS on one thread: several threads on a shared
    2-core machine made each fit four times slower) and its ``horizon``-step forecast."""
    from statsmodels.tsa.arima.model import ARIMA
    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")
        fitted = ARIMA(train, order=order).fit()
    return np.asarray(fitted.forecast(horizon), dtype=np.float64)


def arima_forecast(train: np.ndarray, horizon: int, grid: dict = ARIMA_GRID) -> tuple[np.ndarray, tuple, dict]:
    """ARIMA (statsmodels) with the order of ``grid`` whose forecast of the training part's last 20% from the
    first 80% has the lowest scaled MAE, refitted on the whole training part: ``(forecast, order, scores)``.
    An order whose fit fails or forecasts non-finite values is skipped (its score NaN)."""
    point = int(len(train) * 0.8)
    fit_part, validation = train[:point], train[point:]
    scores = {}
    for order in itertools.product(grid["p"], grid["d"], grid["q"]):
        try:
            forecast = _arima_fit_forecast(fit_part, len(validation), order)
            scores[order] = scaled_mae(validation, forecast) if np.isfinite(forecast).all() else math.nan
        except (ValueError, np.linalg.LinAlgError):
            scores[order] = math.nan
    finite = {order: s for order, s in scores.items() if math.isfinite(s)}
    if not finite:
        raise RuntimeError("no ARIMA order of the grid could be fitted on the validation split")
    best = min(finite, key=finite.get)
    return _arima_fit_forecast(train, horizon, best), best, scores


def interval_coverage(truth: np.ndarray, loc: np.ndarray, scale: np.ndarray, level: float) -> float:
    r"""The share of ``truth`` inside the central ``level`` interval of Cauchy(loc, scale):
    $\mathrm{loc} \pm \mathrm{scale}\cdot\tan(\pi(q - 1/2))$ with $q = (1 + \mathrm{level})/2$."""
    half = np.asarray(scale, dtype=np.float64) * math.tan(math.pi * ((1 + level) / 2 - 0.5))
    inside = np.abs(np.asarray(truth, dtype=np.float64) - np.asarray(loc, dtype=np.float64)) <= half
    return float(inside.mean())
