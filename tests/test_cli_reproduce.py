"""`interp reproduce --help` names the reproductions that define --scale medium; the list is stated
statically in interp/cli/reproduce.py (the claim modules import torch, the command parses first), so
this keeps it equal to the claims' own scales."""

import re

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
