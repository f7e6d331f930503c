#!/usr/bin/env bash
# Install pfl-research (pfl 0.6.0) for benchmarks/pfl_round.py into .pfl/ (git-ignored): the packages of
# benchmarks/requirements-pfl.txt, --no-deps, with the project's .venv Python. pfl_round.py runs pfl with
# that same Python and .pfl/ first on PYTHONPATH, so pfl trains with .venv's torch and numpy; .venv itself
# is not changed. Idempotent: a second run only checks a stamp (the requirements' and Python's hash), so
# `make test` can call it. About 7 s from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TARGET=${PFL_TARGET:-.pfl}
REQ=benchmarks/requirements-pfl.txt

# the stamp: the pinned list and the Python it was installed for (dm-tree and wrapt are compiled wheels)
want=$({ cat "$REQ"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
if [ "$(cat "$TARGET/.installed" 2>/dev/null)" != "$want" ]; then
  echo "== installing pfl and its missing requirements into $TARGET/"
  rm -rf "$TARGET"
  # pip, without this machine's warnings about absent local index folders (exit status kept)
  if ! "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$TARGET" -r "$REQ" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; }; then
    echo "error: pip could not install $REQ into $TARGET/" >&2
    exit 1
  fi
  # Every requirement of what was installed (pfl's own with its 'pytorch' extra) is met by $TARGET/ and
  # .venv together, and torch and numpy are .venv's: a mismatch fails here, not in a benchmark.
  PYTHONPATH="$TARGET" "$PY" - "$TARGET" <<'EOF'
import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement

target = Path(sys.argv[1]).resolve()
problems = []
for dist in md.distributions(path=[str(target)]):
    extras = ("", "pytorch") if dist.metadata["Name"] == "pfl" else ("",)
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{dist.metadata['Name']} needs {req}, which is not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            problems.append(f"{dist.metadata['Name']} needs {req}, found {have}")
for name in ("torch", "numpy"):
    where = Path(md.distribution(name).locate_file("")).resolve()
    if where == target or target in where.parents:
        problems.append(f"{name} was installed into {target}: pfl must use .venv's")
if problems:
    sys.exit("error: " + "; ".join(problems))
EOF
  echo "$want" > "$TARGET/.installed"
fi
echo "pfl environment: $TARGET/ ($(sed -n 's/^Version: //p' "$TARGET"/pfl-*.dist-info/METADATA | head -1))"
