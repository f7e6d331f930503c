"""Progress you can trust, and an interrupt that stops cleanly, with real runs and processes:
every run writes its rounds done into its cache entry, the sweep's one bar reads them from
whatever process trains the run, and Ctrl-C (SIGINT to the whole process group, as a terminal or
Jupyter's interrupt sends it) stops the pool's workers, says in one line what is kept, and the
next sweep resumes from the checkpoints."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.runs.cache import entry, prepare
from fairfl.runs.loop import simulate
from fairfl.base.progress import PROGRESS, read
from fairfl.runs.sweeps import ProcessBackend, SerialBackend, SweepInterrupted, run_many
from processes import children

CFG = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="mlp2",
                       partition=PartitionSpec("shards", num_clients=10, shards_per_client=2),
                       local=LocalTraining(epochs=1, batch_size=20, lr=0.05), rounds=4, clients_per_round=3,
                       eval_every=2, checkpoint_every=1)


def test_a_run_writes_its_rounds_done_into_its_cache_entry(fmnist, tmp_path):
    folder = prepare(CFG, tmp_path)
    simulate(CFG, checkpoint_dir=folder, progress=False, stop_after=3)
    assert json.loads((folder / PROGRESS).read_text()) == {"done": 3, "rounds": 4}
    assert read(folder) == 3
    assert read(folder, since=time.time() + 60) is None       # an earlier sweep's file is not this one's progress
    assert not list(folder.glob(".*.tmp"))


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_the_sweep_bar_ends_at_every_round_of_every_run(fmnist, tmp_path, capsys, monkeypatch, backend):
    monkeypatch.setenv("FAIRFL_PROGRESS", "text")             # what `reproduce` sets for papermill's kernels
    monkeypatch.delenv("TQDM_DISABLE", raising=False)         # `make test` switches bars off; this test reads one
    configs = [CFG.replace(seed=s) for s in range(3)]
    run_many(configs[:1], backend=SerialBackend(), root=tmp_path, progress=False)   # one already cached
    with (SerialBackend() if backend == "serial" else ProcessBackend(workers=2)) as b:
        run_many(configs, backend=b, root=tmp_path)
    out = capsys.readouterr().out
    lines = out.replace("\r", "\n").strip().splitlines()
    last = lines[-1]
    assert last.startswith("2 runs (1 cached): 100%") and "8/8" in last and "2/2 runs done" in last, out
    # what happens before the first round is said (workers starting, data loading), then that runs train
    assert "0/8" in lines[0] and lines[0].endswith("starting workers, loading data…]"), out
    assert any("training, 0/2 runs done" in line for line in lines), out
    # the final state is drawn once (not once per refresh, each with another rate)
    assert sum("2/2 runs done" in line for line in lines) == 1, out
    for c in configs:
        assert read(entry(c, tmp_path)) == 4


def test_progress_off_prints_nothing(fmnist, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAIRFL_PROGRESS", "text")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    run_many([CFG], backend=SerialBackend(), root=tmp_path)
    assert capsys.readouterr().out == ""


def test_an_interrupted_sweep_shows_one_line_in_ipython():
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    try:
        e = SweepInterrupted("interrupted: 1 of 4 runs cached, 2 running stopped at their checkpoints; re-run to resume")
        assert isinstance(e, KeyboardInterrupt)                 # `except Exception` does not swallow it
        assert e._render_traceback_() == [str(e)]              # IPython prints this instead of the frames
    finally:
        InteractiveShell.clear_instance()


def test_an_interrupted_sweep_counts_a_run_that_ended_before_the_sweep_heard_of_it_as_cached(fmnist, tmp_path):
    """Ctrl-C can come after a worker stored a run and before its result reached the sweep: that run
    is cached, not running (the line read "1 of 2 runs cached, 2 running stopped")."""
    from fairfl.base.progress import RoundReporter, SweepProgress
    from fairfl.runs.sweeps import _interrupted, run
    cfgs = [CFG.replace(rounds=1, seed=s) for s in (0, 1)]
    run(cfgs[0], root=tmp_path, progress=False)                          # finished: its entry is written
    folders = [prepare(c, tmp_path) for c in cfgs]
    watch = SweepProgress(folders, [1, 1], enabled=False)
    RoundReporter(folders[0], 1)(1, final=True)                          # both reported rounds in this sweep,
    RoundReporter(folders[1], 1)(0, final=True)                          # neither was seen to end
    said = str(_interrupted(SerialBackend(), watch, cfgs, tmp_path))
    assert said == "interrupted: 1 of 2 runs cached, 1 running stopped at their checkpoints; re-run to resume"


SCRIPT = '''
import os, sys
from pathlib import Path
from fairfl import ExperimentConfig, LocalTraining, PartitionSpec
from fairfl.runs.sweeps import ProcessBackend, SweepInterrupted, run_many

if __name__ == "__main__":
    import signal
    # as a terminal starts it: Ctrl-C raises KeyboardInterrupt here even where the test's own process was
    # started with SIGINT ignored (an ignored signal is inherited through exec, and Python then leaves it so)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = ExperimentConfig(dataset="fashion_mnist", dataset_options={"classes": (0, 1, 2)}, model="mlp2",
                           partition=PartitionSpec("shards", num_clients=10, shards_per_client=2),
                           local=LocalTraining(epochs=2, batch_size=20, lr=0.05), rounds=int(sys.argv[2]),
                           clients_per_round=4, eval_every=10, checkpoint_every=1)
    backend = ProcessBackend(workers=2)
    try:
        hs = run_many([cfg.replace(seed=s) for s in range(2)], backend=backend, root=Path(sys.argv[1]),
                      max_group=1, progress=False)
    except SweepInterrupted as e:
        print(e, file=sys.stderr)
        sys.exit(130)
    finally:
        backend.close()
    print("finished", [h.rounds_done for h in hs])
'''




def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_says_what_is_kept_and_the_next_sweep_resumes(fmnist, tmp_path):
    script, root = tmp_path / "sweep.py", tmp_path / "results"
    script.write_text(textwrap.dedent(SCRIPT))
    cmd = [sys.executable, str(script), str(root), "40"]
    # a session of its own, so that the signal goes to its process group as a terminal's Ctrl-C does
    p = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and p.poll() is None:   # until both runs have checkpointed a round
            if len(list(root.glob("*/checkpoint.pt"))) == 2:
                break
            time.sleep(0.2)
        assert len(list(root.glob("*/checkpoint.pt"))) == 2, p.communicate(timeout=30)
        workers = [c for c in children(p.pid) if "resource_tracker" not in Path(f"/proc/{c}/cmdline").read_text()]
        assert len(workers) == 2
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, (out, err)
    assert err.strip() == ("interrupted: 0 of 2 runs cached, 2 running stopped at their checkpoints; "
                           "re-run to resume"), err                    # no traceback, from any process
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "a worker outlived the interrupted sweep"
    stopped_at = [read(d) for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]   # not the data fingerprints
    assert all(0 < n < 40 for n in stopped_at), stopped_at

    # the same sweep again: both runs resume from their checkpoints and finish
    r = subprocess.run(cmd, env=os.environ.copy(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "finished [40, 40]" in r.stdout
    assert not list(root.glob("*/checkpoint.pt"))
