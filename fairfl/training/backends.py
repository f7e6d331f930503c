"""Where runs execute: a backend is anything with ``submit_all(fn, items) -> iterator of (index,
result or Failure)`` and ``close()``. :class:`SerialBackend` runs in this process,
:class:`ProcessBackend` in a pool of worker processes on this machine (kept between sweeps, one
worker per GPU when given ``gpus``), :class:`RayBackend` on a Ray cluster or a local Ray instance.
``$FAIRFL_BACKEND`` (serial, process or ray) picks the backend of ``fairfl.runs.sweeps.run_many`` and
of the notebooks (:func:`default_backend`). What a backend runs — a lockstep group of runs into
the cache — is ``fairfl.runs.sweeps``'s; a backend only carries it.
"""
from __future__ import annotations

import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from fairfl.base.errors import ConfigError, RunFailedError


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
                yield i, Failure(e, traceback.format_exc())


def _usable_cores() -> int:
    from .engine.cores import usable_cores
    return usable_cores()


def _init_worker(threads: int, parent: int, slots=None, gpus: int = 0, bank=None) -> None:
    import signal
    # Ctrl-C and Jupyter's interrupt signal the whole process group, workers included: a worker
    # ignores it, and the parent, which decides, stops the pool (ProcessBackend.terminate).
    # Otherwise every idle worker would print its own KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent)          # first: importing torch below takes seconds on a busy machine
    # tqdm's first bar (the loop's, disabled in a worker) would create a multiprocessing lock: a
    # named semaphore that a worker stopped by terminate() leaves behind (the resource tracker then
    # warns at exit). A worker shows no bar, so a thread lock does.
    import threading
    from tqdm.std import tqdm
    tqdm.set_lock(threading.RLock())
    import torch
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    from .engine import cores
    cores.set_share(threads, bank)     # its cores, and those it may borrow from workers left without work
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
        # the cores this process may use (its affinity: a cpuset's, taskset's or a batch system's core
        # list), not the host's
        self.workers = workers or (gpus if gpus else max(1, _usable_cores() // threads))
        self.threads = threads
        self._pool: ProcessPoolExecutor | None = None
        self._env: dict[str, str] = {}
        self._bank = None           # fairfl.training.engine.cores.CoreBank: the cores of idle workers, lent to busy ones

    def _start(self) -> ProcessPoolExecutor:
        env = _fairfl_settings()
        # _broken: set by the pool's manager thread as soon as a worker dies, even between sweeps
        if self._pool is not None and (getattr(self._pool, "_broken", False) or env != self._env):
            self._discard(self._pool)
        if self._pool is None:
            import multiprocessing as mp
            from .engine.cores import CoreBank
            ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
            self._bank = CoreBank(ctx) if not self.gpus else None
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self.threads, os.getpid(), ctx.Value("i", 0), self.gpus,
                                                       self._bank))
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
            left = len(futures)
            self._lend(left)
            try:
                for f in as_completed(futures):
                    i = futures[f]
                    left -= 1
                    self._lend(left)
                    try:
                        yield i, f.result()
                    except BrokenProcessPool:      # a worker died: this run was lost with the pool
                        self._discard(pool)
                        lost.append(i)
                    except Exception as e:  # noqa: BLE001 - reported per run
                        yield i, Failure(e, getattr(e, "__traceback_text__", traceback.format_exc()))
            finally:
                # Interrupted (KeyboardInterrupt, or a failure upstream): drop the runs that have not
                # started. Running ones finish into the cache, or, when the interrupt reached the
                # workers too (Jupyter's does), stop with their last checkpoint, which the next sweep
                # resumes from.
                for f in futures:
                    f.cancel()
                self._lend(0)
            if alone and lost:                     # it ran alone: it is the one that kills its worker
                (i,) = lost
                attempts[i] += 1
                if attempts[i] > self.RETRIES:
                    error = WorkerDied(f"a worker process died each of the {attempts[i]} times this run was "
                                       "under way on its own (killed, or out of memory)")
                    yield i, Failure(error, "")
                    lost = []
            alone = alone or bool(lost)
            pending = sorted(lost) + rest

    def _lend(self, unfinished: int) -> None:
        """Lend the cores of the workers that have nothing left to do to those still training (the
        end of a sweep: its last groups then use every core, ``fairfl.training.engine.cores``)."""
        if self._bank is not None:
            busy = min(self.workers, unfinished)
            self._bank.set((self.workers - busy) * self.threads if busy else 0, busy)

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
        with _quiet_broken_pool():
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


class _quiet_broken_pool:
    """While a pool whose runs were cancelled is terminated: the pool's manager thread marks every
    pending run failed, and Python before 3.12 raises InvalidStateError there for one already
    cancelled (``terminate_broken`` calls ``set_exception`` on it), which killed the thread with a
    traceback on stderr ("Exception in thread ... InvalidStateError: CANCELLED") after an interrupted
    sweep with more runs than workers. That error of that thread is not shown; any other is."""

    def __enter__(self):
        import threading
        self._previous = threading.excepthook

        def hook(args):
            from concurrent.futures import InvalidStateError
            if isinstance(args.exc_value, InvalidStateError) and "ExecutorManagerThread" in type(args.thread).__name__:
                return
            self._previous(args)
        threading.excepthook = hook
        return self

    def __exit__(self, *exc) -> None:
        import threading
        threading.excepthook = self._previous


# A Ray cluster. Each lockstep group of a sweep is one Ray task that declares what it needs (one
# CPU; one GPU for a CUDA group), so Ray packs the groups onto the cluster's cores or GPUs. No
# shared filesystem is assumed (shares_files = False): a task trains into a folder of the machine
# it lands on, resuming from the checkpoints the driver sent with it, and returns each finished
# run's cache entry as bytes through Ray's object store; _sweep checks them and writes them into
# the driver's cache atomically (fairfl.runs.cache.receive). A worker that dies or a node that leaves
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
    trains_here = False           # sweeps.check_devices: the cluster's nodes have the devices, not this driver
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
                        yield i, Failure(cause if isinstance(cause, BaseException) else e, str(e))
                    except RayError as e:               # worker died, node left, out of memory, object lost
                        error = WorkerDied(f"the Ray worker running it died or its node left, each of the "
                                           f"{self.retries + 1} times it was sent ({type(e).__name__})")
                        yield i, Failure(error, str(e))
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
class Failure:
    """What a backend yields for an item that failed: the error and its traceback."""

    error: BaseException
    traceback: str


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
    return ProcessBackend(workers=workers) if (workers or _usable_cores()) > 1 else SerialBackend()
