"""Statistics over seeds: exact sign-flip (randomisation) p-values of a location and the
confidence bounds that invert them, intervals that stay inside a metric's range, seed-paired
differences, Holm's correction (with Shaffer's refinement where two nulls cannot both be true) and
Benjamini–Hochberg q-values. Why this test: the comment below; its power: :mod:`~fairfl.studies.protocol.power`."""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from fairfl.base.errors import ConfigError

# ----------------------------------------------------------------------------- statistics over seeds
#
# Every interval and test is the randomisation (sign-flip) test of a location over seeds and its
# inversion. Runs that share a seed share their partition, initial model and sampled clients, so
# the seed-paired differences d_1..d_n of two methods carry none of that noise; under the null
# hypothesis "the differences are centred at c" each d_i − c is as likely to have either sign (the
# seeds are exchangeable draws; the assumption is symmetry, where the t-test's is normality). The
# test of H0: Δ ≤ c against Δ > c with the statistic Σ(d_i − c) has the exact p-value
#
#     p_greater(c) = (1 + #{non-empty subsets F of the seeds: mean_F(d) ≤ c}) / 2ⁿ
#
# (flipping the signs of a set F moves the statistic by −2·Σ_F (d_i − c), which is ≥ 0 exactly when
# mean_F(d) ≤ c), so its one-sided bound at level a is an order statistic of the 2ⁿ − 1 subset means
# (Hartigan 1969, "Using subsample values as typical values"). Why this method:
# * a bound is a mean of the seeds' own values, so it lies between the smallest and the largest
#   seed: no interval leaves the metric's range (an accuracy stays in [0, 100], a σ above 0), as
#   Student-t intervals did;
# * its level is exact for any n, and it is honest about few seeds: no p-value is below 2⁻ⁿ, so a
#   bound at a level below 2⁻ⁿ does not exist and the interval is the metric's whole range (three
#   seeds cannot resolve anything at 2.5 % a side; a percentile bootstrap over (1, 2, 3) would,
#   wrongly: all its resampled means are positive);
# * p-values and intervals come from the same subset means, so a verdict read from an adjusted
#   p-value and one read from the adjusted interval never disagree.
# For n > EXACT_SEEDS the subsets are drawn at random (each seed in with probability 1/2, a fixed
# generator) and a p-value is the Monte Carlo one, (1 + count) / (draws + 1).

EXACT_SEEDS = 16
DRAWS = 2 ** 16 - 1
TOL = 1e-9          # values are rounded to this before they are compared (equal seeds give equal means)


def finite_values(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def sign_patterns(n: int) -> int:
    """How many equally likely sign patterns a p-value counts: 2ⁿ, or DRAWS + 1."""
    return 2 ** n if n <= EXACT_SEEDS else DRAWS + 1


def subset_means(values) -> np.ndarray:
    """The sorted means of the non-empty subsets of ``values`` (NaN dropped): all 2ⁿ − 1 of them
    for n ≤ ``EXACT_SEEDS``, else ``DRAWS`` random ones, rounded to 1e-9."""
    v = finite_values(values)
    n = v.size
    if n == 0:
        return np.empty(0)
    if n <= EXACT_SEEDS:
        masks = (np.arange(1, 2 ** n)[:, None] >> np.arange(n)) & 1
    else:
        masks = np.random.default_rng(0).integers(0, 2, size=(DRAWS, n))
        masks[masks.sum(1) == 0, 0] = 1
    return np.sort(np.round(masks @ v / masks.sum(1), 9))


def p_greater(values, c: float) -> float:
    """The exact one-sided p-value of H0: the seeds' location ≤ ``c`` against > ``c``; NaN where no
    value is finite."""
    means = subset_means(values)
    if means.size == 0:
        return math.nan
    return (1 + int(np.searchsorted(means, round(c, 9), side="right"))) / sign_patterns(finite_values(values).size)


def p_less(values, c: float) -> float:
    """The exact one-sided p-value of H0: location ≥ ``c`` against < ``c``."""
    means = subset_means(values)
    if means.size == 0:
        return math.nan
    below = int(np.searchsorted(means, round(c, 9), side="left"))
    return (1 + means.size - below) / sign_patterns(finite_values(values).size)


def p_two_sided(values, c: float = 0.0) -> float:
    """Two-sided p-value of H0: location = ``c`` (twice the smaller one-sided one, at most 1)."""
    return min(1.0, 2 * min(p_greater(values, c), p_less(values, c)))


def bounds(values, a: float, limits: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float]:
    """(lower, upper) one-sided confidence bounds of the seeds' location, each at level ``a``
    (together a two-sided interval of level 1 − 2a): H0: location ≤ c is rejected at level a
    exactly when c < lower, H0: location ≥ c exactly when c > upper. Where the seeds are too few
    for level a (2⁻ⁿ > a) the bounds are ``limits``, the metric's range; no finite value: NaN."""
    if not 0 < a < 1:
        raise ConfigError(f"a one-sided level must be in (0, 1), got {a}")
    means = subset_means(values)
    if means.size == 0:
        return math.nan, math.nan
    k = math.floor(a * sign_patterns(finite_values(values).size) + TOL) - 1      # means ≤ c allowed below the bound
    if k < 0:
        return limits
    return max(float(means[k]), limits[0]), min(float(means[-1 - k]), limits[1])


def location(values, level: float = 0.95, limits: tuple[float, float] = (-math.inf, math.inf)
             ) -> tuple[float, float, float]:
    """(mean, low, high): the seeds' mean (NaN dropped) and the two-sided interval of ``level``
    from :func:`bounds`."""
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level}")
    v = finite_values(values)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    lo, hi = bounds(v, (1 - level) / 2, limits)
    return float(v.mean()), lo, hi


def paired(a: Mapping[Any, float], b: Mapping[Any, float]) -> tuple[np.ndarray, int]:
    """(the differences a − b over the seeds both have with a finite value, how many shared seeds
    were dropped because one of the two is NaN: a run that diverged)."""
    shared = sorted(set(a) & set(b), key=str)
    pairs = np.array([(a[s], b[s]) for s in shared], dtype=np.float64).reshape(-1, 2)
    ok = np.isfinite(pairs).all(axis=1)
    return pairs[ok, 0] - pairs[ok, 1], int((~ok).sum())


def holm(p, alpha: float = 0.05, exclusive=None) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down correction of the p-values ``p`` at family-wise level ``alpha`` (NaN: not a
    test, left out of the family), as (adjusted p-values, the one-sided level at which each
    test's confidence bound is drawn). The test of rank r (1: the smallest p) among m is compared
    with α/(m − r + 1) while every test before it was rejected; from the first test Holm keeps,
    that test's level holds for it and every later one. So a bound excludes its null value
    exactly when the adjusted p-value is ≤ α.

    ``exclusive`` (one key per test, None for a test on its own): tests that share a key have
    null hypotheses of which **at most one can be true** (a claim part's "gain ≤ 0" and
    "gain ≥ margin" with margin > 0). Then the divisor of rank r is Shaffer's (1986, his method 2,
    "given the specific hypotheses rejected"): the largest number of nulls that can still be true
    together once the r − 1 before it are rejected — each test on its own that is not rejected
    counts one, each key with a test not yet rejected counts one — never more than Holm's
    m − r + 1. This is a shortcut of closed testing with Bonferroni's local tests (an intersection
    of nulls that can hold together is at most that many), so the family-wise error stays ≤ α."""
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha}")
    p = np.asarray(p, dtype=np.float64)
    adjusted, level = np.full(p.shape, np.nan), np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    if m == 0:
        return adjusted, level
    keys = [None] * p.size if exclusive is None else list(exclusive)
    if len(keys) != p.size:
        raise ConfigError(f"holm: {len(keys)} keys for {p.size} p-values")
    order = idx[np.argsort(p[idx], kind="stable")]
    divisors = possibly_true([keys[j] for j in order])
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(divisors * p[order]))
    kept = next((i for i, j in enumerate(order) if adjusted[j] > alpha + TOL), m)
    for i, j in enumerate(order):
        level[j] = alpha / divisors[min(i, kept)]
    return adjusted, level


def possibly_true(keys) -> np.ndarray:
    """For tests in the order they are rejected (``keys`` as :func:`holm` takes them), the divisor
    of each step: how many nulls can be true together when every test before it is rejected —
    the tests on their own (key None) still in, plus the keys with a test still in."""
    keys = list(keys)
    out = np.empty(len(keys))
    for i in range(len(keys)):
        rest = keys[i:]
        out[i] = sum(1 for k in rest if k is None) + len({k for k in rest if k is not None})
    return out


def benjamini_hochberg(p) -> np.ndarray:
    """Benjamini–Hochberg q-values of ``p`` (NaN left out of the family): the tests with q ≤ x are
    the discoveries at false-discovery rate x."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    q = p[order] * m / np.arange(1, m + 1)
    out[order] = np.minimum(1.0, np.minimum.accumulate(q[::-1])[::-1])
    return out
