"""The three profiles every notebook runs in, and how long each notebook took in each where it
was measured: what ``fairfl reproduce`` and a notebook's header line announce, and the README's
table of times (how each was measured: benchmarks/README.md)."""
from __future__ import annotations

PROFILES = ("smoke", "quick", "paper")      # every notebook's profiles (see the README)
CHECKED_PROFILES = ("quick", "paper")       # where claims are checked (fairfl.studies.claims)

# Measured wall time of each notebook per profile, in seconds, on the project machine: 2 CPU cores,
# no GPU (quick: from an empty results folder on the idle machine; smoke: with other jobs loading
# both cores, so an idle machine is faster; paper: from an empty results folder, with other jobs
# on the machine, as benchmarks/README.md says per notebook). A missing entry is not measured.
MEASURED_ON = "2 CPU cores, no GPU"
NOTEBOOK_SECONDS: dict[tuple[str, str], float] = {
    ("00", "smoke"): 19, ("01", "smoke"): 31, ("02", "smoke"): 66, ("03", "smoke"): 11, ("04", "smoke"): 52,
    ("05", "smoke"): 18, ("06", "smoke"): 117,
    ("00", "quick"): 180, ("01", "quick"): 3650, ("02", "quick"): 1616, ("03", "quick"): 1524,
    ("04", "quick"): 2956, ("05", "quick"): 1340, ("06", "quick"): 2408,
    ("03", "paper"): 8220,
}


def expected_time(notebook: str, profile: str, device: str = "cpu") -> str:
    """"about 4 min on 2 CPU cores, no GPU" from :data:`NOTEBOOK_SECONDS`, or "not measured"."""
    seconds = NOTEBOOK_SECONDS.get((notebook[:2], profile))
    if seconds is None:
        return "not measured"
    if device.startswith("cuda"):
        return "not measured on a GPU"
    text = (f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min" if seconds < 5400
            else f"about {seconds / 3600:.1f} h")
    return f"{text} on {MEASURED_ON}"
