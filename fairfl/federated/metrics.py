"""Fairness metrics of a vector of per-client values (usually test accuracies).

Definitions, as the papers report them: the standard deviation has ddof = 0; worst / best
x% is the mean of the ⌊x·N⌋ lowest / highest clients (FedFV, q-FFL) — at least one client;
percentiles are numpy's linear interpolation (what FedMGDA+'s plotting code reported as the
5th / 95th percentile); the improved share counts ties as improved (FedMGDA+ footnote 6,
DQN-Fed eq. 29).
"""
from __future__ import annotations

import math

import numpy as np


def _vec(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError("metric of an empty vector")
    return a


def mean(a) -> float:
    return float(_vec(a).mean())


def std(a) -> float:
    """Population standard deviation (ddof = 0)."""
    return float(_vec(a).std(ddof=0))


def _k(n: int, fraction: float) -> int:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return max(1, math.floor(fraction * n + 1e-9))


def worst(a, fraction: float = 0.1) -> float:
    """Mean of the ⌊fraction·N⌋ lowest values (at least one)."""
    v = np.sort(_vec(a))
    return float(v[: _k(v.size, fraction)].mean())


def best(a, fraction: float = 0.1) -> float:
    """Mean of the ⌊fraction·N⌋ highest values (at least one)."""
    v = np.sort(_vec(a))
    return float(v[-_k(v.size, fraction):].mean())


def seed_interval(a, level: float = 0.95) -> tuple[float, float, float]:
    """Mean over seeds and its two-sided Student-t confidence interval: (mean, low, high).
    For a paired comparison pass the per-seed differences (runs that share a seed share their
    initial model and sampled clients, so the difference removes that noise). One seed has no
    interval: (value, nan, nan)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    v = _vec(a)
    if not np.isfinite(v).all():
        raise ValueError("seed_interval of non-finite values (a run that never reached a threshold is inf): "
                         "summarise those separately")
    m = float(v.mean())
    if v.size < 2:
        return m, math.nan, math.nan
    from scipy import stats
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return m, m - half, m + half


def percentile(a, q: float) -> float:
    return float(np.percentile(_vec(a), q))


def angle_to_uniform(a) -> float:
    """Angle in degrees between the vector and the all-ones vector (DQN-Fed Table 5);
    0 means every client has the same value. A zero vector has angle 0 by convention."""
    v = _vec(a)
    norm = np.linalg.norm(v)
    if norm == 0:
        return 0.0
    cos = np.clip(v.sum() / (norm * math.sqrt(v.size)), -1.0, 1.0)
    return float(np.degrees(np.arccos(cos)))


def kl_to_uniform(a) -> float:
    """KL(â ‖ uniform) with â = a / Σa (DQN-Fed Table 5); values must be non-negative."""
    v = _vec(a)
    if (v < 0).any():
        raise ValueError("KL to uniform needs non-negative values")
    s = v.sum()
    if s == 0:
        return 0.0
    p = v / s
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] * v.size)))


def improved_share(loss_before, loss_after) -> float:
    """Share of participants whose training loss did not increase after the server update
    (ties count as improved)."""
    b, a = _vec(loss_before), _vec(loss_after)
    if b.shape != a.shape:
        raise ValueError("loss_before and loss_after differ in length")
    return float(np.mean(a <= b))


def summary(acc, fraction: float = 0.1) -> dict[str, float]:
    """The usual table row for a vector of per-client accuracies."""
    pct = f"{100 * fraction:.6g}"  # 0.29 -> "29", not int(28.999...) = 28
    return {"mean": mean(acc), "std": std(acc), f"worst{pct}%": worst(acc, fraction),
            f"best{pct}%": best(acc, fraction), "p5": percentile(acc, 5),
            "p95": percentile(acc, 95), "angle": angle_to_uniform(acc), "kl": kl_to_uniform(acc)}


def rounds_to_reach(rounds, values, threshold: float, above: bool = True) -> float:
    """The first evaluated round at which ``values`` reaches ``threshold`` (≥ it, or ≤ it with
    ``above=False``); NaN if it never does. The answer is only as fine as the evaluation grid."""
    r, v = np.asarray(rounds, dtype=np.float64), _vec(values)
    if r.shape != v.shape:
        raise ValueError(f"{r.size} rounds for {v.size} values")
    hit = np.nonzero(v >= threshold if above else v <= threshold)[0]
    return float(r[hit[0]]) if hit.size else float("nan")


def mean_by_quantile(key, values, q: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(quantile edges of ``key``, the mean of ``values`` within each of the q quantile bins of
    ``key``, lowest first; NaN for an empty bin)."""
    k, v = _vec(key), _vec(values)
    if k.shape != v.shape:
        raise ValueError(f"{k.size} keys for {v.size} values")
    edges = np.quantile(k, np.arange(1, q) / q)
    bins = np.searchsorted(edges, k, side="right")
    return edges, np.array([v[bins == i].mean() if (bins == i).any() else np.nan for i in range(q)])
