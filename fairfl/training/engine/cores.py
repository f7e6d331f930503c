"""The cores a computation may use, and the threads that use them.

A run computes with one intra-op thread (``fairfl.training.engine.exactness``: some CPU kernels split their
reductions by thread, so a second intra-op thread changes the bits). Parallelism therefore comes
from *independent* computations side by side: the stacks of a fused step (each stack's instances
share nothing with another stack's), the chunks of a prediction, the instances of the reference
path. :func:`parallel` runs such pieces in threads, each with one intra-op thread, so a lone run
uses every core it may and gives the bits it gives on one: which thread computes a piece, and
where a run's instances are cut into stacks, never changes a result (``exactness.exact_stacks``
only makes stacks of sizes that compute each instance's own bits).

**How many threads** (:func:`threads`): the process's usable cores (``os.sched_getaffinity``, so a
container's or ``taskset``'s limit is respected), capped by :func:`set_threads` (``fairfl run
--threads``), else ``FAIRFL_THREADS``, else ``OMP_NUM_THREADS``. A worker of a process
pool is given its share of the cores when it starts (:func:`set_share`), and may borrow the cores
of workers that have no more work (:class:`CoreBank`), so that the last runs of a sweep do not
leave cores idle. On a GPU nothing changes: a CUDA computation runs on the calling thread.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")

# The rule (``fairfl.training.engine.exactness``): one intra-op thread per computation. Some CPU kernels split
# their reductions by thread (the CNN's bias gradient differs by ~5e-9 between one and two threads,
# and runs drift apart from the first round: tests/test_determinism.py), so a computation's bits
# would depend on the thread count; side by side, each piece on one thread, they do not.
RUN_THREADS = 1

THREADS_ENV = "FAIRFL_THREADS"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _from_env(omp: bool = True) -> int | None:
    """``FAIRFL_THREADS``, else (with ``omp``) ``OMP_NUM_THREADS`` (what a user, a test harness or Ray —
    which sets it to a task's CPUs — has asked of every threaded library), else None."""
    for var in (THREADS_ENV, "OMP_NUM_THREADS") if omp else (THREADS_ENV,):
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            if var == "OMP_NUM_THREADS":
                continue                      # OpenMP's own business (e.g. a list per nesting level)
            from fairfl.base.errors import ConfigError
            raise ConfigError(f"{THREADS_ENV}={value!r}: give a whole number of threads, at least 1")
        return n
    return None


_limit: int | None = None           # set_threads()
_share: int | None = None           # a pool worker's share of the cores (set_share)
_bank: "CoreBank | None" = None     # the pool's spare cores, which a worker may borrow


def set_threads(n: int | None) -> None:
    """Cap the threads of this process's computations at ``n`` (None: back to ``FAIRFL_THREADS``, else
    every usable core). Results do not depend on it."""
    global _limit
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        from fairfl.base.errors import ConfigError
        raise ConfigError(f"threads={n!r}: give a whole number of threads, at least 1 (or None for every core)")
    _limit = n


def set_share(n: int | None, bank: "CoreBank | None" = None) -> None:
    """A pool worker's part: ``n`` cores of its own, and the ``bank`` it may borrow spare cores from
    (None: a process of its own, every usable core)."""
    global _share, _bank
    _share, _bank = (None if n is None else max(1, int(n))), bank


def threads() -> int:
    """How many threads a computation of this process may use now (at least 1): a pool worker's
    share and what it borrows, else every usable core; never more than an explicit cap
    (:func:`set_threads`, ``FAIRFL_THREADS``), which is honoured even above the core count."""
    # a pool worker's threads are the pool's to give (its share, what it borrows): OMP_NUM_THREADS, which
    # it inherits from the process that started the pool, does not cap them
    cap = _limit or _from_env(omp=_share is None)
    own = _share if _share is not None else (cap or usable_cores())
    if _bank is not None:
        own += _bank.borrow()
    return max(1, min(cap, own) if cap else own)


class CoreBank:
    """The cores of a process pool that no worker is using: the driver deposits those of workers
    left without work (the end of a sweep), and each busy worker borrows its part of them at each
    parallel computation (:func:`threads`). Shared memory (``multiprocessing.Value``), so reading it
    costs nothing; what a worker borrows is only how many threads it starts, never what it computes."""

    def __init__(self, ctx) -> None:
        self._spare = ctx.Value("i", 0)      # cores no worker uses
        self._busy = ctx.Value("i", 0)       # workers with work

    def set(self, spare: int, busy: int) -> None:
        with self._spare.get_lock():
            self._spare.value, self._busy.value = max(0, spare), max(0, busy)

    def borrow(self) -> int:
        busy = self._busy.value
        return self._spare.value // busy if busy > 0 else 0


def describe_machine(device: str = "cpu") -> str:
    """The machine a result was computed on, in words, for a figure's stamp and a report:
    ``"2 CPU cores (AMD EPYC 7B13)"``, or the accelerator's name for a CUDA device."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    model = ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        import platform
        model = platform.processor()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} CPU cores" + (f" ({model})" if model else "")


def machine_busy() -> float | None:
    """CPU seconds that all of this machine's cores have spent busy (user, nice, system, interrupts;
    not idle, I/O wait or a hypervisor's steal), from the operating system's counters (psutil), or
    None where it has none."""
    try:
        import psutil
        t = psutil.cpu_times()
    except Exception:                                   # noqa: BLE001 - a report, never an error
        return None
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


# Whether a process's CPU times include its children that ended and were waited for (psutil gives
# them on Linux; macOS and the BSDs report zeros)
CHILDREN_TIMES = sys.platform.startswith("linux")


def tree_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of this process and of its descendants (the processes it started,
    and theirs), by process id: the CPU a sweep's driver and its pool of workers used, told apart from
    the machine's (:func:`machine_busy`). Each process's figure includes the CPU of its children that
    have ended and been waited for (a worker that died, a pool's workers once stopped), so that the
    tree's total never drops when one of its processes ends: compare totals, not processes."""
    try:
        import psutil
        me = psutil.Process()
        family = [me, *me.children(recursive=True)]
    except Exception:                                   # noqa: BLE001
        return {}
    out = {}
    for p in family:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
        except Exception:                               # noqa: BLE001 - it ended meanwhile
            pass
    return out


# ----------------------------------------------------------------------------- memory of many threads

# glibc gives each thread that allocates under contention an arena of its own (up to 8 per core) and
# keeps what a thread freed in its arena for that thread. A lockstep group runs each of its runs in a
# thread (fairfl.runs.loop.simulate_group), and each run's evaluations and gathered batches come and go:
# notebook 06's 17 runs of the 3-client MLP held 5.1 GB at their peak in one worker, 2.2 GB with two
# arenas (the same CPU time: 117 against 104 s, measured on a loaded machine). The runs take turns to
# compute (engine.lockstep), so they seldom contend for the allocator.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8           # mallopt's parameter number (malloc.h)
_arenas_limited = False


def limit_malloc_arenas(n: int = MALLOC_ARENAS) -> bool:
    """At most ``n`` glibc malloc arenas for this process from now on (threads made later share
    them), once per process; ``MALLOC_ARENA_MAX`` in the environment is left to rule where set.
    Returns whether the limit is in force (False off glibc: macOS, Windows, musl)."""
    global _arenas_limited
    if _arenas_limited or os.environ.get("MALLOC_ARENA_MAX"):
        return _arenas_limited or bool(os.environ.get("MALLOC_ARENA_MAX"))
    if not sys.platform.startswith("linux"):
        return False
    libc = _glibc()
    if libc is None:
        return False
    _arenas_limited = bool(libc.mallopt(_M_ARENA_MAX, int(n)))
    return _arenas_limited


_libc: Any = None           # glibc, loaded once (False: not there)


def _glibc() -> Any:
    """glibc through ctypes, or None (not Linux, or another C library: macOS, Windows, musl)."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            import ctypes
            lib = ctypes.CDLL("libc.so.6")
            lib.malloc_trim, lib.mallopt       # noqa: B018 - glibc's, absent from musl's libc.so
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


# What glibc keeps of freed memory: a fused step's gathered batches and activations, and a run's
# evaluations, are freed when they end, but glibc keeps the pages in its arenas for later allocations,
# and a long-lived worker kept the peak of its largest group for good (notebook 06's quick run: 3.7 GB
# a worker through every later sweep). Handing the free pages back to the kernel after each fused
# execution (when every run of the group waits) and after each group keeps a worker near its live
# data. benchmarks/group_memory.py, 32 runs of notebook 06's 3-client MLP (full batch: 17 MB a
# client), 0.84 GiB after the data: the group holds 1.30 GiB after it without the trims, 0.91 GiB
# with them, in the same time (14.4 against 14.3 s, medians of 3). The pages the next step touches
# are faulted in again, its cost.
def trim_free_memory() -> None:
    """Give the free memory of every malloc arena back to the operating system (``malloc_trim``);
    nothing off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# ----------------------------------------------------------------------------- threads

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_local = threading.local()


def _init_thread() -> None:
    # Per thread (OpenMP's and MKL's local settings). torch sets a thread up at its first call into
    # the thread pool API, copying the count last set by any thread: a pool thread whose first
    # operation came after a caller had set 2 (outside a run) computed on 2 intra-op threads for good,
    # and other bits. Asking first finishes that set-up; the count set after it stays.
    torch.get_num_threads()
    torch.set_num_threads(RUN_THREADS)


def _submit(size: int, fn: Callable[[], None], copies: int) -> list:
    """``copies`` calls of ``fn`` submitted to the process's thread pool, grown to ``size`` threads
    first where it is smaller. Under the pool's lock: another caller that grows the pool meanwhile
    must not shut down the pool these are submitted to (its threads finish what they hold)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < size:
            old, _POOL = _POOL, ThreadPoolExecutor(size, thread_name_prefix="fairfl-core", initializer=_init_thread)
            if old is not None:
                old.shutdown(wait=False)
        return [_POOL.submit(fn) for _ in range(copies)]


def bind_width(width: Callable[[], int] | None) -> Callable[[], int] | None:
    """How many threads the calling thread's own computations may use (:func:`parallel` without a
    ``limit``), e.g. a run of a lockstep group: the group's cores divided among its running runs
    (``fairfl.training.engine.lockstep``). None: :func:`threads`. Returns the binding it replaces."""
    before = getattr(_local, "width", None)
    _local.width = width
    return before


@contextmanager
def one_thread() -> Iterator[None]:
    """Compute with :data:`RUN_THREADS` intra-op threads in the calling thread, restoring its count
    afterwards. (A run starts under ``exactness.run_threads``, which also puts Intel MKL in its
    strict mode once per process, before any of these threads computes.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(RUN_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# seconds this process spent in parallel() at each width (threads started): the scheduler's record of
# how many cores a worker's computations used (fairfl.runs.sweeps reports it per sweep; a test reads it)
_WIDTHS: dict[int, float] = {}
_WIDTHS_LOCK = threading.Lock()


def width_seconds() -> dict[int, float]:
    """A copy of this process's record: seconds of :func:`parallel` at each width."""
    with _WIDTHS_LOCK:
        return dict(_WIDTHS)


def _record(width: int, seconds: float) -> None:
    with _WIDTHS_LOCK:
        _WIDTHS[width] = _WIDTHS.get(width, 0.0) + seconds


def parallel(tasks: Sequence[Callable[[], T]], costs: Sequence[float] | None = None,
             limit: int | None = None) -> list[T]:
    """Every task's result, in order, computed on up to :func:`threads` threads (or ``limit``),
    each with one intra-op thread; the calling thread works too. Tasks are taken longest first
    (``costs``), so the last to finish is a short one. After a task raises, no new task starts, and
    its exception is raised once the tasks under way have ended. Inside a task, a nested call runs
    its tasks in that thread."""
    n = len(tasks)
    out: list[Any] = [None] * n
    own = getattr(_local, "width", None)
    width = min(n, limit or (own() if own is not None else threads()))
    if getattr(_local, "inside", False):
        return [task() for task in tasks]
    start = time.perf_counter()
    if width <= 1:
        with one_thread():
            out = [task() for task in tasks]
        _record(1, time.perf_counter() - start)
        return out
    order = sorted(range(n), key=lambda i: -costs[i]) if costs is not None else list(range(n))
    grad = torch.is_grad_enabled()          # thread-local in torch: the caller's no_grad must reach the helpers
    lock = threading.Lock()
    position = iter(order)
    errors: list[BaseException] = []
    # work() calls under way, the caller's and the helpers': what an interrupted caller waits for. A
    # helper counts itself before it takes a task, so none computes unseen; one that starts after the
    # caller stopped finds ``errors`` set and takes no task.
    busy, computing = threading.Condition(), [0]

    def work() -> None:
        with busy:
            computing[0] += 1
        _local.inside = True
        try:
            while True:
                with lock:
                    i = next(position, None)
                    if i is None or errors:
                        return
                try:
                    with torch.set_grad_enabled(grad):
                        out[i] = tasks[i]()
                except BaseException as e:  # noqa: BLE001 - raised in the caller
                    with lock:
                        errors.append(e)
        finally:
            _local.inside = False
            with busy:
                computing[0] -= 1
                busy.notify_all()

    helpers: list = []
    try:
        # submitted inside the try: a helper may take a task at once, before the caller is back
        helpers = _submit(max(usable_cores(), width - 1), work, width - 1)
        with one_thread():
            work()
        for h in helpers:
            h.result()
    except BaseException as e:  # noqa: BLE001 - an interrupt while the helpers compute
        # Ctrl-C lands in this thread, possibly while it waits, or while it submits the helpers: no
        # new task may start, and the caller must not go on (its ``finally`` switches the model's mode
        # back, say) while a helper still computes with the caller's model. (Not under ``lock``: the
        # interrupt may have left it held. A list's append is atomic, and the helpers read ``errors``
        # before taking each task.)
        errors.append(e)
        with busy:
            busy.wait_for(lambda: computing[0] == 0)
        raise
    _record(width, time.perf_counter() - start)
    if errors:
        raise errors[0]
    return out
