"""`interp patch --executor local --workers 2 [--chunk S,E]`: the exact grid as units on worker
processes, kept beside the report and resumed; the same site means as the in-process run of the
same chunk; flags that need --executor are refused in one line."""

import pandas as pd
import pytest

from interp.cli import main
from test_cli_patch import trained


@pytest.fixture(scope="module")
def ar_run(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("patch-units"))


def test_units_on_workers_equal_the_in_process_units_and_resume(ar_run, tmp_path, capsys):
    common = ["patch", str(ar_run), "--method", "exact", "--n", "12", "--chunk", "25,5", "--min-effect", "0"]
    assert main([*common, "--out", str(tmp_path / "here.html")]) == 0
    assert main([*common, "--out", str(tmp_path / "pool.html"), "--executor", "local", "--workers", "2"]) == 0
    here, pool = pd.read_csv(tmp_path / "here.csv"), pd.read_csv(tmp_path / "pool.csv")
    pd.testing.assert_frame_equal(here, pool)
    units = tmp_path / "pool.units" / "interchange" / "units"
    assert len(list(units.glob("*.safetensors"))) == 3 * 3   # 60 sites / 25 x 12 examples / 5
    first = sorted(units.glob("*.safetensors"))[0]
    stamp = first.stat().st_mtime_ns
    assert main([*common, "--out", str(tmp_path / "pool.html"), "--executor", "local", "--workers", "2"]) == 0
    assert first.stat().st_mtime_ns == stamp   # finished units are read back, not recomputed
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "pool.csv"), here)


@pytest.mark.parametrize("argv, message", [
    (["--workers", "2"], "argument --workers: needs --executor local or ray; got --workers 2 alone"),
    (["--executor", "local", "--address", "127.0.0.1:6379"], "argument --address: only --executor ray joins"),
    (["--chunk", "3"], "argument --chunk: must be two positive integers SITES,EXAMPLES; got '3'"),
])
def test_scale_out_flags_are_checked(ar_run, argv, message, capsys):
    try:
        status = main(["patch", str(ar_run), "--n", "4", *argv])
    except SystemExit as stop:   # a flag's own type check stops the parser
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
