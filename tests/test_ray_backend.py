"""RayBackend on a real local Ray instance (two CPUs, loopback only, started here and shut down at
the end): a sweep gives the histories SerialBackend gives, its entries come back through Ray's
object store into the driver's cache; a worker process that really dies mid-sweep costs a retry
of its group and nothing else, and a run that kills every worker it gets is reported after a
bounded number of tries while the other runs are kept; FAIRFL_BACKEND and the CLI pick Ray."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec  # noqa: E402
from fairfl.runs.cache import entry, is_cached  # noqa: E402
from fairfl.base.errors import ConfigError, RunFailedError  # noqa: E402
from fairfl.runs.sweeps import RayBackend, SerialBackend, default_backend, run_many, scratch_root  # noqa: E402

CFG = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="logreg",
                       partition=PartitionSpec("iid", num_clients=6), local=LocalTraining(epochs=1, batch_size=100, lr=0.05),
                       rounds=3, clients_per_round=4, eval_every=1, checkpoint_every=1)

# Algorithms that end the worker process they run in, in round 1 (after round 0's checkpoint): a
# real process death, as an out-of-memory kill would be. DiesOnce only while its marker file does
# not exist yet (it writes its pid there first), DiesAlways every time.
KILLERS = '''
import os
from dataclasses import dataclass
from pathlib import Path

from fairfl.federated.algorithms import register
from fairfl.federated.algorithms.fedavg import FedAvg


@register
@dataclass(frozen=True)
class DiesOnce(FedAvg):
    name = "dies_once"
    marker: str = ""
    spare: int = -1          # a process it must not end (the test's)

    def aggregate(self, reports, state, ctx):
        if ctx.round == 1 and not Path(self.marker).exists() and os.getpid() != self.spare:
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().aggregate(reports, state, ctx)


@register
@dataclass(frozen=True)
class DiesAlways(FedAvg):
    name = "dies_always"

    def aggregate(self, reports, state, ctx):
        if ctx.round == 1:
            os._exit(1)
        return super().aggregate(reports, state, ctx)
'''


@pytest.fixture(scope="module")
def local_ray(fairfl_env, fmnist, tmp_path_factory, one_ray_at_a_time):
    """A local Ray instance with two CPUs. Its workers inherit this process's environment when it
    starts: the FAIRFL_* folders, and a PYTHONPATH holding the killers' module (as a node of a
    cluster would have the code of an algorithm registered outside fairfl)."""
    folder = tmp_path_factory.mktemp("ray_algorithms")
    (folder / "ray_algorithms_mod.py").write_text(KILLERS)
    sys.path.insert(0, str(folder))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]))
        # the node on the loopback address: nothing of the test's Ray listens beyond this machine
        # through RayBackend.start, as fairfl starts Ray: without the FutureWarning tip ray.init gives at every start
        RayBackend.start(None, num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
        try:
            import ray_algorithms_mod
            yield ray_algorithms_mod
        finally:
            ray.shutdown()
            sys.path.remove(str(folder))
            sys.modules.pop("ray_algorithms_mod", None)


def alive(pid: int) -> bool:
    try:                                     # a zombie (dead, not yet reaped by Ray's raylet) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


FIELDS = ("config", "eval_rounds", "test_acc", "test_loss", "train_loss", "round_lr", "round_improved", "sampled",
          "info")      # every History field but round_time (seconds)


def same(a, b) -> None:
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), f


@pytest.fixture(scope="module")
def serial(local_ray, tmp_path_factory):
    """The cache folder of the one-process runs compared with."""
    return tmp_path_factory.mktemp("serial")


@pytest.mark.slow
def test_a_sweep_through_ray_equals_the_serial_one(serial, tmp_path):
    configs = [CFG.replace(seed=s) for s in range(4)]
    alone = run_many(configs, backend=SerialBackend(), root=serial, progress=False)
    backend = RayBackend()
    assert backend.workers == 2 and not backend.shares_files
    out = run_many(configs, backend=backend, root=tmp_path, progress=False)    # two groups of two, side by side
    for s, r in zip(alone, out):
        same(s, r)
    for c in configs:   # the entries came back to the driver's cache; the worker's folder kept nothing
        assert is_cached(c, tmp_path) and not entry(c, scratch_root()).exists()
        assert sorted(p.name for p in entry(c, tmp_path).iterdir()) == ["config.json", "history.json", "history.npz", "version.json"]
    backend.close()
    assert ray.is_initialized()              # a Ray it did not start is left running


@pytest.mark.slow
def test_a_killed_worker_costs_only_its_runs_and_one_that_always_kills_is_reported(local_ray, serial, tmp_path):
    marker = tmp_path / "died"
    good = [CFG.replace(seed=s) for s in range(2)]
    once = CFG.replace(seed=2, algorithm=local_ray.DiesOnce(marker=str(marker)))
    always = CFG.replace(seed=3, algorithm=local_ray.DiesAlways())
    # plan_groups deals these into [good 0, once] and [good 1, always]. Without Ray's retries, each
    # group's worker dies in round 1, so the sweep sends its runs again one by one: the good ones and
    # DiesOnce resume from their round-0 checkpoints on this node and finish; DiesAlways kills its
    # worker once more, alone, and is reported.
    with pytest.raises(RunFailedError, match=r"(?s)1 of 4 runs crashed .*dies_always seed=3: WorkerDied: the Ray "
                                             r"worker running it died or its node left, each of the 1 times"):
        run_many(good + [once, always], backend=RayBackend(retries=0), root=tmp_path, progress=False)
    pid = int(marker.read_text())            # DiesOnce really ended a worker process
    assert pid != os.getpid() and not alive(pid)
    assert not is_cached(always, tmp_path)
    kept = run_many(good + [once], backend=SerialBackend(), root=tmp_path, progress=False)     # cached: loaded
    alone = run_many(good + [once], backend=SerialBackend(), root=serial, progress=False)
    for s, k in zip(alone, kept):
        same(s, k)


@pytest.mark.slow
def test_fairfl_backend_picks_ray_and_a_wrong_name_is_refused(local_ray, tmp_path, monkeypatch):
    from fairfl.cli import main
    monkeypatch.setenv("FAIRFL_BACKEND", "ray")
    monkeypatch.setenv("FAIRFL_RAY_ADDRESS", "auto")
    backend = default_backend()
    assert isinstance(backend, RayBackend) and backend.address == "auto" and backend.device == "cpu"
    assert default_backend("cuda").device == "cuda"
    # One run, no backend given: FAIRFL_BACKEND sends it to Ray rather than training it here, and
    # its worker dies in round 1; Ray sends the task again (retries=2 by default), which resumes.
    marker = tmp_path / "died"
    once = CFG.replace(seed=2, algorithm=local_ray.DiesOnce(marker=str(marker), spare=os.getpid()))
    (h,) = run_many([once], root=tmp_path, progress=False)
    assert int(marker.read_text()) != os.getpid()
    same(h, run_many([once], backend=SerialBackend(), root=tmp_path / "serial", progress=False)[0])

    monkeypatch.setenv("FAIRFL_BACKEND", "dask")
    with pytest.raises(ConfigError, match="FAIRFL_BACKEND='dask' is not a backend; choose one of serial, process, ray"):
        run_many([CFG.replace(seed=9)], root=tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists() or not any((tmp_path / "never").iterdir())

    monkeypatch.delenv("FAIRFL_BACKEND")
    monkeypatch.delenv("FAIRFL_RAY_ADDRESS")
    monkeypatch.delenv("FAIRFL_PROGRESS", raising=False)     # reproduce sets it for its kernels: restored after
    # the choice is checked, then handed to the notebooks' kernels (here none runs: its output folder
    # cannot be made, under a file)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OSError):
        main(["reproduce", "00", "--backend", "ray", "--address", "ray://head:10001", "--output", str(blocker)])
    assert os.environ["FAIRFL_BACKEND"] == "ray" and os.environ["FAIRFL_RAY_ADDRESS"] == "ray://head:10001"
    with pytest.raises(SystemExit):
        main(["reproduce", "--backend", "dask"])
    assert main(["reproduce", "--backend", "process", "--address", "auto"]) == 2   # an address needs ray
