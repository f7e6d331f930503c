"""FMOL (Yang et al., "Federated Multi-Objective Learning", NeurIPS 2023): FMGDA and FSMGDA
(Algorithm 1), and the centralised MGD / SMGD they are compared with (§5, Fig. 2a).

The problem (FMOL eq. (2)): M clients, S objectives, a binary objective-indicator matrix A with
a_{i,s} = 1 when client i holds objective s (the paper writes A as S × M; :class:`FMOLProblem`
stores it with clients as rows, M × S). Objective s is f_s = (1/|R_s|) Σ_{i∈R_s} f_{s,i} over the
clients R_s = {i : a_{i,s} = 1} that hold it (balanced data, §3.2), and f_{s,i} is the mean
cross-entropy of task s's head on client i's samples.

Algorithm 1, round t:

1. every client i copies the global model, x^{t,0}_{s,i} = x_t, for each objective s ∈ S_i;
2. runs K local steps per objective, x^{t,k+1}_{s,i} = x^{t,k}_{s,i} − η_L ∇f_{s,i}(x^{t,k}_{s,i}[, ξ^{t,k}_i])
   (FMGDA: full local gradient; FSMGDA: a minibatch ξ of size b);
3. returns Δ_{s,i} = Σ_k ∇f_{s,i}(x^{t,k}_{s,i}[, ξ^{t,k}_i]), the accumulated (stochastic) gradients;
5. the server averages Δ_s = (1/|R_s|) Σ_{i∈R_s} Δ_{s,i}                      (:func:`average_updates`);
6. solves λ* = argmin_{λ ∈ simplex} ‖Σ_s λ_s Δ_s‖²  (eq. (3), :func:`fairfl.minnorm.min_norm_weights`
   with ε = 1, i.e. plain MGDA over the simplex)                             (:func:`common_direction`);
7. steps x_{t+1} = x_t − η_t d_t with d_t = Σ_s λ*_s Δ_s.

Choices the paper leaves open, and ours
---------------------------------------
* **Which gradients Δ sums** (step 3). Algorithm 1 writes Σ_{k∈[K]} ∇f(x^{t,k}) with the index of
  step 2's *outputs*; we sum the gradients at the points where they were taken, k = 0..K−1, so
  Δ_{s,i} = (x_t − x^{t,K}_{s,i}) / η_L. This is the reading under which FMGDA with K = 1 is MGD
  (§4.1, remark 3 after Corollary 2: "in the single-client special case, FMGDA degenerates to the
  basic MGD algorithm"); the other reading would drop the gradient at x_t itself.
* **Minibatches** (FSMGDA). ξ^{t,k}_i carries no objective index in Algorithm 1, so a client draws
  one minibatch per local step and uses it for every objective it holds. A minibatch is b distinct
  samples drawn uniformly without replacement, independently at every step (unbiased,
  Assumption 5); b = n_i is full batch, i.e. FMGDA (§5: "batch size 256 corresponds to FMGDA").
* **Which parameters enter the QP** (``qp_params``): ``"all"`` (default; Algorithm 1 as written: Δ_s
  and x are the whole model, every head included) or ``"shared"`` (the Gram matrix of step 6 uses
  only the shared trunk's coordinates of the Δ_s, as MGDA is applied to shared parameters in
  multi-task learning, FMOL ref. [1]). Either way step 7 is unchanged: d_t = Σ λ*_s Δ_s on every
  coordinate, so head s moves by λ*_s Δ_s.
* **Pareto-stationarity measure.** FMOL App. A ("Metrics") uses ‖d̄_t‖² with
  d̄_t = λ_tᵀ ∇F(x_t): the λ of step 6 applied to the full gradients of the global objectives at
  x_t (for K = 1 and full batch, d̄_t = d_t). We record it as ``d_sq`` over all coordinates (the
  full gradients come free with FMGDA's first local step; for minibatch runs they cost one extra
  full pass, switched by ``stationarity``), together with ``step_sq`` = ‖d_t‖² on the QP's
  coordinates (the optimal value of eq. (3)).
* **Centralised MGD / SMGD** (§5, 1-c: "use Σ_i |S_i| batch-sizes and run K × T iterations"): one
  iteration uses the union of every client's (mini)batch — M·b samples, the same total batch as
  one federated local step — with each objective's gradient averaged over R_s exactly as step 5
  averages Δ; then the QP and a step of size ``lr``. K iterations make one "round" in the
  history, T rounds K·T iterations. With ``lr = η_t`` and K = 1, full batch, MGD equals FMGDA
  step for step (tested).
* η_t is constant (§5 and App. D: η_L = η_t = 0.1). A client that holds no objective is allowed
  and does nothing; an objective that no client holds is an error.

Randomness: the initial model comes from a ``torch.Generator`` of the run's seed (FMOL App. D:
every algorithm starts from the same point); minibatches of client i in round t from
``numpy.random.default_rng((seed, tag, t, i))``; no global random state is used. Every loss,
update and iterate is checked for NaN/Inf (:class:`~fairfl.errors.TrainingDivergedError`).

The clients are trained one after the other (the reference path of CONVENTIONS.md). Measured on
this machine (one thread, the LeNet of :mod:`fairfl.multitask`, 256 images): a local step of one
(client, objective) model in channels-last layout takes 17 ms, while batching the 20 copies of a
round costs 35 ms per copy through :mod:`fairfl.stacked`'s grouped convolutions and 89 ms per
copy through ``torch.func.vmap``, so there is nothing to gain from batching here.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .atomic import atomic_write, read_json_npz, write_json_npz
from .errors import ConfigError, TrainingDivergedError
from .minnorm import SOLVERS, min_norm_weights
from .multitask import MultiTaskNet, ParamLayout, init_parameters, multi_lenet
from .paths import results_root

try:
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover
    tqdm = None

QP_PARAMS = ("all", "shared")
METHODS = ("federated", "centralised")
_TAG_FEDERATED, _TAG_CENTRAL = 0xF301, 0xC3E7     # separate random streams for the two loops
_CACHE_VERSION = 1                                   # bump when a change alters stored results


# ----------------------------------------------------------------------------- the problem

class FMOLProblem:
    """FMOL problem (2): ``clients`` = [(x_i, y_i)] with y_i of shape (n_i, S) (column s = the
    labels of objective s), and the M × S indicator ``A`` (default all ones: every client holds
    every objective, as in FMOL §5). Validated at construction."""

    def __init__(self, clients: Sequence[tuple[torch.Tensor, torch.Tensor]], A: Any = None,
                 tasks: Sequence[str] | None = None):
        if len(clients) == 0:
            raise ConfigError("an FMOL problem needs at least one client")
        xs, ys = [], []
        for i, pair in enumerate(clients):
            if len(pair) != 2:
                raise ConfigError(f"client {i}: expected (x, y), got {len(pair)} items")
            x, y = torch.as_tensor(pair[0]), torch.as_tensor(pair[1])
            if y.ndim == 1:
                y = y[:, None]
            if y.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
                raise ConfigError(f"client {i}: x has shape {tuple(x.shape)} and y {tuple(y.shape)}; "
                                  "need n ≥ 1 samples and y of shape (n, S)")
            if not x.is_floating_point() or not torch.isfinite(x).all():
                raise ConfigError(f"client {i}: x must be a finite floating-point tensor")
            if y.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8) or (y < 0).any():
                raise ConfigError(f"client {i}: labels must be non-negative integers, got {y.dtype}")
            if x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)   # see the module docstring
            xs.append(x)
            ys.append(y.long())
        num_tasks = {y.shape[1] for y in ys}
        if len(num_tasks) != 1:
            raise ConfigError(f"clients disagree on the number of objectives: {sorted(num_tasks)}")
        S, M = num_tasks.pop(), len(xs)
        a = np.ones((M, S), dtype=bool) if A is None else np.asarray(A)
        if a.shape != (M, S):
            raise ConfigError(f"A must have shape (clients, objectives) = ({M}, {S}), got {a.shape}")
        if not np.isin(a, (0, 1)).all():
            raise ConfigError("A must be binary (a_{i,s} ∈ {0, 1})")
        a = a.astype(bool)
        unheld = np.flatnonzero(~a.any(axis=0))
        if unheld.size:
            raise ConfigError(f"objective(s) {unheld.tolist()} are held by no client (a column of A is all zero)")
        self.tasks = tuple(tasks) if tasks is not None else tuple(str(s) for s in range(S))
        if len(self.tasks) != S:
            raise ConfigError(f"{len(self.tasks)} task names for {S} objectives")
        self.x, self.y, self.A = xs, ys, a

    @property
    def num_clients(self) -> int:
        return len(self.x)

    @property
    def num_objectives(self) -> int:
        return self.A.shape[1]

    def holders(self, s: int) -> np.ndarray:
        """R_s: the clients that hold objective s."""
        return np.flatnonzero(self.A[:, s])

    def objectives(self, i: int) -> np.ndarray:
        """S_i: the objectives client i holds."""
        return np.flatnonzero(self.A[i])


# ----------------------------------------------------------------------------- history

@dataclass
class FMOLHistory:
    """Per-round record of one run (T rounds): ``loss`` (T+1, S) = f_s(x_t) for t = 0..T on all
    clients' training data; ``lam`` (T, S) = λ*_t; ``d_sq`` (T,) = ‖λ_tᵀ∇F(x_t)‖² (FMOL App. A;
    NaN if not tracked); ``step_sq`` (T,) = ‖d_t‖² on the QP's coordinates. For centralised runs a
    round is K iterations and the λ and norms are those of its first iteration."""

    loss: np.ndarray
    lam: np.ndarray
    d_sq: np.ndarray
    step_sq: np.ndarray
    tasks: tuple[str, ...]
    label: str = ""
    seconds: float = float("nan")
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.lam)

    def final_loss(self) -> np.ndarray:
        return self.loss[-1]

    def rounds_to(self, threshold: float) -> np.ndarray:
        """(S,) the first round t with f_s(x_t) ≤ threshold; inf if no round of the run reached it."""
        from .metrics import rounds_to_reach
        t = np.arange(len(self.loss))
        r = np.array([rounds_to_reach(t, self.loss[:, s], threshold, above=False) for s in range(self.loss.shape[1])])
        return np.where(np.isnan(r), np.inf, r)   # inf, not NaN: "more than T rounds" orders correctly

    def save(self, folder: Path) -> None:
        arrays = {k: getattr(self, k) for k in ("loss", "lam", "d_sq", "step_sq")}
        meta = {"tasks": list(self.tasks), "label": self.label, "seconds": self.seconds, "config": self.config}
        write_json_npz(folder, meta, arrays)

    @classmethod
    def load(cls, folder: Path) -> "FMOLHistory":
        meta, arrays = read_json_npz(folder)
        return cls(**arrays, tasks=tuple(meta["tasks"]), label=meta["label"], seconds=meta["seconds"],
                   config=meta["config"])


# ----------------------------------------------------------------------------- pieces of a round

def _check_finite(value: torch.Tensor, what: str) -> None:
    if not torch.isfinite(value).all():
        raise TrainingDivergedError(f"{what} became NaN/Inf; lower the learning rates")


def working_copy(model: MultiTaskNet) -> MultiTaskNet:
    """A copy of the model for training: channels-last convolutions (the fastest layout measured
    here), gradients only through ``torch.autograd.grad``."""
    work = copy.deepcopy(model)
    return work.to(memory_format=torch.channels_last)


def _task_params(work: MultiTaskNet, layout: ParamLayout, task: int) -> tuple[list[int], list[nn.Parameter]]:
    """Indices (in parameter order) and tensors of the parameters objective ``task`` moves."""
    params = list(work.parameters())
    idx = [k for k, name in enumerate(layout.names)
           if name.startswith("trunk.") or name.startswith(f"heads.{task}.")]
    return idx, [params[k] for k in idx]


def minibatches(n: int, batch_size: int | None, steps: int, rng: np.random.Generator) -> list[np.ndarray | None]:
    """ξ^{t,1..K}: per local step, b distinct indices uniformly without replacement, independent
    across steps; None (the whole local set) when b is None or ≥ n."""
    if batch_size is None or batch_size >= n:
        return [None] * steps
    return [np.sort(rng.choice(n, size=batch_size, replace=False)) for _ in range(steps)]


def local_update(work: MultiTaskNet, layout: ParamLayout, theta: torch.Tensor, x: torch.Tensor,
                 y: torch.Tensor, task: int, batches: Sequence[np.ndarray | None], lr: float
                 ) -> tuple[torch.Tensor, float, torch.Tensor]:
    """Algorithm 1 steps 1–3 for one (client, objective): start at θ, take len(batches) local
    steps of size ``lr`` on objective ``task``, and return (Δ, loss at θ on the first batch,
    gradient at θ on the first batch) — Δ = Σ_k ∇f(x^{t,k}) as a flat vector, zero outside the
    trunk and head ``task``."""
    layout.load(work, theta)
    idx, params = _task_params(work, layout, task)
    acc = [torch.zeros_like(p) for p in params]
    loss0, grad0 = float("nan"), None
    for k, b in enumerate(batches):
        xb, yb = (x, y[:, task]) if b is None else (x[b], y[b, task])
        loss = F.cross_entropy(work(xb, task), yb)
        _check_finite(loss.detach(), f"the local loss of objective {task}")
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g, a in zip(params, grads, acc):
                a.add_(g)
                p.sub_(lr * g)
        if k == 0:
            loss0 = float(loss.detach())
            grad0 = _scatter(layout, idx, grads, theta.dtype)
    delta = _scatter(layout, idx, acc, theta.dtype)
    _check_finite(delta, f"a local update of objective {task}")
    return delta, loss0, grad0


def _scatter(layout: ParamLayout, idx: list[int], tensors: Sequence[torch.Tensor], dtype) -> torch.Tensor:
    parts: list[torch.Tensor | None] = [None] * len(layout.names)
    for k, t in zip(idx, tensors):
        parts[k] = t
    return layout.scatter(parts, dtype)


def average_updates(updates: torch.Tensor, A: np.ndarray) -> torch.Tensor:
    """Algorithm 1 step 5: Δ_s = (1/|R_s|) Σ_{i∈R_s} Δ_{s,i}. ``updates`` is (M, S, d); the
    entries of objectives a client does not hold are never read (they may hold anything)."""
    A = np.asarray(A, dtype=bool)
    if updates.ndim != 3 or updates.shape[:2] != A.shape:
        raise ConfigError(f"updates must be (clients, objectives, d) matching A {A.shape}, got {tuple(updates.shape)}")
    rows = []
    for s in range(A.shape[1]):
        held = torch.from_numpy(np.flatnonzero(A[:, s]))
        if held.numel() == 0:
            raise ConfigError(f"objective {s} is held by no client")
        rows.append(updates[held, s].mean(dim=0))
    return torch.stack(rows)


def common_direction(deltas: torch.Tensor, qp_mask: torch.Tensor | None = None, solver: str = "quadprog"
                     ) -> tuple[torch.Tensor, np.ndarray, float]:
    """Algorithm 1 steps 6–7 (eq. (3)): λ* = argmin_{λ ∈ simplex} ‖Σ_s λ_s Δ_s‖² over the
    coordinates in ``qp_mask`` (None: all), and d = Σ_s λ*_s Δ_s on every coordinate.
    Returns (d, λ*, ‖Σ_s λ*_s Δ_s‖² on the QP's coordinates)."""
    _check_finite(deltas, "an averaged update Δ_s")
    v = deltas if qp_mask is None else deltas[:, qp_mask]
    v64 = v.double()
    peak = float(v64.abs().max()) if v64.numel() else 0.0
    scale = peak if peak > 0 else 1.0
    vs = v64 / scale                     # λ* is scale-free; this keeps the Gram matrix in range
    lam = min_norm_weights((vs @ vs.T).numpy(), eps=1.0, solver=solver)
    lam_t = torch.from_numpy(lam)
    direction = (lam_t @ deltas.double()).to(deltas.dtype)
    step_sq = float((lam_t @ vs).pow(2).sum()) * scale ** 2
    return direction, lam, step_sq


@torch.no_grad()
def objective_values(problem: FMOLProblem, work: MultiTaskNet, layout: ParamLayout, theta: torch.Tensor
                     ) -> np.ndarray:
    """(S,) f_s(θ) = (1/|R_s|) Σ_{i∈R_s} f_{s,i}(θ) on all of each client's training data."""
    layout.load(work, theta)
    per_client = np.full((problem.num_clients, problem.num_objectives), np.nan)
    for i in range(problem.num_clients):
        held = problem.objectives(i)
        if held.size == 0:
            continue
        logits = work.forward_all(problem.x[i])
        for s in held:
            per_client[i, s] = float(F.cross_entropy(logits[s], problem.y[i][:, s]))
    return np.array([per_client[problem.holders(s), s].mean() for s in range(problem.num_objectives)])


def objective_gradients(problem: FMOLProblem, work: MultiTaskNet, layout: ParamLayout, theta: torch.Tensor
                        ) -> torch.Tensor:
    """(S, d) ∇f_s(θ), full gradients of the global objectives (for the stationarity measure)."""
    S = problem.num_objectives
    grads = torch.zeros(S, layout.size, dtype=theta.dtype)
    layout.load(work, theta)
    for s in range(S):
        idx, params = _task_params(work, layout, s)
        for i in problem.holders(s):
            loss = F.cross_entropy(work(problem.x[i], s), problem.y[i][:, s])
            g = torch.autograd.grad(loss, params)
            grads[s] += _scatter(layout, idx, g, theta.dtype)
        grads[s] /= len(problem.holders(s))
    return grads


def _stationarity(lam: np.ndarray, grads: torch.Tensor) -> float:
    """‖λᵀ∇F(x_t)‖² (FMOL App. A, d̄_t)."""
    return float((torch.from_numpy(lam) @ grads.double()).pow(2).sum())


@dataclass
class RoundResult:
    theta: torch.Tensor              # x_{t+1}
    direction: torch.Tensor          # d_t
    lam: np.ndarray                  # λ*_t (S,)
    deltas: torch.Tensor             # Δ_s^t (S, d), step 5
    updates: torch.Tensor            # Δ_{s,i}^t (M, S, d), step 3 (zeros where a_{i,s} = 0)
    step_sq: float                   # ‖d_t‖² on the QP's coordinates
    loss: np.ndarray | None = None   # f_s(x_t) when every client used its full data at step 1
    grads: torch.Tensor | None = None  # ∇f_s(x_t), likewise


def fmol_round(problem: FMOLProblem, work: MultiTaskNet, layout: ParamLayout, theta: torch.Tensor, *,
               local_steps: int, batch_size: int | None, local_lr: float, global_lr: float,
               rngs: Sequence[np.random.Generator], qp_mask: torch.Tensor | None = None,
               solver: str = "quadprog") -> RoundResult:
    """One round of Algorithm 1 from x_t = ``theta``; ``rngs[i]`` draws client i's minibatches."""
    M, S = problem.num_clients, problem.num_objectives
    updates = torch.zeros(M, S, layout.size, dtype=theta.dtype)
    loss0 = np.full((M, S), np.nan)
    grad0 = torch.zeros(M, S, layout.size, dtype=theta.dtype)
    full = True
    for i in range(M):
        n = problem.x[i].shape[0]
        batches = minibatches(n, batch_size, local_steps, rngs[i])   # ξ_i^{t,k}: shared by the client's objectives
        full &= batches[0] is None
        for s in problem.objectives(i):
            updates[i, s], loss0[i, s], grad0[i, s] = local_update(
                work, layout, theta, problem.x[i], problem.y[i], int(s), batches, local_lr)
    deltas = average_updates(updates, problem.A)
    direction, lam, step_sq = common_direction(deltas, qp_mask, solver)
    new_theta = theta - global_lr * direction
    _check_finite(new_theta, "the global model")
    loss = grads = None
    if full:   # the first local step evaluated every f_{s,i} and its gradient at x_t
        loss = np.array([loss0[problem.holders(s), s].mean() for s in range(S)])
        grads = average_updates(grad0, problem.A)
    return RoundResult(new_theta, direction, lam, deltas, updates, step_sq, loss, grads)


# ----------------------------------------------------------------------------- the two loops

def _check_common(rounds: int, steps: int, batch_size: int | None, lrs: Mapping[str, float], qp_params: str,
                  solver: str) -> None:
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ConfigError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not (isinstance(steps, int) and steps >= 1):
        raise ConfigError(f"local_steps (K) must be an integer >= 1, got {steps!r}")
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError(f"batch_size must be None (full batch) or an integer >= 1, got {batch_size!r}")
    for name, lr in lrs.items():
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ConfigError(f"{name} must be a finite number > 0, got {lr!r}")
    if qp_params not in QP_PARAMS:
        raise ConfigError(f"qp_params={qp_params!r} is not one of {QP_PARAMS}")
    if solver not in SOLVERS:
        raise ConfigError(f"solver={solver!r} is not one of {SOLVERS}")


def _setup(problem: FMOLProblem, model: MultiTaskNet, theta0: torch.Tensor | None):
    if not isinstance(model, MultiTaskNet):
        raise ConfigError(f"model must be a fairfl.multitask.MultiTaskNet, got {type(model).__name__}")
    if model.num_tasks != problem.num_objectives:
        raise ConfigError(f"the model has {model.num_tasks} heads, the problem {problem.num_objectives} objectives")
    layout = ParamLayout(model)
    theta = layout.flatten(model) if theta0 is None else torch.as_tensor(theta0).detach().clone()
    if theta.shape != (layout.size,):
        raise ConfigError(f"theta0 has shape {tuple(theta.shape)}, the model has {layout.size} parameters")
    _check_finite(theta, "the initial model")
    return working_copy(model), layout, theta


def _bar(total: int, desc: str, progress: bool):
    return tqdm(total=total, desc=desc, leave=False) if (tqdm and progress) else None   # TQDM_DISABLE applies


def _tick(bar, loss_t: np.ndarray) -> None:
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=float(loss_t.max()))


def _finish(problem, work, layout, theta, loss, lam, d_sq, step_sq, label, t0, bar) -> "FMOLHistory":
    """The loss at the final model, and the history of a finished run (both loops)."""
    loss[-1] = objective_values(problem, work, layout, theta)
    if bar is not None:
        bar.close()
    return FMOLHistory(loss, lam, d_sq, step_sq, problem.tasks, label, time.perf_counter() - t0)


CHECKPOINT = "checkpoint.pt"


class Checkpoint:
    """Atomic checkpoints of a run's loop state in ``folder`` every ``every`` rounds, tagged
    with the config's key. Every random draw of round t comes from a generator of
    (seed, t, client), so a run resumed from a checkpoint equals an uninterrupted one."""

    def __init__(self, folder: Path, key: str, every: int = 10):
        if not (isinstance(every, int) and every >= 1):
            raise ConfigError(f"checkpoint every must be a positive number of rounds, got {every!r}")
        self.path, self.key, self.every = Path(folder) / CHECKPOINT, key, every

    def load(self) -> dict | None:
        if not self.path.is_file():
            return None
        state = torch.load(self.path, weights_only=True)   # tensors and plain containers only
        return state if state.get("key") == self.key else None

    def after_round(self, done: int, rounds: int, theta: torch.Tensor, arrays: Mapping[str, np.ndarray],
                    seconds: float) -> None:
        if done % self.every or done >= rounds:
            return
        state = {"key": self.key, "done": done, "theta": theta.detach().clone(), "seconds": seconds,
                 **{k: torch.from_numpy(v.copy()) for k, v in arrays.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda p: torch.save(state, p))


def _records(rounds: int, num_objectives: int, checkpoint: Checkpoint | None, theta: torch.Tensor):
    """The per-round records of a run (loss (T+1, S), λ (T, S), ‖d̄‖², ‖d‖², NaN until written),
    with the first round to run, θ and the seconds already spent — all from ``checkpoint`` when
    it holds this run's state, else a fresh start."""
    S = num_objectives
    records = {"loss": np.full((rounds + 1, S), np.nan), "lam": np.full((rounds, S), np.nan),
               "d_sq": np.full(rounds, np.nan), "step_sq": np.full(rounds, np.nan)}
    state = checkpoint.load() if checkpoint is not None else None
    if state is None:
        return records, 0, theta, 0.0
    for k, v in records.items():
        v[...] = state[k].numpy()
    return records, int(state["done"]), state["theta"], float(state["seconds"])


def run_federated(problem: FMOLProblem, model: MultiTaskNet, *, rounds: int, local_steps: int,
                  batch_size: int | None = None, local_lr: float = 0.1, global_lr: float = 0.1,
                  qp_params: str = "all", seed: int = 0, theta0: torch.Tensor | None = None,
                  solver: str = "quadprog", stationarity: bool = True, progress: bool = False,
                  label: str = "", checkpoint: Checkpoint | None = None) -> FMOLHistory:
    """FMGDA (``batch_size`` None or ≥ every client's n) or FSMGDA (minibatch b), Algorithm 1,
    for ``rounds`` rounds from ``theta0`` (default: the model's parameters); resumed from
    ``checkpoint`` when it holds this run's state."""
    _check_common(rounds, local_steps, batch_size, {"local_lr": local_lr, "global_lr": global_lr}, qp_params, solver)
    work, layout, theta = _setup(problem, model, theta0)
    qp_mask = layout.shared if qp_params == "shared" else None
    arrays, start, theta, spent = _records(rounds, problem.num_objectives, checkpoint, theta)
    loss, lam, d_sq, step_sq = arrays.values()
    t0, bar = time.perf_counter() - spent, _bar(rounds, label or "FMOL", progress)
    for t in range(start, rounds):
        rngs = [np.random.default_rng((seed, _TAG_FEDERATED, t, i)) for i in range(problem.num_clients)]
        r = fmol_round(problem, work, layout, theta, local_steps=local_steps, batch_size=batch_size,
                       local_lr=local_lr, global_lr=global_lr, rngs=rngs, qp_mask=qp_mask, solver=solver)
        loss[t] = r.loss if r.loss is not None else objective_values(problem, work, layout, theta)
        grads = r.grads if r.grads is not None else (
            objective_gradients(problem, work, layout, theta) if stationarity else None)
        if grads is not None:
            d_sq[t] = _stationarity(r.lam, grads)
        lam[t], step_sq[t], theta = r.lam, r.step_sq, r.theta
        _tick(bar, loss[t])
        if checkpoint is not None:
            checkpoint.after_round(t + 1, rounds, theta, arrays, time.perf_counter() - t0)
    return _finish(problem, work, layout, theta, loss, lam, d_sq, step_sq, label, t0, bar)


def centralised_gradients(problem: FMOLProblem, work: MultiTaskNet, layout: ParamLayout, theta: torch.Tensor,
                          batches: Sequence[np.ndarray | None]) -> tuple[torch.Tensor, np.ndarray]:
    """One centralised (S)MGD iteration's gradients: the union of client i's ``batches[i]``
    (None = all its data) in one forward pass; objective s's loss is the average over R_s of
    each holder's mean loss on its part of the batch, as step 5 averages. Returns
    ((S, d) gradients, (S,) losses)."""
    layout.load(work, theta)
    xs, owner = [], []
    for i in range(problem.num_clients):
        b = batches[i]
        xs.append(problem.x[i] if b is None else problem.x[i][b])
        owner.append(torch.full((xs[-1].shape[0],), i))
    x = torch.cat(xs)
    if x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    owner_t = torch.cat(owner)
    z = work.trunk(x)
    S = problem.num_objectives
    grads = torch.zeros(S, layout.size, dtype=theta.dtype)
    losses = np.zeros(S)
    for s in range(S):
        held = problem.holders(s)
        rows, weights, labels = [], [], []
        for i in held:
            r = torch.nonzero(owner_t == int(i)).squeeze(1)
            rows.append(r)
            weights.append(torch.full((len(r),), 1.0 / (len(held) * len(r)), dtype=z.dtype))
            b = batches[i]
            labels.append(problem.y[i][:, s] if b is None else problem.y[i][b, s])
        rows_t = torch.cat(rows)
        ce = F.cross_entropy(work.heads[s](z[rows_t]), torch.cat(labels), reduction="none")
        loss = (torch.cat(weights) * ce).sum()
        _check_finite(loss.detach(), f"the loss of objective {s}")
        idx, params = _task_params(work, layout, s)
        g = torch.autograd.grad(loss, params, retain_graph=s < S - 1)
        grads[s] = _scatter(layout, idx, g, theta.dtype)
        losses[s] = float(loss.detach())
    return grads, losses


def run_centralised(problem: FMOLProblem, model: MultiTaskNet, *, rounds: int, iterations_per_round: int,
                    batch_size: int | None = None, lr: float = 0.1, qp_params: str = "all", seed: int = 0,
                    theta0: torch.Tensor | None = None, solver: str = "quadprog", stationarity: bool = True,
                    progress: bool = False, label: str = "", checkpoint: Checkpoint | None = None) -> FMOLHistory:
    """Centralised MGD (full batch) or SMGD (each client contributes a minibatch of size b to
    one union batch), ``iterations_per_round`` (K) iterations per recorded round, K·T in all;
    resumed from ``checkpoint`` when it holds this run's state."""
    _check_common(rounds, iterations_per_round, batch_size, {"lr": lr}, qp_params, solver)
    work, layout, theta = _setup(problem, model, theta0)
    qp_mask = layout.shared if qp_params == "shared" else None
    K = iterations_per_round
    arrays, start, theta, spent = _records(rounds, problem.num_objectives, checkpoint, theta)
    loss, lam, d_sq, step_sq = arrays.values()
    t0, bar = time.perf_counter() - spent, _bar(rounds, label or "centralised", progress)
    for t in range(start, rounds):
        for k in range(K):
            j = t * K + k
            batches = [minibatches(problem.x[i].shape[0], batch_size, 1,
                                   np.random.default_rng((seed, _TAG_CENTRAL, j, i)))[0]
                       for i in range(problem.num_clients)]
            grads, losses = centralised_gradients(problem, work, layout, theta, batches)
            direction, lam_j, sq = common_direction(grads, qp_mask, solver)
            if k == 0:
                full = all(b is None for b in batches)
                loss[t] = losses if full else objective_values(problem, work, layout, theta)
                exact = grads if full else (objective_gradients(problem, work, layout, theta) if stationarity else None)
                if exact is not None:
                    d_sq[t] = _stationarity(lam_j, exact)
                lam[t], step_sq[t] = lam_j, sq
            theta = theta - lr * direction
            _check_finite(theta, "the model")
        _tick(bar, loss[t])
        if checkpoint is not None:
            checkpoint.after_round(t + 1, rounds, theta, arrays, time.perf_counter() - t0)
    return _finish(problem, work, layout, theta, loss, lam, d_sq, step_sq, label, t0, bar)


# ----------------------------------------------------------------------------- configs and the cache

@dataclass(frozen=True)
class FMOLConfig:
    """One MultiMNIST-style FMOL run (FMOL §5 / App. D defaults: M = 10 clients × 256 samples,
    every client holds both tasks, η_L = η_t = 0.1).

    ``method``: "federated" (FMGDA if ``batch_size`` is None, else FSMGDA) or "centralised"
    (MGD / SMGD, step size ``global_lr``, ``local_steps`` iterations per round; ``local_lr`` is
    not used). ``seed`` sets the initial model and the minibatches; the partition has its own
    ``partition_seed`` and the pairing of the images ``data_seed``."""

    method: str = "federated"
    dataset: str = "multimnist"
    source: str = "auto"
    iid: bool = False
    num_clients: int = 10
    samples_per_client: int = 256
    label_task: int = 0
    local_steps: int = 10
    batch_size: int | None = None
    local_lr: float = 0.1
    global_lr: float = 0.1
    rounds: int = 100
    qp_params: str = "all"
    seed: int = 0
    partition_seed: int = 0
    data_seed: int = 0
    stationarity: bool = True
    solver: str = "quadprog"

    def validate(self) -> "FMOLConfig":
        from .multimnist import DATASETS, SOURCES
        if self.method not in METHODS:
            raise ConfigError(f"method={self.method!r} is not one of {METHODS}")
        if self.dataset not in DATASETS:
            raise ConfigError(f"dataset={self.dataset!r} is not one of {DATASETS}")
        if self.source not in SOURCES:
            raise ConfigError(f"source={self.source!r} is not one of {SOURCES}")
        if self.batch_size is not None and isinstance(self.batch_size, int) and self.batch_size >= self.samples_per_client:
            raise ConfigError(f"batch_size={self.batch_size} ≥ samples_per_client={self.samples_per_client}: "
                              "use batch_size=None for full batch (FMGDA / MGD)")
        for name in ("num_clients", "samples_per_client"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        _check_common(self.rounds, self.local_steps, self.batch_size,
                      {"local_lr": self.local_lr, "global_lr": self.global_lr}, self.qp_params, self.solver)
        return self

    @property
    def algorithm(self) -> str:
        if self.method == "federated":
            return "FMGDA" if self.batch_size is None else "FSMGDA"
        return "MGD" if self.batch_size is None else "SMGD"

    def label(self) -> str:
        b = "" if self.batch_size is None else f" b={self.batch_size}"
        return f"{self.algorithm}{b} K={self.local_steps} {'iid' if self.iid else 'non-iid'} seed={self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FMOLConfig":
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown FMOLConfig keys: {', '.join(sorted(unknown))}")
        return cls(**d)

    def replace(self, **changes) -> "FMOLConfig":
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """A stable hash of every setting and of the cache version (the cache folder's name)."""
        blob = json.dumps({"fmol": _CACHE_VERSION, **self.to_dict()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_problem(config: FMOLConfig) -> FMOLProblem:
    """The clients of ``config``: MultiMNIST / MultiFashion pairs drawn with ``data_seed``,
    partitioned with ``partition_seed``; every client holds every task (A all ones, App. D)."""
    from .multimnist import federate, load_multitask
    ds = load_multitask(config.dataset, seed=config.data_seed, source=config.source)
    clients = federate(ds, config.num_clients, config.samples_per_client, config.iid, config.partition_seed,
                       config.label_task)
    return FMOLProblem(clients, tasks=ds.tasks)


def initial_model(config: FMOLConfig, num_tasks: int = 2) -> MultiTaskNet:
    """The LeNet-style model with the initial point of ``config.seed`` (the same for every method)."""
    model = multi_lenet(num_tasks=num_tasks)
    init_parameters(model, torch.Generator().manual_seed(config.seed))
    return model


def simulate(config: FMOLConfig, progress: bool = False, checkpoint_dir: Path | None = None,
             checkpoint_every: int = 10) -> FMOLHistory:
    """Run one config (no cache); with ``checkpoint_dir``, checkpoint there every
    ``checkpoint_every`` rounds and resume from a checkpoint of the same config."""
    config.validate()
    problem = build_problem(config)
    model = initial_model(config, problem.num_objectives)
    checkpoint = Checkpoint(checkpoint_dir, config.key(), checkpoint_every) if checkpoint_dir is not None else None
    common = dict(rounds=config.rounds, batch_size=config.batch_size, qp_params=config.qp_params, seed=config.seed,
                  solver=config.solver, stationarity=config.stationarity, progress=progress, label=config.label(),
                  checkpoint=checkpoint)
    if config.method == "federated":
        h = run_federated(problem, model, local_steps=config.local_steps, local_lr=config.local_lr,
                          global_lr=config.global_lr, **common)
    else:
        h = run_centralised(problem, model, iterations_per_round=config.local_steps, lr=config.global_lr, **common)
    h.config = config.to_dict()
    return h


def run_dir(config: FMOLConfig, root: Path | None = None) -> Path:
    return Path(root or results_root()) / "fmol" / config.key()


def is_cached(config: FMOLConfig, root: Path | None = None) -> bool:
    d = run_dir(config, root)
    return (d / "history.json").is_file() and (d / "history.npz").is_file()


def run(config: FMOLConfig, cache: bool = True, root: Path | None = None, progress: bool = False) -> FMOLHistory:
    """One run, cached on disk by the hash of its config (``results/fmol/<key>/``, atomic writes);
    an interrupted run resumes from its checkpoint there."""
    config.validate()
    if not cache:
        return simulate(config, progress)
    d = run_dir(config, root)
    if is_cached(config, root):
        return FMOLHistory.load(d)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write(d / "config.json", lambda p: Path(p).write_text(json.dumps(config.to_dict(), indent=1)))
    h = simulate(config, progress, checkpoint_dir=d)
    h.save(d)
    (d / CHECKPOINT).unlink(missing_ok=True)   # the finished history replaces it
    return h


def _worker(args: tuple[dict, str | None]) -> str:
    cfg, root = args
    config = FMOLConfig.from_dict(cfg)
    run(config, root=Path(root) if root else None)
    return config.key()


def run_many(configs: Iterable[FMOLConfig], backend=None, root: Path | None = None,
             progress: bool = True) -> list[FMOLHistory]:
    """Many configs (all validated first), each trained once even if listed twice, on a backend
    of :mod:`fairfl.experiments` (default: serially in this process). Returns the histories in
    the order given; raises RunFailedError listing the failed runs (the others stay cached)."""
    from .experiments import SerialBackend, run_sweep
    configs = [c.validate() for c in configs]
    return run_sweep(configs, _worker, lambda c: is_cached(c, root), lambda c: FMOLHistory.load(run_dir(c, root)),
                     backend or SerialBackend(), root, progress, what="FMOL runs")


# ----------------------------------------------------------------------------- Table 2

TABLE2_THRESHOLD = 1e-2   # FMOL Table 2: "communication rounds needed for 10⁻² loss"


def table2_config(local_steps: int, iid: bool, seed: int, *, num_clients: int = 10, samples_per_client: int = 256,
                  rounds: int = 100) -> FMOLConfig:
    """One FMGDA run of Fig. 1(b) / Table 2 (defaults: the paper's size, 10 × 256, 100 rounds,
    η_L = η_t = 0.1); the partition seed follows the run's seed. Notebook 05 and
    ``scripts/fmol_table2.py`` build their runs here, so they share cache entries."""
    return FMOLConfig(num_clients=num_clients, samples_per_client=samples_per_client, rounds=rounds,
                      local_steps=local_steps, local_lr=0.1, global_lr=0.1, iid=iid, seed=seed, partition_seed=seed)


def rounds_to_threshold(histories: Sequence[FMOLHistory], threshold: float = TABLE2_THRESHOLD) -> np.ndarray:
    """(runs, tasks) first round at which each task's training loss is ≤ threshold; inf where a
    run never reached it."""
    return np.stack([h.rounds_to(threshold) for h in histories])


def format_rounds(r: np.ndarray, horizon: int) -> str:
    """Rounds to a threshold over seeds as a table entry: mean ± std when every seed reached it,
    "> horizon" when none did, else the mean of those that did and how many."""
    ok = np.isfinite(r)
    if ok.all():
        return f"{r.mean():.1f} ± {r.std():.1f}" if len(r) > 1 else f"{r.mean():.0f}"
    if not ok.any():
        return f"> {horizon}"
    return f"{r[ok].mean():.1f} ({ok.sum()}/{len(r)} seeds; others > {horizon})"
