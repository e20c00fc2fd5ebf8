r"""The rows of the claims ledger (V13): one checked statement of the design documents each.

A `LedgerRow` says where a claim is made (document and section), the statement in plain English, how it was
checked (an independent oracle or a measurement), the figures the run computed, and the verdict the run computed
from them. The verdict is one of `VERDICTS`, or begins with one of `CONDITIONAL_PREFIXES` followed by the condition
or what the code does instead. Verdicts are data: a claim that fails is a finding. What makes the experiment pass
is its `Claim` list: that the measurements ran and that the package agrees with the independent oracles they use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .common import Claim, table

__all__ = [
    "VERDICTS",
    "CONDITIONAL_PREFIXES",
    "FOUNDATIONS",
    "OVERVIEW",
    "FORWARD",
    "INFERENCE",
    "LedgerRow",
    "DECISIONS",
    "is_allowed_verdict",
    "ledger_table",
    "verdict_counts",
]

VERDICTS = ("holds", "fails")
CONDITIONAL_PREFIXES = ("holds only under ", "diverges from the draft: ")

# The seed documents, as the ledger names them (../shared/seeds/).
FOUNDATIONS = "math_foundations_v1"
OVERVIEW = "math_overview_reviewed"
FORWARD = "forward_pass"
INFERENCE = "inference"


# The project's decisions that record where the code departs from the drafts (docs/decisions.md), as links from a
# page in docs/validation/.
DECISIONS = {
    "D10": "[D10](../decisions.md#d10-numerical-safety)",
    "D14": "[D14](../decisions.md#d14-initial-scale-and-threshold)",
    "D18": "[D18](../decisions.md#d18-the-exogenous-noise-its-name-its-sign-and-its-kink)",
    "D19": "[D19](../decisions.md#d19-a-learnable-threshold-is-the-bias-under-another-name)",
    "D20": "[D20](../decisions.md#d20-scales-are-clamped-below-only)",
    "D21": "[D21](../decisions.md#d21-top-p-keeps-the-token-that-crosses-p)",
    "D22": "[D22](../decisions.md#d22-w_num-starts-as-a-unit-vector)",
}


@dataclass
class LedgerRow:
    """One claim of the design documents, checked."""

    where: str  # document and section, e.g. "math_foundations_v1 §4.1"
    statement: str  # the claim in plain English
    method: str  # the oracle or measurement
    figures: str  # the numbers the run computed (markdown, one line)
    verdict: str  # "holds", "fails", "holds only under ...", "diverges from the draft: ..."
    claims: list[Claim] = field(default_factory=list)  # the package against the row's oracle (must hold)


def is_allowed_verdict(verdict: str) -> bool:
    """Whether ``verdict`` is "holds", "fails", or a conditional verdict that names its condition."""
    if verdict in VERDICTS:
        return True
    return any(verdict.startswith(prefix) and len(verdict) > len(prefix) for prefix in CONDITIONAL_PREFIXES)


def verdict_counts(rows: list[LedgerRow]) -> dict[str, int]:
    """How many rows hold, fail, hold only under a condition, or diverge from the drafts."""
    counts = {"holds": 0, "fails": 0, "holds only under a condition": 0, "diverges from the draft": 0}
    for row in rows:
        if row.verdict in VERDICTS:
            counts[row.verdict] += 1
        elif row.verdict.startswith(CONDITIONAL_PREFIXES[0]):
            counts["holds only under a condition"] += 1
        else:
            counts["diverges from the draft"] += 1
    return counts


def ledger_table(rows: list[LedgerRow]) -> str:
    """The ledger as a markdown table, one numbered row per claim, the verdict in bold."""
    return table(
        ["#", "where", "claim", "method", "figures", "verdict"],
        [
            [f"C{index}", row.where, row.statement, row.method, row.figures, f"**{row.verdict}**"]
            for index, row in enumerate(rows, start=1)
        ],
    )
