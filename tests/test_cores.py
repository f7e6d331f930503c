"""A lone run on every core, the same bits (fairfl.training.engine.cores): the stacks of a fused step, the
instances of the reference path, are computed side by side in threads, each with one intra-op
thread, and a run's history is the one it gives on one thread — for every algorithm family, on the
CNN (whose convolutions round otherwise on two intra-op threads), the reference path and the
LSTM (on both paths), alone, in a lockstep group and in a worker process. Also: how many threads a process takes,
and the pool's lending of idle workers' cores."""
from __future__ import annotations

import json
import os

import pytest
import torch

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.training.engine import cores
from fairfl.base.errors import ConfigError
from fairfl.runs.loop import simulate, simulate_group

from test_golden import CASES, MLP, FM


def history(h):
    """Everything a run records but its wall times, as text (NaN equals NaN; floats print exactly)."""
    return json.dumps({k: v for k, v in h.to_state().items() if k != "round_time"}, sort_keys=True)


@pytest.fixture
def threads():
    yield cores.set_threads
    cores.set_threads(None)


FAMILIES = {
    # the golden cases: every family of the first papers, the CNN, the reference path, the LSTM
    **{name: CASES[name].replace(rounds=1, eval_every=1) for name in ("fedavg_cnn", "fedavg_cnn_sequential", "fedprox_mlp", "qfedavg_mlp",
                                      "afl_mlp", "fedfv_loss_mlp", "dqnfed_mlp", "adult_fedmgda_plus_sequential",
                                      "shakespeare_fedavg")},
    # the character LSTM stacked (fairfl.federated.stacked_lstm): the golden case on the fused path
    "shakespeare_fedavg_stacked": CASES["shakespeare_fedavg"].replace(rounds=1, eval_every=1, batched=True),
    "fedmgda_plus_mlp": MLP.replace(algorithm={"name": "fedmgda_plus", "eps": 0.1, "decay": 0.1}),
    # the families added since: Ditto's personal training (train_from), TERM, the second-order and
    # layer-wise baselines (gradients, Hessian-vector products, dense Hessians)
    "ditto_mlp": MLP.replace(algorithm={"name": "ditto", "lam": 0.1}),
    "term_mlp": MLP.replace(algorithm="term"),
    "fedlf_mlp": MLP.replace(algorithm="fedlf"),
    "fedheal_mlp": MLP.replace(algorithm="fedheal"),
    "fednl_mlp": MLP.replace(algorithm={"name": "fednl", "hessian_mode": "diag", "mu": 0.5, "hessian_batch": 64}),
    "fednew_mlp": MLP.replace(algorithm={"name": "fednew", "hessian_mode": "cg", "cg_iters": 3, "hessian_batch": 64}),
    # FMOL's multi-task model: (client, objective) pairs as instances
    "fmgda_lenet": ExperimentConfig(
        dataset="multimnist", dataset_options={"source": "mnist_5k", "seed": 0}, model="multi_lenet",
        partition=PartitionSpec("label_limited", num_clients=4, samples_per_client=20, shards_per_client=2),
        local=LocalTraining(epochs=1, batch_size=5, lr=0.1), algorithm="fmgda", rounds=2, participation=1.0,
        eval_every=1, track_improved=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_a_lone_run_gives_the_same_bits_on_one_two_and_three_threads(name, threads, fmnist):
    """Broken variants caught: a stack computed with the process's intra-op threads (the CNN's bias
    gradient differs by ~5e-9 on two), the module's train/eval mode switched by one stack while
    another computes, instances put back in the wrong order, two stacks sharing a module's
    parameters on the reference path."""
    config = FAMILIES[name]
    threads(1)
    one = simulate(config, progress=False)
    for n in (2, 3):
        threads(n)
        assert cores.threads() == n
        assert history(simulate(config, progress=False)) == history(one), f"{n} threads differ from one"


@pytest.mark.slow
def test_a_group_on_every_core_gives_each_run_its_lone_bits(threads, fmnist):
    """Two CNN runs as a lockstep group whose fused steps use three threads, against each run alone on
    one thread."""
    configs = [FM.replace(algorithm="fedavg", seed=s) for s in (0, 1)]
    threads(1)
    alone = [simulate(c, progress=False) for c in configs]
    threads(3)
    together = simulate_group(configs, progress=False)
    assert [history(h) for h in together] == [history(h) for h in alone]


def test_how_many_threads(threads, monkeypatch):
    """An explicit cap wins (even above the cores: the user asked), then FAIRFL_THREADS, then
    OMP_NUM_THREADS, then every usable core; bad values are named."""
    monkeypatch.delenv("FAIRFL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cores.threads() == cores.usable_cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cores.threads() == 1
    monkeypatch.setenv("FAIRFL_THREADS", "5")
    assert cores.threads() == 5
    threads(3)
    assert cores.threads() == 3
    threads(None)
    monkeypatch.setenv("FAIRFL_THREADS", "zero")
    with pytest.raises(ConfigError, match="FAIRFL_THREADS='zero'"):
        cores.threads()
    with pytest.raises(ConfigError, match="threads=0"):
        cores.set_threads(0)


def test_parallel_keeps_order_raises_after_all_and_runs_nested_calls_inline(threads):
    """Results come back in the tasks' order whatever their costs; after an error no new task starts
    and the error is raised; a task's own parallel call runs in its thread (no thread waits on a busy
    pool)."""
    threads(3)
    assert cores.parallel([lambda i=i: i * i for i in range(7)], costs=[1, 9, 3, 7, 2, 8, 0]) == [0, 1, 4, 9, 16, 25, 36]
    threads(2)
    done = []

    def fail():
        raise ValueError("task 0")
    with pytest.raises(ValueError, match="task 0"):
        cores.parallel([fail] + [lambda i=i: done.append(i) for i in range(1, 40)], costs=[100] + [1] * 39)
    assert len(done) < 39
    nested = cores.parallel([lambda: cores.parallel([lambda: torch.get_num_threads()] * 3)] * 2)
    assert nested == [[1, 1, 1], [1, 1, 1]]        # one intra-op thread in every task


def test_a_pool_lends_the_cores_of_workers_without_work(threads, monkeypatch):
    """A worker's threads are its share plus its part of the spare cores the pool deposits in the bank
    (the end of a sweep), never more than an explicit cap."""
    import multiprocessing as mp
    monkeypatch.delenv("FAIRFL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    bank = cores.CoreBank(mp.get_context("spawn"))
    try:
        cores.set_share(1, bank)
        assert cores.threads() == 1
        bank.set(spare=3, busy=1)              # three of four workers idle, one training
        assert cores.threads() == 4
        bank.set(spare=2, busy=2)
        assert cores.threads() == 2
        threads(1)
        assert cores.threads() == 1
    finally:
        cores.set_share(None)


def test_the_callers_grad_mode_reaches_the_threads(threads):
    """torch's grad mode is per thread: predictions under no_grad must not build graphs in the helpers."""
    threads(2)
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        out = cores.parallel([lambda: (x * 2).requires_grad] * 4)
    assert out == [False] * 4
    assert cores.parallel([lambda: (x * 2).requires_grad] * 4) == [True] * 4


@pytest.mark.slow
def test_the_last_group_of_a_sweep_borrows_the_cores_of_the_worker_that_finished(tmp_path, fmnist):
    """Two workers of one thread, two groups of unequal cost (1 round against 6): once the short group
    is done, the pool lends its worker's core to the other, whose fused steps then run on two threads
    — read from the scheduler's own record (the seconds of parallel computation at each width that
    each group reports, fairfl.runs.sweeps.last_usage), not from wall times. Broken variant caught: the
    last group trained alone on one core while the other idled (notebook 04's quick sweep)."""
    import fairfl.runs.sweeps as sweeps
    from fairfl.runs.sweeps import ProcessBackend, run_many
    short = FM.replace(algorithm="fedavg", rounds=1, seed=0)
    long = FM.replace(algorithm="fedavg", rounds=6, seed=1)
    with ProcessBackend(workers=2, threads=1) as pool:
        run_many([short, long], backend=pool, root=tmp_path, progress=False, max_group=1)
    usage = sweeps.last_usage
    assert usage.cores == 2 and usage.widths.get(2, 0) > 0, usage.widths
    assert set(usage.widths) <= {1, 2}
    # each group's span, from the worker that ran it: two workers, the short group ending first
    assert [g.runs for g in usage.groups] == [1, 1] and len({g.pid for g in usage.groups}) == 2
    assert all(0 <= g.start < g.end <= usage.wall + 1e-6 for g in usage.groups), usage.groups
    assert sum(g.cpu for g in usage.groups) == pytest.approx(usage.cpu)
    assert 0 <= usage.tail <= usage.idle + 1e-9


def test_a_sweeps_tail_is_the_core_time_after_the_first_worker_ran_out_of_groups():
    """Hand-made spans: two workers of one core each, one ends at 6 s of a 10-s sweep, the other at
    10 s: 4 core-seconds of 20 idle at the end. One worker, or none, has no tail."""
    from fairfl.runs.sweeps import GroupSpan, SweepUsage
    spans = (GroupSpan(3, 11, 0.0, 4.0, 4.0), GroupSpan(1, 11, 4.0, 6.0, 2.0), GroupSpan(2, 12, 0.0, 10.0, 10.0))
    usage = SweepUsage(cores=2, wall=10.0, cpu=16.0, widths={1: 16.0}, groups=spans)
    assert usage.tail == pytest.approx(0.2) and usage.idle == pytest.approx(0.2)
    assert "(20% at the end)" in str(usage)
    assert SweepUsage(2, 10.0, 16.0, {}, spans[:2]).tail == 0.0
    assert SweepUsage(2, 10.0, 16.0, {}).tail == 0.0 and "at the end" not in str(SweepUsage(2, 10.0, 16.0, {}))


def test_a_sweeps_report_tells_other_processes_use_of_the_cores_from_its_own_idle_share(tmp_path, fmnist):
    """An idle share counts the core-time the sweep's groups did not use, whoever used it: notebook 06's
    tuning sweep printed 23 % idle while a profiler and tests ran beside it (alone: 3-4 %). The report
    now says how much of the machine other processes used meanwhile: the machine's busy CPU less the
    CPU of the sweep's own process tree. A process that spins beside the sweep (not the test's child)
    is counted as another's, at least for the CPU it used; a process of the tree (a pool's worker) is
    not. Broken variants caught: the tree's children left out of its CPU, the spinner not counted."""
    import subprocess
    import sys
    import time

    import psutil

    import fairfl.runs.sweeps as sweeps
    from fairfl.runs.sweeps import ProcessBackend, run_many
    # the spinner is not the test's child (its shell exits at once)
    pid = int(subprocess.run(["bash", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True).stdout)
    spinner = psutil.Process(pid)
    try:
        with ProcessBackend(workers=1, threads=1) as pool:
            time.sleep(0.5)
            before = sum(spinner.cpu_times()[:2])
            run_many([FM.replace(algorithm="fedavg", rounds=2, seed=0)], backend=pool, root=tmp_path, progress=False)
            used = sum(spinner.cpu_times()[:2]) - before
            busy = sweeps.last_usage
    finally:
        spinner.kill()
        spinner.wait(10)
    machine = (os.cpu_count() or 1) * busy.wall
    assert busy.others is not None and 0.0 <= busy.others <= 1.0
    assert busy.others >= used / machine - 0.05, (busy, used, machine)        # others only add to the spinner
    assert used / machine > 0.1 and "other processes used" in str(busy), (busy, used)
    # a child of this process (as a pool's worker is) burns a second of CPU: it is the sweep's, not another's
    child = None

    def burn() -> float:
        nonlocal child
        child = psutil.Process(subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                                                 "while time.process_time() - t < 1.0: pass\ntime.sleep(60)"]).pid)
        deadline = time.monotonic() + 120
        while sum(child.cpu_times()[:2]) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return sum(child.cpu_times()[:2])
    try:
        share, wall, delta, burnt = _share_around(burn)
    finally:
        if child is not None:
            child.kill()
            child.wait(10)
    assert share is not None and share * (os.cpu_count() or 1) * wall <= delta - burnt + 0.2, (share, wall, delta, burnt)


def _share_around(burn) -> tuple:
    """(other processes' share by ``sweeps.others_share``, wall seconds, the machine's busy CPU seconds,
    the CPU ``burn()`` says it burnt) over a call of ``burn``, as a sweep measures them."""
    import time

    import fairfl.runs.sweeps as sweeps
    busy0, tree0, start = cores.machine_busy(), cores.tree_cpu(), time.perf_counter()
    burnt = burn()
    wall = time.perf_counter() - start
    share = sweeps.others_share(busy0, tree0, wall)
    return share, wall, cores.machine_busy() - busy0, burnt


def test_a_process_of_the_sweep_that_ended_is_not_another_process():
    """A child of the driver that burns a second of CPU and ends before the sweep's end (a worker killed,
    a pool's workers stopped) is the sweep's: its CPU is in its parent's figure once it is waited for.
    Fails with only the processes alive at the end counted."""
    import subprocess
    import sys

    import psutil
    me = psutil.Process()

    def burn() -> float:
        children0 = sum(me.cpu_times()[2:4])
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 1.0: pass"], check=True, timeout=120)
        return sum(me.cpu_times()[2:4]) - children0
    share, wall, delta, burnt = _share_around(burn)
    assert burnt >= 1.0
    assert share is not None and share * (os.cpu_count() or 1) * wall <= delta - burnt + 0.2, (share, wall, delta, burnt)


def test_a_sweeps_report_names_other_processes_only_where_they_used_the_cores():
    from fairfl.runs.sweeps import SweepUsage
    assert "other processes" not in str(SweepUsage(2, 10.0, 16.0, {}, (), None))
    assert "other processes" not in str(SweepUsage(2, 10.0, 16.0, {}, (), 0.001))
    assert str(SweepUsage(2, 10.0, 16.0, {}, (), 0.12)).endswith(
        "20% of the core-time idle; other processes used 12% of the machine's core-time meanwhile")
    tree = cores.tree_cpu()
    assert os.getpid() in tree and tree[os.getpid()] > 0
    assert cores.machine_busy() is None or cores.machine_busy() >= tree[os.getpid()] - 1.0


def _python(code: str) -> str:
    """The output of ``code`` run by this Python in a fresh process (a thread pool nobody used yet)."""
    import subprocess
    import sys
    import textwrap
    env = {k: v for k, v in os.environ.items() if k != "FAIRFL_BACKEND"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def test_a_pool_thread_computes_on_one_intra_op_thread_whatever_count_its_caller_had_set():
    """torch sets a thread up at its first call into its thread pool API, copying the count that any
    thread set last. A pool thread that had not computed yet when a caller outside a run had set 2
    (a notebook's own prediction, say) took 2 intra-op threads for good: other bits, depending on
    which thread took which stack. Fails with the set-up left to the thread's first operation."""
    out = _python("""
        import time, torch
        from fairfl.training.engine import cores
        cores.set_threads(2)
        cores.parallel([lambda: time.sleep(0.05)] * 2)        # the pool's thread exists, has not computed
        torch.set_num_threads(2)
        print(cores.parallel([lambda: (time.sleep(0.3), torch.get_num_threads())[1]] * 2))
    """)
    assert out == "[1, 1]", out


def test_ctrl_c_while_threads_compute_returns_once_every_task_under_way_has_ended():
    """A real SIGINT while the caller waits for a helper thread: the KeyboardInterrupt reaches the
    caller only after the helper's task has ended (the caller's ``finally`` then switches the model's
    mode back with no forward pass still running in it). Fails with the interrupt raised at once.
    Events, not a race: the helper's task goes on until the interrupt has reached the caller (its
    handler ran), so the signal always lands while the caller is inside ``parallel``, however slow
    the machine; and for half a second more, so that a caller that raised at once would see it
    running (a busy machine can only make that check pass more slowly, never fail)."""
    out = _python("""
        import os, signal, threading, time
        from fairfl.training.engine import cores
        cores.set_threads(2)
        cores.parallel([lambda: None] * 2)     # the pool's thread started (an interrupt inside Python's
                                               # ThreadPoolExecutor while it starts one leaves it unjoinable)
        started, ended, helping, handled = set(), set(), threading.Event(), threading.Event()
        def on_sigint(signum, frame):          # what Python does on Ctrl-C, and a record that it did
            handled.set()
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, on_sigint)
        def task(i):
            try:                               # (an interrupt may land in this task: it ended, then)
                started.add(i)
                if threading.current_thread().name.startswith("fairfl-core"):
                    helping.set()              # the helper's task is long: it ends after the interrupt
                    handled.wait(60)
                    time.sleep(0.5)
                else:                          # the caller's wait for it, so that it is waiting when Ctrl-C lands
                    helping.wait(60)
            finally:
                ended.add(i)
        def interrupt():
            helping.wait(60)
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt, daemon=True).start()
        try:
            cores.parallel([lambda i=i: task(i) for i in range(4)])
            print("not interrupted")
        except KeyboardInterrupt:
            print(sorted(started) == sorted(ended))
    """)
    assert out == "True", out


def test_a_groups_shared_predictions_use_every_thread_not_their_runs_part(threads):
    """The predictions of a lockstep group are executed by the run whose call completes the group,
    while every run waits: on every thread of the process, not on that run's part of them (one of
    two here). Fails with the executing run's width kept."""
    import threading

    from fairfl.training.client import flat_params
    from fairfl.training.engine import Predict
    from fairfl.training.engine.lockstep import Lockstep
    from fairfl.federated.models import build_model
    threads(2)
    x = torch.randn(2048, 784)                                  # four chunks of 512 rows
    models = [build_model("logreg", (784,), 10, seed=s) for s in range(2)]
    group, out = Lockstep(slots=cores.threads), {}

    def run(rank: int) -> None:
        group.bind(rank)
        try:
            out[rank] = group(Predict(models[0], flat_params(models[rank]), (x,)))
        finally:
            group.leave()
    for _ in models:
        group.enter()
    before = cores.width_seconds()
    workers = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    after = cores.width_seconds()
    assert group.flushes == 1 and set(out) == {0, 1}
    assert after.get(2, 0.0) > before.get(2, 0.0) and after.get(1, 0.0) == before.get(1, 0.0), (before, after)
    for rank, model in enumerate(models):
        assert torch.equal(out[rank], model.eval()(x))


def test_a_pools_workers_are_the_cores_this_process_may_use_not_the_hosts():
    """The affinity mask (a cpuset's, taskset's or batch system's core list) sizes the default pool and
    the sweep's report; one usable core trains in-process. Fails with os.cpu_count()."""
    out = _python("""
        import os
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        from fairfl.training.backends import ProcessBackend, default_backend
        print(ProcessBackend().workers, type(default_backend()).__name__)
    """)
    assert out == "1 SerialBackend", out
