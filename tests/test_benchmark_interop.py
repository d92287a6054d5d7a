"""benchmarks/interop.py at toy sizes: every contender runs and every patched result agrees with
the source's step loop to 1e-4 (TransformerLens, a heavy import, is left out here)."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_interop_benchmark_smoke(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("interop_benchmark", BENCHMARKS / "interop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--length", "24", "--batch", "2", "--d-model", "32", "--layers", "2", "--rounds", "1",
                         "--no-transformer-lens"])
    contenders = {row[2] for row in rows}
    assert {"ours fast path", "source forward", "ours full pass", "ours resumed", "ours resumed from the patched carry",
            "ours declared patch, full pass", "ours declared patch, resumed", "source step loop",
            "source step loop, prefix in one call"} <= contenders
    diffs = [row[8] for row in rows if row[8] is not None]
    assert diffs and max(diffs) < 1e-4
    sys.modules.pop("timing", None)
