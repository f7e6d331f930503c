"""Tuning: a method's grid of :class:`Axis` (its designs: :mod:`~fairfl.studies.protocol.design`), a
configuration as the tables print it; the choice on the clients' validation splits only (:class:`ValidationView`,
:func:`validation_score`, :func:`select`); and whether a federation can speak for a track (its
trained reference beats the best constant predictor: :func:`constant_accuracy`, :func:`speaks`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from fairfl.base.errors import ConfigError
from fairfl.runs.history import History
from .scores import CRITERIA, known_criterion

# ----------------------------------------------------------------------------- grids

@dataclass(frozen=True)
class Axis:
    """One knob of a method's grid: the option it sets (``"server_lr"``, ``"local.lr"``, ``"q"``),
    its values in increasing order, and the value one step beyond each edge, declared with the
    grid (None where the edge is the option's own bound: FedFV's α = 1, q = 0), which
    :func:`~fairfl.studies.protocol.design.edge_extensions` tries when a configuration on that edge wins."""

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
    return CRITERIA[known_criterion(criterion)](run.validation_acc()[-1])


def select(grid: Mapping[str, Mapping[Hashable, Sequence[History]]], criterion: str = "mean") -> dict[str, Hashable]:
    """{method: the grid point with the best criterion on validation, averaged over its runs}.
    ``grid[method][point]`` holds the runs of one grid point (one per tuning seed). Ties go to the
    first point in the grid's order; a point with a failed run (None) or a non-finite score is
    never chosen, and a method with no usable point raises."""
    known_criterion(criterion)
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
