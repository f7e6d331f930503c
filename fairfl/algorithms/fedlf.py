"""FedLF (Pan et al., "FedLF: Layer-Wise Fair Federated Learning", AAAI 2024), a fair first-order
baseline of DQN-Fed (Tables 4–6; App. H: server step ηᵗ ∈ {0.01, 0.05, 0.1, 0.5, 1}).

Each client sends its update gᵢ = w − wᵢ after the usual local training and Lᵢ = Fᵢ(w), its loss at
the global model before training (Algorithm 1 line 4 divides gᵢ by η_l; a constant factor that the
rescaling below removes). The server, with the round's clients S (m of them):

1. the fair-driven objective P(w) = −cos(1, F(w)) (§3.1) has the chain-rule gradient g_P = hᵀG with
   (eq. 5; code ``FedLF.py:67``), p = 1/√m,

       h = ((L·p)·L/‖L‖ − p·‖L‖) / ‖L‖²     (= ∂P/∂L;  Lᵀh = 0,  pᵀh ≤ 0);

   when ‖g_P‖ < 1e-12·maxᵢ‖gᵢ‖ (all losses equal) P is left out this round — the code divides by
   ‖g_P‖ (``FedLF.py:87``) and returns NaN;
2. history clients (§3.3; code ``FedLF.py:169-175``): with M the number of clients seen before this
   round, if M > m the clients absent now whose last round is at most τ = ⌊M/m⌋ rounds ago join
   with their last stored update (not their losses: only S enters L and h);
3. per layer l (eqs. 6–8), the min-norm point dₗ = λ*ᵀQₗ of the hull of the rows of Qₗ: the
   clients' gₗ, g_P,ₗ and the history rows. Rows are first rescaled to the layer's mean client norm
   μₗ (code ``FedLF.py:82-93``, not in the paper; ``normalize_rows``), g_P,ₗ built from the rescaled
   rows; rows of norm < 1e-12 are dropped. The layers are the tensors of ``ctx.layout`` (the code's
   ``create_Loc_reshape_list``) or, with ``slices="module"``, a layer's weight and bias together
   (a hand-made Context without a layout: one layer, the whole vector);
4. layer combination (Algorithm 1 lines 9–12; absent from the code): a layer whose dₗ vanishes
   (‖dₗ‖ ≤ 1e-10·μₗ, e.g. a 10-entry bias against 11 objectives) is merged with the next layer (the
   previous one for the last) and solved again, until no layer's direction vanishes;
5. d = concat dₗ rescaled to ‖(1/m)Σᵢ gᵢ‖ (Algorithm 1 line 15; ``FedLF.py:189-193``); d = 0 when
   ‖d‖ < 1e-12 (Pareto-stationary). The step is w ← w − ηₜd (``server_lr``; the code's decay of
   0.999 per round is ``decay`` = 0.999^T in FedMGDA+'s schedule, in steps of T/100 rounds).

The paper writes d = −λ*ᵀQ and w + ηd; with this package's convention the signs cancel. The code's
final check (``FedLF.py:196-201``: halve d, or revert to the unscaled d, if some gᵢ·d < −1e-6) is
left out: a rescaling cannot change a sign, so it only ever reverts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
import torch

from ..messages import Aggregate, ClientUpdates
from ..minnorm import SOLVERS, min_norm_direction
from .base import Algorithm, Context, ParamLayout, ServerStep, option, register

EPS = 1e-12
VANISHING = 1e-10
SLICES = ("tensor", "module")


def fair_coefficients(losses: torch.Tensor) -> torch.Tensor:
    """h = ∂P/∂L for P = −cos(1, L) (FedLF eq. 5), zeros when ‖L‖ = 0."""
    L = losses.double()
    n = L.norm()
    if not n > 0:
        return torch.zeros_like(L)
    p = torch.full_like(L, 1.0 / math.sqrt(len(L)))
    return ((L @ p) * L / n - p * n) / (n * n)


def history_clients(last_round: torch.Tensor, current: torch.Tensor, round_: int) -> torch.Tensor:
    """Ids of the absent clients whose stored update joins this round (FedLF §3.3): with M clients
    seen before this round and m now, if M > m those absent now whose last round is at most
    ⌊M/m⌋ rounds ago."""
    seen = last_round >= 0
    M, m = int(seen.sum()), len(current)
    if M <= m:
        return torch.zeros(0, dtype=torch.long)
    absent = seen.clone()
    absent[current] = False
    return torch.nonzero(absent & (round_ - last_round <= M // m)).ravel()


def _rescaled(rows: torch.Tensor, target: float) -> torch.Tensor:
    """Rows of norm ≥ 1e-12 rescaled to norm ``target``; the others dropped."""
    norms = rows.norm(dim=1)
    keep = norms >= EPS
    return rows[keep] * (target / norms[keep]).unsqueeze(1)


def layer_rows(g: torch.Tensor, h: torch.Tensor | None, history: torch.Tensor,
               normalize: bool) -> tuple[torch.Tensor, float]:
    """(the rows of Qₗ, μₗ) for one layer: the clients' gₗ, the fair row g_P,ₗ = hᵀ(client rows) (h None:
    no fair row) and the history rows; rescaled to μₗ (the mean client norm) when ``normalize``."""
    mu = float(g.norm(dim=1).mean()) if len(g) else 0.0
    if normalize:
        norms = g.norm(dim=1, keepdim=True)
        clients = torch.where(norms >= EPS, g * (mu / torch.where(norms >= EPS, norms, torch.ones_like(norms))),
                              torch.zeros_like(g))
        rows = [clients[norms.ravel() >= EPS]]
        if h is not None:
            rows.append(_rescaled((h @ clients).unsqueeze(0), mu))
        rows.append(_rescaled(history, mu))
    else:
        rows = [g[g.norm(dim=1) >= EPS]]
        if h is not None:
            fair = (h @ g).unsqueeze(0)
            rows.append(fair[fair.norm(dim=1) >= EPS])
        rows.append(history[history.norm(dim=1) >= EPS])
    return torch.cat(rows), mu


def fedlf_direction(g: torch.Tensor, losses: torch.Tensor | None, groups: list[slice],
                    history: torch.Tensor | None = None, normalize: bool = True, fair: bool = True,
                    solver: str = "quadprog") -> tuple[torch.Tensor, dict]:
    """FedLF's direction (steps 1 and 3–5 of the module docstring) for updates g (m, d), losses (m,),
    the layers ``groups`` and the history rows (a, d). float64. Returns (d, info)."""
    g = g.double()
    history = torch.zeros(0, g.shape[1], dtype=torch.float64) if history is None else history.double()
    h = None
    if fair and losses is not None:
        h = fair_coefficients(losses)
        if not (h @ g).norm() >= EPS * float(g.norm(dim=1).max()) or not (h @ g).norm() > 0:
            h = None                                       # equal losses: P has no direction
    groups = [slice(s.start, s.stop) for s in groups]
    direction = torch.zeros(g.shape[1], dtype=torch.float64)
    merges, i = 0, 0
    while i < len(groups):
        sl = groups[i]
        rows, mu = layer_rows(g[:, sl], h, history[:, sl], normalize)
        d_l = min_norm_direction(rows, solver=solver)[0] if len(rows) else torch.zeros(sl.stop - sl.start,
                                                                                        dtype=torch.float64)
        if not d_l.norm() > VANISHING * mu and len(groups) > 1:      # Algorithm 1 lines 9–12
            j = i + 1 if i + 1 < len(groups) else i - 1
            lo, hi = min(i, j), max(i, j)
            groups[lo:hi + 1] = [slice(groups[lo].start, groups[hi].stop)]
            merges, i = merges + 1, lo
            continue
        direction[sl] = d_l
        i += 1
    target = g.mean(dim=0).norm()
    n = direction.norm()
    direction = direction * (target / n) if n >= EPS else torch.zeros_like(direction)
    return direction, {"fair_active": float(h is not None), "merges": float(merges), "layers": float(len(groups))}


@dataclass
class FedLFState:
    last_round: torch.Tensor   # (n,) the last round each client took part in (-1: never)
    last_update: torch.Tensor  # (n, d) its update then (raw): n·d numbers, checkpointed


@register
@dataclass(frozen=True)
class FedLF(ServerStep, Algorithm):
    """FedLF: a per-layer min-norm direction over the clients, the fair-driven objective
    −cos(1, F) and recent absent clients, rescaled to the mean update's norm."""

    name = "fedlf"
    requires = frozenset({"loss_before"})
    State = FedLFState
    normalize_rows: bool = option(True, doc="rescale each layer's rows to the mean client norm (the code)")
    fair_objective: bool = option(True, doc="include P = −cos(1, F) (False: the paper's ablation M4)")
    history: bool = option(True, doc="include recent absent clients (False: ablation M6)")
    slices: str = option("tensor", choices=SLICES, doc="a layer: each parameter tensor, or each module")
    solver: str = option("quadprog", choices=SOLVERS)

    def init(self, params: torch.Tensor, num_clients: int, layout: ParamLayout | None = None) -> FedLFState:
        return FedLFState(torch.full((num_clients,), -1, dtype=torch.long),
                          torch.zeros(num_clients, params.numel(), dtype=params.dtype))

    def aggregate(self, reports: ClientUpdates, state: FedLFState, ctx: Context) -> Aggregate:
        g = reports.updates
        layout = ctx.layout or ParamLayout.single(g.shape[1])
        ids = torch.as_tensor(reports.clients, dtype=torch.long)
        past = (history_clients(state.last_round, ids, ctx.round) if self.history
                else torch.zeros(0, dtype=torch.long))
        direction, info = fedlf_direction(g, reports.loss_before, list(layout.groups(self.slices)),
                                          state.last_update[past], self.normalize_rows, self.fair_objective,
                                          self.solver)
        last_round, last_update = state.last_round.clone(), state.last_update.clone()
        last_round[ids], last_update[ids] = ctx.round, g.to(last_update.dtype)
        info["history_clients"] = float(len(past))
        return Aggregate(direction.to(g.dtype), FedLFState(last_round, last_update), info)
