"""q-FedAvg (Li, Sanjabi, Beirami, Smith 2020, "Fair Resource Allocation in Federated
Learning", Algorithm 3), as the FedMGDA+, FedFV and DQN-Fed papers run it.

Each sampled client k reports its update gₖ = w − w̄ₖ and Fₖ, its mean training loss at the
global model *before* local training (plus 1e-10 so that Fₖ^{q−1} exists at a zero loss).
With L the Lipschitz estimate (1/η_local in the q-FFL code):

    Δwₖ = L·gₖ,   Δₖ = Fₖ^q·Δwₖ,   hₖ = q·Fₖ^{q−1}·‖Δwₖ‖² + L·Fₖ^q,   w ← w − Σₖ Δₖ / Σₖ hₖ

so the direction returned is Σ Δₖ / Σ hₖ and the server step should be 1. Note the *squared*
norm in hₖ (REPRODUCTION.md, known traps). The scalars are computed in float64: Fₖ^q for
q = 5 and an inflated loss overflows float32 quickly.
"""
from __future__ import annotations

from typing import ClassVar

from ..errors import ConfigError
from ..local import ClientUpdates
from .base import Aggregate, Aggregator, State

LOSS_FLOOR = 1e-10


class QFedAvg(Aggregator):
    name: ClassVar[str] = "qfedavg"
    requires: ClassVar[frozenset[str]] = frozenset({"loss_before"})

    def __init__(self, q: float, L: float):
        if not q >= 0:
            raise ConfigError(f"q-FedAvg q must be >= 0, got {q}")
        if not L > 0:
            raise ConfigError(f"q-FedAvg L must be > 0, got {L}")
        self.q, self.L = float(q), float(L)

    def aggregate(self, reports: ClientUpdates, state: State, round_: int, params=None) -> Aggregate:
        if reports.loss_before is None:
            raise ConfigError("q-FedAvg needs the clients' losses before local training")
        F = reports.loss_before.double() + LOSS_FLOOR
        g = reports.updates.double()
        dw_sq = (self.L ** 2) * (g * g).sum(dim=1)                       # ‖Δwₖ‖²
        Fq = F ** self.q
        h = self.q * F ** (self.q - 1) * dw_sq + self.L * Fq            # hₖ
        weights = Fq * self.L / h.sum()                                  # Δₖ / Σh = (Fₖ^q L / Σh)·gₖ
        direction = (weights @ g).to(reports.updates.dtype)
        return Aggregate(direction, state, {"sum_h": float(h.sum())}, weights=weights.float())
