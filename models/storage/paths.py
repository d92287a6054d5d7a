"""Run directories are a closed world: every path the toolkit writes, truncates, renames or deletes
inside one, and every pointer it follows there, is resolved by `inside` first.

    inside(run_dir, "checkpoints", "step-000000010")      -> run_dir/checkpoints/step-000000010
    inside(run_dir, pointer["path"], what="checkpoint.json path")
    in_place_file(run_dir, "metrics.jsonl")                -> a path safe to append to or truncate
    open_appending(path, "a+b")                            open it so that a link put there since fails
    read_regular(path); regular_file(path)                 reading: no final link, a regular file only
    with locked(run_dir, "run directory"): ...             one writer at a time (DirectoryLocked)
    with locked(run_dir, "run directory", create=True):    the same, the directory made already locked
    sha256_of(path); check_sha256(path, expected, where)   weights checked against the digest recorded

`inside` refuses (PathRefused, a ValueError: one line naming the link or the path) a relative path
that is absolute or climbs with "..", and any component below the run directory that is a
symbolic link, so nothing reached through it can be outside. The run directory itself may be a
link (the user named it). `in_place_file` also refuses a file with other hard links, whose data a
truncation or an append would change elsewhere. Every other file is written by `models.storage.writer`
(a temporary file renamed over the target) and needs no more than `inside` for its directory: a
rename replaces a link, never its target.

Reads are confined too: a file read inside a run directory (config.json, checkpoint.json,
trainer_state.json, metrics.jsonl, the weights, reproduce.json, results.jsonl) is reached through
`inside` and opened by `read_regular` without following a final symbolic link (O_NOFOLLOW, so a
link put there after the check fails too) and only when it is a regular file: a FIFO or a device
put in its place (/dev/zero as the weights) is refused in one line instead of blocking or being
read forever. Files handed to another library by name (safetensors) are checked by `regular_file`.

`locked` holds an exclusive `fcntl.flock` on DIR/.interp.lock (created once and left in place; the
holder writes its pid into it) for as long as a training run, a resume or a sweep writes into DIR;
the lock goes with the process, however it ends. A second writer gets DirectoryLocked at once, one
line naming the holder's pid. The lock is re-entrant within a process (a sweep's trials share it).
A directory a writer creates (`interp train`'s run directory) is made with create=True: it is
built as a hidden sibling holding its lock file, locked, and renamed into place, so there is no
moment at which it exists unlocked (an `interp eval` started just then is refused, not let in).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath

LOCK = ".interp.lock"
_held: dict[tuple[int, str], int] = {}   # (pid, real path) of a directory locked here -> nesting depth


class PathRefused(ValueError):
    """A path inside a run directory is a symbolic link, climbs out of it, or is shared with a file
    outside it."""


def inside(root: str | os.PathLike, *parts: str | os.PathLike, what: str | None = None) -> Path:
    """root / parts, checked to stay inside root: parts relative without "..", and no component
    below root a symbolic link. what: how to name the parts in the error (default the path)."""
    root = Path(root)
    relative = PurePath(*parts)
    if relative.is_absolute() or ".." in relative.parts:
        label = what or "path"
        raise PathRefused(f"{label} {str(relative)!r} points outside the run directory {str(root)!r}; "
                          "only relative paths inside it are allowed")
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            raise PathRefused(f"{current} is a symbolic link (to {os.readlink(current)!r}); refusing to "
                              f"follow it out of the run directory {str(root)!r} (replace it by a real "
                              "file or directory, or use another directory)")
    return current


def in_place_file(root: str | os.PathLike, *parts: str | os.PathLike) -> Path:
    """`inside(root, *parts)` for a file written in place (appended to or truncated): also refused
    when the file has other hard links."""
    path = inside(root, *parts)
    if path.is_file() and path.stat().st_nlink > 1:
        raise PathRefused(f"{path} has {path.stat().st_nlink} hard links; refusing to write in place to a "
                          f"file shared with another path (copy it: cp {path} {path}.tmp && mv {path}.tmp {path})")
    return path


def open_appending(path: str | os.PathLike, mode: str = "a+b"):
    """open(path, mode) for appending ("a", "a+b"), refusing (PathRefused) a symbolic link at path
    itself even if one was put there after `in_place_file` checked it (O_NOFOLLOW)."""
    flags = {"a": os.O_WRONLY, "a+b": os.O_RDWR}[mode] | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as error:
        if os.path.islink(path):
            raise PathRefused(f"{path} is a symbolic link; refusing to write through it") from None
        raise error
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file at `path`, opened without following a final symbolic link;
    PathRefused for a link or another kind of file, FileNotFoundError when nothing is there."""
    with open_regular(path) as handle:
        return handle.read()


def open_regular(path: str | os.PathLike):
    """The regular file at `path` opened for reading ("rb"), without following a final symbolic
    link; PathRefused for a link or another kind of file, FileNotFoundError when nothing is there."""
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)   # O_NONBLOCK: opening a FIFO does not wait for a writer
    except OSError as error:
        if os.path.islink(path):
            raise PathRefused(f"{path} is a symbolic link (to {os.readlink(path)!r}); refusing to read through "
                              "it (replace it by the file itself)") from None
        raise error
    try:
        _require_regular(path, os.fstat(fd).st_mode)
    except PathRefused:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def regular_file(path: str | os.PathLike) -> Path:
    """`path` itself (not a link to one) when it is a regular file, for a library that opens it by
    name; PathRefused for a link or another kind of file, FileNotFoundError when nothing is there."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise PathRefused(f"{path} is a symbolic link (to {os.readlink(path)!r}); refusing to read through it "
                          "(replace it by the file itself)")
    _require_regular(path, mode)
    return Path(path)


def _require_regular(path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise PathRefused(f"{path} is {kind}, not a regular file; refusing to read it")


class DirectoryLocked(RuntimeError):
    """Another process is writing into the directory (it holds its lock)."""


@contextmanager
def locked(directory: str | os.PathLike, what: str = "directory", create: bool = False) -> Iterator[Path]:
    """Hold the exclusive lock of `directory` while the block runs; yields the lock file.
    DirectoryLocked when another process holds it (see the module docstring). The directory must
    exist, or with create=True it is made (its parents too) already locked: it never exists
    unlocked, so no other process can take it between its creation and the lock."""
    directory = Path(directory)
    fd = _create_locked(directory, what) if create and not os.path.lexists(directory) else None
    key = (os.getpid(), os.path.realpath(directory))   # a forked child is another holder
    if fd is None and key in _held:
        _held[key] += 1
        try:
            yield inside(directory, LOCK)
        finally:
            _held[key] -= 1
        return
    path = inside(directory, LOCK)
    fd = _acquire(path, directory, what) if fd is None else fd
    try:
        _held[key] = 1
        yield path
    finally:
        _held.pop(key, None)
        os.close(fd)   # releases the lock


def _acquire(path: Path, directory: Path, what: str) -> int:
    """The descriptor of the lock file `path`, flock-ed, with this process's pid written into it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryLocked(f"{what} {str(directory)!r} is in use by process {holder} (it holds {path}); "
                              "wait for it to finish or stop it, then re-run") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _create_locked(directory: Path, what: str) -> int | None:
    """Make `directory` with its lock already held: a sibling DIR/../.NAME.XXXX.creating/ is made,
    locked and renamed to `directory` (one rename: the directory appears with its lock held).
    Returns the lock's descriptor, or None when another process made `directory` first (it is then
    locked like any existing directory)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(f".{directory.name[:64]}.{secrets.token_hex(8)}.creating")
    try:
        os.mkdir(staging, 0o777)
    except OSError as error:   # name the directory asked for, not the staging sibling
        raise OSError(error.errno, f"cannot create {str(directory)!r} ({error.strerror})") from None
    try:
        fd = _acquire(staging / LOCK, directory, what)
        try:
            os.rename(staging, directory)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)   # gone after the rename; left over only on failure
    return fd


def sha256_of(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes (read in 4 MiB blocks; about 1 s per GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: str | os.PathLike, expected: str | None, where: str) -> None:
    """ValueError unless the file's sha256 is `expected` (recorded in `where`); nothing to check
    when expected is None (a directory written before digests were recorded)."""
    if expected is not None and sha256_of(path) != expected:
        raise ValueError(f"{path} does not match the sha256 recorded in {where}: its bytes changed after it was "
                         "written (a flipped bit, a partial copy, a file replaced by hand); restore it or retrain")
