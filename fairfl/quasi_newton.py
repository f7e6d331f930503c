"""DQN-Fed's client side (Mohajer Hamidi, TMLR; §4.3, Algorithm 1, eqs. (18)–(19)).

Each sampled client k builds a BFGS estimate of its inverse Hessian from curvature pairs and
sends the server its update gₖ together with d̃ₖ = gₖᵀ B gₖ (eq. 18), the rate of decrease of fₖ
that a Newton step would achieve.

Choices the paper leaves open, and ours:

* **Which matrix.** Eq. (19) as printed, B ← B − BssᵀB/(sᵀBs) + yyᵀ/(sᵀy), is the BFGS update of
  a *Hessian* estimate (it makes B s = y), while the text says B ≈ H⁻¹ and eq. (6) needs the
  inverse. We use the inverse of the eq. (19) matrix — the BFGS *inverse*-Hessian estimate,
  which satisfies B y = s — so d̃ₖ approximates gᵀH⁻¹g as eq. (6) intends. The tests check
  our product against the dense inverse of the eq. (19) matrix.
* **Never a d×d matrix.** B is applied by the L-BFGS two-loop recursion over the pairs kept
  (O(pairs·d) memory), with the usual initial scaling B₀ = γI, γ = sᵀy / yᵀy of the newest
  pair (B₀ = I when there is no usable pair, e.g. in round 0).
* **What "local gradient" the client sends.** We send the update gₖ = θᵗ − θₖ after E local
  epochs (the pseudo-gradient of every other algorithm here; Appendix B.2 speaks of
  "pseudo-gradients after E local epochs"). With E = 1 and full batch (Appendix G.1) it is
  η_l ∇fₖ(θᵗ), so the server step changes fₖ at the rate ∇fₖ·Δθ = η_l ∇fₖᵀBₖ∇fₖ: a Newton
  decrement damped by the local learning rate. Sending the raw gradient instead (the letter of
  Algorithm 1) makes the step undamped; on the notebook-04 setting it diverged at once
  (round 0, where B = I: averaged training loss 1.11 → 4.05, measured).
* **The pairs.** Algorithm 1 sets θ̂⁰ = θᵗ⁻¹ (the previous global model) and θ̂¹ = θᵗ and, for
  e = 1…E, sᵉ = θ̂ᵉ − θ̂ᵉ⁻¹, yᵉ = ∇f(θ̂ᵉ) − ∇f(θ̂ᵉ⁻¹); θ̂ᵉ⁺¹ is θ̂ᵉ after one local epoch. So with
  E = 1 the one pair comes from the last two global models. y uses full-batch gradients on the
  client's training data, in training mode (a model with dropout would make them noisy; the
  papers' MLP has none). B starts afresh every round (the paper does not carry it across
  rounds, and a client may not have taken part in the previous ones).
* **Bad curvature.** A pair with sᵀy ≤ 1e-10·‖s‖‖y‖ would make B indefinite: it is skipped
  and counted (``extras["bfgs_skipped"]``, logged per round by the aggregator).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .local import ClientUpdates, LocalTraining, mean_losses, set_flat_params, train_clients
from .partition import Client

CURVATURE_TOL = 1e-10


def usable_pair(s: torch.Tensor, y: torch.Tensor) -> bool:
    """The BFGS curvature condition sᵀy > 0, with a relative tolerance."""
    return bool(s @ y > CURVATURE_TOL * s.norm() * y.norm())


def inverse_hessian_product(v: torch.Tensor, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """B v for the BFGS inverse-Hessian estimate built from ``pairs`` (oldest first), by the
    two-loop recursion (Nocedal & Wright, Algorithm 7.4) — never forming B. Every pair must
    satisfy the curvature condition (see :func:`usable_pair`)."""
    q = v.clone()
    alphas = []
    rhos = [1.0 / (s @ y) for s, y in pairs]
    for (s, y), rho in zip(reversed(pairs), reversed(rhos)):
        a = rho * (s @ q)
        q -= a * y
        alphas.append(a)
    if pairs:
        s, y = pairs[-1]
        q *= (s @ y) / (y @ y)              # B₀ = γ I, γ = sᵀy / yᵀy
    for (s, y), rho, a in zip(pairs, rhos, reversed(alphas)):
        b = rho * (y @ q)
        q += (a - b) * s
    return q


def full_batch_gradients(model: nn.Module, point: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                         batched: bool) -> torch.Tensor:
    """∇fₖ(point) for each client (rows), full batch on its training data: one SGD step of
    learning rate 1 from ``point`` moves by exactly the gradient, so the batched local-training
    path computes all clients' gradients in one fused pass."""
    step = LocalTraining(epochs=1, batch_size=None, lr=1.0)
    return train_clients(model, point, data, clients, step, 0, 0, batched, loss_before=False, loss_after=False).updates


def dqnfed_client_updates(model: nn.Module, global_flat: torch.Tensor, previous_flat: torch.Tensor | None,
                          data: Sequence[Client], clients: Sequence[int], cfg: LocalTraining, seed: int,
                          round_: int, batched: bool = True, loss_before: bool = True,
                          cache: dict | None = None) -> ClientUpdates:
    """Algorithm 1's client loop for every sampled client: E local epochs of the configured SGD,
    the update gₖ = θᵗ − θₖ, and ``extras["dqn_d"]`` = d̃ₖ = gₖᵀBₖgₖ (eq. 18), with Bₖ from the
    pairs of the points θᵗ⁻¹, θᵗ, θ̂², …, θ̂ᴱ; ``extras["bfgs_skipped"]`` counts the pairs dropped
    for bad curvature.

    ``cache`` (kept by the round loop between rounds) saves recomputing ∇fₖ(θᵗ⁻¹): when the same
    clients took part in the previous round, their gradients at θᵗ⁻¹ were computed then, in the
    same batched pass, so reusing them gives the same bits (and a resumed run, whose cache starts
    empty, recomputes the same values)."""
    m = len(clients)
    grads = full_batch_gradients(model, global_flat, data, clients, batched).double()
    same_clients = (cache is not None and cache.get("round") == round_ - 1
                    and cache.get("clients") == [int(k) for k in clients])
    previous_grads = cache["grads"] if same_clients else None
    if cache is not None:
        cache.update(round=round_, clients=[int(k) for k in clients], grads=grads)
    pairs: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(m)]
    skipped = torch.zeros(m)

    def add_pair(r: int, s: torch.Tensor, y: torch.Tensor) -> None:
        if usable_pair(s, y):
            pairs[r].append((s, y))
        else:
            skipped[r] += 1

    if previous_flat is not None:              # θ̂⁰ = θᵗ⁻¹
        prev = (previous_grads if previous_grads is not None
                else full_batch_gradients(model, previous_flat, data, clients, batched).double())
        s = (global_flat - previous_flat).double()
        for r in range(m):
            add_pair(r, s, grads[r] - prev[r])
    if cfg.epochs == 1:                        # all clients start from θᵗ: one batched call
        updates = train_clients(model, global_flat, data, clients, cfg, seed, round_, batched,
                                loss_before=False, loss_after=False).updates
    else:                                      # θ̂ᵉ⁺¹ per client, with a pair after every epoch but the last
        updates = torch.empty(m, global_flat.numel())
        one_epoch = replace(cfg, epochs=1)
        for r, k in enumerate(clients):
            point, g_point = global_flat, grads[r]
            for e in range(cfg.epochs):
                # a distinct, deterministic batch order for every local epoch of every round
                step = train_clients(model, point, data, [k], one_epoch, seed, round_ * 1000 + e, batched,
                                     loss_before=False, loss_after=False).updates[0]
                new = point - step
                if e < cfg.epochs - 1:
                    g_new = full_batch_gradients(model, new, data, [k], batched)[0].double()
                    add_pair(r, (new - point).double(), g_new - g_point)
                    g_point = g_new
                point = new
            updates[r] = global_flat - point
    u = updates.double()
    d = torch.stack([u[r] @ inverse_hessian_product(u[r], pairs[r]) for r in range(m)])
    before = None
    if loss_before:
        set_flat_params(model, global_flat)
        before = mean_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients])
    return ClientUpdates(np.asarray(clients), updates, torch.tensor([data[k].num_train for k in clients]),
                         before, None, {"dqn_d": d, "bfgs_skipped": skipped})
