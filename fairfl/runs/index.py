"""The index of the run cache: what every entry holds, as a table.

``python -m fairfl results [--where KEY=VALUE …] [--format table|csv|json] [--prune]`` and, from
Python, ``fairfl.results(**where)`` (a pandas DataFrame) read the cache's folders
(``fairfl.runs.cache``): each entry's config, how many of its rounds are done (from its history, or
from its checkpoint while it trains), its final metrics, its size on disk and the cache version it
was written under. ``prune`` removes the entries no version of the code will read again.

Settings are named by their dotted path in the config (``local.lr``, ``partition.scheme``,
``algorithm.eps``; ``algorithm`` is the algorithm's name), or by their last part where that is
unambiguous (``eps``, ``lr``). The explorer (``fairfl.studies.explorer``) reads the cache through
:func:`scan` and :func:`load_history`, which keeps loaded histories in memory while their files are
unchanged.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .cache import FILES, VERSION_FILE
from .config import CACHE_VERSION
from fairfl.base.errors import ConfigError, FairFLError
from .history import CHECKPOINT, History
from fairfl.base.paths import results_root

# the columns of the summary table, in order (the DataFrame has every setting after them)
SUMMARY = ["key", "dataset", "model", "algorithm", "seed", "rounds_done", "rounds", "state", "mean_acc", "std_acc",
           "worst10_acc", "best10_acc", "train_loss", "size", "version"]
# what the index measures (not settings): --where can select on these too
MEASURED = {"rounds_done", "state", "mean_acc", "std_acc", "worst10_acc", "best10_acc", "train_loss", "size",
            "size_bytes", "version", "stale", "checkpoint"}


# ----------------------------------------------------------------------------- settings as flat keys

def flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict as {dotted setting: value}: nested groups spelt out (``local.lr``), the
    algorithm's name under ``algorithm``, lists as tuples (hashable, comparable)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = _hashable(value)
    walk("", config)
    if "algorithm.name" in out:
        out["algorithm"] = out.pop("algorithm.name")
    return out


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True)
    return value


def known_settings() -> set[str]:
    """Every setting a config can have: the default config's and every registered algorithm's."""
    from fairfl.federated.algorithms import ALGORITHMS, make_algorithm
    from .config import ExperimentConfig
    keys = set(flatten(ExperimentConfig().to_dict()))
    for name in ALGORITHMS:
        try:
            keys |= {f"algorithm.{k}" for k in make_algorithm(name).options()}
        except FairFLError:          # an algorithm without defaults for every option
            continue
    return keys


# ----------------------------------------------------------------------------- entries

@dataclass
class Entry:
    """One folder of the cache, read without loading its history."""

    folder: Path
    config: dict | None                     # config.json (None: missing or unreadable)
    finished: bool                          # history.json + history.npz present
    checkpoint: bool                        # checkpoint.pt present (a run under way or interrupted)
    version: int | None                     # the cache version recorded when it was made (None: not recorded)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.folder.name

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())

    def stamp(self) -> tuple:
        """Changes whenever the entry's history is written again."""
        try:
            st = (self.folder / "history.json").stat()
        except OSError:
            return ()
        return (st.st_mtime_ns, st.st_size)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def scan(root: Path | str | None = None) -> list[Entry]:
    """Every entry folder under the results root (sorted by name); nothing is trained or removed."""
    root = Path(root) if root is not None else results_root()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config = _read_json(d / "config.json")
        config = config if isinstance(config, dict) else None
        version = _read_json(d / VERSION_FILE)
        version = version.get("cache_version") if isinstance(version, dict) else None
        out.append(Entry(d, config, all((d / f).is_file() for f in FILES), (d / CHECKPOINT).is_file(),
                         version if isinstance(version, int) else None, flatten(config) if config else {}))
    return out


# Loaded histories, kept while their files are unchanged: the explorer redraws without reading
# the disk, and a run that is trained again (or replaced) is read again.
_HISTORIES: dict[Path, tuple[tuple, History]] = {}


def load_history(entry: Entry) -> History | None:
    """The finished history of ``entry`` (checked, memoised by the file's stamp), or None if it
    has none or cannot be read."""
    if not entry.finished:
        return None
    stamp = entry.stamp()
    hit = _HISTORIES.get(entry.folder)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        history = History.load(entry.folder)
    except FairFLError:
        return None
    _HISTORIES[entry.folder] = (stamp, history)
    return history


def _checkpoint_round(folder: Path) -> int | None:
    import torch
    try:
        return int(torch.load(folder / CHECKPOINT, weights_only=True)["round"])
    except Exception:  # noqa: BLE001 - an unreadable checkpoint shows as "?"
        return None


# ----------------------------------------------------------------------------- --where

def parse_where(items: Iterable[str | tuple[str, Any]] | Mapping[str, Any],
                entries: Sequence[Entry] = ()) -> dict[str, Any]:
    """``["eps=0.1", "local.lr=0.01"]`` (items may also be (setting, value) pairs, or a mapping)
    as {setting: value}: values read as JSON where they are (numbers, true/false, null), else as
    text; a setting named by its last part is spelt out. A malformed item, or a setting no config
    has, is one ConfigError naming it."""
    pairs = list(items.items()) if isinstance(items, Mapping) else []
    if not isinstance(items, Mapping):
        for item in items:
            if isinstance(item, tuple) and len(item) == 2:
                pairs.append(item)
                continue
            if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
                raise ConfigError(f"--where takes KEY=VALUE (e.g. algorithm=fedavg, eps=0.1, local.lr=0.01), got {item!r}")
            k, v = item.split("=", 1)
            try:
                value = json.loads(v)
            except ValueError:
                value = v
            pairs.append((k.strip(), value))
    known = known_settings() | {k for e in entries for k in e.settings} | MEASURED | {"key"}
    out = {}
    for k, v in pairs:
        out[_resolve(k, known)] = _hashable(v)
    return out


def _resolve(key: str, known: set[str]) -> str:
    if key in known:
        return key
    matches = sorted(k for k in known if k.endswith(f".{key}"))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(f"--where {key}=…: {key!r} is ambiguous, name one of {', '.join(matches)}")
    close = sorted(k for k in known if key.lower() in k.lower())
    hint = f"; did you mean {', '.join(close[:6])}?" if close else \
        f"; settings are dotted config paths such as {', '.join(sorted(k for k in known if '.' not in k)[:12])}, …"
    raise ConfigError(f"--where {key}=…: no config has a setting {key!r}{hint}")


def _equal(have: Any, want: Any) -> bool:
    if isinstance(want, bool) or isinstance(have, bool):
        return have is want or (isinstance(want, str) and str(have).lower() == want.lower())
    if isinstance(have, (int, float)) and isinstance(want, (int, float)):
        return math.isclose(have, want, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, str) and not isinstance(have, str):
        return str(have) == want or (have is None and want.lower() in ("none", "null"))
    return have == want


def matches(settings: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    return all(k in settings and _equal(settings[k], v) for k, v in where.items())


# ----------------------------------------------------------------------------- the table

def _final_metrics(history: History) -> dict[str, float]:
    from fairfl.federated import metrics
    acc = history.final_acc()
    acc = acc.mean(axis=-1) if acc.ndim == 2 else acc         # per objective (FMOL): their mean per client
    acc = acc[np.isfinite(acc)]
    loss = np.asarray(history.train_loss[-1], dtype=np.float64)
    row = {"train_loss": float(np.mean(loss))}
    if acc.size:
        row.update(mean_acc=metrics.mean(acc), std_acc=metrics.std(acc), worst10_acc=metrics.worst(acc, 0.1),
                   best10_acc=metrics.best(acc, 0.1))
    return row


def human_size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def rows(root: Path | str | None = None, where: Iterable[str | tuple[str, Any]] | Mapping[str, Any] = ()
         ) -> list[dict[str, Any]]:
    """One dict per entry matching ``where``: the summary columns, then every setting."""
    entries = scan(root)
    want = parse_where(where, entries)
    by_setting = {k: v for k, v in want.items() if k not in MEASURED}
    by_summary = {k: v for k, v in want.items() if k not in by_setting}
    out = []
    for e in entries:
        if not matches({**e.settings, "key": e.key}, by_setting):
            continue
        s = e.settings
        row: dict[str, Any] = {"key": e.key, "dataset": s.get("dataset"), "model": s.get("model"),
                               "algorithm": _algorithm_label(e.config), "seed": s.get("seed"),
                               "rounds": s.get("rounds"), "rounds_done": None, "state": "not started"}
        if e.finished:
            history = load_history(e)
            if history is None:
                row["state"] = "unreadable"
            else:
                row.update(rounds_done=history.rounds_done, state="finished", **_final_metrics(history))
        elif e.checkpoint:
            r = _checkpoint_round(e.folder)
            row.update(rounds_done=r, state="mid-way" if r is not None else "checkpoint unreadable")
        elif e.config is None:
            row["state"] = "no config"
        size = e.size()
        row.update(size=human_size(size), size_bytes=size, checkpoint=e.checkpoint,
                   version=e.version, stale=None if e.version is None else e.version != CACHE_VERSION)
        row.update({f"config.{k}": v for k, v in s.items()})
        if matches(row, by_summary):
            out.append(row)
    return out


def _algorithm_label(config: Mapping[str, Any] | None) -> str | None:
    """``name(option=value, …)``: a known algorithm's options that differ from their defaults
    (``Algorithm.label``). An algorithm this process does not know (registered in a module not
    imported here, or whose options no longer validate) has no defaults to compare with: every
    option its config recorded is shown, so that runs with different options stay apart. Without
    spaces (``fedfv(alpha=0.1,tau=1)``): the text table's columns stay split by whitespace."""
    if not config or not isinstance(config.get("algorithm"), Mapping):
        return None
    try:
        from fairfl.federated.algorithms import make_algorithm
        label = make_algorithm(dict(config["algorithm"])).label()
    except FairFLError:
        spec = dict(config["algorithm"])
        name = spec.pop("name", None)
        options = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in spec.items())
        label = f"{name}({options})" if options else str(name)
    return label.replace(", ", ",")


def results(where: Iterable[str] | Mapping[str, Any] | None = None, root: Path | str | None = None,
            **settings: Any):
    """The cache index as a pandas DataFrame, one row per entry (index: the entry's key): the
    summary columns, then every setting as ``config.<dotted path>``. Select with ``where``
    (``["eps=0.1"]`` or a mapping) or keyword arguments (``results(algorithm="fedavg", seed=0)``)."""
    import pandas as pd
    if isinstance(where, str):
        where = [where]
    if isinstance(where, Mapping):
        settings = {**where, **settings}
        where = None
    where = [*(where or []), *settings.items()]
    table = pd.DataFrame(rows(root, where))
    if table.empty:
        return pd.DataFrame(columns=SUMMARY[1:] + ["size_bytes", "checkpoint", "stale"],
                            index=pd.Index([], name="key"))
    return table.set_index("key")


def format_table(table_rows: Sequence[Mapping[str, Any]], fmt: str = "table",
                 where: Iterable[str | tuple[str, Any]] | Mapping[str, Any] = (), root: Path | str | None = None) -> str:
    """The rows as an aligned text table (summary columns), CSV or JSON (every column). ``where``
    and ``root``, what the rows were selected by and from, let an empty table say whether the
    cache is empty or nothing in it matches."""
    import pandas as pd
    if fmt == "json":
        return json.dumps([{k: _jsonable(v) for k, v in r.items()} for r in table_rows], indent=1)
    frame = pd.DataFrame(list(table_rows))
    if fmt == "csv":
        return frame.to_csv(index=False)
    if frame.empty:
        return _nothing_shown(where, root)
    shown = frame[[c for c in SUMMARY if c in frame.columns]].copy()
    # accuracies in % (81.25, headed mean_acc%), as every figure, notebook table and the explorer
    # show them; CSV and JSON keep the stored fractions, for programs
    for c, scale, digits in (("mean_acc", 100, 2), ("std_acc", 100, 2), ("worst10_acc", 100, 2),
                             ("best10_acc", 100, 2), ("train_loss", 1, 4)):
        if c in shown:
            shown[c] = shown[c].map(lambda v, scale=scale, digits=digits: "" if v is None or (
                isinstance(v, float) and math.isnan(v)) else f"{scale * v:.{digits}f}")
    shown = shown.rename(columns={c: f"{c}%" for c in ("mean_acc", "std_acc", "worst10_acc", "best10_acc")})
    shown["rounds_done"] = shown["rounds_done"].map(lambda v: "?" if v is None or v != v else str(int(v)))
    shown["version"] = shown["version"].map(lambda v: "?" if v is None or v != v else str(int(v)))
    return shown.fillna("").to_string(index=False)


def _nothing_shown(where: Iterable[str | tuple[str, Any]] | Mapping[str, Any], root: Path | str | None) -> str:
    """What an empty table says: "(no cached runs)" only when the cache really has none; else
    that the selection matched nothing, so that it does not read as an empty cache."""
    items = list(where.items()) if isinstance(where, Mapping) else list(where)
    n = len(scan(root))
    if not items or not n:
        return "(no cached runs)"
    asked = " ".join(f"{i[0]}={i[1]}" if isinstance(i, tuple) else str(i) for i in items)
    place = Path(root) if root is not None else results_root()
    return f"no cached run matches {asked} ({n} run{'s' * (n != 1)} in {place})"


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


# ----------------------------------------------------------------------------- prune

def stale_reason(entry: Entry) -> str | None:
    """Why no version of the code will read ``entry`` again, or None if it may be read.

    An entry records the cache version it was written under (``version.json``); one written
    under another version is stale. An entry from before that record is checked by its name:
    its config, read by this code, must hash to it (``fairfl.runs.cache.key``, which includes the
    cache version and the data's fingerprint). Where that cannot be told (its data is not on this
    machine, an algorithm from a module not imported), it is kept."""
    if entry.version is not None:
        return None if entry.version == CACHE_VERSION else \
            f"written under cache version {entry.version}, the code is at {CACHE_VERSION}"
    if entry.config is None:
        return None
    from . import cache
    from .config import ExperimentConfig
    try:
        key = cache.key(ExperimentConfig.from_dict(entry.config), entry.folder.parent)
    except ConfigError as e:
        if "unknown algorithm" in str(e):
            return None
        return f"its config is no longer valid ({e})"
    except (FairFLError, OSError):                 # its data is not here: cannot tell
        return None
    return None if key == entry.key else "its config hashes to another entry (an older cache version)"


def prune(root: Path | str | None = None, dry_run: bool = False) -> list[tuple[Entry, str, int]]:
    """Remove the stale entries (:func:`stale_reason`); returns (entry, reason, bytes) of each."""
    removed = []
    for e in scan(root):
        reason = stale_reason(e)
        if reason is None:
            continue
        size = e.size()
        if not dry_run:
            shutil.rmtree(e.folder, ignore_errors=True)
            _HISTORIES.pop(e.folder, None)
        removed.append((e, reason, size))
    return removed


__all__ = ["Entry", "scan", "load_history", "flatten", "parse_where", "matches", "rows", "results", "format_table",
           "prune", "stale_reason", "human_size"]
