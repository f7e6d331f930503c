"""The power of the test actually used — the exact subset-means (sign-flip) test of
:mod:`~fairfl.studies.protocol.statistics` — and the plan of seeds it gives, before the runs.

**The rejection region.** With n seeds the one-sided test of H0: Δ ≤ 0 rejects at level a when
``p_greater(d, 0) = (1 + #{non-empty subsets F: mean_F(d) ≤ 0}) / 2ⁿ ≤ a``, that is when at most
r = ⌊a·2ⁿ⌋ − 1 of the 2ⁿ − 1 subset means are ≤ 0 (r < 0: it never rejects). Equivalently the
(r + 1)-th smallest subset mean is > 0.

**How many seeds must agree** (:func:`fewest_agreeing`). k seeds that dissent (d_i ≤ 0) make
every non-empty subset of them a subset of mean ≤ 0: at least 2ᵏ − 1 of them, so p ≥ 2ᵏ/2ⁿ, with
equality when the dissenters are the smallest in magnitude (their total below every agreeing
seed: then no subset holding an agreeing seed has mean ≤ 0). So a rejection at level a needs at
most k dissenters with 2ᵏ ≤ a·2ⁿ: at least n − ⌊log₂(a·2ⁿ)⌋ = ⌈log₂(1/a)⌉ agreeing seeds (for
a ≥ 2⁻ⁿ), whatever n — more seeds do not lower that count, they raise the chance of reaching it.

**Power under normal seeds** (:func:`power_constant`, :func:`power_at`, :func:`detectable_difference`).
With d_i = δ + σ·Z_i, Z_i i.i.d. N(0, 1), the test is scale-free (the signs of subset means do
not depend on σ), so its power depends on δ/σ alone: it rejects iff δ/σ > c* = −m₍ᵣ₊₁₎(Z), minus
the (r + 1)-th smallest subset mean of the Z's. So power(δ) = P(c* < δ/σ), and the smallest δ
detected with probability π is σ times the π-quantile of c*. For r = 0 (every seed must agree)
c* = max(−Z_i) and the quantile is exact: Φ⁻¹(π^{1/n}). For r ≥ 1 it is simulated: ``DRAWS``
draws of Z from a fixed generator (``SEED``), every subset mean enumerated (n ≤ 16), and the
Monte Carlo error stated (the distribution-free 95 % interval of the quantile from the order
statistics, :attr:`PowerConstant.low` / :attr:`PowerConstant.high`).

**Planning** (:func:`seed_plan`): from pilot spreads (the seed-paired differences' standard
deviations of an earlier run), the detectable difference and the agreeing seeds each candidate n
gives at the strictest level of the declared procedure."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from fairfl.base.errors import ConfigError
from .statistics import EXACT_SEEDS, TOL, finite_values, sign_patterns

DRAWS = 20_000          # normal draws per power constant (r ≥ 1); the error this leaves is reported with it
SEED = 2024             # the simulation's fixed generator
_CHUNK_BYTES = 1 << 26  # subset sums are made this many bytes at a time


def rejections_allowed(n: int, a: float) -> int:
    """r: how many of the 2ⁿ − 1 subset means may lie at or below the null for the exact test with n
    seeds to reject at level ``a`` (−1: it cannot reject at that level)."""
    if n < 1:
        return -1
    return math.floor(a * sign_patterns(n) + TOL) - 1


def fewest_agreeing(n: int, a: float) -> int | None:
    """The fewest of n seeds that must lie beyond the null for a rejection at level ``a`` to be
    possible at all (the best case: the dissenters the smallest in magnitude, p = 2ᵏ/2ⁿ for k of
    them); None where no n seeds can reach level a (2⁻ⁿ > a)."""
    if n > EXACT_SEEDS:
        raise ConfigError(f"fewest_agreeing: n = {n} seeds; the exact test is enumerated up to {EXACT_SEEDS}")
    r = rejections_allowed(n, a)
    if r < 0:
        return None
    k = int(math.floor(math.log2(r + 1) + TOL))          # 2ᵏ − 1 ≤ r subsets of the dissenters
    return n - k


def best_case_p(n: int, dissenters: int) -> float:
    """p = 2ᵏ/2ⁿ: the exact p-value when k of n seeds dissent and are the smallest in magnitude."""
    return 2.0 ** dissenters / 2.0 ** n


@dataclass(frozen=True)
class PowerConstant:
    """δ/σ detected with probability ``power`` by the exact test with ``n`` seeds at level ``a``
    (``value``), with its Monte Carlo interval (``low``, ``high``: equal to ``value`` where exact)
    and how it was computed (``method``: "exact" or "simulated (D draws, seed S)")."""

    n: int
    a: float
    power: float
    value: float
    low: float
    high: float
    method: str


def _subset_means(z: np.ndarray) -> np.ndarray:
    """(2ⁿ − 1, draws): the means of every non-empty subset of each column's n values (``z``:
    (n, draws)), made by doubling (the subsets without value i, then with it)."""
    sums, sizes = np.zeros((1, z.shape[1]), dtype=z.dtype), np.zeros(1, dtype=z.dtype)
    for row in z:
        sums = np.concatenate([sums, sums + row])
        sizes = np.concatenate([sizes, sizes + 1])
    return sums[1:] / sizes[1:, None]


def _kth_smallest_subset_mean(z: np.ndarray, r: int) -> np.ndarray:
    """The (r + 1)-th smallest non-empty subset mean of each column of ``z`` (n, draws), exactly.
    Only subsets at or below a bound can be among the r + 1 smallest: the (r + 1)-th smallest
    subset mean of the column's ⌈log₂(r + 2)⌉ + 1 smallest values is one (those subsets are some of
    all subsets), so every subset mean is compared with it and only those below are sorted."""
    n, draws = z.shape
    j = min(n, max(1, math.ceil(math.log2(r + 2))) + 1)
    small = np.sort(z, axis=0)[:j]
    bound = np.partition(_subset_means(small), r, axis=0)[r]                 # (draws,)
    bound = bound + 1e-9 * (1 + np.abs(bound))          # the same subset, summed in another order, rounds otherwise
    means = _subset_means(z)
    rows, cols = np.nonzero(means <= bound[None, :])
    values = means[rows, cols]
    order = np.lexsort((values, cols))
    cols, values = cols[order], values[order]
    starts = np.searchsorted(cols, np.arange(draws))
    return values[starts + r]


def _thresholds(n: int, r: int, draws: int, seed: int) -> np.ndarray:
    """c* = −(the (r + 1)-th smallest subset mean) of each of ``draws`` standard normal n-vectors."""
    z = np.random.default_rng(seed).standard_normal((draws, n)).astype(np.float64)
    out = np.empty(draws)
    chunk = max(1, _CHUNK_BYTES // (8 * 2 ** n))
    for start in range(0, draws, chunk):
        out[start:start + chunk] = -_kth_smallest_subset_mean(z[start:start + chunk].T, r)
    return out


@lru_cache(maxsize=256)
def _constant(n: int, a: float, power: float, draws: int, seed: int) -> PowerConstant:
    from scipy import stats
    r = rejections_allowed(n, a)
    if r < 0:
        return PowerConstant(n, a, power, math.inf, math.inf, math.inf, "exact: the test cannot reach this level")
    if r == 0:
        v = float(stats.norm.ppf(power ** (1 / n)))
        return PowerConstant(n, a, power, v, v, v, "exact: Φ⁻¹(π^(1/n)), every seed must agree")
    c = np.sort(_thresholds(n, r, draws, seed))
    half = 1.96 * math.sqrt(draws * power * (1 - power))
    at = lambda i: float(c[min(draws - 1, max(0, int(round(i))))])
    return PowerConstant(n, a, power, at(power * draws - 1), at(power * draws - 1 - half), at(power * draws - 1 + half),
                         f"simulated: {draws} normal draws, generator seed {seed}")


def power_constant(n: int, a: float, power: float = 0.8, draws: int = DRAWS, seed: int = SEED) -> PowerConstant:
    """The smallest δ/σ that the exact one-sided test with n seeds at level ``a`` detects with
    probability ``power`` when the seed differences are i.i.d. N(δ, σ²) (see the module's text)."""
    if not 0 < a < 1 or not 0 < power < 1:
        raise ConfigError(f"level and power must be in (0, 1), got {a} and {power}")
    if not 1 <= n <= EXACT_SEEDS:
        raise ConfigError(f"power_constant: n = {n}; the exact test is enumerated for 1 ≤ n ≤ {EXACT_SEEDS}")
    return _constant(int(n), float(a), float(power), int(draws), int(seed))


def power_at(effect: float, n: int, a: float, draws: int = DRAWS, seed: int = SEED) -> float:
    """P(the exact test with n seeds rejects at level ``a``) when the differences are i.i.d.
    N(δ, σ²) with δ/σ = ``effect``: exact for r = 0 (Φ(δ/σ)ⁿ), else the share of the simulated
    thresholds below it."""
    from scipy import stats
    r = rejections_allowed(n, a)
    if r < 0:
        return 0.0
    if r == 0:
        return float(stats.norm.cdf(effect) ** n)
    return float(np.mean(_thresholds(n, r, draws, seed) < effect))


def detectable_difference(differences, a: float, power: float = 0.8) -> float:
    """The smallest true mean difference the exact one-sided test at level ``a`` detects with
    probability ``power``, for seed differences i.i.d. normal with the spread of ``differences``
    (their standard deviation, ddof = 1) and their number n: σ̂ × :func:`power_constant`. Infinite
    where n seeds cannot reach level a (2⁻ⁿ > a; one seed), 0 where every seed gives the same
    difference."""
    if not 0 < a < 1 or not 0 < power < 1:
        raise ConfigError(f"level and power must be in (0, 1), got {a} and {power}")
    v = finite_values(differences)
    n = v.size
    if n < 2 or rejections_allowed(n, a) < 0:
        return math.inf
    s = float(v.std(ddof=1))
    if s == 0:
        return 0.0
    if n > EXACT_SEEDS:
        raise ConfigError(f"detectable_difference: {n} seeds; the exact test is enumerated up to {EXACT_SEEDS}")
    return s * power_constant(n, a, power).value


# ----------------------------------------------------------------------------- the plan of seeds

def seed_plan(spreads: pd.DataFrame, candidates: Iterable[int], a: float, power: float = 0.8) -> pd.DataFrame:
    """For each row of ``spreads`` (one claim part on one federation, with its pilot standard
    deviation of the seed-paired differences in ``sd``) and each candidate number of seeds n:
    the fewest agreeing seeds a rejection at level ``a`` needs, the standardised detectable
    difference (δ/σ, :func:`power_constant`) and the detectable difference σ_pilot·δ/σ. One row per
    (part, n), the columns of ``spreads`` kept."""
    if "sd" not in spreads:
        raise ConfigError("seed_plan: the pilot spreads need an 'sd' column")
    rows = []
    for n in candidates:
        c = power_constant(int(n), a, power)
        agree = fewest_agreeing(int(n), a)
        for r in spreads.to_dict("records"):
            rows.append({**r, "n": int(n), "agree": agree, "effect": c.value, "effect_low": c.low,
                         "effect_high": c.high, "detectable": r["sd"] * c.value})
    return pd.DataFrame(rows)


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def agreement_table(seeds: Mapping[str, int], a: float) -> pd.DataFrame:
    """Per federation ({name: n}): n, the strictest level ``a``, the fewest of n seeds that must
    agree for a rejection there, the best-case p-value with one more dissenter than that allows
    (p = 2ᵏ/2ⁿ), and what Holm's (or Shaffer's) interval is at that level: the seeds' [min, max]
    where every seed must agree (r = 0), else the (r + 1)-th smallest and largest subset means."""
    rows = []
    for fed, n in seeds.items():
        r = rejections_allowed(n, a)
        agree = fewest_agreeing(n, a)
        k = None if agree is None else n - agree
        rows.append({"federation": fed, "n": n, "level": a, "agree": agree, "dissenters": k,
                     "p_best": None if k is None else best_case_p(n, k),
                     "p_one_more": None if k is None or k + 1 > n else best_case_p(n, k + 1),
                     "interval": ("none: the whole range" if r < 0 else "the seeds' [min, max]" if r == 0 else
                                  f"from the {_ordinal(r + 1)} smallest to the {_ordinal(r + 1)} largest of the "
                                  f"{2 ** n - 1} subset means (the smallest: the lowest seed)")})
    return pd.DataFrame(rows)


def pilot_scores(runs: pd.DataFrame, criteria: Iterable[str] = ("mean", "mean-std")) -> pd.DataFrame:
    """An earlier run as the pilot of the next protocol, from its long file alone: the reported
    numbers of each of its reporting runs (recomputed from the test rows,
    :func:`~fairfl.studies.protocol.scores.run_scores`), one row per (federation, criterion, method, seed) at
    the point that criterion chooses on the tuning runs' validation rows (the mean over tuning seeds
    of the criterion of the clients' validation accuracies; ties to the first point in the file's
    order, as :func:`~fairfl.studies.protocol.tuning.select` breaks them)."""
    from .scores import CRITERIA, run_scores
    tuning = runs[(runs["phase"] == "tuning") & (runs["split"] == "val") & (runs["scored"] != "averaged iterate")]
    reporting = runs[(runs["phase"] == "reporting") & (runs["scored"] != "averaged iterate")]
    per_run = run_scores(reporting, by=("federation", "track", "method", "point", "seed"))
    frames = []
    for criterion in criteria:
        score = tuning.groupby(["federation", "method", "point", "seed"], sort=False)["accuracy"].agg(
            lambda a: CRITERIA[criterion](a.to_numpy() / 100)).groupby(["federation", "method", "point"],
                                                                          sort=False).mean().reset_index()
        best = score.loc[score.groupby(["federation", "method"], sort=False)["accuracy"].idxmax()]
        chosen = best[["federation", "method", "point"]].assign(criterion=criterion)
        frames.append(chosen.merge(per_run, on=["federation", "method", "point"]))
    return pd.concat(frames, ignore_index=True).sort_values(
        ["federation", "criterion", "method", "seed"], kind="stable").reset_index(drop=True)


def pilot_spreads(pilot: pd.DataFrame, parts: Iterable[tuple[str, str, str, str, str]],
                  stand_in: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The seed-paired spread of every claim part on every federation of a pilot
    (:func:`pilot_scores`): ``parts`` as (claim, method, other, metric, criterion); one row each with
    the pilot's seeds, its mean difference and ``sd`` (the standard deviation of the seed-paired
    differences, ddof = 1). ``stand_in`` ({method: the pilot's method}) names a method the pilot did
    not run by one it did (the 6.3 "FedAvg (uniform)" by 6.2's FedAvg), said in ``stand_in``."""
    stand_in = dict(stand_in or {})
    rows = []
    for claim, method, other, metric, criterion in parts:
        for fed, g in pilot[pilot["criterion"] == criterion].groupby("federation", sort=False):
            a = g[g["method"] == stand_in.get(method, method)].set_index("seed")[metric]
            b = g[g["method"] == stand_in.get(other, other)].set_index("seed")[metric]
            d = (a - b).dropna()
            if d.size < 2:
                continue
            rows.append({"claim": claim, "federation": fed, "method": method, "other": other, "metric": metric,
                         "criterion": criterion, "pilot_seeds": int(d.size), "pilot_difference": float(d.mean()),
                         "sd": float(d.std(ddof=1)),
                         "stand_in": "; ".join(f"{m} ← {stand_in[m]}" for m in (method, other) if m in stand_in)})
    return pd.DataFrame(rows)


def allocate_seeds(spreads: pd.DataFrame, cost: Mapping[str, float], budget: float, a: float, power: float = 0.8,
                   most: int = 14) -> tuple[dict[str, int], pd.DataFrame]:
    """Reporting seeds per federation by a declared rule, before the runs: every federation of
    ``spreads`` (:func:`pilot_spreads`) starts at the fewest n at which a rejection at level ``a``
    needs fewer than n agreeing seeds (⌈log₂(1/a)⌉ + 1); then, while the total ``cost`` (seconds per
    reporting seed, per federation) stays within ``budget``, one more seed goes to the federation
    where it shrinks the median detectable difference of its parts (pilot σ × δ/σ(n), points) the most
    per second; never beyond ``most``. Returns ({federation: n}, the steps taken: federation, n, the
    cost so far, the median detectable difference before and after, the gain per second)."""
    feds = list(dict.fromkeys(spreads["federation"]))
    start = max(2, int(math.ceil(math.log2(1 / a) - TOL)) + 1)
    n = {f: start for f in feds}
    sd = {f: float(spreads[spreads["federation"] == f]["sd"].median()) for f in feds}
    detect = lambda f, k: sd[f] * power_constant(k, a, power).value
    spent = sum(cost[f] * n[f] for f in feds)
    steps = [{"federation": f, "n": n[f], "cost": spent, "detectable": detect(f, n[f]), "gain_per_second": math.nan}
             for f in feds]
    while True:
        options = [(((detect(f, n[f]) - detect(f, n[f] + 1)) / cost[f]), f) for f in feds
                   if n[f] < most and spent + cost[f] <= budget]
        if not options:
            break
        gain, f = max(options)
        n[f] += 1
        spent += cost[f]
        steps.append({"federation": f, "n": n[f], "cost": spent, "detectable": detect(f, n[f]),
                      "gain_per_second": gain})
    return n, pd.DataFrame(steps)
