"""What an evaluation measures on the clients: each client's test accuracy and loss (and its
validation scores where asked for), the uniformly averaged training loss, per objective for a
multi-task model (:class:`Evaluation`, :func:`evaluate_model`, :func:`evaluation_of`), and one
Evaluation of clients evaluated one at a time at their own models (:func:`merge_evaluations`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fairfl.federated.models import num_tasks, objective_view
from fairfl.federated.partition import Client
from .forward import labels_of, mean_losses, predict


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
