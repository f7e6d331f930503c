"""One model's forward passes over clients' data: its parameters as one flat vector, the device it
is on, its logits on many inputs in chunks (through the fused channels-last forward where the
model allows it), and its mean losses per dataset (and per objective of a multi-task model)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fairfl.federated import stacked as stacked_forward
from ..engine import map_chunks, predict_stack
from fairfl.federated.models import num_tasks, objective_view


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


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
