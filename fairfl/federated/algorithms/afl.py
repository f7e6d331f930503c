"""Agnostic Federated Learning (Mohri, Sivek, Suresh 2019): min_w max_{λ∈Δ} Σₖ λₖ Lₖ(w),
solved by stochastic gradient descent on w and projected gradient ascent on λ.

Each round the direction is the λ-weighted update d = Σₖ λₖ gₖ (over the sampled clients, λ
renormalised to them; with every client sampled, as on Adult, this is exactly Σ λₖ gₖ), and
then λ ← Proj_Δ(λ + γ_λ·L), where L holds the losses the sampled clients report (0 for the
others). The step on w is the clients' local SGD (γ_w is their learning rate); the server step
is 1. As in Mohri et al., the model reported is the averaged iterate w̄_T = (1/T) Σ_{t=1..T} w_t
(:meth:`AFL.eval_params`).

The projection onto the simplex is the sort-based exact one (Duchi et al. 2008): several
public AFL implementations use projections that do not sum to 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from .base import Algorithm, Context, ParamLayout, option, register


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


@dataclass
class AFLState:
    lam: torch.Tensor          # (N,) float64, λ over all clients
    w_sum: torch.Tensor        # Σ of the global models of rounds 1..t (for the averaged iterate)
    w_count: int


@register
@dataclass(frozen=True)
class AFL(Algorithm):
    name = "afl"
    requires = frozenset({"loss_before"})
    State = AFLState
    lr_lambda: float = option(0.1, low=0.0, low_open=True, doc="γ_λ, the ascent step on λ")
    average_iterates: bool = option(True, doc="report the averaged iterate (Mohri et al.)")

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> AFLState:
        return AFLState(torch.full((num_clients,), 1.0 / num_clients, dtype=torch.float64),
                        torch.zeros_like(params), 0)

    def aggregate(self, reports: ClientUpdates, state: AFLState, ctx: Context) -> Aggregate:
        if reports.loss_before is None:
            raise ConfigError("AFL needs the clients' losses before local training")
        lam = state.lam
        idx = torch.as_tensor(reports.clients, dtype=torch.long)
        w = lam[idx]
        w = w / w.sum() if w.sum() > 0 else torch.full_like(w, 1.0 / len(w))
        direction = w.to(reports.updates.dtype) @ reports.updates
        grad = torch.zeros_like(lam)
        grad[idx] = reports.loss_before.double()
        new_state = replace(state, lam=project_simplex(lam + self.lr_lambda * grad))
        if ctx.params is not None and ctx.round >= 1 and self.average_iterates:
            new_state = replace(new_state, w_sum=state.w_sum + ctx.params, w_count=state.w_count + 1)
        return Aggregate(direction, new_state, {"lambda_max": float(new_state.lam.max())}, weights=w.float())

    def eval_params(self, state: AFLState, params: torch.Tensor) -> torch.Tensor:
        if not self.average_iterates or state.w_count == 0:
            return params
        return (state.w_sum + params) / (state.w_count + 1)
