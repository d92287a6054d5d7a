"""StatePatch: a hook_state patch that declares which states it changes and how.

A patch hook function is opaque: a mixer must materialise every state [B, T, *S], hand it over,
compare the result to find what changed (the pins) and re-run the recurrence from there
(models.hooks.state.scan_with_state_hook). A StatePatch says where (example, step) and what (values,
deltas, or a function of the state there), so a recurrent mixer can instead run its fast kernels
up to each patched step, replace the state there and continue (RecurrentMixer.declared_forward),
never forming the [B, T, *S] states. `StatePlan` turns the patches attached to one hook_state
into that schedule.

Several patches on one row mean one thing on every path (the full forward, declared or as hook
functions, and `generate`, whose calls see the steps of one call each): they apply in step
order, each on the state as the earlier ones left it, so a delta or fn at a later step acts on
the state recomputed after the earlier patches (the causal reading). Patches attached at one
(row, step) apply in the order attached, each on the one before's result.
"""

from __future__ import annotations

import bisect

import torch


class StatePatch:
    """A declared hook_state patch: for each entry i the state of example rows[i] after step
    times[i] becomes

        values[i]              (values given: "set")
        current + deltas[i]    (deltas given: "add")
        fn(current)[i]         (fn given: "map")

    where current is the state at the entry as the run reaches it: after the patches at earlier
    steps of that row (the module docstring) and those attached before this one at the same
    step. fn is called once per patched step with the entries there, current [m, *S] in the
    order of the entries (all M at once where they share one step), and must return [m, *S];
    with_index=True calls fn(current, index) with index [m] the entries' places in rows / times.
    rows, times: int64 [M] (or sequences of ints); times count from the start of the states the
    hook sees, negative ones from their end (a resumed call, `SequenceModel.resume_from`, sees
    the last positions only). Each (row, time) at most once. `StatePatch.at(t, values=...)`
    patches every row at step t.

    As a hook function (fwd_hooks=[(name, patch)]) it works on every path and every mixer; where
    it can, a recurrent mixer runs it declared instead (the module docstring).
    """

    def __init__(self, rows, times, values=None, deltas=None, fn=None, with_index: bool = False) -> None:
        given = [name for name, v in (("values", values), ("deltas", deltas), ("fn", fn)) if v is not None]
        if len(given) != 1:
            raise ValueError(f"StatePatch needs exactly one of values, deltas or fn; got {given or 'none'}")
        self.rows, self.times = _entry_index("rows", rows), _entry_index("times", times)
        if self.rows.shape != self.times.shape or not len(self.rows):
            raise ValueError(f"StatePatch rows and times must be two nonempty [M] index lists of one length; got "
                             f"{tuple(self.rows.shape)} and {tuple(self.times.shape)}")
        self.mode = {"values": "set", "deltas": "add", "fn": "map"}[given[0]]
        self.with_index = bool(with_index) and self.mode == "map"
        self.payload = fn if fn is not None else (values if values is not None else deltas)
        if self.mode == "map" and not callable(fn):
            raise TypeError(f"StatePatch fn must be callable as fn(current [M, *S]) -> [M, *S]; got {type(fn).__name__}")
        if self.mode != "map" and (not isinstance(self.payload, torch.Tensor) or self.payload.shape[:1] != self.rows.shape):
            raise ValueError(f"StatePatch {given[0]} must be a [M, *S] tensor with M = {len(self.rows)} entries; got "
                             f"{tuple(getattr(self.payload, 'shape', ())) or type(self.payload).__name__}")

    @classmethod
    def at(cls, time: int, values: torch.Tensor | None = None, deltas: torch.Tensor | None = None) -> "StatePatch":
        """Every row's state after step `time` set to values [B, *S] (or shifted by deltas [B, *S])."""
        given = values if values is not None else deltas
        if not isinstance(given, torch.Tensor) or given.dim() < 1:
            raise ValueError(f"StatePatch.at needs values or deltas, a [B, *S] tensor; got {type(given).__name__}")
        if isinstance(time, bool) or not isinstance(time, int):
            raise TypeError(f"StatePatch.at: time must be an int step; got {time!r}")
        rows = torch.arange(given.shape[0])
        return cls(rows, torch.full_like(rows, time), values=values, deltas=deltas)

    def entries(self, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, times) [M] checked against states [batch, length, ...], times made >= 0."""
        if int(self.rows.min()) < 0 or int(self.rows.max()) >= batch:
            raise ValueError(f"StatePatch rows must lie in [0, {batch}) (the batch); got {self.rows.tolist()[:8]}")
        if int(self.times.min()) < -length or int(self.times.max()) >= length:
            raise ValueError(f"StatePatch times must lie in [-T, T) = [{-length}, {length}) (the states' steps); "
                             f"got {self.times.tolist()[:8]}")
        times = self.times % length
        if len(torch.unique(self.rows * length + times)) != len(times):
            raise ValueError("StatePatch entries must name each (row, time) at most once")
        return self.rows, times

    def new_values(self, current: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """The patched states [m, *S] from the current ones [m, *S] at the entries selected by
        at ([M] bool, or [m] int64 places in rows / times; None: all M): values[at], current +
        deltas[at] or fn(current)."""
        if self.mode == "map":
            index = torch.arange(len(self.rows)) if at is None else at.cpu()
            index = index.nonzero()[:, 0] if index.dtype == torch.bool else index
            new = self.payload(current, index) if self.with_index else self.payload(current)
            if not isinstance(new, torch.Tensor):
                raise TypeError(f"StatePatch fn must return a tensor; got {type(new).__name__}")
        else:
            given = self.payload if at is None else self.payload[at.to(self.payload.device)]
            new = given if self.mode == "set" else current + given.to(device=current.device, dtype=current.dtype)
        if new.shape != current.shape:
            raise ValueError(f"StatePatch {self.mode} gives states of shape {tuple(new.shape[1:])} at its "
                             f"{len(current)} entries; the state has shape {tuple(current.shape[1:])}")
        return new.to(device=current.device, dtype=current.dtype)

    def __call__(self, states: torch.Tensor, hook) -> torch.Tensor:
        """As a hook function on states [B, T, *S]: the entries of each step in increasing order,
        each on the states as they are (a hook function sees one run's states; the mixer re-runs
        the recurrence from the first patched step when a row is patched at several,
        models.hooks.state.causal_pins). While hook.window = (first, length) is set, states are
        the steps first, ..., first + T - 1 of a call of `length` steps (causal_pins' windows):
        the entries there apply, each window costing its own entries only."""
        first, length = getattr(hook, "window", (0, states.shape[1]))
        steps, places = self.by_step(states.shape[0], length)
        out = states.clone()
        for i in range(bisect.bisect_left(steps, first), bisect.bisect_left(steps, first + states.shape[1])):
            at = places[i]  # [m]: the entries at steps[i]
            rows = self.rows[at].to(states.device)
            out[rows, steps[i] - first] = self.new_values(out[rows, steps[i] - first], at)
        return out

    def by_step(self, batch: int, length: int) -> tuple[list[int], list[torch.Tensor]]:
        """(the patched steps ascending, each one's entries [m] in order) over states [batch, length],
        checked (entries) once per shape."""
        key = (batch, length)
        if getattr(self, "_by_step", (None,))[0] != key:
            self._by_step = (key, *by_time(self.entries(batch, length)[1]))
        return self._by_step[1], self._by_step[2]

    def __repr__(self) -> str:
        return f"StatePatch({self.mode}, {len(self.rows)} entries at steps {sorted(set(self.times.tolist()))[:6]})"


def _entry_index(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"StatePatch {name} must be a 1-D integer tensor; got {value.dtype} {tuple(value.shape)}")
        return value.long().cpu()
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return torch.tensor(list(value), dtype=torch.long)
    raise TypeError(f"StatePatch {name} must be a 1-D integer tensor or a list of ints; got {value!r}")


class StatePlan:
    """The patches [(StatePatch, allow_nonfinite)] of one hook_state over states [batch, length, *S]
    as one schedule: entries rows, times [U] (the union, each (row, time) once) and steps (the
    distinct times, ascending). A run applies them step by step in increasing order (`at_step`):
    each patch at a step acts on the state as the run reached it there, after every earlier
    step's patches (the causal reading), and the patches attached at one (row, step) act in
    order, each on the one before's result, as hook functions do."""

    def __init__(self, patches, batch: int, length: int) -> None:
        self.patches = patches
        found = [patch.entries(batch, length) for patch, _ in patches]
        keys = torch.cat([rows * length + times for rows, times in found])  # [sum M]
        union, index = torch.unique(keys, return_inverse=True)  # union sorted by (row, time)
        self.rows, self.times = union // length, union % length  # [U]
        steps, here = by_time(self.times)
        self.steps = steps
        # step -> (the union's entries there [k] ascending, [(patch, its entries there [m] (places in its
        # rows / times, ascending), where they are among the k [m])]): index tensors, O(U) in all
        self._at: dict[int, tuple[torch.Tensor, list[tuple[int, torch.Tensor, torch.Tensor]]]] = {
            step: (entries, []) for step, entries in zip(steps, here)}
        for i, (entries, (_, times)) in enumerate(zip(index.split([len(rows) for rows, _ in found]), found)):
            for step, places in zip(*by_time(times)):
                mine = torch.searchsorted(self._at[step][0], entries[places])
                self._at[step][1].append((i, places, mine))

    @classmethod
    def from_pins(cls, mask: torch.Tensor, values: torch.Tensor) -> "StatePlan":
        """The plan setting the states [B, T, *S] to values where mask [B, T] is set: what hook
        functions changed (models.hooks.state.changed_steps, causal_pins)."""
        rows, times = mask.nonzero(as_tuple=True)
        patch = StatePatch(rows.cpu(), times.cpu(), values=values[rows, times])
        return cls([(patch, True)], *mask.shape)  # allow_nonfinite: the hook's own check has run

    def at_step(self, step: int, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows [k], their patched states [k, *S]) at `step` from the running state [B, *S]
        after that step: each patch with entries there applied in order."""
        here, parts = self._at[step]  # the union's entries at step [k], ascending
        rows = self.rows[here].to(state.device)
        values = state[rows].clone()  # [k, *S]
        for i, places, mine in parts:
            patch, allow_nonfinite = self.patches[i]
            mine = mine.to(state.device)  # this patch's entries at step, in values
            before = values[mine]
            new = patch.new_values(before, places)
            if not allow_nonfinite and not bool(torch.isfinite(new).all()) and bool(torch.isfinite(before).all()):
                raise ValueError(f"{patch!r} makes {int((~torch.isfinite(new)).sum())} state values NaN or Inf; pass "
                                 "allow_nonfinite=True (run_with_hooks / run_with_cache / hooks) if that is intended")
            values[mine] = new
        return rows, values


def by_time(times: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """times [M] -> (the distinct times ascending, for each the places [m] in times holding it,
    ascending)."""
    steps, counts = torch.unique(times, return_counts=True)  # sorted
    return steps.tolist(), list(torch.argsort(times, stable=True).split(counts.tolist()))
