"""The ``fairfl`` command (``python -m fairfl``): the parser and :func:`main`, which runs a command
and turns its errors and a Ctrl-C into one line and an exit status; :func:`console`, the
installed script; the ``data`` and ``list`` commands. Each family of commands has its module:
:mod:`~fairfl.cli.run`, :mod:`~fairfl.cli.reproduce`, :mod:`~fairfl.cli.results`."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from contextlib import contextmanager

# Only light modules here: `python -m fairfl --help` must not wait for torch. Each command imports
# what it needs.
from fairfl.base.profiles import PROFILES
from .reproduce import (KERNEL_ARGUMENTS, MEASURED_ON, NOTEBOOK_SECONDS, check_parameters,  # noqa: F401
                        cmd_reproduce, expected_time, notebook_paths)
from .results import cmd_results
from .run import Said, cmd_run, import_modules  # noqa: F401

# what `fairfl --help` says first
DESCRIPTION = "fairfl: data / run / reproduce / results / list."


def _cmd_data(args) -> int:
    from fairfl.federated.data import report
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


def _cmd_list(args) -> int:
    from fairfl.federated.algorithms import ALGORITHMS
    from fairfl.federated.data import LOADERS
    from fairfl.federated.models import MODELS
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


@contextmanager
def interrupts_deferred():
    """Ctrl-C inside the block is held until the block ends, then handed to the handler it would have
    reached (``_interrupt_once``, Python's default: KeyboardInterrupt; an ignored SIGINT stays ignored). For
    ``import torch``: its import runs Python code from C++ (pybind11), and a KeyboardInterrupt raised
    there cannot unwind through it: the process ended with "terminate called after throwing an
    instance of 'pybind11::error_already_set'" and SIGABRT instead of the one line and status 130
    (a Ctrl-C in a command's first second, seen once in a fresh-clone test run)."""
    import signal
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held and callable(previous):     # what the Ctrl-C would have done (nothing where SIGINT is ignored)
        previous(signal.SIGINT, None)


def main(argv: list[str] | None = None) -> int:
    from fairfl import __version__
    p = _Parser(prog="fairfl", description=DESCRIPTION)
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
    r.set_defaults(fn=cmd_run)

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
    rp.set_defaults(fn=cmd_reproduce)

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
    rs.set_defaults(fn=cmd_results)

    ls = sub.add_parser("list", help="algorithms, models, datasets, notebooks")
    ls.set_defaults(fn=_cmd_list)

    args, extra = p.parse_known_args(argv)
    if extra:
        _unrecognised(sub.choices[args.command], extra)
    import signal
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:     # not where SIGINT is ignored on purpose
        signal.signal(signal.SIGINT, _interrupt_once)
    from fairfl.base.errors import FairFLError
    try:
        with interrupts_deferred():         # every command imports torch: here, where Ctrl-C can wait for it
            import torch  # noqa: F401
        return args.fn(args)
    except KeyboardInterrupt as e:
        # whenever it came (importing, training, waiting for another process): one line, exit status 130,
        # and a Ctrl-C while the process ends changes nothing
        previous = signal.SIG_IGN
        print(f"\n{e}" if isinstance(e, Said) else f"\ninterrupted: fairfl {args.command} stopped",
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
