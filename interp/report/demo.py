"""The report of `interp demo` (tanh RNN vs Mamba on S3) and the model-config table it shows.

    used_config_fields(cfg) -> [field]                     the ModelConfig fields building the model reads
    config_rows({name: ModelConfig}) -> [row]              one row per field that applies to some model
    write_demo_report(path, demo, runs, evals, timings)    the HTML report (docs/reports.md)

`demo` is interp.cli.demo's DemoPlan (models: {preset: (overrides, TrainConfig)}, lengths, eval_n,
label), `runs` its TrainResults, `evals` its LengthEvals by length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interp.report import evaluation as figures
from interp.report.html import Table, Text, write_report
from models.config import ModelConfig

NOT_USED = ""   # the cell of a field a model does not read


def used_config_fields(cfg: ModelConfig) -> list[str]:
    """The fields of `cfg` that building a SequenceModel from it reads, in field order.

    The model is built once on the meta device (no memory) from a copy of `cfg` that records
    every field read after its own validation; a field no constructor reads (d_state for a tanh
    RNN, max_len without learned positions) does not apply to the model. `mixer_options` is left
    out when empty.
    """
    import torch

    from models.backbone import SequenceModel

    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg must be a models.config.ModelConfig; got {type(cfg).__name__}")
    names = ModelConfig.field_names()
    seen: set[str] = set()
    paused = [0]

    @contextlib.contextmanager
    def pause():
        paused[0] += 1
        try:
            yield
        finally:
            paused[0] -= 1

    class Recording(ModelConfig):
        def __getattribute__(self, name: str):
            if not paused[0] and name in names:
                seen.add(name)
            return object.__getattribute__(self, name)

        def __post_init__(self) -> None:        # validation reads every field
            with pause():
                super().__post_init__()

        def explicit(self, name: str):   # a field read as set (models.config.Derived) is read too
            if not paused[0] and name in names:
                seen.add(name)
            return super().explicit(name)

        def layer_config(self, layer: int) -> ModelConfig:   # a hybrid's copy: its reads count, not the copying
            with pause():
                return super().layer_config(layer)

    recording = Recording(**cfg.to_dict())
    with torch.device("meta"):
        SequenceModel(recording)
    return [name for name in names if name in seen and (name != "mixer_options" or cfg.mixer_options)]


def config_rows(configs: Mapping[str, ModelConfig]) -> list[dict[str, Any]]:
    """One row {"field", model: value, ...} per field that some model reads and sets (a field that
    is None for every model reading it, a feature left off or a width left to its default, has
    no row); a model's cell is empty where it does not read that field."""
    used = {name: set(used_config_fields(cfg)) for name, cfg in configs.items()}
    rows = []
    for field in ModelConfig.field_names():
        readers = [name for name in configs if field in used[name]]
        if any(configs[name].explicit(field) is not None for name in readers):   # as set: a derived width is None
            rows.append({"field": field, **{name: _cell(cfg.explicit(field)) if name in readers else NOT_USED
                                            for name, cfg in configs.items()}})
    return rows


def _cell(value: Any) -> Any:
    return "None" if value is None else value if isinstance(value, (int, float, str)) else repr(value)


def intro_text(demo, runs, task: str, fmt: str, train_length: int, threshold: float) -> str:
    """The "What was run" paragraphs, the expected outcome included."""
    text = (
        f"Each model was trained on the {task} word problem ({fmt}: the running product is the "
        f"target at every step) with a length curriculum from 2 up to length {train_length}, then "
        f"evaluated on {demo.eval_n} fresh sequences at each length in {demo.lengths}. Accuracy is "
        f"the final-state accuracy (the prediction at the last position); mp is the largest "
        f"evaluated length whose accuracy is at least {threshold:.0%}."
        "\n\nWhat to expect: the tanh RNN (a state-dependent recurrence, which can pull a drifting state "
        "back to its class) is expected to stay above 90% at every length up to 1000. Mamba is "
        f"expected to fail {task}, by design: its recurrence is affine (the step Jacobian depends on the "
        "input only), so drift along the states that distinguish the group elements is never corrected and "
        "accumulates with length until the read-out flips. At the demo's size its curriculum usually stalls "
        "at a short length and its accuracy stays near chance (1/6 on S3) at every evaluated length. That "
        "failure is the demo's point, not a bug (docs/drift.md and docs/length-generalisation.md in the "
        "repository explain the measurements).")
    short = [f"{name} (length {run.final_length})" for name, run in runs.items() if run.final_length < train_length]
    if short:
        patience = next(iter(demo.models.values()))[1].curriculum_patience
        text += (f"\n\nNot every model reached the training length: the curriculum stopped at "
                 f"{', '.join(short)}, where its final-state accuracy never reached 95% on "
                 f"{patience} consecutive evaluations.")
    if demo.label == "quick":
        text += "\n\nThis is the --quick smoke run: toy sizes and few steps; its numbers mean nothing."
    return text


def write_demo_report(path: str | Path, demo, runs, evals, timings: Mapping[str, Mapping[str, float]], *,
                      task: str = "S3", fmt: str = "acot", train_length: int = 60, threshold: float = 0.9) -> Path:
    """The demo's HTML report: what was run and what to expect, accuracy by length, the mp table,
    training curves, accuracy by position, the training table and the model configs (the fields
    that apply to each model)."""
    training_rows = []
    for name, (_, cfg) in demo.models.items():
        model_cfg = runs[name].model.cfg
        training_rows.append({
            "model": name, "d_model": model_cfg.d_model, "n_layers": model_cfg.n_layers,
            "parameters": sum(p.numel() for p in runs[name].model.parameters()),
            "steps": cfg.steps, "batch": cfg.batch_size, "lr": cfg.lr,
            "curriculum reached length": runs[name].final_length,
            "train s": timings[name]["train_s"], "eval s": timings[name]["eval_s"]})
    sections = [
        Text(intro_text(demo, runs, task, fmt, train_length, threshold), heading="What was run"),
        figures.accuracy_vs_length(evals, threshold, train_length),
        Table(figures.mp_rows(evals, threshold), heading="mp and accuracy by length"),
        figures.training_curves({name: run.metrics for name, run in runs.items()}),
        figures.position_accuracy(evals, max(demo.lengths)),
        Table(training_rows, heading="Models and training (train s / eval s: wall seconds)"),
        Table(config_rows({name: run.model.cfg for name, run in runs.items()}),
              heading="Model configs (a blank cell: the field does not apply to that model)"),
    ]
    return write_report(path, f"interp demo: {task} length generalisation", sections)
