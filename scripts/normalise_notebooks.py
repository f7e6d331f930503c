"""Rewrite the stored notebooks in the form JupyterLab saves them, without outputs
(``fairfl.notebook.stored_form``), so that opening one in JupyterLab leaves ``git diff`` empty.

    .venv/bin/python scripts/normalise_notebooks.py            # rewrite notebooks/*.ipynb
    .venv/bin/python scripts/normalise_notebooks.py --check    # exit 1 if one would change
"""
from __future__ import annotations

import sys
from pathlib import Path

from fairfl.notebook import stored_form

if __name__ == "__main__":
    check = "--check" in sys.argv[1:]
    changed = []
    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        want = stored_form(text)
        if text != want:
            changed.append(path.name)
            if not check:
                path.write_text(want, encoding="utf-8")
    print(("would change: " if check else "rewritten: ") + (", ".join(changed) or "none"))
    sys.exit(1 if check and changed else 0)
