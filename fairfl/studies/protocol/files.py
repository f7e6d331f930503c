"""The CSV files a benchmark writes (:func:`write_table`) and reads back (:func:`read_table`):
a first line naming the table's kind, the version of its columns (:data:`SCHEMAS`) and the
protocol's; gzip without a time stamp, written atomically."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fairfl.base.errors import ConfigError

# ----------------------------------------------------------------------------- files

# the CSV files a benchmark writes, and the version of each one's columns; a reader refuses a
# file of a kind or schema it does not know
SCHEMAS = {"summary": 3, "runs": 2, "claims": 2, "pilot": 1}
_HEADER = "# fairfl"


def write_table(frame: pd.DataFrame, path: Path | str, kind: str, protocol: str) -> Path:
    """Write ``frame`` as CSV (gzip-compressed where the name ends in .gz, with no time stamp, so
    that the same table gives the same bytes) after one first line, ``# fairfl table=<kind>
    schema=<n> protocol=<protocol>``: what the file is, the version of its columns and of the
    protocol that made it. Atomic."""
    from fairfl.base.atomic import atomic_write
    if kind not in SCHEMAS:
        raise ConfigError(f"unknown table kind {kind!r}; choose from {sorted(SCHEMAS)}")
    if not protocol or any(c.isspace() for c in str(protocol)):
        raise ConfigError(f"protocol must be a version without spaces, got {protocol!r}")
    header = f"{_HEADER} table={kind} schema={SCHEMAS[kind]} protocol={protocol}\n"
    text = header + frame.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    path = Path(path)

    def write(p: Path) -> None:
        if path.suffix == ".gz":
            import gzip
            with open(p, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
                f.write(text.encode())
        else:
            Path(p).write_text(text)
    atomic_write(path, write)
    return path


def read_table(path: Path | str, schema: int | None = None) -> pd.DataFrame:
    """A table written by :func:`write_table`: its rows, with ``attrs`` holding its kind, schema
    and protocol. A file without the header, or of another kind or schema version, is refused
    with a :class:`ConfigError` that says which; ``schema`` names an earlier version the caller
    knows how to read (protocol 6.2's claims file, schema 1, read beside 6.3's)."""
    import gzip
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            first = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable table ({e})") from None
    fields = dict(part.split("=", 1) for part in first[len(_HEADER):].split() if "=" in part)
    if not first.startswith(_HEADER) or not {"table", "schema", "protocol"} <= set(fields):
        raise ConfigError(f"{path}: not a fairfl table (its first line should be "
                          f"'{_HEADER} table=... schema=... protocol=...', it is {first[:80]!r})")
    kind = fields["table"]
    found = fields["schema"]
    if kind not in SCHEMAS or found != str(SCHEMAS[kind] if schema is None else schema):
        raise ConfigError(f"{path}: a {kind!r} table of schema {found}; this fairfl reads "
                          + ", ".join(f"{k} schema {v}" for k, v in SCHEMAS.items())
                          + ("" if schema is None else f" (asked for schema {schema})"))
    frame = pd.read_csv(path, skiprows=1, keep_default_na=True)
    frame.attrs.update(kind=kind, schema=int(found), protocol=fields["protocol"])
    return frame
