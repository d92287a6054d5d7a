"""Grids of independent units: run anywhere, written as they finish, resumed, merged bit for bit.

An analysis that loops over independent units (site chunks x example chunks of an interchange
grid, prompt chunks of EAP / EAP-IG, edge chunks of an exact re-scoring) describes its work as

    UnitWork(model, compute, inputs)      compute(model, inputs, spec) -> {name: tensor}, a
                                          module-level function (workers import it by name);
                                          inputs a dict (plus `pinned`, below)
    units: list[Unit]                     Unit(key, spec): spec a JSON-able dict of what it covers

and hands it to `run_units(work, units, executor=..., out=...)`, which returns {key: tensors}
for every unit; the analysis merges them. Where a unit runs does not change its bits:

- the unit grid is fixed by the inputs and the chunk sizes, never by the number of workers, so a
  unit's batch composition (which pairs share its passes) is the same everywhere;
- every unit runs with one torch thread (`one_thread_unit`), in this process or in a worker: a
  CPU reduction's order depends on the thread count (tested: 2 threads change the last bits);
- the result is merged by unit key, so the order of completion does not matter.

executor: None runs the units here, one after another; an executor of interp.sweep.executors
(`make_executor("local" | "ray", workers=...)`) has `map_units(work, units, on_result)` and runs
them on its workers, each worker building the model once (a process per worker, or a Ray actor per
worker fed from the object store) and keeping it for the next grid on the same weights. The analysis never imports the executors (interp.sweep ranks
above interp.analysis): it is handed one.

out: a directory that makes the grid resumable. It gets manifest.json (the analysis, its options,
the sha256 of the model's weights, of the inputs and of the unit grid) and units/KEY.safetensors
per finished unit, each written atomically (temporary file, fsync, rename) as it arrives in this
process, so a killed driver loses at most the units in flight. Rerunning the same call skips the
finished units; an out of another model, input, options or grid is refused in one line naming
what differs. Settings resolved from the machine (`pinned`: the memory budget a unit's passes are
planned to) are recorded by the first run and reused by every resume, so a resumed grid plans
its units as the first run did. The directory is locked while the grid runs (models.storage.paths.locked);
nothing outside it is written and no link inside it is followed (models.storage.paths.inside).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.memory import progress_bar
from models.storage.paths import inside, locked, read_regular
from models.storage.writer import write_file, write_json

FORMAT = "interp-units/1"
MANIFEST = "manifest.json"


class GridFailed(RuntimeError):
    """A grid could not finish: a unit raised in its worker, or its workers kept dying."""


@dataclass(frozen=True)
class Unit:
    key: str    # file-name safe, unique in its grid
    spec: dict  # JSON-able: what the unit covers


@dataclass
class UnitWork:
    """What every unit of one grid shares: the model, the function and its inputs (module docstring)."""

    model: torch.nn.Module
    compute: Callable[[torch.nn.Module, Any, dict], dict]
    inputs: Any
    name: str = "grid"          # the analysis, named in the manifest and the progress bar
    options: dict = dataclasses.field(default_factory=dict)  # JSON-able settings, in the manifest
    # JSON-able settings resolved from the machine (the memory budget): recorded in the manifest by
    # the first run and reused on every resume, so that a resumed grid plans its units alike
    pinned: dict = dataclasses.field(default_factory=dict)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) spans of at most `size` covering range(n)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"chunk size must be a positive int; got {size!r}")
    return [(start, min(start + size, n)) for start in range(0, n, size)]


@contextmanager
def one_thread_unit():
    """Run the block with one torch thread (restored after): a unit's bits must not depend on
    where it runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def compute_unit(work: UnitWork, spec: dict) -> dict[str, torch.Tensor]:
    """One unit, with one thread, results on the CPU."""
    with one_thread_unit(), torch.no_grad():
        out = work.compute(work.model, {**work.inputs, **work.pinned}, spec)
    return {name: value.detach().cpu().contiguous() for name, value in out.items()}


# ----------------------------------------------------------------------------- digests


def _feed(h, value: Any) -> None:
    """Feed a canonical encoding of value (tensors, arrays, dataclasses, mappings, sequences,
    scalars, strings) into the hash h."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(f"D{type(value).__name__}".encode())
        for field in dataclasses.fields(value):
            h.update(field.name.encode())
            _feed(h, getattr(value, field.name))
    elif isinstance(value, dict):
        h.update(f"M{len(value)}".encode())
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for item in value:
            _feed(h, item)
    else:
        h.update(f"S{type(value).__name__}:{value!r}".encode())


def digest(value: Any) -> str:
    """sha256 of a canonical encoding of `value` (see _feed)."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


_DIGESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> (fingerprint, sha256)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's state (names, dtypes, shapes, bytes; about 1 s per GB), computed again
    only when a tensor of the state was replaced or changed in place since the last call (its
    storage or its version counter moved)."""
    state = model.state_dict()
    fingerprint = tuple((name, t.data_ptr(), t._version) for name, t in state.items())
    known = _DIGESTS.get(model)
    if known is not None and known[0] == fingerprint:
        return known[1]
    value = digest(dict(state))
    _DIGESTS[model] = (fingerprint, value)
    return value


# ----------------------------------------------------------------------------- the output directory


class UnitStore:
    """out/manifest.json and out/units/KEY.safetensors (module docstring)."""

    def __init__(self, out: str | os.PathLike, manifest: dict) -> None:
        self.root = Path(out)
        self.manifest = manifest

    def open(self) -> dict[str, dict[str, torch.Tensor]]:
        """Create or check the manifest; the finished units' tensors by key."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.units = inside(self.root, "units")
        self.units.mkdir(exist_ok=True)
        path = inside(self.root, MANIFEST)
        if not path.exists():
            write_json(path, self.manifest)
            return {}
        found = json.loads(read_regular(path))
        self._check(found)
        self.manifest["pinned"] = found.get("pinned", self.manifest["pinned"])
        done = {}
        for key in self.manifest["units"]["keys"]:
            file = inside(self.units, f"{key}.safetensors")
            if file.exists():
                done[key] = self._read(file)
        return done

    def _check(self, found: dict) -> None:
        for field, what in (("format", "format"), ("analysis", "analysis"), ("weights_sha256", "model (weights)"),
                            ("inputs_sha256", "input"), ("options", "options"), ("units", "unit grid")):
            if found.get(field) != self.manifest[field]:
                mine, theirs = self.manifest[field], found.get(field)
                if isinstance(mine, dict):
                    mine, theirs = digest(mine)[:12], digest(theirs)[:12]
                raise ValueError(f"out {str(self.root)!r} holds a grid of another {what} ({field} {theirs!s:.16} "
                                 f"there, {mine!s:.16} here); pass another out directory, or remove it to start over")

    def _read(self, file: Path) -> dict[str, torch.Tensor]:
        from safetensors.torch import load

        try:
            return load(read_regular(file))
        except Exception as error:  # noqa: BLE001 - a torn or edited file: named, then refused
            raise ValueError(f"unit file {file} is unreadable ({type(error).__name__}: {error}); remove it to "
                             "recompute that unit") from None

    def write(self, key: str, tensors: dict[str, torch.Tensor], node: str) -> None:
        """The unit's tensors, atomically; the node that computed it in the file's metadata."""
        from safetensors.torch import save_file

        write_file(inside(self.units, f"{key}.safetensors"),
                   lambda tmp: save_file(tensors, tmp, metadata={"node": node}))


def manifest_of(work: UnitWork, units: Sequence[Unit]) -> dict:
    return {"format": FORMAT, "analysis": work.name, "options": work.options, "pinned": work.pinned,
            "weights_sha256": weights_digest(work.model), "inputs_sha256": digest(work.inputs),
            "units": {"count": len(units), "keys": [u.key for u in units],
                      "specs_sha256": digest([u.spec for u in units])}}


# ----------------------------------------------------------------------------- the driver


class Progress:
    """One bar over every unit: done / total, ETA, units per second per node (in the postfix)."""

    def __init__(self, total: int, done: int, enabled: bool, name: str) -> None:
        self.bar = progress_bar(total, enabled, desc=name, unit="unit", initial=done)
        self.started, self.per_node = time.perf_counter(), {}

    def update(self, node: str) -> None:
        self.per_node[node] = self.per_node.get(node, 0) + 1
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        self.bar.set_postfix_str(" ".join(f"{n[:8]} {c / elapsed:.2f}/s" for n, c in sorted(self.per_node.items())),
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run_units(work: UnitWork, units: Sequence[Unit], executor=None, out: str | os.PathLike | None = None,
              progress: bool = True) -> dict[str, dict[str, torch.Tensor]]:
    """Every unit's tensors by key (module docstring): the finished ones from `out`, the others
    computed here (executor None) or on the executor's workers, each written to `out` as it
    arrives."""
    keys = [u.key for u in units]
    if len(set(keys)) != len(keys):
        raise ValueError(f"unit keys must be unique; got {len(keys) - len(set(keys))} repeated")
    if executor is not None and not hasattr(executor, "map_units"):
        raise TypeError(f"executor must be None or an executor of interp.sweep.executors (make_executor('local' | "
                        f"'ray', ...)); got {type(executor).__name__}")
    if out is None:
        return _run(work, units, executor, {}, None, progress)
    if not isinstance(out, (str, os.PathLike)) or not str(out).strip():
        raise TypeError(f"out must be None or a directory path; got {out!r}")
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"out {str(out)!r} exists and is not a directory; the units go into a directory")
    store = UnitStore(out, manifest_of(work, units))
    with locked(out, "grid output directory", create=True):   # made already locked
        done = store.open()
        work = dataclasses.replace(work, pinned=store.manifest["pinned"])
        return _run(work, units, executor, done, store, progress)


def _run(work, units, executor, done: dict, store: UnitStore | None, progress: bool) -> dict:
    todo = [u for u in units if u.key not in done]
    bar = Progress(len(units), len(done), progress, work.name)

    def on_result(unit: Unit, tensors: dict[str, torch.Tensor], node: str) -> None:
        if store is not None:
            store.write(unit.key, tensors, node)
        done[unit.key] = tensors
        bar.update(node)

    try:
        if executor is None:
            for unit in todo:
                on_result(unit, compute_unit(work, unit.spec), "local")
        elif todo:
            executor.map_units(work, todo, on_result)
    finally:
        bar.close()
    missing = [u.key for u in units if u.key not in done]
    if missing:
        raise GridFailed(f"{len(missing)} units did not finish (first: {missing[0]})")
    return done


def default_chunk(rows_per_item: int, rows_per_unit: int) -> int:
    """Items per unit so that a unit holds about `rows_per_unit` rows when each item brings
    `rows_per_item`: a function of the grid alone, never of the workers."""
    return max(1, math.ceil(rows_per_unit / max(1, rows_per_item)))
