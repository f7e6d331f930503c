"""The notebooks in the form JupyterLab saves them, without outputs (``fairfl.studies.notebook.stored_form``),
so that opening one in JupyterLab leaves ``git diff`` empty.

    .venv/bin/python scripts/normalise_notebooks.py                  # rewrite notebooks/*.ipynb
    .venv/bin/python scripts/normalise_notebooks.py --check          # exit 1 if git would store one otherwise
    .venv/bin/python scripts/normalise_notebooks.py --install-filter # what scripts/setup.sh does once

Running a notebook in JupyterLab saves its outputs into the file. Git stores the notebooks through
a clean filter (``.gitattributes``: ``filter=fairfl-notebook``, installed into this clone's git
config by ``scripts/setup.sh``), which is this script with ``--clean``: git stores the stored form
whatever the file holds, so Run All and save show up neither in ``git status`` nor in ``git diff``,
and the outputs stay in the file for the next time it is opened. Without the filter installed (a
clone where setup.sh has not run) git stores the file as it is, and ``--check`` says so.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))             # this clone's fairfl, whichever environment runs the filter

from fairfl.studies.notebook import FILTER, committed_form, stored_form  # noqa: E402

# git runs a filter from the top of the working tree, with the path of the file as %f
CLEAN = ".venv/bin/python scripts/normalise_notebooks.py --clean %f"


def install_filter() -> bool:
    """Point this repository's git config at the clean filter; True when it was not there yet."""
    key = f"filter.{FILTER}.clean"
    now = subprocess.run(["git", "config", "--get", key], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if now == CLEAN:
        return False
    subprocess.run(["git", "config", key, CLEAN], cwd=ROOT, check=True)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="normalise_notebooks.py", description=__doc__.split("\n\n")[0],
        epilog="Without an option, rewrites the notebooks given (default: notebooks/*.ipynb) in their stored form.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks to rewrite or check (default: notebooks/*.ipynb)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="change nothing; exit 1 if git would store a notebook otherwise than in its stored form")
    mode.add_argument("--clean", metavar="PATH", help=argparse.SUPPRESS)      # git's clean filter: stdin -> stdout
    mode.add_argument("--install-filter", action="store_true",
                      help="install the clean filter in this clone's git config (scripts/setup.sh does it)")
    args = p.parse_args(argv)

    if args.clean is not None:
        sys.stdout.write(stored_form(sys.stdin.read()))
        return 0
    if args.install_filter:
        if install_filter():
            print("notebooks: git now stores them without outputs (the fairfl-notebook clean filter)")
        return 0
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        p.error(f"no such notebook: {', '.join(missing)}")
    changed = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if args.check:
            stored = committed_form(path)
            if stored != stored_form(stored):
                changed.append(path.name)
        else:
            want = stored_form(text)
            if text != want:
                changed.append(path.name)
                path.write_text(want, encoding="utf-8")
    print(("would change: " if args.check else "rewritten: ") + (", ".join(changed) or "none"))
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
