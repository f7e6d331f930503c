"""What a client does in a round: k epochs of minibatch SGD from the global model (optionally
with momentum and FedProx's proximal term), reporting the pseudo-gradient
g = w_global − w_local and its mean training loss before and after.

Two paths compute the same thing:

* :func:`train_clients_sequential` — the reference: one ``nn.Module`` and one
  ``torch.optim.SGD`` per client, in a plain loop.
* :func:`train_clients_batched` — the sampled clients of a round train together. Their
  parameters are stacked along a leading client axis; the forward pass fuses the clients into
  grouped convolutions and batched matrix products (``fairfl.stacked``; any other model goes
  through ``torch.func.vmap(functional_call)``) and one backward pass of the *sum* of the clients' mean
  losses gives every client its own gradient (the clients' losses share no parameters, so
  ∂(Σₖ Lₖ)/∂wₖ = ∂Lₖ/∂wₖ exactly). Clients with the same number of samples share a batch
  schedule and are stacked; clients of other sizes form other groups.

Both paths draw each client's batch order from the same per-client generator, so on a model
without dropout they agree to float tolerance (tested). Dropout under ``vmap`` draws from the
global torch generator, which the round loop seeds per round for determinism.

Recurrent models (the Shakespeare character LSTM) cannot be stacked: ``vmap`` has no batching
rule for ``aten::lstm`` in this torch (it raises "Batching rule not implemented for
aten::lstm.input"), so :func:`train_clients_batched` hands them to the reference loop
(:func:`can_batch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from . import stacked as stacked_forward
from .errors import ConfigError, TrainingDivergedError
from .partition import Client


@dataclass(frozen=True)
class LocalTraining:
    """Client optimiser settings. ``batch_size=None`` means full batch (one step per epoch)."""

    epochs: int = 1
    batch_size: int | None = 10
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0  # FedProx: + (μ/2)·‖w − w_global‖² in every local loss

    def validate(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"local epochs must be >= 1, got {self.epochs}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1 or None (full batch), got {self.batch_size}")
        if not self.lr > 0:
            raise ConfigError(f"local lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0 or self.prox_mu < 0:
            raise ConfigError("weight_decay and prox_mu must be >= 0")


@dataclass
class ClientUpdates:
    """What the sampled clients of one round send to the server (row k = ``clients[k]``)."""

    clients: np.ndarray            # (m,) client ids
    updates: torch.Tensor          # (m, d) pseudo-gradients g = w_global − w_local
    num_samples: torch.Tensor      # (m,) training samples per client
    loss_before: torch.Tensor | None = None  # (m,) mean training loss at w_global (eval mode)
    loss_after: torch.Tensor | None = None   # (m,) mean training loss at w_local (eval mode)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. DQN-Fed's d_k

    @property
    def m(self) -> int:
        return len(self.clients)

    def replace(self, **changes) -> "ClientUpdates":
        """A copy with some fields replaced (attacks and wrappers never mutate in place)."""
        d = dict(self.__dict__)
        d.update(changes)
        return ClientUpdates(**d)


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
    """The index batches of all local epochs: a fresh permutation per epoch, cut into batches
    of ``batch_size`` (the last one may be smaller; nothing is dropped)."""
    b = cfg.batch_size or num_samples
    plan = []
    for _ in range(cfg.epochs):
        perm = torch.randperm(num_samples, generator=generator)
        plan += list(perm.split(b))
    return plan


def client_generator(seed: int, round_: int, client: int) -> torch.Generator:
    """The generator of one client's batch order in one round: a function of (seed, round,
    client) only, so both training paths, and a resumed run, draw the same batches."""
    s = np.random.SeedSequence([seed, round_, client, 0xC11]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(s[0] >> np.uint64(1)))


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


def _check_finite(updates: torch.Tensor, losses: torch.Tensor | None, clients: Sequence[int], round_: int) -> None:
    ok = torch.isfinite(updates).all(dim=1)
    if losses is not None:
        ok &= torch.isfinite(losses)
    bad_rows = ~ok
    if bad_rows.any():
        who = [int(clients[i]) for i in torch.nonzero(bad_rows).ravel()]
        raise TrainingDivergedError(
            f"round {round_}: local training of client(s) {who} produced NaN/Inf "
            "(loss or update); lower the learning rate. The last checkpoint is kept.")


# ----------------------------------------------------------------------------- reference path

def _losses_before(model, data, clients, wanted: bool) -> torch.Tensor | None:
    if not wanted:
        return None
    return mean_losses(model, [data[k].x_train for k in clients], [data[k].y_train for k in clients])


def train_clients_sequential(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client],
                             clients: Sequence[int], cfg: LocalTraining, seed: int, round_: int,
                             loss_before: bool = True, loss_after: bool = True) -> ClientUpdates:
    """Reference path: one client after another with ``torch.optim.SGD``. The losses before
    and after cost a forward pass over the clients' data each; ask only for what is used."""
    set_flat_params(model, global_flat)
    before = _losses_before(model, data, clients, loss_before)
    global_params = [p.detach().clone() for p in model.parameters()]
    updates, after = [], []
    for k in clients:
        c = data[k]
        set_flat_params(model, global_flat)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                              weight_decay=cfg.weight_decay)
        for idx in batch_plan(c.num_train, cfg, client_generator(seed, round_, int(k))):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(c.x_train[idx]), c.y_train[idx])
            if cfg.prox_mu:
                loss = loss + cfg.prox_mu / 2 * sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), global_params))
            loss.backward()
            opt.step()
        if loss_after:
            after.append(mean_losses(model, [c.x_train], [c.y_train])[0])
        updates.append(global_flat - flat_params(model))
    set_flat_params(model, global_flat)
    out = ClientUpdates(np.asarray(clients), torch.stack(updates), torch.tensor([data[k].num_train for k in clients]),
                        before, torch.stack(after) if loss_after else None)
    _check_finite(out.updates, out.loss_after, clients, round_)
    return out


# ----------------------------------------------------------------------------- batched path

# Modules whose forward torch.func.vmap cannot batch: aten::lstm / gru / rnn have no batching
# rule and no fallback ("Batching rule not implemented for aten::lstm.input", torch 2.x).
_NOT_VMAPPABLE = (nn.RNNBase,)


def can_batch(model: nn.Module) -> bool:
    """Whether the clients' copies of ``model`` can train as one stack (fused kernels or vmap)."""
    return stacked_forward.supports(model) or not any(isinstance(m, _NOT_VMAPPABLE) for m in model.modules())


def _stacked_losses(model, names, stacked: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """Per-client mean losses of stacked models on (m, b, ...) inputs: fused kernels for the
    papers' Sequential models (``fairfl.stacked``), ``torch.func.vmap`` for any other model."""
    if stacked_forward.supports(model):
        logits = stacked_forward.forward(model, stacked, x)
    else:
        def one(params, xb):
            return functional_call(model, dict(zip(names, params)), (xb,))
        logits = torch.func.vmap(one, randomness="different")(stacked, x)   # (m, b, classes)
    m, b = y.shape
    return F.cross_entropy(logits.reshape(m * b, -1), y.reshape(-1), reduction="none").reshape(m, b).mean(1)


def _train_group(model: nn.Module, names: list[str], global_params: list[torch.Tensor],
                 group: Sequence[Client], gens: Sequence[torch.Generator], cfg: LocalTraining) -> list[torch.Tensor]:
    """SGD on a stack of clients with equal sample counts; returns the stacked local params."""
    m = len(group)
    w = [p.detach().unsqueeze(0).repeat(m, *([1] * p.dim())) for p in global_params]
    bufs = [torch.zeros_like(t) for t in w] if cfg.momentum else None
    plans = [batch_plan(c.num_train, cfg, g) for c, g in zip(group, gens)]
    xs = torch.stack([c.x_train for c in group])
    ys = torch.stack([c.y_train for c in group])
    ar = torch.arange(m)[:, None]
    model.train()
    for step in range(len(plans[0])):
        idx = torch.stack([p[step] for p in plans])                   # (m, b)
        leaves = [t.requires_grad_() for t in w]
        loss = _stacked_losses(model, names, leaves, xs[ar, idx], ys[ar, idx]).sum()
        if cfg.prox_mu:
            loss = loss + cfg.prox_mu / 2 * sum(((t - g) ** 2).sum() for t, g in zip(leaves, global_params))
        grads = torch.autograd.grad(loss, leaves)
        with torch.no_grad():  # torch.optim.SGD's update rule (dampening 0, no Nesterov)
            new_w = []
            for i, (t, g) in enumerate(zip(leaves, grads)):
                if cfg.weight_decay:
                    g = g + cfg.weight_decay * t
                if bufs is not None:
                    bufs[i] = g.clone() if step == 0 else bufs[i].mul_(cfg.momentum).add_(g)
                    g = bufs[i]
                new_w.append(t.detach() - cfg.lr * g)
        w = new_w
    return w


def train_clients_batched(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client],
                          clients: Sequence[int], cfg: LocalTraining, seed: int, round_: int,
                          loss_before: bool = True, loss_after: bool = True) -> ClientUpdates:
    """The sampled clients train together (see the module docstring). A model that cannot be
    stacked (:func:`can_batch`: an LSTM) trains through the reference loop instead, which
    computes the same updates one client at a time."""
    if not can_batch(model):
        return train_clients_sequential(model, global_flat, data, clients, cfg, seed, round_,
                                        loss_before, loss_after)
    set_flat_params(model, global_flat)
    names = [n for n, _ in model.named_parameters()]
    global_params = [p.detach() for p in model.parameters()]
    before = _losses_before(model, data, clients, loss_before)
    m = len(clients)
    updates = torch.empty(m, global_flat.numel())
    after = torch.empty(m) if loss_after else None
    by_size: dict[int, list[int]] = {}
    for row, k in enumerate(clients):
        by_size.setdefault(data[k].num_train, []).append(row)
    for rows in by_size.values():
        group = [data[clients[r]] for r in rows]
        gens = [client_generator(seed, round_, int(clients[r])) for r in rows]
        w = _train_group(model, names, global_params, group, gens, cfg)
        flat_local = torch.cat([t.reshape(len(rows), -1) for t in w], dim=1)
        updates[rows] = global_flat.unsqueeze(0) - flat_local
        if after is None:
            continue
        # loss after: each local model on its own training data, eval mode, stacked forward
        model.eval()
        with torch.no_grad():
            xs = torch.stack([c.x_train for c in group])
            ys = torch.stack([c.y_train for c in group])
            chunk = max(1, 4096 // max(1, len(rows)))
            per = [_stacked_losses(model, names, w, xs[:, i:i + chunk], ys[:, i:i + chunk]) * ys[:, i:i + chunk].shape[1]
                   for i in range(0, ys.shape[1], chunk)]
            after[rows] = torch.stack(per).sum(0) / ys.shape[1]
        model.train()
    set_flat_params(model, global_flat)
    out = ClientUpdates(np.asarray(clients), updates, torch.tensor([data[k].num_train for k in clients]),
                        before, after)
    _check_finite(out.updates, out.loss_after, clients, round_)
    return out


def train_clients(model: nn.Module, global_flat: torch.Tensor, data: Sequence[Client], clients: Sequence[int],
                  cfg: LocalTraining, seed: int, round_: int, batched: bool = True,
                  loss_before: bool = True, loss_after: bool = True) -> ClientUpdates:
    fn = train_clients_batched if batched else train_clients_sequential
    return fn(model, global_flat, data, clients, cfg, seed, round_, loss_before, loss_after)
