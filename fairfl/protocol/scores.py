"""What the protocol scores: the tuning criteria and the reported metrics (of the clients'
accuracies, in %), each metric's range and direction, what a result row scored; one run's reported
numbers, its local steps and its long-format rows (one per client and split); the Pareto front."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from .. import metrics
from ..errors import ConfigError
from ..history import History

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


def known_metric(metric: str) -> str:
    if metric not in REPORTED:
        raise ConfigError(f"unknown metric {metric!r}; choose from {sorted(REPORTED)}")
    return metric


def known_criterion(criterion: str) -> str:
    if criterion not in CRITERIA:
        raise ConfigError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}")
    return criterion


def difference_range(metric: str) -> tuple[float, float]:
    """The range of a difference of two values of ``metric``."""
    lo, hi = METRIC_RANGE[known_metric(metric)]
    return lo - hi, hi - lo


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
