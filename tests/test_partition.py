"""Partitions (iid, label shards, Dirichlet, one class, attribute) and per-client splits."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fairfl.base.errors import ConfigError
from fairfl.federated.partition import (
                                        PartitionSpec, by_attribute, dirichlet, federate, iid, label_shards, one_class_per_client,
                                        partition_indices, split_client,
                                        )


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_disjoint_complete(parts, n):
    """The parts are disjoint, and together they are exactly range(n)."""
    allidx = np.concatenate(parts)
    assert len(allidx) == n, f"{len(allidx)} indices for {n} samples (overlap or loss)"
    assert len(np.unique(allidx)) == n, "some index is in two clients"
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


# ----------------------------------------------------------------------------- iid

def test_iid_sizes_differ_by_at_most_one_and_cover_everything():
    parts = iid(103, 10, rng())
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sorted(sizes) == [10] * 7 + [11] * 3
    assert_disjoint_complete(parts, 103)


def test_iid_is_shuffled_not_contiguous():
    parts = iid(1000, 4, rng(1))
    # a contiguous deal would give client 0 exactly 0..249
    assert not np.array_equal(parts[0], np.arange(250))


def test_too_many_clients_raise():
    with pytest.raises(ConfigError, match="clients for only"):
        iid(5, 6, rng())
    with pytest.raises(ConfigError, match="num_clients"):
        iid(5, 0, rng())


# ----------------------------------------------------------------------------- label shards

def test_label_shards_on_fashion_mnist(fmnist):
    labels = fmnist.y_train.numpy()
    parts = label_shards(labels, 100, 2, rng(0))
    assert len(parts) == 100
    assert {len(p) for p in parts} == {600}
    assert_disjoint_complete(parts, 60000)
    # 200 shards of 300 samples over 10 classes of 6000: every shard is one class
    for p in parts:
        assert len(np.unique(labels[p])) <= 2
    # and at random: not every client holds two shards of one class
    assert sum(len(np.unique(labels[p])) == 2 for p in parts) > 50


def test_label_shards_more_shards_per_client(fmnist):
    labels = fmnist.y_train.numpy()
    parts = label_shards(labels, 20, 3, rng(3))
    assert {len(p) for p in parts} == {3000}
    assert max(len(np.unique(labels[p])) for p in parts) <= 3
    assert_disjoint_complete(parts, 60000)


def test_label_shards_must_divide_the_data(fmnist):
    with pytest.raises(ConfigError, match="do not divide 60000"):
        label_shards(fmnist.y_train.numpy(), 7, 2, rng())
    with pytest.raises(ConfigError, match="shards_per_client"):
        label_shards(np.zeros(10, int), 2, 0, rng())


def test_label_shards_shards_are_label_sorted():
    # 4 classes x 25 samples, 4 clients x 1 shard of 25: each client gets exactly one class
    labels = np.repeat(np.arange(4), 25)
    rng(0).shuffle(labels)
    parts = label_shards(labels, 4, 1, rng(1))
    assert sorted(int(np.unique(labels[p]).item()) for p in parts) == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- dirichlet

def test_dirichlet_disjoint_complete_min_size():
    labels = rng(5).integers(0, 10, 2000)
    parts = dirichlet(labels, 20, 0.3, rng(0), min_size=10)
    assert len(parts) == 20
    assert_disjoint_complete(parts, 2000)
    assert min(len(p) for p in parts) >= 10


def test_dirichlet_small_beta_is_skewed_large_beta_is_balanced():
    labels = np.repeat(np.arange(10), 500)
    skewed = dirichlet(labels, 10, 0.05, rng(0))
    flat = dirichlet(labels, 10, 1000.0, rng(0))

    def mean_classes_held(parts, share=0.05):
        # classes that make up at least `share` of a client's data
        return np.mean([np.sum(np.bincount(labels[p], minlength=10) >= share * len(p)) for p in parts])
    assert mean_classes_held(skewed) < 5 < mean_classes_held(flat)


def test_dirichlet_impossible_min_size_and_bad_beta():
    labels = np.repeat(np.arange(2), 10)
    with pytest.raises(ConfigError, match="min_size|< 11"):
        dirichlet(labels, 2, 0.5, rng(), min_size=11, max_tries=20)
    with pytest.raises(ConfigError, match="beta"):
        dirichlet(labels, 2, 0.0, rng())


# ----------------------------------------------------------------------------- one class / attribute

def test_one_class_per_client():
    labels = np.array([0, 1, 2, 0, 2, 2, 6, 1])
    parts = one_class_per_client(labels, [2, 0, 6])
    np.testing.assert_array_equal(parts[0], [2, 4, 5])
    np.testing.assert_array_equal(parts[1], [0, 3])
    np.testing.assert_array_equal(parts[2], [6])
    with pytest.raises(ConfigError, match="distinct"):
        one_class_per_client(labels, [0, 0])
    with pytest.raises(ConfigError, match="class 9 has no samples"):
        one_class_per_client(labels, [0, 9])


def test_by_attribute():
    groups = np.array([1, 0, 0, 1, 0])
    parts = by_attribute(groups, [0, 1])
    np.testing.assert_array_equal(parts[0], [1, 2, 4])
    np.testing.assert_array_equal(parts[1], [0, 3])
    with pytest.raises(ConfigError, match="attribute value 3"):
        by_attribute(groups, [0, 3])


def test_federate_one_class_uses_the_test_file(fmnist):
    fed = federate(fmnist, PartitionSpec("one_class", num_clients=3, classes=(0, 2, 6), split=None))
    assert fed.num_clients == 3
    for c, cls in zip(fed.clients, (0, 2, 6)):
        assert c.num_train == 6000 and len(c.y_test) == 1000 and len(c.y_val) == 0
        assert set(c.y_train.tolist()) == {cls} and set(c.y_test.tolist()) == {cls}


# ----------------------------------------------------------------------------- split_client

@pytest.mark.parametrize("scheme", ["shards", "dirichlet"])
def test_test_rows_from_the_test_file_keep_train_and_validation_and_each_labels_count(fmnist, scheme):
    """test_source='file': each client's train and validation rows are the split's, byte for byte; its
    test rows are rows of the standard test file, with its split's test label counts. No partition of
    the training file, whatever its seed, shares a row with any client's test set (notebook 06's
    tuning seed trained on what a reporting seed tested on; the cache key names the option only
    where it is set, so every earlier key is unchanged)."""
    from fairfl.runs.config import ExperimentConfig
    kw = dict(num_clients=20, shards_per_client=2) if scheme == "shards" else dict(
        num_clients=20, beta=0.5, split=(0.6, 0.2, 0.2), min_size=250)
    split = federate(fmnist, PartitionSpec(scheme, seed=1, **kw))
    spec = PartitionSpec(scheme, seed=1, test_source="file", **kw)
    filed = federate(fmnist, spec)
    test_bytes = {bytes(r) for r in fmnist.x_test.numpy().reshape(len(fmnist.x_test), -1)}
    for a, b in zip(split.clients, filed.clients):
        for part in ("x_train", "y_train", "x_val", "y_val"):
            assert torch.equal(getattr(a, part), getattr(b, part))
        assert np.bincount(a.y_test.numpy(), minlength=10).tolist() == np.bincount(b.y_test.numpy(), minlength=10).tolist()
        rows = b.x_test.numpy().reshape(len(b.x_test), -1)
        assert all(bytes(r) in test_bytes for r in rows[:25])
    other = federate(fmnist, PartitionSpec(scheme, seed=2, test_source="file", **kw))
    assert any(not torch.equal(a.x_test, b.x_test) for a, b in zip(filed.clients, other.clients))
    assert "test_source" not in ExperimentConfig(partition=PartitionSpec(scheme, seed=1, **kw)).to_dict()["partition"]
    assert ExperimentConfig(partition=spec).to_dict()["partition"]["test_source"] == "file"
    with pytest.raises(ConfigError, match="already test on the standard test file"):
        PartitionSpec("one_class", num_clients=3, classes=(0, 1, 2), split=None, test_source="file")


def test_split_client_80_10_10_of_600():
    idx = np.arange(1000, 1600)
    tr, va, te = split_client(idx, (0.8, 0.1, 0.1), rng(0))
    assert (len(tr), len(va), len(te)) == (480, 60, 60)
    allidx = np.concatenate([tr, va, te])
    assert len(np.unique(allidx)) == 600
    np.testing.assert_array_equal(np.sort(allidx), idx)


def test_split_client_shuffles_before_cutting():
    idx = np.arange(600)
    tr, va, te = split_client(idx, (0.8, 0.1, 0.1), rng(0))
    assert not np.array_equal(te, np.arange(540, 600))


def test_split_client_rounding_keeps_every_index():
    idx = np.arange(7)
    parts = split_client(idx, (0.5, 0.25, 0.25), rng(0))
    assert [len(p) for p in parts] == [3, 2, 2]
    assert_disjoint_complete(parts, 7)


def test_federated_splits_sizes_and_disjoint(fmnist):
    fed = federate(fmnist, PartitionSpec("shards", num_clients=100, shards_per_client=2, seed=0))
    for c, tr in zip(fed.clients, fed.train_indices):
        assert (c.num_train, len(c.y_val), len(c.y_test)) == (480, 60, 60)
        assert len(tr) == 480
        torch.testing.assert_close(c.x_train, fmnist.x_train[torch.from_numpy(tr)], rtol=0, atol=0)
    all_idx = np.concatenate(fed.train_indices)
    assert len(np.unique(all_idx)) == len(all_idx) == 48000
    counts = fed.label_counts("train")
    assert counts.shape == (100, 10) and counts.sum() == 48000


# ----------------------------------------------------------------------------- determinism

def _indices(ds, spec):
    fed = federate(ds, spec)
    return fed.train_indices, [c.y_test.numpy().copy() for c in fed.clients]


@pytest.mark.parametrize("scheme", ["iid", "shards", "dirichlet"])
def test_federate_determinism(fmnist, scheme):
    spec = PartitionSpec(scheme, num_clients=20, shards_per_client=2, beta=0.5, seed=3)
    np.random.seed(1), torch.manual_seed(1)
    a_train, a_test = _indices(fmnist, spec)
    np.random.seed(999), torch.manual_seed(999)  # global state must not matter
    np.random.rand(17), torch.rand(5)
    b_train, b_test = _indices(fmnist, spec)
    for x, y in zip(a_train, b_train):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a_test, b_test):
        np.testing.assert_array_equal(x, y)
    c_train, _ = _indices(fmnist, dataclasses.replace(spec, seed=4))
    assert any(not np.array_equal(x, y) for x, y in zip(a_train, c_train))


def test_partition_indices_ignore_global_random_state(fmnist):
    spec = PartitionSpec("shards", num_clients=10, shards_per_client=2, seed=0)
    np.random.seed(0)
    a = partition_indices(fmnist, spec)
    np.random.seed(12345)
    torch.manual_seed(12345)
    b = partition_indices(fmnist, spec)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- the released-code trap

def test_shards_then_split_test_sets_are_not_single_class(fmnist):
    """FedMGDA+'s released code cut each client's share in label order, leaving a one-class test
    set. With a shuffled split, a client holding two classes of 300 samples each has a
    60-sample test set with both classes unless all 60 draws hit one class (p ~ 2^-59)."""
    fed = federate(fmnist, PartitionSpec("shards", num_clients=100, shards_per_client=2, seed=0))
    two_class = [c for c in fed.clients if len(torch.unique(c.y_train)) >= 2]
    assert len(two_class) > 50
    for c in two_class:
        assert len(torch.unique(c.y_test)) >= 2
        assert len(torch.unique(c.y_val)) >= 2


def test_split_of_label_sorted_indices_still_mixes_classes(fmnist):
    """The trap itself: hand split_client a client's indices in label-sorted order (what the
    released code cut); the test part must still hold both classes."""
    labels = fmnist.y_train.numpy()
    parts = label_shards(labels, 100, 2, rng(0))
    checked = 0
    for p in parts:
        if len(np.unique(labels[p])) < 2:
            continue
        sorted_by_label = p[np.argsort(labels[p], kind="stable")]
        for seed in range(3):
            tr, va, te = split_client(sorted_by_label, (0.8, 0.1, 0.1), rng(seed))
            assert len(np.unique(labels[te])) == 2
            assert len(np.unique(labels[tr])) == 2
        checked += 1
    assert checked > 50


# ----------------------------------------------------------------------------- spec validation

@pytest.mark.parametrize("kwargs, match", [
    (dict(scheme="nope"), "scheme='nope' is not allowed"),
    (dict(scheme="iid", split=(0.5, 0.5)), "split"),
    (dict(scheme="iid", split=(0.8, 0.1, 0.2)), "split"),
    (dict(scheme="iid", split=(0.0, 0.5, 0.5)), "split"),
    (dict(scheme="iid", split=None), "split=None"),
    (dict(scheme="one_class", split=None), "classes"),
])
def test_partition_spec_fails_at_construction(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PartitionSpec(**kwargs)


# ----------------------------------------------------------------------------- properties

small_labels = st.integers(1, 6).flatmap(
    lambda k: st.lists(st.integers(0, k - 1), min_size=1, max_size=120)).map(np.array)


@given(n=st.integers(1, 300), clients=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_iid_property(n, clients, seed):
    if clients > n:
        with pytest.raises(ConfigError):
            iid(n, clients, rng(seed))
        return
    parts = iid(n, clients, rng(seed))
    assert len(parts) == clients
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert_disjoint_complete(parts, n)


@given(labels=small_labels, clients=st.integers(1, 8), spc=st.integers(1, 4), seed=st.integers(0, 1000))
def test_label_shards_property(labels, clients, spc, seed):
    n = len(labels)
    if clients > n or n % (clients * spc):
        with pytest.raises(ConfigError):
            label_shards(labels, clients, spc, rng(seed))
        return
    parts = label_shards(labels, clients, spc, rng(seed))
    assert len(parts) == clients
    assert {len(p) for p in parts} == {n // clients}
    assert_disjoint_complete(parts, n)


@given(shards_per_class=st.lists(st.integers(1, 4), min_size=1, max_size=5), shard_size=st.integers(1, 7),
       spc=st.integers(1, 3), seed=st.integers(0, 1000))
def test_label_shards_property_one_class_per_shard(shards_per_class, shard_size, spc, seed):
    """When every class fills whole shards, a client holds at most ``spc`` classes, and each of
    its classes in multiples of the shard size."""
    num_shards = sum(shards_per_class)
    if num_shards % spc:
        return
    clients = num_shards // spc
    labels = np.repeat(np.arange(len(shards_per_class)), np.array(shards_per_class) * shard_size)
    rng(seed + 1).shuffle(labels)
    parts = label_shards(labels, clients, spc, rng(seed))
    assert_disjoint_complete(parts, len(labels))
    for p in parts:
        counts = np.bincount(labels[p])
        counts = counts[counts > 0]
        assert len(counts) <= spc
        assert np.all(counts % shard_size == 0)


@given(labels=small_labels, clients=st.integers(1, 6), beta=st.floats(0.05, 50), seed=st.integers(0, 1000))
def test_dirichlet_property(labels, clients, beta, seed):
    n = len(labels)
    if clients > n:
        with pytest.raises(ConfigError):
            dirichlet(labels, clients, beta, rng(seed))
        return
    try:
        parts = dirichlet(labels, clients, beta, rng(seed), max_tries=200)
    except ConfigError as e:  # every draw left a client empty: allowed, but only with this message
        assert "min_size" in str(e) or "samples" in str(e)
        return
    assert len(parts) == clients
    assert min(len(p) for p in parts) >= 1
    assert_disjoint_complete(parts, n)


# ----------------------------------------------------------------------------- FedMGDA+'s code's Adult reading

@pytest.fixture(scope="module")
def adult():
    from fairfl.federated.data import load_dataset
    return load_dataset("adult")


def test_official_code_reading_trains_on_the_row_after_each_domain_row(adult):
    """watml/Fed-MGDA c8d8586: adult/sampling.py l.63 numbers rows from 1, adult/update.py l.25
    indexes from 0, update.py l.45 keeps the first 80 % of list(set)."""
    true = federate(adult, PartitionSpec("attribute", num_clients=2, split=None))
    code = federate(adult, PartitionSpec("attribute", num_clients=2, split=None, reading="official-code"))
    groups, y = adult.groups_train, adult.y_train.numpy()
    phd, phd_code = true.train_indices[1], code.train_indices[1]
    # by hand: the first PhD rows of adult.data are rows 20, 63, 89 and 96 (0-based); the code's "PhD"
    # client holds the rows after them, 21, 64, 90 and 97, none of which is a PhD row
    assert phd[:4].tolist() == [20, 63, 89, 96] and groups[[20, 63, 89, 96]].tolist() == [1, 1, 1, 1]
    assert phd_code[:4].tolist() == [21, 64, 90, 97] and groups[[21, 64, 90, 97]].tolist() == [0, 0, 0, 0]
    # 80 % of 413 shifted rows; of them 3 are PhD rows (3390, 3578 and 12715: a PhD row after a PhD row)
    assert len(phd_code) == int(0.8 * 413) == 330 and set(phd_code) <= set(phd + 1)
    assert phd_code[groups[phd_code] == 1].tolist() == [3390, 3578, 12715]
    assert {3389, 3577, 12714} <= set(phd)
    # >50K: 71 of 330 (21.5 %) instead of the PhD domain's 74.1 %
    assert int(y[phd_code].sum()) == 71 and round(100 * y[phd].mean(), 1) == 74.1
    # the 83 rows the code's 80 % split drops, in CPython's set order (the same 80 % under CPython 3.6)
    assert sorted(set(phd + 1) - set(phd_code))[:3] == [1690, 2022, 4019]
    # the non-PhD set iterates in ascending order: rows 1 .. 26051 that follow a non-PhD row
    non_code = code.train_indices[0]
    assert len(non_code) == int(0.8 * (32561 - 413)) == 25718 and non_code[0] == 1 and non_code[-1] == 26051
    assert set(non_code) == set(true.train_indices[0] + 1) & set(range(26052))
    # the test rows are the standard test file's, by domain, as in the true reading
    for a, b in zip(true.clients, code.clients):
        assert torch.equal(a.y_test, b.y_test) and torch.equal(a.x_test, b.x_test)
    assert torch.equal(code.clients[1].x_train, adult.x_train[torch.from_numpy(phd_code)])


@pytest.mark.parametrize("kwargs, match", [
    (dict(reading="official"), r"reading='official' is not allowed; it must be one of 'true', 'official-code'"),
    (dict(reading="official-code", split=(0.8, 0.1, 0.1)), r"needs scheme='attribute', split=None"),
    (dict(reading="official-code", scheme="one_class", classes=(0, 1)), r"needs scheme='attribute'"),
    (dict(reading="official-code", pooled=True), r"pooled=False \(got scheme='attribute', split=None, pooled=True\)"),
])
def test_official_code_reading_is_validated(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PartitionSpec(**{"scheme": "attribute", "num_clients": 2, "split": None, **kwargs})


def test_official_code_reading_is_adult_only_and_enters_the_key(fmnist):
    from fairfl import ExperimentConfig
    spec = PartitionSpec("attribute", num_clients=2, split=None, reading="official-code")
    with pytest.raises(ConfigError, match="not defined for dataset 'fashion_mnist'"):
        ExperimentConfig(dataset="fashion_mnist", partition=spec)
    with pytest.raises(ConfigError, match="defined for Adult only"):
        partition_indices(dataclasses.replace(fmnist, groups_train=(fmnist.y_train.numpy() == 0).astype(np.int64)), spec)
    true = ExperimentConfig(dataset="adult", model="logreg", partition=dataclasses.replace(spec, reading="true"))
    code = true.replace(partition=spec)
    assert code.key() != true.key() and ExperimentConfig.from_dict(code.to_dict()) == code
    # the default is left out of the canonical form: keys made before the option existed still hold
    assert "reading" not in true.to_dict()["partition"] and code.to_dict()["partition"]["reading"] == "official-code"


def test_dirichlet_min_size_is_an_option_of_its_scheme_only_and_keeps_old_keys(fmnist):
    """notebook 06's Dirichlet federation: 50 clients of at least 250 samples (50 for test with a
    20 % test share); the option is refused elsewhere, and its default is left out of the
    canonical form, so every key made before it existed still names the same run."""
    from fairfl import ExperimentConfig
    spec = PartitionSpec("dirichlet", num_clients=50, beta=0.5, split=(0.6, 0.2, 0.2), min_size=250, seed=3)
    parts = partition_indices(fmnist, spec)
    assert min(len(p) for p in parts) >= 250 and len(parts) == 50
    fed = federate(fmnist, spec)
    assert min(len(c.y_test) for c in fed.clients) >= 50
    # the redraws come from the partition's own generator: one seed, one partition
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(fmnist, spec)))
    with pytest.raises(ConfigError, match="min_size=5 applies to scheme 'dirichlet'"):
        PartitionSpec("shards", num_clients=10, min_size=5)
    plain = ExperimentConfig(partition=PartitionSpec("dirichlet", num_clients=50, beta=0.5))
    assert "min_size" not in plain.to_dict()["partition"]
    sized = plain.replace(partition=spec)
    # train_sizes counts what federate builds, without building it
    from fairfl.federated.partition import train_sizes
    assert train_sizes(fmnist, spec) == [len(c.y_train) for c in fed.clients]
    held_out = PartitionSpec("one_class", num_clients=3, classes=(0, 2, 6), split=None, val_fraction=0.1)
    assert train_sizes(fmnist, held_out) == [len(c.y_train) for c in federate(fmnist, held_out).clients]
    assert sized.to_dict()["partition"]["min_size"] == 250 and ExperimentConfig.from_dict(sized.to_dict()) == sized
