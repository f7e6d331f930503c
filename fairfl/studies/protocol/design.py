"""The tuning designs of protocol 6.3: K configurations per method, chosen by a declared criterion
rather than by the luck of a seed, with the knobs every method shares on one common design.

**Latin columns.** A design of K configurations over c knobs, each with a grid of K values, is c
*columns*, each a permutation of the K grid positions (McKay, Beckman & Conover 1979's Latin
hypercube, on the grid): every value of every knob is tried exactly once. Two columns that are
the same permutation (or one the other reversed) move their knobs together — |Spearman ρ| = 1 —
and the design cannot tell one knob's effect from the other's (protocol 6.2's one-seed draw gave
every two-knob method the diagonal (low, low), (mid, mid), (high, high)).

**The criterion** (declared): among all candidate columns, the smallest largest |Spearman ρ|
between any two columns of the design (a maximin-correlation Latin hypercube, Iman & Conover 1982;
Owen 1994), ties broken by the lexicographic order of the permutations — no random draw. The
knobs every method shares (:data:`SHARED`: the server step η and the local rate multiplier lr×)
get **one** design for all methods (:func:`shared_design`), so that every method tries the same
K (η, lr×) points and comparisons between methods share their coverage; a method with only one of
them uses that column. Each method's own knobs are then further columns (:func:`own_columns`),
chosen by the same criterion against the shared columns and each other. With K = 3 the best
possible is |ρ| = 0.5 for up to three columns; a fourth column at K = 3 must equal or reverse
one of the others (|ρ| = 1), so a method has at most three tuned knobs there (FedHEAL's β is
declared, not tuned). K = 5: enumerated alike (5! = 120 permutations a column).

**Coverage** (:func:`coverage`): per knob, the grid values tried out of the grid's; per pair of
knobs, the combinations tried out of all (K of K² for any Latin design).

**The edge extension** (:func:`edge_extensions`): where the chosen configuration sits on an edge
of one or more knobs, each such knob alone is moved one declared step outward (the others kept):
one configuration per edge knob, run once, taken if it wins, never extended again."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping, Sequence

import numpy as np

from fairfl.base.errors import ConfigError
from .tuning import Axis

# the knobs every method shares (where it has them), on one common design: the server step and the local rate
SHARED = ("server_lr", "lr×")


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two columns without ties (e.g. two permutations):
    1 − 6·Σd²/(K(K² − 1)). One value: 0 (nothing to correlate)."""
    ra, rb = np.argsort(np.argsort(np.asarray(a))), np.argsort(np.argsort(np.asarray(b)))
    k = ra.size
    if k != rb.size:
        raise ConfigError(f"spearman: columns of {k} and {rb.size} values")
    if k < 2:
        return 0.0
    return float(1 - 6 * np.sum((ra - rb) ** 2) / (k * (k * k - 1)))


def largest_correlation(columns: Sequence[Sequence[float]]) -> float:
    """The largest |Spearman ρ| between any two of ``columns`` (0 with fewer than two)."""
    return max((abs(spearman(a, b)) for a, b in itertools.combinations(columns, 2)), default=0.0)


@lru_cache(maxsize=None)
def _permutations(k: int) -> tuple[tuple[int, ...], ...]:
    if k > 7:
        raise ConfigError(f"a Latin design is enumerated over every permutation: K = {k} gives {math.factorial(k)} "
                          "per column, too many (K ≤ 7)")
    return tuple(itertools.permutations(range(k)))


def best_columns(k: int, new: int, fixed: Sequence[Sequence[int]] = (),
                 allowed: Callable[[tuple[tuple[int, ...], ...]], bool] | None = None
                 ) -> tuple[tuple[int, ...], ...] | None:
    """``new`` columns of K grid positions (each a permutation of 0..K−1) that, with the ``fixed``
    ones, have the smallest largest |Spearman ρ| between any two columns; among equals the first in
    the lexicographic order of (column 1, column 2, …). ``allowed`` (of the new columns) rejects
    candidates (a configuration the method refuses); None where none is allowed. Every one of the
    (K!)^new candidates is scored (``new`` ≤ 3)."""
    if new == 0:
        return ()
    if new > 3:
        raise ConfigError(f"best_columns: {new} new columns at once; at most 3 are enumerated")
    perms = np.asarray(_permutations(k), dtype=np.int64)                    # (P, K), lexicographic
    fixed = np.asarray([tuple(int(v) for v in c) for c in fixed], dtype=np.int64).reshape(-1, k)
    scale = 6.0 / (k * (k * k - 1)) if k > 1 else 0.0
    rho = lambda a, b: np.abs(1 - scale * ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    against_fixed = rho(perms, fixed).max(1) if len(fixed) else np.zeros(len(perms))     # (P,)
    pair = rho(perms, perms)                                                            # (P, P)
    p = len(perms)
    if new == 1:
        score = against_fixed
    elif new == 2:
        score = np.maximum(np.maximum(against_fixed[:, None], against_fixed[None, :]), pair)
    else:
        a = against_fixed
        score = np.maximum.reduce([a[:, None, None], a[None, :, None], a[None, None, :], pair[:, :, None],
                                   pair[:, None, :], pair[None, :, :]])
    flat = np.round(score.ravel(), 9)
    for i in np.lexsort((np.arange(flat.size), flat)):        # by score, then lexicographic (row-major) order
        cand = tuple(tuple(int(v) for v in perms[j]) for j in np.unravel_index(i, (p,) * new))
        if allowed is None or allowed(cand):
            return cand
    return None


def shared_design(k: int, shared: int = 2) -> tuple[tuple[int, ...], ...]:
    """The common columns of the shared knobs (grid positions, one column per knob in
    :data:`SHARED` order): the first in lexicographic order among those with the smallest largest
    |ρ| — for K = 3, (0, 1, 2) and (0, 2, 1), |ρ| = 0.5."""
    found = best_columns(k, shared)
    assert found is not None
    return found


@dataclass(frozen=True)
class Design:
    """A method's K configurations (``points``: {knob: value}), the grid positions of each knob
    (``columns``), the largest |ρ| between two of its knobs, and the configurations the method
    refused (dropped: its budget is then below K, said in the coverage table)."""

    axes: tuple[Axis, ...]
    columns: Mapping[str, tuple[int, ...]]
    points: tuple[dict[str, float], ...]
    largest_rho: float
    refused: int = 0


def method_design(axes: Sequence[Axis], k: int, shared: Mapping[str, Sequence[int]] | None = None,
                  allowed: Callable[[dict[str, float]], bool] | None = None) -> Design:
    """A method's design over its ``axes`` (each of K grid values, or fewer: a knob with fewer
    values than K repeats them in its column's order, position mod its size), K configurations:
    the columns of the knobs it shares take ``shared`` ({knob: positions}, default
    :func:`shared_design`'s, by :data:`SHARED` name), its own knobs :func:`best_columns` against
    them. ``allowed`` (a configuration) is the method's own check on a federation: the own columns
    are the best whose every configuration passes; where none does, the best by the criterion with
    the refused configurations dropped. No axes: the one empty configuration."""
    axes = tuple(axes)
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise ConfigError(f"axes named twice: {names}")
    if k < 1:
        raise ConfigError(f"a design needs at least one configuration, got k={k}")
    if not axes:
        return Design((), {}, ({},), 0.0)
    allowed = allowed or (lambda p: True)
    if shared is None:
        shared = dict(zip(SHARED, shared_design(k))) if k > 1 else {s: (0,) for s in SHARED}
    fixed = {a.name: tuple(shared[a.name]) for a in axes if a.name in shared}
    own = [a for a in axes if a.name not in fixed]

    def points_of(columns: Mapping[str, Sequence[int]]) -> list[dict[str, float]]:
        return [{a.name: a.values[columns[a.name][i] % len(a.values)] for a in axes} for i in range(k)]

    def with_own(cand) -> dict[str, tuple[int, ...]]:
        return {**fixed, **{a.name: c for a, c in zip(own, cand)}}

    if k == 1:
        cand = tuple((0,) for _ in own)
    else:
        cand = best_columns(k, len(own), list(fixed.values()),
                            allowed=lambda c: all(allowed(p) for p in points_of(with_own(c))))
        if cand is None:                         # no own columns pass every configuration: drop the refused ones
            cand = best_columns(k, len(own), list(fixed.values()))
    columns = {a.name: with_own(cand)[a.name] for a in axes}
    pts, refused = [], 0
    for p in points_of(columns):
        if p in pts:
            continue
        if allowed(p):
            pts.append(p)
        else:
            refused += 1
    return Design(axes, columns, tuple(pts), largest_correlation([columns[a.name] for a in axes]), refused)


def coverage(design: Design) -> dict[str, str]:
    """{knob: "values tried/grid values", "knob × knob": "combinations tried/all"}: how much of its
    grid a design covers (a Latin design of K over K-value knobs: every value, K of K² pairs)."""
    out = {}
    for a in design.axes:
        out[a.name] = f"{len({p[a.name] for p in design.points})}/{len(a.values)}"
    for a, b in itertools.combinations(design.axes, 2):
        tried = {(p[a.name], p[b.name]) for p in design.points}
        out[f"{a.name} × {b.name}"] = f"{len(tried)}/{len(a.values) * len(b.values)}"
    return out


def edge_extensions(axes: Sequence[Axis], point: Mapping[str, float]) -> list[dict[str, float]]:
    """The declared rule for a winning grid edge: for each knob on which ``point`` sits on an edge
    of its grid, the configuration that moves that knob alone one declared step outward
    (:attr:`Axis.below` / :attr:`Axis.above`), every other knob kept; none where no edge can move
    (inside the grid, or the edge is the knob's own bound). In the order of ``axes``."""
    out = []
    for a in axes:
        v = point[a.name]
        step = a.below if v == a.values[0] else a.above if v == a.values[-1] else None
        if len(a.values) > 1 and step is not None:
            out.append({**point, a.name: step})
    return out


def check_designs(designs: Mapping[str, Design]) -> None:
    """Refuse a set of method designs (``designs``: {method: Design}) in which a method has two
    knobs that move together (|Spearman ρ| = 1: one knob's effect cannot be told from the other's)
    or in which two methods tried different points of the knobs they share (:data:`SHARED`: the
    comparisons would then not share their coverage; compared by grid position, so that a method
    whose server step has a grid of its own, FedLF's ηᵗ, still takes the common column). A design of one configuration has nothing to
    correlate. Raises :class:`ConfigError` naming the method and knobs."""
    seen: dict[str, tuple[str, tuple[int, ...]]] = {}
    for method, d in designs.items():
        if len(d.points) > 1:
            for a, b in itertools.combinations(d.axes, 2):
                rho = spearman(d.columns[a.name], d.columns[b.name])
                if abs(rho) >= 1 - 1e-12:
                    raise ConfigError(f"{method}: its design moves {a.name} and {b.name} together (Spearman ρ = "
                                      f"{rho:+.0f}); fix one of them (declared) or give the design more configurations")
        for name in SHARED:
            if name in d.columns:
                column = tuple(d.columns[name])            # grid positions: FedLF's ηᵗ has its own grid values
                first = seen.setdefault(name, (method, column))
                if first[1] != column:
                    raise ConfigError(f"{method} tries {name} at grid positions {column}, {first[0]} at {first[1]}: "
                                      "the knobs every method shares must have one design")
