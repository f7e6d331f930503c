"""The aggregator interface.

An aggregator is the server's rule for turning the sampled clients' reports into one
direction d; the round loop then steps w ← w − ηₜ·d. Like an Optax transformation it is a pair
of functions with explicit state and no hidden globals:

* ``init(num_params, num_clients) -> state`` — a dict of tensors / numbers (saved in
  checkpoints; FedFV keeps its gradient history here, AFL its λ);
* ``aggregate(reports, state, round, params) -> Aggregate(direction, state, info)``, where
  ``params`` is the current global model as a flat vector (as Optax passes ``params`` to the
  transformations that need them);
* ``eval_params(state, params)`` — the model to evaluate (AFL reports its averaged iterate;
  every other rule the current model).

``requires`` names what the clients must report beyond their updates (``"loss_before"`` for
q-FedAvg, FedFV and AFL; extra client outputs such as DQN-Fed's ``dₖ`` arrive in
``reports.extras``), so that the loop computes only what is used. Algorithms whose clients do
something special (FedProx's proximal term, DQN-Fed's BFGS, FMOL's per-objective steps) say so
through :class:`~fairfl.algorithms.Algorithm`, not through special cases in the loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..local import ClientUpdates

State = dict[str, Any]


@dataclass
class Aggregate:
    direction: torch.Tensor                       # (d,) the server steps w ← w − ηₜ·direction
    state: State
    info: dict[str, float] = field(default_factory=dict)   # scalars logged per round
    weights: torch.Tensor | None = None           # (m,) the λ used, when the rule has one


class Aggregator:
    """Base class: subclasses set ``name`` and implement :meth:`aggregate`."""

    name: ClassVar[str] = "aggregator"
    requires: ClassVar[frozenset[str]] = frozenset()

    def init(self, num_params: int, num_clients: int) -> State:
        return {}

    def aggregate(self, reports: ClientUpdates, state: State, round_: int,
                  params: torch.Tensor | None = None) -> Aggregate:
        raise NotImplementedError

    def eval_params(self, state: State, params: torch.Tensor) -> torch.Tensor:
        return params

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def row_norms(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖gᵢ‖, gᵢ / maxⱼ|gᵢⱼ|): norms computed on rows rescaled by their largest entry, so that
    neither 1e30 (the sum of squares overflows float32) nor 1e-30 (it underflows) is lost."""
    peak = g.abs().amax(dim=1, keepdim=True)
    scaled = g / torch.where(peak > 0, peak, torch.ones_like(peak))
    return peak.squeeze(1) * scaled.norm(dim=1), scaled


def normalise_rows(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-normalise each row; a zero row stays zero instead of becoming NaN (the FedMGDA+
    code's unguarded division; REPRODUCTION.md, known traps). Any non-zero finite row, however
    large or small, keeps its direction. Returns (unit rows, norms)."""
    norms, scaled = row_norms(g)
    scaled_norms = scaled.norm(dim=1, keepdim=True)
    unit = scaled / torch.where(scaled_norms > 0, scaled_norms, torch.ones_like(scaled_norms))
    return unit, norms
