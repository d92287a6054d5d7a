"""Synthetic tasks with ground-truth latent state and named positions (imports only models, probes).

    make_task(spec, **options) -> Task
    task.sample(n, length, seed) -> Batch(tokens, targets, loss_mask, states, roles)

Specs:
    a group name       word problem (`word_problems`): "C2", "Z5", "S3", "S5", "A5", "A4xZ5", ...
                       options: format = "outcome" | "acot" | "cot"
    "AR", "MQAR"       associative recall (`recall`)
    "ATR"              associative treecall over a random PCFG (`treecall`)
    "REPL"             REPL traces of permutation composition with print reveals (`repl`)
    "PFSA"             probabilistic swaps with reveals and exact belief states (`pfsa`)
    "SelectiveCopy"    data tokens scattered among noise, copied in order after the context (`selective_copy`)

Every task has `name`, `vocab_size`, `sample(n, length, seed)` and `options()`, a JSON-able dict
with `make_task(task.name, **task.options())` rebuilding the same task. Tasks with a group-valued
state (word problems, REPL, PFSA) also have `group` and `n_states` (the group order). What
`length` counts is task-specific: group elements (word problems), key-value pairs in context
(AR, MQAR), the most document terminals (ATR), statements (REPL), swap actions (PFSA), context
positions (SelectiveCopy).
"""

from __future__ import annotations

import difflib
import re

from interp.tasks.base import Batch, Task
from interp.tasks.common import check_options
from interp.tasks.groups import EXAMPLE_NAMES, Group, group
from interp.tasks.pfsa import PfsaSwaps
from interp.tasks.recall import AssociativeRecall, MultiQueryRecall
from interp.tasks.repl import ReplTrace
from interp.tasks.selective_copy import SelectiveCopy
from interp.tasks.treecall import AssociativeTreecall
from interp.tasks.word_problems import FORMATS, WordProblem, running_product

_NAMED: dict[str, type] = {"AR": AssociativeRecall, "MQAR": MultiQueryRecall, "ATR": AssociativeTreecall,
                           "REPL": ReplTrace, "PFSA": PfsaSwaps, "SelectiveCopy": SelectiveCopy}


def task_names() -> tuple[str, ...]:
    """The named (non-group) tasks; any group name (see `groups`) is a word problem too."""
    return tuple(_NAMED)


def make_task(spec: str, **options) -> Task:
    """The task called `spec` with `options`; ValueError for unknown names or options."""
    if not isinstance(spec, str):
        raise TypeError(f"task spec must be a str; got {type(spec).__name__}")
    named = task_names()
    if spec in named:
        cls = _NAMED[spec]
        check_options(spec, options, cls.OPTIONS, getattr(cls, "OPTION_HINTS", None))
        return cls(**options)
    try:
        group(spec)
    except ValueError as error:
        raise ValueError(_unknown_task_message(spec, named, error)) from None
    check_options(spec, options, WordProblem.OPTIONS)
    return WordProblem(spec, **options)


def _unknown_task_message(spec: str, named: tuple[str, ...], error: ValueError) -> str:
    """Why `spec` names no task: the group code's reason when it has the shape of a group name
    (S99: the degree is too large), else the allowed names with case and close-match hints."""
    close = difflib.get_close_matches(spec, named + EXAMPLE_NAMES, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    if all(GROUP_PART.match(part) for part in spec.split("x")):
        return f"task spec {spec!r}: {error}{hint}"
    for candidate in (spec.upper(), spec.upper().replace("X", "x"), spec.strip()):
        if candidate != spec and (candidate in named or all(GROUP_PART.match(p) for p in candidate.split("x"))):
            return (f"unknown task {spec!r}: did you mean {candidate!r}? (task and group names are "
                    "case-sensitive, without spaces)")
    return (f"unknown task {spec!r}: allowed {', '.join(named)} or a group name "
            f"(C<n>, Z<n>, S<k>, A<k>, products like A4xZ5){hint}")


GROUP_PART = re.compile(r"^[CZSA][1-9][0-9]*$")

__all__ = ["Batch", "Task", "Group", "group", "make_task", "task_names", "WordProblem", "FORMATS",
           "running_product", "AssociativeRecall", "MultiQueryRecall", "AssociativeTreecall",
           "ReplTrace", "PfsaSwaps", "SelectiveCopy"]
