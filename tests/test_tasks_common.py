"""The contract every task meets: Batch shapes and dtypes, vocabularies, roles, options, seeds."""

import json
import warnings

import numpy as np
import pytest
import torch

from interp.tasks import Batch, Task, make_task, task_names

SPECS = [("C2", {"format": "outcome"}), ("S3", {"format": "acot"}), ("A5", {"format": "cot"}),
         ("A4xZ5", {}), ("AR", {"n_keys": 16, "n_values": 16}), ("MQAR", {"n_queries": 3}),
         ("ATR", {}), ("REPL", {"n_vars": 4}), ("PFSA", {"n_items": 3}),
         ("SelectiveCopy", {"n_tokens": 3})]


def test_every_named_task_is_covered():
    assert set(task_names()) <= {spec for spec, _ in SPECS}


@pytest.mark.parametrize("spec,options", SPECS)
def test_task_contract(spec, options):
    task = make_task(spec, **options)
    assert isinstance(task, Task) and task.name == spec
    b = task.sample(6, 10, seed=0)
    assert isinstance(b, Batch) and len(b) == 6
    assert b.tokens.dtype == b.targets.dtype == torch.int64 and b.loss_mask.dtype == torch.bool
    assert 0 <= b.tokens.min() and b.tokens.max() < task.vocab_size
    assert 0 <= b.targets.min() and b.targets.max() < task.vocab_size
    assert b.loss_mask.any(dim=1).all()
    T = b.tokens.shape[1]
    for name, pos in b.roles.items():
        assert pos.dtype == torch.int64 and pos.shape[0] == 6, name
        assert 0 <= pos.min() and pos.max() < T, name
    if hasattr(task, "n_states") and b.states.dtype == torch.int64:
        assert b.states.max() < task.n_states and task.group.order == task.n_states
    rebuilt = make_task(task.name, **json.loads(json.dumps(task.options())))
    again = rebuilt.sample(6, 10, seed=0)
    for field in ("tokens", "targets", "loss_mask", "states"):
        assert torch.equal(getattr(again, field), getattr(b, field)), field
    # A numpy Generator works as the seed too; the selection helper keeps the Batch consistent.
    assert len(task.sample(2, 10, np.random.default_rng(0))) == 2
    assert len(b.select(torch.tensor([0, 2]))) == 2


@pytest.mark.parametrize("spec,options", SPECS)
def test_single_example_tensors_are_writable(spec, options):
    """n=1 makes broadcast numpy views look contiguous; tensors must still own writable memory."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = make_task(spec, **options).sample(1, 10, seed=0)
        for tensor in [b.tokens, b.targets, b.loss_mask, b.states, *b.roles.values()]:
            tensor.clone().copy_(tensor)
            assert tensor.numpy().flags.writeable


def test_unknown_task_errors_keep_the_real_reason_and_hint_the_case():
    """Issue 13 item 5: S99 / A99 say why (the degree), s3 gets a case hint."""
    with pytest.raises(ValueError, match=r"task spec 'S99': symmetric group degree k must be an int in 1\.\.6; got 99"):
        make_task("S99")
    with pytest.raises(ValueError, match=r"task spec 'A99': alternating group degree"):
        make_task("A99")
    with pytest.raises(ValueError, match=r"unknown task 's3': did you mean 'S3'\? \(task and group names are case-sensitive"):
        make_task("s3")
    with pytest.raises(ValueError, match=r"did you mean 'MQAR'\?"):
        make_task("mqar")
    with pytest.raises(ValueError, match=r"unknown task 'Q': allowed AR, MQAR"):
        make_task("Q")
