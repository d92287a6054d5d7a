"""from_pretrained(source): a transformers / fla model, in memory or in a local checkpoint
directory, as our instrumented SequenceModel with the same math.

    model = models.from_pretrained("path/to/mamba-130m-hf")   # nothing is downloaded
    model.save("runs/mamba-130m")                              # models.load(...) rebuilds it bit for bit

The source's config picks the converter (models.interop.registry); fields we cannot represent
raise UnsupportedConfig, weights the conversion would drop raise too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from models.backbone import SequenceModel
from models.interop.registry import CONVERTERS, converter_for

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def from_pretrained(source: nn.Module | str | os.PathLike, dtype: torch.dtype | None = None) -> SequenceModel:
    """Our SequenceModel with the math and weights of `source`: an in-memory transformers / fla
    model (e.g. `MambaForCausalLM`) or a local checkpoint directory that transformers loads with
    local_files_only=True (config.json + safetensors weights). dtype: of the result (default the
    source's). Supported architectures: models.supported_architectures()."""
    if isinstance(source, (str, os.PathLike)):
        source = load_directory(Path(source), dtype)
    if not isinstance(source, nn.Module):
        raise TypeError(f"source must be a transformers / fla model or a checkpoint directory path; "
                        f"got {type(source).__name__}")
    config = getattr(source, "config", None)
    converter = converter_for(type(source).__name__, getattr(config, "model_type", None))
    cfg, state = converter.convert(source)
    if dtype is None:
        dtype = source.get_input_embeddings().weight.dtype
    model = SequenceModel(cfg).to(dtype)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:  # a converter producing the wrong names or shapes
        raise ValueError(f"{converter.__name__} built weights that do not fit {cfg.mixer!r}: {error}") from error
    return model.eval()


def load_directory(path: Path, dtype: torch.dtype | None) -> nn.Module:
    """The transformers model in a local checkpoint directory (nothing downloaded), after
    checking it has a config of a supported architecture and safetensors weights."""
    if not path.is_dir():
        raise FileNotFoundError(f"source {str(path)!r} is not a directory (a local checkpoint directory with "
                                f"config.json and {WEIGHT_FILES[0]} was expected)")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from error
    model_type, classes = config.get("model_type"), config.get("architectures") or []
    default = CONVERTERS[model_type][1][0] if model_type in CONVERTERS else "?"
    converter_for(classes[0] if classes else default, model_type)  # imports the converter (and what it registers) or raises
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        found = sorted(p.name for p in path.iterdir())
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no weights: looked for {list(WEIGHT_FILES)}, "
                                f"found {found} (save with save_pretrained(..., safe_serialization=True))")
    import transformers

    loader = transformers.AutoModelForCausalLM
    kwargs = {"local_files_only": True, "use_safetensors": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    return loader.from_pretrained(str(path), **kwargs)
