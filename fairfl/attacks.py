"""Malicious clients that inflate their loss (FedMGDA+ §6.2.2).

An attack rewrites what one client reports to the server, after its honest local training and
before aggregation; the loop never mutates the honest reports (the share of improved
participants is measured on the true losses).

* :class:`BiasAttack` — the client adds a constant to the loss it reports. Gradients and
  updates are unchanged, so only rules that use reported losses (AFL's λ, q-FedAvg's
  Fₖ^q weights) can be affected; FedAvg and FedMGDA+ are not, bit for bit.
* :class:`ScalingAttack` — the client multiplies its loss by a constant, hence its update.
  **Choice:** we scale the reported update and losses; with k = 1 full-batch local step this
  equals training on the scaled loss, with several local SGD steps it is the paper's "hence its
  update" taken literally (the local trajectory itself is not re-run with a c-times larger
  step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .errors import ConfigError
from .messages import ClientUpdates


@dataclass(frozen=True)
class BiasAttack:
    client: int
    bias: float
    on: str = "mean"          # "total": the bias is added to the summed loss, i.e. bias / nₖ on the mean
    every_round: bool = True  # the attacker participates in every round

    def __post_init__(self):
        if self.on not in ("mean", "total"):
            raise ConfigError(f"bias attack on={self.on!r} is not 'mean' or 'total'")

    def apply(self, reports: ClientUpdates) -> ClientUpdates:
        shift = _attacker_rows(reports, self.client, 0.0, lambda r: self.bias / float(reports.num_samples[r])
                               if self.on == "total" else self.bias)
        if shift is None:
            return reports
        return reports.replace(**{k: _shift(getattr(reports, k), shift) for k in ("loss_before", "loss_after")})


@dataclass(frozen=True)
class ScalingAttack:
    client: int
    factor: float
    every_round: bool = True

    def __post_init__(self):
        if not self.factor > 0:
            raise ConfigError(f"scaling attack factor must be > 0, got {self.factor}")

    def apply(self, reports: ClientUpdates) -> ClientUpdates:
        scale = _attacker_rows(reports, self.client, 1.0, lambda r: self.factor)
        if scale is None:
            return reports
        updates = reports.updates * scale.to(reports.updates.dtype).unsqueeze(1)
        losses = {k: None if getattr(reports, k) is None else (getattr(reports, k).double() * scale).to(getattr(reports, k).dtype)
                  for k in ("loss_before", "loss_after")}
        return reports.replace(updates=updates, **losses)


Attack = BiasAttack | ScalingAttack
KINDS = {"bias": BiasAttack, "scaling": ScalingAttack}


def make_attack(spec: Mapping[str, Any]) -> Attack:
    """From a config entry such as ``{"kind": "bias", "client": 1, "bias": 10000, "on": "total"}``."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(f"attack kind {kind!r} is not one of {', '.join(KINDS)}")
    try:
        return KINDS[kind](**spec)
    except TypeError as e:
        raise ConfigError(f"bad options for a {kind} attack: {e}") from None


def _attacker_rows(reports: ClientUpdates, client: int, default: float, value) -> torch.Tensor | None:
    """A per-row float64 vector: ``value(row)`` on the attacker's rows, ``default`` elsewhere;
    None if the attacker did not take part in this round."""
    rows = [i for i, k in enumerate(reports.clients) if int(k) == client]
    if not rows:
        return None
    v = torch.full((reports.m,), default, dtype=torch.float64)
    for r in rows:
        v[r] = value(r)
    return v


def _shift(losses: torch.Tensor | None, shift: torch.Tensor) -> torch.Tensor | None:
    return None if losses is None else (losses.double() + shift).to(losses.dtype)
