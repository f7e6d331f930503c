"""`make lab`'s save hook, which keeps `git status` clean after Run All and save. What a newcomer
does in a fresh clone (`make lab` with arguments, Run All and save, the stored-notebook tests and
the clean filter afterwards) is one browser session: tests/test_jupyterlab.py's first afternoon."""
from __future__ import annotations

import subprocess


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
    from fairfl.studies.notebook import refresh_git_index
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
    from fairfl.studies.notebook import refresh_git_index
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
