"""The stored notebooks' structure (their execution is nbval's job in `make test`; notebook 06's is
:func:`smoke06`'s, below, which checks what it writes too).

What is checked is what git stores (``fairfl.studies.notebook.committed_form``): with the clean filter that
scripts/setup.sh installs, a notebook run and saved in JupyterLab keeps its outputs in the file and
git stores it without them, so a Run All fails none of these."""
import platform
import warnings
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid_clean_and_parameterised(path):
    from fairfl.studies.notebook import committed_form
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # e.g. a cell without an id (nbformat ≥ 4.5)
        nb = nbformat.reads(committed_form(path), as_version=4)
        nbformat.validate(nb)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "profile = " in params[0].source, "exactly one parameters cell, with the profile"
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), \
        "notebooks are stored without outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_checks_its_claims_through_its_session(path):
    # session.claims knows which settings the parameters cell overrode (then nothing is checked)
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "session.claims(" in source and "claims.finish()" in source and "Claims(" not in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_as_jupyterlab_saves_it(path):
    """Opening a stored notebook in JupyterLab must not change it: JupyterLab sets the kernel's
    kernelspec and language_info and the server writes with nbformat.write, so the stored text is
    already that (fix with `python scripts/normalise_notebooks.py`, or let git do it: scripts/setup.sh
    installs the clean filter)."""
    from fairfl.studies.notebook import committed_form, stored_form
    text = committed_form(path)
    assert text == stored_form(text), (f"{path.name} differs from its stored form: run scripts/normalise_notebooks.py "
                                       "(or bash scripts/setup.sh, which installs git's clean filter for the notebooks)")
    nb = nbformat.reads(text, as_version=4)
    assert nb.nbformat == 4 and nb.nbformat_minor == 5 and all(c.get("id") for c in nb.cells)


def test_the_stored_python_version_is_kept_unless_another_is_asked_for():
    """JupyterLab writes the kernel's Python version into language_info (tests/test_jupyterlab.py):
    normalising on another patch version must not restamp every notebook, and the browser test
    stamps its copy with the kernel's version."""
    import json

    from fairfl.studies.notebook import stored_form
    stored = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    stored["metadata"]["language_info"]["version"] = "3.11.2"
    text = json.dumps(stored)
    assert json.loads(stored_form(text))["metadata"]["language_info"]["version"] == "3.11.2"
    assert json.loads(stored_form(text, python_version="3.11.9"))["metadata"]["language_info"]["version"] == "3.11.9"
    del stored["metadata"]["language_info"]
    assert json.loads(stored_form(json.dumps(stored)))["metadata"]["language_info"]["version"] \
        == platform.python_version()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_jupyter_servers_load_and_save_leave_the_stored_notebook_unchanged(path, tmp_path):
    """What JupyterLab's autosave does on the server: load the notebook into a model and save it."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    from fairfl.studies.notebook import committed_form
    stored = committed_form(path).encode("utf-8")
    (tmp_path / path.name).write_bytes(stored)
    cm = FileContentsManager(root_dir=str(tmp_path))
    cm.save(cm.get(path.name, content=True, type="notebook"), path.name)
    assert (tmp_path / path.name).read_bytes() == stored


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_first_output_of_every_notebook_is_its_header_line(path):
    """Nothing before the cell that calls start() prints (the parameters cell holds values), and
    start() is told the notebook's name, so its first output says the profile and the time it is
    expected to take (fairfl.studies.notebook.header_line)."""
    import ast
    from fairfl.studies.notebook import committed_form
    cells = [c for c in nbformat.reads(committed_form(path), as_version=4).cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(cells) if "start(" in c.source)
    for cell in cells[:first]:
        assert all(isinstance(node, ast.Assign) for node in ast.parse(cell.source).body), cell.source
    calls = [node for node in ast.walk(ast.parse(cells[first].source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "start"]
    (call,) = calls
    assert {k.arg: getattr(k.value, "value", None) for k in call.keywords}.get("notebook") == path.stem
    lines = cells[first].source.splitlines()
    printing = [line for line in lines[:next(i for i, line in enumerate(lines) if "start(" in line)] if "print(" in line]
    assert not printing, printing


def test_start_says_the_profile_and_the_expected_time_in_one_line(monkeypatch, capsys, tmp_path):
    """Run All in JupyterLab runs quick unless told otherwise: the first line says so, how to choose
    smoke, and how long the notebook is expected to take, as `fairfl reproduce` announces it."""
    from fairfl.cli import expected_time
    from fairfl.studies.notebook import start
    profiles = {"smoke": {"rounds": 2, "seeds": [0]}, "quick": {"rounds": 100, "seeds": [0, 1]}}
    for var in ("FAIRFL_PROFILE", "FAIRFL_EXPLORE_DIR", "FAIRFL_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FAIRFL_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("FAIRFL_OUTPUTS", str(tmp_path / "outputs"))
    start(None, profiles, notebook="00_tour")
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith('00_tour: profile quick (the default; profile = "smoke" in the parameters cell runs in '
                           f'seconds), expected {expected_time("00_tour", "quick")}; figures -> {tmp_path / "figures"}; '
                           "settings rounds=100, seeds=[0, 1], device=cpu"), line
    assert "about 3 min on 2 CPU cores, no GPU" in line
    monkeypatch.setenv("FAIRFL_PROFILE", "smoke")
    start(None, profiles, notebook="00_tour")
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("00_tour: profile smoke (from $FAIRFL_PROFILE), expected about 19 s on 2 CPU cores"), line
    start("smoke", profiles, notebook="00_tour", rounds=3)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("00_tour: profile smoke, expected not measured (settings changed); exploring rounds=3 "
                           "(profile: 2): the paper's claims are recorded as not checked; "
                           f"figures -> {tmp_path / 'outputs' / 'smoke' / 'explore'}"), line


# ----------------------------------------------------------------------------- notebook 06's outputs

@pytest.fixture(scope="module")
def smoke06(tmp_path_factory):
    """Notebook 06 executed in its smoke profile, as `fairfl reproduce` runs it, into a fresh results and figures
    folder: {"figures": its figures folder, "out": the folder of the executed notebook and its claims.json}.
    This is `make test`'s execution of notebook 06, which the Makefile leaves out of nbval: every cell runs here,
    and a cell that raises fails `reproduce` and so this fixture (the browser test runs it a second time, as
    stored, in JupyterLab)."""
    import os
    import subprocess
    import sys
    root = tmp_path_factory.mktemp("smoke06")
    env = {**os.environ, "FAIRFL_RESULTS": str(root / "results"), "FAIRFL_FIGURES": str(root / "figures"),
           "TQDM_DISABLE": "1"}
    r = subprocess.run([sys.executable, "-m", "fairfl", "reproduce", "06", "--profile", "smoke", "--quiet",
                        "--output", str(root / "out")], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"figures": root / "figures" / "smoke", "out": root / "out"}


def _readme_block(marker: str) -> str:
    import re
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(rf"<!-- {marker} -->\n```python\n(.*?)```\n<!-- /{marker} -->", readme, flags=re.S)
    return block


def test_06_readme_snippet_recreates_the_tables_from_the_smoke_csvs(smoke06, tmp_path, monkeypatch):
    """The README's pandas lines, run on the CSV files the smoke profile wrote: the pivoted table is the
    notebook's (protocol.wide of the same rows), and the per-run numbers recomputed from the long file's clients
    give the summary's means over seeds."""
    import shutil

    import numpy as np
    import pandas as pd

    from fairfl.studies import protocol
    (tmp_path / "figures").mkdir()
    for name in ("06_one_protocol.csv", "06_one_protocol_runs.csv.gz"):
        shutil.copy(smoke06["figures"] / name, tmp_path / "figures" / name)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    block = _readme_block("notebook-06-tables")
    mine = 'federation, track = "FMNIST, Dirichlet", "personal"'          # smoke has no Adult; both tracks speak here
    exec(block.replace('federation, track = "Adult", "global"', mine), scope)
    assert scope["federation"] == "FMNIST, Dirichlet"
    summary = protocol.read_table(tmp_path / "figures" / "06_one_protocol.csv")
    assert summary.attrs["protocol"] == "6.3" and set(summary.scored) >= {"global", "personal", "averaged iterate"}
    one = summary[(summary.federation == "FMNIST, Dirichlet") & (summary.track == "personal")]
    expected = protocol.wide(one)[list(protocol.REPORTED)]
    assert list(expected.index) == ["FedAvg-FT", "Local-only", "Ditto"]
    got = scope["table"].loc[expected.index, list(protocol.REPORTED)]
    assert (got.values == expected.values).all()
    means = scope["means"]
    rows = summary[(summary.criterion == "mean") & summary.metric.isin(["mean", "std"])]
    assert len(rows) > 20
    for r in rows.itertuples():
        assert means.loc[(r.federation, r.method), r.metric] == pytest.approx(r.mean, abs=1e-3), r
    assert np.isfinite(means.values).all() and isinstance(means, pd.DataFrame)


def test_06_results_command_reads_its_csvs_and_its_claims_record_verdicts(smoke06):
    import json
    import subprocess
    import sys
    summary = smoke06["figures"] / "06_one_protocol.csv"
    r = subprocess.run([sys.executable, "-m", "fairfl", "results", str(summary), "--where", "federation=FMNIST, Dirichlet",
                        "metric=mean"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "table=summary schema=3 protocol=6.3" in r.stdout and "FedAvg-FT" in r.stdout and "Shakespeare" not in r.stdout
    r = subprocess.run([sys.executable, "-m", "fairfl", "results", str(smoke06["figures"] / "06_one_protocol_runs.csv.gz"),
                        "--format", "csv", "--where", "split=val", "seed=100"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("# fairfl table=runs schema=2 protocol=6.3"), r.stderr
    # the claims: every claim on every federation, Shakespeare (a constant predictor at smoke size) not judged
    verdicts = json.loads((smoke06["out"] / "smoke" / "06_one_protocol.claims.json").read_text())["verdicts"]
    assert len(verdicts) == 4 * 3 and {v["status"] for v in verdicts} == {"not checked"}
    claims = {v["claim"]: v["evidence"] for v in verdicts}
    assert all("not judged" in e for c, e in claims.items() if c.endswith("— Shakespeare"))
