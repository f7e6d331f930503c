"""Second-order quantities of the clients' mean training losses, for the second-order methods
(FedNL, FedNew): Hessian-vector products by double backward (optionally on a subsample of a
client's rows) and dense Hessians (``torch.func.hessian``, one thread at a time: :data:`FORWARD_AD`),
computed in chunks of a client's data in eval mode and returned on the CPU."""
from __future__ import annotations

import threading
import warnings
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fairfl.federated.models import num_tasks
from fairfl.federated.partition import Client
from .forward import device_of


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
    device = device_of(model)
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
