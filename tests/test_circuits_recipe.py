"""examples/circuits.py runs end to end at toy sizes (--quick) and reports every model's paths."""

import importlib.util
from pathlib import Path


def test_circuits_recipe_quick(tmp_path):
    path = Path(__file__).parent.parent / "examples" / "circuits.py"
    spec = importlib.util.spec_from_file_location("circuits_recipe", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    out = recipe.run(recipe.parse_args(["--quick", "--out", str(tmp_path)]))
    assert set(out) == {"transformer", "mamba2", "hybrid"}
    assert {"a0 -> a1.k at value", "embed -> a0.v at key", "a1 -> logits"} <= set(out["transformer"])
    assert {"into conv at key", "conv -> state x at value", "read-out at query", "a0 -> s1 conv at key/value"} <= set(
        out["hybrid"])
    for name, row in out.items():
        assert 0 < row["circuit edges"] <= row["edges"] and (tmp_path / f"{name}.html").exists()
        assert row["edges"] % 4 == 0  # a positional graph: key, value, query, other
        shares = [v for k, v in row.items() if "->" in k or " at " in k]
        assert all(0 <= v <= 1 for v in shares if v == v), row  # shares of |score| (NaN: nothing flows)
