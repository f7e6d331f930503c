"""The server half of a round, written once for every place a round runs (the round loop,
``fairfl.runs.loop``, and Flower's strategy, ``fairfl.runs.flower``): the rule aggregates the reports into a
direction d, the server optimiser turns d into the step (its schedule, ``fairfl.federated.schedules``), the
global model moves w ← w − step, and the round is recorded in the run's history. A NaN or Inf
direction or model stops the run with one named error, before anything is recorded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from fairfl.federated.algorithms.base import Algorithm, Context
from fairfl.base.errors import TrainingDivergedError
from .history import History
from fairfl.federated.messages import ClientUpdates


@dataclass(frozen=True)
class ServerRound:
    """What the server half of round ``ctx.round`` leaves: the new global model, the rule's and
    the optimiser's states, the step size used and the rule's log."""

    params: torch.Tensor
    state: Any
    optimizer: Any
    lr: float
    info: Mapping[str, Any]


def server_half(algorithm: Algorithm, optimizer, reports: ClientUpdates, state: Any, optimizer_state: Any,
                 ctx: Context, rounds: int) -> ServerRound:
    """Aggregate ``reports`` (those the server received, attacks included) and step from
    ``ctx.params``."""
    agg = algorithm.aggregate(reports, state, ctx)
    if not torch.isfinite(agg.direction).all():
        raise TrainingDivergedError(f"round {ctx.round}: {algorithm.name} produced a NaN/Inf direction; "
                                    "the last checkpoint is kept")
    step, optimizer_state, info = optimizer.update(agg.direction, optimizer_state, ctx.round, rounds)
    params = ctx.params - step
    if not torch.isfinite(params).all():
        raise TrainingDivergedError(f"round {ctx.round}: the server step made the global model NaN/Inf; "
                                    "the last checkpoint is kept")
    return ServerRound(params, agg.state, optimizer_state, float(info.get("lr", 1.0)), agg.info)


def record_round(history: History, done: ServerRound, clients: Sequence[int], improved: float = float("nan"),
                 seconds: float | None = None) -> dict[str, float]:
    """Record a round's step size, its share of improved participants (NaN: not measured), its
    clients and the rule's log; returns the log's scalars (what Flower reports as metrics)."""
    history.round_lr.append(done.lr)
    history.round_improved.append(improved)
    history.sampled.append([int(k) for k in clients])
    scalars = {}
    for k, v in done.info.items():
        history.info.setdefault(k, []).append(float(v) if np.ndim(v) == 0 else np.asarray(v, float).tolist())
        if np.ndim(v) == 0:
            scalars[k] = float(v)
    if seconds is not None:
        history.round_time.append(seconds)
    return scalars
