"""``fairfl run``: one experiment from a YAML file and ``--set`` overrides, cached by its config
(``fairfl.runs.sweeps.run``); ``--import`` of modules that register algorithms of your own; what a
Ctrl-C leaves (:class:`Said`: one line, exit status 130)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def import_modules(items: list[str]) -> None:
    """``--import``: modules that register algorithms of your own (``@register`` runs on import),
    by module name (importable from here) or as a path to a ``.py`` file. A file's folder is put
    on ``sys.path`` and the file imported by its name, so that worker processes, which import an
    algorithm's module by name, find it too."""
    import importlib
    from fairfl.base.errors import ConfigError
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


def cmd_run(args) -> int:
    from fairfl.runs.config import ExperimentConfig, parse_setting_value, set_dotted
    from fairfl.base.errors import ConfigError
    from fairfl.runs.sweeps import run, run_dir
    from fairfl.federated import metrics

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
        raise Said(_run_interrupted(cfg, args.no_cache)) from None
    acc = h.final_acc()
    where = "not cached (--no-cache)" if args.no_cache else f"results in {run_dir(cfg)}"
    print(f"{cfg.label()}: {h.rounds_done} rounds in {time.time() - t0:.1f} s; "
          f"final client accuracy (%) mean {100 * metrics.mean(acc):.2f}, std {100 * metrics.std(acc):.2f}, "
          f"worst 10 % {100 * metrics.worst(acc):.2f}; {where}")
    return 0


class Said(KeyboardInterrupt):
    """A Ctrl-C whose one line is its message (printed by :func:`main`, exit status 130)."""


def _run_interrupted(cfg, no_cache: bool) -> str:
    """What a Ctrl-C during `fairfl run` leaves: the run's checkpoint, or another process training it."""
    from fairfl.runs.cache import Claim
    from fairfl.base.progress import read
    from fairfl.runs.sweeps import run_dir
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
