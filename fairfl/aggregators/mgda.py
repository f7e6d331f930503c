"""The MGDA family: FedMGDA, FedMGDA+ and MGDA-Prox (Hu et al., FedMGDA+ Algorithm 1).

FedMGDA+ (Algorithm 1, lines 4–6): normalise every update to unit length (a zero update stays
zero: the released code divided by 0), solve eq. (25)

    λ* = argmin_{λ ∈ Δ, ‖λ − λ₀‖∞ ≤ ε} ‖Σᵢ λᵢ ḡᵢ‖²,   λ₀ uniform over the sampled clients,

and return d = Σᵢ λ*ᵢ ḡᵢ; the loop steps w ← w − ηₜ d with the decaying ηₜ of §6.1.5.
ε = 0 skips the QP (as the released code did) and is FedAvg-n bit for bit; ε = 1 is plain MGDA
on normalised updates. FedMGDA is ε = 1 without normalisation. MGDA-Prox is FedMGDA+ whose
clients add FedProx's proximal term (``fairfl.algorithms``).
"""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from ..errors import ConfigError
from ..local import ClientUpdates
from ..minnorm import min_norm_weights
from .base import Aggregate, Aggregator, State, normalise_rows
from .fedavg import sample_weights


class FedMGDAPlus(Aggregator):
    name: ClassVar[str] = "fedmgda_plus"

    def __init__(self, eps: float = 0.1, normalize: bool = True, solver: str = "quadprog"):
        if not (isinstance(eps, (int, float)) and 0 <= eps <= 1):
            raise ConfigError(f"FedMGDA+ eps must be in [0, 1] (0 = FedAvg, 1 = MGDA), got {eps!r}")
        self.eps, self.normalize, self.solver = float(eps), bool(normalize), solver

    def aggregate(self, reports: ClientUpdates, state: State, round_: int, params=None) -> Aggregate:
        if self.normalize:
            g, norms = normalise_rows(reports.updates)
        else:
            g, norms = reports.updates, reports.updates.norm(dim=1)
        lam0 = sample_weights(reports, "uniform")
        if self.eps == 0:
            lam = lam0
        else:
            G = g.double() @ g.double().T
            lam0_exact = np.full(len(lam0), 1.0 / len(lam0))  # float64: sums to 1 within the solver's check
            lam = torch.as_tensor(min_norm_weights(G.numpy(), lam0_exact, self.eps, self.solver), dtype=g.dtype)
        direction = lam @ g
        p = lam.double().clamp_min(1e-300)
        info = {"lambda_max": float(lam.max()), "lambda_entropy": float(-(p * p.log()).sum() / math.log(max(len(p), 2))),
                "direction_norm2": float(direction.double().pow(2).sum()), "mean_update_norm": float(norms.mean())}
        return Aggregate(direction, state, info, weights=lam)


def fedmgda(solver: str = "quadprog") -> FedMGDAPlus:
    """FedMGDA: vanilla MGDA in FL (ε = 1, no normalisation)."""
    return FedMGDAPlus(eps=1.0, normalize=False, solver=solver)
