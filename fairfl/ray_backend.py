"""Sweeps on a Ray cluster: :class:`RayBackend`, the backend of ``FAIRFL_BACKEND=ray``.

Each lockstep group of a sweep (``fairfl.sweeps.plan_groups``) is one Ray task that declares what
it needs (one CPU; one GPU for a CUDA group), so Ray packs the groups onto the cluster's cores or
GPUs. No shared filesystem is assumed (``shares_files = False``): a task trains into a folder of
the machine it lands on, resuming from the checkpoints the driver sent with it, and returns each
finished run's cache entry (``history.json`` + ``history.npz``, as bytes) through Ray's object
store; the driver checks them and writes them into its own cache atomically
(``fairfl.cache.receive``).

A worker that dies or a node that leaves costs only its group: Ray sends the task again (up to
``retries`` more times, on the same or another node; on the same node it resumes from the
checkpoints its predecessor left), then the sweep splits the group into single runs, each sent
the same bounded number of times, so that only a run that takes down its worker every time is
reported failed (``WorkerDied``) and the other runs are kept.

``import ray`` happens at the first sweep, not when fairfl is imported.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

from .errors import ConfigError
from .sweeps import WorkerDied, _Closing, _Failure


class RayBackend(_Closing):
    """Run a sweep's groups as Ray tasks on the cluster at ``address`` (else
    ``$FAIRFL_RAY_ADDRESS``: ``auto``, ``host:port`` or ``ray://host:port``; else Ray's own
    choice: the ``RAY_ADDRESS`` variable, a cluster started on this machine with ``ray start``,
    or a new local instance). A Ray already initialised in this process is used as it is.

    ``device`` ("cpu" or "cuda") says which resource is a slot for :func:`fairfl.sweeps.plan_groups`:
    the cluster's CPUs, or its GPUs. Each task asks for one CPU, and one GPU when its group trains
    on CUDA (Ray then shows the task that GPU only: give such configs ``device="cuda"``).

    Every node needs fairfl (the same version) and the datasets under its ``FAIRFL_DATA``; an
    algorithm registered outside fairfl must be importable there too. A run trained on other data
    or by another fairfl is refused (its cache key differs) rather than cached."""

    shares_files = False          # fairfl.sweeps: ship checkpoints out, entries back
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
        self._remote: dict[Callable, Any] = {}

    def _ray(self):
        import ray
        if not ray.is_initialized():
            try:
                local = {"include_dashboard": False} if self.address is None else {}   # a new instance: no dashboard
                ray.init(address=self.address, **{**local, **self.init_options})
            except (ConnectionError, ValueError, RuntimeError) as e:
                where = self.address or "a local instance"
                raise ConfigError(f"cannot reach the Ray cluster at {where} ({type(e).__name__}: {e}); check "
                                  "FAIRFL_RAY_ADDRESS (auto, host:port or ray://host:port)") from None
            self._started = True
        return ray

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
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(fn)
        pending = {}
        for i, item in enumerate(items):
            gpu = getattr(item, "device_type", "cpu") == "cuda"
            # max_retries: Ray sends a task again when its worker dies or its node leaves (not when
            # it raises: a run's own error is reported, not retried)
            ref = remote.options(num_cpus=1, num_gpus=1 if gpu else 0, max_retries=self.retries,
                                 retry_exceptions=False).remote(item)
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
