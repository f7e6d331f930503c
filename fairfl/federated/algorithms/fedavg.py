"""FedAvg (McMahan et al. 2017), FedAvg-n (FedMGDA+ §6: FedAvg on unit-normalised updates),
FedProx (Li et al. 2020: FedAvg whose clients add a proximal term) and FedAvg-FT (FedAvg whose
clients fine-tune the global model before they are scored: the personalisation baseline)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ..messages import Aggregate, ClientUpdates
from fairfl.base.seeding import FINETUNE
from .base import Algorithm, Context, RoundPlan, ServerStep, option, register, with_proximal_term


def sample_weights(reports: ClientUpdates, weighting: str) -> torch.Tensor:
    """FedAvg's pₖ: ∝ nₖ ("samples") or 1/m ("uniform", FedMGDA+'s λ₀)."""
    if weighting == "samples":
        w = reports.num_samples.to(torch.float64)
    else:
        w = torch.ones(reports.m, dtype=torch.float64)
    return (w / w.sum()).to(reports.updates.dtype)


def row_norms(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖gᵢ‖, gᵢ / maxⱼ|gᵢⱼ|): norms computed on rows rescaled by their largest entry, so that
    neither 1e30 (the sum of squares overflows float32) nor 1e-30 (it underflows) is lost."""
    peak = g.abs().amax(dim=1, keepdim=True)
    scaled = g / torch.where(peak > 0, peak, torch.ones_like(peak))
    return peak.squeeze(1) * scaled.norm(dim=1), scaled


def normalise_rows(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-normalise each row; a zero row stays zero instead of becoming NaN (the FedMGDA+
    released code divided by 0). Any non-zero finite row, however large or small, keeps its
    direction. Returns (unit rows, norms)."""
    norms, scaled = row_norms(g)
    scaled_norms = scaled.norm(dim=1, keepdim=True)
    unit = scaled / torch.where(scaled_norms > 0, scaled_norms, torch.ones_like(scaled_norms))
    return unit, norms


WEIGHTINGS = ("samples", "uniform")


@register
@dataclass(frozen=True)
class FedAvg(ServerStep, Algorithm):
    """d = Σₖ pₖ gₖ with pₖ ∝ nₖ (``weighting="samples"``, McMahan et al.) or pₖ = 1/m
    (``"uniform"``, the λ₀ of FedMGDA+); step ηₜ·d with FedMGDA+'s schedule (``server_lr``,
    ``decay``; the defaults give plain FedAvg's step of 1)."""

    name = "fedavg"
    weighting: str = option("samples", choices=WEIGHTINGS)

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        w = sample_weights(reports, self.weighting)
        return Aggregate(w @ reports.updates, state, weights=w)


@register
@dataclass(frozen=True)
class FedAvgN(ServerStep, Algorithm):
    """FedAvg-n: d = Σₖ pₖ gₖ/‖gₖ‖ (zero updates contribute zero). With the server step η and
    its decay this is FedMGDA+ with ε = 0 (FedMGDA+ §6.1.4)."""

    name = "fedavg_n"
    weighting: str = option("uniform", choices=WEIGHTINGS)

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        w = sample_weights(reports, self.weighting)
        unit, norms = normalise_rows(reports.updates)
        return Aggregate(w @ unit, state, {"mean_update_norm": float(norms.mean())}, weights=w)


@register
@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedProx: FedAvg whose clients minimise fₖ(w) + (μ/2)‖w − wₜ‖² locally."""

    name = "fedprox"
    mu: float = option(0.01, low=0.0)

    def configure(self, ctx: Context, state: Any) -> RoundPlan:
        return with_proximal_term(super().configure(ctx, state), self.mu)


@register
@dataclass(frozen=True)
class FedAvgFT(FedAvg):
    """FedAvg with local fine-tuning, the reference of personalised federated learning (Wang et
    al. 2019, "Federated Evaluation of On-device Personalization"; the "FedAvg-FT" of pFL-Bench,
    Chen et al. 2022): training is FedAvg's, bit for bit; at each evaluation every client
    fine-tunes the global model on its own training data for ``finetune_epochs`` epochs of the
    experiment's local SGD (of K steps each where the experiment trains K local steps a round; its
    own batch stream, :data:`fairfl.base.seeding.FINETUNE`) and is scored at that personal model. The fine-tuned models are not kept: the next evaluation starts again
    from the global model."""

    name = "fedavg_ft"
    personal = True
    finetune_epochs: int = option(1, low=1, doc="epochs of local SGD from the global model before a client is scored")

    def evaluate(self, ctx: Context, state: Any, clients) -> Any:
        n = clients.num_clients
        start = self.eval_params(state, ctx.params)
        tuned = fine_tune(clients, list(range(n)), start.unsqueeze(0).repeat(n, 1), ctx.local, self.finetune_epochs)
        return clients.evaluate_each(list(tuned))


def fine_tune(clients, ids, starts: torch.Tensor, local, epochs: int = 1) -> torch.Tensor:
    """(m, d): clients ``ids`` each trained from its row of ``starts`` on its own training data for
    ``epochs`` epochs of the experiment's local SGD (``local``; of K steps each where the experiment
    trains K local steps a round), without a proximal term, on the fine-tuning batch stream
    (:data:`fairfl.base.seeding.FINETUNE`): FedAvg-FT's personal models, and the budget Ditto gives a
    client that was never sampled (:meth:`fairfl.federated.algorithms.ditto.Ditto.untrained`)."""
    # an experiment that trains K local steps a round (LocalTraining.steps) fine-tunes for K steps an epoch
    steps = None if local.steps is None else local.steps * epochs
    return clients.train_from(list(ids), starts, replace(local, epochs=epochs, steps=steps, prox_mu=0.0),
                              purpose=FINETUNE)
