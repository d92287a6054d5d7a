"""`python -m interp.reproduce write|check [ROOT]`: (re)write or check the manifest of every committed run,
unfinished copy and sweep table under ROOT (default results/reproduce); see interp.reproduce.manifest.
`python -m interp.reproduce table [--recorded FILE] CLAIMS.json ...`: the claim table REPRODUCTIONS.md opens
with (interp.reproduce.table)."""

from __future__ import annotations

import sys
from pathlib import Path

from interp.reproduce.manifest import MANIFEST, EditedResults, changed_files, write_manifest
from interp.reproduce.results import RESULTS, committed_directories
from models.storage.paths import PathRefused


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        from interp.reproduce.table import main as table
        return table(argv[1:])
    if not argv or argv[0] not in ("write", "check") or len(argv) > 2:
        print("usage: python -m interp.reproduce write|check [ROOT] | table [--recorded FILE] CLAIMS.json ...",
              file=sys.stderr)
        return 2
    root = Path(argv[1]) if len(argv) > 1 else RESULTS
    failed = 0
    for directory in committed_directories(root):
        if argv[0] == "write":
            write_manifest(directory)
            print(f"wrote {directory / MANIFEST}")
            continue
        try:
            problems = changed_files(directory)
        except (EditedResults, PathRefused) as error:
            problems = {MANIFEST: str(error)}
        for name, why in problems.items():
            print(f"{directory / name}: {why}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
