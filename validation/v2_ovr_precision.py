r"""OvR probability accuracy in float32 over $t \in [-10^{10}, 10^{10}]$

**Claim.** With $t = (\mathrm{loc}_S - C)/\mathrm{scale}_S$ the OvR probability is
$P(t) = \tfrac12 + \arctan(t)/\pi$, and the classification loss needs $\log P$ and $\log(1 - P)$. The
package evaluates both in log space without any $\epsilon$ (decision D8):

$$
\log P(t) = \begin{cases} \log\big(\arctan(-1/t)/\pi\big) & t < -1 \\ \log\big(\tfrac12 + \arctan(t)/\pi\big) & \lvert t\rvert \le 1 \\ \operatorname{log1p}\big(-\arctan(1/t)/\pi\big) & t > 1 \end{cases}
\qquad \log\big(1 - P(t)\big) = \log P(-t),
$$

and in float32 both keep a relative error of a few float32 ulps ($2^{-23} \approx 1.2\cdot10^{-7}$)
over the whole range. The seeds' form (forward_pass §5.1),

$$
\log(P + \epsilon),\quad \log(1 - P + \epsilon),\qquad P = \tfrac12 + \arctan(t)/\pi \text{ in float32},\ \epsilon = 10^{-7},
$$

loses all relative accuracy in both tails: $P$ rounds to 0 or 1 long before the true tail mass
underflows, and $\epsilon$ then replaces the tail mass.

**Method.** A grid of $\lvert t\rvert$ from $10^{-6}$ to $10^{10}$ (logarithmically spaced, both
signs, and $t = 0$) in three float32 set-ups $(\mathrm{scale}_S, C)$, with
$\mathrm{loc}_S = \mathrm{fl}_{32}(C + t\,\mathrm{scale}_S)$. The reference is computed with mpmath (50
digits) from the *exact* float32 inputs, so it includes no rounding of the inputs. Compared:
`causalqwen.losses.ovr_log_probability` (which calls `cauchy.log_sf` / `cauchy.log_cdf`) in float32,
the seeds' form in float32, and SciPy in float64 (`scipy.stats.cauchy.logsf` / `logcdf`, for
scale). The relative error is $\lvert\hat y - y\rvert / \lvert y\rvert$; an exact result is drawn at
$10^{-17}$ on the log axis.
"""  # noqa: E501

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import mpmath
import numpy as np
import torch
from scipy import stats

from causalqwen.losses import ovr_log_probability

from .common import ExperimentResult, check, fmt, module_text, save_figure, table

SETUPS = [(1.0, 0.0), (10.0, 100.0), (1e-6, 100.0)]  # (scale_S, threshold C), float32
SEED_EPS = 1e-7  # the eps of the seeds' log(P + eps) (forward_pass.zh.md, ovr loss)
MAX_REL_ERROR = 1e-5  # the stable form's bound ("a few float32 ulps")
ULP32 = 2.0**-23
BREAK = 0.01  # the naive form "breaks" where its relative error passes 1%
FLOOR = 1e-17  # where exact results are drawn (below float64 rounding)
TABLE_T = [-1e10, -1e6, -1e3, -10.0, -1.0, 0.0, 1.0, 10.0, 1e3, 1e6, 1e10]


def _reference(loc: np.ndarray, scale: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """log P and log(1 - P) in 50-digit arithmetic from the exact float32 inputs, rounded to float64."""
    log_p, log_not_p = [], []
    with mpmath.workdps(50):
        for loc_value, scale_value in zip(loc.tolist(), scale.tolist()):
            t = (mpmath.mpf(loc_value) - mpmath.mpf(threshold)) / mpmath.mpf(scale_value)
            tail = mpmath.atan(t) / mpmath.pi
            log_p.append(float(mpmath.log(mpmath.mpf(0.5) + tail)))
            log_not_p.append(float(mpmath.log(mpmath.mpf(0.5) - tail)))
    return np.array(log_p), np.array(log_not_p)


def _naive(loc: np.ndarray, scale: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' float32 form: P = 1/2 + atan(t)/pi, then log(P + eps) and log(1 - P + eps)."""
    loc_t, scale_t = torch.tensor(loc), torch.tensor(scale)
    t = (loc_t - threshold) / scale_t
    p = 0.5 + torch.atan(t) / torch.pi
    return torch.log(p + SEED_EPS).double().numpy(), torch.log(1 - p + SEED_EPS).double().numpy()


def _relative_error(approx: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return np.abs(approx - reference) / np.abs(reference)


def _first_break(t: np.ndarray, error: np.ndarray, sign: int) -> float:
    """The smallest |t| on the side ``sign`` where ``error`` exceeds BREAK (nan if it never does)."""
    side = (np.sign(t) == sign) & (error > BREAK)
    return float(np.abs(t[side]).min()) if side.any() else float("nan")


def _setup_errors(scale_value: float, threshold: float, t_grid: np.ndarray) -> tuple[np.ndarray, dict, dict]:
    """One float32 set-up: the t the inputs really hold, the relative error of every form against the mpmath
    reference, and the values (reference, stable, seeds' form) of log P and log(1 - P)."""
    scale = np.full(t_grid.shape, scale_value, dtype=np.float32)
    loc = (np.float32(threshold) + t_grid * np.float64(scale[0])).astype(np.float32)
    t_exact = (loc.astype(np.float64) - threshold) / np.float64(scale[0])  # the t the inputs really hold
    ref_p, ref_not_p = _reference(loc, scale, threshold)
    stable_p, stable_not_p = (
        x.double().numpy() for x in ovr_log_probability(torch.tensor(loc), torch.tensor(scale), threshold)
    )
    naive_p, naive_not_p = _naive(loc, scale, threshold)
    scipy_p = stats.cauchy.logsf(threshold, loc.astype(np.float64), scale.astype(np.float64))
    scipy_not_p = stats.cauchy.logcdf(threshold, loc.astype(np.float64), scale.astype(np.float64))
    errors = {
        "stable log P": _relative_error(stable_p, ref_p),
        "stable log(1-P)": _relative_error(stable_not_p, ref_not_p),
        "seeds log(P+eps)": _relative_error(naive_p, ref_p),
        "seeds log(1-P+eps)": _relative_error(naive_not_p, ref_not_p),
        "SciPy float64 log P": _relative_error(scipy_p, ref_p),
        "SciPy float64 log(1-P)": _relative_error(scipy_not_p, ref_not_p),
    }
    values = {
        "ref_p": ref_p,
        "stable_p": stable_p,
        "naive_p": naive_p,
        "ref_not_p": ref_not_p,
        "stable_not_p": stable_not_p,
        "naive_not_p": naive_not_p,
    }
    return t_exact, errors, values


def _summary_rows(per_setup: list[tuple]) -> list[list]:
    """Per set-up: the maximum relative error of each form over the grid (the stable form also in ulps)."""
    summary_rows = []
    for scale_value, threshold, t_exact, errors in per_setup:
        summary_rows.append(
            [
                f"scale = {fmt(scale_value)}, C = {fmt(threshold)}",
                errors["stable log P"].max(),
                errors["stable log P"].max() / ULP32,
                errors["stable log(1-P)"].max(),
                errors["stable log(1-P)"].max() / ULP32,
                errors["seeds log(P+eps)"].max(),
                errors["seeds log(1-P+eps)"].max(),
                max(errors["SciPy float64 log P"].max(), errors["SciPy float64 log(1-P)"].max()),
            ]
        )
    return summary_rows


def _break_rows(t_exact: np.ndarray, errors: dict) -> list[list]:
    """Where the seeds' form breaks on each side, and its relative error at the end of the range."""
    break_rows = []
    for name, label in (
        ("seeds log(P+eps)", "seeds $\\log(P + \\epsilon)$"),
        ("seeds log(1-P+eps)", "seeds $\\log(1 - P + \\epsilon)$"),
    ):
        for sign, side in ((-1, "t < 0"), (1, "t > 0")):
            at_end = errors[name][np.argmax(np.abs(t_exact) * (np.sign(t_exact) == sign))]
            break_rows.append([label, side, _first_break(t_exact, errors[name], sign), at_end])
    return break_rows


def _value_rows(t_exact: np.ndarray, values: dict) -> list[list]:
    """The reference, stable and seeds' values of log P and log(1 - P) at the grid points nearest `TABLE_T`."""
    value_rows = []
    for t_value in TABLE_T:
        i = int(np.argmin(np.abs(t_exact - t_value)))
        value_rows.append(
            [t_exact[i]]
            + [
                f"{values[key][i]:.9g}"
                for key in ("ref_p", "stable_p", "naive_p", "ref_not_p", "stable_not_p", "naive_not_p")
            ]
        )
    return value_rows


def _error_figure(t_exact: np.ndarray, errors: dict, out_dir: Path) -> str:
    """Relative error against |t|, one panel per tail."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    styles = {
        "stable log P": ("C0", "-"),
        "stable log(1-P)": ("C1", "-"),
        "seeds log(P+eps)": ("C3", "--"),
        "seeds log(1-P+eps)": ("C2", "--"),
        "SciPy float64 log P": ("C4", ":"),
        "SciPy float64 log(1-P)": ("C5", ":"),
    }
    for axis, sign, side in zip(axes, (-1, 1), ("t < 0", "t > 0")):
        mask = np.sign(t_exact) == sign
        for name, (color, style) in styles.items():
            thin = name.startswith("SciPy")
            axis.plot(
                np.abs(t_exact[mask]),
                np.maximum(errors[name][mask], FLOOR),
                style,
                color=color,
                label=name,
                lw=0.7 if thin else 1.3,
                alpha=0.6 if thin else 1.0,
            )
        axis.axhline(ULP32, color="grey", lw=0.8, ls="-.", label="float32 ulp $2^{-23}$")
        axis.set(xscale="log", yscale="log", xlabel="|t|", title=f"{side} (scale = 1, C = 0)")
    axes[0].set_ylabel(f"relative error (exact drawn at {FLOOR:g})")
    axes[0].legend(fontsize=7, loc="upper left")
    return save_figure(figure, out_dir, "v2_ovr_precision.png")


def _body(text: str, summary_rows: list[list], break_rows: list[list], value_rows: list[list]) -> str:
    return "\n\n".join(
        [
            text,
            "**Results.** Maximum relative error over the grid, per set-up (the stable form also in float32 ulps).",
            table(
                [
                    "set-up",
                    "stable log P",
                    "(ulps)",
                    "stable log(1−P)",
                    "(ulps)",
                    "seeds log(P+ε)",
                    "seeds log(1−P+ε)",
                    "SciPy float64 (both)",
                ],
                summary_rows,
            ),
            "Where the seeds' form breaks (set-up scale = 1, C = 0): the smallest $\\lvert t\\rvert$ at which its "
            f"relative error passes {fmt(BREAK)}, and its relative error at the end of the range. For most classes "
            "$\\mathrm{loc}_S \\ll C$ ($t \\ll 0$), where the loss term is $-\\log(1 - P)$.",
            table(["form", "side", "relative error > 1% from |t| =", "relative error at |t| = 1e10"], break_rows),
            "Values at selected $t$ (set-up scale = 1, C = 0): the reference, the stable form and the seeds' form.",
            table(
                [
                    "t",
                    "log P (ref)",
                    "log P (stable)",
                    "log P (seeds)",
                    "log(1−P) (ref)",
                    "log(1−P) (stable)",
                    "log(1−P) (seeds)",
                ],
                value_rows,
            ),
        ]
    )


def run(quick: bool, out_dir: Path) -> ExperimentResult:
    points = 161 if quick else 641
    magnitudes = np.logspace(-6, 10, points)
    t_grid = np.concatenate([-magnitudes[::-1], [0.0], magnitudes])

    per_setup, plotted = [], None
    for scale_value, threshold in SETUPS:
        t_exact, errors, values = _setup_errors(scale_value, threshold, t_grid)
        per_setup.append((scale_value, threshold, t_exact, errors))
        if plotted is None:  # the tables of values and breaks, and the figure, show the first set-up
            plotted = (t_exact, errors, values)
    t_exact, errors, values = plotted
    break_rows = _break_rows(t_exact, errors)
    figure_name = _error_figure(t_exact, errors, out_dir)

    worst_p = max(errors_["stable log P"].max() for *_, errors_ in per_setup)
    worst_not_p = max(errors_["stable log(1-P)"].max() for *_, errors_ in per_setup)
    worst_naive = max(
        max(errors_["seeds log(P+eps)"].max(), errors_["seeds log(1-P+eps)"].max()) for *_, errors_ in per_setup
    )
    title, text = module_text(__name__)
    claims = [
        check("stable $\\log P$: maximum relative error over every set-up", worst_p, "<=", MAX_REL_ERROR),
        check("stable $\\log(1 - P)$: maximum relative error over every set-up", worst_not_p, "<=", MAX_REL_ERROR),
        check(
            "the seeds' $\\log(P + \\epsilon)$ form loses all relative accuracy in the range "
            "(its maximum relative error)",
            worst_naive,
            ">=",
            0.5,
        ),
    ]
    first_break = min(row[2] for row in break_rows)
    return ExperimentResult(
        name="V2",
        title=title,
        claims=claims,
        body=_body(text, _summary_rows(per_setup), break_rows, _value_rows(t_exact, values)),
        figures=[figure_name],
        headline=(
            f"stable max rel. error {fmt(max(worst_p, worst_not_p), 3)} "
            f"({fmt(max(worst_p, worst_not_p) / ULP32, 3)} ulps); the seeds' form passes 1% error from "
            f"|t| = {fmt(first_break, 2)}, reaches {fmt(worst_naive, 2)}"
        ),
        settings=(
            f"{len(t_grid)} values of t per set-up, set-ups (scale, C) = "
            f"{', '.join(f'({fmt(a)}, {fmt(b)})' for a, b in SETUPS)}, float32; reference mpmath 50 digits"
        ),
    )
