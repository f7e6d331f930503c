"""FedLF (Pan et al., "FedLF: Layer-Wise Fair Federated Learning", AAAI 2024), a fair first-order
baseline of DQN-Fed (Tables 4–6; App. H: server step ηᵗ ∈ {0.01, 0.05, 0.1, 0.5, 1}).

The official code is ``zibinpan/FedLF`` (commit 7b6e0b7), ``gfedplat/algorithm/FedLF/FedLF.py``
(``FedLF.py`` below) on the framework's ``gfedplat/Algorithm.py`` and ``gfedplat/Client.py``.

**What a client sends** (``message``), with Lᵢ = Fᵢ(w), its training loss at the global model:

* ``"update"`` (default: the paper's Algorithm 1, line 4): gᵢ = w − wᵢ after the usual local
  training. The paper sends (w − wᵢ)/η and steps w + ηd with the same learning rate η (lines 4
  and 16); the two η cancel, so its step is ``server_lr`` = 1 here (``server_lr`` = s: s times it);
* ``"gradient"`` (the released code): gᵢ = ∇Fᵢ(w), the full-batch gradient at the global model,
  and no local training (``FedLF.py:147`` calls ``Algorithm.evaluate``, ``Algorithm.py:217-234``,
  whose clients run ``Client.cal_gradient_loss``, ``Client.py:175-203``; the update reading is
  commented out at ``FedLF.py:148-156``). The step w − ηd then has the code's learning rate
  η = ``server_lr`` (``FedLF.py:205-206``; the code's default 0.1, ``gfedplat/main.py:103``; the
  paper's grid {0.01, 0.05, 0.1}), and the experiment's local training is not used. The gradient
  is taken as the model trains (``ClientRuntime.gradients``, as the code's ``model.train()``,
  ``Client.py:176``); Lᵢ is the eval-mode loss every method here sends, where the code sums the
  training-mode losses of its gradient pass (``Client.py:188, 194``): the same without dropout.

The default is the paper's: with it FedLF trains its clients as every other method of a comparison
does (the same local epochs, batches and learning rate), so that the comparison is of the server
rules; ``"gradient"`` is the code's cheaper reading (one gradient per client and round).

**Per-round decay** (``lr_decay``, default 0.999; 1: off). The paper sets "the learning rate
η ∈ {0.01, 0.05, 0.1} decay of 0.999 per round" (§4, Hyper-parameters), and the code sets
ηₜ = η·0.999ᵗ before round t = 0, 1, … (``Algorithm.py:130-133``, called at ``:144``; ``--decay``
0.999, ``gfedplat/main.py:104-105``). What decays is that one learning rate η, the clients' and
the server's: the code sends it to the clients with every request (``Algorithm.py:224, 244``) and
steps the global model with it (``FedLF.py:205-206``). Here, with ``"update"``, the clients'
local learning rate is ``local.lr``·γᵗ in round t (the server's η cancels, as above); with
``"gradient"``, where no client trains, the server step is ``server_lr``·γᵗ. It composes with the
:class:`ServerStep` ``decay`` (FedMGDA+'s schedule, 1 by default).

The server, with the round's clients S (m of them):

1. the fair-driven objective P(w) = −cos(1, F(w)) (§3.1) has the chain-rule gradient g_P = hᵀG with
   (eq. 5; code ``FedLF.py:67``), p = 1/√m (``FedLF.py:183-184``),

       h = ((L·p)·L/‖L‖ − p·‖L‖) / ‖L‖²     (= ∂P/∂L;  Lᵀh = 0,  pᵀh ≤ 0);

   when ‖g_P‖ < 1e-12·maxᵢ‖gᵢ‖ (all losses equal) P is left out this round — the code divides by
   ‖g_P‖ (``FedLF.py:87``) and returns NaN;
2. history clients (§3.3; code ``FedLF.py:165-180``): with M the number of clients seen before this
   round, if M > m the clients absent now whose last round is at most τ = ⌊M/m⌋ rounds ago join
   with their last stored update (not their losses: only S enters L and h);
3. per layer l (eqs. 6–8), the min-norm point dₗ = λ*ᵀQₗ of the hull of the rows of Qₗ: the
   clients' gₗ, g_P,ₗ and the history rows (``FedLF.py:79-98``). Rows are first rescaled to the
   layer's mean client norm μₗ (code ``FedLF.py:82-93``, not in the paper; ``normalize_rows``),
   g_P,ₗ built from the rescaled rows; rows of norm < 1e-12 are dropped. The layers are the tensors
   of ``ctx.layout`` (the code's ``Module.create_Loc_reshape_list``, ``gfedplat/Module.py:24-32``)
   or, with ``slices="module"``, a layer's weight and bias together (a hand-made Context without a
   layout: one layer, the whole vector);
4. layer combination (Algorithm 1 lines 9–12; absent from the code): a layer whose dₗ vanishes
   (‖dₗ‖ ≤ 1e-10·μₗ, e.g. a 10-entry bias against 11 objectives) is merged with the next layer (the
   previous one for the last) and solved again, until no layer's direction vanishes;
5. d = concat dₗ rescaled to ‖(1/m)Σᵢ gᵢ‖ (Algorithm 1 line 15; ``FedLF.py:189-193``); d = 0 when
   ‖d‖ < 1e-12 (Pareto-stationary). The step is w ← w − ηₜd (``server_lr``, ``lr_decay``, ``decay``).

The paper writes d = −λ*ᵀQ and w + ηd; with this package's convention the signs cancel. The code's
final check (``FedLF.py:195-201``: halve d, or revert to the unscaled d, if some gᵢ·d < −1e-6) is
left out: a rescaling cannot change a sign, so it only ever reverts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
import torch

from ..messages import Aggregate, ClientUpdates
from ..minnorm import SOLVERS, min_norm_direction
from ..schedules import Transformation, scale_by_schedule, step_decay
from .base import Algorithm, Context, ParamLayout, RoundPlan, ServerStep, option, register

EPS = 1e-12
VANISHING = 1e-10
SLICES = ("tensor", "module")
MESSAGES = ("update", "gradient")


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
    message: str = option("update", choices=MESSAGES,
                          doc="what a client sends: its local update (the paper's Algorithm 1) or the full-batch "
                              "gradient at the global model (the released code)")
    lr_decay: float = option(0.999, low=0.0, high=1.0, low_open=True,
                             doc="the learning rate's factor per round, η·γᵗ (the paper's and the code's 0.999; "
                                 "1: off): the local one with message='update', the server's with 'gradient'")

    def configure(self, ctx: Context, state: FedLFState) -> RoundPlan:
        plan = super().configure(ctx, state)
        if self.message == "update" and self.lr_decay != 1 and plan.local is not None:
            # the paper's η decays for the clients' training; its server step (w − wᵢ)/η · η does not see it
            plan = replace(plan, local=replace(plan.local, lr=plan.local.lr * self.lr_decay ** ctx.round))
        return plan

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        if self.message == "update":
            return super().client_update(ctx, plan, clients)
        ids = [int(k) for k in plan.clients]            # the code's Client.cal_gradient_loss: no local training
        return ClientUpdates(plan.clients, clients.gradients(ctx.params, ids).to(ctx.params.dtype),
                             clients.num_samples(ids), clients.losses(ctx.params, ids), None)

    def server_optimizer(self) -> Transformation:
        base = step_decay(self.server_lr, self.decay)
        if self.message == "update" or self.lr_decay == 1:
            return scale_by_schedule(base)
        gamma = self.lr_decay                              # the code's ηₜ = η·0.999ᵗ (Algorithm.py:130-133)
        return scale_by_schedule(lambda t, rounds: base(t, rounds) * gamma ** t)

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
