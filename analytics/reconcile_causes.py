"""Why the exporter's cost and the bill's differ, a row of the reconciliation at a time
(``cause``), the kind of each cause in a few words (``kind``) and the gap totalled by kind
(``by_cause``)."""

from __future__ import annotations

import pandas as pd

TOLERANCE_USD = 0.01
TOLERANCE_SHARE = 0.01
"""A gap within a cent, or within 1 % of the bill, is reconciled."""


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(TOLERANCE_USD, TOLERANCE_SHARE * abs(b))


def cause(gpu_hours: float, billed_gpu_hours: float, cost_usd: float, billed_cost_usd: float,
          credits_usd: float) -> str:
    """The likely cause of a gap between the exporter's cost and the bill's (net)."""
    billed_net = billed_cost_usd + credits_usd
    if _close(cost_usd, billed_net):
        return "reconciled"
    if billed_gpu_hours > gpu_hours and not _close(gpu_hours, billed_gpu_hours):
        return (f"unmonitored GPUs: {billed_gpu_hours - gpu_hours:.1f} GPU-hours billed that "
                "the exporter did not see")
    if gpu_hours > billed_gpu_hours and not _close(gpu_hours, billed_gpu_hours):
        return (f"{gpu_hours - billed_gpu_hours:.1f} GPU-hours counted that the bill does not "
                "charge here (another cluster's rows, another project's bill, or a day not "
                "exported yet)")
    if credits_usd and _close(cost_usd, billed_cost_usd):
        return (f"credits of {credits_usd:,.2f} USD on the bill: committed use or discounts "
                "the exporter does not apply (prices.commitments, prices.negotiated)")
    per_hour = billed_cost_usd / billed_gpu_hours if billed_gpu_hours else 0.0
    ours_per_hour = cost_usd / gpu_hours if gpu_hours else 0.0
    return (f"price drift: billed {per_hour:.4f} USD a GPU-hour before credits, the exporter "
            f"{ours_per_hour:.4f} (prices.book, prices.negotiated)")


KINDS = (("reconciled", "reconciled"),
         ("unmonitored GPUs", "unmonitored GPUs: billed, not seen by the exporter"),
         ("credits of", "credits the exporter does not apply"),
         ("price drift", "price drift: the bill's price is not the exporter's"))
"""Each cause's kind, by how its words begin (``cause``); the other kind is GPU-hours the
exporter counted that the bill does not charge here."""
COUNTED_NOT_BILLED = "counted, not billed here: another cluster, project or day"


def kind(cause_words: str) -> str:
    """The kind of gap ``cause`` named, in a few words."""
    return next((k for start, k in KINDS if cause_words.startswith(start)), COUNTED_NOT_BILLED)


def by_cause(table: pd.DataFrame) -> pd.DataFrame:
    """The gap totalled by the kind of its cause: ``cause``, ``rows``, ``gap_usd``, the
    largest gap first."""
    kinds = table.cause.map(kind)
    out = table.assign(cause=kinds).groupby("cause", as_index=False).agg(
        rows=("gap_usd", "size"), gap_usd=("gap_usd", "sum"))
    return out.assign(order=-out.gap_usd.abs()).sort_values(["order", "cause"]) \
        .drop(columns="order").reset_index(drop=True)
