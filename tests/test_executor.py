"""The process pool survives its workers and its parent, with real processes and real kills:
a worker killed in the middle of a sweep costs only the runs it took down (sent again, resumed
from their checkpoints, bit-identical to an uninterrupted sweep); a run that kills every worker
it gets is reported after a bounded number of tries while the others land in the cache; and
when the parent is killed its workers end within seconds."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.base.errors import RunFailedError
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, run_many

CFG = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="mlp2",
                       partition=PartitionSpec("shards", num_clients=10, shards_per_client=2),
                       local=LocalTraining(epochs=2, batch_size=20, lr=0.05), rounds=6, clients_per_round=4,
                       eval_every=2, checkpoint_every=1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                   # a zombie (dead, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_killed_worker_costs_only_its_runs(fmnist, tmp_path):
    configs = [CFG.replace(seed=s) for s in range(4)]
    serial = run_many(configs, backend=SerialBackend(), root=tmp_path / "serial", progress=False)
    with ProcessBackend(workers=2) as backend:
        killed = []

        def kill_one_worker_mid_sweep():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:          # wait until some run has checkpointed a round
                if list((tmp_path / "pool").glob("*/checkpoint.pt")) and backend._pool is not None:
                    pid = next(iter(backend._pool._processes))
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
                time.sleep(0.02)
        killer = threading.Thread(target=kill_one_worker_mid_sweep)
        killer.start()
        pooled = run_many(configs, backend=backend, root=tmp_path / "pool", progress=False)
        killer.join()
    assert killed, "no worker was killed: the test did not test anything"
    for s, p in zip(serial, pooled):
        assert (s.train_loss, s.test_acc, s.info) == (p.train_loss, p.test_acc, p.info)


CRASH = '''
import dataclasses
import os
import signal
from dataclasses import dataclass

from fairfl.federated.algorithms import register
from fairfl.federated.algorithms.fedavg import FedAvg


@register
@dataclass(frozen=True)
class KillsItsWorker(FedAvg):
    """Kills the process it runs in, in round 1: a stand-in for a run that runs out of memory."""

    name = "kills_its_worker"

    def aggregate(self, reports, state, ctx):
        if ctx.round == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().aggregate(reports, state, ctx)
'''


@pytest.mark.slow
def test_a_run_that_kills_every_worker_is_reported_and_the_others_are_kept(fmnist, tmp_path, monkeypatch):
    (tmp_path / "crash_algorithm.py").write_text(CRASH)
    monkeypatch.syspath_prepend(str(tmp_path))
    import crash_algorithm
    good = [CFG.replace(seed=s, rounds=2) for s in range(2)]
    bad = CFG.replace(rounds=3, algorithm=crash_algorithm.KillsItsWorker())
    with ProcessBackend(workers=2) as backend:
        with pytest.raises(RunFailedError, match=r"(?s)1 of 3 runs crashed .*kills_its_worker seed=0: WorkerDied: a worker "
                                                 r"process died each of the 3 times this run was under way on its own"):
            run_many([good[0], bad, good[1]], backend=backend, root=tmp_path, progress=False)
        out = run_many(good, backend=backend, root=tmp_path, progress=False)     # cached: nothing trains
    assert all(h.rounds_done == 2 for h in out)


PARENT = '''
import sys, time
from pathlib import Path
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.runs.sweeps import ProcessBackend

if __name__ == "__main__":
    cfg = ExperimentConfig(dataset="fashion_mnist", model="cnn_fmnist",
                           partition=PartitionSpec("shards", num_clients=10, shards_per_client=2),
                           local=LocalTraining(epochs=5, batch_size=10, lr=0.01), rounds=1000, clients_per_round=5)
    from fairfl.runs.sweeps.workers import _worker_run_group, portable
    pool = ProcessBackend(workers=2)._start()
    futures = [pool.submit(_worker_run_group, ([portable(cfg.replace(seed=s))], sys.argv[2])) for s in range(2)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(pool._processes) < 2:
        time.sleep(0.1)
    Path(sys.argv[1]).write_text(" ".join(map(str, pool._processes)))
    for f in futures:          # train, until killed
        f.result()
'''


@pytest.mark.slow
def test_workers_end_when_their_parent_is_killed(fmnist, tmp_path, fairfl_env):
    script, pids_file = tmp_path / "parent.py", tmp_path / "pids"
    script.write_text(textwrap.dedent(PARENT))
    parent = subprocess.Popen([sys.executable, str(script), str(pids_file), str(tmp_path / "results")],
                              env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not pids_file.exists() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        assert pids_file.exists(), parent.communicate(timeout=10)
        workers = [int(p) for p in pids_file.read_text().split()]
        time.sleep(2.0)                                          # the workers are training now
        assert all(alive(p) for p in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers), "workers outlived their killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_runs_of_the_reference_loop_go_out_singly_and_fused_runs_in_lockstep_groups():
    """Runs with batched=False fuse nothing, so a lockstep group would train them one after another
    on one worker while the other waits (notebook 06's Shakespeare groups left a core idle for
    minutes): they go out as single runs. Batched runs still share lockstep groups."""
    from fairfl.runs.sweeps import plan_groups
    fused = [CFG.replace(seed=s) for s in range(6)]
    reference = [CFG.replace(seed=s, batched=False) for s in range(5)]
    groups = plan_groups(fused + reference, slots=2)
    assert groups == [[0, 1, 2, 3, 4, 5], [6], [7], [8], [9], [10]]    # largest first
    assert plan_groups(fused, slots=2) == [[0, 2, 4], [1, 3, 5]]
    assert plan_groups(reference, slots=2) == [[0], [1], [2], [3], [4]]
    # with the family's rate measured, no group above a quarter of the sweep (two runs a group at least)
    from fairfl.runs.sweeps import rate_key
    rates = {rate_key(CFG): 0.5, rate_key(reference[0]): 0.5}
    assert plan_groups(fused + reference, slots=2, rates=rates) == [[0, 3], [1, 4], [2, 5], [6], [7], [8], [9], [10]]
    assert plan_groups(fused[:4], slots=2, rates=rates) == [[0, 2], [1, 3]]
    assert plan_groups(fused, slots=1, rates=rates) == [[0, 1, 2, 3, 4, 5]]   # one worker (or one GPU): one group


def test_groups_are_cut_and_ordered_by_the_seconds_each_family_measured(tmp_path):
    """Notebook 06's edge extensions: by client-epochs, Adult's 18 runs were the cheapest group, so they
    went last, in one group (at b = 10 an epoch of Adult is hundreds of steps): 121 of the sweep's 307
    CPU-seconds, alone for 36 s after the other worker was done. With the rates a sweep measured
    (CPU seconds per unit of expected_cost, per family), that family's groups come first and are cut
    small enough that the last to start are short. The rates are kept in the results folder."""
    from fairfl.runs import sweeps
    from fairfl.runs.sweeps import expected_cost, plan_groups
    cheap = [CFG.replace(seed=s) for s in range(8)]                                   # one family
    costly = [CFG.replace(seed=s, local=dataclasses.replace(CFG.local, batch_size=5)) for s in range(8)]
    configs = cheap + costly
    blind = plan_groups(configs, slots=2)
    assert blind == [list(range(8)), list(range(8, 16))]           # alike by client-epochs: one group each
    rates = {sweeps.rate_key(cheap[0]): 1.0, sweeps.rate_key(costly[0]): 10.0}
    groups = plan_groups(configs, slots=2, rates=rates)
    assert all(i >= 8 for i in groups[0] + groups[1] + groups[2] + groups[3])      # the costly family first,
    assert len([g for g in groups if g[0] >= 8]) == 4 and sorted(sum(groups, [])) == list(range(16))   # cut in 4
    work = [sum(expected_cost(configs[i]) * (10 if i >= 8 else 1) for i in g) for g in groups]
    assert work == sorted(work, reverse=True) and max(work) <= sum(work) / 4 + 1e-9
    # a family the sweeps have not measured is taken as a typical one (and nothing is cut by cost, which
    # would compare unlike units), and a sweep stores what it measured
    assert plan_groups(cheap, slots=2, rates={"another family": 3.0}) == plan_groups(cheap, slots=2)
    assert len(plan_groups(configs, slots=2, rates={sweeps.rate_key(costly[0]): 10.0})) == len(blind)
    assert sweeps.measured_rates(tmp_path) == {}
    run_many(cheap[:2], backend=SerialBackend(), root=tmp_path, progress=False)
    (key, rate), = sweeps.measured_rates(tmp_path).items()
    assert key == sweeps.rate_key(cheap[0]) == sweeps.rate_key(cheap[0].replace(
        partition=dataclasses.replace(CFG.partition, seed=7))) and rate > 0
    (tmp_path / sweeps.RATES_FILE).write_text("not json")                           # a hint, never an error
    assert sweeps.measured_rates(tmp_path) == {}


def test_a_group_holds_the_runs_of_one_partition():
    """Notebook 06 draws each reporting seed's partition anew: dealt out in turn, every group held
    all ten partitions, and two workers filled 24 GB. A family's runs are now grouped by partition
    first: a group holds its data once."""
    from fairfl.runs.sweeps import plan_groups
    configs = [CFG.replace(seed=s, partition=dataclasses.replace(CFG.partition, seed=s % 3), rounds=1 + m)
               for s in range(6) for m in range(4)]
    groups = plan_groups(configs, slots=2)
    assert sorted(i for g in groups for i in g) == list(range(len(configs)))
    for g in groups:
        assert len({configs[i].partition.seed for i in g}) == 1, [configs[i].partition.seed for i in g]
    assert len(groups) == 3
    # with the family's rate measured, each partition's third of the sweep in two groups: three groups on
    # two workers would leave one idle for a third of the sweep
    from fairfl.runs.sweeps import rate_key
    assert len(plan_groups(configs, slots=2, rates={rate_key(configs[0]): 1.0})) == 6
