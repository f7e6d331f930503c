"""TERM (Li, Beirami, Sanjabi, Smith, "Tilted Empirical Risk Minimization", ICLR 2021) at the
client level, the fair-FL baseline of the DQN-Fed paper (§6, App. H: t ∈ {0.1, 0.5, 1, 2, 5}).

Objective: the tilted risk over clients, J_t(w) = (1/t)·log Σₖ πₖ·exp(t·Fₖ(w)) (TERM eq. (2)
with the clients as the units and ERM inside each client), πₖ FedAvg's weights. Its gradient is
Σₖ pₖ∇Fₖ(w) with pₖ = πₖ·exp(t·Fₖ) / Σⱼ πⱼ·exp(t·Fⱼ), a softmax of t·loss: t → 0 gives FedAvg,
t → ∞ puts all the weight on the client with the largest loss (minimax), and adding a constant
to every Fₖ changes nothing.

Clients train exactly as in FedAvg and report their update gₖ and Fₖ, the mean training loss at
the global model *before* local training. The server steps by d = Σₖ pₖ·gₖ with a step of 1; the
softmax is taken as exp(t·(Fₖ − max F)) in float64, so no exponent overflows.

``mode="official"`` reproduces the released federated code (litian96/TERM, commit ac3c01d,
``fair_flearn/flearn/trainers/tilting.py`` lines 66–80): ωₖ = exp(t·(Fₖ − max F)) / (R̃·m) with
a running estimate R̃ ← ½R̃ + ½·meanₖ exp(t·(Fₖ − max F)) starting at 0, and the step
(1/m)·Σₖ ωₖ·gₖ — the normalised direction scaled by (mean/R̃)/m, i.e. at t = 0 FedAvg's step
times 2/m, 4/(3m), 8/(7m), … (its averaging divides by m twice).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from .base import Algorithm, Context, ParamLayout, option, register
from .fedavg import WEIGHTINGS, sample_weights

MODES = ("softmax", "official")


def tilted_weights(losses: torch.Tensor, prior: torch.Tensor, t: float) -> torch.Tensor:
    """pₖ ∝ πₖ·exp(t·Fₖ), normalised, in float64 (shifted by max F: exact and overflow-free)."""
    F = losses.double()
    if not torch.isfinite(F).all():
        raise ConfigError(f"TERM needs finite client losses, got {F.tolist()}")
    e = prior.double() * torch.exp(t * (F - F.max()))
    return e / e.sum()


@dataclass
class TERMState:
    estimate: float        # R̃ of mode "official" (0 before the first round)


@register
@dataclass(frozen=True)
class TERM(Algorithm):
    """Client-level TERM: the update weighted by a softmax of t × the clients' losses."""

    name = "term"
    requires = frozenset({"loss_before"})
    State = TERMState
    t: float = option(1.0, low=0.0, doc="tilt: 0 = FedAvg, larger = closer to the max-loss client")
    weighting: str = option("samples", choices=WEIGHTINGS, doc="the prior πₖ (FedAvg's weights)")
    mode: str = option("softmax", choices=MODES, doc="'official': the released code's running estimate")

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> TERMState:
        return TERMState(0.0)

    def aggregate(self, reports: ClientUpdates, state: TERMState, ctx: Context) -> Aggregate:
        if reports.loss_before is None:
            raise ConfigError("TERM needs the clients' losses before local training")
        prior = sample_weights(reports, self.weighting).double()
        p = tilted_weights(reports.loss_before, prior, self.t)
        if self.mode == "official":
            F = reports.loss_before.double()
            tilt = torch.exp(self.t * (F - F.max()))
            estimate = 0.5 * state.estimate + 0.5 * float(tilt.mean())
            omega = tilt / (estimate * reports.m)
            weights = omega / reports.m
            state = TERMState(estimate)
        else:
            weights = p
        direction = (weights.to(reports.updates.dtype) @ reports.updates)
        info = {"max_weight": float(p.max()), "loss_spread": float(reports.loss_before.max() - reports.loss_before.min())}
        return Aggregate(direction, state, info, weights=weights.to(reports.updates.dtype))
