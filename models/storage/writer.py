"""The one writer of every file the toolkit produces: reports (HTML), tables (CSV), JSON, weights,
unit files, cache shards, decoding states, the native kernels' library. Each is written whole to a
temporary file, made durable and renamed over its target:

    write_file(path, fill)          fill(tmp) writes the new file by name (safetensors, plotly, a compiler)
    write_bytes(path, *chunks)      bytes or buffers (a numpy array's memory), in order
    write_text(path, text)          UTF-8
    write_json(path, data)          indented, sorted keys, a final newline
    copy_file(source, path)         the bytes of the regular file `source` (not through a link)
    write_files(directory, fill, name)  the files fill(tmp) writes into a directory (a tokenizer's
                                    save_pretrained), each renamed into `directory` as above
    leftovers(directory, name)      the temporary directories of writes of `name` a killed process left
    remove_leftovers(directory, name)   ... removed
    fsync_directory(directory)      make a directory's new entries durable (one the caller created)

How: the temporary file lies in a fresh private directory next to the target (DIR/.NAME.XXXX.tmp/,
mode 0700) and carries the target's own name, so a library that picks its format by the suffix
(plotly's write_image, numpy's save) sees it. Once filled it is fsynced, renamed over the target
(os.replace), the directory is fsynced and the temporary directory removed (durable=False skips
the fsyncs: scratch files only, such as a disk cache's activations). So:

- a reader sees the old file or the new one, never a part of either; after the call the new one
  is on disk (durable=True, the default: it survives a machine crash);
- a symbolic link at `path` is replaced itself, never written through: a rename replaces the
  directory entry, so whatever the link points to (a file, a directory, outside the run) stays as
  it was. Nothing here opens `path` for writing;
- a failure while filling (an exception, a full disk, an interrupt) leaves the old file as it was
  and removes the temporary directory; a process killed mid-write leaves DIR/.NAME.*.tmp/, which
  `remove_leftovers` removes (a resumed run does);
- a `path` that is a directory (not a link to one) is refused (PathRefused) in one line.

Confinement is the caller's part: a path inside a run directory is reached through
`models.storage.paths.inside`, which refuses a link among its directories. Appending writers (metrics.jsonl,
results.jsonl) append in place through `models.storage.paths.open_appending`, which refuses a link at the
file. tests/test_trust_writer.py scans the package source for any write that is neither.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from models.storage.paths import PathRefused, open_regular

PREFIX_CHARS = 64   # of the target's name in its temporary directory's name (NAME_MAX is 255 bytes)


def write_file(path: str | os.PathLike, fill: Callable[[str], Any], durable: bool = True) -> Path:
    """Replace `path` atomically by the file `fill(tmp)` writes at the path `tmp` (a fresh name with
    the target's own base name, in a private directory next to it); returns `path`.
    durable=False skips the two fsyncs (about 10x faster per small file here): for scratch files a
    machine crash may lose whole, never for anything a run or a report keeps (see write_bytes)."""
    path = Path(path)
    _refuse_directory(path)
    scratch = tempfile.mkdtemp(prefix=_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        tmp = os.path.join(scratch, path.name)
        fill(tmp)
        _check_regular(tmp, path, fsync=durable)
        os.replace(tmp, path)   # replaces a link at path itself, never its target
        os.rmdir(scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if durable:
        fsync_directory(path.parent)
    return path


def write_bytes(path: str | os.PathLike, *chunks: bytes | memoryview, durable: bool = True) -> Path:
    """Replace `path` atomically by the concatenation of `chunks` (anything with the buffer protocol).
    durable=False: write_file's (the activation files of a disk cache, which a rerun rebuilds)."""
    def fill(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)

    return write_file(path, fill, durable)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Replace `path` atomically by `text`, UTF-8 encoded."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, data: Any, default: Callable[[Any], Any] | None = None) -> Path:
    """Replace `path` atomically by `data` as JSON (indent 2, sorted keys, a final newline);
    default: json.dumps' (how to write what JSON has no type for)."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=default) + "\n")


def copy_file(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Replace `path` atomically by a copy of the regular file `source` (read without following a
    final link: models.storage.paths.open_regular)."""
    def fill(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with open_regular(source) as reading, os.fdopen(fd, "wb") as handle:
            shutil.copyfileobj(reading, handle, 1 << 22)

    return write_file(path, fill)


def write_files(directory: str | os.PathLike, fill: Callable[[str], Any], name: str) -> list[Path]:
    """Replace files of `directory` by those `fill(tmp)` writes into tmp, a fresh private directory
    inside it (DIR/.NAME.XXXX.tmp/: `leftovers(directory, name)` finds it after a kill), for a
    library that writes a set of files by directory (a tokenizer's save_pretrained). Each must be
    a regular file, and none may land on a directory: anything else (a link, a subdirectory) is
    refused (PathRefused) before any is moved. Each is fsynced and renamed over DIR/its name (a
    link there is replaced itself, never written through), then the directory is fsynced; a
    failure before the renames leaves `directory` as it was. Returns the paths written, sorted."""
    directory = Path(directory)
    scratch = tempfile.mkdtemp(prefix=_prefix(name), suffix=".tmp", dir=directory)
    try:
        fill(scratch)
        names = sorted(os.listdir(scratch))
        if not names:
            raise PathRefused(f"nothing was written for {name} in {directory} (the writer made no file at {scratch})")
        for entry in names:
            _refuse_directory(directory / entry)
            _check_regular(os.path.join(scratch, entry), directory / entry, fsync=True)
        for entry in names:
            os.replace(os.path.join(scratch, entry), directory / entry)   # replaces a link there, never its target
        os.rmdir(scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    fsync_directory(directory)
    return [directory / entry for entry in names]


def leftovers(directory: str | os.PathLike, name: str) -> list[Path]:
    """The temporary directories that writes of DIR/name interrupted by a killed process left."""
    return sorted(Path(directory).glob(f"{_prefix(name)}*.tmp"))


def remove_leftovers(directory: str | os.PathLike, name: str) -> None:
    """Remove `leftovers(directory, name)` (a link among them is removed itself)."""
    for leftover in leftovers(directory, name):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()


def _prefix(name: str) -> str:
    return f".{name[:PREFIX_CHARS]}."


def _refuse_directory(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise PathRefused(f"{path} is a directory; refusing to replace it by a file (name a file, or remove "
                          "the directory)")


def _check_regular(tmp: str, path: Path, fsync: bool) -> None:
    """fsync (when asked) the file `fill` wrote; PathRefused when it wrote none, or something else
    than a regular file."""
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PathRefused(f"nothing was written for {path} (the writer made no file at {tmp})") from None
    except OSError:
        raise PathRefused(f"the writer of {path} left a link at {tmp}, not a file; refusing it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PathRefused(f"the writer of {path} left something else than a regular file at {tmp}")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(directory: str | os.PathLike) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # pragma: no cover - platforms without directory descriptors
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
