"""REPL traces: the generated statements, executed by Python itself, give the stated states."""

import json

import numpy as np
import pytest
import torch

from interp.tasks import make_task
from interp.tasks.repl import NAMES


def run_trace(task, tokens, states):
    """Execute the trace line by line in a sandboxed namespace and check every state and output."""
    lines = task.decode(tokens).split("\n")[:-1]
    printed = []
    env = {"__builtins__": {}, "print": lambda *args: printed.append(" ".join(map(str, args)))}
    names = NAMES[: task.n_vars]
    position, expect_output, statements = 0, None, 0
    previous = None
    for line in lines:
        start, position = position, position + len(line.split()) + 1   # tokens incl. NEWLINE
        if previous is not None:    # until a line's NEWLINE the state is the one before it
            assert all(task.group.perms[s].tolist() == previous for s in states[start:position - 1])
        if expect_output is not None:                      # the REPL's output line
            assert line == expect_output
            expect_output = None
            continue
        exec(line, env)                                    # noqa: S102 - test-only, sandboxed dict
        if line.startswith("print"):
            expect_output = printed[-1]
            continue
        statements += 1
        values = previous = [env[v] for v in names]
        # The state at this line's NEWLINE (and after it) is the arrangement Python computed.
        assert task.group.perms[states[position - 1]].tolist() == values
    assert expect_output is None and position == len(tokens)
    return statements, [env[v] for v in names], len(printed)


@pytest.mark.parametrize("options", [
    {"n_vars": 3}, {"n_vars": 5, "ops": "cycle", "reveal_every": 3, "reveal_fraction": 0.4},
    {"n_vars": 4, "ops": "full", "random_init": False, "loss": "reveals", "reveal_every": 1},
    {"n_vars": 2, "reveal_fraction": 0.5, "reveal_every": 5},
])
def test_trace_executes_to_the_stated_states(options):
    task = make_task("REPL", **options)
    length = 7
    b = task.sample(6, length, seed=0)
    n_reveals = len(set(list(range(task.reveal_every, length + 1, task.reveal_every)) + [length]))
    for i in range(len(b)):
        statements, final, prints = run_trace(task, b.tokens[i].tolist(), b.states[i].tolist())
        assert statements == length + 1 and prints == n_reveals       # init line + statements
        assert task.group.perms[b.states[i, -1]].tolist() == final
    # Reveal roles: the value tokens of the output lines, predicted from the position before.
    values = b.tokens.gather(1, b.roles["reveal_value"])
    assert ((values >= task.value_ids.start) & (values < task.value_ids.stop)).all()
    assert b.roles["reveal"].shape == (6, n_reveals * task.n_revealed)
    assert torch.equal(b.roles["reveal_value"], b.roles["reveal"] + 1)
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])
    if task.loss == "reveals":
        assert b.loss_mask.sum(1).tolist() == [b.roles["reveal"].shape[1]] * 6
        assert b.loss_mask.gather(1, b.roles["reveal"]).all()
    else:
        assert b.loss_mask[:, :-1].all() and not b.loss_mask[:, -1].any()


def test_revealed_values_match_state():
    task = make_task("REPL", n_vars=5, reveal_fraction=0.6)
    b = task.sample(8, 9, seed=2)
    assert task.n_revealed == 3
    for i in range(8):
        for p in b.roles["reveal_value"][i].tolist():
            # Walk back to the print line to find which variable this value belongs to.
            line_start = p
            while b.tokens[i, line_start - 1] != 0:
                line_start -= 1
            column = p - line_start
            print_line = task.decode(b.tokens[i, :line_start]).split("\n")[-2]
            var = print_line[len("print ( "):-len(" )")].split(" , ")[column]
            vals = task.group.perms[b.states[i, p]]
            assert b.tokens[i, p] - task.value_ids.start == vals[NAMES.index(var)]


def test_determinism_and_roundtrip():
    task = make_task("REPL", n_vars=4, ops="cycle")
    a, b, c = task.sample(4, 10, 3), task.sample(4, 10, 3), task.sample(4, 10, 4)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.states, b.states)
    assert not torch.equal(a.tokens, c.tokens)
    rebuilt = make_task("REPL", **json.loads(json.dumps(task.options())))
    assert torch.equal(rebuilt.sample(4, 10, 3).tokens, a.tokens)


def test_bad_arguments():
    for kwargs in ({"n_vars": 9}, {"n_vars": 1}, {"ops": "swp"}, {"ops": "cycle", "n_vars": 2},
                   {"reveal_fraction": 0}, {"reveal_every": 0}, {"loss": "reveal"}):
        with pytest.raises(ValueError):
            make_task("REPL", **kwargs)
    with pytest.raises(TypeError):
        make_task("REPL", random_init=1)
    with pytest.raises(ValueError, match="not in the REPL vocabulary"):
        make_task("REPL").decode([99])
