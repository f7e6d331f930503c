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

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping

import torch

from fairfl.base.errors import ConfigError
from .messages import ClientUpdates
from fairfl.base.validation import option, validate_options


@dataclass(frozen=True)
class BiasAttack:
    """The client adds ``bias`` to the loss it reports: to its mean loss (``target="mean"``), or to
    its summed loss (``"total"``, i.e. bias / nₖ on the mean, FedMGDA+ Table 7's caption)."""

    kind: ClassVar[str] = "bias"
    client: int = option(0, low=0)
    bias: float = option(0.0)
    target: str = option("mean", choices=("mean", "total"))
    every_round: bool = option(True, doc="the attacker participates in every round")

    def __post_init__(self):
        validate_options(self, "bias attack")

    def apply(self, reports: ClientUpdates) -> ClientUpdates:
        shift = _attacker_rows(reports, self.client, 0.0, lambda r: self.bias / float(reports.num_samples[r])
                               if self.target == "total" else self.bias)
        if shift is None:
            return reports
        return reports.replace(**{k: _shift(getattr(reports, k), shift) for k in ("loss_before", "loss_after")})


@dataclass(frozen=True)
class ScalingAttack:
    """The client multiplies its loss, hence its update, by ``factor``."""

    kind: ClassVar[str] = "scaling"
    client: int = option(0, low=0)
    factor: float = option(1.0, low=0.0, low_open=True)
    every_round: bool = option(True, doc="the attacker participates in every round")

    def __post_init__(self):
        validate_options(self, "scaling attack")

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
    """From a config entry such as ``{"kind": "bias", "client": 1, "bias": 10000, "target": "total"}``."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"an attack must be a mapping such as {{'kind': 'bias', 'client': 1, 'bias': 1.0}}, got {spec!r}")
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(f"attack kind {kind!r} is not one of {', '.join(KINDS)}")
    cls = KINDS[kind]
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(spec) - set(allowed), key=str)
    if unknown:
        # YAML 1.1 reads a bare key `on` as True
        hint = " (the bias attack's 'on' is now called 'target')" if "on" in unknown or True in unknown else ""
        raise ConfigError(f"{kind} attack: unknown option(s) {', '.join(map(str, unknown))}{hint}; its options are: "
                          f"{', '.join(allowed)}")
    missing = [n for n in ("client", "bias" if kind == "bias" else "factor") if n not in spec]
    if missing:
        raise ConfigError(f"{kind} attack: {', '.join(missing)} must be given")
    return cls(**spec)


def attack_spec(attack: Attack) -> dict[str, Any]:
    """The canonical config entry of an attack (every option, in its canonical type)."""
    return {"kind": attack.kind, **{f.name: getattr(attack, f.name) for f in fields(attack)}}


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
