"""Every bad input is named before any compute is spent: the probe of the issue "trustworthy
results", kept as a table. Each API case must raise its error class with a message that names the
parameter, without loading any data; each CLI case must exit 2 with one ``error:`` line naming
it, and no traceback."""
from __future__ import annotations

import math

import pytest

import fairfl.federated.data.base
from fairfl import ConfigError, ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms.ditto import Ditto
from fairfl.federated.algorithms.fmgda import FMGDA
from fairfl.cli import main

NAN, INF = math.nan, math.inf
OK = ExperimentConfig(dataset="fashion_mnist", model="mlp2",
                      partition=PartitionSpec("shards", num_clients=10, shards_per_client=2),
                      rounds=2, participation=0.3, eval_every=1, local=LocalTraining(batch_size=50))


def config(**changes):
    return lambda: OK.replace(**changes)


def algorithm(**spec):
    return config(algorithm=spec)


def attack(**spec):
    return config(attacks=(spec,))


API = [
    # the experiment
    ("dataset name", config(dataset="fashion-mnist"), "unknown dataset 'fashion-mnist'"),
    ("dataset type", config(dataset=3), "dataset=3 is not allowed; it must be a string"),
    ("model name", config(model="resnet18"), "unknown model 'resnet18'"),
    ("rounds 0", config(rounds=0), "rounds=0 is not allowed"),
    ("rounds float", config(rounds=2.5), "rounds=2.5 is not allowed"),
    ("rounds bool", config(rounds=True), "rounds=True is not allowed"),
    ("participation 0", config(participation=0.0), "participation=0.0 is not allowed"),
    ("participation 1.5", config(participation=1.5), "participation=1.5 is not allowed"),
    ("participation NaN", config(participation=NAN), "participation=nan is not allowed"),
    ("participation str", config(participation="0.1"), "participation='0.1' is not allowed"),
    ("clients_per_round 0", config(clients_per_round=0), "clients_per_round=0 is not allowed"),
    ("clients_per_round too many", config(clients_per_round=11), "clients_per_round=11 is more than the 10"),
    ("eval_every 0", config(eval_every=0), "eval_every=0 is not allowed"),
    ("checkpoint_every 0", config(checkpoint_every=0), "checkpoint_every=0 is not allowed"),
    ("seed -1", config(seed=-1), "seed=-1 is not allowed"),
    ("seed float", config(seed=1.5), "seed=1.5 is not allowed"),
    ("batched str", config(batched="no"), "batched='no' is not allowed"),
    ("track_improved str", config(track_improved="false"), "track_improved='false' is not allowed"),
    ("eligible empty", config(eligible_clients=()), "eligible_clients must be non-empty"),
    ("eligible out of range", config(eligible_clients=(0, 50)), "eligible_clients must be non-empty client ids"),
    ("eligible str", config(eligible_clients=("a",)), "eligible_clients=('a',) is not allowed"),
    ("local not LocalTraining", config(local=5), "local must be a LocalTraining"),
    ("partition not PartitionSpec", config(partition="shards"), "partition must be a PartitionSpec"),
    ("no test data", config(partition=PartitionSpec("shards", num_clients=10, split=(1.0, 0.0, 0.0))),
     "gives the clients no test data"),
    # dataset and model options
    ("dataset option typo", config(dataset_options={"normalise": "global"}), "unknown option(s) normalise"),
    ("dataset option value", config(dataset_options={"normalize": "zscore"}), "normalize='zscore' is not allowed"),
    ("dataset classes repeated", config(dataset_options={"classes": (0, 0)}), "classes=(0, 0) is not allowed"),
    ("dataset options not a mapping", config(dataset_options="global"), "dataset_options must be a mapping"),
    ("dataset root option", config(dataset_options={"root": "/tmp"}), "unknown option(s) root"),
    ("model option typo", config(model_options={"hiden": (10,)}), "unknown option(s) hiden"),
    ("model option type", config(model_options={"hidden": "wide"}), "hidden='wide' is not allowed"),
    # the algorithm
    ("algorithm name", config(algorithm="fedmgda_plus_plus"), "unknown algorithm 'fedmgda_plus_plus'"),
    ("algorithm type", config(algorithm=42), "algorithm must be an Algorithm"),
    ("algorithm option typo", algorithm(name="fedavg", momentum=0.9), "fedavg: unknown option(s) momentum"),
    ("server_lr 0", algorithm(name="fedavg", server_lr=0.0), "server_lr=0.0 is not allowed"),
    ("server_lr inf", algorithm(name="fedmgda_plus", server_lr=INF), "server_lr=inf is not allowed"),
    ("decay 0", algorithm(name="fedavg_n", decay=0), "decay=0.0 is not allowed"),
    ("decay 1.5", algorithm(name="fedmgda_plus", decay=1.5), "decay=1.5 is not allowed"),
    ("eps True", algorithm(name="fedmgda_plus", eps=True), "eps=True is not allowed"),
    ("eps 1.5", algorithm(name="fedmgda_plus", eps=1.5), "eps=1.5 is not allowed"),
    ("eps NaN", algorithm(name="fedmgda_plus", eps=NAN), "eps=nan is not allowed"),
    ("fedfv tau float", algorithm(name="fedfv", tau=1.5), "tau=1.5 is not allowed"),
    ("fedfv order", algorithm(name="fedfv", order="sideways"), "order='sideways' is not allowed"),
    ("qfedavg q", algorithm(name="qfedavg", q=-1.0), "q=-1.0 is not allowed"),
    ("qfedavg L", algorithm(name="qfedavg", L=0.0), "L=0.0 is not allowed"),
    ("afl lr_lambda", algorithm(name="afl", lr_lambda=-0.5), "lr_lambda=-0.5 is not allowed"),
    ("dqnfed step", algorithm(name="dqnfed", step="newton"), "step='newton' is not allowed"),
    ("dqnfed server_lr with eq17", algorithm(name="dqnfed", server_lr=0.1), "server_lr and decay set the global rate"),
    ("term t NaN", algorithm(name="term", t=NAN), "t=nan is not allowed"),
    ("ditto lam", algorithm(name="ditto", lam=-1.0), "lam=-1.0 is not allowed"),
    ("ditto unstable", config(algorithm=Ditto(lam=250.0)), "η·λ = 2.5 ≥ 2"),
    ("fmgda single-task model", config(algorithm=FMGDA()), "fmgda trains one head per objective"),
    # attacks
    ("attacks not a list", config(attacks={"kind": "bias"}), "attacks must be a list"),
    ("attack kind", attack(kind="poison", client=0), "attack kind 'poison'"),
    ("attack client str", attack(kind="bias", client="1", bias=1.0), "client='1' is not allowed"),
    ("attack bias str", attack(kind="bias", client=1, bias="big"), "bias='big' is not allowed"),
    ("attack bias NaN", attack(kind="bias", client=1, bias=NAN), "bias=nan is not allowed"),
    ("attack old 'on'", attack(kind="bias", client=1, bias=1.0, on="total"), "'on' is now called 'target'"),
    ("attack target", attack(kind="bias", client=1, bias=1.0, target="sum"), "target='sum' is not allowed"),
    ("attack factor", attack(kind="scaling", client=0, factor=-1.0), "factor=-1.0 is not allowed"),
    ("attack factor missing", attack(kind="scaling", client=0), "factor must be given"),
    ("attack client out of range", attack(kind="bias", client=99, bias=1.0), "attack client 99"),
    # the partition and the local training
    ("scheme", lambda: PartitionSpec("pathological"), "scheme='pathological' is not allowed"),
    ("num_clients 0", lambda: PartitionSpec("iid", num_clients=0), "num_clients=0 is not allowed"),
    ("shards_per_client 0", lambda: PartitionSpec("shards", shards_per_client=0), "shards_per_client=0 is not allowed"),
    ("beta 0", lambda: PartitionSpec("dirichlet", beta=0.0), "beta=0.0 is not allowed"),
    ("split sum", lambda: PartitionSpec("iid", split=(0.9, 0.2, 0.0)), "split=(0.9, 0.2, 0.0) is not allowed"),
    ("split length", lambda: PartitionSpec("iid", split=(1.0, 0.0)), "split=(1.0, 0.0) is not allowed"),
    ("split NaN", lambda: PartitionSpec("iid", split=(NAN, 0.5, 0.5)), "split=(nan, 0.5, 0.5) is not allowed"),
    ("partition seed", lambda: PartitionSpec("iid", seed=-1), "seed=-1 is not allowed"),
    ("one_class without classes", lambda: PartitionSpec("one_class", num_clients=3, split=None), "needs classes"),
    ("one_class count", lambda: PartitionSpec("one_class", num_clients=3, classes=(0, 1), split=None),
     "2 classes for num_clients=3"),
    ("label_limited size", lambda: PartitionSpec("label_limited", num_clients=3), "needs samples_per_client"),
    ("samples_per_client scheme", lambda: PartitionSpec("shards", samples_per_client=5), "samples_per_client applies"),
    ("pooled str", lambda: PartitionSpec("iid", pooled="yes"), "pooled='yes' is not allowed"),
    ("lr negative", lambda: LocalTraining(lr=-1.0), "lr=-1.0 is not allowed"),
    ("lr inf", lambda: LocalTraining(lr=INF), "lr=inf is not allowed"),
    ("weight_decay NaN", lambda: LocalTraining(weight_decay=NAN), "weight_decay=nan is not allowed"),
    ("momentum 1", lambda: LocalTraining(momentum=1.0), "momentum=1.0 is not allowed"),
    ("epochs 0", lambda: LocalTraining(epochs=0), "epochs=0 is not allowed"),
    ("batch_size 0", lambda: LocalTraining(batch_size=0), "batch_size=0 is not allowed"),
    ("steps 0", lambda: LocalTraining(steps=0), "steps=0 is not allowed"),
    ("prox_mu negative", lambda: LocalTraining(prox_mu=-1.0), "prox_mu=-1.0 is not allowed"),
]


@pytest.fixture
def no_data(monkeypatch):
    def forbidden(ds):
        raise AssertionError("data was loaded before the bad input was named")
    monkeypatch.setattr(fairfl.federated.data.base, "check_contents", forbidden)


@pytest.mark.parametrize("name, make, message", API, ids=[c[0] for c in API])
def test_api_rejects_bad_input_before_any_data(name, make, message, no_data):
    with pytest.raises(ConfigError) as e:
        make()
    assert message in str(e.value), str(e.value)


def test_the_probe_is_complete():
    assert len(API) + len(CLI) >= 60


CLI = [
    ("local=5", ["--set", "local=5"], "local must be a mapping"),
    ("rounds=0", ["--set", "rounds=0"], "rounds=0 is not allowed"),
    ("participation", ["--set", "participation=1.5"], "participation=1.5 is not allowed"),
    ("unknown key", ["--set", "bogus=1"], "unknown config keys: bogus"),
    ("no equals", ["--set", "rounds"], "--set takes KEY=VALUE"),
    ("algorithm name", ["--set", "algorithm=no_such"], "unknown algorithm 'no_such'"),
    ("algorithm option", ["--set", "algorithm=fedmgda_plus", "--set", "algorithm.eps=2"], "eps=2.0 is not allowed"),
    ("algorithm option typo", ["--set", "algorithm=fedavg", "--set", "algorithm.momentum=0.9"], "unknown option(s) momentum"),
    ("dataset", ["--set", "dataset=imagenet"], "unknown dataset 'imagenet'"),
    ("model option", ["--set", "model_options.dropuot=false"], "unknown option(s) dropuot"),
    ("seed", ["--set", "seed=-1"], "seed=-1 is not allowed"),
    ("batch size", ["--set", "local.batch_size=0"], "batch_size=0 is not allowed"),
]

YAML = [
    ("missing file", None, "No such file"),
    ("empty file", "", "is empty"),
    ("not YAML", "rounds: [1, 2\n", "is not valid YAML"),
    ("partition not a mapping", "partition: shards\n", "partition must be a mapping"),
    ("bare `on` key", "attacks:\n  - {kind: bias, client: 1, bias: 1.0, on: total}\n", "'on' is now called 'target'"),
    ("unknown key", "rounds: 5\nparticipaton: 0.2\n", "unknown config keys: participaton"),
    ("local lr", "local: {lr: -1}\n", "lr=-1.0 is not allowed"),
    ("not a mapping", "- 1\n- 2\n", "a config must be a mapping"),
]


def run_cli(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize("name, args, message", CLI, ids=[c[0] for c in CLI])
def test_cli_rejects_bad_input_with_one_error_line(name, args, message, capsys, no_data):
    code, err = run_cli(capsys, ["run", *args])
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert message in err[0], err


@pytest.mark.parametrize("name, text, message", YAML, ids=[c[0] for c in YAML])
def test_cli_rejects_bad_config_files_with_one_error_line(name, text, message, tmp_path, capsys, no_data):
    path = tmp_path / "exp.yaml"
    if text is not None:
        path.write_text(text)
    code, err = run_cli(capsys, ["run", "--config", str(path)])
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert message in err[0] and (str(path) in err[0] or name not in ("missing file", "empty file", "not YAML")), err


def test_cli_names_a_results_folder_that_is_a_file(tmp_path, capsys, monkeypatch, no_data):
    blocker = tmp_path / "results"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FAIRFL_RESULTS", str(blocker))
    code, err = run_cli(capsys, ["run", "--set", "rounds=1"])
    assert code == 2 and len(err) == 1 and f"the results folder {blocker} is a file" in err[0], err
