"""What a client does in a round: E epochs (or K steps) of minibatch SGD from a starting model,
optionally with momentum, weight decay and a proximal term, reporting the pseudo-gradient
g = w_start − w_local (or the sum of its gradients) and its mean training loss before and after.

The unit of work is an *instance*: one model copy trained on one dataset from one start. A
round's clients are instances (start = the global model); Ditto's personal models are instances
too (start = the client's own model, proximal centre = the global one), and so are FMOL's
(client, objective) pairs (the objective's view of a multi-task model, on one label column).
:func:`train_instances` trains any set of them by one of two paths that compute the same thing:

* the reference path — one ``nn.Module`` and one ``torch.optim.SGD`` per instance, in a plain
  loop;
* the batched path — instances with the same number of samples train together. Their
  parameters are stacked along a leading axis; the forward pass fuses them into grouped
  convolutions and batched matrix products (``fairfl.stacked``; any other model goes through
  ``torch.func.vmap(functional_call)``) and one backward pass of the *sum* of the instances'
  mean losses gives every instance its own gradient (the losses share no parameters, so
  ∂(Σₖ Lₖ)/∂wₖ = ∂Lₖ/∂wₖ exactly).

Both paths draw each instance's batch order from the generator they are given (a client's: of
(seed, round, client), :func:`fairfl.seeding.batch_generator`), so on a model without dropout
they agree to float tolerance (tested). Dropout under ``vmap`` draws from the global torch
generator, which the round loop seeds per round for determinism.

Recurrent models (the Shakespeare character LSTM) cannot be stacked: ``vmap`` has no batching
rule for ``aten::lstm`` in this torch ("Batching rule not implemented for aten::lstm.input"),
so the batched path hands them to the reference loop (:func:`can_batch`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from . import stacked as stacked_forward
from .errors import TrainingDivergedError
from .messages import ClientUpdates
from .models import num_tasks, objective_indices, objective_view, shared_mask
from .partition import Client
from .seeding import BATCHES, batch_generator
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
def set_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy ``flat`` into the parameters (``vector_to_parameters`` would make them views of
    ``flat``, so that training would silently overwrite the global model)."""
    i = 0
    for p in model.parameters():
        p.copy_(flat[i:i + p.numel()].view_as(p))
        i += p.numel()


def batch_plan(num_samples: int, cfg: LocalTraining, generator: torch.Generator) -> list[torch.Tensor]:
    """The index batches of one instance's local training: per epoch a fresh permutation cut
    into batches of ``batch_size`` (the last one may be smaller; nothing is dropped), or with
    ``cfg.steps`` one independent draw without replacement per step."""
    b = cfg.batch_size or num_samples
    if cfg.steps is not None:
        if b >= num_samples:
            return [torch.arange(num_samples)] * cfg.steps
        return [torch.randperm(num_samples, generator=generator)[:b] for _ in range(cfg.steps)]
    plan = []
    for _ in range(cfg.epochs):
        perm = torch.randperm(num_samples, generator=generator)
        plan += list(perm.split(b))
    return plan


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Logits of one model on many inputs, in chunks, through the fused channels-last forward
    when the model allows it (about twice as fast as NCHW on a small CPU)."""
    params = [p.detach().unsqueeze(0) for p in model.parameters()]
    fast = stacked_forward.supports(model)
    outs = [stacked_forward.forward(model, params, x[i:i + chunk].unsqueeze(0))[0] if fast else model(x[i:i + chunk])
            for i in range(0, len(x), chunk)]
    return torch.cat(outs) if outs else torch.empty(0)


@torch.no_grad()
def mean_losses(model: nn.Module, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the model on each of several datasets (eval mode), computed as one
    concatenated forward pass in chunks. A dataset with no samples gets NaN."""
    was_training = model.training
    model.eval()
    try:
        x, y = torch.cat(list(xs)), torch.cat(list(ys))
        losses = F.cross_entropy(predict(model, x), y, reduction="none") if len(y) else torch.empty(0)
        sizes = [len(v) for v in ys]
        return torch.stack([s.mean() if len(s) else torch.tensor(float("nan"))
                            for s in losses.split(sizes)])
    finally:
        model.train(was_training)


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


def check_finite(updates: torch.Tensor, losses: torch.Tensor | None, clients: Sequence[int], round_: int) -> None:
    """Raise TrainingDivergedError naming the clients whose update or loss is NaN/Inf."""
    ok = torch.isfinite(updates.reshape(len(updates), -1)).all(dim=1)
    if losses is not None:
        ok &= torch.isfinite(losses.reshape(len(losses), -1)).all(dim=1)
    bad_rows = ~ok
    if bad_rows.any():
        who = [int(clients[i]) for i in torch.nonzero(bad_rows).ravel()]
        raise TrainingDivergedError(
            f"round {round_}: local training of client(s) {who} produced NaN/Inf "
            "(loss or update); lower the learning rate. The last checkpoint is kept.")


# ----------------------------------------------------------------------------- instances

@dataclass
class Trained:
    """What :func:`train_instances` returns, one row per instance."""

    params: torch.Tensor                 # (m, d) the local models
    grad_sum: torch.Tensor | None        # (m, d) Σ of the local loss's gradients at the iterates
    loss_after: torch.Tensor | None      # (m,) mean training loss of each local model (eval mode)
    first_grad: torch.Tensor | None = None   # (m, d) the gradient of the first step (at the start)


# Modules whose forward torch.func.vmap cannot batch: aten::lstm / gru / rnn have no batching
# rule and no fallback ("Batching rule not implemented for aten::lstm.input", torch 2.x).
_NOT_VMAPPABLE = (nn.RNNBase,)


def can_batch(model: nn.Module) -> bool:
    """Whether copies of ``model`` can train as one stack (fused kernels or vmap)."""
    return stacked_forward.supports(model) or not any(isinstance(m, _NOT_VMAPPABLE) for m in model.modules())


def train_instances(model: nn.Module, starts: torch.Tensor, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor],
                    generators: Sequence[torch.Generator], cfg: LocalTraining, prox_centre: torch.Tensor | None = None,
                    batched: bool = True, loss_after: bool = False, sum_gradients: bool = False,
                    first_gradient: bool = False) -> Trained:
    """Local SGD of m instances of ``model`` (a single-task model; its parameters are only a
    template): instance k starts at ``starts[k]`` (flat, ``parameters()`` order) and trains on
    (``xs[k]``, ``ys[k]``) with the batches of ``generators[k]``; the proximal term of
    ``cfg.prox_mu`` pulls towards ``prox_centre`` (flat; default: each instance's start). The
    model's parameters are restored afterwards. ``sum_gradients`` also returns Σ of the
    gradients of the local loss (with its proximal term, before weight decay and momentum) at the
    iterates; ``first_gradient`` the gradient of the first step."""
    saved = flat_params(model)
    args = (model, starts, xs, ys, generators, cfg, prox_centre, loss_after, sum_gradients, first_gradient)
    try:
        if batched and can_batch(model):
            return _train_batched(*args)
        return _train_sequential(*args)
    finally:
        set_flat_params(model, saved)


def _unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """(m, d) -> per parameter (m, *shape) (or (d,) -> per parameter (*shape))."""
    out, i = [], 0
    for p in like:
        part = flat[..., i:i + p.numel()]
        out.append(part.reshape(*flat.shape[:-1], *p.shape).clone())
        i += p.numel()
    return out


def _train_sequential(model, starts, xs, ys, generators, cfg, prox_centre, loss_after, sum_gradients,
                      first_gradient) -> Trained:
    """Reference path: one instance after another with ``torch.optim.SGD``."""
    m = len(starts)
    params, sums, after, firsts = [], [], [], []
    for k in range(m):
        set_flat_params(model, starts[k])
        centre = ([t.detach().clone() for t in model.parameters()] if prox_centre is None
                  else _unflatten(prox_centre, list(model.parameters())))
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        acc = [torch.zeros_like(p) for p in model.parameters()] if sum_gradients else None
        x, y = xs[k], ys[k]
        for step, idx in enumerate(batch_plan(len(y), cfg, generators[k])):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            if cfg.prox_mu:
                loss = loss + cfg.prox_mu / 2 * sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), centre))
            loss.backward()
            if acc is not None:
                for a, p in zip(acc, model.parameters()):
                    a.add_(p.grad)
            if first_gradient and step == 0:
                firsts.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
            opt.step()
        if loss_after:
            after.append(mean_losses(model, [x], [y])[0])
        params.append(flat_params(model))
        if acc is not None:
            sums.append(torch.cat([a.reshape(-1) for a in acc]))
    return Trained(torch.stack(params), torch.stack(sums) if sum_gradients else None,
                   torch.stack(after) if loss_after else None, torch.stack(firsts) if first_gradient else None)


def _stacked_losses(model, names, stacked: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """Per-instance mean losses of stacked models on (m, b, ...) inputs: fused kernels for the
    papers' Sequential models (``fairfl.stacked``), ``torch.func.vmap`` for any other model."""
    if stacked_forward.supports(model):
        logits = stacked_forward.forward(model, stacked, x)
    else:
        def one(params, xb):
            return functional_call(model, dict(zip(names, params)), (xb,))
        logits = torch.func.vmap(one, randomness="different")(stacked, x)   # (m, b, classes)
    m, b = y.shape
    return F.cross_entropy(logits.reshape(m * b, -1), y.reshape(-1), reduction="none").reshape(m, b).mean(1)


def _train_batched(model, starts, xs, ys, generators, cfg, prox_centre, loss_after, sum_gradients,
                   first_gradient) -> Trained:
    """Instances with equal sample counts share a batch schedule and train as one stack; other
    sizes form other groups."""
    names = [n for n, _ in model.named_parameters()]
    template = list(model.parameters())
    m = len(starts)
    params = torch.empty_like(starts)
    sums = torch.empty_like(starts) if sum_gradients else None
    firsts = torch.empty_like(starts) if first_gradient else None
    after = torch.empty(m) if loss_after else None
    by_size: dict[int, list[int]] = {}
    for k in range(m):
        by_size.setdefault(len(ys[k]), []).append(k)
    for rows in by_size.values():
        w = _unflatten(starts[rows], template)
        centre = (_unflatten(starts[rows], template) if prox_centre is None
                  else _unflatten(prox_centre, template))
        plans = [batch_plan(len(ys[k]), cfg, generators[k]) for k in rows]
        x = torch.stack([xs[k] for k in rows])
        y = torch.stack([ys[k] for k in rows])
        w, acc, first = _sgd_stack(model, names, w, centre, plans, x, y, cfg, sum_gradients, first_gradient)
        params[rows] = torch.cat([t.reshape(len(rows), -1) for t in w], dim=1)
        if sums is not None:
            sums[rows] = torch.cat([a.reshape(len(rows), -1) for a in acc], dim=1)
        if firsts is not None:
            firsts[rows] = torch.cat([g.reshape(len(rows), -1) for g in first], dim=1)
        if after is not None:   # each local model on its own training data, eval mode, stacked forward
            model.eval()
            with torch.no_grad():
                chunk = max(1, 4096 // max(1, len(rows)))
                per = [_stacked_losses(model, names, w, x[:, i:i + chunk], y[:, i:i + chunk]) * y[:, i:i + chunk].shape[1]
                       for i in range(0, y.shape[1], chunk)]
                after[rows] = torch.stack(per).sum(0) / y.shape[1]
            model.train()
    return Trained(params, sums, after, firsts)


def _sgd_stack(model, names, w, centre, plans, xs, ys, cfg: LocalTraining, sum_gradients: bool,
               first_gradient: bool = False):
    """SGD on a stack of instances with equal sample counts: ``torch.optim.SGD``'s update rule
    (dampening 0, no Nesterov), applied to every instance at once."""
    m = len(plans)
    bufs = [torch.zeros_like(t) for t in w] if cfg.momentum else None
    acc = [torch.zeros_like(t) for t in w] if sum_gradients else None
    first = None
    ar = torch.arange(m)[:, None]
    model.train()
    for step in range(len(plans[0])):
        idx = torch.stack([p[step] for p in plans])                   # (m, b)
        leaves = [t.requires_grad_() for t in w]
        loss = _stacked_losses(model, names, leaves, xs[ar, idx], ys[ar, idx]).sum()
        if cfg.prox_mu:
            loss = loss + cfg.prox_mu / 2 * sum(((t - g) ** 2).sum() for t, g in zip(leaves, centre))
        grads = torch.autograd.grad(loss, leaves)
        if first_gradient and step == 0:
            first = grads
        with torch.no_grad():
            new_w = []
            for i, (t, g) in enumerate(zip(leaves, grads)):
                if acc is not None:
                    acc[i].add_(g)
                if cfg.weight_decay:
                    g = g + cfg.weight_decay * t
                if bufs is not None:
                    bufs[i] = g.clone() if step == 0 else bufs[i].mul_(cfg.momentum).add_(g)
                    g = bufs[i]
                new_w.append(t.detach() - cfg.lr * g)
        w = new_w
    return w, acc, first


# ----------------------------------------------------------------------------- clients

def train_clients(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                  cfg: LocalTraining, seed: int, round_: int, batched: bool = True,
                  loss_before: bool = True, loss_after: bool = True) -> ClientUpdates:
    """The sampled clients' local training from the global model: their pseudo-gradients
    g = w_global − w_local, sample counts, and (when asked: each costs a forward pass over the
    clients' data) their mean training losses before and after."""
    set_flat_params(model, global_flat)
    before = (mean_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients])
              if loss_before else None)
    m = len(clients)
    trained = train_instances(model, global_flat.unsqueeze(0).expand(m, -1), [data[k].x_train for k in clients],
                              [data[k].y_train for k in clients],
                              [batch_generator(seed, round_, int(k)) for k in clients], cfg,
                              prox_centre=global_flat, batched=batched, loss_after=loss_after)
    out = ClientUpdates(np.asarray(clients), global_flat.unsqueeze(0) - trained.params,
                        torch.tensor([data[k].num_train for k in clients]), before, trained.loss_after)
    check_finite(out.updates, out.loss_after, clients, round_)
    return out


def gradients(model: nn.Module, point: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
              batched: bool = True) -> torch.Tensor:
    """∇fₖ(point) for each client (rows), full batch on its training data: one SGD step of
    learning rate 1 from ``point`` moves by exactly the gradient, so the batched local-training
    path computes every client's gradient in one fused pass."""
    step = LocalTraining(epochs=1, batch_size=None, lr=1.0)
    return train_clients(model, point, data, clients, step, 0, 0, batched, loss_before=False, loss_after=False).updates


def train_objectives(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                     held: torch.Tensor, cfg: LocalTraining, seed: int, round_: int, batched: bool = True,
                     loss_before: bool = True, first_gradients: bool = False) -> ClientUpdates:
    """Multi-objective local training (FMOL Algorithm 1, steps 1–3): every sampled client i
    trains, for each objective s it holds (``held[i, s]``), the objective's view of the model
    (trunk + head s) from the global model on label column s, and returns the sum of the
    gradients Δ_{s,i} = Σ_k ∇f_{s,i}(x^{t,k}) as a full-length vector (zero outside the trunk and
    head s). The (client, objective) pairs train as one stack; a client draws its minibatches from
    one generator per round, so all its objectives see the same ξ^{t,k} (Algorithm 1 gives ξ no
    objective index). ``loss_before`` is f_{s,i}(x_t) on the client's whole training data;
    ``first_gradients`` adds the first step's gradients as ``extras["first_gradients"]`` (m, S, d)
    (on full batch: ∇f_{s,i}(x_t)). ``shared`` marks the trunk's coordinates."""
    S = num_tasks(model)
    m, d = len(clients), global_flat.numel()
    views = [objective_view(model, s) for s in range(S)]
    where = [objective_indices(model, s) for s in range(S)]
    pairs = [(r, s) for r in range(m) for s in range(S) if held[r, s]]
    starts = torch.stack([global_flat[where[s]] for _, s in pairs]) if pairs else torch.empty(0, 0)
    trained = train_instances(views[0], starts, [data[clients[r]].x_train for r, _ in pairs],
                              [labels_of(data[clients[r]].y_train, s) for r, s in pairs],
                              [batch_generator(seed, round_, int(clients[r])) for r, _ in pairs], cfg,
                              batched=batched, sum_gradients=True, first_gradient=first_gradients) if pairs else None
    updates = torch.zeros(m, S, d, dtype=global_flat.dtype)
    firsts = torch.zeros(m, S, d, dtype=global_flat.dtype) if first_gradients else None
    for j, (r, s) in enumerate(pairs):
        updates[r, s, where[s]] = trained.grad_sum[j]
        if firsts is not None:
            firsts[r, s, where[s]] = trained.first_grad[j]
    before = None
    if loss_before:
        set_flat_params(model, global_flat)
        before = objective_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients])
        before = torch.where(held, before, torch.full_like(before, float("nan")))
    out = ClientUpdates(np.asarray(clients), updates, torch.tensor([data[k].num_train for k in clients]), before,
                        extras={} if firsts is None else {"first_gradients": firsts}, held=held.clone(),
                        shared=shared_mask(model))
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


def _split_means(values: torch.Tensor, sizes: list[int]) -> list[float]:
    return [float(v.mean()) if len(v) else float("nan") for v in values.split(sizes)]


@torch.no_grad()
def evaluate_model(model: nn.Module, data: Sequence[Client]) -> Evaluation:
    """Every client's test accuracy and loss, and the uniformly averaged training loss over all
    clients, at the model's current parameters in eval mode; per objective for a multi-task
    model (its objectives' views)."""
    if num_tasks(model) > 1:
        parts = [evaluate_model(objective_view(model, s), [_task_client(c, s) for c in data])
                 for s in range(num_tasks(model))]
        per_client = lambda key: [list(v) for v in zip(*(getattr(p, key) for p in parts))]
        return Evaluation(per_client("test_acc"), per_client("test_loss"), [p.train_loss for p in parts],
                          per_client("client_train_loss"))
    was_training = model.training
    model.eval()
    xs = torch.cat([c.x_test for c in data])
    ys = torch.cat([c.y_test for c in data])
    out = predict(model, xs)
    losses = F.cross_entropy(out, ys, reduction="none") if len(ys) else torch.empty(0)
    correct = (out.argmax(1) == ys).float() if len(ys) else torch.empty(0)
    sizes = [len(c.y_test) for c in data]
    train = mean_losses(model, [c.x_train for c in data], [c.y_train for c in data])
    model.train(was_training)
    return Evaluation(_split_means(correct, sizes), _split_means(losses, sizes), float(train.mean()),
                      [float(v) for v in train])


def _task_client(c: Client, task: int) -> Client:
    return Client(c.x_train, labels_of(c.y_train, task), c.x_val, labels_of(c.y_val, task),
                  c.x_test, labels_of(c.y_test, task))


# ----------------------------------------------------------------------------- the simulated clients

class ClientRuntime:
    """The clients of one run as the simulation holds them — their data, a model (only a
    template for shapes; every call sets the parameters it uses), the run's seed and the
    training path — and what an algorithm can ask of them. The round loop makes one per run,
    sets ``round`` before each round, and hands it to the algorithm's ``client_update`` and
    ``evaluate``.

    ``states`` holds each client's algorithm state (Ditto's personal model), saved in
    checkpoints; ``cache`` is scratch that an algorithm may keep between rounds to avoid
    recomputing something, never checkpointed, so it must never change a result."""

    def __init__(self, model: nn.Module, data: Sequence[Client], seed: int, batched: bool = True):
        self.model, self.data, self.seed, self.batched = model, data, seed, batched
        self.round = 0
        self.states: dict[int, object] = {}
        self.cache: dict = {}

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
        :func:`train_clients`). ``batch_round`` replaces the round in the batch-order generator
        (an algorithm that trains one round in several calls gives each its own stream)."""
        return train_clients(self.model, params, self.data, ids, local, self.seed,
                             self.round if batch_round is None else batch_round, self.batched, loss_before, loss_after)

    def train_from(self, ids: Sequence[int], starts: torch.Tensor, local: LocalTraining,
                   prox_centre: torch.Tensor | None = None, purpose: int = BATCHES) -> torch.Tensor:
        """(m, d) local models of clients ``ids`` trained from their own ``starts`` (m, d), the
        proximal term of ``local.prox_mu`` pulling towards ``prox_centre`` (Ditto's personal
        models). ``purpose`` separates this batch order from the round's ordinary one."""
        gens = [batch_generator(self.seed, self.round, int(k), purpose) for k in ids]
        trained = train_instances(self.model, starts, [self.data[k].x_train for k in ids],
                                  [self.data[k].y_train for k in ids], gens, local, prox_centre, self.batched)
        check_finite(trained.params, None, ids, self.round)
        return trained.params

    def train_objectives(self, ids: Sequence[int], params: torch.Tensor, held: torch.Tensor, local: LocalTraining,
                         loss_before: bool = True, first_gradients: bool = False) -> ClientUpdates:
        """Per-objective local training of a multi-task model (:func:`train_objectives`)."""
        return train_objectives(self.model, params, self.data, ids, held, local, self.seed, self.round,
                                self.batched, loss_before, first_gradients)

    def objective_gradients(self, point: torch.Tensor, ids: Sequence[int], held: torch.Tensor) -> torch.Tensor:
        """(m, S, d) full-batch gradients ∇f_{s,i}(point) of each held objective (one full-batch
        step, its gradient summed exactly)."""
        step = LocalTraining(steps=1, batch_size=None, lr=1.0)
        return train_objectives(self.model, point, self.data, ids, held, step, self.seed, self.round, self.batched,
                                loss_before=False).updates

    def gradients(self, point: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """(m, d) full-batch gradients of clients ``ids`` at ``point`` (:func:`gradients`)."""
        return gradients(self.model, point, self.data, ids, self.batched)

    def losses(self, params: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """Mean training loss of clients ``ids`` at ``params`` (eval mode); (m, S) per objective
        for a multi-task model."""
        set_flat_params(self.model, params)
        return objective_losses(self.model, [self.data[k].x_train for k in ids], [self.data[k].y_train for k in ids])

    def evaluate(self, params: torch.Tensor) -> Evaluation:
        """Every client evaluated at the global model ``params``."""
        set_flat_params(self.model, params)
        return evaluate_model(self.model, self.data)

    def evaluate_each(self, params: Sequence[torch.Tensor]) -> Evaluation:
        """Client k evaluated at its own model ``params[k]`` (a personalised algorithm)."""
        parts = []
        for k, p in enumerate(params):
            set_flat_params(self.model, p)
            parts.append(evaluate_model(self.model, [self.data[k]]))
        train = [p.train_loss for p in parts]
        mean_train = (float(np.mean(train)) if not isinstance(train[0], list)
                      else [float(v) for v in np.mean(np.asarray(train, dtype=np.float64), axis=0)])
        return Evaluation([p.test_acc[0] for p in parts], [p.test_loss[0] for p in parts], mean_train,
                          [p.client_train_loss[0] for p in parts])
