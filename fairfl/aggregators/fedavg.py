"""FedAvg (McMahan et al. 2017) and FedAvg-n (FedMGDA+ §6: FedAvg on unit-normalised updates).

FedProx (Li et al. 2020) aggregates like FedAvg; its difference, the proximal term, lives in
the clients' local training (see ``fairfl.algorithms``)."""
from __future__ import annotations

from typing import ClassVar

import torch

from ..errors import ConfigError
from ..local import ClientUpdates
from .base import Aggregate, Aggregator, State, normalise_rows


def sample_weights(reports: ClientUpdates, weighting: str) -> torch.Tensor:
    """FedAvg's pₖ: ∝ nₖ ("samples") or 1/m ("uniform", FedMGDA+'s λ₀)."""
    if weighting == "samples":
        w = reports.num_samples.to(torch.float64)
    else:
        w = torch.ones(reports.m, dtype=torch.float64)
    return (w / w.sum()).to(reports.updates.dtype)


class FedAvg(Aggregator):
    """d = Σₖ pₖ gₖ with pₖ ∝ nₖ (``weighting="samples"``, McMahan et al.) or pₖ = 1/m
    (``"uniform"``, the λ₀ of FedMGDA+)."""

    name: ClassVar[str] = "fedavg"

    def __init__(self, weighting: str = "samples"):
        if weighting not in ("samples", "uniform"):
            raise ConfigError(f"FedAvg weighting={weighting!r} is not 'samples' or 'uniform'")
        self.weighting = weighting

    def aggregate(self, reports: ClientUpdates, state: State, round_: int, params=None) -> Aggregate:
        w = sample_weights(reports, self.weighting)
        return Aggregate(w @ reports.updates, state, weights=w)


class FedAvgN(FedAvg):
    """FedAvg-n: d = Σₖ pₖ gₖ/‖gₖ‖ (zero updates contribute zero). With the server step η and
    its decay this is FedMGDA+ with ε = 0 (FedMGDA+ §6.1.4)."""

    name: ClassVar[str] = "fedavg_n"

    def __init__(self, weighting: str = "uniform"):
        super().__init__(weighting)

    def aggregate(self, reports: ClientUpdates, state: State, round_: int, params=None) -> Aggregate:
        w = sample_weights(reports, self.weighting)
        unit, norms = normalise_rows(reports.updates)
        return Aggregate(w @ unit, state, {"mean_update_norm": float(norms.mean())}, weights=w)
