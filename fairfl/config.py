"""One experiment = one frozen, validated :class:`ExperimentConfig`. Its hash names its cache
folder, so a notebook re-plots without retraining and a changed setting never reuses a stale
result.

The algorithm is an object with its own typed options (``fairfl.algorithms``):
``ExperimentConfig(algorithm=FedMGDAPlus(eps=0.1, server_lr=1.0, decay=0.1))``; a name
(``algorithm="fedavg"``) or a mapping (``{"name": "fedfv", "alpha": 0.5}``, the form of a YAML
file) is turned into one at construction."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .algorithms import Algorithm, make_algorithm
from .attacks import make_attack
from .client import LocalTraining
from .data import check_dataset_name
from .errors import ConfigError
from .models import check_model_name
from .partition import PartitionSpec

# Bump when a change of the code changes what a config computes, so that no stale result is read.
# 2: one round loop for every algorithm (the algorithm's options and server step in its own object).
CACHE_VERSION = 2


@dataclass(frozen=True)
class ExperimentConfig:
    dataset: str = "fashion_mnist"
    dataset_options: Mapping[str, Any] = field(default_factory=dict)
    partition: PartitionSpec = PartitionSpec()
    model: str = "cnn_fmnist"
    model_options: Mapping[str, Any] = field(default_factory=dict)
    algorithm: Algorithm = "fedavg"     # an Algorithm, or its name / {"name": ..., option: ...}
    local: LocalTraining = LocalTraining()
    rounds: int = 100
    participation: float = 0.1          # p: share of clients sampled per round
    clients_per_round: int | None = None  # overrides participation when set
    eval_every: int = 10
    seed: int = 0                       # training seed (the partition has its own)
    batched: bool = True                # train a round's clients together (False: reference loop)
    track_improved: bool = True         # share of participants whose loss did not increase
    checkpoint_every: int = 50
    eligible_clients: tuple[int, ...] | None = None  # only these may be sampled (e.g. the PhD-only baseline)
    attacks: tuple[Mapping[str, Any], ...] = ()     # e.g. ({"kind": "bias", "client": 1, "bias": 1.0},)

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", make_algorithm(self.algorithm))

    # ------------------------------------------------------------------ validation
    def validate(self) -> "ExperimentConfig":
        """Check every parameter before any data is loaded; raise one ConfigError naming the
        problem. Returns self, so ``cfg = ExperimentConfig(...).validate()`` reads well."""
        for obj, where in ((self, ""), (self.partition, "partition."), (self.local, "local.")):
            check_number_fields(obj, where)
        check_dataset_name(self.dataset)
        check_model_name(self.model)
        self.partition.validate()
        self.local.validate()
        n = self.partition.federation_size
        if self.eligible_clients is not None:
            bad = [k for k in self.eligible_clients if not 0 <= k < n]
            if bad or not self.eligible_clients:
                raise ConfigError(f"eligible_clients must be non-empty client ids in [0, {n}), got {self.eligible_clients}")
        attacks = [make_attack(spec) for spec in self.attacks]
        for attack in attacks:
            if not 0 <= attack.client < n:
                raise ConfigError(f"attack client {attack.client} is not a client id in [0, {n})")
        pool = len(self.eligible_clients) if self.eligible_clients is not None else n
        attackers = {a.client for a in attacks if a.every_round}
        if len(attackers) > self.num_sampled:
            raise ConfigError(f"{len(attackers)} attackers take part in every round but only "
                              f"{self.num_sampled} clients are sampled per round")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ConfigError(f"rounds must be a positive integer, got {self.rounds!r}")
        if not (0 < self.participation <= 1):
            raise ConfigError(f"participation p must be in (0, 1], got {self.participation}")
        if self.clients_per_round is not None:
            if self.clients_per_round < 1:
                raise ConfigError(f"clients_per_round must be >= 1, got {self.clients_per_round}")
            if self.clients_per_round > pool:
                raise ConfigError(f"clients_per_round={self.clients_per_round} is more than the "
                                  f"{pool} clients that can be sampled")
        if self.eval_every < 1 or self.checkpoint_every < 1:
            raise ConfigError("eval_every and checkpoint_every must be >= 1")
        if attacks and self.algorithm.multi_objective:
            raise ConfigError(f"attacks rewrite single-objective reports; {self.algorithm.name} sends one update "
                              "per objective")
        self.algorithm.check(self)
        return self

    @property
    def num_sampled(self) -> int:
        """Clients per round: ``clients_per_round`` or max(1, round(p·N)) with N the clients
        that can be sampled."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        pool = len(self.eligible_clients) if self.eligible_clients is not None else self.partition.federation_size
        return max(1, math.floor(self.participation * pool + 0.5))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["algorithm"] = self.algorithm.to_dict()
        for key in ("partition", "local"):
            out[key] = dataclasses.asdict(out[key])
        return _plain(out)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExperimentConfig":
        d = dict(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        if isinstance(d.get("partition"), Mapping):
            d["partition"] = _build(PartitionSpec, d["partition"], "partition")
        if isinstance(d.get("local"), Mapping):
            d["local"] = _build(LocalTraining, d["local"], "local")
        for key in ("eligible_clients", "attacks"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        return cls(**_coerce_numbers(cls, d))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ExperimentConfig":
        import yaml
        with open(path) as f:
            return cls.from_dict(yaml.safe_load(f) or {})

    def replace(self, **changes) -> "ExperimentConfig":
        return dataclasses.replace(self, **changes)

    def key(self) -> str:
        """A stable hash of every setting and of the cache version (the cache folder's name)."""
        blob = json.dumps({"cache_version": CACHE_VERSION, **self.to_dict()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        return f"{self.algorithm.label()} seed={self.seed}"


def _build(cls, d: Mapping[str, Any], where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ConfigError(f"unknown {where} keys: {', '.join(sorted(unknown))}")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return cls(**_coerce_numbers(cls, d))


_NUMBER_TYPES = {"int": int, "float": float, "int | None": int, "float | None": float}


def _coerce_numbers(cls, d: dict[str, Any]) -> dict[str, Any]:
    """Numbers written as strings become numbers in numeric fields: PyYAML reads ``1e-3``
    (exponent, no dot) as the string '1e-3'. Anything else is left for validation to reject."""
    kinds = {f.name: _NUMBER_TYPES.get(str(f.type)) for f in dataclasses.fields(cls)}
    out = dict(d)
    for k, v in d.items():
        kind = kinds.get(k)
        if kind is not None and isinstance(v, str):
            try:
                x = float(v)
            except ValueError:
                continue
            out[k] = int(x) if kind is int and x.is_integer() else x
    return out


def check_number_fields(obj, where: str = "") -> None:
    """Every field annotated int / float holds a real number (not a bool, not a string)."""
    for f in dataclasses.fields(obj):
        kind = _NUMBER_TYPES.get(str(f.type))
        if kind is None:
            continue
        v = getattr(obj, f.name)
        if v is None and "None" in str(f.type):
            continue
        ok = isinstance(v, int) if kind is int else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok:
            raise ConfigError(f"{where}{f.name} must be {'an integer' if kind is int else 'a number'}, "
                              f"got {v!r} ({type(v).__name__})")


def _plain(x):
    """JSON-ready: tuples -> lists, mappings -> dicts (for a hash that is stable)."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
