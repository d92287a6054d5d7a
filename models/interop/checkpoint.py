"""A local safetensors checkpoint read tensor by tensor, without building the source model's weights.

    checkpoint = Checkpoint(directory, source)   # source: the transformers model built on the meta device
    checkpoint.complete                          # every weight of source is in the files (tied ones once)
    checkpoint.read("backbone.layers.0.mixer.A_log")   # one tensor, read into memory this process owns

The files (model.safetensors, or the shards model.safetensors.index.json lists) are parsed as
safetensors: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, then the bytes. Tensors are read with plain file reads, not a memory map, so the
only memory they take is the tensors themselves. A name tied to another in the source (lm_head to
the embeddings) reads the tensor stored under the other name; a tensor still alive is returned
again rather than read twice.
"""

from __future__ import annotations

import json
import struct
import weakref
from pathlib import Path

import torch
from torch import nn

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


class Checkpoint:
    """The safetensors weights of a checkpoint directory, by the names of `source`'s state dict."""

    def __init__(self, directory: Path, source: nn.Module) -> None:
        self.entries: dict[str, tuple[Path, int, dict]] = {}  # stored name -> (file, data start, header entry)
        for file in _files(directory):
            header, start = _header(file)
            self.entries |= {name: (file, start, entry) for name, entry in header.items() if name != "__metadata__"}
        self.stored: dict[str, str] = {}  # state-dict name -> the stored name holding it
        self.missing: list[str] = []
        for names in _tied_groups(source):
            present = [n for n in names if n in self.entries]
            self.stored |= {n: present[0] for n in names} if present else {}
            self.missing += [] if present else names
        self._alive: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()

    @property
    def complete(self) -> bool:
        """Every weight of the source is stored (under its name or a tied one's)."""
        return not self.missing

    def dtype(self, name: str) -> torch.dtype:
        """The stored dtype of state-dict name `name`."""
        return _dtype(self.entries[self.stored[name]][2], name)

    def read(self, name: str) -> torch.Tensor:
        """The tensor of state-dict name `name`, read from its file (or the live one read before)."""
        stored = self.stored[name]
        tensor = self._alive.get(stored)
        if tensor is None:
            tensor = _read(*self.entries[stored], stored)
            self._alive[stored] = tensor
        return tensor


def _files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (the shards its index lists, or
    model.safetensors); ValueError / FileNotFoundError naming the index or the missing shard."""
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return [directory / "model.safetensors"]
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{index} is not a safetensors index (a 'weight_map' of tensor names to files): "
                         f"{type(error).__name__}: {error}") from None
    files = []
    for name in names:
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"{index} names the file {name!r}; only files inside {directory} are read")
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{index} names the shard {name!r}, which {directory} does not hold")
        files.append(directory / name)
    return files


def _header(file: Path) -> tuple[dict, int]:
    """(the JSON header, the byte offset where the tensors' data starts), checked: a header that
    fits the file, and every tensor's data_offsets inside it; ValueError naming the file otherwise."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        raw = handle.read(8)
        (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (None,)
        if length is None or length > size - 8:
            raise ValueError(f"{file} is not a safetensors file: {size} bytes, "
                             + ("too short for a header" if length is None else f"its header claims {length}"))
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{file} is not a safetensors file (its header is not JSON: {error})") from None
    data = size - 8 - length
    for name, entry in header.items() if isinstance(header, dict) else [("", None)]:
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data or not isinstance(entry.get("shape"), list)):
            raise ValueError(f"{file} is truncated or corrupt: the header entry {name!r} ({entry!r}) does not "
                             f"lie within its {data} bytes of data")
    return header, 8 + length


def _tied_groups(source: nn.Module) -> list[list[str]]:
    """The source's state-dict names grouped by the tensor they name (tied weights together)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in source.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return list(groups.values())


def _dtype(entry: dict, name: str) -> torch.dtype:
    if entry["dtype"] not in DTYPES:
        raise ValueError(f"checkpoint tensor {name!r} has dtype {entry['dtype']!r}; readable: {sorted(DTYPES)}")
    return DTYPES[entry["dtype"]]


def _read(file: Path, start: int, entry: dict, name: str) -> torch.Tensor:
    """One tensor of a safetensors file, read into a new tensor."""
    begin, end = entry["data_offsets"]
    tensor = torch.empty(entry["shape"], dtype=_dtype(entry, name))
    target = tensor.reshape(-1).view(torch.uint8).numpy()
    if target.nbytes != end - begin:
        raise ValueError(f"checkpoint tensor {name!r} in {file} holds {end - begin} bytes; its shape "
                         f"{entry['shape']} and dtype {entry['dtype']} need {target.nbytes}")
    with open(file, "rb") as handle:
        handle.seek(start + begin)
        if handle.readinto(memoryview(target)) != target.nbytes:
            raise ValueError(f"checkpoint file {file} ends inside tensor {name!r}")
    return tensor
