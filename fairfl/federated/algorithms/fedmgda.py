"""The MGDA family of Hu et al. (FedMGDA+ Algorithm 1): FedMGDA, FedMGDA+ and MGDA-Prox.

FedMGDA+ (Algorithm 1, lines 4–6): normalise every update to unit length (a zero update stays
zero: the released code divided by 0), solve eq. (25)

    λ* = argmin_{λ ∈ Δ, ‖λ − λ₀‖∞ ≤ ε} ‖Σᵢ λᵢ ḡᵢ‖²,   λ₀ uniform over the sampled clients,

and return d = Σᵢ λ*ᵢ ḡᵢ; the server steps w ← w − ηₜ d with the decaying ηₜ = η·β^⌊t/100⌋ of
§6.1.5 (``server_lr`` = η, ``decay``). ε = 0 skips the QP (as the released code did) and is
FedAvg-n bit for bit; ε = 1 is plain MGDA on normalised updates. FedMGDA (§4) is ε = 1 without
normalisation. MGDA-Prox (§6) is FedMGDA+ whose clients add FedProx's proximal term.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..messages import Aggregate, ClientUpdates
from ..minnorm import SOLVERS, min_norm_direction
from .base import Algorithm, Context, RoundPlan, ServerStep, option, register, with_proximal_term
from .fedavg import normalise_rows, sample_weights


def mgda_aggregate(reports: ClientUpdates, state: Any, eps: float, normalize: bool, solver: str) -> Aggregate:
    """Eq. (25) on the (unit-normalised when ``normalize``) updates, with the per-round log."""
    if normalize:
        g, norms = normalise_rows(reports.updates)
    else:
        g, norms = reports.updates, reports.updates.norm(dim=1)
    if eps == 0:
        lam = sample_weights(reports, "uniform")
        direction = lam @ g
    else:
        direction, lam = min_norm_direction(g, eps=eps, solver=solver)
    p = lam.double().clamp_min(1e-300)
    info = {"lambda_max": float(lam.max()), "lambda_entropy": float(-(p * p.log()).sum() / math.log(max(len(p), 2))),
            "direction_norm2": float(direction.double().pow(2).sum()), "mean_update_norm": float(norms.mean())}
    return Aggregate(direction, state, info, weights=lam)


@register
@dataclass(frozen=True)
class FedMGDAPlus(ServerStep, Algorithm):
    """FedMGDA+ (Algorithm 1, eq. (25)): ε ∈ [0, 1] interpolates between FedAvg-n (0) and MGDA
    on normalised updates (1)."""

    name = "fedmgda_plus"
    eps: float = option(0.1, low=0.0, high=1.0, doc="ε of eq. (25): 0 = FedAvg-n, 1 = MGDA")
    normalize: bool = option(True, doc="unit-normalise the updates first (Algorithm 1 line 4)")
    solver: str = option("quadprog", choices=SOLVERS)

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        return mgda_aggregate(reports, state, self.eps, self.normalize, self.solver)


@register
@dataclass(frozen=True)
class FedMGDA(ServerStep, Algorithm):
    """FedMGDA (§4): vanilla MGDA in FL, the min-norm point of the raw updates' hull (ε = 1, no
    normalisation)."""

    name = "fedmgda"
    solver: str = option("quadprog", choices=SOLVERS)

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        return mgda_aggregate(reports, state, 1.0, False, self.solver)


@register
@dataclass(frozen=True)
class MGDAProx(FedMGDAPlus):
    """MGDA-Prox (FedMGDA+ §6): FedMGDA+ whose clients add (μ/2)‖w − wₜ‖² to their local loss."""

    name = "mgda_prox"
    mu: float = option(0.1, low=0.0)

    def configure(self, ctx: Context, state: Any) -> RoundPlan:
        return with_proximal_term(super().configure(ctx, state), self.mu)
