"""Caches on disk: one safetensors file per hook, written as the hook fires, read back lazily.

A cache directory holds

    {hook name}.safetensors   one tensor, named by the hook, in the safetensors format (readable
                              by safetensors.safe_open / load_file); complex activations are stored
                              as their real view [..., 2] (metadata {"complex": "1"})
    cache.json                the index, written last: {"format", "entries": {name: {"file",
                              "shape", "dtype"}}, "positions", "batch", "length", "model"}

`DiskStore` is the mapping behind a disk-backed `models.Cache`: setting an entry writes its file
(models.storage.writer: a temporary file, then one rename; not fsynced, since a cache is scratch that a
rerun rebuilds and an fsync per activation cost 10x the write, 21 ms against 1-2 ms per 256 KiB
file on this machine; the index is fsynced), getting one maps the file into memory (numpy
memmap, copy-on-write: the tensor is writable, changes stay in memory) so nothing is read before
it is touched. `create_store(directory, overwrite)` checks the target: never a symlink; an existing
non-empty directory only with overwrite=True (then the files a previous cache's index names are
removed, nothing else); its parent must exist (nothing outside the directory is created). The
writer holds an exclusive flock on the directory while it writes; a run that fails removes the
files it wrote.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import numpy as np
import torch

from models.storage.writer import write_bytes

INDEX = "cache.json"
FORMAT = "interp-cache/1"
SUFFIX = ".safetensors"
# torch dtype -> safetensors dtype code (complex dtypes go as their real view)
CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL"}
DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in [*CODES, torch.complex64, torch.complex128]}


class DiskStore(MutableMapping):
    """Tensors by hook name in `directory`, one safetensors file each (module docstring).

    entries: {name: {"file", "shape", "dtype"}} already there (an opened cache); writable: whether
    setting and deleting entries is allowed (a store being written, locked by its writer)."""

    def __init__(self, directory: str | Path, entries: dict[str, dict] | None = None, writable: bool = False) -> None:
        self.directory = Path(directory)
        self.entries: dict[str, dict] = dict(entries or {})
        self.writable = writable
        self._lock: int | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.entries:
            raise KeyError(name)
        return read_tensor(self.directory / self.entries[name]["file"], name, self.entries[name])

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        if not self.writable:
            raise ValueError(f"the cache in {self.directory} is read-only (opened from disk); copy the tensors "
                             "into a new Cache to change them")
        file = name + SUFFIX
        write_tensor(self.directory / file, name, value)
        self.entries[name] = {"file": file, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}

    def __delitem__(self, name: str) -> None:
        if not self.writable:
            raise ValueError(f"the cache in {self.directory} is read-only (opened from disk)")
        (self.directory / self.entries.pop(name)["file"]).unlink(missing_ok=True)

    def __contains__(self, name) -> bool:  # from the index, without reading the file
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def nbytes(self) -> int:
        """Bytes of every tensor as stored."""
        return sum(int(np.prod(e["shape"], dtype=np.int64)) * DTYPES[e["dtype"]].itemsize for e in self.entries.values())

    def finish(self, **info) -> None:
        """Write the index (cache.json, atomically) with `info` and release the writer's lock."""
        index = {"format": FORMAT, "entries": self.entries, **info}
        write_bytes(self.directory / INDEX, json.dumps(index, indent=1).encode())
        self.writable = False
        self.release()

    def abandon(self) -> None:
        """Remove every file this writer wrote (a failed run) and release the lock."""
        for entry in self.entries.values():
            (self.directory / entry["file"]).unlink(missing_ok=True)
        self.entries.clear()
        self.writable = False
        self.release()

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops its flock
            self._lock = None


def create_store(directory, overwrite: bool = False, argument: str = "to_disk") -> DiskStore:
    """A writable DiskStore in `directory`, created (its parent must exist) and locked (module
    docstring for what is refused)."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"{argument} must be a directory path (str or Path); got {type(directory).__name__}")
    path = Path(directory)
    if path.is_symlink():
        raise ValueError(f"{argument}={str(directory)!r} is a symlink; name a real directory (a cache never "
                         "writes through a link)")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{argument}={str(directory)!r} exists and is not a directory")
    if not path.parent.is_dir():
        raise ValueError(f"{argument}={str(directory)!r}: its parent {str(path.parent)!r} does not exist; create it "
                         "first (nothing outside the named directory is created)")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{argument}={str(directory)!r} exists and is not empty; pass overwrite=True to "
                              "replace a cache there, or name a new directory")
    path.mkdir(exist_ok=True)
    store = DiskStore(path, writable=True)
    store._lock = _lock(path, argument)
    _remove_indexed(path)
    return store


def open_store(directory) -> tuple[DiskStore, dict]:
    """(read-only DiskStore, the index) of a finished cache directory."""
    path = Path(directory)
    index_file = path / INDEX
    if not index_file.is_file():
        raise ValueError(f"{str(directory)!r} holds no finished cache (no {INDEX}): write one with "
                         "model.run_with_cache(tokens, names, to_disk=directory)")
    try:
        index = json.loads(index_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{index_file} is not a cache index (corrupt?): {error}") from error
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ValueError(f"{index_file} has format {index.get('format') if isinstance(index, dict) else index!r}; "
                         f"expected {FORMAT!r}")
    missing = [e["file"] for e in index["entries"].values() if not (path / e["file"]).is_file()]
    if missing:
        raise ValueError(f"the cache in {str(directory)!r} lacks {len(missing)} files its index names: {missing[:4]}")
    return DiskStore(path, index["entries"]), index


def write_tensor(path: Path, name: str, value: torch.Tensor) -> None:
    """One tensor as a safetensors file at `path` (temporary file, then rename), from its bytes
    in place (a contiguous CPU copy only where it is not one already)."""
    value = value.detach().to("cpu").contiguous()
    metadata = {}
    if value.is_complex():
        value, metadata = torch.view_as_real(value), {"complex": "1"}
    if value.dtype not in CODES:
        raise TypeError(f"cannot store {name!r} of dtype {value.dtype} on disk; supported: {sorted(DTYPES)}")
    raw = value.reshape(-1).view(torch.uint8).numpy() if value.numel() else np.empty(0, np.uint8)
    header = {name: {"dtype": CODES[value.dtype], "shape": list(value.shape), "data_offsets": [0, raw.nbytes]}}
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    write_bytes(path, struct.pack("<Q", len(text)) + text, memoryview(raw), durable=False)   # scratch: module docstring


def read_tensor(path: Path, name: str, entry: dict) -> torch.Tensor:
    """The tensor `name` of a file written by write_tensor, memory-mapped (copy-on-write)."""
    with open(path, "rb") as handle:
        size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(size))
    stored = header[name]
    dtype = DTYPES[entry["dtype"]]
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    begin, end = stored["data_offsets"]
    if end == begin:
        value = torch.empty(stored["shape"], dtype=real)
    else:
        data = np.memmap(path, dtype=np.uint8, mode="c", offset=8 + size + begin, shape=(end - begin,))
        value = torch.from_numpy(data).view(real).reshape(stored["shape"])
    return torch.view_as_complex(value) if dtype.is_complex else value


def _lock(path: Path, argument: str) -> int:
    """An exclusive, non-blocking flock on the directory itself (no lock file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"{argument}={str(path)!r} is being written by another run (locked)") from None
    return fd


def _remove_indexed(path: Path) -> None:
    """Remove a previous cache's index and the files it names (overwrite=True); nothing else."""
    index_file = path / INDEX
    if not index_file.is_file():
        return
    try:
        entries = json.loads(index_file.read_text()).get("entries", {})
    except (json.JSONDecodeError, AttributeError):
        entries = {}
    for entry in entries.values():
        file = path / str(entry.get("file", ""))
        if file.parent == path and file.name.endswith(SUFFIX):
            file.unlink(missing_ok=True)
    index_file.unlink()
