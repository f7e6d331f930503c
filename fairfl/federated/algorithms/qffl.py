"""q-FedAvg (Li, Sanjabi, Beirami, Smith 2020, "Fair Resource Allocation in Federated
Learning", Algorithm 3), as the FedMGDA+, FedFV and DQN-Fed papers run it.

Each sampled client k reports its update gₖ = w − w̄ₖ and Fₖ, its mean training loss at the
global model *before* local training (plus 1e-10 so that Fₖ^{q−1} exists at a zero loss).
With L the Lipschitz estimate (1/η_local in the q-FFL code):

    Δwₖ = L·gₖ,   Δₖ = Fₖ^q·Δwₖ,   hₖ = q·Fₖ^{q−1}·‖Δwₖ‖² + L·Fₖ^q,   w ← w − Σₖ Δₖ / Σₖ hₖ

so the direction is Σ Δₖ / Σ hₖ and the step is 1 (Algorithm 3 has no server rate). Note the
*squared* norm in hₖ (a known trap of public re-implementations). The scalars are computed in
float64: Fₖ^q for q = 5 and an inflated loss overflows float32 quickly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from .base import Algorithm, Context, option, register

LOSS_FLOOR = 1e-10


def qffl_weights(losses, updates, q: float, L: float):
    """(Fₖ^q·L / Σh per client, Σh) of Algorithm 3, in float64."""
    F = losses.double() + LOSS_FLOOR
    g = updates.double()
    dw_sq = (L ** 2) * (g * g).sum(dim=1)                       # ‖Δwₖ‖²
    Fq = F ** q
    h = q * F ** (q - 1) * dw_sq + L * Fq                        # hₖ
    return Fq * L / h.sum(), h.sum()                             # Δₖ / Σh = (Fₖ^q L / Σh)·gₖ


@register
@dataclass(frozen=True)
class QFedAvg(Algorithm):
    """q-FedAvg: q = 0 is FedAvg with L-normalised steps; larger q weights high-loss clients
    more. ``L`` defaults to 1 / (the clients' learning rate), as in the q-FFL code."""

    name = "qfedavg"
    requires = frozenset({"loss_before"})
    q: float = option(1.0, low=0.0)
    L: float | None = option(None, low=0.0, low_open=True)

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        if reports.loss_before is None:
            raise ConfigError("q-FedAvg needs the clients' losses before local training")
        L = self.L if self.L is not None else 1.0 / ctx.local.lr
        weights, sum_h = qffl_weights(reports.loss_before, reports.updates, self.q, L)
        direction = (weights @ reports.updates.double()).to(reports.updates.dtype)
        return Aggregate(direction, state, {"sum_h": float(sum_h)}, weights=weights.float())
