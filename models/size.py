"""What a model costs before it is built: its parameter count, and the size gate every model built
from a ModelConfig passes (models.registry.build / load).

    parameter_count(config)         parameters of SequenceModel(config), counted from formulas (nothing built)
    check_fits(config, device=...)  ModelTooLarge (a ValueError, one line) when the model would not
                                    fit the memory available, before anything is allocated

The field bounds (ModelConfig's FIELD_BOUNDS) refuse sizes no real model has; within them the
memory decides: a 7B Llama-sized config passes the bounds and is refused only by a machine with
less than its ~27 GB of float32 weights free.
"""

from __future__ import annotations

import functools

import torch

from models.config import ModelConfig
from models.memory import available_bytes, format_bytes
from models.moe import uses_moe

FLOAT32_BYTES = 4   # a model is built in float32, then converted to the dtype its weights are in


class ModelTooLarge(ValueError):
    """A model refused before it is built: its weights would not fit the memory available."""


def parameter_count(config: ModelConfig) -> int:
    """Parameters of SequenceModel(config), counted from the config alone (nothing built, nothing
    allocated); see `element_counts`."""
    return element_counts(config)[0]


def element_counts(config: ModelConfig) -> tuple[int, int]:
    """(parameters, buffer bytes) of SequenceModel(config), from formulas: the embeddings, final
    norm and unembedding from their shapes, and each kind of layer (its mixers, MLP, and whether
    it is the first: RWKV-7's first layer has weights the others lack) once, from
    models.backbone.Block.element_counts (each mixer's own element_counts, beside its __init__),
    however many layers there are; a shared block's tied weights (Zamba2) once per shared index.
    Exact (tests/test_size_count.py builds every preset and importer layout and compares), and
    cheap: no module is built, so no meta-device op runs (the first one in a process imports sympy
    for torch.fx's symbolic shapes: it cost a load 1.4 s and 140 MB). Cached per config (a model is
    often built many times from one)."""
    return _element_counts(config.to_json())


@functools.lru_cache(maxsize=256)
def _element_counts(config_json: str) -> tuple[int, int]:
    from models.backbone import Block, check_mixers, norm_size

    config = ModelConfig.from_json(config_json)
    check_mixers(config)
    embedding = config.vocab_size * config.d_model
    positions = config.max_len * config.d_model if config.positional == "learned" else 0
    parameters = norm_size(config) + embedding * (1 if config.tie_embeddings else 2) + positions
    buffers = 0
    kinds: dict[tuple, tuple[int, int, int]] = {}   # kind -> (parameters, buffer bytes, tied shared parameters)
    layers = zip(config.mixers, config.mixer2s, config.mlps, config.shared_blocks)   # each property a new list
    for layer, (mixer, mixer2, mlp, shared_index) in enumerate(layers):
        kind = (mixer, mixer2, mlp, uses_moe(config, layer), shared_index is not None, layer == 0)
        if kind not in kinds:
            kinds[kind] = Block.element_counts(config, layer)
        parameters, buffers = parameters + kinds[kind][0], buffers + kinds[kind][1]
    tied = max((shared for *_, shared in kinds.values()), default=0)
    parameters += tied * len({index for index in config.shared_blocks if index is not None})
    return parameters, buffers


def check_fits(config: ModelConfig, device: str = "cpu", weights_bytes: int = 0, what: str = "the model") -> None:
    """ModelTooLarge (one line: the parameters, the bytes, the memory available) when building
    SequenceModel(config) in float32 on the CPU, plus `weights_bytes` (a weights file read beside
    it), exceeds the memory available now, or its weights (the file's bytes, in their own dtype,
    else float32) exceed what is free on a GPU `device`."""
    parameters, buffers = element_counts(config)
    needed = FLOAT32_BYTES * parameters + buffers + weights_bytes
    available = available_bytes()
    if needed > available:
        read = f" and {format_bytes(weights_bytes)} for its weights file" if weights_bytes else ""
        raise ModelTooLarge(f"{what} has {parameters:,} parameters: building it needs about {format_bytes(needed)} "
                            f"({format_bytes(FLOAT32_BYTES * parameters + buffers)} in float32{read}), more than "
                            f"the {format_bytes(available)} of memory available; lower d_model / n_layers / vocab_size")
    if str(device).startswith("cuda") and torch.cuda.is_available():
        on_gpu, free = weights_bytes or FLOAT32_BYTES * parameters, torch.cuda.mem_get_info(torch.device(device))[0]
        if on_gpu > free:
            raise ModelTooLarge(f"{what} has {parameters:,} parameters: about {format_bytes(on_gpu)} of weights, "
                                f"more than the {format_bytes(free)} free on {device}")
