"""Records ``histories_changed.json``: the histories of the golden cases whose result was changed on
purpose after commit 2392cdc (``CHANGED`` in ``tests/test_golden.py``, each with its reason), as the
current code computes them, one torch thread, with the CPU kernels they are bit-exact for.

    OMP_NUM_THREADS=1 .venv/bin/python tests/golden/make_golden_changed.py

Run it on a machine whose kernels are the 2392cdc recording's (``cpu_kernels_2392cdc.json``; the
script refuses others), after a deliberate change, and say in ``CHANGELOG.md`` which case changed
and why. ``tests/test_golden.py`` then holds each changed case to this recording (bit for bit on
these kernels, to the cross-kernel tolerance elsewhere) and checks that it still differs from the
2392cdc one.
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
    if not t.SAME_KERNELS:
        sys.exit(f"these CPU kernels ({t.cpu_kernels()}) are not the 2392cdc recording's "
                 f"({t.RECORDED_KERNELS}): record on a machine of that kind")
    out = {"kernels": t.cpu_kernels(), "cases": {}}
    for name, reason in sorted(t.CHANGED.items()):
        state = t.simulate(t.CASES[name], progress=False).to_state()
        history = {key: state[key] for key in (*t.EXACT, *t.SERIES, "info")}
        out["cases"][name] = {"reason": reason, "history": history}
        print(f"{name}: recorded ({reason})")
    (HERE / "histories_changed.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
