"""The reference path of local training: one instance after another, each an ``nn.Module`` with
``torch.optim.SGD``. It runs ``batched=False`` and what cannot be stacked (a recurrent model other
than the character LSTM) and is what the fused path is tested against (to float tolerance; bit for
bit where the kernels agree: never for the character LSTM, whose ``nn.LSTM`` is oneDNN's fused cell
on a CPU).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from fairfl.federated import stacked as stacked_forward
from . import cores
from .jobs import LOSS_CHUNK, Job, Trained, set_flat_params, unflatten


def train_sequential(job: Job) -> Trained:
    """One instance after another, each an ``nn.Module`` with ``torch.optim.SGD``; dropout draws
    the masks of the instance's stream (``fairfl.federated.stacked.keyed_dropout``). On a CPU the instances
    are shared out over the threads the process may use (``fairfl.training.engine.cores``), each thread with
    its own copy of the module (the instances set its parameters) and one intra-op thread: an
    instance's arithmetic is its own, so the bits are those of one thread."""
    m = len(job.starts)
    width = min(m, cores.threads()) if job.starts.device.type == "cpu" else 1
    if width <= 1:
        with cores.one_thread():
            parts = [_train_instances(job, job.model, range(m))]
        order = list(range(m))
    else:
        # instances dealt out in turn (their costs are alike: one epoch each, or the same steps)
        shares = [list(range(i, m, width)) for i in range(width)]
        costs = [sum(job.sources[k].size for k in share) for share in shares]
        parts = cores.parallel([lambda share=share: _train_instances(job, copy.deepcopy(job.model), share)
                                for share in shares], costs, width)
        order = [k for share in shares for k in share]
    where = {k: i for i, k in enumerate(order)}
    pick = [where[k] for k in range(m)]

    def gather(field: int) -> torch.Tensor | None:
        rows = [row for part in parts for row in part[field]]
        return torch.stack([rows[i] for i in pick]) if rows else None
    return Trained(gather(0), gather(1) if job.sum_gradients else None, gather(2) if job.loss_after else None,
                   gather(3) if job.first_gradient else None)


def _train_instances(job: Job, model: nn.Module, which) -> tuple[list, list, list, list]:
    """Instances ``which`` of ``job`` trained one after another on ``model`` (restored afterwards):
    per instance its parameters, summed gradients, loss after training and first gradient."""
    cfg = job.local
    saved = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    params, sums, after, firsts = [], [], [], []
    try:
        with stacked_forward.keyed_dropout(model) as dropout:
            for k in which:
                source, stream, plan = job.sources[k], job.streams[k], job.plans[k]
                set_flat_params(model, job.starts[k])
                centre = ([t.detach().clone() for t in model.parameters()] if job.prox_centre is None
                          else unflatten(job.prox_centre, list(model.parameters())))
                model.train()
                opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
                acc = [torch.zeros_like(p) for p in model.parameters()] if job.sum_gradients else None
                x, y = source.data()
                dropout["key"] = stream.key
                for step, idx in enumerate(plan):
                    dropout["step"] = step
                    idx = idx.to(x.device)
                    opt.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(x[idx]), y[idx])
                    if cfg.prox_mu:
                        loss = loss + cfg.prox_mu / 2 * sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), centre))
                    loss.backward()
                    if acc is not None:
                        for a, p in zip(acc, model.parameters()):
                            a.add_(p.grad)
                    if job.first_gradient and step == 0:
                        firsts.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
                    opt.step()
                if job.loss_after:
                    model.eval()
                    with torch.no_grad():
                        after.append(_sequential_loss(model, x, y))
                    model.train()
                params.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone())
                if acc is not None:
                    sums.append(torch.cat([a.reshape(-1) for a in acc]))
    finally:
        set_flat_params(model, saved)
    return params, sums, after, firsts


def _sequential_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    total = sum(F.cross_entropy(model(x[i:i + LOSS_CHUNK]), y[i:i + LOSS_CHUNK], reduction="sum")
                for i in range(0, len(y), LOSS_CHUNK))
    return total / len(y)
