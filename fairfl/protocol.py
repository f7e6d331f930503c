"""One tuning protocol for every method: a grid per method, a choice made on the clients'
*validation* splits by a stated criterion, then several seeds at the chosen point, compared with
seed-paired intervals — the machinery of the one-protocol comparison (notebook 06).

The rule that makes such a comparison honest is that the choice never sees the test split. Here
it cannot: :func:`validation_score` reads only ``History.val_acc`` (recorded by runs with
``track_validation=True``), and :func:`select` sees the histories through :class:`ValidationView`,
which has no test scores to read (a test asserts it).

    scores = {m: {point: [validation_score(h, "mean") for h in runs]} for ...}
    chosen = select(grid_histories, criterion="mean")           # {method: point}
    table = compare(final_histories, reference="FedAvg")       # seed-paired, 95 % intervals

Criteria (of the clients' validation accuracies at the last evaluation, averaged over the tuning
seeds): ``"mean"``, ``"worst10"`` (mean of the worst 10 % of clients), ``"mean-std"`` (mean minus
the clients' standard deviation: accuracy and fairness with equal weight)."""
from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np
import pandas as pd

from . import metrics
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
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}")
    return CRITERIA[criterion](run.validation_acc()[-1])


def select(grid: Mapping[str, Mapping[Hashable, Sequence[History]]], criterion: str = "mean") -> dict[str, Hashable]:
    """{method: the grid point with the best criterion on validation, averaged over its runs}.
    ``grid[method][point]`` holds the runs of one grid point (one per tuning seed). Ties go to the
    first point in the grid's order; a point with a failed run (None) or a non-finite score is
    never chosen, and a method with no usable point raises."""
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}")
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
            raise ValueError(f"{method}: no grid point has a finished run with a finite validation score")
        chosen[method] = best
    return chosen


def reported(history: History) -> dict[str, float]:
    """The reported numbers of one run: mean, σ, worst and best 10 % of the clients' final *test*
    accuracies, in %."""
    acc = 100 * np.asarray(history.final_acc(), dtype=np.float64)
    return {name: fn(acc) for name, fn in REPORTED.items()}


def compare(runs: Mapping[str, Mapping[int, History]], reference: str, level: float = 0.95) -> pd.DataFrame:
    """One row per (method, metric): the mean over seeds with its ``level`` interval, and the
    difference from ``reference`` paired by seed (runs that share a seed share their initial model,
    partition and sampled clients) with its interval. ``resolved`` says whether the paired interval
    excludes 0 (``better`` / ``worse`` for the metric's direction: σ is better lower), ``tie``
    where it does not, and ``—`` with fewer than two shared seeds. ``runs[method][seed]``."""
    if reference not in runs:
        raise ValueError(f"reference {reference!r} is not among the methods {sorted(runs)}")
    numbers = {m: {s: reported(h) for s, h in by_seed.items()} for m, by_seed in runs.items()}
    rows = []
    for method, by_seed in numbers.items():
        for metric in REPORTED:
            mean, lo, hi = metrics.seed_interval([v[metric] for v in by_seed.values()], level)
            row = {"method": method, "metric": metric, "seeds": len(by_seed), "mean": mean, "low": lo, "high": hi}
            if method != reference:
                row.update(_paired(by_seed, numbers[reference], metric, level))
            rows.append(row)
    return pd.DataFrame(rows)


def paired(runs: Mapping[str, Mapping[int, History]], method: str, other: str, metric: str,
           level: float = 0.95) -> dict[str, Any]:
    """``method`` against ``other`` on one reported metric, paired by seed: the difference, its
    interval and the verdict (``better`` / ``worse`` / ``tie`` / ``—``), as in :func:`compare`."""
    if metric not in REPORTED:
        raise ValueError(f"unknown metric {metric!r}; choose from {sorted(REPORTED)}")
    for m in (method, other):
        if m not in runs:
            raise ValueError(f"{m!r} is not among the methods {sorted(runs)}")
    numbers = [{s: reported(h) for s, h in runs[m].items()} for m in (method, other)]
    return _paired(*numbers, metric, level)


def _paired(a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]], metric: str,
            level: float) -> dict[str, Any]:
    shared = sorted(set(a) & set(b))
    diff = [a[s][metric] - b[s][metric] for s in shared]
    d, lo, hi = metrics.seed_interval(diff, level) if diff else (math.nan,) * 3
    return {"paired_seeds": len(shared), "difference": d, "difference_low": lo, "difference_high": hi,
            "resolved": _verdict(lo, hi, lower_is_better=metric == "std")}


def wide(table: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """A :func:`compare` table to read: one row per method, one column per metric, each cell the
    mean ± the interval's half-width, marked ▲ (better than the reference, resolved), ▼ (worse,
    resolved) or = (a tie); the reference's row is unmarked."""
    marks = {"better": " ▲", "worse": " ▼", "tie": " =", "—": ""}
    cells: dict[str, dict[str, str]] = {}
    for r in table.itertuples(index=False):
        half = (r.high - r.low) / 2 if np.isfinite(r.low) else math.nan
        text = f"{r.mean:.{digits}f}" + (f" ± {half:.{digits}f}" if np.isfinite(half) else "")
        resolved = getattr(r, "resolved", None)
        cells.setdefault(r.method, {})[r.metric] = text + (marks.get(resolved, "") if isinstance(resolved, str) else "")
    return pd.DataFrame.from_dict(cells, orient="index")[[m for m in REPORTED if m in set(table.metric)]]


def _verdict(lo: float, hi: float, lower_is_better: bool) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "—"
    if lo > 0:
        return "worse" if lower_is_better else "better"
    if hi < 0:
        return "better" if lower_is_better else "worse"
    return "tie"


def pareto_front(x: Sequence[float], y: Sequence[float], maximise: tuple[bool, bool] = (True, True)) -> np.ndarray:
    """A boolean mask of the points no other point dominates (at least as good in both coordinates
    and better in one); ``maximise`` says the direction of each coordinate (mean vs σ:
    ``(True, False)``). Equal points are all on the front."""
    a = np.column_stack([np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)])
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError("x and y must be sequences of the same length")
    a = a * np.where(maximise, 1.0, -1.0)
    front = np.ones(len(a), dtype=bool)
    for i in range(len(a)):
        dominated = (a >= a[i]).all(axis=1) & (a > a[i]).any(axis=1)
        front[i] = not dominated.any()
    return front


def tidy(federation: str, table: pd.DataFrame, chosen: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of :func:`compare` as the exported CSV: federation, algorithm, chosen
    hyper-parameters, metric, mean and interval (and the paired difference where there is one)."""
    out = table.copy()
    out.insert(0, "federation", federation)
    out.insert(2, "hyper_parameters", [str(chosen.get(m, "")) for m in out["method"]])
    return out.rename(columns={"method": "algorithm"})
