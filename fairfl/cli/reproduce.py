"""``fairfl reproduce``: execute notebooks with papermill, one at a time, each into the outputs
folder (a partial file replaced only by a notebook that ran to its end, a failed one kept beside
it), with ``-p`` parameters checked against the notebook's, the profile and device handed to the
kernels, the measured time announced (:data:`fairfl.base.profiles.NOTEBOOK_SECONDS`), and Ctrl-C handled at any moment
(:class:`_Interrupt`); :func:`notebook_paths` finds notebooks by name, prefix or path."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fairfl.base.profiles import MEASURED_ON, NOTEBOOK_SECONDS, PROFILES, expected_time  # noqa: F401


def notebook_paths(names: list[str]) -> list[Path]:
    from fairfl.base.paths import notebooks_root
    all_nbs = sorted(notebooks_root().glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return all_nbs
    out = []
    for n in names:
        if n.endswith(".ipynb") and Path(n).is_file():  # an explicit path, e.g. your own notebook
            out.append(Path(n).resolve())
            continue
        match = [p for p in all_nbs if p.stem == Path(n).stem or p.name.startswith(n)]
        if not match:
            from fairfl.base.errors import ConfigError
            raise ConfigError(f"no notebook matches {n!r}; have: {', '.join(p.name for p in all_nbs)}")
        out += match
    return out


def _parameters(items: list[str]) -> dict:
    """``-p KEY=VALUE`` (VALUE as JSON when it parses, else a string) for the parameters cell."""
    from fairfl.runs.config import parse_setting_value
    from fairfl.base.errors import ConfigError
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"-p takes KEY=VALUE with KEY a parameter of the notebook (e.g. -p rounds=10), got {item!r}")
        if key == "profile":
            raise ConfigError("-p profile=...: choose the profile with --profile")
        out[key] = parse_setting_value(value)
    return out


def check_parameters(notebooks: list[Path], parameters: dict) -> None:
    """Every ``-p`` name must be a parameter of every notebook it is given to: papermill only warns
    about an unknown one (``-p round=2`` for ``rounds``) and the notebook runs with its defaults."""
    import difflib
    from papermill import inspect_notebook
    from fairfl.base.errors import ConfigError
    for nb in notebooks:
        have = list(inspect_notebook(str(nb)))
        if not have:
            raise ConfigError(f"{nb.name} has no cell tagged 'parameters', so -p cannot reach it")
        for key in parameters:
            if key not in have:
                close = difflib.get_close_matches(key, have, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"-p {key}=...: {nb.name} has no parameter {key!r}{hint} "
                                  f"(its parameters: {', '.join(have)})")


def _profile(args) -> str:
    """One rule: what is given explicitly beats the environment. An explicit --profile beats
    $FAIRFL_PROFILE (the notebook is handed the profile as a parameter, which beats the
    environment in the kernel too); without --profile, $FAIRFL_PROFILE, else quick."""
    from fairfl.base.errors import ConfigError
    env = os.environ.get("FAIRFL_PROFILE")
    if env is not None and env not in PROFILES:
        raise ConfigError(f"FAIRFL_PROFILE={env!r} is not one of {', '.join(PROFILES)}")
    if args.profile is None:
        return env or "quick"
    if env is not None and env != args.profile:
        print(f"--profile {args.profile} beats FAIRFL_PROFILE={env} from the environment")
    return args.profile


# The kernel is this machine's own child on the loopback: its start-up warning that it "is running
# over TCP without encryption" says nothing a user of `reproduce` can act on, and it came before
# every notebook; nor does "KeyboardInterrupt caught in kernel." (an ERROR of its log) after a Ctrl-C
# that reached it outside a cell. Only the kernel application's own log is quieted; the notebook's
# output and its errors are not (they come through the notebook).
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


class _Stopped(Exception):
    """Raised by papermill's hook before a cell once Ctrl-C was pressed: an ordinary exception, so
    that nbclient ends the execution through its own clean-up (a KeyboardInterrupt raised inside its
    asyncio loop left tasks behind, whose errors were printed at exit)."""


class _Interrupt:
    """Ctrl-C during `reproduce`, however many and whenever they come: one line, exit status 130,
    the last good notebook kept.

    The first one interrupts the notebook's kernel if a cell is running (jupyter_client starts the
    kernel in a session of its own, so the terminal's Ctrl-C does not reach it): the cell stops as
    Ctrl-C stops it in JupyterLab (a sweep keeps its finished runs and checkpoints and says so in
    one line, ``fairfl.runs.sweeps``, which `reproduce` repeats) and papermill ends with that cell's
    error. Between two cells, or while the kernel starts, nothing is sent (a kernel signalled while
    it starts dies with a traceback): the next cell does not start. A second Ctrl-C stops at once:
    the kernel and its workers are killed, the notebook so far is kept as failed, one line is said
    and the process ends there (``os._exit``: tearing down a kernel connection cut in the middle of
    a message printed asyncio's and zmq's tracebacks). Any later one is ignored."""

    def __init__(self) -> None:
        self.asked = False
        self.executing = False
        self.kernels: list = []
        self.stop_now = None            # what the second Ctrl-C does before the process ends (per notebook)

    def kernel_manager_class(self):
        from jupyter_client.manager import AsyncKernelManager
        kernels = self.kernels

        class Tracked(AsyncKernelManager):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                kernels.append(self)
        return Tracked

    def __enter__(self) -> "_Interrupt":
        import signal
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        import signal
        # interrupted, the process is about to end: a Ctrl-C while it does changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN if self.asked else self._previous)

    def _signal_kernels(self, signum: int) -> None:
        for km in self.kernels:
            pid = getattr(getattr(km, "provisioner", None), "pid", None)
            if pid is not None:
                try:
                    os.killpg(os.getpgid(pid), signum)
                except OSError:       # the kernel has just ended
                    pass

    def _handle(self, signum, frame) -> None:
        import signal
        if self.asked:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self._signal_kernels(signal.SIGKILL)
            if self.stop_now is not None:
                self.stop_now()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        self.asked = True
        if self.executing:
            self._signal_kernels(signal.SIGINT)

    # papermill's (nbclient's) hooks around each cell
    def before_cell(self, **_) -> None:
        """Nothing more runs once Ctrl-C was pressed (it may come while the kernel starts or between
        two cells, when no cell is there to interrupt)."""
        if self.asked:
            raise _Stopped("interrupted before the next cell")

    def cell_executing(self, **_) -> None:
        self.executing = True

    def cell_done(self, **_) -> None:
        self.executing = False


def cmd_reproduce(args) -> int:
    from fairfl.base.paths import outputs_root

    parameters = _parameters(args.p or [])
    profile = _profile(args)
    notebooks = notebook_paths(args.notebooks)
    if parameters:
        check_parameters(notebooks, parameters)
    device = "cpu"
    if args.device is not None:   # checked now, then handed to the kernels (fairfl.studies.notebook.start reads it)
        from fairfl.runs.config import ExperimentConfig
        from fairfl.training.engine import resolve_device
        device = ExperimentConfig(device=args.device).device
        resolve_device(device)
        os.environ["FAIRFL_DEVICE"] = device
    if args.address and args.backend != "ray":
        from fairfl.base.errors import ConfigError
        raise ConfigError(f"--address {args.address} is the address of a Ray cluster: add --backend ray")
    if args.backend:         # handed to the kernels too: fairfl.runs.sweeps.default_backend reads them
        os.environ["FAIRFL_BACKEND"] = args.backend
        if args.address:
            os.environ["FAIRFL_RAY_ADDRESS"] = args.address
    # the kernels' progress bars as text: a widget has no state in the executed notebook (fairfl.base.progress)
    os.environ.setdefault("FAIRFL_PROGRESS", "text")
    # A run with -p explores: its executed notebooks go beside the reproduced ones, never over them, each
    # exploration into a folder of its own named by its settings (outputs/<profile>/explore/rounds=3/). Choosing
    # some of a notebook's parts (-p parts=...) is not exploring: they run with the profile's settings.
    from fairfl.base.paths import exploration_name
    exploring = {k: v for k, v in parameters.items() if k != "parts"}
    out_dir = Path(args.output or outputs_root()) / profile
    if exploring:
        out_dir = out_dir / "explore" / exploration_name(parameters)
    out_dir.mkdir(parents=True, exist_ok=True)
    if exploring:            # and its figures beside them (fairfl.studies.notebook.figure_dir), not over the reproduced ones
        from fairfl.base.paths import EXPLORE_ENV
        os.environ[EXPLORE_ENV] = str(out_dir.resolve())
    failures = 0
    with _Interrupt() as interrupt:
        for nb in notebooks:
            status = _reproduce_one(nb, out_dir, profile, parameters, device, args, interrupt)
            if status == "interrupted":
                return 130
            failures += status == "failed"
    return 1 if failures else 0


def _reproduce_one(nb: Path, out_dir: Path, profile: str, parameters: dict, device: str, args,
                   interrupt: _Interrupt) -> str:
    """Execute one notebook into ``out_dir``; "ok", "failed" or "interrupted", with one line said.
    papermill writes the executed notebook after every cell: into a partial file, which replaces
    the last good one only when the notebook has run to its end; a failed or interrupted one is
    kept beside it as ``<name>.failed.ipynb``."""
    import papermill as pm
    from fairfl.studies.claims import summary
    t0 = time.time()
    target = out_dir / nb.name
    failed = out_dir / f"{nb.stem}.failed.ipynb"
    partial = out_dir / f".{nb.stem}.partial.ipynb"
    claims_file = out_dir / f"{nb.stem}.claims.json"
    # the verdicts go to a file of their own until the notebook has run to its end: those of the last
    # good notebook stay beside it (it was deleted when a notebook started)
    claims_partial = out_dir / f".{nb.stem}.claims.partial.json"
    claims_partial.unlink(missing_ok=True)
    os.environ["FAIRFL_CLAIMS_FILE"] = str(claims_partial)  # the kernel inherits it (fairfl.studies.claims)
    # and its figures and tables to a staging folder, moved into place when it has run to its end
    from fairfl.base.paths import STAGING_ENV
    staging = out_dir / f".{nb.stem}.figures.partial"
    failed_figures = out_dir / f"{nb.stem}.failed.figures"
    _remove(staging)
    os.environ[STAGING_ENV] = str(staging)
    given = "".join(f" {k}={v!r}" for k, v in parameters.items())
    changed = [k for k in parameters if k != "parts"]
    expected = (expected_time(nb.name, profile, device) if not parameters else "not measured (parameters changed)"
                if changed else "not measured (some parts)")
    print(f"start   {nb.name:<40} {time.strftime('%H:%M:%S')}  {profile}{given}; expected {expected}", flush=True)

    def interrupted(said: str | None) -> None:
        interrupt.stop_now = None           # said once: a later Ctrl-C only ends the process
        _keep_partial(partial, failed)
        _keep_partial(staging, failed_figures)
        claims_partial.unlink(missing_ok=True)
        kept = (f"the last good one is kept at {target}, its figures as they were" if target.is_file()
                else "there is no earlier executed one")
        said = said or "finished runs stay cached and a run stopped at its checkpoint resumes when you run it again"
        print(f"\ninterrupted  {nb.name} after {time.time() - t0:.1f} s: {said}; {kept}", flush=True)
    interrupt.stop_now = lambda: interrupted("stopped at once (a second Ctrl-C); a run stopped at its checkpoint "
                                             "resumes when you run it again")
    error = said = None
    try:
        # the kernel's output is streamed here as it comes (progress bars, the claims' verdicts)
        stream = {} if args.quiet else {"log_output": True, "stdout_file": sys.stdout, "stderr_file": sys.stderr}
        if interrupt.asked:                 # Ctrl-C while papermill was imported: no kernel is started
            raise KeyboardInterrupt
        pm.execute_notebook(str(nb), str(partial), parameters={"profile": profile, **parameters},
                            kernel_name=args.kernel, progress_bar=False, cwd=str(nb.parent),
                            extra_arguments=KERNEL_ARGUMENTS, kernel_manager_class=interrupt.kernel_manager_class(),
                            on_cell_start=interrupt.before_cell, on_cell_execute=interrupt.cell_executing,
                            on_cell_executed=interrupt.cell_done, **stream)
    except KeyboardInterrupt:
        interrupt.asked = True
    except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
        lines = str(e).strip().splitlines()
        error = lines[-1] if lines else type(e).__name__
        # the interrupted cell's own line (a sweep's "interrupted: 3 of 8 runs cached, …"), said here too
        if getattr(e, "ename", "") == "SweepInterrupted":
            said = str(getattr(e, "evalue", "")) or None
    finally:
        os.environ.pop("FAIRFL_CLAIMS_FILE", None)
        os.environ.pop(STAGING_ENV, None)
    seconds = time.time() - t0
    if interrupt.asked:
        interrupted(said)
        return "interrupted"
    interrupt.stop_now = None
    if error is not None:
        _keep_partial(partial, failed)
        _keep_partial(staging, failed_figures)
        claims_partial.unlink(missing_ok=True)
        figures = f"; the figures it drew: {failed_figures}" if failed_figures.is_dir() else ""
        print(f"FAILED  {nb.name:<40} {seconds:7.1f} s  {error}  (see {failed if failed.is_file() else target}"
              f"{figures}; the last good figures are unchanged)")
        return "failed"
    _move_into_place(staging, _destination(staging))
    _remove(failed_figures)
    os.replace(partial, target)
    if claims_partial.is_file():
        os.replace(claims_partial, claims_file)
    else:                                    # this notebook records no claims: none of an earlier one stay
        claims_file.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    print(f"ok      {nb.name:<40} {seconds:7.1f} s  {summary(claims_file)}  -> {target}")
    return "ok"


def _keep_partial(partial: Path, failed: Path) -> None:
    """A failed or interrupted notebook is kept as ``<name>.failed.ipynb`` beside the last good one,
    and the figures it drew as ``<name>.failed.figures/`` (the last good ones stay where they are)."""
    if partial.is_dir():
        from fairfl.base.paths import DESTINATION
        _remove(failed)
        os.replace(partial, failed)
        (failed / DESTINATION).unlink(missing_ok=True)
    elif partial.is_file():
        os.replace(partial, failed)


def _remove(folder: Path) -> None:
    import shutil
    if folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def _destination(staging: Path) -> Path | None:
    """Where the notebook's figures go: the folder ``fairfl.studies.notebook.start`` wrote into the staging
    folder's ``DESTINATION`` file (the one its header line names)."""
    from fairfl.base.paths import DESTINATION
    try:
        return Path((staging / DESTINATION).read_text(encoding="utf-8").strip())
    except OSError:
        return None


def _move_into_place(staging: Path, destination: Path | None) -> None:
    """The staged figures and tables into their folder, file by file (each replace atomic), then the
    staging folder removed. Nothing staged (a notebook that saves nothing): nothing moves."""
    if not staging.is_dir():
        return
    if destination is None:
        from fairfl.base.errors import WriteError
        raise WriteError(f"the notebook staged files in {staging} but never said where they go")
    from fairfl.base.paths import DESTINATION
    for source in sorted(p for p in staging.rglob("*") if p.is_file() and p.name != DESTINATION):
        target = destination / source.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    _remove(staging)
