"""Federated partitions of a dataset, and per-client train / val / test splits.

Every partitioner is a pure function of the labels (or attributes) and an explicit
``numpy.random.Generator``; :func:`federate` seeds it from the partition's own seed, so one
seed gives one partition whatever the training seed is (comparing methods on different
partitions would confound the method with the split).
A partition is a list of index arrays into the training set, one per client, disjoint.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from fairfl.base import seeding
from fairfl.base.seeding import MAX_SEED
from .data.base import ArrayDataset
from fairfl.base.errors import ConfigError
from fairfl.base.validation import option, validate_options


# ----------------------------------------------------------------------------- partitioners

def iid(num_samples: int, num_clients: int, rng: np.random.Generator,
        samples_per_client: int | None = None) -> list[np.ndarray]:
    """Shuffle, then deal into ``num_clients`` parts whose sizes differ by at most one; with
    ``samples_per_client``, a uniform random subset of num_clients × samples_per_client samples
    dealt out (FMOL App. D: M = 10 clients of 256 samples)."""
    _check_clients(num_clients, num_samples)
    if samples_per_client is None:
        return [np.sort(p) for p in np.array_split(rng.permutation(num_samples), num_clients)]
    need = _check_subset(num_clients, samples_per_client, num_samples)
    picked = rng.choice(num_samples, size=need, replace=False)
    return [np.sort(p) for p in picked.reshape(num_clients, samples_per_client)]


def label_limited(labels: np.ndarray, num_clients: int, samples_per_client: int, labels_per_client: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """FMOL App. D's non-iid split, after McMahan et al.'s shards: each client gets
    ``labels_per_client`` shards (sizes differing by at most one) of ``samples_per_client`` samples
    in all, each shard of a single class. The classes are dealt to the shards cyclically from
    random permutations of the classes, so every class serves ⌊·⌋ or ⌈·⌉ of the
    num_clients × labels_per_client shards; a client whose shards drew the same class holds one
    label. Guarantee: at most ``labels_per_client`` distinct labels per client. Raises
    ConfigError when more samples are requested than exist (in total, or of one class)."""
    labels = np.asarray(labels)
    _check_clients(num_clients, len(labels))
    _check_subset(num_clients, samples_per_client, len(labels))
    if not 1 <= labels_per_client <= samples_per_client:
        raise ConfigError(f"shards_per_client (labels per client) must be in 1..samples_per_client, "
                          f"got {labels_per_client}")
    classes = np.unique(labels)
    num_shards = num_clients * labels_per_client
    reps = -(-num_shards // len(classes))
    shard_class = np.concatenate([rng.permutation(classes) for _ in range(reps)])[:num_shards]
    shard_class = rng.permutation(shard_class).reshape(num_clients, labels_per_client)
    shard_size = np.array([len(a) for a in np.array_split(np.arange(samples_per_client), labels_per_client)])
    pools = {}
    for c in classes:
        wanted = int(shard_size[np.nonzero(shard_class == c)[1]].sum())
        pool = np.flatnonzero(labels == c)
        if wanted > len(pool):
            raise ConfigError(f"label_limited partition: class {c} is needed for {wanted} samples, the data has "
                              f"{len(pool)}; use fewer clients or samples per client")
        pools[c] = list(rng.permutation(pool)[:wanted])
    out = []
    for i in range(num_clients):
        idx = []
        for j in range(labels_per_client):
            c = shard_class[i, j]
            take, pools[c] = pools[c][:shard_size[j]], pools[c][shard_size[j]:]
            idx += take
        out.append(np.sort(np.asarray(idx, dtype=np.int64)))
    return out


def label_shards(labels: np.ndarray, num_clients: int, shards_per_client: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al. (2017): sort by label, cut into ``num_clients * shards_per_client`` equal
    shards, give each client ``shards_per_client`` shards at random. The number of shards must
    divide the data, so every client gets the same number of samples."""
    labels = np.asarray(labels)
    num_shards = num_clients * shards_per_client
    if shards_per_client < 1:
        raise ConfigError(f"shards_per_client must be >= 1, got {shards_per_client}")
    _check_clients(num_clients, len(labels))
    if len(labels) % num_shards:
        raise ConfigError(
            f"{num_shards} shards ({num_clients} clients x {shards_per_client}) do not divide "
            f"{len(labels)} samples; choose numbers whose product divides the data")
    # Stable sort by label with ties broken at random, so a shard's samples are not the file order.
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    shards = order.reshape(num_shards, -1)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(shards[a].ravel()) for a in assignment]


def dirichlet(labels: np.ndarray, num_clients: int, beta: float, rng: np.random.Generator,
              min_size: int = 1, max_tries: int = 1000) -> list[np.ndarray]:
    """Per class, split its samples among clients in proportions drawn from Dirichlet(beta)
    (Hsu et al. 2019). Redrawn until every client holds at least ``min_size`` samples."""
    labels = np.asarray(labels)
    if not beta > 0:
        raise ConfigError(f"Dirichlet beta must be > 0, got {beta}")
    _check_clients(num_clients, len(labels))
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, beta)))[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ConfigError(f"Dirichlet(beta={beta}) left a client with < {min_size} samples "
                      f"in {max_tries} draws; raise beta or lower min_size")


def one_class_per_client(labels: np.ndarray, classes: Sequence[int]) -> list[np.ndarray]:
    """Client k holds every sample of class ``classes[k]`` (q-FFL / FedFV's three-client
    Fashion-MNIST setting: T-shirt (0), pullover (2), shirt (6))."""
    labels = np.asarray(labels)
    if len(set(classes)) != len(classes):
        raise ConfigError(f"classes must be distinct, got {list(classes)}")
    out = [np.flatnonzero(labels == c) for c in classes]
    for c, p in zip(classes, out):
        if len(p) == 0:
            raise ConfigError(f"class {c} has no samples")
    return out


def by_attribute(groups: np.ndarray, values: Sequence[int]) -> list[np.ndarray]:
    """Client k holds the samples whose attribute equals ``values[k]`` (Adult: phd / non-phd)."""
    groups = np.asarray(groups)
    out = [np.flatnonzero(groups == v) for v in values]
    for v, p in zip(values, out):
        if len(p) == 0:
            raise ConfigError(f"attribute value {v} has no samples")
    return out


# FedMGDA+'s released Adult code (watml/Fed-MGDA, commit c8d8586), read as it runs: the clients' rows
# as that code numbers them, and the share of them it trains on.
OFFICIAL_CODE_TRAIN_SHARE = 0.8


def as_in_fedmgda_code(parts: Sequence[np.ndarray], num_samples: int) -> list[np.ndarray]:
    """The rows FedMGDA+'s released Adult code trains each attribute client on, given the
    clients' true rows ``parts`` (:func:`by_attribute`). That code has an off-by-one bug:
    ``adult/sampling.py`` l.63 numbers the training rows from 1 (``range(1, n+1)``) and l.72–78
    keep each client's numbers as a Python set, while ``adult/update.py`` l.25 uses those numbers
    as 0-based row indices, so each client trains on the row *after* each of its own rows. Its
    local split (update.py l.34, l.45) keeps the first 80 % of ``list(set)`` — CPython's iteration
    order of the set (built by inserting the numbers in ascending order, as sampling.py does) — for
    training; the other 20 % are never read. On Adult the "PhD" client so trains on 330 rows of
    which 3 are PhD rows. CPython 3.6 and 3.7+ iterate the PhD set in slightly different orders,
    but keep the same 80 % on Adult (checked); a client's training rows are returned sorted (local
    training shuffles them). The test rows are not affected: the code tests on the standard test
    file's rows by domain (federated_main.py l.56–64, l.348–354)."""
    out = []
    for idx in parts:
        numbers = set()
        for i in np.sort(idx).tolist():
            numbers.add(i + 1)                        # sampling.py l.63: rows numbered from 1
        order = list(numbers)                         # update.py l.34: list(set), CPython's order
        train = np.sort(np.asarray(order[:int(OFFICIAL_CODE_TRAIN_SHARE * len(order))], dtype=np.int64))
        if len(train) == 0 or train[-1] >= num_samples:
            raise ConfigError(f"partition reading 'official-code': a client's shifted rows run past the data "
                              f"({num_samples} rows) or are empty; the reading is defined for Adult's two domains")
        out.append(train)                             # update.py l.25: the numbers used as 0-based indices
    return out


def natural(groups: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The dataset's own clients (LEAF: one per speaking role of a play): client k holds every
    sample of one group. With more groups than ``num_clients``, that many are drawn at random
    (q-FFL / DQN-Fed subsample 31 roles); the chosen groups keep their order, and each client's
    indices are ascending (for Shakespeare: text order)."""
    groups = np.asarray(groups)
    values, counts = np.unique(groups, return_counts=True)
    if num_clients < 1:
        raise ConfigError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > len(values):
        raise ConfigError(f"num_clients={num_clients}, but the dataset has only {len(values)} groups "
                          f"(natural clients); num_clients={len(values)} keeps them all")
    chosen = np.sort(rng.choice(len(values), size=num_clients, replace=False))
    order = np.argsort(groups, kind="stable")          # grouped, ascending within each group
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [order[bounds[g]:bounds[g + 1]] for g in chosen]


def _check_subset(num_clients: int, samples_per_client: int, num_samples: int) -> int:
    if samples_per_client < 1:
        raise ConfigError(f"samples_per_client must be >= 1, got {samples_per_client}")
    need = num_clients * samples_per_client
    if need > num_samples:
        raise ConfigError(f"{num_clients} clients × {samples_per_client} samples = {need} samples requested, "
                          f"but the data has only {num_samples}")
    return need


def _check_clients(num_clients: int, num_samples: int) -> None:
    if num_clients < 1:
        raise ConfigError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_samples:
        raise ConfigError(f"{num_clients} clients for only {num_samples} samples")


# ----------------------------------------------------------------------------- splits

def split_client(indices: np.ndarray, fractions: Sequence[float],
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle one client's indices, then cut them by ``fractions`` (e.g. 0.8/0.1/0.1). The
    shuffle matters: FedMGDA+'s released code cut in index order, which after a label sort left
    each client a single-class test set."""
    return split_in_order(rng.permutation(indices), fractions)


def split_in_order(indices: np.ndarray, fractions: Sequence[float]) -> list[np.ndarray]:
    """Cut one client's indices, in the order given, by ``fractions``. For sequence data
    (Shakespeare's overlapping windows, in text order) this puts the first 80% of a role's text
    in train and its end in val / test, so that no val / test target character lies inside a
    training window; a shuffled split would have each test target inside its neighbours' inputs."""
    idx = np.asarray(indices)
    cuts = np.floor(np.cumsum(fractions)[:-1] * len(idx) + 1e-9).astype(int)
    return [np.sort(p) for p in np.split(idx, cuts)]


# ----------------------------------------------------------------------------- federated data

SCHEMES = ("iid", "shards", "dirichlet", "one_class", "attribute", "natural", "label_limited")
# "true": each client holds its own rows. "official-code": Adult's domains as FedMGDA+'s released
# code reads them (rows shifted by one, 80 % kept; :func:`as_in_fedmgda_code`), to show where the
# paper's Table 7 baseline comes from; never the default.
READINGS = ("true", "official-code")
# Where a client's test rows come from when its share of the training file is split: that share ("split"),
# or the standard test file ("file"), never seen by any partition's training or validation rows
TEST_SOURCES = ("split", "file")


@dataclass(frozen=True)
class PartitionSpec:
    """How to federate a dataset. ``scheme`` is one of ``SCHEMES``; ``split`` is the per-client
    (train, val, test) fractions of each client's share of the training file, or ``None`` to keep
    all of it for training and give each client the standard test file's samples of its own
    class / attribute group (only for ``one_class`` and ``attribute``).

    ``natural`` makes the dataset's own groups the clients (Shakespeare: speaking roles):
    ``num_clients`` of them, drawn with ``seed`` when the dataset has more; on sequence data
    (``ArrayDataset.sequential``) each client's train / val / test is cut in text order
    instead of after a shuffle (:func:`split_in_order`).

    ``samples_per_client`` gives every client that many samples of a random subset (``iid``)
    or of single-class shards (``label_limited``: at most ``shards_per_client`` labels per client,
    FMOL App. D); ``label_column`` is the label column that label-based schemes read on a
    multi-task dataset (MultiMNIST: 0 = task L). ``pooled`` merges every client's data into one
    client after the split: centralised training on exactly the federation's data (FMOL's MGD).

    ``reading="official-code"`` (off by default; Adult's ``attribute`` partition with
    ``split=None`` only) gives each domain the training rows that FedMGDA+'s released code
    (watml/Fed-MGDA c8d8586) actually uses: because of an off-by-one bug (``adult/sampling.py``
    l.63 numbers rows from 1, ``adult/update.py`` l.25 indexes from 0) every client trains on the
    row after each of its rows, and only the first 80 % of them (update.py l.45). It reproduces
    the paper's Table 7 "trained on PhD only" baseline; ``"true"`` is the correct split.

    ``val_fraction`` (with ``split=None`` only) holds that share of each client's training rows out
    as its validation split, drawn with ``seed``, while the test stays the standard test file's:
    the papers' settings with a validation split to tune on (notebook 06).

    ``test_source="file"`` (with a ``split``) tests each client on rows of the standard test file
    instead of its share's test fraction: for every label, as many rows as its split's test fraction
    holds of that label (at most the file's rows of it), drawn without replacement from the file's
    rows of that label (``seed``; clients draw independently, so two clients may share a test row).
    Its train and validation rows are exactly those of ``"split"``; the share's test rows are left
    unused. Then no partition's training or validation rows, whatever its seed, are any client's
    test rows: a tuning seed's partition cannot have trained on a reporting seed's test rows
    (notebook 06, protocol 6.3, on label shards and Dirichlet).

    ``min_size`` (``dirichlet`` only) redraws the Dirichlet proportions until every client holds
    at least that many samples (:func:`dirichlet`), so that each client's split has a test set
    worth scoring (notebook 06: 50 clients of at least 250 samples, at least 50 of them for test)."""

    scheme: str = option("iid", choices=SCHEMES)
    num_clients: int = option(100, low=1)
    shards_per_client: int = option(2, low=1)
    beta: float = option(0.5, low=0.0, low_open=True)
    classes: tuple[int, ...] = option((), low=0)
    attribute_values: tuple[int, ...] = option((0, 1))
    split: tuple[float, float, float] | None = (0.8, 0.1, 0.1)
    seed: int = option(0, low=0, high=MAX_SEED)
    samples_per_client: int | None = option(None, low=1)
    label_column: int = option(0, low=0)
    pooled: bool = option(False)
    reading: str = option("true", choices=READINGS, doc="'official-code': Adult's rows as FedMGDA+'s code reads them")
    val_fraction: float = option(0.0, low=0.0, high=1.0, high_open=True,
                                 doc="with split=None: the share of each client's training rows held out for validation")
    min_size: int = option(1, low=1, doc="dirichlet: redrawn until every client holds at least this many samples")
    test_source: str = option("split", choices=TEST_SOURCES,
                              doc="'file': each client tests on the standard test file's rows of its split's labels")

    def __post_init__(self) -> None:
        validate_options(self, "partition")
        self.validate()

    @property
    def federation_size(self) -> int:
        """Clients of the federated data: ``num_clients``, or 1 when pooled."""
        return 1 if self.pooled else self.num_clients

    def validate(self) -> None:
        if self.split is not None:
            ok = (isinstance(self.split, (tuple, list)) and len(self.split) == 3
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                          for v in self.split)
                  and abs(sum(self.split) - 1) <= 1e-9 and self.split[0] > 0)
            if not ok:
                raise ConfigError(f"partition: split={self.split!r} is not allowed; it must be 3 non-negative fractions "
                                  "(train, val, test) summing to 1 with a positive train share, or None")
            object.__setattr__(self, "split", tuple(float(v) for v in self.split))
        elif self.scheme not in ("one_class", "attribute"):
            raise ConfigError("partition: split=None (test from the standard test file) needs scheme "
                              "'one_class' or 'attribute', whose groups exist in the test file")
        if self.val_fraction and self.split is not None:
            raise ConfigError(f"partition: val_fraction={self.val_fraction} applies to split=None (test from the "
                              f"standard test file); with split={self.split} the validation share is its middle fraction")
        if self.val_fraction and self.reading != "true":
            raise ConfigError("partition: val_fraction takes rows out of the training share that "
                              f"reading={self.reading!r} fixes; use it with reading='true'")
        if self.scheme == "one_class" and not self.classes:
            raise ConfigError("partition: scheme 'one_class' needs classes=(...), one per client")
        if self.scheme == "one_class" and len(self.classes) != self.num_clients:
            raise ConfigError(f"partition: scheme 'one_class' gives one class per client: {len(self.classes)} "
                              f"classes for num_clients={self.num_clients}")
        if self.scheme == "label_limited" and self.samples_per_client is None:
            raise ConfigError("partition: scheme 'label_limited' needs samples_per_client")
        if self.reading != "true" and (self.scheme != "attribute" or self.split is not None or self.pooled):
            raise ConfigError(f"partition: reading={self.reading!r} is FedMGDA+'s released Adult code's reading of the "
                              "'attribute' partition, which fixes each client's training share (80 %) and tests on the "
                              f"standard test file: it needs scheme='attribute', split=None and pooled=False (got "
                              f"scheme={self.scheme!r}, split={self.split!r}, pooled={self.pooled})")
        if self.test_source != "split" and self.split is None:
            raise ConfigError(f"partition: test_source={self.test_source!r} replaces the test fraction of a split; with "
                              "split=None the clients already test on the standard test file")
        if self.min_size != 1 and self.scheme != "dirichlet":
            raise ConfigError(f"partition: min_size={self.min_size} applies to scheme 'dirichlet' (redrawn until every "
                              f"client holds that many samples), not {self.scheme!r}")
        if self.samples_per_client is not None and self.scheme not in ("iid", "label_limited"):
            raise ConfigError(f"partition: samples_per_client applies to schemes 'iid' and 'label_limited', "
                              f"not {self.scheme!r}")




@dataclass(frozen=True)
class Client:
    """One client's data (tensors shared with the dataset where possible)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_train(self) -> int:
        return len(self.y_train)


FIELDS = tuple(f.name for f in dataclasses.fields(Client))


@dataclass(frozen=True)
class FederatedData:
    """A partition: its clients, and (``blocks``) each of their six tensors' fields held back to back
    in one tensor, the clients' tensors being views of it. So the federation's data is held once: the
    engine's pool of a round's clients (``fairfl.training.engine.Pool``) and the pooled client of a
    centralised run are views of the same blocks, not copies (a copy per pool held every partition of
    a sweep twice)."""

    dataset: ArrayDataset
    spec: PartitionSpec
    clients: list[Client]
    train_indices: list[np.ndarray] = field(repr=False)
    blocks: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def to(self, device: torch.device | str) -> "FederatedData":
        """The same partition with every client's tensors on ``device`` (itself if already there)."""
        device = torch.device(device)
        if all(c.x_train.device == device for c in self.clients):
            return self
        if self.blocks is None:
            moved = [Client(*(getattr(c, f).to(device) for f in FIELDS)) for c in self.clients]
            return dataclasses.replace(self, clients=moved)
        blocks = {f: b.to(device) for f, b in self.blocks.items()}
        return dataclasses.replace(self, clients=_views(blocks, [[len(getattr(c, f)) for f in FIELDS]
                                                               for c in self.clients]), blocks=blocks)

    def label_counts(self, part: str = "train", task: int = 0) -> np.ndarray:
        """(clients, classes) matrix of label counts: the heatmap of a partition (of label column
        ``task`` on a multi-task dataset)."""
        nc = self.dataset.num_classes

        def labels(c: Client) -> np.ndarray:
            y = getattr(c, f"y_{part}").cpu().numpy()
            return y[:, task] if y.ndim == 2 else y
        return np.stack([np.bincount(labels(c), minlength=nc) for c in self.clients])


def partition_indices(ds: ArrayDataset, spec: PartitionSpec) -> list[np.ndarray]:
    rng = seeding.partition_rng(spec.seed, seeding.PARTITION)
    labels = ds.y_train.numpy()
    if labels.ndim == 2:
        if not 0 <= spec.label_column < labels.shape[1]:
            raise ConfigError(f"label_column={spec.label_column} is not a label column of {ds.name} "
                              f"(0..{labels.shape[1] - 1})")
        labels = labels[:, spec.label_column]
    if spec.scheme == "iid":
        return iid(len(labels), spec.num_clients, rng, spec.samples_per_client)
    if spec.scheme == "label_limited":
        return label_limited(labels, spec.num_clients, spec.samples_per_client, spec.shards_per_client, rng)
    if spec.scheme == "shards":
        return label_shards(labels, spec.num_clients, spec.shards_per_client, rng)
    if spec.scheme == "dirichlet":
        return dirichlet(labels, spec.num_clients, spec.beta, rng, min_size=spec.min_size)
    if spec.scheme == "one_class":
        return one_class_per_client(labels, spec.classes)
    if spec.scheme == "natural":
        if ds.groups_train is None:
            raise ConfigError(f"dataset {ds.name!r} has no groups (natural clients) for scheme 'natural'")
        return natural(ds.groups_train, spec.num_clients, rng)
    if ds.groups_train is None:
        raise ConfigError(f"dataset {ds.name!r} has no attribute groups for scheme 'attribute'")
    parts = by_attribute(ds.groups_train, spec.attribute_values)
    if spec.reading == "official-code":
        if ds.name != "adult":
            raise ConfigError(f"partition reading 'official-code' is defined for Adult only, not {ds.name!r}")
        return as_in_fedmgda_code(parts, len(ds.groups_train))
    return parts


def train_sizes(ds: ArrayDataset, spec: PartitionSpec) -> list[int]:
    """Each client's number of training samples, as :func:`federate` gives them, without building
    the clients' tensors (a count of local steps needs only these)."""
    parts = partition_indices(ds, spec)
    if spec.split is None:
        fractions = (1 - spec.val_fraction, spec.val_fraction) if spec.val_fraction else (1.0,)
    else:
        fractions = spec.split
    sizes = [len(split_in_order(np.arange(len(idx)), fractions)[0]) for idx in parts]
    return [sum(sizes)] if spec.pooled else sizes


def federate(ds: ArrayDataset, spec: PartitionSpec) -> FederatedData:
    """Partition ``ds`` and split every client's data, all seeded by ``spec.seed`` alone."""
    fed = _federate(ds, spec)
    return pool(fed) if spec.pooled else fed


def pool(fed: FederatedData) -> FederatedData:
    """One client holding every client's train, val and test data (in client order): the blocks
    themselves, where the partition has them."""
    if fed.blocks is not None:
        merged = Client(*(fed.blocks[f] for f in FIELDS))
    else:
        merged = Client(*(torch.cat([getattr(c, f) for c in fed.clients]) for f in FIELDS))
    return FederatedData(fed.dataset, fed.spec, [merged], [np.concatenate(fed.train_indices)], fed.blocks)


def _gathered(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
              sources: tuple[torch.Tensor, ...]) -> tuple[list[Client], dict[str, torch.Tensor]]:
    """The clients of a partition from their row indices (``rows[k]``: client k's rows of each field
    in ``sources``, the tensors the six fields are taken from): each field gathered once for all
    clients, in client order, and the clients made views of it. The values are those of gathering
    each client on its own; only where they are held changes."""
    blocks = {f: src[torch.cat([r[i] for r in rows])] if rows else src[:0]
              for i, (f, src) in enumerate(zip(FIELDS, sources))}
    return _views(blocks, [[len(i) for i in r] for r in rows]), blocks


def _views(blocks: dict[str, torch.Tensor], sizes: list[list[int]]) -> list[Client]:
    """Client k's fields as views of ``blocks``, of the lengths ``sizes[k]`` (one per field)."""
    parts = {f: torch.split(blocks[f], [s[i] for s in sizes]) for i, f in enumerate(FIELDS)}
    return [Client(*(parts[f][k] for f in FIELDS)) for k in range(len(sizes))]


def _federate(ds: ArrayDataset, spec: PartitionSpec) -> FederatedData:
    parts = partition_indices(ds, spec)
    split_rng = seeding.partition_rng(spec.seed, seeding.SPLIT)
    if spec.split is None:
        test_groups = (ds.y_test.numpy() if spec.scheme == "one_class" else ds.groups_test)
        test_values = spec.classes if spec.scheme == "one_class" else spec.attribute_values
        if test_groups is None:
            raise ConfigError(f"dataset {ds.name!r} has no test-file groups")
        empty = np.array([], dtype=np.int64)
        train_parts, rows = [], []
        for idx, v in zip(parts, test_values):
            t = torch.from_numpy(np.flatnonzero(test_groups == v))
            # the validation rows are drawn only when asked for, so that every earlier partition is unchanged
            tr, va = (split_client(idx, (1 - spec.val_fraction, spec.val_fraction), split_rng)
                      if spec.val_fraction else (idx, empty))
            train_parts.append(tr)
            i, j = torch.from_numpy(tr), torch.from_numpy(va)
            rows.append((i, i, j, j, t, t))
        clients, blocks = _gathered(rows, (ds.x_train, ds.y_train, ds.x_train, ds.y_train, ds.x_test, ds.y_test))
        return FederatedData(ds, spec, clients, train_parts, blocks)
    in_order = spec.scheme == "natural" and ds.sequential
    from_file = spec.test_source == "file"
    test_rng = seeding.partition_rng(spec.seed, seeding.TEST_FILE) if from_file else None
    train_parts, rows = [], []
    for idx in parts:
        cut = split_in_order(idx, spec.split) if in_order else split_client(idx, spec.split, split_rng)
        tr, va, te = (torch.from_numpy(p) for p in cut)
        train_parts.append(tr.numpy())
        if from_file:
            te = torch.from_numpy(_test_file_rows(ds, spec, te.numpy(), test_rng))
        rows.append((tr, tr, va, va, te, te))
    tests = (ds.x_test, ds.y_test) if from_file else (ds.x_train, ds.y_train)
    clients, blocks = _gathered(rows, (ds.x_train, ds.y_train, ds.x_train, ds.y_train, *tests))
    return FederatedData(ds, spec, clients, train_parts, blocks)


def _labels_of(y: torch.Tensor, spec: PartitionSpec) -> np.ndarray:
    labels = y.numpy()
    return labels[:, spec.label_column] if labels.ndim == 2 else labels


def _test_file_rows(ds: ArrayDataset, spec: PartitionSpec, share_test: np.ndarray, rng: np.random.Generator
                    ) -> np.ndarray:
    """Rows of the standard test file with the label counts of a client's test fraction
    (``share_test``: its rows of the training file), each label's drawn without replacement from
    the file's rows of that label (all of them where the client asks for more), sorted."""
    if len(ds.y_test) == 0:
        raise ConfigError(f"partition: test_source='file', but {ds.name!r} has no test file")
    wanted = np.bincount(_labels_of(ds.y_train, spec)[share_test], minlength=ds.num_classes)
    file_labels = _labels_of(ds.y_test, spec)
    rows = [rng.choice(np.flatnonzero(file_labels == c), size=min(int(n), int(np.sum(file_labels == c))),
                       replace=False) for c, n in enumerate(wanted) if n]
    return np.sort(np.concatenate(rows)) if rows else np.array([], dtype=np.int64)
