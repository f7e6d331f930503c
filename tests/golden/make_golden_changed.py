"""Records ``histories_changed.json``: the histories of the golden cases whose result was changed on
purpose after commit 2392cdc (``CHANGED`` in ``tests/test_golden.py``, each with its reason), as the
current code computes them, one torch thread, with the CPU kernels they are bit-exact for.

    OMP_NUM_THREADS=1 .venv/bin/python tests/golden/make_golden_changed.py

Run it first on a machine whose kernels are the 2392cdc recording's (``cpu_kernels_2392cdc.json``):
that recording is the reference, after a deliberate change, and ``CHANGELOG.md`` says which case
changed and why. ``tests/test_golden.py`` then holds each changed case to the recording of the
machine's kind of kernels bit for bit, and to the reference's within the cross-kernel tolerance on
any other kind; it also checks that each still differs from the 2392cdc one.

On another kind of kernels the script adds (or replaces) that kind's recording, with
``--other-kernels``, and only when the change is the reference's there: the same clients drawn and
a history that differs from 2392cdc's as the change does. Do that only for a case measured to
separate on those kernels by more than the tolerance presumes (the test module's docstring), never
to make a failing comparison pass.
"""
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

torch.set_num_threads(1)

import test_golden as t  # noqa: E402


def main() -> None:
    path = HERE / "histories_changed.json"
    kernels = t.cpu_kernels()
    recordings = json.loads(path.read_text())["recordings"] if path.exists() else []
    reference = t.SAME_KERNELS
    if not reference and "--other-kernels" not in sys.argv[1:]:
        sys.exit(f"these CPU kernels ({kernels}) are not the 2392cdc recording's ({t.RECORDED_KERNELS}): "
                 "record the reference on a machine of that kind, or pass --other-kernels to add this "
                 "kind's recording (the module docstring says when)")
    if not reference and not recordings:
        sys.exit("no reference recording yet: record it first on the 2392cdc recording's kind of machine")
    cases = {}
    for name, reason in sorted(t.CHANGED.items()):
        state = t.simulate(t.CASES[name], progress=False).to_state()
        history = {key: state[key] for key in (*t.EXACT, *t.SERIES, "info")}
        problem = None if reference else t.not_the_change(name, history)
        if problem:
            sys.exit(f"{name}: {problem}; not recorded")
        cases[name] = {"reason": reason, "history": history}
        print(f"{name}: recorded ({reason})")
    recording = {"kernels": kernels, "cases": cases}
    if reference:
        recordings = [recording] + [r for r in recordings[1:] if r["kernels"] != kernels]
    else:
        recordings = [r for r in recordings if r["kernels"] != kernels] + [recording]
    path.write_text(json.dumps({"recordings": recordings}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
