"""The server step: how a server rule's direction d becomes the change of the global model,
w ← w − step. Like Optax's gradient transformations, a server optimiser is a pair of pure
functions ``init(params) -> state`` and ``update(direction, state, round, rounds) -> (step,
state, info)``, and optimisers compose with :func:`chain`::

    chain(momentum(0.9), scale_by_schedule(step_decay(1.0, decay=0.1)))

A schedule is a function ``(round, rounds) -> step size``. Every algorithm declares its server
optimiser (``Algorithm.server_optimizer``); the default is a step of 1 (the rule's direction is
already the whole step: q-FedAvg, FedFV, AFL, DQN-Fed's eq. (17)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

Schedule = Callable[[int, int], float]


def constant(lr: float) -> Schedule:
    """ηₜ = η."""
    return lambda t, rounds: lr


def step_decay(lr: float, decay: float, every: int = 100) -> Schedule:
    """FedMGDA+ §6.1.5: ηₜ = η·β^⌊t/100⌋ with β = decay^(100/T), so that the step has shrunk by
    the factor ``decay`` after the T rounds of the run (``decay = 1``: constant)."""
    def schedule(t: int, rounds: int) -> float:
        beta = decay ** (every / rounds)
        return lr * beta ** (t // every)
    return schedule


@dataclass(frozen=True)
class Transformation:
    """``init(params) -> state``; ``update(direction, state, round, rounds) -> (step, state, info)``."""

    init: Callable[[torch.Tensor], Any]
    update: Callable[[torch.Tensor, Any, int, int], tuple[torch.Tensor, Any, dict[str, float]]]


def scale_by_schedule(schedule: Schedule) -> Transformation:
    """step = ηₜ·d; logs ηₜ as ``lr``."""
    def update(direction, state, t, rounds):
        lr = schedule(t, rounds)
        return lr * direction, state, {"lr": lr}
    return Transformation(lambda params: None, update)


def momentum(beta: float) -> Transformation:
    """Server momentum (FedAvgM, Hsu et al. 2019): m ← β·m + d, step = m."""
    if not 0 <= beta < 1:
        raise ValueError(f"momentum beta must be in [0, 1), got {beta}")

    def update(direction, state, t, rounds):
        buf = direction.clone() if state is None else beta * state + direction
        return buf, buf, {}
    return Transformation(lambda params: None, update)


def chain(*transformations: Transformation) -> Transformation:
    """Apply the transformations in order; their states form a list, their logs are merged."""
    def init(params):
        return [t.init(params) for t in transformations]

    def update(direction, states, t, rounds):
        info: dict[str, float] = {}
        new_states = []
        for tr, s in zip(transformations, states):
            direction, s, more = tr.update(direction, s, t, rounds)
            new_states.append(s)
            info.update(more)
        return direction, new_states, info
    return Transformation(init, update)
