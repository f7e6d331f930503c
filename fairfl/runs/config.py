"""One experiment = one frozen, validated :class:`ExperimentConfig`. Its hash names its cache
folder (with the data's fingerprint, ``fairfl.runs.cache``), so a notebook re-plots without retraining
and a changed setting never reuses a stale result.

The algorithm is an object with its own typed options (``fairfl.federated.algorithms``):
``ExperimentConfig(algorithm=FedMGDAPlus(eps=0.1, server_lr=1.0, decay=0.1))``; a name
(``algorithm="fedavg"``) or a mapping (``{"name": "fedfv", "alpha": 0.5}``, the form of a YAML
file) is turned into one at construction.

Every field is checked when the config is made (and again by :meth:`ExperimentConfig.validate`):
a bad value raises one ConfigError naming it, before any data is loaded. The config is kept in a
canonical form — numbers in their field's type, every dataset / model / algorithm / attack option
written out with its default — so that equal experiments have equal keys (``server_lr=1`` and
``1.0``, an option left out and the same option at its default value).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fairfl.federated.algorithms import Algorithm, make_algorithm
from fairfl.federated.attacks import attack_spec, make_attack
from fairfl.training.client import LocalTraining
from fairfl.federated.data.base import canonical_options
from fairfl.base.errors import ConfigError
from fairfl.federated.models import model_options
from fairfl.federated.partition import PartitionSpec
from fairfl.base.seeding import MAX_SEED
from fairfl.base.validation import did_you_mean, option, validate_options

# Bump when a change of the code changes what a config computes, so that no stale result is read.
# 2: one round loop for every algorithm (the algorithm's options and server step in its own object).
# 3: canonical configs, attacks' `target`, the data's fingerprint in the cache key.
# 4: dropout masks from each client's stream (a run fused with others gives its result alone);
#    the device's type in the key.
# 5: Intel MKL in strict reproducibility mode.
# 6: a lone instance trains in a stack of two (a stack of one rounded otherwise, fairfl.training.engine).
# 7: no stack of any size that rounds otherwise than a pair (a stack of three of a CNN did: the
#    first convolution's weight gradient, fairfl.training.engine.exactness.size_is_exact).
# A change that alters the results of some configs only does not bump it, so that every other
# cached result is still read. A changed default reaches the key with the option's value (every
# algorithm option is in the canonical form: FedHEAL's τ and β). A new option is written into the
# key like any other, which changes its algorithm's every key: right where its default changes
# what they compute (FedLF's message and lr_decay: its default now decays). Only a new option at
# a default that computes what the code computed before may be left out at that default
# (_ADDED_AFTER_V5), so that the earlier keys still name their results. A fix under unchanged
# options raises Algorithm.revision for the options whose results it changes (FedNew's periodic
# Hessian refresh, hessian_every > 1), which enters their keys only; a change of the engine that
# changes what some configs compute raises ExperimentConfig.engine_revision for those configs (the
# character LSTM trained stacked where batched).
CACHE_VERSION = 7
DEVICES = "'auto', 'cpu', 'cuda' or 'cuda:N'"


@dataclass(frozen=True)
class ExperimentConfig:
    dataset: str = "fashion_mnist"
    dataset_options: Mapping[str, Any] = field(default_factory=dict)
    partition: PartitionSpec = PartitionSpec()
    model: str = "cnn_fmnist"
    model_options: Mapping[str, Any] = field(default_factory=dict)
    algorithm: Algorithm = "fedavg"     # an Algorithm, or its name / {"name": ..., option: ...}
    local: LocalTraining = LocalTraining()
    rounds: int = option(100, low=1)
    participation: float = option(0.1, low=0.0, high=1.0, low_open=True, doc="share of clients sampled per round")
    clients_per_round: int | None = option(None, low=1, doc="overrides participation when set")
    eval_every: int = option(10, low=1)
    seed: int = option(0, low=0, high=MAX_SEED, doc="training seed (the partition has its own)")
    batched: bool = option(True, doc="train a round's clients together (False: the reference loop)")
    track_improved: bool = option(True, doc="share of participants whose loss did not increase")
    checkpoint_every: int = option(50, low=1)
    eligible_clients: tuple[int, ...] | None = option(None, low=0, doc="only these may be sampled")
    attacks: tuple = ()                 # e.g. ({"kind": "bias", "client": 1, "bias": 1.0},)
    device: str = option("cpu", doc="'auto', 'cpu', 'cuda' or 'cuda:N': where clients train and evaluate")
    averaged_iterate: bool = option(False, doc="also score w̄_T = (1/T)·Σ_{t=1..T} w_t, the average of the global "
                                                "models after rounds 1..T, at every evaluation (History.avg_*)")
    track_validation: bool = option(False, doc="also score every client's validation split at each evaluation "
                                               "(History.val_acc / val_loss): what a tuning protocol selects on")

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("algorithm", make_algorithm(self.algorithm))
        validate_options(self, "ExperimentConfig")
        for name, kind in (("partition", PartitionSpec), ("local", LocalTraining)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"ExperimentConfig: {name} must be a {kind.__name__} (or, in a config file, a "
                                  f"mapping of its fields), got {getattr(self, name)!r}")
        set_("dataset_options", canonical_options(self.dataset, self.dataset_options))
        set_("model_options", model_options(self.model, self.model_options))
        if isinstance(self.attacks, (str, bytes, Mapping)) or not isinstance(self.attacks, (tuple, list)):
            raise ConfigError(f"ExperimentConfig: attacks must be a list of attacks, got {self.attacks!r}")
        set_("attacks", tuple(attack_spec(make_attack(a)) for a in self.attacks))
        if self.eligible_clients is not None:
            set_("eligible_clients", tuple(sorted(set(self.eligible_clients))))
        set_("device", _canonical_device(self.device))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> "ExperimentConfig":
        """Check how the settings fit together (before any data is loaded); raise one ConfigError
        naming the problem. Every field was checked at construction. Returns self."""
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
        if self.clients_per_round is not None and self.clients_per_round > pool:
            raise ConfigError(f"clients_per_round={self.clients_per_round} is more than the "
                              f"{pool} clients that can be sampled")
        split = self.partition.split
        if split is not None and split[2] == 0:
            raise ConfigError(f"partition: split={split} gives the clients no test data, so every accuracy would "
                              "be NaN; give the test share a positive fraction")
        if self.track_validation and (split[1] == 0 if split is not None else not self.partition.val_fraction):
            raise ConfigError(f"track_validation=True, but partition: split={split} gives the clients no validation "
                              "data; give the validation share a positive fraction, e.g. split=(0.8, 0.1, 0.1), or "
                              "with split=None hold some training rows out, e.g. val_fraction=0.1")
        if self.partition.reading != "true" and self.dataset != "adult":
            raise ConfigError(f"partition: reading={self.partition.reading!r} is FedMGDA+'s released code's reading of "
                              f"Adult's PhD / non-PhD split; it is not defined for dataset {self.dataset!r}")
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
        """The canonical form: every setting, JSON-ready (tuples as lists)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["algorithm"] = self.algorithm.to_dict()
        for key in ("partition", "local"):
            out[key] = dataclasses.asdict(out[key])
        for path, default in _ADDED_AFTER_V5.items():
            *outer, name = path
            where = out[outer[0]] if outer else out
            if where[name] == default:
                del where[name]
        return _plain(out)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExperimentConfig":
        if not isinstance(d, Mapping):
            raise ConfigError(f"a config must be a mapping of ExperimentConfig fields, got {type(d).__name__}: {d!r}")
        d = dict(d)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names), key=str)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(map(str, unknown))}{did_you_mean(unknown, names)}")
        for key, kind in (("partition", PartitionSpec), ("local", LocalTraining)):
            if isinstance(d.get(key), Mapping):
                d[key] = _build(kind, d[key], key)
            elif key in d and not isinstance(d[key], kind):
                raise ConfigError(f"{key} must be a mapping of its fields (e.g. {key}: {{...}}), got {d[key]!r}")
        for key in ("eligible_clients", "attacks"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        return cls(**_coerce_numbers(cls, d))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ExperimentConfig":
        """From a YAML file of ExperimentConfig fields. A missing or empty file, or one that is not
        YAML, is a ConfigError naming the file."""
        import yaml
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"config file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not a text file (not UTF-8): give a YAML file of "
                              "ExperimentConfig fields") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"config file {path} is not valid YAML: {problem}{where}") from None
        if data is None:
            raise ConfigError(f"config file {path} is empty: write the fields to change (e.g. rounds: 20); "
                              "an empty file would silently run the defaults")
        return cls.from_dict(data)

    def replace(self, **changes) -> "ExperimentConfig":
        return dataclasses.replace(self, **changes)

    @property
    def device_type(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return self.device.split(":")[0]

    def key(self) -> str:
        """A stable hash of every setting and of the cache version. Of the device only its type
        counts: GPU kernels add in other orders than CPU ones, and over many rounds runs drift
        apart, so a CPU result is never returned for a CUDA run (nor the other way round); which
        GPU does not matter."""
        content = {"cache_version": CACHE_VERSION, **self.to_dict(), "device": self.device_type}
        if self.algorithm.revision():       # a fix that changed what these options compute (Algorithm.revision)
            content["algorithm_revision"] = self.algorithm.revision()
        if self.engine_revision():          # a change of the engine that changed what these configs compute
            content["engine_revision"] = self.engine_revision()
        blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def engine_revision(self) -> int:
        """How many changes of the engine since CACHE_VERSION 7 changed what *this* config computes
        (0: none), in its key where not 0, as :meth:`Algorithm.revision` is for an algorithm's
        options: the results of other configs stay readable. 1: the character LSTM trains as a stack
        (``fairfl.federated.stacked_lstm``) where ``batched`` is on; before, it trained one instance at a time
        on the reference path whatever ``batched`` said."""
        return 1 if self.batched and self.model == "lstm_shakespeare" else 0

    def label(self) -> str:
        return f"{self.algorithm.label()} seed={self.seed}"


# Settings added after results were cached under CACHE_VERSION 5: written into the canonical form
# (and the key) only when they differ from their default, so that every earlier key still names
# the same result.
_ADDED_AFTER_V5 = {("partition", "reading"): "true", ("averaged_iterate",): False, ("track_validation",): False,
                   ("partition", "val_fraction"): 0.0, ("partition", "min_size"): 1, ("partition", "test_source"): "split"}


def _canonical_device(spec: Any) -> str:
    """'cpu', 'cuda' or 'cuda:N'; 'auto' becomes 'cuda' where torch sees a GPU, else 'cpu'. Whether
    a CUDA device exists is checked when the run starts (``fairfl.training.engine.resolve_device``): a
    config may be written on one machine and run on another."""
    if not isinstance(spec, str):
        raise ConfigError(f"ExperimentConfig: device={spec!r} is not allowed; it must be {DEVICES}")
    text = spec.strip().lower()
    if text == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu"
    if kind == "cuda" and (not index or index.isdigit()):
        return text
    raise ConfigError(f"ExperimentConfig: device={spec!r} is not allowed; it must be {DEVICES}")


def _build(cls, d: Mapping[str, Any], where: str):
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(names), key=str)
    if unknown:
        raise ConfigError(f"unknown {where} keys: {', '.join(map(str, unknown))}{did_you_mean(unknown, names)}")
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
            if math.isfinite(x):
                out[k] = int(x) if kind is int and x.is_integer() else x
    return out


def _plain(x):
    """JSON-ready: tuples -> lists, mappings -> dicts (for a hash that is stable)."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def parse_setting_value(text: str):
    """A setting typed as text (``--set k=v``, ``-p k=v``, the explorer's "run it"): JSON where it
    parses (numbers, lists, true/false, null), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def set_dotted(d: dict, dotted: str, value) -> None:
    """Set ``a.b=v`` in a config's plain form (``--set a.b=v``). A new algorithm name starts from
    that algorithm's defaults (``--set algorithm=fedfv --set algorithm.alpha=0.5``)."""
    keys = dotted.split(".")
    if keys == ["algorithm"] and isinstance(value, str):
        value = {"name": value}
    for i, k in enumerate(keys[:-1]):
        if k == "algorithm" and isinstance(d.get(k), str):
            d[k] = {"name": d[k]}
        inner = d.setdefault(k, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(keys[:i + 1])} is {inner!r}, not a group of settings")
        d = inner
    d[keys[-1]] = value
