"""``python -m fairfl``: data / run / reproduce / results / list."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .claims import PROFILES
from .config import parse_setting_value, set_dotted


def _cmd_data(args) -> int:
    from .data import report
    rows = report(args.names or None)
    width = max(len(r[0]) for r in rows)
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status:<7}  {detail}")
    required = set(args.require or [])
    missing = [r[0] for r in rows if r[1] != "ok" and r[0] in required]
    if missing:
        print(f"required datasets missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def _cmd_run(args) -> int:
    from .config import ExperimentConfig
    from .errors import ConfigError
    from .sweeps import run, run_dir
    from . import metrics

    base = ExperimentConfig.from_yaml(args.config).to_dict() if args.config else ExperimentConfig().to_dict()
    for item in args.set or []:
        if "=" not in item:
            raise ConfigError(f"--set takes KEY=VALUE (e.g. local.lr=0.1), got {item!r}")
        k, v = item.split("=", 1)
        set_dotted(base, k, parse_setting_value(v))
    if args.device:
        base["device"] = args.device
    cfg = ExperimentConfig.from_dict(base).validate()
    t0 = time.time()
    h = run(cfg, cache=not args.no_cache)
    acc = h.final_acc()
    where = "not cached (--no-cache)" if args.no_cache else f"results in {run_dir(cfg)}"
    print(f"{cfg.label()}: {h.rounds_done} rounds in {time.time() - t0:.1f} s; "
          f"final accuracy mean {metrics.mean(acc):.4f}, std {metrics.std(acc):.4f}, "
          f"worst10% {metrics.worst(acc):.4f}; {where}")
    return 0


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
            raise SystemExit(f"no notebook matches {n!r}; have: {', '.join(p.name for p in all_nbs)}")
        out += match
    return out


# Measured wall time of each notebook per profile on the project machine (2 cores, no GPU), in
# seconds: what `reproduce` announces, and the README's table. quick: a fresh-clone `make figures`
# on 2026-11-23 (sweep engine, commit ede32e2) for 00 and 02; 01 at 5 seeds, 2.5 x its 2-seed
# time; 03-05 by `reproduce 03 04 05 --profile quick` from an empty results folder on the idle
# machine, 2026-11-24 (commit 4502a33). smoke: `reproduce --profile smoke` on 2026-11-23 (commit
# d5f1b5c) while other jobs loaded both cores (load 8-14), so an idle machine is faster. A missing
# entry is not measured.
NOTEBOOK_SECONDS: dict[tuple[str, str], float] = {
    ("00", "smoke"): 19, ("01", "smoke"): 31, ("02", "smoke"): 66, ("03", "smoke"): 11, ("04", "smoke"): 28,
    ("05", "smoke"): 18,
    ("00", "quick"): 180, ("01", "quick"): 3650, ("02", "quick"): 1616, ("03", "quick"): 1524,
    ("04", "quick"): 1748, ("05", "quick"): 1340,
}


def expected_time(notebook: str, profile: str) -> str:
    """"about 4 min" from :data:`NOTEBOOK_SECONDS`, or "not measured"."""
    seconds = NOTEBOOK_SECONDS.get((notebook[:2], profile))
    if seconds is None:
        return "not measured"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"


def _parameters(items: list[str]) -> dict:
    """``-p KEY=VALUE`` (VALUE as JSON when it parses, else a string) for the parameters cell."""
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


def _profile(args) -> str:
    """An explicit --profile beats $FAIRFL_PROFILE (which is then not handed to the kernels, whose
    notebooks would otherwise prefer it); without --profile, $FAIRFL_PROFILE, else quick."""
    from .errors import ConfigError
    env = os.environ.get("FAIRFL_PROFILE")
    if env is not None and env not in PROFILES:
        raise ConfigError(f"FAIRFL_PROFILE={env!r} is not one of {', '.join(PROFILES)}")
    if args.profile is None:
        return env or "quick"
    if env is not None:
        if env != args.profile:
            print(f"--profile {args.profile} beats FAIRFL_PROFILE={env} from the environment")
        del os.environ["FAIRFL_PROFILE"]
    return args.profile


def _cmd_reproduce(args) -> int:
    import papermill as pm
    from .claims import summary
    from .paths import outputs_root

    parameters = _parameters(args.p or [])
    profile = _profile(args)
    if args.device:          # checked now, then handed to the kernels (fairfl.notebook.start reads it)
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
    out_dir = Path(args.output or outputs_root()) / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    for nb in notebook_paths(args.notebooks):
        t0 = time.time()
        target = out_dir / nb.name
        claims_file = out_dir / f"{nb.stem}.claims.json"
        claims_file.unlink(missing_ok=True)
        os.environ["FAIRFL_CLAIMS_FILE"] = str(claims_file)  # the kernel inherits it (fairfl.claims)
        given = "".join(f" {k}={v!r}" for k, v in parameters.items())
        print(f"start   {nb.name:<40} {time.strftime('%H:%M:%S')}  {profile}{given}; expected "
              f"{expected_time(nb.name, profile) if not parameters else 'not measured (parameters changed)'}",
              flush=True)
        try:
            # the kernel's output is streamed here as it comes (progress bars, the claims' verdicts)
            stream = {} if args.quiet else {"log_output": True, "stdout_file": sys.stdout, "stderr_file": sys.stderr}
            pm.execute_notebook(str(nb), str(target), parameters={"profile": profile, **parameters},
                                kernel_name=args.kernel, progress_bar=False, cwd=str(nb.parent), **stream)
            print(f"ok      {nb.name:<40} {time.time() - t0:7.1f} s  {summary(claims_file)}  -> {target}")
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
            failures += 1
            msg = str(e).strip().splitlines()
            print(f"FAILED  {nb.name:<40} {time.time() - t0:7.1f} s  {msg[-1] if msg else type(e).__name__}"
                  f"  (see {target})")
        finally:
            os.environ.pop("FAIRFL_CLAIMS_FILE", None)
    return 1 if failures else 0


def _cmd_results(args) -> int:
    from .index import format_table, human_size, prune, rows
    from .paths import results_root
    root = Path(args.root) if args.root else results_root()
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairfl", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

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
    rp.add_argument("--kernel", default="python3")
    rp.add_argument("--device", help="'auto', 'cpu', 'cuda' or 'cuda:N' for every run of the notebooks (default: cpu)")
    rp.add_argument("--backend", choices=("serial", "process", "ray"),
                    help="where the notebooks' sweeps run (default: worker processes on this machine; "
                         "ray: a Ray cluster, see --address)")
    rp.add_argument("--address", help="the Ray cluster for --backend ray: 'auto' (the one started on this machine "
                                      "with `ray start`), host:port, or ray://host:port (default: $FAIRFL_RAY_ADDRESS, "
                                      "else a local Ray instance)")
    rp.set_defaults(fn=_cmd_reproduce)

    rs = sub.add_parser("results", help="the index of cached runs: settings, rounds done, final metrics, size")
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

    args = p.parse_args(argv)
    from .errors import FairFLError
    try:
        return args.fn(args)
    except FairFLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
