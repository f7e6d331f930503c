"""FedNew (Elgabli, Issaid, Bedi, Rajawat, Bennis & Aggarwal, "FedNew: A Communication-Efficient
and Privacy-Preserving Newton-Type Method for Federated Learning", ICML 2022), a second-order
baseline of DQN-Fed (Tables 1–6; App. H gives no hyper-parameters for it).

The Newton direction y = (H + αI)⁻¹ḡ solves the consensus problem
min Σᵢ ½yᵢᵀ(Hᵢ + αI)yᵢ − gᵢᵀyᵢ s.t. yᵢ = y; FedNew runs *one* ADMM pass per round, its state
warm-started across rounds (official MATLAB code ``aelgabli/FedNew``, commit 459c0b2,
``newton_ADMM.m``). Round k:

    client i:  yᵢᵏ = (Hᵢᵏ + (α + ρ)I)⁻¹ (gᵢᵏ − λᵢᵏ⁻¹ + ρ yᵏ⁻¹),   gᵢᵏ = ∇fᵢ(xᵏ);   sends yᵢᵏ only
               (``newton_ADMM.m:48`` gᵢ, ``:56-63`` Hᵢ with α on its diagonal, ``:77`` the solve)
    server:    yᵏ = (1/n) Σᵢ (yᵢᵏ + λᵢᵏ⁻¹/ρ)      (``newton_ADMM.m:84``; = mean yᵢ while Σλᵢ = 0)
               xᵏ⁺¹ = xᵏ − η yᵏ                     (η = 1, ``newton_ADMM.m:98``; ``server_lr``)
               λᵢᵏ = λᵢᵏ⁻¹ + ρ (yᵢᵏ − yᵏ)            (``newton_ADMM.m:88-90``)

Hessian refresh (``hessian_every``): 1 recomputes Hᵢ every round (``newton_ADMM_Hk.m:52-64``, the
``if`` commented out), 0 keeps the first one (``newton_ADMM.m:52-64``: ``if (i==1)``), r > 1
refreshes on the code's rounds: ``newton_ADMM_periodic_Hk.m:52`` refreshes where
``i==1 || rem(i,10)==0`` with i = 1, 2, … the iteration, i.e. on rounds k = i − 1 = 0, 9, 19, 29, …
(0-based, as ``ctx.round``); here on round 0 and every round k with (k + 1) mod r = 0 (the code's
r = 10 is hard-coded). A client also takes its first Hessian at its first round.

**Two readings, chosen by d** (``hessian_mode="auto"``: ``"full"`` when d ≤ ``max_full_d``, 2000 by
default, else ``"cg"``):

* ``"full"``: the dense local Hessian (``clients.hessian``, float64) and a direct solve
  (α + ρ > 0 makes the system positive definite even for a singular softmax Hessian; the code
  uses ``pinv``, ``newton_ADMM.m:77``);
* ``"cg"``: FedNew never sends a Hessian, it only needs (Hᵢ + cI)⁻¹v on the client, c = α + ρ — so
  conjugate gradients on v ↦ ∇²fᵢ v + cv with Hessian-vector products (``clients.hvp``, double
  backward on the client's training data, in float32 unless ``products="float64"``; the CG recursion
  is float64; with ``hessian_batch`` = b, on a fixed subsample of b of the client's samples drawn once per
  run — a subsampled Hessian, Byrd et al. 2011 — while the gradient stays exact) *is* FedNew up to the CG
  tolerance: at most ``cg_iters``
  iterations to a relative residual ``cg_tol``, warm-started at the client's previous yᵢ, stopped at
  the first direction of non-positive curvature pᵀ(Hᵢ + cI)p ≤ 0 (Steihaug: a network's Hessian may
  be indefinite), returning the current iterate — or, when that happens before the first step,
  the solution with Hᵢ left out, rhs/c (the bounded analogue of Nocedal & Wright's steepest-descent
  return in Algorithm 7.1). With Hᵢ refreshed every r rounds the products are
  taken at the point of the last refresh, which the client keeps.

Choices: the code's gᵢ and Hᵢ are *sums* over the client's samples (``newton_ADMM.m:48, 58-61``) and
its L2 term λ is added on every worker (``:48`` λx, ``:56`` λI), while the objective counts it once
(``:104``); here fᵢ is the client's mean training loss with no L2 term, so ρ and α are on that scale (defaults ρ = 1, α = 1e-3; a grid ρ ∈ {0.01, 0.1, 1, 10}). **Partial participation**,
which the paper does not treat: only the round's clients solve and update λᵢ; the server keeps each
client's last uᵢ = yᵢ + λᵢ/ρ and averages over all n (absent clients' stored uᵢ, 0 for a client never
seen). λᵢ is kept by the server, which can mirror it exactly (it sees yᵢ and y), and handed to the
clients with the plan (``extras["lam"]``, every client's row, so n·d numbers to every Flower node):
in a deployment client i keeps its own, and what it computes is the same. ρ = 0 is allowed (no consensus term: λ stays 0 and
y = mean yᵢ). The clients' loss derivatives are of the training loss in eval mode (no dropout).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from .base import (PRODUCT_DTYPES, Algorithm, Context, ParamLayout, RoundPlan, ServerStep, hessian_rows,
                   newton_solve, option, register)

MODES = ("auto", "full", "cg")
ROWS_STREAM = 0x4E3           # a client's fixed Hessian subsample (hessian_batch; purpose of ctx.rng)


def conjugate_gradient(apply: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, x0: torch.Tensor,
                       iters: int, tol: float,
                       fallback: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched CG on A xᵣ = bᵣ for every row r (``apply``: (m, d) → (m, d), one A per row), from x0:
    at most ``iters`` iterations, a row stopping once ‖rᵣ‖ ≤ tol·‖bᵣ‖ or at a direction p with
    pᵀAp ≤ 0 (Steihaug), keeping its current iterate — or, if that happens before its first step,
    ``fallback`` (Nocedal & Wright's Algorithm 7.1 returns the steepest-descent direction there;
    default: x0). Returns (x, iterations per row, negative-curvature flag per row)."""
    x = x0.clone()
    r = b - apply(x) if bool(x0.any()) else b.clone()
    p = r.clone()
    rr = (r * r).sum(dim=1)
    bnorm = b.norm(dim=1)
    active = rr.sqrt() > tol * bnorm
    steps = torch.zeros(len(b), dtype=torch.long)
    negative = torch.zeros(len(b), dtype=torch.bool)
    for _ in range(iters):
        if not bool(active.any()):
            break
        Ap = apply(p)
        pAp = (p * Ap).sum(dim=1)
        bad = active & ~(pAp > 0)
        negative |= bad
        if fallback is not None:
            first = bad & (steps == 0)
            x[first] = fallback[first]
        active &= ~bad
        a = torch.where(active, rr / torch.where(pAp > 0, pAp, torch.ones_like(pAp)), torch.zeros_like(rr))
        x += a.unsqueeze(1) * p
        r -= a.unsqueeze(1) * Ap
        rr_new = (r * r).sum(dim=1)
        steps += active.long()
        active &= rr_new.sqrt() > tol * bnorm
        beta = torch.where(rr > 0, rr_new / torch.where(rr > 0, rr, torch.ones_like(rr)), torch.zeros_like(rr))
        p = torch.where(active.unsqueeze(1), r + beta.unsqueeze(1) * p, p)
        rr = rr_new
    return x, steps, negative


def consensus(y_local: torch.Tensor, lam: torch.Tensor, rho: float) -> torch.Tensor:
    """uᵢ = yᵢ + λᵢ/ρ, the clients' part of the ADMM y-update (= yᵢ when ρ = 0)."""
    return y_local if rho == 0 else y_local + lam / rho


@dataclass
class FedNewState:
    y: torch.Tensor          # yᵏ⁻¹, the consensus direction (float64)
    lam: torch.Tensor        # (n, d) λᵢ (float64)
    u: torch.Tensor          # (n, d) each client's last yᵢ + λᵢ/ρ (float64)


@dataclass
class FedNewClient:
    reference: torch.Tensor          # the point of the client's last Hessian refresh
    hessian: torch.Tensor            # its dense Hessian there ("full"; empty for "cg")
    y: torch.Tensor                  # its last yᵢ (CG warm start)
    rounds: int                      # rounds it has taken part in


@register
@dataclass(frozen=True)
class FedNew(ServerStep, Algorithm):
    """FedNew: one ADMM pass per round on the damped Newton system, only yᵢ leaving a client."""

    name = "fednew"
    State = FedNewState
    ClientState = FedNewClient
    rho: float = option(1.0, low=0.0, doc="ADMM penalty ρ")
    alpha: float = option(1e-3, low=0.0, doc="damping α of (H + αI)")
    hessian_every: int = option(1, low=0, doc="refresh Hᵢ every r rounds (0: keep the first)")
    hessian_mode: str = option("auto", choices=MODES, doc="auto: full when d ≤ max_full_d, else cg")
    max_full_d: int = option(2000, low=1, doc="the largest d of the dense reading under hessian_mode='auto'")
    cg_iters: int = option(10, low=1, doc="CG iterations per client and round (cg)")
    cg_tol: float = option(1e-3, low=0.0, doc="CG's relative residual (cg)")
    products: str = option("float32", choices=tuple(PRODUCT_DTYPES),
                           doc="dtype of the Hessian-vector products (cg; CG itself runs in float64); float32 is "
                               "2.6× faster on a CPU")
    hessian_batch: int | None = option(None, low=1, doc="products on this many of a client's training samples, "
                                                        "fixed per run (cg; None: all of them)")

    def mode(self, d: int) -> str:
        if self.hessian_mode != "auto":
            return self.hessian_mode
        return "full" if d <= self.max_full_d else "cg"

    def check(self, config: Any) -> None:
        if self.rho + self.alpha <= 0:
            raise ConfigError("fednew: rho + alpha must be positive, or a client's system (Hᵢ + (α + ρ)I) may be "
                              f"singular (got rho={self.rho}, alpha={self.alpha})")
        if config.attacks:
            raise ConfigError("fednew: clients send local Newton directions, which the attacks do not model")

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> FedNewState:
        d = params.numel()
        zeros = torch.zeros(num_clients, d, dtype=torch.float64)
        return FedNewState(torch.zeros(d, dtype=torch.float64), zeros, zeros.clone())

    def configure(self, ctx: Context, state: FedNewState) -> RoundPlan:
        return replace(super().configure(ctx, state), extras={"y": state.y, "lam": state.lam})

    def _refresh(self, own: FedNewClient | None, round_: int) -> bool:
        """Whether a client takes a fresh Hessian this round: at its first round, and on the code's
        rounds (0-based k with (k + 1) mod r = 0: newton_ADMM_periodic_Hk.m:52's rem(i, 10) == 0, i = k + 1)."""
        if own is None:
            return True
        return self.hessian_every > 0 and (round_ + 1) % self.hessian_every == 0

    def revision(self) -> int:
        # 1: the periodic refresh moved one round earlier (onto the code's rounds) after results were cached:
        # only r > 1 computes otherwise. 2: the dense reading's solve leaves out the directions below float32's
        # precision (base.newton_solve), where it had solved near-singular systems into huge steps: every
        # config that may take the dense reading (fairfl.runs.config.ExperimentConfig.key)
        if self.hessian_mode == "cg":
            return 1 if self.hessian_every > 1 else 0
        return 3 if self.hessian_every > 1 else 2

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        ids, w = [int(k) for k in plan.clients], ctx.params
        mode, c = self.mode(w.numel()), self.alpha + self.rho
        y_prev, lam = plan.extras["y"].double(), plan.extras["lam"].double()
        rhs = clients.gradients(w, ids).double() - lam[ids] + self.rho * y_prev
        owns = [clients.states.get(k) for k in ids]
        due = [self._refresh(own, ctx.round) for own in owns]
        refs = torch.stack([w.double() if fresh else own.reference for own, fresh in zip(owns, due)])
        if mode == "full":
            fresh = [k for k, f in zip(ids, due) if f]
            new = dict(zip(fresh, clients.hessian(refs[[r for r, f in enumerate(due) if f]], fresh))) if fresh else {}
            hessians = [new[k] if f else own.hessian for k, own, f in zip(ids, owns, due)]
            eye = torch.eye(w.numel(), dtype=torch.float64)
            # α + ρ > 0 keeps the system definite in exact arithmetic; a tiny α with ρ = 0 leaves it singular in
            # floating point, where the code's pinv (newton_ADMM.m:77) is what newton_solve falls back to
            stats: dict = {}
            y = torch.stack([newton_solve(H + c * eye, b, stats) for H, b in zip(hessians, rhs)])
            info = {"newton_dropped": torch.tensor([float(stats.get("dropped", 0))], dtype=torch.float64)}
        else:
            hessians = [torch.zeros(0, dtype=torch.float64)] * len(ids)
            start = torch.stack([torch.zeros_like(w, dtype=torch.float64) if own is None else own.y for own in owns])
            # negative curvature before the first step: the solution with Hᵢ left out, (cI)⁻¹ rhs
            rows = hessian_rows(clients, ids, ctx, ROWS_STREAM, self.hessian_batch)
            dtype = PRODUCT_DTYPES[self.products]
            y, steps, negative = conjugate_gradient(lambda v: clients.hvp(refs, ids, v, dtype=dtype, rows=rows).double()
                                                    + c * v,
                                                    rhs, start, self.cg_iters, self.cg_tol, rhs / c)
            info = {"cg_steps": steps.double(), "cg_negative": negative.double()}
        for r, k in enumerate(ids):
            clients.states[k] = FedNewClient(refs[r], hessians[r], y[r].clone(),
                                             1 if owns[r] is None else owns[r].rounds + 1)
        return ClientUpdates(plan.clients, y.to(w.dtype), clients.num_samples(ids),
                             clients.losses(w, ids) if plan.loss_before else None, None,
                             {"fednew_y": y, **info})

    def aggregate(self, reports: ClientUpdates, state: FedNewState, ctx: Context) -> Aggregate:
        ids = torch.as_tensor(reports.clients, dtype=torch.long)
        y_local = reports.extras.get("fednew_y", reports.updates).double()
        u = state.u.clone()
        u[ids] = consensus(y_local, state.lam[ids], self.rho)
        y = u.mean(dim=0)
        lam = state.lam.clone()
        lam[ids] = state.lam[ids] + self.rho * (y_local - y)
        info = {"y_norm": float(y.norm()), "lambda_sum_norm": float(lam.sum(dim=0).norm())}
        if "newton_dropped" in reports.extras:        # directions left out of the clients' solves (base.newton_solve)
            info["newton_dropped"] = float(reports.extras["newton_dropped"].sum())
        if "cg_steps" in reports.extras:
            info.update(cg_steps=float(reports.extras["cg_steps"].mean()),
                        cg_negative=float(reports.extras["cg_negative"].sum()))
        return Aggregate(y.to(reports.updates.dtype), FedNewState(y, lam, u), info)
