"""The command line, end to end in subprocesses (real papermill, real kernels)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest


def fairfl(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "fairfl", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=600)


def _notebook(path: Path, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('profile = "quick"', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_list_names_every_registry():
    r = fairfl("list")
    assert r.returncode == 0, r.stderr
    assert "fedavg_n" in r.stdout and "cnn_fmnist" in r.stdout and "adult" in r.stdout


def test_data_reports_found_and_missing():
    r = fairfl("data", "fashion_mnist", "cifar10", env={"FAIRFL_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert lines["fashion_mnist"].startswith("ok") and "60000 train" in lines["fashion_mnist"]
    assert lines["cifar10"].startswith("missing")
    r = fairfl("data", "cifar10", "--require", "cifar10", env={"FAIRFL_OFFLINE": "1"})
    assert r.returncode == 1 and "required datasets missing: cifar10" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "algorithm=no_such"], "unknown algorithm 'no_such'"),
    (["--set", "participation=1.5"], "participation=1.5 is not allowed"),
    (["--set", "dataset=imagenet"], "unknown dataset 'imagenet'"),
    (["--set", "bogus=1"], "unknown config keys: bogus"),
])
def test_run_rejects_bad_input_with_one_clear_message(args, message):
    r = fairfl("run", *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_run_from_yaml_trains_and_caches(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "dataset: adult\nmodel: logreg\nalgorithm: fedavg\nrounds: 2\nclients_per_round: 2\n"
        "eval_every: 1\npartition: {scheme: attribute, num_clients: 2, attribute_values: [0, 1], split: null}\n"
        "local: {batch_size: 500, lr: 0.1}\n")
    r = fairfl("run", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "final client accuracy (%) mean" in r.stdout
    folder = Path(r.stdout.rsplit("results in ", 1)[1].strip())
    h = json.loads((folder / "history.json").read_text())
    assert h["eval_rounds"] == [0, 1, 2]


@pytest.mark.slow
def test_reproduce_reports_each_notebook_and_fails_if_one_fails(tmp_path):
    good = _notebook(tmp_path / "98_good.ipynb", "assert profile == 'smoke'\nprint('fine')")
    bad = _notebook(tmp_path / "99_bad.ipynb", "raise ValueError('broken on purpose')")
    out = tmp_path / "out"
    r = fairfl("reproduce", str(good), str(bad), "--profile", "smoke", "--output", str(out))
    assert r.returncode == 1
    assert "ok      98_good.ipynb" in r.stdout
    assert "FAILED  99_bad.ipynb" in r.stdout and "broken on purpose" in r.stdout
    assert (out / "smoke" / "98_good.ipynb").is_file()
    r = fairfl("reproduce", str(good), "--profile", "smoke", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_reproduce_counts_the_claims_a_notebook_checked(tmp_path):
    body = ("from fairfl.studies.claims import Claims\n"
            "c = Claims('97_claims', profile)\n"
            "c.check('holds', True, 'evidence')\n"
            "c.check('misses', False, 'evidence', deviation={'quick': 'a diagnosis'})\n"
            "c.finish()")
    nb = _notebook(tmp_path / "97_claims.ipynb", body)
    out = tmp_path / "out"
    r = fairfl("reproduce", str(nb), "--profile", "quick", "--output", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "claims: 1 holds, 1 not reproduced (documented)" in r.stdout
    assert (out / "quick" / "97_claims.claims.json").is_file()


def _env_with_progress(tmp_path, **extra):
    """The environment of a user's shell: progress shown (`make test` switches it off), figures
    of a non-smoke profile kept out of the repository."""
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "FAIRFL_PROGRESS", "FAIRFL_PROFILE")}
    return {**env, "FAIRFL_FIGURES": str(tmp_path / "figures"), **extra}


def _reproduce(*args, env):
    return subprocess.run([sys.executable, "-m", "fairfl", "reproduce", *args], capture_output=True, text=True,
                          env=env, timeout=900)


@pytest.mark.slow
def test_reproduce_an_explicit_profile_beats_the_environment_and_parameters_reach_the_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('profile = "quick"\nrounds = None', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from fairfl.studies.notebook import resolve_profile\n"
                                          "print('resolved', resolve_profile(profile), 'rounds', rounds)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "96_params.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "out"
    r = _reproduce(str(path), "--profile", "quick", "-p", "rounds=10", "--output", str(out),
                   env=_env_with_progress(tmp_path, FAIRFL_PROFILE="smoke"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--profile quick beats FAIRFL_PROFILE=smoke" in r.stdout
    assert "start   96_params.ipynb" in r.stdout and "expected not measured (parameters changed)" in r.stdout
    assert "resolved quick rounds 10" in r.stdout                     # the kernel's output, streamed here
    # an exploration (-p) goes beside the reproduced notebooks, not over them
    assert not (out / "quick" / "96_params.ipynb").exists()
    executed = nbformat.read(out / "quick" / "explore" / "rounds=10" / "96_params.ipynb", as_version=4)
    assert "resolved quick rounds 10" in executed.cells[-1].outputs[0].text
    assert not (out / "smoke").exists()
    r = _reproduce(str(path), "--output", str(out), env=_env_with_progress(tmp_path, FAIRFL_PROFILE="smoke"))
    assert r.returncode == 0 and "resolved smoke" in r.stdout       # no --profile: the environment's
    for bad, message in ((["-p", "profile=paper"], "choose the profile with --profile"),
                         (["-p", "rounds"], "-p takes KEY=VALUE")):
        r = _reproduce(str(path), *bad, "--output", str(out), env=_env_with_progress(tmp_path))
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_tour_with_changed_parameters_runs_to_the_end_with_claims_not_checked(tmp_path):
    """quick with rounds=2 would fail the tour's claims (FedAvg far below 60 %); exploring, they are
    recorded as not checked, and the executed notebook's stored progress reads 100 %."""
    out = tmp_path / "out"
    r = _reproduce("00", "--profile", "quick", "-p", "rounds=2", "-p", "seeds=[0]", "-p", "workers=1",
                   "--output", str(out), env=_env_with_progress(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "claims: 3 not checked (parameters overridden)" in r.stdout
    explored = out / "quick" / "explore" / "rounds=2,seeds=[0],workers=1"      # a folder per exploration
    verdicts = json.loads((explored / "00_tour.claims.json").read_text())
    assert verdicts["overridden"] == {"rounds": [100, 2], "seeds": [[0, 1], [0]]}
    executed = nbformat.read(explored / "00_tour.ipynb", as_version=4)
    streams = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []) if o.output_type == "stream")
    last_bar = [line for line in streams.replace("\r", "\n").splitlines() if "round" in line and "%|" in line][-1]
    assert last_bar.startswith("2 runs: 100%") and "4/4" in last_bar, last_bar
    widgets = [o for c in executed.cells for o in c.get("outputs", []) if "application/vnd.jupyter.widget-view+json"
               in o.get("data", {})]
    assert not widgets, "a widget bar has no state in an executed notebook"


# ----------------------------------------------------------------------------- a first afternoon

def _sleeping_notebook(path: Path) -> Path:
    """A notebook that trains a real run long enough to be interrupted; ROUNDS from the environment
    (so that the same notebook, unchanged, has a short good run and a long interrupted one)."""
    body = ("import os\n"
            "from fairfl import ExperimentConfig, PartitionSpec, LocalTraining\n"
            "from fairfl.runs.sweeps import SerialBackend, run_many\n"
            "cfg = ExperimentConfig(dataset='adult', model='logreg', rounds=int(os.environ['ROUNDS']),\n"
            "                       partition=PartitionSpec('attribute', num_clients=2, attribute_values=(0, 1), split=None),\n"
            "                       local=LocalTraining(batch_size=10, lr=0.01), eval_every=1)\n"
            "print('training', flush=True)\n"
            "run_many([cfg], backend=SerialBackend())\n"
            "print('trained')")
    return _notebook(path, body)


@pytest.mark.slow
def test_ctrl_c_during_reproduce_says_one_line_and_keeps_the_last_good_notebook(tmp_path):
    import signal
    nb = _sleeping_notebook(tmp_path / "95_long.ipynb")
    out = tmp_path / "out"
    env = {**_env_with_progress(tmp_path), "FAIRFL_RESULTS": str(tmp_path / "results"), "ROUNDS": "1"}
    r = _reproduce(str(nb), "--profile", "quick", "--output", str(out), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    good = (out / "quick" / "95_long.ipynb").read_bytes()
    assert b"trained" in good
    p = subprocess.Popen([sys.executable, "-m", "fairfl", "reproduce", str(nb), "--profile", "quick", "--output",
                          str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**env, "ROUNDS": "100000"}, start_new_session=True)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("training"):
            import time
            time.sleep(3)                        # into the run's first rounds
            os.killpg(p.pid, signal.SIGINT)      # what the terminal's Ctrl-C does
    assert p.wait(timeout=120) == 130
    text = "".join(lines)
    assert "Traceback" not in text and "Task exception" not in text, text
    said = [line for line in lines if line.startswith("interrupted")]
    assert len(said) == 1 and f"kept at {out / 'quick' / '95_long.ipynb'}" in said[0], text
    assert "ok " not in text and "FAILED" not in text
    assert (out / "quick" / "95_long.ipynb").read_bytes() == good           # the last good one, untouched
    failed = nbformat.read(out / "quick" / "95_long.failed.ipynb", as_version=4)
    errors = [o for c in failed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors and "Interrupt" in errors[0].ename                       # the interrupted cell, recorded
    assert "without encryption" not in text                                # the kernel's start-up noise


def test_an_unknown_parameter_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    r = fairfl("reproduce", "00", "-p", "round=2", "--output", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "00_tour.ipynb has no parameter 'round'; did you mean 'rounds'?" in r.stderr
    assert not out.exists()


def test_an_unknown_notebook_is_one_clear_error():
    r = fairfl("reproduce", "99")
    assert r.returncode == 2 and r.stderr.startswith("error: no notebook matches '99'; have: 00_tour.ipynb")


def test_help_is_plain_text_and_needs_no_torch():
    code = ("import sys, contextlib, io\nfrom fairfl.cli import main\nout = io.StringIO()\n"
            "for argv in (['--help'], ['reproduce', '--help'], ['run', '--help']):\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n            main(argv)\n        except SystemExit:\n            pass\n"
            "print('torch' in sys.modules)\nprint(out.getvalue())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    imported, text = r.stdout.split("\n", 1)
    assert imported == "False"                      # what made --help take seconds
    assert "``" not in text and "--kernel KERNEL" in text and "Jupyter kernel" in text and "--import" in text


def test_results_into_a_closed_pipe_ends_quietly(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "fairfl", "results", "--root", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                                 # `| head` that has read what it wanted
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("args, message", [
    (["run", "--device", ""], "device='' is not allowed"),
    (["run", "--set", "seed=18446744073709551616"], "seed=18446744073709551616 is not allowed"),
    (["run", "--set", "partition.seed=-1"], "seed=-1 is not allowed"),
    (["run", "--device", "cuda:9"], "device='cuda:9'"),
])
def test_bad_values_are_named_before_any_data_is_read(tmp_path, args, message):
    results = tmp_path / "results"
    r = fairfl(*args, "--set", "dataset=adult", "--set", "model=logreg", env={"FAIRFL_RESULTS": str(results)})
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not results.exists() or not any(results.iterdir())                # no entry, no fingerprint


def test_a_binary_config_file_and_a_file_as_results_root_are_named(tmp_path):
    binary = tmp_path / "exp.yaml"
    binary.write_bytes(bytes(range(256)))
    r = fairfl("run", "--config", str(binary))
    assert r.returncode == 2 and f"config file {binary} is not a text file" in r.stderr, r.stderr
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    r = fairfl("results", "--root", str(a_file))
    assert r.returncode == 2 and f"{a_file} is a file, not a results folder" in r.stderr, r.stdout + r.stderr


@pytest.mark.slow
def test_run_imports_the_users_own_algorithm(tmp_path):
    """The README's route for an algorithm of one's own, with the README's own module."""
    import re
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (block,) = re.findall(r"```python\n(# my_algorithms\.py\n.*?)```", readme, flags=re.S)
    (tmp_path / "my_algorithms.py").write_text(block)
    cfg = tmp_path / "my.yaml"
    cfg.write_text("dataset: adult\nmodel: logreg\nalgorithm: {name: trimmed_mean, trim: 1}\nrounds: 1\n"
                   "participation: 1.0\npartition: {scheme: iid, num_clients: 4}\nlocal: {batch_size: 500}\n")
    env = {"FAIRFL_RESULTS": str(tmp_path / "results")}
    r = fairfl("run", "--config", str(cfg), env=env, cwd=tmp_path)
    assert r.returncode == 2 and "--import" in r.stderr                      # the error says what to do
    r = fairfl("run", "--config", str(cfg), "--import", str(tmp_path / "my_algorithms.py"), env=env)
    assert r.returncode == 0 and "trimmed_mean" in r.stdout, r.stderr
    r = fairfl("run", "--config", str(cfg), "--import", "my_algorithms", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "1 rounds in" in r.stdout, r.stderr           # by module name: cached now
    r = fairfl("run", "--config", str(cfg), "--import", "no_such_module", env=env, cwd=tmp_path)
    assert r.returncode == 2 and "--import no_such_module" in r.stderr


@pytest.mark.slow
def test_two_processes_asked_for_one_run_train_it_once(tmp_path):
    env = {**os.environ, "FAIRFL_RESULTS": str(tmp_path / "results"), "TQDM_DISABLE": "1"}
    args = [sys.executable, "-m", "fairfl", "run", "--set", "dataset=adult", "--set", "model=logreg",
            "--set", "rounds=600"]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    import time
    deadline = time.time() + 120
    while not list((tmp_path / "results").glob("*/.training.lock")) and time.time() < deadline:
        time.sleep(0.1)                                     # the first one has claimed the run
    second = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    out1, err1 = first.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, err1 + second.stderr
    assert f"being trained by another process (pid {first.pid})" in second.stderr, second.stderr
    assert "being trained" not in err1
    # one result, the same for both
    assert out1.split(": ", 1)[1].split(";")[1] == second.stdout.split(": ", 1)[1].split(";")[1]


def test_an_explicit_profile_beats_the_environment_in_a_notebook_too(monkeypatch):
    """One rule, in JupyterLab as on the command line: the notebooks store profile = None, which is
    $FAIRFL_PROFILE (nbval's smoke runs) else quick; a profile written in the cell is used as written."""
    from fairfl.base.errors import ConfigError
    from fairfl.studies.notebook import resolve_profile
    monkeypatch.setenv("FAIRFL_PROFILE", "smoke")
    assert resolve_profile(None) == "smoke" and resolve_profile("paper") == "paper"
    monkeypatch.delenv("FAIRFL_PROFILE")
    assert resolve_profile(None) == "quick"
    monkeypatch.setenv("FAIRFL_PROFILE", "fast")
    with pytest.raises(ConfigError, match="FAIRFL_PROFILE='fast' is not one of smoke, quick, paper"):
        resolve_profile(None)
    for path in sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert cell.source.startswith("profile = None "), path.name


def _checksums(folder: Path) -> dict[str, str]:
    import hashlib
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_exploring_in_a_kernel_never_touches_the_reproduced_figures(tmp_path):
    """Notebook 00 with its parameters cell edited (`rounds = 4`) and run cell by cell in a kernel,
    as JupyterLab does: its figures go beside nothing reproduced, into a folder of its own named by
    its settings (outputs/smoke/explore/rounds=4/), and the figures folder gets no file. Before,
    an exploration wrote over figures/smoke/00_tour_*.png; then, every exploration shared one folder.
    The same from the terminal (`reproduce 00 -p rounds=3` after `reproduce 00`, the reproduced
    figures' checksums unchanged) is part of tests/test_jupyterlab.py's first afternoon; two
    explorations side by side, of test_a_failed_reproduce_leaves_the_last_good_figures_whole…"""
    import nbformat
    from nbclient import NotebookClient
    figures, outputs = tmp_path / "figures", tmp_path / "outputs"
    env = {**_env_with_progress(tmp_path), "FAIRFL_FIGURES": str(figures), "FAIRFL_OUTPUTS": str(outputs),
           "FAIRFL_RESULTS": str(tmp_path / "results"), "FAIRFL_PROGRESS": "off", "FAIRFL_PROFILE": "smoke"}
    nb = nbformat.read(Path(__file__).resolve().parent.parent / "notebooks" / "00_tour.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert "\nrounds = None" in cell.source
    cell.source = cell.source.replace("\nrounds = None", "\nrounds = 4")
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    assert not figures.exists() or not [p for p in figures.rglob("*") if p.is_file()]
    edited = outputs / "smoke" / "explore" / "rounds=4"
    assert {"00_tour_curves.png", "00_tour_curves.pdf"} <= set(_checksums(edited)), sorted(_checksums(edited))
    said = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "rounds=4 (profile: 2)" in said and f"figures -> {edited}" in said


STAGED = ["import os\nfrom pathlib import Path\nimport matplotlib.pyplot as plt\nfrom fairfl.studies.notebook import start\n"
          "session = start(profile, {'smoke': {}, 'quick': {}, 'paper': {}}, notebook='98_staged')\n"
          "fig, ax = plt.subplots(figsize=(3.3, 2.2))\n"
          "ax.set_title(f\"{Path(os.environ['STAGED_TITLE']).read_text()} {label or ''}\")\nax.plot([0, 1], [0, 1])\n"
          "session.save(fig, '98_staged')\n"
          "(session.figures / '98_staged.csv').write_text('a,b\\n1,2\\n')",
          "if Path(os.environ['STAGED_FAIL']).exists():\n    raise RuntimeError('failed after drawing its figure')"]


@pytest.mark.slow
def test_a_failed_reproduce_leaves_the_last_good_figures_whole_and_each_exploration_its_folder(tmp_path):
    """A notebook that draws its figure and writes a table, then fails: under `reproduce` both were
    staged, so the figures folder keeps the last good run's files byte for byte and the failed
    run's are kept beside its failed notebook (`<name>.failed.figures/`), both said in its line;
    the last good executed notebook is kept, and the next good run clears the failed one.
    Two explorations (`-p label=…`) get two folders named by their settings, and an interrupted or
    failed one is kept in its own folder."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("profile = None\nlabel = None", metadata={"tags": ["parameters"]}),
                *(nbformat.v4.new_code_cell(src) for src in STAGED)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "98_staged.ipynb"
    nbformat.write(nb, path)
    title, fail = tmp_path / "title.txt", tmp_path / "fail"
    figures, outputs = tmp_path / "figures", tmp_path / "outputs"
    env = {**_env_with_progress(tmp_path), "FAIRFL_FIGURES": str(figures), "FAIRFL_OUTPUTS": str(outputs),
           "FAIRFL_RESULTS": str(tmp_path / "results"), "STAGED_TITLE": str(title), "STAGED_FAIL": str(fail),
           "FAIRFL_PROGRESS": "off"}
    title.write_text("first")
    r = _reproduce(str(path), "--profile", "smoke", "--quiet", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    executed, failed = outputs / "smoke" / "98_staged.ipynb", outputs / "smoke" / "98_staged.failed.ipynb"
    good, good_notebook = _checksums(figures), executed.read_bytes()
    assert set(good) == {"smoke/98_staged.png", "smoke/98_staged.pdf", "smoke/98_staged.csv"}, good
    assert not list(outputs.rglob(".*partial*"))                          # nothing staged is left behind
    from fairfl.training.engine.cores import describe_machine
    from fairfl.studies.plotting import figure_stamp
    stamp = figure_stamp(figures / "smoke" / "98_staged.png")               # the profile and the machine
    assert stamp["fairfl-profile"] == "smoke" and stamp["fairfl-machine"] == describe_machine() != "", stamp

    title.write_text("second")
    fail.write_text("")
    r = _reproduce(str(path), "--profile", "smoke", "--quiet", env=env)
    assert r.returncode == 1 and "FAILED  98_staged.ipynb" in r.stdout, r.stdout + r.stderr
    assert "the last good figures are unchanged" in r.stdout and "98_staged.failed.figures" in r.stdout, r.stdout
    assert "98_staged.failed.ipynb" in r.stdout and failed.is_file()       # the failed run's notebook, beside
    assert executed.read_bytes() == good_notebook                         # the last good notebook, kept
    assert _checksums(figures) == good                                    # whole: the last good set
    drawn = _checksums(outputs / "smoke" / "98_staged.failed.figures")
    assert set(drawn) == {"98_staged.png", "98_staged.pdf", "98_staged.csv"}
    assert drawn["98_staged.png"] != good["smoke/98_staged.png"]          # the failed run's own figure

    fail.unlink()
    r = _reproduce(str(path), "--profile", "smoke", "--quiet", env=env)
    assert r.returncode == 0 and not failed.exists(), r.stdout + r.stderr   # a good run clears the failed one
    good = _checksums(figures)
    for label in ("a", "b"):
        r = _reproduce(str(path), "--profile", "smoke", "-p", f"label={label}", "--quiet", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    explored = {p.name: _checksums(p) for p in (outputs / "smoke" / "explore").iterdir()}
    assert set(explored) == {'label=_a_', 'label=_b_'}, sorted(explored)
    assert explored["label=_a_"]["98_staged.png"] != explored["label=_b_"]["98_staged.png"]
    assert _checksums(figures) == good
    fail.write_text("")
    r = _reproduce(str(path), "--profile", "smoke", "-p", "label=a", "--quiet", env=env)
    assert r.returncode == 1 and str(outputs / "smoke" / "explore" / "label=_a_" / "98_staged.failed.ipynb") in r.stdout
    after = _checksums(outputs / "smoke" / "explore" / "label=_a_")
    assert {k: v for k, v in after.items() if not k.startswith("98_staged.failed")} == explored["label=_a_"]
    assert "98_staged.failed.figures/98_staged.png" in after


# ----------------------------------------------------------------------------- a command line that forgives

def test_version_says_which_fairfl():
    from fairfl import __version__
    r = fairfl("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"fairfl {__version__}", r.stdout + r.stderr


@pytest.mark.parametrize("args, said", [
    (["run", "--confg", "x.yaml"], ["usage: fairfl run", "unrecognized arguments: --confg x.yaml; did you mean --config?"]),
    (["results", "--were", "eps=0.1"], ["usage: fairfl results", "did you mean --where?"]),
    (["reprodce", "00"], ["invalid choice: 'reprodce'", "did you mean reproduce?"]),
])
def test_a_mistyped_flag_or_command_gets_its_commands_usage_and_a_suggestion(args, said):
    r = fairfl(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert all(s in r.stderr for s in said), r.stderr


def test_a_mistyped_yaml_key_or_option_gets_a_suggestion(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("dataset: adult\nmodel: logreg\nround: 3\nlocal: {bacth_size: 10}\n")
    r = fairfl("run", "--config", str(cfg))
    assert r.returncode == 2 and "unknown config keys: round; did you mean 'rounds'?" in r.stderr, r.stderr
    cfg.write_text("dataset: adult\nmodel: logreg\nlocal: {bacth_size: 10}\n")
    r = fairfl("run", "--config", str(cfg))
    assert r.returncode == 2 and "unknown local keys: bacth_size; did you mean 'batch_size'?" in r.stderr, r.stderr
    cfg.write_text("dataset: adult\nmodel: logreg\nalgorithm: {name: fedfv, alpah: 0.5}\n")
    r = fairfl("run", "--config", str(cfg))
    assert r.returncode == 2 and "fedfv: unknown option(s) alpah; did you mean 'alpha'?" in r.stderr, r.stderr


def test_a_broken_import_file_is_one_named_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("from fairfl.federated.algorithms import register\n\nclass Rule(\n")
    r = fairfl("run", "--import", str(broken))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: --import {broken}: {broken}, line 3:"), r.stderr
    raising = tmp_path / "raising.py"
    raising.write_text("x = 1\nraise RuntimeError('not ready yet')\n")
    r = fairfl("run", "--import", str(raising))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"importing it raised RuntimeError: not ready yet ({raising}, line 2)" in r.stderr, r.stderr


def test_results_says_when_a_folder_is_not_a_run_cache(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "papers").mkdir()
    r = fairfl("results", "--root", str(tmp_path), "--prune")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{tmp_path} is not a run cache: none of its 2 folders (papers, photos) is a run's entry" in r.stderr
    assert (tmp_path / "photos").is_dir() and (tmp_path / "papers").is_dir()        # --prune touched nothing
    r = fairfl("results", "--root", str(tmp_path / "typo"))
    assert r.returncode == 2 and "no such folder" in r.stderr, r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert fairfl("results", "--root", str(empty)).returncode == 0              # an empty cache is a cache


def test_outside_its_environment_fairfl_says_where_to_run_it():
    """`python -m fairfl list` with a Python that lacks fairfl's dependencies (here the one this
    environment was made from), in the repository: one line saying which environment runs it."""
    base = getattr(sys, "_base_executable", None)
    if not base or sys.prefix == sys.base_prefix:
        pytest.skip("not in a virtual environment: no other Python at hand")
    if subprocess.run([base, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{base} has torch: it is not outside fairfl's environment")
    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([base, "-m", "fairfl", "list"], capture_output=True, text=True, cwd=repo, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.splitlines()
    assert "is not installed in this Python" in line and "source .venv/bin/activate" in line, line


def test_the_readme_has_one_command_form():
    """The `fairfl` command of the activated .venv throughout, never `python -m fairfl`."""
    import re
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "source .venv/bin/activate" in readme
    assert not re.findall(r"python -m fairfl", readme)
    commands = re.findall(r"^fairfl \w+", readme, flags=re.M)
    assert len(commands) >= 4, commands


# ----------------------------------------------------------------------------- Ctrl-C, however many, whenever

def _session(args, env, **kw):
    """A command in a session of its own: os.killpg(p.pid, SIGINT) is then what a terminal's Ctrl-C does."""
    return subprocess.Popen([sys.executable, "-m", "fairfl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True, **kw)


def _ctrl_c(p, times=1, gap=0.3):
    import signal
    import time
    for i in range(times):
        if i:
            time.sleep(gap)
        try:
            os.killpg(p.pid, signal.SIGINT)
        except ProcessLookupError:          # it has ended already
            break


def _wait_for(condition, timeout, what):
    import time
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.1)


def _no_noise(text):
    for noise in ("Traceback", "Task exception", "ZMQError", "IPKernelApp", "InvalidStateError", "Exception ignored"):
        assert noise not in text, text


LONG_RUN = ["run", "--set", "dataset=adult", "--set", "model=logreg", "--set", "rounds=100000",
            "--set", "local.batch_size=500", "--set", "checkpoint_every=5"]


@pytest.mark.slow
def test_ctrl_c_in_fairfl_run_is_one_line_and_130_however_many_and_whenever(tmp_path):
    """Training, twice in a row, in its first second, and while waiting for another process's run:
    exit status 130 and one line on stderr, no traceback (it printed KeyboardInterrupt's)."""
    from fairfl.base.progress import read
    env = {**os.environ, "FAIRFL_RESULTS": str(tmp_path / "results"), "TQDM_DISABLE": "1"}
    trainer = _session(LONG_RUN, env)
    try:
        _wait_for(lambda: any(read(d) for d in (tmp_path / "results").glob("*") if d.is_dir()), 120, "training")
        waiter = _session(LONG_RUN, env)
        _wait_for(lambda: waiter.stderr.readline().find("being trained by another process") >= 0, 120, "the wait")
        _ctrl_c(waiter)
        _, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 130, err
        _no_noise(err)
        assert err.strip().startswith("interrupted: stopped waiting for fedavg") and \
            f"another process (pid {trainer.pid}) goes on training" in err, err
        assert trainer.poll() is None                                   # the trainer goes on
        _ctrl_c(trainer, times=2, gap=0.05)                             # twice, as an impatient hand does
        out, err = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 130, err
    _no_noise(err)
    (line,) = err.strip().splitlines()
    assert line.startswith("interrupted: fedavg") and " of 100000 rounds; the same command resumes it" in line, line
    for delay in (0.3, 1.0):                                            # importing torch, or loading the data
        import time
        early = _session(LONG_RUN, {**env, "FAIRFL_RESULTS": str(tmp_path / f"early{delay}")})
        time.sleep(delay)
        _ctrl_c(early)
        _, err = early.communicate(timeout=60)
        assert early.returncode == 130, err
        _no_noise(err)
        assert len(err.strip().splitlines()) == 1 and err.strip().startswith("interrupted"), err


def _pool_notebook(path: Path) -> Path:
    """A notebook that sweeps five real runs on a pool of two worker processes (two runs wait beyond
    the pool's queue: the case of notebooks 02 and 03), long enough to be interrupted when ROUNDS is
    large, and records one claim."""
    body = ("import os\n"
            "from fairfl import ExperimentConfig, PartitionSpec, LocalTraining\n"
            "from fairfl.studies.claims import Claims\n"
            "from fairfl.runs.sweeps import ProcessBackend, run_many\n"
            "cfg = ExperimentConfig(dataset='adult', model='logreg', rounds=int(os.environ['ROUNDS']),\n"
            "                       partition=PartitionSpec('attribute', num_clients=2, attribute_values=(0, 1), split=None),\n"
            "                       local=LocalTraining(batch_size=10, lr=0.01), eval_every=1, checkpoint_every=1)\n"
            "print('training', flush=True)\n"
            "with ProcessBackend(workers=2) as backend:\n"
            "    run_many([cfg.replace(seed=s) for s in range(5)], backend=backend, max_group=1, progress=False)\n"
            "claims = Claims('93_pool', profile)\n"
            "claims.check('it ran', True, 'five runs')\n"
            "claims.finish()")
    return _notebook(path, body)


def _tree(pid):
    from processes import children
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ctrl_c_in_reproduce_is_one_line_and_130_however_many_and_whenever(tmp_path):
    """A notebook sweeping five runs on two worker processes: a good run first, then (1) one Ctrl-C
    while it trains: the sweep's own line, counted from what is on disk, reaches the terminal (it was
    only inside the failed notebook), no InvalidStateError from the pool, the last good notebook and
    its claims.json kept (the claims were deleted at the start); (2) two Ctrl-Cs: one line, no
    asyncio or zmq traceback, the kernel and its workers gone; (3) a Ctrl-C in the first second
    (a raw traceback before)."""
    import json
    import time
    nb = _pool_notebook(tmp_path / "93_pool.ipynb")
    out, results = tmp_path / "out", tmp_path / "results"
    env = {**_env_with_progress(tmp_path), "FAIRFL_RESULTS": str(results), "ROUNDS": "1", "FAIRFL_BACKEND": ""}
    args = ["reproduce", str(nb), "--profile", "quick", "--output", str(out)]
    r = subprocess.run([sys.executable, "-m", "fairfl", *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "claims: 1 holds" in r.stdout, r.stdout + r.stderr
    target, claims = out / "quick" / "93_pool.ipynb", out / "quick" / "93_pool.claims.json"
    good, good_claims = target.read_bytes(), claims.read_bytes()

    for times in (1, 2):
        p = _session(args, {**env, "ROUNDS": "100000"})
        first = []
        _wait_for(lambda: first.append(p.stdout.readline()) or first[-1].startswith("training"), 240, "the sweep")
        since = time.time()
        _wait_for(lambda: len([d for d in results.glob("*/progress.json") if d.stat().st_mtime > since]) >= 2, 240,
                  "both workers to train")
        processes = [q for q in _tree(p.pid)]
        _ctrl_c(p, times=times, gap=0.5)
        stdout, stderr = p.communicate(timeout=120)
        stdout = "".join(first) + stdout
        text = stdout + stderr
        assert p.returncode == 130, text
        _no_noise(text)
        said = [line for line in text.splitlines() if line.startswith("interrupted")]
        assert len(said) == 1 and f"the last good one is kept at {target}" in said[0], text
        assert target.read_bytes() == good and claims.read_bytes() == good_claims
        assert (out / "quick" / "93_pool.failed.ipynb").is_file()
        _wait_for(lambda: not any(_alive(q) for q in processes), 30, "the kernel and its workers to end")
        if times == 1:
            entries = [d for d in results.glob("*") if (d / "config.json").is_file()
                       and json.loads((d / "config.json").read_text())["rounds"] == 100000]       # not the good run's
            cached = sum((d / "history.json").is_file() for d in entries)
            stopped = sum((d / "progress.json").is_file() and not (d / "history.json").is_file() for d in entries)
            assert (f"interrupted: {cached} of 5 runs cached, {stopped} running stopped at their checkpoints; "
                    "re-run to resume") in said[0], (said, cached, stopped)
        else:
            assert "stopped at once (a second Ctrl-C)" in said[0], said
    assert json.loads(claims.read_text())["verdicts"]

    p = _session(args, {**env, "ROUNDS": "100000"})
    time.sleep(0.7)                                   # importing papermill: no kernel yet
    _ctrl_c(p)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stdout + stderr
    _no_noise(stdout + stderr)
    assert len([line for line in (stdout + stderr).splitlines() if line.startswith("interrupted")]) == 1, stdout + stderr


# ----------------------------------------------------------------------------- quiet by default

def test_data_require_reports_only_the_datasets_it_requires():
    """What setup.sh runs before `make lab` and `make test`: the required datasets, not three
    "missing" ones that nothing there needs."""
    r = fairfl("data", "--require", "fashion_mnist", "adult", env={"FAIRFL_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["fashion_mnist", "adult"], r.stdout
    assert "missing" not in r.stdout


def test_a_dataset_without_a_test_file_says_so_instead_of_0_test():
    import torch

    from fairfl.federated.data.base import ArrayDataset
    x, y = torch.zeros(5, 80, dtype=torch.long), torch.zeros(5, dtype=torch.long)
    ds = ArrayDataset("shakespeare", x, y, x[:0], y[:0], num_classes=81, source="plays")
    assert "0 test" not in ds.summary()
    assert ds.summary().startswith("shakespeare: 5 samples, no test file (the partition splits each client's into "
                                   "train / val / test), input (80,), 81 classes"), ds.summary()
    assert ArrayDataset("d", x, y, x, y, num_classes=81, source="s").summary().startswith("d: 5 train / 5 test,")


def test_second_order_methods_warn_about_nothing_of_theirs():
    """FedNL's and FedNew's dense Hessians (torch.func.hessian) in a fresh process with FutureWarning
    as an error: torch's deprecation of torch.jit.script, which its jvp decompositions call on first
    use, is not shown (it was, on every FedNL/FedNew run)."""
    code = ("import torch\nfrom torch import nn\nfrom fairfl.training.client import ClientRuntime, flat_params\n"
            "from fairfl.federated.partition import Client\n"
            "torch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))\n"
            "x, y = torch.randn(7, 3), torch.randint(0, 2, (7,))\n"
            "clients = ClientRuntime(model, [Client(x, y, x[:0], y[:0], x[:1], y[:1])], seed=0)\n"
            "print(clients.hessian(flat_params(model), [0]).shape)")
    r = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "torch.Size([1, 26, 26])" and "Warning" not in r.stderr, r.stdout + r.stderr


def test_a_ctrl_c_during_torchs_import_is_held_until_it_ends():
    """A Ctrl-C in a command's first second landed inside ``import torch``, where a KeyboardInterrupt
    raised in Python code that C++ called cannot unwind: "terminate called after throwing an instance
    of 'pybind11::error_already_set'", SIGABRT. The CLI imports torch where a Ctrl-C is held until the
    block ends and then raised: the block runs to its end, the interrupt comes after, the handler is back."""
    import signal
    import time
    from fairfl.cli import interrupts_deferred
    before = signal.getsignal(signal.SIGINT)
    reached = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)                    # the handler has run by now: held, not raised
            reached = True
    assert reached and signal.getsignal(signal.SIGINT) is before
    with interrupts_deferred():                 # no Ctrl-C: nothing raised
        pass
    assert signal.getsignal(signal.SIGINT) is before
