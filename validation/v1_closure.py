r"""Cauchy closure: Monte Carlo against the analytic law

**Claim.** For independent $X_j \sim \mathrm{Cauchy}(\mu_j, \gamma_j)$ and any real weights,

$$
Y_k = \sum_j W_{kj} X_j + b_k \;\sim\; \mathrm{Cauchy}\Big(\sum_j W_{kj}\mu_j + b_k,\ \sum_j \lvert W_{kj}\rvert\,\gamma_j\Big),
$$

which `causalqwen.cauchy.linear` computes as ``(loc @ W.T + b, scale @ |W|.T)``. The action network
relies on it twice: the exogenous noise $\varepsilon \sim \mathrm{Cauchy}(0, \lvert b_{\mathrm{noise}}\rvert)$
is added to $U \sim \mathrm{Cauchy}(\mathrm{loc}_U, \mathrm{scale}_U)$, giving
$U' \sim \mathrm{Cauchy}(\mathrm{loc}_U, \mathrm{scale}_U + \lvert b_{\mathrm{noise}}\rvert)$, and $U'$ is mapped
linearly to the class scores $S_k$ and the regression value $Y$ (`ActionNetwork.forward`).

**Method.** Two set-ups, both with mixed-sign weights (so that $\sum_j \lvert W_{kj}\rvert\gamma_j$ and
$\lvert\sum_j W_{kj}\gamma_j\rvert$ differ):

1. *Linear map.* Random $\mu$, $\gamma$, $W$, $b$; the analytic law from `cauchy.linear`.
2. *Noise infusion + action.* An `ActionNetwork` (float64) with random mixed-sign heads and a
   $b_{\mathrm{noise}}$ with negative components; the analytic laws of $S_k$ and $Y$ from its
   ``forward``.

The Monte Carlo side never touches the package: NumPy draws $X_j$ (and $\varepsilon_j$) as
$\mu_j + \gamma_j\,\mathrm{standard\_cauchy}()$ in float64 and applies the weights by hand. Each output
component is compared with the analytic Cauchy law by a one-sample Kolmogorov–Smirnov test
(`scipy.stats.kstest` against `scipy.stats.cauchy(loc, scale)`). With the correct law the p-values
are uniform on $[0, 1]$; every one must exceed $10^{-3}$ (with the number of tests below, a false
alarm has probability about 1%). As a control that the test has power, the same samples are
tested against the law with the *signed* scale $\lvert\sum_j W_{kj}\gamma_j\rvert$ (what one gets by
forgetting the absolute value), which must be rejected at that same level. The QQ plot shows the standardized samples
$(y - \mathrm{loc})/\mathrm{scale}$ against standard-Cauchy quantiles for probabilities in $[0.02, 0.98]$.
"""  # noqa: E501

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats

from causalqwen import cauchy
from causalqwen.action import ActionNetwork

from .common import ExperimentResult, check, fmt, module_text, save_figure, table

SEED = 1
IN_DIM = 6  # components of X (and of U)
OUT_DIM = 4  # outputs of the random linear map
CLASSES = 4  # class scores S_k of the action network
P_MIN = 1e-3  # every KS p-value must exceed this
CONTROL_P_MAX = P_MIN  # the control (wrong scale) must be rejected at the level the true law passes


def _draw_cauchy(rng: np.random.Generator, loc: np.ndarray, scale: np.ndarray, n: int) -> np.ndarray:
    """``n`` rows of independent Cauchy(loc_j, scale_j) draws, float64 (NumPy only)."""
    return loc + scale * rng.standard_cauchy(size=(n, loc.shape[0]))


def _mixed_signs(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Normal weights whose every row has a positive and a negative entry (the first two)."""
    weight = rng.normal(0.0, 1.0, (rows, cols))
    weight[:, 0] = np.abs(weight[:, 0])
    weight[:, 1] = -np.abs(weight[:, 1])
    return weight


def _ks(samples: np.ndarray, loc: float, scale: float) -> float:
    return float(stats.kstest(samples, stats.cauchy(loc=loc, scale=scale).cdf).pvalue)


def _linear_map_outputs(rng: np.random.Generator, n: int) -> list[tuple]:
    """Set-up 1: a random mixed-sign linear map; one ``(setup, label, samples, loc, scale, signed)`` per output."""
    mu = rng.normal(0.0, 3.0, IN_DIM)
    gamma = rng.uniform(0.2, 3.0, IN_DIM)
    weight = _mixed_signs(rng, OUT_DIM, IN_DIM)
    bias = rng.normal(0.0, 1.0, OUT_DIM)
    loc_t, scale_t = cauchy.linear(torch.tensor(mu), torch.tensor(gamma), torch.tensor(weight), torch.tensor(bias))
    linear_loc, linear_scale = loc_t.numpy(), scale_t.numpy()
    linear_signed = np.abs(weight @ gamma)  # the wrong scale of the control
    x = _draw_cauchy(rng, mu, gamma, n)  # [n, IN_DIM]
    y = x @ weight.T + bias  # [n, OUT_DIM]
    return [
        ("linear map", f"Y_{k + 1}", y[:, k], linear_loc[k], linear_scale[k], linear_signed[k]) for k in range(OUT_DIM)
    ]


def _action_outputs(rng: np.random.Generator, n: int) -> list[tuple]:
    """Set-up 2: noise infusion + a float64 `ActionNetwork` with random mixed-sign heads; one output tuple per
    class score S_k and one for Y."""
    action = ActionNetwork(IN_DIM, CLASSES, noise_init=0.0).double()
    with torch.no_grad():
        action.classification_head.weight.copy_(torch.tensor(_mixed_signs(rng, CLASSES, IN_DIM)))
        action.classification_head.bias.copy_(torch.tensor(rng.normal(0.0, 1.0, CLASSES)))
        action.regression_head.weight.copy_(torch.tensor(_mixed_signs(rng, 1, IN_DIM)))
        action.regression_head.bias.copy_(torch.tensor(rng.normal(0.0, 1.0, 1)))
        action.b_noise.copy_(torch.tensor(rng.uniform(-1.5, 1.5, IN_DIM)))  # some components negative
        loc_U = rng.normal(0.0, 3.0, IN_DIM)
        scale_U = rng.uniform(0.2, 3.0, IN_DIM)
        decided = action(torch.tensor(loc_U), torch.tensor(scale_U))
    action_loc = np.concatenate([decided.loc_S.numpy(), decided.loc_Y.reshape(1).numpy()])
    action_scale = np.concatenate([decided.scale_S.numpy(), decided.scale_Y.reshape(1).numpy()])
    w_cls = action.classification_head.weight.detach().numpy()
    w_all = np.concatenate([w_cls, action.regression_head.weight.detach().numpy()])  # [CLASSES + 1, IN_DIM]
    b_all = np.concatenate(
        [action.classification_head.bias.detach().numpy(), action.regression_head.bias.detach().numpy()]
    )
    noise = np.abs(action.b_noise.detach().numpy())
    action_signed = np.abs(w_all @ (scale_U + noise))
    u = _draw_cauchy(rng, loc_U, scale_U, n)  # the individual
    eps = _draw_cauchy(rng, np.zeros(IN_DIM), noise, n)  # the exogenous noise, independent of u
    s = (u + eps) @ w_all.T + b_all  # [n, CLASSES + 1]: S_1..S_K, Y
    return [
        (
            "action (noise infused)",
            f"S_{k + 1}" if k < CLASSES else "Y",
            s[:, k],
            action_loc[k],
            action_scale[k],
            action_signed[k],
        )
        for k in range(CLASSES + 1)
    ]


def _ks_rows(outputs: list[tuple]) -> tuple[list[list], list[float], list[float]]:
    """The results table's rows, the KS p-values against the analytic law and those of the control."""
    rows, p_values, control_p = [], [], []
    for setup, label, samples, loc, scale, signed in outputs:
        p = _ks(samples, loc, scale)
        p_control = _ks(samples, loc, signed)
        median = float(np.median(samples))
        half_iqr = float(np.subtract(*np.percentile(samples, [75, 25])) / 2)  # = scale for a Cauchy law
        rows.append([setup, f"${label}$", loc, median, scale, half_iqr, p, signed, p_control])
        p_values.append(p)
        control_p.append(p_control)
    return rows, p_values, control_p


def _qq_figure(outputs: list[tuple], n: int, out_dir: Path) -> str:
    """QQ plot: standardized samples against standard-Cauchy quantiles, one panel per set-up."""
    probabilities = np.linspace(0.02, 0.98, 193)
    theory = stats.cauchy.ppf(probabilities)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for axis, (setup_name, picks) in zip(
        axes, [("linear map", range(OUT_DIM)), ("noise infusion + action", range(OUT_DIM, len(outputs)))]
    ):
        for index in picks:
            _, label, samples, loc, scale, _ = outputs[index]
            axis.plot(theory, np.quantile((samples - loc) / scale, probabilities), ".", ms=3, label=f"${label}$")
        _, label, samples, loc, _, signed = outputs[picks[0]]
        axis.plot(
            theory,
            np.quantile((samples - loc) / signed, probabilities),
            "x",
            ms=3,
            color="grey",
            label=f"${label}$ with the signed scale (control)",
        )
        axis.plot(theory, theory, "k-", lw=0.8, label="identity")
        axis.set_ylim(1.5 * theory[0], 1.5 * theory[-1])  # the control leaves the frame in the tails
        axis.set(
            xlabel="standard Cauchy quantile",
            ylabel="sample quantile of (y - loc) / scale",
            title=f"{setup_name}: QQ, n = {n}",
        )
        axis.legend(fontsize=7)
    return save_figure(figure, out_dir, "v1_closure_qq.png")


def _body(text: str, rows: list[list]) -> str:
    return "\n\n".join(
        [
            text,
            "**Results.** Analytic location and scale against the Monte Carlo median and half inter-quartile "
            "range (both equal location and scale for a Cauchy law), the KS p-value against the analytic law, "
            "and the control.",
            table(
                [
                    "set-up",
                    "output",
                    "analytic loc",
                    "MC median",
                    "analytic scale",
                    "MC half-IQR",
                    "KS p",
                    "signed scale (control)",
                    "control KS p",
                ],
                rows,
            ),
        ]
    )


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    n = 20_000 if quick else 200_000
    rng = np.random.default_rng(SEED)
    outputs = _linear_map_outputs(rng, n) + _action_outputs(rng, n)
    rows, p_values, control_p = _ks_rows(outputs)
    figure_name = _qq_figure(outputs, n, out_dir)

    title, text = module_text(__name__)
    min_p, max_control = min(p_values), max(control_p)
    claims = [
        check(
            f"every KS p-value against the analytic law exceeds {fmt(P_MIN)} ({len(p_values)} tests; minimum shown)",
            min_p,
            ">=",
            P_MIN,
        ),
        check(
            "the control with the signed scale is rejected in every test (maximum p shown)",
            max_control,
            "<=",
            CONTROL_P_MAX,
        ),
    ]
    return ExperimentResult(
        name="V1",
        title=title,
        claims=claims,
        body=_body(text, rows),
        figures=[figure_name],
        headline=(
            f"min KS p = {fmt(min_p, 3)} over {len(p_values)} outputs (n = {n}); control max p = {fmt(max_control, 3)}"
        ),
        settings=f"n = {n} Monte Carlo draws per output, NumPy seed {SEED}, {IN_DIM} input components, float64",
    )
