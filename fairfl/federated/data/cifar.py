"""CIFAR-10 / CIFAR-100 through torchvision (md5-checked downloads; no offline copy exists on
the project's machines)."""
from __future__ import annotations

from pathlib import Path

import torch

from fairfl.base.errors import DatasetNotFoundError
from fairfl.base.paths import data_root
from .base import ArrayDataset, Normalization, downloads_allowed, missing_message, normalise, register_loader

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")

def _load_cifar(cls_name: str, name: str, num_classes: int, root: Path | None,
                download: bool | None, normalize: str) -> ArrayDataset:
    import torchvision.datasets as tvd

    root = root or data_root()
    cls = getattr(tvd, cls_name)
    try:  # torchvision checks the md5 of the extracted batches itself
        train, test = cls(str(root), train=True, download=False), cls(str(root), train=False, download=False)
        source = str(root)
    except RuntimeError:
        download = downloads_allowed() if download is None else download
        msg = missing_message(name, root, f"No offline copy of {name} exists here; on a machine "
                               "with a network it downloads itself (torchvision, md5-checked).")
        if not download:
            raise DatasetNotFoundError(msg) from None
        try:
            train, test = cls(str(root), train=True, download=True), cls(str(root), train=False, download=True)
        except Exception as e:
            raise DatasetNotFoundError(msg + f"\n(download failed: {type(e).__name__}: {e})") from None
        source = "download"
    to_x = lambda d: torch.from_numpy(d.data).float().div_(255).permute(0, 3, 1, 2).contiguous()
    x_tr, x_te = normalise(to_x(train), to_x(test), normalize)
    return ArrayDataset(name, x_tr, torch.tensor(train.targets), x_te, torch.tensor(test.targets),
                        num_classes, source, tuple(train.classes))


@register_loader("cifar10")
def load_cifar10(root: Path | None = None, download: bool | None = None, normalize: Normalization = "global") -> ArrayDataset:
    return _load_cifar("CIFAR10", "cifar10", 10, root, download, normalize)


@register_loader("cifar100")
def load_cifar100(root: Path | None = None, download: bool | None = None, normalize: Normalization = "global") -> ArrayDataset:
    return _load_cifar("CIFAR100", "cifar100", 100, root, download, normalize)
