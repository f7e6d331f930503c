"""What the protocol scores: the tuning criteria and the reported metrics (of the clients'
accuracies, in %), each metric's range and direction, what a result row scored; one run's reported
numbers, its local steps and its long-format rows (one per client and split); the Pareto front."""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fairfl.federated import metrics
from fairfl.base.errors import ConfigError
from fairfl.runs.history import History

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


def metric_label(metric: str, clients: int | None = None) -> str:
    """A reported metric (or criterion) as a table names it. "worst10" / "best10" average the
    ⌊N/10⌋ lowest / highest clients, at least one: where a federation has fewer than 20 clients
    that is a single client, and the label says so ("worst client")."""
    single = clients is not None and clients < 20
    return {"mean": "mean", "std": "σ", "mean-std": "mean − σ",
            "worst10": "worst client" if single else "worst 10 %",
            "best10": "best client" if single else "best 10 %"}.get(metric, metric)


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


def never_sampled(history: History, num_clients: int) -> int:
    """How many of a run's ``num_clients`` clients no round sampled (a personalised method scores
    them at a model trained for FedAvg-FT's budget: :meth:`fairfl.federated.algorithms.ditto.Ditto.untrained`)."""
    seen = {int(k) for clients in history.sampled for k in clients}
    return int(num_clients - len(seen & set(range(num_clients))))


def client_rows(history: History | None, scored: str = "global", clients: int | None = None) -> pd.DataFrame:
    """A run's final evaluation in long format: one row per client and split (``val``, ``test``)
    with its accuracy (%) and loss, of the models ``scored`` (the averaged iterate's rows have no
    validation split: it is not what the run selects on), and ``diverged`` False. A run that
    diverged (None) keeps its place: one row per client (``clients`` of them) and split with NaN
    accuracy and loss and ``diverged`` True, so that the long file holds every run."""
    if history is None:
        if clients is None:
            raise ConfigError("client_rows: a diverged run needs its number of clients")
        splits = ["test"] if scored == "averaged iterate" else ["val", "test"]
        return pd.DataFrame({"client": np.tile(np.arange(clients), len(splits)),
                             "split": np.repeat(splits, clients), "accuracy": math.nan, "loss": math.nan,
                             "diverged": True})
    if scored == "averaged iterate":
        parts = {"test": (history.averaged_acc()[-1], history.avg_test_loss[-1])}
    else:
        parts = {"test": (history.final_acc(), history.test_loss[-1])}
        if history.val_acc:
            parts = {"val": (history.val_acc[-1], history.val_loss[-1]), **parts}
    frames = [pd.DataFrame({"client": np.arange(len(acc)), "split": split,
                            "accuracy": 100 * np.asarray(acc, dtype=np.float64),
                            "loss": np.asarray(loss, dtype=np.float64), "diverged": False})
              for split, (acc, loss) in parts.items()]
    return pd.concat(frames, ignore_index=True)


def run_scores(rows: pd.DataFrame, split: str = "test",
               by: Sequence[str] = ("federation", "method", "scored", "phase", "point", "seed")) -> pd.DataFrame:
    """The reported numbers of every run (:data:`REPORTED`, in %) recomputed from long-format rows
    (:func:`client_rows` with the columns ``by``): one row per run, NaN for a run that diverged —
    what a reader of the runs file re-derives, and the pilot spreads of a later protocol."""
    part = rows[rows["split"] == split]
    out = part.groupby(list(by), sort=False, dropna=False)["accuracy"].agg(
        **{name: (lambda a, fn=fn: fn(a.to_numpy()) if np.isfinite(a.to_numpy()).all() else math.nan)
           for name, fn in REPORTED.items()})
    return out.reset_index()


def identical_runs(runs: Mapping[str, Mapping[int, np.ndarray | None]]) -> dict[str, str]:
    """{method: the earlier method it is identical to} for the methods whose runs gave exactly the
    same per-client scores as an earlier one's on every shared seed (``runs``: {method: {seed: the
    clients' final test accuracies, None for a diverged run}}, in the order to keep): FedProx is
    FedAvg where every client takes one full-batch step from the global model (its proximal term
    is 0 there), MGDA-Prox is FedMGDA+ alike. Such a method is reported once, under the first."""
    same: dict[str, str] = {}
    names = list(runs)
    for i, b in enumerate(names):
        for a in names[:i]:
            if a in same:
                continue
            seeds = set(runs[a]) & set(runs[b])
            if seeds and all(runs[a][s] is not None and runs[b][s] is not None
                             and np.array_equal(np.asarray(runs[a][s]), np.asarray(runs[b][s])) for s in seeds):
                same[b] = a
                break
    return same


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
