"""The command line, end to end in subprocesses (real papermill, real kernels)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest


def fairfl(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "fairfl", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=600)


def _notebook(path: Path, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('profile = "quick"', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_list_names_every_registry():
    r = fairfl("list")
    assert r.returncode == 0, r.stderr
    assert "fedavg_n" in r.stdout and "cnn_fmnist" in r.stdout and "adult" in r.stdout


def test_data_reports_found_and_missing():
    r = fairfl("data", "fashion_mnist", "cifar10", env={"FAIRFL_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert lines["fashion_mnist"].startswith("ok") and "60000 train" in lines["fashion_mnist"]
    assert lines["cifar10"].startswith("missing")
    r = fairfl("data", "cifar10", "--require", "cifar10", env={"FAIRFL_OFFLINE": "1"})
    assert r.returncode == 1 and "required datasets missing: cifar10" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "algorithm=no_such"], "unknown algorithm 'no_such'"),
    (["--set", "participation=1.5"], "participation=1.5 is not allowed"),
    (["--set", "dataset=imagenet"], "unknown dataset 'imagenet'"),
    (["--set", "bogus=1"], "unknown config keys: bogus"),
])
def test_run_rejects_bad_input_with_one_clear_message(args, message):
    r = fairfl("run", *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_run_from_yaml_trains_and_caches(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "dataset: adult\nmodel: logreg\nalgorithm: fedavg\nrounds: 2\nclients_per_round: 2\n"
        "eval_every: 1\npartition: {scheme: attribute, num_clients: 2, attribute_values: [0, 1], split: null}\n"
        "local: {batch_size: 500, lr: 0.1}\n")
    r = fairfl("run", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "final accuracy mean" in r.stdout
    folder = Path(r.stdout.rsplit("results in ", 1)[1].strip())
    h = json.loads((folder / "history.json").read_text())
    assert h["eval_rounds"] == [0, 1, 2]


@pytest.mark.slow
def test_reproduce_reports_each_notebook_and_fails_if_one_fails(tmp_path):
    good = _notebook(tmp_path / "98_good.ipynb", "assert profile == 'smoke'\nprint('fine')")
    bad = _notebook(tmp_path / "99_bad.ipynb", "raise ValueError('broken on purpose')")
    out = tmp_path / "out"
    r = fairfl("reproduce", str(good), str(bad), "--profile", "smoke", "--output", str(out))
    assert r.returncode == 1
    assert "ok      98_good.ipynb" in r.stdout
    assert "FAILED  99_bad.ipynb" in r.stdout and "broken on purpose" in r.stdout
    assert (out / "smoke" / "98_good.ipynb").is_file()
    r = fairfl("reproduce", str(good), "--profile", "smoke", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_reproduce_counts_the_claims_a_notebook_checked(tmp_path):
    body = ("from fairfl.claims import Claims\n"
            "c = Claims('97_claims', profile)\n"
            "c.check('holds', True, 'evidence')\n"
            "c.check('misses', False, 'evidence', deviation={'quick': 'a diagnosis'})\n"
            "c.finish()")
    nb = _notebook(tmp_path / "97_claims.ipynb", body)
    out = tmp_path / "out"
    r = fairfl("reproduce", str(nb), "--profile", "quick", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "claims: 1 holds, 1 not reproduced (documented)" in r.stdout
    assert (out / "quick" / "97_claims.claims.json").is_file()
