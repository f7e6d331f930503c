"""Every script in benchmarks/ and scripts/ runs, at a tiny size, as a user runs it: a real
subprocess of this Python from the repository root, with runs, figures and data in temporary
folders (nothing lands in the repository).

``SMOKE`` holds each script's smoke arguments (mostly its ``--smoke`` flag: seconds, not minutes)
and a line its output must contain. A script added later without an entry here fails
``test_every_script_has_a_smoke_entry`` and its own run.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.relative_to(REPO).as_posix() for folder in ("benchmarks", "scripts")
                 for p in (REPO / folder).glob("*.py"))

# script: (arguments, text its standard output must contain); "{tmp}" is the test's temporary folder
SMOKE: dict[str, tuple[list[str], str]] = {
    # two spawned workers beside two threads, every copy's updates against one alone
    "benchmarks/core_contention.py": (["--smoke"], "bit-identical to one copy alone: yes"),
    "benchmarks/explore_redraw.py": (["--smoke"], "redraw ("),
    # a lockstep group of two tiny runs, with and without the allocator trims, in fresh processes
    "benchmarks/group_memory.py": (["--smoke"], "group_memory: 2 runs of smoke"),
    "benchmarks/gpu_bundle.py": (["--smoke"], "GPU bundle (temporary)"),      # the data part, staged; no wheels
    "benchmarks/gpu_check.py": (["{tmp}/gpu", "--smoke", "--device", "cpu"], "gpu_check: 6 of 6 sections ok"),
    # the character LSTM's reference and stacked paths at N = 1 and 2, one step each
    "benchmarks/lstm_speed.py": (["--smoke"], "stacked / reference at N = 2: "),
    # a short child allocating 200 MiB, its tree's peak PSS read from /proc
    "benchmarks/memory_trace.py": (["--smoke"], "memory_trace: exit 0 after"),
    "benchmarks/minnorm_speed.py": (["--reps", "1"], "speed-up of the fast solver vs cvxpy at m=100"),  # instant
    # every notebook's smoke sweeps read and counted, nothing trained
    "benchmarks/notebook_sweeps.py": (["--smoke"], "06_one_protocol (smoke): 3 sweep(s), "),
    # notebook 04's smoke profile read and counted, its two kinds of client step timed for 2 rounds: a batched
    # one (the MLP) and an unbatched one (Shakespeare's LSTM). Every notebook's reading is tested by
    # tests/test_paper_cost.py (paper) and by notebook_sweeps.py's entry above (smoke)
    "benchmarks/partition_memory.py": (["--smoke"], "the pool adds nothing"),
    "benchmarks/paper_cost.py": (["--smoke", "--notebooks", "04", "--out", "{tmp}/cost.json"],
                                 "paper_cost: 1 notebook(s), "),
    # real pfl from .pfl/ (`make test` installs it first: benchmarks/pfl_setup.sh), both sides once
    "benchmarks/pfl_round.py": (["--smoke", "--compare", "1"], "fairfl (2 threads) vs pfl (2 processes): "),
    "benchmarks/ray_throughput.py": (["--smoke"], "| RayBackend"),
    "benchmarks/round_speed.py": (["--smoke"], "sweep throughput ratio vs sequential"),
    "benchmarks/sweep_speed.py": (["--smoke"], "sweep speed-up vs executor (geometric mean)"),
    # two figures drawn there, one through save_figure (new code) and one by plain matplotlib (old code)
    "scripts/contact_sheet.py": (["--smoke", "--out", "{tmp}/sheet.png"], "2 figures: 1 drawn by the new code (1 fit"),
    "scripts/dqnfed_shakespeare.py": (["--smoke", "--out", "{tmp}/dqnfed.csv"], "wrote 2 rows to"),
    "scripts/explore_screenshots.py": (["{tmp}/explore-cache", "--smoke"], "selection 2: A"),
    "scripts/fmol_readings.py": (["--smoke", "--out", "{tmp}/readings.csv"], "wrote 2 rows to"),
    "scripts/fmol_table2.py": (["--smoke"], "{tmp}/figures/05_table2_paper_size_T2_K1.png"),
    "scripts/normalise_notebooks.py": (["--check"], "would change: none"),              # instant, writes nothing
    # the bad API inputs row under a pytest of its own (exit 0: none failed); every row's selections checked
    "scripts/reliability.py": (["--smoke"], "| bad API inputs (`api`) | "),
}
RAY = {"benchmarks/ray_throughput.py"}        # starts Ray: one Ray user at a time among the test workers
TIMEOUT = 300                                 # seconds; each takes seconds (the Ray one tens of seconds)


def test_every_script_has_a_smoke_entry():
    assert SCRIPTS, "no scripts found"
    missing = sorted(set(SCRIPTS) - set(SMOKE))
    assert not missing, f"scripts without a smoke entry in tests/test_scripts.py's SMOKE: {missing}"
    stale = sorted(set(SMOKE) - set(SCRIPTS))
    assert not stale, f"SMOKE entries of scripts that do not exist: {stale}"


def _ray_lock(request):
    """The lock of conftest's one_ray_at_a_time, held for this test only."""
    lock = open(Path(tempfile.gettempdir()) / "fairfl-tests-ray.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    request.addfinalizer(lock.close)           # closing releases the lock


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_at_a_tiny_size(script, tmp_path, request):
    assert script in SMOKE, (f"{script} has no entry in tests/test_scripts.py's SMOKE: give it one (and a "
                             "--smoke flag if its defaults take more than seconds)")
    args, expected = ([a.format(tmp=tmp_path) for a in SMOKE[script][0]], SMOKE[script][1].format(tmp=tmp_path))
    if script in RAY:
        _ray_lock(request)
    env = {**os.environ, "FAIRFL_RESULTS": str(tmp_path / "results"), "FAIRFL_FIGURES": str(tmp_path / "figures"),
           "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, script, *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT)
    output = r.stdout + r.stderr
    assert r.returncode == 0, f"{script} exited with {r.returncode}:\n{output[-4000:]}"
    assert expected in r.stdout, f"{script}'s output lacks {expected!r}:\n{output[-4000:]}"
    if script == "benchmarks/gpu_check.py":       # its report: every section, in order, ok, in both forms
        report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
        assert [s["name"] for s in report["sections"]] == ["env", "tests", "stacked", "round", "profiles", "cores"]
        assert all(s["ok"] and not s.get("error") for s in report["sections"]), report["sections"]
        text = (tmp_path / "gpu" / "gpu_check.md").read_text()
        assert text.count("\n## ") == 6 and "FAILED" not in text and "extrapolated" in text
    print(f"{script} {' '.join(args)}: {time.perf_counter() - t0:.1f} s")
