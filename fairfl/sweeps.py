"""Run experiments with an on-disk cache, one or many at once (sweeps).

``run(config)`` returns the cached :class:`History` when ``results/<config.key()>/`` holds a
finished run, resumes from its checkpoint when it holds an interrupted one, and trains
otherwise. ``run_many(configs)`` trains only the runs that are not cached and returns every
History in the order given, reporting the failures of single runs without losing the others.

A sweep is one computation: the uncached runs that share dataset, model and device form a
*family*; :func:`plan_groups` deals each family out into groups (at most :data:`MAX_GROUP`
runs, as many groups as the backend has slots), and a group advances in lockstep
(:func:`fairfl.loop.simulate_group`) so that all (run, client) pairs of a round train in one
fused computation (:mod:`fairfl.engine`). Each run keeps its own sampling, algorithm state,
checkpoint and cache entry, and its history equals the one-run-at-a-time result bit for bit.

A backend is anything with ``submit_all(fn, items) -> iterator of (index, result or
exception)`` and ``close()``; :class:`SerialBackend` and :class:`ProcessBackend` (which keeps its
workers between sweeps and places one worker per GPU when given ``gpus``) are here, and
:class:`RayBackend` sends the groups to a Ray cluster. The first two share the
cache folder with their workers, which write into it; a backend that says ``shares_files =
False`` (Ray: no shared filesystem is assumed) is sent the runs' checkpoints with the configs,
and its workers send each finished entry back as bytes, which the sweep writes into the cache
atomically. ``$FAIRFL_BACKEND`` (serial, process or ray) picks the backend of ``run_many`` and of
the notebooks (:func:`default_backend`).
"""
from __future__ import annotations

import json
import os
import shutil
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from .atomic import atomic_write
from .cache import Claim, checked_load, is_cached, pack, prepare, receive, results_folder, store
from .cache import load as load_entry
from .cache import entry as cache_entry
from .cache import key as entry_key
from .config import ExperimentConfig
from .engine import schedule_key
from .errors import ConfigError, FairFLError, RunFailedError
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
    config.validate()
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


def check_devices(configs: Sequence[ExperimentConfig]) -> None:
    """Each device the configs train on exists here (``fairfl.engine.resolve_device``), checked
    before any data is read or cache entry made."""
    from .engine import resolve_device
    for device in sorted({c.device for c in configs}):
        resolve_device(device)


# ----------------------------------------------------------------------------- backends

class Backend(Protocol):
    def submit_all(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """Run ``fn`` on every item; yield (index, result) as they finish, where a result that
        is an exception means that item failed."""

    def close(self) -> None:
        """Release the workers (a backend may keep them between sweeps)."""


class _Closing:
    """``with backend:`` closes it at the end of the block."""

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SerialBackend(_Closing):
    """In this process, one after another (debugging, or a single core)."""

    def submit_all(self, fn, items):
        for i, item in enumerate(items):
            try:
                yield i, fn(item)
            except Exception as e:  # noqa: BLE001 - reported per run
                yield i, _Failure(e, traceback.format_exc())


def _init_worker(threads: int, parent: int, slots=None, gpus: int = 0) -> None:
    import signal
    # Ctrl-C and Jupyter's interrupt signal the whole process group, workers included: a worker
    # ignores it, and the parent, which decides, stops the pool (ProcessBackend.terminate).
    # Otherwise every idle worker would print its own KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # tqdm's first bar (the loop's, disabled in a worker) would create a multiprocessing lock: a
    # named semaphore that a worker stopped by terminate() leaves behind (the resource tracker then
    # warns at exit). A worker shows no bar, so a thread lock does.
    import threading
    from tqdm.std import tqdm
    tqdm.set_lock(threading.RLock())
    import torch
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    _exit_with_parent(parent)
    if gpus:       # worker i trains on GPU i mod gpus: a config's device "cuda" means this worker's GPU
        with slots.get_lock():
            slot, slots.value = slots.value, slots.value + 1
        torch.cuda.set_device(slot % gpus)


def _exit_with_parent(parent: int) -> None:
    """End this worker as soon as the process that started it is gone (killed, say): a worker
    left behind would keep training, hold gigabytes and the parent's output pipe (a CI step or a
    ``| tee`` would hang on it). Linux tells the worker at once (PR_SET_PDEATHSIG); elsewhere, and
    as a second line, a thread checks every second whether the worker has been handed to another
    parent. A run killed this way stops at its last checkpoint, which the next sweep resumes."""
    import ctypes
    import signal
    import threading
    import time
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)            # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:                   # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(1.0)
    threading.Thread(target=watch, name="fairfl-parent-watch", daemon=True).start()


class ProcessBackend(_Closing):
    """A pool of worker processes, each with ``threads`` torch threads. On a small machine
    several one-thread workers beat one multi-threaded process: the convolutions of a federated
    round are too small to keep several threads busy (see benchmarks/round_speed.py).

    The pool starts at the first sweep and is kept for the next ones, so that a notebook, which
    sends several sweeps through one backend, pays the start-up of a worker (importing torch,
    loading and partitioning the data, oneDNN's first kernels: about 4 s here) once rather than
    per sweep. ``close()`` (or ``with ProcessBackend() as backend:``, or the end of the
    interpreter) stops the workers. A new pool replaces the kept one when a worker has died
    (killed, out of memory, or interrupted: Jupyter's interrupt reaches the workers too) and when
    a ``FAIRFL_*`` setting has changed since the workers started (they read the data and results
    roots then). Workers keep the fairfl code they imported: after editing it, ``close()``."""

    def __init__(self, workers: int | None = None, threads: int = 1, gpus: int = 0):
        self.gpus = gpus
        self.workers = workers or (gpus if gpus else max(1, (os.cpu_count() or 1) // threads))
        self.threads = threads
        self._pool: ProcessPoolExecutor | None = None
        self._env: dict[str, str] = {}

    def _start(self) -> ProcessPoolExecutor:
        env = _fairfl_settings()
        # _broken: set by the pool's manager thread as soon as a worker dies, even between sweeps
        if self._pool is not None and (getattr(self._pool, "_broken", False) or env != self._env):
            self._discard(self._pool)
        if self._pool is None:
            import multiprocessing as mp
            ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.threads, os.getpid(), ctx.Value("i", 0), self.gpus))
            self._env = env
        return self._pool

    # When a worker dies, the pool breaks and every run not yet finished fails with it, on the
    # healthy workers too, and which run took the worker down cannot be told. So the runs lost
    # with a broken pool are sent again one at a time (each resuming from its checkpoint): a run
    # that breaks the pool while it runs alone is the culprit, and is reported after this many
    # more tries; the others just finish.
    RETRIES = 2

    def submit_all(self, fn, items):
        attempts = [0] * len(items)
        pending, alone = list(range(len(items))), False
        while pending:
            batch, rest = (pending[:1], pending[1:]) if alone else (pending, [])
            pool, futures = self._submit(fn, items, batch)
            lost = []
            try:
                for f in as_completed(futures):
                    i = futures[f]
                    try:
                        yield i, f.result()
                    except BrokenProcessPool:      # a worker died: this run was lost with the pool
                        self._discard(pool)
                        lost.append(i)
                    except Exception as e:  # noqa: BLE001 - reported per run
                        yield i, _Failure(e, getattr(e, "__traceback_text__", traceback.format_exc()))
            finally:
                # Interrupted (KeyboardInterrupt, or a failure upstream): drop the runs that have not
                # started. Running ones finish into the cache, or, when the interrupt reached the
                # workers too (Jupyter's does), stop with their last checkpoint, which the next sweep
                # resumes from.
                for f in futures:
                    f.cancel()
            if alone and lost:                     # it ran alone: it is the one that kills its worker
                (i,) = lost
                attempts[i] += 1
                if attempts[i] > self.RETRIES:
                    error = WorkerDied(f"a worker process died each of the {attempts[i]} times this run was "
                                       "under way on its own (killed, or out of memory)")
                    yield i, _Failure(error, "")
                    lost = []
            alone = alone or bool(lost)
            pending = sorted(lost) + rest

    def _submit(self, fn, items, indices):
        for attempt in range(2):
            pool = self._start()
            try:
                return pool, {pool.submit(fn, items[i]): i for i in indices}
            except (BrokenProcessPool, RuntimeError):  # a worker died after _start's check: once more, afresh
                self._discard(pool)
                if attempt:
                    raise

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        pool.shutdown(wait=False, cancel_futures=True)
        if self._pool is pool:
            self._pool = None

    def close(self) -> None:
        """Stop the workers (waits for running work)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def terminate(self) -> None:
        """Stop the workers now, running work too (an interrupted sweep): each run stops at its
        last checkpoint, which the next sweep resumes from. The next sweep starts a new pool."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for p in processes:
            p.terminate()
        for p in processes:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        # its workers gone, the pool is broken: shutting it down now frees its queues and locks (no
        # "leaked semaphore" warning when the interpreter ends just after)
        pool.shutdown(wait=True, cancel_futures=True)


# A Ray cluster. Each lockstep group of a sweep is one Ray task that declares what it needs (one
# CPU; one GPU for a CUDA group), so Ray packs the groups onto the cluster's cores or GPUs. No
# shared filesystem is assumed (shares_files = False): a task trains into a folder of the machine
# it lands on, resuming from the checkpoints the driver sent with it, and returns each finished
# run's cache entry as bytes through Ray's object store; _sweep checks them and writes them into
# the driver's cache atomically (fairfl.cache.receive). A worker that dies or a node that leaves
# costs only its group: Ray sends the task again (up to `retries` more times, on the same or
# another node; on the same node it resumes from the checkpoints its predecessor left), then
# _sweep splits the group into single runs, each sent the same bounded number of times, so that
# only a run that takes down its worker every time is reported (WorkerDied). `import ray` happens
# at the first sweep, not when fairfl is imported.

class RayBackend(_Closing):
    """Run a sweep's groups as Ray tasks on the cluster at ``address`` (else
    ``$FAIRFL_RAY_ADDRESS``: ``auto``, ``host:port`` or ``ray://host:port``; else Ray's own
    choice: the ``RAY_ADDRESS`` variable, a cluster started on this machine with ``ray start``,
    or a new local instance). A Ray already initialised in this process is used as it is.

    ``device`` ("cpu" or "cuda") says which resource is a slot for :func:`plan_groups`:
    the cluster's CPUs, or its GPUs. Each task asks for one CPU, and one GPU when its group trains
    on CUDA (Ray then shows the task that GPU only: give such configs ``device="cuda"``).

    Every node needs fairfl (the same version) and the datasets under its ``FAIRFL_DATA``; an
    algorithm registered outside fairfl must be importable there too. A run trained on other data
    or by another fairfl is refused (its cache key differs) rather than cached."""

    shares_files = False          # _sweep: ship checkpoints out, entries back
    RETRIES = 2

    def __init__(self, address: str | None = None, device: str = "cpu", retries: int | None = None,
                 **init_options: Any):
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"RayBackend(device={device!r}): choose 'cpu' or 'cuda'")
        self.address = address or os.environ.get("FAIRFL_RAY_ADDRESS") or None
        self.device = device
        self.retries = self.RETRIES if retries is None else int(retries)
        if self.retries < 0:
            raise ConfigError(f"RayBackend(retries={retries!r}): the number of retries cannot be negative")
        self.init_options = init_options
        self._started = False       # this backend called ray.init, so close() calls ray.shutdown
        self._remote: dict[tuple[Callable, bool], Any] = {}

    def _ray(self):
        import ray
        if not ray.is_initialized():
            local = {"include_dashboard": False} if self.address is None else {}   # a new instance: no dashboard
            self.start(self.address, **{**local, **self.init_options})
            self._started = True
        return ray

    @staticmethod
    def start(address: str | None = None, **options: Any) -> None:
        """``ray.init(address=address, **options)``, with what Ray's call lacks.

        A new local instance's processes must come up within 30 s each, limits hard-coded in
        ``ray._private`` (no option or variable lengthens them), which a loaded machine can miss:
        Ray then raises a bare "The current node timed out during startup" (the raylet did not
        register with the GCS) or "Timed out waiting for file …gcs_server_port…". What that start
        left running is stopped and the instance started once more; a second miss is one
        RunFailedError saying what to do. A cluster that cannot be reached is a ConfigError.
        Ray's FutureWarning at every start (a tip about a future default,
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO) is not shown: fairfl relies on today's behaviour, in
        which a task that asks for no GPU sees none."""
        import warnings
        import ray
        for attempt in (1, 2):
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
                    ray.init(address=address, **options)
                return
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for a node that timed out
                if address is not None or "timed out" not in str(e).lower():
                    if isinstance(e, (ConnectionError, ValueError, RuntimeError)):
                        raise ConfigError(f"cannot reach the Ray cluster at {address or 'a local instance'} "
                                          f"({type(e).__name__}: {e}); check FAIRFL_RAY_ADDRESS (auto, host:port or "
                                          "ray://host:port)") from None
                    raise
                ray.shutdown()            # the processes the failed start left behind
                if attempt == 2:
                    raise RunFailedError(
                        f"Ray's local instance did not start: twice one of its processes did not come up within the "
                        f"30 s Ray allows ({type(e).__name__}: {e}), which happens on a machine too busy to start them "
                        "in time. Try again when it is less loaded, or start Ray once beforehand (`ray start --head "
                        "--num-cpus N`, then FAIRFL_RAY_ADDRESS=auto), or run without Ray (FAIRFL_BACKEND=process).") \
                        from None

    @property
    def workers(self) -> int:
        """Slots for plan_groups: the cluster's CPUs, or its GPUs for ``device="cuda"``."""
        resources = self._ray().cluster_resources()
        if self.device == "cuda":
            gpus = int(resources.get("GPU", 0))
            if gpus < 1:
                raise ConfigError("RayBackend(device='cuda'): the Ray cluster has no GPU")
            return gpus
        return max(1, int(resources.get("CPU", 1)))

    def submit_all(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        ray = self._ray()
        from ray.exceptions import RayError, RayTaskError
        pending = {}
        for i, item in enumerate(items):
            gpu = getattr(item, "device_type", "cpu") == "cuda"
            # A GPU task's worker must not take another task: once CUDA has started, the process
            # keeps the GPU it was first given (and its memory). Ray makes such a function's
            # workers single-use only when num_gpus is given to ray.remote itself (.options()
            # cannot set max_calls), so GPU tasks have their own remote function.
            remote = self._remote.get((fn, gpu))
            if remote is None:
                remote = self._remote[fn, gpu] = ray.remote(num_gpus=1)(fn) if gpu else ray.remote(fn)
            # max_retries: Ray sends a task again when its worker dies or its node leaves (not when
            # it raises: a run's own error is reported, not retried)
            ref = remote.options(num_cpus=1, max_retries=self.retries, retry_exceptions=False).remote(item)
            pending[ref] = i
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    i = pending.pop(ref)
                    try:
                        yield i, ray.get(ref)
                    except RayTaskError as e:          # the job raised: its error, with the worker's traceback
                        cause = getattr(e, "cause", None)
                        yield i, _Failure(cause if isinstance(cause, BaseException) else e, str(e))
                    except RayError as e:               # worker died, node left, out of memory, object lost
                        error = WorkerDied(f"the Ray worker running it died or its node left, each of the "
                                           f"{self.retries + 1} times it was sent ({type(e).__name__})")
                        yield i, _Failure(error, str(e))
        finally:
            # Interrupted (KeyboardInterrupt, a failure upstream): tasks not started are dropped and
            # running ones are interrupted, stopping at their last checkpoint on their node.
            for ref in pending:
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - already finished or gone
                    pass

    def close(self) -> None:
        """Disconnect from the cluster (a local instance this backend started stops)."""
        if self._started:
            import ray
            ray.shutdown()
            self._started = False
        self._remote.clear()


def _fairfl_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("FAIRFL_")}


class WorkerDied(RunFailedError):
    """A worker process died every time an item was under way on its own."""


@dataclass
class _Failure:
    error: BaseException
    traceback: str


def _portable(config: ExperimentConfig) -> tuple[dict, str]:
    """A config as plain data for a worker process, with the module that defines its algorithm
    (a worker imports it, so that an algorithm registered outside fairfl is known there)."""
    module = type(config.algorithm).__module__
    if module == "__main__":
        raise RunFailedError(f"algorithm {config.algorithm.name!r} is defined in __main__ (a notebook or a script), "
                             "where worker processes cannot import it: put it in a module, or use SerialBackend()")
    return config.to_dict(), module


def _worker_run_group(args: tuple[list[tuple[dict, str]], str | None]) -> list[str | None]:
    """Runs in a worker: train (or resume) a group of configs side by side into the cache
    (``fairfl.loop.simulate_group``), each stored as soon as it ends. Returns, per config, None or
    the error that stopped it."""
    portable, root = args
    import importlib
    for _, module in portable:
        importlib.import_module(module)
    configs = [ExperimentConfig.from_dict(d) for d, _ in portable]
    folder = Path(root) if root else None
    out: list[str | None] = [None] * len(configs)
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
                    out[i] = f"{type(result).__name__}: {result}"
    finally:
        for claim in claims.values():
            claim.release()
    return out


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


def _worker_ship_group(group: ShippedGroup) -> list[tuple[str | None, str, dict[str, bytes] | None]]:
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


def _receive(config: ExperimentConfig, shipped: tuple[str | None, str, dict[str, bytes] | None],
             root: Path | None) -> str | None:
    """Write a run a worker sent back into the cache; its error, or None."""
    error, key, files = shipped
    if error is not None:
        return error
    if key != entry_key(config, root):
        return ("the worker's data or fairfl differ from this machine's (its cache key is another): give every "
                "node the same data files and fairfl version")
    try:
        receive(config, files, root)
    except FairFLError as e:
        return f"{type(e).__name__}: {e}"
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


def plan_groups(configs: Sequence[ExperimentConfig], slots: int, max_group: int | None = None) -> list[list[int]]:
    """Indices of ``configs`` in lockstep groups: runs of one family together, each family cut into
    enough groups to keep ``slots`` workers busy (in proportion to its share of the runs) and none
    larger than ``max_group`` (default: :data:`MAX_GROUP` of the family's device); members dealt out
    in turn so that the groups of a family cost alike. Largest groups first."""
    families: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        families.setdefault(_family(c), []).append(i)
    groups = []
    for members in families.values():
        cap = max_group or MAX_GROUP[configs[members[0]].device_type]
        k = max(-(-len(members) // cap), round(slots * len(members) / max(1, len(configs))), 1)
        k = min(k, len(members))
        groups += [members[j::k] for j in range(k)]
    return sorted(groups, key=len, reverse=True)


BACKENDS = ("serial", "process", "ray")


def chosen_backend() -> str | None:
    """``$FAIRFL_BACKEND`` (serial, process or ray), or None when it is not set; any other value is
    a ConfigError."""
    name = os.environ.get("FAIRFL_BACKEND", "").strip().lower()
    if not name:
        return None
    if name not in BACKENDS:
        raise ConfigError(f"FAIRFL_BACKEND={os.environ['FAIRFL_BACKEND']!r} is not a backend; choose one of "
                          f"{', '.join(BACKENDS)} (or unset it for the default)")
    return name


def default_backend(device: str = "cpu", workers: int | None = None) -> Backend:
    """The backend ``$FAIRFL_BACKEND`` names (``ray``: a :class:`RayBackend`
    on the cluster at ``$FAIRFL_RAY_ADDRESS``, or a local Ray instance), else: CPU, a pool of
    one-thread workers, one per core (in-process on a single core); CUDA, this process for one GPU
    (every run of a sweep fused into one stream of work), one worker per GPU on a machine with
    several."""
    chosen = chosen_backend()
    cuda = device.startswith("cuda")
    if chosen == "ray":
        return RayBackend(device="cuda" if cuda else "cpu")
    if chosen == "serial":
        return SerialBackend()
    gpus = 0
    if cuda:
        import torch
        gpus = torch.cuda.device_count() if device == "cuda" else 1
    if chosen == "process":
        return ProcessBackend(gpus=gpus) if cuda else ProcessBackend(workers=workers)
    if cuda:
        return ProcessBackend(gpus=gpus) if gpus > 1 else SerialBackend()
    return ProcessBackend(workers=workers) if (workers or os.cpu_count() or 1) > 1 else SerialBackend()


def run_many(configs: Iterable[ExperimentConfig], backend: Backend | None = None,
             root: Path | None = None, progress: bool = True, raise_on_failure: bool = True,
             max_group: int | None = None) -> list[History | None]:
    """Run many configs (validated first, all of them, before any training), each once even if
    listed twice. Returns their histories in the given order. If some fail, the others are kept
    in the cache, and a RunFailedError lists the failures (or, with
    ``raise_on_failure=False``, their places hold None).

    The runs to train go to the backend in lockstep groups (:func:`plan_groups`), each group's
    local training fused (``fairfl.engine``); ``max_group=1`` sends one run per job instead.

    The process backend spawns its workers: from a Python *script* (not a notebook), call
    ``run_many`` under ``if __name__ == "__main__":``, or every worker re-runs the script."""
    configs = [c.validate() for c in configs]
    check_devices(configs)
    results_folder(root)
    own = backend is None   # a pool made for this call only is closed after it
    device = "cuda" if any(c.device_type == "cuda" for c in configs) else "cpu"
    if backend is None:      # one run trains in this process, unless $FAIRFL_BACKEND asks for another place
        one = sum(not is_cached(c, root) for c in configs) <= 1
        backend = SerialBackend() if one and chosen_backend() is None else default_backend(device)
    try:
        return _sweep(configs, backend, root, progress, raise_on_failure, max_group)
    finally:
        if own and hasattr(backend, "close"):
            backend.close()


def _sweep(configs: Sequence[ExperimentConfig], backend: Backend, root: Path | None, progress: bool,
           raise_on_failure: bool, max_group: int | None = None) -> list[History | None]:
    """Send the validated, not yet cached configs (each once) to ``backend`` in lockstep groups
    (:func:`plan_groups`), then load every config's history in order. Failed runs are collected
    and raised together (or hold None), the others stay cached. A group whose worker keeps dying
    is split into single runs, so that only the run that kills its worker fails."""
    what = "runs"
    unique = {c.key(): c for c in configs}
    done = {k: checked_load(c, root) for k, c in unique.items()}        # an unusable entry is reported, removed
    todo = [c for k, c in unique.items() if done[k] is None]
    failures: dict[str, str] = {}
    if todo:
        # per-round progress of every run, wherever it trains: read from the progress files its
        # worker writes into the run's cache entry (fairfl.progress)
        watch = SweepProgress([run_dir(c, root) for c in todo], [c.rounds for c in todo], enabled=progress,
                              desc=f"{len(todo)} {what}" + (f" ({len(configs) - len(todo)} cached)" if len(todo) < len(unique) else ""))
        groups = plan_groups(todo, max(1, int(getattr(backend, "workers", 1))), max_group)
        # A backend whose workers share no folder with this process (shares_files = False: Ray on a
        # cluster) gets the runs' checkpoints with the configs and sends the finished entries back,
        # which are written here; the others train straight into the cache folder.
        shared = getattr(backend, "shares_files", True)
        try:
            while groups:
                if shared:
                    job, items = _worker_run_group, [([_portable(todo[i]) for i in g], str(root) if root else None)
                                                     for g in groups]
                else:
                    job, items = _worker_ship_group, [_ship([todo[i] for i in g], root) for g in groups]
                again = []
                for gi, result in backend.submit_all(job, items):
                    group = groups[gi]
                    if isinstance(result, _Failure) and isinstance(result.error, WorkerDied) and len(group) > 1:
                        again += [[i] for i in group]
                        continue
                    if not shared and not isinstance(result, _Failure):
                        result = [_receive(todo[i], shipped, root) for i, shipped in zip(group, result)]
                    for n, i in enumerate(group):
                        error = (f"{type(result.error).__name__}: {result.error}" if isinstance(result, _Failure)
                                 else result[n])
                        if error is not None:
                            failures[todo[i].key()] = f"{todo[i].label()}: {error}"
                        watch.finished([i], failed=error is not None)
                groups = again
        except KeyboardInterrupt:
            raise _interrupted(backend, watch, list(unique.values()), root) from None
        finally:
            watch.close()
    for c in todo:
        if c.key() not in failures:
            try:
                done[c.key()] = load_entry(c, root)
            except FairFLError as e:
                failures[c.key()] = f"{c.label()}: {type(e).__name__}: {e}"
    out = [None if c.key() in failures else done[c.key()] for c in configs]
    if failures and raise_on_failure:
        raise RunFailedError(f"{len(failures)} of {len(todo)} {what} failed (the others are cached):\n  " +
                             "\n  ".join(failures.values()))
    return out


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or the kernel's interrupt. Its message is the whole story, so a
    notebook shows that one line instead of a traceback (IPython asks ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _interrupted(backend: Backend, watch: SweepProgress, configs: Sequence[ExperimentConfig],
                 root: Path | None) -> SweepInterrupted:
    """Stop the backend's workers (each run stops at its last checkpoint) and say what is kept."""
    running = watch.running()
    watch.close()
    stop = getattr(backend, "terminate", None)
    if stop is not None:
        stop()
    cached = sum(is_cached(c, root) for c in configs)
    message = (f"interrupted: {cached} of {len(configs)} runs cached, {running} running stopped at their "
               "checkpoints; re-run to resume")
    return SweepInterrupted(message)
