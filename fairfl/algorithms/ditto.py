"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021), a fair-FL baseline of the DQN-Fed paper (App. H:
λ ∈ {0.01, 0.05, 0.1, 0.5, 1, 2, 5}).

Objective: a global model w* of the FedAvg objective and, for each client k, a personal model
v_k ∈ argmin F_k(v) + (λ/2)·‖v − w*‖². λ = 0 trains purely local models; λ → ∞ pulls every v_k
onto the global model.

A round (Ditto Algorithm 1, as the official code ``litian96/ditto`` runs it, commit 26d9b29,
``flearn/trainers_MTL/ditto.py``): each sampled client

* trains the global model exactly as FedAvg does and sends its update (the server aggregates
  with FedAvg's rule and step) — so Ditto's global model *is* FedAvg's, bit for bit, whatever λ;
* updates its personal model with the same number of local steps, learning rate and batches:
  v_k ← v_k − η·(∇F_k(v_k) + λ·(v_k − wᵗ)), SGD on F_k(v) + (λ/2)‖v − wᵗ‖² from v_k, anchored at the
  global model wᵗ *received at the start of the round* (the official TF code and FLGo; the
  PyTorch port's moving anchor and unsquared norm are not Ditto's objective).

The personal models are per-client state (checkpointed); every v_k starts as a copy of the
initial global model w⁰ (the official code's initialisation), and clients not sampled keep
theirs. Evaluation is personal: client k's accuracy and losses are those of v_k on its own data
(a never-sampled client is evaluated with w⁰, as in the official code). The share of improved
participants (DQN-Fed eq. (29)) is measured by the loop on the global model, whose update is the
server's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import ConfigError
from ..messages import ClientUpdates
from .base import Context, ParamLayout, RoundPlan, option, register
from .fedavg import FedAvg


@dataclass
class DittoState:
    initial: torch.Tensor          # w⁰: the personal model of a client not sampled yet


@dataclass
class DittoClient:
    personal: torch.Tensor         # v_k


@register
@dataclass(frozen=True)
class Ditto(FedAvg):
    """Ditto: FedAvg's global model plus a personal model per client, pulled towards the global
    one with strength λ (``lam``)."""

    name = "ditto"
    State = DittoState
    ClientState = DittoClient
    personal = True
    lam: float = option(1.0, low=0.0, doc="λ of the proximal pull towards the global model")

    def check(self, config: Any) -> None:
        # the personal step contracts (v − wᵗ) by (1 − ηλ) on top of ∇F: it diverges once ηλ ≥ 2
        if config.local.lr * self.lam >= 2:
            raise ConfigError(f"ditto: lam={self.lam} with the local lr {config.local.lr} gives η·λ = "
                              f"{config.local.lr * self.lam:g} ≥ 2, where the personal update diverges")

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> DittoState:
        return DittoState(params.clone())

    def configure(self, ctx: Context, state: DittoState) -> RoundPlan:
        # w⁰ goes with the model: a client's first personal model is a copy of it
        return replace(super().configure(ctx, state), extras={"initial": state.initial})

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        reports = super().client_update(ctx, plan, clients)     # the global half: FedAvg's, untouched
        starts = torch.stack([self._personal(clients, k, plan.extras["initial"]) for k in plan.clients])
        # same steps, η and batches as the global half (the same batch generator), anchored at wᵗ
        personal = clients.train_from(plan.clients, starts, replace(plan.local, prox_mu=self.lam),
                                      prox_centre=ctx.params)
        for k, v in zip(plan.clients, personal):
            clients.states[int(k)] = DittoClient(v.clone())
        return reports

    def evaluate(self, ctx: Context, state: DittoState, clients):
        return clients.evaluate_each([self._personal(clients, k, state.initial) for k in range(clients.num_clients)])

    @staticmethod
    def _personal(clients, k: int, initial: torch.Tensor) -> torch.Tensor:
        own = clients.states.get(int(k))
        return initial if own is None else own.personal
