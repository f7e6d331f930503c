"""The results index (``python -m fairfl results``, ``fairfl.results()``) over a cache of real tiny
runs: finished and mid-way entries, their final metrics and sizes, selection by settings, the
three output formats, clear errors for a bad --where, and --prune removing only entries of
other cache versions."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import fairfl
import fairfl.runs.cache as cache
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated import metrics
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.federated.algorithms.fedmgda import FedMGDAPlus
from fairfl.runs.config import CACHE_VERSION
from fairfl.base.errors import ConfigError
from fairfl.runs.index import format_table, rows
from fairfl.runs.loop import simulate
from fairfl.runs.sweeps import SerialBackend, run_many

CFG = ExperimentConfig(dataset="adult", model="logreg",
                       partition=PartitionSpec("attribute", num_clients=2, attribute_values=(0, 1), split=None),
                       local=LocalTraining(epochs=1, batch_size=500, lr=0.1), rounds=2, clients_per_round=2,
                       eval_every=1, checkpoint_every=1, track_improved=False)
RUNS = [CFG.replace(algorithm=FedMGDAPlus(eps=eps), seed=s) for eps in (0.1, 1.0) for s in (0, 1)] + \
       [CFG.replace(algorithm=FedAvg(), seed=0)]
MIDWAY = CFG.replace(algorithm=FedAvg(), seed=1, rounds=3)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """A cache of five finished runs and one stopped after its first round (a real checkpoint)."""
    root = tmp_path_factory.mktemp("index")
    histories = run_many(RUNS, backend=SerialBackend(), root=root, progress=False)
    simulate(MIDWAY, checkpoint_dir=cache.prepare(MIDWAY, root), progress=False, stop_after=1)
    return root, dict(zip((cache.key(c) for c in RUNS), histories))


def fairfl_cli(*args, root):
    return subprocess.run([sys.executable, "-m", "fairfl", "results", *args], capture_output=True, text=True,
                          env={**os.environ, "FAIRFL_RESULTS": str(root)}, timeout=300)


def test_the_dataframe_holds_every_entry_with_its_state_rounds_and_final_metrics(cached):
    root, histories = cached
    table = fairfl.results(root=root)
    assert len(table) == len(RUNS) + 1
    for key, h in histories.items():
        row = table.loc[key]
        acc = h.final_acc()
        assert row["state"] == "finished" and row["rounds_done"] == row["rounds"] == 2
        assert row["mean_acc"] == pytest.approx(metrics.mean(acc)) and row["std_acc"] == pytest.approx(metrics.std(acc))
        assert row["worst10_acc"] == pytest.approx(metrics.worst(acc, 0.1))
        assert row["train_loss"] == pytest.approx(h.train_loss[-1])
        assert row["size_bytes"] == sum(p.stat().st_size for p in (root / key).iterdir())
        assert row["version"] == CACHE_VERSION and not row["stale"] and not row["checkpoint"]
    mid = table.loc[cache.key(MIDWAY)]
    assert mid["state"] == "mid-way" and mid["rounds_done"] == 1 and mid["rounds"] == 3 and mid["checkpoint"]


def test_where_selects_by_dotted_or_short_setting_names(cached):
    root, _ = cached
    eps = fairfl.results(["eps=0.1"], root=root)
    assert set(eps.index) == {cache.key(c) for c in RUNS[:2]}
    assert set(fairfl.results(root=root, algorithm="fedmgda_plus", seed=1).index) == {cache.key(RUNS[1]), cache.key(RUNS[3])}
    assert set(fairfl.results({"algorithm.eps": 1, "local.lr": 0.1}, root=root).index) == {cache.key(c) for c in RUNS[2:4]}
    assert set(fairfl.results(["state=mid-way"], root=root).index) == {cache.key(MIDWAY)}
    assert fairfl.results(["eps=0.5"], root=root).empty          # a known setting that no entry has that value of


@pytest.mark.parametrize("where, message", [
    ("eps", "takes KEY=VALUE"),
    ("=3", "takes KEY=VALUE"),
    ("epsilon=0.1", "no config has a setting 'epsilon'"),
])
def test_a_bad_where_is_one_clear_error(cached, where, message):
    root, _ = cached
    with pytest.raises(ConfigError, match=message):
        fairfl.results([where], root=root)


def test_an_ambiguous_short_name_lists_the_candidates(tmp_path):
    three_classes = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (6, 2, 0)})
    (tmp_path / "entry").mkdir()       # a run prepared but not started: its config only
    (tmp_path / "entry" / "config.json").write_text(json.dumps(three_classes.to_dict()))
    with pytest.raises(ConfigError, match=r"ambiguous, name one of dataset_options\.classes, partition\.classes"):
        fairfl.results(["classes=[6, 2, 0]"], root=tmp_path)
    table = fairfl.results(["dataset_options.classes=[6, 2, 0]"], root=tmp_path)
    assert list(table["state"]) == ["not started"] and table["rounds_done"].isna().all()


def test_the_command_line_in_three_formats_and_its_errors(cached):
    root, histories = cached
    r = fairfl_cli(root=root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["key", "dataset", "model", "algorithm"] and len(lines) == len(RUNS) + 2
    assert any("mid-way" in line and cache.key(MIDWAY) in line for line in lines)
    r = fairfl_cli("--where", "algorithm=fedmgda_plus", "seed=0", "--format", "json", root=root)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert {d["key"] for d in data} == {cache.key(RUNS[0]), cache.key(RUNS[2])}
    assert all(d["config.algorithm"] == "fedmgda_plus" and d["config.seed"] == 0 for d in data)
    r = fairfl_cli("--format", "csv", "--where", "eps=1.0", root=root)
    header, *body = r.stdout.strip().splitlines()
    assert "mean_acc" in header.split(",") and "config.local.lr" in header.split(",") and len(body) == 2
    r = fairfl_cli("--where", "epsilon=1", root=root)
    assert r.returncode == 2 and "no config has a setting 'epsilon'" in r.stderr and not r.stdout


def test_prune_removes_only_entries_of_other_cache_versions(tmp_path):
    root = tmp_path / "results"
    current, old, legacy_ok, legacy_old = (CFG.replace(seed=s) for s in range(4))
    run_many([current, old, legacy_ok, legacy_old], backend=SerialBackend(), root=root, progress=False)
    (cache.entry(old, root) / cache.VERSION_FILE).write_text(json.dumps({"cache_version": CACHE_VERSION - 1}))
    # entries written before the version was recorded: judged by whether their config still hashes to their name
    (cache.entry(legacy_ok, root) / cache.VERSION_FILE).unlink()
    (cache.entry(legacy_old, root) / cache.VERSION_FILE).unlink()
    renamed = root / "0123456789abcdef"
    shutil.move(cache.entry(legacy_old, root), renamed)
    r = fairfl_cli("--prune", root=root)
    assert r.returncode == 0, r.stderr
    assert f"removed {cache.entry(old, root)}" in r.stderr and f"cache version {CACHE_VERSION - 1}" in r.stderr
    assert f"removed {renamed}" in r.stderr and "pruned 2 stale entries" in r.stderr
    assert not cache.entry(old, root).exists() and not renamed.exists()
    assert cache.is_cached(current, root) and cache.is_cached(legacy_ok, root)
    assert len(r.stdout.strip().splitlines()) == 3           # header + the two kept


def test_a_selection_that_matches_nothing_says_so_and_an_empty_cache_says_it_is_empty(cached, tmp_path):
    root, _ = cached
    r = fairfl_cli("--where", "eps=0.5", root=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"no cached run matches eps=0.5 ({len(RUNS) + 1} runs in {root})"
    assert format_table(rows(root, ["eps=0.5"]), where={"eps": 0.5}, root=root).startswith(
        "no cached run matches eps=0.5 (")
    r = fairfl_cli("--where", "eps=0.5", root=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "(no cached runs)", (r.stdout, r.stderr)
    assert fairfl_cli(root=tmp_path).stdout.strip() == "(no cached runs)"


# The README's algorithm of one's own: registered by its module, which `python -m fairfl results`
# does not import.
TRIMMED_MEAN = '''
from dataclasses import dataclass

from fairfl.federated.algorithms import Algorithm, option, register
from fairfl.federated.messages import Aggregate
from fairfl.federated.schedules import constant, scale_by_schedule


@register
@dataclass(frozen=True)
class TrimmedMean(Algorithm):
    name = "trimmed_mean"
    trim: int = option(1, low=0)
    server_lr: float = option(1.0, low=0.0, low_open=True)

    def aggregate(self, reports, state, ctx):
        g = reports.updates.sort(dim=0).values
        return Aggregate(g[self.trim: reports.m - self.trim].mean(dim=0), state, {})

    def server_optimizer(self):
        return scale_by_schedule(constant(self.server_lr))
'''


def test_the_algorithm_column_tells_runs_with_different_options_apart(cached, fmnist, tmp_path, monkeypatch):
    root, _ = cached
    lines = fairfl_cli(root=root).stdout.splitlines()
    labels = {cache.key(c): next(line.split()[3] for line in lines if cache.key(c) in line) for c in RUNS}
    assert labels[cache.key(RUNS[0])] == labels[cache.key(RUNS[1])] == "fedmgda_plus"       # eps=0.1: its default
    assert labels[cache.key(RUNS[2])] == "fedmgda_plus(eps=1)" and labels[cache.key(RUNS[4])] == "fedavg"

    from fairfl.federated.algorithms import ALGORITHMS
    (tmp_path / "trimmed_mean_mod.py").write_text(TRIMMED_MEAN)
    monkeypatch.syspath_prepend(str(tmp_path))
    import trimmed_mean_mod
    try:
        base = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                                partition=PartitionSpec("iid", num_clients=6), rounds=1, clients_per_round=5,
                                local=LocalTraining(epochs=1, batch_size=100, lr=0.05))
        runs = [base.replace(algorithm=trimmed_mean_mod.TrimmedMean(trim=t)) for t in (1, 2)]
        results = tmp_path / "results"
        run_many(runs, backend=SerialBackend(), root=results, progress=False)
        here = fairfl.results(root=results)                    # this process knows the algorithm: its defaults
        assert sorted(here["algorithm"]) == ["trimmed_mean", "trimmed_mean(trim=2)"]
    finally:
        ALGORITHMS.pop("trimmed_mean", None)
        sys.modules.pop("trimmed_mean_mod", None)
    r = fairfl_cli(root=results)                                # a process that does not: every recorded option
    assert r.returncode == 0, r.stderr
    shown = sorted(line.split()[3] for line in r.stdout.splitlines()[1:])
    assert shown == ["trimmed_mean(trim=1,server_lr=1)", "trimmed_mean(trim=2,server_lr=1)"], r.stdout
