"""FedHEAL (Chen, Huang & Ye, "Fair Federated Learning under Domain Skew with Local Consistency and
Domain Diversity", CVPR 2024), a fair first-order baseline of DQN-Fed (Tables 1 and 3).

The paper's body was not available to us: every equation below is the official code's
(``yuhangchen0/FedHEAL``, commit 770e094), cited by file and line.

Client side — FPHL, the consistency mask (``models/utils/federated_model.py:191-214``). Client i
keeps hᵢ ∈ [0, 1]^d, the share of its past rounds in which each coordinate of its update was
≥ 0, and nᵢ, its number of past rounds. With gᵢ = w − wᵢ after the usual local training
(``models/fedavgheal.py:45``):

    nᵢ = 0:  Mᵢ = 1
    else:    cᵢ[j] = hᵢ[j] if gᵢ[j] ≥ 0 else 1 − hᵢ[j]       (share of past rounds with this sign)
             Mᵢ[j] = 1[cᵢ[j] > τ]                              (strict >, after which:)
    hᵢ ← (hᵢ·nᵢ + 1[gᵢ ≥ 0]) / (nᵢ + 1),   nᵢ ← nᵢ + 1

and sends ĝᵢ = Mᵢ ⊙ gᵢ, Mᵢ, and Dᵢ = Σ_l ‖ĝᵢ,ₗ‖₂, the sum of its per-tensor norms
(``federated_model.py:89-95``; tensors from ``ctx.layout``, one when a hand-made Context has none). A zero coordinate counts as positive
(``>= 0`` in the code). Choices: hᵢ averages over the client's own nᵢ rounds, where the code divides
by the global round index (``federated_model.py:193, 212``) — the same under full participation,
and the code's form breaks for a client first seen after round 0.

Server side — FAEL, the weights (``federated_model.py:70-87, 138-189``). Per client k it keeps Pₖ
(unnormalised, 1/m at the first participation, m the round's clients) and Δₖ (0):

    Δₖ ← (1 − β)·Δₖ + β·Dₖ / Σ_{j∈S} Dⱼ,   Pₖ ← Pₖ + Δₖ,   pₖ = Pₖ / Σ_{j∈S} Pⱼ
    d[j] = Σₖ pₖ Mₖ[j] ĝₖ[j] / Σₖ pₖ Mₖ[j]   (0 where no client kept coordinate j)

Choice: Σ D runs over this round's clients S, where the code sums over every client ever seen
(``federated_model.py:76``); the same under full participation. If Σ D = 0 the distance term is
left out (Δₖ ← (1 − β)Δₖ). The code has no server learning rate (η = 1, the default of the
:class:`ServerStep` options here).

**Defaults: the authors' τ = 0.3 and β = 0.4**, the code's two hyper-parameters (``main.py:52-53``:
``--threshold`` 0.3, ``--beta`` 0.4; ``utils/best_args.py`` overrides neither, and its ``--alpha``
0.5, ``main.py:46``, is the Dirichlet α of the data split). DQN-Fed's App. H gives for FedHEAL
"(α, β) = {(0.5, 0.5)}, (γ_s, γ_c) = {(0.5, 0.9)}" (DQN-Fed, App. H, the line "FedHEAL"): that
is FedFV's Table 1 entry for FedFa (Huang et al. 2020), "(α, β) ∈ {(0.5, 0.5)}, (γ_s, γ_c) ∈
{(0.5, 0.9)}", word for word but for ∈ written =; FedFa's β and γ, not FedHEAL's (the FedLF
code's FedFa has the same defaults, ``gfedplat/main.py:113-116`` of ``zibinpan/FedLF``). No
FedHEAL quantity is named α, γ_s or γ_c, so App. H's line is not a setting of FedHEAL and we do not
read one from it (``FedHEAL(tau=0.5, beta=0.5)``, an earlier reading of it, is what this class
computed by default before). The code's local SGD has momentum 0.9 and weight decay 1e-5
(``models/fedavgheal.py:62``): set them in the experiment's ``local``, which every algorithm
shares.
"""
from __future__ import annotations

from dataclasses import dataclass
import torch

from ..messages import Aggregate, ClientUpdates
from .base import Algorithm, Context, ParamLayout, RoundPlan, ServerStep, option, register

EPS = 1e-12


def consistency_mask(g: torch.Tensor, history: torch.Tensor | None, count: int,
                     tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FPHL for one client: (mask Mᵢ, new history hᵢ) from its update g and its history after
    ``count`` rounds (None when count = 0)."""
    positive = (g >= 0).to(torch.float64)
    if count == 0 or history is None:
        return torch.ones_like(positive), positive
    same = torch.where(g >= 0, history, 1.0 - history)
    mask = (same > tau).to(torch.float64)                 # computed before the history moves
    return mask, (history * count + positive) / (count + 1)


def layer_distance(update: torch.Tensor, layout: ParamLayout) -> torch.Tensor:
    """Dᵢ = Σ_l ‖update_l‖₂ over the layout's tensors, for each row of ``update`` (m, d)."""
    return torch.stack([update[:, sl].double().norm(dim=1) for sl in layout.slices]).sum(dim=0)


def fael_weights(distance: torch.Tensor, P: torch.Tensor, delta: torch.Tensor,
                 beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FAEL for this round's clients: (pₖ, new Pₖ, new Δₖ) from their distances, weights and momenta."""
    total = distance.sum()
    share = distance / total if total > EPS else torch.zeros_like(distance)
    delta = (1.0 - beta) * delta + beta * share
    P = P + delta                                          # kept unnormalised, as the code does
    return P / P.sum(), P, delta


def masked_average(updates: torch.Tensor, masks: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """d[j] = Σₖ pₖ Mₖ[j] ĝₖ[j] / Σₖ pₖ Mₖ[j], 0 where the denominator is 0."""
    w = p.unsqueeze(1) * masks
    z = w.sum(dim=0)
    return torch.where(z > 0, (w * updates).sum(dim=0) / torch.where(z > 0, z, torch.ones_like(z)),
                       torch.zeros_like(z))


@dataclass
class FedHEALState:
    P: torch.Tensor          # (n,) unnormalised weights (NaN: client never seen)
    delta: torch.Tensor      # (n,) FAEL momenta


@dataclass
class FedHEALClient:
    history: torch.Tensor    # hᵢ: share of past rounds with a non-negative update, per coordinate
    count: int               # nᵢ


@register
@dataclass(frozen=True)
class FedHEAL(ServerStep, Algorithm):
    """FedHEAL: consistency-masked updates (FPHL) averaged with distance-driven weights (FAEL)."""

    name = "fedheal"
    State = FedHEALState
    ClientState = FedHEALClient
    tau: float = option(0.3, low=-1.0, high=1.0,
                        doc="consistency threshold τ (the code's --threshold, main.py:52); < 0: no mask")
    beta: float = option(0.4, low=0.0, high=1.0, doc="FAEL momentum β (the code's --beta, main.py:53)")

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> FedHEALState:
        return FedHEALState(torch.full((num_clients,), float("nan"), dtype=torch.float64),
                            torch.zeros(num_clients, dtype=torch.float64))

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        reports = super().client_update(ctx, plan, clients)
        layout = ctx.layout or ParamLayout.single(reports.updates.shape[1])
        masks = torch.empty(reports.updates.shape, dtype=torch.float64)
        for r, k in enumerate(plan.clients):
            own = clients.states.get(int(k))
            mask, history = consistency_mask(reports.updates[r], None if own is None else own.history,
                                             0 if own is None else own.count, self.tau)
            masks[r] = mask
            clients.states[int(k)] = FedHEALClient(history, 1 if own is None else own.count + 1)
        masked = reports.updates * masks.to(reports.updates.dtype)
        return reports.replace(updates=masked, extras={**reports.extras, "heal_mask": masks.to(masked.dtype),
                                                       "heal_distance": layer_distance(masked, layout)})

    def aggregate(self, reports: ClientUpdates, state: FedHEALState, ctx: Context) -> Aggregate:
        for key in ("heal_mask", "heal_distance"):
            if key not in reports.extras:
                raise ValueError(f"FedHEAL needs each client's {key} in reports.extras; its clients compute them "
                                 "(FedHEAL.client_update)")
        ids = torch.as_tensor(reports.clients, dtype=torch.long)
        P, delta = state.P.clone(), state.delta.clone()
        new = torch.isnan(P[ids])
        P[ids[new]] = 1.0 / reports.m                      # federated_model.py:78-81
        p, P[ids], delta[ids] = fael_weights(reports.extras["heal_distance"].double(), P[ids], delta[ids], self.beta)
        masks = reports.extras["heal_mask"].double()
        direction = masked_average(reports.updates.double(), masks, p)
        info = {"kept_share": float(masks.mean()), "weight_max": float(p.max())}
        return Aggregate(direction.to(reports.updates.dtype), FedHEALState(P, delta), info,
                         weights=p.to(reports.updates.dtype))

