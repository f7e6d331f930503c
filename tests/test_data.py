"""The real offline datasets: sizes, shapes, encodings, and the availability report."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import fairfl.federated.data as datasets
from fairfl.federated.data import load_dataset, report
from fairfl.federated.data.base import downloads_allowed
from fairfl.federated.data.mnist import read_idx
from fairfl.base.errors import ConfigError, DatasetNotFoundError
from fairfl.base.paths import data_root, results_root


def test_test_environment_is_isolated(fairfl_env):
    assert data_root() == fairfl_env["data"].resolve()
    assert results_root() == fairfl_env["results"].resolve()
    assert not downloads_allowed()


def test_fashion_mnist(fmnist, fairfl_env):
    ds = fmnist
    assert (len(ds.y_train), len(ds.y_test)) == (60000, 10000)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    assert ds.class_names[0] == "T-shirt/top" and len(ds.class_names) == 10
    # "global" normalisation with training statistics
    assert abs(float(ds.x_train.mean())) < 1e-3 and abs(float(ds.x_train.std()) - 1) < 1e-3
    # staged, decompressed, into the (temporary) data root: by this load (the source is then the
    # Debian copy) or by an earlier process of the session (the source is then the staged copy)
    raw = fairfl_env["data"] / "FashionMNIST" / "raw"
    assert ds.source in ("/usr/share/datasets/fashion-mnist", str(raw))
    assert (raw / "train-images-idx3-ubyte").stat().st_size == 16 + 60000 * 28 * 28
    assert (raw / "t10k-labels-idx1-ubyte").stat().st_size == 8 + 10000
    from fairfl.federated.data.base import sha256
    from fairfl.federated.data.mnist import FASHION_SHA256
    assert all(sha256(raw / f) == staged for f, (_, staged) in FASHION_SHA256.items())


def test_load_dataset_is_memoised(fmnist):
    assert load_dataset("fashion_mnist") is fmnist


def test_fashion_mnist_unnormalised(fmnist):
    raw = load_dataset("fashion_mnist", normalize="none")
    assert float(raw.x_train.min()) == 0.0 and float(raw.x_train.max()) == 1.0
    assert torch.equal(raw.y_train, fmnist.y_train)
    # the normalised copy is an affine map of the raw one
    mean, std = raw.x_train.mean(), raw.x_train.std()
    torch.testing.assert_close(fmnist.x_test[:50], (raw.x_test[:50] - mean) / std, rtol=1e-4, atol=1e-4)


def test_class_subset_relabels_in_the_given_order(fmnist):
    three = load_dataset("fashion_mnist", classes=(6, 2, 0))      # q-FFL: shirt, pullover, T-shirt
    assert three.num_classes == 3 and three.class_names[0] == fmnist.class_names[6]
    assert (len(three.y_train), len(three.y_test)) == (18000, 3000)
    for new, old in enumerate((6, 2, 0)):
        assert torch.equal(three.x_test[three.y_test == new], fmnist.x_test[fmnist.y_test == old])


def test_a_class_selection_is_kept_without_the_full_dataset_it_was_cut_from(fmnist, monkeypatch):
    """Notebook 06 asks for three classes of the per-feature Fashion-MNIST, never for all ten: every
    worker and the kernel kept the whole 220 MB beside the 66 MB they used. Now the selection is
    memoised on its own, and the whole dataset only once it is asked for itself."""
    from fairfl.federated.data import base
    monkeypatch.setattr(base, "_CACHE", {})
    three = load_dataset("fashion_mnist", classes=(6, 2, 0), normalize="per_feature")
    assert load_dataset("fashion_mnist", classes=(6, 2, 0), normalize="per_feature") is three
    assert [k[-1] for k in base._CACHE] == [(6, 2, 0)]             # no entry for all ten classes
    full = load_dataset("fashion_mnist", normalize="per_feature")
    assert load_dataset("fashion_mnist", normalize="per_feature") is full
    assert load_dataset("fashion_mnist", classes=(6, 2, 0), normalize="per_feature") is three
    assert torch.equal(three.x_train, base.select_classes(full, (6, 2, 0)).x_train)


@pytest.mark.parametrize("classes", [(6, 6), (10,), (-1, 2)])
def test_class_subset_rejects_bad_classes(fmnist, classes):
    with pytest.raises(ConfigError, match="classes"):
        load_dataset("fashion_mnist", classes=classes)


def test_adult():
    ds = load_dataset("adult")
    assert (len(ds.y_train), len(ds.y_test)) == (32561, 16281)
    assert ds.x_train.shape == (32561, 99) and ds.x_test.shape == (16281, 99)
    assert len(ds.feature_names) == 99 and ds.num_classes == 2
    # binary one-hot of 8 categorical columns: each row has at most 8 ones (a missing value: none)
    assert set(torch.unique(ds.x_train).tolist()) == {0.0, 1.0}
    assert set(torch.unique(ds.x_test).tolist()) == {0.0, 1.0}
    assert int(ds.x_train.sum(1).max()) == 8 and int(ds.x_test.sum(1).max()) == 8
    assert int(ds.x_train.sum(1).min()) >= 5
    # one-hot within each column group
    sex = [i for i, n in enumerate(ds.feature_names) if n.startswith("sex=")]
    assert len(sex) == 2 and torch.equal(ds.x_train[:, sex].sum(1), torch.ones(32561))
    # income > 50K
    assert int(ds.y_train.sum()) == 7841 and int(ds.y_test.sum()) == 3846
    # the 'phd' domain: education == Doctorate
    assert int(ds.groups_train.sum()) == 413 and int(ds.groups_test.sum()) == 181
    assert set(ds.groups_train.tolist()) == {0, 1}
    doc = ds.feature_names.index("education=Doctorate")
    assert torch.equal(ds.x_train[:, doc].long(), torch.from_numpy(ds.groups_train))


def test_adult_attribute_partition():
    from fairfl.federated.partition import PartitionSpec, federate
    fed = federate(load_dataset("adult"), PartitionSpec("attribute", num_clients=2, split=None))
    assert [c.num_train for c in fed.clients] == [32561 - 413, 413]
    assert [len(c.y_test) for c in fed.clients] == [16281 - 181, 181]


def test_mnist_5k():
    ds = load_dataset("mnist_5k")
    assert len(ds.y_train) + len(ds.y_test) == 5000
    assert (len(ds.y_train), len(ds.y_test)) == (4000, 1000)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert (torch.bincount(ds.y_train, minlength=10) + torch.bincount(ds.y_test, minlength=10)).tolist() == [500] * 10
    assert torch.bincount(ds.y_test).tolist() == [100] * 10   # stratified 20 % test split
    other = load_dataset("mnist_5k", seed=1)
    assert not torch.equal(other.y_test, ds.y_test) or not torch.equal(other.x_test, ds.x_test)


def test_report_offline():
    rows = {name: (status, detail) for name, status, detail in
            report(["fashion_mnist", "adult", "mnist_5k", "cifar10"])}
    assert rows["fashion_mnist"][0] == "ok" and "60000 train / 10000 test" in rows["fashion_mnist"][1]
    assert rows["adult"][0] == "ok" and "32561 train / 16281 test" in rows["adult"][1]
    assert rows["mnist_5k"][0] == "ok" and "4000 train / 1000 test" in rows["mnist_5k"][1]
    assert rows["cifar10"][0] == "missing" and "cifar10" in rows["cifar10"][1]
    assert "\n" not in rows["cifar10"][1]


def test_idx_reader_matches_the_raw_bytes_and_rejects_bad_files(fmnist, fairfl_env, tmp_path):
    raw = fairfl_env["data"] / "FashionMNIST" / "raw"
    labels = read_idx(raw / "train-labels-idx1-ubyte")
    assert labels.dtype == np.uint8 and labels.shape == (60000,)
    assert torch.equal(torch.from_numpy(labels).long(), fmnist.y_train)
    images = read_idx(raw / "t10k-images-idx3-ubyte")
    assert images.shape == (10000, 28, 28)
    assert images[0].tobytes() == (raw / "t10k-images-idx3-ubyte").read_bytes()[16:16 + 784]
    truncated = tmp_path / "truncated"
    truncated.write_bytes((raw / "t10k-labels-idx1-ubyte").read_bytes()[:-1])
    with pytest.raises(DatasetNotFoundError, match="truncated or corrupt"):
        read_idx(truncated)
    not_idx = tmp_path / "not_idx"
    not_idx.write_bytes(b"<html>404</html>")
    with pytest.raises(DatasetNotFoundError, match="not an idx file"):
        read_idx(not_idx)


def test_loading_fashion_mnist_does_not_import_torchvision(fmnist, fairfl_env):
    # torchvision's import costs about 2 s in every worker process of a sweep
    code = ("import sys; from fairfl.federated.data import load_dataset; load_dataset('fashion_mnist'); "
            "print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "FAIRFL_DATA": str(fairfl_env["data"])})
    assert out.stdout.strip() == "False"


def test_normalisation_does_not_depend_on_the_number_of_threads(fmnist, fairfl_env):
    # a one-thread sweep worker and a two-thread notebook must see the same data
    code = ("import sys, torch; torch.set_num_threads(int(sys.argv[1])); "
            "from fairfl.federated.data import load_dataset; x = load_dataset('fashion_mnist').x_train; "
            "print(float(x[7, 0, 14, 14]), float(x[123, 0, 20, 3]))")
    env = {**os.environ, "FAIRFL_DATA": str(fairfl_env["data"])}
    outs = {subprocess.run([sys.executable, "-c", code, str(t)], capture_output=True, text=True, check=True,
                           env=env).stdout for t in (1, 2)}
    assert len(outs) == 1
