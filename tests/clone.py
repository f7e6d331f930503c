"""A fresh clone of this working tree, for the tests that follow a newcomer's first steps (the
README's `bash scripts/setup.sh`, `make lab`, `git status` after a session in JupyterLab).

The clone holds the tracked files of the working tree as they are now (committed or not) in a
new git repository with one commit, as `git clone` of them would. Its ``.venv`` is this test's own
Python environment, seen through a venv of its own (its ``pyvenv.cfg``, a ``site-packages`` whose
``.pth`` adds this environment's), stamped as installed for the clone's requirements: so
``scripts/setup.sh`` runs every step but pip's (installing the pinned torch, a 5 GB CUDA build, is
what this saves; ``tests/test_install.py`` checks the install), and a pip that ran anyway would
write into the clone, never into the shared environment.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def fresh_clone(dest: Path) -> Path:
    """The tracked files of the working tree, committed in a new repository at ``dest``, with a
    ``.venv`` as described in the module's docstring. Returns ``dest``."""
    files = git(REPO, "ls-files", "-z").split("\0")
    dest.mkdir(parents=True)
    for name in filter(None, files):
        source = REPO / name
        target = dest / name
        if source.is_symlink():                            # a tracked link (fairfl/notebooks): a link, as git checks it out
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(source))
            continue
        if not source.exists():                            # a file deleted, not committed
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "-c", "user.name=test", "-c", "user.email=test@example.org", "add", "-A")
    git(dest, "-c", "user.name=test", "-c", "user.email=test@example.org", "commit", "-q", "-m", "fresh clone")
    _venv(dest / ".venv")
    _stamp(dest)
    return dest


def _venv(venv: Path) -> None:
    shared = Path(sys.prefix)
    (venv / "bin").mkdir(parents=True)
    cfg = (shared / "pyvenv.cfg").read_text()
    (venv / "pyvenv.cfg").write_text(cfg)
    base = Path(re.search(r"^executable\s*=\s*(.+)$", cfg, re.M).group(1).strip()) if "executable" in cfg \
        else Path(os.path.realpath(sys.executable))
    for entry in (shared / "bin").iterdir():
        link = venv / "bin" / entry.name
        if entry.name.startswith("python"):
            link.symlink_to(base)           # this venv's own interpreter: its pyvenv.cfg makes .venv its prefix
        elif not entry.name.startswith("activate") and not entry.name.startswith("Activate"):
            link.symlink_to(entry)          # the environment's scripts (jupyter, fairfl, ...), as they are
    site = venv / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    site.mkdir(parents=True)
    # addsitedir also reads that folder's own .pth files (the packages that need one)
    (site / "shared-environment.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")


def _stamp(clone: Path) -> None:
    """The stamp setup.sh writes after installing, computed by setup.sh's own line."""
    setup = (clone / "scripts" / "setup.sh").read_text()
    stamp = re.search(r"^stamp=(.+)$", setup, re.M).group(1).strip()
    want = re.search(r"^want=(.+)$", setup, re.M).group(1).strip()
    value = subprocess.run(["bash", "-c", f"echo {want}"], cwd=clone, check=True, capture_output=True,
                           text=True).stdout.strip()
    (clone / stamp).write_text(value + "\n")


def environment(clone: Path, **extra: str) -> dict[str, str]:
    """The environment of a shell in the clone with its .venv first on PATH (as after
    `source .venv/bin/activate`), importing the clone's fairfl."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(clone / ".venv")
    env["PYTHONPATH"] = str(clone)
    env.update(extra)
    return env
