"""The paper's claims a notebook checks, and their verdicts.

A notebook states each claim once, after its runs::

    claims = Claims("04_dqnfed", profile)
    claims.check("DQN-Fed reaches the threshold first", ok, "21.7 rounds vs FedAvg 31.7",
                 deviation={"quick": "why it does not hold here, in one paragraph"})
    claims.finish()

``deviation`` is the documented diagnosis of a claim that does not hold in a given profile: a
reproduction that misses the paper is a result, reported as **not reproduced** beside the
diagnosis, and it does not stop the notebook. Everything else is strict, like pytest's
``xfail(strict=True)``:

* a claim that fails with no deviation documented for this profile stops the notebook
  (:class:`ClaimFailedError`) — a regression or a new finding someone must look at;
* a claim that *holds* although a deviation is documented stops it too: the diagnosis is stale.

Claims are checked in the ``quick`` and ``paper`` profiles; ``smoke`` runs are too short to
test anything and only record "not checked". A claim's threshold and its documented deviations
were calibrated on the profile's own settings, so when the notebook runs with other values
(``rounds=10`` from the parameters cell, say: exploring, not reproducing) its claims are recorded
as "not checked (parameters overridden)" and stop nothing; ``fairfl.studies.notebook.start`` knows which
settings differ from the profile's and ``Session.claims`` passes them on. ``finish()`` prints the verdict table and, when
``$FAIRFL_CLAIMS_FILE`` is set (``python -m fairfl reproduce`` sets it), writes the verdicts there
as JSON so that the command's one-line summary can count them.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from fairfl.base.atomic import atomic_write
from fairfl.base.errors import FairFLError

from fairfl.base.profiles import CHECKED_PROFILES, PROFILES  # noqa: F401 - PROFILES re-exported (importable from here as before)
HOLDS, NOT_REPRODUCED, FAILED, STALE, NOT_CHECKED, OVERRIDDEN, NOT_RUN = (
    "holds", "not reproduced (documented)", "FAILED", "holds, but a deviation is documented (stale)", "not checked",
    "not checked (parameters overridden)", "not checked (part not run)")


class ClaimFailedError(FairFLError, AssertionError):
    """A paper claim failed without a documented diagnosis, or a documented one is stale."""


@dataclass(frozen=True)
class Verdict:
    claim: str
    status: str
    evidence: str
    deviation: str | None = None


class Claims:
    """The claims of one notebook run. ``overridden``: the settings this run changed from the
    profile's, as {name: (the profile's value, this run's)}; when there are any, nothing is
    checked."""

    def __init__(self, notebook: str, profile: str, overridden: Mapping[str, tuple] | None = None):
        self.notebook, self.profile = notebook, profile
        self.overridden = dict(overridden or {})
        self.verdicts: list[Verdict] = []

    @property
    def checked(self) -> bool:
        return self.profile in CHECKED_PROFILES and not self.overridden

    def check(self, claim: str, holds: bool, evidence: str,
              deviation: Mapping[str, str] | None = None) -> Verdict:
        """Record one claim. ``deviation`` maps a profile to the diagnosis of why the claim does
        not hold there (empty texts are refused: a diagnosis must say something)."""
        note = (deviation or {}).get(self.profile)
        if note is not None and not note.strip():
            raise ValueError(f"claim {claim!r}: the documented deviation for {self.profile!r} is empty")
        if self.profile not in CHECKED_PROFILES:
            status = NOT_CHECKED
        elif self.overridden:
            status = OVERRIDDEN
        elif holds:
            status = STALE if note else HOLDS
        else:
            status = NOT_REPRODUCED if note else FAILED
        v = Verdict(claim, status, evidence, note)
        self.verdicts.append(v)
        print(f"[{status}] {claim}: {evidence}")
        return v

    def record(self, claim: str, verdict: str, evidence: str) -> Verdict:
        """Record a claim whose verdict comes from a statistical test, not from a pass or a fail:
        notebook 06's ``supported`` / ``contradicted`` / ``inconclusive`` / ``not judged``
        (``fairfl.studies.protocol.judge``), each a result to report whatever it is, so none of them
        stops the notebook (:meth:`finish` raises only for :meth:`check`'s FAILED and stale
        claims). In smoke, or with overridden parameters, it is recorded as not checked."""
        if verdict in (FAILED, STALE) or not verdict.strip():
            raise ValueError(f"claim {claim!r}: {verdict!r} is not a recorded verdict; use check() for pass / fail")
        status = (NOT_CHECKED if self.profile not in CHECKED_PROFILES else OVERRIDDEN if self.overridden
                  else verdict)
        v = Verdict(claim, status, evidence)
        self.verdicts.append(v)
        print(f"[{status}] {claim}: {evidence}")
        return v

    def not_run(self, claim: str, part: str) -> Verdict:
        """A claim of a part of the notebook this run left out (``parts``): recorded, not checked."""
        v = Verdict(claim, NOT_RUN, f"the {part!r} part was not run (parts)")
        self.verdicts.append(v)
        print(f"[{NOT_RUN}] {claim}")
        return v

    def finish(self) -> None:
        """Print the table, write ``$FAIRFL_CLAIMS_FILE``, and raise if any claim FAILED or is
        stale."""
        target = os.environ.get("FAIRFL_CLAIMS_FILE")
        if target:
            payload = {"notebook": self.notebook, "profile": self.profile,
                       "overridden": {k: list(v) for k, v in self.overridden.items()},
                       "verdicts": [asdict(v) for v in self.verdicts]}
            atomic_write(Path(target), lambda p: Path(p).write_text(json.dumps(payload, indent=1)))
        width = max((len(v.claim) for v in self.verdicts), default=5)
        if self.overridden and self.profile in CHECKED_PROFILES:
            print(f"\nclaims not checked: {describe_overrides(self.overridden)} differ from the {self.profile} "
                  "profile the claims were calibrated on")
        print(f"\n{'claim':<{width}}  verdict")
        for v in self.verdicts:
            print(f"{v.claim:<{width}}  {v.status}")
        bad = [v for v in self.verdicts if v.status in (FAILED, STALE)]
        if bad:
            raise ClaimFailedError("; ".join(
                f"{v.claim}: {v.evidence}" + (" (the documented deviation no longer applies: update it)"
                                              if v.status == STALE else "") for v in bad))


def describe_overrides(overridden: Mapping[str, tuple]) -> str:
    """"rounds=10 (profile: 100), seeds=[0] (profile: [0, 1])"."""
    return ", ".join(f"{k}={new!r} (profile: {old!r})" for k, (old, new) in overridden.items())


def summary(path: Path) -> str:
    """One line for ``reproduce``: how many claims hold, are not reproduced, failed."""
    try:
        verdicts = json.loads(Path(path).read_text())["verdicts"]
    except (OSError, ValueError, KeyError):
        return "claims: none recorded"
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v["status"]] = counts.get(v["status"], 0) + 1
    return "claims: " + (", ".join(f"{n} {s}" for s, n in counts.items()) or "none recorded")
