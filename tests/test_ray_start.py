"""Starting Ray (``RayBackend.start``, used by RayBackend and by the Flower simulation): a local
instance whose processes do not come up within Ray's 30 s is started once more, and a second miss
is one clear fairfl error; Ray's FutureWarning at start is not shown.

Ray allows each process of a new local instance 30 s to come up, hard-coded in ray/_private (no
option or variable shortens it), and a busy machine misses it only now and then. So the first
test makes the first start fail with the very exception Ray raises then, and the start after it
is a real local instance; the second makes a real instance miss its time twice, with a setting
its GCS refuses to start with (its failure is a real timeout: Ray waits 30 s for the GCS's port
file each time)."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from fairfl.base.errors import RunFailedError  # noqa: E402
from fairfl.runs.sweeps import RayBackend  # noqa: E402

# what ray/_private/node.py raises when a new node does not register with the GCS within 30 s
TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet failed "
             "to startup or the GCS has become overloaded.")


class SlowStarts:
    """``ray.init`` whose first ``misses`` calls fail as Ray's does when a node misses its 30 s."""

    def __init__(self, misses: int):
        self.misses, self.calls, self.real = misses, 0, ray.init

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.misses:
            raise Exception(TIMED_OUT)
        return self.real(*args, **kwargs)


@pytest.mark.slow
def test_a_node_that_misses_its_startup_time_is_started_once_more(fairfl_env, one_ray_at_a_time, monkeypatch,
                                                                   recwarn):
    from ray.util.debug import reset_log_once
    assert not ray.is_initialized()
    reset_log_once("ray_accel_env_var_override_on_zero")     # Ray warns once per process: warn at this start
    starts = SlowStarts(misses=1)
    monkeypatch.setattr(ray, "init", starts)
    backend = RayBackend(num_cpus=2, _node_ip_address="127.0.0.1")
    try:
        assert backend.workers == 2 and starts.calls == 2        # the second start: a real local instance
    finally:
        backend.close()
    assert not ray.is_initialized()
    assert not [str(w.message) for w in recwarn if issubclass(w.category, FutureWarning)]


def test_a_node_that_misses_its_startup_time_twice_is_one_clear_error(monkeypatch):
    starts = SlowStarts(misses=2)
    monkeypatch.setattr(ray, "init", starts)
    with pytest.raises(RunFailedError, match=r"(?s)Ray's local instance did not start: twice .*timed out during "
                                             r"startup.*FAIRFL_BACKEND=process") as e:
        RayBackend(num_cpus=2).workers
    assert starts.calls == 2 and e.value.__suppress_context__      # one error, not Ray's traceback under it
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_real_instance_that_misses_its_startup_time_twice_is_one_clear_error(fairfl_env, one_ray_at_a_time):
    assert not ray.is_initialized()
    # an unknown system setting stops Ray's GCS at start: Ray waits its 30 s for the GCS, twice
    backend = RayBackend(num_cpus=1, _node_ip_address="127.0.0.1", _system_config={"no_such_ray_setting": 1})
    with pytest.raises(RunFailedError, match=r"(?s)Ray's local instance did not start: twice .*RuntimeError: "
                                             r"Timed out waiting for file .*gcs_server_port.*FAIRFL_BACKEND=process"):
        backend.workers
    assert not ray.is_initialized()
