"""A local safetensors checkpoint read tensor by tensor, without building the source model's weights.

    entries = stored_entries(directory)          # every header checked before anything is allocated
    checkpoint = Checkpoint(entries, source)     # source: the transformers model built on the meta device
    checkpoint.missing, checkpoint.unexpected    # source names no file holds, stored names source lacks
    checkpoint.mismatched                        # source names stored at another shape
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
import math
import struct
import weakref
from pathlib import Path

import torch
from torch import nn

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
# every safetensors dtype -> bytes per element (the readable ones are DTYPES)
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER = 100_000_000  # bytes: the safetensors library's own bound on a header


Entries = dict[str, tuple[Path, int, dict]]  # stored name -> (file, data start, its checked header entry)


def stored_entries(directory: Path) -> Entries:
    """Every tensor entry of a checkpoint directory's safetensors files, each header checked
    (shapes, dtypes and byte spans consistent, inside the file) before anything is allocated."""
    entries: Entries = {}
    for file in _files(directory):
        header, start = _header(file)
        entries |= {name: (file, start, entry) for name, entry in header.items() if name != "__metadata__"}
    return entries


class Checkpoint:
    """The safetensors weights of a checkpoint directory (`entries`: stored_entries), by the names
    of `source`'s state dict. missing: the source's names no file holds (tied names count as one);
    unexpected: the stored names that are none of the source's; mismatched: the source's names
    stored at another shape ("name (stored shape, the model's shape)")."""

    def __init__(self, entries: Entries, source: nn.Module) -> None:
        self.entries = entries
        self.stored: dict[str, str] = {}  # state-dict name -> the stored name holding it
        self.missing: list[str] = []
        groups = _tied_groups(source)
        for names in groups:
            present = [n for n in names if n in self.entries]
            self.stored |= {n: present[0] for n in names} if present else {}
            self.missing += [] if present else names
        known = {name for names in groups for name in names}
        self.unexpected = sorted(name for name in self.entries if name not in known)
        shapes = {name: tuple(t.shape) for name, t in source.state_dict(keep_vars=True).items()}
        first = {}  # stored name -> the first state-dict name it fills (tied names once)
        for name, stored in self.stored.items():
            first.setdefault(stored, name)
        self.mismatched = sorted(f"{name} (stored {tuple(self.entries[stored][2]['shape'])}, the model's "
                                 f"{shapes[name]})" for stored, name in first.items()
                                 if tuple(self.entries[stored][2]["shape"]) != shapes[name])
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
    """(the JSON header, the byte offset where the tensors' data starts), checked before anything is
    allocated: a header of at most MAX_HEADER bytes that fits the file, and every tensor entry
    consistent (check_entry); ValueError naming the file (and the tensor) otherwise."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        raw = handle.read(8)
        (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (None,)
        if length is None or length > min(size - 8, MAX_HEADER):
            raise ValueError(f"{file} is not a safetensors file: {size} bytes, "
                             + ("too short for a header" if length is None else
                                f"its header claims {length} (at most {min(size - 8, MAX_HEADER)} allowed)"))
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{file} is not a safetensors file (its header is not JSON: {error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file (its header is a {type(header).__name__}, not an object)")
    data = size - 8 - length
    for name, entry in header.items():
        if name != "__metadata__":
            check_entry(file, name, entry, data)
    return header, 8 + length


def check_entry(file: Path, name: str, entry: object, data: int) -> None:
    """One header entry {dtype, shape, data_offsets} of `file` (with `data` bytes of tensor data),
    refused in one line naming the tensor and the file unless: a dtype safetensors defines, a shape
    of non-negative integers, offsets 0 <= begin <= end <= data, and end - begin = the number of
    elements x the dtype's size."""
    where = f"checkpoint tensor {name!r} in {file}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: its header entry is {entry!r}, not {{dtype, shape, data_offsets}}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise ValueError(f"{where}: dtype {dtype!r} is not a safetensors dtype ({', '.join(DTYPE_SIZES)})")
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data):
        raise ValueError(f"{where}: data_offsets {offsets!r} do not lie within its {data} bytes of data "
                         f"(the file is truncated or corrupt)")
    needed = math.prod(shape) * DTYPE_SIZES[dtype]
    if needed != offsets[1] - offsets[0]:
        raise ValueError(f"{where}: shape {shape} of {dtype} needs {needed} bytes; its data_offsets {offsets} "
                         f"span {offsets[1] - offsets[0]}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    """One tensor of a safetensors file (its entry checked by _header: shape x dtype = its byte
    span), read into a new tensor."""
    begin, _ = entry["data_offsets"]
    tensor = torch.empty(entry["shape"], dtype=_dtype(entry, name))
    target = tensor.reshape(-1).view(torch.uint8).numpy()
    with open(file, "rb") as handle:
        handle.seek(start + begin)
        if handle.readinto(memoryview(target)) != target.nbytes:
            raise ValueError(f"checkpoint file {file} ends inside tensor {name!r}")
    return tensor
