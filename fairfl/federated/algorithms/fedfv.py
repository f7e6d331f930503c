"""FedFV: Federated Learning with Fair Averaging (Wang et al., IJCAI 2021, Algorithms 1–3).

One round, for the m sampled clients' updates gₖ and losses lₖ:

1. **Projection order** PO (Alg. 1 line 5): clients sorted by ascending loss — the loss of the
   *global* model on the client's training data before local training (``loss_before``), so
   the worst-served clients come last and are projected on last. The Table 4 ablation also
   offers ``"random"`` (a fresh permutation per round, from ``seed`` and the round) and
   ``"reverse"`` (descending loss).
2. **Internal conflicts** (Alg. 2): every gradient except the kept ones is projected, in PO
   order, onto the normal plane of each *original* gradient it conflicts with:
   g ← g − (g·gⱼ/‖gⱼ‖²) gⱼ whenever g·gⱼ < 0. The kept ones are the last ``n_keep`` of PO (for
   the loss order: the highest-loss clients). Rounding, as the authors' released code does it:
   n_keep = m − ⌈(m − 1)(1 − α)⌉ for α > 0, and 0 for α = 0 — so α = 1 keeps everyone
   (FedAvg), and with m = 3, α = 1/3 keeps 1 client and α = 2/3 keeps 2 (with m = 10:
   α = 0.1 keeps 1, 1/3 keeps 4, 2/3 keeps 7; we round the product before the ceiling, which
   the released code did not). The projected
   gradients are averaged uniformly (Alg. 2 line 10).
3. **External conflicts** (Alg. 3), for t ≥ τ > 0: for the rounds t − τ, …, t − 1, oldest
   first (the most recent round is the last target, Theorem 1), sum the history gradients
   whose *latest* report is from that round and that conflict with the current direction, and
   project the direction off that sum if they conflict. We use the paper's window t − τ … t − 1,
   and, as Alg. 1 line 4 updates the history before Alg. 3, a client sampled this round is never
   an external conflict (Definition 3: h ∉ Sₜ), even if an older update of it is in the window;
   it was handled in step 2 (the authors' first release does the same: WwZzz/easyFL@eccb017,
   ``method/fedfv.py`` lines 37–39 record this round's updates, lines 71–82 then look at rounds
   t − τ … t − 1 only). (One later version of the released code looped over t − τ + 1 … t
   instead, which re-projects against this round's own clients.) The history holds each
   client's latest *raw* (unprojected) update in the updates' dtype, pruned to the window, so
   memory is at most τ·m updates, and it lives in the aggregator state (checkpointed).
4. **Rescale** (Alg. 1 line 10) to ‖(1/m) Σ gₖ‖; a direction that the projections cancelled
   (exactly, or to within rounding) stays zero (no step) instead of stretched noise. When no projection happened the mean is
   returned untouched, so α = 1, τ = 0 is FedAvg with uniform weights bit for bit.

The server step is 1 (θ ← θ − gᵗ, Algorithm 1). The random order draws from the loop's
generator of (seed, round, ``ORDER_STREAM``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..messages import Aggregate, ClientUpdates
from .base import Algorithm, Context, ParamLayout, option, register
from .fedavg import sample_weights

ORDERS = ("loss", "random", "reverse")
ORDER_STREAM = 0xFF          # purpose tag of the random projection order (fairfl.base.seeding)


def kept_count(m: int, alpha: float) -> int:
    """How many of the m clients keep their original gradient (the released code's rounding)."""
    if alpha <= 0:
        return 0
    # round(…, 9) first: in floats (10 − 1)·(1 − 1/3) = 6.000000000000001, and the released
    # code's bare ceil then keeps 3 of 10 clients at α = 1/3 instead of 4
    return m - math.ceil(round((m - 1) * (1 - alpha), 9))


def projection_order(losses: torch.Tensor, order: str, rng: np.random.Generator | None = None) -> list[int]:
    """Row indices in projection-target order (first target first). Ties keep row order."""
    m = len(losses)
    if order == "random":
        if rng is None:
            raise ValueError("the random order needs a generator")
        return [int(i) for i in rng.permutation(m)]
    keys = np.asarray(losses, dtype=np.float64)
    idx = np.argsort(keys, kind="stable")
    return [int(i) for i in (idx if order == "loss" else np.argsort(-keys, kind="stable"))]


def project_conflicts(g: torch.Tensor, order: list[int], keep: set[int]) -> tuple[torch.Tensor, int]:
    """Alg. 2 lines 2–9: each row not in ``keep`` is projected, target by target in ``order``,
    off every *original* row it conflicts with (skipping itself). Rows are independent, so all
    rows take each target at once. Returns (projected rows, number of projections made)."""
    pc = g.clone()
    norms2 = (g * g).sum(dim=1)
    active = torch.ones(len(g), dtype=torch.bool)
    active[list(keep)] = False
    count = 0
    for j in order:
        if norms2[j] == 0:              # a zero gradient conflicts with nothing
            continue
        dots = pc @ g[j]
        hit = (dots < 0) & active
        hit[j] = False
        if hit.any():
            coef = torch.where(hit, dots / norms2[j], torch.zeros_like(dots))
            pc = pc - coef.unsqueeze(1) * g[j].unsqueeze(0)
            count += int(hit.sum())
    return pc, count


@dataclass
class FedFVState:
    """The latest raw update of each client seen in the last τ rounds (checkpointed)."""

    clients: torch.Tensor      # (h,) client ids
    rounds: torch.Tensor       # (h,) the round of each entry
    updates: torch.Tensor      # (h, d)


@register
@dataclass(frozen=True)
class FedFV(Algorithm):
    """FedFV (Algorithms 1–3): α is the share of highest-loss clients that keep their gradient,
    τ the rounds of gradient history, ``order`` the projection order (Table 4's ablation)."""

    name = "fedfv"
    requires = frozenset({"loss_before"})
    State = FedFVState
    alpha: float = option(0.0, low=0.0, high=1.0, doc="share of clients that keep their gradient")
    tau: int = option(0, low=0, doc="rounds of gradient history (external conflicts)")
    order: str = option("loss", choices=ORDERS)

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> FedFVState:
        return FedFVState(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                          torch.zeros(0, params.numel(), dtype=params.dtype))

    def aggregate(self, reports: ClientUpdates, state: FedFVState, ctx: Context) -> Aggregate:
        if reports.loss_before is None:
            raise ValueError("FedFV needs each client's loss at the global model (loss_before)")
        round_ = ctx.round
        g = reports.updates.double()
        m = len(g)
        rng = ctx.rng(ORDER_STREAM) if self.order == "random" else None
        order = projection_order(reports.loss_before, self.order, rng)
        keep = set(order[m - kept_count(m, self.alpha):])
        pc, n_internal = project_conflicts(g, order, keep)
        mean = g.mean(dim=0)
        direction = pc.mean(dim=0)

        n_external = 0
        if self.tau > 0 and round_ >= self.tau:
            # Alg. 1 line 4 updates GH with this round's updates *before* Alg. 3 runs, so a client
            # sampled now has tₖ = t and is outside the window t − τ … t − 1 (Definition 3: only
            # clients h ∉ Sₜ conflict externally); its older entry must not be projected against
            others = ~torch.isin(state.clients, torch.as_tensor(np.asarray(reports.clients), dtype=torch.long))
            hr, hu = state.rounds[others], state.updates[others].double()
            for r in range(round_ - self.tau, round_):           # oldest first (Alg. 3 line 1)
                rows = hu[hr == r]
                if len(rows) == 0:
                    continue
                conflicting = rows[(rows @ direction) < 0]
                if len(conflicting) == 0:
                    continue
                g_con = conflicting.sum(dim=0)
                dot, n2 = direction @ g_con, g_con @ g_con
                if dot < 0 and n2 > 0:
                    direction = direction - dot / n2 * g_con
                    n_external += 1

        new_state = self._updated_history(state, reports, round_) if self.tau > 0 else state
        info = {"internal_projections": n_internal, "external_projections": n_external}
        if not (n_internal or n_external):      # nothing projected: FedAvg with uniform weights, exactly
            info["cos_to_mean"] = 1.0
            return Aggregate(sample_weights(reports, "uniform") @ reports.updates, new_state, info)
        norm = direction.norm()                 # Alg. 1 line 10: back to the length of the mean
        # Projections that cancel in exact arithmetic (g₁ = −c·g₀) leave a residue of rounding
        # error, ~1e-16 of the updates' length, in an arbitrary direction; rescaling it to ‖mean‖
        # would take a full-length step along noise. A direction no longer than what rounding of
        # m updates of this dtype can produce counts as cancelled: no step.
        noise = 8 * m * torch.finfo(reports.updates.dtype).eps * float(g.norm(dim=1).max())
        direction = direction * (mean.norm() / norm) if norm > noise else torch.zeros_like(direction)
        denom = float(direction.norm() * mean.norm())
        info["cos_to_mean"] = float(direction @ mean) / denom if denom > 0 else float("nan")
        return Aggregate(direction.to(reports.updates.dtype), new_state, info)

    def _updated_history(self, state: FedFVState, reports: ClientUpdates, round_: int) -> FedFVState:
        """Replace the entries of this round's clients with their raw updates; drop what no later
        round's window (t' − τ … t' − 1, t' > round_) can reach."""
        clients = torch.as_tensor(np.asarray(reports.clients), dtype=torch.long)
        hc, hr, hu = state.clients, state.rounds, state.updates
        keep = ~torch.isin(hc, clients) & (hr >= round_ + 1 - self.tau)
        return FedFVState(torch.cat([hc[keep], clients]),
                          torch.cat([hr[keep], torch.full((len(clients),), round_, dtype=torch.long)]),
                          torch.cat([hu[keep].to(reports.updates.dtype), reports.updates.detach()]))
