"""Agnostic Federated Learning (Mohri, Sivek, Suresh 2019): min_w max_{λ∈Δ} Σₖ λₖ Lₖ(w),
solved by stochastic gradient descent on w and projected gradient ascent on λ.

Each round the direction is the λ-weighted update d = Σₖ λₖ gₖ (over the sampled clients, λ
renormalised to them; with every client sampled, as on Adult, this is exactly Σ λₖ gₖ), and
then λ ← Proj_Δ(λ + γ_λ·L), where L holds the losses the sampled clients report (0 for the
others). The step on w is the clients' local SGD (γ_w is their learning rate); the server step
should be 1. As in Mohri et al., the model reported is the averaged iterate
w̄_T = (1/T) Σ_{t=1..T} w_t (:meth:`eval_params`).

The projection onto the simplex is the sort-based exact one (Duchi et al. 2008): several
public AFL implementations use projections that do not sum to 1 (REPRODUCTION.md).
"""
from __future__ import annotations

from typing import ClassVar

import torch

from ..errors import ConfigError
from ..local import ClientUpdates
from .base import Aggregate, Aggregator, State


def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of v onto {x ≥ 0, Σx = 1} (Duchi et al. 2008, Fig. 1)."""
    v = v.double()
    u, _ = torch.sort(v, descending=True)
    css = torch.cumsum(u, 0) - 1.0
    k = torch.arange(1, len(v) + 1, dtype=torch.float64)
    rho = int(torch.nonzero(u - css / k > 0).max())
    theta = css[rho] / (rho + 1)
    x = torch.clamp(v - theta, min=0.0)
    return x / x.sum()  # exact in exact arithmetic; removes the last rounding error


class AFL(Aggregator):
    name: ClassVar[str] = "afl"
    requires: ClassVar[frozenset[str]] = frozenset({"loss_before"})

    def __init__(self, lr_lambda: float = 0.1, average_iterates: bool = True):
        if not lr_lambda > 0:
            raise ConfigError(f"AFL lr_lambda must be > 0, got {lr_lambda}")
        self.lr_lambda, self.average_iterates = float(lr_lambda), bool(average_iterates)

    def init(self, num_params: int, num_clients: int) -> State:
        return {"lam": torch.full((num_clients,), 1.0 / num_clients, dtype=torch.float64),
                "w_sum": torch.zeros(num_params), "w_count": 0}

    def aggregate(self, reports: ClientUpdates, state: State, round_: int, params=None) -> Aggregate:
        if reports.loss_before is None:
            raise ConfigError("AFL needs the clients' losses before local training")
        lam = state["lam"]
        idx = torch.as_tensor(reports.clients, dtype=torch.long)
        w = lam[idx]
        w = w / w.sum() if w.sum() > 0 else torch.full_like(w, 1.0 / len(w))
        direction = w.to(reports.updates.dtype) @ reports.updates
        grad = torch.zeros_like(lam)
        grad[idx] = reports.loss_before.double()
        new_state = dict(state, lam=project_simplex(lam + self.lr_lambda * grad))
        if params is not None and round_ >= 1 and self.average_iterates:
            new_state["w_sum"] = state["w_sum"] + params
            new_state["w_count"] = state["w_count"] + 1
        info = {"lambda_max": float(new_state["lam"].max())}
        return Aggregate(direction, new_state, info, weights=w.float())

    def eval_params(self, state: State, params: torch.Tensor) -> torch.Tensor:
        if not self.average_iterates or state["w_count"] == 0:
            return params
        return (state["w_sum"] + params) / (state["w_count"] + 1)
