"""``python -m fairfl``: data / run / reproduce / list."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .claims import PROFILES


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


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _set(d: dict, dotted: str, value) -> None:
    """``--set a.b=v``. A new algorithm name starts from that algorithm's defaults
    (``--set algorithm=fedfv --set algorithm.alpha=0.5``)."""
    from .errors import ConfigError
    keys = dotted.split(".")
    if keys == ["algorithm"] and isinstance(value, str):
        value = {"name": value}
    for i, k in enumerate(keys[:-1]):
        if k == "algorithm" and isinstance(d.get(k), str):
            d[k] = {"name": d[k]}
        inner = d.setdefault(k, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(keys[:i + 1])} is {inner!r}, not a group of settings")
        d = inner
    d[keys[-1]] = value


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
        _set(base, k, _parse_value(v))
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


def _cmd_reproduce(args) -> int:
    import papermill as pm
    from .claims import summary
    from .paths import outputs_root

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
    out_dir = Path(args.output or outputs_root()) / args.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    for nb in notebook_paths(args.notebooks):
        t0 = time.time()
        target = out_dir / nb.name
        claims_file = out_dir / f"{nb.stem}.claims.json"
        claims_file.unlink(missing_ok=True)
        os.environ["FAIRFL_CLAIMS_FILE"] = str(claims_file)  # the kernel inherits it (fairfl.claims)
        try:
            pm.execute_notebook(str(nb), str(target), parameters={"profile": args.profile},
                                kernel_name=args.kernel, progress_bar=False, cwd=str(nb.parent))
            print(f"ok      {nb.name:<40} {time.time() - t0:7.1f} s  {summary(claims_file)}  -> {target}")
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's error
            failures += 1
            msg = str(e).strip().splitlines()
            print(f"FAILED  {nb.name:<40} {time.time() - t0:7.1f} s  {msg[-1] if msg else type(e).__name__}"
                  f"  (see {target})")
        finally:
            os.environ.pop("FAIRFL_CLAIMS_FILE", None)
    return 1 if failures else 0


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
    rp.add_argument("--profile", choices=PROFILES, default="quick")
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
