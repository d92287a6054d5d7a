"""A run committed by `interp reproduce` carries a manifest of its files, and a file added there makes the
reproduction refuse the run: the analysis commands read it but write nothing into it (no report, no
summary, no lock file), each refusal one line naming the run and what to do instead."""

import shutil
from pathlib import Path

import pytest

from interp.cli import main
from interp.cli.args import COMMITTED_MANIFEST
from interp.reproduce.manifest import MANIFEST, changed_files

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "reproduce" / "error-control-medium" / "S3-mamba3-L2-s0"


@pytest.fixture
def committed(tmp_path):
    run = tmp_path / "results" / COMMITTED.name
    shutil.copytree(COMMITTED, run)
    assert changed_files(run) == {}
    return run


def test_the_cli_knows_the_manifest_by_its_name():
    assert COMMITTED_MANIFEST == MANIFEST


@pytest.mark.parametrize("argv, says", [
    (["drift"], "is a run committed by `interp reproduce`"),
    (["drift", "--out", "{tmp}/drift.html"], "`interp drift` writes its results into the run directory"),
    (["eval"], "analyse a copy (cp -r"),
    (["heads"], "heads.html' would be written into a run committed by `interp reproduce`"),
    (["patch"], "patch.html' would be written into a run committed"),
    (["circuit"], "circuit.html' would be written into a run committed"),
])
def test_an_analysis_writes_nothing_into_a_committed_run(committed, tmp_path, capsys, argv, says):
    command, *flags = argv
    status = main([command, str(committed), *(f.format(tmp=tmp_path) for f in flags)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and says in err[0], err
    assert changed_files(committed) == {}          # nothing added: no report, no summary, no lock file
