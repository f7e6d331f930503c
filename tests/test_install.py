"""fairfl installs into a researcher's own environment: a wheel built from the checkout (no
editable install, no requirements.txt), installed with pip, gives a `fairfl` that runs, keeping the
environment's torch, and that writes nothing inside the environment.

Installing for real would download or unpack gigabytes (the pinned torch is a 5 GB CUDA build),
so the environment is assembled from this one's installed packages instead, which is what pip
would install if the index offered the pinned versions: a fresh virtual environment (no packages
of its own) whose site-packages adds a folder of links to exactly the pinned torch and the
dependencies pyproject.toml declares (with the ``notebooks`` extra), each with what it requires in
turn (read from their installed metadata), and setuptools to build with. Then, offline: pip's
resolver, asked to install fairfl with its dependencies (`--dry-run --report`), would install
fairfl alone (the declared ranges admit every pin, so torch is kept); the wheel installs and `pip
check` succeeds; `fairfl run` trains a run from a small YAML (which it could not if a module it
imports were not declared), `fairfl list` finds the notebooks shipped in the package, and `fairfl
reproduce 00 --profile smoke` executes the tour; the runs, data, figures and executed notebook land
in the user's folder (``fairfl.base.paths``), and no file under the environment changed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent


def _declared() -> tuple[list[Requirement], dict[str, list[Requirement]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return ([Requirement(r) for r in project["dependencies"]],
            {k: [Requirement(r) for r in v] for k, v in project.get("optional-dependencies", {}).items()})


def _pins() -> dict[str, str]:
    out = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[canonicalize_name(Requirement(name).name)] = version.strip()
    return out


def test_every_pin_lies_in_its_declared_range_and_every_declared_package_is_pinned():
    """requirements.txt reproduces the figures; pyproject.toml's ranges are what the package
    needs. The pins must be an installation the ranges allow, torch from 2.11 on among them; and
    `dependencies = []` (a fairfl that failed at its first import) is not a declaration."""
    core, extras = _declared()
    pins = _pins()
    assert core, "pyproject.toml declares no dependencies"
    assert {"notebooks", "ray", "flower"} <= set(extras), sorted(extras)
    for requirement in core + [r for group in extras.values() for r in group]:
        name = canonicalize_name(requirement.name)
        if name in pins:
            assert requirement.specifier.contains(pins[name], prereleases=True), (str(requirement), pins[name])
        else:
            assert requirement in extras.get("test", []), f"{requirement} is declared but not pinned in requirements.txt"
    torch = next(r for r in core if r.name == "torch")
    assert torch.specifier.contains("2.11.0") and not torch.specifier.contains("2.10.0"), torch


def _closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions these requirements need, with what those need in turn (markers
    evaluated for this Python, extras followed)."""
    env, seen, todo = default_environment(), set(), [(r, "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        dist = metadata.distribution(name)
        assert requirement.specifier.contains(dist.version, prereleases=True), (str(requirement), dist.version)
        key = (name, tuple(sorted(requirement.extras)))
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or []:
            inner = Requirement(text)
            for wanted in ("", *requirement.extras):
                if inner.marker is None or inner.marker.evaluate({**env, "extra": wanted}):
                    todo.append((inner, wanted))
                    break
    return {name for name, _ in seen}


def _link_farm(names: set[str], folder: Path) -> None:
    """Links to each installed distribution's top-level files and folders (and its metadata)."""
    folder.mkdir(parents=True)
    for name in names:
        dist = metadata.distribution(name)
        for top in {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            target = folder / top
            source = Path(dist.locate_file(top))
            if source.exists() and not target.exists():
                target.symlink_to(source)


def _pip(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
                           *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (links not followed) with its size and modification time."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), folder)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.slow
def test_a_wheel_installed_into_an_environment_with_the_pinned_torch_runs_and_reproduces_outside_it(tmp_path):
    core, extras = _declared()
    source = tmp_path / "fairfl-src"                      # the tracked files, as a clone or an sdist holds them
    for name in filter(None, subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                                            text=True, check=True).stdout.split("\0")):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():                   # fairfl/notebooks -> ../notebooks, as git checks it out
            (source / name).symlink_to(os.readlink(REPO / name))
        elif (REPO / name).is_file():
            (source / name).write_bytes((REPO / name).read_bytes())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    needed = _closure(core + extras["notebooks"]) | _closure([Requirement("setuptools>=68")])
    _link_farm(needed, tmp_path / "installed")
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "installed.pth").write_text(f"import site; site.addsitedir({str(tmp_path / 'installed')!r})\n")
    assert "fairfl" not in needed and "papermill" in needed, sorted(needed)

    # pip's resolver, offline: what `pip install .` would install here is fairfl alone
    report = tmp_path / "report.json"
    r = _pip(python, "install", "--dry-run", "--no-index", "--no-build-isolation", "--report", str(report),
             str(source), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    would = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    from fairfl import __version__
    assert would == {"fairfl": __version__}, would                       # torch (and everything else) kept

    r = _pip(python, "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-w", str(tmp_path / "dist"),
             str(source), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("fairfl-*.whl")
    r = _pip(python, "install", "--no-deps", "--no-index", str(wheel), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _pip(python, "check", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    before = _tree(venv)

    config = tmp_path / "small.yaml"
    config.write_text("dataset: fashion_mnist\ndataset_options: {classes: [0, 1, 2]}\nmodel: logreg\n"
                      "partition: {scheme: iid, num_clients: 4}\nlocal: {batch_size: 100, lr: 0.05}\n"
                      "rounds: 2\nclients_per_round: 2\n")
    home = tmp_path / "user"                              # the user's home: where the platform's data folder is
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "XDG_DATA_HOME") and not k.startswith("FAIRFL_")}
    env.update(HOME=str(home), TQDM_DISABLE="1", FAIRFL_OFFLINE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
    fairfl = str(venv / "bin" / "fairfl")
    work = tmp_path / "work"                              # the researcher's working directory
    work.mkdir()

    def fairfl_says(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([fairfl, *args], capture_output=True, text=True, cwd=work, env=env, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    ran = fairfl_says("run", "--config", str(config))
    assert "2 rounds in" in ran.stdout and "final client accuracy (%)" in ran.stdout, ran.stdout
    folder = home / ".local" / "share" / "fairfl"
    assert f"go to {folder}" in ran.stderr, ran.stderr        # said at first use
    listed = fairfl_says("list").stdout
    assert "00_tour" in listed and "06_one_protocol" in listed, listed
    done = fairfl_says("reproduce", "00", "--profile", "smoke")
    assert "ok      00_tour.ipynb" in done.stdout, done.stdout
    assert f"go to {folder}" not in done.stderr                 # said once, at the folder's first use
    assert (folder / "outputs" / "smoke" / "00_tour.ipynb").is_file()
    assert (folder / "figures" / "smoke" / "00_tour_curves.png").is_file()
    assert any((folder / "results").glob("*/history.json")) and any((folder / "data").iterdir())
    assert _tree(venv) == before, sorted(set(_tree(venv).items()) ^ set(before.items()))[:10]
    assert not any(work.iterdir())                            # nor in the working directory

    r = subprocess.run([str(python), "-c", "import fairfl, torch; print(fairfl.__file__, torch.__version__)"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    installed, torch_version = r.stdout.split()
    import torch
    assert installed.startswith(str(site)) and torch_version == torch.__version__, r.stdout     # this one's torch, kept


def test_setup_installs_fairfl_without_setuptools_box(tmp_path):
    """scripts/setup.sh's editable install of fairfl, as setup.sh runs it: no ten-line box from
    setuptools ("Editable installation. !! **** Please be careful with folders ...")."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    (line,) = [x for x in setup.splitlines() if re.search(r"pip_install .*-e \.", x)]
    quiet = re.search(r'PYTHONWARNINGS="([^"]+)"', line)
    assert quiet, line
    source = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "fairfl/__init__.py", "fairfl/base/errors.py"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((REPO / name).read_bytes())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    _link_farm(_closure([Requirement("setuptools>=68")]), tmp_path / "installed")
    (site / "setuptools.pth").write_text(f"import site; site.addsitedir({str(tmp_path / 'installed')!r})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", "--no-build-isolation", "-e", str(source)],
                       capture_output=True, text=True, env={**env, "PYTHONWARNINGS": quiet.group(1)}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Editable installation" not in r.stdout + r.stderr and "!!" not in r.stdout + r.stderr, r.stdout + r.stderr
