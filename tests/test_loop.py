"""The round loop on real Fashion-MNIST: determinism, resume, both training paths, the server
schedule, the run cache, sweeps with failures, the divergence guard, History files."""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import fairfl.runs.sweeps as experiments
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.federated.algorithms import register, sample_clients
from fairfl.federated.algorithms.fedavg import FedAvg
from fairfl.base.errors import RunFailedError, TrainingDivergedError
from fairfl.runs.history import CHECKPOINT, History, load_checkpoint
from fairfl.runs.loop import simulate, simulate_group
from fairfl.federated.messages import Aggregate
from fairfl.federated.schedules import step_decay
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, is_cached, run, run_dir, run_many

CFG = ExperimentConfig(
    dataset="fashion_mnist",
    partition=PartitionSpec("shards", num_clients=10, shards_per_client=2, seed=0),
    model="mlp2", rounds=4, participation=0.3, eval_every=2,
    local=LocalTraining(batch_size=50), checkpoint_every=2)


def _sim(cfg, **kw):
    return simulate(cfg, progress=False, **kw)


def assert_same_history(a: History, b: History):
    assert a.eval_rounds == b.eval_rounds
    assert a.test_acc == b.test_acc
    assert a.test_loss == b.test_loss
    assert a.train_loss == b.train_loss
    assert a.sampled == b.sampled
    assert a.round_lr == b.round_lr
    assert a.round_improved == b.round_improved
    assert a.info == b.info


@pytest.fixture(scope="module")
def reference(fmnist, tmp_path_factory):
    """One uninterrupted run of CFG, with its final checkpoint (the final model)."""
    d = tmp_path_factory.mktemp("reference_run")
    history = _sim(CFG, checkpoint_dir=d)
    blob = load_checkpoint(d, CFG)
    return history, blob


# ----------------------------------------------------------------------------- the run itself

def test_reference_run_is_well_formed(reference):
    h, blob = reference
    assert h.eval_rounds == [0, 2, 4]
    assert h.rounds_done == 4 and blob.round == 4
    assert h.acc().shape == (3, 10)
    assert all(len(s) == 3 and len(set(s)) == 3 for s in h.sampled)       # round(0.3 * 10) = 3
    assert h.round_lr == [1.0] * 4
    assert all(0.0 <= v <= 1.0 for v in h.round_improved)
    assert h.train_loss[-1] < h.train_loss[0]                              # it learns
    assert np.mean(h.final_acc()) > np.mean(h.acc()[0])
    assert torch.isfinite(blob.params).all()


# ----------------------------------------------------------------------------- (a) determinism

@pytest.mark.slow
def test_same_seed_same_history_other_seed_other_history(reference):
    ref, ref_blob = reference
    again = _sim(CFG)
    assert_same_history(again, ref)
    other = _sim(CFG.replace(seed=1))
    assert other.sampled != ref.sampled
    assert other.train_loss != ref.train_loss       # other initial model as well


def test_sample_clients_depends_on_seed_and_round_only():
    a = sample_clients(0, 5, 100, 10)
    assert np.array_equal(a, sample_clients(0, 5, 100, 10))
    assert len(np.unique(a)) == 10 and np.all(np.diff(a) > 0) and a.max() < 100
    assert not np.array_equal(a, sample_clients(0, 6, 100, 10))
    assert not np.array_equal(a, sample_clients(1, 5, 100, 10))


# ----------------------------------------------------------------------------- (b) resume

def test_resume_from_checkpoint_equals_uninterrupted_run(reference, tmp_path):
    ref, ref_blob = reference
    part = _sim(CFG, checkpoint_dir=tmp_path, stop_after=2)
    assert part.rounds_done == 2 and part.eval_rounds == [0, 2]
    assert load_checkpoint(tmp_path, CFG).round == 2
    resumed = _sim(CFG, checkpoint_dir=tmp_path)
    assert resumed.rounds_done == 4
    assert_same_history(resumed, ref)
    blob = load_checkpoint(tmp_path, CFG)
    assert blob.round == 4
    assert torch.equal(blob.params, ref_blob.params)      # the final model, bit for bit


def test_checkpoint_of_another_config_is_ignored(fmnist, tmp_path):
    _sim(CFG, checkpoint_dir=tmp_path, stop_after=2)
    other = CFG.replace(seed=1)
    assert load_checkpoint(tmp_path, other) is None
    assert load_checkpoint(tmp_path, CFG).round == 2


# ----------------------------------------------------------------------------- (c) both paths

@pytest.mark.slow
def test_batched_and_sequential_paths_agree(fmnist):
    """mlp2 has no dropout. Float32 rounding differs between the paths (vmap'd vs plain matmul)
    and SGD amplifies it over a run, so a few local steps keep the comparison at ~1e-4."""
    cfg = CFG.replace(local=LocalTraining(batch_size=200))
    a = _sim(cfg.replace(batched=True))
    b = _sim(cfg.replace(batched=False))
    assert a.sampled == b.sampled and a.eval_rounds == b.eval_rounds
    np.testing.assert_allclose(a.train_loss, b.train_loss, rtol=1e-4)
    np.testing.assert_allclose(a.test_loss, b.test_loss, rtol=1e-4)
    # accuracy is discontinuous: allow one of a client's 600 test samples to flip
    np.testing.assert_allclose(a.acc(), b.acc(), atol=1 / 600 + 1e-6)
    np.testing.assert_allclose(a.round_improved, b.round_improved, atol=1 / 3 + 1e-9)
    assert a.train_loss[-1] < a.train_loss[0] - 0.1   # they trained


@pytest.fixture
def float64(fmnist):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_batched_and_sequential_paths_agree_exactly_in_float64(fmnist, float64):
    """In float64 the rounding noise vanishes: the two paths compute the same run (including
    momentum, the proximal term and weight decay)."""
    import dataclasses
    from fairfl.federated.partition import federate
    n = 6000  # a tenth of the training file (20 shards of 300) keeps the float64 copy small
    ds = dataclasses.replace(fmnist, x_train=fmnist.x_train[:n].double(), y_train=fmnist.y_train[:n],
                             x_test=fmnist.x_test[:10].double(), y_test=fmnist.y_test[:10])
    cfg = CFG.replace(algorithm={"name": "fedprox", "mu": 0.01},
                      local=LocalTraining(batch_size=50, momentum=0.5, weight_decay=1e-4))
    fed = federate(ds, cfg.partition)
    a = _sim(cfg.replace(batched=True), fed=fed)
    b = _sim(cfg.replace(batched=False), fed=fed)
    assert a.sampled == b.sampled
    np.testing.assert_allclose(a.train_loss, b.train_loss, rtol=1e-10)
    np.testing.assert_allclose(a.test_loss, b.test_loss, rtol=1e-10)
    np.testing.assert_array_equal(a.acc(), b.acc())


# ----------------------------------------------------------------------------- (d) server schedule

def test_server_lr_schedule_fedmgda():
    sched = step_decay(2.0, 0.5)                    # T = 200: β = 0.5^(100/200) = 1/sqrt(2)
    beta = 0.5 ** (100 / 200)
    assert sched(0, 200) == pytest.approx(2.0)
    assert sched(99, 200) == pytest.approx(2.0)
    assert sched(100, 200) == pytest.approx(2.0 * beta)
    assert sched(199, 200) == pytest.approx(2.0 / math.sqrt(2))
    sched = step_decay(1.0, 0.1)                    # T = 300: β = 0.1^(1/3)
    assert sched(250, 300) == pytest.approx(0.1 ** (2 / 3))
    assert sched(299, 300) == pytest.approx(0.21544346900318834)
    sched = step_decay(0.5, 0.01)                   # T = 50: β = 0.01^2; no step before t = 100
    assert sched(49, 50) == pytest.approx(0.5)
    assert sched(100, 50) == pytest.approx(0.5 * 1e-4)
    assert step_decay(1.0, 1.0)(999, 1000) == 1.0
    # the algorithms with a server step use this schedule
    step, _, info = FedAvg(server_lr=2.0, decay=0.5).server_optimizer().update(torch.ones(2), None, 150, 200)
    assert info["lr"] == pytest.approx(2.0 * beta) and torch.allclose(step, torch.full((2,), 2.0 * beta))


def test_round_lr_is_logged_and_used(fmnist):
    cfg = CFG.replace(rounds=1, eval_every=1, algorithm=FedAvg(server_lr=0.5, decay=0.5))
    h = _sim(cfg)
    assert h.round_lr == [0.5]
    h_small = _sim(cfg.replace(algorithm=FedAvg(server_lr=1e-6)))
    # a tiny server step leaves the model (and its training loss) almost where it started
    assert abs(h_small.train_loss[-1] - h_small.train_loss[0]) < 1e-3 < abs(h.train_loss[-1] - h.train_loss[0])


def test_num_sampled():
    assert CFG.num_sampled == 3
    assert CFG.replace(participation=0.01).num_sampled == 1
    assert CFG.replace(participation=0.25).num_sampled == 3      # round(2.5) up
    assert CFG.replace(clients_per_round=7).num_sampled == 7


# ----------------------------------------------------------------------------- (e) run cache

def test_run_caches_and_second_call_does_not_train(fmnist, tmp_path, monkeypatch):
    first = run(CFG, root=tmp_path, progress=False)
    d = run_dir(CFG, tmp_path)
    import fairfl.runs.cache
    assert d == tmp_path / fairfl.runs.cache.key(CFG)
    assert is_cached(CFG, tmp_path)
    assert not (d / CHECKPOINT).exists()
    assert json.loads((d / "config.json").read_text()) == CFG.to_dict()

    def no_training(*a, **kw):
        raise AssertionError("run() trained again although the result is cached")
    monkeypatch.setattr(experiments, "simulate", no_training)
    second = run(CFG, root=tmp_path, progress=False)
    assert second.to_state() == first.to_state()
    # a changed setting is a different key, so it is not served from the cache
    with pytest.raises(AssertionError, match="trained again"):
        run(CFG.replace(seed=7), root=tmp_path, progress=False)


def test_run_uses_results_root_from_environment(fmnist, fairfl_env):
    cfg = CFG.replace(rounds=1, eval_every=1)
    run(cfg, progress=False)
    assert (run_dir(cfg) / "history.json").is_file() and run_dir(cfg).parent == fairfl_env["results"]


# ----------------------------------------------------------------------------- (f) run_many

DIVERGING = CFG.replace(local=LocalTraining(batch_size=50, lr=1e6))


def test_the_diverging_config_really_diverges(fmnist):
    with pytest.raises(TrainingDivergedError, match="round 0"):
        _sim(DIVERGING)


@pytest.mark.slow
def test_run_many_reports_failures_and_keeps_the_good_runs(fmnist, tmp_path):
    good = CFG
    with pytest.raises(RunFailedError) as e:
        run_many([good, DIVERGING], backend=SerialBackend(), root=tmp_path, progress=False)
    msg = str(e.value)
    assert "1 of 2 runs diverged" in msg and "TrainingDivergedError" in msg and "crashed" not in msg
    assert is_cached(good, tmp_path) and not is_cached(DIVERGING, tmp_path)

    out = run_many([good, DIVERGING, good], backend=SerialBackend(), root=tmp_path, progress=False,
                   keep_diverged=True)
    assert len(out) == 3 and out[1] is None
    assert isinstance(out[0], History) and out[0].to_state() == out[2].to_state()
    assert out[0].rounds_done == 4


@register
@dataclass(frozen=True)
class _BrokenAtRoundOne(FedAvg):
    """A user's algorithm with a bug that shows in round 1 (an error that is not a divergence)."""

    name = "_test_broken_at_round_one"

    def aggregate(self, reports, state, ctx):
        if ctx.round == 1:
            raise IndexError("a bug in the rule")
        return super().aggregate(reports, state, ctx)


def test_a_crash_is_never_reported_as_divergence(fmnist, tmp_path):
    """A run that fails with an error other than TrainingDivergedError crashed: even with
    ``keep_diverged=True`` the sweep raises, after the other runs, naming the crash apart from the
    divergences, so a notebook cannot draw a table in which a bug reads as the method diverging.
    Broken variant caught: every failure held None (notebook 06 printed "FedNL (μ=1): diverged on
    seeds [0, 1]" for runs that had crashed in a thread-unsafe Hessian, and ended "ok")."""
    broken = CFG.replace(algorithm=_BrokenAtRoundOne(), rounds=2)
    with pytest.raises(RunFailedError) as e:
        run_many([CFG, DIVERGING, broken], backend=SerialBackend(), root=tmp_path, progress=False, keep_diverged=True)
    msg = str(e.value)
    assert "1 of 3 runs crashed (an error, not a divergence" in msg and "IndexError: a bug in the rule" in msg
    assert "1 of 3 runs diverged" in msg and msg.index("crashed") < msg.index("diverged")
    assert is_cached(CFG, tmp_path)
    # the divergence alone is an outcome the caller asked to keep
    assert run_many([CFG, DIVERGING], backend=SerialBackend(), root=tmp_path, progress=False,
                    keep_diverged=True)[1] is None


def _worker_pid(_item) -> int:
    import os
    return os.getpid()


def _alive(pid: int) -> bool:
    import os
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(backend, n: int = 6) -> set[int]:
    out = [r for _, r in backend.submit_all(_worker_pid, range(n))]
    assert all(isinstance(r, int) for r in out), out
    return set(out)


@pytest.mark.slow
def test_process_backend_matches_serial_keeps_its_workers_and_reports_failures(fmnist, tmp_path):
    """The real pool: two spawned one-thread workers train the same histories as this process,
    the pool outlives a sweep (a notebook's next sweep starts warm), a failing run is reported
    while the others land in the cache, a worker killed between sweeps is replaced, and close()
    ends the workers."""
    import os
    import signal
    import time

    a, b = CFG.replace(rounds=2), CFG.replace(rounds=2, seed=1)
    serial = run_many([a, b], backend=SerialBackend(), root=tmp_path / "serial", progress=False)
    with ProcessBackend(workers=2, threads=1) as backend:
        pids = _pids(backend)
        # the pool's processes, not only those that got a task: the second may still be starting
        workers = set(backend._pool._processes)
        assert pids <= workers and 1 <= len(workers) <= 2
        pooled = run_many([a, b], backend=backend, root=tmp_path / "pool", progress=False)
        for s, p in zip(serial, pooled):
            assert_same_history(s, p)
        assert _pids(backend) <= workers                   # run_many kept the caller's pool: same workers
        assert set(backend._pool._processes) == workers
        with pytest.raises(RunFailedError, match="1 of 2 runs diverged"):
            run_many([CFG, DIVERGING], backend=backend, root=tmp_path / "pool", progress=False)
        assert is_cached(CFG, tmp_path / "pool") and not is_cached(DIVERGING, tmp_path / "pool")

        os.kill(next(iter(pids)), signal.SIGKILL)           # a worker dies while the pool is idle
        deadline = time.monotonic() + 30
        while not getattr(backend._pool, "_broken", False) and time.monotonic() < deadline:
            time.sleep(0.05)
        fresh = _pids(backend)                              # the next sweep runs on a new pool
        assert not fresh & workers
        fresh |= set(backend._pool._processes)
    assert backend._pool is None
    time.sleep(0.2)
    assert not any(_alive(p) for p in fresh | workers)      # close() ended every worker


def test_run_many_validates_everything_before_training(tmp_path, monkeypatch):
    from fairfl.base.errors import ConfigError

    def no_training(*a, **kw):
        raise AssertionError("trained before validating every config")
    monkeypatch.setattr(experiments, "simulate", no_training)
    with pytest.raises(ConfigError, match="participation"):
        run_many([CFG, CFG.replace(participation=0.0)], backend=SerialBackend(), root=tmp_path, progress=False)


# ----------------------------------------------------------------------------- (g) divergence guard

@pytest.mark.slow
def test_nan_direction_stops_the_run_and_keeps_the_last_checkpoint(fmnist, tmp_path, monkeypatch):
    ok_dir = tmp_path / "ok"
    _sim(CFG, checkpoint_dir=ok_dir, stop_after=2)
    expected = load_checkpoint(ok_dir, CFG)

    real = FedAvg.aggregate

    def poisoned(self, reports, state, ctx):
        agg = real(self, reports, state, ctx)
        if ctx.round == 3:
            d = agg.direction.clone()
            d[0] = float("nan")
            return Aggregate(d, agg.state, agg.info, agg.weights)
        return agg
    monkeypatch.setattr(FedAvg, "aggregate", poisoned)

    d = tmp_path / "run"
    with pytest.raises(TrainingDivergedError, match="round 3: fedavg produced a NaN/Inf direction"):
        _sim(CFG, checkpoint_dir=d)
    blob = load_checkpoint(d, CFG)
    assert blob is not None and blob.round == 2
    assert torch.equal(blob.params, expected.params)
    assert blob.history.rounds_done == 2
    assert not list(d.glob("*.tmp")) and not list(d.glob(".*.tmp"))   # no half-written file left


def test_diverged_run_in_run_cache_is_not_cached(fmnist, tmp_path):
    with pytest.raises(TrainingDivergedError):
        run(DIVERGING, root=tmp_path, progress=False)
    assert not is_cached(DIVERGING, tmp_path)


# ----------------------------------------------------------------------------- (h) History files

def test_history_save_load_round_trip(reference, tmp_path):
    h = History.from_state(copy.deepcopy(reference[0].to_state()))
    h.info["mean_update_norm"] = [1.5, 2.25, 0.0, 3.0]     # exercise the aggregator-info field
    h.save(tmp_path)
    loaded = History.load(tmp_path)
    assert loaded.to_state() == h.to_state()
    assert loaded.final_acc().tolist() == reference[0].final_acc().tolist()
    with np.load(tmp_path / "history.npz", allow_pickle=False) as z:   # no pickle inside
        assert set(z.files) == {"test_acc", "test_loss", "sampled"}
        assert z["test_acc"].dtype == np.float64 and z["test_acc"].shape == (3, 10)
        assert z["sampled"].dtype == np.int64 and z["sampled"].shape == (4, 3)
    scalars = json.loads((tmp_path / "history.json").read_text())
    assert scalars["config"] == CFG.to_dict() and "test_acc" not in scalars


def test_history_round_trip_hand_made(tmp_path):
    h = History(config={"a": 1}, eval_rounds=[0, 5], test_acc=[[0.5, 0.25], [0.75, 1.0]],
                test_loss=[[2.0, 1.0], [0.5, 0.125]], train_loss=[2.5, 0.5], round_lr=[1.0] * 5,
                round_improved=[1.0, 0.5, 0.0, 1.0, 1.0], round_time=[0.1] * 5,
                sampled=[[0, 1]] * 5, info={"x": [1.0] * 5})
    h.save(tmp_path)
    assert History.load(tmp_path) == h


def test_tqdm_disable_silences_a_single_runs_bar(fmnist, fairfl_env):
    """tqdm reads TQDM_* when it is imported: set it for a fresh process, as CI does."""
    import os
    import subprocess
    import sys
    code = ("from fairfl import ExperimentConfig, LocalTraining, PartitionSpec\n"
            "from fairfl.runs.loop import simulate\n"
            "simulate(ExperimentConfig(dataset='fashion_mnist', model='mlp2', rounds=1, eval_every=1, participation=0.3,"
            " partition=PartitionSpec('shards', num_clients=10, shards_per_client=2),"
            " local=LocalTraining(batch_size=50)), progress=True)\n")
    for disable, shown in (("1", False), ("", True)):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TQDM_DISABLE": disable})
        assert r.returncode == 0, r.stderr
        assert ("fedavg seed=0" in r.stderr) is shown, r.stderr


# ----------------------------------------------------------------------------- the averaged iterate

from dataclasses import dataclass  # noqa: E402

from fairfl.federated.algorithms import Algorithm, register  # noqa: E402
from fairfl.training.client import evaluate_model, set_flat_params  # noqa: E402
from fairfl.federated.models import build_model  # noqa: E402
from fairfl.runs.loop import federated_data  # noqa: E402

# The global model after round t is SCALES[t]·w_0. Each scale, and each difference to the previous
# one, is ± a power of two, so that the loop's w − (w − SCALES[t]·w_0) is SCALES[t]·w_0 exactly.
SCALES = (2.0, 4.0, 2.0, -2.0)


@register
@dataclass(frozen=True)
class _HandMadeModels(Algorithm):
    """Moves the global model to SCALES[t]·w_0 in round t, whatever the clients send."""
    name = "_test_hand_made_models"

    def init(self, params, num_clients):
        return params.clone()

    def aggregate(self, reports, state, ctx):
        return Aggregate(ctx.params - SCALES[ctx.round] * state, state)


def test_averaged_iterate_on_hand_made_models(fmnist, tmp_path):
    base = CFG.replace(model="logreg", clients_per_round=1)
    cfg = base.replace(algorithm=_HandMadeModels(), averaged_iterate=True)
    h = _sim(cfg)
    fed = federated_data(cfg)
    model = build_model(cfg.model, fed.dataset.input_shape, fed.dataset.num_classes, seed=cfg.seed)
    w0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()

    def scored(scale):
        set_flat_params(model, scale * w0)
        return evaluate_model(model, fed.clients)
    # w̄_T = (1/T)·Σ_{t=1..T} w_t: after 2 rounds (2 + 4)/2 = 3, after 4 rounds 6/4 = 1.5; round 0: w_0
    want = [scored(1.0), scored(3.0), scored(1.5)]
    assert h.eval_rounds == [0, 2, 4]
    assert h.avg_test_acc == [e.test_acc for e in want] and h.avg_test_loss == [e.test_loss for e in want]
    assert h.avg_train_loss == [e.train_loss for e in want]
    np.testing.assert_array_equal(h.averaged_acc(), np.asarray([e.test_acc for e in want]))
    # the last iterate is −2·w_0: the loop still reports it as before
    assert h.test_acc[-1] == scored(-2.0).test_acc and h.test_acc[-1] != h.avg_test_acc[-1]
    # resumed from the checkpoint after round 2, the sum carries on
    _sim(cfg, checkpoint_dir=tmp_path, stop_after=2)
    resumed = _sim(cfg, checkpoint_dir=tmp_path)
    assert resumed.avg_test_acc == h.avg_test_acc and resumed.avg_test_loss == h.avg_test_loss
    # off by default: nothing recorded, and asking for it says how to get it
    plain = _sim(base.replace(algorithm=_HandMadeModels()))
    assert plain.avg_test_acc == [] and plain.test_acc == h.test_acc
    with pytest.raises(ValueError, match="averaged_iterate=True"):
        plain.averaged_acc()
    assert "averaged_iterate" not in plain.config and cfg.key() != base.replace(algorithm=_HandMadeModels()).key()


def test_averaged_iterate_is_afls_averaged_iterate():
    """AFL reports Mohri et al.'s w̄_T = (1/T)·Σ_{t=1..T} w_t itself; the loop's averaged iterate of
    the same run (AFL reporting its last iterate) is the same model."""
    from fairfl.federated.algorithms.afl import AFL
    adult = ExperimentConfig(dataset="adult", model="logreg",
                             partition=PartitionSpec("attribute", num_clients=2, split=None),
                             local=LocalTraining(epochs=1, batch_size=200, lr=0.05), rounds=3, clients_per_round=2,
                             eval_every=1, track_improved=False)
    afl = _sim(adult.replace(algorithm=AFL(lr_lambda=0.5)))
    loop = _sim(adult.replace(algorithm=AFL(lr_lambda=0.5, average_iterates=False), averaged_iterate=True))
    assert loop.test_acc != afl.test_acc                      # the last iterate differs from the average
    np.testing.assert_allclose(loop.averaged_acc(), afl.acc(), atol=1 / 16281)
    np.testing.assert_allclose(loop.avg_train_loss, afl.train_loss, rtol=1e-5)


def test_a_partition_that_runs_still_hold_is_shared_not_built_again(monkeypatch):
    """A lockstep group of runs on more partitions than a worker keeps (notebook 06's reporting
    sweep: ten seeds, each its own partition) built a partition again for each of its runs once it
    had left the kept four: one copy of Fashion-MNIST per run, 11 GB per worker. A partition still
    held by a run is now shared; once no run holds them, only those within ``KEEP_BYTES`` are kept."""
    import gc

    from fairfl.runs import loop
    configs = [ExperimentConfig(dataset="mnist_5k", partition=PartitionSpec("iid", num_clients=4, seed=s))
               for s in range(6)]
    monkeypatch.setattr(loop, "KEEP_BYTES", 3 * loop._held_bytes(loop.federated_data(configs[0])))
    held = [loop.federated_data(c) for c in configs]            # six partitions, as six runs of a group hold them
    assert len({id(f) for f in held}) == 6 and len(loop._FEDERATED) == 3
    again = [loop.federated_data(c) for c in configs]
    assert all(a is b for a, b in zip(again, held))              # the first three had left the kept three
    del held, again
    gc.collect()
    ours = [f for f in loop._ALIVE.values() if any(f.spec == c.partition for c in configs)]
    assert len(ours) == 3                                        # nothing but the kept ones once no run holds them


def test_the_memo_keeps_only_the_last_partition_no_run_holds():
    """A sweep's groups are each on one partition, so a worker kept partitions that no later group
    used (notebook 06: 512 MiB in each worker and in the kernel). By default only the last is kept."""
    import gc

    from fairfl.runs import loop
    configs = [ExperimentConfig(dataset="mnist_5k", partition=PartitionSpec("iid", num_clients=4, seed=s))
               for s in (41, 42, 43)]
    for c in configs:
        loop.federated_data(c)                                     # each dropped as soon as it is built
    gc.collect()
    kept = [f for f in loop._ALIVE.values() if any(f.spec == c.partition for c in configs)]
    assert [f.spec for f in kept] == [configs[-1].partition]
    assert loop.federated_data(configs[-1]) is kept[0]             # the last one is not built again


def _storage_bytes(feds) -> int:
    """Bytes of the distinct tensor storages the partitions hold (their dataset and their clients')."""
    seen: dict[int, int] = {}
    for fed in feds:
        tensors = [fed.dataset.x_train, fed.dataset.y_train, fed.dataset.x_test, fed.dataset.y_test]
        for c in fed.clients:
            tensors += [c.x_train, c.y_train, c.x_val, c.y_val, c.x_test, c.y_test]
        for t in tensors:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def test_partitions_of_a_class_subset_share_one_filtered_dataset(fmnist):
    """Ten partitions (ten seeds) of Fashion-MNIST's classes 0, 1, 2 hold one copy of the filtered
    dataset between them, beside each one's clients: a sweep over seeds (notebook 06's ten reporting
    seeds) had held ten (66 of each partition's 123 MB). Measured in the bytes of the distinct
    storages: ten partitions cost one dataset plus ten partitions' clients."""
    from fairfl.runs.loop import federated_data
    base = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                            partition=PartitionSpec("shards", num_clients=20, shards_per_client=2),
                            local=LocalTraining(batch_size=50, lr=0.1), rounds=1)
    feds = [federated_data(base.replace(partition=PartitionSpec("shards", num_clients=20, shards_per_client=2,
                                                                 seed=s))) for s in range(10)]
    assert len({id(f) for f in feds}) == 10
    assert len({f.dataset.x_train.untyped_storage().data_ptr() for f in feds}) == 1
    one, ten = _storage_bytes(feds[:1]), _storage_bytes(feds)
    dataset = _storage_bytes([type(feds[0])(feds[0].dataset, feds[0].spec, [], [])])
    clients = one - dataset
    assert ten == dataset + 10 * clients, (one, ten, dataset)
    assert ten < 0.6 * 10 * one                         # against ten copies of everything


def _held_bytes(datas, pools: bool = True) -> int:
    """Bytes of the distinct storages of the clients' data ``datas`` (each a run's client list) and
    (``pools``) of the training pools made from them (``fairfl.training.client.training.pool_of``)."""
    from fairfl.training.client.training import _POOLS
    seen: dict[int, int] = {}
    tensors = [getattr(c, f) for data in datas for c in data
               for f in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")]
    tensors += [t for (ids, _), pool in _POOLS.items() if pools and any(ids == tuple(map(id, d)) for d in datas)
                for t in (pool.x, pool.y)]
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def test_a_lockstep_group_holds_its_federations_data_once(fmnist, monkeypatch):
    """The runs of one lockstep group on one partition (notebook 06: every method at one seed) hold the
    partition's data once between them: its clients' tensors, of which the training pool is a view, as
    much as a run alone does. Broken variants caught: each run partitioning the data anew, or making its
    own pool (notebook 06's groups of 17-24 runs would hold 17-24 copies), or a pool that copies the
    clients' data (every partition of a sweep held twice)."""
    from fairfl.federated.algorithms.ditto import Ditto
    from fairfl.federated.algorithms.fedavg import FedProx
    from fairfl.training.client import ClientRuntime
    from fairfl.training.client.training import _POOLS
    from fairfl.runs.loop import simulate_group
    datas = []
    real = ClientRuntime.__init__

    def spy(self, model, data, *args, **kwargs):
        datas.append(data)
        real(self, model, data, *args, **kwargs)
    monkeypatch.setattr(ClientRuntime, "__init__", spy)
    base = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                            partition=PartitionSpec("shards", num_clients=6, shards_per_client=1, seed=7),
                            local=LocalTraining(batch_size=50, lr=0.1), rounds=2, participation=0.5, eval_every=2,
                            track_improved=False)
    _POOLS.clear()
    alone = simulate(base, progress=False)
    one = _held_bytes(datas)
    assert one == _held_bytes(datas, pools=False) and len(_POOLS) == 1    # the pool holds no bytes of its own
    datas.clear()
    _POOLS.clear()
    group = [base.replace(algorithm=a) for a in (FedAvg(), FedProx(mu=0.1), Ditto(lam=0.5), FedAvg(server_lr=0.5))]
    results = simulate_group(group, progress=False)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert results[0].test_acc == alone.test_acc
    assert len(datas) == 4 and all(d is datas[0] for d in datas)
    assert _held_bytes(datas) == one, (one, _held_bytes(datas))
    assert sum(any(ids == tuple(map(id, d)) for d in datas) for ids, _ in _POOLS) == 1


def test_the_runs_threads_share_two_allocator_arenas_and_a_sweep_reports_its_peak_memory():
    """glibc's per-thread arenas kept what each run's thread freed: 17 runs of notebook 06's MLP held
    5.1 GB in one worker, 2.2 GB with two arenas. A sweep samples its process tree's resident memory
    and says its peak."""
    import sys

    from fairfl.training.engine import cores
    from fairfl.runs.sweeps.usage import MemoryPeak, SweepUsage, tree_rss
    if sys.platform.startswith("linux"):
        assert cores.limit_malloc_arenas() is True
    with MemoryPeak(every=3600) as m:            # one sample, at the start
        pass
    assert m.peak is not None and m.peak > 10 * 2 ** 20 and tree_rss() > 0
    assert "peak memory 1.5 GiB" in str(SweepUsage(2, 10.0, 15.0, {}, peak_rss=1.5 * 2 ** 30))


def test_a_trim_hands_the_free_pages_back_and_a_group_ends_with_one(monkeypatch):
    """A worker kept the peak of its largest group through every later sweep (notebook 06: 3.7 GB,
    most of it free pages glibc held): ``trim_free_memory`` hands freed pages back, and a lockstep
    group calls it after each fused execution and once it has returned."""
    import psutil

    from fairfl.training.engine import cores
    if cores._glibc() is None:
        pytest.skip("glibc only")
    me = psutil.Process()
    blocks = [bytearray(64 * 1024) for _ in range(3200)]       # 200 MiB in 64 KiB pieces, below mmap's threshold
    pin = bytearray(64 * 1024)                                   # noqa: F841 - above them: free() cannot shrink the heap
    del blocks
    held = me.memory_info().rss
    cores.trim_free_memory()
    assert held - me.memory_info().rss > 100 * 2 ** 20

    calls = []
    monkeypatch.setattr(cores, "trim_free_memory", lambda: calls.append(1))
    base = ExperimentConfig(dataset="mnist_5k", partition=PartitionSpec("iid", num_clients=3), rounds=2,
                            local=LocalTraining(epochs=1, batch_size=50, lr=0.05))
    results = simulate_group([base.replace(seed=s) for s in (0, 1)], progress=False)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert len(calls) >= 3              # two rounds' executions at least, and the group's end


def test_a_pool_lives_no_longer_than_its_clients():
    """The engine's pool of a client list is a view of its partition's training block: kept by count
    (eight), pools held the last eight partitions of notebook 06's reporting sweep in every worker,
    1.4 GB more, growing seed by seed. A pool now goes with its clients."""
    import gc
    import weakref

    from fairfl.federated.data import load_dataset
    from fairfl.federated.partition import federate
    from fairfl.training.client.training import _POOLS, pool_of
    fed = federate(load_dataset("mnist_5k"), PartitionSpec("iid", num_clients=4, seed=3))
    pool = pool_of(fed.clients)
    assert pool_of(fed.clients) is pool
    assert pool.x.untyped_storage().data_ptr() == fed.blocks["x_train"].untyped_storage().data_ptr()   # a view
    held, before = weakref.ref(pool), len(_POOLS)
    del fed, pool
    gc.collect()
    assert held() is None and len(_POOLS) == before - 1
