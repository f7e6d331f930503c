"""What a client does in a round: E epochs (or K steps) of minibatch SGD from a starting model,
optionally with momentum, weight decay and a proximal term, reporting the pseudo-gradient
g = w_start − w_local (or the sum of its gradients) and its mean training loss before and after.

The unit of work is an *instance*: one model copy trained on one dataset from one start. A
round's clients are instances (start = the global model); Ditto's personal models are instances
too (start = the client's own model, proximal centre = the global one), and so are FMOL's
(client, objective) pairs (the objective's view of a multi-task model, on one label column).
``fairfl.engine`` trains them: by default fused into stacks (every instance of a round, and of
every run trained alongside, in one computation), or one ``nn.Module`` at a time on the
reference path (``batched=False``, and recurrent models, which cannot be stacked). Both paths
draw each instance's batch order and dropout masks from its :class:`~fairfl.seeding.Stream` (a
client's: of (seed, round, client)), so they agree to float tolerance (tested).

:class:`ClientRuntime` is what an algorithm sees of the clients. It trains and evaluates on the
run's device and hands back CPU tensors, so that server rules never meet a device.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import stacked as stacked_forward
from .engine import (Immediate, Job, Pool, Predict, Source, Trained, Trainer, map_chunks, predict_one, predict_stack,
                     set_flat_params)
from .errors import TrainingDivergedError
from .messages import ClientUpdates
from .models import num_tasks, objective_indices, objective_view, shared_mask
from .partition import Client
from .seeding import BATCHES, Stream
from .validation import option, validate_options


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


# ----------------------------------------------------------------------------- helpers

def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor | Sequence[torch.Tensor], chunk: int = 512) -> torch.Tensor:
    """Logits of one model on many inputs, in chunks, through the fused channels-last forward
    when the model allows it (about twice as fast as NCHW on a small CPU). ``x``: one tensor, or
    several taken as their concatenation (the clients' datasets), which is never built: a chunk
    inside one of them is a view of it, only a chunk across two is copied. The chunks are those of
    the concatenation either way, so the logits are the same bit for bit."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 row, got {chunk}")
    parts = [x] if isinstance(x, torch.Tensor) else list(x)
    if not sum(len(p) for p in parts):
        return torch.empty(0, device=parts[0].device if parts else None)
    if not stacked_forward.supports(model):
        return torch.cat(map_chunks(model, parts, chunk))
    return predict_stack(model, [p.detach().unsqueeze(0) for p in model.parameters()], parts, chunk)[0]


@torch.no_grad()
def mean_losses(model: nn.Module, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the model on each of several datasets (eval mode), computed as one
    forward pass in the chunks of their concatenation (:func:`predict`). A dataset with no
    samples gets NaN."""
    was_training = model.training
    model.eval()
    try:
        return losses_of(predict(model, xs), ys)
    finally:
        model.train(was_training)


def losses_of(logits: torch.Tensor, ys: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy on each of several datasets, from the logits of their concatenation; NaN
    for a dataset with no samples."""
    y = torch.cat(list(ys))
    losses = F.cross_entropy(logits, y, reduction="none") if len(y) else torch.empty(0, device=y.device)
    return torch.stack([s.mean() if len(s) else torch.tensor(float("nan"), device=y.device)
                        for s in losses.split([len(v) for v in ys])])


def labels_of(y: torch.Tensor, task: int) -> torch.Tensor:
    """The labels of objective ``task``: column ``task`` of multi-task labels (n, S)."""
    return y[:, task] if y.ndim == 2 else y


def objective_losses(model: nn.Module, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor]) -> torch.Tensor:
    """(datasets,) mean losses of a single-task model, or (datasets, S) per objective of a
    multi-task one."""
    if num_tasks(model) == 1:
        return mean_losses(model, xs, ys)
    return torch.stack([mean_losses(objective_view(model, s), xs, [labels_of(y, s) for y in ys])
                        for s in range(num_tasks(model))], dim=1)


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

_POOLS: dict[tuple[int, str], tuple[Sequence[Client], Pool]] = {}


def pool_of(data: Sequence[Client], device: torch.device | str = "cpu") -> Pool:
    """The clients' training data as one :class:`~fairfl.engine.Pool` on ``device``, made once per
    client list and device (the runs of a sweep on one partition share it)."""
    device = torch.device(device)
    key = (id(data), str(device))
    hit = _POOLS.get(key)
    if hit is None or hit[0] is not data:
        if len(_POOLS) >= 8:   # bound the memory of a long-lived worker
            _POOLS.pop(next(iter(_POOLS)))
        hit = (data, Pool([c.x_train for c in data], [c.y_train for c in data], device))
        _POOLS[key] = hit
    return hit[1]


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
    first step. Runs through ``fairfl.engine`` (``trainer``: how the job meets other jobs)."""
    return _run(Job(model, starts, [Source.of(x, y) for x, y in zip(xs, ys)], list(streams), cfg, prox_centre, batched,
                    loss_after, sum_gradients, first_gradient), trainer)


def _run(job: Job, trainer: Trainer | None) -> Trained:
    return (trainer or Immediate())(job)

# ----------------------------------------------------------------------------- clients

def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def train_clients(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                  cfg: LocalTraining, seed: int, round_: int, batched: bool = True,
                  loss_before: bool = True, loss_after: bool = True, trainer: Trainer | None = None,
                  check: bool = True) -> ClientUpdates:
    """The sampled clients' local training from the global model: their pseudo-gradients
    g = w_global − w_local, sample counts, and (when asked: each costs a forward pass over the
    clients' data) their mean training losses before and after. ``model`` and ``data`` are on the
    device that trains; what comes back is on the CPU."""
    device = _device(model)
    w = global_flat.to(device)
    set_flat_params(model, w)
    before = (mean_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients])
              if loss_before else None)
    m = len(clients)
    pool = pool_of(data, device)
    trained = _run(Job(model, w.unsqueeze(0).expand(m, -1), [pool.source(int(k)) for k in clients],
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


# ----------------------------------------------------------------------------- second-order quantities

SECOND_ORDER_CHUNK = 4096   # samples per double-backward pass: bounds the memory of a large client's graph


def _flat_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """The summed cross-entropy of ``model`` on (x, y) as a function of the flat parameter vector
    (``parameters()`` order), through ``torch.func.functional_call``: the model's own parameters
    are never touched."""
    names, shapes = zip(*[(n, p.shape) for n, p in model.named_parameters()])
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]

    def loss(flat: torch.Tensor) -> torch.Tensor:
        params = {n: t.view(s) for n, t, s in zip(names, flat.split(sizes), shapes)}
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y, reduction="sum")
    return loss


def _second_order(model: nn.Module, points: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                  dtype: torch.dtype | None, per_chunk, chunk: int,
                  rows: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor]:
    """``per_chunk(loss, point, r)`` summed over the chunks of client ``clients[r]``'s training data and
    divided by its size (fₖ is a mean loss), for every r; in eval mode (no dropout: the same function at
    every call), in ``dtype`` (default: the model's), on the model's device, returned on the CPU.
    ``rows[r]``, where given, restricts client r to those rows of its training data (a subsampled
    Hessian: the mean loss over them)."""
    if num_tasks(model) != 1:
        raise ValueError("Hessian-vector products and Hessians are for single-task models")
    device = _device(model)
    dtype = dtype or next(model.parameters()).dtype
    was_training = model.training
    model.eval()
    out = []
    try:
        for r, k in enumerate(clients):
            point = points[r].to(device=device, dtype=dtype)
            x, y = data[k].x_train, data[k].y_train
            if rows is not None and rows[r] is not None:
                x, y = x[rows[r]], y[rows[r]]
            if not len(y):
                raise ValueError(f"client {k} has no training data: its loss has no derivatives")
            total = None
            for start in range(0, len(y), chunk):
                xb = x[start:start + chunk]
                xb = xb.to(dtype) if xb.is_floating_point() else xb
                part = per_chunk(_flat_loss(model, xb, y[start:start + chunk]), point, r)
                total = part if total is None else total + part
            out.append((total / len(y)).detach().cpu())
    finally:
        model.train(was_training)
    return out


def _rows(t: torch.Tensor, m: int) -> torch.Tensor:
    return t.unsqueeze(0).expand(m, *t.shape) if t.ndim == 1 else t


def hessian_vector_products(model: nn.Module, point: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                            v: torch.Tensor, dtype: torch.dtype | None = None,
                            chunk: int = SECOND_ORDER_CHUNK,
                            rows: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """∇²fₖ(point)·v for each client k (fₖ: its mean training loss, or over ``rows[r]`` of its training
    data where given), by double backward. ``point``: (d,) or (m, d) one per client; ``v``: (d,), (m, d)
    one per client, or (m, s, d) s vectors per client (one backward pass, s products). Returns (m, d) or
    (m, s, d)."""
    m = len(clients)
    points = _rows(point, m)
    many = v.ndim == 3
    vs = v if many else _rows(v, m).unsqueeze(1)

    def per_chunk(loss, p, r):
        p = p.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(loss(p), p, create_graph=True)
        rows = vs[r].to(device=p.device, dtype=p.dtype)
        return torch.stack([torch.autograd.grad(g @ u, p, retain_graph=i < len(rows) - 1)[0]
                            for i, u in enumerate(rows)])
    out = torch.stack(_second_order(model, points, data, clients, dtype, per_chunk, chunk, rows))
    return out if many else out[:, 0]


# torch.func.hessian is forward over reverse mode, and torch's forward-AD levels are process-wide, not
# per thread: two threads computing Hessians at once (the runs of a lockstep group, each in its thread)
# enter and leave each other's levels, and one fails with "Trying to access a forward AD level with an
# invalid index" (FedNL and FedNew on Adult, two runs in one process). One Hessian at a time: the
# computation itself is unchanged, so a run's bits are too (reverse over reverse would need no lock, but
# rounds otherwise, and every cached FedNL/FedNew result would no longer be what its config computes).
FORWARD_AD = threading.Lock()


def hessians(model: nn.Module, point: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
             dtype: torch.dtype | None = torch.float64, chunk: int = SECOND_ORDER_CHUNK) -> torch.Tensor:
    """(m, d, d) dense Hessians ∇²fₖ(point) (``torch.func.hessian``; float64 by default) — for a small
    model only: d² numbers per client. Thread-safe (:data:`FORWARD_AD`)."""
    points = _rows(point, len(clients))

    def per_chunk(loss, p, r):
        # torch.func.hessian's forward-mode half compiles torch's jvp decompositions with torch.jit.script on
        # its first use, which warns that torch.jit.script is deprecated: torch's own call, nothing to change
        # here (warnings' filters are process-wide: changed under the lock, one thread at a time)
        with FORWARD_AD, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
            return torch.func.hessian(loss)(p.detach())
    return torch.stack(_second_order(model, points, data, clients, dtype, per_chunk, chunk))


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
    device = _device(model)
    w = global_flat.to(device)
    views = [objective_view(model, s) for s in range(S)]
    where = [objective_indices(model, s) for s in range(S)]
    pairs = [(r, s) for r in range(m) for s in range(S) if held[r, s]]
    starts = torch.stack([w[where[s]] for _, s in pairs]) if pairs else torch.empty(0, 0, device=device)
    pool = pool_of(data, device)
    trained = _run(Job(views[0], starts, [pool.source(int(clients[r]), s) for r, s in pairs],
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


# ----------------------------------------------------------------------------- evaluation

@dataclass
class Evaluation:
    """One evaluation: per-client test accuracy and loss ([client], or [client][objective] for a
    multi-task model), the uniformly averaged training loss over all clients (a float, or one
    per objective) and each client's own training loss."""

    test_acc: list
    test_loss: list
    train_loss: float | list
    client_train_loss: list | None = None
    val_acc: list | None = None        # the same on the clients' validation splits, where asked for
    val_loss: list | None = None


def merge_evaluations(parts: Sequence[Evaluation]) -> Evaluation:
    """One Evaluation of clients evaluated one at a time (``parts[k]``: client k alone, at its
    own model): the training loss averaged uniformly over the clients, per objective for a
    multi-task model (what :func:`evaluate_model` does over all clients at once)."""
    train = [p.train_loss for p in parts]
    mean_train = (float(np.mean(train)) if not isinstance(train[0], list)
                  else [float(v) for v in np.mean(np.asarray(train, dtype=np.float64), axis=0)])
    validated = parts[0].val_acc is not None
    return Evaluation([p.test_acc[0] for p in parts], [p.test_loss[0] for p in parts], mean_train,
                      [p.client_train_loss[0] for p in parts],
                      [p.val_acc[0] for p in parts] if validated else None,
                      [p.val_loss[0] for p in parts] if validated else None)


def _split_means(values: torch.Tensor, sizes: list[int]) -> list[float]:
    return [float(v.mean()) if len(v) else float("nan") for v in values.split(sizes)]


@torch.no_grad()
def evaluate_model(model: nn.Module, data: Sequence[Client], validation: bool = False) -> Evaluation:
    """Every client's test accuracy and loss, and the uniformly averaged training loss over all
    clients, at the model's current parameters in eval mode; per objective for a multi-task
    model (its objectives' views). ``validation``: also each client's validation accuracy and loss
    (single-task models)."""
    if num_tasks(model) > 1:
        if validation:
            raise ValueError("validation scores are for single-task models")
        parts = [evaluate_model(objective_view(model, s), [_task_client(c, s) for c in data])
                 for s in range(num_tasks(model))]
        per_client = lambda key: [list(v) for v in zip(*(getattr(p, key) for p in parts))]
        return Evaluation(per_client("test_acc"), per_client("test_loss"), [p.train_loss for p in parts],
                          per_client("client_train_loss"))
    was_training = model.training
    model.eval()
    try:
        out = predict(model, [c.x_test for c in data])
        val = predict(model, [c.x_val for c in data]) if validation else None
        train = mean_losses(model, [c.x_train for c in data], [c.y_train for c in data])
    finally:
        model.train(was_training)
    return evaluation_of(out, data, train, val)


def _scores(logits: torch.Tensor, ys: Sequence[torch.Tensor]) -> tuple[list[float], list[float]]:
    """Per-client accuracy and mean cross-entropy from logits on the concatenation of ``ys``' inputs
    (NaN for a client with no samples)."""
    y = torch.cat(list(ys))
    losses = F.cross_entropy(logits, y, reduction="none") if len(y) else torch.empty(0, device=y.device)
    correct = (logits.argmax(1) == y).float() if len(y) else torch.empty(0, device=y.device)
    sizes = [len(v) for v in ys]
    return _split_means(correct, sizes), _split_means(losses, sizes)


def evaluation_of(test_logits: torch.Tensor, data: Sequence[Client], train_losses: torch.Tensor,
                  val_logits: torch.Tensor | None = None) -> Evaluation:
    """The Evaluation of a single-task model from its logits on the clients' concatenated test
    sets (and, where given, validation sets) and its mean training loss on each client."""
    acc, loss = _scores(test_logits, [c.y_test for c in data])
    val_acc, val_loss = _scores(val_logits, [c.y_val for c in data]) if val_logits is not None else (None, None)
    return Evaluation(acc, loss, float(train_losses.mean()), [float(v) for v in train_losses], val_acc, val_loss)


def _task_client(c: Client, task: int) -> Client:
    return Client(c.x_train, labels_of(c.y_train, task), c.x_val, labels_of(c.y_val, task),
                  c.x_test, labels_of(c.y_test, task))


# ----------------------------------------------------------------------------- the simulated clients

class ClientRuntime:
    """The clients of one run as the simulation holds them — their data, a model (only a
    template for shapes; every call sets the parameters it uses), the run's seed and the
    training path — and what an algorithm can ask of them. The round loop makes one per run,
    sets ``round`` before each round, and hands it to the algorithm's ``client_update`` and
    ``evaluate``. Model and data live on the run's device; every method takes and returns CPU
    tensors. ``trainer`` is how this run's local training meets other runs' (``fairfl.engine``).

    ``states`` holds each client's algorithm state (Ditto's personal model), saved in
    checkpoints; ``cache`` is scratch that an algorithm may keep between rounds to avoid
    recomputing something, never checkpointed, so it must never change a result."""

    def __init__(self, model: nn.Module, data: Sequence[Client], seed: int, batched: bool = True,
                 trainer: Trainer | None = None):
        self.model, self.data, self.seed, self.batched = model, data, seed, batched
        self.trainer = trainer or Immediate()
        self.device = _device(model)
        self.round = 0
        self.validation = False     # evaluations also score the validation splits (config.track_validation)
        self.states: dict[int, object] = {}
        self.cache: dict = {}
        self._losses: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_clients(self) -> int:
        return len(self.data)

    @property
    def num_objectives(self) -> int:
        """S: the model's tasks (1 for a single-task model)."""
        return num_tasks(self.model)

    def num_samples(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([self.data[k].num_train for k in ids])

    def train(self, ids: Sequence[int], params: torch.Tensor, local: LocalTraining, *, loss_before: bool = False,
              loss_after: bool = False, batch_round: int | None = None) -> ClientUpdates:
        """Local training of clients ``ids`` from the global model ``params`` (pseudo-gradients,
        :func:`train_clients`). ``batch_round`` replaces the round in the clients' streams (an
        algorithm that trains one round in several calls gives each its own stream)."""
        out = train_clients(self.model, params, self.data, ids, local, self.seed,
                            self.round if batch_round is None else batch_round, self.batched, False, loss_after,
                            self.trainer)
        return out.replace(loss_before=self.losses(params, ids)) if loss_before else out

    def train_from(self, ids: Sequence[int], starts: torch.Tensor, local: LocalTraining,
                   prox_centre: torch.Tensor | None = None, purpose: int = BATCHES) -> torch.Tensor:
        """(m, d) local models of clients ``ids`` trained from their own ``starts`` (m, d), the
        proximal term of ``local.prox_mu`` pulling towards ``prox_centre`` (Ditto's personal
        models). ``purpose`` separates these streams from the round's ordinary ones."""
        pool = pool_of(self.data, self.device)
        centre = None if prox_centre is None else prox_centre.to(self.device)
        trained = _run(Job(self.model, starts.to(self.device), [pool.source(int(k)) for k in ids],
                           [Stream(self.seed, self.round, int(k), purpose) for k in ids], local, centre, self.batched),
                       self.trainer)
        params = trained.params.cpu()
        check_finite(params, None, ids, self.round)
        return params

    def train_objectives(self, ids: Sequence[int], params: torch.Tensor, held: torch.Tensor, local: LocalTraining,
                         loss_before: bool = True, first_gradients: bool = False) -> ClientUpdates:
        """Per-objective local training of a multi-task model (:func:`train_objectives`)."""
        out = train_objectives(self.model, params, self.data, ids, held, local, self.seed, self.round,
                               self.batched, False, first_gradients, self.trainer)
        if not loss_before:
            return out
        before = self.losses(params, ids)
        return out.replace(loss_before=torch.where(held, before, torch.full_like(before, float("nan"))))

    def objective_gradients(self, point: torch.Tensor, ids: Sequence[int], held: torch.Tensor) -> torch.Tensor:
        """(m, S, d) full-batch gradients ∇f_{s,i}(point) of each held objective (one full-batch
        step, its gradient summed exactly)."""
        step = LocalTraining(steps=1, batch_size=None, lr=1.0)
        return train_objectives(self.model, point, self.data, ids, held, step, self.seed, self.round, self.batched,
                                loss_before=False, trainer=self.trainer).updates

    def gradients(self, point: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """(m, d) full-batch gradients of clients ``ids`` at ``point`` (:func:`gradients`)."""
        return gradients(self.model, point, self.data, ids, self.batched, self.trainer, self.round)

    def hvp(self, point: torch.Tensor, ids: Sequence[int], v: torch.Tensor,
            dtype: torch.dtype | None = None, rows: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """∇²fₖ(point)·v on each client's whole training data (or on ``rows[r]`` of it: a subsampled
        Hessian), eval mode (:func:`hessian_vector_products`): ``point`` (d,) or (m, d), ``v`` (d,),
        (m, d) or (m, s, d). The client computation of a second-order method (FedNL's Hutchinson
        probes, FedNew's conjugate gradients)."""
        return hessian_vector_products(self.model, point, self.data, ids, v, dtype, rows=rows)

    def hessian(self, point: torch.Tensor, ids: Sequence[int],
                dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
        """(m, d, d) dense Hessians ∇²fₖ(point), eval mode, float64 by default (:func:`hessians`); for
        a small model (d² numbers per client)."""
        return hessians(self.model, point, self.data, ids, dtype)

    def losses(self, params: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """Mean training loss of clients ``ids`` at ``params`` (eval mode); (m, S) per objective
        for a multi-task model.

        A run asks for the same losses several times — the losses after round t's step (the
        improved share), the losses before round t + 1's training at the same global model
        (q-FedAvg's Fₖ, FedFV's order, AFL, TERM, DQN-Fed) and the evaluation's training loss — each
        a forward pass over the clients' whole training data. The last few answers are kept, keyed
        by the clients and compared with the parameters' exact values, and returned instead of
        computing them again: the same call on the same inputs, so the same numbers bit for bit."""
        key = tuple(int(k) for k in ids)
        hit = self._losses.get(key)
        if hit is not None and hit[0].dtype == params.dtype and torch.equal(hit[0], params.cpu()):
            return hit[1].clone()
        xs, ys = [self.data[k].x_train for k in ids], [self.data[k].y_train for k in ids]
        if self.num_objectives == 1:
            out = losses_of(self.predict(params, xs), ys).cpu()
        else:
            set_flat_params(self.model, params.to(self.device))
            out = objective_losses(self.model, xs, ys).cpu()
        if len(self._losses) >= 4:
            self._losses.pop(next(iter(self._losses)))
        self._losses.pop(key, None)
        self._losses[key] = (params.detach().cpu().clone(), out.clone())
        return out

    def predict(self, params: torch.Tensor, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits (on the run's device) of the single-task model at ``params``, eval mode, on the
        concatenation of ``xs`` (:func:`predict`). A small dense model's go through the trainer:
        the runs of a lockstep group that predict on the same data at once share one stacked
        forward pass (``fairfl.engine.Predict``)."""
        job = Predict(self.model, params.to(device=self.device, dtype=next(self.model.parameters()).dtype), tuple(xs))
        return self.trainer(job) if job.stackable else predict_one(job)

    def evaluate(self, params: torch.Tensor) -> Evaluation:
        """Every client evaluated at the global model ``params`` (and on its validation split where
        the run asks for it: ``validation``)."""
        if self.num_objectives == 1:
            train = self.losses(params, range(self.num_clients))
            val = self.predict(params, [c.x_val for c in self.data]) if self.validation else None
            return evaluation_of(self.predict(params, [c.x_test for c in self.data]), self.data, train, val)
        set_flat_params(self.model, params.to(self.device))
        return evaluate_model(self.model, self.data, self.validation)

    def evaluate_each(self, params: Sequence[torch.Tensor]) -> Evaluation:
        """Client k evaluated at its own model ``params[k]`` (a personalised algorithm)."""
        parts = []
        for k, p in enumerate(params):
            set_flat_params(self.model, p.to(self.device))
            parts.append(evaluate_model(self.model, [self.data[k]], self.validation))
        return merge_evaluations(parts)
