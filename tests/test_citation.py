"""CITATION.cff is valid CFF 1.2.0 in the parts GitHub and citation tools read."""
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_citation_file_has_the_keys_cff_1_2_0_requires():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    for key in ("cff-version", "message", "title", "authors"):
        assert cff.get(key), f"CITATION.cff lacks {key!r}"
    assert cff["cff-version"] == "1.2.0"
    assert all(isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in cff["authors"])
    assert cff["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    for ref in cff.get("references", []):
        assert ref.get("type") and ref.get("title") and ref.get("authors"), ref


def test_readme_links_only_files_that_exist():
    import re
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#:]+)\)", text)        # relative links and images
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
