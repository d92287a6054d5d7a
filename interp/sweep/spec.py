"""Sweep specs: a grid of trials, or the adaptive N* study, read from JSON, YAML or Python.

    load_spec(path or dict) -> SweepSpec
    spec.trials() -> [params]          (grid specs: every trial of the product)

A spec is a mapping (a .json / .yaml / .yml file, or a .py file that defines SPEC = {...}):

    kind: grid                         # or n_star
    trial: interp.analysis.sample_efficiency:train_trial   # "module:function", the default
    grid:                              # grid specs: lists whose product is the trial set
      model: [transformer, lstm]       #   the default trial takes model, task, format, length
      task: [Z5]                       #   (an int or "joint"), n, lr, seed; a custom trial
      format: [outcome, acot]          #   function takes whatever keys the grid names
      length: [2, 4, joint]
      n: [64, 256]
      lr: [0.003]
      seed: [0, 1]
    max_length: 8                      # "joint" trains on 2..max_length (min_length: 2)
    model_options: {transformer: {n_layers: 6}}   # ModelConfig overrides per model
    train: {steps: 500, batch_size: 32, val_size: 128, val_threshold: 0.01}
    ood_factors: [2, 4]                # joint trials report accuracy at 2L and 4L

    kind: n_star                       # the N* / kappa study (interp.analysis.sample_efficiency)
    models: [transformer, lstm, dense_ssm, mamba]
    tasks: [Z5]
    formats: [outcome, cot, acot]
    max_length: 6
    lrs: [0.001, 0.003]
    seeds: [0, 1]
    search: {n0: 16, resolution: 0.1, n_max: 65536}
    (model_options, train, ood_factors, min_length as above)

Every field is checked when the spec is loaded; a bad one raises ValueError naming it
("spec.grid.model: unknown model 'lstmm' ...").

Code execution: loading a .py spec runs it (runpy), and `trial` imports any importable module
(its import-time code runs here and in every worker) and calls the named function per trial.
Load only specs you trust; a JSON / YAML spec with the default trial runs only this toolkit's code.
"""

from __future__ import annotations

import difflib
import importlib
import itertools
import json
import math
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.analysis import sample_efficiency as se

KINDS = ("grid", "n_star")
DEFAULT_TRIAL = "interp.analysis.sample_efficiency:train_trial"
DEFAULT_TRAIN_KEYS = ("model", "task", "format", "length", "n", "lr", "seed")
TOP_KEYS = {"grid": ("kind", "name", "trial", "grid", "max_length", "min_length", "model_options", "train",
                     "ood_factors"),
            "n_star": ("kind", "name", "trial", "models", "tasks", "formats", "max_length", "min_length", "lrs",
                       "seeds", "search", "model_options", "train", "ood_factors")}
SEARCH_KEYS = ("n0", "resolution", "n_max")
MAX_LENGTH = 1024   # sanity bound of max_length / min_length (a study trains every length up to it)


@dataclass
class SweepSpec:
    """A checked spec (see the module docstring); `data` is the mapping it was read from."""

    kind: str
    data: dict[str, Any]
    trial: str = DEFAULT_TRIAL
    name: str = "sweep"
    search: dict[str, Any] = field(default_factory=dict)

    def trial_function(self) -> Callable[[Mapping[str, Any], Path], dict]:
        return resolve(self.trial)

    def trials(self) -> list[dict]:
        """Every trial's params of a grid spec, in product order."""
        if self.kind != "grid":
            raise ValueError(f"spec.kind is {self.kind!r}: only grid specs have a fixed trial list")
        grid, data = self.data["grid"], self.data
        keys = list(grid)
        combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
        if self.trial != DEFAULT_TRIAL:
            return [{**combo, **data.get("train", {})} for combo in combos]
        out = []
        for combo in combos:
            condition = _condition(data, combo["model"], combo["task"], combo["format"], combo["length"])
            out.append({**condition, **{k: combo[k] for k in keys if k not in condition}})
        return out

    def conditions(self) -> list[dict]:
        """The N* study's conditions (n_star specs)."""
        d = self.data
        return se.conditions(d["models"], d["tasks"], d["formats"], d["max_length"],
                             model_options=d.get("model_options"), min_length=d.get("min_length", 2),
                             ood_factors=d.get("ood_factors", (2, 4)), train=d.get("train"))

    def configs(self) -> list[dict]:
        return se.grid_configs(self.data["lrs"], self.data["seeds"])


def _condition(data: Mapping[str, Any], model: str, task: str, fmt: str, length) -> dict:
    max_length = data.get("max_length")
    rows = se.conditions([model], [task], [fmt], max_length if max_length else int(length),
                         model_options=data.get("model_options"), min_length=data.get("min_length", 2),
                         ood_factors=data.get("ood_factors", (2, 4)), train=data.get("train"))
    return next(r for r in rows if r["length"] == length)


def resolve(reference: str) -> Callable:
    """'package.module:function' -> the function."""
    if not isinstance(reference, str) or reference.count(":") != 1:
        raise ValueError(f"spec.trial must be 'module:function'; got {reference!r}")
    module, name = reference.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"spec.trial {reference!r} cannot be imported: {error}") from None
    if not callable(fn):
        raise ValueError(f"spec.trial {reference!r} is not callable")
    return fn


def read_spec_file(path: str | Path) -> dict:
    """The mapping in a spec file; ValueError naming the file when it cannot be read or parsed (an
    exception raised by a .py spec's own code included)."""
    path = Path(path)
    try:
        return _read_spec_file(path)
    except OSError as error:   # a name too long, a link loop, a file unreadable
        raise ValueError(f"spec {str(path)[:200]!r} cannot be read: {error.strerror or error}") from None
    except (ValueError, TypeError):
        raise
    except Exception as error:  # noqa: BLE001 - a .py spec's code failed: named, in one line
        raise ValueError(f"spec {str(path)!r} raised {type(error).__name__} while it was run: {error}") from None


def _read_spec_file(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"spec {str(path)!r} is not a file")
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"spec {str(path)!r} is not valid JSON: {error}") from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:  # pragma: no cover - pyyaml comes with ray
            raise ValueError(f"spec {str(path)!r} is YAML but pyyaml is not installed; use JSON") from None
        try:
            return yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ValueError(f"spec {str(path)!r} is not valid YAML: {error}") from None
    if suffix == ".py":
        namespace = runpy.run_path(str(path))
        if "SPEC" not in namespace:
            raise ValueError(f"spec {str(path)!r} must define SPEC = {{...}}")
        return namespace["SPEC"]
    raise ValueError(f"spec {str(path)!r}: allowed suffixes .json, .yaml, .yml, .py; got {suffix!r}")


def load_spec(source: str | Path | Mapping[str, Any]) -> SweepSpec:
    """Read and check a spec (a path or a mapping)."""
    data = dict(read_spec_file(source)) if isinstance(source, (str, Path)) else source
    if not isinstance(data, Mapping):
        raise ValueError(f"spec must be a mapping; got {type(data).__name__}")
    data = dict(data)
    kind = data.get("kind", "grid")
    if kind not in KINDS:
        raise ValueError(f"spec.kind must be one of {', '.join(KINDS)}; got {kind!r}")
    _unknown_keys("spec", data, TOP_KEYS[kind])
    trial = data.get("trial", DEFAULT_TRIAL)
    resolve(trial)
    _check_train(data.get("train", {}))
    _check_model_options(data.get("model_options", {}))
    if "ood_factors" in data:
        _check_list("spec.ood_factors", data["ood_factors"], lambda v: _is_int(v) and v >= 1, "positive ints")
    for key in ("max_length", "min_length"):
        if key in data and not (_is_int(data[key]) and 1 <= data[key] <= MAX_LENGTH):
            raise ValueError(f"spec.{key} must be a positive int up to {MAX_LENGTH} (each length 2..max_length is "
                             f"a condition of its own; past that, a typo?); got {data[key]!r}")
    if kind == "grid":
        _check_grid(data, trial == DEFAULT_TRIAL)
        search = {}
    else:
        _check_n_star(data)
        search = dict(data.get("search", {}))
    return SweepSpec(kind, data, trial, str(data.get("name", "sweep")), search)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unknown_keys(where: str, data: Mapping, allowed) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"{where}: unknown field {key!r} (allowed: {', '.join(allowed)}){hint}")


def _check_list(where: str, values, ok, what: str) -> None:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ValueError(f"{where} must be a list of {what}; got {values!r}")
    if not values:
        raise ValueError(f"{where} is empty: the grid would have no trials")
    for value in values:
        if not ok(value):
            raise ValueError(f"{where}: {value!r} is not allowed; expected {what}")


def _check_model(where: str, name) -> None:
    import models

    names = models.list_models()
    if name not in names:
        close = difflib.get_close_matches(str(name), names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"{where}: unknown model {name!r} (choose from {', '.join(names)}){hint}")


def _check_task(where: str, name) -> None:
    from interp.tasks import WordProblem, make_task

    try:
        task = make_task(name)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from None
    if not isinstance(task, WordProblem):
        raise ValueError(f"{where}: task {name!r} is not a group word problem (Z5, S5, A4xZ5, ...)")


def _check_format(where: str, name) -> None:
    if name not in se.FORMATS:
        close = difflib.get_close_matches(str(name), se.FORMATS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{where}: unknown format {name!r} (allowed: {', '.join(se.FORMATS)}){hint}")


def _check_train(train) -> None:
    if not isinstance(train, Mapping):
        raise ValueError(f"spec.train must be a mapping of training options; got {train!r}")
    _unknown_keys("spec.train", train, se.TRIAL_TRAIN_KEYS)
    threshold = train.get("val_threshold")
    if threshold is not None and (not isinstance(threshold, (int, float)) or isinstance(threshold, bool)
                                  or not 0 < threshold < math.inf):
        raise ValueError(f"spec.train.val_threshold must be a positive number; got {threshold!r}")
    if not train:
        return
    from interp.training.train import TrainConfig

    probe = {k: v for k, v in train.items() if k != "val_threshold"}
    probe.setdefault("warmup", min(TrainConfig.warmup, probe.get("steps", TrainConfig.steps) // 10))
    try:
        TrainConfig(dataset_size=1, **probe)
    except (ValueError, TypeError) as error:
        raise ValueError(f"spec.train: {error}") from None


def _check_model_options(options) -> None:
    if not isinstance(options, Mapping):
        raise ValueError(f"spec.model_options must map model names to ModelConfig overrides; got {options!r}")
    import models
    from interp.training.preflight import check_override_bounds

    for name, overrides in options.items():
        _check_model("spec.model_options", name)
        if not isinstance(overrides, Mapping):
            raise ValueError(f"spec.model_options.{name} must be a mapping; got {overrides!r}")
        try:
            check_override_bounds(overrides)
            models.preset_config(name, **overrides)
        except (ValueError, TypeError) as error:
            raise ValueError(f"spec.model_options.{name}: {error}") from None


def _check_grid(data: Mapping, default_trial: bool) -> None:
    grid = data.get("grid")
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"spec.grid must be a non-empty mapping of lists; got {grid!r}")
    for key, values in grid.items():
        _check_list(f"spec.grid.{key}", values, lambda v: True, "values")
    if default_trial:
        missing = [k for k in DEFAULT_TRAIN_KEYS if k not in grid]
        if missing:
            raise ValueError(f"spec.grid lacks {missing}: the default trial needs {', '.join(DEFAULT_TRAIN_KEYS)}")
        _unknown_keys("spec.grid", grid, DEFAULT_TRAIN_KEYS)
        if "joint" in grid["length"] and "max_length" not in data:
            raise ValueError("spec.max_length is needed when spec.grid.length holds 'joint' (lengths 2..max_length)")
        _check_list("spec.grid.length", grid["length"], lambda v: v == "joint" or (_is_int(v) and v >= 1),
                    "positive ints or 'joint'")
        _check_list("spec.grid.lr", grid["lr"], lambda v: isinstance(v, (int, float)) and 0 < v < math.inf,
                    "positive numbers")
        _check_list("spec.grid.seed", grid["seed"], lambda v: _is_int(v) and v >= 0, "non-negative ints")
    for key, check in (("model", _check_model), ("task", _check_task), ("format", _check_format)):
        for value in grid.get(key, ()):
            check(f"spec.grid.{key}", value)
    if "n" in grid:
        _check_list("spec.grid.n", grid["n"], lambda v: _is_int(v) and v >= 1, "positive ints (N > 0)")


def _check_n_star(data: Mapping) -> None:
    for key in ("models", "tasks", "formats", "max_length", "lrs", "seeds"):
        if key not in data:
            raise ValueError(f"spec.{key} is required for an n_star spec")
    for key, check in (("models", _check_model), ("tasks", _check_task), ("formats", _check_format)):
        _check_list(f"spec.{key}", data[key], lambda v: True, "names")
        for value in data[key]:
            check(f"spec.{key}", value)
    _check_list("spec.lrs", data["lrs"], lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                and 0 < v < math.inf, "positive numbers")
    _check_list("spec.seeds", data["seeds"], lambda v: _is_int(v) and v >= 0, "non-negative ints")
    if data["max_length"] < data.get("min_length", 2):
        raise ValueError(f"spec.max_length ({data['max_length']}) must be >= spec.min_length "
                         f"({data.get('min_length', 2)})")
    search = data.get("search", {})
    if not isinstance(search, Mapping):
        raise ValueError(f"spec.search must be a mapping; got {search!r}")
    _unknown_keys("spec.search", search, SEARCH_KEYS)
    try:
        se.NStarSearch(search.get("n0", 16), search.get("resolution", 0.1), search.get("n_max", 1 << 16))
    except ValueError as error:
        raise ValueError(f"spec.search: {error}") from None
