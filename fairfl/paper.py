"""The papers' reported numbers, as data, for side-by-side tables (never used to produce ours).

Sources are the texts in ``shared/papers`` (REPRODUCTION.md lists them)."""
from __future__ import annotations

import numpy as np
import pandas as pd

# FedMGDA+ Table 7 (Adult, 500 rounds, 5 seeds): test accuracy %, (uniform, PhD, non-PhD).
# Uniform = accuracy over all test samples (non-PhD dominates it).
FEDMGDA_TABLE7: dict[tuple[str, float], tuple[float, float, float]] = {
    ("AFL", 0.0): (83.26, 77.90, 83.32),
    ("AFL", 1.0): (81.86, 74.25, 81.94),
    ("q-FedAvg (q=5)", 0.0): (83.26, 76.80, 83.33),
    ("q-FedAvg (q=5)", 10000.0): (81.07, 73.48, 81.16),
    ("FedMGDA+", float("nan")): (83.24, 76.58, 83.32),   # "any bias"
    ("PhD only", float("nan")): (81.05, 72.82, 81.14),
}


def side_by_side(ours: pd.DataFrame, paper: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Join our mean ± std (columns ``<c>`` and ``<c>_std``) with the paper's ``<c>``, adding
    the difference ours − paper for every column."""
    out = pd.DataFrame(index=ours.index)
    for c in columns:
        p = paper[c].reindex(ours.index) if c in paper else pd.Series(np.nan, index=ours.index)
        out[f"{c} paper"] = p
        out[f"{c} ours"] = [f"{m:.2f} ± {s:.2f}" for m, s in zip(ours[c], ours[f"{c}_std"])]
        out[f"{c} diff"] = (ours[c] - p).round(2)
    return out
