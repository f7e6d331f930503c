"""A newcomer's first steps in a fresh clone (tests/clone.py), without the browser:
`make lab` with arguments, at the repository root."""
from __future__ import annotations

import json
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from clone import environment, fresh_clone
from processes import stop_group


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_passes_its_arguments_and_serves_the_repository_root(tmp_path):
    """`make lab ARGS="--no-browser --ip ... --port ..."` (what a remote server needs) reaches
    jupyter lab, whose file browser is at the repository root (figures/ and, once a notebook ran,
    outputs/ beside notebooks/) and opens in notebooks/. Before, ARGS were ignored and the server
    served notebooks/ only."""
    clone = fresh_clone(tmp_path / "clone")
    port, token = _free_port(), secrets.token_hex(16)
    env = environment(clone, JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
                      JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"))
    log = open(tmp_path / "lab.log", "w")
    p = subprocess.Popen(["make", "lab", f"ARGS=--no-browser --ip=127.0.0.1 --port={port} "
                          f"--IdentityProvider.token={token} --LabApp.news_url= "
                          "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
                         cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 240      # setup.sh's checks first
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/contents?token={token}", timeout=2) as r:
                    names = {item["name"] for item in json.load(r)["content"]}
                    break
            except OSError:
                pass
            assert p.poll() is None and time.time() < deadline, (tmp_path / "lab.log").read_text()[-3000:]
            time.sleep(0.5)
        assert {"notebooks", "figures", "README.md", "Makefile"} <= names, names

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None
        try:
            urllib.request.build_opener(NoRedirect).open(f"{url}/?token={token}", timeout=10)
            where = None
        except urllib.error.HTTPError as e:
            where = e.headers.get("Location")
        assert where is not None and where.split("?")[0].endswith("/lab/tree/notebooks"), where
    finally:
        stop_group(p)
        log.close()


def _run(cmd, cwd, env, timeout=600):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_run_all_and_save_in_jupyterlab_changes_nothing_that_git_or_make_test_sees(tmp_path):
    """In a fresh clone after `bash scripts/setup.sh`: notebook 00 run cell by cell in a kernel and
    saved by Jupyter's contents manager (what Run All and File ▸ Save do in JupyterLab) keeps its
    outputs in the file, while `git status` and `git diff` show nothing and the stored-notebook
    tests of `make test` pass. `normalise_notebooks.py --help` says what it does and changes nothing;
    without the filter, `--check` names the notebook and a rewrite strips it. Before: no filter,
    ` M notebooks/00_tour.ipynb`, tests/test_notebooks.py failed, and --help stripped every notebook."""
    import nbformat
    from jupyter_server.services.contents.filemanager import FileContentsManager
    from nbclient import NotebookClient
    clone = fresh_clone(tmp_path / "clone")
    env = environment(clone, FAIRFL_PROFILE="smoke", FAIRFL_RESULTS=str(tmp_path / "results"),
                      FAIRFL_FIGURES=str(tmp_path / "figures"), TQDM_DISABLE="1", OMP_NUM_THREADS="1")
    r = _run(["bash", "scripts/setup.sh"], clone, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "notebooks: git now stores them without outputs" in r.stdout, r.stdout

    path = clone / "notebooks" / "00_tour.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute(env=env)
    # the contents manager as `make lab` configures it: its post-save hook, here in the saving thread
    from fairfl.notebook import refresh_git_index

    def refresh_now(**kwargs):
        refresh_git_index(**kwargs, wait=True)
    cm = FileContentsManager(root_dir=str(clone))
    cm.post_save_hook = refresh_now
    cm.save({"type": "notebook", "format": "json", "content": nb}, "notebooks/00_tour.ipynb")
    saved = nbformat.read(path, as_version=4)
    assert sum(len(c.get("outputs", [])) for c in saved.cells) >= 4          # the figures, the tables, the header line
    assert _run(["git", "status", "--porcelain"], clone, env).stdout == ""
    assert _run(["git", "diff"], clone, env).stdout == ""
    r = _run([".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_notebooks.py",
              "tests/test_scripts.py", "-k", "00_tour or normalise or stored_python"], clone, env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    before = path.read_bytes()
    r = _run([".venv/bin/python", "scripts/normalise_notebooks.py", "--help"], clone, env)
    assert r.returncode == 0 and r.stdout.startswith("usage: normalise_notebooks.py") and "--check" in r.stdout
    assert path.read_bytes() == before                                      # --help rewrote nothing

    _run(["git", "config", "--unset", "filter.fairfl-notebook.clean"], clone, env)
    r = _run([".venv/bin/python", "scripts/normalise_notebooks.py", "--check"], clone, env)
    assert r.returncode == 1 and r.stdout.strip() == "would change: 00_tour.ipynb", r.stdout + r.stderr
    r = _run([".venv/bin/python", "scripts/normalise_notebooks.py", "notebooks/00_tour.ipynb"], clone, env)
    assert r.returncode == 0 and r.stdout.strip() == "rewritten: 00_tour.ipynb", r.stdout + r.stderr
    assert _run(["git", "diff", "--exit-code", "HEAD"], clone, env).returncode == 0      # the committed file again


def _repo_with_a_notebook(tmp_path):
    """A git repository holding notebooks/00_tour.ipynb under the clean filter (as setup.sh installs
    it), committed; then the file rewritten with outputs (what Run All and save leave), so that git's
    index entry is stale while the committed form is unchanged."""
    import shutil
    import sys
    from pathlib import Path
    import nbformat
    repo = Path(__file__).resolve().parent.parent
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(repo / "notebooks" / "00_tour.ipynb", root / "notebooks")
    (root / ".gitattributes").write_text("*.ipynb filter=fairfl-notebook\n")

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    git("init", "-q")
    git("config", "filter.fairfl-notebook.clean",
        f"{sys.executable} {repo / 'scripts' / 'normalise_notebooks.py'} --clean %f")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "notebook")
    path = root / "notebooks" / "00_tour.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="an output\n" * 50)]
    nb.cells[1].execution_count = 1
    nbformat.write(nb, path)
    assert git("status", "--porcelain").stdout.strip() == "M notebooks/00_tour.ipynb"     # stale: size changed
    return root, path, git


def test_the_save_hook_waits_for_another_git_commands_lock(tmp_path, monkeypatch):
    """JupyterLab saves while another git command (a `git status` in a terminal) holds the index's
    lock: the hook's first `git add` fails on `.git/index.lock`; it retries, and once the lock is
    released the index is refreshed (before: the failure was swallowed and `git status` stayed `M`).
    The lock is released as soon as the hook's first attempt has failed on it (an event, not a sleep)."""
    import threading
    from fairfl.notebook import refresh_git_index
    root, path, git = _repo_with_a_notebook(tmp_path)
    lock = root / ".git" / "index.lock"
    lock.write_text("")
    refused = threading.Event()
    real_run = subprocess.run

    def watching(cmd, *args, **kwargs):                   # the real git, its refusals seen
        done = real_run(cmd, *args, **kwargs)
        if list(cmd[:2]) == ["git", "add"] and done.returncode and "index.lock" in done.stderr:
            refused.set()
        return done
    monkeypatch.setattr(subprocess, "run", watching)
    hook = threading.Thread(target=refresh_git_index, args=(str(path), {"type": "notebook"}),
                            kwargs={"wait": True, "lock_wait": 600})
    hook.start()
    assert refused.wait(timeout=600), "the hook never tried git add"
    lock.unlink()
    hook.join(timeout=600)
    assert not hook.is_alive()
    assert git("status", "--porcelain").stdout == ""


def test_the_save_hook_says_in_the_servers_log_when_it_cannot_refresh_the_index(tmp_path, caplog):
    """A lock that is never released: the hook gives up after its wait and says so in the server's
    log (the contents manager's logger), with the command that fixes it; the save is not failed."""
    import logging
    from types import SimpleNamespace
    from fairfl.notebook import refresh_git_index
    root, path, git = _repo_with_a_notebook(tmp_path)
    (root / ".git" / "index.lock").write_text("")
    server = SimpleNamespace(log=logging.getLogger("jupyter-server-test"))
    with caplog.at_level(logging.WARNING, logger="jupyter-server-test"):
        refresh_git_index(str(path), {"type": "notebook"}, contents_manager=server, wait=True, lock_wait=0.5)
    (record,) = [r for r in caplog.records if r.name == "jupyter-server-test"]
    text = record.getMessage()
    assert "index.lock" in text and f"git add {path}" in text and str(path) in text
    (root / ".git" / "index.lock").unlink()
    assert git("status", "--porcelain").stdout.strip() == "M notebooks/00_tour.ipynb"      # as the message says
