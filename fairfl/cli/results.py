"""``fairfl results``: the index of cached runs (settings, rounds done, final metrics, size),
``--where`` to select and ``--prune`` to remove stale entries; or the rows of the CSV tables a
notebook wrote (``fairfl.studies.protocol.write_table``)."""
from __future__ import annotations

import sys
from pathlib import Path


def _show_tables(paths: list[str], where: list[str], fmt: str) -> int:
    """``fairfl results FILE.csv …``: the rows of tables a notebook wrote (``fairfl.studies.protocol.write_table``),
    each after its kind, schema and protocol version, selected by ``--where COLUMN=VALUE``."""
    import json as _json

    from fairfl.base.errors import ConfigError
    from fairfl.studies.protocol import read_table
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


def cmd_results(args) -> int:
    from fairfl.base.errors import ConfigError
    from fairfl.runs.index import format_table, human_size, prune, rows, scan
    from fairfl.base.paths import results_root
    # files given after --where (which takes several values) are tables too
    tables = list(args.tables or []) + [w for w in args.where or [] if "=" not in w and Path(w).is_file()]
    args.where = [w for w in args.where or [] if w not in tables]
    if tables:
        if args.prune or args.root:
            from fairfl.base.errors import ConfigError
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
