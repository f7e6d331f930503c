"""Tuning: a method's grid of :class:`Axis`, the Latin-hypercube design that gives every method
the same number of configurations, the declared extension of a winning grid edge, a configuration
as the tables print it; the choice on the clients' validation splits only (:class:`ValidationView`,
:func:`validation_score`, :func:`select`); and whether a federation can speak for a track (its
trained reference beats the best constant predictor: :func:`constant_accuracy`, :func:`speaks`)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError
from ..history import History
from .scores import CRITERIA, known_criterion

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
