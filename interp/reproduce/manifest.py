"""Manifests of committed results: the sha256 of every file of a committed directory, so that an edit
made after the commit (a flipped verdict input, a deleted weights digest, an added file) is detected.

    write_manifest(directory) -> Path          directory/manifest.json over every file in it
    changed_files(directory) -> {file: why}    what differs from the manifest ({} when it matches)
    check_manifest(directory, allowed=()) -> [names of `allowed` files that differ]; EditedResults otherwise

    python -m interp.reproduce write [ROOT]    (re)write the manifest of every committed directory
    python -m interp.reproduce check [ROOT]    exit 1 naming each file that does not match

(interp.reproduce.__main__; ROOT defaults to results/reproduce.) A manifest detects edits; it does not
authenticate whoever made them: anyone who can edit a committed file can run `write` again
(docs/trust.md). Git history is what says who committed a manifest.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from interp.training.checkpoint import write_json
from models.storage.paths import PathRefused, read_regular, sha256_of

MANIFEST = "manifest.json"
NOTE = ("sha256 of every file of this committed directory (interp.reproduce.manifest); it detects edits made "
        "after the commit, it does not authenticate who made them")


class EditedResults(ValueError):
    """A committed directory whose files do not match its manifest."""


def digests(directory: Path) -> dict[str, str]:
    """{path relative to directory (posix): sha256} of every regular file under it but the manifest;
    PathRefused for a link or any other kind of file (a committed directory holds plain files only)."""
    found = {}
    for path in sorted(directory.rglob("*")):
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            kind = f"a symbolic link (to {os.readlink(path)!r})" if stat.S_ISLNK(mode) else "not a regular file"
            raise PathRefused(f"{path} is {kind}; a committed directory holds regular files only")
        name = path.relative_to(directory).as_posix()
        if name != MANIFEST:
            found[name] = sha256_of(path)
    return found


def write_manifest(directory: str | Path) -> Path:
    """Write directory/manifest.json over the files in it now (atomically); returns its path."""
    directory = Path(directory)
    write_json(directory / MANIFEST, {"note": NOTE, "sha256": digests(directory)})
    return directory / MANIFEST


def recorded(directory: Path) -> dict[str, str]:
    """The digests directory/manifest.json records; EditedResults when it is missing or malformed."""
    path = directory / MANIFEST
    try:
        saved = json.loads(read_regular(path).decode("utf-8"))
    except FileNotFoundError:
        raise EditedResults(f"{path} is missing: a committed directory must record the sha256 of its files "
                            "(python -m interp.reproduce write, after checking them)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EditedResults(f"{path} is not a manifest: {error}") from None
    files = saved.get("sha256") if isinstance(saved, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise EditedResults(f"{path} is not a manifest (no 'sha256' map of file names to digests)")
    return files


def changed_files(directory: str | Path) -> dict[str, str]:
    """{file name: what is wrong} for every file of directory that differs from its manifest: edited,
    missing, or not in it; {} when every file matches."""
    directory = Path(directory)
    expected, found = recorded(directory), digests(directory)
    problems = {name: "missing" for name in expected if name not in found}
    problems.update({name: "not in the manifest (added after the commit)" for name in found if name not in expected})
    problems.update({name: f"sha256 {found[name][:12]}... but the manifest records {expected[name][:12]}..."
                     for name in found if name in expected and found[name] != expected[name]})
    return dict(sorted(problems.items()))


def check_manifest(directory: str | Path, allowed: tuple[str, ...] = ()) -> list[str]:
    """EditedResults naming the first file of `directory` that differs from its manifest, unless every
    such file is in `allowed` (files the caller derives again, such as a measurement cache); returns
    those allowed files that differ."""
    problems = changed_files(directory)
    refused = {name: why for name, why in problems.items() if name not in allowed}
    if refused:
        (name, why), others = next(iter(refused.items())), list(refused)[1:]
        more = f"; so do {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}" if others else ""
        raise EditedResults(f"{Path(directory) / name} does not match the committed manifest ({why}){more}: the "
                            "committed directory was changed after it was committed (restore it, e.g. git checkout, "
                            "or commit it again)")
    return sorted(problems)
