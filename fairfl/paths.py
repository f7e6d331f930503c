"""Where things live. Every path is anchored to the repository root, never to the working
directory: papermill runs a notebook in the caller's directory, nbval in the notebook's."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _env_path(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else default


def data_root() -> Path:
    """Datasets: ``$FAIRFL_DATA`` or ``<repo>/data``."""
    return _env_path("FAIRFL_DATA", REPO_ROOT / "data")


def results_root() -> Path:
    """The run cache (one folder per config hash): ``$FAIRFL_RESULTS`` or ``<repo>/results``."""
    return _env_path("FAIRFL_RESULTS", REPO_ROOT / "results")


def figures_root() -> Path:
    """Figures written by notebooks: ``$FAIRFL_FIGURES`` or ``<repo>/figures``."""
    return _env_path("FAIRFL_FIGURES", REPO_ROOT / "figures")


def notebooks_root() -> Path:
    return REPO_ROOT / "notebooks"


def outputs_root() -> Path:
    """Executed copies of notebooks: ``$FAIRFL_OUTPUTS`` or ``<repo>/outputs``."""
    return _env_path("FAIRFL_OUTPUTS", REPO_ROOT / "outputs")


# Set by `fairfl reproduce -p ...` for its kernels: the folder its executed notebooks go to
# (outputs/<profile>/explore/, or under --output), where the exploration's figures go too.
EXPLORE_ENV = "FAIRFL_EXPLORE_DIR"


def exploring_dir(profile: str) -> Path:
    """Where an exploration (settings that differ from the profile's) writes its figures: beside its
    executed notebooks, ``$FAIRFL_EXPLORE_DIR`` when ``fairfl reproduce -p`` set it, else
    ``outputs/<profile>/explore/``."""
    given = os.environ.get(EXPLORE_ENV)
    return Path(given) if given else outputs_root() / profile / "explore"
