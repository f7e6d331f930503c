"""From the runs' scores to what they say: the exploratory table (:func:`summary`: each method's
mean with its interval, its seed-paired difference from the track's reference, BH q-values) and its
readable form (:func:`wide`); a paper's claims (:class:`Comparison`, :class:`Claim`) and their
three-valued verdicts per federation under Holm's correction (:func:`judge`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fairfl.base.errors import ConfigError
from .scores import (LOWER_IS_BETTER, METRIC_RANGE, REPORTED, difference_range, known_criterion, known_metric,
                     metric_label)
from .power import detectable_difference
from .statistics import (TOL, benjamini_hochberg, bounds, holm, location, p_greater, p_less,
                         p_two_sided, paired, possibly_true)

# ----------------------------------------------------------------------------- the tables

KEYS = ["federation", "track", "criterion", "method"]


def summary(scores: pd.DataFrame, references: Mapping[str, str], level: float = 0.95, fdr: float = 0.05,
            reference_of: Mapping[str, str] | None = None,
            learned: Mapping[tuple[str, str], bool] | None = None) -> pd.DataFrame:
    """The exploratory table. ``scores``: one row per reported run with the columns ``KEYS``,
    ``seed`` and one per reported metric (NaN for a run that diverged). One row per (federation,
    track, criterion, method, metric): the seeds, how many diverged, the mean over the others with
    its ``level`` interval (inside the metric's range); and for every method but its track's
    reference (``references``: {track: method}), the seed-paired difference from the reference
    with its interval, the two-sided p-value, the Benjamini–Hochberg q-value over every
    difference of this table, and ``mark``: ▲ / ▼ where q ≤ ``fdr`` and the method is better /
    worse (σ is better lower), ``=`` otherwise. ``reference_of`` ({method: its own reference})
    compares a row with another method than its track's (an averaged iterate with an averaged
    iterate: like with like); ``reference`` names the reference of each row. ``learned``
    ({(federation, method): bool}) adds the column ``learned`` (False: at the best constant
    predictor on validation, within the margin)."""
    reference_of, learned = dict(reference_of or {}), dict(learned or {})
    missing = set(KEYS + ["seed"]) - set(scores.columns)
    if missing:
        raise ConfigError(f"summary: scores lack the columns {sorted(missing)}")
    rows = []
    for key, g in scores.groupby(KEYS, sort=False):
        track, method = key[1], key[3]
        if track not in references:
            raise ConfigError(f"summary: track {track!r} has no reference; references: {dict(references)}")
        against = reference_of.get(method, references[track])
        ref = scores[(scores.federation == key[0]) & (scores.track == track) & (scores.criterion == key[2])
                     & (scores.method == against)]
        for metric in REPORTED:
            if metric not in g:
                continue
            values = dict(zip(g.seed, g[metric]))
            mean, lo, hi = location(list(values.values()), level, METRIC_RANGE[metric])
            row = dict(zip(KEYS, key), reference=against, learned=learned.get((key[0], method), True),
                       metric=metric, seeds=len(values),
                       diverged=int(np.sum(~np.isfinite(np.asarray(list(values.values()), dtype=float)))),
                       mean=mean, low=lo, high=hi)
            if method != against and len(ref):
                d, dropped = paired(values, dict(zip(ref.seed, ref[metric])))
                dm, dlo, dhi = location(d, level, difference_range(metric))
                row.update(paired_seeds=d.size, difference=dm, difference_low=dlo, difference_high=dhi,
                           p=p_two_sided(d) if d.size else math.nan)
            rows.append(row)
    out = pd.DataFrame(rows)
    if "p" not in out:
        out["p"] = math.nan
    out["q"] = benjamini_hochberg(out["p"])
    sign = np.where(out["metric"].isin(LOWER_IS_BETTER), -1.0, 1.0) * np.sign(out.get("difference", np.nan))
    out["mark"] = np.where(out["p"].isna(), "", np.where(out["q"] <= fdr, np.where(sign > 0, "▲", "▼"), "="))
    return out


def wide(table: pd.DataFrame, digits: int = 1, clients: int | None = None) -> pd.DataFrame:
    """A :func:`summary` table of one federation, track and criterion to read: one row per method,
    one column per metric, each cell the mean [interval], marked ▲ / ▼ / = against its reference
    (BH-adjusted; the reference's own row unmarked); a method with diverged seeds says how many,
    one that did not learn (``learned`` False) says so. With ``clients`` (the federation's number)
    the columns are named as :func:`~fairfl.studies.protocol.scores.metric_label` names them ("worst
    client" below 20 clients)."""
    cells: dict[str, dict[str, str]] = {}
    for r in table.itertuples(index=False):
        text = f"{r.mean:.{digits}f}"
        if np.isfinite(r.low):
            text += f" [{r.low:.{digits}f}, {r.high:.{digits}f}]"
        mark = getattr(r, "mark", "")
        cells.setdefault(r.method, {})[r.metric] = text + (f" {mark}" if isinstance(mark, str) and mark else "")
        if getattr(r, "diverged", 0):
            cells[r.method]["diverged"] = f"{r.diverged} of {r.seeds}"
        if getattr(r, "learned", True) is False or str(getattr(r, "learned", True)) == "False":
            cells[r.method]["learned"] = "did not learn"
    out = pd.DataFrame.from_dict(cells, orient="index")
    out = out[[c for c in [*REPORTED, "diverged", "learned"] if c in out.columns]].fillna("")
    if clients is not None:
        out = out.rename(columns={m: metric_label(m, clients) for m in REPORTED})
    return out


# ----------------------------------------------------------------------------- claims

KINDS = ("superiority", "non-inferiority")


@dataclass(frozen=True)
class Comparison:
    """One part of a claim: ``method`` against ``other`` on a reported ``metric``.

    ``"superiority"`` ("A has a higher mean", "a lower σ") is **supported** where the adjusted
    interval of the gain (the difference, sign-flipped for σ) lies above 0, **contradicted** where
    it lies below ``margin`` (the data rule out a gain as large as the smallest one the claim
    means), and **supported, below the margin** where both hold (a gain resolved above 0 and
    below the margin: real, smaller than the claim means). ``"non-inferiority"`` ("a mean that is
    not lower") is supported where the gain's interval lies above −``margin``, contradicted where
    it lies below −``margin``. Else **inconclusive**. ``margin`` is in the metric's points,
    declared before the runs.

    The two nulls of a superiority part, gain ≤ 0 and gain ≥ margin, cannot both be true (margin
    > 0): :func:`judge` counts the part once in Shaffer's refinement of Holm (:attr:`exclusive`).
    A non-inferiority part's nulls, gain ≤ −margin and gain ≥ −margin, share the point −margin: both
    can be true, and the part counts twice, as under Holm."""

    method: str
    other: str
    metric: str
    kind: str = "superiority"
    margin: float = 1.0

    def __post_init__(self) -> None:
        known_metric(self.metric)
        if self.kind not in KINDS:
            raise ConfigError(f"kind={self.kind!r}; choose from {KINDS}")
        if not (np.isfinite(self.margin) and self.margin > 0):
            raise ConfigError(f"a margin must be a positive number of points, got {self.margin}")

    @property
    def nulls(self) -> tuple[float, float]:
        """(the gain at or below which "supported" is false, the gain at or above which
        "contradicted" is false): the supported test's null is gain ≤ the first, the contradicted
        test's gain ≥ the second."""
        return (0.0, self.margin) if self.kind == "superiority" else (-self.margin, -self.margin)

    @property
    def exclusive(self) -> bool:
        """Whether the part's two nulls cannot both be true (their ranges do not meet)."""
        low, high = self.nulls
        return low < high

    def describe(self) -> str:
        """"FedFV lower σ than FedAvg", "DQN-Fed mean accuracy not lower than FedAvg's by more than 1"."""
        name = {"mean": "mean accuracy", "std": "σ", "worst10": "worst-10 % accuracy",
                "best10": "best-10 % accuracy"}[self.metric]
        if self.kind == "superiority":
            return f"{self.method} {'lower' if self.metric in LOWER_IS_BETTER else 'higher'} {name} than {self.other}"
        worse = "higher" if self.metric in LOWER_IS_BETTER else "lower"
        return f"{self.method} {name} not {worse} than {self.other}'s by more than {self.margin:g}"


@dataclass(frozen=True)
class Claim:
    """A paper's claim: its text, where it comes from, its parts (all must hold), the tuning
    criterion it is tested under (the one that matches what the paper optimised for) and the
    track whose runs it reads."""

    text: str
    parts: tuple[Comparison, ...]
    criterion: str = "mean"
    track: str = "global"

    def __post_init__(self) -> None:
        known_criterion(self.criterion)
        if not self.parts:
            raise ConfigError(f"claim {self.text!r} has no parts")
        object.__setattr__(self, "parts", tuple(self.parts))


SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_JUDGED = "supported", "contradicted", "inconclusive", "not judged"
SUPPORTED_BELOW = "supported, below the margin"


def _combine(verdicts: Sequence[str]) -> str:
    """A claim of several parts: contradicted when one part is; supported when every part is
    (supported, below the margin, when every part is supported and one of them only below the
    margin); else inconclusive."""
    if any(v == CONTRADICTED for v in verdicts):
        return CONTRADICTED
    if verdicts and all(v in (SUPPORTED, SUPPORTED_BELOW) for v in verdicts):
        return SUPPORTED_BELOW if SUPPORTED_BELOW in verdicts else SUPPORTED
    return INCONCLUSIVE


def judge(claims: Sequence[Claim], scores: pd.DataFrame, federations: Sequence[str],
          speaking: Mapping[tuple[str, str], bool] | None = None, alpha: float = 0.05, power: float = 0.8,
          learned: Mapping[tuple[str, str], bool] | None = None, shaffer: bool = True) -> pd.DataFrame:
    """Every claim on every federation, one row per (claim, federation, part), with the claim's
    verdict on that federation in each of its rows.

    Two one-sided tests per part (supported / contradicted, :class:`Comparison`) from the seed-
    paired differences of ``scores`` (as :func:`summary` takes them; the runs of each method at
    the point the claim's criterion chose); one family of every test of every claim and federation
    that is judged, corrected at family-wise level ``alpha`` by Holm's step-down with Shaffer's
    refinement (``shaffer``; :func:`~fairfl.studies.protocol.statistics.holm`): a part whose two nulls
    cannot both be true (:attr:`Comparison.exclusive`) counts once among the nulls that may be
    true. The adjusted interval is drawn at the levels the procedure compared its two tests with
    (so the verdict can be read off it: ``level_supported``, ``level_contradicted``);
    ``detectable``, the smallest gain the exact test detects with probability ``power`` at the
    procedure's strictest level (:func:`~fairfl.studies.protocol.power.detectable_difference`), and
    ``agree``, how many seeds lie beyond the supported test's null. A federation is not judged for
    a claim where ``speaking[(federation, track)]`` is False (its models do not beat the best
    constant predictor), where ``learned[(federation, method)]`` is False for one of a part's
    methods (it did not learn: at the best constant predictor on validation, within the margin),
    or where a method has no finished run."""
    speaking, learned = dict(speaking or {}), dict(learned or {})
    rows, tests, keys = [], [], []
    for claim in claims:
        for fed in federations:
            mute = [m for part in claim.parts for m in (part.method, part.other) if not learned.get((fed, m), True)]
            for i, part in enumerate(claim.parts):
                row = {"claim": claim.text, "federation": fed, "part": part.describe(), "criterion": claim.criterion,
                       "kind": part.kind, "margin": part.margin, "metric": part.metric, "exclusive": part.exclusive}
                if not speaking.get((fed, claim.track), True):
                    rows.append({**row, "reason": "its models do not beat the best constant predictor"})
                    continue
                if mute:
                    rows.append({**row, "reason": f"{' and '.join(dict.fromkeys(mute))} did not learn (at the best "
                                                  "constant predictor on validation, within the margin)"})
                    continue
                pick = lambda m: scores[(scores.federation == fed) & (scores.track == claim.track)
                                        & (scores.criterion == claim.criterion) & (scores.method == m)]
                a, b = pick(part.method), pick(part.other)
                d, dropped = paired(dict(zip(a.seed, a[part.metric])), dict(zip(b.seed, b[part.metric])))
                if d.size == 0:
                    rows.append({**row, "reason": f"{part.method} or {part.other} has no finished run here"})
                    continue
                sign = -1.0 if part.metric in LOWER_IS_BETTER else 1.0
                gain = sign * d
                null, far = part.nulls
                row.update(paired_seeds=d.size, dropped=dropped, difference=float(d.mean()),
                           agree=int(np.sum(gain > null + TOL)),
                           p_supported=p_greater(gain, null), p_contradicted=p_less(gain, far))
                row["_gain"], row["_null"], row["_far"], row["_sign"] = gain, null, far, sign
                key = (claim.text, fed, i) if (shaffer and part.exclusive) else None
                tests += [(len(rows), "p_supported"), (len(rows), "p_contradicted")]
                keys += [key, key]
                rows.append(row)
    adjusted, level = holm([rows[i][k] for i, k in tests], alpha, exclusive=keys)
    strictest = alpha / possibly_true(keys)[0] if tests else math.nan
    for (i, k), adj, lev in zip(tests, adjusted, level):
        rows[i][k + "_holm"], rows[i]["level_" + k[2:]] = float(adj), float(lev)
    for row in rows:
        if "_gain" not in row:
            row["verdict"] = NOT_JUDGED
            continue
        gain, sign, metric = row.pop("_gain"), row.pop("_sign"), row["metric"]
        null, far = row.pop("_null"), row.pop("_far")
        limits = difference_range(metric)
        low_gain, _ = bounds(gain, row["level_supported"], limits)
        _, high_gain = bounds(gain, row["level_contradicted"], limits)
        supported, contradicted = low_gain > null, high_gain < far
        assert supported == (row["p_supported_holm"] <= alpha + TOL)
        assert contradicted == (row["p_contradicted_holm"] <= alpha + TOL)
        row["verdict"] = (SUPPORTED_BELOW if supported and contradicted else SUPPORTED if supported else
                          CONTRADICTED if contradicted else INCONCLUSIVE)
        # the adjusted interval of the difference itself (method − other), as the tables print it
        ends = sorted((sign * low_gain, sign * high_gain))
        row["adjusted_low"], row["adjusted_high"] = ends
        row["strictest_level"] = strictest
        row["detectable"] = detectable_difference(gain, strictest, power)
    out = pd.DataFrame(rows)
    claim_verdicts = {key: (_combine(list(g.verdict)) if (g.verdict != NOT_JUDGED).all() else NOT_JUDGED)
                      for key, g in out.groupby(["claim", "federation"], sort=False)}
    out["claim_verdict"] = [claim_verdicts[(c, f)] for c, f in zip(out.claim, out.federation)]
    return out
