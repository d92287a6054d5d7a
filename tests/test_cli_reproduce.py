"""`interp reproduce --help` names the reproductions that define --scale medium; the list is stated
statically in interp/cli/reproduce.py (the claim modules import torch, the command parses first), so
this keeps it equal to the claims' own scales."""

import re

import pytest

from interp.cli import build_parser
from interp.cli.reproduce import MEDIUM
from interp.reproduce import claim_module, names
from interp.reproduce.engine import claim_scales


def scale_help() -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["reproduce"]
    return next(a for a in sub._actions if a.dest == "scale").help


def test_static_medium_list_equals_the_claims_scales():
    defined = tuple(name for name in names() if "medium" in claim_scales(claim_module(name)))
    assert defined and MEDIUM == defined


def test_scale_help_names_every_scale_and_only_the_medium_claims():
    text = scale_help()
    medium = re.search(r"medium \(([^)]*)\)", text)
    assert medium is not None and all(word in text for word in ("cpu", "paper")), text
    assert sorted(n for n in names() if re.search(rf"\b{re.escape(n)}\b", medium.group(1))) == sorted(MEDIUM)


@pytest.mark.parametrize("name", names())
def test_no_train_builds_the_report_from_nothing_trained_and_says_so(name, tmp_path, capsys, monkeypatch):
    """--no-train trains nothing: with nothing committed every run is listed as not trained yet, and every
    claim's judge still writes its report (no figure of zero runs)."""
    import json

    from interp.cli import main
    from interp.reproduce import results
    from tests.browser import assert_renders

    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    assert main(["reproduce", name, "--quick", "--no-train", "--no-progress", "--out", str(tmp_path / "out")]) == 0
    assert "wrote" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert saved["runs"] == [] and set(saved["pending"]) >= {r.label for r in claim_module(name).plan("quick").runs}
    assert not list((tmp_path / "out").rglob("*.safetensors"))
    assert_renders(tmp_path / "out" / "report.html")
