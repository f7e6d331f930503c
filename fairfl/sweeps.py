"""Run experiments with an on-disk cache, one or many at once (sweeps).

``run(config)`` returns the cached :class:`History` when ``results/<config.key()>/`` holds a
finished run, resumes from its checkpoint when it holds an interrupted one, and trains
otherwise. ``run_many(configs)`` trains only the runs that are not cached and returns every
History in the order given, reporting the failures of single runs without losing the others.

A sweep is one computation: the uncached runs that share dataset, model and device form a
*family*; :func:`plan_groups` deals each family out into groups (at most :data:`MAX_GROUP`
runs; enough groups for the backend's slots, cut by the seconds each family cost the last sweeps
into the same results folder), and a group advances in lockstep
(:func:`fairfl.loop.simulate_group`) so that all (run, client) pairs of a round train in one
fused computation (:mod:`fairfl.engine`). Each run keeps its own sampling, algorithm state,
checkpoint and cache entry, and its history equals the one-run-at-a-time result bit for bit.

Where the groups run is a backend's (``fairfl.backends``: in this process, a pool of worker
processes, a Ray cluster; imported here too, so ``from fairfl.sweeps import ProcessBackend``
works). A backend whose workers share the cache folder (serial, process) trains straight into it;
one that says ``shares_files = False`` (Ray: no shared filesystem is assumed) is sent the runs'
checkpoints with the configs, and its workers send each finished entry back as bytes, which the
sweep writes into the cache atomically.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .atomic import atomic_write
from .backends import (Backend, Failure, ProcessBackend, RayBackend, SerialBackend, WorkerDied,  # noqa: F401
                       chosen_backend, default_backend)
from .cache import FILES as CACHE_FILES
from .cache import Claim, checked_load, is_cached, pack, prepare, receive, results_folder, store
from .cache import load as load_entry
from .cache import entry as cache_entry
from .cache import key as entry_key
from .config import ExperimentConfig
from .engine import schedule_key
from .errors import ConfigError, FairFLError, RunFailedError, TrainingDivergedError
from .history import CHECKPOINT, History
from .loop import simulate, simulate_group
from .progress import SweepProgress


def run_dir(config: ExperimentConfig, root: Path | None = None) -> Path:
    """The run's cache entry (``fairfl.cache``)."""
    return cache_entry(config, root)


def run(config: ExperimentConfig, cache: bool = True, root: Path | None = None,
        progress: bool = True) -> History:
    """One experiment, cached (``fairfl.cache``): a good cached run is returned, an interrupted
    one resumes from its checkpoint, an unusable entry is reported and trained again."""
    check_devices([config])              # a device this machine lacks is named before any data is read
    if not cache:
        return simulate(config, progress=progress)
    results_folder(root)                 # so is a results path that cannot be used
    cached = checked_load(config, root)
    if cached is not None:
        return cached
    d = prepare(config, root)
    with Claim(d) as claim:
        claim.wait(config.label())       # another process training this run: its result is read
        cached = checked_load(config, root)
        if cached is not None:
            return cached
        watch = SweepProgress([d], [config.rounds], enabled=progress, desc=config.label())
        try:
            history = simulate(config, checkpoint_dir=d, progress=False)
            store(history, d)
            watch.finished([0])
        finally:
            watch.close()
    return history


def check_devices(configs: Sequence[ExperimentConfig], backend: Backend | None = None) -> None:
    """Each device the configs train on exists where they train, checked before any data is read
    or cache entry made: on this machine (``fairfl.engine.resolve_device``) unless ``backend``
    trains elsewhere (``trains_here = False``: Ray, whose cluster may have GPUs that this driver
    lacks). Then only the device names are checked here, and CUDA configs need a backend that asks
    the cluster for GPUs (``RayBackend(device="cuda")``, which names a cluster without one): a task
    asking for a GPU that no node has would wait for ever. (A config was validated when it was
    made: it is frozen, so it needs no second check.)"""
    from .engine import resolve_device
    from .engine.device import parse_device
    bad = [c for c in configs if not isinstance(c, ExperimentConfig)]
    if bad:
        raise ConfigError(f"expected ExperimentConfig objects, got {type(bad[0]).__name__}: {bad[0]!r:.100}")
    devices = sorted({c.device for c in configs})
    if getattr(backend, "trains_here", True):
        for device in devices:
            resolve_device(device)
        return
    for device in devices:
        parse_device(device)
    if any(c.device_type == "cuda" for c in configs) and getattr(backend, "device", "cuda") != "cuda":
        raise ConfigError(f"{type(backend).__name__}(device={getattr(backend, 'device', None)!r}) gives its tasks no "
                          "GPU, but some configs train on CUDA: use a backend made with device='cuda'")


class _NamesOnly:
    """A stand-in backend for :func:`check_devices`: check the configs' device names only."""

    trains_here = False
    device = "cuda"


_NAMES_ONLY = _NamesOnly()


def _portable(config: ExperimentConfig) -> tuple[dict, str]:
    """A config as plain data for a worker, with the module that defines its algorithm (a worker
    imports it, so that an algorithm registered outside fairfl is known there). An algorithm of
    ``__main__`` only ever reaches a worker in this process (:func:`_here_for_main`), where
    importing ``__main__`` is a no-op."""
    return config.to_dict(), type(config.algorithm).__module__


def _here_for_main(configs: Sequence[ExperimentConfig], backend: Backend, root: Path | None) -> Backend:
    """An algorithm defined in ``__main__`` — a notebook cell, or a script run as ``python my.py``
    — cannot be imported by a worker process (nor a Ray task): a sweep with one trains in this
    process instead, with its progress and cache as usual, and says so in one line. A notebook cell
    is where a new algorithm is first written, so this is its route, not an error."""
    if isinstance(backend, SerialBackend):
        return backend
    names = sorted({c.algorithm.name for c in configs
                    if type(c.algorithm).__module__ == "__main__" and not is_cached(c, root)})
    if not names:
        return backend
    print(f"{', '.join(names)}: defined in this notebook or script (__main__), which worker processes cannot "
          "import, so this sweep trains in this process (put it in a module to use the workers)", flush=True)
    return SerialBackend()


@dataclass(frozen=True)
class RunError:
    """Why a run of a sweep has no result: it **diverged** (its loss or update became NaN/Inf,
    :class:`~fairfl.errors.TrainingDivergedError`: an outcome of the method at its settings, which a
    table may report) or it **crashed** (any other error: a bug, a resource, a worker that died).
    The two are never merged: a crash read as divergence turns a bug into a finding (a thread-unsafe
    Hessian once made notebook 06 report FedNL as diverged on Adult)."""

    message: str
    diverged: bool = False

    @classmethod
    def of(cls, error: BaseException) -> "RunError":
        return cls(f"{type(error).__name__}: {error}", isinstance(error, TrainingDivergedError))


def _worker_run_group(args: tuple[list[tuple[dict, str]], str | None]) -> list[RunError | None]:
    """Runs in a worker: train (or resume) a group of configs side by side into the cache
    (``fairfl.loop.simulate_group``), each stored as soon as it ends. Returns, per config, None or
    why it stopped."""
    portable, root = args
    import importlib
    for _, module in portable:
        importlib.import_module(module)
    configs = [ExperimentConfig.from_dict(d) for d, _ in portable]
    folder = Path(root) if root else None
    out: list[RunError | None] = [None] * len(configs)
    todo = [i for i, c in enumerate(configs) if checked_load(c, folder) is None]   # another worker may have done it
    claims = {i: Claim(prepare(configs[i], folder)) for i in todo}
    # the runs no other process is training now train together; each of the others is waited for,
    # then read, or trained here if that process stopped before it ended
    busy = [i for i in todo if not claims[i].take(wait=False)]
    try:
        for batch in [[i for i in todo if i not in busy]] + [[i] for i in busy]:
            for i in batch:
                if i in busy:
                    claims[i].wait(configs[i].label())
            batch = [i for i in batch if checked_load(configs[i], folder) is None]
            dirs = [claims[i].folder for i in batch]
            results = simulate_group([configs[i] for i in batch], dirs, progress=False,
                                     on_done=lambda j, history, dirs=dirs: store(history, dirs[j])) if batch else []
            for i, result in zip(batch, results):
                if isinstance(result, BaseException):
                    out[i] = RunError.of(result)
    finally:
        for claim in claims.values():
            claim.release()
    return out


@dataclass(frozen=True)
class Measured:
    """A group's result with what its worker spent on it: the CPU seconds of its process (all its
    threads), the wall seconds, the seconds of its parallel computations at each width
    (``fairfl.engine.cores.width_seconds``), and when it started and ended (``time.time()``) in
    which process. A worker trains one group at a time, so its process's CPU time over the group
    is the group's."""

    result: object
    cpu: float
    wall: float
    widths: dict
    start: float = 0.0
    end: float = 0.0
    pid: int = 0


def _measure(fn, item) -> Measured:
    import time
    from .engine.cores import width_seconds
    cpu, wall, widths, start = time.process_time(), time.perf_counter(), width_seconds(), time.time()
    result = fn(item)
    after = width_seconds()
    return Measured(result, time.process_time() - cpu, time.perf_counter() - wall,
                    {w: after[w] - widths.get(w, 0.0) for w in after if after[w] > widths.get(w, 0.0)},
                    start, time.time(), os.getpid())


def _measured_run_group(args) -> Measured:
    return _measure(_worker_run_group, args)


def _measured_ship_group(group: "ShippedGroup") -> Measured:
    return _measure(_worker_ship_group, group)


@dataclass(frozen=True)
class GroupSpan:
    """One group of a sweep as its worker ran it: how many runs, the worker's process id, when it
    started and ended (seconds from the sweep's start) and the CPU seconds it used."""

    runs: int
    pid: int
    start: float
    end: float
    cpu: float


@dataclass(frozen=True)
class SweepUsage:
    """How busy a sweep kept the cores it had: ``cores`` (the backend's workers × their threads, or
    this process's for one in-process), the sweep's wall seconds, the CPU seconds its groups used,
    the seconds of parallel computation at each width, summed over the groups, and each group's
    span (:class:`GroupSpan`, in the order they ended). ``idle`` is the fraction of the core-time
    (cores × wall) no group used: what an idle tail, or work that cannot use several threads,
    costs; ``tail`` is the part of it after the first worker ran out of groups for good. ``others`` is
    the share of the machine's core-time (all its cores × wall) that processes other than the sweep's
    (this one and those it started) used meanwhile, which an idle share counts as idle (None where it
    cannot be known, e.g. workers on other machines)."""

    cores: int
    wall: float
    cpu: float
    widths: dict
    groups: tuple = ()
    others: float | None = None

    @property
    def idle(self) -> float:
        return max(0.0, 1.0 - self.cpu / (self.cores * self.wall)) if self.wall > 0 else 0.0

    @property
    def tail(self) -> float:
        """The part of ``idle`` that came after the first of the sweep's workers ended its last group:
        the core-time from then to the end that the groups still training did not use (their CPU
        seconds taken as spread evenly over each group's span), over cores × wall. 0 with a single
        worker or without spans."""
        last: dict[int, float] = {}
        for g in self.groups:
            last[g.pid] = max(last.get(g.pid, 0.0), g.end)
        if len(last) < 2 or self.wall <= 0:
            return 0.0
        t0 = min(last.values())
        used = sum(g.cpu * max(0.0, g.end - max(g.start, t0)) / (g.end - g.start)
                   for g in self.groups if g.end > g.start)
        return max(0.0, self.cores * (self.wall - t0) - used) / (self.cores * self.wall)

    def __str__(self) -> str:
        return (f"{self.wall:.0f} s on {self.cores} core{'s' * (self.cores != 1)}, "
                f"{self.idle:.0%} of the core-time idle" +
                (f" ({self.tail:.0%} at the end)" if len({g.pid for g in self.groups}) > 1 else "") +
                # where others used the cores, part of the idle share is theirs, not the scheduler's
                (f"; other processes used {self.others:.0%} of the machine's core-time meanwhile"
                 if self.others is not None and self.others >= 0.005 else ""))


def _others_share(busy: float | None, tree: dict[int, float], wall: float) -> float | None:
    """The share of the machine's core-time over ``wall`` seconds that processes outside this one's
    tree used, from the machine's busy CPU seconds and the tree's (``engine.cores``) at the start."""
    from .engine import cores
    after = cores.machine_busy()
    if busy is None or after is None or wall <= 0:
        return None
    end = cores.tree_cpu()
    if cores.CHILDREN_TIMES:
        # totals, not process by process: a process of the tree that ended (a worker killed, a pool's
        # workers stopped) took its CPU into its parent's figure when it was waited for (engine.cores.tree_cpu)
        ours = sum(end.values()) - sum(tree.values())
    else:       # no children's times: what the processes still there used (one that ended is missed)
        ours = sum(t - tree.get(pid, 0.0) for pid, t in end.items())
    return min(1.0, max(0.0, (after - busy - ours) / ((os.cpu_count() or 1) * wall)))


# the last sweep of this process that trained something (fairfl.notebook prints it after a sweep)
last_usage: SweepUsage | None = None


@dataclass(frozen=True)
class ShippedGroup:
    """A group for a worker that shares no folder with the driver (``RayBackend``): the configs,
    the checkpoints the driver holds for them (bytes, or None), and the device type they train on
    (a backend reserves a GPU for a CUDA group)."""

    runs: list[tuple[dict, str]]
    checkpoints: list[bytes | None]
    device_type: str = "cpu"


def scratch_root() -> Path:
    """The worker-side results folder of :func:`_worker_ship_group`: one per machine and user, not
    per task, so that a task that Ray sends again to the same machine after its worker died
    resumes from the checkpoints that worker left."""
    import tempfile
    return Path(tempfile.gettempdir()) / f"fairfl-worker-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def _worker_ship_group(group: ShippedGroup) -> list[tuple[RunError | None, str, dict[str, bytes] | None]]:
    """Runs in a worker that shares no folder with the driver: train (or resume) the group into
    this machine's :func:`scratch_root` as :func:`_worker_run_group` does into the cache, then
    return, per config, (the error that stopped it or None, its entry's key here, the files of its
    finished entry as bytes); the driver writes them into its cache (``fairfl.cache.receive``) and
    this machine keeps nothing. The key lets the driver refuse a run trained on other data than
    its own (the key holds the data's fingerprint and the cache version)."""
    import importlib
    for _, module in group.runs:
        importlib.import_module(module)
    configs = [ExperimentConfig.from_dict(d) for d, _ in group.runs]
    root = results_folder(scratch_root())
    for c, blob in zip(configs, group.checkpoints):
        d = prepare(c, root)
        # one left here by an earlier attempt of this task is newer than the driver's (which only
        # a sweep on a backend that shares the cache folder has written)
        if blob is not None and not (d / CHECKPOINT).is_file():
            atomic_write(d / CHECKPOINT, lambda p, b=blob: Path(p).write_bytes(b))
    errors = _worker_run_group((group.runs, str(root)))
    out = []
    for c, error in zip(configs, errors):
        d = cache_entry(c, root)
        files = pack(d) if error is None else None
        if error is None:
            shutil.rmtree(d, ignore_errors=True)
        out.append((error, entry_key(c, root), files))
    return out


def _ship(configs: Sequence[ExperimentConfig], root: Path | None) -> ShippedGroup:
    blobs = []
    for c in configs:
        path = cache_entry(c, root) / CHECKPOINT
        blobs.append(path.read_bytes() if path.is_file() else None)
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    return ShippedGroup([_portable(c) for c in configs], blobs, device)


def _receive(config: ExperimentConfig, shipped: tuple[RunError | None, str, dict[str, bytes] | None],
             root: Path | None) -> RunError | None:
    """Write a run a worker sent back into the cache; why it has no result, or None."""
    error, key, files = shipped
    if error is not None:
        return error
    if key != entry_key(config, root):
        return RunError("the worker's data or fairfl differ from this machine's (its cache key is another): give "
                        "every node the same data files and fairfl version")
    try:
        receive(config, files, root)
    except FairFLError as e:
        return RunError.of(e)
    return None


# Runs of one family — same data, model and shape of local training — share their fused steps best.
# A group is at most this many runs (memory: each holds its own model, state and history). A GPU
# needs many instances per step to be busy (a stacked step of the Table 3 CNN was measured to fill
# an H100 only near 600 instances); a 2-core CPU gains little beyond a few hundred.
MAX_GROUP = {"cpu": 32, "cuda": 512}


def _family(config: ExperimentConfig) -> str:
    """Runs of one family share lockstep groups: what the engine's rule of fusion
    (``fairfl.engine.fusion_key``) asks of their jobs, read off a config — the architecture (by its
    data and model) and the steps (``fairfl.engine.schedule_key``). Runs that differ only in the kind
    of update (momentum, weight decay, proximal term) still share a group: each of its executions
    trains their stacks side by side."""
    return json.dumps([config.dataset, dict(config.dataset_options), config.model, dict(config.model_options),
                       *schedule_key(config.local), config.batched, config.device_type], sort_keys=True, default=str)


def _partition_key(config: ExperimentConfig, seed: bool = True) -> str:
    partition = config.to_dict()["partition"]
    return json.dumps(partition if seed else {k: v for k, v in partition.items() if k != "seed"},
                      sort_keys=True, default=str)


def expected_cost(config: ExperimentConfig) -> float:
    """A run's work relative to the other runs of its family (which share data, model and local
    steps, :func:`_family`), in client-epochs: its rounds × clients per round × local passes, plus its
    evaluations, each a forward pass over every client's data (about a third of a training pass).
    An estimate from the config alone: it cannot see an algorithm's own work (a second-order method's
    Hessians) nor compare two families (an epoch of Adult at b = 10 is hundreds of steps, one of
    Fashion-MNIST's shards at b = 50 twelve): :func:`plan_groups` scales it by each family's measured
    rate (:func:`measured_rates`), and the cores of workers that finish early are lent to those still
    training (``fairfl.engine.cores.CoreBank``)."""
    passes = config.local.epochs if config.local.steps is None else 1
    evaluations = config.rounds // max(1, config.eval_every) + 1
    return config.rounds * config.num_sampled * passes + evaluations * config.partition.federation_size / 3


# What a sweep measured of each family's cost (CPU seconds per unit of expected_cost), kept in the
# results folder so that the next sweep — the next cell, the next session — cuts and orders its groups
# by seconds, not by client-epochs that differ 100-fold between families. Only the order and the cut of
# groups read it: a run's result never depends on it (tests/test_executor.py).
RATES_FILE = ".sweep-rates.json"


def _rate_key(config: ExperimentConfig) -> str:
    """A family on one kind of partition: the partition without its seed (notebook 06 redraws each
    seed's partition, whose runs cost alike)."""
    return _family(config) + _partition_key(config, seed=False)


def measured_rates(root: Path | None = None) -> dict[str, float]:
    """The rates the sweeps into ``root`` measured ({} where none did, or the file is unreadable:
    it is a hint, never a result)."""
    try:
        data = json.loads((results_folder(root) / RATES_FILE).read_text())
        return {str(k): float(v) for k, v in data.items() if float(v) > 0}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _remember_rates(measured: dict[str, list[float]], root: Path | None) -> None:
    """Blend this sweep's rates (per key, CPU seconds over expected cost of each group) into the file,
    half old, half new."""
    if not measured:
        return
    rates = measured_rates(root)
    for key, values in measured.items():
        new = sum(values) / len(values)
        rates[key] = new if key not in rates else (rates[key] + new) / 2
    try:
        atomic_write(results_folder(root) / RATES_FILE,
                     lambda p: Path(p).write_text(json.dumps(rates, sort_keys=True, indent=0)))
    except FairFLError:
        pass                 # a read-only results folder: the next sweep plans by client-epochs


def plan_groups(configs: Sequence[ExperimentConfig], slots: int, max_group: int | None = None,
                rates: dict[str, float] | None = None) -> list[list[int]]:
    """Indices of ``configs`` in lockstep groups: runs of one family on one partition together, each cut into
    enough groups to keep ``slots`` workers busy (in proportion to its share of the runs) and none
    larger than ``max_group`` (default: :data:`MAX_GROUP` of the family's device); members dealt out
    longest first to the group with the least expected work (:func:`expected_cost`, in seconds where
    ``rates`` has the family's measured rate), so that the groups of a family cost alike. With several
    slots and every family's rate measured, no group is expected to cost more than a 2 × slots-th of
    the sweep (where its family has two runs a group to spare): the last groups to start are then
    short, and none runs on alone for long after the others are done. A family that is not ``batched`` (the reference loop, which fuses
    nothing) goes out as single runs. The costliest groups first: a pool takes them in this order,
    and the short ones fill in at the end."""
    # Within a family, the runs of one partition go together: a group then holds its data once and
    # gathers each step's batches from one pool. Dealt across groups, notebook 06's ten seeds (each its
    # own partition) put ten partitions of Fashion-MNIST in every group, and two workers filled 24 GB.
    families: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        families.setdefault(_family(c) + _partition_key(c), []).append(i)
    rates = rates or {}
    keys = [_rate_key(c) for c in configs]
    known = sorted(rates[k] for k in set(keys) if k in rates)
    fallback = known[len(known) // 2] if known else 1.0     # a family not measured yet: a typical one
    cost = [expected_cost(c) * rates.get(k, fallback) for c, k in zip(configs, keys)]
    # the cut by cost needs costs that compare across families: every family measured (notebook 06's
    # first sweep, cut by client-epochs, left one worker alone for 98 s of 571)
    measured = slots > 1 and all(k in rates for k in keys)
    target = sum(cost) / (2 * slots) if measured else float("inf")
    groups = []
    for members in families.values():
        if not configs[members[0]].batched:
            # nothing fuses in the reference loop, so a group would only train its runs one after another:
            # single runs let the workers balance to the last run (a worker loads the data once, fairfl.loop)
            groups += [[i] for i in members]
            continue
        cap = max_group or MAX_GROUP[configs[members[0]].device_type]
        k = max(-(-len(members) // cap), round(slots * len(members) / max(1, len(configs))), 1)
        # notebook 06's 18 extension runs on Adult cost 121 CPU-seconds of the sweep's 307 in one group,
        # which ran on alone for 36 s after the other worker was done (it fuses too little to use a lent core)
        if target < float("inf"):
            need = math.ceil(sum(cost[i] for i in members) / target - 1e-9)     # groups of at most `target`
            k = max(k, min(need, len(members) // 2))
        k = min(k, len(members))
        cut: list[list[int]] = [[] for _ in range(k)]
        load = [0.0] * k
        for i in sorted(members, key=lambda i: (-cost[i], i)):       # longest processing time first
            g = min((g for g in range(k) if len(cut[g]) < cap), key=lambda g: (load[g], g))
            cut[g].append(i)
            load[g] += cost[i]
        groups += [sorted(g) for g in cut if g]
    return sorted(groups, key=lambda g: (-sum(cost[i] for i in g), g[0]))


def _backend_cores(backend: Backend) -> int:
    """The cores a sweep on ``backend`` may keep busy: a pool's workers × threads, Ray's slots, this
    process's threads for one that trains in it."""
    from .engine import cores
    if isinstance(backend, ProcessBackend):
        return backend.workers * backend.threads
    if isinstance(backend, SerialBackend):
        return cores.threads()
    return max(1, int(getattr(backend, "workers", 1)))


def run_many(configs: Iterable[ExperimentConfig], backend: Backend | None = None,
             root: Path | None = None, progress: bool = True, keep_diverged: bool = False,
             max_group: int | None = None) -> list[History | None]:
    """Run many configs (validated first, all of them, before any training), each once even if
    listed twice. Returns their histories in the given order. If some fail, the others are kept
    in the cache, and a RunFailedError lists the failures. With ``keep_diverged=True`` a run that
    diverged (:class:`RunError`: its loss became NaN/Inf, an outcome of the method) holds None in
    its place instead; a run that crashed raises all the same, so no table is drawn over a bug.

    The runs to train go to the backend in lockstep groups (:func:`plan_groups`), each group's
    local training fused (``fairfl.engine``); ``max_group=1`` sends one run per job instead.

    The process backend spawns its workers: from a Python *script* (not a notebook), call
    ``run_many`` under ``if __name__ == "__main__":``, or every worker re-runs the script."""
    configs = list(configs)
    check_devices(configs, _NAMES_ONLY)          # types and device names, before anything is read
    results_folder(root)
    own = backend is None   # a pool made for this call only is closed after it
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    if backend is None:      # one run trains in this process, unless $FAIRFL_BACKEND asks for another place
        one = sum(not is_cached(c, root) for c in configs) <= 1
        backend = SerialBackend() if one and chosen_backend() is None else default_backend(device)
    backend = _here_for_main(configs, backend, root)
    try:
        check_devices(configs, backend)          # the devices exist where the runs train (made lazily: nothing started)
        return _sweep(configs, backend, root, progress, keep_diverged, max_group)
    finally:
        if own and hasattr(backend, "close"):
            backend.close()


def _sweep(configs: Sequence[ExperimentConfig], backend: Backend, root: Path | None, progress: bool,
           keep_diverged: bool, max_group: int | None = None) -> list[History | None]:
    """Send the validated, not yet cached configs (each once) to ``backend`` in lockstep groups
    (:func:`plan_groups`), then load every config's history in order. Failed runs are collected
    and raised together (or hold None), the others stay cached. A group whose worker keeps dying
    is split into single runs, so that only the run that kills its worker fails."""
    what = "runs"
    unique = {c.key(): c for c in configs}
    done = {k: checked_load(c, root) for k, c in unique.items()}        # an unusable entry is reported, removed
    todo = [c for k, c in unique.items() if done[k] is None]
    failures: dict[str, tuple[ExperimentConfig, RunError]] = {}
    if todo:
        # per-round progress of every run, wherever it trains: read from the progress files its
        # worker writes into the run's cache entry (fairfl.progress)
        watch = SweepProgress([run_dir(c, root) for c in todo], [c.rounds for c in todo], enabled=progress,
                              desc=f"{len(todo)} {what}" + (f" ({len(configs) - len(todo)} cached)" if len(todo) < len(unique) else ""))
        groups = plan_groups(todo, max(1, int(getattr(backend, "workers", 1))), max_group, measured_rates(root))
        import time
        started, cpu, widths, spans, rates = time.perf_counter(), 0.0, {}, [], {}
        clock = time.time()
        from .engine import cores
        local = isinstance(backend, (ProcessBackend, SerialBackend))      # its workers share this machine's cores
        busy, tree = (cores.machine_busy(), cores.tree_cpu()) if local else (None, {})
        # A backend whose workers share no folder with this process (shares_files = False: Ray on a
        # cluster) gets the runs' checkpoints with the configs and sends the finished entries back,
        # which are written here; the others train straight into the cache folder.
        shared = getattr(backend, "shares_files", True)
        try:
            while groups:
                if shared:
                    job, items = _measured_run_group, [([_portable(todo[i]) for i in g], str(root) if root else None)
                                                       for g in groups]
                else:
                    job, items = _measured_ship_group, [_ship([todo[i] for i in g], root) for g in groups]
                again = []
                for gi, result in backend.submit_all(job, items):
                    group = groups[gi]
                    if isinstance(result, Measured):
                        cpu += result.cpu
                        for w, t in result.widths.items():
                            widths[w] = widths.get(w, 0.0) + t
                        spans.append(GroupSpan(len(group), result.pid, result.start - clock, result.end - clock,
                                               result.cpu))
                        # a group its worker came back from: its family's rate (a run that diverged or failed
                        # stopped early, so the rate errs low by its share; notebook 06's MLP groups, where
                        # one run of 24 diverges, cost 13 times what a typical family's rate said)
                        work = sum(expected_cost(todo[i]) for i in group)
                        if isinstance(result.result, list) and work > 0 and result.cpu > 0:
                            rates.setdefault(_rate_key(todo[group[0]]), []).append(result.cpu / work)
                        result = result.result
                    if isinstance(result, Failure) and isinstance(result.error, WorkerDied) and len(group) > 1:
                        again += [[i] for i in group]
                        continue
                    if not shared and not isinstance(result, Failure):
                        result = [_receive(todo[i], shipped, root) for i, shipped in zip(group, result)]
                    for n, i in enumerate(group):
                        error = RunError.of(result.error) if isinstance(result, Failure) else result[n]
                        if error is not None:
                            failures[todo[i].key()] = (todo[i], error)
                        watch.finished([i], failed=error is not None)
                groups = again
            _remember_rates(rates, root)
            global last_usage
            wall = time.perf_counter() - started
            last_usage = SweepUsage(_backend_cores(backend), wall, cpu, widths, tuple(spans),
                                    _others_share(busy, tree, wall))
        except KeyboardInterrupt:
            raise _interrupted(backend, watch, list(unique.values()), root) from None
        finally:
            watch.close()
    for c in todo:
        if c.key() not in failures:
            try:
                done[c.key()] = load_entry(c, root)
            except FairFLError as e:
                failures[c.key()] = (c, RunError.of(e))
    out = [None if c.key() in failures else done[c.key()] for c in configs]
    crashed = [(c, e) for c, e in failures.values() if not e.diverged]
    diverged = [(c, e) for c, e in failures.values() if e.diverged]
    if crashed or (diverged and not keep_diverged):
        raise RunFailedError(_failure_report(crashed, diverged, len(todo), what, keep_diverged))
    return out


def _failure_report(crashed: list, diverged: list, trained: int, what: str, keep_diverged: bool) -> str:
    """The message of a sweep's RunFailedError: the crashes first (each a bug or a resource to look
    at: never a result), then the divergences."""
    lines = []
    if crashed:
        lines.append(f"{len(crashed)} of {trained} {what} crashed (an error, not a divergence; the others are "
                     "cached):")
        lines += [f"  {c.label()}: {e.message}" for c, e in crashed]
    if diverged:
        lines.append(f"{len(diverged)} of {trained} {what} diverged (loss or update NaN/Inf)" +
                     (" and hold None" if keep_diverged else "; the others are cached") + ":")
        lines += [f"  {c.label()}: {e.message}" for c, e in diverged]
    return "\n".join(lines)


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or the kernel's interrupt. Its message is the whole story, so a
    notebook shows that one line instead of a traceback (IPython asks ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _interrupted(backend: Backend, watch: SweepProgress, configs: Sequence[ExperimentConfig],
                 root: Path | None) -> SweepInterrupted:
    """Stop the backend's workers (each run stops at its last checkpoint) and say what is kept:
    counted once they are stopped, so that a run that finished (its entry written) before its
    worker was told is cached, not running, whether or not its result had reached the sweep."""
    watch.close()
    stop = getattr(backend, "terminate", None)
    if stop is not None:
        stop()
    cached = sum(is_cached(c, root) for c in configs)
    running = sum(not all((Path(folder) / name).is_file() for name in CACHE_FILES) for folder in watch.started_folders())
    message = (f"interrupted: {cached} of {len(configs)} runs cached, {running} running stopped at their "
               "checkpoints; re-run to resume")
    return SweepInterrupted(message)
