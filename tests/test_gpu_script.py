"""benchmarks/gpu.py (the prepared device script) runs end to end: its smoke mode on the CPU."""

import importlib.util

import pytest

from tests.conftest import ROOT, triton_interpreter_available


@pytest.mark.skipif(not triton_interpreter_available(), reason="needs triton and TRITON_INTERPRET=1")
def test_gpu_script_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.main(["--smoke", "--out", str(tmp_path)])
    assert (tmp_path / "gpu.md").read_text().strip() == report.strip()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in report.splitlines() if line.startswith("| ")]
    errors = [float(row[2]) for row in rows if len(row) == 3 and " vs " in row[1]]  # the correctness table
    assert len(errors) >= 3 and max(errors) <= 1e-4  # triton (and fla) agree with the naive loop
