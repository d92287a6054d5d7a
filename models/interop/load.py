"""from_pretrained(source): a transformers / fla model, in memory or in a local checkpoint
directory, as our instrumented SequenceModel with the same math.

    model = models.from_pretrained("path/to/mamba-130m-hf")   # nothing is downloaded
    model.save("runs/mamba-130m")                              # models.load(...) rebuilds it bit for bit

The source's config picks the converter (models.interop.registry); fields we cannot represent
raise UnsupportedConfig, weights the conversion would drop raise too. A checkpoint directory is
untrusted (docs/trust-imports.md): no code of it runs (auto_map refused, trust_remote_code=False),
its headers and config sizes are checked before anything is allocated, and it must hold exactly the
model's weights.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from models.backbone import SequenceModel
from models.interop.checkpoint import DTYPE_SIZES, Checkpoint, Entries, stored_entries
from models.interop.convert import listed, reading
from models.interop.gates import check_config_sizes, check_memory
from models.interop.registry import CONVERTERS, converter_for
from models.layout import is_input_major
from models.tl.surface import directory_tokenizer

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def from_pretrained(source: nn.Module | str | os.PathLike, dtype: torch.dtype | None = None,
                    tokenizer=None) -> SequenceModel:
    """Our SequenceModel with the math and weights of `source`: an in-memory transformers / fla
    model (e.g. `MambaForCausalLM`) or a local checkpoint directory (config.json + safetensors
    weights; nothing downloaded). dtype: of the result (default the source's). Supported
    architectures: models.supported_architectures(). tokenizer: a transformers tokenizer to
    attach (model.tokenizer: to_tokens, text inputs); None: a directory's own, when it has one
    (models.tl.surface.directory_tokenizer: local files, no remote code); False: none.

    Memory: our model is created with its parameters on the meta device and filled tensor by
    tensor, each the converter's tensor itself when it is new (a concatenation, a dtype change, a
    tensor read from a checkpoint file) or a copy when it would share the source's memory, so the
    peak beyond the source is about our weights once. A directory is read straight from its
    safetensors files into a source built on the meta device (transformers' own loader only
    where the files' names differ from the model's). A directory is untrusted: no code of it runs,
    its headers and config sizes are checked before allocation, and a weight it lacks or a tensor
    nothing uses is refused (load_directory; docs/trust-imports.md)."""
    checkpoint, directory = None, None
    if isinstance(source, (str, os.PathLike)):
        directory = Path(source)
        source, checkpoint = load_directory(directory, dtype)
    if not isinstance(source, nn.Module):
        raise TypeError(f"source must be a transformers / fla model or a checkpoint directory path; "
                        f"got {type(source).__name__}")
    config = getattr(source, "config", None)
    converter = converter_for(type(source).__name__, getattr(config, "model_type", None))
    with reading(checkpoint):
        cfg, state = converter.convert(source)
    if dtype is None:
        embedding = source.get_input_embeddings().weight
        dtype = embedding.dtype if checkpoint is None else checkpoint.dtype(_name_of(source, embedding))
    shared = set() if checkpoint is not None else {t.untyped_storage().data_ptr() for t in source.state_dict().values()}
    model = filled(cfg, state, dtype, shared, converter.__name__)
    if tokenizer is None and directory is not None:
        tokenizer = directory_tokenizer(directory)
    if tokenizer not in (None, False):
        model.set_tokenizer(tokenizer)
    return model


def filled(cfg, state: dict[str, torch.Tensor], dtype: torch.dtype, shared: set[int], converter: str) -> SequenceModel:
    """SequenceModel(cfg) holding `state` (emptied as it is used; floating tensors in dtype): each
    tensor adopted as it is when it is already contiguous, in dtype and not in the `shared`
    storages (the source's), else copied; tied names share one tensor."""
    with _parameters_on_meta():
        model = SequenceModel(cfg)
    expected = model.state_dict(keep_vars=True)  # name -> meta parameter / buffer (tied names twice)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{converter} built weights that do not fit {cfg.mixer!r}: missing {listed(missing)}; "
                         f"unexpected {listed(unexpected)}")
    placed: dict[int, torch.Tensor] = {}  # id(meta tensor) -> ours
    for name, meta in expected.items():
        value = state.pop(name)
        if id(meta) not in placed:
            if value.shape != meta.shape:
                raise ValueError(f"{converter} built weights that do not fit {cfg.mixer!r}: {name} has shape "
                                 f"{tuple(value.shape)}, the model's is {tuple(meta.shape)}")
            placed[id(meta)] = _owned(value, meta, dtype, shared)
        module, _, attr = name.rpartition(".")
        owner = model.get_submodule(module)
        (owner._parameters if attr in owner._parameters else owner._buffers)[attr] = placed[id(meta)]
    left = [name for name, tensor in model.state_dict().items() if tensor.is_meta]
    if left:
        raise RuntimeError(f"{converter}: tensors of our model were not filled: {listed(left)}")
    return model.to(dtype).eval()


def _owned(value: torch.Tensor, meta: torch.Tensor, dtype: torch.dtype, shared: set[int]) -> torch.Tensor:
    """value as our own tensor laid out like meta (contiguous, or input-major: models.layout), in
    dtype when floating, a Parameter like meta."""
    tensor = value.detach().to(dtype if value.is_floating_point() else value.dtype)
    tensor = tensor.t().contiguous().t() if is_input_major(meta) else tensor.contiguous()
    if tensor.untyped_storage().data_ptr() in shared:
        tensor = tensor.clone(memory_format=torch.preserve_format)
    if not isinstance(meta, nn.Parameter):
        return tensor
    parameter = nn.Parameter(tensor, requires_grad=meta.requires_grad)
    parameter.__dict__.update(meta.__dict__)  # flags such as _no_weight_decay
    return parameter


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside register their parameters on the meta device (no memory, no
    initialisation); buffers and plain tensors are built as usual."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            meta = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(param.__dict__)
            param = meta
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _name_of(source: nn.Module, tensor: torch.Tensor) -> str:
    return next(name for name, t in source.state_dict(keep_vars=True).items() if t is tensor)


def load_directory(path: Path, dtype: torch.dtype | None) -> tuple[nn.Module, Checkpoint | None]:
    """(source, checkpoint) of a local checkpoint directory (nothing downloaded, no code of the
    checkpoint run; docs/trust-imports.md). Checked before any tensor is allocated: a config
    without `auto_map`, of a supported architecture, its sizes within models.interop.gates'
    bounds; safetensors headers that are consistent (models.interop.checkpoint); the weights of
    the model built on the meta device within the memory available. Then: when the files hold
    exactly the model's weights at its shapes (less the converter's KNOWN_DROPS), that meta model
    and the files, read tensor by tensor as the converter takes them; where some names are missing
    and others are there instead (a layout transformers renames on loading), transformers' loaded
    model and None, refused unless transformers filled every weight from the files and used every
    tensor. Anything else (a weight missing or mis-shaped, a tensor left over) is refused naming it."""
    config_path = _config_path(path)
    config = _config(config_path)
    _refuse_code(config, config_path)
    check_config_sizes(config, str(config_path))
    model_type, classes = config.get("model_type"), config.get("architectures") or []
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise ValueError(f"{config_path}: 'architectures' must be a list of class names; got {classes!r}")
    default = CONVERTERS[model_type][1][0] if model_type in CONVERTERS else "?"
    converter = converter_for(classes[0] if classes else default, model_type)  # imports it (and what it registers) or raises
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        found = sorted(p.name for p in path.iterdir())
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no weights: looked for {list(WEIGHT_FILES)}, "
                                f"found {found} (save with save_pretrained(..., safe_serialization=True))")
    entries = stored_entries(path)
    try:
        import transformers
    except ImportError:
        raise ImportError("from_pretrained on a checkpoint directory reads it with transformers, which is not installed: "
                          'pip install -e ".[hf]" (or pip install "transformers>=5.0")') from None

    meta = _meta_source(transformers, path)
    checkpoint = Checkpoint(entries, meta)
    drops = [re.compile(p) for p in getattr(converter, "KNOWN_DROPS", ())]
    unexpected = [n for n in checkpoint.unexpected if not any(p.fullmatch(n) for p in drops)]
    renamed = bool(checkpoint.missing and unexpected)  # a layout transformers renames on loading
    check_memory(_elements(meta), _bytes_each(dtype, entries), 2 if renamed else 1, f"checkpoint directory {str(path)!r}")
    if not renamed:
        _refuse_unfilled(path, type(meta).__name__, checkpoint.missing + checkpoint.mismatched, unexpected,
                         converter.__name__)
        return meta, checkpoint
    return _transformers_loaded(transformers, path, dtype, drops, converter.__name__), None


def _config_path(path: Path) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"source {str(path)!r} is not a directory (a local checkpoint directory with "
                                f"config.json and {WEIGHT_FILES[0]} was expected)")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no config.json")
    return config_path


def _config(config_path: Path) -> dict:
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from error
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object (a transformers config); got {type(config).__name__}")
    return config


def _refuse_code(config: dict, config_path: Path, where: str = "") -> None:
    """Refuse a config (or a nested one) with `auto_map`: it points transformers at code shipped with
    the checkpoint, which from_pretrained never runs."""
    if "auto_map" in config:
        raise ValueError(f"{config_path}: {where}auto_map={config['auto_map']!r} names code shipped with the "
                         f"checkpoint; from_pretrained never runs a checkpoint's code (supported architectures: "
                         f"models.supported_architectures())")
    for field, value in config.items():
        if isinstance(value, dict):
            _refuse_code(value, config_path, f"{where}{field}.")


def _elements(model: nn.Module) -> int:
    """The number of weights of a model (tied tensors once), parameters and buffers."""
    unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    return sum(t.numel() for t in unique.values())


def _bytes_each(dtype: torch.dtype | None, entries: Entries) -> int:
    """Bytes per weight of the result: dtype's, else the widest floating dtype stored."""
    if dtype is not None:
        return dtype.itemsize
    floating = [DTYPE_SIZES[e["dtype"]] for _, _, e in entries.values() if e["dtype"].startswith(("F", "BF"))]
    return max(floating, default=4)


def _refuse_unfilled(path: Path, source: str, missing: list[str], unexpected: list[str], converter: str) -> None:
    """One line naming the source's weights the files lack (they would be initialised at random) or
    the stored tensors nothing would use (dropped silently)."""
    if missing:
        raise ValueError(f"checkpoint directory {str(path)!r} does not fill {len(missing)} weight(s) of {source}: "
                         f"{listed(missing)}; refused rather than initialised at random")
    if unexpected:
        raise ValueError(f"checkpoint directory {str(path)!r} holds {len(unexpected)} tensor(s) that {source} has "
                         f"no weight for and {converter}.KNOWN_DROPS does not name: {listed(unexpected)}; refused "
                         f"rather than dropped")


def _transformers_loaded(transformers, path: Path, dtype: torch.dtype | None, drops: list[re.Pattern],
                         converter: str) -> nn.Module:
    """transformers' model loaded from the directory (its names renamed by transformers' loader, no
    code of the checkpoint run), refused unless every weight came from the files at its shape and
    every tensor of the files was used (less drops, and transformers' own list of keys it ignores)."""
    kwargs = {"local_files_only": True, "use_safetensors": True, "trust_remote_code": False,
              "output_loading_info": True, "ignore_mismatched_sizes": True}  # reported in info, refused below
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as error:  # noqa: BLE001  transformers' loaders raise many types for a bad directory
        raise ValueError(f"checkpoint directory {str(path)!r} could not be loaded by transformers "
                         f"({type(error).__name__}: {_first_line(error)})") from error
    unexpected = [n for n in info.get("unexpected_keys", ()) if not any(p.fullmatch(n) for p in drops)]
    mismatched = [f"{name} (stored {tuple(stored)}, the model's {tuple(shape)})"
                  for name, stored, shape in info.get("mismatched_keys", ())]
    _refuse_unfilled(path, type(model).__name__, sorted(info.get("missing_keys", ())) + sorted(mismatched),
                     sorted(unexpected), converter)
    return model


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _meta_source(transformers, path: Path) -> nn.Module:
    """The directory's transformers model built on the meta device (its config, modules and names
    without weights; no code of the checkpoint run): what the memory estimate counts."""
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001  transformers raises many types for a config it cannot build
        raise ValueError(f"checkpoint directory {str(path)!r}: transformers could not build its model on the meta "
                         f"device to check it before loading ({type(error).__name__}: {_first_line(error)})"
                         ) from error
