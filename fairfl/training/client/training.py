"""Local training: the client optimiser's settings (:class:`LocalTraining`); *instances* (a model
copy, a dataset, a start) trained through ``fairfl.training.engine`` (:func:`train_instances`); the sampled
clients' round from the global model, as pseudo-gradients (:func:`train_clients`), their
full-batch gradients (:func:`gradients`) and FMOL's per-objective training (:func:`train_objectives`);
the named NaN/Inf check of what comes back (:func:`check_finite`)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..engine import Immediate, Job, Pool, Source, Trained, Trainer, set_flat_params
from fairfl.base.errors import TrainingDivergedError
from fairfl.federated.messages import ClientUpdates
from fairfl.federated.models import num_tasks, objective_indices, objective_view, shared_mask
from fairfl.federated.partition import Client
from fairfl.base.seeding import Stream
from fairfl.base.validation import option, validate_options
from .forward import device_of, mean_losses, objective_losses


@dataclass(frozen=True)
class LocalTraining:
    """Client optimiser settings. ``batch_size=None`` means full batch. By default a client runs
    ``epochs`` passes over its data, each a fresh permutation cut into batches; with ``steps``
    set (FMOL's K local steps) it runs that many steps instead, each on ``batch_size`` distinct
    samples drawn uniformly without replacement, independently at every step (the whole local
    set when ``batch_size`` is None), and ``epochs`` is not used."""

    epochs: int = option(1, low=1)
    batch_size: int | None = option(10, low=1, doc="None: full batch")
    lr: float = option(0.01, low=0.0, low_open=True)
    momentum: float = option(0.0, low=0.0, high=1.0, high_open=True)
    weight_decay: float = option(0.0, low=0.0)
    prox_mu: float = option(0.0, low=0.0, doc="FedProx: + (μ/2)·‖w − w_centre‖² in every local loss")
    steps: int | None = option(None, low=1, doc="K local steps instead of epochs (FMOL)")

    def __post_init__(self) -> None:
        validate_options(self, "local")


LOCAL_TRAINING = "local training of client(s) {who} produced NaN/Inf (loss or update); lower the learning rate"
GRADIENT = ("the gradient of client(s) {who} at the global model is NaN/Inf: the server's last step left the region "
            "where the loss is finite (shorten the server's step or, for a Newton-type method, damp it more)")


def check_finite(updates: torch.Tensor, losses: torch.Tensor | None, clients: Sequence[int], round_: int,
                 what: str = LOCAL_TRAINING) -> None:
    """Raise TrainingDivergedError naming the clients whose update or loss is NaN/Inf (``what``: the
    message, with ``{who}`` for them)."""
    ok = torch.isfinite(updates.reshape(len(updates), -1)).all(dim=1)
    if losses is not None:
        ok &= torch.isfinite(losses.reshape(len(losses), -1)).all(dim=1)
    bad_rows = ~ok
    if bad_rows.any():
        who = [int(clients[i]) for i in torch.nonzero(bad_rows).ravel()]
        raise TrainingDivergedError(f"round {round_}: {what.format(who=who)}. The last checkpoint is kept.")


# ----------------------------------------------------------------------------- instances

# The pools of live client lists, each kept while its list's first client lives (a partition's clients
# live and die together). A pool is a view of its partition's training block, so a pool kept longer would
# keep the partition: eight kept by count held the last eight partitions of notebook 06's reporting sweep,
# 1.4 GB more in each worker, growing seed by seed.
_POOLS: dict[tuple[tuple[int, ...], str], Pool] = {}


def pool_of(data: Sequence[Client], device: torch.device | str = "cpu") -> Pool:
    """The clients' training data as one :class:`~fairfl.training.engine.Pool` on ``device``, made once per
    client list and device while the list lives (the runs of a sweep on one partition share it)."""
    device = torch.device(device)
    key = (tuple(map(id, data)), str(device))
    pool = _POOLS.get(key)
    if pool is None:
        pool = Pool([c.x_train for c in data], [c.y_train for c in data], device)
        if data:
            _POOLS[key] = pool
            weakref.finalize(data[0], _POOLS.pop, key, None)
    return pool


def train_instances(model: nn.Module, starts: torch.Tensor, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor],
                    streams: Sequence[Stream], cfg: LocalTraining, prox_centre: torch.Tensor | None = None,
                    batched: bool = True, loss_after: bool = False, sum_gradients: bool = False,
                    first_gradient: bool = False, trainer: Trainer | None = None) -> Trained:
    """Local SGD of m instances of ``model`` (a single-task model; its parameters are only a
    template): instance k starts at ``starts[k]`` (flat, ``parameters()`` order) and trains on
    (``xs[k]``, ``ys[k]``) with the batches and dropout masks of ``streams[k]``; the proximal term
    of ``cfg.prox_mu`` pulls towards ``prox_centre`` (flat; default: each instance's start).
    ``sum_gradients`` also returns Σ of the gradients of the local loss (with its proximal term,
    before weight decay and momentum) at the iterates; ``first_gradient`` the gradient of the
    first step. Runs through ``fairfl.training.engine`` (``trainer``: how the job meets other jobs)."""
    return run_job(Job(model, starts, [Source.of(x, y) for x, y in zip(xs, ys)], list(streams), cfg, prox_centre, batched,
                    loss_after, sum_gradients, first_gradient), trainer)


def run_job(job: Job, trainer: Trainer | None) -> Trained:
    return (trainer or Immediate())(job)

# ----------------------------------------------------------------------------- clients

def train_clients(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                  cfg: LocalTraining, seed: int, round_: int, batched: bool = True,
                  loss_before: bool = True, loss_after: bool = True, trainer: Trainer | None = None,
                  check: bool = True) -> ClientUpdates:
    """The sampled clients' local training from the global model: their pseudo-gradients
    g = w_global − w_local, sample counts, and (when asked: each costs a forward pass over the
    clients' data) their mean training losses before and after. ``model`` and ``data`` are on the
    device that trains; what comes back is on the CPU."""
    device = device_of(model)
    w = global_flat.to(device)
    set_flat_params(model, w)
    before = (mean_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients])
              if loss_before else None)
    m = len(clients)
    pool = pool_of(data, device)
    trained = run_job(Job(model, w.unsqueeze(0).expand(m, -1), [pool.source(int(k)) for k in clients],
                       [Stream(seed, round_, int(k)) for k in clients], cfg, w, batched, loss_after), trainer)
    out = ClientUpdates(np.asarray(clients), (w.unsqueeze(0) - trained.params).cpu(),
                        torch.tensor([data[k].num_train for k in clients]), _cpu(before), _cpu(trained.loss_after))
    if check:
        check_finite(out.updates, out.loss_after, clients, round_)
    return out


def _cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.cpu()


def gradients(model: nn.Module, point: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
              batched: bool = True, trainer: Trainer | None = None, round_: int = 0) -> torch.Tensor:
    """∇fₖ(point) for each client (rows), full batch on its training data: one SGD step of
    learning rate 1 from ``point`` moves by exactly the gradient, so the batched local-training
    path computes every client's gradient in one fused pass. Its data order comes from the
    stream of (seed 0, round 0) in every round, so its bits never depend on the round; ``round_``
    only names the round in its error."""
    step = LocalTraining(epochs=1, batch_size=None, lr=1.0)
    grads = train_clients(model, point, data, clients, step, 0, 0, batched, loss_before=False, loss_after=False,
                          trainer=trainer, check=False).updates
    check_finite(grads, None, clients, round_, GRADIENT)
    return grads


def train_objectives(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                     held: torch.Tensor, cfg: LocalTraining, seed: int, round_: int, batched: bool = True,
                     loss_before: bool = True, first_gradients: bool = False,
                     trainer: Trainer | None = None) -> ClientUpdates:
    """Multi-objective local training (FMOL Algorithm 1, steps 1–3): every sampled client i
    trains, for each objective s it holds (``held[i, s]``), the objective's view of the model
    (trunk + head s) from the global model on label column s, and returns the sum of the
    gradients Δ_{s,i} = Σ_k ∇f_{s,i}(x^{t,k}) as a full-length vector (zero outside the trunk and
    head s). The (client, objective) pairs train as one stack; a client draws its minibatches from
    one stream per round, so all its objectives see the same ξ^{t,k} (Algorithm 1 gives ξ no
    objective index). ``loss_before`` is f_{s,i}(x_t) on the client's whole training data;
    ``first_gradients`` adds the first step's gradients as ``extras["first_gradients"]`` (m, S, d)
    (on full batch: ∇f_{s,i}(x_t)). ``shared`` marks the trunk's coordinates."""
    S = num_tasks(model)
    m, d = len(clients), global_flat.numel()
    device = device_of(model)
    w = global_flat.to(device)
    views = [objective_view(model, s) for s in range(S)]
    where = [objective_indices(model, s) for s in range(S)]
    pairs = [(r, s) for r in range(m) for s in range(S) if held[r, s]]
    starts = torch.stack([w[where[s]] for _, s in pairs]) if pairs else torch.empty(0, 0, device=device)
    pool = pool_of(data, device)
    trained = run_job(Job(views[0], starts, [pool.source(int(clients[r]), s) for r, s in pairs],
                       [Stream(seed, round_, int(clients[r])) for r, _ in pairs], cfg, None, batched,
                       sum_gradients=True, first_gradient=first_gradients), trainer) if pairs else None
    updates = torch.zeros(m, S, d, dtype=global_flat.dtype)
    firsts = torch.zeros(m, S, d, dtype=global_flat.dtype) if first_gradients else None
    if pairs:
        grad_sum = trained.grad_sum.cpu()
        first_grad = trained.first_grad.cpu() if firsts is not None else None
    for j, (r, s) in enumerate(pairs):
        updates[r, s, where[s]] = grad_sum[j]
        if firsts is not None:
            firsts[r, s, where[s]] = first_grad[j]
    before = None
    if loss_before:
        set_flat_params(model, w)
        before = objective_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients]).cpu()
        before = torch.where(held, before, torch.full_like(before, float("nan")))
    out = ClientUpdates(np.asarray(clients), updates, torch.tensor([data[k].num_train for k in clients]), before,
                        extras={} if firsts is None else {"first_gradients": firsts}, held=held.clone(),
                        shared=shared_mask(model).cpu())
    check_finite(out.updates, None if before is None else before.nan_to_num(0.0), clients, round_)
    return out
