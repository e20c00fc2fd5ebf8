r"""LIFT's synthetic regression data (Dinh et al., NeurIPS 2022), rewritten from its published recipe, and its metric.

The recipe is the authors' ``regression/utils/regressionDataGen.py`` (repository
UW-Madison-Lee-Lab/LanguageInterfacedFineTuning), read and rewritten here, not copied: at $p = 1$, NumPy's global
generator seeded with 123 draws 250 inputs $x \sim U(-10, 10)$ (200 training + 50 validation), then 100 test
inputs from the same law, then the training noise $\varepsilon \sim N(0, (0.1\,\mathrm{std}\,f(x))^2)$ on the 250
(the standard deviation of the noiseless targets); test targets are noiseless. The 250 are split into 200 training
and 50 validation points by Python's ``random.shuffle``, which LIFT leaves unseeded: its three "simulations" share
the inputs, the noise and the test set, and differ only in this split. Here simulation ``sim`` shuffles with
``random.Random(sim)``. The outliers (``regression/robustness/outliers.ipynb``, 4 of them for the published
``out_n_4`` tables): NumPy seeded with 123 again, $x \sim U(-10, 10)$, $y = |N(0, 20^2)|$, appended to the training
set (so their $x$ are the first four data inputs, a quirk of the recipe, kept).

The six functions, each scaled by LIFT to about $[-9, 9]$ on $[-10, 10]$: linear $0.9x$; quadratic
$\tfrac{9}{50}(x^2 - 50)$; exponential $18\,\big(\tfrac{e^{0.2x} - e^{-2}}{e^{2} - e^{-2}} - 0.5\big)$; cosine
$9\cos(\pi x / 2)$; l1norm $18\,(|x|/10 - 0.5)$; piecewise $18\,\big((g(x) + 4)/8 - 0.5\big)$ with $g = x + 6$
below $-3$, $0$ on $[-3, 3)$, $x - 6$ above.

The metric (``regression/utils/resultsCollector.py``): $\mathrm{RAE} = \sum_i |\hat y_i - y_i| / \sum_i |\bar y -
y_i|$ with $\bar y$ the mean of the test targets. LIFT's published tables (``save_csv``) first drop the test points
whose error exceeds 3 times the method's own RMSE (`lift_rae`); `rae` is the plain ratio.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FUNCTIONS",
    "CONDITIONS",
    "SEED",
    "N_TRAIN",
    "N_VALID",
    "N_TEST",
    "N_OUTLIERS",
    "PUBLISHED",
    "PUBLISHED_SOURCE",
    "LiftData",
    "target",
    "generate",
    "outliers",
    "prompt_text",
    "answer_text",
    "training_text",
    "finite",
    "rae",
    "lift_rae",
    "require",
]

FUNCTIONS = ("linear", "quadratic", "exponential", "cosine", "l1norm", "piecewise")
CONDITIONS = ("clean", "outliers")
SEED = 123  # np.random.seed(123) in regressionDataGen.generate and in outliers.ipynb's produceOutlier
N_TRAIN, N_VALID, N_TEST = 200, 50, 100
NOISE_LEVEL = 0.1
N_OUTLIERS = 4  # out_n_4: 2% of the training set, int(200 * 2 / 98)
OUTLIER_SCALE = 20.0
LOW, HIGH = -10.0, 10.0
# LIFT's text, with one change: a line break after "###" (see `prompt_text`)
PROMPT = "When we have x1=%.4f, what should be the y value?###\n"
ANSWER = "%.3f@@@"

PUBLISHED_SOURCE = {
    "clean": "regression/accuracy/syn_mean_across_3sims.csv (rows p = 1, (-10, 10), real inputs)",
    "outliers": "regression/robustness/out_n_4/syn_mean_across_3sims.csv",
}
# The published means over LIFT's 3 simulations (RAE after its 3-RMSE filter), as they stand in the two files of
# PUBLISHED_SOURCE (UW-Madison-Lee-Lab/LanguageInterfacedFineTuning), rounded to 4 decimals. Columns: poly
# (degree-3 polynomial), krr (kernel ridge), knn, nn (MLP), xg (gradient boosting), rf (random forest), gp
# (Gaussian process), gpt3 (LIFT/GPT-3 ada), gptj (LIFT/GPT-J).
_COLUMNS = ("poly", "krr", "knn", "nn", "xg", "rf", "gp", "gpt3", "gptj")
_PUBLISHED_ROWS = {
    "clean": {
        "linear": (0.0102, 0.0471, 0.0415, 0.0346, 0.0498, 0.0448, 0.0081, 0.0637, 0.0811),
        "quadratic": (0.0082, 0.0530, 0.0486, 0.0348, 0.0570, 0.0542, 0.0111, 0.1316, 0.1111),
        "exponential": (0.0380, 0.0677, 0.0522, 0.0195, 0.0483, 0.0386, 0.0134, 0.0934, 0.1089),
        "cosine": (1.0522, 0.1212, 0.1359, 0.3794, 0.1479, 0.3540, 0.0352, 0.4359, 0.3849),
        "l1norm": (0.2291, 0.0595, 0.0453, 0.0280, 0.0599, 0.0605, 0.0288, 0.0892, 0.0997),
        "piecewise": (0.4507, 0.1661, 0.0782, 0.0848, 0.0619, 0.0673, 0.1024, 0.1667, 0.1465),
    },
    "outliers": {
        "linear": (0.1459, 0.2348, 0.2058, 0.1016, 0.6730, 0.1896, 0.8076, 0.0683, 0.0704),
        "quadratic": (0.1300, 0.2115, 0.2026, 0.6450, 0.6760, 0.1454, 0.9250, 0.1155, 0.1199),
        "exponential": (0.1769, 0.3209, 0.2563, 0.5381, 0.7638, 0.2170, 1.2506, 0.0982, 0.1109),
        "cosine": (1.0753, 0.2350, 0.3364, 1.0310, 0.8213, 0.3376, 0.7547, 0.4894, 0.3592),
        "l1norm": (0.2171, 0.2181, 0.2117, 0.3507, 0.6878, 0.1466, 0.7801, 0.0978, 0.1017),
        "piecewise": (0.5070, 0.3809, 0.3522, 0.7901, 0.6673, 0.2223, 0.7233, 0.1612, 0.1542),
    },
}
PUBLISHED = {
    condition: {function: dict(zip(_COLUMNS, row)) for function, row in rows.items()}
    for condition, rows in _PUBLISHED_ROWS.items()
}


def require(package: str, purpose: str):
    """``import package`` or a clear error naming it and what V14 needs it for (nothing is downloaded)."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise ImportError(
            f"V14 needs the package {package!r} for {purpose}; install the project's validation extra "
            "(pip install -e '.[validation]')"
        ) from error


def finite(name: str, values) -> np.ndarray:
    """``values`` as a float64 array; a NaN or an infinity is refused by ``name``."""
    array = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(array)
    if bad.any():
        where = int(np.flatnonzero(bad.ravel())[0])
        raise ValueError(f"{name} holds a non-finite value ({array.ravel()[where]!r} at index {where})")
    return array


def target(function: str, x) -> np.ndarray:
    """LIFT's noiseless target of ``function`` at the inputs ``x`` (p = 1)."""
    x = np.asarray(x, dtype=np.float64)
    if function == "linear":
        return 0.9 * x
    if function == "quadratic":
        return (x**2 - 50) * 9 / 50
    if function == "exponential":
        return ((np.exp(0.2 * x) - np.exp(-2)) / (np.exp(2) - np.exp(-2)) - 0.5) * 18
    if function == "cosine":
        return 9 * np.cos(0.5 * np.pi * x)
    if function == "l1norm":
        return (np.abs(x) / 10 - 0.5) * 18
    if function == "piecewise":
        g = np.where(x < -3.0, x + 6, np.where(x < 3.0, 0.0, x - 6))
        return ((g + 4) / 8 - 0.5) * 18
    raise ValueError(f"unknown LIFT function {function!r}; one of {', '.join(FUNCTIONS)}")


@dataclass(frozen=True)
class LiftData:
    """One data set: ``function``, ``condition`` ("clean" or "outliers"), ``sim`` (the split's seed) and the arrays
    (float64, one input per row)."""

    function: str
    condition: str
    sim: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_valid: np.ndarray
    y_valid: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def key(self) -> tuple[str, str, int]:
        return self.function, self.condition, self.sim


def outliers(n: int = N_OUTLIERS) -> tuple[np.ndarray, np.ndarray]:
    """LIFT's ``produceOutlier(n)``: ``(x, y)`` with the generator seeded with 123, $x \\sim U(-10, 10)$ then
    $y = |N(0, 20^2)|$."""
    generator = np.random.RandomState(SEED)
    x = generator.uniform(LOW, HIGH, n)
    return x, np.abs(generator.normal(0.0, OUTLIER_SCALE, n))


def generate(function: str, sim: int, condition: str = "clean") -> LiftData:
    """The data set of ``function`` (p = 1) for LIFT's simulation ``sim`` (see the module docstring)."""
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    generator = np.random.RandomState(SEED)
    n = N_TRAIN + N_VALID
    x = generator.uniform(LOW, HIGH, n)
    x_test = generator.uniform(LOW, HIGH, N_TEST)
    clean = target(function, x)
    y = clean + generator.normal(0.0, NOISE_LEVEL * np.std(clean), n)
    order = np.arange(n)
    random.Random(sim).shuffle(order)
    train, valid = order[:N_TRAIN], order[N_TRAIN:]
    x_train, y_train = x[train], y[train]
    if condition == "outliers":
        x_out, y_out = outliers()
        x_train, y_train = np.concatenate([x_train, x_out]), np.concatenate([y_train, y_out])
    data = LiftData(function, condition, sim, x_train, y_train, x[valid], y[valid], x_test, target(function, x_test))
    for field in ("x_train", "y_train", "x_valid", "y_valid", "x_test", "y_test"):
        finite(f"{function}/{condition}/sim {sim}: {field}", getattr(data, field))
    return data


def prompt_text(x: float) -> str:
    """LIFT's prompt for the input ``x``, "When we have x1=%.4f, what should be the y value?###", with a line break
    added after "###": the number grammar does not read a number right after "#" (an issue number), and the line
    break makes Qwen2's pre-tokenizer end the prompt with the same token whatever the answer's sign."""
    return PROMPT % float(finite("the input x", x))


def answer_text(y: float) -> str:
    """LIFT's answer: the value at 3 decimals, then "@@@"."""
    return ANSWER % float(finite("the answer y", y))


def training_text(x: float, y: float) -> str:
    return prompt_text(x) + answer_text(y)


def rae(predicted, truth) -> float:
    """$\\sum |\\hat y - y| / \\sum |\\bar y - y|$, $\\bar y$ the mean of ``truth`` (LIFT's ``regressionLoss``)."""
    predicted, truth = finite("the predictions", predicted), finite("the targets", truth)
    if predicted.shape != truth.shape:
        raise ValueError(f"{predicted.shape[0]} predictions for {truth.shape[0]} targets")
    spread = float(np.abs(truth.mean() - truth).sum())
    return float(np.abs(predicted - truth).sum()) / spread if spread > 0 else math.nan


def lift_rae(predicted, truth, threshold: float = 3.0) -> float:
    """The RAE of LIFT's published tables: the points whose absolute error exceeds ``threshold`` times the RMSE of
    the same predictions are dropped first (``regressionLoss(..., outlier_filter=True)``)."""
    predicted, truth = finite("the predictions", predicted), finite("the targets", truth)
    errors = np.abs(predicted - truth)
    kept = errors <= threshold * math.sqrt(float(np.mean(errors**2)))
    return rae(predicted[kept], truth[kept])
