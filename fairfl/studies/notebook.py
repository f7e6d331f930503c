"""What every notebook does, once: the profile header, sweeps keyed by named factors, tables
over seeds, and the paper's numbers beside ours.

    session = start(profile, PROFILES, seeds=seeds, rounds=rounds, workers=workers)
    runs = session.sweep(config, eps=session["eps"], iid=[True, False], seed=session["seeds"])
    runs.groups("eps", iid=False)                 # {ε: [History per seed]} for plotting.curves
    runs.summary("eps", loss=final_train_loss)    # mean and std over the seeds
    beside(runs.frame(...), paper.FEDMGDA_TABLE7, on=["method", "bias"], metrics=[...])
    session.save(fig, "01_fedmgda_eps")
"""
from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from fairfl.base.profiles import PROFILES
from fairfl.base.errors import ConfigError
from fairfl.base.paths import DESTINATION, EXPLORE_ENV, STAGING_ENV, exploring_dir, figures_root


def resolve_profile(profile: str | None) -> str:
    """The profile to run. One rule everywhere: what is given explicitly beats the environment.
    A notebook's ``profile`` parameter is stored as None, which means ``$FAIRFL_PROFILE`` when set
    (nbval cannot inject parameters, so CI runs the stored notebooks with ``FAIRFL_PROFILE=smoke``),
    else quick; a profile written in the parameters cell (JupyterLab) or passed by papermill
    (``fairfl reproduce --profile``) is used as it is."""
    source = "profile"
    if profile is None:
        profile, source = os.environ.get("FAIRFL_PROFILE", "quick"), "FAIRFL_PROFILE"
    if profile not in PROFILES:
        raise ConfigError(f"{source}={profile!r} is not one of {', '.join(PROFILES)}")
    return profile


def figure_dir(profile: str, exploring: bool = False, settings: dict | None = None) -> Path:
    """Where a notebook's figures go: ``figures/`` for quick and paper, ``figures/smoke/`` for
    smoke (a CI run never overwrites the real figures), and :func:`exploring_dir` for a run
    whose settings differ from its profile's (``-p``, or an edited parameters cell; ``settings``:
    those that differ, which name its folder): an exploration never replaces a reproduced figure."""
    if exploring:
        return exploring_dir(profile, settings)
    return figures_root() / "smoke" if profile == "smoke" else figures_root()


# ----------------------------------------------------------------------------- the header

@dataclass
class Session:
    """A notebook's profile, its settings (the profile's, with the parameters cell's overrides),
    where its figures go, the backend its sweeps run on and the device they train on."""

    profile: str
    settings: dict[str, Any]
    figures: Path                    # where the notebook writes its figures and tables now
    backend: Any
    device: str = "cpu"
    overridden: dict[str, tuple[Any, Any]] = field(default_factory=dict)   # {setting: (profile's, this run's)}
    # where they end up: ``figures`` itself, or, under ``fairfl reproduce``, the folder its staging
    # folder (``figures``) is moved into once the notebook has run to its end
    destination: Path | None = None

    def __getitem__(self, key: str) -> Any:
        return self.settings[key]

    @property
    def parts(self) -> tuple[str, ...]:
        """The parts of the notebook this run runs (its profile's ``parts``, or those chosen)."""
        return tuple(self.settings.get("parts") or ())

    def claims(self, notebook: str):
        """The notebook's :class:`~fairfl.studies.claims.Claims`: checked strictly on the profile's own
        settings, recorded as not checked when the parameters cell overrode some of them."""
        from .claims import Claims
        return Claims(notebook, self.profile, self.overridden)

    def save(self, fig, name: str) -> None:
        """Write the figure as ``<figures>/<name>.png`` and ``.pdf`` (atomically), the PNG stamped
        with the profile and the machine (``fairfl.studies.plotting.figure_stamp`` reads them back)."""
        from fairfl.training.engine.cores import describe_machine
        from .plotting import save_figure
        save_figure(fig, name, self.figures, provenance={"fairfl-profile": self.profile,
                                                         "fairfl-machine": describe_machine(self.device)})

    def sweep(self, config: Callable[..., Any], points: Iterable[Mapping[str, Any]] | None = None,
              keep_diverged: bool = False, **factors: Sequence[Any]) -> "Sweep":
        """Run ``config(**point)`` for every point — the product of ``factors`` in the order
        given, or the explicit ``points`` — through the session's backend (cached runs are
        loaded, not trained). With ``keep_diverged=True`` a run that diverged holds None (an outcome
        the notebook reports); a run that crashed always raises (``fairfl.runs.sweeps.run_many``)."""
        from fairfl.runs.sweeps import run_many
        if points is None:
            names = list(factors)
            points = [dict(zip(names, values)) for values in itertools.product(*factors.values())]
        else:
            points = [dict(p) for p in points]
        configs = [config(**p) for p in points]
        if self.device != "cpu":
            configs = [c.replace(device=self.device) for c in configs]
        from fairfl.runs import sweeps
        before = sweeps.last_usage
        histories = run_many(configs, backend=self.backend, keep_diverged=keep_diverged)
        if sweeps.last_usage is not before:        # something trained: how busy the cores were
            print(f"sweep of {len(configs)} runs: {sweeps.last_usage}")
        return Sweep(points, histories)


def _profile_source(given: str | None) -> str:
    """Why this profile, in words for the header line: a Run All in JupyterLab runs ``quick``
    unless told otherwise, which takes minutes to an hour; the line says how to choose ``smoke``."""
    if given is not None:
        return ""
    if os.environ.get("FAIRFL_PROFILE"):
        return " (from $FAIRFL_PROFILE)"
    return ' (the default; profile = "smoke" in the parameters cell runs in seconds)'


def header_line(notebook: str | None, profile: str, given: str | None, settings: Mapping[str, Any],
                overridden: Mapping[str, tuple], exploring: bool, device: str, figures: Path | str) -> str:
    """The one line a notebook prints first (:func:`start`): its profile and why, the time it is
    expected to take here (``fairfl reproduce`` announces the same), what it explores, where its
    figures go, its settings and device."""
    from .claims import describe_overrides
    from fairfl.base.profiles import expected_time
    if exploring:
        expected = "not measured (settings changed)"
    elif notebook is None:
        expected = "not measured"
    else:
        expected = expected_time(notebook, profile, device)
    parts = [f"{notebook + ': ' if notebook else ''}profile {profile}{_profile_source(given)}, expected {expected}"]
    if overridden:
        parts.append(f"exploring {describe_overrides(overridden)}: the paper's claims are recorded as not checked")
    elif exploring:
        parts.append("exploring (parameters given): the paper's claims are recorded as not checked")
    parts.append(f"figures -> {figures}")
    parts.append("settings " + ", ".join(f"{k}={v!r}" for k, v in settings.items()) + f", device={device}")
    return "; ".join(parts)


def _choose_parts(settings: dict, profiles: Mapping[str, Mapping[str, Any]], profile: str,
                  parts: str | Sequence[str] | None) -> tuple[dict, list[str]]:
    """A notebook whose profiles declare ``parts`` (its separable experiments, e.g. notebook 02's
    ``("adult", "scaling")``) runs the ``parts`` chosen, in the declared order, or all of them; a
    part the profile does not have is a ConfigError naming those it has (and the profiles that have
    it). Choosing parts is not exploring: each part runs with its profile's settings, so its claims
    are checked and its figures go where the profile's go. Returns the settings and the parts left
    out."""
    declared = tuple(settings.get("parts") or ())
    if parts is None:
        return settings, []
    if not declared:
        raise ConfigError(f"parts={parts!r}: this notebook has no parts to choose from; it runs as a whole")
    chosen = [parts] if isinstance(parts, str) else list(parts)
    for part in chosen:
        if part not in declared:
            elsewhere = [name for name, s in profiles.items() if part in (s.get("parts") or ())]
            hint = f" ({part!r} is a part of the {' and '.join(elsewhere)} profile)" if elsewhere else ""
            raise ConfigError(f"parts={parts!r}: the {profile} profile has no part {part!r}; its parts: "
                              f"{', '.join(declared)}{hint}")
    if not chosen:
        raise ConfigError(f"parts=[]: choose at least one of {', '.join(declared)} (or None for all of them)")
    return {**settings, "parts": tuple(p for p in declared if p in chosen)}, [p for p in declared if p not in chosen]


def start(profile: str | None, profiles: Mapping[str, Mapping[str, Any]], workers: int | None = None,
          device: str | None = None, notebook: str | None = None, parts: str | Sequence[str] | None = None,
          **overrides: Any) -> Session:
    """The header of a notebook: resolve the profile, apply the plotting style, take the
    profile's settings with the parameters cell's non-None overrides (``seeds``, ``rounds``, …),
    the device (the parameter, else ``$FAIRFL_DEVICE``, else the CPU; ``fairfl reproduce
    --device cuda`` sets it) and a backend: the one ``$FAIRFL_BACKEND`` names (``fairfl reproduce
    --backend ray`` sets it), else in-process for smoke and on a GPU (one process feeds the GPU
    best: all runs of a sweep fused), else a pool of worker processes. Prints one line first
    (:func:`header_line`): the profile, and the time ``notebook`` (its name, e.g. "00_tour") is
    expected to take on it."""
    from fairfl.training.engine import resolve_device
    from .plotting import use_style
    from fairfl.runs.config import ExperimentConfig
    from fairfl.training.backends import SerialBackend, chosen_backend, default_backend
    device = ExperimentConfig(device=device or os.environ.get("FAIRFL_DEVICE", "cpu")).device
    resolve_device(device)            # a CUDA device this machine lacks is named now, before any data is read
    given, profile = profile, resolve_profile(profile)
    if profile not in profiles:
        raise ConfigError(f"this notebook has no {profile!r} profile; it has {', '.join(profiles)}")
    settings = dict(profiles[profile])
    settings, not_run = _choose_parts(settings, profiles, profile, parts)
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in settings:
            raise ConfigError(f"override {key}={value!r}: the profile has no setting {key!r}; "
                              f"it has {', '.join(settings)}")
        settings[key] = list(value) if isinstance(settings[key], list) else value
    # what the profile's claims were not calibrated on: they are then recorded, not checked (fairfl.studies.claims)
    overridden = {k: (profiles[profile][k], v) for k, v in settings.items() if v != profiles[profile][k] and k != "parts"}
    use_style()
    backend = SerialBackend() if profile == "smoke" and chosen_backend() is None else default_backend(device, workers)
    # exploring: settings changed in the parameters cell, or any -p of `fairfl reproduce` (which may
    # change what no profile setting names, e.g. notebook 04's `shakespeare`)
    exploring = bool(overridden) or bool(os.environ.get(EXPLORE_ENV))
    destination = figure_dir(profile, exploring, {k: v for k, (_, v) in overridden.items()})
    # under `fairfl reproduce` everything the notebook writes is staged, and moved into place only when it
    # has run to its end: a failed or interrupted run leaves the last good set of figures whole
    staging = os.environ.get(STAGING_ENV)
    if staging:
        Path(staging).mkdir(parents=True, exist_ok=True)
        (Path(staging) / DESTINATION).write_text(str(destination), encoding="utf-8")
    session = Session(profile, settings, Path(staging) if staging else destination, backend, device, overridden,
                      destination)
    shown = f"{destination} (staged until the notebook has run to its end)" if staging else destination
    line = header_line(notebook, profile, given, settings, overridden, exploring, device, shown)
    if not_run:
        line += f"; parts {', '.join(settings['parts'])} (not run: {', '.join(not_run)})"
    print(line, flush=True)
    return session


# ----------------------------------------------------------------------------- sweeps

@dataclass
class Sweep:
    """Runs keyed by named factors: ``points[i]`` (a dict such as {"eps": 0.1, "seed": 0}) and
    its ``histories[i]``. Select with keyword arguments; factors not named are left free (usually
    the seeds)."""

    points: list[dict[str, Any]]
    histories: list[Any]
    _index: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.points)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Any]]:
        return iter(zip(self.points, self.histories))

    def __add__(self, other: "Sweep") -> "Sweep":
        return Sweep(self.points + other.points, self.histories + other.histories)

    @property
    def factors(self) -> list[str]:
        return list(dict.fromkeys(k for p in self.points for k in p))

    def values(self, factor: str) -> list[Any]:
        """The values ``factor`` takes, in order of first appearance."""
        return list(dict.fromkeys(p[factor] for p in self.points if factor in p))

    def _matches(self, point: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
        return all(k in point and point[k] == v for k, v in where.items())

    def select(self, **where: Any) -> "Sweep":
        keep = [i for i, p in enumerate(self.points) if self._matches(p, where)]
        return Sweep([self.points[i] for i in keep], [self.histories[i] for i in keep])

    def get(self, **where: Any) -> list[Any]:
        """The histories of every run that matches (for example every seed of one setting)."""
        out = self.select(**where).histories
        if not out:
            raise KeyError(f"no run matches {where}; factors: {self.factors}")
        return out

    def one(self, **where: Any) -> Any:
        out = self.get(**where)
        if len(out) != 1:
            raise KeyError(f"{len(out)} runs match {where}; name more factors")
        return out[0]

    def groups(self, by: str, label: Callable[[Any], str] | None = None, **where: Any) -> dict[Any, list[Any]]:
        """{value of ``by`` (or ``label(value)``): the histories with it} among the matching runs,
        in order — what ``plotting.curves`` takes."""
        sub = self.select(**where)
        return {(label(v) if label else v): sub.get(**{by: v}) for v in sub.values(by)}

    def frame(self, **metrics: Callable[[Any], Any]) -> pd.DataFrame:
        """One row per run: its factors, then ``metric(history)`` for each named metric (a
        metric returning a mapping contributes one column per key; a run that failed gives NaN)."""
        rows = []
        for p, h in self:
            row = dict(p)
            for name, fn in metrics.items():
                value = np.nan if h is None else fn(h)
                if isinstance(value, Mapping):
                    row.update(value)
                else:
                    row[name] = value
            rows.append(row)
        return pd.DataFrame(rows)

    def explore(self, static: bool | None = None, backend: Any = None):
        """An explorer over these runs (``fairfl.studies.explorer``): its factors as controls, the seeds
        free, two selections side by side; display it as a cell's last line."""
        from .explorer import explore
        return explore(self, static=static, backend=backend)

    def summary(self, by: str | Sequence[str], over: str = "seed", **metrics: Callable[[Any], Any]) -> pd.DataFrame:
        """One row per value of ``by``: how many runs (seeds) it averages, then each metric's mean
        over ``over`` (the seeds) under the metric's own name, each followed by
        "<metric> ± over seeds", its std over the seeds (ddof 0). One flat header row; the ±
        columns only where some row has more than one seed, and NaN in a row of one seed (a single
        seed has no spread to show, and 0.0 reads as a measured one)."""
        by = [by] if isinstance(by, str) else list(by)
        df = self.frame(**metrics).drop(columns=[over], errors="ignore")
        value_columns = [c for c in df.columns if c not in self.factors]
        groups = df.groupby(by, sort=False, dropna=False)
        counted = "seeds" if over == "seed" else f"{over}s"
        out = pd.DataFrame({counted: groups.size()})
        spread = bool((out[counted] > 1).any())
        for c in value_columns:
            out[c] = groups[c].mean()
            if spread:
                out[f"{c} ± over {counted}"] = groups[c].agg(lambda v: v.std(ddof=0) if len(v) > 1 else np.nan)
        return out


def client_fairness(history: Any, fraction: float = 0.1) -> dict[str, float]:
    """The usual fairness row of a run's final client test accuracies (``metrics.summary``), in %,
    under names that say what each is: a metric for :meth:`Sweep.summary`."""
    from fairfl.federated import metrics
    pct = f"{100 * fraction:.6g}"
    names = {"mean": "mean acc (%)", "std": "std over clients (points)", f"worst{pct}%": f"worst {pct} % (%)",
             f"best{pct}%": f"best {pct} % (%)", "p5": "5th percentile (%)", "p95": "95th percentile (%)",
             "angle": "angle to all-ones (°)", "kl": "KL to uniform"}
    return {names.get(k, k): v for k, v in metrics.summary(100 * history.final_acc(), fraction).items()}


# ----------------------------------------------------------------------------- beside the paper

def mean_std(values: Iterable[float], digits: int = 2) -> str:
    """"m ± s" over seeds (std with ddof 0; just "m" for one value; "–" when every value is NaN)."""
    v = np.asarray(list(values), dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "–"
    return f"{v.mean():.{digits}f}" if v.size == 1 else f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def format_rounds(rounds: Sequence[float], horizon: int) -> str:
    """Rounds to a threshold over seeds as a table entry: mean ± std when every seed reached it,
    "> horizon" when none did, else the mean of those that did and how many."""
    r = np.asarray(rounds, dtype=np.float64)
    ok = np.isfinite(r)
    if ok.all():
        return f"{r.mean():.1f} ± {r.std():.1f}" if len(r) > 1 else f"{r.mean():.0f}"
    if not ok.any():
        return f"> {horizon}"
    return f"{r[ok].mean():.1f} ({ok.sum()}/{len(r)} seeds; others > {horizon})"


def beside(ours: pd.DataFrame, paper: pd.DataFrame, on: Sequence[str], metrics: Sequence[str] | Mapping[str, str],
           summarise: Callable[[pd.Series], str] | None = None, digits: int = 2) -> pd.DataFrame:
    """The paper's numbers beside ours, one row per setting (``on``): for each metric, ours
    summarised over the runs of the setting (default: mean ± std over seeds), the paper's value,
    and their difference (ours' mean minus the paper's). ``metrics`` names our columns, mapped to
    the paper's column names when they differ. A paper key that is NaN matches any value of ours
    ("FedMGDA+, any bias"); a setting the paper does not have shows an empty paper column."""
    on = list(on)
    pairs = dict(metrics) if isinstance(metrics, Mapping) else {m: m for m in metrics}
    summarise = summarise or (lambda s: mean_std(s, digits))
    rows = []
    for key, group in ours.groupby(on, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        match = paper
        for col, value in zip(on, key):
            if col in paper.columns:
                match = match[(match[col] == value) | match[col].isna()]
        row = dict(zip(on, key))
        for ours_col, paper_col in pairs.items():
            theirs = float(match[paper_col].iloc[0]) if len(match) and paper_col in match else np.nan
            values = pd.to_numeric(group[ours_col], errors="coerce")
            row[f"{ours_col} ours"] = summarise(group[ours_col])
            row[f"{ours_col} paper"] = theirs
            finite = np.isfinite(theirs) and bool(np.isfinite(values).all())
            row[f"{ours_col} diff"] = round(float(values.mean()) - theirs, digits) if finite else np.nan
        rows.append(row)
    return pd.DataFrame(rows).set_index(on)


# ----------------------------------------------------------------------------- stored notebooks

def stored_form(text: str, python_version: str | None = None) -> str:
    """A notebook's text as it is kept in the repository: without outputs and execution counts,
    with the kernelspec and language_info that JupyterLab sets when it opens the notebook with
    the ``python3`` kernel, written the way Jupyter's server saves it (``nbformat.write``:
    nbformat 4.5 with cell ids, indent 1, sorted keys, a final newline). Opening and saving the
    stored file in JupyterLab then changes nothing (``tests/test_notebooks.py`` checks every
    notebook, ``tests/test_jupyterlab.py`` in JupyterLab itself; ``scripts/normalise_notebooks.py``
    rewrites them).

    ``language_info.version`` is the kernel's Python version, which JupyterLab writes whenever it
    differs from the stored one: another value, or none, marks the notebook modified as soon as
    the kernel starts, and autosave then writes it (seen in JupyterLab 4.6; the field cannot be
    left out). So a notebook opened with another Python patch version than the one it was stored
    with is modified by that one field. The stored version is kept here (normalising on another
    Python does not rewrite six notebooks), or set to ``python_version``; a notebook without one
    gets this Python's."""
    import io

    import nbformat
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    nb = nbformat.reads(text, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        for transient in ("execution", "collapsed", "scrolled", "trusted"):
            cell.metadata.pop(transient, None)
    spec = KernelSpecManager().get_kernel_spec("python3")
    # what JupyterLab writes: {name, display_name, language} of the kernel, and the kernel's
    # language_info from its kernel_info reply (ipykernel's, with its Python's version)
    info = dict(IPythonKernel.language_info)
    info["version"] = python_version or nb.metadata.get("language_info", {}).get("version") or info["version"]
    nb.metadata = nbformat.from_dict({
        "kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": "python3"},
        "language_info": info})
    out = io.StringIO()
    nbformat.write(nb, out, version=nbformat.NO_CONVERT)
    return out.getvalue()


# The git filter that stores the notebooks without outputs (.gitattributes; scripts/setup.sh installs
# it into a clone's git config with scripts/normalise_notebooks.py --install-filter)
FILTER = "fairfl-notebook"


def committed_form(path: Path) -> str:
    """The text git stores for the notebook at ``path``: its :func:`stored_form` where this clone has
    the clean filter (``FILTER``) installed for it, whatever the file holds (JupyterLab's Run All and
    save put outputs there); else the file as it is (no filter, or not in a git repository)."""
    import subprocess
    path = Path(path).resolve()
    text = path.read_text(encoding="utf-8")

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True,
                                  timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    attribute = git("check-attr", "filter", "--", path.name)
    if attribute.endswith(f": filter: {FILTER}") and git("config", "--get", f"filter.{FILTER}.clean"):
        return stored_form(text)
    return text


# How long the save hook waits for another git command (a `git status` in a terminal, an editor's
# git integration) to release the index's lock before it gives up and says so
INDEX_LOCK_WAIT = 60.0


def refresh_git_index(os_path: str, model: Mapping[str, Any], contents_manager: Any = None, wait: bool = False,
                      lock_wait: float = INDEX_LOCK_WAIT, **_: Any) -> None:
    """Jupyter's post-save hook (``make lab`` sets it): after JupyterLab saves a tracked notebook
    whose stored form is the one in git's index (Run All and save: only outputs changed), refresh
    that index entry (``git add`` of content equal to the index stores nothing). Git's status
    otherwise lists the notebook as modified although ``git diff`` shows nothing: a file whose size
    changed is taken as changed without running the clean filter. Runs in a thread (the filter
    takes seconds; a save must not wait for it) unless ``wait``; a notebook with a real change, an
    untracked one, or one outside a git repository is left alone.

    Another git command holding the index (``.git/index.lock``: a ``git status`` in a terminal) makes
    ``git add`` fail at once; the hook retries for up to ``lock_wait`` seconds. Whatever still fails is
    said in the Jupyter server's log (``contents_manager.log``, the terminal of ``make lab``) with
    the command that fixes it, never swallowed; a save itself never fails because of it."""
    import subprocess
    import threading
    import time
    if model.get("type") != "notebook":
        return
    path = Path(os_path)
    log = getattr(contents_manager, "log", None) or logging.getLogger("fairfl.studies.notebook")

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True, timeout=300)

    def refresh() -> None:
        try:
            indexed = git("show", f":./{path.name}")
            if indexed.returncode != 0 or committed_form(path) != indexed.stdout:
                return                                   # untracked, not in a repository, or a real change
            deadline, pause = time.monotonic() + lock_wait, 0.1
            while True:
                done = git("add", "--", path.name)
                if done.returncode == 0:
                    return
                locked = "index.lock" in done.stderr
                if not locked or time.monotonic() + pause > deadline:
                    break
                time.sleep(pause)                        # another git command holds the index: it ends soon
                pause = min(2 * pause, 2.0)
            why = ("another git command held the index (.git/index.lock) for "
                   f"{lock_wait:.0f} s" if locked else f"git add failed: {done.stderr.strip()[:300]}")
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            why = f"{type(e).__name__}: {e}"
        log.warning("fairfl: saved %s, but could not refresh its entry in git's index (%s); `git status` lists it "
                    "as modified until you run `git add %s` (its committed form is unchanged)", path, why, path)
    if wait:
        refresh()
    else:
        threading.Thread(target=refresh, name="fairfl-git-refresh", daemon=True).start()
