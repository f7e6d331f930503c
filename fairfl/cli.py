"""fairfl: data / run / reproduce / results / list."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import time
from pathlib import Path

# Only light modules here: `python -m fairfl --help` must not wait for torch. Each command imports
# what it needs.
from .claims import PROFILES


def _cmd_data(args) -> int:
    from .data import report
    # `data --require A B` (what setup.sh runs) reports A and B only: the datasets nothing needs were
    # three "missing" lines at every `make lab` and `make test`
    rows = report(args.names or args.require or None)
    width = max(len(r[0]) for r in rows)
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status:<7}  {detail}")
    required = set(args.require or [])
    missing = [r[0] for r in rows if r[1] != "ok" and r[0] in required]
    if missing:
        print(f"required datasets missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def import_modules(items: list[str]) -> None:
    """``--import``: modules that register algorithms of your own (``@register`` runs on import),
    by module name (importable from here) or as a path to a ``.py`` file. A file's folder is put
    on ``sys.path`` and the file imported by its name, so that worker processes, which import an
    algorithm's module by name, find it too."""
    import importlib
    from .errors import ConfigError
    for item in items:
        path = Path(item)
        if item.endswith(".py"):
            if not path.is_file():
                raise ConfigError(f"--import {item}: no such file")
            folder = str(path.resolve().parent)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            name = path.stem
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:   # `python -m` has the cwd; a console script not
                sys.path.insert(0, os.getcwd())
            name = item
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"--import {item}: {e}") from None
        except SyntaxError as e:
            raise ConfigError(f"--import {item}: {e.filename}, line {e.lineno}: {e.msg}") from None
        except Exception as e:  # noqa: BLE001 - the module raised while it was imported: say where
            import traceback
            frame = traceback.extract_tb(e.__traceback__)[-1]
            raise ConfigError(f"--import {item}: importing it raised {type(e).__name__}: {e} "
                              f"({frame.filename}, line {frame.lineno})") from None


def _cmd_run(args) -> int:
    from .config import ExperimentConfig, parse_setting_value, set_dotted
    from .errors import ConfigError
    from .sweeps import run, run_dir
    from . import metrics

    import_modules(args.imports or [])
    base = ExperimentConfig.from_yaml(args.config).to_dict() if args.config else ExperimentConfig().to_dict()
    for item in args.set or []:
        if "=" not in item:
            raise ConfigError(f"--set takes KEY=VALUE (e.g. local.lr=0.1), got {item!r}")
        k, v = item.split("=", 1)
        set_dotted(base, k, parse_setting_value(v))
    if args.device is not None:
        base["device"] = args.device
    cfg = ExperimentConfig.from_dict(base)             # validated as it is made
    t0 = time.time()
    try:
        h = run(cfg, cache=not args.no_cache)
    except KeyboardInterrupt:
        raise _Said(_run_interrupted(cfg, args.no_cache)) from None
    acc = h.final_acc()
    where = "not cached (--no-cache)" if args.no_cache else f"results in {run_dir(cfg)}"
    print(f"{cfg.label()}: {h.rounds_done} rounds in {time.time() - t0:.1f} s; "
          f"final client accuracy (%) mean {100 * metrics.mean(acc):.2f}, std {100 * metrics.std(acc):.2f}, "
          f"worst 10 % {100 * metrics.worst(acc):.2f}; {where}")
    return 0


def console() -> None:
    """The ``fairfl`` command and ``python -m fairfl``: :func:`main`'s exit status. An interrupted
    command ends with 130 through ``os._exit`` once the exit handlers have run: a Ctrl-C that lands
    while an extension runs Python code during an import (``import torch``, in a command's first
    second) leaves CPython's "unhandled KeyboardInterrupt" mark set even though :func:`main` caught
    it, and the interpreter would then end by killing itself with SIGINT (status -2, seen in a test)."""
    code = main()
    if code == 130:
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


class _Said(KeyboardInterrupt):
    """A Ctrl-C whose one line is its message (printed by :func:`main`, exit status 130)."""


def _run_interrupted(cfg, no_cache: bool) -> str:
    """What a Ctrl-C during `fairfl run` leaves: the run's checkpoint, or another process training it."""
    from .cache import Claim
    from .progress import read
    from .sweeps import run_dir
    if no_cache:
        return f"interrupted: {cfg.label()} stopped (--no-cache: nothing is kept)"
    folder = run_dir(cfg)
    claim = Claim(folder)
    try:
        other = folder.is_dir() and not claim.take(wait=False)
    finally:
        claim.release()
    if other:
        return (f"interrupted: stopped waiting for {cfg.label()}, which another process ({claim.holder()}) goes on "
                f"training into {folder}")
    done = read(folder)
    after = f" after {done} of {cfg.rounds} rounds" if done else ""
    return (f"interrupted: {cfg.label()} stopped{after}; the same command resumes it from its last checkpoint "
            f"in {folder}")


def notebook_paths(names: list[str]) -> list[Path]:
    from .paths import notebooks_root
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
            from .errors import ConfigError
            raise ConfigError(f"no notebook matches {n!r}; have: {', '.join(p.name for p in all_nbs)}")
        out += match
    return out


# Measured wall time of each notebook per profile, in seconds, on the project machine: 2 CPU cores,
# no GPU (quick: from an empty results folder on the idle machine; smoke: with other jobs loading
# both cores, so an idle machine is faster). What `reproduce` announces, and the README's table;
# how each was measured is in benchmarks/README.md. A missing entry is not measured.
MEASURED_ON = "2 CPU cores, no GPU"
NOTEBOOK_SECONDS: dict[tuple[str, str], float] = {
    ("00", "smoke"): 19, ("01", "smoke"): 31, ("02", "smoke"): 66, ("03", "smoke"): 11, ("04", "smoke"): 100,
    ("05", "smoke"): 18, ("06", "smoke"): 117,
    ("00", "quick"): 180, ("01", "quick"): 3650, ("02", "quick"): 1616, ("03", "quick"): 1524,
    ("04", "quick"): 2956, ("05", "quick"): 1340, ("06", "quick"): 2624,
}


def expected_time(notebook: str, profile: str, device: str = "cpu") -> str:
    """"about 4 min on 2 CPU cores, no GPU" from :data:`NOTEBOOK_SECONDS`, or "not measured"."""
    seconds = NOTEBOOK_SECONDS.get((notebook[:2], profile))
    if seconds is None:
        return "not measured"
    if device.startswith("cuda"):
        return "not measured on a GPU"
    return (f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min") + f" on {MEASURED_ON}"


def _parameters(items: list[str]) -> dict:
    """``-p KEY=VALUE`` (VALUE as JSON when it parses, else a string) for the parameters cell."""
    from .config import parse_setting_value
    from .errors import ConfigError
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
    from .errors import ConfigError
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
    from .errors import ConfigError
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
    one line, ``fairfl.sweeps``, which `reproduce` repeats) and papermill ends with that cell's
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


def _cmd_reproduce(args) -> int:
    from .paths import outputs_root

    parameters = _parameters(args.p or [])
    profile = _profile(args)
    notebooks = notebook_paths(args.notebooks)
    if parameters:
        check_parameters(notebooks, parameters)
    device = "cpu"
    if args.device is not None:   # checked now, then handed to the kernels (fairfl.notebook.start reads it)
        from .config import ExperimentConfig
        from .engine import resolve_device
        device = ExperimentConfig(device=args.device).device
        resolve_device(device)
        os.environ["FAIRFL_DEVICE"] = device
    if args.address and args.backend != "ray":
        from .errors import ConfigError
        raise ConfigError(f"--address {args.address} is the address of a Ray cluster: add --backend ray")
    if args.backend:         # handed to the kernels too: fairfl.sweeps.default_backend reads them
        os.environ["FAIRFL_BACKEND"] = args.backend
        if args.address:
            os.environ["FAIRFL_RAY_ADDRESS"] = args.address
    # the kernels' progress bars as text: a widget has no state in the executed notebook (fairfl.progress)
    os.environ.setdefault("FAIRFL_PROGRESS", "text")
    # A run with -p explores: its executed notebooks go beside the reproduced ones, never over them.
    out_dir = Path(args.output or outputs_root()) / profile / ("explore" if parameters else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    if parameters:           # and its figures beside them (fairfl.notebook.figure_dir), not over the reproduced ones
        from .paths import EXPLORE_ENV
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
    from .claims import summary
    t0 = time.time()
    target = out_dir / nb.name
    failed = out_dir / f"{nb.stem}.failed.ipynb"
    partial = out_dir / f".{nb.stem}.partial.ipynb"
    claims_file = out_dir / f"{nb.stem}.claims.json"
    # the verdicts go to a file of their own until the notebook has run to its end: those of the last
    # good notebook stay beside it (it was deleted when a notebook started)
    claims_partial = out_dir / f".{nb.stem}.claims.partial.json"
    claims_partial.unlink(missing_ok=True)
    os.environ["FAIRFL_CLAIMS_FILE"] = str(claims_partial)  # the kernel inherits it (fairfl.claims)
    given = "".join(f" {k}={v!r}" for k, v in parameters.items())
    expected = expected_time(nb.name, profile, device) if not parameters else "not measured (parameters changed)"
    print(f"start   {nb.name:<40} {time.strftime('%H:%M:%S')}  {profile}{given}; expected {expected}", flush=True)

    def interrupted(said: str | None) -> None:
        interrupt.stop_now = None           # said once: a later Ctrl-C only ends the process
        _keep_partial(partial, failed)
        claims_partial.unlink(missing_ok=True)
        kept = f"the last good one is kept at {target}" if target.is_file() else "there is no earlier executed one"
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
    seconds = time.time() - t0
    if interrupt.asked:
        interrupted(said)
        return "interrupted"
    interrupt.stop_now = None
    if error is not None:
        _keep_partial(partial, failed)
        claims_partial.unlink(missing_ok=True)
        print(f"FAILED  {nb.name:<40} {seconds:7.1f} s  {error}  (see {failed if failed.is_file() else target})")
        return "failed"
    os.replace(partial, target)
    if claims_partial.is_file():
        os.replace(claims_partial, claims_file)
    else:                                    # this notebook records no claims: none of an earlier one stay
        claims_file.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    print(f"ok      {nb.name:<40} {seconds:7.1f} s  {summary(claims_file)}  -> {target}")
    return "ok"


def _keep_partial(partial: Path, failed: Path) -> None:
    """A failed or interrupted notebook is kept as ``<name>.failed.ipynb``, beside the last good one."""
    if partial.is_file():
        os.replace(partial, failed)


def _show_tables(paths: list[str], where: list[str], fmt: str) -> int:
    """``fairfl results FILE.csv …``: the rows of tables a notebook wrote (``fairfl.protocol.write_table``),
    each after its kind, schema and protocol version, selected by ``--where COLUMN=VALUE``."""
    import json as _json

    from .errors import ConfigError
    from .protocol import read_table
    for path in paths:
        frame = read_table(path)
        for item in where:
            key, eq, value = item.partition("=")
            if not eq:
                raise ConfigError(f"--where {item!r}: write it as COLUMN=VALUE")
            if key not in frame.columns:
                raise ConfigError(f"--where {key}: {path} has no column {key!r}; it has {', '.join(frame.columns)}")
            column = frame[key]
            try:
                keep = column.astype(float) == float(value)
            except (TypeError, ValueError):
                keep = column.astype(str) == value
            frame = frame[keep]
        a = frame.attrs
        if fmt == "json":
            print(_json.dumps({"file": str(path), "table": a["kind"], "schema": a["schema"], "protocol": a["protocol"],
                               "rows": _json.loads(frame.to_json(orient="records"))}, indent=1))
        elif fmt == "csv":
            print(f"# fairfl table={a['kind']} schema={a['schema']} protocol={a['protocol']}")
            print(frame.to_csv(index=False), end="")
        else:
            print(f"{path}: table={a['kind']} schema={a['schema']} protocol={a['protocol']}, {len(frame)} rows")
            print(frame.to_string(index=False) if len(frame) else "(no row matches)")
    return 0


def _cmd_results(args) -> int:
    from .errors import ConfigError
    from .index import format_table, human_size, prune, rows, scan
    from .paths import results_root
    # files given after --where (which takes several values) are tables too
    tables = list(args.tables or []) + [w for w in args.where or [] if "=" not in w and Path(w).is_file()]
    args.where = [w for w in args.where or [] if w not in tables]
    if tables:
        if args.prune or args.root:
            from .errors import ConfigError
            raise ConfigError("--prune and --root apply to the run cache, not to CSV tables")
        return _show_tables(tables, args.where, args.format)
    root = Path(args.root) if args.root else results_root()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--root {root} is a file, not a results folder")
    if args.root and not root.exists():
        raise ConfigError(f"--root {root}: no such folder")
    # a folder of other things (a typo for the results folder, the repository itself) is said to be
    # one, not listed as unreadable runs, and --prune touches nothing there
    entries = scan(root)
    if entries and not any(e.config is not None or e.version is not None or e.finished or e.checkpoint
                           for e in entries):
        shown = ", ".join(e.folder.name for e in entries[:4]) + (", …" if len(entries) > 4 else "")
        raise ConfigError(f"{root} is not a run cache: none of its {len(entries)} folders ({shown}) is a run's entry "
                          f"(a folder with config.json); the run cache is {results_root()} ($FAIRFL_RESULTS moves it)")
    table = rows(root, args.where or [])             # a bad --where is named before anything is removed
    if args.prune:
        removed = prune(root)
        for entry, reason, size in removed:
            print(f"removed {entry.folder} ({human_size(size)}): {reason}", file=sys.stderr)
        print(f"pruned {len(removed)} stale entr{'y' if len(removed) == 1 else 'ies'}, "
              f"{human_size(sum(s for _, _, s in removed))} freed", file=sys.stderr)
        gone = {e.key for e, _, _ in removed}
        table = [r for r in table if r["key"] not in gone]
    print(format_table(table, args.format, where=args.where or [], root=root))
    return 0


def _cmd_list(args) -> int:
    from .algorithms import ALGORITHMS
    from .data import LOADERS
    from .models import MODELS
    print("algorithms:", ", ".join(sorted(ALGORITHMS)))
    print("models:    ", ", ".join(sorted(MODELS)))
    print("datasets:  ", ", ".join(sorted(LOADERS)))
    print("notebooks: ", ", ".join(p.name for p in notebook_paths([])))
    return 0


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class _Parser(argparse.ArgumentParser):
    """argparse, with a suggestion for a mistyped command (Python 3.11's argparse gives none)."""

    def error(self, message: str):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            message += _suggest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        super().error(message)


def _unrecognised(sub: argparse.ArgumentParser, extra: list[str]) -> None:
    """A flag the command does not take: its own usage and the flag it resembles (argparse alone
    printed the top-level usage, with no hint: `run --confg`)."""
    flags = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
    hint = next((_suggest(x.split("=", 1)[0], flags) for x in extra
                 if x.startswith("-") and _suggest(x.split("=", 1)[0], flags)), "")
    sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


# The modules of fairfl's dependencies (pyproject.toml), by the names they are imported under
DEPENDENCIES = {"torch", "torchvision", "numpy", "pandas", "scipy", "cvxpy", "quadprog", "matplotlib", "seaborn",
                "tqdm", "yaml", "papermill", "nbformat", "jupyter_client", "ipykernel", "ipywidgets", "IPython",
                "ray", "flwr"}

# What a Python outside fairfl's environment lacks first (a bare `python -m fairfl` in the repository):
# said in one line, with the commands that run fairfl where it is installed.
OUTSIDE = ("error: {module!r} is not installed in this Python ({python}), which is not fairfl's environment. "
           "Run fairfl from the environment scripts/setup.sh made: `source .venv/bin/activate`, then `fairfl ...` "
           "(or `.venv/bin/fairfl ...`); or install it into your own, from the repository: pip install \".[notebooks]\"")


def _interrupt_once(signum, frame) -> None:
    """Ctrl-C: KeyboardInterrupt once; a second one while the first unwinds (a checkpoint being
    closed, the line being said) changes nothing, instead of a traceback from the middle of it."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    from . import __version__
    p = _Parser(prog="fairfl", description=__doc__)
    p.add_argument("--version", action="version", version=f"fairfl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    d = sub.add_parser("data", help="prepare every dataset and report where it was found or what is missing")
    d.add_argument("names", nargs="*", help="datasets (default: all)")
    d.add_argument("--require", nargs="*", help="exit non-zero if one of these is missing")
    d.set_defaults(fn=_cmd_data)

    r = sub.add_parser("run", help="run one experiment (cached by its config hash)")
    r.add_argument("--config", help="YAML file with ExperimentConfig fields")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field, dotted for nested ones: --set algorithm=fedavg_n "
                        "--set algorithm.decay=0.1 --set local.lr=0.1")
    r.add_argument("--no-cache", action="store_true", help="train even if a cached result exists")
    r.add_argument("--device", help="'auto', 'cpu', 'cuda' or 'cuda:N' (default: the config's, else cpu)")
    r.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="a module that registers an algorithm of your own: a module name or a path to a .py file "
                        "(repeatable), e.g. --import my_algorithms.py")
    r.set_defaults(fn=_cmd_run)

    rp = sub.add_parser("reproduce", help="execute notebooks with papermill; figures go to figures/")
    rp.add_argument("notebooks", nargs="*", help="notebook names, prefixes (e.g. 00) or paths (default: all)")
    rp.add_argument("--profile", choices=PROFILES,
                    help="smoke | quick | paper (default: $FAIRFL_PROFILE, else quick); beats $FAIRFL_PROFILE")
    rp.add_argument("-p", action="append", metavar="KEY=VALUE",
                    help="a parameter for the notebooks' parameters cell, e.g. -p rounds=10 -p seeds=[0,1] "
                         "(claims are then recorded as not checked)")
    rp.add_argument("--quiet", action="store_true", help="do not stream the notebooks' output here")
    rp.add_argument("--output", help="folder for executed notebooks (default: outputs/)")
    rp.add_argument("--kernel", default="python3",
                    help="the Jupyter kernel that executes the notebooks (default: python3, this environment's)")
    rp.add_argument("--device", help="'auto', 'cpu', 'cuda' or 'cuda:N' for every run of the notebooks (default: cpu)")
    rp.add_argument("--backend", choices=("serial", "process", "ray"),
                    help="where the notebooks' sweeps run (default: worker processes on this machine; "
                         "ray: a Ray cluster, see --address)")
    rp.add_argument("--address", help="the Ray cluster for --backend ray: 'auto' (the one started on this machine "
                                      "with `ray start`), host:port, or ray://host:port (default: $FAIRFL_RAY_ADDRESS, "
                                      "else a local Ray instance)")
    rp.set_defaults(fn=_cmd_reproduce)

    rs = sub.add_parser("results", help="the index of cached runs: settings, rounds done, final metrics, size; "
                                        "or the rows of CSV tables a notebook wrote")
    rs.add_argument("tables", nargs="*", metavar="FILE",
                    help="CSV tables a notebook wrote (e.g. figures/06_one_protocol.csv): their rows, after their "
                         "kind, schema and protocol version; --where COLUMN=VALUE selects rows")
    rs.add_argument("--where", nargs="+", action="extend", metavar="KEY=VALUE",
                    help="only entries with these settings, e.g. --where algorithm=fedmgda_plus eps=0.1 local.lr=0.01 "
                         "(dotted config paths, or their last part where unambiguous)")
    rs.add_argument("--format", choices=("table", "csv", "json"), default="table",
                    help="table: a summary; csv and json: every setting too")
    rs.add_argument("--prune", action="store_true",
                    help="remove the entries of other cache versions (never read again), then list the rest")
    rs.add_argument("--root", help="results folder (default: $FAIRFL_RESULTS or <repo>/results)")
    rs.set_defaults(fn=_cmd_results)

    ls = sub.add_parser("list", help="algorithms, models, datasets, notebooks")
    ls.set_defaults(fn=_cmd_list)

    args, extra = p.parse_known_args(argv)
    if extra:
        _unrecognised(sub.choices[args.command], extra)
    import signal
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:     # not where SIGINT is ignored on purpose
        signal.signal(signal.SIGINT, _interrupt_once)
    from .errors import FairFLError
    try:
        return args.fn(args)
    except KeyboardInterrupt as e:
        # whenever it came (importing, training, waiting for another process): one line, exit status 130,
        # and a Ctrl-C while the process ends changes nothing
        previous = signal.SIG_IGN
        print(f"\n{e}" if isinstance(e, _Said) else f"\ninterrupted: fairfl {args.command} stopped",
              file=sys.stderr, flush=True)
        return 130
    except FairFLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if not e.name or e.name.split(".")[0] not in DEPENDENCIES:      # another module's: its own traceback
            raise
        print(OUTSIDE.format(module=e.name.split(".")[0], python=sys.executable), file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`fairfl results | head`): what was printed is what was asked for.
        # Python would report the pipe again when it flushes stdout at exit; point stdout at
        # devnull first (the recipe of Python's documentation on SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        # an in-process caller gets its handler back; an interrupted process keeps ignoring Ctrl-C as it ends
        if signal.getsignal(signal.SIGINT) is _interrupt_once or previous is signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
