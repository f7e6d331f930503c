"""The metrics an explorer draws against rounds, each a function of a History (and the x % of
the worst/best clients): accuracy statistics over the clients per evaluation, the training loss,
and per round what the histories recorded (:func:`available_metrics`)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fairfl.federated import metrics
from fairfl.runs.history import History

DISTRIBUTION = "per-client accuracy distribution"
_INFO_LABELS = {"d_sq": "‖d‖² (Pareto stationarity)", "step_norm2": "‖d‖² of the server step",
                "lambda_max": "largest weight λ", "eta": "server step ηₜ"}


# ----------------------------------------------------------------------------- metrics

def acc_percent(h: History) -> np.ndarray:
    """(evaluations, clients) accuracy in %; a multi-objective run's objectives averaged per client."""
    a = h.acc()
    return 100 * (a.mean(axis=2) if a.ndim == 3 else a)


def _per_eval(fn: Callable[[np.ndarray], float]) -> Callable[[History, float], tuple[np.ndarray, np.ndarray]]:
    def curve(h: History, fraction: float) -> tuple[np.ndarray, np.ndarray]:
        acc = acc_percent(h)
        return np.asarray(h.eval_rounds, float), np.array([fn(row[np.isfinite(row)], fraction) if np.isfinite(row).any()
                                                           else np.nan for row in acc])
    return curve


def _loss(h: History, fraction: float):
    loss = h.train_losses()
    return np.asarray(h.eval_rounds, float), loss.mean(axis=1) if loss.ndim == 2 else loss


def _per_round(get: Callable[[History], Sequence[float]], scale: float = 1.0):
    def curve(h: History, fraction: float):
        y = scale * np.asarray(get(h), dtype=np.float64)
        y = y.reshape(len(y), -1).mean(axis=1) if y.ndim > 1 else y
        return np.arange(1, len(y) + 1, dtype=float), y
    return curve


def available_metrics(histories: Sequence[History]) -> dict[str, Callable]:
    """The curves these histories can give: accuracy statistics per evaluation, the training
    loss, and per round what each history recorded (improved share, server step, the rule's log)."""
    out: dict[str, Callable] = {
        "mean accuracy (%)": _per_eval(lambda a, f: float(a.mean())),
        "std of client accuracy (points)": _per_eval(lambda a, f: metrics.std(a)),
        "worst x % of clients (%)": _per_eval(lambda a, f: metrics.worst(a, f)),
        "best x % of clients (%)": _per_eval(lambda a, f: metrics.best(a, f)),
        DISTRIBUTION: _per_eval(lambda a, f: float(np.median(a))),
        "averaged training loss": _loss,
    }
    if any(np.isfinite(np.asarray(h.round_improved, float)).any() for h in histories):
        out["improved share (%)"] = _per_round(lambda h: h.round_improved, 100.0)
    if any(len(set(h.round_lr)) > 1 for h in histories):
        out["server learning rate ηₜ"] = _per_round(lambda h: h.round_lr)
    # of what the rules log each round, the quantities the papers discuss, by name: the menu listed every
    # internal key (about 25 over notebook 06's runs: `kept`, `internal_projections`, ...)
    info = sorted({k for h in histories for k in h.info if k in _INFO_LABELS})
    for k in info:
        out[_INFO_LABELS[k]] = _per_round(lambda h, k=k: h.info.get(k, []))
    return out
