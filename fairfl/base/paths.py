"""Where things live. Every path is anchored, never taken from the working directory (papermill
runs a notebook in the caller's directory, nbval in the notebook's):

* **From fairfl's own clone** (``bash scripts/setup.sh``'s editable install, or the source tree on
  ``sys.path``): the folders beside the package, ``<repo>/data``, ``results``, ``figures``,
  ``outputs`` and ``notebooks``, as the README describes.
* **Installed like a library** (``pip install fairfl`` or ``pip install .`` into an environment of
  your own): never inside the package, so that recreating the environment loses nothing. Runs,
  data, figures and executed notebooks go to one folder of the user's, ``$FAIRFL_HOME``, else the
  platform's user data folder (``platformdirs``: ``~/.local/share/fairfl`` on Linux,
  ``~/Library/Application Support/fairfl`` on macOS), said once on stderr when it is first made.
  The notebooks ship inside the package (``fairfl/notebooks``), so ``fairfl list`` and ``fairfl
  reproduce`` work from a plain install.

In both, ``$FAIRFL_DATA``, ``$FAIRFL_RESULTS``, ``$FAIRFL_FIGURES`` and ``$FAIRFL_OUTPUTS`` win.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent      # fairfl/ (this module is fairfl/base/paths.py)
REPO_ROOT = PACKAGE.parent
HOME_ENV = "FAIRFL_HOME"


def from_clone() -> bool:
    """Whether fairfl runs from its own repository (the package folder beside the project's
    ``pyproject.toml`` and ``notebooks/``), rather than from an installed copy."""
    project = REPO_ROOT / "pyproject.toml"
    try:
        return (REPO_ROOT / "notebooks").is_dir() and 'name = "fairfl"' in project.read_text()
    except OSError:
        return False


_ANNOUNCED = threading.Event()


def user_home() -> Path:
    """An installed fairfl's folder: ``$FAIRFL_HOME``, else the platform's user data folder for
    fairfl. Made, and said on stderr, the first time it is used."""
    given = os.environ.get(HOME_ENV)
    if given:
        return Path(given).expanduser().resolve()
    import platformdirs
    home = Path(platformdirs.user_data_dir("fairfl", appauthor=False))
    if not home.exists() and not _ANNOUNCED.is_set():
        _ANNOUNCED.set()
        print(f"fairfl: runs, data, figures and executed notebooks of this installation go to {home} "
              f"(set {HOME_ENV} to choose another folder)", file=sys.stderr)
    return home


def _default(name: str) -> Path:
    return REPO_ROOT / name if from_clone() else user_home() / name


def _env_path(var: str, name: str) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else _default(name)


def data_root() -> Path:
    """Datasets: ``$FAIRFL_DATA``, else ``<repo>/data`` (an installed fairfl: ``<home>/data``)."""
    return _env_path("FAIRFL_DATA", "data")


def results_root() -> Path:
    """The run cache (one folder per config hash): ``$FAIRFL_RESULTS``, else ``<repo>/results``
    (an installed fairfl: ``<home>/results``)."""
    return _env_path("FAIRFL_RESULTS", "results")


def figures_root() -> Path:
    """Figures written by notebooks: ``$FAIRFL_FIGURES``, else ``<repo>/figures`` (an installed
    fairfl: ``<home>/figures``)."""
    return _env_path("FAIRFL_FIGURES", "figures")


def outputs_root() -> Path:
    """Executed copies of notebooks: ``$FAIRFL_OUTPUTS``, else ``<repo>/outputs`` (an installed
    fairfl: ``<home>/outputs``)."""
    return _env_path("FAIRFL_OUTPUTS", "outputs")


def notebooks_root() -> Path:
    """The notebooks: ``<repo>/notebooks``, or those shipped inside an installed package."""
    return REPO_ROOT / "notebooks" if from_clone() else PACKAGE / "notebooks"


# Set by `fairfl reproduce -p ...` for its kernels: the folder its executed notebooks go to
# (outputs/<profile>/explore/<its settings>/, or under --output), where the exploration's figures go too.
EXPLORE_ENV = "FAIRFL_EXPLORE_DIR"
# Set by `fairfl reproduce` for its kernels: the folder a notebook's figures and tables are written to
# while it runs, moved into place only once it has run to its end (fairfl.studies.notebook.Session)
STAGING_ENV = "FAIRFL_FIGURES_STAGING"
# the file in a staging folder that says where its figures go (written by the kernel, read by reproduce)
DESTINATION = ".destination"


def exploration_name(settings: dict) -> str:
    """The folder name of an exploration: its settings, ``rounds=3`` or ``rounds=3,seeds=[0,1]``
    (sorted by name; characters a file name should not hold become ``_``; a long one is cut and
    ends in a hash of the whole, so two explorations never share a folder)."""
    import hashlib
    import json
    text = ",".join(f"{k}={json.dumps(v, sort_keys=True, separators=(',', ':'), default=str)}"
                    for k, v in sorted(settings.items()))
    safe = "".join(c if c.isalnum() or c in "=,.-[]" else "_" for c in text) or "explore"
    if len(safe) > 80:
        safe = f"{safe[:64]}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return safe


def exploring_dir(profile: str, settings: dict | None = None) -> Path:
    """Where an exploration (settings that differ from the profile's) writes its figures: beside its
    executed notebooks, ``$FAIRFL_EXPLORE_DIR`` when ``fairfl reproduce -p`` set it, else
    ``outputs/<profile>/explore/<its settings>/`` (:func:`exploration_name`): each exploration its
    own folder, so a second one never replaces the first's figures."""
    given = os.environ.get(EXPLORE_ENV)
    if given:
        return Path(given)
    return outputs_root() / profile / "explore" / exploration_name(settings or {})
