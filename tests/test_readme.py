"""The README's code blocks run as written (the tour must stay true)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2, "the README tour lost its code blocks"
    namespace: dict = {}
    for block in blocks:  # later blocks use names from earlier ones, as a reader would
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["states"].shape[:2] == (8, 20)
    assert len(namespace["result"].sites) == 12


def test_readme_opens_with_the_two_commands():
    lines = [line for line in README.read_text().splitlines() if line.startswith("pip install")]
    assert "interp demo" in lines[0] and "pytest" in lines[1]
    assert Path(README.parent / ".ci/run").read_text().count("python -m pytest -q -n 2 tests") == 1
