"""nnsight access to our models: `interp.nnsight.wrap(model)`.

    nn_model = wrap(model)
    with nn_model.trace() as tracer:
        barrier = tracer.barrier(2)                             # orders the read before the write
        with tracer.invoke(clean_tokens):                       # [n, T]
            clean_out = nn_model.blocks[0].mixer.hook_out.output[rows, pos]
            barrier()
        with tracer.invoke(corrupt_tokens):                     # [n, T], same T
            barrier()
            nn_model.blocks[0].mixer.hook_out.output[rows, pos] = clean_out
            logits = nn_model.output.save()                     # this invoke's rows only

Within an invoke, read and write sites in execution order (in a mixer, hook_state comes before
hook_out); a value handed from one invoke to another needs a `tracer.barrier` (nnsight 0.8).

Envoys follow the hook grammar (`nn_model.blocks[0].mixer.hook_state`, or
`nn_model.hook_envoy("blocks.0.mixer.hook_state")`, which checks the name). The invokes of one
trace run as one forward pass over their concatenated token rows (nnsight 0.8.1 batches through the
`_batch_size` / `_batch` overrides below; it has no `_prepare_input`); each invoke sees and edits
only its own rows.

Every trace runs on the instrumented path (`models.instrumented()`): nnsight intercepts a module's
forward, not torch hooks, so a mixer cannot tell that nnsight will read or replace its per-step
values; forcing the instrumented path makes every hook point materialise its activation.

State patches: a HookPoint's call runs its forward through nnsight's controller, so the value an
intervention writes to `hook_state.output` is what the hook point returns to
`models.hooks.state.scan_with_state_hook`, which pins every changed (example, step) and re-runs the
recurrence: an nnsight edit of `hook_state` is a causal state patch, as with `run_with_hooks`.
Reading `hook_state.output` gives the states before that re-run (the patched steps hold the
patched values; later steps of the same layer are those of the unpatched scan); later layers and
the logits see the patched run. nnsight hands out the value the hook point returned, which is
fixed before the re-run exists, so it cannot show the re-run's states: read those with
`model.run_with_cache(tokens, names=[...hook_state], fwd_hooks=[...])`, whose readers see the
states after the re-run.

Gradients: `.grad` of `hook_state.output` (inside `with metric.backward():`) is d metric / d h_t,
the total derivative through the recurrence, as `run_with_cache(incl_bwd=True)` caches it: under
grad mode the value the hook point returns enters the re-run as a zero shift of every unpatched
step (models.hooks.state.scan_with_state_hook), so the gradient reaches it (tests/test_gradients.py).

This module is `interp.nnsight`; `import nnsight` inside it is the nnsight package (absolute
imports), so the name does not shadow it.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from nnsight import NNsight
except ImportError as error:  # an optional dependency: the base install leaves it out
    raise ImportError("interp.nnsight needs the nnsight package: pip install 'interp-seq[nnsight]' "
                      f"(or pip install nnsight); {error}") from error

import models
from models.hooks import unknown_name_message


def _tokens(inputs: tuple, kwargs: dict) -> torch.Tensor:
    """The invoke's token ids [n, T] (positional or tokens=)."""
    if kwargs and set(kwargs) != {"tokens"}:
        raise TypeError(f"an invoke takes the token ids [n, T] only; got keyword arguments {sorted(kwargs)}")
    values = list(inputs) + ([kwargs["tokens"]] if kwargs else [])
    if len(values) != 1:
        raise TypeError(f"an invoke takes exactly one argument, token ids [n, T]; got {len(values)}")
    tokens = values[0]
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(
            f"an invoke's tokens must be a [n, T] integer tensor; got {getattr(tokens, 'shape', type(tokens).__name__)}"
        )
    return tokens


class SequenceModelNNsight(NNsight):
    """An NNsight envoy over a SequenceModel whose invokes batch into one forward pass."""

    def _batch_size(self, *inputs: Any, **kwargs: Any) -> int:
        if not inputs and not kwargs:
            return 0
        return _tokens(inputs, kwargs).shape[0]

    def _batch(self, invokes: list[tuple], fn: Any) -> tuple:
        if not invokes:
            return tuple(), {}
        tokens = [_tokens(inputs, kwargs) for inputs, kwargs in invokes]
        lengths = sorted({t.shape[1] for t in tokens})
        if len(lengths) > 1:
            raise ValueError(
                f"invokes batched in one trace must have the same length T; got lengths {lengths}"
            )
        return (torch.cat(tokens, dim=0),), {}

    def interleave(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with models.instrumented():
            return super().interleave(fn, *args, **kwargs)

    def hook_envoy(self, name: str):
        """The envoy of a hook point by its name in the grammar ("blocks.0.mixer.hook_state")."""
        hook_names = self._module.hook_names()
        if name not in hook_names:
            raise ValueError(unknown_name_message("hook name", name, hook_names))
        return self.get(name)


def wrap(model) -> SequenceModelNNsight:
    """An nnsight model (NNsight subclass) over `model`, with envoys named by the hook grammar."""
    if not isinstance(model, models.SequenceModel):
        raise TypeError(f"model must be a models.SequenceModel; got {type(model).__name__}")
    return SequenceModelNNsight(model)
