"""What a round's clients send to the server, and what a server rule gives back. Both sides
import this module; it imports neither (a server rule never depends on client training).

Convention everywhere: a client's update is the pseudo-gradient g = w_global − w_local, and the
server steps w ← w − ηₜ·d with the rule's direction d (FMOL's clients send their accumulated
gradients Δ instead, see ``fairfl.federated.algorithms.fmgda``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch


@dataclass
class ClientUpdates:
    """What the sampled clients of one round send (row k = ``clients[k]``).

    A multi-objective round (FMOL) adds an objective axis: ``updates`` is (m, S, d) with one
    update per objective, the losses (m, S), and ``held`` (m, S) says which objectives each
    client holds (FMOL's indicator matrix A, rows of the sampled clients); entries of objectives a
    client does not hold are zero and never read. ``shared`` marks the coordinates that every
    objective moves (a multi-task model's trunk; a head's coordinates are zero in the other
    objectives' updates)."""

    clients: np.ndarray                      # (m,) client ids
    updates: torch.Tensor                    # (m, d), or (m, S, d) for several objectives
    num_samples: torch.Tensor                # (m,) training samples per client
    loss_before: torch.Tensor | None = None  # (m,) [or (m, S)] mean training loss at w_global (eval mode)
    loss_after: torch.Tensor | None = None   # (m,) [or (m, S)] mean training loss at w_local (eval mode)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)   # e.g. DQN-Fed's d_k
    held: torch.Tensor | None = None         # (m, S) bool, multi-objective rounds only
    shared: torch.Tensor | None = None       # (d,) bool: the coordinates every objective moves (the trunk)

    @property
    def m(self) -> int:
        return len(self.clients)

    @property
    def num_objectives(self) -> int:
        """S: 1 for an ordinary round."""
        return self.updates.shape[1] if self.updates.ndim == 3 else 1

    def replace(self, **changes) -> "ClientUpdates":
        """A copy with some fields replaced (attacks and wrappers never mutate in place)."""
        return replace(self, **changes)


@dataclass
class Aggregate:
    """A server rule's answer: the direction d (the server then steps w ← w − ηₜ·d), its new
    state, scalars (or short vectors) logged per round, and the client weights it used."""

    direction: torch.Tensor                  # (d,)
    state: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    weights: torch.Tensor | None = None      # (m,) the λ used, when the rule has one

