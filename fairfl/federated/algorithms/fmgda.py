"""FMOL (Yang et al., "Federated Multi-Objective Learning", NeurIPS 2023): FMGDA and FSMGDA
(Algorithm 1) on the one round loop; centralised MGD / SMGD are the same rule on one client that
holds the whole federation's data (``PartitionSpec(pooled=True)``, one local step per round).

The problem (FMOL eq. (2)): M clients, S objectives, a binary objective-indicator matrix A with
a_{i,s} = 1 when client i holds objective s (``held``: one tuple of objectives per client; None:
every client holds every objective, as in FMOL §5). Objective s is
f_s = (1/|R_s|) Σ_{i∈R_s} f_{s,i} over the clients R_s that hold it, f_{s,i} the mean
cross-entropy of head s of a multi-task model on label column s of client i's data.

Algorithm 1, round t (the experiment's ``LocalTraining(steps=K, batch_size=b, lr=η_L)``):

1.–3. every client i, for each objective s it holds, starts at x_t, takes K local steps on
      objective s (full gradient for FMGDA, ``batch_size=None``; a minibatch ξ of size b for
      FSMGDA) and returns Δ_{s,i} = Σ_k ∇f_{s,i}(x^{t,k}_{s,i}[, ξ^{t,k}_i]), the accumulated gradients
      (``ClientRuntime.train_objectives``; the message has an objective axis);
5.    the server averages Δ_s = (1/|R_s|) Σ_{i∈R_s} Δ_{s,i}                    (:func:`average_updates`);
6.    solves λ* = argmin_{λ ∈ simplex} ‖Σ_s λ_s Δ_s‖² (eq. (3): the package's one min-norm rule,
      ``fairfl.federated.minnorm.min_norm_direction`` with ε = 1);
7.    steps x_{t+1} = x_t − η_t d_t with d_t = Σ_s λ*_s Δ_s (``server_lr`` = η_t, constant in §5).

Choices the paper leaves open, and ours
---------------------------------------
* **Which gradients Δ sums** (step 3). Algorithm 1 writes Σ_{k∈[K]} ∇f(x^{t,k}) with the index of
  step 2's *outputs*; we sum the gradients at the points where they were taken, k = 0..K−1.
  This is the reading under which FMGDA with K = 1 is MGD (§4.1, remark 3 after Corollary 2: "in
  the single-client special case, FMGDA degenerates to the basic MGD algorithm"); the other
  reading would drop the gradient at x_t itself. The sum is accumulated exactly, not recovered
  as (x_t − x^{t,K}) / η_L.
* **Minibatches** (FSMGDA). ξ^{t,k}_i carries no objective index in Algorithm 1, so a client draws
  one minibatch per local step and uses it for every objective it holds. A minibatch is b distinct
  samples drawn uniformly without replacement, independently at every step (unbiased,
  Assumption 5), from the client's generator of (seed, round, client).
* **Which parameters enter the QP** (``qp_params``): ``"all"`` (default; Algorithm 1 as written: Δ_s
  and x are the whole model, every head included) or ``"shared"`` (the Gram matrix of step 6 uses
  only the shared trunk's coordinates, as MGDA is applied to shared parameters in multi-task
  learning, FMOL ref. [1]). Either way step 7 is unchanged: d_t = Σ λ*_s Δ_s on every
  coordinate, so head s moves by λ*_s Δ_s.
* **How λ is solved** (``solver``): exactly (``"quadprog"``, default; ``"cvxpy"`` the reference),
  or ``"sener_koltun"``: the two-objective closed form of Sener & Koltun's released MGDA code
  (isl-org/MultiObjectiveOptimization, ``multi_task/min_norm_solvers.py`` l.9–30 and l.108–110;
  FedCMOO copies it), which equals the exact λ inside the simplex but puts 0.999 / 0.001 instead
  of 1 / 0 at a vertex, so the objective that loses still moves its head a little. Their code
  solves it on the shared parameters' gradients (``train_multi_task.py`` l.143–155), i.e. with
  ``qp_params="shared"``. A reading of those codes, off by default; for more than two
  objectives (their projected-gradient loop, l.112–137) it is refused.
* **Pareto-stationarity measure.** FMOL App. A ("Metrics") uses ‖d̄_t‖² with
  d̄_t = λ_tᵀ ∇F(x_t): the λ of step 6 applied to the full gradients of the global objectives at
  x_t (for K = 1 and full batch, d̄_t = d_t). Logged as ``d_sq`` (the full gradients come free with
  FMGDA's first local step; for FSMGDA they cost one extra full pass, switched by
  ``stationarity``), with ``step_sq`` = ‖Σ λ*_s Δ_s‖² on the QP's coordinates (the optimal value
  of eq. (3)) and ``lambda`` = λ*_t.
* **Centralised MGD / SMGD** (§5, 1-c: "use Σ_i |S_i| batch-sizes and run K × T iterations"): the
  pooled client, ``steps=1``, ``rounds`` = K·T and ``batch_size`` = M·b for SMGD (one union batch
  drawn from the pooled data), evaluated every K rounds. With ``server_lr = η_t``, K = 1 and full
  batch, MGD equals FMGDA with one client step for step.
* A client that holds no objective is allowed and does nothing; an objective that no client
  holds is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fairfl.base.errors import ConfigError
from ..messages import Aggregate, ClientUpdates
from ..minnorm import CLOSED_FORMS, SOLVERS, min_norm_direction
from ..models import MULTI_TASK_MODELS
from ..schedules import Transformation, constant, scale_by_schedule
from .base import Algorithm, Context, RoundPlan, option, register

QP_PARAMS = ("all", "shared")


def average_updates(updates: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 step 5: Δ_s = (1/|R_s|) Σ_{i∈R_s} Δ_{s,i}. ``updates`` is (m, S, d), ``held``
    (m, S); the entries of objectives a client does not hold are never read."""
    held = torch.as_tensor(held, dtype=torch.bool)
    if updates.ndim != 3 or tuple(updates.shape[:2]) != tuple(held.shape):
        raise ConfigError(f"updates must be (clients, objectives, d) matching held {tuple(held.shape)}, "
                          f"got {tuple(updates.shape)}")
    rows = []
    for s in range(held.shape[1]):
        holders = torch.nonzero(held[:, s]).ravel()
        if holders.numel() == 0:
            raise ConfigError(f"objective {s} is held by no client of the round")
        rows.append(updates[holders, s].mean(dim=0))
    return torch.stack(rows)


@register
@dataclass(frozen=True)
class FMGDA(Algorithm):
    """FMOL Algorithm 1: FMGDA with full-batch local steps, FSMGDA with minibatches (the
    experiment's ``local.batch_size``), K = ``local.steps`` local steps per objective."""

    name = "fmgda"
    multi_objective = True
    server_lr: float = option(0.1, low=0.0, low_open=True, doc="η_t, the global step size")
    qp_params: str = option("all", choices=QP_PARAMS, doc="coordinates in the QP of step 6")
    solver: str = option("quadprog", choices=SOLVERS + CLOSED_FORMS,
                         doc="λ of step 6: the exact QP, or 'sener_koltun' (their two-task closed form)")
    stationarity: bool = option(True, doc="log ‖λᵀ∇F(x_t)‖² (costs a full pass per round for FSMGDA)")
    held: tuple | None = None       # FMOL's A: the objectives each client holds (None: all)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.held is not None:
            rows = tuple(tuple(int(s) for s in row) for row in self.held)
            if any(s < 0 for row in rows for s in row) or any(len(set(row)) != len(row) for row in rows):
                raise ConfigError(f"fmgda: held must list distinct objective indices >= 0 per client, got {self.held}")
            object.__setattr__(self, "held", rows)

    def check(self, config: Any) -> None:
        if config.model not in MULTI_TASK_MODELS:
            raise ConfigError(f"fmgda trains one head per objective: use a multi-task model "
                              f"({', '.join(MULTI_TASK_MODELS)}), not {config.model!r}")
        clients = config.partition.federation_size
        if self.held is not None and len(self.held) != clients:
            raise ConfigError(f"fmgda: held has {len(self.held)} rows for {clients} clients")

    def server_optimizer(self) -> Transformation:
        return scale_by_schedule(constant(self.server_lr))

    def _held(self, ids: np.ndarray, num_objectives: int) -> torch.Tensor:
        if self.held is None:
            return torch.ones(len(ids), num_objectives, dtype=torch.bool)
        out = torch.zeros(len(ids), num_objectives, dtype=torch.bool)
        for r, k in enumerate(ids):
            for s in self.held[int(k)]:
                if s >= num_objectives:
                    raise ConfigError(f"fmgda: client {int(k)} holds objective {s}, the model has {num_objectives}")
                out[r, s] = True
        return out

    def client_update(self, ctx: Context, plan: RoundPlan, clients) -> ClientUpdates:
        held = self._held(plan.clients, clients.num_objectives)
        n = [clients.data[k].num_train for k in plan.clients]
        full = plan.local.batch_size is None or plan.local.batch_size >= max(n)
        reports = clients.train_objectives(plan.clients, ctx.params, held, plan.local, loss_before=plan.loss_before,
                                           first_gradients=self.stationarity and full)
        if self.stationarity and not full:      # FSMGDA: the exact gradients cost one full pass
            reports = reports.replace(extras={**reports.extras, "first_gradients": clients.objective_gradients(
                ctx.params, plan.clients, held)})
        return reports

    def aggregate(self, reports: ClientUpdates, state: Any, ctx: Context) -> Aggregate:
        if reports.updates.ndim != 3:
            raise ConfigError("fmgda needs one update per objective (an (m, S, d) message)")
        held = reports.held if reports.held is not None else torch.ones(reports.updates.shape[:2], dtype=torch.bool)
        deltas = average_updates(reports.updates, held)
        self._check_objectives(deltas.shape[0])
        mask = reports.shared if self.qp_params == "shared" else None
        direction, lam = min_norm_direction(deltas, eps=1.0, solver=self.solver, mask=mask)
        on_qp = deltas if mask is None else deltas[:, mask]
        info = {"lambda": lam.double().tolist(),
                "step_sq": float((lam.double() @ on_qp.double()).pow(2).sum())}
        if "first_gradients" in reports.extras:
            full = average_updates(reports.extras["first_gradients"], held)
            info["d_sq"] = float((lam.double() @ full.double()).pow(2).sum())
        return Aggregate(direction, state, info, weights=lam)

    def _check_objectives(self, num_objectives: int) -> None:
        if self.solver in CLOSED_FORMS and num_objectives != 2:
            raise ConfigError(f"fmgda: solver={self.solver!r} is Sener & Koltun's closed form for two objectives; "
                              f"the model has {num_objectives} (use solver='quadprog')")

    def evaluate(self, ctx: Context, state: Any, clients):
        """Per objective: f_s = mean over the clients that hold s (FMOL eq. (2)); the test
        accuracy of every client and objective."""
        # the loop evaluates x_0 before any training: a solver that cannot serve the model fails here
        self._check_objectives(clients.num_objectives)
        ev = clients.evaluate(ctx.params)
        if self.held is None:
            return ev
        held = self._held(np.arange(clients.num_clients), len(ev.train_loss)).numpy()
        per_client = np.asarray(ev.client_train_loss, dtype=np.float64)
        return replace(ev, train_loss=[float(per_client[held[:, s], s].mean()) for s in range(held.shape[1])])
