"""docs/generation.md stays true: its python blocks run (their asserts are the claims they make)
and its table of each mixer's state is the one the code gives (regenerate it with
`python -m tests.test_generation_doc`)."""

import inspect
import re
from pathlib import Path

import pytest
import torch

import models
from models.decoding.step import advance, mixer_kind

DOC = Path(__file__).resolve().parent.parent / "docs" / "generation.md"
TABLE_CONFIG = dict(vocab_size=11, d_model=64, n_heads=4, d_state=16, n_layers=2)
TABLE_HEAD = ("| preset | mixer | decodes as | state `[*S]` (hook_state `[B, T, *S]`, StatePatch values "
              "`[M, *S]`) | `state_shape` in the code | a layer's DecodingState after 5 tokens, B = 1 |\n"
              "|---|---|---|---|---|---|")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_the_guide_python_blocks_run(index):
    torch.manual_seed(0)
    exec(compile(python_blocks()[index], f"{DOC.name} block {index}", "exec"), {"__name__": "generation_doc"})


def code_shape(mixer) -> str:
    """The expression assigned to state_shape in the source of the first class in mixer's MRO
    that assigns it."""
    for cls in type(mixer).__mro__:
        found = re.search(r"state_shape = (\(.*\))\n", inspect.getsource(cls)) if cls.__module__.startswith("models") else None
        if found:
            return f"`{found.group(1)}` ({cls.__name__})"
    raise AssertionError(f"{type(mixer).__name__} assigns no state_shape")


def carried(entries: dict[str, torch.Tensor]) -> str:
    dtype = lambda v: "" if v.dtype == torch.float32 else f" {str(v.dtype).replace('torch.', '')}"  # noqa: E731
    return ", ".join(f"{key} `{list(value.shape)}`{dtype(value)}" for key, value in entries.items())


def state_table() -> str:
    """The table of docs/generation.md: one row per preset and mixer class, from the code."""
    rows = [TABLE_HEAD]
    for name in models.list_models():
        model = models.build(name, **TABLE_CONFIG).eval()
        with torch.no_grad():
            _, state = advance(model, torch.zeros(1, 5, dtype=torch.long))
        seen = set()
        for block, layer in zip(model.blocks, state.trimmed()):
            mixer = block.mixer
            if type(mixer) in seen:
                continue
            seen.add(type(mixer))
            recurrent = hasattr(mixer, "hook_state")
            shape = f"`{list(mixer.state_shape)}`" + (" complex" if layer["state"].is_complex() else "") if recurrent else "-"
            rows.append(f"| {name} | {type(mixer).__name__} | {mixer_kind(mixer)} | {shape} | "
                        f"{code_shape(mixer) if recurrent else '-'} | {carried(layer)} |")
    return "\n".join(rows)


def test_the_state_table_is_the_codes():
    text = DOC.read_text()
    start = text.index(TABLE_HEAD)
    end = text.index("\n\n", start)
    assert text[start:end] == state_table(), "regenerate it: python -m tests.test_generation_doc"


if __name__ == "__main__":
    print(state_table())
