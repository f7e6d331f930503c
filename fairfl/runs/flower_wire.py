"""What crosses the wire between fairfl's Flower strategy and its nodes (``fairfl.runs.flower``), as
Flower's records.

Wire format (Flower's records; each choice is forced by what a record may hold):

* the global model: an ``ArrayRecord`` of the model's named parameters (``"arrays"``);
* the round's orders: a ``ConfigRecord`` (``"config"``): the round, the local training (a
  ``batch_size``/``steps`` of None is left out: a ConfigRecord holds no None) and which losses to
  report; tensors sent with the plan (DQN-Fed's θᵗ⁻¹, Ditto's w⁰) in an ``ArrayRecord``
  (``"plan"``);
* a client's report: per-client arrays in an ``ArrayRecord`` (``"report"``: the update, (d,) or
  (S, d) for FMOL, and any per-objective losses, masks and extras), per-client scalars in a
  ``MetricRecord`` (``"metrics"``: ``client-id``, ``num-examples``, the losses, DQN-Fed's
  ``extra.dqn_d`` and, for its safeguard, ``extra.dqn_curvature`` and ``extra.dqn_scale``). A
  MetricRecord holds Python floats: scalars arrive as float64, which every rule reads in float64
  anyway (the float32 → float64 conversion is exact);
* a client's state across rounds (Ditto's personal model) stays on its node, in the node's
  ``Context.state``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import torch

from fairfl.federated.algorithms.base import Context, RoundPlan
from fairfl.training.client import LocalTraining
from fairfl.base.errors import ConfigError, RunFailedError
from fairfl.federated.messages import ClientUpdates

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
except ImportError as e:  # pragma: no cover - flwr is in requirements.txt
    raise ImportError("fairfl.runs.flower_wire needs Flower: pip install 'flwr[simulation]' (pinned in requirements.txt)") from e

RUN_KEY = "fairfl-run"          # which experiment a message belongs to (one ClientApp may serve several)


# ----------------------------------------------------------------------------- model <-> records

def parameter_names(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def to_arrays(model: torch.nn.Module, flat: torch.Tensor) -> ArrayRecord:
    """A flat parameter vector as Flower's ArrayRecord of the model's named parameters."""
    out, i = {}, 0
    for name, p in model.named_parameters():
        out[name] = Array(flat[i:i + p.numel()].reshape(p.shape).detach().cpu().numpy())
        i += p.numel()
    return ArrayRecord(out)


def from_arrays(model: torch.nn.Module, record: ArrayRecord) -> torch.Tensor:
    """The flat parameter vector (``parameters()`` order) of an ArrayRecord of named parameters."""
    names = parameter_names(model)
    if sorted(record.keys()) != sorted(names):
        raise ConfigError(f"the message's arrays {sorted(record.keys())} are not this model's parameters {sorted(names)}")
    return torch.cat([torch.from_numpy(np.array(record[name].numpy())).reshape(-1) for name in names])


def tensor_record(tensors: dict[str, Any]) -> ArrayRecord:
    return ArrayRecord({k: Array(torch.as_tensor(v).detach().cpu().numpy()) for k, v in tensors.items()})


def tensors_of(record: ArrayRecord | None) -> dict[str, torch.Tensor]:
    return {} if record is None else {k: torch.from_numpy(np.array(record[k].numpy())) for k in record.keys()}


# ----------------------------------------------------------------------------- the plan on the wire

def plan_config(ctx: Context, plan: RoundPlan, run: str) -> tuple[ConfigRecord, ArrayRecord]:
    cfg = {RUN_KEY: run, "fairfl-round": int(ctx.round), "loss-before": bool(plan.loss_before),
           "loss-after": bool(plan.loss_after)}
    for f in dataclasses.fields(plan.local):
        value = getattr(plan.local, f.name)
        if value is not None:           # a ConfigRecord holds no None: absent means None
            cfg[f"local.{f.name}"] = value
    tensors, none = {}, []
    for k, v in plan.extras.items():
        if v is None:
            none.append(k)
        elif isinstance(v, torch.Tensor):
            tensors[k] = v
        else:
            raise ConfigError(f"plan extra {k!r} is a {type(v).__name__}: only tensors (or None) travel to the clients")
    if none:
        cfg["plan.none"] = none
    return ConfigRecord(cfg), tensor_record(tensors)


def plan_from(content: RecordDict, client: int) -> tuple[int, RoundPlan]:
    cfg = content["config"]
    local = LocalTraining(**{f.name: cfg[f"local.{f.name}"] if f"local.{f.name}" in cfg else None
                             for f in dataclasses.fields(LocalTraining)})
    extras: dict[str, Any] = dict(tensors_of(content.get("plan")))
    for k in cfg.get("plan.none", []):
        extras[k] = None
    plan = RoundPlan(np.asarray([client]), local, bool(cfg["loss-before"]), bool(cfg["loss-after"]), extras)
    return int(cfg["fairfl-round"]), plan


# ----------------------------------------------------------------------------- a report on the wire

def report_fields(reports: ClientUpdates) -> dict[str, torch.Tensor | None]:
    return {"update": reports.updates, "loss-before": reports.loss_before, "loss-after": reports.loss_after,
            "held": reports.held, **{f"extra.{k}": v for k, v in reports.extras.items()}}


def encode_report(reports: ClientUpdates) -> RecordDict:
    """One client's row of ClientUpdates as Flower records: per-client scalars in a MetricRecord,
    everything with a shape (its update, per-objective values) in an ArrayRecord."""
    if reports.m != 1:
        raise ValueError(f"a node reports one client, got {reports.m}")
    metrics: dict[str, Any] = {"client-id": int(reports.clients[0]), "num-examples": int(reports.num_samples[0])}
    arrays: dict[str, torch.Tensor] = {}
    for name, value in report_fields(reports).items():
        if value is None:
            continue
        row = value[0]
        if row.ndim == 0 and row.dtype != torch.bool:
            metrics[name] = float(row)
        else:
            arrays[name] = row
    if reports.shared is not None:
        arrays["shared"] = reports.shared
    return RecordDict({"report": tensor_record(arrays), "metrics": MetricRecord(metrics)})


def decode_reports(contents: Sequence[RecordDict], order: Sequence[int]) -> ClientUpdates:
    """The round's ClientUpdates from the clients' replies, rows in ``order`` (the plan's order,
    which is the loop's)."""
    by_client = {int(c["metrics"]["client-id"]): c for c in contents}
    missing = [int(k) for k in order if int(k) not in by_client]
    if missing:
        raise RunFailedError(f"client(s) {missing} did not report")
    rows = [by_client[int(k)] for k in order]
    arrays = [tensors_of(r["report"]) for r in rows]
    metrics = [r["metrics"] for r in rows]
    names = set(arrays[0]) | {k for k in metrics[0] if k not in ("client-id", "num-examples")}

    def stacked(name: str) -> torch.Tensor | None:
        if name not in names:
            return None
        if name in arrays[0]:
            return torch.stack([a[name] for a in arrays])
        return torch.tensor([float(m[name]) for m in metrics], dtype=torch.float64)

    extras = {n[len("extra."):]: stacked(n) for n in sorted(names) if n.startswith("extra.")}
    return ClientUpdates(np.asarray(order), stacked("update"),
                         torch.tensor([int(m["num-examples"]) for m in metrics]),
                         stacked("loss-before"), stacked("loss-after"), extras, stacked("held"),
                         arrays[0].get("shared"))
