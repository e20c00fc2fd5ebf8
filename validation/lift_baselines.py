r"""V14's tabular baselines on LIFT's data: the classical ones with LIFT's published tuning, and robust ones.

**Classical** (``regression/utils/resultsCollector.py``'s ``reg_model``, rewritten): a degree-3 polynomial by least
squares (no tuning), and six tuned methods, each fitted for every candidate of LIFT's grid on the training set and
kept by the lowest plain RAE on the 50 validation points: kernel ridge (RBF, $\gamma \in \{0.01, 0.1, 1\}$),
k-NN ($k \in \{2, 5, 8\}$), an MLP (three hidden layers of 50, 500 iterations, learning rate
$\{10^{-2}, 10^{-3}, 10^{-4}\}$, seed 1), gradient boosting (500 trees of depth 4, learning rate
$\{0.1, 0.01, 0.001\}$), a random forest (500 trees, depth $\{4, 6\}$, seed 0) and a Gaussian process
(kernel $1.41^2\,\mathrm{RBF}(0.1)$, noise $\alpha = 0.16$, 5 or 10 optimizer restarts, seed 0).

**Robust** (not in LIFT): the same degree-3 polynomial fitted with the Huber loss (scikit-learn's
``HuberRegressor``, $\epsilon = 1.35$, on standardized features) and by the Cauchy likelihood
$\max_{\beta, \gamma} \sum_i \log \mathrm{Cauchy}(y_i;\ \phi(x_i)^\top\beta, \gamma)$ (``scipy.optimize``, started
from the Huber fit); and causal-sklearn's ``MLPCauchyRegressor`` and ``MLPCausalRegressor`` (PyPI
``causal-sklearn``, the CausalQwen authors' tabular engine) at their defaults, seed 0.
"""

from __future__ import annotations

import warnings

import numpy as np

from .lift_data import LiftData, finite, rae, require

__all__ = ["CLASSICAL", "ROBUST", "QUICK_METHODS", "LABELS", "fit_predict", "baseline_predictions"]

CLASSICAL = ("poly", "krr", "knn", "nn", "xg", "rf", "gp")
ROBUST = ("huber", "cauchy", "mlp_cauchy", "mlp_causal")
QUICK_METHODS = ("poly", "krr", "knn", "huber", "cauchy")  # the fast ones, for --quick
LABELS = {
    "poly": "polynomial (degree 3)",
    "krr": "kernel ridge",
    "knn": "k-NN",
    "nn": "MLP",
    "xg": "gradient boosting",
    "rf": "random forest",
    "gp": "Gaussian process",
    "huber": "Huber polynomial (degree 3)",
    "cauchy": "Cauchy-likelihood polynomial (degree 3)",
    "mlp_cauchy": "causal-sklearn MLPCauchyRegressor",
    "mlp_causal": "causal-sklearn MLPCausalRegressor",
}
DEGREE = 3


def _candidates(method: str) -> list:
    """LIFT's grid for a tuned classical method (fresh estimators)."""
    require("sklearn", "the classical baselines")
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF
    from sklearn.kernel_ridge import KernelRidge
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.neural_network import MLPRegressor

    if method == "krr":
        return [KernelRidge(kernel="rbf", gamma=gamma) for gamma in (0.01, 0.1, 1.0)]
    if method == "knn":
        return [KNeighborsRegressor(n_neighbors=k) for k in (2, 5, 8)]
    if method == "nn":
        return [
            MLPRegressor(random_state=1, max_iter=500, hidden_layer_sizes=(50, 50, 50), learning_rate_init=rate)
            for rate in (1e-2, 1e-3, 1e-4)
        ]
    if method == "xg":
        return [
            GradientBoostingRegressor(n_estimators=500, max_depth=4, min_samples_split=5, learning_rate=rate)
            for rate in (0.1, 0.01, 0.001)
        ]
    if method == "rf":
        return [RandomForestRegressor(n_estimators=500, max_depth=depth, random_state=0) for depth in (4, 6)]
    if method == "gp":
        return [
            GaussianProcessRegressor(
                kernel=1.41**2 * RBF(length_scale=0.1), alpha=0.16, n_restarts_optimizer=restarts, random_state=0
            )
            for restarts in (5, 10)
        ]
    raise ValueError(f"unknown tuned method {method!r}")


def _features(x: np.ndarray) -> np.ndarray:
    """$[x, x^2, x^3]$ (the intercept is fitted apart)."""
    return np.stack([x**k for k in range(1, DEGREE + 1)], axis=1)


def _polynomial(data: LiftData) -> np.ndarray:
    """Least squares on $[1, x, x^2, x^3]$ (LIFT's ``PolynomialFeatures(3)`` + ``LinearRegression``)."""
    design = np.column_stack([np.ones_like(data.x_train), _features(data.x_train)])
    beta, *_ = np.linalg.lstsq(design, data.y_train, rcond=None)
    return np.column_stack([np.ones_like(data.x_test), _features(data.x_test)]) @ beta


def _huber(data: LiftData):
    """The fitted Huber polynomial: ``(predict, scaler, model)``."""
    from sklearn.linear_model import HuberRegressor
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(_features(data.x_train))
    model = HuberRegressor(epsilon=1.35, max_iter=2000).fit(scaler.transform(_features(data.x_train)), data.y_train)
    return (lambda x: model.predict(scaler.transform(_features(x)))), scaler, model


def _cauchy(data: LiftData) -> np.ndarray:
    r"""The degree-3 polynomial of largest Cauchy likelihood: minimizes
    $\sum_i [\log\gamma + \log(1 + r_i^2/\gamma^2)]$, $r_i = y_i - \beta_0 - \phi(x_i)^\top\beta$, over
    $(\beta_0, \beta, \log\gamma)$ by L-BFGS from the Huber fit."""
    from scipy.optimize import minimize

    _, scaler, huber = _huber(data)
    design = np.column_stack([np.ones(len(data.x_train)), scaler.transform(_features(data.x_train))])
    start_beta = np.concatenate([[huber.intercept_], huber.coef_])
    start_scale = max(float(np.median(np.abs(data.y_train - design @ start_beta))), 1e-3)

    def loss_and_gradient(theta):
        beta, log_scale = theta[:-1], theta[-1]
        scale = np.exp(log_scale)
        residual = data.y_train - design @ beta
        ratio = residual**2 / scale**2
        loss = np.sum(log_scale + np.log1p(ratio))
        weight = 2 * residual / (scale**2 + residual**2)
        return loss, np.concatenate([-design.T @ weight, [np.sum(1 - 2 * ratio / (1 + ratio))]])

    theta = minimize(
        loss_and_gradient, np.concatenate([start_beta, [np.log(start_scale)]]), jac=True, method="L-BFGS-B"
    ).x
    test = np.column_stack([np.ones(len(data.x_test)), scaler.transform(_features(data.x_test))])
    return test @ theta[:-1]


def _tuned(method: str, data: LiftData) -> np.ndarray:
    """LIFT's selection: every candidate fitted on the training set, the lowest validation RAE kept."""
    best = None
    for model in _candidates(method):
        model.fit(data.x_train[:, None], data.y_train)
        score = rae(model.predict(data.x_valid[:, None]), data.y_valid)
        if best is None or score < best[0]:
            best = (score, model)
    return best[1].predict(data.x_test[:, None])


def _causal_sklearn(method: str, data: LiftData) -> np.ndarray:
    module = require("causal_sklearn", "the MLPCauchyRegressor and MLPCausalRegressor baselines")
    estimator = module.MLPCauchyRegressor if method == "mlp_cauchy" else module.MLPCausalRegressor
    model = estimator(random_state=0).fit(data.x_train[:, None], data.y_train)
    return np.asarray(model.predict(data.x_test[:, None]), dtype=np.float64).ravel()


def fit_predict(method: str, data: LiftData) -> np.ndarray:
    """The test predictions of ``method`` fitted on ``data``'s training set (float64, finite or refused)."""
    if method == "poly":
        predicted = _polynomial(data)
    elif method == "huber":
        predicted = _huber(data)[0](data.x_test)
    elif method == "cauchy":
        predicted = _cauchy(data)
    elif method in ("mlp_cauchy", "mlp_causal"):
        predicted = _causal_sklearn(method, data)
    else:
        predicted = _tuned(method, data)
    return finite(f"{method}'s predictions on {'/'.join(map(str, data.key))}", predicted)


def baseline_predictions(datasets: list[LiftData], methods: tuple[str, ...]) -> dict:
    """``{method: {data.key: test predictions}}`` for every method and data set, on one thread (run in a worker
    process beside the language models' training)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    results: dict = {method: {} for method in methods}
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the published MLP / GP settings
        for data in datasets:
            for method in methods:
                results[method][data.key] = fit_predict(method, data)
    return results
