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
theirs. Evaluation is personal: client k's accuracy and losses are those of v_k on its own data.

**A client never sampled** has no v_k yet. The official code scores it at w⁰, a model that never
trained on anything (3–27 % on notebook 06's federations, against FedAvg-FT's fine-tuned 57–100 %:
the personal track then compares a random model with a trained one). Here no client is scored on
a model that never trained on it (:meth:`Ditto.untrained`): it gets, at evaluation, FedAvg-FT's
budget — one local epoch of the experiment's SGD, no proximal term, on the fine-tuning stream
(:func:`fairfl.federated.algorithms.fedavg.fine_tune`) — from the current global model wᵗ (λ > 0: what
Ditto's personal objective is anchored at), or from its own w⁰ where λ = 0 (Local-only: a purely
local model stays local, never touching the global one). These models are not kept: a client
sampled later starts its v_k from w⁰ as before, and the next evaluation starts again. This changes
what the official code reports for clients never sampled (only them): :meth:`Ditto.revision`.
The share of improved participants (DQN-Fed eq. (29)) is measured by the loop on the global
model, whose update is the server's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from fairfl.base.errors import ConfigError
from ..messages import ClientUpdates
from .base import Context, ParamLayout, RoundPlan, option, register
from .fedavg import FedAvg, fine_tune


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

    def revision(self) -> int:
        # 1: a client never sampled is scored at a model trained for FedAvg-FT's budget, not at w⁰ (untrained)
        return 1

    def evaluate(self, ctx: Context, state: DittoState, clients):
        models = [self._personal(clients, k, None) for k in range(clients.num_clients)]
        never = [k for k, v in enumerate(models) if v is None]
        if never:
            for k, v in zip(never, self.untrained(clients, never, ctx.params, state.initial, ctx.local)):
                models[k] = v
        return clients.evaluate_each(models)

    def untrained(self, clients, ids, params: torch.Tensor, initial: torch.Tensor, local) -> torch.Tensor:
        """(m, d): the models clients ``ids``, never sampled, are scored at — one epoch of local SGD
        (FedAvg-FT's budget, :func:`~fairfl.federated.algorithms.fedavg.fine_tune`) from the global model
        ``params`` (λ > 0), or from their own initial model ``initial`` (λ = 0: Local-only)."""
        start = initial if self.lam == 0 else params
        return fine_tune(clients, ids, start.unsqueeze(0).repeat(len(ids), 1), local, epochs=1)

    @staticmethod
    def _personal(clients, k: int, initial: torch.Tensor | None) -> torch.Tensor | None:
        own = clients.states.get(int(k))
        return initial if own is None else own.personal
