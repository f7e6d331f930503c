"""Claim verdicts: a documented deviation is reported, everything else is strict."""
import json

import pytest

from fairfl.studies.claims import (FAILED, HOLDS, NOT_CHECKED, NOT_REPRODUCED, OVERRIDDEN, STALE, ClaimFailedError, Claims,
                                   summary)

DIAGNOSIS = {"quick": "the step of eq. (17) grows near Pareto stationarity"}


def test_a_claim_that_holds_passes(capsys):
    c = Claims("nb", "quick")
    assert c.check("faster", True, "21 vs 31 rounds").status == HOLDS
    c.finish()
    assert "[holds] faster: 21 vs 31 rounds" in capsys.readouterr().out


def test_an_undocumented_failure_stops_the_notebook():
    c = Claims("nb", "quick")
    assert c.check("improved ≥ 95 %", False, "74.8 %").status == FAILED
    with pytest.raises(ClaimFailedError, match="improved ≥ 95 %: 74.8 %"):
        c.finish()


def test_a_documented_failure_is_reported_not_raised(capsys):
    c = Claims("nb", "quick")
    v = c.check("improved ≥ 95 %", False, "74.8 %", deviation=DIAGNOSIS)
    assert v.status == NOT_REPRODUCED and v.deviation == DIAGNOSIS["quick"]
    c.finish()
    assert "not reproduced (documented)" in capsys.readouterr().out


def test_a_stale_diagnosis_stops_the_notebook():
    c = Claims("nb", "quick")
    assert c.check("improved ≥ 95 %", True, "99 %", deviation=DIAGNOSIS).status == STALE
    with pytest.raises(ClaimFailedError, match="no longer applies"):
        c.finish()


def test_a_deviation_documented_for_another_profile_does_not_excuse_this_one():
    c = Claims("nb", "paper")
    assert c.check("improved ≥ 95 %", False, "74.8 %", deviation=DIAGNOSIS).status == FAILED
    with pytest.raises(ClaimFailedError):
        c.finish()


def test_smoke_checks_nothing():
    c = Claims("nb", "smoke")
    assert c.check("faster", False, "3 rounds only").status == NOT_CHECKED
    c.finish()


def test_an_empty_diagnosis_is_refused():
    with pytest.raises(ValueError, match="empty"):
        Claims("nb", "quick").check("faster", False, "x", deviation={"quick": "  "})


def test_verdicts_are_written_for_the_reproduce_summary(tmp_path, monkeypatch):
    target = tmp_path / "nb.claims.json"
    monkeypatch.setenv("FAIRFL_CLAIMS_FILE", str(target))
    c = Claims("nb", "quick")
    c.check("a", True, "x")
    c.check("b", False, "y", deviation=DIAGNOSIS)
    c.finish()
    data = json.loads(target.read_text())
    assert [v["status"] for v in data["verdicts"]] == [HOLDS, NOT_REPRODUCED]
    assert summary(target) == "claims: 1 holds, 1 not reproduced (documented)"
    assert summary(tmp_path / "missing.json") == "claims: none recorded"
    Claims("empty", "quick").finish()
    assert summary(target) == "claims: none recorded"


def test_claims_under_overridden_parameters_are_recorded_not_checked(tmp_path, monkeypatch, capsys):
    target = tmp_path / "nb.claims.json"
    monkeypatch.setenv("FAIRFL_CLAIMS_FILE", str(target))
    c = Claims("nb", "quick", overridden={"rounds": (100, 10)})
    assert c.check("FedAvg learns", False, "52.2 %").status == OVERRIDDEN
    assert c.check("stale elsewhere", True, "99 %", deviation=DIAGNOSIS).status == OVERRIDDEN
    c.finish()                                            # nothing raised: exploring, not reproducing
    out = capsys.readouterr().out
    assert "rounds=10 (profile: 100) differ from the quick profile" in out
    assert summary(target) == "claims: 2 not checked (parameters overridden)"
    # the same failing claim on the profile's own settings still stops the notebook
    strict = Claims("nb", "quick", overridden={})
    assert strict.check("FedAvg learns", False, "52.2 %").status == FAILED
    with pytest.raises(ClaimFailedError, match="FedAvg learns"):
        strict.finish()


def test_start_knows_which_settings_differ_from_the_profile(monkeypatch):
    from fairfl.studies.notebook import start
    monkeypatch.delenv("FAIRFL_PROFILE", raising=False)
    profiles = {"quick": dict(rounds=100, seeds=[0, 1])}
    same = start("quick", profiles, workers=1, rounds=100, seeds=(0, 1))     # the profile's own values
    assert same.overridden == {} and same.claims("nb").checked
    other = start("quick", profiles, workers=1, rounds=10)
    assert other.overridden == {"rounds": (100, 10)} and not other.claims("nb").checked


def test_recorded_verdicts_are_reported_whatever_they_are(tmp_path, monkeypatch, capsys):
    """notebook 06's verdicts come from its statistics: a contradicted claim is a result, not a
    failure, so finish() raises for none of them; smoke records them as not checked."""
    monkeypatch.setenv("FAIRFL_CLAIMS_FILE", str(tmp_path / "claims.json"))
    c = Claims("06", "quick")
    for verdict in ("supported", "contradicted", "inconclusive", "not judged"):
        assert c.record(f"claim {verdict}", verdict, "Adult: +2.1 [0.3, 4.0]").status == verdict
    c.finish()
    assert "1 supported, 1 contradicted, 1 inconclusive, 1 not judged" in summary(tmp_path / "claims.json")
    assert Claims("06", "smoke").record("x", "supported", "e").status == NOT_CHECKED
    assert Claims("06", "quick", {"seeds": ([0], [1])}).record("x", "supported", "e").status == OVERRIDDEN
    with pytest.raises(ValueError, match="use check"):
        c.record("x", FAILED, "e")


def test_choosing_some_parts_runs_them_as_the_profile_does_and_names_what_a_profile_lacks(monkeypatch, capsys):
    """A notebook's parts (notebook 02: the bias and the scaling attack): choosing some is not
    exploring (nothing is overridden, the claims of the parts run are checked), the header says which
    parts were left out, a claim of a part not run is recorded as such; a part the profile lacks is
    a ConfigError naming the profile's parts and the profiles that have it."""
    from fairfl.studies.claims import NOT_RUN
    from fairfl.base.errors import ConfigError
    from fairfl.studies.notebook import start
    monkeypatch.delenv("FAIRFL_PROFILE", raising=False)
    profiles = {"quick": dict(rounds=100, parts=("adult", "scaling")), "paper": dict(rounds=500, parts=("adult", "text"))}
    whole = start("quick", profiles, workers=1)
    assert whole.parts == ("adult", "scaling") and "not run" not in capsys.readouterr().out
    some = start("quick", profiles, workers=1, parts=["scaling"])
    assert some.parts == ("scaling",) and some.overridden == {}
    assert "parts scaling (not run: adult)" in capsys.readouterr().out
    claims = some.claims("nb")
    assert claims.checked
    assert claims.not_run("the bias attack hurts AFL", "adult").status == NOT_RUN
    assert claims.check("the scaling attack hurts q-FedAvg", True, "hurt most").status == HOLDS
    with pytest.raises(ConfigError, match=r"the quick profile has no part 'text'; its parts: adult, scaling "
                                          r"\('text' is a part of the paper profile\)"):
        start("quick", profiles, workers=1, parts="text")
    with pytest.raises(ConfigError, match="no parts to choose from"):
        start("quick", {"quick": dict(rounds=100)}, workers=1, parts=["adult"])
