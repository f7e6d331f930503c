"""Shared fixtures for the fairfl test-suite.

* Every test runs with ``FAIRFL_DATA`` / ``FAIRFL_RESULTS`` pointing at temporary folders shared
  by the session (one per xdist worker) and ``FAIRFL_OFFLINE=1``: nothing is written into the
  repository and no test downloads anything.
* A guard records every attempt to open an internet socket; a test that attempts one fails.
* ``fmnist`` is the real Fashion-MNIST ``ArrayDataset`` (staged from the offline Debian copy).
"""
from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# One torch thread per process: the convolutions here are too small to keep two threads busy
# (a 2-thread CNN round is several times slower), and `-n 2` runs two worker processes.
torch.set_num_threads(1)
try:
    torch.set_num_interop_threads(1)
except RuntimeError:  # already set (parallel work has started in this process)
    pass

# No example database: hypothesis would otherwise write .hypothesis/ into the repository.
settings.register_profile(
    "fairfl", deadline=None, database=None, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("fairfl")


# ----------------------------------------------------------------------------- order

# `make test` runs `pytest -n 2 --dist loadfile`: whole files go to the two workers in collection
# order, each as its worker runs low. A long file handed out near the end runs alone while the
# other worker idles (CI's log: the browser's 5-minute afternoon, the command line's subprocesses
# and the scripts' smoke runs sat late in alphabetical order, the notebooks' nbval cells after all
# of them). The longest files go first, longest first (their sums in CI's `--durations` output);
# the rest keep their order. It trims the end, not the total: the suite keeps both cores busy
# almost throughout (a fresh-clone run took 1,914 s of tests with this, 1,943 s before).
LONGEST_FIRST = ("tests/test_cli.py", "tests/test_jupyterlab.py", "tests/test_scripts.py", "tests/test_engine.py",
                 "notebooks/02_fedmgda_attacks.ipynb", "tests/test_flower.py", "tests/test_notebooks.py",
                 "notebooks/04_dqnfed_convergence.ipynb", "tests/test_determinism.py", "tests/test_newcomer.py",
                 "notebooks/01_fedmgda_eps_interpolation.ipynb")


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # stable: within a file and among the others, collection order (a node id starts with the file's
    # path from the root)
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


# ----------------------------------------------------------------------------- environment

@pytest.fixture(scope="session", autouse=True)
def fairfl_env(tmp_path_factory):
    """Session-wide data root, results root and offline mode (restored afterwards)."""
    # FAIRFL_TEST_DATA: a prepared data root to use instead (benchmarks/gpu_check.py on a GPU machine,
    # which has none of the offline copies the loaders stage from: its data root is staged from the bundle)
    data = Path(os.environ["FAIRFL_TEST_DATA"]) if os.environ.get("FAIRFL_TEST_DATA") else tmp_path_factory.mktemp("fairfl_data")
    results = tmp_path_factory.mktemp("fairfl_results")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAIRFL_DATA", str(data))
        mp.setenv("FAIRFL_RESULTS", str(results))
        mp.setenv("FAIRFL_OFFLINE", "1")
        yield {"data": data, "results": results}


_NETWORK_ATTEMPTS: list[object] = []


@pytest.fixture(scope="session", autouse=True)
def _no_network():
    """Refuse (and record) every connection to an internet address (loopback is allowed)."""
    real_connect = socket.socket.connect

    def guarded_connect(self, address):
        # loopback is this machine, not the internet: the JupyterLab test talks to its server and browser
        loopback = isinstance(address, tuple) and str(address[0]) in ("127.0.0.1", "::1", "localhost")
        if self.family in (socket.AF_INET, socket.AF_INET6) and not loopback:
            _NETWORK_ATTEMPTS.append(address)
            raise OSError(f"network access attempted in a test: {address!r}")
        return real_connect(self, address)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", guarded_connect)
        yield


@pytest.fixture(autouse=True)
def _fail_on_network_attempt():
    """Fail the test if it tried the network, even if the code under test swallowed the error."""
    before = len(_NETWORK_ATTEMPTS)
    yield
    attempts = _NETWORK_ATTEMPTS[before:]
    assert not attempts, f"test attempted network access: {attempts}"


# ----------------------------------------------------------------------------- real data

@pytest.fixture(scope="session")
def fmnist(fairfl_env):
    """Real Fashion-MNIST, loaded once per session from the offline copy into the tmp data root."""
    from fairfl.federated.data import load_dataset
    return load_dataset("fashion_mnist")


@pytest.fixture(scope="module")
def one_ray_at_a_time():
    """Held by every test module that starts Ray (a local instance, or Flower's simulation on one):
    only one of them runs at a time across the pytest-xdist workers. Ray gives a starting node 30 s
    to register (hard-coded in ray/_private/node.py); two instances starting at once beside the
    notebooks on a 2-core machine missed it ("The current node timed out during startup")."""
    with open(Path(tempfile.gettempdir()) / "fairfl-tests-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
