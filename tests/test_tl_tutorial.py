"""examples/tl_tutorial.py: TransformerLens-tutorial snippets run unchanged on our model and,
where TransformerLens is installed, give TL 4.3's numbers on the same weights (1e-10)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")


def tutorial():
    path = Path(__file__).parent.parent / "examples" / "tl_tutorial.py"
    spec = importlib.util.spec_from_file_location("tl_tutorial", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_snippet_runs_and_agrees_with_transformer_lens(tmp_path):
    module = tutorial()
    module.tiny_checkpoint(tmp_path)
    differences = module.compare(tmp_path, module.TINY_PROMPT)
    assert len(differences) >= 30
    measured = {name: value for name, value in differences.items() if value is not None}
    if not measured:
        pytest.skip("transformer_lens not installed: the snippets ran on our model only")
    assert measured.keys() == differences.keys()
    assert max(measured.values()) <= 1e-10, {n: v for n, v in measured.items() if v > 1e-10}
