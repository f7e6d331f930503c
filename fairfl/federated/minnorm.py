"""The min-norm quadratic program of FedMGDA+ eq. (25).

Given the m client vectors ḡᵢ (rows of Ḡ) and their Gram matrix G = Ḡ Ḡᵀ, FedMGDA+ eq. (25)
chooses the aggregation weights

    λ* = argmin ‖Σᵢ λᵢ ḡᵢ‖² = argmin λᵀ G λ   over   Δ ∩ {‖λ − λ₀‖∞ ≤ ε},

i.e. Σλ = 1 and lo ≤ λ ≤ hi with lo = max(0, λ₀ − ε), hi = min(1, λ₀ + ε) (see :func:`bounds`).
ε = 0 is FedAvg with the weights λ₀; ε ≥ 1 is plain MGDA (Désidéri 2012), whose direction
d = Σ λ*ᵢ ḡᵢ satisfies d·ḡᵢ ≥ ‖d‖² for every i (a common descent direction).

G is only positive *semi*-definite: clients with equal or collinear updates, a zero update, or
fewer parameters than clients (d < m) make it singular, and then λ* need not be unique (its
objective is).

Solvers
-------
``"quadprog"`` (default, fast): Goldfarb–Idnani dual active set (the pinned ``quadprog``) on
G / max(diag G) plus a small ridge (see :func:`_solve_quadprog` for the ridge and the retry /
fall-back ladder). Every answer is checked with :func:`kkt_residual` before it is returned.

``"cvxpy"`` (reference): the same scaled problem through cvxpy, solver named explicitly
(CLARABEL with tightened tolerances, OSQP if CLARABEL is unavailable or fails), with
``cp.psd_wrap`` so that a singular G is accepted as is, without a ridge.

Why quadprog, measured (prototypes of all three on this 2-core machine, one BLAS thread, median
of 10–30 calls of the bare solver on the same scaled, ridged problem; m random vectors in
d = 1000; "shared" = a common component plus log-normal norms, like client updates, so that up
to m − 1 bounds are active at λ*):

================================  ==============  ==============  ===============  ==========
instance                          quadprog        daqp 0.11       own active set   cvxpy
================================  ==============  ==============  ===============  ==========
m = 10, Gaussian or shared        0.02–0.04 ms    0.01–0.02 ms    0.06–0.46 ms     3–4 ms
m = 100, Gaussian (none active)   0.16–0.18 ms    0.16 ms         0.22 ms          8 ms
m = 100, shared (≤ 99 active)     1.5–2.0 ms      0.5–0.8 ms      5.7–5.9 ms       9–10 ms
================================  ==============  ==============  ===============  ==========

Robustness, on ~1,000 random instances (duplicate, collinear, zero and rank-2 vectors, d < m,
Gram matrices computed in float32, G × 1e±20, λ₀ with zeros, ε from 1e-9 to 3) plus ~4,500
with entries scaled by 1e±30, row norms spread over 1e±5 and ε down to 1e-300: quadprog with
the ridge and its second rung solved all of them without falling back (scaled KKT residual
≤ 1e-10 on float64 Gram matrices, ≤ 1e-7 on float32 ones); daqp with its default tolerances
returned KKT residuals up to 2e-6 (its primal tolerance is 1e-6) and would need tuning; the numpy
active-set prototype cycled on a rank-3 Gram matrix (m = 10).

* An own active-set method in Python pays ~one numpy KKT solve per added or dropped bound:
  slowest of the three once many bounds are active, and making it robust on a singular G
  (anti-cycling, null-space steps) means re-implementing what quadprog and daqp do in C.
* daqp is 2–4× faster on the hard m = 100 case, but that saves ≈ 1 ms per round with 100
  clients — negligible next to a round of local training — at the price of a new dependency
  and tolerance tuning. quadprog is already pinned in requirements.txt, so it is the fast path;
  cvxpy is 30–40× slower at m = 100 (Gaussian), 6× on the shared case.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import quadprog
import torch

from fairfl.base.errors import ConfigError, FairFLError

SOLVERS = ("quadprog", "cvxpy")
# Rules that are not exact solvers of the QP but a reference code's reading of it, named after
# the code (see :func:`sener_koltun_weights`); only plain MGDA (ε ≥ 1) with two vectors.
CLOSED_FORMS = ("sener_koltun",)

# Sener & Koltun's two-task rule puts these weights on the first vector when the minimum over the
# segment lies at (or past) an end point (their min_norm_solvers.py l.17–26).
SK_ENDS = (0.001, 0.999)

# Feasible sets thinner than this (per coordinate) are answered without a solver; see
# min_norm_weights. The objective then differs from the optimum by at most ~2·m·1e-12·max diag G.
_WIDTH_TOL = 1e-12

_RIDGE = 1e-10          # ridge of the fast solver, relative to max diag G; see _solve_quadprog

# An answer whose scaled KKT residual exceeds this (plus the ridge used, which moves the residual
# by at most its own size) is treated as a failure: retry, then fall back. Correct quadprog
# answers land below ~2e-10 on float64 Gram matrices, a wrong active set or an infeasible point
# at 1e-3 and above, so 1e-6 separates "right" from "garbage" with room on both sides.
KKT_ACCEPT = 1e-6

# CLARABEL's defaults (gap 1e-8) leave relative objective errors up to ~1e-5 when λᵀGλ is small
# compared with max diag G (clients nearly agree on a common direction); the reference must be
# tighter than the fast solver it is compared with.
_CLARABEL_OPTS = dict(tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-10,
                      max_iter=500)
_OSQP_OPTS = dict(eps_abs=1e-10, eps_rel=1e-10, max_iter=100_000)   # cvxpy turns polishing on


class MinNormSolverError(FairFLError, RuntimeError):
    """Every solver on the ladder failed on an instance; raised instead of returning a λ that
    is not a solution."""


# ----------------------------------------------------------------------------- validation

def _to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    try:
        # np.array copies: the caller's array is never aliased, and eps = 0 returns a fresh copy.
        return np.array(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name} must be a numeric array, got {type(x).__name__}: {e}") from None


def _check_eps(eps: Any) -> float:
    if isinstance(eps, torch.Tensor):
        eps = eps.item()
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise ConfigError(f"eps must be a number in [0, inf), got {eps!r}") from None
    if math.isnan(value) or value < 0:
        raise ConfigError(f"eps must be in [0, inf), got {eps!r}")
    return value


def _check_gram(gram: Any) -> np.ndarray:
    g = _to_numpy(gram, "gram")
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ConfigError(f"gram must be a square (m, m) matrix, got shape {g.shape}")
    if g.shape[0] == 0:
        raise ConfigError("gram is empty (m = 0): there is nothing to weight")
    if not np.isfinite(g).all():
        raise ConfigError("gram contains NaN or Inf")
    peak = float(np.abs(g).max())
    # 1e-6 relative accepts a Gram matrix computed in float32 (asymmetry ~1e-7) and rejects a
    # matrix that is genuinely not symmetric.
    if np.abs(g - g.T).max() > 1e-6 * peak:
        raise ConfigError(f"gram is not symmetric (max |G - Gᵀ| = {np.abs(g - g.T).max():.3g}, "
                          f"max |G| = {peak:.3g})")
    g = 0.5 * g + 0.5 * g.T          # (g + gᵀ)/2 would overflow for entries near 1e308
    diag = np.diag(g)
    # Cheap necessary conditions of positive semi-definiteness (a full eigen-decomposition
    # would cost more than the QP): G_ii ≥ 0 and |G_ij| ≤ max_k G_kk.
    if diag.min() < -1e-6 * peak or peak > (1 + 1e-6) * max(diag.max(), 0.0):
        raise ConfigError("gram is not positive semi-definite (negative diagonal entry, or an "
                          "off-diagonal entry larger than every diagonal one); it must be Ḡ Ḡᵀ")
    return g


def _check_lam0(lam0: Any, m: int) -> np.ndarray:
    if lam0 is None:
        return np.full(m, 1.0 / m)
    lam = _to_numpy(lam0, "lam0")
    if lam.ndim != 1 or lam.shape[0] != m:
        raise ConfigError(f"lam0 must have length m = {m} (one weight per row of gram), "
                          f"got shape {lam.shape}")
    if not np.isfinite(lam).all():
        raise ConfigError("lam0 contains NaN or Inf")
    if (lam < 0).any():
        raise ConfigError(f"lam0 must be non-negative, got min {lam.min():.3g}")
    if abs(lam.sum() - 1.0) > 1e-9 * m:
        raise ConfigError(f"lam0 must sum to 1 (it is a point of the simplex), got {lam.sum():.12g}")
    return lam


# ----------------------------------------------------------------------------- public helpers

def bounds(lam0: Any, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The box of FedMGDA+ eq. (25): lo = max(0, λ₀ − ε), hi = min(1, λ₀ + ε).

    ε ≥ 1 returns exactly ([0]*m, [1]*m): the box then contains the whole simplex (plain MGDA)."""
    eps = _check_eps(eps)
    lam0 = _to_numpy(lam0, "lam0")
    if eps >= 1:
        return np.zeros_like(lam0), np.ones_like(lam0)
    return np.maximum(0.0, lam0 - eps), np.minimum(1.0, lam0 + eps)


def _project(y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Euclidean projection of y onto {Σx = 1, lo ≤ x ≤ hi}: x = clip(y − ν, lo, hi) with the ν
    that makes Σx = 1, found exactly on the piecewise-linear, non-increasing S(ν) = Σx(ν).
    If the box misses the simplex, returns the box point closest in sum (hi or lo)."""
    # ν below every breakpoint: x = hi; above: x = lo. Between, each i is free on
    # (yᵢ − hiᵢ, yᵢ − loᵢ), so the slope of S is −(number of free coordinates).
    enter, leave = y - hi, y - lo
    points = np.concatenate([enter, leave])
    order = np.argsort(points, kind="stable")
    points = points[order]
    steps = np.concatenate([np.ones_like(enter), -np.ones_like(leave)])[order]
    free = np.cumsum(steps)[:-1]                      # free count on (points[k], points[k+1])
    s = hi.sum() - np.concatenate([[0.0], np.cumsum(free * np.diff(points))])   # S(points[k])
    if s[0] <= 1.0:
        nu = points[0]
    elif s[-1] >= 1.0:
        nu = points[-1]
    else:
        k = int(np.searchsorted(-s, -1.0)) - 1        # s[k] > 1 ≥ s[k+1]
        nu = points[k] + (s[k] - 1.0) / free[k] if free[k] > 0 else points[k]
    return np.clip(y - nu, lo, hi)


def kkt_residual(gram: Any, lam: Any, lo: Any, hi: Any) -> float:
    """Violation of the KKT conditions of the QP of FedMGDA+ eq. (25), scale-free.

    With the gradient ∇ = 2Gλ, λ is optimal iff it is feasible and there is a scalar ν with
    ∇ᵢ = ν where lo < λᵢ < hi, ∇ᵢ ≥ ν where λᵢ = loᵢ, ∇ᵢ ≤ ν where λᵢ = hiᵢ. The returned value
    is max(feasibility violation, ‖λ − P(λ − ∇/(2·max|G|))‖∞), where P projects onto
    {Σx = 1, lo ≤ x ≤ hi}: this natural residual is zero exactly when such a ν exists (P's own
    ν), needs no tolerance to decide which bounds are "active", and is unchanged when G is
    multiplied by any c > 0, so one threshold serves G ~ 1e-20 and G ~ 1e20 alike.
    """
    g = _to_numpy(gram, "gram")
    lam, lo, hi = (_to_numpy(v, n) for v, n in ((lam, "lam"), (lo, "lo"), (hi, "hi")))
    if not (np.isfinite(lam).all() and np.isfinite(g).all()):
        return math.inf
    feas = max(abs(lam.sum() - 1.0), float(np.max(lo - lam, initial=0.0)),
               float(np.max(lam - hi, initial=0.0)))
    peak = float(np.abs(g).max()) if g.size else 0.0
    grad = g @ lam / peak if peak > 0 else np.zeros_like(lam)   # = ∇ / (2 max|G|)
    stat = float(np.abs(lam - _project(lam - grad, lo, hi)).max()) if lam.size else 0.0
    return max(feas, stat)


# ----------------------------------------------------------------------------- solvers

def _make_feasible(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Clip a solver's answer into the box and move the sum's deficit to coordinates with room,
    in proportion to their room, so that the bounds hold exactly and Σλ = 1 up to rounding.
    (Dividing by Σλ instead could push a coordinate past hi.)"""
    lam = np.clip(x, lo, hi)
    for _ in range(3):
        gap = 1.0 - lam.sum()
        if gap == 0.0:
            break
        room = hi - lam if gap > 0 else lam - lo
        total = room.sum()
        if total <= 0.0:
            break
        lam = np.clip(lam + gap * (room / total), lo, hi)
    return lam


def _solve_quadprog(gs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """quadprog on the scaled Ĝ = G / max diag G, with a ridge δ·I, checked; ladder on failure.

    δ = _RIDGE = 1e-10, i.e. 1e-10·max diag G (a trace term such as 1e-10·(1 + tr Ĝ/m) would
    only move it within [1e-10, 2e-10] once Ĝ is scaled, so it is left out):
    * large enough: quadprog Cholesky-factorises Ĝ + δI, and a singular Ĝ computed in float64
      has eigenvalues down to about −m·u·max|Ĝ| ≈ −1e-14·(m/100) from rounding (u = 1.1e-16);
      δ clears that by four orders of magnitude for any realistic number of clients, and keeps
      cond(Ĝ + δI) ≤ 1e10, where quadprog's dual steps are still accurate;
    * small enough: over the simplex ‖λ‖² ≤ 1, so the ridge changes the objective by at most
      δ·max diag G in absolute terms, and the scaled gradient (hence the KKT residual) by at
      most δ;
    * on a singular Ĝ it selects, among the optimal λ, the one of least norm: a deterministic,
      spread-out choice instead of whatever vertex an unregularised solver stops at.
    The accuracy is absolute, relative to the largest client: when squared norms differ by more
    than ~1e6 and λ* favours the small vectors (λ*ᵀGλ* ≲ 1e-4·max diag G), the *relative*
    error of the objective can exceed 1e-6. A per-client ridge δ·diag(G) removes that, but
    makes Ĝ + ridge as ill-conditioned as diag G, and quadprog then failed ("constraints are
    inconsistent", wrong active sets) on 1–10 % of random instances with norms spread over
    1e±5 — so not here. FedMGDA+ normalises the updates (diag G = 1), where this cannot occur.

    Second rung, only if the first fails: a Gram matrix with larger rounding (computed in
    float32: eigenvalues down to ~−1e-6) makes quadprog report "matrix G is not positive
    definite"; the ridge is then raised to 1000δ + 2·max(0, −λ_min(Ĝ)), just enough to make the
    matrix definite, and the acceptance threshold by the same amount (the ridge moves the
    residual by at most its own size). Third: the reference solver, with a warning.
    """
    m = gs.shape[0]
    # λᵢ ≤ 1 is implied by Σλ = 1 and λ ≥ 0: leaving such bounds out (every one when ε ≥ 1)
    # halves the constraints quadprog scans.
    upper = hi < 1.0
    c = np.hstack([np.ones((m, 1)), np.eye(m), -np.eye(m)[:, upper]])
    b = np.concatenate([[1.0], lo, -hi[upper]])
    problems: list[str] = []

    def attempt(ridge: float) -> np.ndarray | None:
        try:
            x = quadprog.solve_qp(gs + ridge * np.eye(m), np.zeros(m), c, b, meq=1)[0]
        except ValueError as e:   # "constraints are inconsistent", "... not positive definite"
            problems.append(f"ridge {ridge:.1e}: {e}")
            return None
        if not np.isfinite(x).all():
            problems.append(f"ridge {ridge:.1e}: non-finite answer")
            return None
        lam = _make_feasible(x, lo, hi)
        res = kkt_residual(gs, lam, lo, hi)
        if res > KKT_ACCEPT + ridge:
            problems.append(f"ridge {ridge:.1e}: KKT residual {res:.2e}")
            return None
        return lam

    lam = attempt(_RIDGE)
    if lam is None:
        lam = attempt(1e3 * _RIDGE + 2.0 * max(0.0, -_smallest_eigenvalue(gs)))
    if lam is not None:
        return lam
    warnings.warn(f"quadprog failed on the FedMGDA+ min-norm QP (m = {m}; {'; '.join(problems)}); "
                  "solved with cvxpy instead", RuntimeWarning, stacklevel=3)
    return _solve_cvxpy(gs, lo, hi)


# Smallest eigenvalue of Ĝ (max diag 1) still taken for rounding of a PSD matrix rather than a
# matrix that is not a Gram matrix: a float32 Gram of 100 clients reaches ~−1e-6.
_PSD_TOL = 1e-5


def _smallest_eigenvalue(gs: np.ndarray) -> float:
    """Only on the failure path (O(m³)): an indefinite matrix would make the QP non-convex, and
    cvxpy's psd_wrap would silently trust it."""
    low = float(np.linalg.eigvalsh(gs)[0])
    if low < -_PSD_TOL:
        raise ConfigError(f"gram is not positive semi-definite (smallest eigenvalue {low:.3g} × "
                          "max diag); it must be Ḡ Ḡᵀ, computed in float64")
    return low


def _solve_cvxpy(gs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    import cvxpy as cp   # imported here: ~1 s to import, and only the reference path needs it

    m = gs.shape[0]
    lam = cp.Variable(m)
    problem = cp.Problem(cp.Minimize(cp.quad_form(lam, cp.psd_wrap(gs))),
                         [cp.sum(lam) == 1, lam >= lo, lam <= hi])
    problems = []
    for name, opts in (("CLARABEL", _CLARABEL_OPTS), ("OSQP", _OSQP_OPTS)):
        if name not in cp.installed_solvers():
            problems.append(f"{name} not installed")
            continue
        try:
            with warnings.catch_warnings():
                # "Solution may be inaccurate": such an answer is judged by its KKT residual below.
                warnings.filterwarnings("ignore", "Solution may be inaccurate", UserWarning)
                problem.solve(solver=name, **opts)
        except cp.SolverError as e:
            problems.append(f"{name}: {e}")
            continue
        x = lam.value
        if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or x is None \
                or not np.isfinite(x).all():
            problems.append(f"{name}: status {problem.status}")
            continue
        result = _make_feasible(np.asarray(x, dtype=np.float64), lo, hi)
        res = kkt_residual(gs, result, lo, hi)
        if problem.status == cp.OPTIMAL or res <= KKT_ACCEPT:
            return result
        problems.append(f"{name}: inaccurate, KKT residual {res:.2e}")
    raise MinNormSolverError(f"no solver solved the FedMGDA+ min-norm QP (m = {m}): "
                             + "; ".join(problems))


def sener_koltun_weights(gram: Any) -> np.ndarray:
    """λ of two vectors by the closed form of Sener & Koltun's released MGDA code
    (isl-org/MultiObjectiveOptimization, ``multi_task/min_norm_solvers.py`` l.9–30, used for two
    tasks by ``find_min_norm_element``, l.100–110), the reading behind their and FedCMOO's
    MultiMNIST runs. With v₁₁ = ‖g₁‖², v₁₂ = g₁·g₂, v₂₂ = ‖g₂‖², the weight γ of g₁ is

    * 0.999 if v₁₂ ≥ v₁₁ (the segment's minimum is at g₁ or past it; checked first, so identical
      vectors and two zero vectors land here),
    * else 0.001 if v₁₂ ≥ v₂₂ (minimum at g₂ or past it),
    * else γ = (v₂₂ − v₁₂) / (v₁₁ + v₂₂ − 2v₁₂) = ((g₂ − g₁)·g₂) / ‖g₁ − g₂‖², which then lies
      strictly inside (0, 1) and is *not* clipped further (so it may be 0.9995).

    Inside the segment this is the exact minimiser, as the QP's; it differs from the QP only at
    an end point, where the exact λ = (1, 0) gives the other vector no weight and this rule
    gives it 0.001. Returns (γ, 1 − γ) as float64. ``gram`` must be a valid 2 × 2 Gram matrix.
    """
    g = _check_gram(gram)
    if g.shape != (2, 2):
        raise ConfigError(f"the 'sener_koltun' rule is Sener & Koltun's closed form for two vectors; got {g.shape[0]} "
                          "(their code runs a projected-gradient loop for more, which is not implemented here: "
                          "use solver='quadprog')")
    v11, v12, v22 = float(g[0, 0]), float(g[0, 1]), float(g[1, 1])
    if v12 >= v11:
        gamma = SK_ENDS[1]
    elif v12 >= v22:
        gamma = SK_ENDS[0]
    else:
        gamma = (v22 - v12) / (v11 + v22 - 2.0 * v12)
    return np.array([gamma, 1.0 - gamma])


# ----------------------------------------------------------------------------- API

def min_norm_weights(gram: Any, lam0: Any = None, eps: float = 1.0,
                     solver: str = "quadprog") -> np.ndarray:
    """λ* of FedMGDA+ eq. (25): argmin λᵀGλ over Σλ = 1, max(0, λ₀−ε) ≤ λ ≤ min(1, λ₀+ε).

    gram: (m, m) Gram matrix Ḡ Ḡᵀ (numpy or torch; PSD, may be singular); lam0: a point of the
    simplex (default uniform 1/m); eps ≥ 0 (0: λ₀ itself, returned unchanged; ≥ 1: plain
    MGDA); solver: ``"quadprog"`` (fast) or ``"cvxpy"`` (reference), or ``"sener_koltun"``
    (not an exact solver: :func:`sener_koltun_weights`, two vectors and ε ≥ 1 only).

    Returns a float64 array of shape (m,) that satisfies the bounds exactly and sums to 1 up to
    rounding. When G is singular the minimiser need not be unique; quadprog then returns the one
    of least norm, cvxpy whichever its interior point converges to (same objective).
    Raises ConfigError for invalid input, MinNormSolverError if no solver succeeds.
    """
    eps = _check_eps(eps)
    if solver not in SOLVERS + CLOSED_FORMS:
        raise ConfigError(f"unknown min-norm solver {solver!r}; choose one of {SOLVERS + CLOSED_FORMS}")
    if solver == "sener_koltun":
        if eps < 1 or lam0 is not None:
            raise ConfigError(f"the 'sener_koltun' rule is plain MGDA over the whole simplex: it takes no lam0 and "
                              f"needs eps >= 1, got eps={eps:g}{', a lam0' if lam0 is not None else ''}")
        return sener_koltun_weights(gram)
    g = _check_gram(gram)
    m = g.shape[0]
    lam0 = _check_lam0(lam0, m)
    if eps == 0:
        return lam0
    if m == 1:
        return np.ones(1)
    lo, hi = bounds(lam0, eps)
    # How far the feasible set extends, per coordinate: Σλ = 1 with Σhi = 1 + w forces
    # λᵢ ≥ hiᵢ − w, so every feasible λ is within w of hi; likewise within 1 − Σlo of lo, and
    # within max(hi − lo) of λ₀. A set thinner than _WIDTH_TOL is answered by that point (exact
    # to rounding), without a solver — quadprog, whose own tolerance is about that size, calls
    # such a sliver "constraints are inconsistent". A negative width is a box that misses the
    # simplex (λ₀ sums to 1 only within 1e-9·m, and ε is smaller than that): the box point
    # nearest the simplex is returned, as ε = 0 returns λ₀.
    over, under = hi.sum() - 1.0, 1.0 - lo.sum()
    if min(over, under, float((hi - lo).max())) <= _WIDTH_TOL:
        point = hi if over <= _WIDTH_TOL else lo if under <= _WIDTH_TOL else lam0
        return _make_feasible(point, lo, hi)
    scale = float(np.diag(g).max())
    if scale == 0.0:
        # Every vector is zero (the PSD check made G = 0): every λ is optimal; keep λ₀.
        return _make_feasible(lam0, lo, hi)
    # λ* is invariant to G → cG; with max diag = 1 the ridge and tolerances mean the same thing
    # for G ~ 1e-20 and G ~ 1e20.
    gs = g / scale
    if solver == "quadprog":
        return _solve_quadprog(gs, lo, hi)
    return _solve_cvxpy(gs, lo, hi)


def min_norm_direction(vectors: torch.Tensor, lam0: Any = None, eps: float = 1.0, solver: str = "quadprog",
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FedMGDA+ eq. (25) on client vectors: (d = Σᵢ λ*ᵢ vᵢ, λ*). The one min-norm rule of the
    package: FedMGDA / FedMGDA+ / MGDA-Prox run it on the clients' (normalised) updates, FMGDA
    on the averaged per-objective updates Δ_s (FMOL eq. (3), ε = 1).

    vectors: (m, d) tensor, one row per client or objective. ``mask`` (d,) bool restricts the
    QP to some coordinates (FMOL's ``qp_params="shared"``: the trunk of a multi-task model);
    d combines the whole rows either way. G = V Vᵀ is formed in float64; if that over- or
    underflows (entries beyond ~1e±150), V is first divided by its largest |entry|, which leaves
    λ* unchanged. λ* is solved in float64 and d = λ*ᵀV is taken in the input's dtype. Returns d
    and λ as tensors of the input's dtype (float64 for a non-floating input) on its device.
    """
    v = torch.as_tensor(vectors)
    if v.ndim != 2 or v.shape[0] == 0:
        raise ConfigError(f"vectors must be a non-empty (m, d) matrix, got shape {tuple(v.shape)}")
    if not v.is_floating_point():
        v = v.to(torch.float64)
    v = v.detach()
    if not torch.isfinite(v).all():
        raise ConfigError("vectors contain NaN or Inf")
    if mask is not None:
        mask = torch.as_tensor(mask, dtype=torch.bool, device=v.device)
        if mask.shape != (v.shape[1],):
            raise ConfigError(f"mask must be a boolean vector of length d = {v.shape[1]}, got shape {tuple(mask.shape)}")
    sub = v.double() if mask is None else v.double()[:, mask]
    gram = sub @ sub.T
    diag = torch.diagonal(gram)
    peak = float(sub.abs().max()) if sub.numel() else 0.0
    if not torch.isfinite(gram).all() or (peak > 0 and float(diag.max()) < 1e-280):
        scaled = sub / peak
        gram = scaled @ scaled.T
    lam = min_norm_weights(gram.cpu().numpy(), lam0, eps, solver)
    lam_t = torch.as_tensor(lam, dtype=v.dtype, device=v.device)
    return lam_t @ v, lam_t
