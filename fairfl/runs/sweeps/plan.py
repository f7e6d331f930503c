"""How a sweep's uncached runs are dealt into lockstep groups: runs of one *family* (same data,
model, local steps and device) on one partition together, at most :data:`MAX_GROUP` a group, cut
and ordered by each run's expected cost (:func:`expected_cost`) scaled by the rate each family
measured in the last sweeps into the same results folder (:data:`RATES_FILE`)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from fairfl.base.atomic import atomic_write
from ..cache import results_folder
from ..config import ExperimentConfig
from fairfl.training.engine import schedule_key
from fairfl.base.errors import FairFLError


# Runs of one family — same data, model and shape of local training — share their fused steps best.
# A group is at most this many runs (memory: each holds its own model, state and history). A GPU
# needs many instances per step to be busy (a stacked step of the Table 3 CNN was measured to fill
# an H100 only near 600 instances); a 2-core CPU gains little beyond a few hundred.
MAX_GROUP = {"cpu": 32, "cuda": 512}


def _family(config: ExperimentConfig) -> str:
    """Runs of one family share lockstep groups: what the engine's rule of fusion
    (``fairfl.training.engine.fusion_key``) asks of their jobs, read off a config — the architecture (by its
    data and model) and the steps (``fairfl.training.engine.schedule_key``). Runs that differ only in the kind
    of update (momentum, weight decay, proximal term) still share a group: each of its executions
    trains their stacks side by side."""
    return json.dumps([config.dataset, dict(config.dataset_options), config.model, dict(config.model_options),
                       *schedule_key(config.local), config.batched, config.device_type], sort_keys=True, default=str)


def _partition_key(config: ExperimentConfig, seed: bool = True) -> str:
    partition = config.to_dict()["partition"]
    return json.dumps(partition if seed else {k: v for k, v in partition.items() if k != "seed"},
                      sort_keys=True, default=str)


def expected_cost(config: ExperimentConfig) -> float:
    """A run's work relative to the other runs of its family (which share data, model and local
    steps, :func:`_family`), in client-epochs: its rounds × clients per round × local passes, plus its
    evaluations, each a forward pass over every client's data (about a third of a training pass).
    An estimate from the config alone: it cannot see an algorithm's own work (a second-order method's
    Hessians) nor compare two families (an epoch of Adult at b = 10 is hundreds of steps, one of
    Fashion-MNIST's shards at b = 50 twelve): :func:`plan_groups` scales it by each family's measured
    rate (:func:`measured_rates`), and the cores of workers that finish early are lent to those still
    training (``fairfl.training.engine.cores.CoreBank``)."""
    passes = config.local.epochs if config.local.steps is None else 1
    evaluations = config.rounds // max(1, config.eval_every) + 1
    return config.rounds * config.num_sampled * passes + evaluations * config.partition.federation_size / 3


# What a sweep measured of each family's cost (CPU seconds per unit of expected_cost), kept in the
# results folder so that the next sweep — the next cell, the next session — cuts and orders its groups
# by seconds, not by client-epochs that differ 100-fold between families. Only the order and the cut of
# groups read it: a run's result never depends on it (tests/test_executor.py).
RATES_FILE = ".sweep-rates.json"


def rate_key(config: ExperimentConfig) -> str:
    """A family on one kind of partition: the partition without its seed (notebook 06 redraws each
    seed's partition, whose runs cost alike)."""
    return _family(config) + _partition_key(config, seed=False)


def measured_rates(root: Path | None = None) -> dict[str, float]:
    """The rates the sweeps into ``root`` measured ({} where none did, or the file is unreadable:
    it is a hint, never a result)."""
    try:
        data = json.loads((results_folder(root) / RATES_FILE).read_text())
        return {str(k): float(v) for k, v in data.items() if float(v) > 0}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def remember_rates(measured: dict[str, list[float]], root: Path | None) -> None:
    """Blend this sweep's rates (per key, CPU seconds over expected cost of each group) into the file,
    half old, half new."""
    if not measured:
        return
    rates = measured_rates(root)
    for key, values in measured.items():
        new = sum(values) / len(values)
        rates[key] = new if key not in rates else (rates[key] + new) / 2
    try:
        atomic_write(results_folder(root) / RATES_FILE,
                     lambda p: Path(p).write_text(json.dumps(rates, sort_keys=True, indent=0)))
    except FairFLError:
        pass                 # a read-only results folder: the next sweep plans by client-epochs


def plan_groups(configs: Sequence[ExperimentConfig], slots: int, max_group: int | None = None,
                rates: dict[str, float] | None = None) -> list[list[int]]:
    """Indices of ``configs`` in lockstep groups: runs of one family on one partition together, each cut into
    enough groups to keep ``slots`` workers busy (in proportion to its share of the runs) and none
    larger than ``max_group`` (default: :data:`MAX_GROUP` of the family's device); members dealt out
    longest first to the group with the least expected work (:func:`expected_cost`, in seconds where
    ``rates`` has the family's measured rate), so that the groups of a family cost alike. With several
    slots and every family's rate measured, no group is expected to cost more than a 2 × slots-th of
    the sweep (where its family has two runs a group to spare): the last groups to start are then
    short, and none runs on alone for long after the others are done. A family that is not ``batched`` (the reference loop, which fuses
    nothing) goes out as single runs. The costliest groups first: a pool takes them in this order,
    and the short ones fill in at the end."""
    # Within a family, the runs of one partition go together: a group then holds its data once and
    # gathers each step's batches from one pool. Dealt across groups, notebook 06's ten seeds (each its
    # own partition) put ten partitions of Fashion-MNIST in every group, and two workers filled 24 GB.
    families: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        families.setdefault(_family(c) + _partition_key(c), []).append(i)
    rates = rates or {}
    keys = [rate_key(c) for c in configs]
    known = sorted(rates[k] for k in set(keys) if k in rates)
    fallback = known[len(known) // 2] if known else 1.0     # a family not measured yet: a typical one
    cost = [expected_cost(c) * rates.get(k, fallback) for c, k in zip(configs, keys)]
    # the cut by cost needs costs that compare across families: every family measured (notebook 06's
    # first sweep, cut by client-epochs, left one worker alone for 98 s of 571)
    measured = slots > 1 and all(k in rates for k in keys)
    target = sum(cost) / (2 * slots) if measured else float("inf")
    groups = []
    for members in families.values():
        if not configs[members[0]].batched:
            # nothing fuses in the reference loop, so a group would only train its runs one after another:
            # single runs let the workers balance to the last run (a worker loads the data once, fairfl.runs.loop)
            groups += [[i] for i in members]
            continue
        cap = max_group or MAX_GROUP[configs[members[0]].device_type]
        k = max(-(-len(members) // cap), round(slots * len(members) / max(1, len(configs))), 1)
        # notebook 06's 18 extension runs on Adult cost 121 CPU-seconds of the sweep's 307 in one group,
        # which ran on alone for 36 s after the other worker was done (it fuses too little to use a lent core)
        if target < float("inf"):
            need = math.ceil(sum(cost[i] for i in members) / target - 1e-9)     # groups of at most `target`
            k = max(k, min(need, len(members) // 2))
        k = min(k, len(members))
        cut: list[list[int]] = [[] for _ in range(k)]
        load = [0.0] * k
        for i in sorted(members, key=lambda i: (-cost[i], i)):       # longest processing time first
            g = min((g for g in range(k) if len(cut[g]) < cap), key=lambda g: (load[g], g))
            cut[g].append(i)
            load[g] += cost[i]
        groups += [sorted(g) for g in cut if g]
    return sorted(groups, key=lambda g: (-sum(cost[i] for i in g), g[0]))
