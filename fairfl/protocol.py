"""One tuning protocol for every method, and the statistics that turn its runs into verdicts —
the machinery of the one-protocol benchmark (notebook 06).

**Tuning.** Each method has a grid of :class:`Axis` (the knobs every method shares — server step,
local learning rate — and its own); :func:`latin_design` draws the same number of configurations
for every method, :func:`extension` names the one configuration that continues a winning grid
edge, and :func:`select` chooses on the clients' *validation* splits by a stated criterion. The
choice cannot see the test split: :func:`validation_score` reads only ``History.val_acc``, and
:func:`select` sees the histories through :class:`ValidationView`, which has no test scores.

Criteria (of the clients' validation accuracies at the last evaluation, averaged over the tuning
seeds): ``"mean"``, ``"worst10"`` (mean of the worst 10 % of clients), ``"mean-std"`` (mean minus
the clients' standard deviation: accuracy and fairness with equal weight).

**Federations that can speak.** :func:`constant_accuracy` is the best constant predictor's
validation accuracy; a federation enters the tables and the claims of a track only where the
track's trained reference beats it (:func:`speaks`).

**Statistics over seeds** (see the comment above :func:`subset_means`): seed-paired differences,
exact sign-flip intervals that stay inside the metric's range, three-valued verdicts against
declared margins (:class:`Comparison`, :class:`Claim`, :func:`judge`) with Holm's correction over
the declared claims, Benjamini–Hochberg q-values on the exploratory table (:func:`summary`), and
the smallest difference the design can detect (:func:`detectable_difference`).

**Outputs.** :func:`write_table` / :func:`read_table`: CSV files with a first line naming their
kind, schema and protocol version; :func:`client_rows` gives a run's long-format rows (one per
client and split)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np
import pandas as pd

from . import metrics
from .errors import ConfigError
from .history import History

CRITERIA: dict[str, Callable[[np.ndarray], float]] = {
    "mean": metrics.mean,
    "worst10": lambda acc: metrics.worst(acc, 0.1),
    "mean-std": lambda acc: metrics.mean(acc) - metrics.std(acc),
}

# the numbers reported per run, from the clients' final test accuracies (in %)
REPORTED: dict[str, Callable[[np.ndarray], float]] = {
    "mean": metrics.mean,
    "std": metrics.std,
    "worst10": lambda acc: metrics.worst(acc, 0.1),
    "best10": lambda acc: metrics.best(acc, 0.1),
}
# each reported metric's range (σ of values in [0, 100] is at most 50) and which is better lower
METRIC_RANGE = {"mean": (0.0, 100.0), "std": (0.0, 50.0), "worst10": (0.0, 100.0), "best10": (0.0, 100.0)}
LOWER_IS_BETTER = frozenset({"std"})
# what a result row scored: the global model, each client's own model, or the average of the global iterates
SCORED = ("global", "personal", "averaged iterate")


def _metric(metric: str) -> str:
    if metric not in REPORTED:
        raise ConfigError(f"unknown metric {metric!r}; choose from {sorted(REPORTED)}")
    return metric


def _criterion(criterion: str) -> str:
    if criterion not in CRITERIA:
        raise ConfigError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}")
    return criterion


def difference_range(metric: str) -> tuple[float, float]:
    """The range of a difference of two values of ``metric``."""
    lo, hi = METRIC_RANGE[_metric(metric)]
    return lo - hi, hi - lo


# ----------------------------------------------------------------------------- grids

@dataclass(frozen=True)
class Axis:
    """One knob of a method's grid: the option it sets (``"server_lr"``, ``"local.lr"``, ``"q"``),
    its values in increasing order, and the value one step beyond each edge, declared with the
    grid (None where the edge is the option's own bound: FedFV's α = 1, q = 0), which
    :func:`extension` tries when a configuration on that edge wins."""

    name: str
    values: tuple[float, ...]
    below: float | None = None
    above: float | None = None

    def __post_init__(self) -> None:
        v = tuple(float(x) for x in self.values)
        if not v or list(v) != sorted(set(v)):
            raise ConfigError(f"axis {self.name}: values must be distinct and increasing, got {self.values!r}")
        if (self.below is not None and self.below >= v[0]) or (self.above is not None and self.above <= v[-1]):
            raise ConfigError(f"axis {self.name}: the extensions ({self.below}, {self.above}) must lie outside "
                              f"the values {v}")
        object.__setattr__(self, "values", v)


def latin_design(axes: Sequence[Axis], k: int, seed: int,
                 allowed: Callable[[dict[str, float]], bool] | None = None) -> list[dict[str, float]]:
    """``k`` configurations of a grid, the same number for every method (an equal tuning budget):
    a Latin hypercube over the axes' values (McKay, Beckman, Conover 1979) — each axis's values
    are dealt to the k configurations in a random order, each value as often as the others
    (±1), so that every value of every knob is tried even where the full grid is far larger
    than k. Drawn from ``seed`` alone (declared with the grid); configurations that came out
    equal, or that ``allowed`` refuses (a method's own check on a federation: Ditto's η·λ ≥ 2),
    are replaced by unused allowed grid points drawn from the same seed. A grid with fewer than k
    allowed points gives all of them; no axes give the one empty configuration."""
    if k < 1:
        raise ConfigError(f"a design needs at least one configuration, got k={k}")
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise ConfigError(f"axes named twice: {names}")
    allowed = allowed or (lambda p: True)
    full = [dict(zip(names, p)) for p in itertools.product(*(a.values for a in axes))]
    if len(full) <= k:
        return [p for p in full if allowed(p)]
    rng = np.random.default_rng(seed)
    columns = []
    for a in axes:
        # each value ⌊k/n⌋ or ⌈k/n⌉ times (k < n: k different values, drawn at random)
        dealt = np.resize(rng.permutation(np.asarray(a.values)), k)
        columns.append(rng.permutation(dealt))
    points: list[dict[str, float]] = []
    for row in zip(*columns):
        p = dict(zip(names, (float(x) for x in row)))
        if p not in points and allowed(p):
            points.append(p)
    # the check is asked only of the points that may enter (it can be slow: a config's validation)
    for i in rng.permutation(len(full)):
        if len(points) == k:
            break
        if full[i] not in points and allowed(full[i]):
            points.append(full[i])
    return points


def extension(axes: Sequence[Axis], point: Mapping[str, float]) -> dict[str, float] | None:
    """The rule for a winning grid edge, declared before the runs: where the chosen configuration
    sits on an edge of one or more axes, the one configuration that moves each of them a declared
    step outward (:attr:`Axis.below` / :attr:`Axis.above`), the others kept; it is run once and
    taken if it wins (never extended again). None where no edge can move."""
    out, moved = dict(point), False
    for a in axes:
        v = point[a.name]
        step = a.below if v == a.values[0] else a.above if v == a.values[-1] else None
        if len(a.values) > 1 and step is not None:
            out[a.name], moved = step, True
    return out if moved else None


def point_label(point: Mapping[str, Any], symbols: Mapping[str, str] | None = None) -> str:
    """"η=1, lr=0.1, q=5": a configuration as the tables print it (``symbols`` renames options)."""
    symbols = symbols or {}
    if not point:
        return "—"
    return ", ".join(f"{symbols.get(k, k)}={v:.3g}" if isinstance(v, float) else f"{symbols.get(k, k)}={v}"
                     for k, v in point.items())


# ----------------------------------------------------------------------------- the choice

class ValidationView:
    """A run as the selection may see it: its config and its validation scores, nothing else."""

    __slots__ = ("config", "_val")

    def __init__(self, history: History):
        self.config = history.config
        self._val = history.validation_acc()          # raises where the run scored no validation split

    def validation_acc(self) -> np.ndarray:
        return self._val


def validation_score(run: History | ValidationView, criterion: str = "mean") -> float:
    """The criterion on the clients' validation accuracies at the run's last evaluation."""
    return CRITERIA[_criterion(criterion)](run.validation_acc()[-1])


def select(grid: Mapping[str, Mapping[Hashable, Sequence[History]]], criterion: str = "mean") -> dict[str, Hashable]:
    """{method: the grid point with the best criterion on validation, averaged over its runs}.
    ``grid[method][point]`` holds the runs of one grid point (one per tuning seed). Ties go to the
    first point in the grid's order; a point with a failed run (None) or a non-finite score is
    never chosen, and a method with no usable point raises."""
    _criterion(criterion)
    chosen = {}
    for method, points in grid.items():
        best, best_score = None, -math.inf
        for point, runs in points.items():
            if not runs or any(r is None for r in runs):
                continue
            score = float(np.mean([validation_score(ValidationView(r), criterion) for r in runs]))
            if np.isfinite(score) and score > best_score:
                best, best_score = point, score
        if best is None:
            raise ConfigError(f"{method}: no grid point has a finished run with a finite validation score")
        chosen[method] = best
    return chosen


# ----------------------------------------------------------------------------- federations that can speak

def constant_accuracy(labels: Sequence[np.ndarray], personal: bool = False) -> float:
    """The best constant predictor's accuracy, in %, as the mean over clients (each client's
    labels, e.g. of its validation split): one class for every client (the global models'
    track), or each client's own best class (``personal``: a client that holds one class scores
    100 %, so no personalised model can beat it there). A client without labels is skipped."""
    counts = [np.bincount(np.asarray(y, dtype=np.int64).ravel()) for y in labels if np.asarray(y).size]
    if not counts:
        raise ConfigError("constant_accuracy: no client has any label")
    if personal:
        return float(100 * np.mean([c.max() / c.sum() for c in counts]))
    width = max(c.size for c in counts)
    share = np.stack([np.pad(c, (0, width - c.size)) / c.sum() for c in counts])   # (clients, classes)
    return float(100 * share.mean(0).max())


def speaks(trained: float, constant: float, margin: float = 1.0) -> bool:
    """Whether trained models (their mean validation accuracy over clients, in %) beat the best
    constant predictor by at least ``margin`` points: below that a federation's rows say nothing
    about the methods (every one predicts about the same few classes)."""
    return bool(np.isfinite(trained) and trained >= constant + margin)


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
_TOL = 1e-9          # values are rounded to this before they are compared (equal seeds give equal means)


def _finite(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


def _patterns(n: int) -> int:
    """How many equally likely sign patterns a p-value counts: 2ⁿ, or DRAWS + 1."""
    return 2 ** n if n <= EXACT_SEEDS else DRAWS + 1


def subset_means(values) -> np.ndarray:
    """The sorted means of the non-empty subsets of ``values`` (NaN dropped): all 2ⁿ − 1 of them
    for n ≤ ``EXACT_SEEDS``, else ``DRAWS`` random ones, rounded to 1e-9."""
    v = _finite(values)
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
    return (1 + int(np.searchsorted(means, round(c, 9), side="right"))) / _patterns(_finite(values).size)


def p_less(values, c: float) -> float:
    """The exact one-sided p-value of H0: location ≥ ``c`` against < ``c``."""
    means = subset_means(values)
    if means.size == 0:
        return math.nan
    below = int(np.searchsorted(means, round(c, 9), side="left"))
    return (1 + means.size - below) / _patterns(_finite(values).size)


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
    k = math.floor(a * _patterns(_finite(values).size) + _TOL) - 1      # means ≤ c allowed below the bound
    if k < 0:
        return limits
    return max(float(means[k]), limits[0]), min(float(means[-1 - k]), limits[1])


def location(values, level: float = 0.95, limits: tuple[float, float] = (-math.inf, math.inf)
             ) -> tuple[float, float, float]:
    """(mean, low, high): the seeds' mean (NaN dropped) and the two-sided interval of ``level``
    from :func:`bounds`."""
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level}")
    v = _finite(values)
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


def detectable_difference(differences, a: float, power: float = 0.8) -> float:
    """The smallest true mean difference a one-sided test at level ``a`` detects with probability
    ``power``, from the seeds' spread: (t₁₋ₐ + t_power)·s/√n on n − 1 degrees of freedom (the
    usual planning formula; the sign-flip test's power is close to the t-test's). Infinite where
    the seeds cannot reach level a at all (2⁻ⁿ > a; one seed), 0 where every seed gives the same
    difference."""
    if not 0 < a < 1 or not 0 < power < 1:
        raise ConfigError(f"level and power must be in (0, 1), got {a} and {power}")
    v = _finite(differences)
    n = v.size
    if n < 2 or 1 / _patterns(n) > a + _TOL:
        return math.inf
    from scipy import stats
    return float((stats.t.ppf(1 - a, n - 1) + stats.t.ppf(power, n - 1)) * v.std(ddof=1) / math.sqrt(n))


def holm(p, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down correction of the p-values ``p`` at family-wise level ``alpha`` (NaN: not a
    test, left out of the family), as (adjusted p-values, the one-sided level at which each
    test's confidence bound is drawn). The test of rank r (1: the smallest p) among m is compared
    with α/(m − r + 1) while every test before it was rejected; from the first test Holm keeps,
    that test's level holds for it and every later one. So a bound excludes its null value
    exactly when the adjusted p-value is ≤ α."""
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha}")
    p = np.asarray(p, dtype=np.float64)
    adjusted, level = np.full(p.shape, np.nan), np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = idx.size
    if m == 0:
        return adjusted, level
    order = idx[np.argsort(p[idx], kind="stable")]
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    kept = next((i for i, j in enumerate(order) if adjusted[j] > alpha + _TOL), m)
    for i, j in enumerate(order):
        level[j] = alpha / (m - min(i, kept))
    return adjusted, level


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


# ----------------------------------------------------------------------------- per-run numbers

def reported(history: History | None, scored: str = "global") -> dict[str, float]:
    """The reported numbers of one run: mean, σ, worst and best 10 % of the clients' final *test*
    accuracies, in % — of the models the run evaluates (``"global"``, or ``"personal"`` for a
    personalised method), or of its averaged iterate (``"averaged iterate"``: a run with
    ``averaged_iterate=True``). A run that diverged (None) gives NaN everywhere."""
    if scored not in SCORED:
        raise ConfigError(f"scored={scored!r}; choose from {SCORED}")
    if history is None:
        return {name: math.nan for name in REPORTED}
    acc = history.averaged_acc()[-1] if scored == "averaged iterate" else history.final_acc()
    acc = 100 * np.asarray(acc, dtype=np.float64)
    return {name: fn(acc) for name, fn in REPORTED.items()}


def local_steps(sampled: Sequence[Sequence[int]], train_sizes: Sequence[int], epochs: int, batch_size: int | None,
                steps: int | None = None) -> int:
    """The local SGD steps of a run's rounds: for every sampled client of every round, ``steps``
    (K local steps), else ``epochs`` × its number of batches (one per epoch at full batch)."""
    per = [steps if steps is not None else epochs * (1 if batch_size is None else -(-int(n) // batch_size))
           for n in train_sizes]
    return int(sum(per[k] for clients in sampled for k in clients))


def client_rows(history: History, scored: str = "global") -> pd.DataFrame:
    """A run's final evaluation in long format: one row per client and split (``val``, ``test``)
    with its accuracy (%) and loss, of the models ``scored`` (the averaged iterate's rows have no
    validation split: it is not what the run selects on)."""
    if scored == "averaged iterate":
        parts = {"test": (history.averaged_acc()[-1], history.avg_test_loss[-1])}
    else:
        parts = {"test": (history.final_acc(), history.test_loss[-1])}
        if history.val_acc:
            parts = {"val": (history.val_acc[-1], history.val_loss[-1]), **parts}
    frames = [pd.DataFrame({"client": np.arange(len(acc)), "split": split,
                            "accuracy": 100 * np.asarray(acc, dtype=np.float64),
                            "loss": np.asarray(loss, dtype=np.float64)}) for split, (acc, loss) in parts.items()]
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- the tables

KEYS = ["federation", "track", "criterion", "method"]


def summary(scores: pd.DataFrame, references: Mapping[str, str], level: float = 0.95, fdr: float = 0.05
            ) -> pd.DataFrame:
    """The exploratory table. ``scores``: one row per reported run with the columns ``KEYS``,
    ``seed`` and one per reported metric (NaN for a run that diverged). One row per (federation,
    track, criterion, method, metric): the seeds, how many diverged, the mean over the others with
    its ``level`` interval (inside the metric's range); and for every method but its track's
    reference (``references``: {track: method}), the seed-paired difference from the reference
    with its interval, the two-sided p-value, the Benjamini–Hochberg q-value over every
    difference of this table, and ``mark``: ▲ / ▼ where q ≤ ``fdr`` and the method is better /
    worse (σ is better lower), ``=`` otherwise."""
    missing = set(KEYS + ["seed"]) - set(scores.columns)
    if missing:
        raise ConfigError(f"summary: scores lack the columns {sorted(missing)}")
    rows = []
    for key, g in scores.groupby(KEYS, sort=False):
        track, method = key[1], key[3]
        if track not in references:
            raise ConfigError(f"summary: track {track!r} has no reference; references: {dict(references)}")
        ref = scores[(scores.federation == key[0]) & (scores.track == track) & (scores.criterion == key[2])
                     & (scores.method == references[track])]
        for metric in REPORTED:
            if metric not in g:
                continue
            values = dict(zip(g.seed, g[metric]))
            mean, lo, hi = location(list(values.values()), level, METRIC_RANGE[metric])
            row = dict(zip(KEYS, key), metric=metric, seeds=len(values),
                       diverged=int(np.sum(~np.isfinite(np.asarray(list(values.values()), dtype=float)))),
                       mean=mean, low=lo, high=hi)
            if method != references[track] and len(ref):
                d, dropped = paired(values, dict(zip(ref.seed, ref[metric])))
                dm, dlo, dhi = location(d, level, difference_range(metric))
                row.update(paired_seeds=d.size, difference=dm, difference_low=dlo, difference_high=dhi,
                           p=p_two_sided(d) if d.size else math.nan)
            rows.append(row)
    out = pd.DataFrame(rows)
    if "p" not in out:
        out["p"] = math.nan
    out["q"] = benjamini_hochberg(out["p"])
    sign = np.where(out["metric"].isin(LOWER_IS_BETTER), -1.0, 1.0) * np.sign(out.get("difference", np.nan))
    out["mark"] = np.where(out["p"].isna(), "", np.where(out["q"] <= fdr, np.where(sign > 0, "▲", "▼"), "="))
    return out


def wide(table: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """A :func:`summary` table of one federation, track and criterion to read: one row per method,
    one column per metric, each cell the mean [interval], marked ▲ / ▼ / = against the track's
    reference (BH-adjusted; the reference's own row unmarked); a method with diverged seeds says
    how many."""
    cells: dict[str, dict[str, str]] = {}
    for r in table.itertuples(index=False):
        text = f"{r.mean:.{digits}f}"
        if np.isfinite(r.low):
            text += f" [{r.low:.{digits}f}, {r.high:.{digits}f}]"
        mark = getattr(r, "mark", "")
        cells.setdefault(r.method, {})[r.metric] = text + (f" {mark}" if isinstance(mark, str) and mark else "")
        if getattr(r, "diverged", 0):
            cells[r.method]["diverged"] = f"{r.diverged} of {r.seeds}"
    out = pd.DataFrame.from_dict(cells, orient="index")
    return out[[c for c in [*REPORTED, "diverged"] if c in out.columns]].fillna("")


# ----------------------------------------------------------------------------- claims

KINDS = ("superiority", "non-inferiority")


@dataclass(frozen=True)
class Comparison:
    """One part of a claim: ``method`` against ``other`` on a reported ``metric``.

    ``"superiority"`` ("A has a higher mean", "a lower σ") is **supported** where the adjusted
    interval of the gain (the difference, sign-flipped for σ) lies above 0, **contradicted** where
    it lies below ``margin`` (the data rule out a gain as large as the smallest one the claim
    means). ``"non-inferiority"`` ("a mean that is not lower") is supported where the gain's
    interval lies above −``margin``, contradicted where it lies below −``margin``. Else
    **inconclusive**. ``margin`` is in the metric's points, declared before the runs."""

    method: str
    other: str
    metric: str
    kind: str = "superiority"
    margin: float = 1.0

    def __post_init__(self) -> None:
        _metric(self.metric)
        if self.kind not in KINDS:
            raise ConfigError(f"kind={self.kind!r}; choose from {KINDS}")
        if not (np.isfinite(self.margin) and self.margin > 0):
            raise ConfigError(f"a margin must be a positive number of points, got {self.margin}")

    def describe(self) -> str:
        """"FedFV lower σ than FedAvg", "DQN-Fed mean accuracy not lower than FedAvg's by more than 1"."""
        name = {"mean": "mean accuracy", "std": "σ", "worst10": "worst-10 % accuracy",
                "best10": "best-10 % accuracy"}[self.metric]
        if self.kind == "superiority":
            return f"{self.method} {'lower' if self.metric in LOWER_IS_BETTER else 'higher'} {name} than {self.other}"
        worse = "higher" if self.metric in LOWER_IS_BETTER else "lower"
        return f"{self.method} {name} not {worse} than {self.other}'s by more than {self.margin:g}"


@dataclass(frozen=True)
class Claim:
    """A paper's claim: its text, where it comes from, its parts (all must hold), the tuning
    criterion it is tested under (the one that matches what the paper optimised for) and the
    track whose runs it reads."""

    text: str
    parts: tuple[Comparison, ...]
    criterion: str = "mean"
    track: str = "global"

    def __post_init__(self) -> None:
        _criterion(self.criterion)
        if not self.parts:
            raise ConfigError(f"claim {self.text!r} has no parts")
        object.__setattr__(self, "parts", tuple(self.parts))


SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_JUDGED = "supported", "contradicted", "inconclusive", "not judged"


def _combine(verdicts: Sequence[str]) -> str:
    """A claim of several parts: supported when every part is, contradicted when one part is."""
    if any(v == CONTRADICTED for v in verdicts):
        return CONTRADICTED
    return SUPPORTED if verdicts and all(v == SUPPORTED for v in verdicts) else INCONCLUSIVE


def judge(claims: Sequence[Claim], scores: pd.DataFrame, federations: Sequence[str],
          speaking: Mapping[tuple[str, str], bool] | None = None, alpha: float = 0.05, power: float = 0.8
          ) -> pd.DataFrame:
    """Every claim on every federation, one row per (claim, federation, part), with the claim's
    verdict on that federation in each of its rows.

    Two one-sided tests per part (supported / contradicted, :class:`Comparison`) from the seed-
    paired differences of ``scores`` (as :func:`summary` takes them; the runs of each method at
    the point the claim's criterion chose); Holm's correction at family-wise level ``alpha`` over
    every test of every claim and federation that is judged; the adjusted interval drawn at the
    levels Holm compared its two tests with (so the verdict can be read off it); ``detectable``,
    the smallest gain the design detects with probability ``power`` at Holm's strictest level
    α/m. A federation is not judged for a claim where ``speaking[(federation, track)]`` is False
    (its models do not beat the best constant predictor) or a method has no finished run."""
    speaking = dict(speaking or {})
    rows, tests = [], []
    for claim in claims:
        for fed in federations:
            for part in claim.parts:
                row = {"claim": claim.text, "federation": fed, "part": part.describe(), "criterion": claim.criterion,
                       "kind": part.kind, "margin": part.margin, "metric": part.metric}
                if not speaking.get((fed, claim.track), True):
                    rows.append({**row, "reason": "its models do not beat the best constant predictor"})
                    continue
                pick = lambda m: scores[(scores.federation == fed) & (scores.track == claim.track)
                                        & (scores.criterion == claim.criterion) & (scores.method == m)]
                a, b = pick(part.method), pick(part.other)
                d, dropped = paired(dict(zip(a.seed, a[part.metric])), dict(zip(b.seed, b[part.metric])))
                if d.size == 0:
                    rows.append({**row, "reason": f"{part.method} or {part.other} has no finished run here"})
                    continue
                sign = -1.0 if part.metric in LOWER_IS_BETTER else 1.0
                gain = sign * d
                null = 0.0 if part.kind == "superiority" else -part.margin
                far = part.margin if part.kind == "superiority" else -part.margin
                row.update(paired_seeds=d.size, dropped=dropped, difference=float(d.mean()),
                           p_supported=p_greater(gain, null), p_contradicted=p_less(gain, far))
                row["_gain"], row["_null"], row["_far"], row["_sign"] = gain, null, far, sign
                tests += [(len(rows), "p_supported"), (len(rows), "p_contradicted")]
                rows.append(row)
    adjusted, level = holm([rows[i][k] for i, k in tests], alpha)
    m = len(tests)
    for (i, k), adj, lev in zip(tests, adjusted, level):
        rows[i][k + "_holm"], rows[i]["_level_" + k] = float(adj), float(lev)
    for row in rows:
        if "_gain" not in row:
            row["verdict"] = NOT_JUDGED
            continue
        gain, sign, metric = row.pop("_gain"), row.pop("_sign"), row["metric"]
        null, far = row.pop("_null"), row.pop("_far")
        limits = difference_range(metric)
        low_gain, _ = bounds(gain, row.pop("_level_p_supported"), limits)
        _, high_gain = bounds(gain, row.pop("_level_p_contradicted"), limits)
        supported, contradicted = low_gain > null, high_gain < far
        assert supported == (row["p_supported_holm"] <= alpha + _TOL)
        assert contradicted == (row["p_contradicted_holm"] <= alpha + _TOL)
        row["verdict"] = SUPPORTED if supported else CONTRADICTED if contradicted else INCONCLUSIVE
        # the adjusted interval of the difference itself (method − other), as the tables print it
        ends = sorted((sign * low_gain, sign * high_gain))
        row["adjusted_low"], row["adjusted_high"] = ends
        row["detectable"] = detectable_difference(gain, alpha / m, power) if m else math.inf
    out = pd.DataFrame(rows)
    claim_verdicts = {key: (_combine(list(g.verdict)) if (g.verdict != NOT_JUDGED).all() else NOT_JUDGED)
                      for key, g in out.groupby(["claim", "federation"], sort=False)}
    out["claim_verdict"] = [claim_verdicts[(c, f)] for c, f in zip(out.claim, out.federation)]
    return out


# ----------------------------------------------------------------------------- the Pareto front

def pareto_front(x: Sequence[float], y: Sequence[float], maximise: tuple[bool, bool] = (True, True)) -> np.ndarray:
    """A boolean mask of the points no other point dominates (at least as good in both coordinates
    and better in one); ``maximise`` says the direction of each coordinate (mean vs σ:
    ``(True, False)``). Equal points are all on the front."""
    a = np.column_stack([np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)])
    if a.ndim != 2 or a.shape[1] != 2:
        raise ConfigError("x and y must be sequences of the same length")
    a = a * np.where(maximise, 1.0, -1.0)
    front = np.ones(len(a), dtype=bool)
    for i in range(len(a)):
        dominated = (a >= a[i]).all(axis=1) & (a > a[i]).any(axis=1)
        front[i] = not dominated.any()
    return front


# ----------------------------------------------------------------------------- files

# the CSV files a benchmark writes, and the version of each one's columns; a reader refuses a
# file of a kind or schema it does not know
SCHEMAS = {"summary": 2, "runs": 1, "claims": 1}
_HEADER = "# fairfl"


def write_table(frame: pd.DataFrame, path: Path | str, kind: str, protocol: str) -> Path:
    """Write ``frame`` as CSV (gzip-compressed where the name ends in .gz, with no time stamp, so
    that the same table gives the same bytes) after one first line, ``# fairfl table=<kind>
    schema=<n> protocol=<protocol>``: what the file is, the version of its columns and of the
    protocol that made it. Atomic."""
    from .atomic import atomic_write
    if kind not in SCHEMAS:
        raise ConfigError(f"unknown table kind {kind!r}; choose from {sorted(SCHEMAS)}")
    if not protocol or any(c.isspace() for c in str(protocol)):
        raise ConfigError(f"protocol must be a version without spaces, got {protocol!r}")
    header = f"{_HEADER} table={kind} schema={SCHEMAS[kind]} protocol={protocol}\n"
    text = header + frame.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    path = Path(path)

    def write(p: Path) -> None:
        if path.suffix == ".gz":
            import gzip
            with open(p, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
                f.write(text.encode())
        else:
            Path(p).write_text(text)
    atomic_write(path, write)
    return path


def read_table(path: Path | str) -> pd.DataFrame:
    """A table written by :func:`write_table`: its rows, with ``attrs`` holding its kind, schema
    and protocol. A file without the header, or of another kind or schema version, is refused
    with a :class:`ConfigError` that says which."""
    import gzip
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            first = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable table ({e})") from None
    fields = dict(part.split("=", 1) for part in first[len(_HEADER):].split() if "=" in part)
    if not first.startswith(_HEADER) or not {"table", "schema", "protocol"} <= set(fields):
        raise ConfigError(f"{path}: not a fairfl table (its first line should be "
                          f"'{_HEADER} table=... schema=... protocol=...', it is {first[:80]!r})")
    kind, schema = fields["table"], fields["schema"]
    if kind not in SCHEMAS or schema != str(SCHEMAS[kind]):
        raise ConfigError(f"{path}: a {kind!r} table of schema {schema}; this fairfl reads "
                          + ", ".join(f"{k} schema {v}" for k, v in SCHEMAS.items()))
    frame = pd.read_csv(path, skiprows=1, keep_default_na=True)
    frame.attrs.update(kind=kind, schema=int(schema), protocol=fields["protocol"])
    return frame
