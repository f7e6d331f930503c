"""The real offline datasets: sizes, shapes, encodings, and the availability report."""
from __future__ import annotations

import pytest
import torch

import fairfl.datasets as datasets
from fairfl.datasets import load_dataset, report
from fairfl.errors import ConfigError
from fairfl.paths import data_root, results_root


def test_test_environment_is_isolated(fairfl_env):
    assert data_root() == fairfl_env["data"].resolve()
    assert results_root() == fairfl_env["results"].resolve()
    assert not datasets.downloads_allowed()


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
    assert ds.source == "/usr/share/datasets/fashion-mnist"
    # staged, decompressed, into the (temporary) data root
    raw = fairfl_env["data"] / "FashionMNIST" / "raw"
    assert (raw / "train-images-idx3-ubyte").stat().st_size == 16 + 60000 * 28 * 28
    assert (raw / "t10k-labels-idx1-ubyte").stat().st_size == 8 + 10000


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
    from fairfl.partition import PartitionSpec, federate
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
