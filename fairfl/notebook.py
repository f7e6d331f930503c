"""Small helpers every notebook calls right after its ``parameters`` cell."""
from __future__ import annotations

import os
from pathlib import Path

from .claims import PROFILES
from .errors import ConfigError
from .paths import figures_root


def resolve_profile(profile: str) -> str:
    """The profile to run: ``$FAIRFL_PROFILE`` when set (nbval cannot inject parameters, so CI
    runs the stored notebooks with ``FAIRFL_PROFILE=smoke``), else the parameter."""
    profile = os.environ.get("FAIRFL_PROFILE", profile)
    if profile not in PROFILES:
        raise ConfigError(f"profile {profile!r} is not one of {', '.join(PROFILES)}")
    return profile


def figure_dir(profile: str) -> Path:
    """Where a notebook's figures go: ``figures/`` for quick and paper, ``figures/smoke/`` for
    smoke (a CI run never overwrites the real figures)."""
    return figures_root() / "smoke" if profile == "smoke" else figures_root()


def setup(profile: str) -> str:
    """Resolve the profile and apply the plotting style; returns the profile."""
    from .plotting import use_style
    profile = resolve_profile(profile)
    use_style()
    return profile
